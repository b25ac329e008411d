/*
 * bt_kv_promise.h - the KV blocks a decode worker promises a request at
 * admission (issue 36), one rule for the worker that admits by it
 * (decode_resv.c) and the router that picks workers by it
 * (router_policy.c), so that the router never sends a request the worker
 * must refuse.
 *
 * A request of n_tokens prompt tokens that may grow to `total` tokens
 * (prompt + max tokens) is promised blocks for min(total, ctx) tokens,
 * its prompt at least; one that asks past the context (past_ctx: no
 * max_tokens, "until the context") is promised its prompt and
 * `unbounded` tokens (--kv-unbounded-promise) instead when unbounded >= 0
 * (< 0: the whole context).  ctx <= 0: no context known, no clamp.
 * Overcommitting workers admit on the prompt alone: the caller's case.
 */
#ifndef BT_COMMON_BT_KV_PROMISE_H
#define BT_COMMON_BT_KV_PROMISE_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_util.h"

/* Blocks for the prompt alone (at least one). */
static inline int64_t bt_kv_prompt_blocks(int64_t n_tokens, int64_t ctx,
                                          int64_t block_size)
{
    const int64_t n = ctx > 0 ? BT_MIN(n_tokens, ctx) : n_tokens;

    return BT_MAX(1, BT_DIV_UP(n, block_size));
}

/* Blocks of the promise (see the header). */
static inline int64_t bt_kv_promise_blocks(int64_t n_tokens, int64_t total,
                                           int64_t ctx, int64_t block_size,
                                           bool past_ctx, int64_t unbounded)
{
    const int64_t need = bt_kv_prompt_blocks(n_tokens, ctx, block_size);
    const int64_t growth = BT_MAX(
        need, BT_DIV_UP(ctx > 0 ? BT_MIN(total, ctx) : total, block_size));

    if (past_ctx && unbounded >= 0)
        return BT_MIN(growth, need + BT_DIV_UP(unbounded, block_size));
    return growth;
}

#endif /* BT_COMMON_BT_KV_PROMISE_H */
