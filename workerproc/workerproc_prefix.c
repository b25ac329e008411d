/*
 * workerproc_prefix.c - a worker's prefix cache, wired (see
 * workerproc_prefix.h).
 */
#include "workerproc_prefix.h"

#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "workerproc.h"

struct workerproc_prefix_s {
    kv_prefix_t *cache;     /* owned */
    kv_allocator_t *kv;     /* the engine's pool, not owned */
    backend_t *backend;     /* the engine's, not owned (host tier copies) */
    void *host_mem;         /* host tier (owned), NULL: none */
    size_t host_bytes;
    bool host_pinned;       /* backend_host_pin succeeded */
    int block_size;
    bool snapshot_owed;     /* the next publication is a snapshot */
    uint64_t last_pub_ns;   /* last publication */
    int *ids;               /* (max_blocks) match scratch */
    int max_blocks;
};

static const char *precision_name(backend_precision_t p)
{
    switch (p) {
    case BACKEND_PRECISION_F32: return "f32";
    case BACKEND_PRECISION_BF16: return "bf16";
    case BACKEND_PRECISION_FP8: return "fp8";
    default: return "default";
    }
}

static bt_status_t host_save(void *arg, int n, const int *blocks,
                             void *const *host)
{
    return backend_kv_save(arg, n, blocks, host);
}

static bt_status_t host_load(void *arg, int n, const int *blocks,
                             void *const *host)
{
    return backend_kv_load(arg, n, blocks, host);
}

/* --kv-host-gb: the host tier's memory, as many whole blocks as fit,
 * pinned where the backend pins (a failed pin only slows the copies). */
static bt_status_t host_tier_init(workerproc_prefix_t *p, size_t bytes,
                                  kv_prefix_config_t *pc)
{
    size_t block_bytes = backend_kv_host_block_bytes(p->backend);
    size_t n = block_bytes > 0 ? bytes / block_bytes : 0;
    bt_status_t status;

    if (backend_tp_size(p->backend) > 1)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "KV",
                        "--kv-host-gb: the host tier needs one GPU (--tp "
                        "%d)", backend_tp_size(p->backend));
    if (n == 0 || n > (1u << 28))
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "--kv-host-gb: %zu bytes hold %zu KV blocks of %zu "
                        "bytes (1 to 2^28 needed)", bytes, n, block_bytes);
    p->host_bytes = n * block_bytes;
    p->host_mem = bt_malloc(p->host_bytes, "workerproc_prefix_host");
    if (p->host_mem == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "KV",
                        "--kv-host-gb: cannot allocate %zu bytes of host "
                        "memory", p->host_bytes);
    status = backend_host_pin(p->backend, p->host_mem, p->host_bytes, true);
    if (status != BT_OK)
        BT_LOG_WARN("KV", "host tier not pinned (%s): its copies are "
                    "staged, slower", bt_status_str(status));
    p->host_pinned = status == BT_OK;
    pc->host_blocks = (int)n;
    pc->host_block_bytes = block_bytes;
    pc->host_mem = p->host_mem;
    pc->host_save = host_save;
    pc->host_load = host_load;
    pc->host_arg = p->backend;
    return BT_OK;
}

static void host_tier_free(workerproc_prefix_t *p)
{
    if (p->host_pinned)
        (void)backend_host_pin(p->backend, p->host_mem, p->host_bytes,
                               false);
    bt_free(p->host_mem);
    p->host_mem = NULL;
}

bt_status_t workerproc_prefix_create(engine_t *engine,
                                     const engine_config_t *ecfg,
                                     workerproc_prefix_t **prefix_p)
{
    workerproc_prefix_t *p;
    kv_prefix_config_t pc;
    char model_id[512];
    const char *path = ecfg->model_path != NULL ? ecfg->model_path : "";
    const char *base = strrchr(path, '/');
    bt_status_t status;

    p = bt_calloc(1, sizeof(*p), "workerproc_prefix");
    if (p == NULL)
        return BT_ERR_NO_MEMORY;
    p->kv = engine_kv(engine);
    p->backend = engine_backend(engine);
    p->block_size = engine_block_size(engine);
    p->max_blocks = BT_DIV_UP(engine_max_context(engine) + 1, p->block_size);
    p->ids = bt_malloc((size_t)p->max_blocks * sizeof(int),
                       "workerproc_prefix");
    if (p->ids == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_free;
    }
    /* KV is interchangeable only between equal weights computed the same
     * way: the file (its name: workers of one cluster load one
     * checkpoint), the precision and the backend that computed it. */
    snprintf(model_id, sizeof(model_id), "%s|%s|%s",
             base != NULL ? base + 1 : path,
             precision_name(ecfg->backend.precision),
             backend_name(engine_backend(engine)));
    kv_prefix_config_init(&pc);
    pc.block_size = p->block_size;
    pc.model_id = model_id;
    pc.kv_dtype = backend_kv_dtype_name(ecfg->backend.kv_dtype);
    if (ecfg->backend.kv_host_bytes > 0) {
        status = host_tier_init(p, ecfg->backend.kv_host_bytes, &pc);
        if (status != BT_OK)
            goto err_free;
    }
    status = kv_prefix_create(&pc, p->kv, &p->cache);
    if (status != BT_OK)
        goto err_free;
    BT_LOG_INFO("KV", "prefix cache on: model id '%s', KV dtype %s, block "
                "size %d, instance %016llx, host tier %d blocks (%.2f "
                "GiB%s)", model_id, pc.kv_dtype, p->block_size,
                (unsigned long long)kv_prefix_instance(p->cache),
                pc.host_blocks, (double)p->host_bytes / 1073741824.0,
                p->host_pinned ? ", pinned" : "");
    *prefix_p = p;
    return BT_OK;

err_free:
    host_tier_free(p);
    bt_free(p->ids);
    bt_free(p);
    return status;
}

void workerproc_prefix_destroy(workerproc_prefix_t **prefix_p)
{
    workerproc_prefix_t *p = *prefix_p;

    if (p == NULL)
        return;
    kv_prefix_destroy(&p->cache);
    /* Called once every sequence and reservation let go: every block
     * must be free now (the cache's references included). */
    if (kv_allocator_free_count(p->kv) != kv_allocator_total(p->kv))
        BT_LOG_WARN("KV", "leak: %d of %d KV blocks still held after the "
                    "prefix cache", kv_allocator_total(p->kv) -
                    kv_allocator_free_count(p->kv),
                    kv_allocator_total(p->kv));
    host_tier_free(p);
    bt_free(p->ids);
    bt_free(p);
    *prefix_p = NULL;
}

kv_prefix_t *workerproc_prefix_cache(workerproc_prefix_t *prefix)
{
    return prefix->cache;
}

bt_blockhash_t workerproc_prefix_root(const workerproc_prefix_t *prefix,
                                      bool has_salt,
                                      const ProtobufCBinaryData *salt)
{
    size_t len = has_salt && salt != NULL ? salt->len : 0;

    return kv_prefix_root(prefix->cache, len > 0 ? salt->data : NULL,
                          BT_MIN(len, (size_t)PROTO_MAX_CACHE_SALT));
}

int workerproc_prefix_adopt(workerproc_prefix_t *prefix, bt_blockhash_t root,
                            const int *tokens, int n_tokens, int *blocks,
                            int n_blocks)
{
    int max = n_tokens > 0 ? (n_tokens - 1) / prefix->block_size : 0;
    int hit;

    max = BT_MIN(max, BT_MIN(n_blocks, prefix->max_blocks));
    hit = kv_prefix_match(prefix->cache, root, tokens, n_tokens, max,
                          prefix->ids);
    if (hit <= 0)
        return 0;
    /* The reserved blocks replaced are plain ones nobody else holds:
     * back to the free list. */
    kv_allocator_release(prefix->kv, hit, blocks);
    memcpy(blocks, prefix->ids, (size_t)hit * sizeof(int));
    return hit * prefix->block_size;
}

int workerproc_prefix_insert(workerproc_prefix_t *prefix,
                             kv_prefix_cursor_t *cursor, const int *tokens,
                             int n_computed, const int *blocks)
{
    if (n_computed / prefix->block_size <= cursor->n_hashed)
        return 0; /* no block became full */
    return kv_prefix_insert_more(prefix->cache, cursor, tokens, n_computed,
                                 blocks);
}

void workerproc_prefix_want_snapshot(workerproc_prefix_t *prefix)
{
    prefix->snapshot_owed = true;
}

void workerproc_prefix_on_resync(workerproc_prefix_t *prefix,
                                 const Baton__KvResyncRequest *m)
{
    BT_LOG_INFO("KV", "router asked for a prefix-cache resync (it knew "
                "instance %016llx up to event %llu)",
                (unsigned long long)m->instance,
                (unsigned long long)(m->has_seq_next ? m->seq_next : 0));
    prefix->snapshot_owed = true;
}

/* kv_prefix_batch_t -> KvEvents, sent.  The message borrows the batch's
 * hash arrays. */
static bt_status_t send_batch(workerproc_prefix_t *prefix, void *sock,
                              const kv_prefix_batch_t *batch)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvEvents ev = BATON__KV_EVENTS__INIT;
    Baton__KvEvent *evs = NULL;
    Baton__KvEvent **ptrs = NULL;
    bt_blockhash_t id = kv_prefix_identity(prefix->cache);
    uint8_t idb[16];

    if (batch->n_events > 0) {
        evs = bt_calloc((size_t)batch->n_events, sizeof(*evs),
                        "workerproc_prefix");
        ptrs = bt_calloc((size_t)batch->n_events, sizeof(*ptrs),
                         "workerproc_prefix");
        if (evs == NULL || ptrs == NULL) {
            bt_free(evs);
            bt_free(ptrs);
            return BT_ERR_NO_MEMORY;
        }
    }
    for (int i = 0; i < batch->n_events; i++) {
        const kv_prefix_event_t *e = &batch->events[i];
        baton__kv_event__init(&evs[i]);
        evs[i].type = (Baton__KvEventType)e->type;
        evs[i].n_block_hashes = (size_t)e->n_hashes;
        evs[i].block_hashes = e->hashes;
        evs[i].has_parent_hash = e->type == KV_PREFIX_EV_STORED;
        evs[i].parent_hash = e->parent;
        evs[i].has_tier = e->tier != 0;
        evs[i].tier = (uint32_t)e->tier;
        ptrs[i] = &evs[i];
    }
    for (int i = 0; i < 8; i++) {
        idb[i] = (uint8_t)(id.lo >> (8 * i));
        idb[8 + i] = (uint8_t)(id.hi >> (8 * i));
    }
    ev.instance = batch->instance;
    ev.seq_first = batch->seq_first;
    ev.n_events = (size_t)batch->n_events;
    ev.events = ptrs;
    ev.has_resync = batch->resync;
    ev.resync = batch->resync;
    ev.has_identity = 1;
    ev.identity.data = idb;
    ev.identity.len = sizeof(idb);
    ev.has_block_size = 1;
    ev.block_size = (uint32_t)prefix->block_size;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_EVENTS;
    msg.kv_events = &ev;
    workerproc_send(sock, &msg);
    bt_free(ptrs);
    bt_free(evs);
    return BT_OK;
}

void workerproc_prefix_publish(workerproc_prefix_t *prefix, void *sock,
                               int min_interval_ms)
{
    kv_prefix_batch_t batch;
    uint64_t now = bt_time_ns();
    bt_status_t status;

    if (!prefix->snapshot_owed &&
        now - prefix->last_pub_ns < (uint64_t)min_interval_ms * 1000000ull)
        return;
    memset(&batch, 0, sizeof(batch));
    status = prefix->snapshot_owed
                 ? kv_prefix_snapshot(prefix->cache, &batch)
                 : kv_prefix_events_take(prefix->cache, &batch);
    if (status != BT_OK) {
        BT_LOG_WARN("KV", "prefix cache events not published: %s "
                    "(retried)", bt_status_str(status));
        return;
    }
    prefix->last_pub_ns = now;
    if (batch.n_events > 0 || batch.resync) {
        status = send_batch(prefix, sock, &batch);
        if (status == BT_OK)
            prefix->snapshot_owed = false;
        else /* the events are gone: the router gets a snapshot */
            prefix->snapshot_owed = true;
    } else {
        prefix->snapshot_owed = false;
    }
    kv_prefix_batch_cleanup(&batch);
}

void workerproc_prefix_beat(const workerproc_prefix_t *prefix,
                            workerproc_beat_t *b)
{
    kv_prefix_stats_t st;

    kv_prefix_stats(prefix->cache, &st);
    b->has_prefix = true;
    b->prefix_lookups = st.lookups;
    b->prefix_lookup_tokens = st.lookup_tokens;
    b->prefix_hit_tokens = st.hit_tokens;
    b->prefix_lookup_blocks = st.lookup_blocks;
    b->prefix_hit_blocks = st.hit_blocks;
    b->prefix_inserted = st.inserted;
    b->prefix_evictions = st.evictions;
    b->prefix_cached_blocks = (uint32_t)st.cached_blocks;
    b->prefix_cached_unused = (uint32_t)st.cached_unused;
    b->prefix_host_blocks = (uint32_t)st.host_blocks;
    b->prefix_host_cached = (uint32_t)st.host_cached;
    b->prefix_host_saves = st.host_saves;
    b->prefix_host_loads = st.host_loads;
    b->prefix_host_evictions = st.host_evictions;
}
