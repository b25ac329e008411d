/*
 * router_metrics.c - what the router counts and its Prometheus text
 * exposition (format 0.0.4), served by router_http.c on GET /metrics.
 *
 * Counters (since start):
 *   baton_router_requests_total{outcome}   every request that got its
 *       final answer: stop, length, cancelled (Finished) or an error
 *       name (overloaded, invalid, timeout, no_workers, worker_failed, ...)
 *   baton_router_admitted_total            requests taken into the queue
 *   baton_router_rejected_total{reason}    refused at admission (error name)
 *   baton_router_retries_total             re-queues after worker failures
 *   baton_router_preemptions_total         re-queues of requests decode
 *                                          workers gave back (KV short past
 *                                          their promise)
 *   baton_router_kv_refusals_total         reservations decode workers
 *                                          refused (pool or hand-off
 *                                          windows full): asked again
 *   baton_router_prompt_tokens_total       prompt tokens of finished requests
 *   baton_router_generated_tokens_total    tokens streamed to clients
 *   baton_router_kv_handoffs_total{transport}  KvReady sent, by transport
 *   baton_router_worker_drops_total        workers dropped (dead, left)
 *   baton_router_curve, _insecure          CURVE on / --insecure (gauges)
 *   baton_router_auth_denied_total{socket} CURVE handshakes refused
 *   baton_router_foreign_messages_total    worker messages from another key
 *   baton_router_stale_messages_total      worker messages of a given-up
 *                                          attempt or registration, dropped
 * Gauges (now): baton_router_queue_depth, baton_router_queue_limit,
 *   baton_router_in_flight, baton_router_draining, baton_router_workers;
 *   per worker {worker, role}: baton_router_worker_up (heard from within
 *   3 heartbeats), _last_seen_seconds, _draining, _assigned_requests,
 *   _outstanding_tokens, _free_kv_blocks, _total_kv_blocks,
 *   _kv_capacity_tokens, _kv_index_blocks (its prefix cache as the
 *   router's index knows it), _info (1, with labels precision and
 *   kv_dtype), and the counter baton_router_worker_served_total.
 * Histograms (seconds): baton_router_ttft_seconds (arrival -> first
 *   token sent), baton_router_tpot_seconds (per request, between its
 *   first and last token), baton_router_queue_wait_seconds (arrival ->
 *   first KV grant).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "router_int.h"

/* Bucket upper bounds in seconds (as baton-http's). */
static const double ttft_bounds[] = BT_PROM_TTFT_BOUNDS;
static const double tpot_bounds[] = BT_PROM_TPOT_BOUNDS;
static const double queue_bounds[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                       0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                       5, 10, 30 };

/* ErrorCode names (client_error_name's), FinishReason names. */
static const char *const error_names[] = {
    "none", "invalid", "overloaded", "version", "malformed", "no_workers",
    "timeout", "internal", "worker_failed", "too_long", "draining",
    "duplicate",
};
static const char *const finish_names[] = { "none", "stop", "length",
                                            "cancelled" };

_Static_assert(BT_ARRAY_SIZE(error_names) <= ROUTER_METRICS_CODES,
               "every error code has a counter");
_Static_assert(BT_ARRAY_SIZE(finish_names) <= ROUTER_METRICS_FINISH,
               "every finish reason has a counter");

// ---------------------------------------------------------------------------
// Histograms

void router__metrics_init(router_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
    bt_prom_hist_init(&m->ttft, ttft_bounds, (int)BT_ARRAY_SIZE(ttft_bounds));
    bt_prom_hist_init(&m->tpot, tpot_bounds, (int)BT_ARRAY_SIZE(tpot_bounds));
    bt_prom_hist_init(&m->queue_wait, queue_bounds,
                      (int)BT_ARRAY_SIZE(queue_bounds));
}

// ---------------------------------------------------------------------------
// Rendering

/* Appends to `out` while status is BT_OK (the first error sticks). */
#define P(...)                                                              \
    do {                                                                    \
        if (status == BT_OK)                                                \
            status = bt_buf_printf(out, __VA_ARGS__);                  \
    } while (0)

/* bt_prom_write_fn into a bt_buf_t. */
static bt_status_t prom_write(void *out, const char *text, size_t len)
{
    return bt_buf_printf(out, "%.*s", (int)len, text);
}

static bt_status_t render_hist(const bt_prom_hist_t *h, const char *name,
                               const char *help, bt_buf_t *out)
{
    return bt_prom_hist_render(h, name, help, prom_write, out);
}

/* The per-worker families: which field each one shows. */
typedef enum {
    WF_UP = 0,
    WF_LAST_SEEN,
    WF_DRAINING,
    WF_ASSIGNED,
    WF_OUTSTANDING,
    WF_FREE_KV,
    WF_TOTAL_KV,
    WF_KV_TOKENS,
    WF_SERVED,
    WF_KV_INDEX,
    WF_INFO,
    WF_COUNT
} worker_field_t;

static const struct {
    const char *name;
    const char *type;
    const char *help;
} worker_families[WF_COUNT] = {
    { "baton_router_worker_up", "gauge",
      "1 when the worker was heard from within 3 heartbeat intervals" },
    { "baton_router_worker_last_seen_seconds", "gauge",
      "Seconds since the worker's last message" },
    { "baton_router_worker_draining", "gauge",
      "1 when the worker takes no new work" },
    { "baton_router_worker_assigned_requests", "gauge",
      "Requests assigned to the worker now" },
    { "baton_router_worker_outstanding_tokens", "gauge",
      "Prompt tokens assigned to the worker and not done" },
    { "baton_router_worker_free_kv_blocks", "gauge",
      "Free KV blocks of a decode worker (last heartbeat)" },
    { "baton_router_worker_total_kv_blocks", "gauge",
      "KV blocks of a decode worker" },
    { "baton_router_worker_kv_capacity_tokens", "gauge",
      "KV capacity of a decode worker in tokens (blocks x block size)" },
    { "baton_router_worker_served_total", "counter",
      "Requests assigned to the worker since it registered" },
    { "baton_router_worker_kv_index_blocks", "gauge",
      "KV blocks the router's prefix index says the worker caches "
      "(its KvEvents; issue 38)" },
    { "baton_router_worker_info", "gauge",
      "1 per worker, labelled with its precision class and KV dtype "
      "(issue 37; \"\" for none)" },
};

static bt_status_t render_workers(router_t *r, uint64_t now,
                                  bt_buf_t *out)
{
    bt_status_t status = BT_OK;

    for (int f = 0; f < WF_COUNT; f++) {
        if (status == BT_OK)
            status = bt_prom_header(worker_families[f].name,
                                    worker_families[f].type,
                                    worker_families[f].help, prom_write, out);
        for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
            const router_worker_t *w = &r->workers[i];
            char name[2 * ROUTER_NAME_MAX + 1];
            const char *role;

            if (!w->used)
                continue;
            bt_prom_label_escape(w->name, name, sizeof(name));
            role = w->role == BATON__ROLE__ROLE_PREFILL ? "prefill"
                   : w->can_prefill                    ? "decode+prefill"
                                                       : "decode";
            P("%s{worker=\"%s\",role=\"%s\"", worker_families[f].name,
              name, role);
            if (f == WF_INFO) {
                char kv[2 * ROUTER_KV_DTYPE_MAX + 1];
                bt_prom_label_escape(w->kv_dtype, kv, sizeof(kv));
                P(",precision=\"%s\",kv_dtype=\"%s\"", w->precision, kv);
            }
            P("} ");
            switch ((worker_field_t)f) {
            case WF_UP: P("%d\n", !w->silent); break;
            case WF_LAST_SEEN:
                P("%.3f\n", now > w->last_seen_ns
                                ? (double)(now - w->last_seen_ns) * 1e-9
                                : 0.0);
                break;
            case WF_DRAINING: P("%d\n", w->draining); break;
            case WF_ASSIGNED: P("%u\n", w->assigned); break;
            case WF_OUTSTANDING:
                P("%llu\n", (unsigned long long)w->outstanding);
                break;
            case WF_FREE_KV: P("%u\n", w->hb_free_kv); break;
            case WF_TOTAL_KV: P("%u\n", w->total_kv); break;
            case WF_KV_TOKENS:
                P("%llu\n", (unsigned long long)w->total_kv *
                                 (w->role == BATON__ROLE__ROLE_DECODE
                                      ? w->block_size : 0));
                break;
            case WF_KV_INDEX:
                P("%d\n", router_kvindex_blocks(r->kvindex, i));
                break;
            case WF_INFO: P("1\n"); break;
            default: P("%llu\n", (unsigned long long)w->served); break;
            }
        }
    }
    return status;
}

bt_status_t router__metrics_render(router_t *r, uint64_t now,
                                   bt_buf_t *out)
{
    const router_metrics_t *m = &r->metrics;
    bt_status_t status = BT_OK;
    int n_workers = 0;

    P("# HELP baton_router_requests_total Requests answered, by outcome "
      "(finish reason or error)\n"
      "# TYPE baton_router_requests_total counter\n");
    for (size_t i = 1; i < BT_ARRAY_SIZE(finish_names); i++)
        P("baton_router_requests_total{outcome=\"%s\"} %llu\n",
          finish_names[i], (unsigned long long)m->finished[i]);
    for (size_t i = 1; i < BT_ARRAY_SIZE(error_names); i++)
        P("baton_router_requests_total{outcome=\"%s\"} %llu\n",
          error_names[i],
          (unsigned long long)(m->failed[i] + m->rejected[i]));
    P("# HELP baton_router_admitted_total Requests taken into the "
      "admission queue\n# TYPE baton_router_admitted_total counter\n"
      "baton_router_admitted_total %llu\n",
      (unsigned long long)m->admitted);
    P("# HELP baton_router_rejected_total Requests refused at admission, "
      "by reason\n# TYPE baton_router_rejected_total counter\n");
    for (size_t i = 1; i < BT_ARRAY_SIZE(error_names); i++)
        P("baton_router_rejected_total{reason=\"%s\"} %llu\n",
          error_names[i], (unsigned long long)m->rejected[i]);
    P("# HELP baton_router_prompt_tokens_total Prompt tokens of the "
      "requests that finished\n# TYPE baton_router_prompt_tokens_total "
      "counter\nbaton_router_prompt_tokens_total %llu\n",
      (unsigned long long)m->prompt_tokens);
    P("# HELP baton_router_generated_tokens_total Generated tokens streamed "
      "to clients\n# TYPE baton_router_generated_tokens_total counter\n"
      "baton_router_generated_tokens_total %llu\n",
      (unsigned long long)m->generated_tokens);
    P("# HELP baton_router_retries_total Requests re-queued after a "
      "worker failure\n# TYPE baton_router_retries_total counter\n"
      "baton_router_retries_total %llu\n",
      (unsigned long long)m->retries);
    P("# HELP baton_router_preemptions_total Requests re-queued because a "
      "decode worker gave them back (its KV ran short past their "
      "promise)\n"
      "# TYPE baton_router_preemptions_total counter\n"
      "baton_router_preemptions_total %llu\n",
      (unsigned long long)m->preemptions);
    P("# HELP baton_router_kv_refusals_total KV reservations decode "
      "workers refused (pool or hand-off windows full); the request "
      "asked again\n"
      "# TYPE baton_router_kv_refusals_total counter\n"
      "baton_router_kv_refusals_total %llu\n",
      (unsigned long long)m->kv_refusals);
    P("# HELP baton_router_kv_handoffs_total KV hand-offs to decode "
      "workers, by transport\n"
      "# TYPE baton_router_kv_handoffs_total counter\n");
    for (int t = 0; t < ROUTER_METRICS_TRANSPORTS; t++) {
        const char *name = router__transport_name((Baton__KvTransport)t);
        if (strcmp(name, "unknown") != 0)
            P("baton_router_kv_handoffs_total{transport=\"%s\"} %llu\n",
              name, (unsigned long long)m->handoffs[t]);
    }
    P("# HELP baton_router_worker_drops_total Workers dropped (dead, "
      "silent or left)\n# TYPE baton_router_worker_drops_total counter\n"
      "baton_router_worker_drops_total %llu\n",
      (unsigned long long)m->worker_drops);
    P("# HELP baton_router_stale_messages_total Worker messages about an "
      "attempt or registration the router gave up, dropped (never "
      "relayed)\n# TYPE baton_router_stale_messages_total counter\n"
      "baton_router_stale_messages_total %llu\n",
      (unsigned long long)r->stale_msgs);
    P("# HELP baton_router_curve 1 when the sockets use CURVE, 0 without "
      "(loopback or --insecure)\n# TYPE baton_router_curve gauge\n"
      "baton_router_curve %d\n"
      "# HELP baton_router_insecure 1 when started with --insecure\n"
      "# TYPE baton_router_insecure gauge\nbaton_router_insecure %d\n"
      "# HELP baton_router_auth_denied_total CURVE handshakes refused (key "
      "not in the allow list), by socket\n"
      "# TYPE baton_router_auth_denied_total counter\n"
      "baton_router_auth_denied_total{socket=\"client\"} %llu\n"
      "baton_router_auth_denied_total{socket=\"control\"} %llu\n"
      "# HELP baton_router_foreign_messages_total Worker messages from a "
      "CURVE key that is not their registration's, dropped\n"
      "# TYPE baton_router_foreign_messages_total counter\n"
      "baton_router_foreign_messages_total %llu\n",
      r->curve ? 1 : 0, r->cfg.insecure && !r->curve ? 1 : 0,
      (unsigned long long)r->zap_denied[0],
      (unsigned long long)r->zap_denied[1],
      (unsigned long long)r->foreign_msgs);
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        n_workers += r->workers[i].used;
    P("# HELP baton_router_queue_depth Requests waiting for workers\n"
      "# TYPE baton_router_queue_depth gauge\n"
      "baton_router_queue_depth %d\n"
      "# HELP baton_router_queue_limit Admission bound (--max-queue)\n"
      "# TYPE baton_router_queue_limit gauge\n"
      "baton_router_queue_limit %d\n"
      "# HELP baton_router_in_flight Requests past the queue\n"
      "# TYPE baton_router_in_flight gauge\n"
      "baton_router_in_flight %d\n"
      "# HELP baton_router_draining 1 while the router drains\n"
      "# TYPE baton_router_draining gauge\n"
      "baton_router_draining %d\n"
      "# HELP baton_router_workers Registered workers\n"
      "# TYPE baton_router_workers gauge\n"
      "baton_router_workers %d\n",
      r->n_queued, r->cfg.max_queue, r->n_live - r->n_queued,
      r->draining ? 1 : 0, n_workers);
    if (status == BT_OK)
        status = render_workers(r, now, out);
    if (status == BT_OK)
        status = render_hist(&m->ttft, "baton_router_ttft_seconds",
                             "Arrival to the first token sent", out);
    if (status == BT_OK)
        status = render_hist(&m->tpot, "baton_router_tpot_seconds",
                             "Time per output token after the first, per "
                             "request", out);
    if (status == BT_OK)
        status = render_hist(&m->queue_wait,
                             "baton_router_queue_wait_seconds",
                             "Arrival to the first KV grant", out);
    return status;
}
