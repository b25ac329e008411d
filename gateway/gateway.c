/*
 * gateway.c - baton-http's event loop: connections, request dispatch,
 * the router link and the responses (see gateway.h).
 *
 * Connection life: READ (parse requests as bytes arrive) -> WAIT (a
 * request is at the router; output streams as chunks arrive) -> READ
 * again (keep-alive) or CLOSING (flush, then half-close) -> LINGER (read
 * and drop until the client closes, so a reply sent before unread input
 * is not destroyed by a TCP reset) -> closed.  A connection is never
 * freed in the middle of a handler: conn_kill() marks it dead (cancelling
 * its router request) and the loop frees dead ones at the end of each
 * iteration, so stale pointers never survive a loop turn.
 */
#include "gateway.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "client.h"
#include "gateway_int.h"

#define TAG_LISTEN 0u
#define TAG_ROUTER 1u
#define TAG_CONN0 2u
#define MAX_EVENTS 256
#define TICK_MS 50
#define LINGER_MS 2000
#define READ_CHUNK 16384
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
    CONN_READ = 0, /* reading / parsing requests */
    CONN_WAIT,     /* a request is at the router */
    CONN_CLOSING,  /* flushing the last response */
    CONN_LINGER    /* half-closed, dropping input until EOF */
} conn_state_t;

typedef enum {
    JOB_NONE = 0,
    JOB_GENERATE,  /* completion / chat request at the router */
    JOB_HEALTH,    /* cluster status for /health */
    JOB_METRICS    /* cluster status for /metrics */
} conn_job_t;

typedef struct {
    int fd;                  /* client socket, non-blocking */
    uint8_t addr[16];        /* client address (IPv4: first 4 bytes) */
    uint8_t addr_len;        /* 4, 16, or 0 when unknown */
    int slot;                /* index in gw->conns */
    uint32_t gen;            /* slot generation (stale-event guard) */
    conn_state_t state;
    bool dead;               /* freed at the end of the loop turn */
    bool in_dirty;           /* listed in gw->dirty */
    bool eof;                /* the client closed its side */
    uint32_t events;         /* epoll events registered */
    bt_buf_t in;        /* received, not yet consumed bytes */
    bt_buf_t out;       /* bytes to send */
    uint64_t t_activity;     /* last read or write progress (ns) */
    uint64_t t_req_start;    /* first byte of the pending request (0 none) */
    uint64_t t_out_since;    /* output pending and unprogressed since */
    uint64_t t_linger_end;   /* LINGER: close at this time */
    bool sent_continue;      /* 100 Continue sent for this request */
    char request_id[GATEWAY_REQUEST_ID_MAX + 1]; /* X-Request-Id of the
                                request in progress: the client's or
                                made here; "" between requests */
    /* the request in progress */
    bool keep_alive;         /* after the current response */
    bool http10;             /* HTTP/1.0 client: no chunked replies */
    gateway_endpoint_t ep;   /* for metrics */
    conn_job_t job;
    uint64_t rid;            /* router request id of job (0 none) */
    uint64_t t_deadline;     /* job gives up at this time (ns) */
    /* generation requests */
    gateway_api_resp_t resp; /* id, created, model, usage */
    char id[48];             /* resp.id storage */
    bool stream;
    bool include_usage;
    bool headers_sent;       /* stream head written */
    bt_buf_t text;      /* non-stream: gathered completion text */
    uint32_t n_tokens;       /* ids received */
    uint64_t t_start;        /* request parsed (ns) */
    uint64_t t_first;        /* first token received (ns) */
    gateway_tenant_t *tenant; /* admitted against this tenant's limits
                                (NULL: none); released at the job's end */
    uint64_t charged;        /* tokens charged to it at admission */
    uint64_t prompt_est;     /* of which the prompt's */
} conn_t;

typedef struct {
    uint64_t rid;  /* 0 = empty */
    conn_t *conn;
} rid_entry_t;

struct gateway_s {
    gateway_config_t cfg;
    char *model_name;            /* owned copy */
    int listen_fd;
    int port;
    int epoll_fd;
    int router_fd;               /* ZMQ_FD of the client socket */
    client_t *client;
    gateway_auth_t *auth;        /* API keys and tenants, NULL: open */
    tok_t *tok;                  /* NULL without --tokenizer */
    gateway_api_ctx_t api;
    gateway_http_limits_t limits;
    conn_t **conns;              /* (max_connections) slots, NULL = free */
    uint32_t *gens;              /* (max_connections) slot generations */
    int n_conns;
    conn_t **dead;               /* (max_connections) to free this turn */
    int n_dead;
    conn_t **dirty;              /* (max_connections) output to flush */
    int n_dirty;
    rid_entry_t *map;            /* (map_cap) rid -> conn, open addressing */
    size_t map_cap;
    gateway_metrics_t metrics;
    bt_buf_t scratch;       /* event JSON under construction */
    uint64_t id_counter;         /* response ids */
    uint32_t max_context;        /* cluster context (tokens), 0 unknown */
    uint64_t ctx_rid;            /* our own status request, 0 none */
    uint64_t t_ctx_asked;        /* when it was sent (ns) */
    uint64_t losses_seen;        /* client_router_losses() last sweep */
    volatile sig_atomic_t stop;
};

// ---------------------------------------------------------------------------
// rid -> connection map (linear probing, backward-shift deletion)

static size_t map_hash(const gateway_t *gw, uint64_t rid)
{
    return (size_t)((rid * 0x9e3779b97f4a7c15ull) >> 17) & (gw->map_cap - 1);
}

static void map_put(gateway_t *gw, uint64_t rid, conn_t *conn)
{
    size_t i = map_hash(gw, rid);

    while (gw->map[i].rid != 0)
        i = (i + 1) & (gw->map_cap - 1);
    gw->map[i].rid = rid;
    gw->map[i].conn = conn;
}

static conn_t *map_get(const gateway_t *gw, uint64_t rid)
{
    size_t i = map_hash(gw, rid);

    if (rid == 0)
        return NULL;
    while (gw->map[i].rid != 0) {
        if (gw->map[i].rid == rid)
            return gw->map[i].conn;
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
// Connection plumbing

static uint64_t epoll_tag(const conn_t *conn)
{
    return ((uint64_t)conn->gen << 32) | (uint64_t)(conn->slot + TAG_CONN0);
}

/* Registers the events the connection needs now. */
static void conn_update_events(gateway_t *gw, conn_t *conn)
{
    struct epoll_event ev;
    uint32_t want = 0;
    size_t in_limit = gw->cfg.max_header_bytes + gw->cfg.max_body_bytes;

    if (conn->dead)
        return;
    if (!conn->eof) {
        want |= EPOLLRDHUP;
        if (!(conn->state == CONN_WAIT && conn->in.len >= in_limit))
            want |= EPOLLIN;
    }
    if (conn->out.len > 0)
        want |= EPOLLOUT;
    if (want == conn->events)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.events = want;
    ev.data.u64 = epoll_tag(conn);
    if (epoll_ctl(gw->epoll_fd, EPOLL_CTL_MOD, conn->fd, &ev) == 0)
        conn->events = want;
}

/* Ends the router side of the connection's job: cancels a generation
 * still running there (cancel = true) and forgets the request id. */
static void conn_job_drop(gateway_t *gw, conn_t *conn, bool cancel)
{
    if (conn->job == JOB_NONE)
        return;
    if (conn->job == JOB_GENERATE) {
        if (cancel) {
            if (client_cancel(gw->client, conn->rid) != BT_OK)
                BT_LOG_WARN("HTTP", "cannot cancel request %llu",
                            (unsigned long long)conn->rid);
            gw->metrics.cancelled++;
        }
        gw->metrics.in_flight--;
        if (conn->tenant != NULL) /* tokens it cost: prompt + received */
            gateway__tenant_release(conn->tenant, conn->charged,
                                    conn->prompt_est + conn->n_tokens);
        conn->tenant = NULL;
    }
    map_remove(gw, conn->rid);
    conn->job = JOB_NONE;
    conn->rid = 0;
}

/* Marks a connection dead; it is closed and freed at the end of the loop
 * turn.  A generation still at the router is cancelled there. */
static void conn_kill(gateway_t *gw, conn_t *conn)
{
    if (conn->dead)
        return;
    conn_job_drop(gw, conn, true);
    conn->dead = true;
    gw->dead[gw->n_dead++] = conn;
}

static void conn_free(gateway_t *gw, conn_t *conn)
{
    epoll_ctl(gw->epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
    close(conn->fd);
    gw->conns[conn->slot] = NULL;
    gw->n_conns--;
    gw->metrics.connections = gw->n_conns;
    bt_buf_cleanup(&conn->in);
    bt_buf_cleanup(&conn->out);
    bt_buf_cleanup(&conn->text);
    bt_free(conn);
}

/* Queues the connection for a flush at the end of the loop turn, so the
 * chunks of one router batch leave in one send(). */
static void conn_dirty(gateway_t *gw, conn_t *conn)
{
    if (conn->in_dirty)
        return;
    conn->in_dirty = true;
    gw->dirty[gw->n_dirty++] = conn;
}

/* Appends to the output; when the connection cannot hold more (memory,
 * or a stream reader too slow for --max-stream-buffer) it is killed. */
static bool conn_write(gateway_t *gw, conn_t *conn, const void *data,
                       size_t len)
{
    if (conn->dead)
        return false;
    if (conn->out.len == 0)
        conn->t_out_since = bt_time_ns();
    if (bt_buf_append(&conn->out, data, len) != BT_OK) {
        conn_kill(gw, conn);
        return false;
    }
    if (conn->stream && conn->out.len > gw->cfg.max_stream_buffer) {
        BT_LOG_WARN("HTTP", "stream reader too slow: %zu bytes unsent, "
                    "closing", conn->out.len);
        conn_kill(gw, conn);
        return false;
    }
    conn_dirty(gw, conn);
    return true;
}

/* Sends what the kernel takes now. */
static void conn_flush(gateway_t *gw, conn_t *conn)
{
    size_t off = 0;

    while (!conn->dead && off < conn->out.len) {
        ssize_t n = send(conn->fd, conn->out.data + off, conn->out.len - off,
                         MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            conn->t_activity = conn->t_out_since = bt_time_ns();
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            conn_kill(gw, conn);
            return;
        }
    }
    bt_buf_consume(&conn->out, off);
    if (conn->out.len == 0 && conn->state == CONN_CLOSING) {
        if (conn->eof) {
            conn_kill(gw, conn);
            return;
        }
        shutdown(conn->fd, SHUT_WR);
        conn->state = CONN_LINGER;
        conn->t_linger_end = bt_time_ns() + LINGER_MS * 1000000ull;
    }
    conn_update_events(gw, conn);
}

// ---------------------------------------------------------------------------
// Responses

static void conn_request_reset(conn_t *conn)
{
    conn->job = JOB_NONE;
    conn->rid = 0;
    conn->stream = false;
    conn->include_usage = false;
    conn->headers_sent = false;
    conn->n_tokens = 0;
    conn->t_first = 0;
    conn->text.len = 0;
    conn->sent_continue = false;
    conn->request_id[0] = '\0';
}

/* The response to the current request is queued: count it and move to
 * the next request (keep-alive) or to closing. */
static void conn_request_end(gateway_t *gw, conn_t *conn, int status)
{
    BT_LOG_INFO("HTTP", "request %s: %s %d", conn->request_id,
                gateway__metrics_endpoint_name(conn->ep), status);
    gateway__metrics_request(&gw->metrics, conn->ep, status);
    conn_request_reset(conn);
    conn->state = conn->keep_alive ? CONN_READ : CONN_CLOSING;
    conn->t_req_start = conn->in.len > 0 ? bt_time_ns() : 0;
    conn_dirty(gw, conn);
}

static void conn_head(gateway_t *gw, conn_t *conn, int status,
                      const char *ctype, long long content_length,
                      const char *extra)
{
    char head[768];
    int n;

    n = snprintf(head, sizeof(head),
                 "HTTP/1.1 %d %s\r\nServer: baton-http\r\n"
                 "Content-Type: %s\r\n",
                 status, gateway__http_reason(status), ctype);
    if (content_length >= 0)
        n += snprintf(head + n, sizeof(head) - (size_t)n,
                      "Content-Length: %lld\r\n", content_length);
    else if (!conn->http10)
        n += snprintf(head + n, sizeof(head) - (size_t)n,
                      "Transfer-Encoding: chunked\r\n");
    if (conn->request_id[0] != '\0')
        n += snprintf(head + n, sizeof(head) - (size_t)n,
                      "X-Request-Id: %s\r\n", conn->request_id);
    n += snprintf(head + n, sizeof(head) - (size_t)n,
                  "Connection: %s\r\n%s\r\n",
                  conn->keep_alive ? "keep-alive" : "close",
                  extra ? extra : "");
    conn_write(gw, conn, head, (size_t)n);
}

static void conn_respond(gateway_t *gw, conn_t *conn, int status,
                         const char *ctype, const char *body, size_t len,
                         const char *extra)
{
    conn_head(gw, conn, status, ctype, (long long)len, extra);
    conn_write(gw, conn, body, len);
    conn_request_end(gw, conn, status);
}

static void conn_respond_error(gateway_t *gw, conn_t *conn,
                               const gateway_api_error_t *err,
                               const char *extra)
{
    bt_buf_t *b = &gw->scratch;
    char retry[48];

    b->len = 0;
    if (gateway__api_error_json(err, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK) {
        conn_kill(gw, conn);
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
        BT_LOG_WARN("HTTP", "request %s: %d: %s", conn->request_id,
                    err->status, err->message);
    conn_respond(gw, conn, err->status, "application/json", b->data, b->len,
                 extra);
}

static void respond_simple_error(gateway_t *gw, conn_t *conn, int status,
                                 const char *type, const char *code,
                                 const char *msg, const char *extra)
{
    gateway_api_error_t err;

    gateway__api_error_set(&err, status, type, code, NULL, "%s", msg);
    conn_respond_error(gw, conn, &err, extra);
}

/* One SSE event "data: JSON\n\n" (a chunk of its own when chunked). */
static void stream_event(gateway_t *gw, conn_t *conn, const char *data,
                         size_t len)
{
    char pre[32];
    int n;

    if (!conn->http10) {
        n = snprintf(pre, sizeof(pre), "%zx\r\n", len + 8);
        conn_write(gw, conn, pre, (size_t)n);
    }
    conn_write(gw, conn, "data: ", 6);
    conn_write(gw, conn, data, len);
    conn_write(gw, conn, "\n\n", 2);
    if (!conn->http10)
        conn_write(gw, conn, "\r\n", 2);
}

static void stream_head(gateway_t *gw, conn_t *conn)
{
    if (conn->headers_sent)
        return;
    conn->headers_sent = true;
    if (conn->http10)
        conn->keep_alive = false; /* the end of the stream is the close */
    conn_head(gw, conn, 200, "text/event-stream", -1,
              "Cache-Control: no-cache\r\n");
    if (conn->resp.kind == GATEWAY_API_CHAT) {
        gw->scratch.len = 0;
        if (gateway__api_chunk_json(&conn->resp, "", 0, true, NULL,
                                    conn->include_usage,
                                    &gw->scratch) == BT_OK)
            stream_event(gw, conn, gw->scratch.data, gw->scratch.len);
    }
}

static void stream_end(gateway_t *gw, conn_t *conn)
{
    stream_event(gw, conn, "[DONE]", 6);
    if (!conn->http10)
        conn_write(gw, conn, "0\r\n\r\n", 5);
}

// ---------------------------------------------------------------------------
// Router messages

static void on_chunk(gateway_t *gw, conn_t *conn, const Baton__TokenChunk *c)
{
    const char *text = c->has_text ? (const char *)c->text.data : "";
    size_t len = c->has_text ? c->text.len : 0;
    uint64_t now = bt_time_ns();

    if (conn->job != JOB_GENERATE)
        return;
    if (conn->t_first == 0 && c->n_ids > 0) {
        conn->t_first = now;
        bt_prom_hist_observe(&gw->metrics.ttft,
                              (double)(now - conn->t_start) * 1e-9);
    }
    conn->n_tokens += (uint32_t)c->n_ids;
    if (!conn->stream) {
        if (bt_buf_append(&conn->text, text, len) != BT_OK)
            conn_kill(gw, conn);
        return;
    }
    stream_head(gw, conn);
    if (len == 0)
        return;
    gw->scratch.len = 0;
    if (gateway__api_chunk_json(&conn->resp, text, len, false, NULL,
                                conn->include_usage, &gw->scratch) != BT_OK) {
        conn_kill(gw, conn);
        return;
    }
    stream_event(gw, conn, gw->scratch.data, gw->scratch.len);
}

static const char *finish_name(Baton__FinishReason r)
{
    switch (r) {
    case BATON__FINISH_REASON__FINISH_LENGTH: return "length";
    case BATON__FINISH_REASON__FINISH_CANCELLED: return "cancelled";
    default: return "stop";
    }
}

static void on_finished(gateway_t *gw, conn_t *conn,
                        const Baton__Finished *f)
{
    const char *finish = finish_name(f->reason);
    uint64_t now = bt_time_ns();
    bt_buf_t *b = &gw->scratch;

    if (conn->job != JOB_GENERATE)
        return;
    conn_job_drop(gw, conn, false);
    conn->resp.prompt_tokens = f->usage ? f->usage->prompt_tokens : 0;
    conn->resp.completion_tokens =
        f->usage ? f->usage->completion_tokens : conn->n_tokens;
    gw->metrics.prompt_tokens += conn->resp.prompt_tokens;
    gw->metrics.completion_tokens += conn->resp.completion_tokens;
    bt_prom_hist_observe(&gw->metrics.e2e,
                          (double)(now - conn->t_start) * 1e-9);
    if (conn->n_tokens > 1 && conn->t_first != 0)
        bt_prom_hist_observe(&gw->metrics.tpot,
                              (double)(now - conn->t_first) * 1e-9 /
                                  (conn->n_tokens - 1));
    b->len = 0;
    if (conn->stream) {
        stream_head(gw, conn);
        if (gateway__api_chunk_json(&conn->resp, "", 0, false, finish,
                                    conn->include_usage, b) != BT_OK)
            goto err_kill;
        stream_event(gw, conn, b->data, b->len);
        if (conn->include_usage) {
            b->len = 0;
            if (gateway__api_usage_chunk_json(&conn->resp, b) != BT_OK)
                goto err_kill;
            stream_event(gw, conn, b->data, b->len);
        }
        stream_end(gw, conn);
        conn_request_end(gw, conn, 200);
        return;
    }
    if (gateway__api_response_json(&conn->resp, conn->text.data,
                                   conn->text.len, finish, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK)
        goto err_kill;
    conn_respond(gw, conn, 200, "application/json", b->data, b->len, NULL);
    return;

err_kill:
    conn_kill(gw, conn);
}

/* Fails the current generation with err: a JSON error response, or an
 * error event when the stream has begun. */
static void generation_fail(gateway_t *gw, conn_t *conn,
                            const gateway_api_error_t *err)
{
    if (conn->stream && conn->headers_sent) {
        gw->scratch.len = 0;
        if (gateway__api_error_json(err, &gw->scratch) != BT_OK) {
            conn_kill(gw, conn);
            return;
        }
        stream_event(gw, conn, gw->scratch.data, gw->scratch.len);
        stream_end(gw, conn);
        conn_request_end(gw, conn, 200); /* the status already sent */
        return;
    }
    conn_respond_error(gw, conn, err, NULL);
}

static void respond_health(gateway_t *gw, conn_t *conn,
                           const Baton__ClusterStatus *cs);
static void respond_metrics(gateway_t *gw, conn_t *conn,
                            const Baton__ClusterStatus *cs);

static void on_error(gateway_t *gw, conn_t *conn, const Baton__Error *e)
{
    gateway_api_error_t err;
    conn_job_t job = conn->job;

    if (job == JOB_HEALTH || job == JOB_METRICS) {
        /* the status request was lost with the router */
        conn_job_drop(gw, conn, false);
        if (job == JOB_HEALTH)
            respond_health(gw, conn, NULL);
        else
            respond_metrics(gw, conn, NULL);
        return;
    }
    if (job != JOB_GENERATE)
        return;
    conn_job_drop(gw, conn, false);
    gateway__api_error_from_router(e->code, e->message,
                                   e->has_retry_after_ms ? e->retry_after_ms
                                                         : 0,
                                   &err);
    generation_fail(gw, conn, &err);
}

static void respond_health(gateway_t *gw, conn_t *conn,
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
        conn_respond(gw, conn, 503, "application/json", body, (size_t)n,
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
    conn_respond(gw, conn, status, "application/json", body, (size_t)n,
                 status == 503 ? "Retry-After: 1\r\n" : NULL);
}

static void respond_metrics(gateway_t *gw, conn_t *conn,
                            const Baton__ClusterStatus *cs)
{
    bt_buf_t *b = &gw->scratch;

    b->len = 0;
    gw->metrics.connections = gw->n_conns;
    if (gateway__metrics_render(&gw->metrics, cs, b) != BT_OK) {
        conn_kill(gw, conn);
        return;
    }
    conn_respond(gw, conn, 200, "text/plain; version=0.0.4; charset=utf-8",
                 b->data, b->len, NULL);
}

static void on_status(gateway_t *gw, conn_t *conn,
                      const Baton__ClusterStatus *cs)
{
    conn_job_t job = conn->job;

    if (job != JOB_HEALTH && job != JOB_METRICS)
        return;
    conn_job_drop(gw, conn, false);
    if (job == JOB_HEALTH)
        respond_health(gw, conn, cs);
    else
        respond_metrics(gw, conn, cs);
}

static void process_input(gateway_t *gw, conn_t *conn);

/* Takes every message the router has for us now. */
static void drain_router(gateway_t *gw)
{
    for (;;) {
        Baton__ClientMessage *m = NULL;
        bt_status_t status = client_recv(gw->client, 0, &m);
        conn_t *conn;

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
        conn = map_get(gw, client_msg_request_id(m));
        if (conn != NULL && !conn->dead) {
            switch (m->body_case) {
            case BATON__CLIENT_MESSAGE__BODY_CHUNK:
                on_chunk(gw, conn, m->chunk);
                break;
            case BATON__CLIENT_MESSAGE__BODY_FINISHED:
                on_finished(gw, conn, m->finished);
                break;
            case BATON__CLIENT_MESSAGE__BODY_ERROR:
                on_error(gw, conn, m->error);
                break;
            case BATON__CLIENT_MESSAGE__BODY_STATUS:
                on_status(gw, conn, m->status);
                break;
            default:
                break;
            }
            if (!conn->dead && conn->state == CONN_READ)
                process_input(gw, conn); /* pipelined next request */
        }
        proto_client_free(&m);
    }
}

// ---------------------------------------------------------------------------
// Requests

/* True (err set: 400 context_length_exceeded) when the prompt cannot fit
 * the cluster's context, so that no worker spends time on it.  Token ids
 * are counted exactly.  Text is bounded by bytes first (a token is at
 * most tok_max_piece_len bytes, or --max-token-bytes without a
 * tokenizer), then, with a tokenizer and a prompt near the bound,
 * counted exactly. */
static bool prompt_too_long(gateway_t *gw, const gateway_api_req_t *areq,
                            gateway_api_error_t *err)
{
    uint32_t ctx = gw->max_context;
    size_t bytes, per_token, n_tokens = 0;

    if (ctx == 0)
        return false; /* not known yet: the router checks */
    if (areq->req.n_prompt_ids > 0) {
        n_tokens = (size_t)areq->req.n_prompt_ids;
    } else if (areq->req.prompt != NULL) {
        bytes = strlen(areq->req.prompt);
        per_token = gw->tok ? (size_t)BT_MAX(tok_max_piece_len(gw->tok), 1)
                            : (size_t)gw->cfg.max_token_bytes;
        n_tokens = (bytes + per_token - 1) / per_token; /* a lower bound */
        if (n_tokens < ctx && gw->tok != NULL && bytes + 1 >= ctx &&
            bytes <= (1u << 20)) {
            int *ids = NULL, n = 0;
            if (tok_encode(gw->tok, areq->req.prompt, bytes,
                           areq->req.add_bos && tok_adds_bos(gw->tok), &ids,
                           &n) == BT_OK)
                n_tokens = (size_t)n;
            bt_free(ids);
        }
    }
    if (n_tokens < ctx)
        return false;
    gateway__api_error_set(err, 400, "invalid_request_error",
                           "context_length_exceeded", "prompt",
                           "the prompt is %s%zu tokens, the context is %u",
                           areq->req.n_prompt_ids > 0 ? "" : "at least ",
                           n_tokens, ctx);
    return true;
}

/* Prompt tokens of a parsed request: exact for ids, bytes / 4 for text
 * (a tenant's token-rate charge; corrected at the end). */
static uint64_t prompt_estimate(const gateway_api_req_t *areq)
{
    if (areq->req.n_prompt_ids > 0)
        return (uint64_t)areq->req.n_prompt_ids;
    return areq->req.prompt != NULL ? strlen(areq->req.prompt) / 4 + 1 : 1;
}

/* Admits a parsed request against its tenant's limits (none without
 * one) and stamps it with the tenant's class, weight and salt.  False:
 * answered 429 (areq cleaned up). */
static bool tenant_admit(gateway_t *gw, conn_t *conn, gateway_tenant_t *t,
                         gateway_api_req_t *areq)
{
    gateway_api_error_t err;
    uint64_t out, prompt = prompt_estimate(areq);
    uint32_t retry_ms = 0;
    const char *why = NULL;

    if (t == NULL)
        return true;
    out = areq->req.max_tokens > 0 ? (uint64_t)areq->req.max_tokens
          : gw->max_context > 0    ? (uint64_t)gw->max_context
                                   : 1024;
    if (gateway__tenant_admit(t, bt_time_ns(), prompt + out, &retry_ms,
                              &why) != BT_OK) {
        gateway__api_req_cleanup(areq);
        gw->metrics.tenant_limited++;
        gateway__api_error_set(&err, 429, "rate_limit_exceeded",
                               "rate_limit_exceeded", NULL, "%s", why);
        err.retry_after_ms = BT_MAX(retry_ms, 1000u);
        conn_respond_error(gw, conn, &err, NULL);
        return false;
    }
    conn->tenant = t;
    conn->charged = prompt + out;
    conn->prompt_est = prompt;
    areq->req.tenant = t->name;
    areq->req.tenant_weight = t->weight;
    areq->req.cache_salt = t->cache_salt;
    areq->req.priority = t->priority; /* the tenant's class, not the body's */
    return true;
}

static void start_generation(gateway_t *gw, conn_t *conn,
                             gateway_api_kind_t kind, const char *body,
                             size_t len, gateway_tenant_t *tenant)
{
    gateway_api_req_t areq;
    gateway_api_error_t err;
    uint64_t rid;
    bt_status_t status;

    if (client_router_state(gw->client) == CLIENT_ROUTER_LOST) {
        /* fail fast rather than queue behind a router that is gone */
        respond_simple_error(gw, conn, 503, "service_unavailable",
                             "router_unreachable",
                             "the baton router is unreachable", NULL);
        return;
    }
    if (gateway__api_parse(&gw->api, kind, body, len, &areq, &err) != BT_OK) {
        conn_respond_error(gw, conn, &err, NULL);
        return;
    }
    if (prompt_too_long(gw, &areq, &err)) {
        gateway__api_req_cleanup(&areq);
        gw->metrics.edge_too_long++;
        conn_respond_error(gw, conn, &err, NULL);
        return;
    }
    if (!tenant_admit(gw, conn, tenant, &areq))
        return;
    status = client_submit(gw->client, &areq.req, &rid);
    conn->stream = areq.stream;
    conn->include_usage = areq.stream && areq.include_usage;
    gateway__api_req_cleanup(&areq);
    if (status != BT_OK) {
        if (conn->tenant != NULL)
            gateway__tenant_release(conn->tenant, conn->charged, 0);
        conn->tenant = NULL;
        respond_simple_error(gw, conn, 503, "service_unavailable",
                             "router_unreachable",
                             "cannot reach the baton router", NULL);
        return;
    }
    conn->job = JOB_GENERATE;
    conn->rid = rid;
    conn->state = CONN_WAIT;
    conn->t_start = bt_time_ns();
    conn->t_deadline =
        conn->t_start + (uint64_t)gw->cfg.request_timeout_ms * 1000000ull;
    gw->id_counter++;
    snprintf(conn->id, sizeof(conn->id), "%s-%016llx",
             kind == GATEWAY_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)((conn->t_start ^ (gw->id_counter *
                                   0x9e3779b97f4a7c15ull))));
    conn->resp.kind = kind;
    conn->resp.id = conn->id;
    conn->resp.created = (long long)time(NULL);
    conn->resp.model = gw->model_name;
    conn->resp.prompt_tokens = 0;
    conn->resp.completion_tokens = 0;
    gw->metrics.in_flight++;
    map_put(gw, rid, conn);
}

static void start_status(gateway_t *gw, conn_t *conn, conn_job_t job)
{
    uint64_t rid;

    if (client_router_state(gw->client) != CLIENT_ROUTER_UP ||
        client_status_request(gw->client, &rid) != BT_OK) {
        if (job == JOB_HEALTH)
            respond_health(gw, conn, NULL);
        else
            respond_metrics(gw, conn, NULL);
        return;
    }
    conn->job = job;
    conn->rid = rid;
    conn->state = CONN_WAIT;
    conn->t_deadline =
        bt_time_ns() + (uint64_t)gw->cfg.status_timeout_ms * 1000000ull;
    map_put(gw, rid, conn);
}

static void respond_models(gateway_t *gw, conn_t *conn, const char *one,
                           size_t one_len)
{
    bt_buf_t *b = &gw->scratch;

    b->len = 0;
    if (one != NULL && (one_len != strlen(gw->model_name) ||
                        memcmp(one, gw->model_name, one_len) != 0)) {
        respond_simple_error(gw, conn, 404, "invalid_request_error",
                             "model_not_found", "no such model", NULL);
        return;
    }
    if (gateway__api_models_json(gw->model_name, (long long)time(NULL),
                                 one == NULL, b) != BT_OK ||
        bt_buf_append(b, "\n", 1) != BT_OK) {
        conn_kill(gw, conn);
        return;
    }
    conn_respond(gw, conn, 200, "application/json", b->data, b->len, NULL);
}

static bool path_is(const gateway_http_req_t *req, const char *p)
{
    size_t n = strlen(p);
    return req->path_len == n && memcmp(req->path, p, n) == 0;
}

/* With API keys: the tenant of the request's Bearer key, or NULL after
 * answering 401 (nothing reaches the router).  Without keys: true with
 * *t_p NULL.  The key is never logged. */
static bool authorize(gateway_t *gw, conn_t *conn,
                      const gateway_http_req_t *req, gateway_tenant_t **t_p)
{
    gateway_tenant_t *t = NULL;

    *t_p = NULL;
    if (gw->auth == NULL)
        return true;
    if (req->n_authorization == 1)
        t = gateway__auth_check(gw->auth, req->authorization,
                                req->authorization_len);
    if (t == NULL) {
        gw->metrics.unauthorized++;
        respond_simple_error(gw, conn, 401, "invalid_request_error",
                             "invalid_api_key",
                             req->n_authorization == 0
                                 ? "no API key: send Authorization: Bearer "
                                   "KEY"
                                 : "incorrect API key provided",
                             "WWW-Authenticate: Bearer\r\n");
        return false;
    }
    *t_p = t;
    return true;
}

/* Answers one complete request (now, or later from the router). */
static void dispatch(gateway_t *gw, conn_t *conn, const gateway_http_req_t *req)
{
    const char *body = conn->in.data + req->header_len;
    bool get = req->method == GATEWAY_HTTP_GET;
    bool post = req->method == GATEWAY_HTTP_POST;
    gateway_tenant_t *tenant = NULL;

    if (path_is(req, "/v1/completions") || path_is(req, "/v1/chat/completions")) {
        bool chat = path_is(req, "/v1/chat/completions");
        conn->ep = chat ? GATEWAY_EP_CHAT : GATEWAY_EP_COMPLETIONS;
        if (!post) {
            respond_simple_error(gw, conn, 405, "invalid_request_error",
                                 "method_not_allowed", "use POST",
                                 "Allow: POST\r\n");
            return;
        }
        if (!authorize(gw, conn, req, &tenant))
            return;
        start_generation(gw, conn,
                         chat ? GATEWAY_API_CHAT : GATEWAY_API_COMPLETIONS,
                         body, req->content_length, tenant);
        return;
    }
    if (path_is(req, "/v1/models") ||
        (req->path_len > 11 && memcmp(req->path, "/v1/models/", 11) == 0)) {
        conn->ep = GATEWAY_EP_MODELS;
        if (!get) {
            respond_simple_error(gw, conn, 405, "invalid_request_error",
                                 "method_not_allowed", "use GET",
                                 "Allow: GET\r\n");
            return;
        }
        if (!authorize(gw, conn, req, &tenant))
            return;
        if (req->path_len > 11)
            respond_models(gw, conn, req->path + 11, req->path_len - 11);
        else
            respond_models(gw, conn, NULL, 0);
        return;
    }
    if (path_is(req, "/livez")) {
        /* Liveness of this process only: answered by the event loop
         * without asking the router (a router restart or an empty
         * cluster must not get baton-http restarted). */
        static const char ok[] = "{\"status\":\"alive\"}\n";
        conn->ep = GATEWAY_EP_LIVEZ;
        if (!get) {
            respond_simple_error(gw, conn, 405, "invalid_request_error",
                                 "method_not_allowed", "use GET",
                                 "Allow: GET\r\n");
            return;
        }
        conn_respond(gw, conn, 200, "application/json", ok, sizeof(ok) - 1,
                     NULL);
        return;
    }
    if (path_is(req, "/health") || path_is(req, "/metrics")) {
        bool health = path_is(req, "/health");
        conn->ep = health ? GATEWAY_EP_HEALTH : GATEWAY_EP_METRICS;
        if (!get) {
            respond_simple_error(gw, conn, 405, "invalid_request_error",
                                 "method_not_allowed", "use GET",
                                 "Allow: GET\r\n");
            return;
        }
        if (!health && gw->cfg.metrics_auth &&
            !authorize(gw, conn, req, &tenant))
            return;
        start_status(gw, conn, health ? JOB_HEALTH : JOB_METRICS);
        return;
    }
    conn->ep = GATEWAY_EP_OTHER;
    respond_simple_error(gw, conn, 404, "invalid_request_error", "not_found",
                         "no such endpoint", NULL);
}

/* Sets the X-Request-Id of the request about to be answered: the
 * client's (req, when given) if it is 1 to GATEWAY_REQUEST_ID_MAX visible
 * ASCII characters, else a new unique one.  Echoed in the response head
 * and logged with the request. */
static void conn_request_id(gateway_t *gw, conn_t *conn,
                            const gateway_http_req_t *req)
{
    bool ok = req != NULL && req->request_id != NULL &&
              req->request_id_len > 0 &&
              req->request_id_len <= GATEWAY_REQUEST_ID_MAX;

    for (size_t i = 0; ok && i < req->request_id_len; i++)
        ok = req->request_id[i] > 0x20 && req->request_id[i] < 0x7f;
    if (ok) {
        memcpy(conn->request_id, req->request_id, req->request_id_len);
        conn->request_id[req->request_id_len] = '\0';
        return;
    }
    gw->id_counter++;
    snprintf(conn->request_id, sizeof(conn->request_id), "baton-%016llx",
             (unsigned long long)(bt_time_ns() ^
                                  (gw->id_counter * 0x9e3779b97f4a7c15ull)));
}

/* Parses and answers the requests waiting in the input buffer, in order,
 * until one has to wait for the router. */
static void process_input(gateway_t *gw, conn_t *conn)
{
    while (!conn->dead && conn->state == CONN_READ && conn->in.len > 0) {
        gateway_http_req_t req;
        bt_status_t status;

        status = gateway__http_parse(conn->in.data, conn->in.len, &gw->limits,
                                     &req);
        if (status == BT_IN_PROGRESS) {
            if (req.header_len > 0 && req.expect_continue &&
                !conn->sent_continue) {
                conn->sent_continue = true;
                conn_write(gw, conn, "HTTP/1.1 100 Continue\r\n\r\n", 25);
            }
            return;
        }
        conn_request_id(gw, conn, status == BT_OK ? &req : NULL);
        if (status != BT_OK) {
            conn->ep = GATEWAY_EP_OTHER;
            conn->keep_alive = false;
            conn->http10 = false;
            respond_simple_error(gw, conn, req.error_status,
                                 "invalid_request_error", NULL, req.error,
                                 NULL);
            conn->in.len = 0;
            return;
        }
        conn->keep_alive = req.keep_alive;
        conn->http10 = req.minor == 0;
        dispatch(gw, conn, &req);
        bt_buf_consume(&conn->in, req.total_len);
        conn->sent_continue = false;
        conn->t_req_start = conn->in.len > 0 ? bt_time_ns() : 0;
    }
}

// ---------------------------------------------------------------------------
// Sockets

static void on_readable(gateway_t *gw, conn_t *conn, uint32_t events)
{
    size_t limit = gw->cfg.max_header_bytes + gw->cfg.max_body_bytes;

    if (events & EPOLLERR) {
        conn_kill(gw, conn);
        return;
    }
    while (!conn->dead && !conn->eof) {
        size_t room;
        ssize_t n;

        if (conn->state == CONN_LINGER)
            conn->in.len = 0; /* dropped */
        if (conn->in.len >= limit) {
            if ((events & (EPOLLRDHUP | EPOLLHUP)) && conn->state == CONN_WAIT)
                conn_kill(gw, conn); /* cannot read, but the client left */
            break;
        }
        room = limit - conn->in.len < READ_CHUNK ? limit - conn->in.len
                                                 : READ_CHUNK;
        if (bt_buf_reserve(&conn->in, room) != BT_OK) {
            conn_kill(gw, conn);
            return;
        }
        n = recv(conn->fd, conn->in.data + conn->in.len, room, 0);
        if (n > 0) {
            if (conn->in.len == 0 && conn->t_req_start == 0 &&
                conn->state == CONN_READ)
                conn->t_req_start = bt_time_ns();
            conn->in.len += (size_t)n;
            conn->in.data[conn->in.len] = '\0';
            conn->t_activity = bt_time_ns();
            if ((size_t)n < room)
                break; /* drained for now */
        } else if (n == 0) {
            conn->eof = true;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else {
            conn_kill(gw, conn);
            return;
        }
    }
    if (conn->dead)
        return;
    if (conn->state == CONN_READ)
        process_input(gw, conn);
    if (conn->eof && !conn->dead) {
        /* The client closed its side: a request at the router is
         * abandoned (cancelled); queued output still goes out. */
        if (conn->state == CONN_WAIT || conn->state == CONN_LINGER ||
            conn->out.len == 0)
            conn_kill(gw, conn);
        else
            conn->state = CONN_CLOSING;
    }
    if (!conn->dead)
        conn_update_events(gw, conn);
}

/* Open connections from one client address. */
static int conns_from(const gateway_t *gw, const uint8_t *addr, size_t len)
{
    int n = 0;

    for (int i = 0; i < gw->cfg.max_connections; i++) {
        const conn_t *c = gw->conns[i];
        n += c != NULL && !c->dead && c->addr_len == len &&
             memcmp(c->addr, addr, len) == 0;
    }
    return n;
}

/* All connections are taken: closes the one that has waited longest for
 * a request to start or finish arriving (idle keep-alive, or a slow or
 * never-finished request: slowloris).  Connections with a request at the
 * router or output to send are never taken.  Without this, half-open
 * connections from many addresses would keep real clients out (503)
 * until their timeouts. */
static void evict_one(gateway_t *gw)
{
    conn_t *victim = NULL;
    uint64_t oldest = UINT64_MAX;

    for (int i = 0; i < gw->cfg.max_connections; i++) {
        conn_t *c = gw->conns[i];
        uint64_t since;
        if (c == NULL || c->dead || c->out.len > 0 ||
            (c->state != CONN_READ && c->state != CONN_LINGER))
            continue;
        since = c->t_req_start != 0 ? c->t_req_start : c->t_activity;
        if (c->state == CONN_LINGER)
            since = 0; /* done already: first to go */
        if (since < oldest) {
            oldest = since;
            victim = c;
        }
    }
    if (victim == NULL)
        return;
    gw->metrics.evicted_conns++;
    conn_kill(gw, victim);
    /* Freed now, for its slot: out of the turn's dead and dirty lists
     * first, so nothing touches it later in this turn (stale epoll
     * events are caught by the slot generation). */
    for (int i = 0; i < gw->n_dead; i++)
        if (gw->dead[i] == victim) {
            gw->dead[i] = gw->dead[--gw->n_dead];
            break;
        }
    for (int i = 0; victim->in_dirty && i < gw->n_dirty; i++)
        if (gw->dirty[i] == victim) {
            gw->dirty[i] = gw->dirty[--gw->n_dirty];
            break;
        }
    conn_free(gw, victim);
}

static void accept_all(gateway_t *gw)
{
    static const char busy_body[] =
        "{\"error\":{\"message\":\"too many connections\",\"type\":"
        "\"service_unavailable\",\"param\":null,\"code\":\"overloaded\"}}\n";
    char busy[512];
    int busy_len = snprintf(busy, sizeof(busy),
        "HTTP/1.1 503 Service Unavailable\r\nServer: baton-http\r\n"
        "Content-Type: application/json\r\nContent-Length: %zu\r\n"
        "Connection: close\r\nRetry-After: 1\r\n\r\n%s",
        sizeof(busy_body) - 1, busy_body);

    for (;;) {
        struct epoll_event ev;
        struct sockaddr_storage ss;
        socklen_t ss_len = sizeof(ss);
        uint8_t addr[16];
        uint8_t addr_len = 0;
        conn_t *conn;
        int one = 1, slot;
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
        if (ss.ss_family == AF_INET) {
            memcpy(addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
            addr_len = 4;
        } else if (ss.ss_family == AF_INET6) {
            memcpy(addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
            addr_len = 16;
        }
        if (gw->cfg.max_conns_per_client > 0 && addr_len > 0 &&
            conns_from(gw, addr, addr_len) >= gw->cfg.max_conns_per_client) {
            ssize_t n = send(fd, busy, (size_t)busy_len, MSG_NOSIGNAL);
            (void)n;
            gw->metrics.rejected_conns++;
            gateway__metrics_request(&gw->metrics, GATEWAY_EP_OTHER, 503);
            close(fd);
            continue;
        }
        if (gw->n_conns >= gw->cfg.max_connections)
            evict_one(gw);
        if (gw->n_conns >= gw->cfg.max_connections) {
            ssize_t n = send(fd, busy, (size_t)busy_len, MSG_NOSIGNAL);
            (void)n;
            gw->metrics.rejected_conns++;
            gateway__metrics_request(&gw->metrics, GATEWAY_EP_OTHER, 503);
            close(fd);
            continue;
        }
        for (slot = 0; gw->conns[slot] != NULL; slot++)
            ;
        conn = bt_calloc(1, sizeof(*conn), "gateway_conn");
        if (conn == NULL) {
            close(fd);
            continue;
        }
        conn->fd = fd;
        memcpy(conn->addr, addr, sizeof(addr));
        conn->addr_len = addr_len;
        conn->slot = slot;
        conn->gen = ++gw->gens[slot];
        conn->state = CONN_READ;
        conn->t_activity = bt_time_ns();
        conn->keep_alive = true;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = epoll_tag(conn);
        if (epoll_ctl(gw->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            bt_free(conn);
            continue;
        }
        conn->events = ev.events;
        gw->conns[slot] = conn;
        gw->n_conns++;
        gw->metrics.connections = gw->n_conns;
    }
}

/* True when the pending request's headers have all arrived. */
static bool headers_complete(const conn_t *conn)
{
    return conn->in.len >= 4 &&
           (memmem(conn->in.data, conn->in.len, "\r\n\r\n", 4) != NULL ||
            memmem(conn->in.data, conn->in.len, "\n\n", 2) != NULL);
}

/* The router link: counts losses, and keeps the cluster's context length
 * fresh (asked every CONTEXT_POLL_MS while the link is up). */
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

/* Timeouts: slow request senders (408), idle keep-alive connections,
 * stalled readers, router requests past their time (504), lingering
 * closes. */
static void sweep(gateway_t *gw, uint64_t now)
{
    uint64_t ms = 1000000ull;

    router_watch(gw, now);
    for (int i = 0; i < gw->cfg.max_connections; i++) {
        conn_t *conn = gw->conns[i];

        if (conn == NULL || conn->dead)
            continue;
        if (conn->out.len > 0 &&
            now - conn->t_out_since > (uint64_t)gw->cfg.write_timeout_ms * ms) {
            conn_kill(gw, conn);
            continue;
        }
        switch (conn->state) {
        case CONN_READ:
            if (conn->t_req_start != 0 &&
                (now - conn->t_req_start >
                     (uint64_t)gw->cfg.read_timeout_ms * ms ||
                 (now - conn->t_req_start >
                      (uint64_t)gw->cfg.header_timeout_ms * ms &&
                  !headers_complete(conn)))) {
                conn->keep_alive = false;
                conn->ep = GATEWAY_EP_OTHER;
                conn->in.len = 0;
                respond_simple_error(gw, conn, 408, "invalid_request_error",
                                     NULL, "request not received in time",
                                     NULL);
            } else if (conn->in.len == 0 && conn->out.len == 0 &&
                       now - conn->t_activity >
                           (uint64_t)gw->cfg.idle_timeout_ms * ms) {
                conn_kill(gw, conn);
            }
            break;
        case CONN_WAIT:
            if (now > conn->t_deadline) {
                conn_job_t job = conn->job;
                if (job == JOB_GENERATE) {
                    gateway_api_error_t err;
                    client_cancel(gw->client, conn->rid);
                    conn_job_drop(gw, conn, false);
                    gateway__api_error_set(&err, 504, "timeout",
                                           "router_timeout", NULL,
                                           "no answer from the router in "
                                           "%d ms", gw->cfg.request_timeout_ms);
                    generation_fail(gw, conn, &err);
                } else {
                    conn_job_drop(gw, conn, false);
                    if (job == JOB_HEALTH)
                        respond_health(gw, conn, NULL);
                    else
                        respond_metrics(gw, conn, NULL);
                }
                if (!conn->dead && conn->state == CONN_READ)
                    process_input(gw, conn);
            }
            break;
        case CONN_LINGER:
            if (now > conn->t_linger_end)
                conn_kill(gw, conn);
            break;
        default:
            break;
        }
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
    gw = bt_calloc(1, sizeof(*gw), "gateway");
    if (gw == NULL)
        return BT_ERR_NO_MEMORY;
    gw->cfg = *cfg;
    gw->listen_fd = -1;
    gw->epoll_fd = -1;
    gateway__metrics_init(&gw->metrics);
    bt_buf_init(&gw->scratch);
    gw->model_name = bt_strdup(cfg->model_name, "gateway");
    gw->conns = bt_calloc((size_t)n, sizeof(*gw->conns), "gateway");
    gw->gens = bt_calloc((size_t)n, sizeof(*gw->gens), "gateway");
    gw->dead = bt_calloc((size_t)n, sizeof(*gw->dead), "gateway");
    gw->dirty = bt_calloc((size_t)n, sizeof(*gw->dirty), "gateway");
    for (gw->map_cap = 64; gw->map_cap < (size_t)n * 4; gw->map_cap *= 2)
        ;
    gw->map = bt_calloc(gw->map_cap, sizeof(*gw->map), "gateway");
    if (gw->model_name == NULL || gw->conns == NULL || gw->gens == NULL ||
        gw->dead == NULL || gw->dirty == NULL || gw->map == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    gw->limits.max_header_bytes = cfg->max_header_bytes;
    gw->limits.max_body_bytes = cfg->max_body_bytes;

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
    status = client_create(cfg->router, &gw->client);
    if (status != BT_OK)
        goto err_destroy;
    status = client_fd(gw->client, &gw->router_fd);
    if (status != BT_OK)
        goto err_destroy;
    gw->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (gw->epoll_fd < 0) {
        status = BT_ERROR(BT_ERR_IO, "HTTP", "epoll_create1: %s",
                          strerror(errno));
        goto err_destroy;
    }
    status = listen_on(gw, cfg->listen);
    if (status != BT_OK)
        goto err_destroy;
    status = epoll_add(gw, gw->listen_fd, EPOLLIN, TAG_LISTEN);
    if (status == BT_OK)
        status = epoll_add(gw, gw->router_fd, EPOLLIN | EPOLLET, TAG_ROUTER);
    if (status != BT_OK)
        goto err_destroy;
    BT_LOG_INFO("HTTP", "listening on %s (port %d), router %s, model '%s', "
                "chat template %s%s", cfg->listen, gw->port, cfg->router,
                gw->model_name, chat_template_name(gw->api.chat_template),
                gw->tok ? "" : " (no tokenizer: chat prompts sent as text)");
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
    for (int i = 0; gw->conns != NULL && i < gw->cfg.max_connections; i++)
        if (gw->conns[i] != NULL) {
            conn_kill(gw, gw->conns[i]);
            conn_free(gw, gw->conns[i]);
        }
    if (gw->listen_fd >= 0)
        close(gw->listen_fd);
    if (gw->epoll_fd >= 0)
        close(gw->epoll_fd);
    client_destroy(&gw->client);
    gateway__auth_destroy(&gw->auth);
    tok_destroy(&gw->tok);
    bt_buf_cleanup(&gw->scratch);
    bt_free(gw->map);
    bt_free(gw->dirty);
    bt_free(gw->dead);
    bt_free(gw->gens);
    bt_free(gw->conns);
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
        int n = epoll_wait(gw->epoll_fd, events, MAX_EVENTS, TICK_MS);
        uint64_t now;

        if (n < 0 && errno != EINTR)
            return BT_ERROR(BT_ERR_IO, "HTTP", "epoll_wait: %s",
                            strerror(errno));
        for (int i = 0; i < n; i++) {
            uint64_t tag = events[i].data.u64;
            uint32_t slot = (uint32_t)tag - TAG_CONN0;
            conn_t *conn;

            if (tag == TAG_LISTEN) {
                accept_all(gw);
                continue;
            }
            if (tag == TAG_ROUTER)
                continue; /* drained below */
            if (slot >= (uint32_t)gw->cfg.max_connections)
                continue;
            conn = gw->conns[slot];
            if (conn == NULL || conn->dead || conn->gen != (uint32_t)(tag >> 32))
                continue; /* stale event of a closed connection */
            if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                on_readable(gw, conn, events[i].events);
            if (!conn->dead && (events[i].events & EPOLLOUT))
                conn_flush(gw, conn);
        }
        drain_router(gw);
        now = bt_time_ns();
        if (now - last_sweep >= TICK_MS * 1000000ull) {
            last_sweep = now;
            sweep(gw, now);
        }
        for (int i = 0; i < gw->n_dirty; i++) {
            gw->dirty[i]->in_dirty = false;
            if (!gw->dirty[i]->dead)
                conn_flush(gw, gw->dirty[i]);
        }
        gw->n_dirty = 0;
        for (int i = 0; i < gw->n_dead; i++)
            conn_free(gw, gw->dead[i]);
        gw->n_dead = 0;
    }
    return BT_OK;
}
