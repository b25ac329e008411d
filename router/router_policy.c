/*
 * router_policy.c - how the router picks workers.
 *
 * "least-loaded": the prefill worker with the fewest outstanding prompt
 * tokens, the decode worker with the most free KV blocks (ties: fewest
 * requests).  "round-robin": the next usable worker of each role that has
 * room.  "kv-aware" (issue 38): the decode worker whose prefix cache
 * holds the most of the prompt, against its load (router_policy_kv.c:
 * w_overlap * cached prompt tokens - w_load * outstanding tokens), for
 * prompts given as ids (the router does not tokenize); prefill workers
 * and text prompts as least-loaded.  Every pick considers only the
 * workers of the class it is given (router_pool.c: the request's
 * precision, or the prefill worker's pool).  Add a policy by adding a
 * table entry.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "bt_kv_promise.h"
#include "bt_util.h"
#include "kv/kv_link_choose.h"
#include "router_int.h"

/* w's KV block size (16 until it says) */
static int64_t worker_block_size(const router_worker_t *w)
{
    return w->block_size > 0 ? (int64_t)w->block_size : 16;
}

bool router__worker_is_usable(const router_worker_t *w)
{
    return w->used && !w->draining;
}

int64_t router__promise_blocks(const router_worker_t *w,
                               const router_req_t *req, int n_tokens,
                               bool *unbounded_p)
{
    const int64_t ctx = (int64_t)w->max_context;
    const int64_t total = (int64_t)n_tokens + req->max_tokens -
                          req->n_generated;
    /* asking past the context (no max_tokens: until it); a worker that
     * says no context is judged by the missing max_tokens */
    const bool past = ctx > 0 ? total > ctx
                              : req->max_tokens >= ROUTER_MAX_TOKENS;

    if (unbounded_p != NULL)
        *unbounded_p = past && w->unbounded_promise >= 0;
    return bt_kv_promise_blocks(n_tokens, total, ctx, worker_block_size(w),
                                past, w->unbounded_promise);
}

int64_t router__blocks_to_admit(const router_worker_t *w,
                                const router_req_t *req, int n_tokens)
{
    return w->admits_on_promise
               ? router__promise_blocks(w, req, n_tokens, NULL)
               : bt_kv_prompt_blocks(n_tokens, 0, worker_block_size(w));
}

bool router__req_never_fits(const router_t *r, const router_req_t *req,
                            int n_tokens, char *why, size_t why_size)
{
    int candidates = 0;
    int64_t best_blocks = 0;
    uint32_t best_ctx = 0;
    int64_t need_on_best = 0;
    bool best_unbounded = false;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *w = &r->workers[i];
        int64_t need;
        uint32_t ctx;
        bool unbounded;

        /* silent workers count: they may speak again; workers of
         * another precision class never take it */
        if (!router__worker_is_usable(w) ||
            w->role != BATON__ROLE__ROLE_DECODE ||
            (req->precision[0] != '\0' &&
             strcmp(w->precision, req->precision) != 0))
            continue;
        candidates++;
        ctx = w->max_context;
        if (w->total_kv == 0)
            return false; /* pool not known yet: cannot tell */
        /* a text prompt's length is only known after tokenization:
         * judged by its growth alone */
        if (req->prompt_ids != NULL && ctx > 0 && (uint32_t)n_tokens >= ctx)
            continue;
        /* its growth promised, even where w admits on the prompt alone:
         * growing alone past the whole pool it could never finish */
        need = router__promise_blocks(w, req, n_tokens, &unbounded);
        if (need <= (int64_t)w->total_kv)
            return false;
        if ((int64_t)w->total_kv > best_blocks) {
            best_blocks = w->total_kv;
            best_ctx = ctx;
            need_on_best = need;
            best_unbounded = unbounded;
        }
    }
    if (candidates == 0)
        return false;
    if (best_blocks == 0)
        snprintf(why, why_size, "prompt of %d tokens does not fit the "
                 "context of any decode worker", n_tokens);
    else
        snprintf(why, why_size, "request needs %lld KV blocks (prompt %d "
                 "tokens and its growth: %s, context %u) but the largest "
                 "decode worker's whole pool has %lld: it can never fit",
                 (long long)need_on_best, n_tokens,
                 best_unbounded ? "past the context, what the worker "
                                  "promises such a request"
                                : "max tokens",
                 best_ctx, (long long)best_blocks);
    return true;
}

/* Policies give new work only to workers heard from recently: a worker
 * killed a moment ago would otherwise keep getting reservations (and
 * retried requests) until the liveness check drops it. */
static bool policy_takes_work(const router_worker_t *w)
{
    return router__worker_is_usable(w) && !w->silent;
}

static bool policy_decode_fits(const router_worker_t *w,
                               const router_req_t *req, int n_tokens,
                               bool need_prefill, const router_class_t *cls)
{
    if (!policy_takes_work(w) || w->role != BATON__ROLE__ROLE_DECODE ||
        !router__worker_in_class(w, cls))
        return false;
    if (need_prefill && !w->can_prefill)
        return false;
    /* a hand-off to it needs receive room it said it lacks */
    if (!need_prefill && (w->recv_probe_out ||
                          (w->recv_probing &&
                           w->recv_full_until > bt_time_ns())))
        return false;
    if (w->max_context > 0 && (uint32_t)n_tokens > w->max_context)
        return false;
    /* by w's own admission rule: a worker that would refuse it is not
     * asked while another has room */
    return w->est_free_kv >= router__blocks_to_admit(w, req, n_tokens);
}

static router_worker_t *least_pick_prefill(router_t *router,
                                           const router_req_t *req,
                                           const router_class_t *cls,
                                           int *cached_p)
{
    router_worker_t *best = NULL;

    (void)req;
    *cached_p = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &router->workers[i];
        if (!policy_takes_work(w) || w->role != BATON__ROLE__ROLE_PREFILL ||
            !router__worker_in_class(w, cls))
            continue;
        if (best == NULL || w->outstanding < best->outstanding ||
            (w->outstanding == best->outstanding &&
             w->assigned < best->assigned))
            best = w;
    }
    return best;
}

static router_worker_t *least_pick_decode(router_t *router,
                                          const router_req_t *req,
                                          int n_tokens, bool need_prefill,
                                          const router_class_t *cls,
                                          int *cached_p)
{
    router_worker_t *best = NULL;

    *cached_p = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &router->workers[i];
        if (!policy_decode_fits(w, req, n_tokens, need_prefill, cls))
            continue;
        if (best == NULL || w->est_free_kv > best->est_free_kv ||
            (w->est_free_kv == best->est_free_kv &&
             w->assigned < best->assigned))
            best = w;
    }
    return best;
}

static router_worker_t *rr_pick(router_t *router, unsigned *cursor,
                                Baton__Role role, const router_req_t *req,
                                int n_tokens,
                                bool need_prefill, const router_class_t *cls)
{
    for (int k = 0; k < ROUTER_MAX_WORKERS; k++) {
        unsigned i = (*cursor + (unsigned)k) % ROUTER_MAX_WORKERS;
        router_worker_t *w = &router->workers[i];
        if (!policy_takes_work(w) || w->role != role ||
            !router__worker_in_class(w, cls))
            continue;
        if (role == BATON__ROLE__ROLE_DECODE &&
            !policy_decode_fits(w, req, n_tokens, need_prefill, cls))
            continue;
        *cursor = i + 1;
        return w;
    }
    return NULL;
}

static router_worker_t *rr_pick_prefill(router_t *router,
                                        const router_req_t *req,
                                        const router_class_t *cls,
                                        int *cached_p)
{
    *cached_p = 0;
    return rr_pick(router, &router->rr_prefill, BATON__ROLE__ROLE_PREFILL,
                   req, 0, false, cls);
}

static router_worker_t *rr_pick_decode(router_t *router,
                                       const router_req_t *req, int n_tokens,
                                       bool need_prefill,
                                       const router_class_t *cls,
                                       int *cached_p)
{
    *cached_p = 0;
    return rr_pick(router, &router->rr_decode, BATON__ROLE__ROLE_DECODE,
                   req, n_tokens, need_prefill, cls);
}

/* The candidate of cands[0..n) the kv-aware score prefers for req's
 * prompt, *cached_p its expected cached prompt tokens; NULL when the
 * index cannot score it (the caller goes least-loaded). */
static router_worker_t *kv_pick_scored(router_t *router,
                                       const router_req_t *req,
                                       const router_kv_candidate_t *cands,
                                       int n, int *cached_p)
{
    router_worker_t *w;
    int pick = -1, overlap = 0;

    /* The prompt as the worker will cache it: the ids the client gave.
     * kv_chain is a memo (the same prompt hashes the same), not request
     * state: written through a const request on purpose. */
    if (router_kv_pick_tokens(router->kvindex, cands, n, req->cache_salt,
                              req->cache_salt_len, req->prompt_ids,
                              req->n_prompt,
                              (router_kv_chain_t *)&req->kv_chain,
                              &router->kv_weights, &pick, &overlap) !=
            BT_OK ||
        pick < 0)
        return NULL;
    w = &router->workers[cands[pick].worker];
    *cached_p = overlap * (w->block_size > 0 ? (int)w->block_size : 16);
    return w;
}

static router_worker_t *kv_pick_decode(router_t *router,
                                       const router_req_t *req, int n_tokens,
                                       bool need_prefill,
                                       const router_class_t *cls,
                                       int *cached_p)
{
    router_kv_candidate_t cands[ROUTER_MAX_WORKERS];
    router_worker_t *w;
    int n = 0;

    if (req->prompt_ids == NULL || req->n_prompt <= 0)
        return least_pick_decode(router, req, n_tokens, need_prefill, cls,
                                 cached_p);
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        if (!policy_decode_fits(&router->workers[i], req, n_tokens,
                                need_prefill, cls))
            continue;
        cands[n].worker = i;
        cands[n].load = (double)router->workers[i].outstanding;
        n++;
    }
    *cached_p = 0;
    if (n == 0)
        return NULL;
    w = kv_pick_scored(router, req, cands, n, cached_p);
    return w != NULL ? w
                     : least_pick_decode(router, req, n_tokens, need_prefill,
                                         cls, cached_p);
}

/* Prefill workers keep a prefix cache too (issue 38): the one holding
 * most of the prompt against its queued tokens, as for decode workers.
 * A prompt with prompt logprobs is computed whole (no match there), and
 * one the router cannot hash (text) goes least-loaded. */
static router_worker_t *kv_pick_prefill(router_t *router,
                                        const router_req_t *req,
                                        const router_class_t *cls,
                                        int *cached_p)
{
    router_kv_candidate_t cands[ROUTER_MAX_WORKERS];
    router_worker_t *w;
    int n = 0;

    if (req->prompt_ids == NULL || req->n_prompt <= 0 ||
        req->sampling.prompt_logprobs)
        return least_pick_prefill(router, req, cls, cached_p);
    *cached_p = 0;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *c = &router->workers[i];
        if (!policy_takes_work(c) || c->role != BATON__ROLE__ROLE_PREFILL ||
            !router__worker_in_class(c, cls))
            continue;
        cands[n].worker = i;
        cands[n].load = (double)c->outstanding;
        n++;
    }
    if (n == 0)
        return NULL;
    w = kv_pick_scored(router, req, cands, n, cached_p);
    return w != NULL ? w : least_pick_prefill(router, req, cls, cached_p);
}

static const router_policy_t router_policies[] = {
    { "least-loaded", least_pick_prefill, least_pick_decode },
    { "round-robin", rr_pick_prefill, rr_pick_decode },
    { "kv-aware", kv_pick_prefill, kv_pick_decode },
};

const router_policy_t *router__policy_find(const char *name)
{
    for (size_t i = 0; i < BT_ARRAY_SIZE(router_policies); i++)
        if (strcmp(router_policies[i].name, name) == 0)
            return &router_policies[i];
    return NULL;
}

// ---------------------------------------------------------------------------
// KV transport per prefill/decode pair

bool router__kv_mode_parse(const char *s, router_kv_mode_t *mode_p)
{
    static const struct {
        const char *name;
        router_kv_mode_t mode;
    } modes[] = {
        { "auto", ROUTER_KV_AUTO },
        { "ucx", ROUTER_KV_UCX },
        { "cuda-ipc", ROUTER_KV_CUDA_IPC },
        { "ucx-stage", ROUTER_KV_UCX_STAGE },
        { "inline", ROUTER_KV_INLINE },
    };

    for (size_t i = 0; s != NULL && i < BT_ARRAY_SIZE(modes); i++) {
        if (strcmp(s, modes[i].name) == 0) {
            *mode_p = modes[i].mode;
            return true;
        }
    }
    return false;
}

/* The ids of kv_link_choose.h are the proto's KvTransport values. */
_Static_assert((int)KV_LINK_INLINE ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE &&
               (int)KV_LINK_UCX == (int)BATON__KV_TRANSPORT__KV_TRANSPORT_UCX &&
               (int)KV_LINK_NONE ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_NONE &&
               (int)KV_LINK_CUDA_IPC ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC &&
               (int)KV_LINK_UCX_SHM ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_SHM &&
               (int)KV_LINK_LOCAL ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_LOCAL &&
               (int)KV_LINK_UCX_STAGE ==
                   (int)BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE,
               "kv_link_id_t must match control.proto KvTransport");

const router_endpoint_t *router__worker_endpoint(const router_worker_t *w,
                                                 Baton__KvTransport
                                                     transport)
{
    int id = kv_link_endpoint_id((int)transport);

    for (int i = 0; i < w->n_eps; i++)
        if (w->eps[i].transport == id)
            return &w->eps[i];
    return NULL;
}

static void worker_facts(const router_worker_t *w, kv_link_facts_t *f)
{
    f->offers = w->transports;
    f->endpoints = 0;
    for (int i = 0; i < w->n_eps; i++)
        if ((unsigned)w->eps[i].transport < 32)
            f->endpoints |= 1u << (unsigned)w->eps[i].transport;
    f->host_id = w->host_id;
    f->has_gpu = w->has_gpu;
    f->gpu_ipc = w->gpu_ipc;
}

Baton__KvTransport router__choose_transport_ex(const router_worker_t *p,
                                               const router_worker_t *d,
                                               router_kv_mode_t mode,
                                               bool stage_granted)
{
    static const int forced[] = {
        [ROUTER_KV_AUTO] = -1,
        [ROUTER_KV_UCX] = KV_LINK_UCX,
        [ROUTER_KV_CUDA_IPC] = -1, /* the automatic choice's first */
        [ROUTER_KV_INLINE] = KV_LINK_INLINE,
        [ROUTER_KV_UCX_STAGE] = KV_LINK_UCX_STAGE,
    };
    kv_link_facts_t pf, df;

    worker_facts(p, &pf);
    worker_facts(d, &df);
    return (Baton__KvTransport)kv_link_choose(&pf, &df, p == d,
                                              forced[mode], stage_granted);
}

Baton__KvTransport router__choose_transport(const router_worker_t *p,
                                            const router_worker_t *d,
                                            router_kv_mode_t mode)
{
    return router__choose_transport_ex(p, d, mode, true);
}

const char *router__transport_name(Baton__KvTransport t)
{
    return kv_link_name((int)t);
}
