/*
 * kv_transport_cuda_ipc.c - KV hand-off over CUDA IPC (see
 * kv_transport_cuda_ipc.h).  The descriptor codec is plain C; everything
 * that touches the device is compiled only with BATON_HAVE_CUDA and
 * returns BT_ERR_UNSUPPORTED otherwise.
 */
#include "kv/kv_transport_cuda_ipc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_reshard.h"

#ifdef BATON_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "kv/kv_fd_channel.h"
#include "kv/kv_window_pool.h"
#endif

// ---------------------------------------------------------------------------
// Descriptor codec: little-endian records, FNV-1a checksummed.
// Version 1 (fixed size):
//   u32 magic 'BTCI', u32 version, u32 size, u32 pid, u64 pool_id,
//   i32 device, char bus_id[32], u32 layout[6], u32 n_slots,
//   u8 k_handle[64], u8 v_handle[64], u8 arrival_handle[64], u64 checksum
// Version 2 (a TP pool; size grows with n_ranks):
//   u32 magic, u32 version 2, u32 size, u32 pid, u64 pool_id,
//   u32 n_ranks, u32 n_heads_total, u32 layout[6] (one rank's), u32 n_slots,
//   u8 arrival_handle[64] (on rank 0's GPU),
//   n_ranks x { i32 device, char bus_id[32], u32 head0, u8 k_handle[64],
//               u8 v_handle[64] },
//   u64 checksum
// Version 3 (windowed, fixed size: no handle; windows come per grant as
// FDs from the decode worker's FD channel):
//   u32 magic, u32 version 3, u32 size, u32 pid, u64 pool_id,
//   i32 device, char bus_id[32], u32 layout[6], u32 n_slots,
//   char fd_socket[48], u64 checksum

#define CIPC_MAGIC 0x49435442u /* "BTCI" */
#define CIPC_DESC_SIZE (4 * 4 + 8 + 4 + KV_CIPC_BUS_ID_LEN + 6 * 4 + 4 + \
                        3 * KV_CIPC_HANDLE_BYTES + 8)
#define CIPC_V2_HEAD (4 * 4 + 8 + 4 + 4 + 6 * 4 + 4 + KV_CIPC_HANDLE_BYTES)
#define CIPC_V2_RANK (4 + KV_CIPC_BUS_ID_LEN + 4 + 2 * KV_CIPC_HANDLE_BYTES)
#define CIPC_V2_SIZE(n) ((size_t)CIPC_V2_HEAD + (size_t)(n) * CIPC_V2_RANK + 8)
#define CIPC_DESC_MAX CIPC_V2_SIZE(KV_CIPC_MAX_RANKS)
#define CIPC_V3_SIZE (4 * 4 + 8 + 4 + KV_CIPC_BUS_ID_LEN + 6 * 4 + 4 + \
                      KV_CIPC_SOCKET_LEN + 8)

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

static void put_bytes(uint8_t **p, const void *src, size_t n)
{
    memcpy(*p, src, n);
    *p += n;
}

static void put_bus_id(uint8_t **p, const char *bus_id)
{
    memset(*p, 0, KV_CIPC_BUS_ID_LEN);
    snprintf((char *)*p, KV_CIPC_BUS_ID_LEN, "%s", bus_id);
    *p += KV_CIPC_BUS_ID_LEN;
}

static void put_layout(uint8_t **p, const kv_layout_t *l)
{
    put_u32(p, (uint32_t)l->n_layers);
    put_u32(p, (uint32_t)l->n_blocks);
    put_u32(p, (uint32_t)l->block_size);
    put_u32(p, (uint32_t)l->n_kv_heads);
    put_u32(p, (uint32_t)l->head_dim);
    put_u32(p, (uint32_t)l->elem_size);
}

size_t kv_cipc_desc_size(void)
{
    return CIPC_DESC_SIZE;
}

size_t kv_cipc_desc_encoded_size(const kv_cipc_desc_t *desc)
{
    if (desc->windowed)
        return CIPC_V3_SIZE;
    return desc->n_ranks <= 1 ? CIPC_DESC_SIZE : CIPC_V2_SIZE(desc->n_ranks);
}

int kv_cipc_desc_n_ranks(const kv_cipc_desc_t *desc)
{
    return desc->n_ranks >= 2 ? desc->n_ranks : 1;
}

int kv_cipc_desc_heads_total(const kv_cipc_desc_t *desc)
{
    return desc->n_ranks >= 2 ? desc->n_heads_total
                              : desc->layout.n_kv_heads;
}

kv_cipc_rank_desc_t kv_cipc_desc_rank(const kv_cipc_desc_t *desc, int rank)
{
    kv_cipc_rank_desc_t r;

    if (desc->n_ranks >= 2 && rank >= 0 && rank < desc->n_ranks)
        return desc->ranks[rank];
    memset(&r, 0, sizeof(r));
    r.device = desc->device;
    snprintf(r.bus_id, sizeof(r.bus_id), "%s", desc->bus_id);
    r.head0 = 0;
    memcpy(r.k_handle, desc->k_handle, KV_CIPC_HANDLE_BYTES);
    memcpy(r.v_handle, desc->v_handle, KV_CIPC_HANDLE_BYTES);
    return r;
}

bt_status_t kv_cipc_desc_encode(const kv_cipc_desc_t *d, uint8_t *buf,
                                size_t cap)
{
    uint8_t *p = buf;
    size_t size = kv_cipc_desc_encoded_size(d);

    if (cap < size)
        return BT_ERR_INVALID_ARG;
    if (d->windowed) {
        if (d->n_ranks > 1 ||
            memchr(d->fd_socket, '\0', KV_CIPC_SOCKET_LEN) == NULL ||
            d->fd_socket[0] == '\0')
            return BT_ERR_INVALID_ARG;
        put_u32(&p, CIPC_MAGIC);
        put_u32(&p, KV_CIPC_DESC_VERSION_WIN);
        put_u32(&p, CIPC_V3_SIZE);
        put_u32(&p, d->pid);
        put_u64(&p, d->pool_id);
        put_u32(&p, (uint32_t)d->device);
        put_bus_id(&p, d->bus_id);
        put_layout(&p, &d->layout);
        put_u32(&p, (uint32_t)d->n_slots);
        memset(p, 0, KV_CIPC_SOCKET_LEN);
        memcpy(p, d->fd_socket, strlen(d->fd_socket));
        p += KV_CIPC_SOCKET_LEN;
    } else if (d->n_ranks <= 1) {
        put_u32(&p, CIPC_MAGIC);
        put_u32(&p, KV_CIPC_DESC_VERSION);
        put_u32(&p, CIPC_DESC_SIZE);
        put_u32(&p, d->pid);
        put_u64(&p, d->pool_id);
        put_u32(&p, (uint32_t)d->device);
        put_bus_id(&p, d->bus_id);
        put_layout(&p, &d->layout);
        put_u32(&p, (uint32_t)d->n_slots);
        put_bytes(&p, d->k_handle, KV_CIPC_HANDLE_BYTES);
        put_bytes(&p, d->v_handle, KV_CIPC_HANDLE_BYTES);
        put_bytes(&p, d->arrival_handle, KV_CIPC_HANDLE_BYTES);
    } else {
        if (d->n_ranks > KV_CIPC_MAX_RANKS ||
            d->n_heads_total != d->n_ranks * d->layout.n_kv_heads)
            return BT_ERR_INVALID_ARG;
        put_u32(&p, CIPC_MAGIC);
        put_u32(&p, KV_CIPC_DESC_VERSION_TP);
        put_u32(&p, (uint32_t)size);
        put_u32(&p, d->pid);
        put_u64(&p, d->pool_id);
        put_u32(&p, (uint32_t)d->n_ranks);
        put_u32(&p, (uint32_t)d->n_heads_total);
        put_layout(&p, &d->layout);
        put_u32(&p, (uint32_t)d->n_slots);
        put_bytes(&p, d->arrival_handle, KV_CIPC_HANDLE_BYTES);
        for (int r = 0; r < d->n_ranks; r++) {
            const kv_cipc_rank_desc_t *rk = &d->ranks[r];
            put_u32(&p, (uint32_t)rk->device);
            put_bus_id(&p, rk->bus_id);
            put_u32(&p, (uint32_t)rk->head0);
            put_bytes(&p, rk->k_handle, KV_CIPC_HANDLE_BYTES);
            put_bytes(&p, rk->v_handle, KV_CIPC_HANDLE_BYTES);
        }
    }
    put_u64(&p, bt_fnv1a64(buf, (size_t)(p - buf)));
    BT_ASSERT((size_t)(p - buf) == size);
    return BT_OK;
}

/* The layout fields v[6] and the slot count: in range, sizes without
 * overflow. */
static bt_status_t cipc_check_layout(const uint32_t *v, uint32_t slots,
                                     kv_cipc_desc_t *d)
{
    size_t bytes;

    d->n_slots = (int)BT_MIN(slots, (uint32_t)INT32_MAX);
    if (v[0] < 1 || v[0] > 4096 || v[1] < 1 || v[1] > (1u << 24) ||
        v[2] < 1 || v[2] > 4096 || v[3] < 1 || v[3] > 4096 || v[4] < 1 ||
        v[4] > 4096 || (v[5] != 1 && v[5] != 2 && v[5] != 4) ||
        d->n_slots < 1 || d->n_slots > KV_CIPC_MAX_SLOTS)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor layout "
                        "out of range");
    d->layout.n_layers = (int)v[0];
    d->layout.n_blocks = (int)v[1];
    d->layout.block_size = (int)v[2];
    d->layout.n_kv_heads = (int)v[3];
    d->layout.head_dim = (int)v[4];
    d->layout.elem_size = v[5];
    /* n_layers * n_blocks * block bytes must fit a size_t. */
    bytes = (size_t)v[2] * v[3] * v[4] * v[5]; /* < 2^38 */
    if (bt_mul_overflow_size(bytes, v[1], &bytes) ||
        bt_mul_overflow_size(bytes, v[0], &bytes))
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC pool size overflows");
    return BT_OK;
}

static bt_status_t cipc_get_bus_id(const uint8_t **p, char *out)
{
    if (memchr(*p, '\0', KV_CIPC_BUS_ID_LEN) == NULL)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC bus id unterminated");
    snprintf(out, KV_CIPC_BUS_ID_LEN, "%s", (const char *)*p);
    *p += KV_CIPC_BUS_ID_LEN;
    return BT_OK;
}

static bt_status_t cipc_parse_v2(const uint8_t *p, size_t len,
                                 kv_cipc_desc_t *d)
{
    uint32_t v[6], n_ranks, total, slots;
    bt_status_t status;

    n_ranks = get_u32(&p);
    total = get_u32(&p);
    if (n_ranks < 2 || n_ranks > KV_CIPC_MAX_RANKS ||
        len != CIPC_V2_SIZE(n_ranks))
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor of %u "
                        "ranks in %zu bytes", n_ranks, len);
    for (int i = 0; i < 6; i++)
        v[i] = get_u32(&p);
    slots = get_u32(&p);
    status = cipc_check_layout(v, slots, d);
    if (status != BT_OK)
        return status;
    if (total != n_ranks * v[3])
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: %u ranks "
                        "of %u heads are not %u heads", n_ranks, v[3], total);
    d->n_ranks = (int)n_ranks;
    d->n_heads_total = (int)total;
    memcpy(d->arrival_handle, p, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    for (uint32_t r = 0; r < n_ranks; r++) {
        kv_cipc_rank_desc_t *rk = &d->ranks[r];
        rk->device = (int32_t)get_u32(&p);
        if (rk->device < 0 || rk->device > 1024)
            return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: "
                            "device %d", rk->device);
        status = cipc_get_bus_id(&p, rk->bus_id);
        if (status != BT_OK)
            return status;
        rk->head0 = (int)get_u32(&p);
        if ((uint32_t)rk->head0 != r * v[3])
            return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: rank "
                            "%u holds heads from %d, not %u", r, rk->head0,
                            r * v[3]);
        memcpy(rk->k_handle, p, KV_CIPC_HANDLE_BYTES);
        p += KV_CIPC_HANDLE_BYTES;
        memcpy(rk->v_handle, p, KV_CIPC_HANDLE_BYTES);
        p += KV_CIPC_HANDLE_BYTES;
    }
    /* the top level repeats rank 0 */
    d->device = d->ranks[0].device;
    snprintf(d->bus_id, sizeof(d->bus_id), "%s", d->ranks[0].bus_id);
    memcpy(d->k_handle, d->ranks[0].k_handle, KV_CIPC_HANDLE_BYTES);
    memcpy(d->v_handle, d->ranks[0].v_handle, KV_CIPC_HANDLE_BYTES);
    return BT_OK;
}

bt_status_t kv_cipc_desc_parse(const void *buf, size_t len,
                               kv_cipc_desc_t *out)
{
    const uint8_t *p = buf;
    kv_cipc_desc_t d;
    uint32_t v[6], version, size;
    bt_status_t status;

    if (buf == NULL || len < CIPC_V2_SIZE(0) || len > CIPC_DESC_MAX)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor of %zu "
                        "bytes", len);
    {
        const uint8_t *c = p + len - 8;
        if (get_u64(&c) != bt_fnv1a64(p, len - 8))
            return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor "
                            "checksum mismatch");
    }
    memset(&d, 0, sizeof(d));
    if (get_u32(&p) != CIPC_MAGIC)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "not a CUDA IPC descriptor");
    version = get_u32(&p);
    size = get_u32(&p);
    if ((version != KV_CIPC_DESC_VERSION &&
         version != KV_CIPC_DESC_VERSION_TP &&
         version != KV_CIPC_DESC_VERSION_WIN) || size != len ||
        (version == KV_CIPC_DESC_VERSION && len != CIPC_DESC_SIZE) ||
        (version == KV_CIPC_DESC_VERSION_WIN && len != CIPC_V3_SIZE))
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor version "
                        "%u of %u bytes", version, size);
    d.pid = get_u32(&p);
    d.pool_id = get_u64(&p);
    if (version == KV_CIPC_DESC_VERSION_TP) {
        status = cipc_parse_v2(p, len, &d);
        if (status != BT_OK)
            return status;
        *out = d;
        return BT_OK;
    }
    d.device = (int32_t)get_u32(&p);
    if (d.device < 0 || d.device > 1024)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: device "
                        "%d", d.device);
    status = cipc_get_bus_id(&p, d.bus_id);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < 6; i++)
        v[i] = get_u32(&p);
    status = cipc_check_layout(v, get_u32(&p), &d);
    if (status != BT_OK)
        return status;
    if (version == KV_CIPC_DESC_VERSION_WIN) {
        /* a name of printable characters, NUL-terminated, not empty */
        size_t n = strnlen((const char *)p, KV_CIPC_SOCKET_LEN);
        if (n == 0 || n == KV_CIPC_SOCKET_LEN)
            return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: bad "
                            "FD channel name");
        for (size_t i = 0; i < n; i++)
            if (p[i] < 0x21 || p[i] > 0x7e)
                return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC descriptor: "
                                "bad FD channel name");
        memcpy(d.fd_socket, p, n);
        d.windowed = true;
        *out = d;
        return BT_OK;
    }
    memcpy(d.k_handle, p, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(d.v_handle, p, KV_CIPC_HANDLE_BYTES);
    p += KV_CIPC_HANDLE_BYTES;
    memcpy(d.arrival_handle, p, KV_CIPC_HANDLE_BYTES);
    *out = d;
    return BT_OK;
}

size_t kv_cipc_window_data_bytes(const kv_layout_t *layout, int n_blocks)
{
    return 2 * (size_t)layout->n_layers * (size_t)n_blocks *
           kv_layout_block_bytes(layout);
}

void kv_cipc_window_grant_encode(const uint8_t *token, int n_blocks,
                                 uint8_t *out)
{
    uint8_t *p = out + KV_CIPC_TOKEN_BYTES;

    memcpy(out, token, KV_CIPC_TOKEN_BYTES);
    put_u32(&p, (uint32_t)n_blocks);
}

/* The most blocks a grant's window may have. */
#define CIPC_WINDOW_MAX_BLOCKS (1 << 24)

bt_status_t kv_cipc_window_grant_parse(const uint8_t *buf, size_t len,
                                       uint8_t *token, int *n_blocks_p)
{
    const uint8_t *p;
    uint32_t n;

    if (buf == NULL || len != KV_CIPC_GRANT_BYTES)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC window grant of %zu "
                        "bytes", len);
    p = buf + KV_CIPC_TOKEN_BYTES;
    n = get_u32(&p);
    if (n < 1 || n > (uint32_t)CIPC_WINDOW_MAX_BLOCKS)
        return BT_ERROR(BT_ERR_FORMAT, "KV", "CUDA IPC window of %u blocks",
                        n);
    memcpy(token, buf, KV_CIPC_TOKEN_BYTES);
    *n_blocks_p = (int)n;
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

bt_status_t kv_cipc_memcpy2d(void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height)
{
    return CIPC_CUDA(cudaMemcpy2D(dst, dpitch, src, spitch, width, height,
                                  cudaMemcpyDefault));
}

struct kv_cipc_pool_s {
    uint64_t *d_arrival;          /* (n_slots) epochs, on device; NULL
                                     when windowed (the epoch is in each
                                     window) */
    int n_slots;
    int device;                   /* rank 0's */
    uint8_t desc[CIPC_DESC_MAX];  /* encoded descriptor */
    size_t desc_len;
    /* windowed (kv_cipc_pool_export_windowed) */
    bool windowed;
    kv_layout_t layout;
    kv_fdch_t *fdch;              /* hands each window's FD by token */
    size_t window_budget;         /* bytes all windows' allocations may
                                     take, made ahead and pending release
                                     included */
    kv_winpool_t *winpool;        /* makes them ahead, releases them later */
    CUmemAllocationProp win_prop; /* a window allocation's properties */
    size_t win_gran;              /* and their granularity */
};

// ---------------------------------------------------------------------------
// The driver's virtual memory API (cuMemCreate & co.), reached through the
// runtime's entry point: the build links cudart only, never libcuda.

typedef CUresult (*cipc_cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cipc_cuDeviceGetAttribute_t)(int *, CUdevice_attribute,
                                                CUdevice);
typedef CUresult (*cipc_cuMemCreate_t)(CUmemGenericAllocationHandle *, size_t,
                                       const CUmemAllocationProp *,
                                       unsigned long long);
typedef CUresult (*cipc_cuMemRelease_t)(CUmemGenericAllocationHandle);
typedef CUresult (*cipc_cuMemAddressReserve_t)(CUdeviceptr *, size_t, size_t,
                                               CUdeviceptr,
                                               unsigned long long);
typedef CUresult (*cipc_cuMemAddressFree_t)(CUdeviceptr, size_t);
typedef CUresult (*cipc_cuMemMap_t)(CUdeviceptr, size_t, size_t,
                                    CUmemGenericAllocationHandle,
                                    unsigned long long);
typedef CUresult (*cipc_cuMemUnmap_t)(CUdeviceptr, size_t);
typedef CUresult (*cipc_cuMemSetAccess_t)(CUdeviceptr, size_t,
                                          const CUmemAccessDesc *, size_t);
typedef CUresult (*cipc_cuMemExportToShareableHandle_t)(
    void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
    unsigned long long);
typedef CUresult (*cipc_cuMemImportFromShareableHandle_t)(
    CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
typedef CUresult (*cipc_cuMemGetAllocationGranularity_t)(
    size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*cipc_cuMemGetAllocationPropertiesFromHandle_t)(
    CUmemAllocationProp *, CUmemGenericAllocationHandle);
typedef CUresult (*cipc_cuGetErrorName_t)(CUresult, const char **);

static struct {
    bool tried, ok;
    cipc_cuDeviceGet_t DeviceGet;
    cipc_cuDeviceGetAttribute_t DeviceGetAttribute;
    cipc_cuMemCreate_t MemCreate;
    cipc_cuMemRelease_t MemRelease;
    cipc_cuMemAddressReserve_t MemAddressReserve;
    cipc_cuMemAddressFree_t MemAddressFree;
    cipc_cuMemMap_t MemMap;
    cipc_cuMemUnmap_t MemUnmap;
    cipc_cuMemSetAccess_t MemSetAccess;
    cipc_cuMemExportToShareableHandle_t MemExport;
    cipc_cuMemImportFromShareableHandle_t MemImport;
    cipc_cuMemGetAllocationGranularity_t MemGranularity;
    cipc_cuMemGetAllocationPropertiesFromHandle_t MemGetProps;
    cipc_cuGetErrorName_t GetErrorName; /* optional: names in messages */
} cipc_drv;

static bool cipc_sym(const char *name, void **fn_p)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;

    /* 12000: the ABI of these symbols since CUDA 12 (they date from 10.2) */
    if (cudaGetDriverEntryPointByVersion(name, fn_p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || *fn_p == NULL) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

/* Resolves the driver symbols once (main thread: the workers' loops). */
static bool cipc_driver_load(void)
{
    if (cipc_drv.tried)
        return cipc_drv.ok;
    cipc_drv.tried = true;
    if (!cipc_sym("cuGetErrorName", (void **)&cipc_drv.GetErrorName))
        cipc_drv.GetErrorName = NULL;
    cipc_drv.ok =
        cipc_sym("cuDeviceGet", (void **)&cipc_drv.DeviceGet) &&
        cipc_sym("cuDeviceGetAttribute",
                 (void **)&cipc_drv.DeviceGetAttribute) &&
        cipc_sym("cuMemCreate", (void **)&cipc_drv.MemCreate) &&
        cipc_sym("cuMemRelease", (void **)&cipc_drv.MemRelease) &&
        cipc_sym("cuMemAddressReserve",
                 (void **)&cipc_drv.MemAddressReserve) &&
        cipc_sym("cuMemAddressFree", (void **)&cipc_drv.MemAddressFree) &&
        cipc_sym("cuMemMap", (void **)&cipc_drv.MemMap) &&
        cipc_sym("cuMemUnmap", (void **)&cipc_drv.MemUnmap) &&
        cipc_sym("cuMemSetAccess", (void **)&cipc_drv.MemSetAccess) &&
        cipc_sym("cuMemExportToShareableHandle",
                 (void **)&cipc_drv.MemExport) &&
        cipc_sym("cuMemImportFromShareableHandle",
                 (void **)&cipc_drv.MemImport) &&
        cipc_sym("cuMemGetAllocationGranularity",
                 (void **)&cipc_drv.MemGranularity) &&
        cipc_sym("cuMemGetAllocationPropertiesFromHandle",
                 (void **)&cipc_drv.MemGetProps);
    return cipc_drv.ok;
}

/* Converts a driver result at the boundary; logs once. */
#define CIPC_CU(_expr) cipc_cu_check((_expr), #_expr, __func__)

static bt_status_t cipc_cu_check(CUresult res, const char *expr,
                                 const char *func)
{
    const char *name = NULL;

    if (res == CUDA_SUCCESS)
        return BT_OK;
    if (cipc_drv.GetErrorName == NULL ||
        cipc_drv.GetErrorName(res, &name) != CUDA_SUCCESS || name == NULL)
        name = "unnamed";
    return BT_ERROR(BT_ERR_CUDA, "KV", "%s: %s failed: %s (CUresult %d)",
                    func, expr, name, (int)res);
}

/* The allocation properties of a window on `device` (an ordinal of this
 * process): device memory, exportable as a POSIX FD. */
static bt_status_t cipc_window_prop(int device, CUmemAllocationProp *prop,
                                    size_t *gran_p)
{
    CUdevice dev;
    bt_status_t status = CIPC_CU(cipc_drv.DeviceGet(&dev, device));

    if (status != BT_OK)
        return status;
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return CIPC_CU(cipc_drv.MemGranularity(gran_p, prop,
                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

/* Bytes of a window of n blocks: the K|V data of every layer, then the
 * 8-byte epoch word at a 256-byte boundary, rounded to `gran`. */
static size_t cipc_window_size(const kv_layout_t *layout, int n_blocks,
                               size_t gran, size_t *epoch_off_p)
{
    size_t off = (kv_cipc_window_data_bytes(layout, n_blocks) + 255) &
                 ~(size_t)255;

    *epoch_off_p = off;
    return (off + sizeof(uint64_t) + gran - 1) / gran * gran;
}

/* Maps allocation `h` of `size` bytes at a fresh address, read-write for
 * device `device` (an ordinal of this process). */
static bt_status_t cipc_map(CUmemGenericAllocationHandle h, size_t size,
                            size_t gran, int device, CUdeviceptr *base_p)
{
    CUmemAccessDesc acc;
    CUdeviceptr base = 0;
    CUdevice dev;
    bt_status_t status = CIPC_CU(cipc_drv.DeviceGet(&dev, device));

    if (status != BT_OK)
        return status;
    status = CIPC_CU(cipc_drv.MemAddressReserve(&base, size, gran, 0, 0));
    if (status != BT_OK)
        return status;
    status = CIPC_CU(cipc_drv.MemMap(base, size, 0, h, 0));
    if (status != BT_OK)
        goto err_free;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    status = CIPC_CU(cipc_drv.MemSetAccess(base, size, &acc, 1));
    if (status != BT_OK)
        goto err_unmap;
    *base_p = base;
    return BT_OK;

err_unmap:
    (void)cipc_drv.MemUnmap(base, size);
err_free:
    (void)cipc_drv.MemAddressFree(base, size);
    return status;
}

static void cipc_unmap(CUdeviceptr base, size_t size,
                       CUmemGenericAllocationHandle h)
{
    if (base != 0) {
        (void)cipc_drv.MemUnmap(base, size);
        (void)cipc_drv.MemAddressFree(base, size);
    }
    if (h != 0)
        (void)cipc_drv.MemRelease(h);
}

bool kv_cipc_windows_supported(int device)
{
    int vmm = 0, fd = 0;
    CUdevice dev;

    if (!cipc_driver_load() || cipc_drv.DeviceGet(&dev, device) !=
                                   CUDA_SUCCESS)
        return false;
    if (cipc_drv.DeviceGetAttribute(
            &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            dev) != CUDA_SUCCESS ||
        cipc_drv.DeviceGetAttribute(
            &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            dev) != CUDA_SUCCESS)
        return false;
    return vmm != 0 && fd != 0;
}

bt_status_t kv_cipc_pool_export(const kv_layout_t *layout,
                                void *const *k_layers, void *const *v_layers,
                                int device, int n_slots,
                                kv_cipc_pool_t **pool_p)
{
    return kv_cipc_pool_export_ranks(layout, 1, k_layers, v_layers, &device,
                                     n_slots, pool_p);
}

bt_status_t kv_cipc_pool_export_ranks(const kv_layout_t *layout, int n_ranks,
                                      void *const *k_layers,
                                      void *const *v_layers,
                                      const int *devices, int n_slots,
                                      kv_cipc_pool_t **pool_p)
{
    size_t layer_bytes = kv_layout_layer_bytes(layout);
    const int nl = layout->n_layers;
    kv_cipc_pool_t *pool;
    kv_cipc_desc_t d;
    cudaIpcMemHandle_t h;
    bt_status_t status;

    if (n_slots < 1 || n_slots > KV_CIPC_MAX_SLOTS || nl < 1 ||
        n_ranks < 1 || n_ranks > KV_CIPC_MAX_RANKS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "bad CUDA IPC pool shape");
    for (int r = 0; r < n_ranks; r++) {
        char *k0 = k_layers[(size_t)r * nl], *v0 = v_layers[(size_t)r * nl];
        for (int l = 0; l < nl; l++)
            if ((char *)k_layers[(size_t)r * nl + l] != k0 + l * layer_bytes ||
                (char *)v_layers[(size_t)r * nl + l] != v0 + l * layer_bytes)
                return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC export "
                                "needs K and V each in one allocation for "
                                "all layers");
    }
    pool = bt_calloc(1, sizeof(*pool), "kv_cipc_pool");
    if (pool == NULL)
        return BT_ERR_NO_MEMORY;
    pool->n_slots = n_slots;
    pool->device = devices[0];
    memset(&d, 0, sizeof(d));
    d.pid = (uint32_t)getpid();
    d.pool_id = bt_time_ns() ^ ((uint64_t)getpid() << 40) ^
                (uint64_t)(uintptr_t)pool;
    d.layout = *layout;
    d.n_slots = n_slots;
    if (n_ranks > 1) {
        d.n_ranks = n_ranks;
        d.n_heads_total = n_ranks * layout->n_kv_heads;
    }
    for (int r = 0; r < n_ranks; r++) {
        kv_cipc_rank_desc_t *rk = &d.ranks[r];

        rk->device = devices[r];
        rk->head0 = r * layout->n_kv_heads;
        status = CIPC_CUDA(cudaSetDevice(devices[r]));
        if (status == BT_OK)
            status = CIPC_CUDA(cudaDeviceGetPCIBusId(
                rk->bus_id, KV_CIPC_BUS_ID_LEN, devices[r]));
        if (status == BT_OK)
            status = CIPC_CUDA(cudaIpcGetMemHandle(
                &h, k_layers[(size_t)r * nl]));
        if (status != BT_OK)
            goto err_free;
        memcpy(rk->k_handle, &h, KV_CIPC_HANDLE_BYTES);
        status = CIPC_CUDA(cudaIpcGetMemHandle(&h,
                                               v_layers[(size_t)r * nl]));
        if (status != BT_OK)
            goto err_free;
        memcpy(rk->v_handle, &h, KV_CIPC_HANDLE_BYTES);
    }
    d.device = d.ranks[0].device;
    snprintf(d.bus_id, sizeof(d.bus_id), "%s", d.ranks[0].bus_id);
    memcpy(d.k_handle, d.ranks[0].k_handle, KV_CIPC_HANDLE_BYTES);
    memcpy(d.v_handle, d.ranks[0].v_handle, KV_CIPC_HANDLE_BYTES);
    if (n_ranks == 1)
        memset(d.ranks, 0, sizeof(d.ranks)); /* version 1: top level */
    /* the arrival slots on rank 0's GPU (left current) */
    status = CIPC_CUDA(cudaSetDevice(devices[0]));
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
    status = CIPC_CUDA(cudaIpcGetMemHandle(&h, pool->d_arrival));
    if (status != BT_OK)
        goto err_arrival;
    memcpy(d.arrival_handle, &h, KV_CIPC_HANDLE_BYTES);
    pool->desc_len = kv_cipc_desc_encoded_size(&d);
    status = kv_cipc_desc_encode(&d, pool->desc, sizeof(pool->desc));
    if (status != BT_OK)
        goto err_arrival;
    BT_LOG_INFO("KV", "CUDA IPC pool %016llx exported: %d rank(s) from "
                "device %d (%s), %d layers x %d blocks, %d heads per rank, "
                "%d slots", (unsigned long long)d.pool_id, n_ranks,
                devices[0], d.bus_id, layout->n_layers, layout->n_blocks,
                layout->n_kv_heads, n_slots);
    *pool_p = pool;
    return BT_OK;

err_arrival:
    cudaFree(pool->d_arrival);
err_free:
    (void)cudaSetDevice(devices[0]);
    bt_free(pool);
    return status;
}

void kv_cipc_pool_destroy(kv_cipc_pool_t **pool_p)
{
    kv_cipc_pool_t *pool = *pool_p;

    if (pool == NULL)
        return;
    if (pool->winpool != NULL) {
        kv_winpool_stats_t st;

        /* how often a grant found its window made ahead: the loop's
         * share of the window cost */
        kv_winpool_stats(pool->winpool, &st);
        BT_LOG_INFO("KV", "CUDA IPC windows: %llu made ahead, %llu made on "
                    "the loop; %llu allocations released, %llu of them on "
                    "the loop to make room", (unsigned long long)st.taken_ready,
                    (unsigned long long)st.taken_made,
                    (unsigned long long)st.released,
                    (unsigned long long)st.released_by_take);
    }
    /* windows must be gone (their owner destroys them first); the pool
     * releases what it made ahead or was given back */
    kv_winpool_destroy(&pool->winpool);
    kv_fdch_destroy(&pool->fdch);
    cudaFree(pool->d_arrival);
    bt_free(pool);
    *pool_p = NULL;
}

const uint8_t *kv_cipc_pool_desc(const kv_cipc_pool_t *pool, size_t *len_p)
{
    *len_p = pool->desc_len;
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
    status = CIPC_CUDA(cudaSetDevice(pool->device));
    if (status != BT_OK)
        return status;
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
    /* the legacy stream synchronised below is the arrival GPU's */
    status = CIPC_CUDA(cudaSetDevice(pool->device));
    if (status != BT_OK)
        return status;
    status = CIPC_CUDA(cudaMemcpy(pool->d_arrival + slot, &zero, sizeof(zero),
                                  cudaMemcpyHostToDevice));
    if (status != BT_OK)
        return status;
    /* A pageable host-to-device copy may return before the DMA lands. */
    return CIPC_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
}

// ---------------------------------------------------------------------------
// Decode side: windows, one per grant

/* Ready windows per size class, and the share of the window budget
 * they may take: the pool's thread makes them ahead so that a grant
 * takes one instead of making it on the decode loop. */
#define CIPC_WINDOWS_READY_PER_CLASS 2
#define CIPC_WINDOWS_READY_SHARE 3 /* a third: one full-context window
                                      (the link's budget holds four) */
#define CIPC_WINDOWS_READY_IDLE_MS 30000 /* an idle worker gives them back */

/* A window's physical allocation and our mapping of it, for up to its
 * class's blocks: made and released on the window pool's thread
 * (kv_window_pool.h), or made on the loop when none is ready. */
typedef struct {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr base;
    size_t size;
    atomic_int readers;  /* copies out of it still in flight
                            (kv_cipc_window_read_begin) */
} cipc_alloc_t;

/* How long a release waits for a copy out of the window: the copy waits
 * only for the step in flight, so anything near this is a hung GPU. */
#define CIPC_READ_WAIT_NS (60ull * 1000000000ull)

struct kv_cipc_window_s {
    kv_cipc_pool_t *pool;
    kv_winpool_item_t *item;      /* its cipc_alloc_t, never to be reused */
    CUdeviceptr base;             /* our mapping: (n_layers, K|V, n_blocks)
                                     blocks, then the epoch word */
    size_t epoch_off;             /* the epoch word's offset for n_blocks
                                     (the allocation may be larger) */
    int n_blocks;
    uint8_t grant[KV_CIPC_GRANT_BYTES]; /* token, n_blocks */
};

static size_t cipc_alloc_bytes(void *ctx, int n_blocks)
{
    kv_cipc_pool_t *pool = ctx;
    size_t epoch_off;

    return cipc_window_size(&pool->layout, n_blocks, pool->win_gran,
                            &epoch_off);
}

static bt_status_t cipc_alloc_make(void *ctx, int n_blocks, void **alloc_p)
{
    kv_cipc_pool_t *pool = ctx;
    cipc_alloc_t *a;
    /* the pool's thread has no current device of its own */
    bt_status_t status = CIPC_CUDA(cudaSetDevice(pool->device));

    if (status != BT_OK)
        return status;
    a = bt_calloc(1, sizeof(*a), "kv_cipc_alloc");
    if (a == NULL)
        return BT_ERR_NO_MEMORY;
    atomic_init(&a->readers, 0);
    a->size = cipc_alloc_bytes(pool, n_blocks);
    status = CIPC_CU(cipc_drv.MemCreate(&a->handle, a->size, &pool->win_prop,
                                        0));
    if (status == BT_OK) {
        status = cipc_map(a->handle, a->size, pool->win_gran, pool->device,
                          &a->base);
        if (status != BT_OK)
            (void)cipc_drv.MemRelease(a->handle);
    }
    if (status != BT_OK) {
        bt_free(a);
        return status;
    }
    *alloc_p = a;
    return BT_OK;
}

static void cipc_alloc_release(void *ctx, void *alloc)
{
    kv_cipc_pool_t *pool = ctx;
    cipc_alloc_t *a = alloc;
    uint64_t t0 = bt_time_ns();

    /* unmapping under a copy in flight would fault it: wait (on the
     * window pool's thread: the loop is not held) */
    while (atomic_load_explicit(&a->readers, memory_order_acquire) != 0) {
        if (bt_time_ns() - t0 > CIPC_READ_WAIT_NS) {
            BT_LOG_ERROR("KV", "a CUDA IPC window is still read by a copy "
                         "after %llu s: its %zu bytes are left mapped",
                         CIPC_READ_WAIT_NS / 1000000000ull, a->size);
            return;
        }
        usleep(100);
    }
    (void)cudaSetDevice(pool->device);
    cipc_unmap(a->base, a->size, a->handle);
    bt_free(a);
}

bt_status_t kv_cipc_pool_export_windowed(const kv_layout_t *layout,
                                         int device, size_t window_budget,
                                         kv_cipc_pool_t **pool_p)
{
    kv_cipc_pool_t *pool;
    kv_cipc_desc_t d;
    bt_status_t status;

    if (layout->n_layers < 1 || window_budget == 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "bad CUDA IPC window pool");
    /* fail closed: no FD handles, no windows (the caller logs the line) */
    if (!kv_cipc_windows_supported(device))
        return BT_ERR_UNSUPPORTED;
    pool = bt_calloc(1, sizeof(*pool), "kv_cipc_pool");
    if (pool == NULL)
        return BT_ERR_NO_MEMORY;
    pool->windowed = true;
    pool->layout = *layout;
    pool->device = device;
    pool->n_slots = 1;
    /* at most half of what the device has free now (after the pool):
     * the rest stays for graphs, tuning and other processes */
    {
        size_t free_b = 0, total_b = 0;
        status = CIPC_CUDA(cudaSetDevice(device));
        if (status == BT_OK)
            status = CIPC_CUDA(cudaMemGetInfo(&free_b, &total_b));
        if (status != BT_OK)
            goto err_free;
        pool->window_budget = BT_MIN(window_budget, free_b / 2);
    }
    status = cipc_window_prop(device, &pool->win_prop, &pool->win_gran);
    if (status != BT_OK)
        goto err_free;
    memset(&d, 0, sizeof(d));
    d.windowed = true;
    d.pid = (uint32_t)getpid();
    d.pool_id = bt_time_ns() ^ ((uint64_t)getpid() << 40) ^
                (uint64_t)(uintptr_t)pool;
    d.device = device;
    d.layout = *layout;
    d.n_slots = 1;
    status = CIPC_CUDA(cudaDeviceGetPCIBusId(d.bus_id, KV_CIPC_BUS_ID_LEN,
                                             device));
    if (status != BT_OK)
        goto err_free;
    {
        kv_winpool_config_t wc = {
            .ctx = pool,
            .make = cipc_alloc_make,
            .release = cipc_alloc_release,
            .bytes = cipc_alloc_bytes,
            .max_blocks = BT_MIN(layout->n_blocks, CIPC_WINDOW_MAX_BLOCKS),
            .budget = pool->window_budget,
            .ready_budget = pool->window_budget / CIPC_WINDOWS_READY_SHARE,
            .ready_per_class = CIPC_WINDOWS_READY_PER_CLASS,
            .ready_idle_ms = CIPC_WINDOWS_READY_IDLE_MS,
        };
        status = kv_winpool_create(&wc, &pool->winpool);
    }
    if (status != BT_OK)
        goto err_free;
    status = kv_fdch_create(&pool->fdch);
    if (status != BT_OK)
        goto err_winpool;
    snprintf(d.fd_socket, sizeof(d.fd_socket), "%s",
             kv_fdch_name(pool->fdch));
    pool->desc_len = kv_cipc_desc_encoded_size(&d);
    status = kv_cipc_desc_encode(&d, pool->desc, sizeof(pool->desc));
    if (status != BT_OK)
        goto err_fdch;
    BT_LOG_INFO("KV", "CUDA IPC pool %016llx windowed on device %d (%s): "
                "a window per grant, FDs on @%s, %zu MiB for windows",
                (unsigned long long)d.pool_id, device, d.bus_id, d.fd_socket,
                pool->window_budget >> 20);
    *pool_p = pool;
    return BT_OK;

err_fdch:
    kv_fdch_destroy(&pool->fdch);
err_winpool:
    kv_winpool_destroy(&pool->winpool);
err_free:
    bt_free(pool);
    return status;
}

bool kv_cipc_pool_is_windowed(const kv_cipc_pool_t *pool)
{
    return pool->windowed;
}

/* The allocation comes from the window pool: made ahead on its thread
 * when one of the class is ready (never given to anyone before: a fresh
 * cuMemCreate, no FD exported), else made here as it always was.  What
 * is cheap and binds it to this grant happens here, at grant time: the
 * token, the epoch word zeroed where this grant's n puts it, the FD
 * exported and offered. */
bt_status_t kv_cipc_window_create(kv_cipc_pool_t *pool, int n_blocks,
                                  kv_cipc_window_t **win_p)
{
    static const uint64_t zero = 0;
    uint8_t token[KV_CIPC_TOKEN_BYTES];
    kv_cipc_window_t *w;
    int fd = -1;
    bt_status_t status;

    if (!pool->windowed || n_blocks < 1 ||
        n_blocks > pool->layout.n_blocks)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC window of %d "
                        "blocks", n_blocks);
    w = bt_calloc(1, sizeof(*w), "kv_cipc_window");
    if (w == NULL)
        return BT_ERR_NO_MEMORY;
    /* over the budget (BT_ERR_NO_RESOURCE): nothing to undo; the grant
     * is refused and asked for again (kv_link__win_slots_arm) */
    status = kv_winpool_take(pool->winpool, n_blocks, &w->item);
    if (status != BT_OK) {
        bt_free(w);
        return status;
    }
    w->pool = pool;
    w->n_blocks = n_blocks;
    w->base = ((const cipc_alloc_t *)w->item->alloc)->base;
    (void)cipc_window_size(&pool->layout, n_blocks, pool->win_gran,
                           &w->epoch_off);
    status = bt_random_secret(token, sizeof(token));
    if (status == BT_OK)
        status = CIPC_CUDA(cudaSetDevice(pool->device));
    /* a fresh allocation holds anything: the epoch word starts at 0 */
    if (status == BT_OK)
        status = CIPC_CUDA(cudaMemcpy(
            (void *)(uintptr_t)(w->base + w->epoch_off), &zero, sizeof(zero),
            cudaMemcpyHostToDevice));
    if (status == BT_OK)
        status = CIPC_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    if (status == BT_OK)
        status = CIPC_CU(cipc_drv.MemExport(
            &fd, ((const cipc_alloc_t *)w->item->alloc)->handle,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (status == BT_OK) {
        status = kv_fdch_offer(pool->fdch, token, fd, 0);
        close(fd); /* the channel keeps its own copy until handed or
                      revoked */
    }
    if (status != BT_OK) {
        /* released, never offered again */
        kv_winpool_put(pool->winpool, &w->item);
        bt_free(w);
        return status;
    }
    kv_cipc_window_grant_encode(token, n_blocks, w->grant);
    *win_p = w;
    return BT_OK;
}

bool kv_cipc_window_made_ahead(const kv_cipc_window_t *win)
{
    return win->item->made_ahead;
}

const uint8_t *kv_cipc_window_grant(const kv_cipc_window_t *win,
                                    size_t *len_p)
{
    *len_p = KV_CIPC_GRANT_BYTES;
    return win->grant;
}

const void *kv_cipc_window_data(const kv_cipc_window_t *win)
{
    return (const void *)(uintptr_t)win->base;
}

void *kv_cipc_window_read_begin(kv_cipc_window_t *win)
{
    cipc_alloc_t *a = win->item->alloc;

    atomic_fetch_add_explicit(&a->readers, 1, memory_order_relaxed);
    return a;
}

void kv_cipc_window_read_done(void *reader)
{
    cipc_alloc_t *a = reader;

    atomic_fetch_sub_explicit(&a->readers, 1, memory_order_release);
}

bt_status_t kv_cipc_window_has_arrived(kv_cipc_window_t *win, uint64_t epoch,
                                       bool *arrived_p)
{
    uint64_t v = 0;
    bt_status_t status = CIPC_CUDA(cudaSetDevice(win->pool->device));

    if (status == BT_OK)
        status = CIPC_CUDA(cudaMemcpy(
            &v, (const void *)(uintptr_t)(win->base + win->epoch_off),
            sizeof(v), cudaMemcpyDeviceToHost));
    if (status != BT_OK)
        return status;
    *arrived_p = epoch != 0 && v == epoch;
    return BT_OK;
}

void kv_cipc_window_destroy(kv_cipc_window_t **win_p)
{
    kv_cipc_window_t *w = *win_p;

    if (w == NULL)
        return;
    /* No FD for this token any more, at once; a writer that has one
     * keeps only its own reference to the physical memory, which nobody
     * reads once ours is gone.  The unmap and release (~1 ms) wait for
     * the pool's thread, which waits for a copy out of it still in
     * flight (kv_cipc_window_read_begin); the allocation is never handed
     * out again. */
    (void)kv_fdch_revoke(w->pool->fdch, w->grant);
    kv_winpool_put(w->pool->winpool, &w->item);
    bt_free(w);
    *win_p = NULL;
}

#define CIPC_MAX_PEERS 64

struct kv_cipc_peer_s {
    kv_cipc_t *ctx;
    kv_cipc_desc_t desc;
    int n_ranks;           /* pools (1: descriptor version 1) */
    char *d_k[KV_CIPC_MAX_RANKS]; /* mapped K array of rank r (all layers) */
    char *d_v[KV_CIPC_MAX_RANKS]; /* mapped V array of rank r */
    uint64_t *d_arrival;   /* mapped (n_slots) arrival epochs */
    size_t layer_stride;   /* bytes from layer l's K to layer l+1's */
    bool p2p;              /* a pool is on another GPU than ctx's */
    /* a window (kv_cipc_window_open): its own mapping, never cached */
    bool is_window;
    CUmemGenericAllocationHandle win_handle;
    CUdeviceptr win_base;
    size_t win_size;
    int peer_device[KV_CIPC_MAX_RANKS]; /* ordinals here; -1: not visible */
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
    int dev = 0;

    if (!kv_cipc_is_available())
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: no CUDA device");
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: no current device");
    }
    return kv_cipc_create_on(dev, ctx_p);
}

bt_status_t kv_cipc_create_on(int device, kv_cipc_t **ctx_p)
{
    kv_cipc_t *ctx;
    bt_status_t status;

    if (!kv_cipc_is_available())
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: no CUDA device");
    ctx = bt_calloc(1, sizeof(*ctx), "kv_cipc");
    if (ctx == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "KV", "CUDA IPC context: no "
                        "memory");
    ctx->device = device;
    status = CIPC_CUDA(cudaSetDevice(device));
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

/* Peer access from ctx's device (current) to `dev` (idempotent). */
static bt_status_t cipc_enable_peer(kv_cipc_t *ctx, int dev)
{
    int can = 0;
    cudaError_t err;

    if (cudaDeviceCanAccessPeer(&can, ctx->device, dev) != cudaSuccess ||
        !can) {
        (void)cudaGetLastError();
        return BT_ERROR(BT_ERR_CUDA, "KV", "CUDA IPC: device %d (%s) cannot "
                        "access peer device %d", ctx->device, ctx->bus_id,
                        dev);
    }
    err = cudaDeviceEnablePeerAccess(dev, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return BT_OK;
    }
    return CIPC_CUDA(err);
}

bt_status_t kv_cipc_add_source(kv_cipc_t *ctx, int device)
{
    bt_status_t status;

    if (device == ctx->device)
        return BT_OK;
    status = CIPC_CUDA(cudaSetDevice(ctx->device));
    if (status != BT_OK)
        return status;
    return cipc_enable_peer(ctx, device);
}

static void peer_unmap(kv_cipc_peer_t *peer)
{
    if (peer->is_window) {
        cipc_unmap(peer->win_base, peer->win_size, peer->win_handle);
        bt_free(peer);
        return;
    }
    for (int r = 0; r < KV_CIPC_MAX_RANKS; r++) {
        if (peer->d_k[r])
            cudaIpcCloseMemHandle(peer->d_k[r]);
        if (peer->d_v[r])
            cudaIpcCloseMemHandle(peer->d_v[r]);
    }
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

/* Pool `rank` of the peer: when on another GPU than ctx's, finds its
 * ordinal here by PCI bus id (the exporter's ordinal may differ:
 * CUDA_VISIBLE_DEVICES) and enables peer access from ctx's device, so the
 * copy engine writes over NVLink (or PCIe) straight into the pool.  A GPU
 * this process cannot see is left to cudaIpcMemLazyEnablePeerAccess. */
static bt_status_t peer_setup(kv_cipc_t *ctx, kv_cipc_peer_t *peer, int rank)
{
    kv_cipc_rank_desc_t rk = kv_cipc_desc_rank(&peer->desc, rank);
    int dev = -1;

    peer->peer_device[rank] = -1;
    if (strcmp(rk.bus_id, ctx->bus_id) == 0) {
        peer->peer_device[rank] = ctx->device;
        return BT_OK;
    }
    if (cudaDeviceGetByPCIBusId(&dev, rk.bus_id) != cudaSuccess) {
        (void)cudaGetLastError();
        peer->p2p = true;
        BT_LOG_INFO("KV", "CUDA IPC pool on GPU %s, not visible here: peer "
                    "access left to the IPC mapping", rk.bus_id);
        return BT_OK;
    }
    peer->peer_device[rank] = dev;
    if (dev == ctx->device) /* same GPU, bus ids spelled differently */
        return BT_OK;
    peer->p2p = true;
    return cipc_enable_peer(ctx, dev);
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
        return BT_ERROR(BT_ERR_NO_MEMORY, "KV", "CUDA IPC connect: no "
                        "memory");
    peer->ctx = ctx;
    peer->desc = d;
    peer->n_ranks = kv_cipc_desc_n_ranks(&d);
    peer->layer_stride = kv_layout_layer_bytes(&d.layout);
    /* Map into ctx's device (the backend may have switched meanwhile). */
    status = CIPC_CUDA(cudaSetDevice(ctx->device));
    /* windowed: nothing to map now, each grant's window comes by FD */
    if (status == BT_OK && d.windowed)
        status = peer_setup(ctx, peer, 0);
    for (int r = 0; r < peer->n_ranks && status == BT_OK && !d.windowed;
         r++) {
        kv_cipc_rank_desc_t rk = kv_cipc_desc_rank(&d, r);

        status = peer_setup(ctx, peer, r);
        if (status == BT_OK)
            status = open_handle(rk.k_handle, (void **)&peer->d_k[r]);
        if (status == BT_OK)
            status = open_handle(rk.v_handle, (void **)&peer->d_v[r]);
    }
    if (status == BT_OK && !d.windowed)
        status = open_handle(d.arrival_handle, (void **)&peer->d_arrival);
    if (status != BT_OK) {
        peer_unmap(peer);
        return status;
    }
    BT_LOG_INFO("KV", "CUDA IPC pool %016llx of pid %u mapped (%d rank(s) "
                "from device %d, %s): %s, copies from device %d (%s)",
                (unsigned long long)d.pool_id, d.pid, peer->n_ranks, d.device,
                d.bus_id, kv_cipc_peer_transport(peer), ctx->device,
                ctx->bus_id);
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

bool kv_cipc_peer_is_windowed(const kv_cipc_peer_t *peer)
{
    return peer->desc.windowed;
}

bt_status_t kv_cipc_window_open(kv_cipc_peer_t *peer, const uint8_t *grant,
                                size_t len, int n_blocks,
                                kv_cipc_peer_t **win_p)
{
    kv_cipc_t *ctx = peer->ctx;
    uint8_t token[KV_CIPC_TOKEN_BYTES];
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop;
    kv_cipc_peer_t *w;
    size_t gran = 0, size, epoch_off, bb;
    int n = 0, fd = -1;
    bt_status_t status;

    if (!peer->desc.windowed)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC pool %016llx "
                        "has no windows", (unsigned long long)
                        peer->desc.pool_id);
    status = kv_cipc_window_grant_parse(grant, len, token, &n);
    if (status != BT_OK)
        return status;
    /* the window's shape is the decode worker's (K and V offsets follow
     * its n): a longer range does not fit it */
    if (n_blocks < 1 || n_blocks > n || n > peer->desc.layout.n_blocks)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC window of %d "
                        "blocks for a range of %d", n, n_blocks);
    if (!cipc_driver_load())
        return BT_ERROR(BT_ERR_UNSUPPORTED, "KV", "CUDA IPC windows: no "
                        "driver virtual memory API");
    status = kv_fdch_fetch(peer->desc.fd_socket, token, 1000, &fd, NULL);
    if (status != BT_OK)
        return status;
    status = CIPC_CUDA(cudaSetDevice(ctx->device));
    if (status == BT_OK)
        status = CIPC_CU(cipc_drv.MemImport(
            &h, (void *)(uintptr_t)fd,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd); /* the handle holds the allocation now */
    if (status != BT_OK)
        return status;
    status = CIPC_CU(cipc_drv.MemGetProps(&prop, h));
    if (status == BT_OK)
        status = CIPC_CU(cipc_drv.MemGranularity(
            &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (status != BT_OK)
        goto err_release;
    w = bt_calloc(1, sizeof(*w), "kv_cipc_peer");
    if (w == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, "KV", "CUDA IPC window open: "
                          "no memory");
        goto err_release;
    }
    size = cipc_window_size(&peer->desc.layout, n, gran, &epoch_off);
    /* mapped for the copy stream's device: peer access over NVLink when
     * the decode GPU is another one */
    status = cipc_map(h, size, gran, ctx->device, &w->win_base);
    if (status != BT_OK) {
        bt_free(w);
        goto err_release;
    }
    bb = kv_layout_block_bytes(&peer->desc.layout);
    w->ctx = ctx;
    w->desc = peer->desc;
    w->desc.layout.n_blocks = n;
    w->desc.n_slots = 1;
    w->n_ranks = 1;
    w->is_window = true;
    w->win_handle = h;
    w->win_size = size;
    w->d_k[0] = (char *)(uintptr_t)w->win_base;
    w->d_v[0] = w->d_k[0] + (size_t)n * bb;
    w->d_arrival = (uint64_t *)(uintptr_t)(w->win_base + epoch_off);
    w->layer_stride = 2 * (size_t)n * bb;
    w->p2p = peer->p2p;
    w->peer_device[0] = peer->peer_device[0];
    w->refs = 1;
    *win_p = w;
    return BT_OK;

err_release:
    (void)cipc_drv.MemRelease(h);
    return status;
}

void kv_cipc_window_close(kv_cipc_peer_t **win_p)
{
    kv_cipc_peer_t *w = *win_p;

    if (w == NULL)
        return;
    BT_ASSERT(w->is_window);
    /* the copies into it finish before the mapping goes */
    (void)cudaStreamSynchronize(w->ctx->stream);
    peer_unmap(w);
    *win_p = NULL;
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

/* The copies of one layer from `src` into destination rank `rank` of the
 * peer, which holds heads from dst_head0 of src->n_heads_total. */
static bt_status_t put_rank(kv_cipc_peer_t *peer, int rank, int layer,
                            const void *src_k, const void *src_v,
                            const kv_reshard_side_t *src, int dst_head0,
                            const int *src_ids, const int *dst_ids, int n)
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
    if (peer->d_k[rank] == NULL || peer->d_v[rank] == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC put into a "
                        "windowed pool: only into a grant's window");
    dst.n_heads_total = src->n_heads_total;
    dst.head0 = dst_head0;
    dst.layout = *dl;
    if (n > ctx->plan_cap) {
        int cap = BT_MAX(n, 2 * ctx->plan_cap);
        kv_copy2d_t *p = bt_realloc(ctx->plan, (size_t)cap * sizeof(*p),
                                    "kv_cipc_plan");
        if (p == NULL)
            return BT_ERROR(BT_ERR_NO_MEMORY, "KV", "CUDA IPC put: no "
                            "memory for a plan of %d copies", cap);
        ctx->plan = p;
        ctx->plan_cap = cap;
    }
    /* Checks the block shapes and ids; TP 1 on both sides gives one 1D
     * copy per run of consecutive ids (the plan before re-sharding). */
    status = kv_reshard_plan(src, &dst, src_ids, dst_ids, n, ctx->plan,
                             ctx->plan_cap, &n_copies);
    if (status != BT_OK)
        return status;
    if (n_copies > 0) {
        status = CIPC_CUDA(cudaSetDevice(ctx->device));
        if (status != BT_OK)
            return status;
    }
    layer_off = (size_t)layer * peer->layer_stride;
    for (int i = 0; i < n_copies; i++) {
        const kv_copy2d_t *c = &ctx->plan[i];
        for (int kv = 0; kv < 2; kv++) {
            const char *s = (const char *)(kv ? src_v : src_k) + c->src_off;
            char *d = (kv ? peer->d_v[rank] : peer->d_k[rank]) + layer_off +
                      c->dst_off;
            /* cudaMemcpyDefault: same GPU, or a peer GPU's pool (UVA);
             * the source may be another GPU of this process too
             * (kv_cipc_add_source). */
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

bt_status_t kv_cipc_put_layer_heads(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    int dst_head0, const int *src_ids,
                                    const int *dst_ids, int n)
{
    return put_rank(peer, 0, layer, src_k, src_v, src, dst_head0, src_ids,
                    dst_ids, n);
}

bt_status_t kv_cipc_put_layer_ranks(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    const int *src_ids, const int *dst_ids,
                                    int n)
{
    bt_status_t status = BT_OK;

    if (src->n_heads_total != kv_cipc_desc_heads_total(&peer->desc))
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC put: the source "
                        "has %d KV heads in all, the pool %d",
                        src->n_heads_total,
                        kv_cipc_desc_heads_total(&peer->desc));
    for (int r = 0; r < peer->n_ranks && status == BT_OK; r++)
        status = put_rank(peer, r, layer, src_k, src_v, src,
                          kv_cipc_desc_rank(&peer->desc, r).head0, src_ids,
                          dst_ids, n);
    return status;
}

bt_status_t kv_cipc_commit(kv_cipc_peer_t *peer, int slot, uint64_t epoch,
                           kv_cipc_commit_t **commit_p)
{
    kv_cipc_t *ctx = peer->ctx;
    kv_cipc_commit_t *c;
    bt_status_t status;

    if (slot < 0 || slot >= peer->desc.n_slots || epoch == 0 ||
        peer->d_arrival == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "CUDA IPC commit: slot %d",
                        slot);
    c = bt_calloc(1, sizeof(*c), "kv_cipc_commit");
    if (c == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "KV", "CUDA IPC commit: no "
                        "memory");
    c->epoch = epoch;
    status = CIPC_CUDA(cudaSetDevice(ctx->device));
    if (status == BT_OK)
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
struct kv_cipc_window_s {
    int unused;
};

bool kv_cipc_windows_supported(int device)
{
    (void)device;
    return false;
}

bt_status_t kv_cipc_pool_export_windowed(const kv_layout_t *layout,
                                         int device, size_t window_budget,
                                         kv_cipc_pool_t **pool_p)
{
    (void)layout;
    (void)device;
    (void)window_budget;
    (void)pool_p;
    return CIPC_NO_CUDA();
}

bool kv_cipc_pool_is_windowed(const kv_cipc_pool_t *pool)
{
    (void)pool;
    return false;
}

bt_status_t kv_cipc_window_create(kv_cipc_pool_t *pool, int n_blocks,
                                  kv_cipc_window_t **win_p)
{
    (void)pool;
    (void)n_blocks;
    (void)win_p;
    return CIPC_NO_CUDA();
}

const uint8_t *kv_cipc_window_grant(const kv_cipc_window_t *win,
                                    size_t *len_p)
{
    (void)win;
    *len_p = 0;
    return NULL;
}

const void *kv_cipc_window_data(const kv_cipc_window_t *win)
{
    (void)win;
    return NULL;
}

void *kv_cipc_window_read_begin(kv_cipc_window_t *win)
{
    return win;
}

void kv_cipc_window_read_done(void *reader)
{
    (void)reader;
}

bt_status_t kv_cipc_window_has_arrived(kv_cipc_window_t *win, uint64_t epoch,
                                       bool *arrived_p)
{
    (void)win;
    (void)epoch;
    *arrived_p = false;
    return CIPC_NO_CUDA();
}

bool kv_cipc_window_made_ahead(const kv_cipc_window_t *win)
{
    (void)win;
    return false;
}

void kv_cipc_window_destroy(kv_cipc_window_t **win_p)
{
    *win_p = NULL;
}

bool kv_cipc_peer_is_windowed(const kv_cipc_peer_t *peer)
{
    return peer->desc.windowed;
}

bt_status_t kv_cipc_window_open(kv_cipc_peer_t *peer, const uint8_t *grant,
                                size_t len, int n_blocks,
                                kv_cipc_peer_t **win_p)
{
    (void)peer;
    (void)grant;
    (void)len;
    (void)n_blocks;
    (void)win_p;
    return CIPC_NO_CUDA();
}

void kv_cipc_window_close(kv_cipc_peer_t **win_p)
{
    *win_p = NULL;
}

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

bt_status_t kv_cipc_memcpy2d(void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height)
{
    (void)dst;
    (void)dpitch;
    (void)src;
    (void)spitch;
    (void)width;
    (void)height;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_pool_export_ranks(const kv_layout_t *layout, int n_ranks,
                                      void *const *k_layers,
                                      void *const *v_layers,
                                      const int *devices, int n_slots,
                                      kv_cipc_pool_t **pool_p)
{
    (void)layout;
    (void)n_ranks;
    (void)k_layers;
    (void)v_layers;
    (void)devices;
    (void)n_slots;
    (void)pool_p;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_create_on(int device, kv_cipc_t **ctx_p)
{
    (void)device;
    (void)ctx_p;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_add_source(kv_cipc_t *ctx, int device)
{
    (void)ctx;
    (void)device;
    return CIPC_NO_CUDA();
}

bt_status_t kv_cipc_put_layer_ranks(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    const int *src_ids, const int *dst_ids,
                                    int n)
{
    (void)peer;
    (void)layer;
    (void)src_k;
    (void)src_v;
    (void)src;
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
