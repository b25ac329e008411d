/*
 * decode_budget.c - the prefill token budget of an aggregated decode
 * step under a TPOT target (see decode_budget.h).
 */
#include "decode_budget.h"

#include <string.h>

#define BUDGET_ALPHA 0.2 /* weight of the newest step in the averages */

void decode_budget_init(decode_budget_t *b)
{
    memset(b, 0, sizeof(*b));
}

static double ewma(double old, double x, bool have)
{
    return have ? (1.0 - BUDGET_ALPHA) * old + BUDGET_ALPHA * x : x;
}

void decode_budget_observe(decode_budget_t *b, int n_decode, int n_prefill,
                           double step_ms)
{
    double extra;

    if (step_ms < 0)
        return;
    if (n_prefill <= 0) {
        if (n_decode > 0) {
            b->decode_ms = ewma(b->decode_ms, step_ms, b->have_decode);
            b->have_decode = true;
        }
        return;
    }
    /* How far the model missed this step: its mean absolute miss is the
     * margin the budget keeps below the target.  Under load no step is
     * decode-only (prompts always wait), so the model may never learn
     * decode_ms: the per-token cost then carries the decode rows too
     * (below), and the margin must not wait for decode_ms (it did: the
     * H200's TPOT p50 sat at 50.4 ms under a 50 ms target, p99 51.0). */
    if (n_decode > 0 && b->have_token) {
        double miss = step_ms - ((b->have_decode ? b->decode_ms : 0) +
                                 n_prefill * b->token_ms);
        b->miss_ms = ewma(b->miss_ms, miss < 0 ? -miss : miss, b->have_miss);
        b->have_miss = true;
    }
    /* The prefill tokens' share: what the step took beyond a decode-only
     * step (all of it when the step had no decode rows). */
    extra = n_decode > 0 && b->have_decode ? step_ms - b->decode_ms : step_ms;
    if (extra < 0)
        extra = 0;
    b->token_ms = ewma(b->token_ms, extra / n_prefill, b->have_token);
    b->have_token = true;
}

void decode_budget_observe_between(decode_budget_t *b, double gap_ms)
{
    if (gap_ms < 0)
        return;
    b->between_ms = ewma(b->between_ms, gap_ms, b->have_between);
    b->have_between = true;
}

int decode_budget_prefill_tokens(const decode_budget_t *b, int n_decode,
                                 double target_ms, int max_tokens,
                                 int min_tokens)
{
    double room, n;

    if (target_ms <= 0 || n_decode == 0 || !b->have_token ||
        b->token_ms <= 0)
        return max_tokens;
    if (min_tokens > max_tokens)
        min_tokens = max_tokens;
    /* Aiming the step at the target itself puts half the mixed steps
     * above it (H200, 2048/128 at 256 streams: TPOT p99 50.8 ms under a
     * 50 ms target); aiming one mean miss below keeps most under it. */
    room = target_ms - (b->have_decode ? b->decode_ms : 0) -
           (b->have_miss ? b->miss_ms : 0) -
           (b->have_between ? b->between_ms : 0);
    if (room <= 0)
        return min_tokens;
    n = room / b->token_ms;
    if (n < min_tokens)
        return min_tokens;
    if (n > max_tokens)
        return max_tokens;
    return (int)n;
}

int decode_budget_round_step(int n_decode, int prefill_tokens, int quantum,
                             int min_tokens)
{
    int cut;

    if (quantum <= 1)
        return prefill_tokens;
    cut = (n_decode + prefill_tokens) / quantum * quantum - n_decode;
    return cut >= min_tokens && cut < prefill_tokens ? cut : prefill_tokens;
}
