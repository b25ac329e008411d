/* test_kv_promise.c - common/bt_kv_promise.h, the promise a decode worker
 * admits a request by and the router picks workers by: the whole growth
 * of a request with max tokens (to the context at most), the prompt and
 * --kv-unbounded-promise tokens for one asking past the context, the
 * prompt alone never less than one block; worked by hand from the rule
 * (blocks of 8, context 128 as aidreams260K's). */
#include "bt_kv_promise.h"
#include "bt_test.h"

int main(void)
{
    /* 16 prompt + 84 max tokens: 100 tokens, 13 blocks */
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 100, 128, 8, false, 16), 13);
    /* max tokens ending at the context: 16 blocks, whatever the
     * unbounded promise (it only concerns requests past the context) */
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 128, 128, 8, false, 16), 16);
    /* past the context: prompt (2) + 16 tokens (2) = 4; "all" (-1): the
     * context's 16; a promise larger than the context: the context */
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 138, 128, 8, true, 16), 4);
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 138, 128, 8, true, -1), 16);
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 138, 128, 8, true, 4096), 16);
    /* a promise of 0 (--kv-overcommit's, as registered): the prompt */
    BT_ASSERT_EQ(bt_kv_promise_blocks(17, 138, 128, 8, true, 0), 3);
    /* a prompt past the context counts the context */
    BT_ASSERT_EQ(bt_kv_promise_blocks(200, 300, 128, 8, true, 16), 16);
    BT_ASSERT_EQ(bt_kv_prompt_blocks(200, 128, 8), 16);
    /* no context known (ctx 0): no clamp, the unbounded promise */
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, (int64_t)1 << 30, 0, 16, true,
                                      2048), 1 + 128);
    BT_ASSERT_EQ(bt_kv_promise_blocks(16, 1000, 0, 16, false, 2048), 63);
    /* growth below the prompt (tokens already generated): the prompt;
     * an empty prompt still one block */
    BT_ASSERT_EQ(bt_kv_promise_blocks(40, 20, 128, 8, false, 16), 5);
    BT_ASSERT_EQ(bt_kv_prompt_blocks(0, 128, 8), 1);
    BT_ASSERT_EQ(bt_kv_promise_blocks(0, 0, 128, 8, false, 16), 1);
    BT_TEST_PASS("common/kv_promise: the admission promise, worked cases");
    return 0;
}
