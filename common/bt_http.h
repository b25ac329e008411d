/*
 * bt_http.h - the minimal, strict HTTP/1.1 server that baton's metrics
 * and health endpoints share (baton-router's --metrics-port, every
 * worker's --metrics-port).  GET and HEAD of a fixed list of paths, one
 * request per connection (Connection: close), no request bodies.
 *
 * The request parser is strict where leniency lets requests be misread
 * (bare CR, folded header lines, Transfer-Encoding, conflicting
 * Content-Length, a missing Host in HTTP/1.1: all 400) and answers
 * everything it cannot serve without calling the owner: 404 for other
 * paths, 405 for other methods, 431 for an oversized head, 505 for other
 * HTTP versions.  It is a pure function of the bytes: unit tests and the
 * fuzz target (tests/fuzz/fuzz_router_http.c) drive it directly.
 *
 * The server is driven by its owner's poll loop (zmq_poll items that
 * hold plain fds): the router polls it with its ZeroMQ sockets; a worker
 * runs it on a thread of its own (workerproc_metrics.h).  After a
 * response the write side is shut and unread input drained for a moment
 * (a lingering close), so a client that sent more than the head still
 * reads the answer instead of a reset.  Not thread-safe: one thread
 * drives one server.
 */
#ifndef BT_COMMON_BT_HTTP_H
#define BT_COMMON_BT_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "bt_buf.h"
#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_HTTP_MAX_CONNS 16     /* open connections at most */
#define BT_HTTP_MAX_REQUEST 8192 /* request line + headers */
#define BT_HTTP_MAX_ROUTES 8     /* paths one server answers */

// ---------------------------------------------------------------------------
// Parsing

/* A parsed request head. */
typedef struct {
    int status;   /* the status to answer: 200 (GET/HEAD of a served
                     path), 400, 404, 405, 431, 505 */
    int route;    /* with 200: the index of the path in `paths` */
    bool head;    /* HEAD: headers only */
    size_t len;   /* bytes of the request head (through the blank
                     line) */
} bt_http_req_t;

/* Parses the request head at buf[0..len) against the served `paths`
 * (n_paths of them, exact matches; a query or fragment is ignored).
 * BT_IN_PROGRESS: the blank line is not there yet (and len is under
 * BT_HTTP_MAX_REQUEST); BT_OK: *req says how to answer (status 400 for
 * anything malformed: bad request line, bad header, bare CR, a folded
 * line, no Host in HTTP/1.1, Transfer-Encoding, a bad Content-Length;
 * 431 when the head exceeds BT_HTTP_MAX_REQUEST).  Never reads past
 * buf[len-1]. */
bt_status_t bt_http_parse(const char *buf, size_t len,
                          const char *const *paths, int n_paths,
                          bt_http_req_t *req);

/* The reason phrase of `status` ("OK", "Not Found", ...). */
const char *bt_http_reason(int status);

// ---------------------------------------------------------------------------
// Server

typedef struct bt_http_server_s bt_http_server_t;

/* Answers a well-formed request for paths[route]: appends the body to
 * `body` and returns the HTTP status (200, 503, ...); sets
 * *content_type (a static string) when it is not plain text.  A failed
 * append may simply be ignored: the server then answers 500.  Called by
 * the thread that drives the server, with the `arg` given to
 * bt_http_server_process. */
typedef int (*bt_http_handler_fn)(void *arg, int route, bt_buf_t *body,
                                  const char **content_type);

/* Listens on host:port (0: any free port), non-blocking, answering
 * GET/HEAD of `paths` (n_paths, at most BT_HTTP_MAX_ROUTES; the strings
 * must outlive the server) through `handler`.  `what` names the
 * listener in errors ("metrics"). */
bt_status_t bt_http_server_create(const char *host, int port,
                                  const char *const *paths, int n_paths,
                                  bt_http_handler_fn handler,
                                  const char *what,
                                  bt_http_server_t **srv_p);
/* Closes every connection and the listener.  NULL-safe. */
void bt_http_server_destroy(bt_http_server_t **srv_p);
/* The bound port (useful after port 0). */
int bt_http_server_port(const bt_http_server_t *srv);

/* Fills items[] (room for 1 + BT_HTTP_MAX_CONNS) with the fds to poll;
 * returns how many. */
int bt_http_server_poll_items(bt_http_server_t *srv, zmq_pollitem_t *items);
/* After zmq_poll (n_items: what poll_items returned, or 0 when the poll
 * timed out): accepts, reads, answers (calling the handler with `arg`),
 * writes and closes; connections idle for 5 s are closed. */
void bt_http_server_process(bt_http_server_t *srv, void *arg,
                            const zmq_pollitem_t *items, int n_items,
                            uint64_t now);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_BT_HTTP_H */
