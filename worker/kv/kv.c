/*
 * kv.c - KV cache layout arithmetic and the block allocator.
 *
 * The allocator keeps its free blocks in a binary min-heap of ids, so an
 * allocation always takes the lowest free ids: a fresh sequence on an
 * unfragmented pool gets one adjacent run, which transfers coalesce into a
 * single put.  Each block carries a reference count; 0 means free.
 */
#include "kv.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

struct kv_allocator_s {
    int n_blocks;   /* pool size */
    int n_free;     /* entries used in free_heap */
    int *free_heap; /* (n_blocks) min-heap of free block ids */
    int *refcount;  /* (n_blocks) references per block, 0 = free */
    kv_allocator_cache_t cache; /* attached block cache, hooks NULL = none */
};

// ----------------------------------------------------------------------------
// layout

size_t kv_layout_block_bytes(const kv_layout_t *layout)
{
    return (size_t)layout->block_size * (size_t)layout->n_kv_heads *
           (size_t)layout->head_dim * layout->elem_size;
}

size_t kv_layout_layer_bytes(const kv_layout_t *layout)
{
    return (size_t)layout->n_blocks * kv_layout_block_bytes(layout);
}

size_t kv_layout_offset(const kv_layout_t *layout, int layer, int block,
                        int slot)
{
    size_t row = (size_t)layout->n_kv_heads * (size_t)layout->head_dim;

    return (((size_t)layer * (size_t)layout->n_blocks + (size_t)block) *
                (size_t)layout->block_size + (size_t)slot) * row;
}

// ----------------------------------------------------------------------------
// min-heap of free ids

static void kv_heap_push(kv_allocator_t *alloc, int id)
{
    int *heap = alloc->free_heap;
    int i = alloc->n_free++;

    while (i > 0) {
        int parent = (i - 1) / 2;

        if (heap[parent] <= id)
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = id;
}

static int kv_heap_pop(kv_allocator_t *alloc)
{
    int *heap = alloc->free_heap;
    int top = heap[0];
    int last = heap[--alloc->n_free];
    int n = alloc->n_free;
    int i = 0;

    for (;;) {
        int child = 2 * i + 1;

        if (child >= n)
            break;
        if (child + 1 < n && heap[child + 1] < heap[child])
            child++;
        if (last <= heap[child])
            break;
        heap[i] = heap[child];
        i = child;
    }
    if (n > 0)
        heap[i] = last;
    return top;
}

// ----------------------------------------------------------------------------
// allocator

bt_status_t kv_allocator_create(int n_blocks, kv_allocator_t **alloc_p)
{
    kv_allocator_t *alloc;

    if (n_blocks <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "a KV pool needs at least one block, not %d",
                        n_blocks);
    alloc = bt_calloc(1, sizeof(*alloc), "kv_allocator");
    if (alloc == NULL)
        return BT_ERR_NO_MEMORY;
    alloc->free_heap = bt_malloc((size_t)n_blocks * sizeof(int),
                                 "kv_allocator");
    if (alloc->free_heap == NULL)
        goto err_free_alloc;
    alloc->refcount = bt_calloc((size_t)n_blocks, sizeof(int),
                                "kv_allocator");
    if (alloc->refcount == NULL)
        goto err_free_heap;
    alloc->n_blocks = n_blocks;
    /* Ascending ids already form a valid min-heap. */
    for (int i = 0; i < n_blocks; i++)
        alloc->free_heap[i] = i;
    alloc->n_free = n_blocks;
    *alloc_p = alloc;
    return BT_OK;

err_free_heap:
    bt_free(alloc->free_heap);
err_free_alloc:
    bt_free(alloc);
    return BT_ERR_NO_MEMORY;
}

void kv_allocator_destroy(kv_allocator_t **alloc_p)
{
    kv_allocator_t *alloc = *alloc_p;

    if (alloc == NULL)
        return;
    bt_free(alloc->refcount);
    bt_free(alloc->free_heap);
    bt_free(alloc);
    *alloc_p = NULL;
}

bt_status_t kv_allocator_alloc(kv_allocator_t *alloc, int n, int *ids)
{
    if (n < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "negative block count %d", n);
    if (n > alloc->n_free && alloc->cache.reclaim != NULL &&
        alloc->cache.reclaimable(alloc->cache.arg) >= n - alloc->n_free)
        (void)alloc->cache.reclaim(alloc->cache.arg, n - alloc->n_free);
    if (n > alloc->n_free)
        return BT_ERR_NO_RESOURCE; /* routine back-pressure, not logged */
    for (int i = 0; i < n; i++) {
        int id = kv_heap_pop(alloc);

        BT_ASSERT(alloc->refcount[id] == 0);
        alloc->refcount[id] = 1;
        ids[i] = id;
    }
    return BT_OK;
}

void kv_allocator_ref(kv_allocator_t *alloc, int id)
{
    BT_ASSERT(id >= 0 && id < alloc->n_blocks);
    BT_ASSERT(alloc->refcount[id] > 0);
    alloc->refcount[id]++;
}

void kv_allocator_release(kv_allocator_t *alloc, int n, const int *ids)
{
    /* Last first: the free list does not care, an LRU cache does (it
     * should evict a sequence's tail before the head others share). */
    for (int i = n - 1; i >= 0; i--) {
        int id = ids[i];

        BT_ASSERT(id >= 0 && id < alloc->n_blocks);
        BT_ASSERT(alloc->refcount[id] > 0);
        if (--alloc->refcount[id] == 0)
            kv_heap_push(alloc, id);
        if (alloc->cache.released != NULL)
            alloc->cache.released(alloc->cache.arg, id, alloc->refcount[id]);
    }
}

int kv_allocator_free_count(const kv_allocator_t *alloc)
{
    if (alloc->cache.reclaimable != NULL)
        return alloc->n_free + alloc->cache.reclaimable(alloc->cache.arg);
    return alloc->n_free;
}

int kv_allocator_free_list_count(const kv_allocator_t *alloc)
{
    return alloc->n_free;
}

bt_status_t kv_allocator_set_cache(kv_allocator_t *alloc,
                                   const kv_allocator_cache_t *cache)
{
    if (cache == NULL) {
        memset(&alloc->cache, 0, sizeof(alloc->cache));
        return BT_OK;
    }
    if (alloc->cache.released != NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "this KV pool already has a block cache");
    if (cache->released == NULL || cache->reclaim == NULL ||
        cache->reclaimable == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "a block cache needs all three hooks");
    alloc->cache = *cache;
    return BT_OK;
}

int kv_allocator_total(const kv_allocator_t *alloc)
{
    return alloc->n_blocks;
}

int kv_allocator_refcount(const kv_allocator_t *alloc, int id)
{
    BT_ASSERT(id >= 0 && id < alloc->n_blocks);
    return alloc->refcount[id];
}
