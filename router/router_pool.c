/*
 * router_pool.c - precision routing (issue 37).
 *
 * Every worker registers the precision class it computes in (f32, bf16,
 * fp8) and its KV cache's element type.  A request may name a class; the
 * policies then pick only workers of it.  A prefill worker hands its KV
 * only to a decode worker of its own precision and KV dtype (its pool):
 * the blocks would not mean the same in another pool, and a request
 * would be half computed in one precision and half in another.  So the
 * pairing is a filter on the pick, not a check after it, and a request
 * fails only when no pool can serve it at all.
 */
#include <stdio.h>
#include <string.h>

#include "router_int.h"

bool router__worker_in_class(const router_worker_t *w,
                             const router_class_t *cls)
{
    if (cls == NULL)
        return true;
    if (cls->precision[0] != '\0' &&
        strcmp(w->precision, cls->precision) != 0)
        return false;
    return cls->kv_dtype[0] == '\0' || w->kv_dtype[0] == '\0' ||
           strcmp(w->kv_dtype, cls->kv_dtype) == 0;
}

router_class_t router__worker_class(const router_worker_t *w)
{
    router_class_t cls = { w->precision, w->kv_dtype };

    return cls;
}

bool router__pair_matches(const router_worker_t *p, const router_worker_t *d)
{
    router_class_t cls = router__worker_class(p);

    return p == d || router__worker_in_class(d, &cls);
}

int router__pools(const router_t *r, router_pool_t *pools)
{
    int n = 0;

    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *w = &r->workers[i];
        router_pool_t *pool = NULL;

        /* silent workers count, as for admission: they may speak again */
        if (!router__worker_is_usable(w))
            continue;
        for (int k = 0; k < n && pool == NULL; k++)
            if (strcmp(pools[k].precision, w->precision) == 0 &&
                strcmp(pools[k].kv_dtype, w->kv_dtype) == 0)
                pool = &pools[k];
        if (pool == NULL && n < ROUTER_MAX_POOLS) {
            pool = &pools[n++];
            memset(pool, 0, sizeof(*pool));
            snprintf(pool->precision, sizeof(pool->precision), "%s",
                     w->precision);
            snprintf(pool->kv_dtype, sizeof(pool->kv_dtype), "%s",
                     w->kv_dtype);
        }
        if (pool == NULL)
            continue;
        if (w->role == BATON__ROLE__ROLE_PREFILL)
            pool->n_prefill++;
        else if (w->can_prefill)
            pool->n_both++;
        else
            pool->n_decode++;
    }
    return n;
}

/* Workers of the pool that can prefill (aggregated ones only when the
 * router uses them so) and that can decode. */
static bool pool_prefills(const router_t *r, const router_pool_t *pool)
{
    return pool->n_prefill > 0 || (pool->n_both > 0 && r->aggregate >= 1);
}

static bool pool_decodes(const router_pool_t *pool)
{
    return pool->n_decode + pool->n_both > 0;
}

/* True when the pool can serve a request alone: a prefill and a decode
 * worker of it, or an aggregated worker that is its own pair. */
static bool pool_serves(const router_t *r, const router_pool_t *pool)
{
    return (pool->n_prefill > 0 && pool_decodes(pool)) ||
           (pool->n_both > 0 && r->aggregate >= 1);
}

/* "bf16 x2, f32 x1": the usable workers by precision class. */
static void describe_classes(const router_pool_t *pools, int n_pools,
                             char *buf, size_t size)
{
    size_t len = 0;

    buf[0] = '\0';
    for (int k = 0; k < n_pools; k++) {
        int count = 0;
        bool seen = false;

        for (int j = 0; j < k && !seen; j++)
            seen = strcmp(pools[j].precision, pools[k].precision) == 0;
        if (seen)
            continue;
        for (int j = k; j < n_pools; j++)
            if (strcmp(pools[j].precision, pools[k].precision) == 0)
                count += pools[j].n_prefill + pools[j].n_decode +
                         pools[j].n_both;
        if (len < size)
            len += (size_t)snprintf(buf + len, size - len, "%s%s x%d",
                                    len ? ", " : "",
                                    pools[k].precision[0] ? pools[k].precision
                                                          : "none",
                                    count);
    }
}

/* "bf16/kv bf16 1P+0D, fp8/kv fp8 0P+1D+0both": every pool. */
static void describe_pools(const router_pool_t *pools, int n_pools,
                           char *buf, size_t size)
{
    size_t len = 0;

    buf[0] = '\0';
    for (int k = 0; k < n_pools && len < size; k++)
        len += (size_t)snprintf(buf + len, size - len,
                                "%s%s/kv %s %dP+%dD+%dboth", len ? ", " : "",
                                pools[k].precision[0] ? pools[k].precision
                                                      : "none",
                                pools[k].kv_dtype[0] ? pools[k].kv_dtype
                                                     : "none",
                                pools[k].n_prefill, pools[k].n_decode,
                                pools[k].n_both);
}

bool router__class_unservable(const router_t *r, const router_pool_t *pools,
                              int n_pools, const char *precision, char *why,
                              size_t why_size)
{
    bool prefills = false, decodes = false;
    char list[160];

    for (int k = 0; k < n_pools; k++) {
        const router_pool_t *pool = &pools[k];
        if (precision[0] != '\0' && strcmp(pool->precision, precision) != 0)
            continue;
        if (pool_serves(r, pool))
            return false;
        prefills |= pool_prefills(r, pool);
        decodes |= pool_decodes(pool);
    }
    if (n_pools == 0)
        return false; /* nothing registered yet: wait for workers */
    if (precision[0] != '\0' && !prefills && !decodes) {
        describe_classes(pools, n_pools, list, sizeof(list));
        snprintf(why, why_size, "no worker serves precision '%s' "
                 "(registered: %s)", precision, list);
        return true;
    }
    if (!prefills || !decodes)
        return false; /* one side is missing: wait for it */
    describe_pools(pools, n_pools, list, sizeof(list));
    snprintf(why, why_size, "no prefill/decode pair of one precision and "
             "KV dtype%s%s%s (pools: %s): start both sides with the same "
             "--precision and --kv-dtype", precision[0] ? " serves '" : "",
             precision, precision[0] ? "'" : "", list);
    return true;
}
