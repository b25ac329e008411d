/*
 * router.h - baton-router: the one address clients know.
 *
 * Keeps the registry of prefill and decode workers (they register and
 * heartbeat over the --control socket; a worker silent for
 * heartbeat_miss intervals is dropped), admits client requests into a
 * bounded queue (over the bound: an immediate OVERLOADED error), picks a
 * decode and a prefill worker for each with a pluggable policy, runs the
 * reserve -> prefill -> decode flow of docs/DESIGN.md, relays the token
 * stream, and handles cancellation, deadlines and worker failure
 * (re-prefill elsewhere; the client stream continues without duplicates).
 *
 * Per prefill/decode pair the router chooses how KV moves (see
 * router__choose_transport): CUDA IPC when both run on one host with
 * GPU KV pools, staged UCX (pinned host buffers, kv_transport_stage.h)
 * for GPU pools on different hosts, UCX (shared memory when on one host)
 * for host pools, inline otherwise, or LOCAL when a --role both decode
 * worker prefills its own request (aggregated mode).  The choice is reported per pair in
 * the cluster status.
 *
 * With metrics_port set it serves Prometheus metrics over HTTP (GET
 * /metrics; router_metrics.c lists them).
 *
 * Single-threaded: router_run() is the event loop (zmq_poll, no busy
 * polling).  router_stop() may be called from a signal handler.
 */
#ifndef BT_ROUTER_ROUTER_H
#define BT_ROUTER_ROUTER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *listen;     /* client endpoint, tcp://127.0.0.1:5555 */
    const char *control;    /* worker endpoint, tcp://127.0.0.1:5556 */
    const char *policy;     /* "least-loaded" (default), "round-robin" or
                             * "kv-aware" (decode workers by expected
                             * prefix-cache overlap against load) */
    const char *kv_weights; /* kv-aware: "overlap=X,load=Y" (NULL: 1,1) */
    const char *tokenizer;  /* the workers' tokenizer (file or HF model
                             * directory): text prompts are tokenized
                             * here for routing and KvReserve, and sent
                             * as ids to workers of the same identity;
                             * NULL: text prompts go as text */
    int tokenize_max_bytes; /* --tokenizer: longer texts go as text (the
                             * router's one thread tokenizes, ~0.1-0.3 us
                             * a byte; 16384) */
    int heartbeat_ms;       /* interval workers are told to use (250) */
    int heartbeat_miss;     /* silent intervals before a drop (4) */
    int max_queue;          /* admission bound (1024) */
    int queue_timeout_ms;   /* longest queued wait for a worker or for
                               capacity to come free (30000) */
    int drain_timeout_ms;   /* longest drain on SIGTERM (30000) */
    int max_retries;        /* re-prefills after worker failures (3) */
    int max_inflight;       /* requests past the queue (0 = no limit) */
    int max_queue_wait_ms;  /* overload bound: when a request arrives,
                             * first attempts queued longer than this
                             * (while workers serve) end OVERLOADED with
                             * a retry hint, and so does the new one
                             * while any had to; 0 = no bound (the
                             * config_init default; baton-router's is
                             * 1000) */
    const char *kv_transport; /* "auto" (default), "ucx", "cuda-ipc",
                               * "ucx-stage" or "inline": KV transport
                               * per prefill/decode pair; a forced one
                               * the pair cannot use falls back to auto */
    const char *aggregate;  /* "fallback" (default): a decode worker with
                             * --role both prefills its own requests when
                             * no prefill worker is usable; "always": such
                             * workers always prefill their requests;
                             * "ttft": as fallback, and also when such a
                             * worker's predicted first token comes
                             * sooner than the prefill worker's
                             * (conditional disaggregation); "never" */
    int metrics_port;       /* HTTP port serving Prometheus GET /metrics;
                             * -1 (default): none, 0: any free port
                             * (router_metrics_port() tells which) */
    const char *metrics_host; /* address it binds ("127.0.0.1") */
    /* CURVE (docs/SECURITY.md): with curve_secret_key set, both sockets
     * are CURVE servers and a ZAP handler admits only the listed public
     * keys, allow_workers on the control socket and allow_clients on the
     * client socket (each a file of keys or a directory of *.pub).
     * Without it, listen and control must be loopback (or ipc://)
     * endpoints unless insecure is set. */
    const char *curve_secret_key; /* secret key file, NULL = no CURVE */
    const char *allow_workers;    /* worker public keys (file or dir) */
    const char *allow_clients;    /* client public keys (file or dir) */
    bool insecure;                /* no CURVE on non-loopback endpoints */
    int stall_ms;           /* a worker whose engine turn has run this
                             * long (or 20 of its longest recent turns,
                             * when longer) with work assigned is stuck:
                             * dropped, its requests re-queued (10000) */
    int phase_ms;           /* least time a request phase (reserve,
                             * prefill, first token, next token) may take
                             * before its attempt is abandoned and
                             * re-queued; longer when the worker's
                             * measured step cost says so (10000) */
} router_config_t;

void router_config_init(router_config_t *cfg);

typedef struct router_s router_t;

/* Binds both sockets.  BT_ERR_NET when an endpoint cannot be bound,
 * BT_ERR_INVALID_ARG for an unknown policy, an unreadable key file or
 * allow list, or (without CURVE and insecure) a non-loopback endpoint. */
bt_status_t router_create(const router_config_t *cfg, router_t **router_p);
void router_destroy(router_t **router_p);

/* Runs the event loop until router_stop(): then drains (no new requests;
 * in-flight ones finish, bounded by drain_timeout_ms) and returns. */
bt_status_t router_run(router_t *router);

/* Asks the loop to drain and return.  Async-signal-safe. */
void router_stop(router_t *router);

/* The ports actually bound (useful with port 0). */
int router_client_port(const router_t *router);
int router_control_port(const router_t *router);
/* The metrics HTTP port bound, -1 without one. */
int router_metrics_port(const router_t *router);

#ifdef __cplusplus
}
#endif
#endif /* BT_ROUTER_ROUTER_H */
