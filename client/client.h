/*
 * client.h - the baton client library: connect to a router, submit
 * generate requests, receive their streamed tokens, cancel them.
 *
 * One client_t is one DEALER socket; many requests may be in flight on
 * it, told apart by the request id client_submit() returns.  Messages
 * arrive as decoded ClientMessage envelopes (proto/client.proto):
 * TokenChunk*, then Finished or Error for each request (a router's
 * ClientBatch, several replies in one ZeroMQ message, is unpacked here and
 * handed out one reply at a time, in order).  Not thread-safe:
 * one thread uses a client at a time.
 *
 * A lost router is an error, never a hang: the socket sends ZeroMQ
 * heartbeats (ZMTP PING; the router's libzmq answers them itself) and a
 * socket monitor watches the connection.  When the connection drops (the
 * router died, was stopped, or restarted) or no heartbeat answer comes
 * within heartbeat_timeout_ms, every request in flight ends with an
 * Error of code ERROR_ROUTER_LOST, synthesized here: the router that
 * held them is gone, even when a new one answers a moment later.  A
 * request that waits longer than connect_timeout_ms for a connection ends
 * the same way.  Such a request did not finish and may be resubmitted.
 * Late messages for those requests (a stopped router that resumes) are
 * dropped, and a Cancel is queued for each, so a router that sees the
 * request after all does not run it for nobody.
 */
#ifndef BT_CLIENT_CLIENT_H
#define BT_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_curve.h"
#include "bt_status.h"
#include "params.h"
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
    bool skip_special_tokens;  /* special tokens print as nothing
                                * (default true; issue 39) */
    int priority;              /* higher first */
    uint32_t deadline_ms;      /* 0 = none */
    bool want_text;            /* default true */
    /* Tenants (issue 42), set by a trusted front end: */
    const char *tenant;        /* NULL: the default tenant */
    uint32_t tenant_weight;    /* share within its priority (0: 1) */
    const char *cache_salt;    /* NULL: none */
    const char *grammar;       /* structured output "<kind>:<text>"
                                * (GenerateRequest.grammar); NULL: none */
    const char *precision;     /* precision class the workers must serve
                                * it in: "f32", "bf16", "fp8"; NULL or "":
                                * any (issue 37; the router refuses an
                                * unknown class and a class no worker
                                * registered) */
    /* Log-probabilities (issue 39; params.h): each TokenChunk then holds
     * logprobs (one per id), top_ids and top_logprobs (top_logprobs per
     * id, most likely first); the first chunk holds prompt_ids and
     * prompt_logprobs (positions 1.., prompt_top_logprobs alternatives
     * each) when prompt_logprobs is set. */
    bool logprobs;
    int top_logprobs;          /* 0..20 */
    bool prompt_logprobs;
    int prompt_top_logprobs;   /* 0..20 */
} client_request_t;

void client_request_init(client_request_t *req);

/* The request's sampling, max_tokens and ignore_eos from the parameter
 * contract (params/params.h); the stop lists are pointers the caller
 * sets.  client_request_params is the reverse, stop lists included
 * (borrowed from req). */
void client_request_set_params(client_request_t *req, const params_t *p);
void client_request_params(const client_request_t *req, params_t *p);
/* Asks for workers of precision class `precision` ("f32", "bf16",
 * "fp8"; NULL or "": any), as req->precision (a static string, so the
 * argument need not outlive req).  BT_ERR_INVALID_ARG for any other
 * name, req unchanged. */
bt_status_t client_request_set_precision(client_request_t *req,
                                         const char *precision);

typedef struct client_s client_t;

typedef struct {
    int heartbeat_ms;         /* ZMTP PING interval (500; env
                               * BT_CLIENT_HEARTBEAT_MS) */
    int heartbeat_timeout_ms; /* no answer this long: the router is lost
                               * (2000; env BT_CLIENT_HEARTBEAT_TIMEOUT_MS) */
    int connect_timeout_ms;   /* a request waits this long for a
                               * connection, then ERROR_ROUTER_LOST (5000;
                               * env BT_CLIENT_CONNECT_TIMEOUT_MS) */
    const bt_curve_client_t *curve; /* CURVE keys; NULL (default): the
                               * process identity (bt_curve_identity():
                               * --curve-secret-key/--router-public-key or
                               * BATON_CURVE_SECRET_KEY and
                               * BATON_ROUTER_PUBLIC_KEY).  A router that
                               * refuses the key never answers: requests
                               * end ERROR_ROUTER_LOST after
                               * connect_timeout_ms (an error is logged) */
} client_config_t;

/* Defaults, then the BT_CLIENT_* environment overrides. */
void client_config_init(client_config_t *cfg);

/* Connects to a router's client endpoint (tcp://HOST:PORT).  ZeroMQ
 * connects lazily: an unreachable router shows up, after
 * connect_timeout_ms, as ERROR_ROUTER_LOST for the requests sent.
 * client_create() uses client_config_init()'s configuration.
 * BT_ERR_INVALID_ARG when the CURVE key files cannot be read. */
bt_status_t client_create(const char *endpoint, client_t **client_p);
bt_status_t client_create_cfg(const char *endpoint,
                              const client_config_t *cfg,
                              client_t **client_p);
void client_destroy(client_t **client_p);

/* Takes --curve-secret-key FILE and --router-public-key FILE (also
 * --opt=FILE) out of argv[1..argc) wherever they are, shifting the rest
 * down and lowering *argc, and sets the process identity from them
 * (bt_curve_identity_init; the environment fills in a missing one).
 * Without either, nothing is loaded here (the environment is read when
 * the first socket is made).  Lets every program that is a client (the
 * CLI, baton-http) take the same two options.  Returns 0, or -1 after
 * printing the error to stderr with `prog`. */
int client_curve_args(int *argc, char **argv, const char *prog);

typedef enum {
    CLIENT_ROUTER_CONNECTING = 0, /* never connected yet */
    CLIENT_ROUTER_UP,             /* connected, heartbeats answered */
    CLIENT_ROUTER_LOST            /* was connected, is not now */
} client_router_state_t;

/* The state of the link to the router, as of the last client_recv() (or
 * now: pending monitor events are read first). */
client_router_state_t client_router_state(client_t *client);

/* Times the router was lost since the client was created. */
uint64_t client_router_losses(const client_t *client);

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
 * router, or for an ERROR_ROUTER_LOST this library synthesized for a
 * request in flight.  BT_ERR_TIMEOUT when none came; BT_ERR_FORMAT for an
 * undecodable reply.  The caller frees *msg_p with proto_client_free().
 * Loss detection runs inside this call: callers with their own loop call
 * it at least every few hundred milliseconds. */
bt_status_t client_recv(client_t *client, int timeout_ms,
                        Baton__ClientMessage **msg_p);

/* The request id a received message belongs to (0 when none). */
uint64_t client_msg_request_id(const Baton__ClientMessage *msg);

/* The file descriptor that signals when the client's socket may have
 * messages (ZeroMQ's ZMQ_FD), for callers that run their own epoll/poll
 * loop: when it polls readable, and after every send, drain with
 * client_recv(client, 0, ...) until BT_ERR_TIMEOUT (the fd is
 * edge-triggered); also call it on a timer (a lost router does not make
 * this fd readable).  BT_ERR_NET when ZeroMQ cannot give it. */
bt_status_t client_fd(client_t *client, int *fd_p);

/* A human name for an error code ("overloaded"). */
const char *client_error_name(Baton__ErrorCode code);
const char *client_finish_name(Baton__FinishReason reason);

#ifdef __cplusplus
}
#endif
#endif /* BT_CLIENT_CLIENT_H */
