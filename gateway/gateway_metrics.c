/*
 * gateway_metrics.c - baton-http's counters and latency histograms, and
 * their Prometheus text exposition (format 0.0.4), together with the
 * router's and each worker's state from the latest ClusterStatus.
 *
 * One owner per metric name (issue 40): every name here starts with
 * baton_http_.  The router's view as baton-http last saw it is
 * baton_http_router_* / baton_http_worker_*, never the router's own
 * baton_router_* names (with other labels, a sum() over both
 * double-counted) nor the workers' baton_worker_*.  docs/OPERATIONS.md
 * lists them all.
 */
#include <stdio.h>
#include <string.h>

#include "bt_util.h"
#include "gateway_int.h"

/* Bucket upper bounds in seconds. */
static const double ttft_bounds[] = BT_PROM_TTFT_BOUNDS;
static const double tpot_bounds[] = BT_PROM_TPOT_BOUNDS;
static const double e2e_bounds[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5, 1, 2.5, 5, 10, 30, 60, 120, 300 };

static const char *const endpoint_names[GATEWAY_EP_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
    "/metrics", "/livez", "other",
};

const char *gateway__metrics_endpoint_name(gateway_endpoint_t ep)
{
    return ep >= 0 && ep < GATEWAY_EP_COUNT ? endpoint_names[ep] : "other";
}

void gateway__metrics_init(gateway_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
    bt_prom_hist_init(&m->ttft, ttft_bounds, (int)BT_ARRAY_SIZE(ttft_bounds));
    bt_prom_hist_init(&m->tpot, tpot_bounds, (int)BT_ARRAY_SIZE(tpot_bounds));
    bt_prom_hist_init(&m->e2e, e2e_bounds, (int)BT_ARRAY_SIZE(e2e_bounds));
}

void gateway__metrics_request(gateway_metrics_t *m, gateway_endpoint_t ep,
                              int status)
{
    int k;

    for (k = 0; k < m->n_codes; k++)
        if (m->codes[k] == status)
            break;
    if (k == m->n_codes) {
        if (m->n_codes == GATEWAY_METRICS_MAX_CODES)
            return; /* cannot happen: the gateway sends < 24 statuses */
        m->codes[m->n_codes++] = status;
    }
    m->requests[ep][k]++;
}

/* bt_prom_write_fn into a bt_buf_t. */
static bt_status_t prom_write(void *out, const char *text, size_t len)
{
    return bt_buf_append(out, text, len);
}

static bt_status_t render_hist(const bt_prom_hist_t *h, const char *name,
                               const char *help, bt_buf_t *out)
{
    return bt_prom_hist_render(h, name, help, prom_write, out);
}

static const char *role_name(uint32_t role)
{
    return role == 1 ? "prefill" : role == 2 ? "decode" : "other";
}

/* One gauge family over the workers; `field` picks the value. */
static bt_status_t render_workers(const Baton__ClusterStatus *cs,
                                  const char *name, const char *type,
                                  const char *help, int field,
                                  bt_buf_t *out)
{
    bt_status_t status;

    status = bt_prom_header(name, type, help, prom_write, out);
    for (size_t i = 0; status == BT_OK && i < cs->n_workers; i++) {
        const Baton__WorkerStatus *w = cs->workers[i];
        char wname[160];
        unsigned long long v;

        bt_prom_label_escape(w->name, wname, sizeof(wname));
        switch (field) {
        case 0: v = w->free_kv_blocks; break;
        case 1: v = w->total_kv_blocks; break;
        case 2: v = w->running; break;
        case 3: v = w->outstanding_tokens; break;
        case 4: v = w->draining; break;
        default: v = w->served; break;
        }
        status = bt_buf_printf(out, "%s{worker=\"%s\",role=\"%s\"} %llu\n",
                                     name, wname, role_name(w->role), v);
    }
    return status;
}

#define P(...)                                                              \
    do {                                                                    \
        if (status == BT_OK)                                                \
            status = bt_buf_printf(out, __VA_ARGS__);                 \
    } while (0)

bt_status_t gateway__metrics_render(const gateway_metrics_t *m,
                                    const Baton__ClusterStatus *cluster,
                                    bt_buf_t *out)
{
    bt_status_t status = BT_OK;
    int n_prefill = 0, n_decode = 0;

    P("# HELP baton_http_requests_total HTTP requests answered, by endpoint "
      "and status code.\n# TYPE baton_http_requests_total counter\n");
    for (int e = 0; e < GATEWAY_EP_COUNT; e++)
        for (int k = 0; k < m->n_codes; k++)
            if (m->requests[e][k] > 0)
                P("baton_http_requests_total{endpoint=\"%s\",code=\"%d\"} "
                  "%llu\n", endpoint_names[e], m->codes[k],
                  (unsigned long long)m->requests[e][k]);
    {
        /* The plain counters, one sample each. */
        const struct {
            const char *name;
            const char *help;
            uint64_t value;
        } counters[] = {
            { "baton_http_prompt_tokens_total",
              "Prompt tokens of finished requests.", m->prompt_tokens },
            { "baton_http_completion_tokens_total", "Generated tokens.",
              m->completion_tokens },
            { "baton_http_requests_cancelled_total",
              "Requests cancelled at the router because the client went "
              "away.", m->cancelled },
            { "baton_http_connections_rejected_total",
              "Connections refused over --max-connections or "
              "--max-conns-per-client.", m->rejected_conns },
            { "baton_http_connections_evicted_total",
              "Idle connections or unfinished requests closed to make room "
              "for a new connection.", m->evicted_conns },
            { "baton_http_prompts_too_long_total",
              "Prompts refused here as longer than the cluster's context, "
              "before any worker saw them.", m->edge_too_long },
            { "baton_http_router_lost_total",
              "Times the router connection was lost (requests in flight "
              "failed with 502 router_lost).", m->router_lost },
            { "baton_http_unauthorized_total",
              "Requests refused with 401: no or a wrong API key.",
              m->unauthorized },
            { "baton_http_tenant_limited_total",
              "Requests refused with 429 over a tenant's concurrency or "
              "token-rate limit.", m->tenant_limited },
        };
        for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
            P("# HELP %s %s\n# TYPE %s counter\n%s %llu\n",
              counters[i].name, counters[i].help, counters[i].name,
              counters[i].name, (unsigned long long)counters[i].value);
    }
    P("# HELP baton_http_requests_in_flight Generation requests waiting on "
      "the router.\n# TYPE baton_http_requests_in_flight gauge\n"
      "baton_http_requests_in_flight %d\n", m->in_flight);
    P("# HELP baton_http_open_connections Open client connections.\n"
      "# TYPE baton_http_open_connections gauge\n"
      "baton_http_open_connections %d\n", m->connections);
    if (status == BT_OK)
        status = render_hist(&m->ttft,
                             "baton_http_time_to_first_token_seconds",
                             "Request parsed to first token received.", out);
    if (status == BT_OK)
        status = render_hist(&m->tpot,
                             "baton_http_time_per_output_token_seconds",
                             "Mean time between tokens after the first.",
                             out);
    if (status == BT_OK)
        status = render_hist(&m->e2e, "baton_http_e2e_request_latency_seconds",
                             "Request parsed to last byte queued.", out);

    P("# HELP baton_http_router_up Whether the router answered the status "
      "request.\n# TYPE baton_http_router_up gauge\nbaton_http_router_up %d\n",
      cluster != NULL);
    if (cluster == NULL || status != BT_OK)
        return status;
    for (size_t i = 0; i < cluster->n_workers; i++) {
        n_prefill += cluster->workers[i]->role == 1;
        n_decode += cluster->workers[i]->role == 2;
    }
    P("# HELP baton_http_router_workers Registered workers by role.\n"
      "# TYPE baton_http_router_workers gauge\n"
      "baton_http_router_workers{role=\"prefill\"} %d\n"
      "baton_http_router_workers{role=\"decode\"} %d\n", n_prefill, n_decode);
    P("# HELP baton_http_router_queued Requests waiting for KV or workers.\n"
      "# TYPE baton_http_router_queued gauge\nbaton_http_router_queued %u\n",
      cluster->queued);
    P("# HELP baton_http_router_in_flight Requests past the queue.\n"
      "# TYPE baton_http_router_in_flight gauge\nbaton_http_router_in_flight %u\n",
      cluster->in_flight);
    P("# HELP baton_http_router_completed_total Requests the router finished.\n"
      "# TYPE baton_http_router_completed_total counter\n"
      "baton_http_router_completed_total %llu\n",
      (unsigned long long)cluster->completed);
    P("# HELP baton_http_router_failed_total Requests the router failed.\n"
      "# TYPE baton_http_router_failed_total counter\n"
      "baton_http_router_failed_total %llu\n",
      (unsigned long long)cluster->failed);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_free_kv_blocks",
                                "gauge", "Free KV blocks.", 0, out);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_kv_blocks", "gauge",
                                "KV pool size in blocks.", 1, out);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_running", "gauge",
                                "Requests on the worker.", 2, out);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_outstanding_tokens",
                                "gauge", "Tokens the worker still owes.", 3,
                                out);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_draining", "gauge",
                                "1 while the worker drains.", 4, out);
    if (status == BT_OK)
        status = render_workers(cluster, "baton_http_worker_served_total",
                                "counter", "Requests assigned so far.", 5,
                                out);
    return status;
}
