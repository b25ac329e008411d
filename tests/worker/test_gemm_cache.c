/*
 * test_gemm_cache.c - the GEMM tuner's cache file (worker/cuda/
 * gemm_cache.h): what gemm_cache_format writes parses back to the same
 * entries, another key's file holds none, and every malformed form --
 * bad header, version, field, count, duplicate, NUL, truncation at every
 * byte -- is an error or a shorter valid file, never a crash or a wrong
 * entry.  The device side (install, AlgoCheck, merge on save) runs in
 * tests/gpu/test_cuda_model.c.
 */
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_status.h"
#include "bt_test.h"
#include "cuda/gemm_cache.h"

#define KEY "NVIDIA_H200/sm90/132sm/60MB-L2/cublasLt-120900/build-1/env-2"

static gemm_cache_entry_t entry(int bucket, int n_out, int n_in, int f32,
                                const char *choice, float us)
{
    gemm_cache_entry_t e;

    memset(&e, 0, sizeof(e));
    e.bucket = bucket;
    e.n_out = n_out;
    e.n_in = n_in;
    e.out_f32 = f32;
    snprintf(e.choice, sizeof(e.choice), "%s", choice);
    e.us = us;
    e.lt = (choice[0] == 'l' || choice[0] == 'p') && choice[1] == 't';
    for (int w = 0; e.lt && w < GEMM_CACHE_ALGO_WORDS; w++)
        e.algo[w] = 0x0123456789abcdefull * (uint64_t)(w + 1) + (uint64_t)n_out;
    return e;
}

static int parse(const char *text, const char *key, gemm_cache_entry_t *out,
                 int max, int *n)
{
    bt_status_t st = gemm_cache_parse(text, strlen(text), key, out, max, n);
    bt_error_clear();
    return (int)st;
}

static void test_round_trip(void)
{
    enum { N_IN = 10 };
    gemm_cache_entry_t in[N_IN], out[N_IN + 4];
    char *text;
    size_t len;
    int n;

    in[0] = entry(1, 6144, 4096, 0, "rows", 11.25f);
    in[1] = entry(64, 6144, 4096, 0, "lt3", 17.0f);
    in[2] = entry(2048, 128256, 4096, 1, "lt0", 251.5f);
    in[3] = entry(64, 28672, 4096, 0, "wg", -1.0f); /* a BIG_PICK pick */
    /* the FP8 GEMM's picks: the same (T, O, I, out dtype) as a bf16 one
     * is another entry, and so is the accumulating form */
    in[4] = entry(2048, 6144, 4096, 0, "lt5", 40.0f);
    in[4].kind = GEMM_CACHE_KIND_FP8_VEC;
    in[5] = entry(2048, 4096, 14336, 1, "lt1", 60.5f);
    in[5].kind = GEMM_CACHE_KIND_FP8_VEC;
    in[5].accumulate = 1;
    in[6] = entry(2048, 4096, 14336, 1, "lt2", 61.0f);
    in[6].kind = GEMM_CACHE_KIND_FP8_VEC;
    in[7] = entry(2048, 6144, 4096, 0, "lt0", 80.0f); /* in[4]'s bf16 twin */
    /* decode's FP8 picks: the plain plan's algorithm, the skinny GEMM */
    in[8] = entry(64, 4096, 14336, 1, "pt1", 27.2f);
    in[8].kind = GEMM_CACHE_KIND_FP8_VEC;
    in[8].accumulate = 1;
    in[9] = entry(64, 28672, 4096, 0, "skinny", 49.2f);
    in[9].kind = GEMM_CACHE_KIND_FP8_VEC;
    BT_ASSERT_OK(gemm_cache_format(KEY, in, N_IN, &text, &len));
    BT_ASSERT_EQ(strlen(text), len);
    BT_CHECK(strstr(text, " fp8v-bf16 lt5 ") != NULL);
    BT_CHECK(strstr(text, " fp8v-f32+ lt1 ") != NULL);
    BT_CHECK(strstr(text, " fp8v-f32 lt2 ") != NULL);
    BT_CHECK(strstr(text, " fp8v-f32+ pt1 27.2") != NULL);
    BT_CHECK(strstr(text, " fp8v-bf16 skinny 49.2") != NULL);
    BT_ASSERT_OK(gemm_cache_parse(text, len, KEY, out, N_IN + 4, &n));
    BT_ASSERT_EQ(n, N_IN);
    for (int i = 0; i < N_IN; i++) {
        BT_ASSERT_EQ(out[i].bucket, in[i].bucket);
        BT_ASSERT_EQ(out[i].n_out, in[i].n_out);
        BT_ASSERT_EQ(out[i].n_in, in[i].n_in);
        BT_ASSERT_EQ(out[i].out_f32, in[i].out_f32);
        BT_ASSERT_EQ(out[i].kind, in[i].kind);
        BT_ASSERT_EQ(out[i].accumulate, in[i].accumulate);
        BT_ASSERT_STREQ(out[i].choice, in[i].choice);
        BT_ASSERT_NEAR(out[i].us, in[i].us, 1e-3);
        BT_ASSERT_EQ(out[i].lt, in[i].lt);
        for (int w = 0; w < GEMM_CACHE_ALGO_WORDS; w++)
            BT_CHECK(out[i].algo[w] == in[i].algo[w]);
    }
    /* max bounds the entries kept */
    BT_ASSERT_OK(gemm_cache_parse(text, len, KEY, out, 2, &n));
    BT_ASSERT_EQ(n, 2);
    /* another device / build: a stale file, no entries, not an error */
    BT_ASSERT_OK(gemm_cache_parse(text, len, KEY "x", out, 8, &n));
    BT_ASSERT_EQ(n, 0);
    /* every truncation: an error, or a valid prefix of the entries (a
     * cut inside "fp8v-f32+" may leave "fp8v-f32": only the kind and the
     * output are then sure) */
    for (size_t cut = 0; cut < len; cut++) {
        bt_status_t st = gemm_cache_parse(text, cut, KEY, out, N_IN + 4, &n);
        bt_error_clear();
        if (st != BT_OK) {
            BT_ASSERT_EQ(n, 0);
            continue;
        }
        BT_CHECK(n <= N_IN);
        for (int i = 0; i < n; i++) {
            BT_ASSERT_EQ(out[i].n_out, in[i].n_out);
            BT_ASSERT_EQ(out[i].lt, in[i].lt);
            BT_ASSERT_EQ(out[i].kind, in[i].kind);
        }
    }
    bt_free(text);
    /* an empty file list formats to a header that parses to nothing */
    BT_ASSERT_OK(gemm_cache_format(KEY, NULL, 0, &text, &len));
    BT_ASSERT_OK(gemm_cache_parse(text, len, KEY, out, 8, &n));
    BT_ASSERT_EQ(n, 0);
    bt_free(text);
    BT_TEST_PASS("gemm cache round trip, stale key, truncations");
}

static void test_malformed(void)
{
    static const char *const bad[] = {
        "",                                             /* no header */
        "# only a comment\n",
        "baton-gemm-cache\n",
        "baton-gemm-cache 2 " KEY "\n",                 /* version */
        "baton-gemm-cache x " KEY "\n",
        "baton-gemm-cache 1 " KEY " extra\n",
        "other-cache 1 " KEY "\n",
        "1 6144 4096 bf16 rows 1.0\nbaton-gemm-cache 1 " KEY "\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows\n",     /* count */
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows 1.0 7\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 lt0 1.0\n",  /* no algo */
        "baton-gemm-cache 1 " KEY "\n64 4096 14336 fp8v-f32+ pt1 27.2\n",
        "baton-gemm-cache 1 " KEY
        "\n64 28672 4096 fp8v-bf16 skinny 49.2 1 2 3 4 5 6 7 8\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 lt0 1 1 2 3 4 5 6 7\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows 1 1 2 3 4 5 6 7 8\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 lt0 1 1 2 3 4 5 6 7 g\n",
        "baton-gemm-cache 1 " KEY
        "\n1 6144 4096 bf16 lt0 1 1 2 3 4 5 6 7 11112222333344445\n",
        "baton-gemm-cache 1 " KEY "\n0 6144 4096 bf16 rows 1.0\n",  /* ranges */
        "baton-gemm-cache 1 " KEY "\n1 -6144 4096 bf16 rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 99999999 bf16 rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n65537 6144 4096 bf16 rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 f16 rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16+ rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 fp8v rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 fp8v-f16 lt0 1 1 2 3 4 5 6 7 8\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 fp8v-bf16++ rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 FP8V-BF16 rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 Rows 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 row$ 1.0\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 averyveryverylongname 1\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows nan\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows inf\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows -5\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows 1.0x\n",
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 bf16 rows 1.0\n"
        "1 6144 4096 bf16 mma1 2.0\n",                  /* duplicate */
        "baton-gemm-cache 1 " KEY "\n1 6144 4096 fp8v-f32+ rows 1.0\n"
        "1 6144 4096 fp8v-f32+ mma1 2.0\n",
        "baton-gemm-cache 1 " KEY "\nbaton-gemm-cache 1 " KEY "\n",
    };
    gemm_cache_entry_t out[8];
    char big[600];
    int n = -1;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n = -1;
        if (parse(bad[i], KEY, out, 8, &n) != BT_ERR_FORMAT)
            BT_TEST_FAIL("case %zu parsed: %s", i, bad[i]);
        BT_ASSERT_EQ(n, 0);
    }
    /* a NUL inside the text */
    {
        static const char t[] = "baton-gemm-cache 1 " KEY "\n1 6\0 4 bf16 rows 1\n";
        BT_ASSERT_EQ(gemm_cache_parse(t, sizeof(t) - 1, KEY, out, 8, &n),
                     BT_ERR_FORMAT);
        bt_error_clear();
    }
    /* a key longer than GEMM_CACHE_KEY_MAX */
    memset(big, 'k', sizeof(big));
    memcpy(big, "baton-gemm-cache 1 ", 19);
    big[sizeof(big) - 1] = '\0';
    BT_ASSERT_EQ(parse(big, KEY, out, 8, &n), BT_ERR_FORMAT);
    /* accepted forms: comments, blank lines, CRLF, tabs, f32 output */
    BT_ASSERT_OK(parse("# c\n\nbaton-gemm-cache 1 " KEY "\r\n"
                       "# another\n2\t6144 4096 f32 mma1 3.5\r\n"
                       "2 6144 4096 bf16 mma1 3.5", KEY, out, 8, &n));
    BT_ASSERT_EQ(n, 2);
    BT_ASSERT_EQ(out[0].out_f32, 1);
    BT_ASSERT_EQ(out[1].out_f32, 0);
    BT_ASSERT_STREQ(out[1].choice, "mma1");
    /* one shape in every kind: four entries, no duplicate */
    BT_ASSERT_OK(parse("baton-gemm-cache 1 " KEY "\n"
                       "2 6144 4096 f32 rows 1\n2 6144 4096 fp8v-f32 rows 1\n"
                       "2 6144 4096 fp8v-f32+ rows 1\n"
                       "2 6144 4096 fp8v-bf16+ rows 1\n", KEY, out, 8, &n));
    BT_ASSERT_EQ(n, 4);
    BT_ASSERT_EQ(out[0].kind, GEMM_CACHE_KIND_DENSE);
    BT_ASSERT_EQ(out[1].kind, GEMM_CACHE_KIND_FP8_VEC);
    BT_ASSERT_EQ(out[1].accumulate, 0);
    BT_ASSERT_EQ(out[2].accumulate, 1);
    BT_ASSERT_EQ(out[2].out_f32, 1);
    BT_ASSERT_EQ(out[3].out_f32, 0);
    BT_ASSERT_EQ(out[3].accumulate, 1);
    /* duplicates under another key are not this process's concern */
    BT_ASSERT_OK(parse("baton-gemm-cache 1 other\n1 6 4 bf16 rows 1\n"
                       "1 6 4 bf16 rows 1\n", KEY, out, 8, &n));
    BT_ASSERT_EQ(n, 0);
    BT_TEST_PASS("gemm cache malformed files rejected");
}

static void test_format_rejects(void)
{
    gemm_cache_entry_t e = entry(1, 6144, 4096, 0, "rows", 1.0f);
    char *text = (char *)1;
    size_t len = 1;

    BT_ASSERT_EQ(gemm_cache_format("has space", &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(text == NULL && len == 0);
    BT_ASSERT_EQ(gemm_cache_format("", &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    e.lt = 1; /* "rows" with an algorithm: inconsistent */
    BT_ASSERT_EQ(gemm_cache_format(KEY, &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    e = entry(1, 6144, 4096, 0, "rows", 1.0f);
    e.accumulate = 1; /* accumulate is the FP8 kinds' only */
    BT_ASSERT_EQ(gemm_cache_format(KEY, &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    e.kind = 2;
    BT_ASSERT_EQ(gemm_cache_format(KEY, &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    e = entry(0, 6144, 4096, 0, "rows", 1.0f);
    BT_ASSERT_EQ(gemm_cache_format(KEY, &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    e = entry(1, 6144, 4096, 0, "rows", NAN);
    BT_ASSERT_EQ(gemm_cache_format(KEY, &e, 1, &text, &len),
                 BT_ERR_INVALID_ARG);
    bt_error_clear();
    BT_TEST_PASS("gemm cache format rejects what it cannot write back");
}

int main(void)
{
    size_t live = bt_alloc_live_count();

    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    test_round_trip();
    test_malformed();
    test_format_rejects();
    BT_ASSERT_EQ(bt_alloc_live_count(), live);
    return 0;
}
