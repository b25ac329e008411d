/*
 * kv_link_choose.c - the router's choice of KV link per worker pair (see
 * kv_link_choose.h).  Pure logic: a new link adds its rule here only if
 * the router should pick it on its own.
 */
#include "kv/kv_link_choose.h"

#include <string.h>

static bool offers(const kv_link_facts_t *w, int id)
{
    return (w->offers & (1u << (unsigned)id)) != 0;
}

static bool has_endpoint(const kv_link_facts_t *d, int id)
{
    return (d->endpoints & (1u << (unsigned)id)) != 0;
}

static bool same_host(const kv_link_facts_t *p, const kv_link_facts_t *d)
{
    return p->host_id != NULL && d->host_id != NULL &&
           p->host_id[0] != '\0' && strcmp(p->host_id, d->host_id) == 0;
}

/* Both sides run the link and the decode worker published its endpoint. */
static bool pair_runs(const kv_link_facts_t *p, const kv_link_facts_t *d,
                      int id)
{
    return has_endpoint(d, id) && offers(p, id) && offers(d, id);
}

static bool pair_cuda_ipc(const kv_link_facts_t *p, const kv_link_facts_t *d)
{
    return same_host(p, d) && p->has_gpu && d->has_gpu && p->gpu_ipc &&
           d->gpu_ipc && pair_runs(p, d, KV_LINK_CUDA_IPC);
}

static bool pair_ucx(const kv_link_facts_t *p, const kv_link_facts_t *d)
{
    return !p->has_gpu && !d->has_gpu && pair_runs(p, d, KV_LINK_UCX);
}

static int ucx_kind(const kv_link_facts_t *p, const kv_link_facts_t *d)
{
    return same_host(p, d) ? KV_LINK_UCX_SHM : KV_LINK_UCX;
}

int kv_link_choose(const kv_link_facts_t *p, const kv_link_facts_t *d,
                   bool same_worker, int forced, bool stage_ok)
{
    /* staged UCX runs wherever the pools are; the automatic choice adds
     * "GPU pools on other hosts" */
    bool stage = stage_ok && pair_runs(p, d, KV_LINK_UCX_STAGE);

    if (same_worker)
        return KV_LINK_LOCAL;
    if (forced == KV_LINK_INLINE)
        return KV_LINK_INLINE;
    if (forced == KV_LINK_UCX && pair_ucx(p, d))
        return ucx_kind(p, d);
    if (forced == KV_LINK_UCX_STAGE && stage)
        return KV_LINK_UCX_STAGE;
    if (pair_cuda_ipc(p, d))
        return KV_LINK_CUDA_IPC;
    if (stage && p->has_gpu && d->has_gpu && !same_host(p, d))
        return KV_LINK_UCX_STAGE;
    if (pair_ucx(p, d))
        return ucx_kind(p, d);
    return KV_LINK_INLINE;
}

bool kv_link_wants_recv_area(int id)
{
    return id == KV_LINK_UCX_STAGE;
}

int kv_link_endpoint_id(int id)
{
    return id == KV_LINK_UCX_SHM ? KV_LINK_UCX : id;
}

const char *kv_link_name(int id)
{
    static const char *const names[KV_LINK_N_IDS] = {
        [KV_LINK_INLINE] = "inline",     [KV_LINK_UCX] = "ucx",
        [KV_LINK_NONE] = "none",         [KV_LINK_CUDA_IPC] = "cuda-ipc",
        [KV_LINK_UCX_SHM] = "ucx-shm",   [KV_LINK_LOCAL] = "local",
        [KV_LINK_UCX_STAGE] = "ucx-stage",
    };

    return id >= 0 && id < KV_LINK_N_IDS ? names[id] : "unknown";
}
