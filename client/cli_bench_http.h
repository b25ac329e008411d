/*
 * cli_bench_http.h - a small non-blocking HTTP/1.1 client with a
 * Server-Sent-Events reader, for `baton bench --http` (one connection per
 * cli_http_t, one request at a time on it, keep-alive reuse).
 *
 * The caller owns the event loop: it polls cli_http_fd() for
 * cli_http_poll_events() and calls cli_http_io() when the fd is ready (or
 * whenever it likes: cli_http_io never blocks).  A 200 text/event-stream
 * response is delivered event by event through a callback; any other
 * response is kept (bounded) for cli_http_body().  Everything is bounded:
 * status line and headers (CLI_HTTP_MAX_HEAD), one SSE event
 * (CLI_HTTP_MAX_EVENT), a kept body (CLI_HTTP_MAX_BODY), a chunk size.
 * Timeouts are the caller's: it destroys a connection it gave up on.
 * Not thread-safe; no TLS.
 */
#ifndef BT_CLIENT_CLI_BENCH_HTTP_H
#define BT_CLIENT_CLI_BENCH_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "bt_status.h"

#define CLI_HTTP_MAX_HEAD (16 * 1024)   /* status line + headers */
#define CLI_HTTP_MAX_EVENT (1 << 20)    /* one SSE event's data */
#define CLI_HTTP_MAX_BODY (64 * 1024)   /* a kept non-SSE body */

/* Where to send: parsed from "http://HOST:PORT/PATH" or "HOST:PORT" and
 * resolved once. */
typedef struct {
    char host[256];                 /* as written (for the Host header) */
    char port[16];                  /* decimal */
    char path[512];                 /* request target, starts with '/' */
    struct sockaddr_storage addr;   /* resolved address */
    socklen_t addr_len;             /* its length */
} cli_http_url_t;

/* Parses and resolves url; an empty path or "/" becomes default_path.
 * BT_ERR_INVALID_ARG for a malformed URL or https (message in
 * bt_error_last()), BT_ERR_NOT_FOUND when the host does not resolve. */
bt_status_t cli_http_url_parse(const char *url, const char *default_path,
                               cli_http_url_t *url_p);

typedef struct cli_http_s cli_http_t;

/* Called once per SSE event with its data (the "data:" lines joined by
 * '\n', NUL-terminated at data[len]); the buffer is valid during the
 * call only. */
typedef void (*cli_http_event_cb_t)(void *arg, const char *data, size_t len);

/* Starts a non-blocking connect to url (which must outlive the
 * connection).  BT_ERR_IO when no socket can be made; a connect that
 * fails at once is reported by the first cli_http_io. */
bt_status_t cli_http_create(const cli_http_url_t *url, cli_http_t **http_p);

/* Closes the connection (an unfinished request is abandoned: the server
 * sees the close) and frees it.  NULL-safe; sets *http_p = NULL. */
void cli_http_destroy(cli_http_t **http_p);

/* Starts `POST url->path` with a JSON body (copied).  The connection
 * must be fresh or have completed its last response with
 * cli_http_is_reusable().  BT_ERR_INVALID_ARG otherwise. */
bt_status_t cli_http_post(cli_http_t *http, const char *body, size_t len);

/* The socket, and the poll(2) events to wait for (POLLOUT while
 * connecting or sending, POLLIN after). */
int cli_http_fd(const cli_http_t *http);
short cli_http_poll_events(const cli_http_t *http);

/* Does all the I/O the socket allows now without blocking and parses
 * what arrived, calling cb for each complete SSE event.  Returns
 * BT_IN_PROGRESS while the response is unfinished, BT_OK once it is
 * complete (then cli_http_status() and, for a non-SSE body,
 * cli_http_body() are set), or an error after which the connection is
 * dead (cli_http_error() says why): BT_ERR_IO (connect, send or receive
 * failed, or the server closed mid-response), BT_ERR_FORMAT (not HTTP,
 * bad chunking, a bound exceeded). */
bt_status_t cli_http_io(cli_http_t *http, cli_http_event_cb_t cb, void *arg);

/* The response status (0 before the status line). */
int cli_http_status(const cli_http_t *http);

/* The kept body of a non-SSE response, NUL-terminated ("" when none);
 * valid until the next cli_http_post or destroy. */
const char *cli_http_body(const cli_http_t *http);

/* Whether the finished response lets the connection carry another
 * request (HTTP/1.1, no "Connection: close", nothing extra received). */
bool cli_http_is_reusable(const cli_http_t *http);

/* Whether any byte of a response arrived since the last post (a failure
 * before that on a reused connection is a stale keep-alive: retry). */
bool cli_http_got_bytes(const cli_http_t *http);

/* Why the last cli_http_io failed. */
const char *cli_http_error(const cli_http_t *http);

#endif /* BT_CLIENT_CLI_BENCH_HTTP_H */
