/*
 * kv_transport_cuda_ipc.c - KV hand-off over CUDA IPC (see
 * kv_transport_cuda_ipc.h).  The descriptor codec is plain C; everything
 * that touches the device is compiled only with BATON_HAVE_CUDA and
 * returns BT_ERR_UNSUPPORTED otherwise.
 */
#include "kv/kv_transport_cuda_ipc.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_reshard.h"

#ifdef BATON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

// ---------------------------------------------------------------------------
// Descriptor codec: little-endian fixed-size record, FNV-1a checksummed.
//   u32 magic 'BTCI', u32 version, u32 size, u32 pid, u64 pool_id,
//   i32 device, char bus_id[32], u32 layout[6], u32 n_slots,
//   u8 k_handle[64], u8 v_handle[64], u8 arrival_handle[64], u64 checksum

#define CIPC_MAGIC 0x49435442u /* "BTCI" */
#define CIPC_DESC_SIZE (4 * 4 + 8 + 4 + KV_CIPC_BUS_ID_LEN + 6 * 4 + 4 + \
                        3 * KV_CIPC_HANDLE_BYTES + 8)

static uint64_t cipc_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void put_u32(uint8_t **p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        (*p)[i] = (uint8_t)(v >> (8 * i));
    *p += 4;
}

static void put_u64(uint8_t **p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        (*p)[i] = (uint8_t)(v >> (8 * i));
    *p += 8;
}

static uint32_t get_u32(const uint8_t **p)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++)
        v |= (uint32_t)(*p)[i] << (8 * i);
    *p += 4;
    return v;
}

static uint64_t get_u64(const uint8_t **p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t)(*p)[i] << (8 * i);
    *p += 8;
    return v;
}

size_t kv_cipc_desc_size(void)
{
    return CIPC_DESC_SIZE;
}

bt_status_t kv_cipc_desc_encode(const kv_cipc_desc_t *d, uint8_t *buf,
                                size_t cap)
{
    uint8_t *p = buf;

    if (cap < CIPC_DESC_SIZE)
        return BT_ERR_INVALID_ARG;
    put_u32(&p, CIPC_MAGIC);
    put_u32(&p, KV_CIPC_DESC_VERSION);
    put_u32(&p, CIPC_DESC_SIZE);
    put_u32(&p, d->pid);
    put_u64(&p, d->pool_id);
    put_u32(&p, (uint32_t)d->device);
    memset(p, 0, KV_CIPC_BUS_ID_LEN);
    snprintf((char *)p, KV_CIPC_BUS_ID_LEN, "%s", d->bus_id);
    p += KV_CIPC_BUS_ID_LEN;
    put_u32(&p, (uint32_t)d->layout.n_layers);
    put_u32(&p, (uint32_t)d->layout.n_blocks);
    put_u32(&p, (uint32_t)d->layout.block_size);
    put_u32(&p, (uint32_t)d->layout.n_kv_heads);
    put_u32(&p, (uint32_t)d->layout.head_dim);
    put_u32(&p, (uint32_t)d->layout.elem_size);
    put_u32(&p, (uint32_t)d->n_slots);
    memcpy(p, d->k_handle, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(p, d->v_handle, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(p, d->arrival_handle, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    put_u64(&p, cipc_fnv1a(buf, (size_t)(p - buf)));
    BT_ASSERT((size_t)(p - buf) == CIPC_DESC_SIZE);
    return BT_OK;
}

bt_status_t kv_cipc_desc_parse(const void *buf, size_t len,
                               kv_cipc_desc_t *out)
{
    const uint8_t *p = buf;
    kv_cipc_desc_t d;
    uint32_t v[6];
    size_t bytes;

    if (buf == NULL || len != CIPC_DESC_SIZE)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor of %zu "
                        "bytes (want %d)", len, CIPC_DESC_SIZE);
    {
        const uint8_t *c = p + CIPC_DESC_SIZE - 8;
        if (get_u64(&c) != cipc_fnv1a(p, CIPC_DESC_SIZE - 8))
            return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor "
                            "checksum mismatch");
    }
    memset(&d, 0, sizeof(d));
    if (get_u32(&p) != CIPC_MAGIC)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "not a CUDA IPC descriptor");
    if (get_u32(&p) != KV_CIPC_DESC_VERSION)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor version");
    if (get_u32(&p) != CIPC_DESC_SIZE)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor size");
    d.pid = get_u32(&p);
    d.pool_id = get_u64(&p);
    d.device = (int32_t)get_u32(&p);
    if (memchr(p, '\0', KV_CIPC_BUS_ID_LEN) == NULL)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC bus id unterminated");
    snprintf(d.bus_id, sizeof(d.bus_id), "%s", (const char *)p);
    p += KV_CIPC_BUS_ID_LEN;
    for (int i = 0; i < 6; i++)
        v[i] = get_u32(&p);
    {
        uint32_t slots = get_u32(&p); /* BT_MIN evaluates twice */
        d.n_slots = (int)BT_MIN(slots, (uint32_t)INT32_MAX);
    }
    if (d.device < 0 || d.device > 1024 || v[0] < 1 || v[0] > 4096 ||
        v[1] < 1 || v[1] > (1u << 24) || v[2] < 1 || v[2] > 4096 ||
        v[3] < 1 || v[3] > 4096 || v[4] < 1 || v[4] > 4096 ||
        (v[5] != 1 && v[5] != 2 && v[5] != 4) || d.n_slots < 1 ||
        d.n_slots > KV_CIPC_MAX_SLOTS)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor layout "
                        "out of range");
    d.layout.n_layers = (int)v[0];
    d.layout.n_blocks = (int)v[1];
    d.layout.block_size = (int)v[2];
    d.layout.n_kv_heads = (int)v[3];
    d.layout.head_dim = (int)v[4];
    d.layout.elem_size = v[5];
    /* n_layers * n_blocks * block bytes must fit a size_t. */
    bytes = (size_t)v[2] * v[3] * v[4] * v[5]; /* < 2^38 */
    if (bt_mul_overflow_size(bytes, v[1], &bytes) ||
        bt_mul_overflow_size(bytes, v[0], &bytes))
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC pool size overflows");
    memcpy(d.k_handle, p, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(d.v_handle, p, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(d.arrival_handle, p, KV_CIPC_HANDLE_BYTES);
    *out = d;
    return BT_OK;
}

void kv_cipc_host_id(char *buf, size_t len)
{
    char host[256] = "localhost", boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    if (gethostname(host, sizeof(host) - 1) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(buf, len, "%s/%s", host, boot);
}

#ifdef BATON_HAVE_CUDA
// ---------------------------------------------------------------------------
// With CUDA

/* Converts a CUDA result at the boundary; logs once. */
#define CIPC_CUDA(_expr) cipc_check((_expr), #_expr, __func__)

static bt_status_t cipc_check(cudaError_t err, const char *expr,
                              const char *func)
{
    if (err == cudaSuccess)
        return BT_OK;
    (void)cudaGetLastError();
    return BT_ERROR(BT_ERR_CUDA, "KV", "%s: %s failed: %s", func, expr,
                    cudaGetErrorString(err));
}

bool kv_cipc_is_available(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

bt_status_t kv_cipc_gpu_info(int device, kv_cipc_gpu_info_t *info)
{
    struct cudaDeviceProp prop;
    kv_cipc_gpu_info_t g;
    bt_status_t status;

    memset(&g, 0, sizeof(g));
    g.device = device;
    status = CIPC_CUDA(cudaDeviceGetPCIBusId(g.bus_id, KV_CIPC_BUS_ID_LEN,
                                             device));
    if (status != BT_OK)
        return status;
    status = CIPC_CUDA(cudaGetDeviceProperties(&prop, device));
    if (status != BT_OK)
        return status;
    memcpy(g.name, prop.name, sizeof(g.name) - 1);
    g.name[sizeof(g.name) - 1] = '\0';
    /* IPC needs a 64-bit Linux process with unified addressing; every
     * device CUDA 13 supports qualifies unless the driver says not. */
    g.ipc = prop.unifiedAddressing != 0;
    *info = g;
    return BT_OK;
}

bt_status_t kv_cipc_memcpy(void *dst, const void *src, size_t bytes)
{
    return CIPC_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

struct kv_cipc_pool_s {
    uint64_t *d_arrival;          /* (n_slots) epochs, device */
    int n_slots;
    int device;
    uint8_t desc[CIPC_DESC_SIZE]; /* encoded descriptor */
};

bt_status_t kv_cipc_pool_export(const kv_layout_t *layout,
                                void *const *k_layers, void *const *v_layers,
                                int device, int n_slots,
                                kv_cipc_pool_t **pool_p)
{
    size_t layer_bytes = kv_layout_layer_bytes(layout);
    kv_cipc_pool_t *pool;
    kv_cipc_desc_t d;
    cudaIpcMemHandle_t h;
    bt_status_t status;

    if (n_slots < 1 || n_slots > KV_CIPC_MAX_SLOTS || layout->n_layers < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "bad CUDA IPC pool shape");
    for (int l = 0; l < layout->n_layers; l++)
        if ((char *)k_layers[l] != (char *)k_layers[0] + l * layer_bytes ||
            (char *)v_layers[l] != (char *)v_layers[0] + l * layer_bytes)
            return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC export needs "
                            "K and V each in one allocation for all layers");
    pool = bt_calloc(1, sizeof(*pool), "kv_cipc_pool");
    if (pool == NULL)
        return BT_ERR_NO_MEMORY;
    pool->n_slots = n_slots;
    pool->device = device;
    memset(&d, 0, sizeof(d));
    d.pid = (uint32_t)getpid();
    d.pool_id = bt_time_ns() ^ ((uint64_t)getpid() << 40) ^
                (uint64_t)(uintptr_t)pool;
    d.device = device;
    d.layout = *layout;
    d.n_slots = n_slots;
    status = CIPC_CUDA(cudaSetDevice(device));
    if (status != BT_OK)
        goto err_free;
    status = CIPC_CUDA(cudaDeviceGetPCIBusId(d.bus_id, KV_CIPC_BUS_ID_LEN,
                                             device));
    if (status != BT_OK)
        goto err_free;
    status = CIPC_CUDA(cudaMalloc((void **)&pool->d_arrival,
                                  (size_t)n_slots * sizeof(uint64_t)));
    if (status != BT_OK)
        goto err_free;
    status = CIPC_CUDA(cudaMemset(pool->d_arrival, 0,
                                  (size_t)n_slots * sizeof(uint64_t)));
    if (status != BT_OK)
        goto err_arrival;
    status = CIPC_CUDA(cudaDeviceSynchronize());
    if (status != BT_OK)
        goto err_arrival;
    status = CIPC_CUDA(cudaIpcGetMemHandle(&h, k_layers[0]));
    if (status != BT_OK)
        goto err_arrival;
    memcpy(d.k_handle, &h, KV_CIPC_HANDLE_BYTES);
    status = CIPC_CUDA(cudaIpcGetMemHandle(&h, v_layers[0]));
    if (status != BT_OK)
        goto err_arrival;
    memcpy(d.v_handle, &h, KV_CIPC_HANDLE_BYTES);
    status = CIPC_CUDA(cudaIpcGetMemHandle(&h, pool->d_arrival));
    if (status != BT_OK)
        goto err_arrival;
    memcpy(d.arrival_handle, &h, KV_CIPC_HANDLE_BYTES);
    kv_cipc_desc_encode(&d, pool->desc, sizeof(pool->desc));
    BT_LOG_INFO("KV", "CUDA IPC pool %016llx exported: device %d (%s), %d "
                "layers x %d blocks, %d slots", (unsigned long long)d.pool_id,
                device, d.bus_id, layout->n_layers, layout->n_blocks,
                n_slots);
    *pool_p = pool;
    return BT_OK;

err_arrival:
    cudaFree(pool->d_arrival);
err_free:
    bt_free(pool);
    return status;
}

void kv_cipc_pool_destroy(kv_cipc_pool_t **pool_p)
{
    kv_cipc_pool_t *pool = *pool_p;

    if (pool == NULL)
        return;
    cudaFree(pool->d_arrival);
    bt_free(pool);
    *pool_p = NULL;
}

const uint8_t *kv_cipc_pool_desc(const kv_cipc_pool_t *pool, size_t *len_p)
{
    *len_p = CIPC_DESC_SIZE;
    return pool->desc;
}

bt_status_t kv_cipc_pool_has_arrived(kv_cipc_pool_t *pool, int slot,
                                     uint64_t epoch, bool *arrived_p)
{
    uint64_t v = 0;
    bt_status_t status;

    if (slot < 0 || slot >= pool->n_slots || epoch == 0) {
        *arrived_p = false;
        return BT_OK;
    }
    status = CIPC_CUDA(cudaMemcpy(&v, pool->d_arrival + slot, sizeof(v),
                                  cudaMemcpyDeviceToHost));
    if (status != BT_OK)
        return status;
    *arrived_p = v == epoch;
    return BT_OK;
}

bt_status_t kv_cipc_pool_slot_reset(kv_cipc_pool_t *pool, int slot)
{
    static const uint64_t zero = 0;
    bt_status_t status;

    if (slot < 0 || slot >= pool->n_slots)
        return BT_ERR_INVALID_ARG;
    status = CIPC_CUDA(cudaMemcpy(pool->d_arrival + slot, &zero, sizeof(zero),
                                  cudaMemcpyHostToDevice));
    if (status != BT_OK)
        return status;
    /* A pageable host-to-device copy may return before the DMA lands. */
    return CIPC_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
}

#define CIPC_MAX_PEERS 64

struct kv_cipc_peer_s {
    kv_cipc_t *ctx;
    kv_cipc_desc_t desc;
    char *d_k;             /* mapped K array (all layers) */
    char *d_v;             /* mapped V array (all layers) */
    uint64_t *d_arrival;   /* mapped (n_slots) arrival epochs */
    bool p2p;              /* the pool is on another GPU than ctx's */
    int peer_device;       /* its ordinal here; -1 when not visible */
    int refs;
};

struct kv_cipc_s {
    cudaStream_t stream;   /* copies; non-blocking */
    int device;            /* the device current at create: the source */
    char bus_id[KV_CIPC_BUS_ID_LEN]; /* its PCI bus id */
    kv_cipc_peer_t *peers[CIPC_MAX_PEERS]; /* (n_peers) cached mappings */
    int n_peers;
    kv_copy2d_t *plan;     /* (plan_cap) scratch for kv_reshard_plan */
    int plan_cap;
    uint64_t copies;
    uint64_t bytes;
};

struct kv_cipc_commit_s {
    cudaEvent_t done;      /* recorded after the copies and the epoch */
    uint64_t epoch;        /* source of the epoch copy: lives until done */
};

bt_status_t kv_cipc_create(kv_cipc_t **ctx_p)
{
    kv_cipc_t *ctx;
    bt_status_t status;

    if (!kv_cipc_is_available())
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: no CUDA device");
    ctx = bt_calloc(1, sizeof(*ctx), "kv_cipc");
    if (ctx == NULL)
        return BT_ERR_NO_MEMORY;
    status = CIPC_CUDA(cudaGetDevice(&ctx->device));
    if (status == BT_OK)
        status = CIPC_CUDA(cudaDeviceGetPCIBusId(ctx->bus_id,
                                                 KV_CIPC_BUS_ID_LEN,
                                                 ctx->device));
    if (status == BT_OK)
        status = CIPC_CUDA(cudaStreamCreateWithFlags(&ctx->stream,
                                                     cudaStreamNonBlocking));
    if (status != BT_OK) {
        bt_free(ctx);
        return status;
    }
    *ctx_p = ctx;
    return BT_OK;
}

static void peer_unmap(kv_cipc_peer_t *peer)
{
    if (peer->d_k)
        cudaIpcCloseMemHandle(peer->d_k);
    if (peer->d_v)
        cudaIpcCloseMemHandle(peer->d_v);
    if (peer->d_arrival)
        cudaIpcCloseMemHandle(peer->d_arrival);
    (void)cudaGetLastError();
    bt_free(peer);
}

void kv_cipc_destroy(kv_cipc_t **ctx_p)
{
    kv_cipc_t *ctx = *ctx_p;

    if (ctx == NULL)
        return;
    (void)cudaStreamSynchronize(ctx->stream);
    for (int i = 0; i < ctx->n_peers; i++) {
        BT_ASSERT(ctx->peers[i]->refs == 0);
        peer_unmap(ctx->peers[i]);
    }
    cudaStreamDestroy(ctx->stream);
    bt_free(ctx->plan);
    bt_free(ctx);
    *ctx_p = NULL;
}

/* A pool on another GPU than ctx's: finds its ordinal here by PCI bus id
 * (the exporter's ordinal may differ: CUDA_VISIBLE_DEVICES) and enables
 * peer access from ctx's device, so the copy engine writes over NVLink
 * (or PCIe) straight into the pool.  A GPU this process cannot see is
 * left to cudaIpcMemLazyEnablePeerAccess. */
static bt_status_t peer_setup(kv_cipc_t *ctx, kv_cipc_peer_t *peer)
{
    int dev = -1, can = 0;
    cudaError_t err;

    peer->peer_device = -1;
    peer->p2p = strcmp(peer->desc.bus_id, ctx->bus_id) != 0;
    if (!peer->p2p) {
        peer->peer_device = ctx->device;
        return BT_OK;
    }
    if (cudaDeviceGetByPCIBusId(&dev, peer->desc.bus_id) != cudaSuccess) {
        (void)cudaGetLastError();
        BT_LOG_INFO("KV", "CUDA IPC pool on GPU %s, not visible here: peer "
                    "access left to the IPC mapping", peer->desc.bus_id);
        return BT_OK;
    }
    peer->peer_device = dev;
    if (dev == ctx->device) { /* same GPU, bus ids spelled differently */
        peer->p2p = false;
        return BT_OK;
    }
    if (cudaDeviceCanAccessPeer(&can, ctx->device, dev) != cudaSuccess ||
        !can) {
        (void)cudaGetLastError();
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: device %d (%s) cannot "
                        "access peer device %d (%s)", ctx->device,
                        ctx->bus_id, dev, peer->desc.bus_id);
    }
    err = cudaDeviceEnablePeerAccess(dev, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return BT_OK;
    }
    return CIPC_CUDA(err);
}

static bt_status_t open_handle(const uint8_t *bytes, void **d_p)
{
    cudaIpcMemHandle_t h;

    memcpy(&h, bytes, KV_CIPC_HANDLE_BYTES);
    return CIPC_CUDA(cudaIpcOpenMemHandle(d_p, h,
                                          cudaIpcMemLazyEnablePeerAccess));
}

bt_status_t kv_cipc_connect(kv_cipc_t *ctx, const void *buf, size_t len,
                            kv_cipc_peer_t **peer_p)
{
    kv_cipc_desc_t d;
    kv_cipc_peer_t *peer;
    bt_status_t status;

    status = kv_cipc_desc_parse(buf, len, &d);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < ctx->n_peers; i++) {
        if (ctx->peers[i]->desc.pool_id == d.pool_id) {
            ctx->peers[i]->refs++;
            *peer_p = ctx->peers[i];
            return BT_OK;
        }
    }
    if (ctx->n_peers == CIPC_MAX_PEERS)
        return BT_ERROR(BT_ERR_NO_RESOURCE, "KV", "too many CUDA IPC pools "
                        "mapped");
    peer = bt_calloc(1, sizeof(*peer), "kv_cipc_peer");
    if (peer == NULL)
        return BT_ERR_NO_MEMORY;
    peer->ctx = ctx;
    peer->desc = d;
    /* Map into ctx's device (the backend may have switched meanwhile). */
    status = CIPC_CUDA(cudaSetDevice(ctx->device));
    if (status == BT_OK)
        status = peer_setup(ctx, peer);
    if (status == BT_OK)
        status = open_handle(d.k_handle, (void **)&peer->d_k);
    if (status == BT_OK)
        status = open_handle(d.v_handle, (void **)&peer->d_v);
    if (status == BT_OK)
        status = open_handle(d.arrival_handle, (void **)&peer->d_arrival);
    if (status != BT_OK) {
        peer_unmap(peer);
        return status;
    }
    BT_LOG_INFO("KV", "CUDA IPC pool %016llx of pid %u mapped (device %d, "
                "%s): %s, copies from device %d (%s)",
                (unsigned long long)d.pool_id, d.pid, d.device, d.bus_id,
                kv_cipc_peer_transport(peer), ctx->device, ctx->bus_id);
    peer->refs = 1;
    ctx->peers[ctx->n_peers++] = peer;
    *peer_p = peer;
    return BT_OK;
}

void kv_cipc_release(kv_cipc_peer_t **peer_p)
{
    if (*peer_p == NULL)
        return;
    BT_ASSERT((*peer_p)->refs > 0);
    (*peer_p)->refs--;
    *peer_p = NULL;
}

void kv_cipc_retire_unlisted(kv_cipc_t *ctx, const uint64_t *ids, int n)
{
    bool synced = false;

    for (int i = 0; i < ctx->n_peers;) {
        kv_cipc_peer_t *peer = ctx->peers[i];
        bool listed = false;
        for (int k = 0; k < n && !listed; k++)
            listed = ids[k] == peer->desc.pool_id;
        if (listed || peer->refs > 0) {
            i++;
            continue;
        }
        if (!synced) {
            (void)cudaStreamSynchronize(ctx->stream);
            synced = true;
        }
        BT_LOG_INFO("KV", "CUDA IPC pool %016llx unmapped",
                    (unsigned long long)peer->desc.pool_id);
        peer_unmap(peer);
        ctx->peers[i] = ctx->peers[--ctx->n_peers];
    }
}

const kv_cipc_desc_t *kv_cipc_peer_desc(const kv_cipc_peer_t *peer)
{
    return &peer->desc;
}

bool kv_cipc_peer_is_p2p(const kv_cipc_peer_t *peer)
{
    return peer->p2p;
}

const char *kv_cipc_peer_transport(const kv_cipc_peer_t *peer)
{
    return peer->p2p ? "cuda-ipc(p2p)" : "cuda-ipc";
}

bt_status_t kv_cipc_put_layer(kv_cipc_peer_t *peer, int layer,
                              const void *src_k, const void *src_v,
                              const kv_layout_t *src_layout,
                              const int *src_ids, const int *dst_ids, int n)
{
    kv_reshard_side_t src = kv_reshard_side_whole(src_layout);

    return kv_cipc_put_layer_heads(peer, layer, src_k, src_v, &src, 0,
                                   src_ids, dst_ids, n);
}

bt_status_t kv_cipc_put_layer_heads(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    int dst_head0, const int *src_ids,
                                    const int *dst_ids, int n)
{
    const kv_layout_t *dl = &peer->desc.layout;
    kv_cipc_t *ctx = peer->ctx;
    kv_reshard_side_t dst;
    size_t layer_off;
    int n_copies = 0;
    bt_status_t status;

    if (layer < 0 || layer >= dl->n_layers)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC put: layer %d of "
                        "%d", layer, dl->n_layers);
    dst.n_heads_total = src->n_heads_total;
    dst.head0 = dst_head0;
    dst.layout = *dl;
    if (n > ctx->plan_cap) {
        int cap = BT_MAX(n, 2 * ctx->plan_cap);
        kv_copy2d_t *p = bt_realloc(ctx->plan, (size_t)cap * sizeof(*p),
                                    "kv_cipc_plan");
        if (p == NULL)
            return BT_ERR_NO_MEMORY;
        ctx->plan = p;
        ctx->plan_cap = cap;
    }
    /* Checks the block shapes and ids; TP 1 on both sides gives one 1D
     * copy per run of consecutive ids (the plan before re-sharding). */
    status = kv_reshard_plan(src, &dst, src_ids, dst_ids, n, ctx->plan,
                             ctx->plan_cap, &n_copies);
    if (status != BT_OK)
        return status;
    layer_off = (size_t)layer * kv_layout_layer_bytes(dl);
    for (int i = 0; i < n_copies; i++) {
        const kv_copy2d_t *c = &ctx->plan[i];
        for (int kv = 0; kv < 2; kv++) {
            const char *s = (const char *)(kv ? src_v : src_k) + c->src_off;
            char *d = (kv ? peer->d_v : peer->d_k) + layer_off + c->dst_off;
            /* cudaMemcpyDefault: same GPU, or a peer GPU's pool (UVA). */
            if (c->height == 1)
                status = CIPC_CUDA(cudaMemcpyAsync(d, s, c->width,
                                                   cudaMemcpyDefault,
                                                   ctx->stream));
            else
                status = CIPC_CUDA(cudaMemcpy2DAsync(
                    d, c->dpitch, s, c->spitch, c->width, c->height,
                    cudaMemcpyDefault, ctx->stream));
            if (status != BT_OK)
                return status;
            ctx->copies++;
            ctx->bytes += c->width * c->height;
        }
    }
    return BT_OK;
}

bt_status_t kv_cipc_commit(kv_cipc_peer_t *peer, int slot, uint64_t epoch,
                           kv_cipc_commit_t **commit_p)
{
    kv_cipc_t *ctx = peer->ctx;
    kv_cipc_commit_t *c;
    bt_status_t status;

    if (slot < 0 || slot >= peer->desc.n_slots || epoch == 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC commit: slot %d",
                        slot);
    c = bt_calloc(1, sizeof(*c), "kv_cipc_commit");
    if (c == NULL)
        return BT_ERR_NO_MEMORY;
    c->epoch = epoch;
    status = CIPC_CUDA(cudaEventCreateWithFlags(&c->done,
                                                cudaEventDisableTiming));
    if (status != BT_OK)
        goto err_free;
    /* Stream order: the epoch lands after every copy enqueued before. */
    status = CIPC_CUDA(cudaMemcpyAsync(peer->d_arrival + slot, &c->epoch,
                                       sizeof(c->epoch),
                                       cudaMemcpyHostToDevice, ctx->stream));
    if (status != BT_OK)
        goto err_event;
    status = CIPC_CUDA(cudaEventRecord(c->done, ctx->stream));
    if (status != BT_OK)
        goto err_event;
    *commit_p = c;
    return BT_OK;

err_event:
    (void)cudaStreamSynchronize(ctx->stream); /* c->epoch may be read */
    cudaEventDestroy(c->done);
err_free:
    bt_free(c);
    return status;
}

bt_status_t kv_cipc_commit_query(kv_cipc_commit_t *commit)
{
    cudaError_t err = cudaEventQuery(commit->done);

    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return BT_IN_PROGRESS;
    }
    return CIPC_CUDA(err);
}

void kv_cipc_commit_destroy(kv_cipc_commit_t **commit_p)
{
    kv_cipc_commit_t *c = *commit_p;

    if (c == NULL)
        return;
    (void)cudaEventSynchronize(c->done);
    cudaEventDestroy(c->done);
    bt_free(c);
    *commit_p = NULL;
}

uint64_t kv_cipc_copies(const kv_cipc_t *ctx)
{
    return ctx->copies;
}

uint64_t kv_cipc_bytes(const kv_cipc_t *ctx)
{
    return ctx->bytes;
}

#else /* !BATON_HAVE_CUDA */
// ---------------------------------------------------------------------------
// Without CUDA: every device call fails cleanly.

#define CIPC_NO_CUDA()                                                      \
    BT_ERROR(BT_ERR_UNSUPPORTED, "KV", "built without CUDA: no CUDA IPC")

struct kv_cipc_pool_s {
    int unused;
};
struct kv_cipc_s {
    int unused;
};
struct kv_cipc_peer_s {
    kv_cipc_desc_t desc;
};
struct kv_cipc_commit_s {
    int unused;
};

bool kv_cipc_is_available(void)
{
    return false;
}

bt_status_t kv_cipc_gpu_info(int device, kv_cipc_gpu_info_t *info)
{
    (void)device;
    (void)info;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_memcpy(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_pool_export(const kv_layout_t *layout,
                                void *const *k_layers, void *const *v_layers,
                                int device, int n_slots,
                                kv_cipc_pool_t **pool_p)
{
    (void)layout;
    (void)k_layers;
    (void)v_layers;
    (void)device;
    (void)n_slots;
    (void)pool_p;
    return CIPC_NO_CUDA();
}

void kv_cipc_pool_destroy(kv_cipc_pool_t **pool_p)
{
    *pool_p = NULL;
}

const uint8_t *kv_cipc_pool_desc(const kv_cipc_pool_t *pool, size_t *len_p)
{
    (void)pool;
    *len_p = 0;
    return NULL;
}

bt_status_t kv_cipc_pool_has_arrived(kv_cipc_pool_t *pool, int slot,
                                     uint64_t epoch, bool *arrived_p)
{
    (void)pool;
    (void)slot;
    (void)epoch;
    *arrived_p = false;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_pool_slot_reset(kv_cipc_pool_t *pool, int slot)
{
    (void)pool;
    (void)slot;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_create(kv_cipc_t **ctx_p)
{
    (void)ctx_p;
    return CIPC_NO_CUDA();
}

void kv_cipc_destroy(kv_cipc_t **ctx_p)
{
    *ctx_p = NULL;
}

bt_status_t kv_cipc_connect(kv_cipc_t *ctx, const void *desc, size_t len,
                            kv_cipc_peer_t **peer_p)
{
    kv_cipc_desc_t d;
    bt_status_t status = kv_cipc_desc_parse(desc, len, &d);

    (void)ctx;
    (void)peer_p;
    return status != BT_OK ? status : CIPC_NO_CUDA();
}

void kv_cipc_release(kv_cipc_peer_t **peer_p)
{
    *peer_p = NULL;
}

void kv_cipc_retire_unlisted(kv_cipc_t *ctx, const uint64_t *ids, int n)
{
    (void)ctx;
    (void)ids;
    (void)n;
}

const kv_cipc_desc_t *kv_cipc_peer_desc(const kv_cipc_peer_t *peer)
{
    return &peer->desc;
}

bt_status_t kv_cipc_put_layer(kv_cipc_peer_t *peer, int layer,
                              const void *src_k, const void *src_v,
                              const kv_layout_t *src_layout,
                              const int *src_ids, const int *dst_ids, int n)
{
    (void)peer;
    (void)layer;
    (void)src_k;
    (void)src_v;
    (void)src_layout;
    (void)src_ids;
    (void)dst_ids;
    (void)n;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_commit(kv_cipc_peer_t *peer, int slot, uint64_t epoch,
                           kv_cipc_commit_t **commit_p)
{
    (void)peer;
    (void)slot;
    (void)epoch;
    (void)commit_p;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_commit_query(kv_cipc_commit_t *commit)
{
    (void)commit;
    return CIPC_NO_CUDA();
}

void kv_cipc_commit_destroy(kv_cipc_commit_t **commit_p)
{
    *commit_p = NULL;
}

bool kv_cipc_peer_is_p2p(const kv_cipc_peer_t *peer)
{
    (void)peer;
    return false;
}

const char *kv_cipc_peer_transport(const kv_cipc_peer_t *peer)
{
    (void)peer;
    return "cuda-ipc";
}

bt_status_t kv_cipc_put_layer_heads(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    int dst_head0, const int *src_ids,
                                    const int *dst_ids, int n)
{
    (void)peer;
    (void)layer;
    (void)src_k;
    (void)src_v;
    (void)src;
    (void)dst_head0;
    (void)src_ids;
    (void)dst_ids;
    (void)n;
    return CIPC_NO_CUDA();
}

uint64_t kv_cipc_copies(const kv_cipc_t *ctx)
{
    (void)ctx;
    return 0;
}

uint64_t kv_cipc_bytes(const kv_cipc_t *ctx)
{
    (void)ctx;
    return 0;
}
#endif /* BATON_HAVE_CUDA */
