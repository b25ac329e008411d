/*
 * workerproc_metrics.c - a worker's /metrics and /health, served by a
 * thread of their own from a snapshot the main loop publishes (see
 * workerproc_metrics.h).  Every metric name here starts with
 * baton_worker_ and is exported by the workers only (docs/OPERATIONS.md).
 */
#include "workerproc_metrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_http.h"
#include "bt_log.h"
#include "bt_prom.h"
#include "bt_util.h"

#define METRICS_POLL_MS 100         /* the thread checks for quit */
#define METRICS_STALL_MS_DEFAULT 10000

/* Bucket upper bounds: sequences per step, seconds per step, seconds
 * per KV hand-off. */
static const double batch_bounds[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256,
                                       512 };
static const double step_bounds[] = { 0.001, 0.0025, 0.005, 0.01, 0.025,
                                      0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };
/* serial host seconds per decode step: 10 us .. 100 ms */
static const double host_bounds[] = { 0.00001, 0.000025, 0.00005, 0.0001,
                                      0.00025, 0.0005, 0.001, 0.0025,
                                      0.005, 0.01, 0.025, 0.05, 0.1 };
static const double handoff_bounds[] = { 0.0005, 0.001, 0.0025, 0.005,
                                         0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                         1, 2.5, 5 };

static const char *const metrics_paths[] = { "/metrics", "/health" };

/* What a scrape shows: copied whole under the lock, rendered without. */
typedef struct {
    uint64_t steps;             /* engine steps */
    uint64_t prefill_tokens;    /* prompt tokens prefilled */
    uint64_t generated_tokens;  /* tokens generated */
    uint64_t handoffs;          /* KV hand-offs sent */
    uint64_t handoff_bytes;     /* their KV bytes */
    uint64_t kv_cap_rejected;   /* KV commits dropped: wrong capability */
    uint64_t kv_grants_waited;  /* grants refused: receive room full */
    uint64_t kv_windows;        /* receive windows mapped for grants */
    uint64_t kv_windows_revoked;/* receive windows unmapped with a writer */
    uint64_t kv_writes_refused; /* KV messages refused (stale, forged) */
    uint64_t kv_blocks_sent;    /* hand-off blocks put to decode workers */
    uint64_t kv_blocks_received;/* hand-off blocks that arrived here */
    uint64_t kv_blocks_held;    /* hand-off blocks not moved: the decode
                                   worker's prefix cache held them */
    bt_prom_hist_t batch;       /* sequences per step */
    bt_prom_hist_t step;        /* seconds per step */
    bt_prom_hist_t handoff;     /* seconds per hand-off */
    bt_prom_hist_t host;        /* serial host seconds per decode step */
    workerproc_step_split_t phases; /* decode steps' seconds by phase,
                                   summed */
} metrics_state_t;

/* The phases of workerproc_step_split_t, by label. */
typedef struct {
    const char *label;
    size_t offset; /* of the double in workerproc_step_split_t */
} phase_t;

static const phase_t phases[] = {
    { "build", offsetof(workerproc_step_split_t, build) },
    { "enqueue", offsetof(workerproc_step_split_t, enqueue) },
    { "emit", offsetof(workerproc_step_split_t, emit) },
    { "wait", offsetof(workerproc_step_split_t, wait) },
    { "post", offsetof(workerproc_step_split_t, post) },
};

static double *phase_of(workerproc_step_split_t *s, const phase_t *ph)
{
    return (double *)((uint8_t *)s + ph->offset);
}

static double phase_get(const workerproc_step_split_t *s, const phase_t *ph)
{
    return *(const double *)((const uint8_t *)s + ph->offset);
}

struct workerproc_metrics_s {
    char role[16];
    char router[256];
    char host[128];
    int stall_ms;                /* BATON_HEALTH_STALL_MS */
    bt_http_server_t *srv;       /* owned by the thread while it runs */
    pthread_t thread;
    atomic_bool quit;
    /* Guards everything below (main thread writes, the server's thread
     * reads). */
    pthread_mutex_t mu;
    workerproc_link_t *link;     /* NULL: not attached (yet, or any more) */
    bool detached;               /* attached once, then detached */
    char name[128];
    metrics_state_t st;
};

// ---------------------------------------------------------------------------
// Rendering (the server's thread)

static bt_status_t prom_write(void *out, const char *text, size_t len)
{
    return bt_buf_append(out, text, len);
}

/* Appends while status is BT_OK (the first error sticks). */
#define P(...)                                                              \
    do {                                                                    \
        if (status == BT_OK)                                                \
            status = bt_buf_printf(out, __VA_ARGS__);                       \
    } while (0)

/* One unlabelled sample with its family header. */
/* The prefix cache's counters (workerproc_prefix.h), one row each. */
typedef struct {
    const char *name;
    const char *help;
    size_t offset; /* of the uint64_t in workerproc_beat_t */
} prefix_counter_t;

static const prefix_counter_t prefix_counters[] = {
    { "baton_worker_prefix_lookups_total",
      "Prefix cache: prompts looked up",
      offsetof(workerproc_beat_t, prefix_lookups) },
    { "baton_worker_prefix_lookup_tokens_total",
      "Prefix cache: prompt tokens looked up",
      offsetof(workerproc_beat_t, prefix_lookup_tokens) },
    { "baton_worker_prefix_hit_tokens_total",
      "Prefix cache: prompt tokens found cached (not computed)",
      offsetof(workerproc_beat_t, prefix_hit_tokens) },
    { "baton_worker_prefix_lookup_blocks_total",
      "Prefix cache: full prompt blocks looked up",
      offsetof(workerproc_beat_t, prefix_lookup_blocks) },
    { "baton_worker_prefix_hit_blocks_total",
      "Prefix cache: full prompt blocks found cached",
      offsetof(workerproc_beat_t, prefix_hit_blocks) },
    { "baton_worker_prefix_inserted_blocks_total",
      "Prefix cache: blocks that entered the cache",
      offsetof(workerproc_beat_t, prefix_inserted) },
    { "baton_worker_prefix_evictions_total",
      "Prefix cache: blocks evicted to make room",
      offsetof(workerproc_beat_t, prefix_evictions) },
    { "baton_worker_prefix_host_saves_total",
      "Prefix cache: evicted blocks kept in the host tier (--kv-host-gb)",
      offsetof(workerproc_beat_t, prefix_host_saves) },
    { "baton_worker_prefix_host_loads_total",
      "Prefix cache: host-tier blocks loaded back into the pool on a hit",
      offsetof(workerproc_beat_t, prefix_host_loads) },
    { "baton_worker_prefix_host_evictions_total",
      "Prefix cache: host-tier blocks dropped for good",
      offsetof(workerproc_beat_t, prefix_host_evictions) },
};

#define FAMILY(name, type, help, fmt, value)                                \
    do {                                                                    \
        if (status == BT_OK)                                                \
            status = bt_prom_header(name, type, help, prom_write, out);     \
        P("%s " fmt "\n", name, value);                                     \
    } while (0)

static bt_status_t render(const metrics_state_t *st, const char *role,
                          const char *name,
                          const workerproc_link_health_t *h, bool have_h,
                          bt_buf_t *out)
{
    const workerproc_beat_t *b = &h->beat; /* the link's (zero: none) */
    bt_status_t status = BT_OK;
    char lname[2 * 128 + 1];
    uint32_t used = b->total_kv > b->free_kv ? b->total_kv - b->free_kv : 0;

    bt_prom_label_escape(name, lname, sizeof(lname));
    status = bt_prom_header("baton_worker_info", "gauge",
                            "Always 1; labels name the worker and its role",
                            prom_write, out);
    P("baton_worker_info{worker=\"%s\",role=\"%s\"} 1\n", lname, role);
    FAMILY("baton_worker_registered", "gauge",
           "1 while the router acknowledged this worker's registration",
           "%d", have_h && h->registered ? 1 : 0);
    FAMILY("baton_worker_turns_total", "counter",
           "Main-loop turns completed (engine progress)", "%llu",
           (unsigned long long)(have_h ? h->progress : 0));
    FAMILY("baton_worker_turn_running_seconds", "gauge",
           "Age of the main-loop turn running now (0: idle)", "%.3f",
           have_h ? h->busy_ms / 1e3 : 0.0);
    FAMILY("baton_worker_turn_longest_seconds", "gauge",
           "Longest main-loop turn of the last 5 to 10 seconds", "%.3f",
           have_h ? h->step_ms / 1e3 : 0.0);
    FAMILY("baton_worker_draining", "gauge",
           "1 while the worker drains (takes no new work)", "%d",
           b->draining ? 1 : 0);
    FAMILY("baton_worker_running_sequences", "gauge",
           "Sequences (decode) or prompts (prefill) started", "%u",
           b->running);
    FAMILY("baton_worker_waiting_sequences", "gauge",
           "Held but not started: prompts with no chunk fed, or "
           "reservations whose KV has not arrived", "%u", b->waiting);
    FAMILY("baton_worker_outstanding_tokens", "gauge",
           "Tokens the worker still owes (prompt tokens to prefill, one "
           "per running sequence)", "%llu",
           (unsigned long long)b->outstanding);
    if (b->has_kv) {
        FAMILY("baton_worker_kv_blocks_used", "gauge",
               "KV blocks in use or promised", "%u", used);
        FAMILY("baton_worker_kv_blocks", "gauge",
               "KV blocks in the pool", "%u", b->total_kv);
        FAMILY("baton_worker_kv_usage_ratio", "gauge",
               "KV blocks used / total (0..1)", "%.4f",
               b->total_kv > 0 ? (double)used / b->total_kv : 0.0);
    }
    if (b->has_reserved)
        FAMILY("baton_worker_kv_blocks_reserved", "gauge",
               "KV blocks granted to hand-offs that have not arrived", "%u",
               b->reserved);
    FAMILY("baton_worker_steps_total", "counter", "Engine steps", "%llu",
           (unsigned long long)st->steps);
    FAMILY("baton_worker_prefill_tokens_total", "counter",
           "Prompt tokens prefilled", "%llu",
           (unsigned long long)st->prefill_tokens);
    FAMILY("baton_worker_generated_tokens_total", "counter",
           "Tokens generated (decode steps)", "%llu",
           (unsigned long long)st->generated_tokens);
    if (b->prefill_tokens_per_s > 0)
        FAMILY("baton_worker_prefill_tokens_per_second", "gauge",
               "Measured prefill rate (moving average)", "%.1f",
               b->prefill_tokens_per_s);
    FAMILY("baton_worker_kv_handoffs_total", "counter",
           "KV hand-offs sent to decode workers", "%llu",
           (unsigned long long)st->handoffs);
    FAMILY("baton_worker_kv_handoff_bytes_total", "counter",
           "KV bytes of the hand-offs sent", "%llu",
           (unsigned long long)st->handoff_bytes);
    FAMILY("baton_worker_kv_blocks_sent_total", "counter",
           "KV blocks of the hand-offs sent (prefill)", "%llu",
           (unsigned long long)st->kv_blocks_sent);
    FAMILY("baton_worker_kv_blocks_received_total", "counter",
           "KV blocks of the hand-offs received (decode)", "%llu",
           (unsigned long long)st->kv_blocks_received);
    FAMILY("baton_worker_kv_blocks_held_total", "counter",
           "Hand-off blocks not moved: the decode worker's prefix cache "
           "held them", "%llu", (unsigned long long)st->kv_blocks_held);
    FAMILY("baton_worker_kv_capability_rejected_total", "counter",
           "KV commits (KvReady, local prefill) dropped: the capability "
           "is not the live reservation's", "%llu",
           (unsigned long long)st->kv_cap_rejected);
    FAMILY("baton_worker_kv_grants_waited_total", "counter",
           "KV reservations refused because the hand-offs in flight fill "
           "the receive room (the staged link's area, the CUDA IPC "
           "windows' budget); the router asks again 20 ms later", "%llu",
           (unsigned long long)st->kv_grants_waited);
    FAMILY("baton_worker_kv_windows_total", "counter",
           "Receive windows (UCX or staged) mapped for KV grants: only for "
           "the link the router announced, none for a local or inline "
           "hand-off", "%llu", (unsigned long long)st->kv_windows);
    FAMILY("baton_worker_kv_windows_revoked_total", "counter",
           "UCX receive windows unmapped while their writer may still hold "
           "the key (the reservation ended before its KV arrived)", "%llu",
           (unsigned long long)st->kv_windows_revoked);
    FAMILY("baton_worker_kv_writes_refused_total", "counter",
           "KV writes the UCX link refused: messages naming no live "
           "receive window of their slot, epoch and token, or out of its "
           "bounds (a stale or forged writer)", "%llu",
           (unsigned long long)st->kv_writes_refused);
    if (b->has_spec) {
        FAMILY("baton_worker_spec_accept_length", "gauge",
               "Speculation: mean tokens accepted per verify step", "%.3f",
               b->spec_accept_length);
        FAMILY("baton_worker_spec_verify_steps_total", "counter",
               "Speculation: sequence verify steps", "%llu",
               (unsigned long long)b->spec_verify_steps);
        FAMILY("baton_worker_spec_verify_tokens_total", "counter",
               "Speculation: tokens those steps accepted", "%llu",
               (unsigned long long)b->spec_verify_tokens);
    }
    if (b->has_prefix) {
        for (size_t i = 0; i < BT_ARRAY_SIZE(prefix_counters); i++) {
            const prefix_counter_t *pc = &prefix_counters[i];
            FAMILY(pc->name, "counter", pc->help, "%llu",
                   (unsigned long long)*(const uint64_t *)(
                       (const uint8_t *)b + pc->offset));
        }
        if (status == BT_OK)
            status = bt_prom_header("baton_worker_prefix_cached_blocks",
                                    "gauge", "Prefix cache: blocks cached "
                                    "now, by tier (0: the KV pool, 1: "
                                    "the host tier)", prom_write, out);
        P("baton_worker_prefix_cached_blocks{tier=\"0\"} %u\n",
          b->prefix_cached_blocks);
        if (b->prefix_host_blocks > 0)
            P("baton_worker_prefix_cached_blocks{tier=\"1\"} %u\n",
              b->prefix_host_cached);
        FAMILY("baton_worker_prefix_cached_unused_blocks", "gauge",
               "Prefix cache: cached blocks no sequence uses (evictable)",
               "%u", b->prefix_cached_unused);
    }
    if (status == BT_OK)
        status = bt_prom_hist_render(&st->batch, "baton_worker_batch_size",
                                     "Sequences per engine step",
                                     prom_write, out);
    if (status == BT_OK)
        status = bt_prom_hist_render(&st->step, "baton_worker_step_seconds",
                                     "Wall time per engine step",
                                     prom_write, out);
    if (strcmp(role, "prefill") != 0) { /* decode steps only */
        if (status == BT_OK)
            status = bt_prom_hist_render(
                &st->host, "baton_worker_step_host_seconds",
                "Serial host time per decode step: before the forward is "
                "enqueued and after its ids are back (what every device "
                "step waits for)", prom_write, out);
        if (status == BT_OK)
            status = bt_prom_header(
                "baton_worker_step_phase_seconds_total", "counter",
                "Decode steps' wall time by phase: build and post are "
                "serial host work, emit overlaps the device, enqueue and "
                "wait are the device's", prom_write, out);
        for (size_t i = 0; i < BT_ARRAY_SIZE(phases); i++)
            P("baton_worker_step_phase_seconds_total{phase=\"%s\"} %.6f\n",
              phases[i].label, phase_get(&st->phases, &phases[i]));
    }
    if (status == BT_OK)
        status = bt_prom_hist_render(&st->handoff,
                                     "baton_worker_kv_handoff_seconds",
                                     "Time moving one hand-off's KV (puts "
                                     "and commit; inline: packing)",
                                     prom_write, out);
    return status;
}

/* The reason the worker is not healthy, or NULL when it is.  Called with
 * m->mu held. */
static const char *unhealthy(const workerproc_metrics_t *m,
                             const workerproc_link_health_t *h, char *why,
                             size_t cap)
{
    uint64_t limit;

    if (m->link == NULL)
        return m->detached ? "stopping" : "starting: loading the model";
    if (!h->registered) {
        snprintf(why, cap, "not registered: waiting for the router at %s",
                 m->router);
        return why;
    }
    limit = BT_MAX((uint64_t)m->stall_ms, 20ull * h->step_ms);
    if (h->busy_ms > limit) {
        snprintf(why, cap, "engine turn running for %u ms (limit %llu ms): "
                 "stuck", h->busy_ms, (unsigned long long)limit);
        return why;
    }
    return NULL;
}

/* bt_http_handler_fn. */
static int handler(void *arg, int route, bt_buf_t *body,
                   const char **content_type)
{
    workerproc_metrics_t *m = arg;
    workerproc_link_health_t h;
    metrics_state_t *st = NULL;
    char name[128], why[384];
    const char *reason = NULL;
    bool have_h = false;
    bt_status_t status;

    memset(&h, 0, sizeof(h));
    if (route == 1) {
        pthread_mutex_lock(&m->mu);
        if (m->link != NULL)
            workerproc_link_health(m->link, &h);
        reason = unhealthy(m, &h, why, sizeof(why));
        status = reason == NULL ? bt_buf_printf(body, "ok\n")
                                : bt_buf_printf(body, "unavailable: %s\n",
                                                reason);
        pthread_mutex_unlock(&m->mu);
        if (status != BT_OK)
            return 500;
        return reason == NULL ? 200 : 503;
    }
    /* Copy under the lock, render outside it. */
    st = bt_malloc(sizeof(*st), "worker_metrics_snapshot");
    if (st == NULL)
        return 500;
    pthread_mutex_lock(&m->mu);
    *st = m->st;
    snprintf(name, sizeof(name), "%s", m->name);
    if (m->link != NULL) {
        workerproc_link_health(m->link, &h);
        have_h = true;
    }
    pthread_mutex_unlock(&m->mu);
    status = render(st, m->role, name, &h, have_h, body);
    bt_free(st);
    if (status != BT_OK)
        return 500;
    *content_type = "text/plain; version=0.0.4; charset=utf-8";
    return 200;
}

static void *serve_thread(void *arg)
{
    workerproc_metrics_t *m = arg;
    zmq_pollitem_t items[1 + BT_HTTP_MAX_CONNS];

    while (!atomic_load(&m->quit)) {
        int n = bt_http_server_poll_items(m->srv, items);
        int rc = zmq_poll(items, n, METRICS_POLL_MS);
        bt_http_server_process(m->srv, m, items, rc > 0 ? n : 0,
                               bt_time_ns());
    }
    return NULL;
}

// ---------------------------------------------------------------------------
// API

bt_status_t workerproc_metrics_create(const workerproc_metrics_config_t *cfg,
                                      workerproc_metrics_t **m_p)
{
    workerproc_metrics_t *m;
    const char *env = getenv("BATON_HEALTH_STALL_MS");
    bt_status_t status;

    m = bt_calloc(1, sizeof(*m), "workerproc_metrics");
    if (m == NULL)
        return BT_ERR_NO_MEMORY;
    snprintf(m->role, sizeof(m->role), "%s", cfg->role);
    snprintf(m->router, sizeof(m->router), "%s",
             cfg->router ? cfg->router : "?");
    snprintf(m->host, sizeof(m->host), "%s",
             cfg->host ? cfg->host : "127.0.0.1");
    m->stall_ms = METRICS_STALL_MS_DEFAULT;
    if (env != NULL && bt_parse_int(env, &m->stall_ms) != BT_OK)
        m->stall_ms = METRICS_STALL_MS_DEFAULT;
    bt_prom_hist_init(&m->st.batch, batch_bounds,
                      (int)BT_ARRAY_SIZE(batch_bounds));
    bt_prom_hist_init(&m->st.step, step_bounds,
                      (int)BT_ARRAY_SIZE(step_bounds));
    bt_prom_hist_init(&m->st.handoff, handoff_bounds,
                      (int)BT_ARRAY_SIZE(handoff_bounds));
    bt_prom_hist_init(&m->st.host, host_bounds,
                      (int)BT_ARRAY_SIZE(host_bounds));
    status = bt_http_server_create(m->host, cfg->port, metrics_paths, 2,
                                   handler, "worker metrics", &m->srv);
    if (status != BT_OK)
        goto err_free;
    pthread_mutex_init(&m->mu, NULL);
    if (pthread_create(&m->thread, NULL, serve_thread, m) != 0) {
        status = BT_ERROR(BT_ERR_INTERNAL, "WORKER", "cannot start the "
                          "metrics thread");
        goto err_mutex;
    }
    BT_LOG_INFO("WORKER", "metrics on http://%s:%d/metrics, health on "
                "/health", m->host, bt_http_server_port(m->srv));
    *m_p = m;
    return BT_OK;

err_mutex:
    pthread_mutex_destroy(&m->mu);
    bt_http_server_destroy(&m->srv);
err_free:
    bt_free(m);
    return status;
}

void workerproc_metrics_destroy(workerproc_metrics_t **m_p)
{
    workerproc_metrics_t *m = *m_p;

    if (m == NULL)
        return;
    atomic_store(&m->quit, true);
    pthread_join(m->thread, NULL);
    bt_http_server_destroy(&m->srv);
    pthread_mutex_destroy(&m->mu);
    bt_free(m);
    *m_p = NULL;
}

int workerproc_metrics_port(const workerproc_metrics_t *m)
{
    return m != NULL ? bt_http_server_port(m->srv) : -1;
}

void workerproc_metrics_attach(workerproc_metrics_t *m,
                               workerproc_link_t *link, const char *name)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    if (link == NULL && m->link != NULL)
        m->detached = true;
    m->link = link;
    if (name != NULL)
        snprintf(m->name, sizeof(m->name), "%s", name);
    pthread_mutex_unlock(&m->mu);
}

void workerproc_metrics_step(workerproc_metrics_t *m, int batch,
                             double seconds, uint64_t prefill_tokens,
                             uint64_t generated_tokens)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    m->st.steps++;
    m->st.prefill_tokens += prefill_tokens;
    m->st.generated_tokens += generated_tokens;
    bt_prom_hist_observe(&m->st.batch, (double)batch);
    bt_prom_hist_observe(&m->st.step, seconds);
    pthread_mutex_unlock(&m->mu);
}

void workerproc_metrics_step_split(workerproc_metrics_t *m,
                                   const workerproc_step_split_t *split)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    bt_prom_hist_observe(&m->st.host, split->build + split->post);
    for (size_t i = 0; i < BT_ARRAY_SIZE(phases); i++)
        *phase_of(&m->st.phases, &phases[i]) +=
            phase_get(split, &phases[i]);
    pthread_mutex_unlock(&m->mu);
}

void workerproc_metrics_handoff(workerproc_metrics_t *m, uint64_t bytes,
                                double seconds)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    m->st.handoffs++;
    m->st.handoff_bytes += bytes;
    bt_prom_hist_observe(&m->st.handoff, seconds);
    pthread_mutex_unlock(&m->mu);
}

/* Adds n to the counter at offset `off` of the state (NULL-safe). */
static void count_add(workerproc_metrics_t *m, size_t off, uint64_t n)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    *(uint64_t *)((char *)&m->st + off) += n;
    pthread_mutex_unlock(&m->mu);
}

void workerproc_metrics_kv_rejected(workerproc_metrics_t *m)
{
    count_add(m, offsetof(metrics_state_t, kv_cap_rejected), 1);
}

void workerproc_metrics_kv_grant_waited(workerproc_metrics_t *m)
{
    count_add(m, offsetof(metrics_state_t, kv_grants_waited), 1);
}

void workerproc_metrics_kv_window_mapped(workerproc_metrics_t *m)
{
    count_add(m, offsetof(metrics_state_t, kv_windows), 1);
}

void workerproc_metrics_kv_window_revoked(workerproc_metrics_t *m)
{
    count_add(m, offsetof(metrics_state_t, kv_windows_revoked), 1);
}

void workerproc_metrics_kv_writes_refused(workerproc_metrics_t *m,
                                          uint64_t n)
{
    count_add(m, offsetof(metrics_state_t, kv_writes_refused), n);
}

void workerproc_metrics_kv_blocks(workerproc_metrics_t *m, bool sent,
                                  uint64_t moved, uint64_t held)
{
    if (m == NULL)
        return;
    pthread_mutex_lock(&m->mu);
    if (sent)
        m->st.kv_blocks_sent += moved;
    else
        m->st.kv_blocks_received += moved;
    m->st.kv_blocks_held += held;
    pthread_mutex_unlock(&m->mu);
}
