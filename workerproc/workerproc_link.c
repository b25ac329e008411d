/*
 * workerproc_link.c - registration sessions, router acknowledgements and
 * the heartbeat thread of a worker (see workerproc_link.h).
 */
#include "workerproc_link.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "workerproc.h"

#define LINK_REGISTER_RETRY_NS 1000000000ull /* Register again after 1 s
                                                without an answer */
#define LINK_REFUSED_LIMIT_NS (10ull * 1000000000ull) /* then give up */
#define LINK_SILENCE_MIN_NS (3ull * 1000000000ull)
#define LINK_WINDOW_NS (5ull * 1000000000ull) /* longest-turn window */

struct workerproc_link_s {
    void *sock;
    char name[128];
    /* Guards everything up to `beat` (read by the heartbeat thread). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    uint64_t session;          /* Register messages sent */
    bool registered;           /* the current session was acknowledged */
    int heartbeat_ms;          /* the router's period (250 until told) */
    bool batches;              /* the router takes ControlBatch
                                  (RegisterAck.batches; main thread) */
    uint64_t last_beat_ns;     /* last heartbeat sent */
    workerproc_beat_t beat;    /* what the next heartbeat says */
    /* Main thread only: */
    uint64_t router_instance;  /* of the last acknowledgement (0: none) */
    int liveness_ms;           /* the router drops a worker silent this
                                  long (from the ack) */
    uint64_t last_register_ns;
    uint64_t last_ack_ns;
    bool want_register;        /* the router said it does not know us */
    bool refused;
    uint64_t refused_since_ns;
    char refusal[256];
    uint64_t win_start_ns;     /* longest turn: this window and the last */
    uint64_t win_ms[2];
    /* Both threads, lock-free: */
    _Atomic uint64_t progress;      /* turns completed */
    _Atomic uint64_t turn_start_ns; /* the running turn's start, 0: idle */
    _Atomic uint32_t step_ms;       /* longest turn of the last window or
                                       two */
    pthread_t thread;
    bool thread_on;
};

static pthread_mutex_t g_sock_lock = PTHREAD_MUTEX_INITIALIZER;
/* Heartbeat threads waiting for the lock: the main thread lets them go
 * first (a mutex is not fair: a loop that unlocks and locks again at
 * once would starve them, and a starved heartbeat looks like death). */
static atomic_int g_sock_waiters;

void workerproc_sock_lock(void)
{
    while (atomic_load(&g_sock_waiters) > 0)
        sched_yield();
    pthread_mutex_lock(&g_sock_lock);
}

/* The heartbeat thread's way in: ahead of the main thread. */
static void sock_lock_first(void)
{
    atomic_fetch_add(&g_sock_waiters, 1);
    pthread_mutex_lock(&g_sock_lock);
    atomic_fetch_sub(&g_sock_waiters, 1);
}

void workerproc_sock_unlock(void)
{
    pthread_mutex_unlock(&g_sock_lock);
}

/* Sends one heartbeat from the published state (either thread). */
static void send_beat(workerproc_link_t *link)
{
    Baton__Heartbeat hb;
    workerproc_beat_t b;
    uint64_t session, start, now = bt_time_ns();
    bool registered;

    pthread_mutex_lock(&link->mu);
    b = link->beat;
    session = link->session;
    registered = link->registered;
    link->last_beat_ns = now;
    pthread_mutex_unlock(&link->mu);
    if (!registered) /* the Register is on its way; it says it all */
        return;
    workerproc_heartbeat_init(&hb, link->name, b.running + b.waiting,
                              b.outstanding, b.draining);
    if (b.has_kv) {
        hb.has_free_kv_blocks = 1;
        hb.free_kv_blocks = b.free_kv;
        hb.has_total_kv_blocks = 1;
        hb.total_kv_blocks = b.total_kv;
    }
    if (b.has_reserved) {
        hb.has_reserved_blocks = 1;
        hb.reserved_blocks = b.reserved;
    }
    hb.has_recv_frees = b.has_recv_frees;
    hb.recv_frees = b.recv_frees;
    if (b.has_spec) {
        hb.has_spec_verify_steps = 1;
        hb.spec_verify_steps = b.spec_verify_steps;
        hb.has_spec_verify_tokens = 1;
        hb.spec_verify_tokens = b.spec_verify_tokens;
        hb.has_spec_accept_length = 1;
        hb.spec_accept_length = b.spec_accept_length;
    }
    if (b.has_prefix) {
        hb.has_prefix_cached_blocks = 1;
        hb.prefix_cached_blocks = b.prefix_cached_blocks;
        hb.has_prefix_host_cached_blocks = b.prefix_host_blocks > 0;
        hb.prefix_host_cached_blocks = b.prefix_host_cached;
        hb.has_prefix_hit_rate = 1;
        hb.prefix_hit_rate = b.prefix_lookup_tokens > 0
            ? (double)b.prefix_hit_tokens / (double)b.prefix_lookup_tokens
            : 0.0;
    }
    if (b.prefill_tokens_per_s > 0) {
        hb.has_prefill_tokens_per_s = 1;
        hb.prefill_tokens_per_s = b.prefill_tokens_per_s;
    }
    start = atomic_load(&link->turn_start_ns);
    hb.has_progress = 1;
    hb.progress = atomic_load(&link->progress);
    hb.has_busy_ms = 1;
    hb.busy_ms = start != 0 && now > start
                     ? (uint32_t)BT_MIN((now - start) / 1000000ull,
                                        (uint64_t)UINT32_MAX)
                     : 0;
    hb.has_step_ms = 1;
    hb.step_ms = atomic_load(&link->step_ms);
    hb.has_session = 1;
    hb.session = session;
    {
        Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
        msg.body_case = BATON__CONTROL_MESSAGE__BODY_HEARTBEAT;
        msg.heartbeat = &hb;
        sock_lock_first();
        if (proto_control_send(link->sock, NULL, 0, &msg) != BT_OK)
            BT_LOG_WARN("NET", "%s: cannot send a heartbeat", link->name);
        pthread_mutex_unlock(&g_sock_lock);
    }
}

static void *beat_thread(void *arg)
{
    workerproc_link_t *link = arg;

    pthread_mutex_lock(&link->mu);
    while (!link->quit) {
        uint64_t now = bt_time_ns();
        uint64_t due = link->last_beat_ns +
                       (uint64_t)link->heartbeat_ms * 1000000ull;
        if (now < due) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull +
                          (uint64_t)ts.tv_nsec + (due - now);
            ts.tv_sec = (time_t)(at / 1000000000ull);
            ts.tv_nsec = (long)(at % 1000000000ull);
            pthread_cond_timedwait(&link->cv, &link->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&link->mu);
        send_beat(link);
        pthread_mutex_lock(&link->mu);
    }
    pthread_mutex_unlock(&link->mu);
    return NULL;
}

bt_status_t workerproc_link_create(void *sock, const char *name,
                                   workerproc_link_t **link_p)
{
    workerproc_link_t *link = bt_calloc(1, sizeof(*link), "workerproc_link");
    pthread_condattr_t ca;

    if (link == NULL)
        return BT_ERR_NO_MEMORY;
    link->sock = sock;
    snprintf(link->name, sizeof(link->name), "%s", name);
    link->heartbeat_ms = 250;
    link->liveness_ms = 1000;
    pthread_mutex_init(&link->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&link->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&link->thread, NULL, beat_thread, link) != 0) {
        pthread_cond_destroy(&link->cv);
        pthread_mutex_destroy(&link->mu);
        bt_free(link);
        return BT_ERROR(BT_ERR_INTERNAL, "WORKER", "cannot start the "
                        "heartbeat thread");
    }
    link->thread_on = true;
    *link_p = link;
    return BT_OK;
}

void workerproc_link_destroy(workerproc_link_t **link_p)
{
    workerproc_link_t *link = *link_p;

    if (link == NULL)
        return;
    if (link->thread_on) {
        pthread_mutex_lock(&link->mu);
        link->quit = true;
        pthread_cond_signal(&link->cv);
        pthread_mutex_unlock(&link->mu);
        pthread_join(link->thread, NULL);
    }
    pthread_cond_destroy(&link->cv);
    pthread_mutex_destroy(&link->mu);
    bt_free(link);
    *link_p = NULL;
}

uint64_t workerproc_link_begin_session(workerproc_link_t *link)
{
    uint64_t session;

    pthread_mutex_lock(&link->mu);
    session = ++link->session;
    link->registered = false;
    pthread_mutex_unlock(&link->mu);
    link->want_register = false;
    link->last_register_ns = bt_time_ns();
    return session;
}

bool workerproc_link_registered(const workerproc_link_t *link)
{
    /* Written by the main thread only; the heartbeat thread reads it
     * under the lock. */
    return link->registered;
}

static void on_register_ack(workerproc_link_t *link,
                            const Baton__RegisterAck *ack)
{
    uint64_t now = bt_time_ns();

    if (ack->refused != NULL) {
        if (ack->has_session && ack->session != link->session)
            return;
        if (!link->refused) {
            link->refused = true;
            link->refused_since_ns = now;
        }
        snprintf(link->refusal, sizeof(link->refusal), "%s", ack->refused);
        BT_LOG_ERROR("WORKER", "%s: the router refused the registration: "
                     "%s", link->name, ack->refused);
        return;
    }
    if (ack->reregister) {
        /* Answers to messages sent before our latest Register arrive
         * before its ack; once registered, this one is news: the router
         * dropped us (we were silent) or restarted. */
        if (link->registered)
            link->want_register = true;
        return;
    }
    if (ack->has_session && ack->session != link->session)
        return; /* an older session's ack */
    if (ack->has_router_instance && link->router_instance != 0 &&
        ack->router_instance != link->router_instance)
        BT_LOG_WARN("WORKER", "%s: a new router instance %016llx answers "
                    "(was %016llx): it restarted", link->name,
                    (unsigned long long)ack->router_instance,
                    (unsigned long long)link->router_instance);
    if (ack->has_router_instance)
        link->router_instance = ack->router_instance;
    if (ack->has_liveness_ms && ack->liveness_ms > 0)
        link->liveness_ms = (int)ack->liveness_ms;
    link->batches = ack->has_batches && ack->batches;
    link->refused = false;
    link->want_register = false;
    link->last_ack_ns = now;
    pthread_mutex_lock(&link->mu);
    link->registered = true;
    if (ack->heartbeat_ms > 0)
        link->heartbeat_ms = (int)ack->heartbeat_ms;
    link->last_beat_ns = 0; /* a heartbeat at once */
    pthread_cond_signal(&link->cv);
    pthread_mutex_unlock(&link->mu);
}

bool workerproc_link_batches(const workerproc_link_t *link)
{
    return link->batches;
}

bool workerproc_link_on_ack(workerproc_link_t *link,
                            const Baton__ControlMessage *msg)
{
    const Baton__HeartbeatAck *ha;

    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK:
        on_register_ack(link, msg->register_ack);
        return true;
    case BATON__CONTROL_MESSAGE__BODY_HEARTBEAT_ACK:
        ha = msg->heartbeat_ack;
        if (!link->registered || ha->session != link->session)
            return true;
        if (ha->router_instance != link->router_instance) {
            link->want_register = true; /* another router answers */
            return true;
        }
        link->last_ack_ns = bt_time_ns();
        return true;
    default:
        return false;
    }
}

workerproc_link_action_t workerproc_link_check(workerproc_link_t *link)
{
    uint64_t now = bt_time_ns();
    uint64_t silence = BT_MAX(LINK_SILENCE_MIN_NS,
                              2ull * (uint64_t)link->liveness_ms * 1000000ull);

    if (link->refused) {
        if (now - link->refused_since_ns > LINK_REFUSED_LIMIT_NS)
            return WORKERPROC_LINK_REFUSED;
        return now - link->last_register_ns > LINK_REGISTER_RETRY_NS
                   ? WORKERPROC_LINK_REGISTER
                   : WORKERPROC_LINK_OK;
    }
    if (link->session == 0)
        return WORKERPROC_LINK_REGISTER; /* first start */
    if (!link->registered)
        return now - link->last_register_ns > LINK_REGISTER_RETRY_NS
                   ? WORKERPROC_LINK_REGISTER /* the router may not be up */
                   : WORKERPROC_LINK_OK;
    if (link->want_register) {
        BT_LOG_WARN("WORKER", "%s: the router no longer knows this worker: "
                    "dropping what it holds, registering again", link->name);
        return WORKERPROC_LINK_REGISTER;
    }
    if (now - link->last_ack_ns > silence) {
        BT_LOG_WARN("WORKER", "%s: no answer from the router for %llu ms: "
                    "dropping what it holds, registering again", link->name,
                    (unsigned long long)((now - link->last_ack_ns) /
                                         1000000ull));
        return WORKERPROC_LINK_REGISTER;
    }
    return WORKERPROC_LINK_OK;
}

const char *workerproc_link_refusal(const workerproc_link_t *link)
{
    return link->refusal;
}

void workerproc_link_publish(workerproc_link_t *link,
                             const workerproc_beat_t *beat, bool now)
{
    pthread_mutex_lock(&link->mu);
    link->beat = *beat;
    pthread_mutex_unlock(&link->mu);
    if (now)
        send_beat(link);
}

void workerproc_link_health(workerproc_link_t *link,
                            workerproc_link_health_t *h)
{
    uint64_t now = bt_time_ns(), start;

    pthread_mutex_lock(&link->mu);
    h->registered = link->registered;
    h->beat = link->beat;
    pthread_mutex_unlock(&link->mu);
    start = atomic_load(&link->turn_start_ns);
    h->progress = atomic_load(&link->progress);
    h->busy_ms = start != 0 && now > start
                     ? (uint32_t)BT_MIN((now - start) / 1000000ull,
                                        (uint64_t)UINT32_MAX)
                     : 0;
    h->step_ms = atomic_load(&link->step_ms);
}

void workerproc_link_turn_begin(workerproc_link_t *link)
{
    atomic_store(&link->turn_start_ns, bt_time_ns());
}

void workerproc_link_turn_end(workerproc_link_t *link)
{
    uint64_t now = bt_time_ns();
    uint64_t start = atomic_exchange(&link->turn_start_ns, 0);
    uint64_t ms = start != 0 && now > start ? (now - start) / 1000000ull : 0;

    atomic_fetch_add(&link->progress, 1);
    if (now - link->win_start_ns > LINK_WINDOW_NS) {
        link->win_ms[1] = link->win_ms[0];
        link->win_ms[0] = 0;
        link->win_start_ns = now;
    }
    link->win_ms[0] = BT_MAX(link->win_ms[0], ms);
    atomic_store(&link->step_ms,
                 (uint32_t)BT_MIN(BT_MAX(link->win_ms[0], link->win_ms[1]),
                                  (uint64_t)UINT32_MAX));
}
