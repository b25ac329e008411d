/* client.c - the baton client library (see client.h). */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "params_proto.h"
#include "proto_batch.h"

/* One request the router owes an ending (Finished, Error, ClusterStatus). */
typedef struct {
    uint64_t rid;      /* 0 = empty slot */
    uint64_t t_submit; /* ns, for the connect timeout */
} client_pending_t;

struct client_s {
    void *ctx;                 /* ZeroMQ context, owned */
    void *sock;                /* DEALER connected to the router */
    void *mon;                 /* PAIR reading the DEALER's monitor */
    uint64_t next_id;          /* next request id */
    client_config_t cfg;
    client_router_state_t state;
    uint64_t t_down;           /* ns: link down since (creation, loss) */
    uint64_t losses;           /* times the router was lost */
    uint64_t auth_failures;    /* handshakes the router refused */
    uint64_t lost_below;       /* replies for ids under this that are not
                                  in flight belong to a lost router:
                                  dropped */
    client_pending_t *inflight; /* (inflight_cap) open addressing by rid */
    size_t inflight_cap;       /* power of two */
    size_t n_inflight;
    Baton__ClientMessage **ready; /* (ready_cap) synthesized errors, FIFO */
    size_t ready_head;
    size_t n_ready;
    size_t ready_cap;
};

#define CLIENT_RETRY_HINT_MS 1000 /* ERROR_ROUTER_LOST's retry hint */

static int env_ms(const char *name, int def)
{
    const char *v = getenv(name);
    int x;

    if (v == NULL || bt_parse_int(v, &x) != BT_OK || x <= 0)
        return def;
    return x;
}

void client_config_init(client_config_t *cfg)
{
    cfg->heartbeat_ms = env_ms("BT_CLIENT_HEARTBEAT_MS", 500);
    cfg->heartbeat_timeout_ms = env_ms("BT_CLIENT_HEARTBEAT_TIMEOUT_MS", 2000);
    cfg->connect_timeout_ms = env_ms("BT_CLIENT_CONNECT_TIMEOUT_MS", 5000);
    cfg->curve = NULL;
}

int client_curve_args(int *argc, char **argv, const char *prog)
{
    static const char *const names[2] = { "--curve-secret-key",
                                          "--router-public-key" };
    const char *vals[2] = { NULL, NULL };
    int out = 1;

    for (int i = 1; i < *argc; i++) {
        int k = -1;
        const char *val = NULL;
        for (int j = 0; j < 2 && k < 0; j++) {
            size_t n = strlen(names[j]);
            if (strcmp(argv[i], names[j]) == 0) {
                if (i + 1 >= *argc) {
                    fprintf(stderr, "%s: %s needs a FILE\n", prog, names[j]);
                    return -1;
                }
                k = j;
                val = argv[++i];
            } else if (strncmp(argv[i], names[j], n) == 0 &&
                       argv[i][n] == '=') {
                k = j;
                val = argv[i] + n + 1;
            }
        }
        if (k >= 0)
            vals[k] = val;
        else
            argv[out++] = argv[i];
    }
    *argc = out;
    argv[out] = NULL;
    if (vals[0] == NULL && vals[1] == NULL)
        return 0;
    if (bt_curve_identity_init(vals[0], vals[1]) != BT_OK) {
        fprintf(stderr, "%s: %s\n", prog, bt_error_last());
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Requests in flight (linear probing, backward-shift deletion)

static size_t inflight_slot(const client_t *c, uint64_t rid)
{
    return (size_t)((rid * 0x9e3779b97f4a7c15ull) >> 17) &
           (c->inflight_cap - 1);
}

static client_pending_t *inflight_find(const client_t *c, uint64_t rid)
{
    size_t i;

    if (rid == 0 || c->inflight_cap == 0)
        return NULL;
    for (i = inflight_slot(c, rid); c->inflight[i].rid != 0;
         i = (i + 1) & (c->inflight_cap - 1))
        if (c->inflight[i].rid == rid)
            return &c->inflight[i];
    return NULL;
}

static void inflight_insert(client_pending_t *tab, size_t cap,
                            const client_pending_t *p)
{
    size_t i = (size_t)((p->rid * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);

    while (tab[i].rid != 0)
        i = (i + 1) & (cap - 1);
    tab[i] = *p;
}

/* Remembers rid as owed an ending; false when out of memory (the request
 * then goes untracked: a lost router is not reported for it). */
static bool inflight_add(client_t *c, uint64_t rid)
{
    client_pending_t p = { rid, bt_time_ns() };

    if ((c->n_inflight + 1) * 2 > c->inflight_cap) {
        size_t cap = c->inflight_cap ? c->inflight_cap * 2 : 64;
        client_pending_t *tab = bt_calloc(cap, sizeof(*tab), "client_inflight");
        if (tab == NULL)
            return false;
        for (size_t i = 0; i < c->inflight_cap; i++)
            if (c->inflight[i].rid != 0)
                inflight_insert(tab, cap, &c->inflight[i]);
        bt_free(c->inflight);
        c->inflight = tab;
        c->inflight_cap = cap;
    }
    inflight_insert(c->inflight, c->inflight_cap, &p);
    c->n_inflight++;
    return true;
}

static void inflight_remove(client_t *c, uint64_t rid)
{
    size_t mask = c->inflight_cap - 1, i, j;
    client_pending_t *p = inflight_find(c, rid);

    if (p == NULL)
        return;
    i = (size_t)(p - c->inflight);
    c->inflight[i].rid = 0;
    c->n_inflight--;
    for (j = (i + 1) & mask; c->inflight[j].rid != 0; j = (j + 1) & mask) {
        size_t h = inflight_slot(c, c->inflight[j].rid);
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            c->inflight[i] = c->inflight[j];
            c->inflight[j].rid = 0;
            i = j;
        }
    }
}

// ---------------------------------------------------------------------------
// Lost router: synthesized errors

/* Appends `msg` to the messages client_recv() hands out before reading
 * the socket again.  Takes ownership of `msg` (freed on failure).
 * BT_ERR_NO_MEMORY. */
static bt_status_t ready_push(client_t *c, Baton__ClientMessage *msg)
{
    if (c->n_ready == c->ready_cap) {
        size_t cap = c->ready_cap ? c->ready_cap * 2 : 64;
        Baton__ClientMessage **q = bt_calloc(cap, sizeof(*q), "client_ready");
        if (q == NULL) {
            proto_client_free(&msg);
            return BT_ERR_NO_MEMORY;
        }
        for (size_t i = 0; i < c->n_ready; i++)
            q[i] = c->ready[(c->ready_head + i) % c->ready_cap];
        bt_free(c->ready);
        c->ready = q;
        c->ready_cap = cap;
        c->ready_head = 0;
    }
    c->ready[(c->ready_head + c->n_ready) % c->ready_cap] = msg;
    c->n_ready++;
    return BT_OK;
}

/* Queues an Error(ERROR_ROUTER_LOST) for rid.  It is built by encoding and
 * decoding a real message, so the caller frees it with
 * proto_client_free() like any other. */
static void ready_push_lost(client_t *c, uint64_t rid, const char *why)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Error e = BATON__ERROR__INIT;
    Baton__ClientMessage *out = NULL;
    uint8_t buf[512];
    char text[256], err[128];
    size_t len;

    snprintf(text, sizeof(text), "router lost: %s (the request did not "
             "finish; it may be resubmitted)", why);
    e.has_client_request_id = 1;
    e.client_request_id = rid;
    e.has_code = 1;
    e.code = BATON__ERROR_CODE__ERROR_ROUTER_LOST;
    e.message = text;
    e.has_retry_after_ms = 1;
    e.retry_after_ms = CLIENT_RETRY_HINT_MS;
    msg.version = BT_PROTO_VERSION;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_ERROR;
    msg.error = &e;
    len = baton__client_message__get_packed_size(&msg);
    if (len > sizeof(buf))
        return; /* cannot happen: the text is bounded */
    baton__client_message__pack(&msg, buf);
    if (proto_client_decode(buf, len, &out, err, sizeof(err)) != BT_OK)
        return;
    (void)ready_push(c, out);
}

/* Ends request rid with ERROR_ROUTER_LOST.  A Cancel is queued for it: a
 * request still in the socket's queue would otherwise reach the next
 * router that answers and run for nobody. */
static void fail_lost(client_t *c, uint64_t rid, const char *why)
{
    inflight_remove(c, rid);
    ready_push_lost(c, rid, why);
    (void)client_cancel(c, rid); /* best effort; a full queue drops it */
    if (rid + 1 > c->lost_below)
        c->lost_below = rid + 1;
}

/* The connection dropped: every request in flight is gone with it. */
static void router_lost(client_t *c, const char *why)
{
    size_t n = c->n_inflight;

    c->state = CLIENT_ROUTER_LOST;
    c->t_down = bt_time_ns();
    c->losses++;
    for (size_t i = 0; i < c->inflight_cap && c->n_inflight > 0;) {
        if (c->inflight[i].rid != 0)
            fail_lost(c, c->inflight[i].rid, why); /* may shift into i */
        else
            i++;
    }
    c->lost_below = c->next_id;
    BT_LOG_WARN("CLIENT", "router lost (%s): %zu request(s) in flight "
                "failed", why, n);
}

/* Reads the monitor's events (non-blocking). */
static void monitor_drain(client_t *c)
{
    for (;;) {
        zmq_msg_t ev, addr;
        uint16_t event;
        int more;

        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        memcpy(&event, zmq_msg_data(&ev), sizeof(event));
        more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) { /* the endpoint address frame */
            zmq_msg_init(&addr);
            (void)zmq_msg_recv(&addr, c->mon, 0);
            zmq_msg_close(&addr);
        }
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (c->state == CLIENT_ROUTER_LOST)
                BT_LOG_INFO("CLIENT", "router connection up again");
            c->state = CLIENT_ROUTER_UP;
        } else if (event == ZMQ_EVENT_DISCONNECTED &&
                   c->state == CLIENT_ROUTER_UP) {
            router_lost(c, "connection closed or heartbeats unanswered");
        } else if ((event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                    event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) &&
                   c->auth_failures++ == 0) {
            /* Once: it repeats on every reconnect. */
            BT_LOG_ERROR("CLIENT", "the router refused the connection (%s): "
                         "check --curve-secret-key/--router-public-key "
                         "(BATON_CURVE_SECRET_KEY, BATON_ROUTER_PUBLIC_KEY) "
                         "and the router's --allow-clients",
                         event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                             ? "key not allowed"
                             : "security handshake failed: CURVE on one "
                               "side only, or the wrong router key?");
        }
    }
}

/* While there is no connection: requests that waited connect_timeout_ms
 * for one fail. */
static void check_connect_timeout(client_t *c, uint64_t now)
{
    uint64_t limit = (uint64_t)c->cfg.connect_timeout_ms * 1000000ull;

    if (c->state == CLIENT_ROUTER_UP || c->n_inflight == 0)
        return;
    for (size_t i = 0; i < c->inflight_cap && c->n_inflight > 0;) {
        client_pending_t *p = &c->inflight[i];
        uint64_t since = BT_MAX(p->t_submit, c->t_down);
        if (p->rid != 0 && now - since > limit)
            fail_lost(c, p->rid, c->state == CLIENT_ROUTER_LOST
                                     ? "no new connection in time"
                                     : "cannot connect");
        else
            i++;
    }
}

// ---------------------------------------------------------------------------
// Requests

bt_status_t client_request_set_precision(client_request_t *req,
                                         const char *precision)
{
    const char *cls = proto_precision_find(precision);

    if (cls == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CLIENT", "precision '%s' is "
                        "not a precision class (%s)", precision,
                        PROTO_PRECISIONS);
    req->precision = cls[0] != '\0' ? cls : NULL;
    return BT_OK;
}

void client_request_init(client_request_t *req)
{
    params_t p;

    memset(req, 0, sizeof(*req));
    req->add_bos = true;
    req->want_text = true;
    params_init(&p);
    client_request_set_params(req, &p);
}

void client_request_set_params(client_request_t *req, const params_t *p)
{
    req->temperature = p->sampling.temperature;
    req->top_k = p->sampling.top_k;
    req->top_p = p->sampling.top_p;
    req->min_p = p->sampling.min_p;
    req->repetition_penalty = p->sampling.repetition_penalty;
    req->presence_penalty = p->sampling.presence_penalty;
    req->frequency_penalty = p->sampling.frequency_penalty;
    req->seed = p->sampling.seed;
    req->skip_special_tokens = p->sampling.skip_special_tokens;
    req->logprobs = p->sampling.logprobs;
    req->top_logprobs = p->sampling.top_logprobs;
    req->prompt_logprobs = p->sampling.prompt_logprobs;
    req->prompt_top_logprobs = p->sampling.prompt_top_logprobs;
    req->max_tokens = p->max_tokens;
    req->ignore_eos = p->ignore_eos;
}

void client_request_params(const client_request_t *req, params_t *p)
{
    params_init(p);
    p->sampling.temperature = req->temperature;
    p->sampling.top_k = req->top_k;
    p->sampling.top_p = req->top_p;
    p->sampling.min_p = req->min_p;
    p->sampling.repetition_penalty = req->repetition_penalty;
    p->sampling.presence_penalty = req->presence_penalty;
    p->sampling.frequency_penalty = req->frequency_penalty;
    p->sampling.seed = req->seed;
    p->sampling.skip_special_tokens = req->skip_special_tokens;
    p->sampling.logprobs = req->logprobs;
    p->sampling.top_logprobs = req->top_logprobs;
    p->sampling.prompt_logprobs = req->prompt_logprobs;
    p->sampling.prompt_top_logprobs = req->prompt_top_logprobs;
    p->max_tokens = req->max_tokens;
    p->ignore_eos = req->ignore_eos;
    p->n_stop_ids = BT_MIN(req->n_stop_ids, PARAMS_MAX_STOP_IDS + 1);
    for (int i = 0; i < req->n_stop_ids && i < PARAMS_MAX_STOP_IDS; i++)
        p->stop_ids[i] = req->stop_ids[i];
    p->n_stop_strings = BT_MIN(req->n_stop_strings,
                               PARAMS_MAX_STOP_STRINGS + 1);
    for (int i = 0; i < req->n_stop_strings && i < PARAMS_MAX_STOP_STRINGS;
         i++) {
        p->stop_strings[i].data = req->stop_strings[i];
        p->stop_strings[i].len = strlen(req->stop_strings[i]);
    }
}

/* Creates the DEALER with heartbeats (set before connecting: a connection
 * takes the options of the moment it is made) and its monitor. */
static bt_status_t socket_open(client_t *c, const char *endpoint)
{
    int linger = 0, hwm = 100000, keepalive = 1, ivl = c->cfg.heartbeat_ms;
    int timeout = c->cfg.heartbeat_timeout_ms, ttl = timeout;
    int handshake = BT_MAX(timeout, 1000);
    int64_t max_msg = PROTO_CLIENT_MAX_BYTES;
    const bt_curve_client_t *curve = c->cfg.curve;
    bt_status_t status;
    char mon_ep[64];

    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (c->sock == NULL)
        return BT_ZMQ_ERROR("zmq_socket");
    /* HEARTBEAT_TTL: the router drops our side as fast, should we be the
     * one that stopped; HANDSHAKE_IVL: a stopped router accepts TCP (the
     * kernel does) but never completes the ZMTP handshake. */
    if (zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max_msg,
                       sizeof(max_msg)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_TCP_KEEPALIVE, &keepalive,
                       sizeof(keepalive)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof(ivl)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout,
                       sizeof(timeout)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TTL, &ttl, sizeof(ttl)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HANDSHAKE_IVL, &handshake,
                       sizeof(handshake)) != 0)
        return BT_ZMQ_ERROR("zmq_setsockopt");
    if (curve == NULL) {
        status = bt_curve_identity(&curve);
        if (status != BT_OK)
            return status;
    }
    status = bt_curve_client_apply(c->sock, curve);
    if (status != BT_OK)
        return status;
    snprintf(mon_ep, sizeof(mon_ep), "inproc://bt-client-mon-%p", (void *)c);
    if (zmq_socket_monitor(c->sock, mon_ep,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        return BT_ZMQ_ERROR("zmq_socket_monitor");
    c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
    if (c->mon == NULL)
        return BT_ZMQ_ERROR("zmq_socket(PAIR)");
    if (zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_connect(c->mon, mon_ep) != 0)
        return BT_ZMQ_ERROR("monitor connect");
    if (zmq_connect(c->sock, endpoint) != 0)
        return BT_ERROR(BT_ERR_NET, "NET", "connect %s: %s", endpoint,
                        zmq_strerror(zmq_errno()));
    return BT_OK;
}

bt_status_t client_create(const char *endpoint, client_t **client_p)
{
    client_config_t cfg;

    client_config_init(&cfg);
    return client_create_cfg(endpoint, &cfg, client_p);
}

bt_status_t client_create_cfg(const char *endpoint,
                              const client_config_t *cfg, client_t **client_p)
{
    client_t *client;
    bt_status_t status;

    if (cfg->heartbeat_ms <= 0 || cfg->heartbeat_timeout_ms <= 0 ||
        cfg->connect_timeout_ms <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CLIENT",
                        "client timeouts must be positive");
    client = bt_calloc(1, sizeof(*client), "client");
    if (client == NULL)
        return BT_ERR_NO_MEMORY;
    client->next_id = 1;
    client->cfg = *cfg;
    client->state = CLIENT_ROUTER_CONNECTING;
    client->t_down = bt_time_ns();
    client->ctx = zmq_ctx_new();
    if (client->ctx == NULL) {
        status = BT_ZMQ_ERROR("zmq_ctx_new");
        bt_free(client);
        return status;
    }
    status = socket_open(client, endpoint);
    if (status != BT_OK) {
        client_destroy(&client);
        return status;
    }
    *client_p = client;
    return BT_OK;
}

void client_destroy(client_t **client_p)
{
    client_t *client = *client_p;

    if (client == NULL)
        return;
    if (client->sock != NULL)
        zmq_socket_monitor(client->sock, NULL, 0);
    bt_zmq_socket_destroy(&client->mon);
    bt_zmq_socket_destroy(&client->sock);
    zmq_ctx_term(client->ctx);
    while (client->n_ready > 0) {
        proto_client_free(&client->ready[client->ready_head]);
        client->ready_head = (client->ready_head + 1) % client->ready_cap;
        client->n_ready--;
    }
    bt_free(client->ready);
    bt_free(client->inflight);
    bt_free(client);
    *client_p = NULL;
}

client_router_state_t client_router_state(client_t *client)
{
    monitor_drain(client);
    return client->state;
}

uint64_t client_router_losses(const client_t *client)
{
    return client->losses;
}

bt_status_t client_submit(client_t *client, const client_request_t *req,
                          uint64_t *rid_p)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__GenerateRequest gen = BATON__GENERATE_REQUEST__INIT;
    Baton__SamplingParams sp;
    params_t params;
    ProtobufCBinaryData stops[PROTO_MAX_STOP];
    bt_status_t status;
    uint64_t rid = client->next_id;

    if (req->n_stop_strings > PROTO_MAX_STOP)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CLIENT",
                        "too many stop strings (%d)", req->n_stop_strings);
    gen.has_client_request_id = 1;
    gen.client_request_id = rid;
    if (req->n_prompt_ids > 0) {
        gen.n_prompt_ids = (size_t)req->n_prompt_ids;
        gen.prompt_ids = (int32_t *)req->prompt_ids;
    } else if (req->prompt != NULL) {
        gen.has_prompt = 1;
        gen.prompt.data = (uint8_t *)req->prompt;
        gen.prompt.len = strlen(req->prompt);
    }
    gen.has_add_bos = 1;
    gen.add_bos = req->add_bos;
    client_request_params(req, &params);
    params_sampling_to_proto(&params.sampling, &sp);
    gen.sampling = &sp;
    gen.has_max_tokens = 1;
    gen.max_tokens = req->max_tokens;
    gen.n_stop_ids = (size_t)req->n_stop_ids;
    gen.stop_ids = (int32_t *)req->stop_ids;
    for (int i = 0; i < req->n_stop_strings; i++) {
        stops[i].data = (uint8_t *)req->stop_strings[i];
        stops[i].len = strlen(req->stop_strings[i]);
    }
    gen.n_stop_strings = (size_t)req->n_stop_strings;
    gen.stop_strings = stops;
    gen.has_ignore_eos = 1;
    gen.ignore_eos = req->ignore_eos;
    gen.has_priority = 1;
    gen.priority = req->priority;
    gen.has_deadline_ms = 1;
    gen.deadline_ms = req->deadline_ms;
    gen.has_want_text = 1;
    gen.want_text = req->want_text;
    gen.tenant = (char *)req->tenant;
    gen.has_tenant_weight = req->tenant_weight > 0;
    gen.tenant_weight = req->tenant_weight;
    gen.grammar = (char *)req->grammar;
    gen.precision = (char *)req->precision;
    gen.has_accept_batch = 1; /* recv_one unpacks ClientBatch */
    gen.accept_batch = 1;
    gen.has_cache_salt = req->cache_salt != NULL;
    gen.cache_salt.data = (uint8_t *)req->cache_salt;
    gen.cache_salt.len = req->cache_salt ? strlen(req->cache_salt) : 0;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_GENERATE;
    msg.generate = &gen;
    status = proto_client_send(client->sock, NULL, 0, &msg);
    if (status != BT_OK)
        return BT_ERROR(BT_ERR_NET, "CLIENT", "cannot send request");
    client->next_id++;
    (void)inflight_add(client, rid);
    *rid_p = rid;
    return BT_OK;
}

bt_status_t client_send_raw(client_t *client, const void *data, size_t len)
{
    const void *frames[1] = { data };
    size_t lens[1] = { len };

    return bt_zmq_send_frames(client->sock, frames, lens, 1, ZMQ_DONTWAIT);
}

bt_status_t client_cancel(client_t *client, uint64_t rid)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Cancel c = BATON__CANCEL__INIT;

    c.has_client_request_id = 1;
    c.client_request_id = rid;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_CANCEL;
    msg.cancel = &c;
    return proto_client_send(client->sock, NULL, 0, &msg);
}

bt_status_t client_status_request(client_t *client, uint64_t *rid_p)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__StatusRequest s = BATON__STATUS_REQUEST__INIT;
    bt_status_t status;

    s.has_client_request_id = 1;
    s.client_request_id = client->next_id;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS_REQUEST;
    msg.status_request = &s;
    status = proto_client_send(client->sock, NULL, 0, &msg);
    if (status != BT_OK)
        return status;
    (void)inflight_add(client, client->next_id);
    *rid_p = client->next_id++;
    return BT_OK;
}

/* True when msg ends its request (no more messages for its id). */
static bool msg_is_final(const Baton__ClientMessage *msg)
{
    return msg->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED ||
           msg->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR ||
           msg->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS;
}

/* Takes a decoded reply: false when it belongs to a request already
 * ended as lost (the caller drops it); a final one ends its request. */
static bool reply_accept(client_t *client, const Baton__ClientMessage *msg)
{
    uint64_t rid = client_msg_request_id(msg);

    if (rid != 0 && rid < client->lost_below &&
        inflight_find(client, rid) == NULL)
        return false; /* already ended as ERROR_ROUTER_LOST */
    if (msg_is_final(msg))
        inflight_remove(client, rid);
    return true;
}

/* A ClientBatch (issue 42): its entries are queued in order as if each
 * had come alone.  An entry that does not decode, has another version or
 * is itself a batch is dropped with a log line (the rest are kept): it
 * cannot be matched to a request.  A batch with more entries than the
 * router makes is dropped whole. */
static void batch_unpack(client_t *client, const Baton__ClientBatch *batch)
{
    char err[256];

    if (batch->n_msgs > PROTO_BATCH_MAX_MSGS) {
        BT_LOG_WARN("CLIENT", "router reply batch of %zu messages dropped "
                    "(at most %d)", batch->n_msgs, PROTO_BATCH_MAX_MSGS);
        return;
    }
    for (size_t i = 0; i < batch->n_msgs; i++) {
        Baton__ClientMessage *m = NULL;
        bt_status_t status;

        status = proto_client_decode(batch->msgs[i].data, batch->msgs[i].len,
                                     &m, err, sizeof(err));
        if (status == BT_OK &&
            m->body_case == BATON__CLIENT_MESSAGE__BODY_BATCH) {
            status = BT_ERR_FORMAT;
            snprintf(err, sizeof(err), "a batch inside a batch");
        }
        if (status != BT_OK) {
            BT_LOG_WARN("CLIENT", "entry %zu of a router reply batch "
                        "dropped: %s", i, err);
            proto_client_free(&m);
            continue;
        }
        if (!reply_accept(client, m)) {
            proto_client_free(&m);
            continue;
        }
        (void)ready_push(client, m);
    }
}

/* Receives and decodes one message the socket holds (BT_ERR_TIMEOUT: none).
 * Messages for requests already ended as lost are dropped, and a batch's
 * entries are queued for client_recv (BT_IN_PROGRESS: look again). */
static bt_status_t recv_one(client_t *client, Baton__ClientMessage **msg_p)
{
    bt_zmq_msg_t zmsg;
    char err[256];
    bt_status_t status;

    status = bt_zmq_recv(client->sock, ZMQ_DONTWAIT, &zmsg);
    if (status != BT_OK)
        return status;
    if (zmsg.n_frames != 1) {
        bt_zmq_msg_close(&zmsg);
        return BT_ERR_FORMAT;
    }
    status = proto_client_decode(bt_zmq_frame_data(&zmsg, 0),
                                 bt_zmq_frame_size(&zmsg, 0), msg_p, err,
                                 sizeof(err));
    bt_zmq_msg_close(&zmsg);
    if (status == BT_ERR_UNSUPPORTED) {
        proto_client_free(msg_p);
        return BT_ERROR(BT_ERR_FORMAT, "CLIENT", "router reply: %s", err);
    }
    if (status != BT_OK)
        return status;
    if ((*msg_p)->body_case == BATON__CLIENT_MESSAGE__BODY_BATCH) {
        batch_unpack(client, (*msg_p)->batch);
        proto_client_free(msg_p);
        return BT_IN_PROGRESS;
    }
    if (!reply_accept(client, *msg_p)) {
        proto_client_free(msg_p);
        return BT_IN_PROGRESS;
    }
    return BT_OK;
}

bt_status_t client_recv(client_t *client, int timeout_ms,
                        Baton__ClientMessage **msg_p)
{
    uint64_t deadline = timeout_ms < 0
                            ? UINT64_MAX
                            : bt_time_ns() + (uint64_t)timeout_ms * 1000000ull;

    for (;;) {
        zmq_pollitem_t items[2] = { { client->sock, 0, ZMQ_POLLIN, 0 },
                                    { client->mon, 0, ZMQ_POLLIN, 0 } };
        uint64_t now;
        bt_status_t status;
        long wait;
        int rc;

        monitor_drain(client);
        now = bt_time_ns();
        check_connect_timeout(client, now);
        if (client->n_ready > 0) {
            *msg_p = client->ready[client->ready_head];
            client->ready_head = (client->ready_head + 1) % client->ready_cap;
            client->n_ready--;
            return BT_OK;
        }
        status = recv_one(client, msg_p);
        if (status == BT_IN_PROGRESS)
            continue;
        if (status != BT_ERR_TIMEOUT)
            return status;
        if (now >= deadline)
            return BT_ERR_TIMEOUT;
        /* Wake for the socket, the monitor, and (waiting for a connection
         * with requests owed) the connect timeout. */
        wait = deadline == UINT64_MAX ? -1
                                      : (long)((deadline - now) / 1000000ull);
        if (client->state != CLIENT_ROUTER_UP && client->n_inflight > 0 &&
            (wait < 0 || wait > 100))
            wait = 100;
        rc = zmq_poll(items, 2, wait);
        if (rc < 0 && zmq_errno() != EINTR)
            return BT_ZMQ_ERROR("zmq_poll");
    }
}

bt_status_t client_fd(client_t *client, int *fd_p)
{
    int fd = -1;
    size_t len = sizeof(fd);

    if (zmq_getsockopt(client->sock, ZMQ_FD, &fd, &len) != 0)
        return BT_ZMQ_ERROR("zmq_getsockopt(ZMQ_FD)");
    *fd_p = fd;
    return BT_OK;
}

uint64_t client_msg_request_id(const Baton__ClientMessage *msg)
{
    switch (msg->body_case) {
    case BATON__CLIENT_MESSAGE__BODY_CHUNK:
        return msg->chunk->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_FINISHED:
        return msg->finished->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_ERROR:
        return msg->error->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_STATUS:
        return msg->status->client_request_id;
    default:
        return 0;
    }
}

const char *client_error_name(Baton__ErrorCode code)
{
    static const char *const names[] = {
        "none", "invalid", "overloaded", "version", "malformed",
        "no_workers", "timeout", "internal", "worker_failed", "too_long",
        "draining", "duplicate", "router_lost",
    };
    if ((unsigned)code < BT_ARRAY_SIZE(names))
        return names[code];
    return "unknown";
}

const char *client_finish_name(Baton__FinishReason reason)
{
    static const char *const names[] = { "none", "stop", "length",
                                         "cancelled" };
    if ((unsigned)reason < BT_ARRAY_SIZE(names))
        return names[reason];
    return "unknown";
}
