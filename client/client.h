/*
 * client.h - the baton client library: connect to a router, submit
 * generate requests, receive their streamed tokens, cancel them.
 *
 * One client_t is one DEALER socket; many requests may be in flight on
 * it, told apart by the request id client_submit() returns.  Messages
 * arrive as decoded ClientMessage envelopes (proto/client.proto):
 * TokenChunk*, then Finished or Error for each request.  Not thread-safe:
 * one thread uses a client at a time.
 */
#ifndef BT_CLIENT_CLIENT_H
#define BT_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"
#include "proto_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *prompt;        /* UTF-8 text, or NULL when ids are given */
    const int *prompt_ids;     /* (n_prompt_ids) ids; win over text */
    int n_prompt_ids;
    bool add_bos;              /* for text prompts (default true) */
    float temperature;         /* sampler.h semantics and defaults */
    int top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    uint64_t seed;
    int max_tokens;            /* 0 (default): until the context is full */
    const int *stop_ids;       /* (n_stop_ids), added to the model EOS ids */
    int n_stop_ids;
    const char *const *stop_strings; /* (n_stop_strings) */
    int n_stop_strings;
    bool ignore_eos;
    int priority;              /* higher first */
    uint32_t deadline_ms;      /* 0 = none */
    bool want_text;            /* default true */
} client_request_t;

void client_request_init(client_request_t *req);

typedef struct client_s client_t;

/* Connects to a router's client endpoint (tcp://HOST:PORT).  ZeroMQ
 * connects lazily: an unreachable router shows up as a receive timeout. */
bt_status_t client_create(const char *endpoint, client_t **client_p);
void client_destroy(client_t **client_p);

/* Sends a request; its id (unique on this client) goes to *rid_p. */
bt_status_t client_submit(client_t *client, const client_request_t *req,
                          uint64_t *rid_p);

/* Sends a raw, already encoded frame (tests of malformed input). */
bt_status_t client_send_raw(client_t *client, const void *data, size_t len);

/* Asks the router to cancel a request; a Finished(cancelled) follows. */
bt_status_t client_cancel(client_t *client, uint64_t rid);

/* Asks for the cluster status; a ClusterStatus reply follows. */
bt_status_t client_status_request(client_t *client, uint64_t *rid_p);

/* Waits up to timeout_ms (-1 = forever) for the next message from the
 * router.  BT_ERR_TIMEOUT when none came; BT_ERR_FORMAT for an
 * undecodable reply.  The caller frees *msg_p with proto_client_free(). */
bt_status_t client_recv(client_t *client, int timeout_ms,
                        Baton__ClientMessage **msg_p);

/* The request id a received message belongs to (0 when none). */
uint64_t client_msg_request_id(const Baton__ClientMessage *msg);

/* The file descriptor that signals when the client's socket may have
 * messages (ZeroMQ's ZMQ_FD), for callers that run their own epoll/poll
 * loop: when it polls readable, and after every send, drain with
 * client_recv(client, 0, ...) until BT_ERR_TIMEOUT (the fd is
 * edge-triggered).  BT_ERR_NET when ZeroMQ cannot give it. */
bt_status_t client_fd(client_t *client, int *fd_p);

/* A human name for an error code ("overloaded"). */
const char *client_error_name(Baton__ErrorCode code);
const char *client_finish_name(Baton__FinishReason reason);

#ifdef __cplusplus
}
#endif
#endif /* BT_CLIENT_CLIENT_H */
