/*
 * gateway_int.h - the pieces of baton-http shared inside gateway/: HTTP
 * helpers on top of libmicrohttpd (CORS, header counts), the OpenAI
 * request parser and response builders, /tokenize and /detokenize, and
 * the metrics registry.  The parsers are pure functions of their input
 * (no sockets), so unit tests and the fuzz target
 * (tests/fuzz/fuzz_http_request.c) drive them directly.
 */
#ifndef BT_GATEWAY_GATEWAY_INT_H
#define BT_GATEWAY_GATEWAY_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_prom.h"
#include "bt_buf.h"
#include "bt_status.h"
#include "client.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------
// HTTP helpers (gateway_http.c).  libmicrohttpd parses HTTP/1.1; these are
// the pieces baton adds on top of it.

struct MHD_Connection;

#define GATEWAY_HTTP_MAX_TARGET 2048 /* longer request paths: 414 */

/* How many header fields named `name` (any case) the request has: MHD
 * keeps them all, and baton refuses some repeated ones (Content-Length,
 * Authorization) as ambiguous. */
int gateway__http_header_count(struct MHD_Connection *c, const char *name);

/* The reason phrase of an HTTP status ("Not Found"). */
const char *gateway__http_reason(int status);

/* CORS allowed origins (--cors-origins "https://a.example,http://b:3000"
 * or "*").  Origins are compared exactly (scheme://host[:port], no
 * trailing slash, case-insensitive). */
typedef struct gateway_cors_s gateway_cors_t;

/* BT_ERR_INVALID_ARG (with a message) for an empty list or an entry that
 * is neither "*" nor an http(s)://host[:port] origin. */
bt_status_t gateway__cors_create(const char *spec, gateway_cors_t **cors_p);
void gateway__cors_destroy(gateway_cors_t **cors_p);

/* The Access-Control-Allow-Origin value for a request's Origin ("*" when
 * any origin is allowed, else the origin itself), or NULL when that
 * origin is not allowed.  The result points into cors or origin. */
const char *gateway__cors_match(const gateway_cors_t *cors,
                                const char *origin);

// ---------------------------------------------------------------------------
// OpenAI request parsing and responses

typedef enum {
    GATEWAY_API_COMPLETIONS = 0, /* POST /v1/completions */
    GATEWAY_API_CHAT             /* POST /v1/chat/completions */
} gateway_api_kind_t;

/* What the API parser needs to know about the served model. */
typedef struct {
    const char *model_name;      /* the one model id served */
    const tok_t *tok;            /* NULL: chat prompts go as text */
    chat_template_t chat_template;
    const char *bos;             /* tokenizer BOS/EOS strings for chat */
    const char *eos;
    uint32_t default_deadline_ms; /* 0 = none */
} gateway_api_ctx_t;

/* An error in OpenAI's shape: {"error": {message, type, param, code}}. */
typedef struct {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", ... */
    const char *code;    /* NULL -> null */
    char param[64];      /* "" -> null */
    char message[320];
    uint32_t retry_after_ms; /* Retry-After hint (0: none; 429 and 503
                              * then say 1 s) */
} gateway_api_error_t;

void gateway__api_error_set(gateway_api_error_t *err, int status,
                            const char *type, const char *code,
                            const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#define GATEWAY_CACHE_SALT_MAX 32 /* bytes of a body's cache_salt */

/* Choices of one request at most: prompts in a /v1/completions list
 * times `n`.  Each choice is one router request, so the bound keeps one
 * HTTP request from flooding the router's queue. */
#define GATEWAY_MAX_CHOICES 128

/* One prompt of a request: text or token ids. */
typedef struct {
    char *text;            /* owned: text prompt or formatted chat, or NULL */
    int *ids;              /* owned: (n_ids) token ids, or NULL */
    int n_ids;
} gateway_api_prompt_t;

/* A parsed generation request; `req`'s pointers point into this struct's
 * own storage, released by gateway__api_req_cleanup().  `req` holds
 * prompts[0]; the gateway points it at each prompt in turn to submit
 * one router request per choice (n_prompts * n of them; choice i is
 * prompt i / n, sample i % n, as OpenAI numbers them). */
typedef struct {
    gateway_api_kind_t kind;
    client_request_t req;  /* ready for client_submit() */
    bool stream;           /* SSE response */
    bool include_usage;    /* stream_options.include_usage */
    gateway_api_prompt_t *prompts; /* owned: (n_prompts) completions: the
                            * list in order; chat: the formatted messages */
    int n_prompts;
    int n;                 /* choices per prompt (OpenAI's `n`) */
    bool has_seed;         /* the body set `seed` */
    int *stop_ids;         /* owned: (n_stop_ids) */
    int n_stop_ids;
    char *stops[PARAMS_MAX_STOP_STRINGS]; /* owned: (n_stops) stop strings */
    int n_stops;
    char *grammar;         /* owned: structured output spec (NULL: none) */
    /* The body's "cache_salt" (issue 38; vLLM's field): requests share
     * cached KV only under equal salts.  A tenant's salt is mixed in at
     * admission (gateway.c), so a body cannot reach another tenant's. */
    char cache_salt[GATEWAY_CACHE_SALT_MAX + 1]; /* "" = none */
    bool echo;             /* completions: the prompt starts the text */
    bool show_prompt_logprobs; /* vLLM's choices[].prompt_logprobs */
} gateway_api_req_t;

/* Points areq->req at prompt p (text or ids). */
void gateway__api_req_use_prompt(gateway_api_req_t *areq, int p);

/* Parses and validates a JSON body of `kind`.  On BT_ERR_INVALID_ARG, err
 * holds the OpenAI error (400 for bad values, 404 for an unknown model)
 * and *out is left empty.  Safe on any bytes (fuzzed). */
bt_status_t gateway__api_parse(const gateway_api_ctx_t *ctx,
                               gateway_api_kind_t kind, const char *body,
                               size_t len, gateway_api_req_t *out,
                               gateway_api_error_t *err);
void gateway__api_req_cleanup(gateway_api_req_t *r);

/* The error object as JSON text appended to out. */
bt_status_t gateway__api_error_json(const gateway_api_error_t *err,
                                    bt_buf_t *out);

/* Maps a router error (code, message, retry hint in ms or 0) to an OpenAI
 * error (status, type, code, Retry-After). */
void gateway__api_error_from_router(int router_code, const char *message,
                                    uint32_t retry_after_ms,
                                    gateway_api_error_t *err);

/* One token's log-probabilities as the gateway shows them (issue 39):
 * the cluster sends ids and numbers, the gateway's tokenizer makes the
 * token strings (one tokenizer, the one that makes the text). */
typedef struct {
    int id;
    bool has_logprob;      /* false: the prompt's first token (null) */
    float logprob;
    int n_top;
    int top_ids[PARAMS_MAX_LOGPROBS];      /* (n_top) most likely first */
    float top_logprobs[PARAMS_MAX_LOGPROBS]; /* (n_top) */
} gateway_lp_t;

/* What every response object or chunk of one request shares. */
typedef struct {
    gateway_api_kind_t kind;
    const char *id;        /* "cmpl-..." / "chatcmpl-..." */
    long long created;     /* Unix seconds */
    const char *model;
    uint32_t prompt_tokens;     /* usage, summed over the choices */
    uint32_t completion_tokens;
    const tok_t *tok;      /* token strings; NULL: no logprobs shown */
} gateway_api_resp_t;

/* One entry of choices[] (borrowed pointers, set per call). */
typedef struct {
    int index;             /* choices[].index */
    const char *text;      /* (text_len) bytes; NULL: empty */
    size_t text_len;
    const char *finish;    /* finish_reason; NULL -> null */
    bool logprobs;         /* choices[].logprobs is an object, not null */
    const gateway_lp_t *lp; /* (n_lp) tokens of choices[].logprobs: the
                            * echoed prompt's, then the generated ones */
    int n_lp;
    int prev_id;           /* the token before lp[0] (-1: none) */
    uint32_t text_offset;  /* completions: text_offset of lp[0] */
    const gateway_lp_t *plp; /* (n_plp) vLLM's choices[].prompt_logprobs
                            * (NULL: field absent) */
    int n_plp;
} gateway_api_choice_t;

/* The characters (code points) that choices[].logprobs.text_offset
 * advances by for c's tokens (streams carry it from chunk to chunk). */
uint32_t gateway__api_lp_chars(const gateway_api_resp_t *r,
                               const gateway_api_choice_t *c);

/* A whole response with n choices (in the order given) and usage, as
 * JSON text appended to out. */
bt_status_t gateway__api_response_json(const gateway_api_resp_t *r,
                                       const gateway_api_choice_t *choices,
                                       int n, bt_buf_t *out);
/* One stream chunk of one choice.  `role`: chat's role delta;
 * usage_null: "usage": null (stream_options.include_usage). */
bt_status_t gateway__api_chunk_json(const gateway_api_resp_t *r,
                                    const gateway_api_choice_t *c,
                                    bool role, bool usage_null,
                                    bt_buf_t *out);
bt_status_t gateway__api_usage_chunk_json(const gateway_api_resp_t *r,
                                          bt_buf_t *out);

/* GET /v1/models (list) or /v1/models/ID (one model object). */
bt_status_t gateway__api_models_json(const char *model, long long created,
                                     bool list, bt_buf_t *out);

/* POST /tokenize (vLLM's shape): {"prompt": "..."} or {"messages": [...]}
 * (with "add_generation_prompt", default true; "add_special_tokens",
 * default true for a prompt and false for messages) ->
 * {"count": n, "max_model_len": M, "tokens": [...]}.  max_model_len is
 * the cluster's context (0: not known yet -> null).  On
 * BT_ERR_INVALID_ARG err holds a 400 (404 for an unknown model, 501
 * without a tokenizer).  Safe on any bytes (fuzzed). */
bt_status_t gateway__tokenize(const gateway_api_ctx_t *ctx,
                              uint32_t max_model_len, const char *body,
                              size_t len, bt_buf_t *out,
                              gateway_api_error_t *err);

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": "text"}; an id out
 * of the vocabulary is a 400. */
bt_status_t gateway__detokenize(const gateway_api_ctx_t *ctx,
                                const char *body, size_t len, bt_buf_t *out,
                                gateway_api_error_t *err);

// ---------------------------------------------------------------------------
// API keys and tenants (gateway_auth.c; issue 42)

#define GATEWAY_AUTH_MAX_KEY 256    /* key bytes at most (255 + NUL) */
#define GATEWAY_AUTH_MIN_KEY 16     /* shorter keys are refused at load */

/* A tenant: what its keys share.  Limits of 0 mean none. */
typedef struct {
    char name[65];             /* [A-Za-z0-9._-]{1,64} */
    int priority;              /* the router priority class of its requests */
    uint32_t weight;           /* its share within the class (1..1000) */
    int max_concurrency;       /* requests in flight at once (0: no limit) */
    uint64_t tokens_per_min;   /* token rate (0: no limit) */
    char cache_salt[65];       /* default: the tenant's name */
    const char *precision;     /* its requests' precision class when the
                                  body names none (proto_precision_find's
                                  static string), NULL: any */
    /* state */
    int in_flight;             /* generation requests admitted, not ended */
    double bucket;             /* tokens it may still start (may go below
                                  0: the overdraft of requests that used
                                  more than charged) */
    uint64_t t_bucket;         /* bucket last refilled (ns) */
    uint64_t limited;          /* requests refused with 429 here */
} gateway_tenant_t;

typedef struct gateway_auth_s gateway_auth_t;

/* Loads an API key file (format in docs/SECURITY.md): one key per line,
 * "KEY TENANT [priority=N] [weight=N] [max_concurrency=N]
 * [tokens_per_min=N] [cache_salt=S]"; '#' starts a comment.  Any error
 * (missing or unreadable file, a malformed line, no key at all) fails
 * the load with a message naming the line, never the key. */
bt_status_t gateway__auth_load(const char *path, gateway_auth_t **auth_p);
void gateway__auth_destroy(gateway_auth_t **auth_p);
int gateway__auth_n_keys(const gateway_auth_t *auth);
int gateway__auth_n_tenants(const gateway_auth_t *auth);

/* The tenant of the credential in an Authorization header value
 * ("Bearer KEY"), or NULL when it names no key.  Compares against every
 * key in time that depends on the number of keys only. */
gateway_tenant_t *gateway__auth_check(gateway_auth_t *auth,
                                      const char *value, size_t len);

/* Admission of an HTTP request that makes n_requests router requests
 * (its choices: a prompt list, `n`) of `tokens` estimated tokens in all,
 * for tenant t at `now`: they count as n_requests requests against the
 * tenant's concurrency.  BT_OK takes the slots and charges the tokens;
 * BT_ERR_NO_RESOURCE (the caller answers 429) with how long to wait in
 * *retry_ms and why in *why; BT_ERR_INVALID_ARG (400) when n_requests is
 * over the tenant's max_concurrency, so waiting would never help. */
bt_status_t gateway__tenant_admit(gateway_tenant_t *t, uint64_t now,
                                  uint64_t tokens, int n_requests,
                                  uint32_t *retry_ms, const char **why);
/* The end of an admitted request: frees its n_requests slots and
 * corrects the charge (`charged` at admission, `used` in the end). */
void gateway__tenant_release(gateway_tenant_t *t, uint64_t charged,
                             uint64_t used, int n_requests);

// ---------------------------------------------------------------------------
// Metrics (Prometheus text exposition format)

typedef enum {
    GATEWAY_EP_COMPLETIONS = 0,
    GATEWAY_EP_CHAT,
    GATEWAY_EP_MODELS,
    GATEWAY_EP_HEALTH,
    GATEWAY_EP_METRICS,
    GATEWAY_EP_LIVEZ,
    GATEWAY_EP_OTHER,
    GATEWAY_EP_COUNT
} gateway_endpoint_t;

#define GATEWAY_METRICS_MAX_CODES 24
typedef struct {
    int codes[GATEWAY_METRICS_MAX_CODES];     /* statuses seen, in order */
    int n_codes;
    uint64_t requests[GATEWAY_EP_COUNT][GATEWAY_METRICS_MAX_CODES];
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t cancelled;       /* client went away mid-request */
    uint64_t rejected_conns;  /* over --max-connections or
                                 --max-conns-per-client */
    uint64_t evicted_conns;   /* idle or unfinished requests closed to
                                 make room for a new connection */
    uint64_t edge_too_long;   /* prompts refused here as over the context */
    uint64_t router_lost;     /* times the router link was lost */
    uint64_t unauthorized;    /* 401: no or a wrong API key */
    uint64_t tenant_limited;  /* 429: over a tenant's concurrency or
                                 token-rate limit, refused here */
    int in_flight;            /* generation requests at the router */
    int connections;          /* open client connections */
    bt_prom_hist_t ttft;
    bt_prom_hist_t tpot;
    bt_prom_hist_t e2e;
} gateway_metrics_t;

void gateway__metrics_init(gateway_metrics_t *m);

/* The path an endpoint is counted under ("/v1/completions", "other"). */
const char *gateway__metrics_endpoint_name(gateway_endpoint_t ep);
void gateway__metrics_request(gateway_metrics_t *m, gateway_endpoint_t ep,
                              int status);

/* Writes every metric; `cluster` (may be NULL when the router did not
 * answer) adds the router and per-worker gauges. */
bt_status_t gateway__metrics_render(const gateway_metrics_t *m,
                                    const Baton__ClusterStatus *cluster,
                                    bt_buf_t *out);

#ifdef __cplusplus
}
#endif
#endif /* BT_GATEWAY_GATEWAY_INT_H */
