/*
 * router.c - the router's life cycle and event loop (see router.h):
 * configuration, binding the client and control sockets, and the one
 * thread that sleeps in zmq_poll and hands each message to the client
 * (router_client.c) or control (router_control.c) handler; a 20 ms tick
 * drives liveness checks, deadlines and dispatch retries.
 *
 * The router by file (each a short, single job):
 *   router.c           life cycle, event loop
 *   router_client.c    the client socket: admission, cancel, status,
 *                      replies (chunks, finished, errors)
 *   router_control.c   the worker socket: control messages in and out
 *   router_registry.c  the worker table: registration, heartbeats,
 *                      liveness, drops, KV peer lists
 *   router_request.c   request objects: lookup, admission queue,
 *                      release, re-queue, completion, deadlines
 *   router_flow.c      the request state machine: queued -> reserving ->
 *                      prefilling -> decoding (dispatch, grants, the
 *                      first token, the token relay)
 *   router_policy.c    which workers take a request; KV transport per pair
 *   router_pool.c      precision routing: a request's class, pairs of one
 *                      precision and KV dtype
 *   router_metrics.c   counters, histograms, the Prometheus text
 *   router_http.c      the metrics HTTP listener (GET /metrics)
 *   router_zap.c       CURVE: key files, allow lists, the ZAP handler
 */
#include "router.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "router_int.h"

#define ROUTER_TICK_MS 20
#define ROUTER_MAX_BURST 4096 /* messages handled per socket per wakeup */

void router_config_init(router_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "tcp://127.0.0.1:5555";
    cfg->control = "tcp://127.0.0.1:5556";
    cfg->policy = "least-loaded";
    cfg->heartbeat_ms = 250;
    cfg->heartbeat_miss = 4;
    cfg->max_queue = 1024;
    cfg->queue_timeout_ms = 30000;
    cfg->drain_timeout_ms = 30000;
    cfg->max_retries = 3;
    cfg->max_inflight = 0;
    cfg->kv_transport = "auto";
    cfg->aggregate = "fallback";
    cfg->metrics_port = -1;
    cfg->metrics_host = "127.0.0.1";
    cfg->stall_ms = 10000;
    cfg->tokenize_max_bytes = 16384;
    cfg->phase_ms = 10000;
}

bt_status_t router_create(const router_config_t *cfg, router_t **router_p)
{
    bt_zmq_socket_config_t scfg;
    char secret[BT_CURVE_Z85_LEN + 1] = "";
    router_t *r;
    bt_status_t status;
    int handover = 1;

    r = bt_calloc(1, sizeof(*r), "router");
    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->cfg = *cfg;
    router__metrics_init(&r->metrics);
    r->policy = router__policy_find(cfg->policy);
    if (r->policy == NULL) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown policy %s",
                          cfg->policy);
        goto err_free;
    }
    router_kv_weights_init(&r->kv_weights);
    if (cfg->kv_weights != NULL &&
        router_kv_weights_parse(cfg->kv_weights, &r->kv_weights) != BT_OK) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "bad --kv-weights "
                          "'%s' (overlap=X,load=Y, not negative)",
                          cfg->kv_weights);
        goto err_free;
    }
    if (cfg->tokenizer != NULL) {
        status = tok_load(cfg->tokenizer, 0, &r->tok);
        if (status != BT_OK)
            goto err_free;
        r->tok_id = tok_identity(r->tok);
        BT_LOG_INFO("ROUTER", "tokenizer %s (%s, identity %016llx): text "
                    "prompts are tokenized here for workers of the same "
                    "identity", cfg->tokenizer, tok_kind_name(r->tok),
                    (unsigned long long)r->tok_id);
    }
    {
        router_kvindex_config_t kc;

        router_kvindex_config_init(&kc);
        kc.max_workers = ROUTER_MAX_WORKERS;
        status = router_kvindex_create(&kc, &r->kvindex);
        if (status != BT_OK)
            goto err_free;
    }
    if (!router__kv_mode_parse(cfg->kv_transport, &r->kv_mode)) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown KV "
                          "transport %s (auto, ucx, cuda-ipc, ucx-stage, "
                          "inline)",
                          cfg->kv_transport ? cfg->kv_transport : "(null)");
        goto err_free;
    }
    if (cfg->aggregate == NULL || strcmp(cfg->aggregate, "fallback") == 0) {
        r->aggregate = 1;
    } else if (strcmp(cfg->aggregate, "always") == 0) {
        r->aggregate = 2;
    } else if (strcmp(cfg->aggregate, "never") == 0) {
        r->aggregate = 0;
    } else if (strcmp(cfg->aggregate, "ttft") == 0) {
        r->aggregate = 3;
    } else {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "unknown aggregate "
                          "mode %s (fallback, ttft, always, never)", cfg->aggregate);
        goto err_free;
    }
    if (cfg->max_queue <= 0 || cfg->heartbeat_ms <= 0 ||
        cfg->heartbeat_miss <= 0 || cfg->stall_ms <= 0 ||
        cfg->phase_ms <= 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                          "max_queue, heartbeat_ms, heartbeat_miss, "
                          "stall_ms and phase_ms must be positive");
        goto err_free;
    }
    if (cfg->tokenize_max_bytes < 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                          "--tokenize-max-bytes must not be negative");
        goto err_free;
    }
    /* Request ids carry 23 random bits of this instance above a 40-bit
     * counter: ids never repeat across router restarts, so a worker's
     * message about a request of an earlier router can match nothing. */
    r->instance = bt_random_u64();
    r->next_req_id = ((r->instance >> 41) & 0x7fffffull) << 40;
    r->ctx = zmq_ctx_new();
    if (r->ctx == NULL) {
        status = BT_ZMQ_ERROR("zmq_ctx_new");
        goto err_free;
    }
    /* CURVE encrypts in libzmq's I/O threads, not in the router's loop:
     * with it, two of them (set before the first socket; each connection
     * stays on one), so the crypto of the workers' and clients'
     * connections is not serialised on one core.  docs/SECURITY.md has
     * the measurements (four measured the same as two). */
    if (cfg->curve_secret_key != NULL && cfg->curve_secret_key[0])
        zmq_ctx_set(r->ctx, ZMQ_IO_THREADS, 2);
    /* The ZAP handler exists before anything binds (fail closed). */
    status = router__zap_create(r, secret);
    if (status != BT_OK)
        goto err_ctx;
    bt_zmq_socket_config_init(&scfg);
    scfg.type = ZMQ_ROUTER;
    scfg.bind = true;
    scfg.endpoint = cfg->listen;
    scfg.max_msg = PROTO_CLIENT_MAX_BYTES;
    scfg.curve_secret = r->curve ? secret : NULL;
    scfg.zap_domain = BT_CURVE_DOMAIN_CLIENT;
    status = bt_zmq_socket_create(r->ctx, &scfg, &r->client_sock);
    if (status != BT_OK)
        goto err_zap;
    scfg.endpoint = cfg->control;
    scfg.max_msg = PROTO_CONTROL_MAX_BYTES;
    scfg.zap_domain = BT_CURVE_DOMAIN_CONTROL;
    status = bt_zmq_socket_create(r->ctx, &scfg, &r->control_sock);
    memset(secret, 0, sizeof(secret));
    if (status != BT_OK)
        goto err_client;
    /* A worker's routing id is its name plus a random per-process suffix
     * (workerproc_connect), so only the same process can reconnect with
     * it: handover lets that process's new connection replace a
     * half-open old one.  Another process with the same name gets its
     * own route and is refused at Register while the name is live.
     * With CURVE the suffix is not trusted to stay secret: handover is
     * off, so no connection (whatever key it has) can take over the
     * route of a live one and receive its messages; a duplicate id is
     * ignored until the old connection is gone, which ZMTP heartbeats
     * find out within a few seconds. */
    if (r->curve) {
        int ivl = 1000, timeout = 3000;
        handover = 0;
        zmq_setsockopt(r->control_sock, ZMQ_HEARTBEAT_IVL, &ivl,
                       sizeof(ivl));
        zmq_setsockopt(r->control_sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout,
                       sizeof(timeout));
    }
    zmq_setsockopt(r->control_sock, ZMQ_ROUTER_HANDOVER, &handover,
                   sizeof(handover));
    if (cfg->metrics_port >= 0) {
        status = router__http_create(cfg->metrics_host, cfg->metrics_port,
                                     &r->http);
        if (status != BT_OK)
            goto err_control;
    }
    *router_p = r;
    return BT_OK;

err_control:
    bt_zmq_socket_destroy(&r->control_sock);
err_client:
    bt_zmq_socket_destroy(&r->client_sock);
err_zap:
    router__zap_destroy(r);
err_ctx:
    zmq_ctx_term(r->ctx);
err_free:
    router_kvindex_destroy(&r->kvindex);
    tok_destroy(&r->tok);
    bt_free(r);
    return status;
}

void router_destroy(router_t **router_p)
{
    router_t *r = *router_p;

    if (r == NULL)
        return;
    while (r->all_head != NULL)
        router__req_destroy(r, r->all_head);
    router__control_flush(r);
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        router__worker_clear(&r->workers[i]);
    bt_free(r->queue);
    router__client_outbox_cleanup(r);
    router__http_destroy(&r->http);
    bt_zmq_socket_destroy(&r->client_sock);
    bt_zmq_socket_destroy(&r->control_sock);
    router__zap_destroy(r);
    zmq_ctx_term(r->ctx);
    router_kvindex_destroy(&r->kvindex);
    tok_destroy(&r->tok);
    bt_free(r);
    *router_p = NULL;
}

void router_stop(router_t *router)
{
    router->stop = 1;
}

int router_client_port(const router_t *router)
{
    return bt_zmq_bound_port(router->client_sock);
}

int router_control_port(const router_t *router)
{
    return bt_zmq_bound_port(router->control_sock);
}

int router_metrics_port(const router_t *router)
{
    return router->http != NULL ? router__http_port(router->http) : -1;
}

bt_status_t router_run(router_t *r)
{
    /* The two ZeroMQ sockets, the ZAP handler (with CURVE), then the
     * metrics listener's fds. */
    zmq_pollitem_t items[3 + 1 + ROUTER_HTTP_MAX_CONNS] = {
        { r->client_sock, 0, ZMQ_POLLIN, 0 },
        { r->control_sock, 0, ZMQ_POLLIN, 0 },
        { r->zap_sock, 0, ZMQ_POLLIN, 0 },
    };
    const int n_zmq = r->zap_sock != NULL ? 3 : 2;
    uint64_t last_tick = 0;

    BT_LOG_INFO("ROUTER", "serving clients on %s (port %d), workers on %s "
                "(port %d), policy %s, instance %016llx, %s", r->cfg.listen,
                router_client_port(r), r->cfg.control, router_control_port(r),
                r->policy->name, (unsigned long long)r->instance,
                r->curve ? "CURVE" : r->cfg.insecure
                                         ? "INSECURE (no CURVE, --insecure)"
                                         : "no CURVE (loopback only)");
    if (r->http != NULL)
        BT_LOG_INFO("ROUTER", "metrics on http://%s:%d/metrics",
                    r->cfg.metrics_host, router_metrics_port(r));
    for (;;) {
        uint64_t now;
        int rc, n_http = 0;

        if (r->stop && !r->draining) {
            r->draining = true;
            r->drain_deadline_ns = bt_time_ns() +
                                   (uint64_t)r->cfg.drain_timeout_ms * 1000000ull;
            BT_LOG_INFO("ROUTER", "draining: %d requests in flight",
                        r->n_live);
        }
        if (r->draining) {
            if (r->n_live == 0)
                break;
            if (bt_time_ns() > r->drain_deadline_ns) {
                while (r->all_head != NULL)
                    router__req_fail(
                        r, r->all_head, BATON__ERROR_CODE__ERROR_DRAINING,
                        "router shut down before the request finished");
                break;
            }
        }
        if (r->http != NULL)
            n_http = router__http_poll_items(r->http, items + n_zmq);
        rc = zmq_poll(items, n_zmq + n_http, ROUTER_TICK_MS);
        if (rc < 0 && zmq_errno() != EINTR)
            return BT_ZMQ_ERROR("zmq_poll");
        if (n_zmq == 3 && rc > 0 && (items[2].revents & ZMQ_POLLIN))
            router__zap_process(r);
        for (int s = 0; s < 2 && rc > 0; s++) {
            if (!(items[s].revents & ZMQ_POLLIN))
                continue;
            for (int k = 0; k < ROUTER_MAX_BURST; k++) {
                bt_zmq_msg_t zm;
                if (bt_zmq_recv(items[s].socket, ZMQ_DONTWAIT, &zm) != BT_OK)
                    break;
                if (s == 0)
                    router__handle_client(r, &zm);
                else
                    router__handle_control(r, &zm);
                bt_zmq_msg_close(&zm);
            }
        }
        now = bt_time_ns();
        if (r->http != NULL)
            router__http_process(r->http, r, items + n_zmq,
                                 rc > 0 ? n_http : 0, now);
        if (now - last_tick >= ROUTER_TICK_MS * 1000000ull) {
            last_tick = now;
            router__check_liveness(r, now);
            router__check_deadlines(r, now);
        }
        router__dispatch(r);
        router__control_flush(r); /* one message per worker and turn */
        router__client_flush(r); /* this turn's replies, one per client */
    }
    router__control_flush(r);
    router__client_flush(r); /* the drain's last errors */
    BT_LOG_INFO("ROUTER", "stopped: %llu completed, %llu failed",
                (unsigned long long)r->completed,
                (unsigned long long)r->failed);
    return BT_OK;
}
