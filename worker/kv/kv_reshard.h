/*
 * kv_reshard.h - plans the copies that move a request's KV blocks from
 * one pool to another when the two pools hold different KV heads: prefill
 * and decode workers with different tensor-parallel (TP) degrees.
 *
 * With TP = t, rank r's pool holds KV heads [r*n, (r+1)*n) of the model's
 * H heads (n = H / t), laid out as every pool is,
 *     (n_layers, n_blocks, block_size, n_local_heads, head_dim)
 * so one token's row in one layer is n_local_heads * head_dim elements and
 * the heads of one token are adjacent.  Moving a block from a source rank
 * to a destination rank copies, for every token of the block, the part of
 * the row whose heads both hold: a 2D copy (rows = tokens, width = the
 * common heads' bytes, each side with its own row pitch), which is what
 * cudaMemcpy2DAsync does in one call.  Adjacent blocks on both sides are
 * adjacent rows, so a run of consecutive block ids is ONE 2D copy of
 * run * block_size rows; when the common heads are the whole row on both
 * sides (equal sharding, e.g. TP 1 -> TP 1) the rows are contiguous too
 * and the run collapses to one 1D copy of run * block bytes (height 1).
 *
 * A destination rank that receives from several source ranks (prefill
 * TP 2 -> decode TP 1) gets one plan per source rank; each plan writes
 * only the destination's columns of its own heads, so the plans never
 * overlap and their order does not matter.
 *
 * The planner is pure (no memory is touched): offsets are bytes from the
 * base of ONE layer's K (or V) array on each side, the same plan serves K
 * and V (both have the same layout), and executing it is the caller's job
 * (kv_transport_cuda_ipc.c with cudaMemcpy2DAsync / cudaMemcpyAsync,
 * kv_reshard_exec_host for host memory and the tests).
 */
#ifndef BT_WORKER_KV_KV_RESHARD_H
#define BT_WORKER_KV_KV_RESHARD_H

#include <stddef.h>

#include "bt_status.h"
#include "kv/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One side of a re-sharding copy: which heads a pool holds, and its
 * layout (layout.n_kv_heads = the heads THIS pool holds). */
typedef struct {
    int n_heads_total;   /* KV heads of the model */
    int head0;           /* first KV head held: rank * layout.n_kv_heads */
    kv_layout_t layout;
} kv_reshard_side_t;

/* A whole pool (TP 1): heads [0, layout->n_kv_heads) of that many. */
kv_reshard_side_t kv_reshard_side_whole(const kv_layout_t *layout);

/* Rank `rank` of a TP `tp` pool whose layout is `layout` (one rank's
 * pool: layout->n_kv_heads heads per rank). */
kv_reshard_side_t kv_reshard_side_rank(const kv_layout_t *layout, int tp,
                                       int rank);

/* A strided copy, shaped like cudaMemcpy2DAsync(dst, dpitch, src, spitch,
 * width, height): `height` rows of `width` bytes, row i from
 * src + src_off + i * spitch to dst + dst_off + i * dpitch.  A 1D copy
 * has height 1 and pitch = width. */
typedef struct {
    size_t dst_off;   /* bytes from the destination layer base */
    size_t dpitch;    /* bytes between destination rows */
    size_t src_off;   /* bytes from the source layer base */
    size_t spitch;    /* bytes between source rows */
    size_t width;     /* bytes per row */
    size_t height;    /* rows */
} kv_copy2d_t;

/* Heads both sides hold: [*h0_p, *h1_p), empty when *h0_p >= *h1_p. */
void kv_reshard_overlap(const kv_reshard_side_t *src,
                        const kv_reshard_side_t *dst, int *h0_p, int *h1_p);

/* Plans moving, in one layer, source block src_ids[i] to destination
 * block dst_ids[i] (i < n): the heads both sides hold, nothing else.
 * Runs where both ids are consecutive merge into one copy, so there are
 * at most n copies (cap >= n always suffices) and zero when the head
 * ranges do not meet.  Checks: both sides describe the same model (total
 * heads, head_dim, elem_size, block_size, n_layers), head ranges inside
 * the model and block ids inside each pool (BT_ERR_INVALID_ARG); more
 * copies than `cap` is BT_ERR_NO_RESOURCE.  *n_copies_p gets the count. */
bt_status_t kv_reshard_plan(const kv_reshard_side_t *src,
                            const kv_reshard_side_t *dst,
                            const int *src_ids, const int *dst_ids, int n,
                            kv_copy2d_t *copies, int cap, int *n_copies_p);

/* Bytes a plan moves. */
size_t kv_reshard_plan_bytes(const kv_copy2d_t *copies, int n);

/* Executes a plan with memcpy between host layer bases. */
void kv_reshard_exec_host(const kv_copy2d_t *copies, int n, void *dst_base,
                          const void *src_base);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_RESHARD_H */
