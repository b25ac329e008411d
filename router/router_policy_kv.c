/*
 * router_policy_kv.c - the "kv-aware" choice: send a prompt where most of
 * its prefix is already cached, unless that worker is too loaded.
 *
 *     score = w_overlap * overlap_tokens - w_load * load
 *
 * A linear score because both terms are in comparable units when load is
 * counted in tokens: a cached prompt token is prefill work saved, a token
 * of load is work queued ahead.  The weights say how much a saved token
 * is worth against a queued one (w_overlap 0: least-loaded).  The
 * overlap comes from router_kvindex (what workers reported holding); the
 * load is the caller's measure.  Round robin and least-loaded stay in
 * router_policy.c.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "router_kvindex.h"

void router_kv_weights_init(router_kv_weights_t *w)
{
    w->w_overlap = 1.0;
    w->w_load = 1.0;
}

bt_status_t router_kv_weights_parse(const char *spec,
                                    router_kv_weights_t *w)
{
    router_kv_weights_t out = *w;
    const char *p = spec;

    if (spec == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "no KV weights");
    while (*p != '\0') {
        const char *eq = strchr(p, '=');
        size_t key_len = eq != NULL ? (size_t)(eq - p) : 0;
        double *dst = NULL;
        char *end;
        double v;

        if (key_len == 7 && strncmp(p, "overlap", 7) == 0)
            dst = &out.w_overlap;
        else if (key_len == 4 && strncmp(p, "load", 4) == 0)
            dst = &out.w_load;
        if (dst == NULL)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                            "KV weights \"%s\": expected overlap=<x>,"
                            "load=<y>", spec);
        errno = 0;
        v = strtod(eq + 1, &end);
        if (errno != 0 || end == eq + 1 || !isfinite(v) || v < 0 ||
            (*end != ',' && *end != '\0'))
            return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER",
                            "KV weights \"%s\": a weight is a finite "
                            "number >= 0", spec);
        *dst = v;
        p = *end == ',' ? end + 1 : end;
    }
    *w = out;
    return BT_OK;
}

/* The best candidate so far (best < 0: none yet). */
typedef struct {
    int best;
    double score;
    int overlap;   /* its cached leading blocks */
} kv_best_t;

/* Scores candidate i (`overlap` cached blocks of `block_size` tokens)
 * and keeps it when it beats the best.  Ties go to the lower load, then
 * the earlier. */
static void kv_consider(kv_best_t *b, const router_kv_candidate_t *cands,
                        int i, int overlap, int block_size,
                        const router_kv_weights_t *w)
{
    double score = w->w_overlap * (double)overlap * (double)block_size -
                   w->w_load * cands[i].load;

    if (b->best < 0 || score > b->score ||
        (score == b->score && cands[i].load < cands[b->best].load)) {
        b->best = i;
        b->score = score;
        b->overlap = overlap;
    }
}

int router_kv_pick(const router_kvindex_t *idx,
                   const router_kv_candidate_t *cands, int n,
                   const uint64_t *chain, int n_chain, int block_size,
                   const router_kv_weights_t *w, int *overlap_p)
{
    kv_best_t b = { -1, 0, 0 };

    for (int i = 0; i < n; i++)
        kv_consider(&b, cands, i,
                    router_kvindex_overlap(idx, cands[i].worker, chain,
                                           n_chain),
                    block_size, w);
    if (overlap_p != NULL)
        *overlap_p = b.overlap;
    return b.best;
}

void router_kv_chain_cleanup(router_kv_chain_t *chain)
{
    bt_free(chain->hashes);
    memset(chain, 0, sizeof(*chain));
}

/* Makes c the chain of tokens under (id, bs, salt), computing it only
 * when c holds another. */
static bt_status_t chain_for(router_kv_chain_t *c, bt_blockhash_t id, int bs,
                             const void *salt, size_t salt_len,
                             const int *tokens, int n_tokens)
{
    int need = n_tokens > 0 ? n_tokens / bs : 0;

    if (c->block_size == bs && c->n_tokens == n_tokens &&
        bt_blockhash_eq(c->id, id))
        return BT_OK;
    if (need > c->cap) {
        uint64_t *grown = bt_realloc(c->hashes, (size_t)need * sizeof(uint64_t),
                                     "router_kv_chain");
        if (grown == NULL)
            return BT_ERR_NO_MEMORY;
        c->hashes = grown;
        c->cap = need;
    }
    c->n = bt_blockhash_chain64(bt_blockhash_root(id, salt, salt_len), tokens,
                                n_tokens, bs, c->hashes, need);
    c->id = id;
    c->block_size = bs;
    c->n_tokens = n_tokens;
    return BT_OK;
}

bt_status_t router_kv_pick_tokens(const router_kvindex_t *idx,
                                  const router_kv_candidate_t *cands, int n,
                                  const void *salt, size_t salt_len,
                                  const int *tokens, int n_tokens,
                                  router_kv_chain_t *memo,
                                  const router_kv_weights_t *w,
                                  int *pick_p, int *overlap_p)
{
    router_kv_chain_t local = { 0 };
    router_kv_chain_t *c = memo != NULL ? memo : &local;
    kv_best_t b = { -1, 0, 0 };
    bt_status_t status = BT_OK;

    for (int i = 0; i < n && status == BT_OK; i++) {
        bt_blockhash_t id;
        int bs = 0;
        int overlap = 0;

        /* Candidates of one model share a chain: computed once. */
        if (router_kvindex_identity(idx, cands[i].worker, &id, &bs)) {
            status = chain_for(c, id, bs, salt, salt_len, tokens, n_tokens);
            if (status == BT_OK)
                overlap = router_kvindex_overlap(idx, cands[i].worker,
                                                 c->hashes, c->n);
        }
        kv_consider(&b, cands, i, overlap, bs, w);
    }
    if (memo == NULL)
        router_kv_chain_cleanup(&local);
    if (status != BT_OK)
        return status;
    *pick_p = b.best;
    if (overlap_p != NULL)
        *overlap_p = b.overlap;
    return BT_OK;
}
