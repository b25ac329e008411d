/*
 * kv_reshard.c - copy plans between KV pools holding different head
 * ranges (see kv_reshard.h).
 */
#include "kv/kv_reshard.h"

#include <stdbool.h>
#include <string.h>

#include "bt_error.h"

kv_reshard_side_t kv_reshard_side_whole(const kv_layout_t *layout)
{
    kv_reshard_side_t s;

    s.n_heads_total = layout->n_kv_heads;
    s.head0 = 0;
    s.layout = *layout;
    return s;
}

kv_reshard_side_t kv_reshard_side_rank(const kv_layout_t *layout, int tp,
                                       int rank)
{
    kv_reshard_side_t s;

    s.n_heads_total = layout->n_kv_heads * tp;
    s.head0 = layout->n_kv_heads * rank;
    s.layout = *layout;
    return s;
}

void kv_reshard_overlap(const kv_reshard_side_t *src,
                        const kv_reshard_side_t *dst, int *h0_p, int *h1_p)
{
    int s1 = src->head0 + src->layout.n_kv_heads;
    int d1 = dst->head0 + dst->layout.n_kv_heads;

    *h0_p = src->head0 > dst->head0 ? src->head0 : dst->head0;
    *h1_p = s1 < d1 ? s1 : d1;
}

/* A side's head range lies inside the model. */
static bool side_ok(const kv_reshard_side_t *s)
{
    const kv_layout_t *l = &s->layout;

    return s->n_heads_total >= 1 && l->n_kv_heads >= 1 && s->head0 >= 0 &&
           s->head0 <= s->n_heads_total - l->n_kv_heads && l->head_dim >= 1 &&
           l->block_size >= 1 && l->n_blocks >= 1 && l->n_layers >= 1 &&
           l->elem_size >= 1;
}

bt_status_t kv_reshard_plan(const kv_reshard_side_t *src,
                            const kv_reshard_side_t *dst,
                            const int *src_ids, const int *dst_ids, int n,
                            kv_copy2d_t *copies, int cap, int *n_copies_p)
{
    const kv_layout_t *sl = &src->layout, *dl = &dst->layout;
    size_t head_bytes, row_s, row_d, blk_s, blk_d, width, soff, doff;
    int h0, h1, n_copies = 0;
    bool full;

    *n_copies_p = 0;
    if (!side_ok(src) || !side_ok(dst) || n < 0 ||
        src->n_heads_total != dst->n_heads_total ||
        sl->head_dim != dl->head_dim || sl->elem_size != dl->elem_size ||
        sl->block_size != dl->block_size || sl->n_layers != dl->n_layers)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "re-shard: pools of "
                        "different models or a head range outside the "
                        "model (src heads %d+%d of %d, dst %d+%d of %d)",
                        src->head0, sl->n_kv_heads, src->n_heads_total,
                        dst->head0, dl->n_kv_heads, dst->n_heads_total);
    for (int i = 0; i < n; i++)
        if (src_ids[i] < 0 || src_ids[i] >= sl->n_blocks || dst_ids[i] < 0 ||
            dst_ids[i] >= dl->n_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "re-shard: block id "
                            "out of range (src %d of %d, dst %d of %d)",
                            src_ids[i], sl->n_blocks, dst_ids[i],
                            dl->n_blocks);
    kv_reshard_overlap(src, dst, &h0, &h1);
    if (h0 >= h1)
        return BT_OK; /* no head in common: nothing to move */
    head_bytes = (size_t)sl->head_dim * sl->elem_size;
    row_s = (size_t)sl->n_kv_heads * head_bytes;
    row_d = (size_t)dl->n_kv_heads * head_bytes;
    blk_s = (size_t)sl->block_size * row_s;
    blk_d = (size_t)dl->block_size * row_d;
    width = (size_t)(h1 - h0) * head_bytes;
    soff = (size_t)(h0 - src->head0) * head_bytes;
    doff = (size_t)(h0 - dst->head0) * head_bytes;
    full = width == row_s && width == row_d; /* whole rows both sides */
    for (int i = 0; i < n;) {
        int run = 1;
        kv_copy2d_t *c;
        while (i + run < n && src_ids[i + run] == src_ids[i] + run &&
               dst_ids[i + run] == dst_ids[i] + run)
            run++;
        if (n_copies == cap)
            return BT_ERROR(BT_ERR_NO_RESOURCE, "KV", "re-shard plan needs "
                            "more than %d copies", cap);
        c = &copies[n_copies++];
        if (full) {
            c->dst_off = (size_t)dst_ids[i] * blk_d;
            c->src_off = (size_t)src_ids[i] * blk_s;
            c->width = (size_t)run * blk_s;
            c->height = 1;
            c->dpitch = c->width;
            c->spitch = c->width;
        } else {
            c->dst_off = (size_t)dst_ids[i] * blk_d + doff;
            c->src_off = (size_t)src_ids[i] * blk_s + soff;
            c->dpitch = row_d;
            c->spitch = row_s;
            c->width = width;
            c->height = (size_t)run * (size_t)sl->block_size;
        }
        i += run;
    }
    *n_copies_p = n_copies;
    return BT_OK;
}

size_t kv_reshard_plan_bytes(const kv_copy2d_t *copies, int n)
{
    size_t bytes = 0;

    for (int i = 0; i < n; i++)
        bytes += copies[i].width * copies[i].height;
    return bytes;
}

void kv_reshard_exec_host(const kv_copy2d_t *copies, int n, void *dst_base,
                          const void *src_base)
{
    for (int i = 0; i < n; i++) {
        const kv_copy2d_t *c = &copies[i];
        char *d = (char *)dst_base + c->dst_off;
        const char *s = (const char *)src_base + c->src_off;
        for (size_t r = 0; r < c->height; r++)
            memcpy(d + r * c->dpitch, s + r * c->spitch, c->width);
    }
}
