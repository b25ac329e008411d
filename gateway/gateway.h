/*
 * gateway.h - baton-http: an OpenAI-compatible HTTP/1.1 front end that is
 * a client of a baton router.
 *
 * One thread runs one epoll loop over the listening socket, the client
 * connections (non-blocking, keep-alive, pipelined requests answered in
 * order) and the router's ZeroMQ socket (client library, client.h).  A
 * generation request becomes one router request per choice (one unless a
 * /v1/completions prompt list or `n` asks for more); their TokenChunks
 * become SSE events with the choice's index (stream) or are gathered into
 * one JSON response.  One failed choice fails the request and cancels
 * the others.  A client that disconnects mid-request has its requests
 * cancelled at the router.
 *
 * The edge protects the cluster: prompts longer than the cluster's
 * context (from the router's ClusterStatus) are refused here with 400
 * before any worker sees them; bodies over max_body_bytes get 413; a
 * router OVERLOADED error becomes 429 with Retry-After; a lost router
 * fails the requests in flight with 502 router_lost (or an SSE error
 * event) and makes /health 503.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions,
 * GET /v1/models[/ID], POST /tokenize, POST /detokenize, GET /version,
 * GET /health, GET /livez, GET /metrics (Prometheus); OPTIONS preflights
 * with --cors-origins.
 */
#ifndef BT_GATEWAY_GATEWAY_H
#define BT_GATEWAY_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *router;          /* router client endpoint, tcp://H:P */
    const char *listen;          /* HOST:PORT to listen on (port 0: any) */
    const char *model_name;      /* id served in "model" (default "baton") */
    const char *tokenizer;       /* tokenizer path for chat (may be NULL) */
    const char *chat_template;   /* template name; NULL: detect */
    const char *model_type;      /* config.json model_type hint, or NULL */
    int max_connections;         /* open connections (1024); when all are
                                  * taken, the one idle longest or slowest
                                  * to send its request is closed for a
                                  * new one (slowloris cannot fill them) */
    int max_conns_per_client;    /* open connections per client address
                                  * (128; 0 = no limit): libmicrohttpd's
                                  * per-IP limit */
    size_t max_header_bytes;     /* request line + headers (16 KiB; MHD's
                                  * connection memory is this + 2 KiB) */
    size_t max_body_bytes;       /* request body (4 MiB) */
    int header_timeout_ms;       /* a started request's headers, and a
                                  * new connection's first request head,
                                  * must arrive (5 s) */
    int read_timeout_ms;         /* a started request must arrive (10 s) */
    int idle_timeout_ms;         /* idle keep-alive connection (60 s) */
    int write_timeout_ms;        /* stalled output (30 s): the larger of
                                  * this and idle_timeout_ms is MHD's
                                  * connection timeout, which closes it */
    int request_timeout_ms;      /* no router answer: 504 (600 s) */
    int status_timeout_ms;       /* /health, /metrics router wait (1 s) */
    uint32_t deadline_ms;        /* router deadline per request (0 none) */
    size_t max_stream_buffer;    /* unsent stream bytes before close (8 MiB) */
    const char *api_key_file;    /* API keys and tenants (NULL: open, no
                                  * tenants); unreadable: create fails */
    bool metrics_auth;           /* /metrics needs a key too */
    const char *tls_cert;        /* PEM certificate (chain): HTTPS only;
                                  * with tls_key; unusable: create fails */
    const char *tls_key;         /* PEM private key */
    const char *cors_origins;    /* "a,b" or "*": CORS for these origins
                                  * (NULL: no CORS headers) */
    int max_token_bytes;         /* without a tokenizer: text prompts of
                                  * more than context * this many bytes are
                                  * refused here as too long (128) */
} gateway_config_t;

void gateway_config_init(gateway_config_t *cfg);

typedef struct gateway_s gateway_t;

/* Loads the tokenizer (when given), connects to the router and binds the
 * listening socket.  BT_ERR_IO / BT_ERR_NET with a message on failure. */
bt_status_t gateway_create(const gateway_config_t *cfg, gateway_t **gw_p);

/* Closes every connection (in-flight requests are cancelled at the
 * router) and frees everything.  NULL-safe. */
void gateway_destroy(gateway_t **gw_p);

/* The bound TCP port (useful with port 0). */
int gateway_port(const gateway_t *gw);

/* Serves until gateway_stop().  Returns BT_OK after a stop. */
bt_status_t gateway_run(gateway_t *gw);

/* Asks gateway_run to return; async-signal-safe. */
void gateway_stop(gateway_t *gw);

#ifdef __cplusplus
}
#endif
#endif /* BT_GATEWAY_GATEWAY_H */
