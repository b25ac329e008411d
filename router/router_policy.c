/*
 * router_policy.c - how the router picks workers.
 *
 * "least-loaded": the prefill worker with the fewest outstanding prompt
 * tokens, the decode worker with the most free KV blocks (ties: fewest
 * requests).  "round-robin": the next usable worker of each role that has
 * room.  Add a policy by adding a table entry.
 */
#include <string.h>

#include "bt_util.h"
#include "router_int.h"

int router__blocks_needed(const router_worker_t *w, int n_tokens)
{
    int bs = w->block_size > 0 ? (int)w->block_size : 16;
    return BT_DIV_UP(n_tokens, bs);
}

bool router__worker_is_usable(const router_worker_t *w)
{
    return w->used && !w->draining;
}

static bool policy_decode_fits(const router_worker_t *w, int n_tokens)
{
    if (!router__worker_is_usable(w) || w->role != BATON__ROLE__ROLE_DECODE)
        return false;
    if (w->max_context > 0 && (uint32_t)n_tokens > w->max_context)
        return false;
    return w->est_free_kv >= router__blocks_needed(w, n_tokens);
}

static router_worker_t *least_pick_prefill(router_t *router,
                                           const router_req_t *req)
{
    router_worker_t *best = NULL;

    (void)req;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &router->workers[i];
        if (!router__worker_is_usable(w) || w->role != BATON__ROLE__ROLE_PREFILL)
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
                                          int n_tokens)
{
    router_worker_t *best = NULL;

    (void)req;
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        router_worker_t *w = &router->workers[i];
        if (!policy_decode_fits(w, n_tokens))
            continue;
        if (best == NULL || w->est_free_kv > best->est_free_kv ||
            (w->est_free_kv == best->est_free_kv &&
             w->assigned < best->assigned))
            best = w;
    }
    return best;
}

static router_worker_t *rr_pick(router_t *router, unsigned *cursor,
                                Baton__Role role, int n_tokens)
{
    for (int k = 0; k < ROUTER_MAX_WORKERS; k++) {
        unsigned i = (*cursor + (unsigned)k) % ROUTER_MAX_WORKERS;
        router_worker_t *w = &router->workers[i];
        if (!router__worker_is_usable(w) || w->role != role)
            continue;
        if (role == BATON__ROLE__ROLE_DECODE &&
            !policy_decode_fits(w, n_tokens))
            continue;
        *cursor = i + 1;
        return w;
    }
    return NULL;
}

static router_worker_t *rr_pick_prefill(router_t *router,
                                        const router_req_t *req)
{
    (void)req;
    return rr_pick(router, &router->rr_prefill, BATON__ROLE__ROLE_PREFILL, 0);
}

static router_worker_t *rr_pick_decode(router_t *router,
                                       const router_req_t *req, int n_tokens)
{
    (void)req;
    return rr_pick(router, &router->rr_decode, BATON__ROLE__ROLE_DECODE,
                   n_tokens);
}

static const router_policy_t router_policies[] = {
    { "least-loaded", least_pick_prefill, least_pick_decode },
    { "round-robin", rr_pick_prefill, rr_pick_decode },
};

const router_policy_t *router__policy_find(const char *name)
{
    for (size_t i = 0; i < BT_ARRAY_SIZE(router_policies); i++)
        if (strcmp(router_policies[i].name, name) == 0)
            return &router_policies[i];
    return NULL;
}
