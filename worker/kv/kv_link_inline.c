/*
 * kv_link_inline.c - KV in the control messages: the K and V of every
 * prompt token of the route's range (all but the decode's cached prefix),
 * packed in token order per layer, travel in PrefillDone.kv_inline and
 * KvReady.kv_inline.  No endpoint, no setup; the fallback of every
 * other link, and the only one between a GPU and a CPU pool.
 */
#include "kv/kv_link_int.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_transport_cuda_ipc.h"

typedef struct {
    kv_link_xfer_base_t base;
    const kv_link_config_t *cfg;
    int first;            /* the first token whose KV moves */
    int n_tokens;         /* tokens [first, n_tokens) move */
    int n_layers;
    const int *src;       /* (n_src) local blocks, borrowed */
    int n_src;
    uint8_t **parts;      /* (2 * n_layers) packed K/V per layer */
    size_t row_bytes;     /* one token's K (or V) of one layer, all ranks */
} inline_xfer_t;

static bt_status_t inline_send_create(kv_link_shared_t *sh, void **state_p)
{
    *state_p = sh;
    return BT_OK;
}

/* One token's K (or V) of one layer on one rank: an inline row holds
 * every rank's, whatever either side's TP. */
static size_t inline_rank_row(const kv_layout_t *lay)
{
    return (size_t)lay->n_kv_heads * (size_t)lay->head_dim * lay->elem_size;
}

bt_status_t kv_link__inline_create(const kv_link_shared_t *sh,
                                   const kv_link_route_t *route,
                                   kv_link_xfer_base_t **xfer_p)
{
    const int first = route->first_block * route->dst_block_size;
    const int n = route->n_tokens - first; /* tokens that move */
    inline_xfer_t *x;

    if (first < 0 || n <= 0)
        return BT_ERR_INVALID_ARG;
    if (sh->cfg != NULL && sh->cfg->backend != NULL) {
        /* what pack_layer will pack: every layer's K and V rows */
        backend_t *be = sh->cfg->backend;
        const kv_layout_t *lay = backend_kv_layout(be);
        size_t max = sh->cfg->inline_max_bytes > 0
                         ? sh->cfg->inline_max_bytes
                         : KV_LINK_INLINE_MAX_BYTES;
        double bytes = 2.0 * (double)lay->n_layers *
                       (double)inline_rank_row(lay) *
                       (double)backend_tp_size(be) * (double)n;
        if (bytes > (double)max)
            return BT_ERROR(BT_ERR_NO_RESOURCE, "KV",
                            "request %llu: %d tokens of KV (%.1f MiB) cannot "
                            "go inline (at most %.1f MiB in a control "
                            "message) and no other KV link took them",
                            (unsigned long long)route->request_id, n,
                            bytes / 1048576.0, (double)max / 1048576.0);
    }
    x = bt_calloc(1, sizeof(*x), "kv_link_xfer");
    if (x == NULL)
        return BT_ERR_NO_MEMORY;
    x->cfg = sh->cfg;
    x->first = first;
    x->n_tokens = route->n_tokens;
    x->base.request_id = route->request_id;
    *xfer_p = &x->base;
    return BT_OK;
}

static bt_status_t inline_xfer_create(void *state, const kv_link_route_t *r,
                                      kv_link_xfer_base_t **xfer_p)
{
    return kv_link__inline_create(state, r, xfer_p);
}

static bt_status_t inline_start(kv_link_xfer_base_t *b, const int *src, int n)
{
    inline_xfer_t *x = (inline_xfer_t *)b;

    x->src = src;
    x->n_src = n;
    return BT_OK;
}

/* Copies layer `layer`'s K and V of every prompt token into the inline
 * buffers, in token order. */
static bt_status_t pack_layer(inline_xfer_t *x, int layer)
{
    backend_t *be = x->cfg->backend;
    const kv_layout_t *lay = backend_kv_layout(be);
    /* rank r's `row` bytes go to columns [r row, (r + 1) row) */
    const int tp = backend_tp_size(be);
    size_t row = inline_rank_row(lay);
    size_t full = row * (size_t)tp;

    if (x->parts == NULL) {
        x->n_layers = (int)lay->n_layers;
        x->parts = bt_calloc((size_t)(2 * x->n_layers), sizeof(uint8_t *),
                             "prefill_inline");
        if (x->parts == NULL)
            return BT_ERR_NO_MEMORY;
        x->row_bytes = full;
    }
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *out = bt_malloc(full * (size_t)(x->n_tokens - x->first),
                                 "prefill_inline");
        if (out == NULL)
            return BT_ERR_NO_MEMORY;
        bt_free(x->parts[2 * layer + kv]); /* a repack after a fallback */
        x->parts[2 * layer + kv] = out;
        for (int r = 0; r < tp; r++) {
            const uint8_t *base = backend_kv_data_rank(be, r, layer, kv);
            uint8_t *o = out + (size_t)r * row;
            /* One copy per block: its rows are adjacent on both sides.
             * Token s goes to row s - first. */
            for (int s = x->first; s < x->n_tokens;) {
                int blk = x->src[s / lay->block_size];
                int in = s % lay->block_size;
                int cnt = BT_MIN(lay->block_size - in, x->n_tokens - s);
                size_t off = ((size_t)blk * (size_t)lay->block_size +
                              (size_t)in) * row;
                size_t at = (size_t)(s - x->first);
                if (!x->cfg->kv_on_device)
                    memcpy(o + at * row, base + off, row * (size_t)cnt);
                else if (tp == 1 ? kv_cipc_memcpy(o + at * row,
                                                  base + off,
                                                  row * (size_t)cnt) != BT_OK
                                 : kv_cipc_memcpy2d(o + at * full,
                                                    full, base + off, row,
                                                    row,
                                                    (size_t)cnt) != BT_OK)
                    return BT_ERR_CUDA;
                s += cnt;
            }
        }
    }
    return BT_OK;
}

static bt_status_t inline_layer(kv_link_xfer_base_t *b, int layer)
{
    inline_xfer_t *x = (inline_xfer_t *)b;

    if (x->src == NULL || x->cfg->backend == NULL)
        return BT_OK;
    if (pack_layer(x, layer) != BT_OK)
        BT_LOG_WARN("KV", "out of memory packing KV");
    return BT_OK;
}

static int inline_payload(const kv_link_xfer_base_t *b,
                          uint8_t *const **parts_p, size_t *part_len_p)
{
    const inline_xfer_t *x = (const inline_xfer_t *)b;

    if (x->parts == NULL)
        return 0;
    *parts_p = x->parts;
    *part_len_p = x->row_bytes * (size_t)(x->n_tokens - x->first);
    return 2 * x->n_layers;
}

static void inline_destroy(kv_link_xfer_base_t *b)
{
    inline_xfer_t *x = (inline_xfer_t *)b;

    if (x->parts != NULL) {
        for (int i = 0; i < 2 * x->n_layers; i++)
            bt_free(x->parts[i]);
        bt_free(x->parts);
    }
    bt_free(x);
}

// ---------------------------------------------------------------------------
// Receiver

static bt_status_t inline_recv_create(kv_link_shared_t *sh, void **state_p)
{
    *state_p = sh;
    return BT_OK;
}

/* Inline rows hold every KV head of a token (whatever either side's TP);
 * rank r's pool holds the r-th `row` bytes of each. */
bt_status_t kv_link__inline_unpack(const kv_link_shared_t *sh,
                                   const uint8_t *const *parts,
                                   const size_t *lens, int n_parts,
                                   const int *blocks, int n_blocks, int n)
{
    backend_t *be = sh->backend;
    const kv_layout_t *lay;
    int tp, bs, n_layers;
    size_t row, full;

    if (be == NULL)
        return BT_ERR_FORMAT;
    lay = backend_kv_layout(be);
    tp = backend_tp_size(be);
    bs = (int)lay->block_size;
    n_layers = (int)lay->n_layers;
    row = inline_rank_row(lay);
    full = row * (size_t)tp;
    if (n_parts != 2 * n_layers || BT_DIV_UP(n, bs) > n_blocks)
        return BT_ERR_FORMAT;
    for (int i = 0; i < n_parts; i++)
        if (lens[i] != full * (size_t)n)
            return BT_ERR_FORMAT;
    for (int l = 0; l < n_layers; l++) {
        for (int kv = 0; kv < 2 * tp; kv++) {
            uint8_t *base = backend_kv_data_rank(be, kv / 2, l, kv % 2);
            const uint8_t *src = parts[2 * l + kv % 2] +
                                 (size_t)(kv / 2) * row;
            /* One copy per block: its rows are adjacent on both sides. */
            for (int s = 0; s < n;) {
                int blk = blocks[s / bs];
                int in = s % bs;
                int cnt = BT_MIN(bs - in, n - s);
                size_t off = ((size_t)blk * (size_t)bs + (size_t)in) * row;
                if (!sh->kv_on_device)
                    memcpy(base + off, src + (size_t)s * row,
                           row * (size_t)cnt);
                else if (tp == 1 ? kv_cipc_memcpy(base + off,
                                                  src + (size_t)s * row,
                                                  row * (size_t)cnt) != BT_OK
                                 : kv_cipc_memcpy2d(base + off, row,
                                                    src + (size_t)s * full,
                                                    full, row,
                                                    (size_t)cnt) != BT_OK)
                    return BT_ERR_CUDA;
                s += cnt;
            }
        }
    }
    return BT_OK;
}

const kv_link_ops_t kv_link_inline_ops = {
    .name = "inline",
    .id = KV_LINK_INLINE,
    .alias = KV_LINK_NONE,
    .send_create = inline_send_create,
    .xfer_create = inline_xfer_create,
    .xfer_start = inline_start,
    .xfer_layer = inline_layer,
    .xfer_payload = inline_payload,
    .xfer_destroy = inline_destroy,
    .recv_create = inline_recv_create,
};
