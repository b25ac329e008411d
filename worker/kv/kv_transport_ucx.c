/*
 * kv_transport_ucx.c - KV hand-off over UCX RMA (see kv_transport.h for
 * the protocol, the descriptor contents and the ordering argument).
 *
 * Descriptor wire format, little-endian, every field fixed-width:
 *   off  size
 *     0     4  magic "BTKV"
 *     4     1  version (KV_UCX_DESC_VERSION)
 *     5     1  memory type (kv_ucx_mem_type_t)
 *     6     1  flags: 1 = windowed (kv_ucx_pool_register_windowed: one
 *              region, the arrival slots, and no layer entries)
 *     7     1  reserved, 0
 *     8     4  total length in bytes (== the buffer length)
 *    12     4  reserved, 0
 *    16     8  pool id (random per registration)
 *    24    24  layout: n_layers, n_blocks, block_size, n_kv_heads,
 *              head_dim, elem_size (u32 each)
 *    48     4  n_slots          52  4  slot region index
 *    56     8  slot offset inside that region (8-aligned)
 *    64     4  n_regions        68  4  worker address length
 *    72        regions: n_regions x { base u64, length u64, rkey_len u32,
 *              rkey bytes }
 *              layers: n_layers x { k_region u32, k_offset u64,
 *              v_region u32, v_offset u64 }
 *              worker address bytes
 *   end-8   8  FNV-1a 64 of every byte before it
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <sys/shm.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_transport.h"

#define KV_UCX_SUBSYS "KV"
#define KV_UCX_MAGIC "BTKV"
#define KV_UCX_HDR_BYTES 72
#define KV_UCX_REGION_HDR 20 /* base, length, rkey_len */
#define KV_UCX_LAYER_BYTES 24
#define KV_UCX_MAX_LAYERS 4096
#define KV_UCX_MAX_BLOCKS (1 << 24)
#define KV_UCX_MAX_SLOTS (1 << 24)
#define KV_UCX_MAX_RKEY 65536
#define KV_UCX_MAX_ADDR 65536
#define KV_UCX_CLOSE_MS 2000
/* Active-message hand-off (receive windows over software RMA, below):
 * ids, header bytes, and the most bytes one data message carries (eager
 * only: the decode worker never starts a rendezvous for a writer). */
#define KV_UCX_AM_DATA 0x4b56
#define KV_UCX_AM_COMMIT 0x4b57
#define KV_UCX_AM_ACK 0x4b58
#define KV_UCX_MAX_ACKS 4096 /* acks queued at most (a flood is dropped) */
#define KV_UCX_AM_HDR 64
#define KV_UCX_AM_CHUNK (256u << 10)
#define KV_UCX_TOKEN_BYTES 16

/* Converts a UCX status at the boundary: logs once and evaluates to a
 * bt_status_t (BT_OK for UCS_OK). */
#define KV_UCX_CHECK(_call, _what)                                          \
    kv_ucx_status_from((_call), (_what), __FILE__, __LINE__, __func__)

static bt_status_t kv_ucx_status_from(ucs_status_t ucs, const char *what,
                                      const char *file, int line,
                                      const char *func)
{
    if (ucs == UCS_OK)
        return BT_OK;
    return bt_error_record(BT_ERR_NET, KV_UCX_SUBSYS, file, line, func,
                           "%s failed: %s", what, ucs_status_string(ucs));
}

// ----------------------------------------------------------------------------
// Types

typedef struct kv_ucx_commit_s kv_ucx_commit_t;
typedef struct kv_ucx_ack_s kv_ucx_ack_t;

struct kv_ucx_s {
    ucp_context_h context;   /* UCX context (RMA [+ wakeup]) */
    ucp_worker_h worker;     /* the one worker, progressed by the caller */
    int efd;                 /* worker event fd, -1 without wakeup */
    bool peer_errors;        /* endpoints in UCP_ERR_HANDLING_MODE_PEER */
    int n_pools;             /* live pools made from this context */
    kv_ucx_peer_t *peers;    /* live peers (cache by pool id) */
    kv_ucx_peer_t *zombies;  /* closed peers with callbacks still due */
    kv_ucx_commit_t *ready;  /* commits whose current stage finished */
    kv_ucx_commit_t *ready_tail; /* last of `ready` (FIFO) */
    struct kv_ucx_alloc_s *allocs; /* kv_ucx_mem_alloc blocks */
    kv_ucx_commit_t *commits;    /* every live commit (freed at destroy) */
    struct kv_ucx_pool_s *wpools;/* windowed pools (active-message lookup) */
    uint64_t refused;            /* KV messages the handlers dropped */
    uint64_t refused_log_ns;     /* last refusal logged (rate limit) */
    kv_ucx_ack_t *acks;          /* commit acks to send (after progress) */
    kv_ucx_ack_t *acks_sent;     /* acks in flight (freed at destroy) */
    int n_acks;                  /* both lists */
};

/* A commit's answer to its writer: queued by the handler, sent from
 * kv_ucx_progress (never from inside UCX's callback). */
struct kv_ucx_ack_s {
    ucp_ep_h ep;                 /* the writer's reply endpoint */
    uint8_t hdr[KV_UCX_AM_HDR];  /* accepted (kv 0) or refused (1) */
    kv_ucx_t *ctx;               /* whose lists hold it */
    kv_ucx_ack_t *prev;          /* ctx->acks_sent */
    kv_ucx_ack_t *next;          /* ctx->acks or ctx->acks_sent */
};

typedef struct kv_ucx_alloc_s {
    uint8_t *ptr;                /* first byte */
    size_t len;                  /* bytes */
    ucp_mem_h memh;              /* the allocating registration */
    struct kv_ucx_alloc_s *next; /* ctx->allocs */
} kv_ucx_alloc_t;

typedef struct {
    uint64_t base;        /* remote virtual address of the region */
    uint64_t length;      /* bytes */
    const uint8_t *rkey;  /* packed rkey, points into the descriptor copy */
    uint32_t rkey_len;    /* bytes of rkey */
} kv_ucx_region_t;

typedef struct {
    uint32_t region;      /* index into regions */
    uint64_t offset;      /* byte offset of the layer's array in it */
} kv_ucx_ref_t;

struct kv_ucx_desc_s {
    uint8_t *buf;              /* (len) private copy of the bytes */
    size_t len;                /* descriptor length */
    uint64_t pool_id;          /* random identity of the pool */
    kv_ucx_mem_type_t mem_type;/* memory type of the KV regions */
    bool windowed;             /* no KV regions: receive windows only */
    kv_layout_t layout;        /* remote pool layout */
    size_t block_bytes;        /* bytes of one block of one layer's K */
    size_t layer_bytes;        /* n_blocks * block_bytes */
    int n_slots;               /* arrival slots */
    kv_ucx_ref_t slots;        /* where arrival[0] lives */
    int n_regions;             /* registered regions */
    kv_ucx_region_t *regions;  /* (n_regions) */
    kv_ucx_ref_t *k;           /* (n_layers) K array of each layer */
    kv_ucx_ref_t *v;           /* (n_layers) V array of each layer */
    const uint8_t *addr;       /* worker address, points into buf */
    uint32_t addr_len;         /* bytes of addr */
};

struct kv_ucx_pool_s {
    kv_ucx_t *ctx;             /* owner context */
    kv_layout_t layout;        /* local pool layout */
    int n_regions;             /* mapped regions (last: arrival slots) */
    ucp_mem_h *memh;           /* (n_regions) */
    bool *own;                 /* (n_regions) memh mapped by the pool */
    uint64_t *arrival;         /* (n_slots) epoch per reservation slot */
    int n_slots;               /* reservation slots */
    uint8_t *desc;             /* (desc_len) serialized descriptor */
    size_t desc_len;           /* bytes */
    uint64_t id;               /* the descriptor's pool id */
    bool windowed;             /* KV only through receive windows */
    int n_windows;             /* live windows (unmapped before the pool) */
    struct kv_ucx_window_s **slot_win; /* (n_slots) windowed: the live
                                        * window of each slot, or NULL */
    struct kv_ucx_pool_s *wnext;/* ctx->wpools */
};

struct kv_ucx_peer_s {
    kv_ucx_t *ctx;             /* owner context */
    kv_ucx_desc_t *desc;       /* the remote pool */
    ucp_ep_h ep;               /* endpoint to the decode worker */
    ucp_rkey_h *rkeys;         /* (desc->n_regions) unpacked rkeys */
    int refs;                  /* kv_ucx_connect references */
    int pending;               /* puts + commits in flight */
    bt_status_t status;        /* sticky endpoint error */
    bool abandoned;            /* kv_ucx_peer_abandon: presumed dead */
    bool closed;               /* endpoint closed: issue nothing more */
    uint64_t n_done;           /* operations the peer completed (OK) */
    uint64_t n_puts;           /* puts issued (after coalescing) */
    uint64_t n_bytes;          /* bytes put */
    bool rma_lanes;            /* the endpoint has RMA lanes (shared memory,
                                * RDMA): keys are checked; none means
                                * software RMA over the AM lane (tcp) */
    int am_inflight;           /* active-message sends in flight */
    kv_ucx_commit_t *am_waiters; /* commits waiting for them to complete */
    struct kv_ucx_rwindow_s *retired; /* closed windows whose keys wait
                                       * for the puts in flight */
    kv_ucx_peer_t *next;       /* ctx->peers / ctx->zombies list */
};

/* What a window's handlers know of one commit unit: the whole window, or
 * one layer of a window that commits layer by layer. */
typedef struct {
    uint64_t am_bytes;         /* data bytes accepted by message */
    uint64_t commit_bytes;     /* what the accepted commit announced */
    bool commit_pending;       /* committed, bytes still to come */
    bool sealed;               /* arrived: nothing more is accepted */
    ucp_ep_h ack_ep;           /* the committer's reply endpoint, or NULL */
} kv_ucx_wunit_t;

struct kv_ucx_window_s {
    kv_ucx_pool_t *pool;       /* whose layout and context */
    ucp_mem_h memh;            /* this window's own mapping */
    uint8_t *base;             /* (len) n_layers x K|V x n_blocks blocks:
                                * UCX's segment, or bt_calloc'ed when it
                                * has no key (memh NULL) */
    size_t len;
    int n_blocks;
    size_t block_bytes;
    long sysv_id;              /* its System V segment */
    uint8_t *desc;             /* (desc_len) KvGrant.ucx_window */
    size_t desc_len;
    int slot;                  /* the reservation's arrival slot */
    uint64_t epoch;            /* the grant's epoch */
    uint8_t token[KV_UCX_TOKEN_BYTES]; /* random: names this grant in
                                        * active messages */
    bool per_layer;            /* commits layer by layer (the staged
                                * link): layer l's sets slot + l */
    int n_units;               /* commit units: 1, or n_layers per layer */
    kv_ucx_wunit_t *units;     /* (n_units) */
};

struct kv_ucx_rwindow_s {
    kv_ucx_peer_t *peer;       /* the pool's endpoint (not a reference) */
    ucp_rkey_h rkey;           /* unpacked on peer->ep; NULL when am */
    uint64_t base;             /* the window's remote address */
    int n_blocks;
    int slot;                  /* from the descriptor */
    uint64_t epoch;
    uint8_t token[KV_UCX_TOKEN_BYTES];
    bool am;                   /* data by active message (no RMA lanes) */
    bool per_layer;            /* commits layer by layer */
    uint64_t am_bytes;         /* data bytes sent by message */
    uint64_t *layer_bytes;     /* (n_layers) per_layer: of each layer */
    struct kv_ucx_rwindow_s *next; /* peer->retired */
};

static void kv_ucx_retired_free(kv_ucx_peer_t *peer)
{
    while (peer->retired != NULL) {
        kv_ucx_rwindow_t *rw = peer->retired;
        peer->retired = rw->next;
        if (rw->rkey != NULL)
            ucp_rkey_destroy(rw->rkey);
        bt_free(rw->layer_bytes);
        bt_free(rw);
    }
}

typedef enum {
    KV_UCX_COMMIT_FLUSH_DATA = 0, /* flushing the reservation's data */
    KV_UCX_COMMIT_PUT_EPOCH,      /* putting the epoch */
    KV_UCX_COMMIT_FLUSH_EPOCH,    /* flushing the epoch */
    KV_UCX_COMMIT_DONE
} kv_ucx_commit_stage_t;

struct kv_ucx_commit_s {
    kv_ucx_peer_t *peer;          /* the peer (holds one pending count) */
    int slot;                     /* reservation slot */
    uint64_t epoch;               /* put source: must live until done */
    kv_ucx_commit_stage_t stage;  /* stage in progress */
    bool window;                  /* a window's: the epoch goes as an
                                   * active message carrying hdr */
    uint32_t unit;                /* window: its commit unit (layer) */
    bool flush_only;              /* kv_ucx_flush: no epoch at all */
    uint8_t hdr[KV_UCX_AM_HDR];   /* its header (lives until done) */
    bool acked;                   /* the decode worker answered */
    bool waiting_ack;             /* parked until it does */
    bt_status_t status;           /* first error */
    kv_ucx_commit_cb_t cb;        /* user completion, may be NULL */
    void *arg;                    /* for cb */
    kv_ucx_commit_t *next;        /* ctx->ready list */
    kv_ucx_commit_t *all_prev;    /* ctx->commits list */
    kv_ucx_commit_t *all_next;    /* ctx->commits list */
};

static void kv_ucx_commit_free(kv_ucx_t *ctx, kv_ucx_commit_t *c)
{
    if (c->all_prev != NULL)
        c->all_prev->all_next = c->all_next;
    else
        ctx->commits = c->all_next;
    if (c->all_next != NULL)
        c->all_next->all_prev = c->all_prev;
    bt_free(c);
}

// ----------------------------------------------------------------------------
// Little helpers

static ucs_memory_type_t kv_ucx_mem_type(kv_ucx_mem_type_t t)
{
    return t == KV_UCX_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

static uint64_t kv_ucx_random_id(void)
{
    static uint64_t counter;
    uint64_t z = bt_time_ns() ^ ((uint64_t)getpid() << 32) ^
                 (++counter * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) | 1;
}

static void kv_ucx_put_u32(uint8_t **p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *(*p)++ = (uint8_t)(v >> (8 * i));
}

static void kv_ucx_put_u64(uint8_t **p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        *(*p)++ = (uint8_t)(v >> (8 * i));
}

static uint32_t kv_ucx_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t kv_ucx_get_u64(const uint8_t *p)
{
    return (uint64_t)kv_ucx_get_u32(p) | (uint64_t)kv_ucx_get_u32(p + 4)
                                             << 32;
}

/* Block and layer bytes of a layout, with range and overflow checks
 * (the layout may come from the network). */
static bool kv_ucx_layout_sizes(const kv_layout_t *l, size_t *block_p,
                                size_t *layer_p)
{
    size_t b;
    if (l->n_layers < 1 || l->n_layers > KV_UCX_MAX_LAYERS ||
        l->n_blocks < 1 || l->n_blocks > KV_UCX_MAX_BLOCKS ||
        l->block_size < 1 || l->block_size > 65536 || l->n_kv_heads < 1 ||
        l->n_kv_heads > 65536 || l->head_dim < 1 || l->head_dim > 65536 ||
        l->elem_size < 1 || l->elem_size > 8)
        return false;
    if (bt_mul_overflow_size((size_t)l->block_size, (size_t)l->n_kv_heads,
                             &b) ||
        bt_mul_overflow_size(b, (size_t)l->head_dim, &b) ||
        bt_mul_overflow_size(b, l->elem_size, &b) ||
        bt_mul_overflow_size(b, (size_t)l->n_blocks, layer_p))
        return false;
    *block_p = b;
    return true;
}

// ----------------------------------------------------------------------------
// Context

void kv_ucx_config_init(kv_ucx_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->wakeup = true;
    cfg->peer_errors = true;
    cfg->rma = true;
}

static ucs_status_t kv_ucx_am_data_cb(void *arg, const void *header,
                                      size_t header_length, void *data,
                                      size_t length,
                                      const ucp_am_recv_param_t *param);
static ucs_status_t kv_ucx_am_commit_cb(void *arg, const void *header,
                                        size_t header_length, void *data,
                                        size_t length,
                                        const ucp_am_recv_param_t *param);
static ucs_status_t kv_ucx_am_ack_cb(void *arg, const void *header,
                                     size_t header_length, void *data,
                                     size_t length,
                                     const ucp_am_recv_param_t *param);

/* The receive side of the active-message hand-off: installed on every
 * context (a writer's too: with no windowed pool it refuses all). */
static bt_status_t kv_ucx_am_handlers_set(kv_ucx_t *ctx)
{
    ucp_am_handler_param_t hp;
    bt_status_t status;

    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.arg = ctx;
    hp.id = KV_UCX_AM_DATA;
    hp.cb = kv_ucx_am_data_cb;
    status = KV_UCX_CHECK(ucp_worker_set_am_recv_handler(ctx->worker, &hp),
                          "ucp_worker_set_am_recv_handler");
    if (status != BT_OK)
        return status;
    hp.id = KV_UCX_AM_COMMIT;
    hp.cb = kv_ucx_am_commit_cb;
    status = KV_UCX_CHECK(ucp_worker_set_am_recv_handler(ctx->worker, &hp),
                          "ucp_worker_set_am_recv_handler");
    if (status != BT_OK)
        return status;
    hp.id = KV_UCX_AM_ACK;
    hp.cb = kv_ucx_am_ack_cb;
    return KV_UCX_CHECK(ucp_worker_set_am_recv_handler(ctx->worker, &hp),
                        "ucp_worker_set_am_recv_handler");
}

bt_status_t kv_ucx_create(const kv_ucx_config_t *cfg, kv_ucx_t **ctx_p)
{
    kv_ucx_config_t defaults;
    ucp_config_t *config;
    ucp_params_t params;
    ucp_worker_params_t wparams;
    bt_status_t status;
    kv_ucx_t *ctx;

    if (cfg == NULL) {
        kv_ucx_config_init(&defaults);
        cfg = &defaults;
    }
    ctx = bt_calloc(1, sizeof(*ctx), "kv_ucx");
    if (ctx == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "kv_ucx context");
    ctx->efd = -1;
    ctx->peer_errors = cfg->peer_errors;

    status = KV_UCX_CHECK(ucp_config_read(NULL, NULL, &config),
                          "ucp_config_read");
    if (status != BT_OK)
        goto err_free_ctx;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    /* Without RMA this process runs no software-RMA handler: a put that
     * reaches it over tcp (where UCX checks no key) is dropped by UCX
     * instead of written to the address it names (kv_transport.h). */
    params.features = UCP_FEATURE_AM;
    if (cfg->rma)
        params.features |= UCP_FEATURE_RMA;
    if (cfg->wakeup)
        params.features |= UCP_FEATURE_WAKEUP;
    status = KV_UCX_CHECK(ucp_init(&params, config, &ctx->context),
                          "ucp_init");
    ucp_config_release(config);
    if (status != BT_OK)
        goto err_free_ctx;

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = cfg->serialized ? UCS_THREAD_MODE_SERIALIZED
                                          : UCS_THREAD_MODE_SINGLE;
    status = KV_UCX_CHECK(
        ucp_worker_create(ctx->context, &wparams, &ctx->worker),
        "ucp_worker_create");
    if (status != BT_OK)
        goto err_cleanup_context;
    if (cfg->wakeup) {
        status = KV_UCX_CHECK(ucp_worker_get_efd(ctx->worker, &ctx->efd),
                              "ucp_worker_get_efd");
        if (status != BT_OK)
            goto err_destroy_worker;
    }
    status = kv_ucx_am_handlers_set(ctx);
    if (status != BT_OK)
        goto err_destroy_worker;
    *ctx_p = ctx;
    return BT_OK;

err_destroy_worker:
    ucp_worker_destroy(ctx->worker);
err_cleanup_context:
    ucp_cleanup(ctx->context);
err_free_ctx:
    bt_free(ctx);
    return status;
}

static void kv_ucx_peer_free(kv_ucx_peer_t *peer);
static void kv_ucx_acks_free(kv_ucx_t *ctx);
static void kv_ucx_acks_send(kv_ucx_t *ctx);

void kv_ucx_destroy(kv_ucx_t **ctx_p)
{
    kv_ucx_t *ctx = *ctx_p;
    if (ctx == NULL)
        return;
    BT_ASSERT(ctx->n_pools == 0);
    BT_ASSERT(ctx->peers == NULL);
    BT_ASSERT(ctx->allocs == NULL);
    ucp_worker_destroy(ctx->worker);
    kv_ucx_acks_free(ctx);
    /* Commits still in flight (a peer that died and was force-closed)
     * are dropped without their callbacks: the worker is gone. */
    while (ctx->commits != NULL)
        kv_ucx_commit_free(ctx, ctx->commits);
    ctx->ready = ctx->ready_tail = NULL;
    /* Zombie peers had callbacks outstanding when closed; the worker is
     * gone now, so nothing can reach them any more. */
    while (ctx->zombies != NULL) {
        kv_ucx_peer_t *z = ctx->zombies;
        ctx->zombies = z->next;
        kv_ucx_peer_free(z);
    }
    ucp_cleanup(ctx->context);
    bt_free(ctx);
    *ctx_p = NULL;
}

static void kv_ucx_commit_advance(kv_ucx_commit_t *c);

/* Frees closed peers whose last operation has completed: nothing can
 * name them any more (every put and commit holds a pending count, and
 * neither touches the peer after dropping it).  Without this a peer
 * closed with operations in flight (a dead decode worker's, cancelled by
 * a forced close) stayed allocated until kv_ucx_destroy. */
static void kv_ucx_reap_zombies(kv_ucx_t *ctx)
{
    kv_ucx_peer_t **pp = &ctx->zombies;

    while (*pp != NULL) {
        kv_ucx_peer_t *z = *pp;
        if (z->pending > 0) {
            pp = &z->next;
            continue;
        }
        *pp = z->next;
        kv_ucx_peer_free(z);
    }
}

bool kv_ucx_progress(kv_ucx_t *ctx)
{
    bool any = false;
    while (ucp_worker_progress(ctx->worker) != 0)
        any = true;
    if (ctx->acks != NULL) {
        kv_ucx_acks_send(ctx);
        any = true;
    }
    while (ctx->ready != NULL) {
        kv_ucx_commit_t *c = ctx->ready;
        ctx->ready = c->next;
        if (ctx->ready == NULL)
            ctx->ready_tail = NULL;
        c->next = NULL;
        kv_ucx_commit_advance(c);
        any = true;
    }
    if (ctx->zombies != NULL)
        kv_ucx_reap_zombies(ctx);
    for (kv_ucx_peer_t *p = ctx->peers; p != NULL; p = p->next)
        if (p->retired != NULL && p->pending == 0)
            kv_ucx_retired_free(p);
    return any;
}

int kv_ucx_event_fd(const kv_ucx_t *ctx)
{
    return ctx->efd;
}

bt_status_t kv_ucx_arm(kv_ucx_t *ctx)
{
    ucs_status_t ucs;
    if (ctx->efd < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_arm without wakeup");
    if (ctx->ready != NULL || ctx->acks != NULL)
        return BT_IN_PROGRESS;
    ucs = ucp_worker_arm(ctx->worker);
    if (ucs == UCS_ERR_BUSY)
        return BT_IN_PROGRESS;
    return KV_UCX_CHECK(ucs, "ucp_worker_arm");
}

bt_status_t kv_ucx_wait(kv_ucx_t *ctx, int timeout_ms)
{
    struct pollfd pfd;
    bt_status_t status;
    int ret;

    if (kv_ucx_progress(ctx) || timeout_ms <= 0)
        return BT_OK;
    if (ctx->efd < 0) {
        /* No event fd: a short sleep bounds the spin. */
        struct timespec ts = { 0, 200 * 1000 };
        nanosleep(&ts, NULL);
        return BT_OK;
    }
    status = kv_ucx_arm(ctx);
    if (status != BT_OK)
        return status == BT_IN_PROGRESS ? BT_OK : status;
    pfd.fd = ctx->efd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    ret = poll(&pfd, 1, timeout_ms);
    if (ret < 0 && errno != EINTR)
        return BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS, "poll: %s",
                        strerror(errno));
    return BT_OK;
}

// ----------------------------------------------------------------------------
// Decode side: registration and the descriptor

typedef struct {
    uintptr_t start;        /* first byte */
    size_t len;             /* bytes */
    kv_ucx_alloc_t *alloc;  /* kv_ucx_mem_alloc block holding it, or NULL */
} kv_ucx_span_t;

/* Maps `bytes` of new memory UCX allocates itself (UCP_MEM_MAP_ALLOCATE:
 * on one host a shared memory segment a peer attaches through the key)
 * and finds where it went: *memh_p, *addr_p and *len_p (at least bytes)
 * are set on success only; the caller unmaps the handle.  `what` names
 * the mapping in the error. */
static bt_status_t kv_ucx_map_allocate(kv_ucx_t *ctx, size_t bytes,
                                       const char *what, ucp_mem_h *memh_p,
                                       void **addr_p, size_t *len_p)
{
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t attr;
    ucp_mem_h memh;
    bt_status_t status;

    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length = bytes;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    status = KV_UCX_CHECK(ucp_mem_map(ctx->context, &mp, &memh), what);
    if (status != BT_OK)
        return status;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = KV_UCX_CHECK(ucp_mem_query(memh, &attr), "ucp_mem_query");
    if (status != BT_OK) {
        ucp_mem_unmap(ctx->context, memh);
        return status;
    }
    BT_ASSERT(attr.length >= bytes);
    *memh_p = memh;
    *addr_p = attr.address;
    *len_p = attr.length;
    return BT_OK;
}

bt_status_t kv_ucx_mem_alloc(kv_ucx_t *ctx, size_t bytes,
                             kv_ucx_mem_type_t mem_type, void **ptr_p)
{
    kv_ucx_alloc_t *a;
    bt_status_t status;
    void *ptr;

    if (bytes == 0 || mem_type != KV_UCX_MEM_HOST)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_mem_alloc: %zu bytes of type %d", bytes,
                        (int)mem_type);
    a = bt_calloc(1, sizeof(*a), "kv_ucx_alloc");
    if (a == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "alloc");
    status = kv_ucx_map_allocate(ctx, bytes, "ucp_mem_map(ALLOCATE)",
                                 &a->memh, &ptr, &a->len);
    if (status != BT_OK) {
        bt_free(a);
        return status;
    }
    a->ptr = ptr;
    a->next = ctx->allocs;
    ctx->allocs = a;
    *ptr_p = a->ptr;
    return BT_OK;
}

void kv_ucx_mem_free(kv_ucx_t *ctx, void **ptr_p)
{
    kv_ucx_alloc_t **pp, *a;
    if (*ptr_p == NULL)
        return;
    for (pp = &ctx->allocs; *pp != NULL && (*pp)->ptr != *ptr_p;
         pp = &(*pp)->next)
        ;
    BT_ASSERT(*pp != NULL); /* not from kv_ucx_mem_alloc */
    a = *pp;
    *pp = a->next;
    ucp_mem_unmap(ctx->context, a->memh);
    bt_free(a);
    *ptr_p = NULL;
}

/* The kv_ucx_mem_alloc block that holds all of [start, start+len). */
static kv_ucx_alloc_t *kv_ucx_alloc_find(kv_ucx_t *ctx, uintptr_t start,
                                         size_t len)
{
    for (kv_ucx_alloc_t *a = ctx->allocs; a != NULL; a = a->next)
        if (start >= (uintptr_t)a->ptr &&
            start - (uintptr_t)a->ptr + len <= a->len)
            return a;
    return NULL;
}

static int kv_ucx_span_cmp(const void *a, const void *b)
{
    const kv_ucx_span_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Finds the region holding [p, p+len) among `n` sorted spans. */
static bool kv_ucx_find_region(const kv_ucx_span_t *regs, int n,
                               const void *p, size_t len,
                               kv_ucx_ref_t *ref_p)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < n; i++) {
        if (a >= regs[i].start && a - regs[i].start + len <= regs[i].len) {
            ref_p->region = (uint32_t)i;
            ref_p->offset = a - regs[i].start;
            return true;
        }
    }
    return false;
}

/* Merges the 2 * n_layers layer arrays into maximal contiguous spans,
 * followed by one span for the arrival slots.  Returns the span count in
 * *n_p and a bt_malloc'ed array. */
static bt_status_t kv_ucx_pool_spans(kv_ucx_t *ctx,
                                     const kv_layout_t *layout,
                                     size_t layer_bytes,
                                     void *const *k_layers,
                                     void *const *v_layers,
                                     const uint64_t *arrival, int n_slots,
                                     kv_ucx_span_t **spans_p, int *n_p)
{
    int n_arrays = k_layers != NULL ? 2 * layout->n_layers : 0, n = 0;
    kv_ucx_span_t *all;

    all = bt_calloc((size_t)n_arrays + 1, sizeof(*all), "kv_ucx_spans");
    if (all == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "spans");
    for (int l = 0; l < n_arrays / 2; l++) {
        if (k_layers[l] == NULL || v_layers[l] == NULL) {
            bt_free(all);
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                            "layer %d has a NULL K or V base", l);
        }
        all[2 * l].start = (uintptr_t)k_layers[l];
        all[2 * l].len = layer_bytes;
        all[2 * l + 1].start = (uintptr_t)v_layers[l];
        all[2 * l + 1].len = layer_bytes;
        all[2 * l].alloc = kv_ucx_alloc_find(ctx, all[2 * l].start,
                                             layer_bytes);
        all[2 * l + 1].alloc = kv_ucx_alloc_find(ctx, all[2 * l + 1].start,
                                                 layer_bytes);
    }
    qsort(all, (size_t)n_arrays, sizeof(*all), kv_ucx_span_cmp);
    for (int i = 0; i < n_arrays; i++) {
        if (n > 0 && all[i].start < all[n - 1].start + all[n - 1].len) {
            bt_free(all);
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                            "KV layer arrays overlap");
        }
        /* Merge adjacent arrays, but never across two allocations: each
         * region has exactly one registration. */
        if (n > 0 && all[i].start == all[n - 1].start + all[n - 1].len &&
            all[i].alloc == all[n - 1].alloc)
            all[n - 1].len += all[i].len;
        else
            all[n++] = all[i];
    }
    all[n].start = (uintptr_t)arrival;
    all[n].len = (size_t)n_slots * sizeof(uint64_t);
    all[n].alloc = NULL;
    n++;
    *spans_p = all;
    *n_p = n;
    return BT_OK;
}

/* k_layers == NULL: windowed, only the arrival slots are registered. */
static bt_status_t kv_ucx_pool_map(kv_ucx_t *ctx, const kv_layout_t *layout,
                                   void *const *k_layers,
                                   void *const *v_layers,
                                   kv_ucx_mem_type_t mem_type, int n_slots,
                                   kv_ucx_pool_t **pool_p)
{
    bool windowed = k_layers == NULL;
    size_t block_bytes, layer_bytes, rkey_total = 0, len;
    kv_ucx_span_t *spans = NULL;
    void **rkeys = NULL;
    size_t *rkey_lens = NULL;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    kv_ucx_pool_t *pool;
    bt_status_t status;
    uint8_t *p;
    int n_spans = 0, mapped = 0;

    if (!kv_ucx_layout_sizes(layout, &block_bytes, &layer_bytes))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "invalid KV layout");
    if (n_slots < 1 || n_slots > KV_UCX_MAX_SLOTS)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "n_slots %d out of range", n_slots);
    pool = bt_calloc(1, sizeof(*pool), "kv_ucx_pool");
    if (pool == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "pool");
    pool->ctx = ctx;
    pool->layout = *layout;
    pool->n_slots = n_slots;
    pool->arrival = bt_malloc_aligned((size_t)n_slots * sizeof(uint64_t),
                                      "kv_ucx_arrival");
    if (pool->arrival == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "arrival");
        goto err_free_pool;
    }
    memset(pool->arrival, 0, (size_t)n_slots * sizeof(uint64_t));

    status = kv_ucx_pool_spans(ctx, layout, layer_bytes, k_layers,
                               v_layers,
                               pool->arrival, n_slots, &spans, &n_spans);
    if (status != BT_OK)
        goto err_free_arrival;
    pool->memh = bt_calloc((size_t)n_spans, sizeof(*pool->memh),
                           "kv_ucx_memh");
    pool->own = bt_calloc((size_t)n_spans, sizeof(*pool->own),
                          "kv_ucx_memh");
    rkeys = bt_calloc((size_t)n_spans, sizeof(*rkeys), "kv_ucx_rkeys");
    rkey_lens = bt_calloc((size_t)n_spans, sizeof(*rkey_lens),
                          "kv_ucx_rkeys");
    if (pool->memh == NULL || pool->own == NULL || rkeys == NULL ||
        rkey_lens == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "memh");
        goto err_free_arrays;
    }
    for (mapped = 0; mapped < n_spans; mapped++) {
        ucp_mem_map_params_t mp;
        bool is_slots = mapped == n_spans - 1;
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.address = (void *)spans[mapped].start;
        mp.length = spans[mapped].len;
        mp.memory_type = is_slots ? UCS_MEMORY_TYPE_HOST
                                  : kv_ucx_mem_type(mem_type);
        if (spans[mapped].alloc != NULL) {
            pool->memh[mapped] = spans[mapped].alloc->memh;
        } else {
            status = KV_UCX_CHECK(
                ucp_mem_map(ctx->context, &mp, &pool->memh[mapped]),
                "ucp_mem_map");
            if (status != BT_OK)
                goto err_unmap;
            pool->own[mapped] = true;
        }
        status = KV_UCX_CHECK(ucp_rkey_pack(ctx->context, pool->memh[mapped],
                                            &rkeys[mapped],
                                            &rkey_lens[mapped]),
                              "ucp_rkey_pack");
        if (status != BT_OK) {
            if (pool->own[mapped])
                ucp_mem_unmap(ctx->context, pool->memh[mapped]);
            goto err_unmap;
        }
        rkey_total += KV_UCX_REGION_HDR + rkey_lens[mapped];
    }
    pool->n_regions = n_spans;
    status = KV_UCX_CHECK(ucp_worker_get_address(ctx->worker, &addr,
                                                 &addr_len),
                          "ucp_worker_get_address");
    if (status != BT_OK)
        goto err_unmap;

    /* Serialize (format at the top of this file). */
    len = KV_UCX_HDR_BYTES + rkey_total +
          (windowed ? 0 : (size_t)layout->n_layers * KV_UCX_LAYER_BYTES) +
          addr_len + 8;
    pool->desc = bt_malloc(len, "kv_ucx_desc");
    if (pool->desc == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "descriptor");
        goto err_unmap;
    }
    pool->desc_len = len;
    p = pool->desc;
    memcpy(p, KV_UCX_MAGIC, 4);
    p += 4;
    *p++ = KV_UCX_DESC_VERSION;
    *p++ = (uint8_t)mem_type;
    *p++ = windowed ? 1 : 0;
    *p++ = 0;
    kv_ucx_put_u32(&p, (uint32_t)len);
    kv_ucx_put_u32(&p, 0);
    pool->id = kv_ucx_random_id();
    kv_ucx_put_u64(&p, pool->id);
    kv_ucx_put_u32(&p, (uint32_t)layout->n_layers);
    kv_ucx_put_u32(&p, (uint32_t)layout->n_blocks);
    kv_ucx_put_u32(&p, (uint32_t)layout->block_size);
    kv_ucx_put_u32(&p, (uint32_t)layout->n_kv_heads);
    kv_ucx_put_u32(&p, (uint32_t)layout->head_dim);
    kv_ucx_put_u32(&p, (uint32_t)layout->elem_size);
    kv_ucx_put_u32(&p, (uint32_t)n_slots);
    kv_ucx_put_u32(&p, (uint32_t)(n_spans - 1));
    kv_ucx_put_u64(&p, 0);
    kv_ucx_put_u32(&p, (uint32_t)n_spans);
    kv_ucx_put_u32(&p, (uint32_t)addr_len);
    for (int i = 0; i < n_spans; i++) {
        kv_ucx_put_u64(&p, (uint64_t)spans[i].start);
        kv_ucx_put_u64(&p, (uint64_t)spans[i].len);
        kv_ucx_put_u32(&p, (uint32_t)rkey_lens[i]);
        memcpy(p, rkeys[i], rkey_lens[i]);
        p += rkey_lens[i];
    }
    for (int l = 0; l < (windowed ? 0 : layout->n_layers); l++) {
        kv_ucx_ref_t k, v;
        bool ok_k = kv_ucx_find_region(spans, n_spans - 1, k_layers[l],
                                       layer_bytes, &k);
        bool ok_v = kv_ucx_find_region(spans, n_spans - 1, v_layers[l],
                                       layer_bytes, &v);
        BT_ASSERT(ok_k && ok_v);
        kv_ucx_put_u32(&p, k.region);
        kv_ucx_put_u64(&p, k.offset);
        kv_ucx_put_u32(&p, v.region);
        kv_ucx_put_u64(&p, v.offset);
    }
    memcpy(p, addr, addr_len);
    p += addr_len;
    kv_ucx_put_u64(&p, bt_fnv1a64(pool->desc, len - 8));
    BT_ASSERT((size_t)(p - pool->desc) == len);

    pool->windowed = windowed;
    if (windowed) {
        pool->slot_win = bt_calloc((size_t)n_slots, sizeof(*pool->slot_win),
                                   "kv_ucx_pool");
        if (pool->slot_win == NULL) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "windows");
            bt_free(pool->desc);
            goto err_unmap;
        }
        pool->wnext = ctx->wpools;
        ctx->wpools = pool;
    }
    ucp_worker_release_address(ctx->worker, addr);
    for (int i = 0; i < n_spans; i++)
        ucp_rkey_buffer_release(rkeys[i]);
    bt_free(rkeys);
    bt_free(rkey_lens);
    bt_free(spans);
    BT_LOG_INFO(KV_UCX_SUBSYS,
                "registered KV pool: %d layers x %d blocks x %zu B, %d "
                "regions, %d slots, descriptor %zu B%s",
                layout->n_layers, layout->n_blocks, block_bytes,
                n_spans, n_slots, len,
                windowed ? " (receive windows only)" : "");
    ctx->n_pools++;
    *pool_p = pool;
    return BT_OK;

err_unmap:
    if (addr != NULL)
        ucp_worker_release_address(ctx->worker, addr);
    for (int i = 0; i < mapped; i++) {
        ucp_rkey_buffer_release(rkeys[i]);
        if (pool->own[i])
            ucp_mem_unmap(ctx->context, pool->memh[i]);
    }
err_free_arrays:
    bt_free(rkeys);
    bt_free(rkey_lens);
    bt_free(pool->memh);
    bt_free(pool->own);
    bt_free(spans);
err_free_arrival:
    bt_free(pool->arrival);
err_free_pool:
    bt_free(pool);
    return status;
}

bt_status_t kv_ucx_pool_register(kv_ucx_t *ctx, const kv_layout_t *layout,
                                 void *const *k_layers,
                                 void *const *v_layers,
                                 kv_ucx_mem_type_t mem_type, int n_slots,
                                 kv_ucx_pool_t **pool_p)
{
    if (k_layers == NULL || v_layers == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "KV pool without layer arrays");
    return kv_ucx_pool_map(ctx, layout, k_layers, v_layers, mem_type,
                           n_slots, pool_p);
}

bt_status_t kv_ucx_pool_register_windowed(kv_ucx_t *ctx,
                                          const kv_layout_t *layout,
                                          int n_slots,
                                          kv_ucx_pool_t **pool_p)
{
    return kv_ucx_pool_map(ctx, layout, NULL, NULL, KV_UCX_MEM_HOST, n_slots,
                           pool_p);
}

void kv_ucx_pool_deregister(kv_ucx_pool_t **pool_p)
{
    kv_ucx_pool_t *pool = *pool_p;
    if (pool == NULL)
        return;
    for (int i = 0; i < pool->n_regions; i++)
        if (pool->own[i])
            ucp_mem_unmap(pool->ctx->context, pool->memh[i]);
    BT_ASSERT(pool->n_windows == 0);
    if (pool->windowed) {
        kv_ucx_pool_t **pp = &pool->ctx->wpools;
        while (*pp != pool)
            pp = &(*pp)->wnext;
        *pp = pool->wnext;
    }
    bt_free(pool->slot_win);
    pool->ctx->n_pools--;
    bt_free(pool->memh);
    bt_free(pool->own);
    bt_free(pool->arrival);
    bt_free(pool->desc);
    bt_free(pool);
    *pool_p = NULL;
}

const uint8_t *kv_ucx_pool_desc(const kv_ucx_pool_t *pool, size_t *len_p)
{
    *len_p = pool->desc_len;
    return pool->desc;
}

bool kv_ucx_pool_has_arrived(const kv_ucx_pool_t *pool, int slot,
                             uint64_t epoch)
{
    if (slot < 0 || slot >= pool->n_slots || epoch == 0)
        return false;
    /* Acquire: pairs with the flush before the epoch put (header). */
    return __atomic_load_n(&pool->arrival[slot], __ATOMIC_ACQUIRE) == epoch;
}

uint64_t kv_ucx_pool_slot_value(const kv_ucx_pool_t *pool, int slot)
{
    if (slot < 0 || slot >= pool->n_slots)
        return 0;
    return __atomic_load_n(&pool->arrival[slot], __ATOMIC_ACQUIRE);
}

void kv_ucx_pool_slot_reset(kv_ucx_pool_t *pool, int slot)
{
    BT_ASSERT(slot >= 0 && slot < pool->n_slots);
    __atomic_store_n(&pool->arrival[slot], 0, __ATOMIC_RELEASE);
}

// ----------------------------------------------------------------------------
// Descriptor parsing: every byte is untrusted

#define KV_UCX_BAD(...)                                                     \
    BT_ERROR(BT_ERR_FORMAT, KV_UCX_SUBSYS, "KV descriptor: " __VA_ARGS__)

/* Bytes left from offset `off` of a `len`-byte buffer. */
static bool kv_ucx_has(size_t off, size_t len, size_t need)
{
    return off <= len && len - off >= need;
}

static bool kv_ucx_ref_ok(const kv_ucx_desc_t *d, const kv_ucx_ref_t *r,
                          size_t bytes)
{
    const kv_ucx_region_t *reg;
    if (r->region >= (uint32_t)d->n_regions)
        return false;
    reg = &d->regions[r->region];
    return r->offset <= reg->length && reg->length - r->offset >= bytes;
}

bt_status_t kv_ucx_desc_parse(const void *buf, size_t len,
                              kv_ucx_desc_t **desc_p)
{
    const uint8_t *b;
    kv_ucx_desc_t *d;
    bt_status_t status;
    uint32_t n_regions, addr_len, v;
    size_t off;

    if (buf == NULL || len < KV_UCX_HDR_BYTES + 8)
        return KV_UCX_BAD("%zu bytes is too short", len);
    if (len > KV_UCX_DESC_MAX_BYTES)
        return KV_UCX_BAD("%zu bytes is too long", len);
    b = buf;
    if (memcmp(b, KV_UCX_MAGIC, 4) != 0)
        return KV_UCX_BAD("bad magic");
    if (b[4] != KV_UCX_DESC_VERSION)
        return KV_UCX_BAD("version %u, expected %u", b[4],
                          KV_UCX_DESC_VERSION);
    if (b[5] > KV_UCX_MEM_CUDA)
        return KV_UCX_BAD("memory type %u", b[5]);
    if (b[6] > 1 || b[7] != 0 || kv_ucx_get_u32(b + 12) != 0)
        return KV_UCX_BAD("reserved bytes set");
    if (kv_ucx_get_u32(b + 8) != len)
        return KV_UCX_BAD("length field %u, have %zu bytes",
                          kv_ucx_get_u32(b + 8), len);

    d = bt_calloc(1, sizeof(*d), "kv_ucx_desc");
    if (d == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "descriptor");
    d->buf = bt_malloc(len, "kv_ucx_desc");
    if (d->buf == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "descriptor");
        goto err_free_desc;
    }
    memcpy(d->buf, buf, len);
    b = d->buf;
    d->len = len;
    d->mem_type = (kv_ucx_mem_type_t)b[5];
    d->windowed = b[6] == 1;
    d->pool_id = kv_ucx_get_u64(b + 16);

    /* Layout: each u32 must fit an int before the range checks. */
    for (int i = 0; i < 7; i++) {
        if (kv_ucx_get_u32(b + 24 + 4 * i) > (uint32_t)KV_UCX_MAX_SLOTS) {
            status = KV_UCX_BAD("layout field %d out of range", i);
            goto err_free_buf;
        }
    }
    d->layout.n_layers = (int)kv_ucx_get_u32(b + 24);
    d->layout.n_blocks = (int)kv_ucx_get_u32(b + 28);
    d->layout.block_size = (int)kv_ucx_get_u32(b + 32);
    d->layout.n_kv_heads = (int)kv_ucx_get_u32(b + 36);
    d->layout.head_dim = (int)kv_ucx_get_u32(b + 40);
    d->layout.elem_size = kv_ucx_get_u32(b + 44);
    if (!kv_ucx_layout_sizes(&d->layout, &d->block_bytes,
                             &d->layer_bytes)) {
        status = KV_UCX_BAD("invalid layout");
        goto err_free_buf;
    }
    v = kv_ucx_get_u32(b + 48);
    if (v < 1 || v > KV_UCX_MAX_SLOTS) {
        status = KV_UCX_BAD("n_slots %u out of range", v);
        goto err_free_buf;
    }
    d->n_slots = (int)v;
    d->slots.region = kv_ucx_get_u32(b + 52);
    d->slots.offset = kv_ucx_get_u64(b + 56);
    n_regions = kv_ucx_get_u32(b + 64);
    addr_len = kv_ucx_get_u32(b + 68);
    if ((d->windowed ? n_regions != 1 : n_regions < 2) ||
        n_regions > 2 * (uint32_t)d->layout.n_layers + 1) {
        status = KV_UCX_BAD("%u regions for %d layers", n_regions,
                            d->layout.n_layers);
        goto err_free_buf;
    }
    if (addr_len < 1 || addr_len > KV_UCX_MAX_ADDR) {
        status = KV_UCX_BAD("worker address length %u", addr_len);
        goto err_free_buf;
    }
    d->n_regions = (int)n_regions;
    d->regions = bt_calloc(n_regions, sizeof(*d->regions),
                           "kv_ucx_desc");
    d->k = bt_calloc((size_t)d->layout.n_layers, sizeof(*d->k),
                     "kv_ucx_desc");
    d->v = bt_calloc((size_t)d->layout.n_layers, sizeof(*d->v),
                     "kv_ucx_desc");
    if (d->regions == NULL || d->k == NULL || d->v == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "descriptor");
        goto err_free_arrays;
    }

    off = KV_UCX_HDR_BYTES;
    for (uint32_t i = 0; i < n_regions; i++) {
        kv_ucx_region_t *r = &d->regions[i];
        if (!kv_ucx_has(off, len, KV_UCX_REGION_HDR)) {
            status = KV_UCX_BAD("truncated in region %u", i);
            goto err_free_arrays;
        }
        r->base = kv_ucx_get_u64(b + off);
        r->length = kv_ucx_get_u64(b + off + 8);
        r->rkey_len = kv_ucx_get_u32(b + off + 16);
        off += KV_UCX_REGION_HDR;
        if (r->length == 0 || r->base + r->length < r->base) {
            status = KV_UCX_BAD("region %u: bad extent", i);
            goto err_free_arrays;
        }
        if (r->rkey_len < 1 || r->rkey_len > KV_UCX_MAX_RKEY ||
            !kv_ucx_has(off, len, r->rkey_len)) {
            status = KV_UCX_BAD("region %u: rkey length %u", i, r->rkey_len);
            goto err_free_arrays;
        }
        r->rkey = b + off;
        off += r->rkey_len;
    }
    for (int l = 0; l < (d->windowed ? 0 : d->layout.n_layers); l++) {
        if (!kv_ucx_has(off, len, KV_UCX_LAYER_BYTES)) {
            status = KV_UCX_BAD("truncated in layer %d", l);
            goto err_free_arrays;
        }
        d->k[l].region = kv_ucx_get_u32(b + off);
        d->k[l].offset = kv_ucx_get_u64(b + off + 4);
        d->v[l].region = kv_ucx_get_u32(b + off + 12);
        d->v[l].offset = kv_ucx_get_u64(b + off + 16);
        off += KV_UCX_LAYER_BYTES;
        if (!kv_ucx_ref_ok(d, &d->k[l], d->layer_bytes) ||
            !kv_ucx_ref_ok(d, &d->v[l], d->layer_bytes)) {
            status = KV_UCX_BAD("layer %d outside its region", l);
            goto err_free_arrays;
        }
    }
    if (!kv_ucx_ref_ok(d, &d->slots, (size_t)d->n_slots * sizeof(uint64_t))
        || (d->regions[d->slots.region].base + d->slots.offset) % 8 != 0) {
        status = KV_UCX_BAD("arrival slots outside their region");
        goto err_free_arrays;
    }
    if (!kv_ucx_has(off, len, (size_t)addr_len + 8) ||
        len - off != (size_t)addr_len + 8) {
        status = KV_UCX_BAD("worker address: %u bytes, %zu left", addr_len,
                            len - off);
        goto err_free_arrays;
    }
    d->addr = b + off;
    d->addr_len = addr_len;
    off += addr_len;
    if (kv_ucx_get_u64(b + off) != bt_fnv1a64(b, off)) {
        status = KV_UCX_BAD("checksum mismatch");
        goto err_free_arrays;
    }
    *desc_p = d;
    return BT_OK;

err_free_arrays:
    bt_free(d->regions);
    bt_free(d->k);
    bt_free(d->v);
err_free_buf:
    bt_free(d->buf);
err_free_desc:
    bt_free(d);
    return status;
}

void kv_ucx_desc_destroy(kv_ucx_desc_t **desc_p)
{
    kv_ucx_desc_t *d = *desc_p;
    if (d == NULL)
        return;
    bt_free(d->regions);
    bt_free(d->k);
    bt_free(d->v);
    bt_free(d->buf);
    bt_free(d);
    *desc_p = NULL;
}

const kv_layout_t *kv_ucx_desc_layout(const kv_ucx_desc_t *desc)
{
    return &desc->layout;
}

int kv_ucx_desc_n_slots(const kv_ucx_desc_t *desc)
{
    return desc->n_slots;
}

bool kv_ucx_desc_windowed(const kv_ucx_desc_t *desc)
{
    return desc->windowed;
}

uint64_t kv_ucx_desc_pool_id(const kv_ucx_desc_t *desc)
{
    return desc->pool_id;
}

// ----------------------------------------------------------------------------
// Prefill side: peers

static void kv_ucx_ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t ucs)
{
    kv_ucx_peer_t *peer = arg;
    if (peer->status == BT_OK)
        peer->status = BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS,
                                "KV endpoint to pool %016llx failed: %s",
                                (unsigned long long)peer->desc->pool_id,
                                ucs_status_string(ucs));
}

/* True when the endpoint has RMA lanes (UCX prints a "put[lane]" line
 * for each): shared memory or RDMA, where a put needs a key the target
 * checks (its segment, its memory region).  Without one UCX emulates RMA
 * over the AM lane (tcp), and the target writes whatever address a put
 * names.  Unknown (no memory for the text): false, the safe answer. */
static bool kv_ucx_ep_has_rma_lanes(ucp_ep_h ep)
{
    char *text = NULL;
    size_t len = 0;
    bool rma;
    FILE *f = open_memstream(&text, &len);

    if (f == NULL)
        return false;
    ucp_ep_print_info(ep, f);
    fclose(f);
    rma = text != NULL && strstr(text, " put[") != NULL;
    free(text); /* open_memstream's buffer, from libc */
    return rma;
}

static void kv_ucx_peer_free(kv_ucx_peer_t *peer)
{
    kv_ucx_retired_free(peer);
    kv_ucx_desc_destroy(&peer->desc);
    bt_free(peer->rkeys);
    bt_free(peer);
}

bt_status_t kv_ucx_connect(kv_ucx_t *ctx, const void *desc, size_t len,
                           kv_ucx_peer_t **peer_p)
{
    ucp_ep_params_t ep_params;
    kv_ucx_desc_t *d = NULL;
    kv_ucx_peer_t *peer;
    bt_status_t status;
    int unpacked = 0;

    status = kv_ucx_desc_parse(desc, len, &d);
    if (status != BT_OK)
        return status;
    for (peer = ctx->peers; peer != NULL; peer = peer->next) {
        /* An abandoned endpoint is never handed out again: if its pool
         * is alive after all, a fresh endpoint reaches it. */
        if (!peer->abandoned && peer->desc->pool_id == d->pool_id &&
            peer->desc->len == len &&
            memcmp(peer->desc->buf, d->buf, len) == 0) {
            kv_ucx_desc_destroy(&d);
            peer->refs++;
            *peer_p = peer;
            return BT_OK;
        }
    }
    peer = bt_calloc(1, sizeof(*peer), "kv_ucx_peer");
    if (peer == NULL) {
        kv_ucx_desc_destroy(&d);
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "peer");
    }
    peer->ctx = ctx;
    peer->desc = d;
    peer->refs = 1;
    peer->rkeys = bt_calloc((size_t)d->n_regions, sizeof(*peer->rkeys),
                            "kv_ucx_peer");
    if (peer->rkeys == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "rkeys");
        goto err_free_peer;
    }
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = (const ucp_address_t *)d->addr;
    ep_params.err_mode = ctx->peer_errors ? UCP_ERR_HANDLING_MODE_PEER
                                          : UCP_ERR_HANDLING_MODE_NONE;
    ep_params.err_handler.cb = kv_ucx_ep_error_cb;
    ep_params.err_handler.arg = peer;
    status = KV_UCX_CHECK(ucp_ep_create(ctx->worker, &ep_params, &peer->ep),
                          "ucp_ep_create");
    if (status != BT_OK)
        goto err_free_peer;
    for (unpacked = 0; unpacked < d->n_regions; unpacked++) {
        status = KV_UCX_CHECK(ucp_ep_rkey_unpack(peer->ep,
                                                 d->regions[unpacked].rkey,
                                                 &peer->rkeys[unpacked]),
                              "ucp_ep_rkey_unpack");
        if (status != BT_OK)
            goto err_close_ep;
    }
    peer->rma_lanes = kv_ucx_ep_has_rma_lanes(peer->ep);
    peer->next = ctx->peers;
    ctx->peers = peer;
    BT_LOG_DEBUG(KV_UCX_SUBSYS, "connected to KV pool %016llx (%s)",
                 (unsigned long long)d->pool_id,
                 peer->rma_lanes ? "RMA lanes"
                                 : "no RMA lanes: windows by message");
    *peer_p = peer;
    return BT_OK;

err_close_ep:
    for (int i = 0; i < unpacked; i++)
        ucp_rkey_destroy(peer->rkeys[i]);
    {
        ucp_request_param_t prm;
        void *req;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        req = ucp_ep_close_nbx(peer->ep, &prm);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
    }
err_free_peer:
    kv_ucx_peer_free(peer);
    return status;
}

void kv_ucx_peer_abandon(kv_ucx_peer_t *peer)
{
    if (peer == NULL || peer->abandoned)
        return;
    peer->abandoned = true;
    if (peer->status == BT_OK)
        peer->status = BT_ERR_NET;
}

void kv_ucx_disconnect(kv_ucx_peer_t **peer_p)
{
    kv_ucx_peer_t *peer = *peer_p, **pp;
    ucp_request_param_t prm;
    uint64_t deadline;
    void *req;

    if (peer == NULL)
        return;
    *peer_p = NULL;
    if (--peer->refs > 0)
        return;
    for (pp = &peer->ctx->peers; *pp != peer; pp = &(*pp)->next)
        BT_ASSERT(*pp != NULL);
    *pp = peer->next;
    peer->next = NULL;
    /* An abandoned peer is closed at once: without peer error handling a
     * dead process's operations never complete, and the waits below
     * (up to 3 x KV_UCX_CLOSE_MS) inside the caller's event loop stalled
     * a prefill worker until it missed its heartbeats and the router
     * dropped it, counting every request it held as one more failure.
     * Its status is an error, so the close is forced. */
    const bool wait = !peer->abandoned;

    /* Let in-flight operations finish (bounded): a dead peer in
     * UCP_ERR_HANDLING_MODE_NONE never completes them. */
    deadline = bt_time_ns() + (uint64_t)KV_UCX_CLOSE_MS * 1000000;
    while (wait && peer->pending > 0 && peer->status == BT_OK &&
           bt_time_ns() < deadline)
        kv_ucx_wait(peer->ctx, 10);
    if (wait && peer->pending > 0)
        BT_LOG_WARN(KV_UCX_SUBSYS, "closing KV peer with %d operations "
                    "in flight: they are cancelled", peer->pending);
    for (int i = 0; i < peer->desc->n_regions; i++)
        ucp_rkey_destroy(peer->rkeys[i]);
    kv_ucx_retired_free(peer);
    peer->closed = true;
    /* no answer comes on a closed endpoint: its waiting commits fail */
    for (kv_ucx_commit_t *c = peer->ctx->commits; c != NULL;
         c = c->all_next) {
        if (c->peer != peer || !c->waiting_ack)
            continue;
        c->waiting_ack = false;
        c->next = NULL;
        if (peer->ctx->ready_tail != NULL)
            peer->ctx->ready_tail->next = c;
        else
            peer->ctx->ready = c;
        peer->ctx->ready_tail = c;
    }
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = peer->status == BT_OK && peer->pending == 0
                    ? 0
                    : UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(peer->ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        deadline = bt_time_ns() + (uint64_t)KV_UCX_CLOSE_MS * 1000000;
        while (wait && ucp_request_check_status(req) == UCS_INPROGRESS &&
               bt_time_ns() < deadline)
            kv_ucx_wait(peer->ctx, 10);
        ucp_request_free(req); /* UCX finishes it on its own */
    }
    deadline = bt_time_ns() + (uint64_t)KV_UCX_CLOSE_MS * 1000000;
    while (wait && peer->pending > 0 && bt_time_ns() < deadline)
        kv_ucx_wait(peer->ctx, 10);
    if (peer->pending > 0) {
        /* Callbacks may still name this peer: a zombie until its last
         * operation completes (kv_ucx_reap_zombies) or the worker is
         * destroyed. */
        peer->next = peer->ctx->zombies;
        peer->ctx->zombies = peer;
        return;
    }
    kv_ucx_peer_free(peer);
}

const kv_ucx_desc_t *kv_ucx_peer_desc(const kv_ucx_peer_t *peer)
{
    return peer->desc;
}

int kv_ucx_peer_pending(const kv_ucx_peer_t *peer)
{
    return peer->pending;
}

uint64_t kv_ucx_peer_puts(const kv_ucx_peer_t *peer)
{
    return peer->n_puts;
}

uint64_t kv_ucx_peer_bytes(const kv_ucx_peer_t *peer)
{
    return peer->n_bytes;
}

void kv_ucx_peer_print_info(const kv_ucx_peer_t *peer, FILE *stream)
{
    ucp_ep_print_info(peer->ep, stream);
}

bt_status_t kv_ucx_peer_status(const kv_ucx_peer_t *peer)
{
    return peer->status;
}

uint64_t kv_ucx_peer_completed(const kv_ucx_peer_t *peer)
{
    return peer->n_done;
}

bool kv_ucx_peer_abandoned(const kv_ucx_peer_t *peer)
{
    return peer != NULL && peer->abandoned;
}

bt_status_t kv_ucx_peer_wait(kv_ucx_peer_t *peer, int timeout_ms)
{
    uint64_t deadline = bt_time_ns() + (uint64_t)timeout_ms * 1000000;
    bt_status_t status;

    for (;;) {
        uint64_t now;
        kv_ucx_progress(peer->ctx);
        if (peer->pending == 0)
            return peer->status;
        now = bt_time_ns();
        if (now >= deadline)
            return BT_ERROR(BT_ERR_TIMEOUT, KV_UCX_SUBSYS,
                            "KV peer: %d operations still in flight after "
                            "%d ms", peer->pending, timeout_ms);
        status = kv_ucx_wait(peer->ctx,
                             (int)BT_MIN((deadline - now) / 1000000 + 1, 10));
        if (status != BT_OK)
            return status;
    }
}

// ----------------------------------------------------------------------------
// Prefill side: puts

static void kv_ucx_put_done_cb(void *request, ucs_status_t ucs,
                               void *user_data)
{
    kv_ucx_peer_t *peer = user_data;
    if (ucs != UCS_OK && peer->status == BT_OK)
        peer->status = BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS, "KV put failed: %s",
                                ucs_status_string(ucs));
    if (ucs == UCS_OK)
        peer->n_done++;
    peer->pending--;
    ucp_request_free(request);
}

/* Issues one put; completion is counted in peer->pending. */
static bt_status_t kv_ucx_put(kv_ucx_peer_t *peer, const void *src,
                              size_t bytes, uint64_t raddr, ucp_rkey_h rkey,
                              ucs_memory_type_t mem)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t req;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    prm.cb.send = kv_ucx_put_done_cb;
    prm.user_data = peer;
    prm.memory_type = mem;
    req = ucp_put_nbx(peer->ep, src, bytes, raddr, rkey, &prm);
    peer->n_puts++;
    peer->n_bytes += bytes;
    if (req == NULL)
        return BT_OK;
    if (UCS_PTR_IS_ERR(req)) {
        if (peer->status == BT_OK)
            peer->status = KV_UCX_CHECK(UCS_PTR_STATUS(req), "ucp_put_nbx");
        return peer->status;
    }
    peer->pending++;
    return BT_OK;
}

/* The source blocks' shape must be the remote pool's (n_blocks may
 * differ). */
static bt_status_t kv_ucx_shape_check(const kv_layout_t *src,
                                      const kv_layout_t *dl)
{
    if (src->block_size != dl->block_size ||
        src->n_kv_heads != dl->n_kv_heads ||
        src->head_dim != dl->head_dim || src->elem_size != dl->elem_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "source block shape (%d x %d x %d x %zu B) differs "
                        "from the remote pool's (%d x %d x %d x %zu B)",
                        src->block_size, src->n_kv_heads, src->head_dim,
                        src->elem_size, dl->block_size, dl->n_kv_heads,
                        dl->head_dim, dl->elem_size);
    return BT_OK;
}

/* Puts n blocks of one layer, src_ids[i] -> dst_ids[i] (NULL: i), one
 * put per run consecutive in both, K to kbase/krkey, V to vbase/vrkey.
 * The ids were checked by the caller. */
static bt_status_t kv_ucx_put_runs(kv_ucx_peer_t *peer, const void *src_k,
                                   const void *src_v, size_t bb,
                                   const int *src_ids, const int *dst_ids,
                                   int n, uint64_t kbase, ucp_rkey_h krkey,
                                   uint64_t vbase, ucp_rkey_h vrkey,
                                   ucs_memory_type_t mem)
{
    bt_status_t status;
    int run;

    for (int i = 0; i < n; i += run) {
        int d0 = dst_ids != NULL ? dst_ids[i] : i;
        size_t soff = (size_t)src_ids[i] * bb;
        uint64_t doff = (uint64_t)d0 * bb;
        size_t bytes;

        for (run = 1; i + run < n && src_ids[i + run] == src_ids[i] + run &&
                      (dst_ids != NULL ? dst_ids[i + run] : i + run) ==
                          d0 + run;
             run++)
            ;
        bytes = (size_t)run * bb;
        status = kv_ucx_put(peer, (const uint8_t *)src_k + soff, bytes,
                            kbase + doff, krkey, mem);
        if (status != BT_OK)
            return status;
        status = kv_ucx_put(peer, (const uint8_t *)src_v + soff, bytes,
                            vbase + doff, vrkey, mem);
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

bt_status_t kv_ucx_put_layer(kv_ucx_peer_t *peer, int layer,
                             const void *src_k, const void *src_v,
                             const kv_layout_t *src_layout,
                             kv_ucx_mem_type_t src_mem, const int *src_ids,
                             const int *dst_ids, int n)
{
    const kv_ucx_desc_t *d = peer->desc;
    const kv_layout_t *dl = &d->layout;
    bt_status_t status;

    if (peer->status != BT_OK)
        return peer->status;
    if (d->windowed)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "the KV pool takes KV through receive windows only");
    if (layer < 0 || layer >= dl->n_layers || n < 0 ||
        (n > 0 && (src_k == NULL || src_v == NULL || src_ids == NULL ||
                   dst_ids == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_put_layer: layer %d of %d, n %d", layer,
                        dl->n_layers, n);
    status = kv_ucx_shape_check(src_layout, dl);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n; i++) {
        if (src_ids[i] < 0 || src_ids[i] >= src_layout->n_blocks ||
            dst_ids[i] < 0 || dst_ids[i] >= dl->n_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                            "block pair %d: %d -> %d out of range (%d, %d)",
                            i, src_ids[i], dst_ids[i], src_layout->n_blocks,
                            dl->n_blocks);
    }
    return kv_ucx_put_runs(
        peer, src_k, src_v, d->block_bytes, src_ids, dst_ids, n,
        d->regions[d->k[layer].region].base + d->k[layer].offset,
        peer->rkeys[d->k[layer].region],
        d->regions[d->v[layer].region].base + d->v[layer].offset,
        peer->rkeys[d->v[layer].region], kv_ucx_mem_type(src_mem));
}

// ----------------------------------------------------------------------------
// Prefill side: commits (flush -> put epoch -> flush)

static void kv_ucx_commit_stage_cb(void *request, ucs_status_t ucs,
                                   void *user_data)
{
    kv_ucx_commit_t *c = user_data;
    kv_ucx_t *ctx = c->peer->ctx;

    if (ucs != UCS_OK && c->status == BT_OK)
        c->status = BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS,
                             "KV commit of slot %d epoch %llu failed: %s",
                             c->slot, (unsigned long long)c->epoch,
                             ucs_status_string(ucs));
    if (ucs == UCS_OK)
        c->peer->n_done++;
    ucp_request_free(request);
    c->stage++;
    /* Advance outside UCX's callback, in kv_ucx_progress. */
    c->next = NULL;
    if (ctx->ready_tail != NULL)
        ctx->ready_tail->next = c;
    else
        ctx->ready = c;
    ctx->ready_tail = c;
}

/* Starts the current stage of `c`; stages that complete at once are
 * chained here; the last one reports to the user and frees `c`. */
static void kv_ucx_commit_advance(kv_ucx_commit_t *c)
{
    kv_ucx_peer_t *peer = c->peer;
    kv_ucx_t *ctx = peer->ctx;
    const kv_ucx_desc_t *d = peer->desc;
    ucp_request_param_t prm;
    ucs_status_ptr_t req;

    /* A stage that finished as the endpoint was closed (forced: a peer
     * presumed dead) must not start the next one on a closed endpoint. */
    if (peer->closed && c->status == BT_OK)
        c->status = BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS,
                             "KV commit of slot %d: endpoint closed", c->slot);
    while (c->status == BT_OK && c->stage != KV_UCX_COMMIT_DONE) {
        if (c->stage == KV_UCX_COMMIT_FLUSH_DATA && peer->am_inflight > 0) {
            /* A flush does not wait for messages; their completion does
             * (the source blocks stay put until then): parked until the
             * last one completes (kv_ucx_am_done_cb). */
            c->next = peer->am_waiters;
            peer->am_waiters = c;
            return;
        }
        if (c->flush_only && c->stage == KV_UCX_COMMIT_PUT_EPOCH) {
            c->stage = KV_UCX_COMMIT_DONE; /* flushed: all it asked */
            break;
        }
        if (c->window && c->stage == KV_UCX_COMMIT_FLUSH_EPOCH) {
            /* Its answer, not a flush, says the epoch landed: a message
             * on shared memory is "flushed" once it sits in the decode
             * worker's queue, dead or alive. */
            if (!c->acked) {
                c->waiting_ack = true; /* kv_ucx_am_ack_cb continues */
                return;
            }
            c->stage = KV_UCX_COMMIT_DONE;
            break;
        }
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                           UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send = kv_ucx_commit_stage_cb;
        prm.user_data = c;
        if (c->stage == KV_UCX_COMMIT_PUT_EPOCH && c->window) {
            /* the decode worker checks it, sets the slot itself and
             * answers on the reply endpoint */
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
            req = ucp_am_send_nbx(peer->ep, KV_UCX_AM_COMMIT, c->hdr,
                                  KV_UCX_AM_HDR, NULL, 0, &prm);
        } else if (c->stage == KV_UCX_COMMIT_PUT_EPOCH) {
            uint64_t raddr = d->regions[d->slots.region].base +
                             d->slots.offset +
                             (uint64_t)c->slot * sizeof(uint64_t);
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            prm.memory_type = UCS_MEMORY_TYPE_HOST;
            req = ucp_put_nbx(peer->ep, &c->epoch, sizeof(c->epoch), raddr,
                              peer->rkeys[d->slots.region], &prm);
        } else {
            req = ucp_ep_flush_nbx(peer->ep, &prm);
        }
        if (UCS_PTR_IS_PTR(req))
            return; /* kv_ucx_commit_stage_cb continues */
        if (UCS_PTR_IS_ERR(req))
            c->status = KV_UCX_CHECK(UCS_PTR_STATUS(req),
                                     "KV commit flush/put");
        else
            c->stage++;
    }
    /* a refused commit says nothing about the endpoint: not sticky */
    if (c->status != BT_OK && c->status != BT_ERR_REMOTE &&
        peer->status == BT_OK)
        peer->status = c->status;
    /* The peer is not touched after this: a closed one may be freed as
     * soon as nothing is pending (kv_ucx_reap_zombies). */
    peer->pending--;
    if (c->cb != NULL)
        c->cb(c->arg, c->slot, c->epoch, c->status);
    kv_ucx_commit_free(ctx, c);
}

/* Queues a commit of (slot, epoch) on `peer`; the caller checked them.
 * Returns it (BT_OK) so a window's commit can fill its header. */
static bt_status_t kv_ucx_commit_queue(kv_ucx_peer_t *peer, int slot,
                                       uint64_t epoch,
                                       kv_ucx_commit_cb_t cb, void *arg,
                                       kv_ucx_commit_t **c_p)
{
    kv_ucx_commit_t *c = bt_calloc(1, sizeof(*c), "kv_ucx_commit");

    if (c == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "commit");
    c->peer = peer;
    c->slot = slot;
    c->epoch = epoch;
    c->stage = KV_UCX_COMMIT_FLUSH_DATA;
    c->cb = cb;
    c->arg = arg;
    c->all_next = peer->ctx->commits;
    if (c->all_next != NULL)
        c->all_next->all_prev = c;
    peer->ctx->commits = c;
    peer->pending++;
    /* Always defer to kv_ucx_progress, so `cb` never runs inside this
     * call (callers may hold state that the callback touches). */
    c->stage = KV_UCX_COMMIT_FLUSH_DATA;
    if (peer->ctx->ready_tail != NULL)
        peer->ctx->ready_tail->next = c;
    else
        peer->ctx->ready = c;
    peer->ctx->ready_tail = c;
    *c_p = c;
    return BT_OK;
}

bt_status_t kv_ucx_commit(kv_ucx_peer_t *peer, int slot, uint64_t epoch,
                          kv_ucx_commit_cb_t cb, void *arg)
{
    kv_ucx_commit_t *c = NULL;

    if (peer->status != BT_OK)
        return peer->status;
    if (slot < 0 || slot >= peer->desc->n_slots || epoch == 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_commit: slot %d of %d, epoch %llu", slot,
                        peer->desc->n_slots, (unsigned long long)epoch);
    /* its decode worker may have no RMA: an epoch put over tcp would be
     * dropped and its flush never complete */
    if (peer->desc->windowed)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_commit: pool %016llx takes commits by "
                        "message only (kv_ucx_commit_window)",
                        (unsigned long long)peer->desc->pool_id);
    return kv_ucx_commit_queue(peer, slot, epoch, cb, arg, &c);
}

bt_status_t kv_ucx_flush(kv_ucx_peer_t *peer, uint64_t tag,
                         kv_ucx_commit_cb_t cb, void *arg)
{
    kv_ucx_commit_t *c = NULL;
    bt_status_t status;

    if (peer->status != BT_OK)
        return peer->status;
    status = kv_ucx_commit_queue(peer, -1, tag, cb, arg, &c);
    if (status == BT_OK)
        c->flush_only = true;
    return status;
}

// ----------------------------------------------------------------------------
// Receive windows (kv_transport.h): one mapping and one key per reservation
//
// Window descriptor, little-endian:
//   0  4 magic "BTKW"   4  4 version (2)
//   8  8 pool id        16 4 n_layers     20 4 n_blocks
//  24  8 block bytes    32 8 base address 40 8 length
//  48  8 System V shm id + 1 of the segment UCX placed it in (0: not one)
//  56  4 arrival slot   60 4 flags (bit 0: commits layer by layer, layer
//        l's setting slot + l; the other bits 0)   64 8 epoch
//  72 16 token (random per window: names the grant in active messages)
//  88  4 rkey length (0: no key, written by message only)
//  92    rkey bytes,  then FNV-1a 64 of all before
//
// Why the shm id: UCX 1.13's ucp_ep_rkey_unpack crashes (SIGSEGV in its
// error path, uct_rkey_release) when a System V segment it must attach is
// gone - exactly a window whose reservation ended, or whose decode worker
// died, before the hand-off started.  The writer checks the segment first
// (kv_ucx_window_open) and fails the hand-off cleanly instead.

#define KV_UCX_WIN_MAGIC "BTKW"
#define KV_UCX_WIN_VERSION 2
#define KV_UCX_WIN_HDR 92
#define KV_UCX_WIN_PER_LAYER 1u

/* The System V shm id of the mapping holding `addr` (its inode in
 * /proc/self/maps, path "/SYSV........"), or -1. */
static long kv_ucx_sysv_id(const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    char line[512];
    long id = -1;
    FILE *f = fopen("/proc/self/maps", "r");

    if (f == NULL)
        return -1;
    while (id < 0 && fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi, ino;
        char path[256] = "";
        if (sscanf(line, "%lx-%lx %*s %*s %*s %lu %255s", &lo, &hi, &ino,
                   path) >= 3 &&
            a >= lo && a < hi)
            id = strncmp(path, "/SYSV", 5) == 0 ? (long)ino : -2;
    }
    fclose(f);
    return id >= 0 ? id : -1;
}

/* False when the System V segment `id_plus_1` names is gone (its
 * attach would crash UCX 1.13); true when it exists or is not one. */
static bool kv_ucx_sysv_alive(uint64_t id_plus_1)
{
    struct shmid_ds ds;

    if (id_plus_1 == 0 || id_plus_1 > (uint64_t)INT_MAX + 1)
        return id_plus_1 == 0;
    if (shmctl((int)(id_plus_1 - 1), IPC_STAT, &ds) == 0)
        return !((ds.shm_perm.mode & SHM_DEST) && ds.shm_nattch == 0);
    return errno != EINVAL && errno != EIDRM;
}

/* kv_ucx_window_create and kv_ucx_window_create_layers: `per_layer`
 * windows commit layer by layer into arrival slots slot .. slot +
 * n_layers - 1. */
static bt_status_t kv_ucx_window_map(kv_ucx_pool_t *pool, int slot,
                                     uint64_t epoch, int n_blocks,
                                     bool per_layer, kv_ucx_window_t **win_p)
{
    kv_ucx_t *ctx = pool->ctx;
    size_t bb, layer_bytes, rkey_len = 0, mapped;
    int words = per_layer ? pool->layout.n_layers : 1;
    kv_ucx_window_t *w;
    void *rkey = NULL, *base;
    bt_status_t status;
    uint8_t *p;

    if (n_blocks < 1 || n_blocks > pool->layout.n_blocks ||
        !kv_ucx_layout_sizes(&pool->layout, &bb, &layer_bytes))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "receive window of %d blocks (pool %d)", n_blocks,
                        pool->layout.n_blocks);
    if (!pool->windowed || slot < 0 || slot > pool->n_slots - words ||
        epoch == 0 || pool->slot_win[slot] != NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "receive window for slot %d epoch %llu: not a "
                        "windowed pool's free slot", slot,
                        (unsigned long long)epoch);
    w = bt_calloc(1, sizeof(*w), "kv_ucx_window");
    if (w == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
    w->pool = pool;
    w->n_blocks = n_blocks;
    w->block_bytes = bb;
    w->slot = slot;
    w->epoch = epoch;
    w->per_layer = per_layer;
    w->n_units = words;
    w->units = bt_calloc((size_t)words, sizeof(*w->units), "kv_ucx_window");
    if (w->units == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
        goto err_free;
    }
    /* the grant's name in active messages: as secret as the capability,
     * and like it never made up (no randomness: no window) */
    status = bt_random_secret(w->token, sizeof(w->token));
    if (status != BT_OK)
        goto err_free;
    /* ALLOCATE: on one host its own shared memory segment, which a
     * writer attaches through this key only. */
    w->len = 2 * (size_t)pool->layout.n_layers * (size_t)n_blocks * bb;
    status = kv_ucx_map_allocate(ctx, w->len, "ucp_mem_map(window)",
                                 &w->memh, &base, &mapped);
    if (status != BT_OK)
        goto err_free;
    w->base = base;
    /* Only a System V segment is known to be revoked by the unmap and
     * never aliased by a later window (a POSIX one shared through
     * /proc/<pid>/fd/<fd> reuses fd numbers).  Anywhere else (no shared
     * memory transport, UCX_ALLOC_PRIO) the window gets no key at all:
     * plain memory, written by message only. */
    w->sysv_id = kv_ucx_sysv_id(w->base);
    if (w->sysv_id < 0) {
        ucp_mem_unmap(ctx->context, w->memh);
        w->memh = NULL;
        w->base = bt_calloc(1, w->len, "kv_ucx_window");
        if (w->base == NULL) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
            goto err_free;
        }
    } else {
        status = KV_UCX_CHECK(ucp_rkey_pack(ctx->context, w->memh, &rkey,
                                            &rkey_len),
                              "ucp_rkey_pack(window)");
        if (status != BT_OK)
            goto err_unmap;
    }
    w->desc_len = KV_UCX_WIN_HDR + rkey_len + 8;
    w->desc = bt_malloc(w->desc_len, "kv_ucx_window");
    if (w->desc == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
        goto err_rkey;
    }
    p = w->desc;
    memcpy(p, KV_UCX_WIN_MAGIC, 4);
    p += 4;
    kv_ucx_put_u32(&p, KV_UCX_WIN_VERSION);
    kv_ucx_put_u64(&p, pool->id);
    kv_ucx_put_u32(&p, (uint32_t)pool->layout.n_layers);
    kv_ucx_put_u32(&p, (uint32_t)n_blocks);
    kv_ucx_put_u64(&p, (uint64_t)bb);
    kv_ucx_put_u64(&p, (uint64_t)(uintptr_t)w->base);
    kv_ucx_put_u64(&p, (uint64_t)w->len);
    kv_ucx_put_u64(&p, (uint64_t)(w->sysv_id + 1));
    kv_ucx_put_u32(&p, (uint32_t)slot);
    kv_ucx_put_u32(&p, per_layer ? KV_UCX_WIN_PER_LAYER : 0);
    kv_ucx_put_u64(&p, epoch);
    memcpy(p, w->token, sizeof(w->token));
    p += sizeof(w->token);
    kv_ucx_put_u32(&p, (uint32_t)rkey_len);
    if (rkey_len > 0)
        memcpy(p, rkey, rkey_len);
    p += rkey_len;
    kv_ucx_put_u64(&p, bt_fnv1a64(w->desc, w->desc_len - 8));
    BT_ASSERT((size_t)(p - w->desc) == w->desc_len);
    if (rkey != NULL)
        ucp_rkey_buffer_release(rkey);
    pool->n_windows++;
    pool->slot_win[slot] = w;
    *win_p = w;
    return BT_OK;

err_rkey:
    if (rkey != NULL)
        ucp_rkey_buffer_release(rkey);
err_unmap:
    if (w->memh != NULL)
        ucp_mem_unmap(ctx->context, w->memh);
    else
        bt_free(w->base);
err_free:
    bt_free(w->units);
    bt_free(w);
    return status;
}

bt_status_t kv_ucx_window_create(kv_ucx_pool_t *pool, int slot,
                                 uint64_t epoch, int n_blocks,
                                 kv_ucx_window_t **win_p)
{
    return kv_ucx_window_map(pool, slot, epoch, n_blocks, false, win_p);
}

bt_status_t kv_ucx_window_create_layers(kv_ucx_pool_t *pool, int slot,
                                        uint64_t epoch, int n_blocks,
                                        kv_ucx_window_t **win_p)
{
    return kv_ucx_window_map(pool, slot, epoch, n_blocks, true, win_p);
}

const uint8_t *kv_ucx_window_desc(const kv_ucx_window_t *win, size_t *len_p)
{
    *len_p = win->desc_len;
    return win->desc;
}

const void *kv_ucx_window_data(const kv_ucx_window_t *win, int layer, int kv)
{
    return win->base +
           (2 * (size_t)layer + (size_t)(kv != 0)) * (size_t)win->n_blocks *
               win->block_bytes;
}

int kv_ucx_window_blocks(const kv_ucx_window_t *win)
{
    return win->n_blocks;
}

void kv_ucx_window_destroy(kv_ucx_window_t **win_p)
{
    kv_ucx_window_t *w = *win_p;

    if (w == NULL)
        return;
    /* from here on its messages find no window: refused */
    w->pool->slot_win[w->slot] = NULL;
    if (w->memh != NULL)
        ucp_mem_unmap(w->pool->ctx->context, w->memh);
    else
        bt_free(w->base);
    w->pool->n_windows--;
    bt_free(w->desc);
    bt_free(w->units);
    bt_free(w);
    *win_p = NULL;
}

bt_status_t kv_ucx_window_open(kv_ucx_peer_t *peer, const void *desc,
                               size_t len, kv_ucx_rwindow_t **rw_p)
{
    const kv_ucx_desc_t *d = peer->desc;
    const uint8_t *b = desc;
    uint32_t n_layers, n_blocks, rkey_len, slot, flags;
    uint64_t bb, length, epoch;
    kv_ucx_rwindow_t *rw;
    bt_status_t status;

    if (b == NULL || len < KV_UCX_WIN_HDR + 8 || len > KV_UCX_DESC_MAX_BYTES ||
        memcmp(b, KV_UCX_WIN_MAGIC, 4) != 0 ||
        kv_ucx_get_u32(b + 4) != KV_UCX_WIN_VERSION)
        return KV_UCX_BAD("not a receive window (%zu bytes)", len);
    rkey_len = kv_ucx_get_u32(b + 88); /* 0: by message only */
    if (rkey_len > KV_UCX_MAX_RKEY ||
        len != KV_UCX_WIN_HDR + (size_t)rkey_len + 8 ||
        kv_ucx_get_u64(b + len - 8) != bt_fnv1a64(b, len - 8))
        return KV_UCX_BAD("receive window: rkey length %u, %zu bytes",
                          rkey_len, len);
    n_layers = kv_ucx_get_u32(b + 16);
    n_blocks = kv_ucx_get_u32(b + 20);
    bb = kv_ucx_get_u64(b + 24);
    length = kv_ucx_get_u64(b + 40);
    slot = kv_ucx_get_u32(b + 56);
    flags = kv_ucx_get_u32(b + 60);
    epoch = kv_ucx_get_u64(b + 64);
    if (kv_ucx_get_u64(b + 8) != d->pool_id ||
        n_layers != (uint32_t)d->layout.n_layers || bb != d->block_bytes ||
        n_blocks < 1 || n_blocks > (uint32_t)d->layout.n_blocks ||
        length / 2 / n_layers / n_blocks < bb ||
        (flags & ~KV_UCX_WIN_PER_LAYER) != 0 ||
        slot >= (uint32_t)d->n_slots ||
        ((flags & KV_UCX_WIN_PER_LAYER) &&
         (uint32_t)d->n_slots - slot < n_layers) ||
        epoch == 0)
        return KV_UCX_BAD("receive window does not fit pool %016llx",
                          (unsigned long long)d->pool_id);
    if (peer->status != BT_OK)
        return peer->status;
    rw = bt_calloc(1, sizeof(*rw), "kv_ucx_rwindow");
    if (rw == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
    rw->peer = peer;
    rw->base = kv_ucx_get_u64(b + 32);
    rw->n_blocks = (int)n_blocks;
    rw->slot = (int)slot;
    rw->epoch = epoch;
    memcpy(rw->token, b + 72, sizeof(rw->token));
    rw->per_layer = (flags & KV_UCX_WIN_PER_LAYER) != 0;
    if (rw->per_layer) {
        rw->layer_bytes = bt_calloc(n_layers, sizeof(*rw->layer_bytes),
                                    "kv_ucx_rwindow");
        if (rw->layer_bytes == NULL) {
            bt_free(rw);
            return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "window");
        }
    }
    /* No RMA lanes (tcp): UCX would not check the key, so the decode
     * worker takes the data only as messages it checks, and its key is
     * never unpacked (nor its segment, maybe on another host, looked
     * up). */
    rw->am = !peer->rma_lanes || rkey_len == 0;
    if (rw->am) {
        *rw_p = rw;
        return BT_OK;
    }
    if (!kv_ucx_sysv_alive(kv_ucx_get_u64(b + 48))) {
        bt_free(rw->layer_bytes);
        bt_free(rw);
        return BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS,
                        "receive window of pool %016llx is gone (its "
                        "reservation ended or its process died)",
                        (unsigned long long)d->pool_id);
    }
    status = KV_UCX_CHECK(ucp_ep_rkey_unpack(peer->ep, b + KV_UCX_WIN_HDR,
                                             &rw->rkey),
                          "ucp_ep_rkey_unpack(window)");
    if (status != BT_OK) {
        bt_free(rw->layer_bytes);
        bt_free(rw);
        return status;
    }
    *rw_p = rw;
    return BT_OK;
}

int kv_ucx_rwindow_blocks(const kv_ucx_rwindow_t *rw)
{
    return rw->n_blocks;
}

bool kv_ucx_rwindow_by_message(const kv_ucx_rwindow_t *rw)
{
    return rw->am;
}

// ----------------------------------------------------------------------------
// Active-message hand-off: the receiver decides where bytes land
//
// Header of both messages (64 bytes, little-endian):
//   0 8 pool id   8 4 slot   12 4 layer   16 8 epoch   24 16 token
//  40 4 K (0) | V (1)   44 4 reserved, 0
//  48 8 data: byte offset in the window's layer K|V array; commit: 0
//  56 8 data: its length (== the message's); commit: the data bytes the
//       writer sent by message for this window (0 when it put them), or
//       for this layer of a window that commits layer by layer
// A commit's layer is 0, or the layer it commits in such a window; its
// answer (ack) repeats pool, slot, epoch and layer, K|V 0 accepted, 1
// refused.

typedef struct {
    uint64_t pool_id;
    uint32_t slot;
    uint32_t layer;
    uint64_t epoch;
    uint8_t token[KV_UCX_TOKEN_BYTES];
    uint32_t kv;
    uint64_t offset;
    uint64_t length;
} kv_ucx_am_hdr_t;

static void kv_ucx_am_hdr_pack(const kv_ucx_am_hdr_t *h, uint8_t *b)
{
    uint8_t *p = b;

    kv_ucx_put_u64(&p, h->pool_id);
    kv_ucx_put_u32(&p, h->slot);
    kv_ucx_put_u32(&p, h->layer);
    kv_ucx_put_u64(&p, h->epoch);
    memcpy(p, h->token, KV_UCX_TOKEN_BYTES);
    p += KV_UCX_TOKEN_BYTES;
    kv_ucx_put_u32(&p, h->kv);
    kv_ucx_put_u32(&p, 0);
    kv_ucx_put_u64(&p, h->offset);
    kv_ucx_put_u64(&p, h->length);
    BT_ASSERT(p - b == KV_UCX_AM_HDR);
}

/* False for a header of the wrong size or with reserved bits set. */
static bool kv_ucx_am_hdr_unpack(const void *hdr, size_t len,
                                 kv_ucx_am_hdr_t *h)
{
    const uint8_t *b = hdr;

    if (hdr == NULL || len != KV_UCX_AM_HDR || kv_ucx_get_u32(b + 44) != 0)
        return false;
    h->pool_id = kv_ucx_get_u64(b);
    h->slot = kv_ucx_get_u32(b + 8);
    h->layer = kv_ucx_get_u32(b + 12);
    h->epoch = kv_ucx_get_u64(b + 16);
    memcpy(h->token, b + 24, KV_UCX_TOKEN_BYTES);
    h->kv = kv_ucx_get_u32(b + 40);
    h->offset = kv_ucx_get_u64(b + 48);
    h->length = kv_ucx_get_u64(b + 56);
    return true;
}

/* Counts a message the handlers drop and logs it (at most once a
 * second: a writer could send millions).  A rendezvous offer is
 * declined, which fails the sender's request; eager data is simply
 * dropped. */
static ucs_status_t kv_ucx_am_refuse(kv_ucx_t *ctx,
                                     const ucp_am_recv_param_t *param,
                                     const kv_ucx_am_hdr_t *h,
                                     const char *why)
{
    uint64_t now = bt_time_ns();

    ctx->refused++;
    if (now - ctx->refused_log_ns > 1000000000ull) {
        ctx->refused_log_ns = now;
        BT_LOG_WARN(KV_UCX_SUBSYS, "KV message refused (%s): slot %u epoch "
                    "%llu layer %u; %llu refused so far", why,
                    h != NULL ? h->slot : 0,
                    h != NULL ? (unsigned long long)h->epoch : 0ull,
                    h != NULL ? h->layer : 0,
                    (unsigned long long)ctx->refused);
    }
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED
                                                           : UCS_OK;
}

/* The live window a message names: pool, slot, the grant's epoch and
 * its token (compared in constant time).  NULL for anything else: a
 * reservation that ended, a later grant of the slot, a forged token. */
static kv_ucx_window_t *kv_ucx_am_window(kv_ucx_t *ctx,
                                         const kv_ucx_am_hdr_t *h)
{
    kv_ucx_pool_t *pool = ctx->wpools;
    kv_ucx_window_t *w;

    while (pool != NULL && pool->id != h->pool_id)
        pool = pool->wnext;
    if (pool == NULL || h->slot >= (uint32_t)pool->n_slots)
        return NULL;
    w = pool->slot_win[h->slot];
    if (w == NULL || w->epoch != h->epoch ||
        !bt_ct_equal(w->token, h->token, KV_UCX_TOKEN_BYTES))
        return NULL;
    return w;
}

/* Queues the answer to a commit of (slot, layer, epoch) of pool
 * `pool_id` on the writer's reply endpoint: accepted (the epoch landed)
 * or refused. */
static void kv_ucx_ack_queue(kv_ucx_t *ctx, ucp_ep_h ep, uint64_t pool_id,
                             uint32_t slot, uint32_t layer, uint64_t epoch,
                             bool accepted)
{
    kv_ucx_am_hdr_t h;
    kv_ucx_ack_t *a;

    if (ep == NULL || ctx->n_acks >= KV_UCX_MAX_ACKS)
        return; /* the writer's commit times out instead */
    a = bt_calloc(1, sizeof(*a), "kv_ucx_ack");
    if (a == NULL)
        return;
    memset(&h, 0, sizeof(h));
    h.pool_id = pool_id;
    h.slot = slot;
    h.layer = layer;
    h.epoch = epoch;
    h.kv = accepted ? 0 : 1;
    kv_ucx_am_hdr_pack(&h, a->hdr);
    a->ep = ep;
    a->ctx = ctx;
    a->next = ctx->acks;
    ctx->acks = a;
    ctx->n_acks++;
}

static void kv_ucx_ack_unlink_free(kv_ucx_ack_t *a)
{
    kv_ucx_t *ctx = a->ctx;

    if (a->prev != NULL)
        a->prev->next = a->next;
    else
        ctx->acks_sent = a->next;
    if (a->next != NULL)
        a->next->prev = a->prev;
    ctx->n_acks--;
    bt_free(a);
}

static void kv_ucx_ack_done_cb(void *request, ucs_status_t ucs,
                               void *user_data)
{
    (void)ucs; /* a writer that is gone: its commit fails on its side */
    kv_ucx_ack_unlink_free(user_data);
    ucp_request_free(request);
}

/* Sends the queued acks (kv_ucx_progress, outside UCX's callbacks). */
static void kv_ucx_acks_send(kv_ucx_t *ctx)
{
    while (ctx->acks != NULL) {
        kv_ucx_ack_t *a = ctx->acks;
        ucp_request_param_t prm;
        ucs_status_ptr_t req;

        ctx->acks = a->next;
        a->prev = NULL;
        a->next = ctx->acks_sent;
        if (a->next != NULL)
            a->next->prev = a;
        ctx->acks_sent = a;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                           UCP_OP_ATTR_FIELD_USER_DATA |
                           UCP_OP_ATTR_FIELD_FLAGS;
        prm.cb.send = kv_ucx_ack_done_cb;
        prm.user_data = a;
        prm.flags = UCP_AM_SEND_FLAG_EAGER;
        req = ucp_am_send_nbx(a->ep, KV_UCX_AM_ACK, a->hdr, KV_UCX_AM_HDR,
                              NULL, 0, &prm);
        if (!UCS_PTR_IS_PTR(req))
            kv_ucx_ack_unlink_free(a); /* done at once, or failed */
    }
}

/* After the worker is destroyed: acks never sent or never completed. */
static void kv_ucx_acks_free(kv_ucx_t *ctx)
{
    while (ctx->acks != NULL) {
        kv_ucx_ack_t *a = ctx->acks;
        ctx->acks = a->next;
        bt_free(a);
    }
    while (ctx->acks_sent != NULL) {
        kv_ucx_ack_t *a = ctx->acks_sent;
        ctx->acks_sent = a->next;
        bt_free(a);
    }
    ctx->n_acks = 0;
}

/* The commit unit layer `layer` (checked) belongs to. */
static kv_ucx_wunit_t *kv_ucx_window_unit(kv_ucx_window_t *w, uint32_t layer)
{
    return &w->units[w->per_layer ? layer : 0];
}

/* A unit's epoch lands once its commit came and every byte it announced
 * did (messages may arrive on several lanes, in any order), in arrival
 * slot slot + unit; its writer is told. */
static void kv_ucx_window_try_arrive(kv_ucx_window_t *w, kv_ucx_wunit_t *u)
{
    uint32_t unit = (uint32_t)(u - w->units);

    if (!u->commit_pending || u->am_bytes != u->commit_bytes)
        return;
    u->commit_pending = false;
    u->sealed = true;
    __atomic_store_n(&w->pool->arrival[w->slot + (int)unit], w->epoch,
                     __ATOMIC_RELEASE);
    kv_ucx_ack_queue(w->pool->ctx, u->ack_ep, w->pool->id,
                     (uint32_t)w->slot, unit, w->epoch, true);
}

static ucs_status_t kv_ucx_am_data_cb(void *arg, const void *header,
                                      size_t header_length, void *data,
                                      size_t length,
                                      const ucp_am_recv_param_t *param)
{
    kv_ucx_t *ctx = arg;
    kv_ucx_am_hdr_t h;
    kv_ucx_window_t *w;
    kv_ucx_wunit_t *u;
    uint64_t span;

    if (!kv_ucx_am_hdr_unpack(header, header_length, &h))
        return kv_ucx_am_refuse(ctx, param, NULL, "malformed header");
    w = kv_ucx_am_window(ctx, &h);
    if (w == NULL)
        return kv_ucx_am_refuse(ctx, param, &h, "no live window of that "
                                "slot, epoch and token");
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
        return kv_ucx_am_refuse(ctx, param, &h, "rendezvous");
    span = (uint64_t)w->n_blocks * w->block_bytes;
    if (h.layer >= (uint32_t)w->pool->layout.n_layers || h.kv > 1 ||
        h.length != length || h.offset > span || span - h.offset < length)
        return kv_ucx_am_refuse(ctx, param, &h, "out of the window");
    /* a committed layer may already be read: it takes nothing more */
    u = kv_ucx_window_unit(w, h.layer);
    if (u->sealed)
        return kv_ucx_am_refuse(ctx, param, &h, "after its commit");
    if (u->commit_pending && u->commit_bytes - u->am_bytes < length)
        return kv_ucx_am_refuse(ctx, param, &h, "more than committed");
    if (length > 0)
        memcpy((uint8_t *)kv_ucx_window_data(w, (int)h.layer, (int)h.kv) +
                   h.offset,
               data, length);
    u->am_bytes += length;
    kv_ucx_window_try_arrive(w, u);
    return UCS_OK;
}

static ucs_status_t kv_ucx_am_commit_cb(void *arg, const void *header,
                                        size_t header_length, void *data,
                                        size_t length,
                                        const ucp_am_recv_param_t *param)
{
    kv_ucx_t *ctx = arg;
    kv_ucx_am_hdr_t h;
    kv_ucx_window_t *w;
    kv_ucx_wunit_t *u = NULL;

    ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                         ? param->reply_ep : NULL;
    const char *why = NULL;

    (void)data;
    if (!kv_ucx_am_hdr_unpack(header, header_length, &h))
        return kv_ucx_am_refuse(ctx, param, NULL, "malformed commit");
    w = kv_ucx_am_window(ctx, &h);
    if (w == NULL)
        why = "commit of no live window of that slot, epoch and token";
    else if (length != 0 || h.kv != 0 || h.offset != 0 ||
             h.layer >= (uint32_t)w->n_units)
        why = "malformed commit";
    else if ((u = kv_ucx_window_unit(w, h.layer))->sealed ||
             u->commit_pending || h.length < u->am_bytes)
        why = "second commit, or fewer bytes than arrived";
    if (why != NULL) {
        /* told at once: its hand-off fails now, not at a timeout */
        kv_ucx_ack_queue(ctx, reply, h.pool_id, h.slot, h.layer, h.epoch,
                         false);
        return kv_ucx_am_refuse(ctx, param, &h, why);
    }
    u->commit_bytes = h.length;
    u->commit_pending = true;
    u->ack_ep = reply;
    kv_ucx_window_try_arrive(w, u);
    return UCS_OK;
}

/* Writer: the decode worker's answer to a window commit. */
static ucs_status_t kv_ucx_am_ack_cb(void *arg, const void *header,
                                     size_t header_length, void *data,
                                     size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kv_ucx_t *ctx = arg;
    kv_ucx_am_hdr_t h;

    (void)data;
    (void)length;
    (void)param;
    if (!kv_ucx_am_hdr_unpack(header, header_length, &h))
        return UCS_OK;
    for (kv_ucx_commit_t *c = ctx->commits; c != NULL; c = c->all_next) {
        if (!c->window || c->acked || c->peer->desc->pool_id != h.pool_id ||
            (uint32_t)c->slot != h.slot || c->unit != h.layer ||
            c->epoch != h.epoch)
            continue;
        c->acked = true;
        if (h.kv != 0 && c->status == BT_OK)
            c->status = BT_ERROR(BT_ERR_REMOTE, KV_UCX_SUBSYS,
                                 "KV commit of slot %d epoch %llu refused "
                                 "by the decode worker (its reservation "
                                 "ended?)", c->slot,
                                 (unsigned long long)c->epoch);
        if (c->waiting_ack) {
            c->waiting_ack = false;
            c->next = NULL;
            if (ctx->ready_tail != NULL)
                ctx->ready_tail->next = c;
            else
                ctx->ready = c;
            ctx->ready_tail = c;
        }
        break;
    }
    return UCS_OK;
}

uint64_t kv_ucx_writes_refused(const kv_ucx_t *ctx)
{
    return ctx != NULL ? ctx->refused : 0;
}

/* A window commit parked behind messages continues (kv_ucx_progress). */
static void kv_ucx_am_release_waiters(kv_ucx_peer_t *peer)
{
    kv_ucx_t *ctx = peer->ctx;

    while (peer->am_waiters != NULL) {
        kv_ucx_commit_t *c = peer->am_waiters;
        peer->am_waiters = c->next;
        c->next = NULL;
        if (ctx->ready_tail != NULL)
            ctx->ready_tail->next = c;
        else
            ctx->ready = c;
        ctx->ready_tail = c;
    }
}

/* A data message in flight, with the header UCX reads until it is
 * done. */
typedef struct {
    kv_ucx_peer_t *peer;
    uint8_t hdr[KV_UCX_AM_HDR];
} kv_ucx_am_send_t;

static void kv_ucx_am_done_cb(void *request, ucs_status_t ucs,
                              void *user_data)
{
    kv_ucx_am_send_t *m = user_data;
    kv_ucx_peer_t *peer = m->peer;

    if (ucs != UCS_OK && peer->status == BT_OK)
        peer->status = BT_ERROR(BT_ERR_NET, KV_UCX_SUBSYS,
                                "KV message failed: %s",
                                ucs_status_string(ucs));
    if (ucs == UCS_OK)
        peer->n_done++;
    bt_free(m);
    ucp_request_free(request);
    if (--peer->am_inflight == 0)
        kv_ucx_am_release_waiters(peer);
    peer->pending--; /* last: a closed peer may be freed after this */
}

/* Sends `bytes` of `src` as one eager data message for window `rw`. */
static bt_status_t kv_ucx_am_send(kv_ucx_peer_t *peer,
                                  const kv_ucx_rwindow_t *rw, int layer,
                                  int kv, uint64_t offset, const void *src,
                                  size_t bytes, ucs_memory_type_t mem)
{
    kv_ucx_am_hdr_t h;
    kv_ucx_am_send_t *m = bt_malloc(sizeof(*m), "kv_ucx_am");
    ucp_request_param_t prm;
    ucs_status_ptr_t req;

    if (m == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_UCX_SUBSYS, "KV message");
    h.pool_id = peer->desc->pool_id;
    h.slot = (uint32_t)rw->slot;
    h.layer = (uint32_t)layer;
    h.epoch = rw->epoch;
    memcpy(h.token, rw->token, sizeof(h.token));
    h.kv = (uint32_t)kv;
    h.offset = offset;
    h.length = bytes;
    m->peer = peer;
    kv_ucx_am_hdr_pack(&h, m->hdr);
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS |
                       UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    prm.cb.send = kv_ucx_am_done_cb;
    prm.user_data = m;
    prm.flags = UCP_AM_SEND_FLAG_EAGER; /* the receiver starts nothing */
    prm.memory_type = mem;
    req = ucp_am_send_nbx(peer->ep, KV_UCX_AM_DATA, m->hdr, KV_UCX_AM_HDR,
                          src, bytes, &prm);
    peer->n_puts++;
    peer->n_bytes += bytes;
    if (req == NULL) {
        bt_free(m);
        return BT_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        bt_free(m);
        if (peer->status == BT_OK)
            peer->status = KV_UCX_CHECK(UCS_PTR_STATUS(req),
                                        "ucp_am_send_nbx");
        return peer->status;
    }
    peer->pending++;
    peer->am_inflight++;
    return BT_OK;
}

/* As kv_ucx_put_runs into a window from its block `first` on, as
 * messages of at most KV_UCX_AM_CHUNK bytes. */
static bt_status_t kv_ucx_am_runs(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw,
                                  int layer, int first, const void *src_k,
                                  const void *src_v, size_t bb,
                                  const int *src_ids, int n,
                                  ucs_memory_type_t mem)
{
    bt_status_t status;
    int run;

    for (int i = 0; i < n; i += run) {
        size_t soff = (size_t)src_ids[i] * bb, bytes;

        for (run = 1; i + run < n && src_ids[i + run] == src_ids[i] + run;
             run++)
            ;
        bytes = (size_t)run * bb;
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *src = (const uint8_t *)(kv ? src_v : src_k) + soff;
            for (size_t off = 0; off < bytes; off += KV_UCX_AM_CHUNK) {
                size_t c = BT_MIN(bytes - off, (size_t)KV_UCX_AM_CHUNK);
                status = kv_ucx_am_send(peer, rw, layer, kv,
                                        ((uint64_t)first + (uint64_t)i) *
                                                bb + off,
                                        src + off, c, mem);
                if (status != BT_OK)
                    return status;
                rw->am_bytes += c;
                if (rw->per_layer)
                    rw->layer_bytes[layer] += c;
            }
        }
    }
    return BT_OK;
}

// ----------------------------------------------------------------------------
// Prefill side: writing a window

bt_status_t kv_ucx_put_layer_window(kv_ucx_peer_t *peer,
                                    kv_ucx_rwindow_t *rw, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_layout_t *src_layout,
                                    kv_ucx_mem_type_t src_mem,
                                    const int *src_ids, int n)
{
    return kv_ucx_put_layer_window_at(peer, rw, layer, 0, src_k, src_v,
                                      src_layout, src_mem, src_ids, n);
}

bt_status_t kv_ucx_put_layer_window_at(kv_ucx_peer_t *peer,
                                       kv_ucx_rwindow_t *rw, int layer,
                                       int first, const void *src_k,
                                       const void *src_v,
                                       const kv_layout_t *src_layout,
                                       kv_ucx_mem_type_t src_mem,
                                       const int *src_ids, int n)
{
    const kv_layout_t *dl = &peer->desc->layout;
    size_t bb = peer->desc->block_bytes;
    uint64_t k0, span = (uint64_t)rw->n_blocks * bb;
    bt_status_t status;

    if (peer->status != BT_OK)
        return peer->status;
    if (rw->peer != peer || layer < 0 || layer >= dl->n_layers || n < 0 ||
        first < 0 || first > rw->n_blocks || n > rw->n_blocks - first ||
        (n > 0 && (src_k == NULL || src_v == NULL || src_ids == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_put_layer_window: layer %d of %d, blocks "
                        "%d + %d of %d", layer, dl->n_layers, first, n,
                        rw->n_blocks);
    status = kv_ucx_shape_check(src_layout, dl);
    if (status != BT_OK)
        return status;
    for (int i = 0; i < n; i++)
        if (src_ids[i] < 0 || src_ids[i] >= src_layout->n_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                            "source block %d out of range (%d)", src_ids[i],
                            src_layout->n_blocks);
    if (rw->am)
        return kv_ucx_am_runs(peer, rw, layer, first, src_k, src_v, bb,
                              src_ids, n, kv_ucx_mem_type(src_mem));
    k0 = rw->base + 2 * (uint64_t)layer * span + (uint64_t)first * bb;
    return kv_ucx_put_runs(peer, src_k, src_v, bb, src_ids, NULL, n, k0,
                           rw->rkey, k0 + span, rw->rkey,
                           kv_ucx_mem_type(src_mem));
}

/* kv_ucx_commit_window (`layer` -1) and kv_ucx_commit_window_layer. */
static bt_status_t kv_ucx_commit_unit(kv_ucx_peer_t *peer,
                                      kv_ucx_rwindow_t *rw, int layer,
                                      kv_ucx_commit_cb_t cb, void *arg)
{
    kv_ucx_am_hdr_t h;
    kv_ucx_commit_t *c = NULL;
    bt_status_t status;

    if (peer->status != BT_OK)
        return peer->status;
    if (rw == NULL || rw->peer != peer || rw->per_layer != (layer >= 0) ||
        layer >= peer->desc->layout.n_layers)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_commit_window: not a window of this peer "
                        "that commits %s", layer >= 0 ? "layer by layer"
                                                      : "as a whole");
    status = kv_ucx_commit_queue(peer, rw->slot, rw->epoch, cb, arg, &c);
    if (status != BT_OK)
        return status;
    memset(&h, 0, sizeof(h));
    h.pool_id = peer->desc->pool_id;
    h.slot = (uint32_t)rw->slot;
    h.layer = layer >= 0 ? (uint32_t)layer : 0;
    h.epoch = rw->epoch;
    memcpy(h.token, rw->token, sizeof(h.token));
    /* the bytes sent so far: the caller commits after the last of them */
    h.length = layer >= 0 ? rw->layer_bytes[layer] : rw->am_bytes;
    c->window = true;
    c->unit = h.layer;
    kv_ucx_am_hdr_pack(&h, c->hdr);
    return BT_OK;
}

bt_status_t kv_ucx_commit_window(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw,
                                 kv_ucx_commit_cb_t cb, void *arg)
{
    return kv_ucx_commit_unit(peer, rw, -1, cb, arg);
}

bt_status_t kv_ucx_commit_window_layer(kv_ucx_peer_t *peer,
                                       kv_ucx_rwindow_t *rw, int layer,
                                       kv_ucx_commit_cb_t cb, void *arg)
{
    if (layer < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, KV_UCX_SUBSYS,
                        "kv_ucx_commit_window_layer: layer %d", layer);
    return kv_ucx_commit_unit(peer, rw, layer, cb, arg);
}

void kv_ucx_window_close(kv_ucx_rwindow_t **rw_p)
{
    kv_ucx_rwindow_t *rw = *rw_p;

    if (rw == NULL)
        return;
    *rw_p = NULL;
    /* UCX may still read the key for puts in flight */
    rw->next = rw->peer->retired;
    rw->peer->retired = rw;
    if (rw->peer->pending == 0 && !rw->peer->closed)
        kv_ucx_retired_free(rw->peer);
}
