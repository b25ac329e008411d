/*
 * decode_budget.h - how many prompt tokens an aggregated decode worker
 * may prefill in one step without pushing its running streams past a
 * time-per-output-token target (issue 36: at 256 streams, 2048-token
 * chunks made every decode step wait, TPOT p50 113 ms).
 *
 * The cost model is learned from the worker's own steps: the time of a
 * step with only decode rows (moving average), and the extra time one
 * prefill token adds (moving average of (step - decode step) / prefill
 * tokens).  A step may then prefill (target - decode step - margin) /
 * per-token tokens, where the margin is the model's mean absolute miss
 * on mixed steps (so noisy steps stay under the target, not around it),
 * at least a floor (prompts always move) and at most the step's
 * budget.  A stream's time per token is the step plus the loop's work
 * between two busy steps (poll, control messages, KV links, emission:
 * ~0.5 ms on the H200 at 256 streams, where TPOT p50 sat 0.6 ms above a
 * 50 ms target), so that is learned too and kept out of the room.  Under
 * load no step is decode-only (prompts always wait): the decode step is
 * then never learned, the per-token cost carries the decode rows too,
 * and the margin still applies.  With no decode rows, or no target,
 * prefill takes the budget: only time to first token is at stake then.
 */
#ifndef BT_DECODE_DECODE_BUDGET_H
#define BT_DECODE_DECODE_BUDGET_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double decode_ms;    /* a step with decode rows only */
    double token_ms;     /* what one prefill token adds to a step */
    double miss_ms;      /* mean |step - model| of mixed steps: the margin */
    double between_ms;   /* the loop's time from one busy step to the next */
    bool have_decode;
    bool have_token;
    bool have_miss;
    bool have_between;
} decode_budget_t;

void decode_budget_init(decode_budget_t *b);

/* Learns from one finished step: n_decode decode rows, n_prefill prompt
 * tokens, step_ms of wall time. */
void decode_budget_observe(decode_budget_t *b, int n_decode, int n_prefill,
                           double step_ms);

/* Learns the loop's time between the end of a step that left streams
 * running and the start of the next one. */
void decode_budget_observe_between(decode_budget_t *b, double gap_ms);

/* Prompt tokens the next step may take with n_decode decode rows:
 * `max_tokens` when target_ms <= 0 or n_decode == 0, else the model's
 * answer clamped to [min_tokens, max_tokens]. */
int decode_budget_prefill_tokens(const decode_budget_t *b, int n_decode,
                                 double target_ms, int max_tokens,
                                 int min_tokens);

/* The prompt budget cut so that the step (n_decode rows + the prompt
 * tokens) ends at a multiple of the backend's quantum
 * (backend_step_quantum: its GEMMs' token tiles; a step just past a
 * multiple pays a whole tile, and at 4,096-row outputs a wave, for a few
 * tokens), unless that takes it below min_tokens; quantum <= 1: as is. */
int decode_budget_round_step(int n_decode, int prefill_tokens, int quantum,
                             int min_tokens);

#ifdef __cplusplus
}
#endif
#endif /* BT_DECODE_DECODE_BUDGET_H */
