/*
 * kv_transport_stage.c - pipelined, double-buffered KV hand-off between
 * GPU pools on different hosts over UCX (see kv_transport_stage.h for the
 * pipeline, the receive area, the arrival words and the integration plan).
 *
 * Sender state machine per staging buffer:
 *   FREE --dispatch: D2H of a chunk's runs + event record--> D2H
 *   D2H  --event complete: puts + the chunk's commit--> PUT
 *   PUT  --commit callback--> FREE
 * Buffers leave D2H in the order they entered it (fill sequence), so the
 * puts and commits of one transfer reach the endpoint in layer order.
 *
 * Receiver state per reservation slot:
 *   IDLE --begin--> ACTIVE --all layers arrived, last H2D event done-->
 *   DONE --finish--> IDLE; ACTIVE/DONE --cancel--> IDLE (receive blocks
 *   quarantined).  With windows: begin maps and pins the slot's window,
 *   ACTIVE -> DONE and cancel unpin and unmap it (no quarantine).
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_transport_stage.h"

#define KV_STAGE_SUBSYS "KV"
#define KV_STAGE_MAGIC "BTKS"
#define KV_STAGE_HDR_BYTES 28
#define KV_STAGE_TRAILER 8
#define KV_STAGE_MAX_LAYERS 4096
#define KV_STAGE_MAX_BLOCKS (1 << 24)
#define KV_STAGE_DRAIN_MS 2000

// ----------------------------------------------------------------------------
// Little helpers

static void kv_stage_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void kv_stage_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t kv_stage_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t kv_stage_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Length of the run starting at a[i], b[i] where both lists count up by
 * one (b may be NULL: only a must). */
static int kv_stage_run(const int *a, const int *b, int i, int n)
{
    int run = 1;
    while (i + run < n && a[i + run] == a[i] + run &&
           (b == NULL || b[i + run] == b[i] + run))
        run++;
    return run;
}

/* Sleeps a little when a wait loop found nothing to do: yields while
 * copies are running (they finish without an fd event), else sleeps on
 * UCX's event fd for up to 1 ms. */
static void kv_stage_idle(kv_ucx_t *ucx, bool copies_pending)
{
    if (copies_pending)
        sched_yield();
    else
        (void)kv_ucx_wait(ucx, 1);
}

static bool kv_stage_layout_ok(const kv_layout_t *l)
{
    return l->n_layers >= 1 && l->n_layers <= KV_STAGE_MAX_LAYERS &&
           l->n_blocks >= 1 && l->n_blocks <= KV_STAGE_MAX_BLOCKS &&
           l->block_size >= 1 && l->n_kv_heads >= 1 && l->head_dim >= 1 &&
           (l->elem_size == 1 || l->elem_size == 2 || l->elem_size == 4);
}

// ----------------------------------------------------------------------------
// Descriptor

bt_status_t kv_stage_desc_parse(const void *buf, size_t len,
                                kv_stage_desc_info_t *info_p)
{
    const uint8_t *b = buf;
    kv_stage_desc_info_t info;
    kv_ucx_desc_t *ud = NULL;
    const kv_layout_t *ul;
    uint32_t total, n_layers, recv_blocks, n_slots, ucx_len;
    bt_status_t status;

    if (b == NULL || len < KV_STAGE_HDR_BYTES + KV_STAGE_TRAILER ||
        len > (size_t)KV_UCX_DESC_MAX_BYTES + KV_STAGE_HDR_BYTES +
                  KV_STAGE_TRAILER)
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: bad length %zu", len);
    if (memcmp(b, KV_STAGE_MAGIC, 4) != 0 || b[4] != KV_STAGE_DESC_VERSION ||
        (b[5] & ~1u) != 0 || b[6] != 0 || b[7] != 0)
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: bad magic, version or flags");
    total = kv_stage_get_u32(b + 8);
    n_layers = kv_stage_get_u32(b + 12);
    recv_blocks = kv_stage_get_u32(b + 16);
    n_slots = kv_stage_get_u32(b + 20);
    ucx_len = kv_stage_get_u32(b + 24);
    if (total != len ||
        (size_t)ucx_len != len - KV_STAGE_HDR_BYTES - KV_STAGE_TRAILER)
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: length fields %u/%u vs %zu",
                        total, ucx_len, len);
    if (bt_fnv1a64(b, len - KV_STAGE_TRAILER) !=
        kv_stage_get_u64(b + len - KV_STAGE_TRAILER))
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: bad checksum");
    if (n_layers < 1 || n_layers > KV_STAGE_MAX_LAYERS || recv_blocks < 1 ||
        recv_blocks > KV_STAGE_MAX_BLOCKS || n_slots < 1 ||
        n_slots > KV_STAGE_MAX_SLOTS)
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: %u layers, %u blocks, %u slots",
                        n_layers, recv_blocks, n_slots);
    status = kv_ucx_desc_parse(b + KV_STAGE_HDR_BYTES, ucx_len, &ud);
    if (status != BT_OK)
        return status;
    ul = kv_ucx_desc_layout(ud);
    if ((uint32_t)ul->n_layers != n_layers ||
        (uint32_t)ul->n_blocks != recv_blocks ||
        (uint64_t)kv_ucx_desc_n_slots(ud) !=
            (uint64_t)n_slots * n_layers + 1) {
        kv_ucx_desc_destroy(&ud);
        return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                        "stage descriptor: header disagrees with its pool");
    }
    info.direct = (b[5] & 1u) != 0;
    info.windowed = kv_ucx_desc_windowed(ud);
    kv_ucx_desc_destroy(&ud);
    info.n_layers = (int)n_layers;
    info.recv_blocks = (int)recv_blocks;
    info.n_slots = (int)n_slots;
    info.ucx = b + KV_STAGE_HDR_BYTES;
    info.ucx_len = ucx_len;
    *info_p = info;
    return BT_OK;
}

/* Builds the descriptor around the kv_ucx one; *buf_p is owned by the
 * caller. */
static bt_status_t kv_stage_desc_build(bool direct, int n_layers,
                                       int recv_blocks, int n_slots,
                                       const uint8_t *ucx, size_t ucx_len,
                                       uint8_t **buf_p, size_t *len_p)
{
    size_t len = KV_STAGE_HDR_BYTES + ucx_len + KV_STAGE_TRAILER;
    uint8_t *b = bt_calloc(1, len, "kv_stage_desc");

    if (b == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "descriptor");
    memcpy(b, KV_STAGE_MAGIC, 4);
    b[4] = KV_STAGE_DESC_VERSION;
    b[5] = direct ? 1 : 0;
    kv_stage_put_u32(b + 8, (uint32_t)len);
    kv_stage_put_u32(b + 12, (uint32_t)n_layers);
    kv_stage_put_u32(b + 16, (uint32_t)recv_blocks);
    kv_stage_put_u32(b + 20, (uint32_t)n_slots);
    kv_stage_put_u32(b + 24, (uint32_t)ucx_len);
    memcpy(b + KV_STAGE_HDR_BYTES, ucx, ucx_len);
    kv_stage_put_u64(b + len - KV_STAGE_TRAILER,
                     bt_fnv1a64(b, len - KV_STAGE_TRAILER));
    *buf_p = b;
    *len_p = len;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// Receiver

typedef enum {
    KV_STAGE_SLOT_IDLE = 0,
    KV_STAGE_SLOT_ACTIVE,
    KV_STAGE_SLOT_DONE
} kv_stage_slot_state_t;

typedef struct {
    kv_stage_slot_state_t state; /* see the top of the file */
    uint64_t epoch;              /* of the current reservation */
    int n;                       /* blocks reserved */
    int cap;                     /* capacity of the id arrays */
    int *dev_ids;                /* (cap) device block ids */
    int *recv_ids;               /* (cap) receive-area block ids */
    uint8_t *arrived;            /* (n_layers) H2D enqueued for layer */
    int n_arrived;               /* layers with H2D enqueued */
    void *event;                 /* recorded after each layer's H2D */
    bool copies_pending;         /* event recorded, not yet seen done */
    bt_status_t status;          /* first copy error */
    int *quarantine;             /* (n_quarantine) blocks of cancels */
    int n_quarantine;            /* quarantined receive blocks */
    kv_ucx_window_t *win;        /* windows: mapped for the reservation
                                  * until DONE or cancel, else NULL */
    bool win_pinned;             /* ops->host_register of win succeeded */
} kv_stage_slot_t;

struct kv_stage_recv_s {
    kv_ucx_t *ucx;              /* owner of the UCX worker */
    const kv_stage_ops_t *ops;  /* copies (NULL in direct mode) */
    bool direct;                /* device pool registered directly */
    bool windows;               /* a receive window per reservation */
    kv_layout_t layout;         /* device pool */
    uint8_t **d_k;              /* (n_layers) device K base per layer */
    uint8_t **d_v;              /* (n_layers) device V base per layer */
    size_t block_bytes;         /* bytes of one block of one layer's K */
    int recv_blocks;            /* receive-area blocks per layer */
    uint8_t *h_area;            /* (2, n_layers, recv_blocks, block_size,
                                 *  n_kv_heads, head_dim) K then V; NULL
                                 *  with windows */
    size_t area_bytes;          /* bytes of h_area */
    bool pinned;                /* ops->host_register succeeded */
    kv_allocator_t *alloc;      /* receive-area blocks (with windows:
                                 * only the budget of blocks in flight) */
    void *stream;               /* H2D copy stream */
    kv_ucx_pool_t *pool;        /* registration + arrival words */
    int n_slots;                /* reservation slots */
    kv_stage_slot_t *slots;     /* (n_slots) */
    uint8_t *desc;              /* (desc_len) serialized descriptor */
    size_t desc_len;            /* bytes */
};

void kv_stage_recv_config_init(kv_stage_recv_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_slots = 16;
    cfg->ops = kv_stage_ops_cuda();
}

static uint8_t *kv_stage_recv_h_layer(const kv_stage_recv_t *r, int kv,
                                      int layer)
{
    size_t lb = r->block_bytes * (size_t)r->recv_blocks;
    return r->h_area + ((size_t)kv * (size_t)r->layout.n_layers +
                        (size_t)layer) * lb;
}

bt_status_t kv_stage_recv_create(kv_ucx_t *ucx,
                                 const kv_stage_recv_config_t *cfg,
                                 kv_stage_recv_t **recv_p)
{
    kv_stage_recv_t *r;
    void **k_reg = NULL;
    void **v_reg = NULL;
    kv_layout_t reg_layout;
    const uint8_t *ud;
    size_t ud_len, area = 0;
    int L = cfg->layout.n_layers;
    bt_status_t status;

    if (!kv_stage_layout_ok(&cfg->layout) || cfg->k_layers == NULL ||
        cfg->v_layers == NULL || cfg->n_slots < 1 ||
        cfg->n_slots > KV_STAGE_MAX_SLOTS || cfg->recv_blocks < 0 ||
        cfg->recv_blocks > KV_STAGE_MAX_BLOCKS ||
        (!cfg->direct && cfg->ops == NULL) ||
        (cfg->direct && cfg->windows) ||
        (uint64_t)cfg->n_slots * (uint64_t)L + 1 > (1u << 24))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_recv_create: bad configuration");
    r = bt_calloc(1, sizeof(*r), "kv_stage_recv");
    if (r == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "receiver");
    r->ucx = ucx;
    r->direct = cfg->direct;
    r->windows = cfg->windows;
    r->ops = cfg->direct ? NULL : cfg->ops;
    r->layout = cfg->layout;
    r->block_bytes = kv_layout_block_bytes(&cfg->layout);
    r->recv_blocks = cfg->direct ? cfg->layout.n_blocks
                     : cfg->recv_blocks > 0 ? cfg->recv_blocks
                                            : cfg->layout.n_blocks;
    r->n_slots = cfg->n_slots;
    r->d_k = bt_calloc((size_t)L, sizeof(*r->d_k), "kv_stage_recv");
    r->d_v = bt_calloc((size_t)L, sizeof(*r->d_v), "kv_stage_recv");
    r->slots = bt_calloc((size_t)r->n_slots, sizeof(*r->slots),
                         "kv_stage_recv");
    k_reg = bt_calloc((size_t)L, sizeof(*k_reg), "kv_stage_recv");
    v_reg = bt_calloc((size_t)L, sizeof(*v_reg), "kv_stage_recv");
    if (r->d_k == NULL || r->d_v == NULL || r->slots == NULL ||
        k_reg == NULL || v_reg == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "receiver");
        goto err_free;
    }
    for (int l = 0; l < L; l++) {
        r->d_k[l] = cfg->k_layers[l];
        r->d_v[l] = cfg->v_layers[l];
    }
    for (int s = 0; s < r->n_slots; s++) {
        r->slots[s].arrived = bt_calloc((size_t)L, 1, "kv_stage_recv");
        if (r->slots[s].arrived == NULL) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "slots");
            goto err_free;
        }
    }

    reg_layout = cfg->layout;
    if (r->direct) {
        for (int l = 0; l < L; l++) {
            k_reg[l] = r->d_k[l];
            v_reg[l] = r->d_v[l];
        }
    } else {
        reg_layout.n_blocks = r->recv_blocks;
        if (bt_mul_overflow_size(r->block_bytes, (size_t)r->recv_blocks,
                                 &area) ||
            bt_mul_overflow_size(area, 2 * (size_t)L, &area)) {
            status = BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                              "receive area size overflows");
            goto err_free;
        }
        if (!r->windows) {
            status = kv_ucx_mem_alloc(ucx, area, KV_UCX_MEM_HOST,
                                      (void **)&r->h_area);
            if (status != BT_OK)
                goto err_free;
            r->area_bytes = area;
            status = r->ops->host_register(r->h_area, area);
            if (status != BT_OK)
                goto err_free_area;
            r->pinned = true;
        }
        status = kv_allocator_create(r->recv_blocks, &r->alloc);
        if (status != BT_OK)
            goto err_free_area;
        status = r->ops->stream_create(&r->stream);
        if (status != BT_OK)
            goto err_free_area;
        for (int s = 0; s < r->n_slots; s++) {
            status = r->ops->event_create(&r->slots[s].event);
            if (status != BT_OK)
                goto err_free_area;
        }
        for (int l = 0; l < L && !r->windows; l++) {
            k_reg[l] = kv_stage_recv_h_layer(r, 0, l);
            v_reg[l] = kv_stage_recv_h_layer(r, 1, l);
        }
    }
    /* With windows only the arrival words are registered: no writer ever
     * holds a key to memory that outlives its reservation. */
    if (r->windows)
        status = kv_ucx_pool_register_windowed(ucx, &reg_layout,
                                               r->n_slots * L + 1, &r->pool);
    else
        status = kv_ucx_pool_register(ucx, &reg_layout, k_reg, v_reg,
                                      r->direct ? (cfg->ops != NULL
                                                       ? cfg->ops->mem_type
                                                       : KV_UCX_MEM_CUDA)
                                                : KV_UCX_MEM_HOST,
                                      r->n_slots * L + 1, &r->pool);
    if (status != BT_OK)
        goto err_free_area;
    ud = kv_ucx_pool_desc(r->pool, &ud_len);
    status = kv_stage_desc_build(r->direct, L, r->recv_blocks, r->n_slots,
                                 ud, ud_len, &r->desc, &r->desc_len);
    if (status != BT_OK)
        goto err_free_area;
    bt_free(k_reg);
    bt_free(v_reg);
    BT_LOG_INFO(KV_STAGE_SUBSYS,
                "stage receiver: %s, %d layers, %d receive blocks "
                "(%.1f MiB), %d slots, copies %s",
                r->direct    ? "direct"
                : r->windows ? "staged, a receive window per reservation"
                             : "staged",
                L, r->recv_blocks, (double)area / (1 << 20), r->n_slots,
                r->ops != NULL ? r->ops->name : "none");
    *recv_p = r;
    return BT_OK;

err_free_area:
    /* kv_stage_recv_destroy undoes whatever was set up. */
err_free:
    bt_free(k_reg);
    bt_free(v_reg);
    kv_stage_recv_destroy(&r);
    return status;
}

/* Bytes of a window of n blocks (K and V of every layer). */
static size_t kv_stage_window_bytes(const kv_stage_recv_t *r, int n)
{
    return 2 * (size_t)r->layout.n_layers * (size_t)n * r->block_bytes;
}

/* Maps and pins slot sl's window of n blocks.  Pinned per window through
 * the ops (cudaHostRegister with the CUDA ops): the H2D copies out of it
 * are asynchronous DMA, which needs page-locked memory, and a window is
 * fresh memory every time (docs/SECURITY.md section 5 has the cost). */
static bt_status_t kv_stage_slot_map(kv_stage_recv_t *r, kv_stage_slot_t *sl,
                                     int slot, uint64_t epoch, int n)
{
    /* named by its layer-0 arrival word, epoch and token in messages;
     * layer l's commit message sets word slot * L + l */
    bt_status_t status = kv_ucx_window_create_layers(
        r->pool, slot * r->layout.n_layers, epoch, n, &sl->win);

    if (status != BT_OK)
        return status;
    status = r->ops->host_register(
        (void *)(uintptr_t)kv_ucx_window_data(sl->win, 0, 0),
        kv_stage_window_bytes(r, n));
    if (status != BT_OK) {
        kv_ucx_window_destroy(&sl->win);
        return status;
    }
    sl->win_pinned = true;
    return BT_OK;
}

/* Unpins and unmaps slot sl's window: its key dies with it.  Its copies
 * must be done.  Returns true when there was one. */
static bool kv_stage_slot_unmap(kv_stage_recv_t *r, kv_stage_slot_t *sl)
{
    if (sl->win == NULL)
        return false;
    if (sl->win_pinned)
        r->ops->host_unregister(
            (void *)(uintptr_t)kv_ucx_window_data(sl->win, 0, 0));
    sl->win_pinned = false;
    kv_ucx_window_destroy(&sl->win);
    return true;
}

/* Waits for the slot's H2D copies (bounded); false on timeout. */
static bool kv_stage_slot_drain(kv_stage_recv_t *r, kv_stage_slot_t *sl)
{
    uint64_t deadline = bt_time_ns() + (uint64_t)KV_STAGE_DRAIN_MS * 1000000;

    while (sl->copies_pending) {
        bt_status_t status = r->ops->event_query(sl->event);
        if (status != BT_IN_PROGRESS) {
            sl->copies_pending = false;
            break;
        }
        if (bt_time_ns() > deadline) {
            BT_LOG_WARN(KV_STAGE_SUBSYS,
                        "stage receiver: H2D copies still running after "
                        "%d ms", KV_STAGE_DRAIN_MS);
            return false;
        }
        sched_yield();
    }
    return true;
}

void kv_stage_recv_destroy(kv_stage_recv_t **recv_p)
{
    kv_stage_recv_t *r = *recv_p;

    if (r == NULL)
        return;
    if (r->slots != NULL) {
        for (int s = 0; s < r->n_slots; s++) {
            kv_stage_slot_t *sl = &r->slots[s];
            if (r->ops != NULL && sl->event != NULL) {
                (void)kv_stage_slot_drain(r, sl);
                r->ops->event_destroy(sl->event);
            }
            (void)kv_stage_slot_unmap(r, sl); /* before the pool */
            bt_free(sl->dev_ids);
            bt_free(sl->recv_ids);
            bt_free(sl->arrived);
            bt_free(sl->quarantine);
        }
    }
    kv_ucx_pool_deregister(&r->pool);
    if (r->stream != NULL)
        r->ops->stream_destroy(r->stream);
    kv_allocator_destroy(&r->alloc);
    if (r->pinned)
        r->ops->host_unregister(r->h_area);
    if (r->h_area != NULL)
        kv_ucx_mem_free(r->ucx, (void **)&r->h_area);
    bt_free(r->desc);
    bt_free(r->slots);
    bt_free(r->d_k);
    bt_free(r->d_v);
    bt_free(r);
    *recv_p = NULL;
}

const uint8_t *kv_stage_recv_desc(const kv_stage_recv_t *recv,
                                  size_t *len_p)
{
    *len_p = recv->desc_len;
    return recv->desc;
}

static void kv_stage_slot_reset_words(kv_stage_recv_t *r, int slot)
{
    int L = r->layout.n_layers;
    for (int l = 0; l < L; l++)
        kv_ucx_pool_slot_reset(r->pool, slot * L + l);
}

bt_status_t kv_stage_recv_begin(kv_stage_recv_t *recv, int slot,
                                uint64_t epoch, const int *dev_ids, int n,
                                int *dst_ids)
{
    kv_stage_slot_t *sl;
    bt_status_t status;

    if (slot < 0 || slot >= recv->n_slots || epoch == 0 || n < 0 ||
        (n > 0 && (dev_ids == NULL || dst_ids == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_recv_begin: slot %d, epoch %llu, n %d",
                        slot, (unsigned long long)epoch, n);
    sl = &recv->slots[slot];
    if (sl->state != KV_STAGE_SLOT_IDLE)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_recv_begin: slot %d is busy", slot);
    for (int i = 0; i < n; i++)
        if (dev_ids[i] < 0 || dev_ids[i] >= recv->layout.n_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                            "kv_stage_recv_begin: device block %d of %d",
                            dev_ids[i], recv->layout.n_blocks);
    if (n > recv->recv_blocks)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_recv_begin: %d blocks never fit a "
                        "receive area of %d", n, recv->recv_blocks);
    if (n > sl->cap) {
        int *d = bt_realloc(sl->dev_ids, (size_t)n * sizeof(*d),
                            "kv_stage_slot");
        if (d == NULL)
            return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "slot ids");
        sl->dev_ids = d;
        d = bt_realloc(sl->recv_ids, (size_t)n * sizeof(*d),
                       "kv_stage_slot");
        if (d == NULL)
            return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "slot ids");
        sl->recv_ids = d;
        sl->cap = n;
    }
    (void)kv_stage_slot_unmap(recv, sl); /* none: idle slots have none */
    if (!recv->direct && n > 0) {
        status = kv_allocator_alloc(recv->alloc, n, sl->recv_ids);
        if (status != BT_OK)
            return status; /* BT_ERR_NO_RESOURCE, not logged: expected */
        if (recv->windows) {
            status = kv_stage_slot_map(recv, sl, slot, epoch, n);
            if (status != BT_OK) {
                kv_allocator_release(recv->alloc, n, sl->recv_ids);
                return status;
            }
        }
    } else if (n > 0) {
        memcpy(sl->recv_ids, dev_ids, (size_t)n * sizeof(int));
    }
    if (n > 0) {
        memcpy(sl->dev_ids, dev_ids, (size_t)n * sizeof(int));
        memcpy(dst_ids, sl->recv_ids, (size_t)n * sizeof(int));
    }
    for (int i = 0; i < n && recv->windows; i++)
        dst_ids[i] = i; /* window block i */
    kv_stage_slot_reset_words(recv, slot);
    memset(sl->arrived, 0, (size_t)recv->layout.n_layers);
    sl->n_arrived = 0;
    sl->n = n;
    sl->epoch = epoch;
    sl->status = BT_OK;
    sl->copies_pending = false;
    sl->state = KV_STAGE_SLOT_ACTIVE;
    return BT_OK;
}

/* Enqueues the H2D copies of one layer: coalesced runs where both the
 * receive ids and the device ids are consecutive. */
static bt_status_t kv_stage_slot_copy_layer(kv_stage_recv_t *r,
                                            kv_stage_slot_t *sl, int layer)
{
    size_t bb = r->block_bytes;
    const uint8_t *hk, *hv;
    bt_status_t status;
    int run;

    if (sl->n == 0)
        return BT_OK;
    hk = r->windows ? kv_ucx_window_data(sl->win, layer, 0)
                    : kv_stage_recv_h_layer(r, 0, layer);
    hv = r->windows ? kv_ucx_window_data(sl->win, layer, 1)
                    : kv_stage_recv_h_layer(r, 1, layer);
    for (int i = 0; i < sl->n; i += run) {
        /* window block i, or the area's id */
        size_t hoff = (size_t)(r->windows ? i : sl->recv_ids[i]) * bb;
        size_t doff = (size_t)sl->dev_ids[i] * bb;
        run = r->windows ? kv_stage_run(sl->dev_ids, NULL, i, sl->n)
                         : kv_stage_run(sl->recv_ids, sl->dev_ids, i, sl->n);
        status = r->ops->copy_async(r->stream, r->d_k[layer] + doff,
                                    hk + hoff, (size_t)run * bb);
        if (status != BT_OK)
            return status;
        status = r->ops->copy_async(r->stream, r->d_v[layer] + doff,
                                    hv + hoff, (size_t)run * bb);
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

/* Advances one active slot; true if anything happened. */
static bool kv_stage_slot_advance(kv_stage_recv_t *r, int slot)
{
    kv_stage_slot_t *sl = &r->slots[slot];
    int L = r->layout.n_layers;
    bool any = false;
    bool copied = false;
    bt_status_t status;

    if (sl->state != KV_STAGE_SLOT_ACTIVE || sl->status != BT_OK)
        return false;
    for (int l = 0; l < L && sl->n_arrived < L; l++) {
        /* windows: a grant of no blocks has no window and nothing to
         * wait for (its sender commits nothing) */
        if (sl->arrived[l] ||
            (!kv_ucx_pool_has_arrived(r->pool, slot * L + l, sl->epoch) &&
             !(r->windows && sl->n == 0)))
            continue;
        if (!r->direct) {
            status = kv_stage_slot_copy_layer(r, sl, l);
            if (status != BT_OK) {
                sl->status = status;
                return true;
            }
            copied = true;
        }
        sl->arrived[l] = 1;
        sl->n_arrived++;
        any = true;
    }
    if (copied) {
        status = r->ops->event_record(sl->event, r->stream);
        if (status != BT_OK) {
            sl->status = status;
            return true;
        }
        sl->copies_pending = true;
    }
    if (sl->n_arrived < L)
        return any;
    if (sl->copies_pending) {
        status = r->ops->event_query(sl->event);
        if (status == BT_IN_PROGRESS)
            return any;
        sl->copies_pending = false;
        if (status != BT_OK) {
            sl->status = status;
            return true;
        }
    }
    if (!r->direct && sl->n > 0)
        kv_allocator_release(r->alloc, sl->n, sl->recv_ids);
    (void)kv_stage_slot_unmap(r, sl); /* its writer is done: not revoked */
    sl->state = KV_STAGE_SLOT_DONE;
    return true;
}

const uint8_t *kv_stage_recv_window(const kv_stage_recv_t *recv, int slot,
                                    size_t *len_p)
{
    if (slot < 0 || slot >= recv->n_slots || recv->slots[slot].win == NULL)
        return NULL;
    return kv_ucx_window_desc(recv->slots[slot].win, len_p);
}

bool kv_stage_recv_progress(kv_stage_recv_t *recv)
{
    bool any = false;
    for (int s = 0; s < recv->n_slots; s++)
        any |= kv_stage_slot_advance(recv, s);
    return any;
}

bt_status_t kv_stage_recv_poll(kv_stage_recv_t *recv, int slot)
{
    kv_stage_slot_t *sl;

    if (slot < 0 || slot >= recv->n_slots ||
        recv->slots[slot].state == KV_STAGE_SLOT_IDLE)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_recv_poll: slot %d is not active", slot);
    sl = &recv->slots[slot];
    (void)kv_stage_slot_advance(recv, slot);
    if (sl->status != BT_OK)
        return sl->status;
    return sl->state == KV_STAGE_SLOT_DONE ? BT_OK : BT_IN_PROGRESS;
}

bt_status_t kv_stage_recv_wait(kv_stage_recv_t *recv, int slot,
                               int timeout_ms)
{
    uint64_t deadline = bt_time_ns() + (uint64_t)timeout_ms * 1000000;

    for (;;) {
        bool any = kv_ucx_progress(recv->ucx);
        bt_status_t status = kv_stage_recv_poll(recv, slot);
        if (status != BT_IN_PROGRESS)
            return status;
        if (bt_time_ns() >= deadline)
            return BT_ERROR(BT_ERR_TIMEOUT, KV_STAGE_SUBSYS,
                            "stage receiver: slot %d has %d of %d layers "
                            "after %d ms", slot,
                            recv->slots[slot].n_arrived,
                            recv->layout.n_layers, timeout_ms);
        if (!any)
            kv_stage_idle(recv->ucx, recv->slots[slot].copies_pending);
    }
}

int kv_stage_recv_layers_arrived(const kv_stage_recv_t *recv, int slot)
{
    if (slot < 0 || slot >= recv->n_slots)
        return 0;
    return recv->slots[slot].n_arrived;
}

void kv_stage_recv_finish(kv_stage_recv_t *recv, int slot)
{
    BT_ASSERT(slot >= 0 && slot < recv->n_slots);
    BT_ASSERT(recv->slots[slot].state == KV_STAGE_SLOT_DONE);
    recv->slots[slot].state = KV_STAGE_SLOT_IDLE;
    kv_stage_slot_reset_words(recv, slot);
}

bool kv_stage_recv_cancel(kv_stage_recv_t *recv, int slot)
{
    kv_stage_slot_t *sl;
    bool revoked;

    BT_ASSERT(slot >= 0 && slot < recv->n_slots);
    sl = &recv->slots[slot];
    if (sl->state == KV_STAGE_SLOT_IDLE)
        return false;
    if (recv->ops != NULL && !kv_stage_slot_drain(recv, sl)) {
        /* Copies stuck: leak the receive blocks rather than reuse them
         * under a running copy (they stay reserved forever).  A window is
         * unmapped all the same: revoking its key matters more than a
         * copy the device never finishes. */
        sl->n = 0;
    }
    revoked = kv_stage_slot_unmap(recv, sl);
    if (sl->state == KV_STAGE_SLOT_ACTIVE && recv->windows && sl->n > 0) {
        /* no writer can reach them: free now */
        kv_allocator_release(recv->alloc, sl->n, sl->recv_ids);
    } else if (sl->state == KV_STAGE_SLOT_ACTIVE && !recv->direct &&
               sl->n > 0) {
        int *q = bt_realloc(sl->quarantine,
                            (size_t)(sl->n_quarantine + sl->n) * sizeof(*q),
                            "kv_stage_slot");
        if (q != NULL) {
            memcpy(q + sl->n_quarantine, sl->recv_ids,
                   (size_t)sl->n * sizeof(int));
            sl->quarantine = q;
            sl->n_quarantine += sl->n;
        } else {
            BT_LOG_WARN(KV_STAGE_SUBSYS,
                        "stage receiver: no memory to quarantine %d blocks "
                        "of slot %d; they stay reserved", sl->n, slot);
        }
    }
    kv_stage_slot_reset_words(recv, slot);
    sl->state = KV_STAGE_SLOT_IDLE;
    sl->n = 0;
    return revoked;
}

void kv_stage_recv_release_quarantine(kv_stage_recv_t *recv, int slot)
{
    kv_stage_slot_t *sl;

    BT_ASSERT(slot >= 0 && slot < recv->n_slots);
    sl = &recv->slots[slot];
    if (sl->n_quarantine > 0)
        kv_allocator_release(recv->alloc, sl->n_quarantine, sl->quarantine);
    bt_free(sl->quarantine);
    sl->quarantine = NULL;
    sl->n_quarantine = 0;
}

int kv_stage_recv_free_blocks(const kv_stage_recv_t *recv)
{
    return recv->alloc != NULL ? kv_allocator_free_count(recv->alloc) : 0;
}

// ----------------------------------------------------------------------------
// Sender: types

typedef enum {
    KV_STAGE_BUF_FREE = 0, /* available */
    KV_STAGE_BUF_D2H,      /* device-to-host copies in flight */
    KV_STAGE_BUF_PUT       /* puts + commit in flight */
} kv_stage_buf_state_t;

typedef struct kv_stage_job_s kv_stage_job_t;

typedef struct {
    kv_stage_send_t *send;       /* owner */
    kv_stage_buf_state_t state;  /* see the top of the file */
    uint8_t *h_k;                /* (stage_blocks, block_size, n_kv_heads,
                                  *  head_dim) staged K of one chunk */
    uint8_t *h_v;                /* same shape, staged V */
    void *event;                 /* recorded after the chunk's D2H */
    kv_stage_xfer_t *xfer;       /* the chunk's transfer */
    int layer;                   /* the chunk's layer */
    int off;                     /* first block index in the transfer */
    int cnt;                     /* blocks in the chunk */
    bool last;                   /* last chunk of its layer */
    uint64_t seq;                /* fill order */
} kv_stage_buf_t;

struct kv_stage_job_s {
    kv_stage_xfer_t *xfer;       /* transfer */
    int layer;                   /* layer to send */
    const uint8_t *src_k;        /* layer's K base (device) */
    const uint8_t *src_v;        /* layer's V base (device) */
    int next;                    /* first block not yet staged */
    kv_stage_job_t *next_job;    /* FIFO */
};

struct kv_stage_peer_s {
    kv_stage_send_t *send;       /* owner */
    kv_ucx_peer_t *up;           /* the UCX peer (cached in kv_ucx_t) */
    uint8_t *desc;               /* (desc_len) copy: info points into it */
    size_t desc_len;             /* bytes */
    kv_stage_desc_info_t info;   /* parsed header */
    int refs;                    /* caller + transfers */
};

struct kv_stage_xfer_s {
    kv_stage_send_t *send;       /* owner */
    kv_stage_peer_t *peer;       /* destination (holds a reference) */
    int slot;                    /* reservation slot at the peer */
    uint64_t epoch;              /* its epoch */
    int n;                       /* blocks */
    int *src_ids;                /* (n) local block ids */
    int *dst_ids;                /* (n) peer's destination ids (window
                                  * block ids with a window) */
    kv_ucx_rwindow_t *win;       /* the grant's receive window, opened on
                                  * peer->up; NULL: the peer's area */
    uint8_t *queued;             /* (n_layers) layer queued */
    int n_committed;             /* layers whose final commit completed */
    int in_flight;               /* chunks in buffers + direct commits */
    uint64_t n_landed;           /* chunks + direct layers committed */
    bt_status_t status;          /* IN_PROGRESS, OK or the first error */
    bool orphaned;               /* destroyed by the caller while busy */
    kv_stage_xfer_t *next_orphan;/* send->orphans */
};

struct kv_stage_send_s {
    kv_ucx_t *ucx;               /* owner of the UCX worker */
    const kv_stage_ops_t *ops;   /* copies (NULL when direct) */
    bool direct;                 /* put from device memory */
    kv_ucx_mem_type_t src_mem;   /* memory type of the local pool */
    kv_layout_t layout;          /* local pool */
    kv_layout_t stage_layout;    /* one staging buffer, as a 1-layer pool */
    size_t block_bytes;          /* bytes of one block of one layer's K */
    int stage_blocks;            /* blocks per buffer */
    int *stage_ids;              /* (stage_blocks) 0, 1, 2, ... */
    int n_buffers;               /* staging buffers */
    kv_stage_buf_t bufs[KV_STAGE_MAX_BUFFERS]; /* the buffers */
    uint8_t *h_stage;            /* (n_buffers, 2, stage_blocks, ...) */
    size_t stage_bytes;          /* bytes of h_stage */
    bool pinned;                 /* ops->host_register succeeded */
    void *stream;                /* D2H copy stream */
    uint64_t fill_seq;           /* next buffer fill number */
    kv_stage_job_t *jobs;        /* queued layers (FIFO head) */
    kv_stage_job_t *jobs_tail;   /* FIFO tail */
    kv_stage_xfer_t *orphans;    /* destroyed transfers still in flight */
    int n_xfers;                 /* live transfers (not orphaned) */
    int n_peers;                 /* live peers */
    kv_stage_send_stats_t stats; /* counters */
};

void kv_stage_send_config_init(kv_stage_send_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->stage_blocks = 256;
    cfg->n_buffers = 2;
    cfg->ops = kv_stage_ops_cuda();
}

// ----------------------------------------------------------------------------
// Sender: create / destroy

bt_status_t kv_stage_send_create(kv_ucx_t *ucx,
                                 const kv_stage_send_config_t *cfg,
                                 kv_stage_send_t **send_p)
{
    kv_stage_send_t *s;
    size_t per_buf;
    bt_status_t status;

    if (!kv_stage_layout_ok(&cfg->layout) ||
        (!cfg->direct &&
         (cfg->ops == NULL || cfg->stage_blocks < 1 ||
          cfg->stage_blocks > KV_STAGE_MAX_BLOCKS || cfg->n_buffers < 1 ||
          cfg->n_buffers > KV_STAGE_MAX_BUFFERS)))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_send_create: bad configuration");
    s = bt_calloc(1, sizeof(*s), "kv_stage_send");
    if (s == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "sender");
    s->ucx = ucx;
    s->direct = cfg->direct;
    s->ops = cfg->direct ? NULL : cfg->ops;
    s->src_mem = cfg->ops != NULL ? cfg->ops->mem_type : KV_UCX_MEM_CUDA;
    s->layout = cfg->layout;
    s->block_bytes = kv_layout_block_bytes(&cfg->layout);
    if (s->direct) {
        *send_p = s;
        return BT_OK;
    }
    s->stage_blocks = cfg->stage_blocks;
    s->n_buffers = cfg->n_buffers;
    s->stage_layout = cfg->layout;
    s->stage_layout.n_layers = 1;
    s->stage_layout.n_blocks = cfg->stage_blocks;
    s->stage_ids = bt_malloc((size_t)s->stage_blocks * sizeof(int),
                             "kv_stage_send");
    if (s->stage_ids == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "sender");
        goto err_destroy;
    }
    for (int i = 0; i < s->stage_blocks; i++)
        s->stage_ids[i] = i;
    if (bt_mul_overflow_size(s->block_bytes, (size_t)s->stage_blocks,
                             &per_buf) ||
        bt_mul_overflow_size(per_buf, 2 * (size_t)s->n_buffers,
                             &s->stage_bytes)) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                          "staging size overflows");
        goto err_destroy;
    }
    status = kv_ucx_mem_alloc(ucx, s->stage_bytes, KV_UCX_MEM_HOST,
                              (void **)&s->h_stage);
    if (status != BT_OK)
        goto err_destroy;
    status = s->ops->host_register(s->h_stage, s->stage_bytes);
    if (status != BT_OK)
        goto err_destroy;
    s->pinned = true;
    status = s->ops->stream_create(&s->stream);
    if (status != BT_OK)
        goto err_destroy;
    for (int b = 0; b < s->n_buffers; b++) {
        kv_stage_buf_t *buf = &s->bufs[b];
        buf->send = s;
        buf->h_k = s->h_stage + (size_t)(2 * b) * per_buf;
        buf->h_v = s->h_stage + (size_t)(2 * b + 1) * per_buf;
        status = s->ops->event_create(&buf->event);
        if (status != BT_OK)
            goto err_destroy;
    }
    BT_LOG_INFO(KV_STAGE_SUBSYS,
                "stage sender: %d buffers x %d blocks (%.1f MiB pinned), "
                "copies %s", s->n_buffers, s->stage_blocks,
                (double)s->stage_bytes / (1 << 20), s->ops->name);
    *send_p = s;
    return BT_OK;

err_destroy:
    kv_stage_send_destroy(&s);
    return status;
}

static void kv_stage_peer_unref(kv_stage_peer_t *p)
{
    if (--p->refs > 0)
        return;
    kv_ucx_disconnect(&p->up);
    p->send->n_peers--;
    bt_free(p->desc);
    bt_free(p);
}

static void kv_stage_xfer_free(kv_stage_xfer_t *x)
{
    kv_ucx_window_close(&x->win); /* before the endpoint's last reference */
    kv_stage_peer_unref(x->peer);
    bt_free(x->src_ids);
    bt_free(x->dst_ids);
    bt_free(x->queued);
    bt_free(x);
}

/* Unlinks and frees orphans with nothing in flight. */
static void kv_stage_reap_orphans(kv_stage_send_t *s)
{
    kv_stage_xfer_t **pp = &s->orphans;
    while (*pp != NULL) {
        kv_stage_xfer_t *x = *pp;
        if (x->in_flight == 0) {
            *pp = x->next_orphan;
            kv_stage_xfer_free(x);
        } else {
            pp = &x->next_orphan;
        }
    }
}

static int kv_stage_busy_buffers(const kv_stage_send_t *s)
{
    int busy = 0;
    for (int b = 0; b < s->n_buffers; b++)
        busy += s->bufs[b].state != KV_STAGE_BUF_FREE;
    return busy;
}

void kv_stage_send_destroy(kv_stage_send_t **send_p)
{
    kv_stage_send_t *s = *send_p;
    uint64_t deadline;

    if (s == NULL)
        return;
    BT_ASSERT(s->n_xfers == 0);
    deadline = bt_time_ns() + (uint64_t)KV_STAGE_DRAIN_MS * 1000000;
    while ((s->orphans != NULL || kv_stage_busy_buffers(s) > 0) &&
           bt_time_ns() < deadline) {
        if (!kv_stage_send_progress(s))
            kv_stage_idle(s->ucx, true);
    }
    if (s->orphans != NULL || kv_stage_busy_buffers(s) > 0)
        BT_LOG_WARN(KV_STAGE_SUBSYS,
                    "stage sender: chunks still in flight after %d ms; "
                    "dropping them", KV_STAGE_DRAIN_MS);
    while (s->orphans != NULL) {
        kv_stage_xfer_t *x = s->orphans;
        s->orphans = x->next_orphan;
        kv_stage_xfer_free(x);
    }
    BT_ASSERT(s->n_peers == 0);
    while (s->jobs != NULL) {
        kv_stage_job_t *j = s->jobs;
        s->jobs = j->next_job;
        bt_free(j);
    }
    for (int b = 0; b < s->n_buffers; b++)
        if (s->bufs[b].event != NULL)
            s->ops->event_destroy(s->bufs[b].event);
    if (s->stream != NULL)
        s->ops->stream_destroy(s->stream);
    if (s->pinned)
        s->ops->host_unregister(s->h_stage);
    if (s->h_stage != NULL)
        kv_ucx_mem_free(s->ucx, (void **)&s->h_stage);
    bt_free(s->stage_ids);
    bt_free(s);
    *send_p = NULL;
}

// ----------------------------------------------------------------------------
// Sender: peers and transfers

bt_status_t kv_stage_connect(kv_stage_send_t *send, const void *desc,
                             size_t len, kv_stage_peer_t **peer_p)
{
    kv_stage_peer_t *p;
    const kv_layout_t *rl;
    bt_status_t status;

    p = bt_calloc(1, sizeof(*p), "kv_stage_peer");
    if (p == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "peer");
    p->desc = bt_malloc(len > 0 ? len : 1, "kv_stage_peer");
    if (p->desc == NULL) {
        bt_free(p);
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "peer");
    }
    if (len > 0)
        memcpy(p->desc, desc, len);
    p->desc_len = len;
    status = kv_stage_desc_parse(p->desc, len, &p->info);
    if (status != BT_OK)
        goto err_free;
    status = kv_ucx_connect(send->ucx, p->info.ucx, p->info.ucx_len, &p->up);
    if (status != BT_OK)
        goto err_free;
    rl = kv_ucx_desc_layout(kv_ucx_peer_desc(p->up));
    if (rl->n_layers != send->layout.n_layers ||
        rl->block_size != send->layout.block_size ||
        rl->n_kv_heads != send->layout.n_kv_heads ||
        rl->head_dim != send->layout.head_dim ||
        rl->elem_size != send->layout.elem_size) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                          "stage peer: layout %d layers x %d x %d x %d x "
                          "%zu B differs from ours", rl->n_layers,
                          rl->block_size, rl->n_kv_heads, rl->head_dim,
                          rl->elem_size);
        kv_ucx_disconnect(&p->up);
        goto err_free;
    }
    p->send = send;
    p->refs = 1;
    send->n_peers++;
    *peer_p = p;
    return BT_OK;

err_free:
    bt_free(p->desc);
    bt_free(p);
    return status;
}

void kv_stage_disconnect(kv_stage_peer_t **peer_p)
{
    if (*peer_p == NULL)
        return;
    kv_stage_peer_unref(*peer_p);
    *peer_p = NULL;
}

static void kv_stage_xfer_fail(kv_stage_xfer_t *x, bt_status_t status);

void kv_stage_peer_abandon(kv_stage_peer_t *peer)
{
    kv_stage_send_t *s = peer->send;

    /* Its endpoint too (first: reaping orphans may drop the last
     * reference): the close then never waits for operations a dead
     * process will not complete (kv_ucx_peer_abandon). */
    kv_ucx_peer_abandon(peer->up);
    for (int b = 0; b < s->n_buffers; b++) {
        kv_stage_buf_t *buf = &s->bufs[b];
        if (buf->state != KV_STAGE_BUF_PUT || buf->xfer == NULL ||
            buf->xfer->peer != peer)
            continue;
        kv_stage_xfer_fail(buf->xfer, BT_ERR_NET);
        buf->xfer->in_flight--;
        buf->xfer = NULL;
        buf->state = KV_STAGE_BUF_FREE;
    }
    if (s->orphans != NULL)
        kv_stage_reap_orphans(s); /* may free peer */
}

const kv_stage_desc_info_t *kv_stage_peer_info(const kv_stage_peer_t *peer)
{
    return &peer->info;
}

/* A transfer of n blocks src_ids[i] -> dst_ids[i] (NULL: i, a window's
 * blocks), its lists copied; the ids were checked by the caller. */
static bt_status_t kv_stage_xfer_new(kv_stage_send_t *send,
                                     kv_stage_peer_t *peer, int slot,
                                     uint64_t epoch, const int *src_ids,
                                     const int *dst_ids, int n,
                                     kv_stage_xfer_t **xfer_p)
{
    kv_stage_xfer_t *x;
    size_t ids = (size_t)(n > 0 ? n : 1) * sizeof(int);

    x = bt_calloc(1, sizeof(*x), "kv_stage_xfer");
    if (x == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "transfer");
    x->src_ids = bt_malloc(ids, "kv_stage_xfer");
    x->dst_ids = bt_malloc(ids, "kv_stage_xfer");
    x->queued = bt_calloc((size_t)send->layout.n_layers, 1, "kv_stage_xfer");
    if (x->src_ids == NULL || x->dst_ids == NULL || x->queued == NULL) {
        bt_free(x->src_ids);
        bt_free(x->dst_ids);
        bt_free(x->queued);
        bt_free(x);
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "transfer");
    }
    if (n > 0)
        memcpy(x->src_ids, src_ids, (size_t)n * sizeof(int));
    for (int i = 0; i < n; i++)
        x->dst_ids[i] = dst_ids != NULL ? dst_ids[i] : i;
    x->send = send;
    x->peer = peer;
    peer->refs++;
    x->slot = slot;
    x->epoch = epoch;
    x->n = n;
    x->status = BT_IN_PROGRESS;
    send->n_xfers++;
    *xfer_p = x;
    return BT_OK;
}

/* Checks a transfer's slot, epoch and source ids (and dst_ids against
 * the peer's area, when given). */
static bt_status_t kv_stage_xfer_check(const kv_stage_send_t *send,
                                       const kv_stage_peer_t *peer, int slot,
                                       uint64_t epoch, const int *src_ids,
                                       const int *dst_ids, int n)
{
    if (slot < 0 || slot >= peer->info.n_slots || epoch == 0 || n < 0 ||
        (n > 0 && src_ids == NULL))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_xfer_begin: slot %d of %d, epoch %llu, "
                        "n %d", slot, peer->info.n_slots,
                        (unsigned long long)epoch, n);
    for (int i = 0; i < n; i++)
        if (src_ids[i] < 0 || src_ids[i] >= send->layout.n_blocks ||
            (dst_ids != NULL &&
             (dst_ids[i] < 0 || dst_ids[i] >= peer->info.recv_blocks)))
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                            "kv_stage_xfer_begin: pair %d: %d -> %d out of "
                            "range (%d, %d)", i, src_ids[i],
                            dst_ids != NULL ? dst_ids[i] : i,
                            send->layout.n_blocks, peer->info.recv_blocks);
    return BT_OK;
}

bt_status_t kv_stage_xfer_begin(kv_stage_send_t *send, kv_stage_peer_t *peer,
                                int slot, uint64_t epoch, const int *src_ids,
                                const int *dst_ids, int n,
                                kv_stage_xfer_t **xfer_p)
{
    bt_status_t status;

    if (n > 0 && (dst_ids == NULL || peer->info.windowed))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_xfer_begin: %s", dst_ids == NULL
                            ? "no destination ids"
                            : "the receiver takes KV through receive "
                              "windows only");
    status = kv_stage_xfer_check(send, peer, slot, epoch, src_ids, dst_ids,
                                 n);
    if (status != BT_OK)
        return status;
    return kv_stage_xfer_new(send, peer, slot, epoch, src_ids, dst_ids, n,
                             xfer_p);
}

bt_status_t kv_stage_xfer_begin_window(kv_stage_send_t *send,
                                       kv_stage_peer_t *peer, int slot,
                                       uint64_t epoch, const int *src_ids,
                                       int n, const void *window,
                                       size_t window_len,
                                       kv_stage_xfer_t **xfer_p)
{
    kv_ucx_rwindow_t *rw = NULL;
    kv_stage_xfer_t *x;
    bt_status_t status;

    if (!peer->info.windowed)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_xfer_begin_window: the receiver has a "
                        "receive area, not windows");
    status = kv_stage_xfer_check(send, peer, slot, epoch, src_ids, NULL, n);
    if (status != BT_OK)
        return status;
    if (n > 0) {
        /* the descriptor is untrusted: parsed and checked against this
         * peer's pool before its key is unpacked */
        status = kv_ucx_window_open(peer->up, window, window_len, &rw);
        if (status != BT_OK)
            return status;
        if (kv_ucx_rwindow_blocks(rw) < n) {
            int have = kv_ucx_rwindow_blocks(rw);
            kv_ucx_window_close(&rw);
            return BT_ERROR(BT_ERR_FORMAT, KV_STAGE_SUBSYS,
                            "receive window of %d blocks for %d", have, n);
        }
    }
    status = kv_stage_xfer_new(send, peer, slot, epoch, src_ids, NULL, n, &x);
    if (status != BT_OK) {
        kv_ucx_window_close(&rw);
        return status;
    }
    x->win = rw;
    *xfer_p = x;
    return BT_OK;
}

/* Records the first error of a transfer. */
static void kv_stage_xfer_fail(kv_stage_xfer_t *x, bt_status_t status)
{
    if (x->status == BT_IN_PROGRESS || x->status == BT_OK)
        x->status = status;
}

/* One layer's final commit landed. */
static void kv_stage_xfer_layer_done(kv_stage_xfer_t *x)
{
    x->n_committed++;
    if (x->n_committed == x->send->layout.n_layers &&
        x->status == BT_IN_PROGRESS)
        x->status = BT_OK;
}

static int kv_stage_commit_word(const kv_stage_xfer_t *x, int layer,
                                bool last);
static bool kv_stage_commit_is(const kv_stage_xfer_t *x, int layer,
                               bool last, int slot, uint64_t epoch);

/* Commit callback of a staged chunk: the buffer is free again. */
static void kv_stage_buf_commit_cb(void *arg, int slot, uint64_t epoch,
                                   bt_status_t status)
{
    kv_stage_buf_t *buf = arg;
    kv_stage_xfer_t *x = buf->xfer;

    if (buf->state != KV_STAGE_BUF_PUT || x == NULL ||
        !kv_stage_commit_is(x, buf->layer, buf->last, slot, epoch))
        return; /* abandoned (kv_stage_peer_abandon); buffer reused */
    if (status != BT_OK)
        kv_stage_xfer_fail(x, status);
    else if (buf->last)
        kv_stage_xfer_layer_done(x);
    if (status == BT_OK)
        x->n_landed++;
    x->in_flight--;
    buf->xfer = NULL;
    buf->state = KV_STAGE_BUF_FREE;
}

/* Commit callback of a direct layer. */
static void kv_stage_direct_commit_cb(void *arg, int slot, uint64_t epoch,
                                      bt_status_t status)
{
    kv_stage_xfer_t *x = arg;

    (void)slot;
    (void)epoch;
    if (status != BT_OK) {
        kv_stage_xfer_fail(x, status);
    } else {
        kv_stage_xfer_layer_done(x);
        x->n_landed++;
    }
    x->in_flight--;
}

/* The arrival word a chunk's commit writes. */
static int kv_stage_commit_word(const kv_stage_xfer_t *x, int layer,
                                bool last)
{
    const kv_stage_desc_info_t *info = &x->peer->info;
    return last ? x->slot * info->n_layers + layer
                : info->n_slots * info->n_layers; /* scratch */
}

/* True when a commit callback's (slot, epoch) is that of x's chunk
 * commit (kv_stage_commit), not a late one of an abandoned buffer. */
static bool kv_stage_commit_is(const kv_stage_xfer_t *x, int layer,
                               bool last, int slot, uint64_t epoch)
{
    if (epoch != x->epoch)
        return false;
    if (!x->peer->info.windowed)
        return slot == kv_stage_commit_word(x, layer, last);
    /* a flush reports slot -1; a window's commit its layer-0 word */
    return slot == (!last || x->win == NULL
                        ? -1 : x->slot * x->peer->info.n_layers);
}

/* Commits a chunk of x's layer `layer` (`last`: the layer's last).  With
 * a receive area, an epoch put into its arrival word (the last chunk's)
 * or the scratch word (the others': only to learn that the staging
 * buffer's puts are remotely complete).  With windows the decode worker
 * may run without RMA: the layer's last chunk commits by a message it
 * checks and answers (token, slot, epoch, that layer's bytes), the
 * others only flush - the buffer's puts complete remotely, its messages
 * are sent, and the layer's commit checks them all. */
static bt_status_t kv_stage_commit(kv_stage_xfer_t *x, int layer, bool last,
                                   kv_ucx_commit_cb_t cb, void *arg)
{
    if (!x->peer->info.windowed)
        return kv_ucx_commit(x->peer->up,
                             kv_stage_commit_word(x, layer, last), x->epoch,
                             cb, arg);
    if (!last || x->win == NULL) /* x->win NULL: n == 0, nothing to land */
        return kv_ucx_flush(x->peer->up, x->epoch, cb, arg);
    return kv_ucx_commit_window_layer(x->peer->up, x->win, layer, cb, arg);
}

/* Puts blocks [off, off + cnt) of x's layer `layer` from src_k / src_v
 * (laid out by `lay`, blocks src_ids[0..cnt)): into the grant's window
 * at the same offsets, or to the peer's area ids dst_ids[off..]. */
static bt_status_t kv_stage_put(kv_stage_xfer_t *x, int layer, int off,
                                const void *src_k, const void *src_v,
                                const kv_layout_t *lay,
                                kv_ucx_mem_type_t mem, const int *src_ids,
                                int cnt)
{
    if (cnt == 0)
        return BT_OK; /* a windowed peer takes no put without a window */
    if (x->win != NULL)
        return kv_ucx_put_layer_window_at(x->peer->up, x->win, layer, off,
                                          src_k, src_v, lay, mem, src_ids,
                                          cnt);
    return kv_ucx_put_layer(x->peer->up, layer, src_k, src_v, lay, mem,
                            src_ids, x->dst_ids + off, cnt);
}

/* Direct mode: puts a whole layer from device memory and commits it. */
static bt_status_t kv_stage_direct_layer(kv_stage_send_t *s,
                                         kv_stage_job_t *j)
{
    kv_stage_xfer_t *x = j->xfer;
    bt_status_t status;

    status = kv_stage_put(x, j->layer, 0, j->src_k, j->src_v, &s->layout,
                          s->src_mem, x->src_ids, x->n);
    if (status == BT_OK)
        status = kv_stage_commit(x, j->layer, true, kv_stage_direct_commit_cb,
                                 x);
    if (status != BT_OK)
        return status;
    x->in_flight++;
    s->stats.chunks++;
    s->stats.bytes += 2 * (uint64_t)x->n * s->block_bytes;
    return BT_OK;
}

/* Stages the next chunk of job `j` into free buffer `buf`: D2H copies of
 * the source runs, packed, then an event. */
static bt_status_t kv_stage_fill(kv_stage_send_t *s, kv_stage_buf_t *buf,
                                 kv_stage_job_t *j)
{
    kv_stage_xfer_t *x = j->xfer;
    size_t bb = s->block_bytes;
    int off = j->next;
    int cnt = BT_MIN(s->stage_blocks, x->n - off);
    bt_status_t status;
    int run;

    for (int i = 0; i < cnt; i += run) {
        size_t soff = (size_t)x->src_ids[off + i] * bb;
        size_t hoff = (size_t)i * bb;
        run = kv_stage_run(x->src_ids + off, NULL, i, cnt);
        status = s->ops->copy_async(s->stream, buf->h_k + hoff,
                                    j->src_k + soff, (size_t)run * bb);
        if (status != BT_OK)
            return status;
        status = s->ops->copy_async(s->stream, buf->h_v + hoff,
                                    j->src_v + soff, (size_t)run * bb);
        if (status != BT_OK)
            return status;
        s->stats.d2h_copies += 2;
    }
    status = s->ops->event_record(buf->event, s->stream);
    if (status != BT_OK)
        return status;
    buf->state = KV_STAGE_BUF_D2H;
    buf->xfer = x;
    buf->layer = j->layer;
    buf->off = off;
    buf->cnt = cnt;
    buf->last = off + cnt >= x->n;
    buf->seq = s->fill_seq++;
    x->in_flight++;
    j->next = off + cnt;
    s->stats.chunks++;
    s->stats.bytes += 2 * (uint64_t)cnt * bb;
    return BT_OK;
}

/* Pops the head job. */
static void kv_stage_job_pop(kv_stage_send_t *s)
{
    kv_stage_job_t *j = s->jobs;
    s->jobs = j->next_job;
    if (s->jobs == NULL)
        s->jobs_tail = NULL;
    bt_free(j);
}

/* Starts as many queued chunks as there are free buffers. */
static bool kv_stage_dispatch(kv_stage_send_t *s)
{
    bool any = false;

    while (s->jobs != NULL) {
        kv_stage_job_t *j = s->jobs;
        kv_stage_xfer_t *x = j->xfer;
        kv_stage_buf_t *buf = NULL;
        bt_status_t status;

        if (x->status != BT_IN_PROGRESS) {
            kv_stage_job_pop(s); /* failed transfer: drop its layers */
            any = true;
            continue;
        }
        if (s->direct) {
            status = kv_stage_direct_layer(s, j);
            if (status != BT_OK)
                kv_stage_xfer_fail(x, status);
            kv_stage_job_pop(s);
            any = true;
            continue;
        }
        for (int b = 0; b < s->n_buffers; b++)
            if (s->bufs[b].state == KV_STAGE_BUF_FREE) {
                buf = &s->bufs[b];
                break;
            }
        if (buf == NULL)
            break;
        status = kv_stage_fill(s, buf, j);
        any = true;
        if (status != BT_OK) {
            kv_stage_xfer_fail(x, status);
            kv_stage_job_pop(s);
            continue;
        }
        if (j->next >= x->n)
            kv_stage_job_pop(s);
    }
    if (!s->direct)
        s->stats.max_busy = BT_MAX(s->stats.max_busy,
                                   kv_stage_busy_buffers(s));
    return any;
}

/* Turns the oldest staged buffers whose D2H finished into puts + a
 * commit, in fill order. */
static bool kv_stage_flush_staged(kv_stage_send_t *s)
{
    bool any = false;

    for (;;) {
        kv_stage_buf_t *buf = NULL;
        kv_stage_xfer_t *x;
        bt_status_t status;

        for (int b = 0; b < s->n_buffers; b++)
            if (s->bufs[b].state == KV_STAGE_BUF_D2H &&
                (buf == NULL || s->bufs[b].seq < buf->seq))
                buf = &s->bufs[b];
        if (buf == NULL)
            return any;
        status = s->ops->event_query(buf->event);
        if (status == BT_IN_PROGRESS)
            return any;
        any = true;
        x = buf->xfer;
        if (status == BT_OK && x->status != BT_IN_PROGRESS)
            status = BT_ERR_CANCELLED; /* failed meanwhile: put nothing */
        if (status == BT_OK)
            status = kv_stage_put(x, buf->layer, buf->off, buf->h_k,
                                  buf->h_v, &s->stage_layout,
                                  KV_UCX_MEM_HOST, s->stage_ids, buf->cnt);
        if (status == BT_OK)
            status = kv_stage_commit(x, buf->layer, buf->last,
                                     kv_stage_buf_commit_cb, buf);
        if (status == BT_OK) {
            buf->state = KV_STAGE_BUF_PUT;
            continue;
        }
        /* No callback will come: free the buffer here.  Puts already
         * issued read the buffer until the endpoint failed or they
         * completed; a failed endpoint never completes them, and a
         * healthy one only fails here on an argument bug. */
        if (status != BT_ERR_CANCELLED)
            kv_stage_xfer_fail(x, status);
        x->in_flight--;
        buf->xfer = NULL;
        buf->state = KV_STAGE_BUF_FREE;
    }
}

bt_status_t kv_stage_xfer_layer(kv_stage_xfer_t *xfer, int layer,
                                const void *src_k, const void *src_v)
{
    kv_stage_send_t *s = xfer->send;
    kv_stage_job_t *j;

    if (layer < 0 || layer >= s->layout.n_layers || xfer->queued[layer] ||
        src_k == NULL || src_v == NULL || xfer->orphaned)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_STAGE_SUBSYS,
                        "kv_stage_xfer_layer: layer %d of %d (queued "
                        "twice?)", layer, s->layout.n_layers);
    if (xfer->status != BT_IN_PROGRESS)
        return xfer->status == BT_OK ? BT_ERR_INVALID_ARG : xfer->status;
    j = bt_calloc(1, sizeof(*j), "kv_stage_job");
    if (j == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "layer job");
    j->xfer = xfer;
    j->layer = layer;
    j->src_k = src_k;
    j->src_v = src_v;
    if (s->jobs_tail != NULL)
        s->jobs_tail->next_job = j;
    else
        s->jobs = j;
    s->jobs_tail = j;
    xfer->queued[layer] = 1;
    (void)kv_stage_dispatch(s);
    return BT_OK;
}

bool kv_stage_send_progress(kv_stage_send_t *send)
{
    bool any = kv_ucx_progress(send->ucx);

    if (!send->direct)
        any |= kv_stage_flush_staged(send);
    any |= kv_stage_dispatch(send);
    if (!send->direct)
        any |= kv_stage_flush_staged(send); /* sync copies finish at once */
    if (send->orphans != NULL)
        kv_stage_reap_orphans(send);
    return any;
}

bt_status_t kv_stage_xfer_status(const kv_stage_xfer_t *xfer)
{
    return xfer->status;
}

uint64_t kv_stage_xfer_landed(const kv_stage_xfer_t *xfer)
{
    return xfer->n_landed;
}

bt_status_t kv_stage_xfer_wait(kv_stage_xfer_t *xfer, int timeout_ms)
{
    kv_stage_send_t *s = xfer->send;
    uint64_t deadline = bt_time_ns() + (uint64_t)timeout_ms * 1000000;

    for (;;) {
        bool any = kv_stage_send_progress(s);
        if (xfer->status != BT_IN_PROGRESS)
            return xfer->status;
        if (bt_time_ns() >= deadline)
            return BT_ERROR(BT_ERR_TIMEOUT, KV_STAGE_SUBSYS,
                            "stage transfer to slot %d: %d of %d layers "
                            "committed after %d ms", xfer->slot,
                            xfer->n_committed, s->layout.n_layers,
                            timeout_ms);
        if (!any) {
            bool copies = false;
            for (int b = 0; b < s->n_buffers; b++)
                copies |= s->bufs[b].state == KV_STAGE_BUF_D2H;
            kv_stage_idle(s->ucx, copies);
        }
    }
}

void kv_stage_xfer_destroy(kv_stage_xfer_t **xfer_p)
{
    kv_stage_xfer_t *x = *xfer_p;
    kv_stage_send_t *s;
    kv_stage_job_t **pp;

    if (x == NULL)
        return;
    s = x->send;
    /* Drop its queued layers. */
    pp = &s->jobs;
    s->jobs_tail = NULL;
    while (*pp != NULL) {
        kv_stage_job_t *j = *pp;
        if (j->xfer == x) {
            *pp = j->next_job;
            bt_free(j);
        } else {
            s->jobs_tail = j;
            pp = &j->next_job;
        }
    }
    s->n_xfers--;
    if (x->in_flight == 0) {
        kv_stage_xfer_free(x);
    } else {
        kv_stage_xfer_fail(x, BT_ERR_CANCELLED);
        x->orphaned = true;
        x->next_orphan = s->orphans;
        s->orphans = x;
    }
    *xfer_p = NULL;
}

void kv_stage_send_stats(const kv_stage_send_t *send,
                         kv_stage_send_stats_t *stats)
{
    *stats = send->stats;
}
