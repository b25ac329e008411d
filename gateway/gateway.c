/*
 * gateway.c - baton-http on libmicrohttpd: the server wiring (accept,
 * connection limits and eviction, timeouts, TLS), the request dispatch,
 * the router link and the responses (see gateway.h).
 *
 * One thread runs everything.  MHD runs in "external epoll" mode
 * (MHD_USE_EPOLL without an internal thread): its epoll descriptor, our
 * listening socket and the router's ZeroMQ descriptor sit in one epoll
 * set, and each loop turn calls MHD_run(), drains the router and sweeps
 * the timeouts.  Handlers therefore never race the router code.
 *
 * A request's life: MHD calls on_request() once with the headers (the
 * checks MHD does not make: body size, Transfer-Encoding, Expect, CORS
 * preflight), then with the body, then once more; dispatch() answers at
 * once (a response is queued) or starts a router job and suspends the
 * connection.  Router messages fill in the response (non-stream) or the
 * SSE byte queue (stream, sent by a content-reader callback that suspends
 * the connection whenever the queue is empty) and resume it.  MHD calls
 * on_completed() when the request ends for any reason; a job still at
 * the router is then cancelled there.
 *
 * We accept connections ourselves and hand them to MHD
 * (MHD_add_connection), so that when --max-connections are open the one
 * idle longest, or slowest to send its request, can be closed for the
 * new one (MHD itself would refuse the newcomer: slowloris wins).
 */
#include "gateway.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_blockhash.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "client.h"
#include "gateway_int.h"

#define TAG_LISTEN 0u
#define TAG_ROUTER 1u
#define TAG_MHD 2u
#define MAX_EVENTS 64
#define TICK_MS 50
#define CONTEXT_POLL_MS 2000 /* how often the cluster context is asked */

void gateway_config_init(gateway_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->router = "tcp://127.0.0.1:5555";
    cfg->listen = "127.0.0.1:8000";
    cfg->model_name = "baton";
    cfg->max_connections = 1024;
    cfg->max_conns_per_client = 128;
    cfg->header_timeout_ms = 5000;
    cfg->max_token_bytes = 128;
    cfg->max_header_bytes = 16384;
    cfg->max_body_bytes = 4u << 20;
    cfg->read_timeout_ms = 10000;
    cfg->idle_timeout_ms = 60000;
    cfg->write_timeout_ms = 30000;
    cfg->request_timeout_ms = 600000;
    cfg->status_timeout_ms = 1000;
    cfg->deadline_ms = 0;
    cfg->max_stream_buffer = 8u << 20;
}

// ---------------------------------------------------------------------------
// Types

#define GATEWAY_REQUEST_ID_MAX 128 /* longer client X-Request-Ids: replaced */

typedef enum {
    JOB_NONE = 0,
    JOB_GENERATE,  /* completion / chat request at the router */
    JOB_HEALTH,    /* cluster status for /health */
    JOB_METRICS    /* cluster status for /metrics */
} conn_job_t;

typedef struct req_s req_t;

/* One client connection: MHD's socket context. */
typedef struct conn_s {
    struct MHD_Connection *mhd; /* MHD's handle of it */
    int fd;                  /* the socket (MHD owns it) */
    struct conn_s *prev;     /* gw->conns list */
    struct conn_s *next;
    req_t *req;              /* request in the handler, NULL between */
    bool evicted;            /* shut down here; MHD closes it soon */
    bool used;               /* a request line has arrived on it */
    uint64_t t_idle;         /* connected, or the last request ended (ns) */
    uint64_t t_req_start;    /* request line arrived (ns, 0: none) */
} conn_t;

/* One choice of a generation request (choices[].index = its place):
 * one router request, prompt i / n, sample i % n. */
typedef struct {
    uint64_t rid;            /* router request id (0: ended or not sent) */
    const char *finish;      /* finish_reason once finished, NULL before */
    bt_buf_t text;           /* non-stream: gathered text (echo first) */
    uint32_t n_tokens;       /* ids received */
    uint32_t prompt_tokens;  /* Finished.usage */
    uint32_t completion_tokens;
    uint64_t prompt_est;     /* the prompt's tokens as charged */
    uint64_t t_first;        /* first token received (ns) */
    bool first_seen;         /* a chunk was shown (echo goes first) */
    char *echo_text;         /* owned: the prompt's text (echo), or NULL */
    gateway_lp_t *lp;        /* (n_lp, cap_lp) non-stream: every token's */
    int n_lp;
    int cap_lp;
    gateway_lp_t *plp;       /* (n_plp) prompt_logprobs, owned */
    int n_plp;
    int last_id;             /* the last token shown (token strings) */
    uint32_t text_off;       /* stream: text_offset of the next token */
} choice_t;

/* One request: MHD's request context, from the headers to the end. */
struct req_s {
    gateway_t *gw;           /* the gateway serving it */
    conn_t *conn;            /* its connection (NULL once closed) */
    struct MHD_Connection *mhd; /* MHD's handle of the connection */
    gateway_endpoint_t ep;   /* for metrics */
    bool has_body;           /* POST: wait for the body before dispatch */
    bool dispatched;         /* answered or at the router */
    bool queued;             /* a response is queued with MHD */
    bool suspended;          /* MHD_suspend_connection in effect */
    bool dead;               /* client gone or killed: close */
    bool close;              /* Connection: close on the response */
    char cors[256];          /* Access-Control-Allow-Origin value, or "" */
    bt_buf_t body;           /* request body */
    struct MHD_Response *resp; /* ready, not yet queued */
    int status;              /* status of the response */
    char request_id[GATEWAY_REQUEST_ID_MAX + 1]; /* X-Request-Id: the
                                client's or made here */
    conn_job_t job;
    uint64_t rid;            /* router request id of a status job */
    uint64_t t_deadline;     /* job gives up at this time (ns) */
    /* generation requests: one router request per choice; the job ends
     * when every choice has finished, or at the first that fails */
    choice_t *choices;       /* (n_choices) owned */
    int n_choices;
    int n_per_prompt;        /* OpenAI's n */
    int n_open;              /* choices still at the router */
    gateway_api_resp_t resp_info; /* id, created, model, usage */
    char id[48];             /* resp_info.id storage */
    bool stream;
    bool include_usage;
    bool stream_started;     /* the 200 head and reader are set up */
    bool stream_done;        /* [DONE] is in sse */
    bt_buf_t sse;            /* stream bytes not yet taken by MHD */
    uint64_t t_start;        /* request dispatched (ns) */
    gateway_tenant_t *tenant; /* admitted against this tenant's limits
                                (NULL: none); released at the job's end */
    uint64_t charged;        /* tokens charged to it at admission */
    /* logprobs and echo (issue 39) */
    bool logprobs;           /* choices[].logprobs asked */
    bool echo_lp;            /* ... with the echoed prompt's tokens */
    bool show_plp;           /* vLLM's prompt_logprobs asked */
};

typedef struct {
    uint64_t rid;  /* 0 = empty */
    req_t *conn;   /* the request waiting for rid */
    int choice;    /* its choice (-1: a status job) */
} rid_entry_t;

struct gateway_s {
    gateway_config_t cfg;
    char *model_name;            /* owned copy */
    int listen_fd;
    int port;
    int epoll_fd;
    int router_fd;               /* ZMQ_FD of the client socket */
    struct MHD_Daemon *mhd;
    bool tls;                    /* HTTPS only */
    char *tls_cert;              /* PEM text (owned) */
    char *tls_key;               /* PEM text (owned; a secret) */
    gateway_cors_t *cors;        /* allowed origins, NULL: no CORS */
    client_t *client;
    gateway_auth_t *auth;        /* API keys and tenants, NULL: open */
    tok_t *tok;                  /* NULL without --tokenizer */
    gateway_api_ctx_t api;
    conn_t *conns;               /* open connections */
    int n_conns;
    int n_evicted;               /* of which shut down, not yet closed */
    rid_entry_t *map;            /* (map_cap) rid -> request */
    size_t map_cap;
    size_t map_n;                /* entries in use (at most half) */
    gateway_metrics_t metrics;
    bt_buf_t scratch;            /* event JSON under construction */
    uint64_t id_counter;         /* response ids */
    uint32_t max_context;        /* cluster context (tokens), 0 unknown */
    uint64_t ctx_rid;            /* our own status request, 0 none */
    uint64_t t_ctx_asked;        /* when it was sent (ns) */
    uint64_t losses_seen;        /* client_router_losses() last sweep */
    volatile sig_atomic_t stop;
};

// ---------------------------------------------------------------------------
// rid -> request map (linear probing, backward-shift deletion)

static size_t map_hash(const gateway_t *gw, uint64_t rid)
{
    return (size_t)((rid * 0x9e3779b97f4a7c15ull) >> 17) & (gw->map_cap - 1);
}

static void map_insert(gateway_t *gw, const rid_entry_t *e)
{
    size_t i = map_hash(gw, e->rid);

    while (gw->map[i].rid != 0)
        i = (i + 1) & (gw->map_cap - 1);
    gw->map[i] = *e;
}

/* Doubles the table (a request may hold GATEWAY_MAX_CHOICES ids, so the
 * connection limit does not bound the entries).  False: no memory. */
static bool map_grow(gateway_t *gw)
{
    rid_entry_t *old = gw->map;
    size_t old_cap = gw->map_cap;

    gw->map = bt_calloc(old_cap * 2, sizeof(*gw->map), "gateway");
    if (gw->map == NULL) {
        gw->map = old;
        return false;
    }
    gw->map_cap = old_cap * 2;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].rid != 0)
            map_insert(gw, &old[i]);
    bt_free(old);
    return true;
}

/* rid -> (conn, choice); false: no memory to grow the table. */
static bool map_put(gateway_t *gw, uint64_t rid, req_t *conn, int choice)
{
    rid_entry_t e = { rid, conn, choice };

    if ((gw->map_n + 1) * 2 > gw->map_cap && !map_grow(gw))
        return false;
    map_insert(gw, &e);
    gw->map_n++;
    return true;
}

static req_t *map_get(const gateway_t *gw, uint64_t rid, int *choice_p)
{
    size_t i = map_hash(gw, rid);

    if (rid == 0)
        return NULL;
    while (gw->map[i].rid != 0) {
        if (gw->map[i].rid == rid) {
            *choice_p = gw->map[i].choice;
            return gw->map[i].conn;
        }
        i = (i + 1) & (gw->map_cap - 1);
    }
    return NULL;
}

static void map_remove(gateway_t *gw, uint64_t rid)
{
    size_t mask = gw->map_cap - 1;
    size_t i = map_hash(gw, rid), j;

    while (gw->map[i].rid != rid) {
        if (gw->map[i].rid == 0)
            return;
        i = (i + 1) & mask;
    }
    gw->map[i].rid = 0;
    gw->map_n--;
    /* shift back the entries of the cluster that follows */
    for (j = (i + 1) & mask; gw->map[j].rid != 0; j = (j + 1) & mask) {
        size_t h = map_hash(gw, gw->map[j].rid);
        /* entry j may move to i when h is not in (i, j] cyclically */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            gw->map[i] = gw->map[j];
            gw->map[j].rid = 0;
            i = j;
        }
    }
}


// ---------------------------------------------------------------------------
// Requests: jobs, responses

/* Lets MHD go on with a suspended request (a response or stream bytes are
 * ready, or it is to be closed). */
static void req_resume(req_t *req)
{
    if (!req->suspended)
        return;
    req->suspended = false;
    MHD_resume_connection(req->mhd);
}

/* Forgets choice i's router request (it ended, or is given up: cancel
 * asks the router to stop it). */
static void choice_forget(gateway_t *gw, req_t *req, int i, bool cancel)
{
    choice_t *ch = &req->choices[i];

    if (ch->rid == 0)
        return;
    if (cancel && client_cancel(gw->client, ch->rid) != BT_OK)
        BT_LOG_WARN("HTTP", "cannot cancel request %llu",
                    (unsigned long long)ch->rid);
    map_remove(gw, ch->rid);
    ch->rid = 0;
    req->n_open--;
    gw->metrics.in_flight--;
}

/* Ends the router side of the request's job: cancels the choices of a
 * generation still running there (cancel = true) and forgets the
 * request ids. */
static void job_drop(gateway_t *gw, req_t *req, bool cancel)
{
    if (req->job == JOB_NONE)
        return;
    if (req->job == JOB_GENERATE) {
        uint64_t used = 0;

        if (cancel && req->n_open > 0)
            gw->metrics.cancelled++;
        for (int i = 0; i < req->n_choices; i++) {
            choice_forget(gw, req, i, cancel);
            used += req->choices[i].prompt_est + req->choices[i].n_tokens;
        }
        if (req->tenant != NULL) /* tokens it cost: prompts + received */
            gateway__tenant_release(req->tenant, req->charged, used,
                                    req->n_choices);
        req->tenant = NULL;
    } else {
        map_remove(gw, req->rid);
    }
    req->job = JOB_NONE;
    req->rid = 0;
}

/* A generation that failed (a choice's error, the gateway's timeout):
 * the choices still running are cancelled at the router; not counted
 * as a client's cancel. */
static void job_abort(gateway_t *gw, req_t *req)
{
    if (req->job != JOB_GENERATE)
        return;
    for (int i = 0; i < req->n_choices; i++)
        choice_forget(gw, req, i, true);
    job_drop(gw, req, false);
}

/* Gives up on a request: its router job is cancelled and MHD closes the
 * connection at the next chance. */
static void req_kill(gateway_t *gw, req_t *req)
{
    job_drop(gw, req, true);
    req->dead = true;
    req_resume(req);
}

/* Adds "Name: value\r\n" lines to a response. */
static void add_extra_headers(struct MHD_Response *r, const char *extra)
{
    char line[1024];

    while (extra != NULL && *extra != '\0') {
        const char *end = strstr(extra, "\r\n");
        size_t len = end ? (size_t)(end - extra) : strlen(extra);
        char *colon;

        if (len < sizeof(line)) {
            memcpy(line, extra, len);
            line[len] = '\0';
            colon = strchr(line, ':');
            if (colon != NULL) {
                char *v = colon + 1;
                *colon = '\0';
                while (*v == ' ')
                    v++;
                MHD_add_response_header(r, line, v);
            }
        }
        extra = end ? end + 2 : extra + len;
    }
}

/* The headers of every response: server, request id, CORS, close. */
static void add_common_headers(const req_t *req, struct MHD_Response *r,
                               const char *ctype)
{
    MHD_add_response_header(r, "Server", "baton-http");
    if (ctype != NULL)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (req->request_id[0] != '\0')
        MHD_add_response_header(r, "X-Request-Id", req->request_id);
    if (req->cors[0] != '\0') {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", req->cors);
        MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                "X-Request-Id, Retry-After");
        if (strcmp(req->cors, "*") != 0)
            MHD_add_response_header(r, "Vary", "Origin");
    }
    if (req->close)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* Counts and logs the response of a request (status known). */
static void req_count(gateway_t *gw, req_t *req, int status)
{
    req->status = status;
    BT_LOG_INFO("HTTP", "request %s: %s %d", req->request_id,
                gateway__metrics_endpoint_name(req->ep), status);
    gateway__metrics_request(&gw->metrics, req->ep, status);
}

/* Sets the whole response of a request (copied); it is queued by the
 * handler, now or once the connection is resumed. */
static void req_respond(gateway_t *gw, req_t *req, int status,
                        const char *ctype, const char *body, size_t len,
                        const char *extra)
{
    struct MHD_Response *r;

    if (req->resp != NULL || req->queued || req->dead)
        return;
    r = MHD_create_response_from_buffer(len, (void *)body,
                                        MHD_RESPMEM_MUST_COPY);
    if (r == NULL) {
        req_kill(gw, req);
        return;
    }
    add_common_headers(req, r, ctype);
    add_extra_headers(r, extra);
    req->resp = r;
    req_count(gw, req, status);
    req_resume(req);
}

static void req_respond_error(gateway_t *gw, req_t *req,
                              const gateway_api_error_t *err,
                              const char *extra)
{
    bt_buf_t *b = &gw->scratch;
    char retry[48];

    b->len = 0;
    if (gateway__api_error_json(err, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK) {
        req_kill(gw, req);
        return;
    }
    if (extra == NULL && (err->status == 429 || err->status == 503 ||
                          err->retry_after_ms > 0)) {
        unsigned secs = (err->retry_after_ms + 999) / 1000;
        snprintf(retry, sizeof(retry), "Retry-After: %u\r\n",
                 secs > 0 ? secs : 1);
        extra = retry;
    }
    if (err->status >= 500 && err->status != 503 && err->status != 504)
        BT_LOG_WARN("HTTP", "request %s: %d: %s", req->request_id,
                    err->status, err->message);
    req_respond(gw, req, err->status, "application/json", b->data, b->len,
                extra);
}

static void respond_simple_error(gateway_t *gw, req_t *req, int status,
                                 const char *type, const char *code,
                                 const char *msg, const char *extra)
{
    gateway_api_error_t err;

    gateway__api_error_set(&err, status, type, code, NULL, "%s", msg);
    req_respond_error(gw, req, &err, extra);
}

// ---------------------------------------------------------------------------
// Streams (SSE)

/* MHD's content reader of a stream: hands out the queued SSE bytes; with
 * none, suspends the connection until the router sends more (returning 0
 * without suspending would make MHD spin). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    req_t *req = cls;
    size_t n;

    (void)pos;
    if (req->dead)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (req->sse.len > 0) {
        n = req->sse.len < max ? req->sse.len : max;
        memcpy(buf, req->sse.data, n);
        bt_buf_consume(&req->sse, n);
        return (ssize_t)n;
    }
    if (req->stream_done)
        return MHD_CONTENT_READER_END_OF_STREAM;
    req->suspended = true;
    MHD_suspend_connection(req->mhd);
    return 0;
}

/* Queues one SSE event "data: JSON\n\n" (MHD frames it as a chunk). */
static void stream_event(gateway_t *gw, req_t *req, const char *data,
                         size_t len)
{
    if (req->dead)
        return;
    if (bt_buf_append(&req->sse, "data: ", 6) != BT_OK ||
        bt_buf_append(&req->sse, data, len) != BT_OK ||
        bt_buf_append(&req->sse, "\n\n", 2) != BT_OK) {
        req_kill(gw, req);
        return;
    }
    if (req->sse.len > gw->cfg.max_stream_buffer) {
        BT_LOG_WARN("HTTP", "stream reader too slow: %zu bytes unsent, "
                    "closing", req->sse.len);
        req_kill(gw, req);
        return;
    }
    req_resume(req);
}

/* The 200 head of a stream (and chat's role delta), once. */
static void stream_head(gateway_t *gw, req_t *req)
{
    struct MHD_Response *r;

    if (req->stream_started || req->dead)
        return;
    req->stream_started = true;
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
                                          stream_read, req, NULL);
    if (r == NULL) {
        req_kill(gw, req);
        return;
    }
    add_common_headers(req, r, "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    req->resp = r;
    req_count(gw, req, 200);
    for (int i = 0; req->resp_info.kind == GATEWAY_API_CHAT &&
                    i < req->n_choices; i++) {
        /* each choice's role delta first, as OpenAI streams them */
        gateway_api_choice_t c = { .index = i, .text = "" };
        gw->scratch.len = 0;
        if (gateway__api_chunk_json(&req->resp_info, &c, true,
                                    req->include_usage,
                                    &gw->scratch) == BT_OK)
            stream_event(gw, req, gw->scratch.data, gw->scratch.len);
    }
    req_resume(req);
}

static void stream_end(gateway_t *gw, req_t *req)
{
    stream_event(gw, req, "[DONE]", 6);
    req->stream_done = true;
    req_resume(req);
}


// ---------------------------------------------------------------------------
// Router messages

/* Appends n entries to *a (n_p, cap_p); false: no memory. */
static bool lp_append(gateway_lp_t **a, int *n_p, int *cap_p,
                      const gateway_lp_t *e, int n)
{
    if (*n_p + n > *cap_p) {
        int cap = BT_MAX(*cap_p * 2, *n_p + n + 16);
        gateway_lp_t *b = bt_realloc(*a, (size_t)cap * sizeof(*b),
                                     "gateway_logprobs");
        if (b == NULL)
            return false;
        *a = b;
        *cap_p = cap;
    }
    memcpy(*a + *n_p, e, (size_t)n * sizeof(*e));
    *n_p += n;
    return true;
}

/* n entries from ids, one logprob each and the same count of
 * alternatives each (top: (n, k)); first_null: entry 0 has no logprob
 * (the prompt's first token; then lps/top start at entry 1).  NULL (and
 * *n_p 0) when the sizes do not match. */
static gateway_lp_t *lp_entries(const int32_t *ids, size_t n,
                                const float *lps, size_t n_lps,
                                const int32_t *top_ids, size_t n_top_ids,
                                const float *top_lps, size_t n_top_lps,
                                bool first_null, int *n_p)
{
    size_t with = first_null ? n - 1 : n, k;
    gateway_lp_t *e;

    *n_p = 0;
    if (n == 0 || n_lps != with || n_top_ids != n_top_lps ||
        (with > 0 && n_top_ids % with != 0) || (with == 0 && n_top_ids))
        return NULL;
    k = with > 0 ? n_top_ids / with : 0;
    if (k > PARAMS_MAX_LOGPROBS)
        return NULL;
    e = bt_calloc(n, sizeof(*e), "gateway_logprobs");
    if (e == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t j = first_null ? i - 1 : i;
        e[i].id = ids[i];
        if (first_null && i == 0)
            continue;
        e[i].has_logprob = true;
        e[i].logprob = lps[j];
        e[i].n_top = (int)k;
        for (size_t t = 0; t < k; t++) {
            e[i].top_ids[t] = top_ids[j * k + t];
            e[i].top_logprobs[t] = top_lps[j * k + t];
        }
    }
    *n_p = (int)n;
    return e;
}

static void generation_fail(gateway_t *gw, req_t *req,
                            const gateway_api_error_t *err);

/* Tokens of choice i: gathered (non-stream) or sent as a chunk with its
 * index (stream). */
static void on_chunk(gateway_t *gw, req_t *req, int i,
                     const Baton__TokenChunk *c)
{
    const char *text = c->has_text ? (const char *)c->text.data : "";
    size_t len = c->has_text ? c->text.len : 0;
    uint64_t now = bt_time_ns();
    gateway_lp_t *pe = NULL, *ge = NULL, *all = NULL;
    int n_pe = 0, n_ge = 0, n_all = 0, cap_all = 0;
    choice_t *ch = &req->choices[i];
    bool first = !ch->first_seen;
    gateway_api_choice_t view;
    bt_buf_t shown;

    if (req->job != JOB_GENERATE)
        return;
    if (ch->t_first == 0 && c->n_ids > 0) {
        ch->t_first = now;
        bt_prom_hist_observe(&gw->metrics.ttft,
                             (double)(now - req->t_start) * 1e-9);
    }
    ch->n_tokens += (uint32_t)c->n_ids;
    ch->first_seen = true;
    /* the prompt's (first chunk) then the generated tokens' logprobs */
    if (first && c->n_prompt_ids > 0 && (req->echo_lp || req->show_plp))
        pe = lp_entries(c->prompt_ids, c->n_prompt_ids, c->prompt_logprobs,
                        c->n_prompt_logprobs, c->prompt_top_ids,
                        c->n_prompt_top_ids, c->prompt_top_logprobs,
                        c->n_prompt_top_logprobs, true, &n_pe);
    if (req->logprobs && c->n_ids > 0)
        ge = lp_entries(c->ids, c->n_ids, c->logprobs, c->n_logprobs,
                        c->top_ids, c->n_top_ids, c->top_logprobs,
                        c->n_top_logprobs, false, &n_ge);
    if ((first && (req->echo_lp || req->show_plp) && pe == NULL) ||
        (req->logprobs && c->n_ids > 0 && ge == NULL) ||
        (req->echo_lp && pe != NULL &&
         !lp_append(&all, &n_all, &cap_all, pe, n_pe)) ||
        (ge != NULL && !lp_append(&all, &n_all, &cap_all, ge, n_ge))) {
        /* asked, not sent (a worker without logprobs) or no memory:
         * never answer without what was asked */
        gateway_api_error_t err;
        BT_LOG_WARN("HTTP", "request %s: logprobs missing from the "
                    "cluster's reply", req->id);
        job_drop(gw, req, true);
        gateway__api_error_set(&err, 502, "server_error", "worker_failed",
                               NULL, "the cluster returned no logprobs "
                               "for this request");
        generation_fail(gw, req, &err);
        goto out;
    }
    if (pe != NULL && req->show_plp) {
        ch->plp = pe;
        ch->n_plp = n_pe;
        pe = NULL;
    }
    if (!req->stream) {
        if (bt_buf_append(&ch->text, text, len) != BT_OK ||
            (n_all > 0 &&
             !lp_append(&ch->lp, &ch->n_lp, &ch->cap_lp, all, n_all)))
            goto err_kill;
        goto out;
    }
    stream_head(gw, req);
    if (len == 0 && n_all == 0 && !(first && (ch->echo_text != NULL ||
                                              ch->plp != NULL)))
        goto out;
    bt_buf_init(&shown);
    if ((first && ch->echo_text != NULL &&
         bt_buf_append(&shown, ch->echo_text, strlen(ch->echo_text)) !=
             BT_OK) ||
        bt_buf_append(&shown, text, len) != BT_OK) {
        bt_buf_cleanup(&shown);
        goto err_kill;
    }
    memset(&view, 0, sizeof(view));
    view.index = i;
    view.text = shown.data;
    view.text_len = shown.len;
    view.logprobs = req->logprobs;
    view.lp = all;
    view.n_lp = n_all;
    view.prev_id = ch->last_id;
    view.text_offset = ch->text_off;
    view.plp = first && req->show_plp ? ch->plp : NULL;
    view.n_plp = ch->n_plp;
    gw->scratch.len = 0;
    if (gateway__api_chunk_json(&req->resp_info, &view, false,
                                req->include_usage, &gw->scratch) != BT_OK) {
        bt_buf_cleanup(&shown);
        goto err_kill;
    }
    ch->text_off += gateway__api_lp_chars(&req->resp_info, &view);
    if (n_all > 0)
        ch->last_id = all[n_all - 1].id;
    bt_buf_cleanup(&shown);
    stream_event(gw, req, gw->scratch.data, gw->scratch.len);
    goto out;

err_kill:
    req_kill(gw, req);
out:
    bt_free(pe);
    bt_free(ge);
    bt_free(all);
}

static const char *finish_name(Baton__FinishReason r)
{
    switch (r) {
    case BATON__FINISH_REASON__FINISH_LENGTH: return "length";
    case BATON__FINISH_REASON__FINISH_CANCELLED: return "cancelled";
    default: return "stop";
    }
}

/* Every choice has finished: usage summed (a prompt's tokens once, not
 * once per sample, as OpenAI counts n), then the response, or the usage
 * chunk and [DONE]. */
static void generation_done(gateway_t *gw, req_t *req)
{
    gateway_api_resp_t *ri = &req->resp_info;
    gateway_api_choice_t *views = NULL;
    bt_buf_t *b = &gw->scratch;

    job_drop(gw, req, false); /* ends the job: the tenant's slots */
    ri->prompt_tokens = 0;
    ri->completion_tokens = 0;
    for (int i = 0; i < req->n_choices; i++) {
        if (i % req->n_per_prompt == 0)
            ri->prompt_tokens += req->choices[i].prompt_tokens;
        ri->completion_tokens += req->choices[i].completion_tokens;
    }
    bt_prom_hist_observe(&gw->metrics.e2e,
                         (double)(bt_time_ns() - req->t_start) * 1e-9);
    b->len = 0;
    if (req->stream) {
        if (req->include_usage) {
            if (gateway__api_usage_chunk_json(ri, b) != BT_OK)
                goto err_kill;
            stream_event(gw, req, b->data, b->len);
        }
        stream_end(gw, req);
        return;
    }
    views = bt_calloc((size_t)req->n_choices, sizeof(*views),
                      "gateway_choices");
    if (views == NULL)
        goto err_kill;
    for (int i = 0; i < req->n_choices; i++) {
        const choice_t *ch = &req->choices[i];
        views[i].index = i;
        views[i].text = ch->text.data;
        views[i].text_len = ch->text.len;
        views[i].finish = ch->finish;
        views[i].logprobs = req->logprobs;
        views[i].lp = ch->lp;
        views[i].n_lp = ch->n_lp;
        views[i].prev_id = -1;
        views[i].plp = req->show_plp ? ch->plp : NULL;
        views[i].n_plp = ch->n_plp;
    }
    if (gateway__api_response_json(ri, views, req->n_choices, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK)
        goto err_kill;
    bt_free(views);
    req_respond(gw, req, 200, "application/json", b->data, b->len, NULL);
    return;

err_kill:
    bt_free(views);
    req_kill(gw, req);
}

/* Choice i has finished: its finish chunk (stream), then the whole
 * request once it was the last. */
static void on_finished(gateway_t *gw, req_t *req, int i,
                        const Baton__Finished *f)
{
    choice_t *ch = &req->choices[i];
    uint64_t now = bt_time_ns();
    bt_buf_t *b = &gw->scratch;

    if (req->job != JOB_GENERATE)
        return;
    if (req->stream && !ch->first_seen && ch->echo_text != NULL) {
        /* nothing came (the first token was a stop): the prompt still
         * shows */
        Baton__TokenChunk none = BATON__TOKEN_CHUNK__INIT;
        on_chunk(gw, req, i, &none);
        if (req->dead || req->job != JOB_GENERATE)
            return;
    }
    choice_forget(gw, req, i, false);
    ch->finish = finish_name(f->reason);
    ch->prompt_tokens = f->usage ? f->usage->prompt_tokens : 0;
    ch->completion_tokens =
        f->usage ? f->usage->completion_tokens : ch->n_tokens;
    gw->metrics.prompt_tokens += ch->prompt_tokens;
    gw->metrics.completion_tokens += ch->completion_tokens;
    if (ch->n_tokens > 1 && ch->t_first != 0)
        bt_prom_hist_observe(&gw->metrics.tpot,
                             (double)(now - ch->t_first) * 1e-9 /
                                 (ch->n_tokens - 1));
    if (req->stream) {
        gateway_api_choice_t view = { .index = i, .text = "",
                                      .finish = ch->finish };
        stream_head(gw, req);
        b->len = 0;
        if (gateway__api_chunk_json(&req->resp_info, &view, false,
                                    req->include_usage, b) != BT_OK) {
            req_kill(gw, req);
            return;
        }
        stream_event(gw, req, b->data, b->len);
        if (req->dead)
            return; /* a reader too slow: killed, nothing more to send */
    }
    if (req->n_open == 0)
        generation_done(gw, req);
}

/* Fails the current generation with err: a JSON error response, or an
 * error event when the stream has begun. */
static void generation_fail(gateway_t *gw, req_t *req,
                            const gateway_api_error_t *err)
{
    if (req->stream && req->stream_started) {
        gw->scratch.len = 0;
        if (gateway__api_error_json(err, &gw->scratch) != BT_OK) {
            req_kill(gw, req);
            return;
        }
        stream_event(gw, req, gw->scratch.data, gw->scratch.len);
        stream_end(gw, req);
        return;
    }
    req_respond_error(gw, req, err, NULL);
}

static void respond_health(gateway_t *gw, req_t *req,
                           const Baton__ClusterStatus *cs);
static void respond_metrics(gateway_t *gw, req_t *req,
                            const Baton__ClusterStatus *cs);

/* An error for choice i (or the status job): a generation fails as a
 * whole, its other choices cancelled at the router (never a response
 * with a choice missing). */
static void on_error(gateway_t *gw, req_t *req, int i, const Baton__Error *e)
{
    gateway_api_error_t err;
    conn_job_t job = req->job;
    char msg[sizeof(err.message)];

    if (job == JOB_HEALTH || job == JOB_METRICS) {
        /* the status request was lost with the router */
        job_drop(gw, req, false);
        if (job == JOB_HEALTH)
            respond_health(gw, req, NULL);
        else
            respond_metrics(gw, req, NULL);
        return;
    }
    if (job != JOB_GENERATE)
        return;
    job_abort(gw, req);
    if (req->n_choices > 1)
        snprintf(msg, sizeof(msg), "choice %d (prompt %d): %s", i,
                 i / req->n_per_prompt, e->message ? e->message : "");
    else
        snprintf(msg, sizeof(msg), "%s", e->message ? e->message : "");
    gateway__api_error_from_router(e->code, msg,
                                   e->has_retry_after_ms ? e->retry_after_ms
                                                         : 0,
                                   &err);
    generation_fail(gw, req, &err);
}

static void respond_health(gateway_t *gw, req_t *req,
                           const Baton__ClusterStatus *cs)
{
    int n_prefill = 0, n_decode = 0, n_both = 0, status;
    char body[256];
    int n;

    if (cs == NULL) {
        n = snprintf(body, sizeof(body), "{\"status\":\"%s\"}\n",
                     client_router_state(gw->client) == CLIENT_ROUTER_LOST
                         ? "router_lost"
                         : "router_unreachable");
        req_respond(gw, req, 503, "application/json", body, (size_t)n,
                    "Retry-After: 1\r\n");
        return;
    }
    /* Serving needs a worker that can prefill (a prefill worker, or a
     * decode worker running --role both: aggregated clusters have no
     * prefill worker at all) and one that decodes.  Draining workers take
     * no new work and do not count. */
    for (size_t i = 0; i < cs->n_workers; i++) {
        const Baton__WorkerStatus *w = cs->workers[i];
        if (w->draining)
            continue;
        n_prefill += w->role == BATON__ROLE__ROLE_PREFILL;
        n_decode += w->role == BATON__ROLE__ROLE_DECODE;
        n_both += w->role == BATON__ROLE__ROLE_DECODE && w->can_prefill;
    }
    status = n_prefill + n_both > 0 && n_decode > 0 ? 200 : 503;
    n = snprintf(body, sizeof(body),
                 "{\"status\":\"%s\",\"prefill_workers\":%d,"
                 "\"decode_workers\":%d,\"aggregated_workers\":%d,"
                 "\"queued\":%u,\"in_flight\":%u}\n",
                 status == 200 ? "ok" : "no_workers", n_prefill, n_decode,
                 n_both, cs->queued, cs->in_flight);
    req_respond(gw, req, status, "application/json", body, (size_t)n,
                status == 503 ? "Retry-After: 1\r\n" : NULL);
}

static void respond_metrics(gateway_t *gw, req_t *req,
                            const Baton__ClusterStatus *cs)
{
    bt_buf_t *b = &gw->scratch;

    b->len = 0;
    gw->metrics.connections = gw->n_conns - gw->n_evicted;
    if (gateway__metrics_render(&gw->metrics, cs, b) != BT_OK) {
        req_kill(gw, req);
        return;
    }
    req_respond(gw, req, 200, "text/plain; version=0.0.4; charset=utf-8",
                b->data, b->len, NULL);
}

static void on_status(gateway_t *gw, req_t *req,
                      const Baton__ClusterStatus *cs)
{
    conn_job_t job = req->job;

    if (job != JOB_HEALTH && job != JOB_METRICS)
        return;
    job_drop(gw, req, false);
    if (job == JOB_HEALTH)
        respond_health(gw, req, cs);
    else
        respond_metrics(gw, req, cs);
}

/* Takes every message the router has for us now. */
static void drain_router(gateway_t *gw)
{
    for (;;) {
        Baton__ClientMessage *m = NULL;
        bt_status_t status = client_recv(gw->client, 0, &m);
        req_t *req;
        int choice = -1;

        if (status == BT_ERR_FORMAT)
            continue; /* logged by the client library */
        if (status != BT_OK)
            return;
        if (gw->ctx_rid != 0 && client_msg_request_id(m) == gw->ctx_rid) {
            if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
                m->status->has_max_context)
                gw->max_context = m->status->max_context;
            gw->ctx_rid = 0;
            proto_client_free(&m);
            continue;
        }
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
            m->status->has_max_context && m->status->max_context > 0)
            gw->max_context = m->status->max_context;
        req = map_get(gw, client_msg_request_id(m), &choice);
        if (req != NULL && !req->dead) {
            bool gen = choice >= 0 && req->job == JOB_GENERATE;
            switch (m->body_case) {
            case BATON__CLIENT_MESSAGE__BODY_CHUNK:
                if (gen)
                    on_chunk(gw, req, choice, m->chunk);
                break;
            case BATON__CLIENT_MESSAGE__BODY_FINISHED:
                if (gen)
                    on_finished(gw, req, choice, m->finished);
                break;
            case BATON__CLIENT_MESSAGE__BODY_ERROR:
                on_error(gw, req, choice, m->error);
                break;
            case BATON__CLIENT_MESSAGE__BODY_STATUS:
                on_status(gw, req, m->status);
                break;
            default:
                break;
            }
        }
        proto_client_free(&m);
    }
}

// ---------------------------------------------------------------------------
// Dispatch

/* True (err set: 400 context_length_exceeded) when prompt p cannot fit
 * the cluster's context, so that no worker spends time on it.  Token ids
 * are counted exactly.  Text is bounded by bytes first (a token is at
 * most tok_max_piece_len bytes, or --max-token-bytes without a
 * tokenizer), then, with a tokenizer and a prompt near the bound,
 * counted exactly.  A list's entry is named by its index. */
static bool prompt_too_long(gateway_t *gw, const gateway_api_req_t *areq,
                            int p, gateway_api_error_t *err)
{
    const gateway_api_prompt_t *pr = &areq->prompts[p];
    uint32_t ctx = gw->max_context;
    size_t bytes, per_token, n_tokens = 0;
    char where[32] = "the prompt";

    if (ctx == 0)
        return false; /* not known yet: the router checks */
    if (pr->ids != NULL) {
        n_tokens = (size_t)pr->n_ids;
    } else if (pr->text != NULL) {
        bytes = strlen(pr->text);
        per_token = gw->tok ? (size_t)BT_MAX(tok_max_piece_len(gw->tok), 1)
                            : (size_t)gw->cfg.max_token_bytes;
        n_tokens = (bytes + per_token - 1) / per_token; /* a lower bound */
        if (n_tokens < ctx && gw->tok != NULL && bytes + 1 >= ctx &&
            bytes <= (1u << 20)) {
            int *ids = NULL, n = 0;
            if (tok_encode(gw->tok, pr->text, bytes,
                           areq->req.add_bos && tok_adds_bos(gw->tok), &ids,
                           &n) == BT_OK)
                n_tokens = (size_t)n;
            bt_free(ids);
        }
    }
    if (n_tokens < ctx)
        return false;
    if (areq->n_prompts > 1)
        snprintf(where, sizeof(where), "prompt[%d]", p);
    gateway__api_error_set(err, 400, "invalid_request_error",
                           "context_length_exceeded", "prompt",
                           "%s is %s%zu tokens, the context is %u",
                           where, pr->ids != NULL ? "" : "at least ",
                           n_tokens, ctx);
    return true;
}

/* Prompt tokens of prompt p: exact for ids, bytes / 4 for text (a
 * tenant's token-rate charge; corrected at the end). */
static uint64_t prompt_estimate(const gateway_api_req_t *areq, int p)
{
    const gateway_api_prompt_t *pr = &areq->prompts[p];

    if (pr->ids != NULL)
        return (uint64_t)pr->n_ids;
    return pr->text != NULL ? strlen(pr->text) / 4 + 1 : 1;
}

/* Admits a parsed request against its tenant's limits (none without
 * one): each choice counts as a request, and the tokens of all of them
 * are charged.  Stamps the request with the tenant's class, weight and
 * salt.  False: answered 429 (or 400 when the tenant can never run that
 * many at once). */
static bool tenant_admit(gateway_t *gw, req_t *conn, gateway_tenant_t *t,
                         gateway_api_req_t *areq)
{
    gateway_api_error_t err;
    uint64_t out, prompt = 0;
    uint32_t retry_ms = 0;
    const char *why = NULL;
    bt_status_t status;

    if (t == NULL)
        return true;
    for (int i = 0; i < conn->n_choices; i++)
        prompt += conn->choices[i].prompt_est;
    out = areq->req.max_tokens > 0 ? (uint64_t)areq->req.max_tokens
          : gw->max_context > 0    ? (uint64_t)gw->max_context
                                   : 1024;
    out *= (uint64_t)conn->n_choices;
    status = gateway__tenant_admit(t, bt_time_ns(), prompt + out,
                                   conn->n_choices, &retry_ms, &why);
    if (status != BT_OK) {
        gw->metrics.tenant_limited++;
        if (status == BT_ERR_INVALID_ARG) {
            gateway__api_error_set(&err, 400, "invalid_request_error",
                                   "too_many_choices", "n", "%s", why);
        } else {
            gateway__api_error_set(&err, 429, "rate_limit_exceeded",
                                   "rate_limit_exceeded", NULL, "%s", why);
            err.retry_after_ms = BT_MAX(retry_ms, 1000u);
        }
        req_respond_error(gw, conn, &err, NULL);
        return false;
    }
    conn->tenant = t;
    conn->charged = prompt + out;
    areq->req.tenant = t->name;
    areq->req.tenant_weight = t->weight;
    areq->req.cache_salt = t->cache_salt;
    if (areq->cache_salt[0] != '\0') {
        /* The body's salt under the tenant's: 32 hex digits of a keyed
         * hash of both, so no body reaches another tenant's blocks. */
        static const char key[] = "baton-tenant-slt"; /* 16 bytes */
        uint8_t buf[sizeof(t->cache_salt) + GATEWAY_CACHE_SALT_MAX + 1];
        size_t lt = strlen(t->cache_salt), lr = strlen(areq->cache_salt);
        bt_blockhash_t h;

        memcpy(buf, t->cache_salt, lt);
        buf[lt] = 0;
        memcpy(buf + lt + 1, areq->cache_salt, lr);
        h = bt_siphash128((const uint8_t *)key, buf, lt + 1 + lr);
        snprintf(areq->cache_salt, sizeof(areq->cache_salt),
                 "%016llx%016llx", (unsigned long long)h.hi,
                 (unsigned long long)h.lo);
        areq->req.cache_salt = areq->cache_salt;
    }
    areq->req.priority = t->priority; /* the tenant's class, not the body's */
    if (areq->req.precision == NULL)  /* the body's own class wins */
        areq->req.precision = t->precision;
    return true;
}


/* echo: keeps prompt p's text to show before choice ch's completion (a
 * text prompt as given, ids decoded by --tokenizer; without it an ids
 * prompt cannot be echoed: 400).  Non-streamed text starts with it now. */
static bt_status_t start_echo(gateway_t *gw, const gateway_api_req_t *areq,
                              int p, choice_t *ch, gateway_api_error_t *err)
{
    const gateway_api_prompt_t *pr = &areq->prompts[p];
    char *text = NULL;

    if (pr->ids != NULL) {
        if (gw->tok == NULL) {
            gateway__api_error_set(err, 400, "invalid_request_error", NULL,
                                   "echo", "'echo' of a token-id prompt "
                                   "needs baton-http --tokenizer");
            return BT_ERR_INVALID_ARG;
        }
        if (tok_decode(gw->tok, -1, pr->ids, pr->n_ids, &text) != BT_OK) {
            gateway__api_error_set(err, 400, "invalid_request_error", NULL,
                                   "prompt", "the prompt%s holds ids out of "
                                   "the vocabulary",
                                   areq->n_prompts > 1 ? " list" : "");
            return BT_ERR_INVALID_ARG;
        }
    } else {
        text = bt_strdup(pr->text ? pr->text : "", "gateway_echo");
    }
    if (text == NULL || (!areq->stream &&
                         bt_buf_append(&ch->text, text, strlen(text)) !=
                             BT_OK)) {
        bt_free(text);
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return BT_ERR_NO_MEMORY;
    }
    ch->echo_text = text;
    return BT_OK;
}

/* splitmix64: the seeds of a request's samples. */
static uint64_t seed_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The seed of sample j of a prompt: sample 0 keeps the request's (so n =
 * 1 is unchanged); the others get distinct seeds derived from it when
 * the body set one (reproducible), else fresh ones (independent). */
static uint64_t sample_seed(gateway_t *gw, const gateway_api_req_t *areq,
                            uint64_t seed, int j)
{
    if (j == 0)
        return seed;
    if (areq->has_seed)
        return seed_mix(seed ^ seed_mix((uint64_t)j));
    gw->id_counter++;
    return seed_mix(bt_time_ns() ^ (gw->id_counter * 0x9e3779b97f4a7c15ull));
}

/* Everything a request's choices need before any is sent: the state of
 * each, every prompt checked against the context, echo texts.  False:
 * answered (err), nothing sent. */
static bool choices_prepare(gateway_t *gw, req_t *req,
                            const gateway_api_req_t *areq,
                            gateway_api_error_t *err)
{
    int n = areq->n_prompts * areq->n;

    for (int p = 0; p < areq->n_prompts; p++) {
        if (prompt_too_long(gw, areq, p, err)) {
            gw->metrics.edge_too_long++;
            return false;
        }
    }
    req->choices = bt_calloc((size_t)n, sizeof(*req->choices),
                             "gateway_choices");
    if (req->choices == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    req->n_choices = n;
    req->n_per_prompt = areq->n;
    for (int i = 0; i < n; i++) {
        choice_t *ch = &req->choices[i];
        int p = i / areq->n;

        bt_buf_init(&ch->text);
        ch->last_id = -1;
        ch->prompt_est = prompt_estimate(areq, p);
        if (areq->echo && start_echo(gw, areq, p, ch, err) != BT_OK)
            return false;
    }
    return true;
}

/* Sends every choice to the router.  False: a send failed; the choices
 * sent are cancelled there. */
static bool choices_submit(gateway_t *gw, req_t *req,
                           gateway_api_req_t *areq)
{
    uint64_t seed = areq->req.seed;

    for (int i = 0; i < req->n_choices; i++) {
        choice_t *ch = &req->choices[i];
        uint64_t rid;

        gateway__api_req_use_prompt(areq, i / req->n_per_prompt);
        areq->req.seed = sample_seed(gw, areq, seed, i % req->n_per_prompt);
        if (client_submit(gw->client, &areq->req, &rid) != BT_OK)
            return false;
        if (!map_put(gw, rid, req, i)) {
            client_cancel(gw->client, rid);
            return false;
        }
        ch->rid = rid;
        req->n_open++;
        gw->metrics.in_flight++;
    }
    return true;
}

/* A completion or chat request: parsed and checked as a whole, then one
 * router request per choice (a prompt list, `n`). */
static void start_generation(gateway_t *gw, req_t *req,
                             gateway_api_kind_t kind,
                             gateway_tenant_t *tenant)
{
    gateway_api_req_t areq;
    gateway_api_error_t err;
    bool sent;

    if (client_router_state(gw->client) == CLIENT_ROUTER_LOST) {
        /* fail fast rather than queue behind a router that is gone */
        respond_simple_error(gw, req, 503, "service_unavailable",
                             "router_unreachable",
                             "the baton router is unreachable", NULL);
        return;
    }
    if (gateway__api_parse(&gw->api, kind, req->body.data, req->body.len,
                           &areq, &err) != BT_OK) {
        req_respond_error(gw, req, &err, NULL);
        return;
    }
    req->stream = areq.stream;
    req->include_usage = areq.stream && areq.include_usage;
    req->logprobs = areq.req.logprobs;
    req->echo_lp = areq.echo && areq.req.logprobs;
    req->show_plp = areq.show_prompt_logprobs;
    if (!choices_prepare(gw, req, &areq, &err)) {
        gateway__api_req_cleanup(&areq);
        req_respond_error(gw, req, &err, NULL);
        return;
    }
    if (!tenant_admit(gw, req, tenant, &areq)) {
        gateway__api_req_cleanup(&areq);
        return;
    }
    req->job = JOB_GENERATE;
    req->t_start = bt_time_ns();
    req->t_deadline =
        req->t_start + (uint64_t)gw->cfg.request_timeout_ms * 1000000ull;
    sent = choices_submit(gw, req, &areq);
    gateway__api_req_cleanup(&areq);
    if (!sent) {
        job_abort(gw, req);
        respond_simple_error(gw, req, 503, "service_unavailable",
                             "router_unreachable",
                             "cannot reach the baton router", NULL);
        return;
    }
    gw->id_counter++;
    snprintf(req->id, sizeof(req->id), "%s-%016llx",
             kind == GATEWAY_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)((req->t_start ^ (gw->id_counter *
                                   0x9e3779b97f4a7c15ull))));
    req->resp_info.kind = kind;
    req->resp_info.id = req->id;
    req->resp_info.created = (long long)time(NULL);
    req->resp_info.model = gw->model_name;
    req->resp_info.prompt_tokens = 0;
    req->resp_info.completion_tokens = 0;
    req->resp_info.tok = gw->tok;
}

static void start_status(gateway_t *gw, req_t *req, conn_job_t job)
{
    uint64_t rid;

    if (client_router_state(gw->client) != CLIENT_ROUTER_UP ||
        client_status_request(gw->client, &rid) != BT_OK) {
        if (job == JOB_HEALTH)
            respond_health(gw, req, NULL);
        else
            respond_metrics(gw, req, NULL);
        return;
    }
    if (!map_put(gw, rid, req, -1)) {
        respond_simple_error(gw, req, 500, "server_error", NULL,
                             "out of memory", NULL);
        return;
    }
    req->job = job;
    req->rid = rid;
    req->t_deadline =
        bt_time_ns() + (uint64_t)gw->cfg.status_timeout_ms * 1000000ull;
}

static void respond_models(gateway_t *gw, req_t *req, const char *one)
{
    bt_buf_t *b = &gw->scratch;

    b->len = 0;
    if (one != NULL && strcmp(one, gw->model_name) != 0) {
        respond_simple_error(gw, req, 404, "invalid_request_error",
                             "model_not_found", "no such model", NULL);
        return;
    }
    if (gateway__api_models_json(gw->model_name, (long long)time(NULL),
                                 one == NULL, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK) {
        req_kill(gw, req);
        return;
    }
    req_respond(gw, req, 200, "application/json", b->data, b->len, NULL);
}

/* /tokenize, /detokenize (gateway_tokenize.c): answered here, no router. */
static void respond_tokenize(gateway_t *gw, req_t *req, bool detokenize)
{
    gateway_api_error_t err;
    bt_buf_t *b = &gw->scratch;
    bt_status_t status;

    b->len = 0;
    if (detokenize)
        status = gateway__detokenize(&gw->api, req->body.data, req->body.len,
                                     b, &err);
    else
        status = gateway__tokenize(&gw->api, gw->max_context, req->body.data,
                                   req->body.len, b, &err);
    if (status != BT_OK) {
        req_respond_error(gw, req, &err, NULL);
        return;
    }
    if (bt_buf_append(b, "\n", 1) != BT_OK) {
        req_kill(gw, req);
        return;
    }
    req_respond(gw, req, 200, "application/json", b->data, b->len, NULL);
}

/* With API keys: the tenant of the request's Bearer key, or false after
 * answering 401 (nothing reaches the router).  Without keys: true with
 * *t_p NULL.  The key is never logged. */
static bool authorize(gateway_t *gw, req_t *req, gateway_tenant_t **t_p)
{
    gateway_tenant_t *t = NULL;
    int n_auth;
    const char *value;

    *t_p = NULL;
    if (gw->auth == NULL)
        return true;
    n_auth = gateway__http_header_count(req->mhd, "Authorization");
    value = MHD_lookup_connection_value(req->mhd, MHD_HEADER_KIND,
                                        "Authorization");
    if (n_auth == 1 && value != NULL)
        t = gateway__auth_check(gw->auth, value, strlen(value));
    if (t == NULL) {
        gw->metrics.unauthorized++;
        respond_simple_error(gw, req, 401, "invalid_request_error",
                             "invalid_api_key",
                             n_auth == 0 ? "no API key: send Authorization: "
                                           "Bearer KEY"
                                         : "incorrect API key provided",
                             "WWW-Authenticate: Bearer\r\n");
        return false;
    }
    *t_p = t;
    return true;
}

static void method_not_allowed(gateway_t *gw, req_t *req, const char *allow)
{
    char extra[64];

    snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
    respond_simple_error(gw, req, 405, "invalid_request_error",
                         "method_not_allowed",
                         strcmp(allow, "GET") == 0 ? "use GET" : "use POST",
                         extra);
}

/* Answers one complete request (now, or later from the router). */
static void dispatch(gateway_t *gw, req_t *req, const char *path,
                     const char *method)
{
    bool get = strcmp(method, "GET") == 0;
    bool post = strcmp(method, "POST") == 0;
    gateway_tenant_t *tenant = NULL;

    if (strcmp(path, "/v1/completions") == 0 ||
        strcmp(path, "/v1/chat/completions") == 0) {
        bool chat = strcmp(path, "/v1/chat/completions") == 0;
        req->ep = chat ? GATEWAY_EP_CHAT : GATEWAY_EP_COMPLETIONS;
        if (!post) {
            method_not_allowed(gw, req, "POST");
            return;
        }
        if (!authorize(gw, req, &tenant))
            return;
        start_generation(gw, req,
                         chat ? GATEWAY_API_CHAT : GATEWAY_API_COMPLETIONS,
                         tenant);
        return;
    }
    if (strcmp(path, "/v1/models") == 0 ||
        (strncmp(path, "/v1/models/", 11) == 0 && path[11] != '\0')) {
        req->ep = GATEWAY_EP_MODELS;
        if (!get) {
            method_not_allowed(gw, req, "GET");
            return;
        }
        if (!authorize(gw, req, &tenant))
            return;
        respond_models(gw, req, path[10] == '/' ? path + 11 : NULL);
        return;
    }
    if (strcmp(path, "/tokenize") == 0 || strcmp(path, "/detokenize") == 0) {
        req->ep = GATEWAY_EP_OTHER;
        if (!post) {
            method_not_allowed(gw, req, "POST");
            return;
        }
        if (!authorize(gw, req, &tenant))
            return;
        respond_tokenize(gw, req, path[1] == 'd');
        return;
    }
    if (strcmp(path, "/version") == 0) {
        char body[96];
        int n = snprintf(body, sizeof(body), "{\"version\":\"%s\"}\n",
                         BT_VERSION_STRING);
        req->ep = GATEWAY_EP_OTHER;
        if (!get) {
            method_not_allowed(gw, req, "GET");
            return;
        }
        req_respond(gw, req, 200, "application/json", body, (size_t)n, NULL);
        return;
    }
    if (strcmp(path, "/livez") == 0) {
        /* Liveness of this process only: answered by the event loop
         * without asking the router (a router restart or an empty
         * cluster must not get baton-http restarted). */
        static const char ok[] = "{\"status\":\"alive\"}\n";
        req->ep = GATEWAY_EP_LIVEZ;
        if (!get) {
            method_not_allowed(gw, req, "GET");
            return;
        }
        req_respond(gw, req, 200, "application/json", ok, sizeof(ok) - 1,
                    NULL);
        return;
    }
    if (strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0) {
        bool health = strcmp(path, "/health") == 0;
        req->ep = health ? GATEWAY_EP_HEALTH : GATEWAY_EP_METRICS;
        if (!get) {
            method_not_allowed(gw, req, "GET");
            return;
        }
        if (!health && gw->cfg.metrics_auth && !authorize(gw, req, &tenant))
            return;
        start_status(gw, req, health ? JOB_HEALTH : JOB_METRICS);
        return;
    }
    req->ep = GATEWAY_EP_OTHER;
    respond_simple_error(gw, req, 404, "invalid_request_error", "not_found",
                         "no such endpoint", NULL);
}

/* Sets the X-Request-Id of the request: the client's if it is 1 to
 * GATEWAY_REQUEST_ID_MAX visible ASCII characters, else a new unique one.
 * Echoed in the response head and logged with the request. */
static void req_set_id(gateway_t *gw, req_t *req)
{
    const char *v = MHD_lookup_connection_value(req->mhd, MHD_HEADER_KIND,
                                                "X-Request-Id");
    size_t len = v ? strlen(v) : 0;
    bool ok = len > 0 && len <= GATEWAY_REQUEST_ID_MAX;

    for (size_t i = 0; ok && i < len; i++)
        ok = v[i] > 0x20 && v[i] < 0x7f;
    if (ok) {
        memcpy(req->request_id, v, len + 1);
        return;
    }
    gw->id_counter++;
    snprintf(req->request_id, sizeof(req->request_id), "baton-%016llx",
             (unsigned long long)(bt_time_ns() ^
                                  (gw->id_counter * 0x9e3779b97f4a7c15ull)));
}


// ---------------------------------------------------------------------------
// MHD callbacks

static conn_t *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return ci != NULL ? ci->socket_context : NULL;
}

/* Closes a connection from our side (timeouts, eviction): shutdown()
 * wakes MHD, which then sees the end of the stream and closes and frees
 * the connection itself; the descriptor stays MHD's. */
static void conn_shut(gateway_t *gw, conn_t *conn)
{
    if (conn->evicted)
        return;
    conn->evicted = true;
    gw->n_evicted++;
    if (conn->fd >= 0)
        shutdown(conn->fd, SHUT_RDWR);
    gw->metrics.connections = gw->n_conns - gw->n_evicted;
}

/* A request that did not arrive in time.  Plain HTTP gets a 408 written
 * on the socket (MHD has nothing to send while it waits for a request);
 * over TLS the connection just closes. */
static void conn_timeout(gateway_t *gw, conn_t *conn)
{
    static const char body[] =
        "{\"error\":{\"message\":\"request not received in time\",\"type\":"
        "\"invalid_request_error\",\"param\":null,\"code\":null}}\n";
    char msg[512];
    int n;

    if (!gw->tls && conn->fd >= 0) {
        n = snprintf(msg, sizeof(msg),
                     "HTTP/1.1 408 %s\r\nServer: baton-http\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     gateway__http_reason(408), sizeof(body) - 1, body);
        if (send(conn->fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
            BT_LOG_DEBUG("HTTP", "408: %s", strerror(errno));
    }
    gateway__metrics_request(&gw->metrics, GATEWAY_EP_OTHER, 408);
    conn_shut(gw, conn);
}

static void on_connection(void *cls, struct MHD_Connection *mc,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    gateway_t *gw = cls;
    conn_t *conn = *socket_context;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn = bt_calloc(1, sizeof(*conn), "gateway_conn");
        if (conn == NULL)
            return; /* untracked: no eviction or timeouts of ours */
        conn->mhd = mc;
        conn->fd = ci != NULL ? ci->connect_fd : -1;
        conn->t_idle = bt_time_ns();
        conn->next = gw->conns;
        if (gw->conns != NULL)
            gw->conns->prev = conn;
        gw->conns = conn;
        gw->n_conns++;
        *socket_context = conn;
    } else if (conn != NULL) {
        if (conn->req != NULL)
            conn->req->conn = NULL;
        if (conn->prev != NULL)
            conn->prev->next = conn->next;
        else
            gw->conns = conn->next;
        if (conn->next != NULL)
            conn->next->prev = conn->prev;
        gw->n_conns--;
        if (conn->evicted)
            gw->n_evicted--;
        bt_free(conn);
        *socket_context = NULL;
    }
    gw->metrics.connections = gw->n_conns - gw->n_evicted;
}

/* The request line has arrived: the start of the request's clock. */
static void *on_request_line(void *cls, const char *uri,
                             struct MHD_Connection *mc)
{
    conn_t *conn = conn_of(mc);

    (void)cls;
    (void)uri;
    if (conn != NULL) {
        conn->t_req_start = bt_time_ns();
        conn->used = true;
    }
    return NULL;
}

static void req_free(req_t *req)
{
    if (req->resp != NULL)
        MHD_destroy_response(req->resp);
    if (req->conn != NULL) {
        req->conn->req = NULL;
        req->conn->t_idle = bt_time_ns();
        req->conn->t_req_start = 0;
    }
    bt_buf_cleanup(&req->body);
    bt_buf_cleanup(&req->sse);
    for (int i = 0; req->choices != NULL && i < req->n_choices; i++) {
        choice_t *ch = &req->choices[i];
        bt_buf_cleanup(&ch->text);
        bt_free(ch->echo_text);
        bt_free(ch->lp);
        bt_free(ch->plp);
    }
    bt_free(req->choices);
    bt_free(req);
}

/* MHD is done with a request, answered or not: a job still at the
 * router (the client went away) is cancelled there. */
static void on_completed(void *cls, struct MHD_Connection *mc,
                         void **req_cls, enum MHD_RequestTerminationCode toe)
{
    gateway_t *gw = cls;
    req_t *req = *req_cls;

    (void)mc;
    if (req == NULL)
        return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        BT_LOG_DEBUG("HTTP", "request %s ended early (%d)", req->request_id,
                     (int)toe);
    job_drop(gw, req, true);
    req_free(req);
    *req_cls = NULL;
}

/* The headers a preflight may allow: those it asks for (SDKs send their
 * own, X-Stainless-*), when they are a plain list of field names; else
 * the ones baton reads. */
static const char *allow_headers(struct MHD_Connection *mc)
{
    const char *asked = MHD_lookup_connection_value(
        mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    size_t len = asked ? strlen(asked) : 0;

    if (len == 0 || len > 1024 ||
        strspn(asked, "abcdefghijklmnopqrstuvwxyz"
                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_, ") != len)
        return "Authorization, Content-Type, X-Request-Id";
    return asked;
}

/* The checks made on the headers alone, before any body is read: what
 * MHD accepts but baton refuses (chunked bodies, conflicting lengths,
 * bodies over --max-body-bytes, unknown expectations), and CORS.  May
 * set the response (an error, or a preflight's 204). */
static void req_check_head(gateway_t *gw, req_t *req, const char *url,
                           const char *method)
{
    struct MHD_Connection *mc = req->mhd;
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                 "Content-Length");
    const char *expect = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                     "Expect");
    const char *origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                     "Origin");
    int n_te = gateway__http_header_count(mc, "Transfer-Encoding");
    int n_cl = gateway__http_header_count(mc, "Content-Length");
    bool post = strcmp(method, "POST") == 0;
    const char *why = NULL;
    int status = 0;

    req_set_id(gw, req);
    if (origin != NULL && gw->cors != NULL) {
        const char *allow = gateway__cors_match(gw->cors, origin);
        if (allow != NULL)
            snprintf(req->cors, sizeof(req->cors), "%s", allow);
    }
    if (strlen(url) > GATEWAY_HTTP_MAX_TARGET) {
        status = 414;
        why = "request target too long";
    } else if (n_te > 0 && n_cl > 0) {
        status = 400;
        why = "both Transfer-Encoding and Content-Length given";
    } else if (n_te > 0) {
        status = 411;
        why = "chunked request bodies are not supported: send a "
              "Content-Length";
    } else if (n_cl > 1) {
        status = 400;
        why = "more than one Content-Length header";
    } else if (post && cl == NULL) {
        status = 411;
        why = "POST needs a Content-Length";
    } else if (cl != NULL && strtoull(cl, NULL, 10) > gw->cfg.max_body_bytes) {
        status = 413;
        why = "request body too large";
    } else if (expect != NULL && strcasecmp(expect, "100-continue") != 0) {
        status = 417;
        why = "unsupported Expect value";
    }
    if (status != 0) {
        req->ep = GATEWAY_EP_OTHER;
        req->close = true; /* the body, if any, is not read */
        respond_simple_error(gw, req, status, "invalid_request_error", NULL,
                             why, NULL);
        return;
    }
    if (strcmp(method, "OPTIONS") == 0 && gw->cors != NULL &&
        origin != NULL &&
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                    "Access-Control-Request-Method")) {
        /* a CORS preflight: answered here, never authenticated (browsers
         * send no credentials with it) */
        req->ep = GATEWAY_EP_OTHER;
        if (req->cors[0] == '\0') {
            respond_simple_error(gw, req, 403, "invalid_request_error",
                                 "cors_origin_not_allowed",
                                 "origin not allowed (--cors-origins)",
                                 NULL);
            return;
        }
        req_respond(gw, req, 204, NULL, "", 0,
                    "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                    "Access-Control-Max-Age: 600\r\n");
        if (req->resp != NULL)
            MHD_add_response_header(req->resp,
                                    "Access-Control-Allow-Headers",
                                    allow_headers(mc));
    }
}

/* Queues a ready response, or suspends a dispatched request until the
 * router answers. */
static enum MHD_Result req_next(req_t *req)
{
    enum MHD_Result ret;

    if (req->dead)
        return MHD_NO;
    if (req->resp != NULL) {
        ret = MHD_queue_response(req->mhd, (unsigned)req->status, req->resp);
        MHD_destroy_response(req->resp);
        req->resp = NULL;
        req->queued = true;
        return ret;
    }
    if (req->dispatched && !req->queued) {
        req->suspended = true;
        MHD_suspend_connection(req->mhd);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc,
                                  const char *url, const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    gateway_t *gw = cls;
    req_t *req = *req_cls;

    (void)version;
    if (req == NULL) {
        req = bt_calloc(1, sizeof(*req), "gateway_req");
        if (req == NULL)
            return MHD_NO;
        req->gw = gw;
        req->mhd = mc;
        req->conn = conn_of(mc);
        req->ep = GATEWAY_EP_OTHER;
        if (req->conn != NULL)
            req->conn->req = req;
        bt_buf_init(&req->body);
        bt_buf_init(&req->sse);
        *req_cls = req;
        req_check_head(gw, req, url, method);
        return req_next(req);
    }
    if (req->dead)
        return MHD_NO;
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->resp != NULL || req->queued)
            return MHD_YES; /* answered already: dropped */
        if (req->body.len + n > gw->cfg.max_body_bytes ||
            bt_buf_append(&req->body, upload_data, n) != BT_OK)
            return MHD_NO;
        return MHD_YES;
    }
    if (!req->dispatched && req->resp == NULL && !req->queued) {
        req->dispatched = true;
        if (bt_buf_reserve(&req->body, 1) != BT_OK)
            return MHD_NO;
        req->body.data[req->body.len] = '\0';
        dispatch(gw, req, url, method);
    }
    return req_next(req);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    size_t len;

    (void)cls;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    len = strlen(msg);
    while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        msg[--len] = '\0';
    BT_LOG_INFO("HTTP", "libmicrohttpd: %s", msg);
}

// ---------------------------------------------------------------------------
// Connections: accept, limits, timeouts

/* All connections are taken: closes the one that has waited longest for
 * a request to start or finish arriving (idle keep-alive, or a slow or
 * never-finished request: slowloris).  Connections with a request at the
 * router or a response under way are never taken.  Without this,
 * half-open connections from many addresses would keep real clients out
 * (503) until their timeouts. */
static void evict_one(gateway_t *gw)
{
    conn_t *victim = NULL;
    uint64_t oldest = UINT64_MAX;

    for (conn_t *c = gw->conns; c != NULL; c = c->next) {
        const req_t *r = c->req;
        uint64_t since;

        if (c->evicted ||
            (r != NULL && (r->dispatched || r->queued || r->resp != NULL)))
            continue;
        since = c->t_req_start != 0 ? c->t_req_start : c->t_idle;
        if (since < oldest) {
            oldest = since;
            victim = c;
        }
    }
    if (victim == NULL)
        return;
    gw->metrics.evicted_conns++;
    conn_shut(gw, victim);
}

/* Refuses a connection over --max-connections with 503 (plain HTTP; over
 * TLS nothing can be said before a handshake, so it is just closed). */
static void refuse(gateway_t *gw, int fd)
{
    static const char body[] =
        "{\"error\":{\"message\":\"too many connections\",\"type\":"
        "\"service_unavailable\",\"param\":null,\"code\":\"overloaded\"}}\n";
    char msg[512];
    int n;

    if (!gw->tls) {
        n = snprintf(msg, sizeof(msg),
                     "HTTP/1.1 503 %s\r\n"
                     "Server: baton-http\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n"
                     "Retry-After: 1\r\n\r\n%s", gateway__http_reason(503),
                     sizeof(body) - 1, body);
        if (send(fd, msg, (size_t)n, MSG_NOSIGNAL) < 0)
            BT_LOG_DEBUG("HTTP", "503: %s", strerror(errno));
    }
    close(fd);
    gw->metrics.rejected_conns++;
    gateway__metrics_request(&gw->metrics, GATEWAY_EP_OTHER, 503);
}

static void accept_all(gateway_t *gw)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t ss_len = sizeof(ss);
        int one = 1;
        int fd = accept4(gw->listen_fd, (struct sockaddr *)&ss, &ss_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                BT_LOG_WARN("HTTP", "accept: %s", strerror(errno));
            return;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (gw->n_conns - gw->n_evicted >= gw->cfg.max_connections)
            evict_one(gw);
        if (gw->n_conns - gw->n_evicted >= gw->cfg.max_connections) {
            refuse(gw, fd);
            continue;
        }
        /* MHD applies --max-conns-per-client (and closes fd on refusal) */
        if (MHD_add_connection(gw->mhd, fd, (struct sockaddr *)&ss,
                               ss_len) != MHD_YES) {
            gw->metrics.rejected_conns++;
            gateway__metrics_request(&gw->metrics, GATEWAY_EP_OTHER, 503);
        }
    }
}

/* Whether the client has closed its side of a waiting connection. */
static bool peer_gone(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };

    return fd >= 0 && poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static void router_watch(gateway_t *gw, uint64_t now)
{
    client_router_state_t st = client_router_state(gw->client);
    uint64_t losses = client_router_losses(gw->client);
    uint64_t rid;

    if (losses != gw->losses_seen) {
        gw->metrics.router_lost += losses - gw->losses_seen;
        gw->losses_seen = losses;
        BT_LOG_WARN("HTTP", "router lost: requests in flight failed (502), "
                    "/health is 503 until it is back");
    }
    if (st != CLIENT_ROUTER_UP)
        return;
    if (gw->ctx_rid != 0 &&
        now - gw->t_ctx_asked < 4ull * CONTEXT_POLL_MS * 1000000ull)
        return; /* still waiting (an unanswered one is given up later) */
    if (gw->ctx_rid == 0 && gw->t_ctx_asked != 0 &&
        now - gw->t_ctx_asked < CONTEXT_POLL_MS * 1000000ull)
        return;
    if (client_status_request(gw->client, &rid) == BT_OK) {
        gw->ctx_rid = rid;
        gw->t_ctx_asked = now;
    }
}

/* Timeouts: slow request senders (408; a new connection must send its
 * first request head within --header-timeout-ms, as with nginx's
 * client_header_timeout), idle keep-alive connections,
 * stalled readers, router requests past their time (504), lingering
 * closes. */

/* Timeouts: slow request senders (408; a new connection must send its
 * first request head within --header-timeout-ms, as with nginx's
 * client_header_timeout), idle keep-alive connections,
 * router requests past their time (504), clients gone while their
 * request waits for the router (cancelled). */
static void sweep(gateway_t *gw, uint64_t now)
{
    uint64_t ms = 1000000ull;
    int header_ms = BT_MIN(gw->cfg.header_timeout_ms,
                           gw->cfg.read_timeout_ms);

    router_watch(gw, now);
    for (conn_t *c = gw->conns, *next; c != NULL; c = next) {
        req_t *req = c->req;

        next = c->next;
        if (c->evicted)
            continue;
        if (req == NULL ||
            (!req->dispatched && !req->queued && req->resp == NULL)) {
            /* receiving: headers (no req yet) or the body */
            uint64_t limit = (uint64_t)(req == NULL ? header_ms
                                                    : gw->cfg.read_timeout_ms);
            if (c->t_req_start != 0 && now - c->t_req_start > limit * ms)
                conn_timeout(gw, c);
            else if (req == NULL && !c->used &&
                     now - c->t_idle >
                         (uint64_t)gw->cfg.header_timeout_ms * ms)
                conn_timeout(gw, c); /* no request line since accept: a
                                        partial one is invisible to us */
            else if (req == NULL && c->t_req_start == 0 &&
                     now - c->t_idle >
                         (uint64_t)gw->cfg.idle_timeout_ms * ms)
                conn_shut(gw, c);
            continue;
        }
        if (req->job != JOB_NONE && now > req->t_deadline) {
            conn_job_t job = req->job;
            if (job == JOB_GENERATE) {
                gateway_api_error_t err;
                job_abort(gw, req);
                gateway__api_error_set(&err, 504, "timeout",
                                       "router_timeout", NULL,
                                       "no answer from the router in %d ms",
                                       gw->cfg.request_timeout_ms);
                generation_fail(gw, req, &err);
            } else {
                job_drop(gw, req, false);
                if (job == JOB_HEALTH)
                    respond_health(gw, req, NULL);
                else
                    respond_metrics(gw, req, NULL);
            }
        }
        if (req->suspended && !req->dead && peer_gone(c->fd))
            req_kill(gw, req); /* the client left: cancel at the router */
    }
}

// ---------------------------------------------------------------------------
// Lifecycle

static bt_status_t listen_on(gateway_t *gw, const char *spec)
{
    struct addrinfo hints, *res = NULL;
    char host[256];
    const char *colon = strrchr(spec, ':');
    struct sockaddr_storage ss;
    socklen_t ss_len = sizeof(ss);
    size_t hlen;
    int one = 1, ret, fd;

    if (colon == NULL || colon == spec || colon[1] == '\0')
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                        "--listen wants HOST:PORT, got '%s'", spec);
    hlen = (size_t)(colon - spec);
    if (spec[0] == '[' && hlen >= 2 && spec[hlen - 1] == ']') {
        spec++;
        hlen -= 2;
    }
    if (hlen >= sizeof(host))
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "host name too long");
    memcpy(host, spec, hlen);
    host[hlen] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    ret = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res);
    if (ret != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "cannot resolve '%s': %s",
                        host, gai_strerror(ret));
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return BT_ERROR(BT_ERR_IO, "HTTP", "socket: %s", strerror(errno));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        return BT_ERROR(BT_ERR_IO, "HTTP", "cannot listen on %s: %s",
                        gw->cfg.listen, strerror(e));
    }
    freeaddrinfo(res);
    if (getsockname(fd, (struct sockaddr *)&ss, &ss_len) == 0)
        gw->port = ntohs(ss.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&ss)->sin6_port
                             : ((struct sockaddr_in *)&ss)->sin_port);
    gw->listen_fd = fd;
    return BT_OK;
}


static bt_status_t epoll_add(gateway_t *gw, int fd, uint32_t events,
                             uint64_t tag)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.u64 = tag;
    if (epoll_ctl(gw->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return BT_ERROR(BT_ERR_IO, "HTTP", "epoll_ctl: %s", strerror(errno));
    return BT_OK;
}

/* Reads a PEM file for TLS.  Fails closed: missing, unreadable, empty or
 * not PEM is an error naming the option. */
static bt_status_t read_pem(const char *opt, const char *path, char **pem_p)
{
    char *data = NULL;
    size_t len = 0;

    if (bt_read_file(path, 1u << 20, &data, &len) != BT_OK)
        return BT_ERROR(BT_ERR_IO, "HTTP", "%s: cannot read '%s'", opt, path);
    if (len == 0 || strstr(data, "-----BEGIN ") == NULL) {
        bt_free(data);
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                        "%s: '%s' is not a PEM file", opt, path);
    }
    *pem_p = data;
    return BT_OK;
}

/* Starts MHD in external-epoll mode, without a listening socket of its
 * own (we accept), with TLS when configured. */
static bt_status_t start_mhd(gateway_t *gw)
{
    const gateway_config_t *cfg = &gw->cfg;
    unsigned int flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                         MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG;
    /* MHD's connection pool holds the request head and the response
     * head: a request head over --max-header-bytes does not fit (431) */
    size_t pool = cfg->max_header_bytes + 2048;
    unsigned int timeout_s = (unsigned)((BT_MAX(cfg->idle_timeout_ms,
                                                cfg->write_timeout_ms) +
                                         999) / 1000);
    /* evicted connections count at MHD until it has closed them */
    unsigned int limit = (unsigned)cfg->max_connections * 2u + 16u;
    const union MHD_DaemonInfo *info;

    if (gw->tls) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
            return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                            "this libmicrohttpd has no TLS support");
        flags |= MHD_USE_TLS;
    }
    gw->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, gw,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, gw,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, gw,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, gw,
        MHD_OPTION_URI_LOG_CALLBACK, on_request_line, gw,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
        MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_conns_per_client,
        MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
        MHD_OPTION_STRICT_FOR_CLIENT, 0,
        gw->tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, gw->tls_cert,
        MHD_OPTION_HTTPS_MEM_KEY, gw->tls_key,
        MHD_OPTION_END);
    if (gw->mhd == NULL)
        return BT_ERROR(gw->tls ? BT_ERR_INVALID_ARG : BT_ERR_IO, "HTTP",
                        gw->tls ? "cannot start HTTPS: --tls-cert/--tls-key "
                                  "rejected (not a matching certificate "
                                  "and private key?)"
                                : "cannot start the HTTP server");
    info = MHD_get_daemon_info(gw->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (info == NULL)
        return BT_ERROR(BT_ERR_IO, "HTTP", "libmicrohttpd has no epoll fd");
    return epoll_add(gw, info->epoll_fd, EPOLLIN, TAG_MHD);
}

bt_status_t gateway_create(const gateway_config_t *cfg, gateway_t **gw_p)
{
    gateway_t *gw;
    bt_status_t status;
    int n = cfg->max_connections;

    if (n <= 0 || n > 1000000 || cfg->max_header_bytes < 256 ||
        cfg->max_body_bytes == 0 || cfg->router == NULL ||
        cfg->listen == NULL || cfg->model_name == NULL ||
        cfg->model_name[0] == '\0')
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                        "bad gateway configuration");
    if ((cfg->tls_cert == NULL) != (cfg->tls_key == NULL))
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                        "--tls-cert and --tls-key go together");
    gw = bt_calloc(1, sizeof(*gw), "gateway");
    if (gw == NULL)
        return BT_ERR_NO_MEMORY;
    gw->cfg = *cfg;
    gw->listen_fd = -1;
    gw->epoll_fd = -1;
    gateway__metrics_init(&gw->metrics);
    bt_buf_init(&gw->scratch);
    gw->model_name = bt_strdup(cfg->model_name, "gateway");
    for (gw->map_cap = 64; gw->map_cap < (size_t)n * 4; gw->map_cap *= 2)
        ;
    gw->map = bt_calloc(gw->map_cap, sizeof(*gw->map), "gateway");
    if (gw->model_name == NULL || gw->map == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    if (cfg->tls_cert != NULL) {
        /* fail closed: never fall back to plain HTTP */
        gw->tls = true;
        status = read_pem("--tls-cert", cfg->tls_cert, &gw->tls_cert);
        if (status == BT_OK)
            status = read_pem("--tls-key", cfg->tls_key, &gw->tls_key);
        if (status != BT_OK)
            goto err_destroy;
    }
    if (cfg->cors_origins != NULL) {
        status = gateway__cors_create(cfg->cors_origins, &gw->cors);
        if (status != BT_OK)
            goto err_destroy;
    }

    gw->api.model_name = gw->model_name;
    gw->api.default_deadline_ms = cfg->deadline_ms;
    gw->api.chat_template = CHAT_TEMPLATE_PLAIN;
    if (cfg->tokenizer != NULL) {
        status = tok_load(cfg->tokenizer, 0, &gw->tok);
        if (status != BT_OK)
            goto err_destroy;
        gw->api.tok = gw->tok;
        if (tok_bos_id(gw->tok) >= 0)
            gw->api.bos = tok_piece(gw->tok, tok_bos_id(gw->tok));
        if (tok_eos_id(gw->tok) >= 0)
            gw->api.eos = tok_piece(gw->tok, tok_eos_id(gw->tok));
        gw->api.chat_template =
            chat_template_detect(tok_chat_template(gw->tok), cfg->model_type);
    }
    if (cfg->chat_template != NULL) {
        status = chat_template_from_name(cfg->chat_template,
                                         &gw->api.chat_template);
        if (status != BT_OK)
            goto err_destroy;
    }

    if (cfg->api_key_file != NULL) {
        /* fail closed: a key file that cannot be used stops us here */
        status = gateway__auth_load(cfg->api_key_file, &gw->auth);
        if (status != BT_OK)
            goto err_destroy;
        BT_LOG_INFO("HTTP", "API keys: %d keys of %d tenants from '%s'%s",
                    gateway__auth_n_keys(gw->auth),
                    gateway__auth_n_tenants(gw->auth), cfg->api_key_file,
                    cfg->metrics_auth ? "; /metrics needs a key" : "");
    } else if (cfg->metrics_auth) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                          "--metrics-auth needs --api-key-file");
        goto err_destroy;
    }
    gw->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (gw->epoll_fd < 0) {
        status = BT_ERROR(BT_ERR_IO, "HTTP", "epoll_create1: %s",
                          strerror(errno));
        goto err_destroy;
    }
    status = start_mhd(gw);
    if (status != BT_OK)
        goto err_destroy;
    status = client_create(cfg->router, &gw->client);
    if (status != BT_OK)
        goto err_destroy;
    status = client_fd(gw->client, &gw->router_fd);
    if (status != BT_OK)
        goto err_destroy;
    status = listen_on(gw, cfg->listen);
    if (status != BT_OK)
        goto err_destroy;
    status = epoll_add(gw, gw->listen_fd, EPOLLIN, TAG_LISTEN);
    if (status == BT_OK)
        status = epoll_add(gw, gw->router_fd, EPOLLIN | EPOLLET, TAG_ROUTER);
    if (status != BT_OK)
        goto err_destroy;
    BT_LOG_INFO("HTTP", "listening on %s (port %d, %s), router %s, model "
                "'%s', chat template %s%s%s", cfg->listen, gw->port,
                gw->tls ? "HTTPS" : "plain HTTP", cfg->router,
                gw->model_name, chat_template_name(gw->api.chat_template),
                gw->tok ? "" : " (no tokenizer: chat prompts sent as text)",
                gw->cors ? ", CORS on" : "");
    *gw_p = gw;
    return BT_OK;

err_destroy:
    gateway_destroy(&gw);
    return status;
}

void gateway_destroy(gateway_t **gw_p)
{
    gateway_t *gw = *gw_p;

    if (gw == NULL)
        return;
    if (gw->mhd != NULL) {
        /* waiting requests are cancelled at the router and let go, so
         * that MHD can close their connections */
        for (conn_t *c = gw->conns; c != NULL; c = c->next)
            if (c->req != NULL && c->req->suspended)
                req_kill(gw, c->req);
        MHD_stop_daemon(gw->mhd); /* on_completed cancels the others */
        gw->mhd = NULL;
    }
    if (gw->listen_fd >= 0)
        close(gw->listen_fd);
    if (gw->epoll_fd >= 0)
        close(gw->epoll_fd);
    client_destroy(&gw->client);
    gateway__auth_destroy(&gw->auth);
    gateway__cors_destroy(&gw->cors);
    tok_destroy(&gw->tok);
    bt_buf_cleanup(&gw->scratch);
    if (gw->tls_key != NULL)
        memset(gw->tls_key, 0, strlen(gw->tls_key)); /* a secret */
    bt_free(gw->tls_key);
    bt_free(gw->tls_cert);
    bt_free(gw->map);
    bt_free(gw->model_name);
    bt_free(gw);
    *gw_p = NULL;
}

int gateway_port(const gateway_t *gw)
{
    return gw->port;
}

void gateway_stop(gateway_t *gw)
{
    gw->stop = 1;
}

bt_status_t gateway_run(gateway_t *gw)
{
    struct epoll_event events[MAX_EVENTS];
    uint64_t last_sweep = bt_time_ns();

    while (!gw->stop) {
        MHD_UNSIGNED_LONG_LONG mhd_ms = TICK_MS;
        int n;
        uint64_t now;

        /* MHD may have work pending without a new socket event (data it
         * has read but not yet processed): then it asks for 0 ms */
        if (MHD_get_timeout(gw->mhd, &mhd_ms) != MHD_YES || mhd_ms > TICK_MS)
            mhd_ms = TICK_MS;
        n = epoll_wait(gw->epoll_fd, events, MAX_EVENTS, (int)mhd_ms);

        if (n < 0 && errno != EINTR)
            return BT_ERROR(BT_ERR_IO, "HTTP", "epoll_wait: %s",
                            strerror(errno));
        for (int i = 0; i < n; i++)
            if (events[i].data.u64 == TAG_LISTEN)
                accept_all(gw);
        MHD_run(gw->mhd);
        drain_router(gw);
        now = bt_time_ns();
        if (now - last_sweep >= TICK_MS * 1000000ull) {
            last_sweep = now;
            sweep(gw, now);
        }
        /* what the router answered (resumed connections) goes out now */
        MHD_run(gw->mhd);
    }
    return BT_OK;
}
