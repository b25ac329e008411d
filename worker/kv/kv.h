/*
 * kv.h - the paged KV cache: its memory layout and the block allocator.
 *
 * The cache is a pool of fixed-size blocks.  Each sequence owns a block
 * table (block ids in token order); token slot s of the sequence lives in
 * block table[s / block_size] at offset s % block_size.
 *
 * Memory layout, chosen for transfers (see docs/ARCHITECTURE.md): K and V
 * are separate arrays, each
 *     (n_layers, n_blocks, block_size, n_kv_heads, head_dim)
 * so one layer's blocks are addressable on their own (layer-by-layer
 * streaming) and a run of adjacent block ids is one contiguous region
 * (transfers coalesce runs into single puts).
 *
 * The allocator is host-side bookkeeping only; the memory itself belongs
 * to the backend (host RAM for CPU, device memory for CUDA).  Blocks are
 * reference counted so that prefix sharing can hand one block to several
 * sequences.  Not thread-safe: one scheduler thread owns it.
 */
#ifndef BT_WORKER_KV_KV_H
#define BT_WORKER_KV_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_layers;
    int n_blocks;
    int block_size;   /* tokens per block */
    int n_kv_heads;
    int head_dim;
    size_t elem_size; /* bytes per element: 4 (f32), 2 (bf16), 1 (fp8) */
} kv_layout_t;

/* Bytes of one block of K (or V) in one layer. */
size_t kv_layout_block_bytes(const kv_layout_t *layout);
/* Bytes of K (or V) for one layer: n_blocks * block bytes. */
size_t kv_layout_layer_bytes(const kv_layout_t *layout);
/* Element offset of (layer, block, slot-in-block) inside the K or V array. */
size_t kv_layout_offset(const kv_layout_t *layout, int layer, int block,
                        int slot);

typedef struct kv_allocator_s kv_allocator_t;

bt_status_t kv_allocator_create(int n_blocks, kv_allocator_t **alloc_p);
void kv_allocator_destroy(kv_allocator_t **alloc_p);

/* Takes `n` free blocks (refcount 1 each) into `ids`.  All or nothing:
 * BT_ERR_NO_RESOURCE and no change when fewer than n are free.  Blocks are
 * handed out lowest id first so that a fresh sequence gets adjacent runs. */
bt_status_t kv_allocator_alloc(kv_allocator_t *alloc, int n, int *ids);

/* Adds a reference to a block already held (prefix sharing). */
void kv_allocator_ref(kv_allocator_t *alloc, int id);

/* Drops one reference from each block, last id first (an attached cache
 * then sees a sequence's tail before its head); a block whose count
 * reaches 0 returns to the free list. */
void kv_allocator_release(kv_allocator_t *alloc, int n, const int *ids);

/* Blocks an allocation can get now: the free list plus, with a cache
 * attached, the cached blocks it would evict. */
int kv_allocator_free_count(const kv_allocator_t *alloc);
int kv_allocator_total(const kv_allocator_t *alloc);
int kv_allocator_refcount(const kv_allocator_t *alloc, int id);

/* ---- a block cache on top of the pool (worker/kv/kv_prefix.h) ----
 * A cache keeps blocks no sequence uses by holding a reference of its own
 * on them; these hooks let it see every release and free such blocks
 * when an allocation finds the free list short, so the allocator's users
 * (engine, workers) need no change to run with one. */
typedef struct {
    /* After a release left block `id` at `refcount` references. */
    void (*released)(void *arg, int id, int refcount);
    /* Asked for `short_by` more free blocks: either releases exactly that
     * many of its own references down to 0 and returns true, or changes
     * nothing and returns false. */
    bool (*reclaim)(void *arg, int short_by);
    /* How many blocks reclaim could free now. */
    int (*reclaimable)(const void *arg);
    void *arg; /* passed to each hook */
} kv_allocator_cache_t;

/* Attaches `cache` (copied; NULL detaches).  BT_ERR_INVALID_ARG when one
 * is attached already. */
bt_status_t kv_allocator_set_cache(kv_allocator_t *alloc,
                                   const kv_allocator_cache_t *cache);

/* Blocks on the free list only (refcount 0). */
int kv_allocator_free_list_count(const kv_allocator_t *alloc);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_H */
