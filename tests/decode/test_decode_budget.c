/*
 * test_decode_budget.c - the aggregated decode step's prefill budget
 * under a TPOT target (decode/decode_budget.h): learned from synthetic
 * steps whose cost is a known line, it must give the token count that
 * keeps a step at the target, never below the floor nor above the
 * budget, and the whole budget when nothing decodes or no target is set.
 */
#include "bt_test.h"
#include "decode_budget.h"

/* A step of this "machine": 20 ms for the decode rows, 0.01 ms a prompt
 * token (plus 2 ms of fixed cost when the step has only prompt rows). */
static double machine(int n_decode, int n_prefill)
{
    return (n_decode > 0 ? 20.0 : 2.0) + 0.01 * n_prefill;
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
    BT_TEST_PASS("decode/budget: prefill tokens per step under a TPOT target");
    return 0;
}
