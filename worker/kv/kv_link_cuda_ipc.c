/*
 * kv_link_cuda_ipc.c - KV as device-to-device copies into a decode
 * worker's GPU memory mapped over CUDA IPC (kv_transport_cuda_ipc.h): same
 * host, GPUs that can reach each other.  Each computed layer's blocks are
 * copied on a stream of their own (re-sharded when prefill and decode
 * TP differ), and the commit writes the grant's epoch after them.
 *
 * By default the decode worker exports no pool: each grant gets its own
 * window (a device allocation handed as an FD for the grant's token,
 * KvGrant.cipc_window), the prefill worker copies into it, and on KvReady
 * the decode worker copies it into the reservation's blocks and frees it;
 * a reservation that ends otherwise frees it at once (revoked, counted).
 * --kv-direct-writes exports the whole pool once instead (the old mode:
 * freed blocks then wait in quarantine).
 */
#include "kv/kv_link_int.h"

#include <stddef.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_reshard.h"
#include "kv/kv_transport_cuda_ipc.h"

#define CIPC_MAX_POOLS 64 /* decode pools kept mapped */

typedef struct {
    const kv_link_config_t *cfg;
    kv_cipc_t *cipc;            /* the copy stream on rank 0's GPU */
} cipc_send_t;

typedef struct {
    kv_link_xfer_base_t base;
    cipc_send_t *s;
    kv_link_remote_t rt;       /* endpoint, slot, epoch, where to */
    kv_cipc_peer_t *peer;       /* mapped decode pool (one reference) */
    kv_cipc_peer_t *win;        /* windowed: this grant's window, where the
                                   copies and the commit go; else NULL */
    int *win_ids;               /* (n) 0..n-1: the window's blocks */
    kv_cipc_commit_t *commit;   /* in flight after the commit */
    const int *src;             /* (n) */
    int n;
} cipc_xfer_t;

static bt_status_t cipc_send_create(kv_link_shared_t *sh, void **state_p)
{
    const kv_link_config_t *cfg = sh->cfg;
    cipc_send_t *s;
    bool ok;

    if (cfg->backend == NULL || !cfg->kv_on_device || !cfg->use_cuda_ipc)
        return BT_ERR_UNSUPPORTED;
    s = bt_calloc(1, sizeof(*s), "kv_link_cipc");
    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->cfg = cfg;
    /* the copy stream on rank 0's GPU; the other ranks' pools are read
     * from there over peer access */
    ok = kv_cipc_create_on(cfg->device_index, &s->cipc) == BT_OK;
    for (int r = 1; ok && r < backend_tp_size(cfg->backend); r++)
        ok = kv_cipc_add_source(s->cipc, cfg->device_index + r) == BT_OK;
    if (!ok) {
        kv_cipc_destroy(&s->cipc);
        bt_free(s);
        BT_LOG_WARN("KV", "CUDA IPC unavailable; KV goes inline");
        return BT_ERR_UNSUPPORTED;
    }
    *state_p = s;
    return BT_OK;
}

static void cipc_send_destroy(void **state_p)
{
    cipc_send_t *s = *state_p;

    kv_cipc_destroy(&s->cipc);
    bt_free(s);
    *state_p = NULL;
}

/* KvPeers: maps new device pools now (off the critical path) and unmaps
 * those of decode workers that left (frees their memory). */
static void cipc_send_sync(void *state, const kv_link_endpoint_t *eps, int n)
{
    cipc_send_t *s = state;
    uint64_t ids[CIPC_MAX_POOLS];
    int n_ids = 0;

    for (int i = 0; i < n && n_ids < CIPC_MAX_POOLS; i++) {
        kv_cipc_peer_t *cp = NULL;
        if (kv_cipc_connect(s->cipc, eps[i].desc, eps[i].len, &cp) != BT_OK)
            continue;
        ids[n_ids++] = kv_cipc_peer_desc(cp)->pool_id;
        kv_cipc_release(&cp);
    }
    kv_cipc_retire_unlisted(s->cipc, ids, n_ids);
}

static bt_status_t cipc_xfer_create(void *state, const kv_link_route_t *r,
                                    kv_link_xfer_base_t **xfer_p)
{
    cipc_send_t *s = state;
    const kv_layout_t *lay = backend_kv_layout(s->cfg->backend);
    kv_link_xfer_base_t *b;
    cipc_xfer_t *x;
    bt_status_t status = kv_link__remote_xfer_create(
        r, lay, sizeof(*x), offsetof(cipc_xfer_t, rt), r->dst_blocks, &b);

    if (status != BT_OK)
        return status;
    x = (cipc_xfer_t *)b;
    x->s = s;
    *xfer_p = &x->base;
    return BT_OK;
}

static bt_status_t cipc_xfer_start(kv_link_xfer_base_t *b, const int *src,
                                   int n)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;
    bt_status_t status;

    x->src = src;
    x->n = n;
    status = kv_cipc_connect(x->s->cipc, x->rt.desc, x->rt.desc_len, &x->peer);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "request %llu: cannot map the decode pool over "
                    "CUDA IPC; KV goes inline",
                    (unsigned long long)b->request_id);
        bt_error_clear();
        return status;
    }
    if (!kv_cipc_peer_is_windowed(x->peer))
        return BT_OK;
    /* windowed: only this grant's window takes the copies; a grant
     * without one (the budget was spent) goes inline */
    if (!x->rt.has_cipc_window || n < 1) {
        BT_LOG_WARN("KV", "request %llu: no CUDA IPC window in the grant; "
                    "KV goes inline", (unsigned long long)b->request_id);
        return BT_ERR_UNSUPPORTED;
    }
    x->win_ids = bt_malloc((size_t)n * sizeof(int), "kv_link_cipc");
    if (x->win_ids == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++)
        x->win_ids[i] = i;
    status = kv_cipc_window_open(x->peer, x->rt.cipc_window,
                                 sizeof(x->rt.cipc_window), n, &x->win);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "request %llu: cannot open the CUDA IPC window "
                    "(%s); KV goes inline", (unsigned long long)b->request_id,
                    bt_error_last());
        bt_error_clear();
    }
    return status;
}

/* Every prefill rank's heads into the decode rank(s) holding them
 * (kv_reshard: prefill and decode TP may differ). */
static bt_status_t cipc_xfer_layer(kv_link_xfer_base_t *b, int layer)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;
    backend_t *be = x->s->cfg->backend;
    int tp = backend_tp_size(be);
    bt_status_t status = BT_OK;

    for (int r = 0; r < tp && status == BT_OK; r++) {
        kv_reshard_side_t src = kv_reshard_side_rank(backend_kv_layout(be),
                                                     tp, r);
        status = kv_cipc_put_layer_ranks(
            x->win != NULL ? x->win : x->peer, layer,
            backend_kv_data_rank(be, r, layer, 0),
            backend_kv_data_rank(be, r, layer, 1), &src, x->src,
            x->win != NULL ? x->win_ids : x->rt.dst, x->n);
    }
    if (status != BT_OK)
        BT_LOG_WARN("KV", "CUDA IPC copy of request %llu failed; falling "
                    "back to inline", (unsigned long long)b->request_id);
    return status;
}

static bt_status_t cipc_xfer_commit(kv_link_xfer_base_t *b)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;

    /* a window's epoch word is its slot 0 */
    if (kv_cipc_commit(x->win != NULL ? x->win : x->peer,
                       x->win != NULL ? 0 : x->rt.slot, x->rt.epoch,
                       &x->commit) == BT_OK)
        return BT_IN_PROGRESS;
    b->error = "KV commit over CUDA IPC failed";
    return BT_ERR_CUDA;
}

static bt_status_t cipc_xfer_query(kv_link_xfer_base_t *b)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;
    bt_status_t status = kv_cipc_commit_query(x->commit);

    if (status != BT_OK && status != BT_IN_PROGRESS)
        b->error = "KV transfer to the decode worker failed";
    return status;
}

static void cipc_xfer_destroy(kv_link_xfer_base_t *b)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;

    kv_cipc_commit_destroy(&x->commit);
    kv_cipc_window_close(&x->win); /* after its copies: our reference */
    bt_free(x->win_ids);
    kv_cipc_release(&x->peer);
    kv_link__remote_cleanup(&x->rt);
    bt_free(x);
}

// ---------------------------------------------------------------------------
// Receiver: a window per grant, or (--kv-direct-writes) the exported pool

/* Windows may take this many full-context prompts' worth of device
 * memory at once (capped at half the device memory free at start). */
#define CIPC_WINDOW_PROMPTS 4

typedef struct {
    kv_link_shared_t *sh;
    kv_cipc_pool_t *pool;
    bool windowed;
    kv_link_win_slots_t *slots; /* a window per slot; windowed only */
} cipc_recv_t;

/* The whole-pool export (--kv-direct-writes): one pool per TP rank
 * (descriptor version 2 when tp > 1): k_layers[r * n_layers + l], then
 * the V bases alike. */
static bt_status_t export_pool(kv_link_shared_t *sh, kv_cipc_pool_t **pool_p)
{
    backend_t *be = sh->backend;
    const kv_layout_t *lay = backend_kv_layout(be);
    int devices[KV_CIPC_MAX_RANKS];
    int tp = backend_tp_size(be), nl = (int)lay->n_layers;
    void **k_layers;
    bt_status_t status = BT_ERR_UNSUPPORTED;

    k_layers = bt_calloc((size_t)nl * (size_t)tp, 2 * sizeof(void *),
                         "decode_layers");
    if (k_layers == NULL)
        return BT_ERR_NO_MEMORY;
    for (int r = 0; r < tp; r++) {
        if (r < KV_CIPC_MAX_RANKS)
            devices[r] = sh->rcfg->device_index + r;
        for (int l = 0; l < nl; l++) {
            k_layers[(size_t)r * nl + l] = backend_kv_data_rank(be, r, l, 0);
            k_layers[(size_t)(tp + r) * nl + l] =
                backend_kv_data_rank(be, r, l, 1);
        }
    }
    if (tp <= KV_CIPC_MAX_RANKS &&
        kv_cipc_pool_export_ranks(lay, tp, k_layers,
                                  k_layers + (size_t)tp * nl, devices,
                                  sh->rcfg->n_slots, pool_p) == BT_OK)
        status = BT_OK;
    else
        BT_LOG_WARN("KV", "CUDA IPC export failed; KV arrives inline");
    bt_free(k_layers);
    return status;
}

/* Windows: the FD channel and a descriptor naming it; fails closed (one
 * line) where the driver cannot export FDs or TP > 1. */
static bt_status_t export_windowed(kv_link_shared_t *sh,
                                   kv_cipc_pool_t **pool_p)
{
    backend_t *be = sh->backend;
    const kv_layout_t *lay = backend_kv_layout(be);
    int dev = sh->rcfg->device_index;
    size_t prompt = kv_cipc_window_data_bytes(
        lay, BT_MAX(BT_DIV_UP(sh->max_context, (int)lay->block_size), 1));
    bt_status_t status;

    if (backend_tp_size(be) != 1) {
        BT_LOG_WARN("KV", "CUDA IPC windows need one GPU per decode worker "
                    "(tp %d): the cuda-ipc link is off, KV goes over UCX or "
                    "inline (--kv-direct-writes exports the whole pool)",
                    backend_tp_size(be));
        return BT_ERR_UNSUPPORTED;
    }
    status = kv_cipc_pool_export_windowed(lay, dev,
                                          CIPC_WINDOW_PROMPTS * prompt,
                                          pool_p);
    if (status == BT_ERR_UNSUPPORTED)
        BT_LOG_WARN("KV", "CUDA IPC windows need the driver's POSIX file "
                    "descriptor handles, which device %d does not offer: "
                    "the cuda-ipc link is off, KV goes over UCX or inline "
                    "(--kv-direct-writes exports the whole pool)", dev);
    else if (status != BT_OK)
        BT_LOG_WARN("KV", "CUDA IPC windowed export failed; KV arrives "
                    "inline");
    return status;
}

/* A device allocation of the window budget, handed as an FD for the
 * grant's token (BT_ERR_NO_RESOURCE: the budget is spent for now). */
static bt_status_t cipc_win_create(void *ctx, const kv_link_grant_t *g,
                                   void **win_p)
{
    kv_cipc_window_t *win = NULL;
    bt_status_t status =
        kv_cipc_window_create(((cipc_recv_t *)ctx)->pool, g->n, &win);

    *win_p = win;
    return status;
}

/* A live window's writer loses the token's FD and writes only into an
 * orphaned allocation. */
static void cipc_win_destroy(void *win)
{
    kv_cipc_window_t *w = win;

    kv_cipc_window_destroy(&w);
}

/* The prefill worker wrote the epoch after its copies and waited for
 * them before PrefillDone, so the flag is normally set at once; a
 * bounded wait covers a reordered control message. */
static bt_status_t cipc_wait(void *ctx, void *win, int slot, uint64_t epoch)
{
    cipc_recv_t *r = ctx;
    uint64_t until = bt_time_ns() + 2000000000ull;

    for (;;) {
        bool arrived = false;
        bt_status_t status =
            win != NULL ? kv_cipc_window_has_arrived(win, epoch, &arrived)
                        : kv_cipc_pool_has_arrived(r->pool, slot, epoch,
                                                   &arrived);
        if (status != BT_OK)
            return BT_ERR_CUDA;
        if (arrived)
            return BT_OK;
        if (bt_time_ns() > until)
            return BT_ERR_TIMEOUT;
        usleep(200);
    }
}

/* The window into the reservation's blocks: a device copy queued on
 * the backend's copy stream; the window's release waits for it. */
static bt_status_t cipc_win_copy_in(void *ctx, void *win, const int *blocks,
                                    int n)
{
    cipc_recv_t *r = ctx;
    void *reader = kv_cipc_window_read_begin(win);

    if (backend_kv_copy_in(r->sh->backend, kv_cipc_window_data(win), n,
                           blocks, kv_cipc_window_read_done,
                           reader) != BT_OK) {
        kv_cipc_window_read_done(reader); /* nothing reads it now */
        return BT_ERR_CUDA;
    }
    return BT_OK;
}

static void cipc_win_warn(void *ctx, const kv_link_grant_t *g)
{
    BT_LOG_WARN("KV", "request %llu: no CUDA IPC window (%s); its "
                "KV comes another way",
                (unsigned long long)g->request_id, bt_error_last());
}

static const kv_link_win_ops_t cipc_win_ops = {
    .name = "kv_link_cipc",
    .create = cipc_win_create,
    .destroy = cipc_win_destroy,
    .wait = cipc_wait,
    .copy_in = cipc_win_copy_in,
    .warn = cipc_win_warn,
};

static bt_status_t cipc_recv_create(kv_link_shared_t *sh, void **state_p)
{
    cipc_recv_t *r;
    bt_status_t status;

    if (sh->backend == NULL || !sh->kv_on_device || !sh->rcfg->use_cuda_ipc)
        return BT_ERR_UNSUPPORTED;
    r = bt_calloc(1, sizeof(*r), "kv_link_cipc");
    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->sh = sh;
    r->windowed = !sh->rcfg->kv_direct_writes;
    if (r->windowed) {
        if (kv_link__win_slots_create(&cipc_win_ops, r, sh->rcfg->n_slots,
                                      &r->slots) != BT_OK) {
            bt_free(r);
            return BT_ERR_NO_MEMORY;
        }
        status = export_windowed(sh, &r->pool);
    } else {
        status = export_pool(sh, &r->pool);
    }
    if (status != BT_OK) {
        kv_link__win_slots_destroy(&r->slots);
        bt_free(r);
        return status == BT_ERR_NO_MEMORY ? status : BT_ERR_UNSUPPORTED;
    }
    *state_p = r;
    return BT_OK;
}

static void cipc_recv_destroy(void **state_p)
{
    cipc_recv_t *r = *state_p;

    kv_link__win_slots_destroy(&r->slots);
    kv_cipc_pool_destroy(&r->pool);
    bt_free(r);
    *state_p = NULL;
}

static const uint8_t *cipc_recv_desc(void *state, size_t *len_p)
{
    return kv_cipc_pool_desc(((cipc_recv_t *)state)->pool, len_p);
}

/* A reused slot never carries an old arrival.  Windowed: makes the
 * grant's window (a grant that cannot get one goes without: its KV then
 * comes another way, never into the pool). */
static bt_status_t cipc_recv_arm(void *state, kv_link_grant_t *g)
{
    cipc_recv_t *r = state;
    void *win;
    bt_status_t status;

    g->cipc_window = NULL;
    g->cipc_window_len = 0;
    if (!r->windowed) {
        kv_cipc_pool_slot_reset(r->pool, g->slot);
        return BT_OK;
    }
    /* forgets what was copied in even when the grant gets no window */
    kv_link__win_slots_reset(r->slots, g->slot, false);
    status = kv_link__win_slots_arm(r->slots, g, &win);
    if (win != NULL)
        g->cipc_window = kv_cipc_window_grant(win, &g->cipc_window_len);
    return status; /* BT_ERR_NO_RESOURCE: the grant waits for a window */
}

static bool cipc_recv_reset(void *state, int slot, bool writer)
{
    cipc_recv_t *r = state;

    if (!r->windowed) {
        kv_cipc_pool_slot_reset(r->pool, slot);
        return false; /* the pool's one IPC handle: nothing to revoke */
    }
    return kv_link__win_slots_reset(r->slots, slot, writer);
}

/* Windowed: the window goes into the reservation's blocks once its
 * epoch arrived (cipc_wait), and is freed. */
static bt_status_t cipc_recv_arrived(void *state, int slot, uint64_t epoch)
{
    cipc_recv_t *r = state;

    if (r->windowed)
        return kv_link__win_slots_arrived(r->slots, slot, epoch);
    return cipc_wait(r, NULL, slot, epoch);
}

static bool cipc_recv_pool_exposed(void *state)
{
    return !((cipc_recv_t *)state)->windowed;
}

const kv_link_ops_t kv_link_cuda_ipc_ops = {
    .name = "cuda-ipc",
    .id = KV_LINK_CUDA_IPC,
    .alias = -1,
    .spins = true,
    .send_create = cipc_send_create,
    .send_destroy = cipc_send_destroy,
    .send_sync = cipc_send_sync,
    .xfer_create = cipc_xfer_create,
    .xfer_start = cipc_xfer_start,
    .xfer_layer = cipc_xfer_layer,
    .xfer_commit = cipc_xfer_commit,
    .xfer_query = cipc_xfer_query,
    .xfer_destroy = cipc_xfer_destroy,
    .recv_create = cipc_recv_create,
    .recv_destroy = cipc_recv_destroy,
    .recv_desc = cipc_recv_desc,
    .recv_arm = cipc_recv_arm,
    .recv_arrived = cipc_recv_arrived,
    .recv_reset = cipc_recv_reset,
    .recv_pool_exposed = cipc_recv_pool_exposed,
};
