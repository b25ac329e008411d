/*
 * kv_link_cuda_ipc.c - KV as device-to-device copies into a decode
 * worker's GPU pool mapped over CUDA IPC (kv_transport_cuda_ipc.h): same
 * host, GPUs that can reach each other.  Each computed layer's blocks are
 * copied on a stream of their own (re-sharded when prefill and decode
 * TP differ), and the commit writes the grant's epoch after them.
 */
#include "kv/kv_link_int.h"

#include <stddef.h>
#include <string.h>
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
            x->peer, layer, backend_kv_data_rank(be, r, layer, 0),
            backend_kv_data_rank(be, r, layer, 1), &src, x->src, x->rt.dst,
            x->n);
    }
    if (status != BT_OK)
        BT_LOG_WARN("KV", "CUDA IPC copy of request %llu failed; falling "
                    "back to inline", (unsigned long long)b->request_id);
    return status;
}

static bt_status_t cipc_xfer_commit(kv_link_xfer_base_t *b)
{
    cipc_xfer_t *x = (cipc_xfer_t *)b;

    if (kv_cipc_commit(x->peer, x->rt.slot, x->rt.epoch, &x->commit) == BT_OK)
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
    kv_cipc_release(&x->peer);
    kv_link__remote_cleanup(&x->rt);
    bt_free(x);
}

// ---------------------------------------------------------------------------
// Receiver: the exported device pool

/* One pool per TP rank (descriptor version 2 when tp > 1):
 * k_layers[r * n_layers + l], then the V bases alike. */
static bt_status_t cipc_recv_create(kv_link_shared_t *sh, void **state_p)
{
    backend_t *be = sh->backend;
    const kv_layout_t *lay;
    kv_cipc_pool_t *pool = NULL;
    int devices[KV_CIPC_MAX_RANKS];
    int tp, nl;
    void **k_layers;
    bt_status_t status = BT_ERR_UNSUPPORTED;

    if (be == NULL || !sh->kv_on_device || !sh->rcfg->use_cuda_ipc)
        return BT_ERR_UNSUPPORTED;
    lay = backend_kv_layout(be);
    tp = backend_tp_size(be);
    nl = (int)lay->n_layers;
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
                                  sh->rcfg->n_slots, &pool) == BT_OK)
        status = BT_OK;
    else
        BT_LOG_WARN("KV", "CUDA IPC export failed; KV arrives inline");
    bt_free(k_layers);
    if (status == BT_OK)
        *state_p = pool;
    return status;
}

static void cipc_recv_destroy(void **state_p)
{
    kv_cipc_pool_t *pool = *state_p;

    kv_cipc_pool_destroy(&pool);
    *state_p = NULL;
}

static const uint8_t *cipc_recv_desc(void *state, size_t *len_p)
{
    return kv_cipc_pool_desc(state, len_p);
}

static bt_status_t cipc_recv_arm(void *state, kv_link_grant_t *g)
{
    kv_cipc_pool_slot_reset(state, g->slot);
    return BT_OK;
}

static bool cipc_recv_reset(void *state, int slot, bool writer)
{
    (void)writer;
    kv_cipc_pool_slot_reset(state, slot);
    return false; /* the pool's one IPC handle: nothing to revoke */
}

/* The prefill worker wrote the epoch after its copies and waited for
 * them before PrefillDone, so the flag is normally set at once; a
 * bounded wait covers a reordered control message. */
static bt_status_t cipc_recv_arrived(void *state, int slot, uint64_t epoch)
{
    uint64_t until = bt_time_ns() + 2000000000ull;

    for (;;) {
        bool arrived = false;
        if (kv_cipc_pool_has_arrived(state, slot, epoch, &arrived) != BT_OK)
            return BT_ERR_CUDA;
        if (arrived)
            return BT_OK;
        if (bt_time_ns() > until)
            return BT_ERR_TIMEOUT;
        usleep(200);
    }
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
};
