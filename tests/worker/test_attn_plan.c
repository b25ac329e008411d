/*
 * test_attn_plan.c - the decode attention's split planner
 * (cuda_attn_decode_plan, worker/cuda/kernels/attn_decode.cu), which is
 * host code and runs without a GPU:
 *   - every plan covers the keys within max_splits: n_splits x split_len
 *     >= max_kv, n_splits <= max_splits, n_splits the fewest for its
 *     split_len, split_len a power of two from 64 (above 4096 only when
 *     max_splits forces it);
 *   - the plans the device measured best (bench_kernels --dec-kv8
 *     --dec-splits, H100, FP8 KV at four blocks an SM, 2026-12-08; bf16
 *     at two: docs/PERFORMANCE.md), so a change to the cost model that
 *     moves them is seen before a device run.
 * CPU-only builds have no planner: the test passes after saying so.
 */
#include <stdio.h>

#include "bt_test.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/kernels/attn_decode.h"

#define N_SM 132 /* H100 / H200 */

static void plan(int n, int max_kv, int bps, int max_splits, int *ns,
                 int *sl)
{
    cuda_attn_decode_plan(n, max_kv, 32, 8, N_SM, bps, max_splits, ns, sl);
}

static void test_covers(void)
{
    static const int ns_max[] = {1, 2, 7, 64};
    for (int bps = 1; bps <= 4; bps++)
        for (int n = 1; n <= 512; n = n * 3 + 1)
            for (int kv = 1; kv <= 70000; kv = kv * 5 + 3)
                for (size_t m = 0; m < sizeof(ns_max) / sizeof(*ns_max);
                     m++) {
                    int ns = 0, sl = 0;
                    plan(n, kv, bps, ns_max[m], &ns, &sl);
                    BT_CHECK(ns >= 1 && ns <= ns_max[m]);
                    BT_CHECK(sl >= 64 && (sl & (sl - 1)) == 0);
                    BT_CHECK((long)ns * sl >= kv);
                    BT_CHECK((long)(ns - 1) * sl < kv);
                    BT_CHECK(sl <= 4096 || (long)ns_max[m] * 4096 < kv);
                }
}

static void expect(int n, int max_kv, int bps, int want_ns, int want_sl)
{
    int ns = 0, sl = 0;

    plan(n, max_kv, bps, 64, &ns, &sl);
    if (ns != want_ns || sl != want_sl)
        BT_TEST_FAIL("batch %d @%d, %d blocks an SM: %d x %d, measured "
                     "best %d x %d",
                     n, max_kv, bps, ns, sl, want_ns, want_sl);
}

static void test_measured(void)
{
    /* FP8 KV, four blocks an SM (µs a layer, H100): batch 1 32 x 64 11.6
     * (16 x 128 12.0, 1 x 2048 31.7); batch 8 4 x 512 20.7 (8 x 256
     * 21.4, 2 x 1024 22.3); batch 32 1 x 2048 51.8 (2 x 1024 54.7);
     * batch 64 and 256 @3072 one split (95.5, 541). */
    expect(1, 2048, 4, 32, 64);
    expect(8, 2048, 4, 4, 512);
    expect(32, 2048, 4, 1, 2048);
    expect(64, 2048, 4, 1, 2048);
    expect(256, 3072, 4, 1, 4096);
    /* bf16 K/V, two blocks an SM: batch 64 @2k one split of 2048 */
    expect(64, 2048, 2, 1, 2048);
}
#endif /* BATON_HAVE_CUDA */

int main(void)
{
#ifdef BATON_HAVE_CUDA
    test_covers();
    test_measured();
#else
    printf("test_attn_plan: CPU-only build, no CUDA planner\n");
#endif
    BT_TEST_PASS("test_attn_plan");
    return 0;
}
