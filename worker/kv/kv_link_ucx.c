/*
 * kv_link_ucx.c - KV over UCX one-sided puts into a decode worker's host
 * pool (kv_transport.h): one put per run of consecutive blocks per layer
 * as soon as the layer is computed, then a commit that lands the grant's
 * epoch in the arrival slot after every put.
 *
 * The sender keeps an endpoint per decode pool the router lists, so a
 * hand-off never pays for connecting on a request's critical path.
 *
 * Receive windows (issue 42, the default): the decode worker registers
 * only its arrival slots and maps one window per reservation
 * (kv_ucx_window_create); the grant carries its key, the hand-off puts
 * into it, and the decode worker copies it into the reservation's blocks
 * once KvReady's capability was checked and the epoch arrived, then
 * unmaps it.  A reservation that ends otherwise unmaps it too, so the
 * pool is never a remote writer's target and a stale key reaches nothing
 * a sequence reads.  --kv-direct-writes registers the pool instead.
 *
 * Where UCX would not check the window's key (an endpoint without RMA
 * lanes: software RMA over tcp) the hand-off sends the data as active
 * messages the decode worker checks against the live grant (slot, epoch,
 * the window's token, bounds) and copies itself; the commit always goes
 * that way.  The decode worker's UCX runs without RMA unless another
 * receiving link needs it, so a put over tcp writes nothing there
 * (kv_transport.h "Receive windows", docs/SECURITY.md 5).
 */
#include "kv/kv_link_int.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

#define UCX_MAX_PEERS 64 /* decode pools kept connected */

/* A decode pool this worker keeps an endpoint to. */
typedef struct {
    kv_ucx_peer_t *peer;  /* one reference, held by the sender */
    uint64_t pool_id;     /* the pool's identity (descriptor) */
    uint64_t last_used;   /* bt_time_ns of the last hand-off that used it */
    bool retiring;        /* dropped: disconnect once nothing uses it */
} ucx_held_t;

typedef struct ucx_xfer_s ucx_xfer_t;

typedef struct {
    kv_link_shared_t *sh;
    kv_ucx_t *ucx;                     /* sh->ucx, one acquire */
    ucx_held_t peers[UCX_MAX_PEERS];   /* (n_peers) */
    int n_peers;
    ucx_xfer_t *xfers;                 /* live hand-offs */
} ucx_send_t;

struct ucx_xfer_s {
    kv_link_xfer_base_t base;
    ucx_send_t *s;
    kv_link_remote_t rt;       /* endpoint, slot, epoch, where to */
    kv_ucx_peer_t *peer;  /* one reference */
    kv_ucx_rwindow_t *win;/* the grant's receive window, or NULL */
    bool win_failed;      /* it could not be opened: the commit fails */
    const int *src;       /* (n) local blocks, borrowed */
    int n;
    bool committing;
    bool commit_done;
    bt_status_t commit_status;
    ucx_xfer_t *next;
};

// ---------------------------------------------------------------------------
// Held endpoints

static ucx_held_t *peer_find(ucx_send_t *s, const kv_ucx_peer_t *peer)
{
    for (int i = 0; i < s->n_peers; i++)
        if (s->peers[i].peer == peer)
            return &s->peers[i];
    return NULL;
}

static void peer_retire(ucx_send_t *s, const kv_ucx_peer_t *peer)
{
    ucx_held_t *h = peer_find(s, peer);

    if (h != NULL && !h->retiring) {
        BT_LOG_INFO("KV", "dropping the endpoint to KV pool %016llx",
                    (unsigned long long)h->pool_id);
        h->retiring = true;
    }
}

static bool peer_in_use(ucx_send_t *s, const kv_ucx_peer_t *peer)
{
    for (ucx_xfer_t *x = s->xfers; x; x = x->next)
        if (x->peer == peer)
            return true;
    return false;
}

/* Connects to the decode pool of `desc` and keeps the endpoint: later
 * hand-offs to that pool reuse it (kv_ucx_connect caches by pool id while
 * a reference lives).  The first connect to a pool costs ~milliseconds
 * (UCX endpoint, rkey unpack, shared-memory attach).  When the table is
 * full, the least recently used endpoint is retired. */
static kv_ucx_peer_t *peer_hold(ucx_send_t *s, const void *desc, size_t len)
{
    kv_ucx_peer_t *peer = NULL;
    ucx_held_t *h;

    if (kv_ucx_connect(s->ucx, desc, len, &peer) != BT_OK)
        return NULL;
    h = peer_find(s, peer);
    if (h != NULL) {
        h->retiring = false; /* in use again */
        h->last_used = bt_time_ns();
        kv_ucx_disconnect(&peer); /* the held reference stays */
        return h->peer;
    }
    if (s->n_peers == UCX_MAX_PEERS) {
        ucx_held_t *lru = NULL;
        for (int i = 0; i < s->n_peers; i++)
            if (!s->peers[i].retiring &&
                (lru == NULL || s->peers[i].last_used < lru->last_used))
                lru = &s->peers[i];
        if (lru != NULL)
            lru->retiring = true;
        kv_ucx_disconnect(&peer); /* not held: connected per hand-off */
        return NULL;
    }
    h = &s->peers[s->n_peers++];
    h->peer = peer;
    h->pool_id = kv_ucx_desc_pool_id(kv_ucx_peer_desc(peer));
    h->last_used = bt_time_ns();
    h->retiring = false;
    BT_LOG_DEBUG("KV", "connected to KV pool %016llx",
                 (unsigned long long)h->pool_id);
    if (bt_log_is_enabled(BT_LOG_LEVEL_DEBUG, "KV"))
        kv_ucx_peer_print_info(peer, stderr); /* lanes and transports */
    return peer;
}

/* The stall verdict on a hand-off: the decode worker is presumed dead, so
 * its endpoint is abandoned (kv_ucx_peer_abandon) rather than only
 * retired.  A retired endpoint with operations stuck in flight was never
 * closed (reap waits for them), one per dead decode worker until exit; an
 * abandoned one fails every other hand-off on it, is closed at once by
 * reap when no hand-off holds it, and a later connect to that pool makes
 * a fresh endpoint. */
static void peer_abandon(ucx_send_t *s, kv_ucx_peer_t *peer)
{
    if (kv_ucx_peer_abandoned(peer))
        return;
    BT_LOG_INFO("KV", "abandoning the endpoint to KV pool %016llx",
                (unsigned long long)kv_ucx_desc_pool_id(
                    kv_ucx_peer_desc(peer)));
    kv_ucx_peer_abandon(peer);
    peer_retire(s, peer);
}

// ---------------------------------------------------------------------------
// Sender

static bt_status_t ucx_send_create(kv_link_shared_t *sh, void **state_p)
{
    ucx_send_t *s;

    /* device pools go over CUDA IPC or the staged link */
    if (sh->cfg->backend == NULL || !sh->cfg->use_ucx ||
        sh->cfg->kv_on_device)
        return BT_ERR_UNSUPPORTED;
    s = bt_calloc(1, sizeof(*s), "kv_link_ucx");
    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->sh = sh;
    s->ucx = kv_link__ucx_acquire(sh);
    if (s->ucx == NULL) {
        bt_free(s);
        return BT_ERR_UNSUPPORTED; /* logged */
    }
    *state_p = s;
    return BT_OK;
}

static void ucx_send_destroy(void **state_p)
{
    ucx_send_t *s = *state_p;

    BT_ASSERT(s->xfers == NULL);
    for (int i = 0; i < s->n_peers; i++)
        kv_ucx_disconnect(&s->peers[i].peer); /* bounded wait */
    kv_link__ucx_release(s->sh);
    bt_free(s);
    *state_p = NULL;
}

/* KvPeers: connects to the new pools now and retires endpoints to pools
 * no longer listed (their decode worker is gone). */
static void ucx_send_sync(void *state, const kv_link_endpoint_t *eps, int n)
{
    ucx_send_t *s = state;
    kv_ucx_peer_t *listed[UCX_MAX_PEERS];
    int n_listed = 0;

    for (int i = 0; i < n && n_listed < UCX_MAX_PEERS; i++) {
        kv_ucx_peer_t *peer = peer_hold(s, eps[i].desc, eps[i].len);
        if (peer != NULL)
            listed[n_listed++] = peer;
    }
    for (int i = 0; i < s->n_peers; i++) {
        bool keep = false;
        for (int k = 0; k < n_listed && !keep; k++)
            keep = listed[k] == s->peers[i].peer;
        if (!keep)
            peer_retire(s, s->peers[i].peer);
    }
}

/* Disconnects retired endpoints that no hand-off uses and that have
 * nothing in flight.  A dead peer's operations without peer error
 * handling never complete: the stall verdict abandons such an endpoint
 * (its status is no longer OK), and its close is then forced, at once. */
static void ucx_send_reap(void *state)
{
    ucx_send_t *s = state;

    for (int i = 0; i < s->n_peers;) {
        ucx_held_t *h = &s->peers[i];
        if (!h->retiring || peer_in_use(s, h->peer) ||
            (kv_ucx_peer_pending(h->peer) > 0 &&
             kv_ucx_peer_status(h->peer) == BT_OK)) {
            i++;
            continue;
        }
        kv_ucx_disconnect(&h->peer);
        BT_LOG_INFO("KV", "closed the endpoint to KV pool %016llx",
                    (unsigned long long)h->pool_id);
        s->peers[i] = s->peers[--s->n_peers];
    }
}

// ---------------------------------------------------------------------------
// One hand-off

static bt_status_t ucx_xfer_create(void *state, const kv_link_route_t *r,
                                   kv_link_xfer_base_t **xfer_p)
{
    ucx_send_t *s = state;
    const kv_layout_t *lay = backend_kv_layout(s->sh->cfg->backend);
    kv_link_xfer_base_t *b;
    ucx_xfer_t *x;
    bt_status_t status = kv_link__remote_xfer_create(
        r, lay, sizeof(*x), offsetof(ucx_xfer_t, rt), r->dst_blocks, &b);

    if (status != BT_OK)
        return status;
    x = (ucx_xfer_t *)b;
    x->s = s;
    x->next = s->xfers;
    s->xfers = x;
    *xfer_p = &x->base;
    return BT_OK;
}

static bt_status_t ucx_xfer_start(kv_link_xfer_base_t *b, const int *src,
                                  int n)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;
    bt_status_t status;

    x->src = src;
    x->n = n;
    peer_hold(x->s, x->rt.desc, x->rt.desc_len);
    status = kv_ucx_connect(x->s->ucx, x->rt.desc, x->rt.desc_len, &x->peer);
    if (status != BT_OK)
        return status;
    /* A windowed pool takes KV only through the grant's window; a grant
     * without one, or with one this version cannot read, goes inline.  A
     * window UCX cannot open is gone (the reservation ended) or its
     * process is (a dead decode worker): inline would go to the same
     * place, so the hand-off fails and the router retries. */
    if (x->rt.window != NULL) {
        status = kv_ucx_window_open(x->peer, x->rt.window, x->rt.window_len,
                                    &x->win);
        if (status == BT_ERR_FORMAT || status == BT_ERR_NO_MEMORY)
            return status;
        if (status != BT_OK) {
            BT_LOG_WARN("KV", "request %llu: its UCX receive window could "
                        "not be opened", (unsigned long long)b->request_id);
            bt_error_clear();
            x->win_failed = true;
        }
        return BT_OK;
    }
    if (kv_ucx_desc_windowed(kv_ucx_peer_desc(x->peer)))
        return BT_ERR_UNSUPPORTED;
    return BT_OK;
}

static bt_status_t ucx_xfer_layer(kv_link_xfer_base_t *b, int layer)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;
    backend_t *be = x->s->sh->cfg->backend;
    bt_status_t status;

    /* Its decode worker is presumed dead (another hand-off to it timed
     * out): no inline fallback to a dead process; the commit fails and
     * the router retries. */
    if (kv_ucx_peer_abandoned(x->peer) || x->win_failed)
        return BT_OK;
    if (x->win != NULL)
        status = kv_ucx_put_layer_window(
            x->peer, x->win, layer, backend_kv_data(be, layer, 0),
            backend_kv_data(be, layer, 1), backend_kv_layout(be),
            KV_UCX_MEM_HOST, x->src, x->n);
    else
        status = kv_ucx_put_layer(x->peer, layer,
                                  backend_kv_data(be, layer, 0),
                                  backend_kv_data(be, layer, 1),
                                  backend_kv_layout(be), KV_UCX_MEM_HOST,
                                  x->src, x->rt.dst, x->n);
    if (status != BT_OK)
        BT_LOG_WARN("KV", "UCX put of request %llu failed; falling back to "
                    "inline", (unsigned long long)b->request_id);
    return status;
}

/* Commit completion.  The argument is the sender, not the hand-off: one
 * whose hand-off timed out is freed while its commit may still complete,
 * so it is found by (slot, epoch), which a grant never reuses. */
static void commit_cb(void *arg, int slot, uint64_t epoch, bt_status_t status)
{
    ucx_send_t *s = arg;

    for (ucx_xfer_t *x = s->xfers; x; x = x->next) {
        if (x->committing && x->rt.slot == slot && x->rt.epoch == epoch &&
            !x->commit_done) {
            x->commit_done = true;
            x->commit_status = status;
            return;
        }
    }
}

static bt_status_t ucx_xfer_commit(kv_link_xfer_base_t *b)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;

    if (x->win_failed) {
        b->error = "KV receive window of the decode worker could not be "
                   "opened";
        return BT_ERR_NET;
    }
    x->committing = true;
    if ((x->win != NULL
             ? kv_ucx_commit_window(x->peer, x->win, commit_cb, x->s)
             : kv_ucx_commit(x->peer, x->rt.slot, x->rt.epoch, commit_cb,
                             x->s)) == BT_OK)
        return BT_IN_PROGRESS;
    x->committing = false;
    b->error = "KV commit to the decode worker failed";
    return BT_ERR_NET;
}

static bt_status_t ucx_xfer_query(kv_link_xfer_base_t *b)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;

    if (x->commit_done) {
        if (x->commit_status == BT_OK)
            return BT_OK;
        b->error = "KV transfer to the decode worker failed";
        peer_retire(x->s, x->peer);
        return x->commit_status;
    }
    if (kv_ucx_peer_abandoned(x->peer)) {
        /* Another hand-off on this endpoint timed out: this commit waits
         * for the same dead peer.  Its callback (if UCX ever runs it)
         * finds no hand-off: commit_cb matches among the live ones. */
        b->error = "KV hand-off abandoned: the decode worker is presumed "
                   "dead";
        return BT_ERR_NET;
    }
    return BT_IN_PROGRESS;
}

/* Operations the endpoint completed: a commit's flushes wait for every
 * put on the endpoint, other hand-offs' too, so any completion shows the
 * peer alive and this commit coming. */
static uint64_t ucx_xfer_moved(kv_link_xfer_base_t *b)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;

    return x->peer != NULL ? kv_ucx_peer_completed(x->peer) : 0;
}

static void ucx_xfer_abandon(kv_link_xfer_base_t *b)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;

    if (x->peer != NULL)
        peer_abandon(x->s, x->peer);
}

static void ucx_xfer_destroy(kv_link_xfer_base_t *b)
{
    ucx_xfer_t *x = (ucx_xfer_t *)b;

    for (ucx_xfer_t **pp = &x->s->xfers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    }
    kv_ucx_window_close(&x->win); /* before the peer reference goes */
    kv_ucx_disconnect(&x->peer);
    kv_link__remote_cleanup(&x->rt);
    bt_free(x);
}

// ---------------------------------------------------------------------------
// Receiver: the arrival slots, and a window per reservation or the pool

typedef struct {
    kv_link_shared_t *sh;
    kv_ucx_pool_t *pool;
    bool windowed;        /* receive windows (not --kv-direct-writes) */
    kv_link_win_slots_t *slots; /* a window per slot; NULL unless
                                   windowed */
    int n_slots;
} ucx_recv_t;

#define UCX_MAX_LAYERS 1024

static bt_status_t ucx_register(ucx_recv_t *r, backend_t *be)
{
    void *k_layers[UCX_MAX_LAYERS], *v_layers[UCX_MAX_LAYERS];
    const kv_layout_t *lay = backend_kv_layout(be);
    int n_layers = (int)lay->n_layers;

    if (r->windowed)
        return kv_ucx_pool_register_windowed(r->sh->ucx, lay, r->n_slots,
                                             &r->pool);
    if (n_layers > UCX_MAX_LAYERS)
        return BT_ERR_INVALID_ARG;
    for (int l = 0; l < n_layers; l++) {
        k_layers[l] = backend_kv_data(be, l, 0);
        v_layers[l] = backend_kv_data(be, l, 1);
    }
    return kv_ucx_pool_register(r->sh->ucx, lay, k_layers, v_layers,
                                KV_UCX_MEM_HOST, r->n_slots, &r->pool);
}

/* Maps grant g's window; it takes the grant's commit for its slot. */
static bt_status_t ucx_win_create(void *ctx, const kv_link_grant_t *g,
                                  void **win_p)
{
    kv_ucx_window_t *win = NULL;
    bt_status_t status = kv_ucx_window_create(((ucx_recv_t *)ctx)->pool,
                                              g->slot, g->epoch, g->n, &win);

    *win_p = win;
    return status;
}

/* Unmaps a window: a stale key reaches nothing a sequence reads. */
static void ucx_win_destroy(void *win)
{
    kv_ucx_window_t *w = win;

    kv_ucx_window_destroy(&w);
}

/* The prefill worker committed before PrefillDone, so the epoch is
 * normally there; over software RMA this process copies the bytes in
 * during its own progress, hence the bounded progress loop.  A window's
 * commit lands in its slot too. */
static bt_status_t ucx_wait(void *ctx, void *win, int slot, uint64_t epoch)
{
    ucx_recv_t *r = ctx;
    uint64_t until = bt_time_ns() + 2000000000ull;

    while (bt_time_ns() < until) {
        kv_ucx_progress(r->sh->ucx);
        if (kv_ucx_pool_has_arrived(r->pool, slot, epoch))
            return BT_OK;
        kv_ucx_wait(r->sh->ucx, 1);
    }
    return BT_ERR_TIMEOUT;
}

/* The window's blocks into the pool's (host memory: memcpy), after the
 * epoch arrived (acquire) and KvReady's capability was checked. */
static bt_status_t ucx_win_copy_in(void *ctx, void *win, const int *blocks,
                                   int n)
{
    ucx_recv_t *r = ctx;
    backend_t *be = r->sh->backend;
    size_t bb = kv_layout_block_bytes(backend_kv_layout(be));
    int n_layers = (int)backend_kv_layout(be)->n_layers;

    for (int l = 0; l < n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *src = kv_ucx_window_data(win, l, kv);
            uint8_t *dst = backend_kv_data(be, l, kv);
            for (int i = 0; i < n; i++)
                memcpy(dst + (size_t)blocks[i] * bb, src + (size_t)i * bb,
                       bb);
        }
    }
    return BT_OK;
}

static void ucx_win_warn(void *ctx, const kv_link_grant_t *g)
{
    BT_LOG_WARN("KV", "request %llu: no UCX receive window (%s); "
                "KV comes inline", (unsigned long long)g->request_id,
                bt_error_last());
}

static const kv_link_win_ops_t ucx_win_ops = {
    .name = "kv_link_ucx",
    .create = ucx_win_create,
    .destroy = ucx_win_destroy,
    .wait = ucx_wait,
    .copy_in = ucx_win_copy_in,
    .warn = ucx_win_warn,
};

/* Host pools only (device pools go over CUDA IPC or staged). */
static bt_status_t ucx_recv_create(kv_link_shared_t *sh, void **state_p)
{
    backend_t *be = sh->backend;
    ucx_recv_t *r;

    if (be == NULL || sh->kv_on_device || !sh->rcfg->use_ucx)
        return BT_ERR_UNSUPPORTED;
    r = bt_calloc(1, sizeof(*r), "kv_link_ucx");
    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->sh = sh;
    r->windowed = !sh->rcfg->kv_direct_writes;
    r->n_slots = sh->rcfg->n_slots;
    if (r->windowed && kv_link__win_slots_create(&ucx_win_ops, r, r->n_slots,
                                                 &r->slots) != BT_OK) {
        bt_free(r);
        return BT_ERR_NO_MEMORY;
    }
    if (kv_link__ucx_acquire(sh) == NULL) {
        kv_link__win_slots_destroy(&r->slots);
        bt_free(r);
        return BT_ERR_UNSUPPORTED; /* logged */
    }
    if (ucx_register(r, be) != BT_OK) {
        BT_LOG_WARN("KV", "UCX pool registration failed; KV arrives inline");
        kv_link__ucx_release(sh);
        kv_link__win_slots_destroy(&r->slots);
        bt_free(r);
        return BT_ERR_UNSUPPORTED;
    }
    *state_p = r;
    return BT_OK;
}

static void ucx_recv_destroy(void **state_p)
{
    ucx_recv_t *r = *state_p;

    kv_link__win_slots_destroy(&r->slots);
    kv_ucx_pool_deregister(&r->pool);
    kv_link__ucx_release(r->sh);
    bt_free(r);
    *state_p = NULL;
}

static const uint8_t *ucx_recv_desc(void *state, size_t *len_p)
{
    return kv_ucx_pool_desc(((ucx_recv_t *)state)->pool, len_p);
}

/* A reused slot never carries an old arrival.  Windowed: maps the
 * grant's window (a grant that cannot get one goes without: its KV then
 * comes inline, never into the pool; BT_ERR_NO_RESOURCE: refused, it
 * waits for one). */
static bt_status_t ucx_recv_arm(void *state, kv_link_grant_t *g)
{
    ucx_recv_t *r = state;
    void *win;
    bt_status_t status;

    kv_ucx_pool_slot_reset(r->pool, g->slot);
    g->ucx_window = NULL;
    g->ucx_window_len = 0;
    status = kv_link__win_slots_arm(r->slots, g, &win);
    if (win != NULL)
        g->ucx_window = kv_ucx_window_desc(win, &g->ucx_window_len);
    return status;
}

static bool ucx_recv_reset(void *state, int slot, bool writer)
{
    ucx_recv_t *r = state;

    kv_ucx_pool_slot_reset(r->pool, slot);
    return kv_link__win_slots_reset(r->slots, slot, writer);
}

/* Windowed: the window goes into the reservation's blocks once its
 * epoch arrived (ucx_wait). */
static bt_status_t ucx_recv_arrived(void *state, int slot, uint64_t epoch)
{
    ucx_recv_t *r = state;

    if (r->slots != NULL)
        return kv_link__win_slots_arrived(r->slots, slot, epoch);
    return ucx_wait(r, NULL, slot, epoch);
}

static bool ucx_recv_pool_exposed(void *state)
{
    return !((ucx_recv_t *)state)->windowed;
}

const kv_link_ops_t kv_link_ucx_ops = {
    .name = "ucx",
    .id = KV_LINK_UCX,
    .alias = KV_LINK_UCX_SHM,
    .send_create = ucx_send_create,
    .send_destroy = ucx_send_destroy,
    .send_sync = ucx_send_sync,
    .send_reap = ucx_send_reap,
    .xfer_create = ucx_xfer_create,
    .xfer_start = ucx_xfer_start,
    .xfer_layer = ucx_xfer_layer,
    .xfer_commit = ucx_xfer_commit,
    .xfer_query = ucx_xfer_query,
    .xfer_moved = ucx_xfer_moved,
    .xfer_abandon = ucx_xfer_abandon,
    .xfer_destroy = ucx_xfer_destroy,
    .recv_create = ucx_recv_create,
    .recv_destroy = ucx_recv_destroy,
    .recv_desc = ucx_recv_desc,
    .recv_arm = ucx_recv_arm,
    .recv_arrived = ucx_recv_arrived,
    .recv_reset = ucx_recv_reset,
    .recv_pool_exposed = ucx_recv_pool_exposed,
};
