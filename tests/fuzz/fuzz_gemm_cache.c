/*
 * fuzz_gemm_cache.c - gemm_cache_parse on arbitrary bytes (the GEMM
 * tuner's cache file, worker/cuda/gemm_cache.h), under two keys: the
 * corpus's and one it never holds.  Whatever parses must format and
 * parse back to the same entries.
 */
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cuda/gemm_cache.h"

#define FUZZ_KEY "NVIDIA_H200/sm90/132sm/60MB-L2/cublasLt-120900/b-1/e-2"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static gemm_cache_entry_t out[64], back[64];
    char *text;
    size_t len;
    int n = 0, m = 0;

    if (gemm_cache_parse((const char *)data, size, "no-such-key", out, 64,
                         &n) == BT_OK)
        BT_ASSERT(n == 0);
    bt_error_clear();
    if (gemm_cache_parse((const char *)data, size, FUZZ_KEY, out, 64, &n) !=
        BT_OK) {
        bt_error_clear();
        return 0;
    }
    BT_ASSERT(n >= 0 && n <= 64);
    BT_ASSERT(gemm_cache_format(FUZZ_KEY, out, n, &text, &len) == BT_OK);
    BT_ASSERT(gemm_cache_parse(text, len, FUZZ_KEY, back, 64, &m) == BT_OK);
    BT_ASSERT(m == n);
    for (int i = 0; i < n; i++) {
        BT_ASSERT(back[i].bucket == out[i].bucket);
        BT_ASSERT(back[i].n_out == out[i].n_out);
        BT_ASSERT(back[i].n_in == out[i].n_in);
        BT_ASSERT(back[i].lt == out[i].lt);
        BT_ASSERT(back[i].out_f32 == out[i].out_f32);
        BT_ASSERT(back[i].kind == out[i].kind);
        BT_ASSERT(back[i].accumulate == out[i].accumulate);
        BT_ASSERT(strcmp(back[i].choice, out[i].choice) == 0);
        BT_ASSERT(memcmp(back[i].algo, out[i].algo, sizeof(out[i].algo)) == 0);
    }
    bt_free(text);
    return 0;
}
