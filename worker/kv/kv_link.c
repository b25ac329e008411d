/*
 * kv_link.c - the KV link registry and the generic half of a hand-off
 * (see kv_link.h): which link a route names, inline fallback, stall
 * detection; and the receive windows per reservation slot that the UCX
 * and CUDA IPC receivers share (kv_link_int.h).  Transport code lives in
 * the kv_link_<name>.c files.
 */
#include "kv/kv_link_int.h"

#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

/* Every KV link, in the order a worker offers them (inline last but for
 * local, which no sender runs).  Adding a transport: one file, one line. */
static const kv_link_ops_t *const kv_links[] = {
    &kv_link_ucx_ops,
    &kv_link_cuda_ipc_ops,
    &kv_link_stage_ops,
    &kv_link_inline_ops,
    &kv_link_local_ops,
};

#define KV_LINK_N BT_ARRAY_SIZE(kv_links)
/* A commit of a spinning link younger than this: spin, don't sleep. */
#define KV_LINK_SPIN_NS 2000000ull

struct kv_link_sender_s {
    kv_link_config_t cfg;
    kv_link_shared_t sh;
    void *state[KV_LINK_N];   /* each link's sender state */
    bool running[KV_LINK_N];  /* send_create succeeded */
    char names[64];           /* kv_link_sender_names */
};

struct kv_link_xfer_s {
    kv_link_sender_t *sender;
    int link;                 /* index in kv_links[] of x */
    kv_link_xfer_base_t *x;   /* the link's hand-off */
    kv_link_route_t route;    /* copied; arrays below */
    int *dst;                 /* (n_dst) */
    int *stage;               /* (n_stage) */
    const int *src;           /* (n_src) local blocks, borrowed */
    int n_src;
    int layers;               /* layers shipped so far */
    bool committed;
    bool finished;            /* poll returned a final status */
    uint64_t t_commit;        /* bt_time_ns of the commit */
    uint64_t t_moved;         /* when the hand-off last moved */
    uint64_t n_moved;         /* xfer_moved then */
    const char *error;        /* set when it failed outside the link */
    char why[200];            /* error's text when it is this xfer's own */
};

// ---------------------------------------------------------------------------
// The shared UCX context

kv_ucx_t *kv_link__ucx_acquire(kv_link_shared_t *sh)
{
    if (sh->ucx == NULL) {
        kv_ucx_config_t ucfg;

        if (sh->ucx_failed)
            return NULL;
        kv_ucx_config_init(&ucfg);
        /* Device KV: UCX only carries staged hand-offs to other hosts (no
         * shared memory to lose), and a dead decode worker must fail the
         * puts so its staging buffers come back.  A receiver makes no
         * endpoints. */
        ucfg.peer_errors = sh->cfg != NULL &&
                           (sh->cfg->ucx_peer_errors || sh->kv_on_device);
        /* A receiver takes RMA only with --kv-direct-writes (the pool,
         * the staged receive area or the device pool registered for
         * puts and epoch puts): windows of both UCX links take their
         * commits by message, so without it its UCX writes no address a
         * put over tcp names (kv_transport.h "Receive windows"). */
        if (sh->rcfg != NULL)
            ucfg.rma = sh->rcfg->kv_direct_writes;
        if (kv_ucx_create(&ucfg, &sh->ucx) != BT_OK) {
            BT_LOG_WARN("KV", "UCX unavailable; KV %s inline",
                        sh->cfg != NULL ? "goes" : "arrives");
            bt_error_clear();
            sh->ucx = NULL;
            sh->ucx_failed = true;
            return NULL;
        }
    }
    sh->ucx_users++;
    return sh->ucx;
}

void kv_link__ucx_release(kv_link_shared_t *sh)
{
    BT_ASSERT(sh->ucx_users > 0);
    if (--sh->ucx_users == 0)
        kv_ucx_destroy(&sh->ucx);
}

// ---------------------------------------------------------------------------
// Sender

bt_status_t kv_link_sender_create(const kv_link_config_t *cfg,
                                  kv_link_sender_t **sender_p)
{
    kv_link_sender_t *s = bt_calloc(1, sizeof(*s), "kv_link");
    size_t used = 0;

    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    s->cfg = *cfg;
    s->sh.cfg = &s->cfg;
    s->sh.backend = cfg->backend;
    s->sh.kv_on_device = cfg->kv_on_device;
    for (size_t i = 0; i < KV_LINK_N; i++) {
        const kv_link_ops_t *ops = kv_links[i];
        bt_status_t status;

        if (ops->send_create == NULL)
            continue;
        status = ops->send_create(&s->sh, &s->state[i]);
        if (status != BT_OK) {
            if (status != BT_ERR_UNSUPPORTED)
                BT_LOG_WARN("KV", "KV link %s not started (%s); its "
                            "hand-offs go inline", ops->name,
                            bt_status_str(status));
            bt_error_clear();
            s->state[i] = NULL;
            continue;
        }
        s->running[i] = true;
        if (ops->id != KV_LINK_INLINE && used + 16 < sizeof(s->names))
            used += (size_t)snprintf(s->names + used, sizeof(s->names) - used,
                                     "%s%s", used > 0 ? "," : "", ops->name);
    }
    *sender_p = s;
    return BT_OK;
}

void kv_link_sender_destroy(kv_link_sender_t **sender_p)
{
    kv_link_sender_t *s = *sender_p;

    if (s == NULL)
        return;
    /* reverse order: links that share the UCX context release it */
    for (size_t i = KV_LINK_N; i-- > 0;)
        if (s->running[i] && kv_links[i]->send_destroy != NULL)
            kv_links[i]->send_destroy(&s->state[i]);
    BT_ASSERT(s->sh.ucx == NULL);
    bt_free(s);
    *sender_p = NULL;
}

int kv_link_sender_offers(const kv_link_sender_t *s, int *ids, int max)
{
    int n = 0;

    for (size_t i = 0; i < KV_LINK_N && n < max; i++)
        if (s->running[i])
            ids[n++] = kv_links[i]->id;
    return n;
}

const char *kv_link_sender_names(const kv_link_sender_t *s)
{
    return s->names;
}

void kv_link_sender_sync(kv_link_sender_t *s, const kv_link_endpoint_t *eps,
                         int n)
{
    kv_link_endpoint_t *mine;

    if (n <= 0)
        n = 0;
    mine = bt_calloc((size_t)BT_MAX(n, 1), sizeof(*mine), "kv_link");
    if (mine == NULL)
        return;
    for (size_t i = 0; i < KV_LINK_N; i++) {
        int k = 0;
        if (!s->running[i] || kv_links[i]->send_sync == NULL)
            continue;
        for (int e = 0; e < n; e++)
            if (eps[e].transport == kv_links[i]->id && eps[e].len > 0)
                mine[k++] = eps[e];
        kv_links[i]->send_sync(s->state[i], mine, k);
    }
    bt_free(mine);
}

void kv_link_sender_progress(kv_link_sender_t *s)
{
    /* A UCX commit is a chain of flush, put and flush, each step started
     * from the previous one's completion, so over shared memory one
     * progress call may leave the next step ready but not yet run.
     * Bounded, in case a transport never idles. */
    if (s->sh.ucx != NULL)
        for (int k = 0; k < 64 && kv_ucx_progress(s->sh.ucx); k++)
            ;
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (s->running[i] && kv_links[i]->send_progress != NULL)
            for (int k = 0; k < 64 && kv_links[i]->send_progress(s->state[i]);
                 k++)
                ;
}

void kv_link_sender_reap(kv_link_sender_t *s)
{
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (s->running[i] && kv_links[i]->send_reap != NULL)
            kv_links[i]->send_reap(s->state[i]);
}

/* Arms the shared UCX context's event fd, the only one a link sleeps on. */
static bt_status_t shared_arm(kv_link_shared_t *sh, int *fd_p)
{
    bt_status_t status;

    *fd_p = -1;
    if (sh->ucx == NULL || kv_ucx_event_fd(sh->ucx) < 0)
        return BT_OK;
    status = kv_ucx_arm(sh->ucx);
    if (status == BT_OK)
        *fd_p = kv_ucx_event_fd(sh->ucx);
    return status == BT_IN_PROGRESS ? BT_IN_PROGRESS : BT_OK;
}

bt_status_t kv_link_sender_arm(kv_link_sender_t *s, int *fd_p)
{
    return shared_arm(&s->sh, fd_p);
}

// ---------------------------------------------------------------------------
// One hand-off

static int link_index(int id)
{
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (kv_links[i]->id == id || kv_links[i]->alias == id)
            return (int)i;
    return -1;
}

/* Replaces the hand-off by an inline one that packs every layer shipped
 * so far (the link's own hand-off is cancelled).  When inline cannot
 * take it either, xf->x stays NULL, xf->error says why and so does
 * bt_error_last() (the caller clears it or passes it on). */
static bt_status_t fall_back(kv_link_xfer_t *xf)
{
    int inl = link_index(KV_LINK_INLINE);
    kv_link_xfer_base_t *x = NULL;
    bt_status_t status;

    if (xf->x != NULL)
        kv_links[xf->link]->xfer_destroy(xf->x);
    xf->x = NULL;
    xf->link = inl;
    status = kv_link__inline_create(&xf->sender->sh, &xf->route, &x);
    if (status != BT_OK) {
        /* the range was checked at create: too big, or out of memory */
        snprintf(xf->why, sizeof(xf->why), "%s",
                 status == BT_ERR_NO_RESOURCE ? bt_error_last()
                                              : "out of memory");
        xf->error = xf->why;
        return status;
    }
    xf->x = x;
    if (xf->src != NULL)
        kv_link_inline_ops.xfer_start(x, xf->src, xf->n_src);
    for (int l = 0; l < xf->layers; l++)
        kv_link_inline_ops.xfer_layer(x, l);
    return BT_OK;
}

bt_status_t kv_link_xfer_create(kv_link_sender_t *s,
                                const kv_link_route_t *route,
                                kv_link_xfer_t **xfer_p)
{
    kv_link_xfer_t *xf = bt_calloc(1, sizeof(*xf), "kv_link_xfer");
    int i = route->transport >= 0 ? link_index(route->transport) : -1;
    bt_status_t status = BT_ERR_UNSUPPORTED;

    if (xf == NULL)
        return BT_ERR_NO_MEMORY;
    xf->sender = s;
    xf->route = *route;
    if (route->n_dst > 0) {
        xf->dst = bt_malloc((size_t)route->n_dst * sizeof(int), "kv_link_xfer");
        if (xf->dst == NULL)
            goto err_free;
        memcpy(xf->dst, route->dst_blocks, (size_t)route->n_dst * sizeof(int));
    }
    if (route->n_stage > 0) {
        xf->stage = bt_malloc((size_t)route->n_stage * sizeof(int),
                              "kv_link_xfer");
        if (xf->stage == NULL)
            goto err_free;
        memcpy(xf->stage, route->stage_blocks,
               (size_t)route->n_stage * sizeof(int));
    }
    xf->route.dst_blocks = xf->dst;
    xf->route.stage_blocks = xf->stage;
    xf->route.desc = NULL; /* the links copy what they keep */
    xf->route.desc_len = 0;
    if (route->first_block < 0 || route->first_block >= BT_MAX(route->n_dst, 1)
        || (route->first_block > 0 && (route->dst_block_size <= 0 ||
                                       (int64_t)route->first_block *
                                       route->dst_block_size >=
                                       route->n_tokens))) {
        BT_LOG_ERROR("KV", "request %llu: hand-off range from block %d of "
                     "%d (block size %d) is not a range",
                     (unsigned long long)route->request_id,
                     route->first_block, route->n_dst,
                     route->dst_block_size);
        status = BT_ERR_INVALID_ARG;
        goto err_free;
    }
    if (i >= 0 && s->running[i] && kv_links[i]->id != KV_LINK_INLINE &&
        kv_links[i]->xfer_create != NULL) {
        /* A remote link puts whole blocks of one size on both sides
         * (kv_link__remote_xfer_create checks): the range is the tail of
         * both tables.  Inline moves tokens (kv_link__inline_create). */
        kv_link_route_t r = xf->route;
        r.desc = route->desc;
        r.desc_len = route->desc_len;
        r.dst_blocks = xf->dst + route->first_block;
        r.n_dst = route->n_dst - route->first_block;
        status = kv_links[i]->xfer_create(s->state[i], &r, &xf->x);
        if (status == BT_OK)
            xf->link = i;
        else if (status == BT_ERR_NO_MEMORY)
            goto err_free;
    }
    if (status != BT_OK) {
        if (i >= 0 && kv_links[i]->id != KV_LINK_INLINE)
            BT_LOG_WARN("KV", "request %llu: %s not usable here; KV goes "
                        "inline", (unsigned long long)route->request_id,
                        kv_links[i]->name);
        bt_error_clear();
        status = fall_back(xf);
        if (status != BT_OK)
            goto err_free; /* bt_error_last() says why */
    }
    xf->x->request_id = route->request_id;
    *xfer_p = xf;
    return BT_OK;

err_free:
    kv_link_xfer_destroy(&xf);
    return status == BT_ERR_INVALID_ARG || status == BT_ERR_NO_RESOURCE
               ? status
               : BT_ERR_NO_MEMORY;
}

void kv_link_xfer_start(kv_link_xfer_t *xf, const int *src, int n)
{
    const kv_link_ops_t *ops = kv_links[xf->link];

    int skip = ops->id != KV_LINK_INLINE ? xf->route.first_block : 0;

    xf->src = src;
    xf->n_src = n;
    if (skip >= n) {
        xf->error = "hand-off range past the prompt's blocks";
        return;
    }
    if (ops->xfer_start != NULL &&
        ops->xfer_start(xf->x, src + skip, n - skip) != BT_OK &&
        fall_back(xf) != BT_OK)
        bt_error_clear(); /* xf->error keeps why */
}

void kv_link_xfer_layer(kv_link_xfer_t *xf, int layer)
{
    const kv_link_ops_t *ops = kv_links[xf->link];

    xf->layers = BT_MAX(xf->layers, layer + 1);
    if (xf->x != NULL && ops->xfer_layer != NULL &&
        ops->xfer_layer(xf->x, layer) != BT_OK && ops->id != KV_LINK_INLINE &&
        fall_back(xf) != BT_OK) /* repacks layers 0..layer */
        bt_error_clear(); /* xf->error keeps why */
}

bt_status_t kv_link_xfer_commit(kv_link_xfer_t *xf)
{
    const kv_link_ops_t *ops = kv_links[xf->link];
    bt_status_t status;

    if (xf->x == NULL || xf->error != NULL)
        return BT_ERR_INVALID_ARG; /* xf->error says why */
    xf->committed = true;
    xf->t_commit = bt_time_ns();
    status = ops->xfer_commit != NULL ? ops->xfer_commit(xf->x) : BT_OK;
    if (status == BT_IN_PROGRESS) {
        xf->n_moved = ops->xfer_moved != NULL ? ops->xfer_moved(xf->x) : 0;
        xf->t_moved = xf->t_commit;
    } else {
        xf->finished = true;
    }
    return status;
}

/* The stall clock counts from the last progress seen, not from the
 * commit: a UCX hand-off moves only while the worker's loop turns, and
 * the worker's own steps (a long forward) hold the loop for hundreds of
 * ms, so a live decode worker's hand-off must not time out as if it were
 * dead.  The caller polls just after progressing the links, so a live
 * peer's completions are seen first; a dead one completes nothing. */
bt_status_t kv_link_xfer_poll(kv_link_xfer_t *xf, uint64_t stall_ns)
{
    const kv_link_ops_t *ops = kv_links[xf->link];
    bt_status_t status;
    uint64_t now, moved;

    if (xf->x == NULL)
        return BT_ERR_NO_MEMORY;
    status = ops->xfer_query != NULL ? ops->xfer_query(xf->x) : BT_OK;
    if (status != BT_IN_PROGRESS) {
        xf->finished = true;
        return status;
    }
    now = bt_time_ns();
    moved = ops->xfer_moved != NULL ? ops->xfer_moved(xf->x) : 0;
    if (moved != xf->n_moved) {
        xf->n_moved = moved;
        xf->t_moved = now;
    }
    if (now - BT_MAX(xf->t_commit, xf->t_moved) <= stall_ns)
        return BT_IN_PROGRESS;
    /* Without peer error handling a dead decode worker's commit never
     * completes: give up; the router retries elsewhere. */
    BT_LOG_WARN("KV", "request %llu: KV hand-off stalled for %llu ms; the "
                "decode worker is presumed dead",
                (unsigned long long)xf->route.request_id,
                (unsigned long long)(stall_ns / 1000000ull));
    if (ops->xfer_abandon != NULL)
        ops->xfer_abandon(xf->x);
    xf->x->error = "KV hand-off to the decode worker timed out";
    xf->finished = true;
    return BT_ERR_TIMEOUT;
}

bool kv_link_xfer_failed(const kv_link_xfer_t *xf)
{
    return xf->error != NULL || xf->x == NULL;
}

const char *kv_link_xfer_error(const kv_link_xfer_t *xf)
{
    if (xf->error != NULL)
        return xf->error;
    if (xf->x != NULL && xf->x->error != NULL)
        return xf->x->error;
    return "KV transfer to the decode worker failed";
}

bool kv_link_xfer_is_remote(const kv_link_xfer_t *xf)
{
    return kv_links[xf->link]->id != KV_LINK_INLINE;
}

bool kv_link_xfer_spins(const kv_link_xfer_t *xf)
{
    return kv_links[xf->link]->spins && xf->committed && !xf->finished &&
           bt_time_ns() - xf->t_commit < KV_LINK_SPIN_NS;
}

int kv_link_xfer_payload(const kv_link_xfer_t *xf, uint8_t *const **parts_p,
                         size_t *part_len_p)
{
    const kv_link_ops_t *ops = kv_links[xf->link];

    if (xf->x == NULL || ops->xfer_payload == NULL)
        return 0;
    return ops->xfer_payload(xf->x, parts_p, part_len_p);
}

void kv_link_xfer_destroy(kv_link_xfer_t **xfer_p)
{
    kv_link_xfer_t *xf = *xfer_p;

    if (xf == NULL)
        return;
    if (xf->x != NULL)
        kv_links[xf->link]->xfer_destroy(xf->x);
    bt_free(xf->dst);
    bt_free(xf->stage);
    bt_free(xf);
    *xfer_p = NULL;
}

// ---------------------------------------------------------------------------
// Receiver

struct kv_link_receiver_s {
    kv_link_recv_config_t cfg;
    kv_link_shared_t sh;
    bool alloc_ref;           /* a reference on sh.ucx for the pool memory
                                 (kv_link_receiver_kv_alloc) */
    bool attached;            /* the links' receivers run */
    void *state[KV_LINK_N];   /* each link's receiver state */
    bool running[KV_LINK_N];  /* recv_create succeeded */
    uint64_t arrivals[KV_LINK_N]; /* KV that arrived over each */
    char names[64];           /* kv_link_receiver_names */
    char why[96];             /* kv_link_receiver_arrived's reason */
};

bt_status_t kv_link_receiver_create(const kv_link_recv_config_t *cfg,
                                    kv_link_receiver_t **recv_p)
{
    kv_link_receiver_t *r = bt_calloc(1, sizeof(*r), "kv_link");

    if (r == NULL)
        return BT_ERR_NO_MEMORY;
    r->cfg = *cfg;
    r->sh.rcfg = &r->cfg;
    /* UCX first when the backend puts its KV arrays in memory UCX maps
     * into prefill workers (its failure is a warning: KV comes inline);
     * otherwise at attach, when it is known whether a link needs RMA */
    if (cfg->use_ucx && cfg->ucx_shm_pool && cfg->kv_direct_writes)
        r->alloc_ref = kv_link__ucx_acquire(&r->sh) != NULL;
    *recv_p = r;
    return BT_OK;
}

/* backend_config_t.kv_alloc: the KV arrays in UCX-mapped shared memory. */
static void *ucx_kv_alloc(void *arg, size_t bytes)
{
    void *p = NULL;

    if (kv_ucx_mem_alloc(arg, bytes, KV_UCX_MEM_HOST, &p) != BT_OK)
        return NULL;
    return p;
}

static void ucx_kv_free(void *arg, void *ptr)
{
    kv_ucx_mem_free(arg, &ptr);
}

void kv_link_receiver_kv_alloc(kv_link_receiver_t *r, backend_config_t *bcfg)
{
    /* with receive windows no writer maps the pool: plain memory */
    if (r->sh.ucx == NULL || !r->cfg.ucx_shm_pool || !r->cfg.kv_direct_writes)
        return;
    bcfg->kv_alloc = ucx_kv_alloc;
    bcfg->kv_free = ucx_kv_free;
    bcfg->kv_alloc_arg = r->sh.ucx;
}

bt_status_t kv_link_receiver_attach(kv_link_receiver_t *r, backend_t *be,
                                    bool kv_on_device, int max_context)
{
    size_t used = 0;

    r->sh.backend = be;
    r->sh.kv_on_device = kv_on_device;
    r->sh.max_context = max_context;
    for (size_t i = 0; i < KV_LINK_N; i++) {
        const kv_link_ops_t *ops = kv_links[i];
        bt_status_t status;

        if (ops->recv_create == NULL)
            continue;
        status = ops->recv_create(&r->sh, &r->state[i]);
        if (status == BT_ERR_NO_MEMORY) {
            kv_link_receiver_detach(r);
            return status;
        }
        if (status != BT_OK) {
            if (status != BT_ERR_UNSUPPORTED)
                BT_LOG_WARN("KV", "KV link %s not started (%s); its KV "
                            "arrives inline", ops->name,
                            bt_status_str(status));
            bt_error_clear();
            r->state[i] = NULL;
            continue;
        }
        r->running[i] = true;
        if (ops->id != KV_LINK_INLINE && used + 16 < sizeof(r->names))
            used += (size_t)snprintf(r->names + used, sizeof(r->names) - used,
                                     "%s%s", used > 0 ? "," : "", ops->name);
    }
    r->attached = true;
    /* Device KV is not UCX memory: UCX only serves the links that hold
     * it (the staged receiver), or nothing. */
    if (kv_on_device && r->alloc_ref) {
        r->alloc_ref = false;
        kv_link__ucx_release(&r->sh);
    }
    return BT_OK;
}

void kv_link_receiver_detach(kv_link_receiver_t *r)
{
    if (r == NULL)
        return;
    /* reverse order: the staged receiver before the device pool */
    for (size_t i = KV_LINK_N; i-- > 0;) {
        if (r->running[i] && kv_links[i]->recv_destroy != NULL)
            kv_links[i]->recv_destroy(&r->state[i]);
        r->running[i] = false;
    }
    r->attached = false;
}

void kv_link_receiver_destroy(kv_link_receiver_t **recv_p)
{
    kv_link_receiver_t *r = *recv_p;

    if (r == NULL)
        return;
    kv_link_receiver_detach(r);
    if (r->alloc_ref)
        kv_link__ucx_release(&r->sh);
    BT_ASSERT(r->sh.ucx == NULL);
    bt_free(r);
    *recv_p = NULL;
}

int kv_link_receiver_offers(const kv_link_receiver_t *r, int *ids, int max)
{
    int n = 0;

    for (size_t i = 0; i < KV_LINK_N && n < max; i++)
        if (r->running[i])
            ids[n++] = kv_links[i]->id;
    return n;
}

int kv_link_receiver_endpoints(const kv_link_receiver_t *r,
                               kv_link_endpoint_t *eps, int max)
{
    int n = 0;

    for (size_t i = 0; i < KV_LINK_N && n < max; i++) {
        size_t len = 0;
        const uint8_t *d;
        if (!r->running[i] || kv_links[i]->recv_desc == NULL)
            continue;
        d = kv_links[i]->recv_desc(r->state[i], &len);
        if (d == NULL || len == 0)
            continue;
        eps[n].transport = kv_links[i]->id;
        eps[n].desc = d;
        eps[n].len = len;
        n++;
    }
    return n;
}

const char *kv_link_receiver_names(const kv_link_receiver_t *r)
{
    return r->names;
}

bool kv_link_receiver_is_remote(const kv_link_receiver_t *r)
{
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (r->running[i] && kv_links[i]->id != KV_LINK_INLINE)
            return true;
    return false;
}

bool kv_link_receiver_pool_exposed(const kv_link_receiver_t *r)
{
    for (size_t i = 0; i < KV_LINK_N; i++) {
        if (!r->running[i] || kv_links[i]->id == KV_LINK_INLINE)
            continue;
        if (kv_links[i]->recv_pool_exposed == NULL ||
            kv_links[i]->recv_pool_exposed(r->state[i]))
            return true;
    }
    return false;
}

bt_status_t kv_link_receiver_arm(kv_link_receiver_t *r, kv_link_grant_t *g)
{
    /* An unknown link (a newer router's) arms none: its KV comes inline. */
    int want = g->has_want_link ? link_index(g->want_link) : -1;

    g->has_recv_ids = false;
    g->ucx_window = NULL;
    g->ucx_window_len = 0;
    for (size_t i = 0; i < KV_LINK_N; i++) {
        bt_status_t status;
        if (!r->running[i] || kv_links[i]->recv_arm == NULL)
            continue;
        if (g->has_want_link && (int)i != want) {
            /* Not the announced link: no window (~34 us of mapping a
             * request on UCX, a device allocation on CUDA IPC), only a
             * slot that carries no old arrival; a writer that uses it
             * anyway finds nothing to write into. */
            if (kv_links[i]->recv_reset != NULL)
                kv_links[i]->recv_reset(r->state[i], g->slot, false);
            continue;
        }
        status = kv_links[i]->recv_arm(r->state[i], g);
        if (status != BT_OK) {
            /* undo the links armed before: nothing was granted */
            for (size_t k = 0; k < i; k++)
                if (r->running[k] && kv_links[k]->recv_reset != NULL)
                    kv_links[k]->recv_reset(r->state[k], g->slot, false);
            g->has_recv_ids = false;
            g->ucx_window = NULL; /* unmapped by the reset */
            g->ucx_window_len = 0;
            g->cipc_window = NULL;
            g->cipc_window_len = 0;
            return status;
        }
    }
    return BT_OK;
}

bt_status_t kv_link_receiver_arrived(kv_link_receiver_t *r, int transport,
                                     int slot, uint64_t epoch,
                                     const char **why_p)
{
    int i = link_index(transport);
    bt_status_t status = BT_ERR_INVALID_ARG;

    if (i >= 0 && r->running[i] && kv_links[i]->recv_arrived != NULL)
        status = kv_links[i]->recv_arrived(r->state[i], slot, epoch);
    if (status == BT_OK)
        r->arrivals[i]++;
    if (status != BT_OK && status != BT_IN_PROGRESS) {
        if (i >= 0 && kv_links[i]->id != KV_LINK_UCX)
            snprintf(r->why, sizeof(r->why), "KV did not arrive over %s",
                     kv_links[i]->name);
        else
            snprintf(r->why, sizeof(r->why), "KV did not arrive");
        *why_p = r->why;
    }
    return status;
}

bt_status_t kv_link_receiver_unpack(kv_link_receiver_t *r,
                                    const uint8_t *const *parts,
                                    const size_t *lens, int n_parts,
                                    const int *blocks, int n_blocks,
                                    int n_tokens)
{
    return kv_link__inline_unpack(&r->sh, parts, lens, n_parts, blocks,
                                  n_blocks, n_tokens);
}

bool kv_link_receiver_reset(kv_link_receiver_t *r, int slot, bool writer)
{
    bool revoked = false;

    for (size_t i = 0; i < KV_LINK_N; i++)
        if (r->running[i] && kv_links[i]->recv_reset != NULL)
            revoked |= kv_links[i]->recv_reset(r->state[i], slot, writer);
    return revoked;
}

void kv_link_receiver_progress(kv_link_receiver_t *r)
{
    if (r->sh.ucx != NULL)
        kv_ucx_progress(r->sh.ucx);
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (r->running[i] && kv_links[i]->recv_progress != NULL)
            kv_links[i]->recv_progress(r->state[i]);
}

void kv_link_receiver_expire(kv_link_receiver_t *r, uint64_t now)
{
    for (size_t i = 0; i < KV_LINK_N; i++)
        if (r->running[i] && kv_links[i]->recv_expire != NULL)
            kv_links[i]->recv_expire(r->state[i], now);
}

uint64_t kv_link_receiver_writes_refused(const kv_link_receiver_t *r)
{
    return kv_ucx_writes_refused(r->sh.ucx);
}

bt_status_t kv_link_receiver_arm_fd(kv_link_receiver_t *r, int *fd_p)
{
    return shared_arm(&r->sh, fd_p);
}

void kv_link_receiver_stats(const kv_link_receiver_t *r, char *buf,
                            size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < KV_LINK_N && used + 32 < len; i++)
        if (kv_links[i]->recv_arrived != NULL)
            used += (size_t)snprintf(buf + used, len - used, "%s%s:%llu",
                                     used > 0 ? " " : "", kv_links[i]->name,
                                     (unsigned long long)r->arrivals[i]);
}

// ---------------------------------------------------------------------------
// Remote links' shared xfer start (kv_link_int.h)

bt_status_t kv_link__remote_xfer_create(const kv_link_route_t *r,
                                        const kv_layout_t *lay, size_t size,
                                        size_t remote_off, const int *dst,
                                        kv_link_xfer_base_t **xfer_p)
{
    kv_link_xfer_base_t *x;
    kv_link_remote_t *rt;

    if (r->desc_len == 0 || r->slot < 0 ||
        r->dst_block_size != (int)lay->block_size)
        return BT_ERR_UNSUPPORTED;
    x = bt_calloc(1, size, "kv_link_xfer");
    if (x == NULL)
        return BT_ERR_NO_MEMORY;
    rt = (kv_link_remote_t *)((uint8_t *)x + remote_off);
    rt->desc = bt_malloc(r->desc_len, "prefill_desc");
    if (rt->desc == NULL) {
        bt_free(x);
        return BT_ERR_NO_MEMORY;
    }
    memcpy(rt->desc, r->desc, r->desc_len);
    rt->desc_len = r->desc_len;
    if (r->ucx_window_len > 0) {
        rt->window = bt_malloc(r->ucx_window_len, "prefill_desc");
        if (rt->window == NULL) {
            bt_free(rt->desc);
            bt_free(x);
            return BT_ERR_NO_MEMORY;
        }
        memcpy(rt->window, r->ucx_window, r->ucx_window_len);
        rt->window_len = r->ucx_window_len;
    }
    /* the CUDA IPC window's token and block count: fixed size */
    if (r->cipc_window_len == sizeof(rt->cipc_window)) {
        memcpy(rt->cipc_window, r->cipc_window, sizeof(rt->cipc_window));
        rt->has_cipc_window = true;
    }
    rt->slot = r->slot;
    rt->epoch = r->epoch;
    rt->dst = dst;
    *xfer_p = x;
    return BT_OK;
}

void kv_link__remote_cleanup(kv_link_remote_t *rt)
{
    bt_free(rt->desc);
    rt->desc = NULL;
    bt_free(rt->window);
    rt->window = NULL;
}

// ---------------------------------------------------------------------------
// Receive windows per reservation slot (kv_link_int.h)

/* One reservation slot's receive window. */
typedef struct {
    void *win;            /* the live grant's window, else NULL */
    int *blocks;          /* (n) the pool blocks it is copied into */
    int n;
    uint64_t epoch;       /* the grant's */
    uint64_t copied;      /* the epoch whose window was copied in (0) */
} win_slot_t;

struct kv_link_win_slots_s {
    const kv_link_win_ops_t *ops;
    void *ctx;            /* the link's receiver state, for ops */
    win_slot_t *slots;    /* (n_slots) */
    int n_slots;
    bool warned;          /* a grant went without a window: said once */
};

bt_status_t kv_link__win_slots_create(const kv_link_win_ops_t *ops,
                                      void *ctx, int n_slots,
                                      kv_link_win_slots_t **slots_p)
{
    kv_link_win_slots_t *ws = bt_calloc(1, sizeof(*ws), ops->name);

    if (ws == NULL)
        return BT_ERR_NO_MEMORY;
    ws->slots = bt_calloc((size_t)BT_MAX(n_slots, 1), sizeof(*ws->slots),
                          ops->name);
    if (ws->slots == NULL) {
        bt_free(ws);
        return BT_ERR_NO_MEMORY;
    }
    ws->ops = ops;
    ws->ctx = ctx;
    ws->n_slots = n_slots;
    *slots_p = ws;
    return BT_OK;
}

/* Frees slot sl's window.  True when it was still live: its writer (if
 * any) loses its key or FD, and writes nothing the pool holds. */
static bool win_slot_unmap(kv_link_win_slots_t *ws, win_slot_t *sl)
{
    bool revoked = sl->win != NULL;

    if (sl->win != NULL)
        ws->ops->destroy(sl->win);
    sl->win = NULL;
    bt_free(sl->blocks);
    sl->blocks = NULL;
    sl->n = 0;
    return revoked;
}

void kv_link__win_slots_destroy(kv_link_win_slots_t **slots_p)
{
    kv_link_win_slots_t *ws = *slots_p;

    if (ws == NULL)
        return;
    for (int i = 0; i < ws->n_slots; i++)
        win_slot_unmap(ws, &ws->slots[i]);
    bt_free(ws->slots);
    bt_free(ws);
    *slots_p = NULL;
}

bt_status_t kv_link__win_slots_arm(kv_link_win_slots_t *ws,
                                   const kv_link_grant_t *g, void **win_p)
{
    win_slot_t *sl;
    bt_status_t status;

    *win_p = NULL;
    if (ws == NULL || g->slot < 0 || g->slot >= ws->n_slots)
        return BT_OK;
    sl = &ws->slots[g->slot];
    win_slot_unmap(ws, sl); /* a slot is reset before it is granted again */
    /* a grant for the staged link carries that link's window instead */
    if (g->n <= 0 || g->want_recv_area)
        return BT_OK;
    sl->blocks = bt_malloc((size_t)g->n * sizeof(int), ws->ops->name);
    if (sl->blocks == NULL)
        return BT_OK;
    status = ws->ops->create(ws->ctx, g, &sl->win);
    if (status != BT_OK || sl->win == NULL) {
        win_slot_unmap(ws, sl);
        if (status == BT_ERR_NO_RESOURCE) { /* for now: wait for one */
            bt_error_clear();
            return status;
        }
        if (!ws->warned) /* once: it would repeat for every grant */
            ws->ops->warn(ws->ctx, g);
        ws->warned = true;
        bt_error_clear();
        return BT_OK;
    }
    memcpy(sl->blocks, g->blocks, (size_t)g->n * sizeof(int));
    sl->n = g->n;
    sl->epoch = g->epoch;
    sl->copied = 0;
    *win_p = sl->win;
    return BT_OK;
}

bool kv_link__win_slots_reset(kv_link_win_slots_t *ws, int slot,
                              bool writer)
{
    bool revoked;

    if (ws == NULL || slot < 0 || slot >= ws->n_slots)
        return false;
    revoked = win_slot_unmap(ws, &ws->slots[slot]) && writer;
    ws->slots[slot].copied = 0;
    return revoked;
}

bt_status_t kv_link__win_slots_arrived(kv_link_win_slots_t *ws, int slot,
                                       uint64_t epoch)
{
    win_slot_t *sl;
    bt_status_t status;

    BT_ASSERT(ws != NULL);
    if (slot < 0 || slot >= ws->n_slots)
        return BT_ERR_INVALID_ARG; /* no window of this grant */
    sl = &ws->slots[slot];
    if (epoch != 0 && sl->copied == epoch)
        return BT_OK; /* asked again: already in the pool */
    if (sl->win == NULL || sl->epoch != epoch)
        return BT_ERR_INVALID_ARG; /* no window of this grant */
    status = ws->ops->wait(ws->ctx, sl->win, slot, epoch);
    if (status != BT_OK)
        return status;
    status = ws->ops->copy_in(ws->ctx, sl->win, sl->blocks, sl->n);
    win_slot_unmap(ws, sl); /* its writer is done: nothing revoked */
    if (status != BT_OK)
        return status;
    sl->copied = epoch;
    return BT_OK;
}
