/*
 * test_decode_budget.c - the aggregated decode step's prefill budget
 * under a TPOT target (decode/decode_budget.h): learned from synthetic
 * steps whose cost is a known line, it must give the token count that
 * keeps a step at the target, never below the floor nor above the
 * budget, and the whole budget when nothing decodes or no target is set;
 * the loop's time between busy steps comes out of the room.
 */
#include "bt_test.h"
#include "decode_budget.h"

/* A step of this "machine": 20 ms for the decode rows, 0.01 ms a prompt
 * token (plus 2 ms of fixed cost when the step has only prompt rows). */
static double machine(int n_decode, int n_prefill)
{
    return (n_decode > 0 ? 20.0 : 2.0) + 0.01 * n_prefill;
}

/* Deterministic noise, uniform in [-3, 3] ms. */
static double noise(unsigned *state)
{
    *state = *state * 1103515245u + 12345u;
    return ((*state >> 8) % 6001) / 1000.0 - 3.0;
}

/* Closed loop on the noisy machine: each mixed step of 64 rows takes the
 * budget's answer; with `decode_steps`, a decode-only step follows each.
 * The steps after the first `settle` are counted: how many took longer
 * than the 50 ms target, and their mean. */
static void closed_loop(decode_budget_t *b, unsigned state, bool decode_steps,
                        int steps, int settle, int *over_p, double *mean_p)
{
    int over = 0;
    double sum = 0;

    for (int i = 0; i < steps; i++) {
        int n = decode_budget_prefill_tokens(b, 64, 50.0, 8192, 128);
        double ms = machine(64, n) + noise(&state);
        decode_budget_observe(b, 64, n, ms);
        if (decode_steps)
            decode_budget_observe(b, 64, 0, machine(64, 0));
        if (i >= settle) {
            over += ms > 50.0;
            sum += ms;
        }
    }
    *over_p = over;
    *mean_p = sum / (steps - settle);
}

/* Aimed at the target itself, half the steps would land above it (the
 * H200's TPOT p99 of 50.8 ms under a 50 ms target); the margin must keep
 * most below and the mean a margin under it. */
static void check_noisy_machine(void)
{
    decode_budget_t b;
    int over;
    double mean;

    decode_budget_init(&b);
    for (int i = 0; i < 20; i++) {
        decode_budget_observe(&b, 64, 0, machine(64, 0));
        decode_budget_observe(&b, 64, 2048, machine(64, 2048));
    }
    closed_loop(&b, 7, true, 2000, 0, &over, &mean);
    /* mean |noise| is 1.5 ms: ~25% of the steps above the target */
    BT_CHECK(over < 2000 * 35 / 100);
    BT_CHECK(mean < 49.0 && mean > 47.0);
}

/* Under load every step carries prompt tokens (256 streams, prompts
 * always waiting): after the cold burst's prefill-only steps the model
 * never sees a decode-only step, so it has no decode_ms.  The margin
 * must still keep the steps a mean miss under the target (it did not:
 * the H200 served TPOT p50 50.4 ms, p99 51.0, under a 50 ms target). */
static void check_mixed_only(void)
{
    decode_budget_t b;
    int over;
    double mean;

    decode_budget_init(&b);
    for (int i = 0; i < 4; i++) /* the cold burst: prompts only */
        decode_budget_observe(&b, 0, 8192, machine(0, 8192));
    closed_loop(&b, 11, false, 2000, 500, &over, &mean);
    BT_CHECK(!b.have_decode);
    BT_CHECK(over < 1500 * 35 / 100);
    BT_CHECK(mean < 49.0 && mean > 46.0);
}

/* The loop's time between busy steps is part of every stream's TPOT:
 * 5 ms of it leaves (50 - 20 - 5) / 0.01 = 2500 tokens, not 3000. */
static void check_between(void)
{
    decode_budget_t b;
    int n;

    decode_budget_init(&b);
    for (int i = 0; i < 50; i++) {
        decode_budget_observe(&b, 64, 0, machine(64, 0));
        decode_budget_observe(&b, 64, 2048, machine(64, 2048));
    }
    n = decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128);
    BT_CHECK(n >= 2900 && n <= 3100);
    for (int i = 0; i < 50; i++)
        decode_budget_observe_between(&b, 5.0);
    n = decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128);
    BT_CHECK(n >= 2400 && n <= 2600);
    /* a step plus the time between stays within the target */
    BT_CHECK(machine(64, n) + 5.0 <= 51.0);
    decode_budget_observe_between(&b, -1.0); /* ignored */
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128), n);
}

int main(void)
{
    decode_budget_t b;
    int n;

    decode_budget_init(&b);
    /* Nothing learned yet: the whole budget. */
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128), 8192);
    for (int i = 0; i < 50; i++) {
        decode_budget_observe(&b, 64, 0, machine(64, 0));
        decode_budget_observe(&b, 64, 2048, machine(64, 2048));
    }
    /* 50 ms target: (50 - 20) / 0.01 = 3000 tokens. */
    n = decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128);
    BT_CHECK(n >= 2900 && n <= 3100);
    /* The step at that size stays within the target (and near it). */
    BT_CHECK(machine(64, n) <= 51.0 && machine(64, n) >= 48.0);
    /* Clamps: the budget above, the floor below (a target under the
     * decode step itself still lets prompts move). */
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 500.0, 8192, 128), 8192);
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 15.0, 8192, 128), 128);
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 21.0, 8192, 128), 128);
    /* No decode rows or no target: only TTFT matters, the whole budget. */
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 0, 50.0, 8192, 128), 8192);
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 0.0, 8192, 128), 8192);
    /* A floor above the budget is cut to the budget. */
    BT_ASSERT_EQ(decode_budget_prefill_tokens(&b, 64, 15.0, 100, 128), 100);
    /* The model follows a slower machine (the decode step doubles). */
    for (int i = 0; i < 60; i++) {
        decode_budget_observe(&b, 64, 0, 40.0);
        decode_budget_observe(&b, 64, 1000, 40.0 + 10.0);
    }
    n = decode_budget_prefill_tokens(&b, 64, 50.0, 8192, 128);
    BT_CHECK(n >= 900 && n <= 1100);
    /* The step ends at the quantum's multiple below (124 rows + 1,956
     * prompt tokens = 2,080 -> 2,048), never under the floor, never up,
     * unchanged on a multiple or without a quantum. */
    BT_ASSERT_EQ(decode_budget_round_step(124, 1956, 128, 128), 1924);
    BT_ASSERT_EQ(decode_budget_round_step(124, 1924, 128, 128), 1924);
    BT_ASSERT_EQ(decode_budget_round_step(124, 1956, 1, 128), 1956);
    BT_ASSERT_EQ(decode_budget_round_step(124, 200, 128, 128), 132);
    BT_ASSERT_EQ(decode_budget_round_step(124, 130, 128, 128), 130);
    BT_ASSERT_EQ(decode_budget_round_step(0, 8192, 128, 128), 8192);
    BT_ASSERT_EQ(decode_budget_round_step(5, 8000, 128, 128), 7931);
    check_noisy_machine();
    check_mixed_only();
    check_between();
    BT_TEST_PASS("decode/budget: prefill tokens per step under a TPOT target");
    return 0;
}
