/*
 * kv_link_stage.c - KV over UCX through pinned staging buffers
 * (kv_transport_stage.h): GPU pools on different hosts (or the CPU pool
 * with --kv-stage-host).  Each computed layer is copied to a staging
 * buffer (or, direct, put straight from device memory), put into the
 * decode worker's receive area and committed layer by layer; the decode
 * side copies it into the reserved blocks.
 *
 * Receive windows (issue 42, the default): the decode worker registers no
 * receive area; each grant maps its own window (kv_stage_recv_begin with
 * windows), whose descriptor travels in KvGrant.ucx_window to that task's
 * prefill worker only; the window is unmapped when its KV was copied in
 * or the reservation ends otherwise (counted as revoked), so a stale key
 * reaches nothing the decode worker reads and freed memory needs no
 * quarantine.  --kv-direct-writes keeps the one shared area (and allows
 * the direct mode that registers the device pool itself).
 */
#include "kv/kv_link_int.h"

#include <stddef.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_transport_stage.h"

#define STAGE_MAX_PEERS 64 /* receivers kept connected */

/* A staged receiver this worker keeps connected (its transfers hold
 * their own references, so dropping one here never cuts a hand-off). */
typedef struct {
    kv_stage_peer_t *peer; /* one reference */
    uint8_t *desc;         /* (desc_len) the descriptor it came from */
    size_t desc_len;
    uint64_t last_used;
} stage_held_t;

typedef struct {
    kv_link_shared_t *sh;
    kv_stage_send_t *stage;
    stage_held_t peers[STAGE_MAX_PEERS]; /* (n_peers) */
    int n_peers;
} stage_send_t;

typedef struct {
    kv_link_xfer_base_t base;
    stage_send_t *s;
    kv_link_remote_t rt;       /* endpoint, slot, epoch, where to */
    kv_stage_peer_t *peer;     /* held in s->peers (not owned) */
    kv_stage_xfer_t *xfer;     /* the hand-off, from start on */
    bool failed;               /* a layer could not be queued */
} stage_xfer_t;

// ---------------------------------------------------------------------------
// Held receivers

static void peer_drop_at(stage_send_t *s, int i)
{
    kv_stage_disconnect(&s->peers[i].peer);
    bt_free(s->peers[i].desc);
    s->peers[i] = s->peers[--s->n_peers];
}

/* Drops the held receiver `peer` (a failed hand-off: the next one to
 * that decode worker connects afresh). */
static void peer_drop(stage_send_t *s, const kv_stage_peer_t *peer)
{
    for (int i = 0; i < s->n_peers; i++) {
        if (s->peers[i].peer == peer) {
            peer_drop_at(s, i);
            return;
        }
    }
}

/* The receiver of `desc`, connected once and kept (the first connect
 * costs an endpoint and an rkey unpack).  NULL when it cannot be reached
 * or does not match the local pool; the least recently used one makes
 * room when full. */
static kv_stage_peer_t *peer_hold(stage_send_t *s, const void *desc,
                                  size_t len)
{
    stage_held_t *h;
    kv_stage_peer_t *peer = NULL;

    for (int i = 0; i < s->n_peers; i++) {
        h = &s->peers[i];
        if (h->desc_len == len && memcmp(h->desc, desc, len) == 0) {
            h->last_used = bt_time_ns();
            return h->peer;
        }
    }
    if (kv_stage_connect(s->stage, desc, len, &peer) != BT_OK)
        return NULL;
    if (s->n_peers == STAGE_MAX_PEERS) {
        int lru = 0;
        for (int i = 1; i < s->n_peers; i++)
            if (s->peers[i].last_used < s->peers[lru].last_used)
                lru = i;
        peer_drop_at(s, lru);
    }
    h = &s->peers[s->n_peers];
    h->desc = bt_malloc(len, "prefill_desc");
    if (h->desc == NULL) {
        kv_stage_disconnect(&peer);
        return NULL;
    }
    memcpy(h->desc, desc, len);
    h->desc_len = len;
    h->peer = peer;
    h->last_used = bt_time_ns();
    s->n_peers++;
    BT_LOG_DEBUG("KV", "connected to a staged receiver (%s, %d receive "
                 "blocks)", kv_stage_peer_info(peer)->direct ? "direct"
                                                            : "staged",
                 kv_stage_peer_info(peer)->recv_blocks);
    return peer;
}

// ---------------------------------------------------------------------------
// Sender

/* CUDA copies (or, direct, puts from device memory) for device KV, host
 * memcpys over the CPU pool with --kv-stage-host.  The staged sender
 * reads one pool: not with tp > 1. */
static bt_status_t stage_send_create(kv_link_shared_t *sh, void **state_p)
{
    const kv_link_config_t *cfg = sh->cfg;
    kv_stage_send_config_t sc;
    stage_send_t *s;
    kv_ucx_t *ucx;

    if (cfg->backend == NULL || !cfg->use_ucx ||
        !(cfg->kv_on_device ? cfg->kv_stage : cfg->kv_stage_host) ||
        backend_tp_size(cfg->backend) != 1)
        return BT_ERR_UNSUPPORTED;
    s = bt_calloc(1, sizeof(*s), "kv_link_stage");
    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->sh = sh;
    ucx = kv_link__ucx_acquire(sh);
    if (ucx == NULL) {
        bt_free(s);
        return BT_ERR_UNSUPPORTED; /* logged */
    }
    kv_stage_send_config_init(&sc);
    sc.layout = *backend_kv_layout(cfg->backend);
    sc.stage_blocks = cfg->kv_stage_blocks > 0
                          ? cfg->kv_stage_blocks
                          : BT_DIV_UP(2048, (int)sc.layout.block_size);
    if (cfg->kv_on_device) {
        sc.ops = kv_stage_ops_cuda();
        sc.direct = cfg->kv_stage_direct && kv_stage_ucx_has_cuda();
    } else {
        sc.ops = kv_stage_ops_host(true);
    }
    if (kv_stage_send_create(ucx, &sc, &s->stage) != BT_OK) {
        BT_LOG_WARN("KV", "no staged UCX sender (%s); KV for other hosts "
                    "goes inline", bt_error_last());
        bt_error_clear();
        kv_link__ucx_release(sh);
        bt_free(s);
        return BT_ERR_UNSUPPORTED;
    }
    *state_p = s;
    return BT_OK;
}

static void stage_send_destroy(void **state_p)
{
    stage_send_t *s = *state_p;

    while (s->n_peers > 0)
        peer_drop_at(s, s->n_peers - 1);
    kv_stage_send_destroy(&s->stage); /* bounded wait for orphans */
    kv_link__ucx_release(s->sh);
    bt_free(s);
    *state_p = NULL;
}

/* KvPeers: connects to new receivers now and drops those no longer
 * listed (their decode worker is gone). */
static void stage_send_sync(void *state, const kv_link_endpoint_t *eps,
                            int n)
{
    stage_send_t *s = state;
    kv_stage_peer_t *listed[STAGE_MAX_PEERS];
    int n_listed = 0;

    for (int i = 0; i < n && n_listed < STAGE_MAX_PEERS; i++) {
        kv_stage_peer_t *p = peer_hold(s, eps[i].desc, eps[i].len);
        if (p != NULL)
            listed[n_listed++] = p;
    }
    for (int i = 0; i < s->n_peers;) {
        bool keep = false;
        for (int k = 0; k < n_listed && !keep; k++)
            keep = listed[k] == s->peers[i].peer;
        if (keep)
            i++;
        else
            peer_drop_at(s, i);
    }
}

static bool stage_send_progress(void *state)
{
    stage_send_t *s = state;

    return kv_stage_send_progress(s->stage);
}

// ---------------------------------------------------------------------------
// One hand-off

/* The KV goes to the grant's receive-area ids. */
static bt_status_t stage_xfer_create(void *state, const kv_link_route_t *r,
                                     kv_link_xfer_base_t **xfer_p)
{
    stage_send_t *s = state;
    const kv_layout_t *lay = backend_kv_layout(s->sh->cfg->backend);
    kv_link_xfer_base_t *b;
    stage_xfer_t *x;
    bt_status_t status;

    if (r->n_stage != r->n_dst)
        return BT_ERR_UNSUPPORTED;
    status = kv_link__remote_xfer_create(r, lay, sizeof(*x),
                                         offsetof(stage_xfer_t, rt),
                                         r->stage_blocks, &b);
    if (status != BT_OK)
        return status;
    x = (stage_xfer_t *)b;
    x->s = s;
    *xfer_p = &x->base;
    return BT_OK;
}

/* A receiver with windows takes the KV only through the grant's window
 * (a grant without one goes inline); one whose window is gone (the
 * reservation ended) fails here too: inline then reaches a reservation
 * that no longer exists, which the decode worker refuses. */
static bt_status_t stage_xfer_start(kv_link_xfer_base_t *b, const int *src,
                                    int n)
{
    stage_xfer_t *x = (stage_xfer_t *)b;
    bt_status_t status = BT_ERR_NET;

    x->peer = peer_hold(x->s, x->rt.desc, x->rt.desc_len);
    if (x->peer != NULL && kv_stage_peer_info(x->peer)->windowed)
        status = kv_stage_xfer_begin_window(x->s->stage, x->peer, x->rt.slot,
                                            x->rt.epoch, src, n, x->rt.window,
                                            x->rt.window_len, &x->xfer);
    else if (x->peer != NULL)
        status = kv_stage_xfer_begin(x->s->stage, x->peer, x->rt.slot,
                                     x->rt.epoch, src, x->rt.dst, n,
                                     &x->xfer);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "request %llu: cannot start the staged hand-off; "
                    "KV goes inline", (unsigned long long)b->request_id);
        bt_error_clear();
        return BT_ERR_NET;
    }
    return BT_OK;
}

/* D2H into a staging buffer now (the backend synchronised this layer's
 * K/V first), the put when the copy is done.  A layer that cannot be
 * queued fails the commit (no inline fallback: layers already put). */
static bt_status_t stage_xfer_layer(kv_link_xfer_base_t *b, int layer)
{
    stage_xfer_t *x = (stage_xfer_t *)b;
    backend_t *be = x->s->sh->cfg->backend;
    bt_status_t status = kv_stage_xfer_layer(x->xfer, layer,
                                             backend_kv_data(be, layer, 0),
                                             backend_kv_data(be, layer, 1));

    if (status != BT_OK && !x->failed) {
        BT_LOG_WARN("KV", "request %llu: staged KV of layer %d not queued "
                    "(%s)", (unsigned long long)b->request_id, layer,
                    bt_status_str(status));
        x->failed = true;
    }
    kv_stage_send_progress(x->s->stage);
    return BT_OK;
}

/* Each layer commits itself; the hand-off waits for the last. */
static bt_status_t stage_xfer_commit(kv_link_xfer_base_t *b)
{
    stage_xfer_t *x = (stage_xfer_t *)b;
    bt_status_t st = kv_stage_xfer_status(x->xfer);

    if (st != BT_IN_PROGRESS && st != BT_OK)
        x->failed = true;
    if (!x->failed)
        return BT_IN_PROGRESS;
    b->error = "staged KV transfer to the decode worker failed";
    peer_drop(x->s, x->peer);
    return BT_ERR_NET;
}

static bt_status_t stage_xfer_query(kv_link_xfer_base_t *b)
{
    stage_xfer_t *x = (stage_xfer_t *)b;
    bt_status_t status = kv_stage_xfer_status(x->xfer);

    if (status != BT_OK && status != BT_IN_PROGRESS) {
        b->error = "KV transfer to the decode worker failed";
        peer_drop(x->s, x->peer);
    }
    return status;
}

static uint64_t stage_xfer_moved(kv_link_xfer_base_t *b)
{
    return kv_stage_xfer_landed(((stage_xfer_t *)b)->xfer);
}

/* Its staging buffers would wait for the dead peer forever (the transfer
 * still holds the peer). */
static void stage_xfer_abandon(kv_link_xfer_base_t *b)
{
    stage_xfer_t *x = (stage_xfer_t *)b;

    if (x->peer == NULL)
        return;
    kv_stage_peer_abandon(x->peer);
    peer_drop(x->s, x->peer);
    x->peer = NULL;
}

/* A transfer still in flight is cancelled: nothing more is put, and
 * chunks already staged finish on their own.  The local blocks may be
 * freed already: a D2H copy of a cancelled chunk may still read them,
 * but its bytes are never put, so a new task's KV is never harmed. */
static void stage_xfer_destroy(kv_link_xfer_base_t *b)
{
    stage_xfer_t *x = (stage_xfer_t *)b;

    kv_stage_xfer_destroy(&x->xfer);
    kv_link__remote_cleanup(&x->rt);
    bt_free(x);
}

// ---------------------------------------------------------------------------
// Receiver: the receive area

typedef struct {
    kv_link_shared_t *sh;
    kv_stage_recv_t *recv;
    bool windows;         /* a receive window per reservation */
    bool direct;          /* the device pool itself is registered */
    int n_slots;
    bool *staged;         /* (n_slots) the slot holds receive blocks */
    uint64_t *quar_ns;    /* (n_slots) when the receive blocks a cancel
                             of slot i quarantined are released (0: none) */
} stage_recv_t;

static void stage_recv_free(stage_recv_t *r)
{
    kv_stage_recv_destroy(&r->recv);
    bt_free(r->staged);
    bt_free(r->quar_ns);
    bt_free(r);
}

/* The staged receiver writes one pool: not with tp > 1 (KV from other
 * hosts then arrives inline). */
static bt_status_t stage_recv_create(kv_link_shared_t *sh, void **state_p)
{
    const kv_link_recv_config_t *cfg = sh->rcfg;
    backend_t *be = sh->backend;
    kv_stage_recv_config_t rc;
    stage_recv_t *r;
    void **layers;
    int n_layers, block_size, prompt_blocks;
    bt_status_t status;

    if (be == NULL || !cfg->use_ucx ||
        !(sh->kv_on_device ? cfg->kv_stage : cfg->kv_stage_host) ||
        backend_tp_size(be) != 1)
        return BT_ERR_UNSUPPORTED;
    n_layers = (int)backend_kv_layout(be)->n_layers;
    block_size = (int)backend_kv_layout(be)->block_size;
    prompt_blocks = BT_DIV_UP(sh->max_context, block_size);
    r = bt_calloc(1, sizeof(*r), "kv_link_stage");
    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->sh = sh;
    r->n_slots = cfg->n_slots;
    r->staged = bt_calloc((size_t)cfg->n_slots, sizeof(bool), "decode_resv");
    r->quar_ns = bt_calloc((size_t)cfg->n_slots, sizeof(uint64_t),
                           "decode_resv");
    layers = bt_calloc((size_t)n_layers, 2 * sizeof(void *), "decode_layers");
    if (r->staged == NULL || r->quar_ns == NULL || layers == NULL) {
        bt_free(layers);
        stage_recv_free(r);
        return BT_ERR_NO_MEMORY;
    }
    if (kv_link__ucx_acquire(sh) == NULL) {
        bt_free(layers);
        stage_recv_free(r);
        return BT_ERR_UNSUPPORTED; /* logged */
    }
    for (int l = 0; l < n_layers; l++) {
        layers[l] = backend_kv_data(be, l, 0);
        layers[n_layers + l] = backend_kv_data(be, l, 1);
    }
    kv_stage_recv_config_init(&rc);
    rc.layout = *backend_kv_layout(be);
    rc.k_layers = layers;
    rc.v_layers = layers + n_layers;
    rc.recv_blocks = cfg->kv_stage_blocks > 0
                         ? cfg->kv_stage_blocks
                         : BT_MIN((int)rc.layout.n_blocks, 4 * prompt_blocks);
    rc.n_slots = cfg->n_slots;
    if (sh->kv_on_device) {
        rc.ops = kv_stage_ops_cuda();
        rc.direct = cfg->kv_stage_direct && kv_stage_ucx_has_cuda();
    } else {
        rc.ops = kv_stage_ops_host(true);
    }
    /* Direct receive registers the device pool itself: a writer's key
     * then reaches every block for the pool's life, which only
     * --kv-direct-writes accepts; otherwise windows, staged. */
    rc.windows = !cfg->kv_direct_writes;
    if (rc.direct && rc.windows) {
        BT_LOG_INFO("KV", "staged receiver: receive windows; direct "
                    "receive into the device pool needs --kv-direct-writes");
        rc.direct = false;
    }
    r->windows = rc.windows;
    r->direct = rc.direct;
    status = kv_stage_recv_create(sh->ucx, &rc, &r->recv);
    bt_free(layers);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "no staged UCX receiver (%s); KV from other hosts "
                    "arrives inline", bt_error_last());
        bt_error_clear();
        kv_link__ucx_release(sh);
        stage_recv_free(r);
        return BT_ERR_UNSUPPORTED;
    }
    *state_p = r;
    return BT_OK;
}

static void stage_recv_destroy(void **state_p)
{
    stage_recv_t *r = *state_p;
    kv_link_shared_t *sh = r->sh;

    stage_recv_free(r);
    kv_link__ucx_release(sh);
    *state_p = NULL;
}

static const uint8_t *stage_recv_desc(void *state, size_t *len_p)
{
    return kv_stage_recv_desc(((stage_recv_t *)state)->recv, len_p);
}

/* Receive-area blocks next to the reserved ones, only when asked (they
 * are scarce).  The area holds the hand-offs in flight: when it is full
 * the grant waits (BT_ERR_NO_RESOURCE); any other failure grants
 * without, and the router picks another link. */
static bt_status_t stage_recv_arm(void *state, kv_link_grant_t *g)
{
    stage_recv_t *r = state;
    bt_status_t st;

    if (!g->want_recv_area || g->slot < 0 || g->slot >= r->n_slots)
        return BT_OK;
    st = kv_stage_recv_begin(r->recv, g->slot, g->epoch, g->blocks, g->n,
                             g->recv_ids);
    if (st == BT_ERR_NO_RESOURCE)
        return st;
    if (st != BT_OK) {
        BT_LOG_WARN("KV", "request %llu: no staged receive blocks (%s)",
                    (unsigned long long)g->request_id, bt_status_str(st));
        bt_error_clear();
        return BT_OK;
    }
    r->staged[g->slot] = true;
    g->has_recv_ids = true;
    /* its window travels in the grant (the UCX link maps none when a
     * receive area was asked for) */
    if (r->windows)
        g->ucx_window = kv_stage_recv_window(r->recv, g->slot,
                                             &g->ucx_window_len);
    return BT_OK;
}

/* Every layer was committed before PrefillDone; its copies to the pool
 * may still run (BT_IN_PROGRESS). */
static bt_status_t stage_recv_arrived(void *state, int slot, uint64_t epoch)
{
    stage_recv_t *r = state;

    (void)epoch; /* the receiver checks each layer's */
    if (slot < 0 || slot >= r->n_slots || !r->staged[slot])
        return BT_ERR_INVALID_ARG;
    return kv_stage_recv_poll(r->recv, slot);
}

/* A slot whose KV did not all arrive may still have a writer.  With
 * windows its window is unmapped now (the key revoked: true when that
 * writer may still hold it) and nothing waits; with the shared area its
 * receive blocks stay quarantined for the quarantine time
 * (kv_stage_recv_cancel); when no writer can exist they are free now. */
static bool stage_recv_reset(void *state, int slot, bool writer)
{
    stage_recv_t *r = state;
    int q_ms = r->sh->rcfg->quarantine_ms;
    bool done, revoked;

    if (slot < 0 || slot >= r->n_slots || !r->staged[slot])
        return false;
    done = kv_stage_recv_poll(r->recv, slot) == BT_OK;
    revoked = kv_stage_recv_cancel(r->recv, slot); /* waits for copies */
    if (!done && writer && q_ms > 0 && !r->windows)
        r->quar_ns[slot] = bt_time_ns() + (uint64_t)q_ms * 1000000ull;
    else if (r->quar_ns[slot] == 0)
        kv_stage_recv_release_quarantine(r->recv, slot);
    /* else: an older cancel's quarantine releases these with it */
    r->staged[slot] = false;
    return revoked && writer;
}

/* The shared area (--kv-direct-writes) and direct receive expose memory
 * a writer keeps a key to; windows expose nothing that outlives its
 * reservation. */
static bool stage_recv_pool_exposed(void *state)
{
    stage_recv_t *r = state;

    return r->direct || !r->windows;
}

static bool stage_recv_progress(void *state)
{
    return kv_stage_recv_progress(((stage_recv_t *)state)->recv);
}

static void stage_recv_expire(void *state, uint64_t now)
{
    stage_recv_t *r = state;

    for (int i = 0; i < r->n_slots; i++) {
        if (r->quar_ns[i] != 0 && now > r->quar_ns[i]) {
            kv_stage_recv_release_quarantine(r->recv, i);
            r->quar_ns[i] = 0;
        }
    }
}

const kv_link_ops_t kv_link_stage_ops = {
    .name = "ucx-stage",
    .id = KV_LINK_UCX_STAGE,
    .alias = -1,
    .spins = true,
    .send_create = stage_send_create,
    .send_destroy = stage_send_destroy,
    .send_sync = stage_send_sync,
    .send_progress = stage_send_progress,
    .xfer_create = stage_xfer_create,
    .xfer_start = stage_xfer_start,
    .xfer_layer = stage_xfer_layer,
    .xfer_commit = stage_xfer_commit,
    .xfer_query = stage_xfer_query,
    .xfer_moved = stage_xfer_moved,
    .xfer_abandon = stage_xfer_abandon,
    .xfer_destroy = stage_xfer_destroy,
    .recv_create = stage_recv_create,
    .recv_destroy = stage_recv_destroy,
    .recv_desc = stage_recv_desc,
    .recv_arm = stage_recv_arm,
    .recv_arrived = stage_recv_arrived,
    .recv_reset = stage_recv_reset,
    .recv_pool_exposed = stage_recv_pool_exposed,
    .recv_progress = stage_recv_progress,
    .recv_expire = stage_recv_expire,
};
