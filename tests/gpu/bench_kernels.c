/*
 * bench_kernels.c - kernel timings behind issue 4's targets, ON THE
 * DEVICE MACHINE (tests/gpu/run_gpu_tc.sh and round scripts run it):
 *
 *   bench_kernels [--gemv] [--attn] [--attn-hd 64|128] [--attn-runs]
 *                 [--small] [--dec] [--dec-kv8] [--dec-splits]
 *                 [--dec-only B:CTX]
 *                 [--toks L] [--reps N]
 *   (default: all)
 *
 * --gemv: every GEMV variant of kernels/gemv.h, cuBLASLt's heuristic
 *   algorithm (BT_GEMV_FORCE=lt through worker_gemm) and the autotuned
 *   worker_gemm on the Llama-3-8B projections (qkv 6144x4096, o 4096x4096,
 *   gate|up 28672x4096, down 4096x14336, lm_head 128256x4096 with f32
 *   out) at 1..128 tokens: median of N runs, each after an L2 flush
 *   (cuda_l2_flush: a read, clean lines); TB/s counts the weight bytes.
 *   Then the per-step GEMM sum (32 layers + classifier) of the best
 *   variant and of the tuned choice.
 * --attn: cuda_attn_prefill on one causal prompt of 512/2048/8192 tokens
 *   (32 heads, 8 KV heads, head 128, blocks of 16): TFLOP/s of the causal
 *   FLOPs (4 x heads x hd x P(P+1)/2) against 790; the default kernel
 *   (fa2pp128 at head 128), then fa2pp and fa2wqv (cuda_attn_prefill_fa2
 *   called directly); then over an FP8 (E4M3) KV cache (--kv-dtype fp8:
 *   d_kv_scale): the default ("kv8 default", fa2wqv on sm_90a) and fa2
 *   on mma.sync ("kv8 fa2").  --attn-hd 64: the same at head 64
 *   (Llama-3.2-1B's shape).
 *   The cache blocks are in reverse order (no two pages adjacent, as in
 *   a used pool); --attn-runs: in order, as a fresh pool hands them out
 *   (the ping-pong kernels then copy whole tiles as one box).
 * --dec: decode attention at batch x context (KV TB/s), with the split
 *   planner's splits ("split"); the last two cases are serving steps at
 *   2048/2048 (bf16: 199 rows, FP8 KV: 342, at ~3K context).
 * --dec-kv8: the same over an FP8 (E4M3) KV cache (d_kv_scale; the
 *   bytes read are half).
 * --dec-splits: with --dec / --dec-kv8, each case again at 1..32
 *   splits (each a multiple of 64 keys; "sweep" rows): how far the
 *   planner's pick is from the fastest.
 * --small: RMSNorm, SwiGLU and RoPE+KV write at 2048 tokens (GB/s).
 * --toks LIST: only these token counts in --gemv.
 * --dec-only B:CTX: --dec's case of batch B at context CTX only (the
 *   kernels of one case under a profiler: each pass launches its kernel
 *   once, then --reps times); a B:CTX not in the list runs with the
 *   8B's heads (32 query, 8 KV).
 * Lines start with "gemv ", "gemvsum ", "attn ", "small " for grepping.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_switches.h"
#include "gemm.h"
#include "kernels/attn_decode.h"
#include "kernels/attn_prefill.h"
#include "kernels/gemv.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_kv.h"
#include "kernels/swiglu.h"

#define CK(_e)                                                              \
    do {                                                                    \
        cudaError_t _r = (_e);                                              \
        if (_r != cudaSuccess) {                                            \
            fprintf(stderr, "FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #_e, \
                    cudaGetErrorString(_r));                                \
            exit(1);                                                        \
        }                                                                   \
    } while (0)
#define OK(_e)                                                              \
    do {                                                                    \
        if ((_e) != BT_OK) {                                                \
            fprintf(stderr, "FAIL %s:%d %s\n", __FILE__, __LINE__, #_e);    \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static int g_reps = 10;
static int g_dec_b, g_dec_ctx; /* --dec-only B:CTX (0: every case) */
static int g_dec_kv8;          /* --dec-kv8 */
static int g_dec_splits;       /* --dec-splits */
static char g_toks[256];   /* --toks: comma list of token counts, "" all */

/* True when t is selected by --toks. */
static int tok_selected(int t)
{
    char buf[300];

    if (g_toks[0] == '\0')
        return 1;
    snprintf(buf, sizeof(buf), ",%s,", g_toks);
    char key[16];
    snprintf(key, sizeof(key), ",%d,", t);
    return strstr(buf, key) != NULL;
}
static void *g_flush;
static cudaEvent_t g_e0, g_e1;

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void flush_l2(void)
{
    if (cuda_l2_flush(g_flush, 256u << 20, 0) != BT_OK) {
        fprintf(stderr, "bench_kernels: L2 flush failed\n");
        exit(1);
    }
}

/* What one timed run does. */
typedef struct {
    int kind;          /* 0 gemv variant, 1 worker_gemm (forced lt), 2 tuned */
    int k;
    worker_gemm_ctx_t *g;
    int t, o, i;
    void *x, *w, *y;
    cuda_dtype_t out_dt;
} gemv_job_t;

/* Split-K scratch of the tc variant (as worker_gemm's context holds). */
static cuda_gemv_ws_t g_gemv_ws;

static void job_run(const gemv_job_t *j)
{
    if (j->kind == 0) {
        if (g_gemv_ws.d_cnt == NULL) {
            g_gemv_ws.part_bytes = 32u << 20;
            g_gemv_ws.n_cnt = 4096;
            CK(cudaMalloc((void **)&g_gemv_ws.d_part, g_gemv_ws.part_bytes));
            CK(cudaMalloc((void **)&g_gemv_ws.d_cnt,
                          g_gemv_ws.n_cnt * sizeof(int)));
            CK(cudaMemset(g_gemv_ws.d_cnt, 0, g_gemv_ws.n_cnt * sizeof(int)));
        }
        OK(cuda_gemv_run((cuda_gemv_kernel_t)j->k, j->t, j->o, j->i, j->x,
                         j->w, j->y, j->out_dt, false, &g_gemv_ws, 0));
    } else {
        OK(worker_gemm(j->g, j->t, j->o, j->i, j->x, j->w, CUDA_DT_BF16,
                       j->y, j->out_dt, false, 0));
    }
}

/* Kind 1 runs worker_gemm with BT_GEMV_FORCE=lt: set (on) or unset
 * around its runs, the switch table re-read (cuda_switches.h). */
static void job_force_lt(const gemv_job_t *j, int on)
{
    if (j->kind != 1)
        return;
    if (on)
        setenv("BT_GEMV_FORCE", "lt", 1);
    else
        unsetenv("BT_GEMV_FORCE");
    cuda_switches_reload();
}

/* Median microseconds of a job, L2 flushed before each run. */
static float job_time(const gemv_job_t *j)
{
    float ms[64];
    int n = g_reps < 64 ? g_reps : 64;

    job_force_lt(j, 1);
    job_run(j);
    for (int r = 0; r < n; r++) {
        flush_l2();
        CK(cudaEventRecord(g_e0, 0));
        job_run(j);
        CK(cudaEventRecord(g_e1, 0));
        CK(cudaEventSynchronize(g_e1));
        CK(cudaEventElapsedTime(&ms[r], g_e0, g_e1));
    }
    job_force_lt(j, 0);
    CK(cudaGetLastError());
    qsort(ms, n, sizeof(float), cmp_f);
    return ms[n / 2] * 1e3f;
}

/* True when `name` is listed in BT_GEMV_DISABLE (failed its test). */
static int disabled(const char *name)
{
    const char *env = getenv("BT_GEMV_DISABLE");
    char buf[256];

    if (env == NULL)
        return 0;
    snprintf(buf, sizeof(buf), ",%s,", env);
    for (char *p = buf; (p = strstr(p, name)) != NULL; p++)
        if (p[-1] == ',' && p[strlen(name)] == ',')
            return 1;
    return 0;
}

static void bench_gemv(void)
{
    static const struct {
        const char *name;
        int o, i, per_step; /* per_step: times per decode step */
        cuda_dtype_t out_dt;
    } sh[] = {{"qkv", 6144, 4096, 32, CUDA_DT_BF16},
              {"o", 4096, 4096, 32, CUDA_DT_F32},
              {"gate_up", 28672, 4096, 32, CUDA_DT_BF16},
              {"down", 4096, 14336, 32, CUDA_DT_F32},
              {"lm_head", 128256, 4096, 1, CUDA_DT_F32}};
    const int toks[] = {1, 2, 4, 8, 16, 32, 64, 128, 2048};
    enum { NT = sizeof(toks) / sizeof(toks[0]) };
    double best_sum[NT] = {0}, tuned_sum[NT] = {0}, lt_sum[NT] = {0};
    worker_gemm_ctx_t *g = NULL;

    OK(worker_gemm_ctx_create(32u << 20, &g));
    for (size_t s = 0; s < sizeof(sh) / sizeof(sh[0]); s++) {
        int o = sh[s].o, i = sh[s].i;
        void *x, *w, *y;
        double wbytes = 2.0 * o * i;

        CK(cudaMalloc(&x, (size_t)2048 * i * 2));
        CK(cudaMalloc(&w, (size_t)o * i * 2));
        CK(cudaMalloc(&y, (size_t)2048 * o * 4));
        OK(cuda_gemv_fill(x, (size_t)2048 * i, 11, 0));
        OK(cuda_gemv_fill(w, (size_t)o * i, 12 + (uint32_t)s, 0));
        CK(cudaDeviceSynchronize());
        for (int ti = 0; ti < NT; ti++) {
            int t = toks[ti];
            char line[1024];
            size_t len = 0;
            float best = 1e30f, us;
            const char *best_name = "?";
            gemv_job_t j = {0, 0, g, t, o, i, x, w, y, sh[s].out_dt};

            if (t > 128 && sh[s].per_step == 1)
                continue; /* a prefill computes one classifier row */
            if (!tok_selected(t))
                continue;

            len += snprintf(line + len, sizeof(line) - len,
                            "gemv %-7s t=%3d o=%6d i=%5d:", sh[s].name, t, o,
                            i);
            for (int k = 0; k < CUDA_GEMV_N_KERNELS; k++) {
                if (!cuda_gemv_kernel_ok((cuda_gemv_kernel_t)k, t, o, i,
                                         CUDA_DT_BF16) ||
                    disabled(cuda_gemv_kernel_name((cuda_gemv_kernel_t)k)))
                    continue;
                j.kind = 0;
                j.k = k;
                us = job_time(&j);
                len += snprintf(line + len, sizeof(line) - len,
                                " %s %.1f (%.2f)",
                                cuda_gemv_kernel_name((cuda_gemv_kernel_t)k),
                                us, wbytes / (us * 1e-6) / 1e12);
                if (us < best) {
                    best = us;
                    best_name = cuda_gemv_kernel_name((cuda_gemv_kernel_t)k);
                }
            }
            j.kind = 1;
            us = job_time(&j);
            lt_sum[ti] += (double)us * sh[s].per_step;
            len += snprintf(line + len, sizeof(line) - len,
                            " cublasLt %.1f (%.2f)", us,
                            wbytes / (us * 1e-6) / 1e12);
            if (us < best) {
                best = us;
                best_name = "cublasLt";
            }
            j.kind = 2; /* the first call tunes the whole shape */
            us = job_time(&j);
            {
                float tus = 0.0f;
                const char *c = worker_gemm_choice(g, t, o, i, sh[s].out_dt,
                                                   &tus);
                len += snprintf(line + len, sizeof(line) - len,
                                " | tuned=%s %.1f (%.2f TB/s)",
                                c ? c : "none", us,
                                wbytes / (us * 1e-6) / 1e12);
            }
            best_sum[ti] += (double)best * sh[s].per_step;
            tuned_sum[ti] += (double)us * sh[s].per_step;
            printf("%s | best=%s %.1f us %.2f TB/s %.0f TFLOP/s\n", line,
                   best_name, best, wbytes / (best * 1e-6) / 1e12,
                   2.0 * t * o * (double)i / (best * 1e-6) / 1e12);
            fflush(stdout);
        }
        cudaFree(x);
        cudaFree(w);
        cudaFree(y);
    }
    for (int ti = 0; ti < NT; ti++)
        printf("gemvsum t=%4d: GEMMs per step (32 layers + lm_head; "
               "t=2048: layers only = prefill): "
               "best %.3f ms, tuned %.3f ms, cuBLASLt %.3f ms; 15.0 GB at "
               "4.5 TB/s = 3.34 ms\n", toks[ti], best_sum[ti] * 1e-3,
               tuned_sum[ti] * 1e-3, lt_sum[ti] * 1e-3);
    worker_gemm_ctx_destroy(&g);
}

/* A profiling build's phases (attn_prefill.h) of the runs just timed:
 * cycles a tile per consumer warpgroup, the block's ends per warp. */
static void print_prefill_prof(unsigned long long p[3][F2_PROF_N])
{
    static const char *const names[] = {"prologue", "full", "turn", "S",
                                        "softmax", "PV", "skipped", "tail",
                                        "epilogue"};

    for (int wg = 0; wg < 2; wg++) {
        const double tiles = p[wg][F2_PROF_TILES] ? p[wg][F2_PROF_TILES] : 1;
        const double warps = p[wg][F2_PROF_WARPS] ? p[wg][F2_PROF_WARPS] : 1;
        double sum = 0.0;

        printf("attn prof wg%d: %.1f tiles a warp; cycles a tile:", wg,
               tiles / warps);
        for (int i = F2_PROF_FULL; i <= F2_PROF_SKIPPED; i++) {
            printf(" %s %.0f", names[i], p[wg][i] / tiles);
            sum += p[wg][i] / tiles;
        }
        printf(" (sum %.0f); a warp: prologue %.0f tail %.0f epilogue %.0f"
               "\n", sum, p[wg][F2_PROF_PROLOGUE] / warps,
               p[wg][F2_PROF_TAIL] / warps, p[wg][F2_PROF_EPILOGUE] / warps);
    }
    const double pt = p[2][F2_PROF_TILES] ? p[2][F2_PROF_TILES] : 1;
    printf("attn prof producer: cycles a tile: empty %.0f issue %.0f\n",
           p[2][F2_PROF_PROD_EMPTY] / pt, p[2][F2_PROF_PROD_ISSUE] / pt);
}


/* One prefill attention launch: cuda_attn_prefill (wgmma < 0) or
 * attn_prefill_fa2.cu's kernel for that wgmma (cuda_attn_prefill_fa2);
 * FP8 KV when a->d_kv_scale is set. */
static void prefill_run(const cuda_attn_args_t *a, const int *d_tiles,
                        int n_tiles, int wgmma)
{
    if (wgmma < 0) {
        OK(cuda_attn_prefill(a, d_tiles, n_tiles, CUDA_DT_BF16, 0));
        return;
    }
    CK(cuda_attn_prefill_fa2(a, d_tiles, n_tiles, 0, wgmma, 0));
    CK(cudaGetLastError());
}

/* One causal prompt of P tokens through cuda_attn_prefill. */
static int g_attn_hd = 128; /* --attn-hd */
static int g_attn_runs;      /* --attn-runs */

static void bench_attn(void)
{
    const int nh = 32, nkv = 8, hd = g_attn_hd, bs = 16;
    const int lens[] = {512, 2048, 8192};

    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int P = lens[li], nb = (P + bs - 1) / bs;
        int n_tiles = (P + CUDA_PREFILL_BQ - 1) / CUDA_PREFILL_BQ;
        size_t kv = (size_t)nb * bs * nkv * hd;
        int *h = calloc((size_t)n_tiles * CUDA_PREFILL_TILE_INTS + nb +
                            (size_t)5 * P, sizeof(int));
        int *tiles = h, *bt = h + (size_t)n_tiles * CUDA_PREFILL_TILE_INTS;
        int *kvl = bt + nb, *bto = kvl + P, *ctxa = bto + P, *mo = ctxa + P;
        void *q, *kc, *vc, *out, *kc8, *vc8;
        float *d_kv_scale;
        int *d_meta;
        cuda_attn_args_t a, a8;

        for (int t = 0; t < n_tiles; t++) {
            int *tp = tiles + (size_t)t * CUDA_PREFILL_TILE_INTS;
            tp[CUDA_PT_TOK0] = 0;
            tp[CUDA_PT_I0] = t * CUDA_PREFILL_BQ;
            tp[CUDA_PT_NQ] = P - t * CUDA_PREFILL_BQ < CUDA_PREFILL_BQ
                                 ? P - t * CUDA_PREFILL_BQ
                                 : CUDA_PREFILL_BQ;
            tp[CUDA_PT_NTOK] = P;
            tp[CUDA_PT_CTX] = 0;
            tp[CUDA_PT_BT_OFF] = 0;
            tp[CUDA_PT_MASK_OFF] = -1;
        }
        /* not contiguous, like a used pool; --attn-runs: in order, as a
         * fresh pool hands blocks out (the prefill kernels' runs) */
        for (int b = 0; b < nb; b++)
            bt[b] = g_attn_runs ? b : nb - 1 - b;
        for (int t = 0; t < P; t++) {
            kvl[t] = t + 1;
            mo[t] = -1;
        }
        size_t ints = (size_t)n_tiles * CUDA_PREFILL_TILE_INTS + nb +
                      (size_t)5 * P;
        CK(cudaMalloc((void **)&d_meta, ints * sizeof(int)));
        CK(cudaMemcpy(d_meta, h, ints * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&q, (size_t)P * nh * hd * 2));
        CK(cudaMalloc(&out, (size_t)P * nh * hd * 2));
        CK(cudaMalloc(&kc, kv * 2));
        CK(cudaMalloc(&vc, kv * 2));
        OK(cuda_gemv_fill(q, (size_t)P * nh * hd, 1, 0));
        OK(cuda_gemv_fill(kc, kv, 2, 0));
        OK(cuda_gemv_fill(vc, kv, 3, 0));
        /* FP8 KV: codes of magnitude <= 2^4 x 1.875 (exponent field
         * <= 11; never NaN), scale 1 / 64 for every head */
        {
            unsigned char *c8 = malloc(kv);
            float sc[2 * 8]; /* 2 x nkv */
            uint32_t r = 777;

            if (c8 == NULL) {
                fprintf(stderr, "FAIL out of host memory\n");
                exit(1);
            }
            for (size_t i = 0; i < kv; i++) {
                r = r * 1664525u + 1013904223u;
                c8[i] = (unsigned char)(((r >> 24) & 0x80) |
                                        ((r >> 8) % 0x60));
            }
            for (int i = 0; i < 2 * nkv; i++)
                sc[i] = 1.0f / 64.0f;
            CK(cudaMalloc(&kc8, kv));
            CK(cudaMalloc(&vc8, kv));
            CK(cudaMalloc((void **)&d_kv_scale, sizeof(sc)));
            CK(cudaMemcpy(kc8, c8, kv, cudaMemcpyHostToDevice));
            for (size_t i = 0; i < kv / 2; i++) { /* V: the codes reversed */
                unsigned char t = c8[i];
                c8[i] = c8[kv - 1 - i];
                c8[kv - 1 - i] = t;
            }
            CK(cudaMemcpy(vc8, c8, kv, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_kv_scale, sc, sizeof(sc),
                          cudaMemcpyHostToDevice));
            free(c8);
        }
        memset(&a, 0, sizeof(a));
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.block_size = bs;
        a.scale = 0.08838834764f;
        a.d_q = q;
        a.d_k_cache = kc;
        a.d_v_cache = vc;
        a.kv_slots = (long long)(kv / ((size_t)nkv * hd));
        a.d_block_tables = d_meta + (size_t)n_tiles * CUDA_PREFILL_TILE_INTS;
        a.d_kv_len = a.d_block_tables + nb;
        a.d_bt_off = a.d_kv_len + P;
        a.d_ctx_len = a.d_bt_off + P;
        a.d_mask_off = a.d_ctx_len + P;
        a.d_out = out;
        a8 = a;
        a8.d_k_cache = kc8;
        a8.d_v_cache = vc8;
        a8.d_kv_scale = d_kv_scale;
        /* The default kernel (fa2pp128 at head 128), then the ones it
         * falls back to (fa2pp, fa2wqv: cuda_attn_prefill_fa2's wgmma 3
         * and 2) as more rows; then FP8 KV: the default (fa2wqv) and
         * fa2 on mma.sync. */
        static const char *const alt[] = {"default", "fa2pp", "fa2wqv",
                                          "kv8 default", "kv8 fa2"};
        static const int alt_wgmma[] = {-1, 3, 2, -1, 0};
        for (int var = 0; var < 5; var++) {
        float ms[64];
        int n = g_reps < 64 ? g_reps : 64;
        const cuda_attn_args_t *ap = var >= 3 ? &a8 : &a;
        prefill_run(ap, d_meta, n_tiles, alt_wgmma[var]);
        unsigned long long prof[3][F2_PROF_N];
        const bool profiled = cuda_attn_prefill_prof_take(prof); /* reset */
        for (int r = 0; r < n; r++) {
            flush_l2();
            CK(cudaEventRecord(g_e0, 0));
            prefill_run(ap, d_meta, n_tiles, alt_wgmma[var]);
            CK(cudaEventRecord(g_e1, 0));
            CK(cudaEventSynchronize(g_e1));
            CK(cudaEventElapsedTime(&ms[r], g_e0, g_e1));
        }
        qsort(ms, n, sizeof(float), cmp_f);
        double fl = 4.0 * nh * hd * (double)P * (P + 1) / 2;
        double us = ms[n / 2] * 1e3;
        printf("attn prefill hd=%d P=%5d (%s): %8.1f "
               "us/layer %6.1f TFLOP/s (%.0f%% of 790); x32 layers = %.2f "
               "ms\n", hd, P, alt[var], us, fl / (us * 1e-6) / 1e12,
               100.0 * fl / (us * 1e-6) / 790e12, us * 32e-3);
        if (profiled && cuda_attn_prefill_prof_take(prof))
            print_prefill_prof(prof);
        fflush(stdout);
        }
        cudaFree(q); cudaFree(out); cudaFree(kc); cudaFree(vc);
        cudaFree(kc8); cudaFree(vc8); cudaFree(d_kv_scale);
        cudaFree(d_meta);
        free(h);
    }
}

/* Decode attention (one query token per sequence) at the Llama-3-8B
 * shape: KV read bandwidth with the split planner's choice (rows
 * "split").  The last row is a
 * layout probe: batch 64 x 8 KV heads run as 512 sequences of one KV
 * head (4 query heads), the same blocks and bytes, but a block's K (and
 * V) rows lie 256 B apart -- the access pattern of a head-major (HND)
 * page layout, where our NHD layout puts them 2 KB apart. */
static void bench_dec(void)
{
    const int hd = 128, bs = 16;
    static const int all[][4] = {{1, 2048, 32, 8},    {1, 8192, 32, 8},
                                 {64, 512, 32, 8},    {64, 2048, 32, 8},
                                 {128, 512, 32, 8},   {8, 8192, 32, 8},
                                 {64, 8192, 32, 8},   {512, 2048, 4, 1},
                                 {199, 3072, 32, 8},  {342, 3072, 32, 8},
                                 {124, 2048, 32, 8},  {124, 2176, 32, 8}};
    /* --dec-only B:CTX: that case, the 8B's heads when it is not listed */
    const int one[1][4] = {{g_dec_b, g_dec_ctx, 32, 8}};
    int listed = 0;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        listed |= all[i][0] == g_dec_b && all[i][1] == g_dec_ctx;
    const bool alone = g_dec_b > 0 && !listed;
    const int(*cases)[4] = alone ? one : all;
    const size_t n_cases = alone ? 1 : sizeof(all) / sizeof(all[0]);
    const int kvb = g_dec_kv8 ? 1 : 2; /* bytes a K or V element */
    const char *tag = g_dec_kv8 ? " kv8" : "";
    int n_sm = 132, dev = 0;

    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    for (size_t ci = 0; ci < n_cases; ci++) {
        const int B = cases[ci][0], ctx = cases[ci][1];
        const int nh = cases[ci][2], nkv = cases[ci][3];
        if (g_dec_b > 0 && (B != g_dec_b || ctx != g_dec_ctx))
            continue;
        const int nbs = (ctx + bs - 1) / bs, nb = B * nbs;
        size_t kv = (size_t)nb * bs * nkv * hd;
        size_t ints = (size_t)nb + 4 * (size_t)B;
        int *h = calloc(ints, sizeof(int));
        int *bt = h, *kvl = bt + nb, *bto = kvl + B, *ctxa = bto + B,
            *mo = ctxa + B;
        int *d_meta;
        void *q, *kc, *vc, *out;
        float *ws = NULL, *d_scale = NULL;
        cuda_attn_args_t a;
        uint32_t r = 12345;

        for (int i = 0; i < nb; i++)
            bt[i] = i;
        for (int i = nb - 1; i > 0; i--) { /* a used pool: shuffled */
            r = r * 1664525u + 1013904223u;
            int j = (int)(r % (uint32_t)(i + 1)), tmp = bt[i];
            bt[i] = bt[j];
            bt[j] = tmp;
        }
        for (int b = 0; b < B; b++) {
            kvl[b] = ctx;
            bto[b] = b * nbs;
            ctxa[b] = ctx - 1;
            mo[b] = -1;
        }
        CK(cudaMalloc((void **)&d_meta, ints * sizeof(int)));
        CK(cudaMemcpy(d_meta, h, ints * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&q, (size_t)B * nh * hd * 2));
        CK(cudaMalloc(&out, (size_t)B * nh * hd * 2));
        CK(cudaMalloc(&kc, kv * kvb));
        CK(cudaMalloc(&vc, kv * kvb));
        CK(cudaMalloc((void **)&ws, 4 * cuda_attn_decode_ws_floats(
                                            B, nh, hd, 64) + 4));
        OK(cuda_gemv_fill(q, (size_t)B * nh * hd, 1, 0));
        if (g_dec_kv8) { /* codes of 1.0 and 0.5; a scale per KV head */
            float sc[64];
            CK(cudaMemset(kc, 0x38, kv));
            CK(cudaMemset(vc, 0x30, kv));
            CK(cudaMalloc((void **)&d_scale, 2 * nkv * sizeof(float)));
            for (int i = 0; i < 2 * nkv && i < 64; i++)
                sc[i] = 0.01f;
            CK(cudaMemcpy(d_scale, sc, 2 * nkv * sizeof(float),
                          cudaMemcpyHostToDevice));
        } else {
            OK(cuda_gemv_fill(kc, kv, 2, 0));
            OK(cuda_gemv_fill(vc, kv, 3, 0));
        }
        memset(&a, 0, sizeof(a));
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.block_size = bs;
        a.scale = 0.08838834764f;
        a.d_q = q;
        a.d_k_cache = kc;
        a.d_v_cache = vc;
        a.d_block_tables = d_meta;
        a.d_kv_len = d_meta + nb;
        a.d_bt_off = a.d_kv_len + B;
        a.d_ctx_len = a.d_bt_off + B;
        a.d_mask_off = a.d_ctx_len + B;
        a.d_out = out;
        a.d_kv_scale = d_scale;
        for (int sweep = 0; sweep <= (g_dec_splits ? 32 : 0); sweep++) {
            float ms[64];
            int n = g_reps < 64 ? g_reps : 64, ns, sl;
            cuda_attn_decode_plan(B, ctx, nh, nkv, n_sm,
                                  cuda_attn_decode_blocks_per_sm(
                                      hd, g_dec_kv8, nh / nkv),
                                  64, &ns, &sl);
            if (sweep > 0) { /* `sweep` splits, a multiple of 64 keys */
                sl = (ctx + sweep - 1) / sweep;
                sl = (sl + 63) / 64 * 64;
                ns = (ctx + sl - 1) / sl;
                if (ns != sweep)
                    continue; /* the same split as a smaller count */
            }
            OK(cuda_attn_decode(&a, NULL, B, ns, sl, ws, CUDA_DT_BF16, 0));
            for (int rr = 0; rr < n; rr++) {
                flush_l2();
                CK(cudaEventRecord(g_e0, 0));
                OK(cuda_attn_decode(&a, NULL, B, ns, sl, ws, CUDA_DT_BF16,
                                    0));
                CK(cudaEventRecord(g_e1, 0));
                CK(cudaEventSynchronize(g_e1));
                CK(cudaEventElapsedTime(&ms[rr], g_e0, g_e1));
            }
            CK(cudaGetLastError());
            qsort(ms, n, sizeof(float), cmp_f);
            double bytes = 2.0 * B * (double)ctx * nkv * hd * kvb;
            double us = ms[n / 2] * 1e3;
            printf("attn decode%s B=%3d ctx=%5d plan=%-7s %3d x %4d%s: %8.1f "
                   "us/layer %5.2f TB/s KV (%.0f%% of 4.5); x32 = %.2f ms\n",
                   tag, B, ctx, sweep ? "sweep" : "split", ns, sl,
                   nkv == 1 ? " (HND probe)" : "", us,
                   bytes / (us * 1e-6) / 1e12,
                   100.0 * bytes / (us * 1e-6) / 4.5e12, us * 32e-3);
            fflush(stdout);
        }
        cudaFree(q); cudaFree(out); cudaFree(kc); cudaFree(vc);
        cudaFree(ws); cudaFree(d_meta); cudaFree(d_scale);
        free(h);
    }
}

/* The per-layer small kernels of a 2048-token prefill. */
static void bench_small(void)
{
    const int P = 2048, dim = 4096, hid = 14336, nh = 32, nkv = 8, hd = 128;
    const int qkv = (nh + 2 * nkv) * hd;
    float *x;
    void *xn, *g, *gu, *hbuf, *qkvb, *q, *kc, *vc;
    float *inv;
    int *pos, *slot;
    int n = g_reps < 64 ? g_reps : 64;
    float ms[64];

    CK(cudaMalloc((void **)&x, (size_t)P * dim * 4));
    CK(cudaMalloc(&xn, (size_t)P * dim * 2));
    CK(cudaMalloc(&g, (size_t)dim * 2));
    CK(cudaMalloc(&gu, (size_t)P * 2 * hid * 2));
    CK(cudaMalloc(&hbuf, (size_t)P * hid * 2));
    CK(cudaMalloc(&qkvb, (size_t)P * qkv * 2));
    CK(cudaMalloc(&q, (size_t)P * nh * hd * 2));
    CK(cudaMalloc(&kc, (size_t)P * nkv * hd * 2));
    CK(cudaMalloc(&vc, (size_t)P * nkv * hd * 2));
    CK(cudaMalloc((void **)&inv, hd / 2 * 4));
    CK(cudaMalloc((void **)&pos, P * 4));
    CK(cudaMalloc((void **)&slot, P * 4));
    {
        int *hp = malloc(P * 4);
        float hi[64];
        for (int i = 0; i < P; i++)
            hp[i] = i;
        CK(cudaMemcpy(pos, hp, P * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(slot, hp, P * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < 64; i++)
            hi[i] = 1.0f / (float)(i + 1);
        CK(cudaMemcpy(inv, hi, sizeof(hi), cudaMemcpyHostToDevice));
        free(hp);
    }
    CK(cudaMemset(x, 0x3c, (size_t)P * dim * 4));
    OK(cuda_gemv_fill(g, dim, 4, 0));
    OK(cuda_gemv_fill(gu, (size_t)P * 2 * hid, 5, 0));
    OK(cuda_gemv_fill(qkvb, (size_t)P * qkv, 6, 0));
    for (int which = 0; which < 3; which++) {
        double bytes;
        const char *name;
        for (int r = 0; r <= n; r++) {
            if (r > 0) {
                flush_l2();
                CK(cudaEventRecord(g_e0, 0));
            }
            if (which == 0) {
                OK(cuda_rmsnorm(x, NULL, g, NULL, P, dim, 1e-5f, xn,
                                CUDA_DT_BF16, 0));
            } else if (which == 1) {
                OK(cuda_swiglu(gu, P, hid, hbuf, CUDA_DT_BF16, 0));
            } else {
                cuda_rope_kv_args_t ra;
                memset(&ra, 0, sizeof(ra));
                ra.n_tokens = P;
                ra.n_heads = nh;
                ra.n_kv_heads = nkv;
                ra.head_dim = hd;
                ra.rope_half = 1;
                ra.d_qkv = qkvb;
                ra.d_inv_freq = inv;
                ra.d_pos = pos;
                ra.d_slot = slot;
                ra.d_q = q;
                ra.d_k_cache = kc;
                ra.d_v_cache = vc;
                OK(cuda_rope_kv(&ra, CUDA_DT_BF16, 0));
            }
            if (r > 0) {
                CK(cudaEventRecord(g_e1, 0));
                CK(cudaEventSynchronize(g_e1));
                CK(cudaEventElapsedTime(&ms[r - 1], g_e0, g_e1));
            }
        }
        CK(cudaGetLastError());
        qsort(ms, n, sizeof(float), cmp_f);
        if (which == 0) {
            name = "rmsnorm";
            bytes = (double)P * dim * 6;
        } else if (which == 1) {
            name = "swiglu";
            bytes = (double)P * hid * 6;
        } else {
            name = "rope_kv";
            bytes = (double)P * qkv * 4;
        }
        printf("small %-8s P=%d: %7.1f us/layer %6.0f GB/s; x32 layers = "
               "%.2f ms (x2 for rmsnorm)\n", name, P, ms[n / 2] * 1e3,
               bytes / (ms[n / 2] * 1e-3) / 1e9, ms[n / 2] * 32);
    }
    cudaFree(x); cudaFree(xn); cudaFree(g); cudaFree(gu); cudaFree(hbuf);
    cudaFree(qkvb); cudaFree(q); cudaFree(kc); cudaFree(vc); cudaFree(inv);
    cudaFree(pos); cudaFree(slot);
}

int main(int argc, char **argv)
{
    int do_gemv = 0, do_attn = 0, do_small = 0, do_dec = 0;

    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--gemv") == 0)
            do_gemv = 1;
        else if (strcmp(argv[a], "--attn") == 0)
            do_attn = 1;
        else if (strcmp(argv[a], "--attn-hd") == 0 && a + 1 < argc &&
                 (atoi(argv[a + 1]) == 64 || atoi(argv[a + 1]) == 128)) {
            g_attn_hd = atoi(argv[++a]);
            do_attn = 1;
        } else if (strcmp(argv[a], "--attn-runs") == 0) {
            g_attn_runs = 1;
            do_attn = 1;
        } else if (strcmp(argv[a], "--small") == 0)
            do_small = 1;
        else if (strcmp(argv[a], "--dec") == 0)
            do_dec = 1;
        else if (strcmp(argv[a], "--dec-kv8") == 0)
            do_dec = g_dec_kv8 = 1;
        else if (strcmp(argv[a], "--dec-splits") == 0)
            g_dec_splits = 1;
        else if (strcmp(argv[a], "--toks") == 0 && a + 1 < argc)
            snprintf(g_toks, sizeof(g_toks), "%s", argv[++a]);
        else if (strcmp(argv[a], "--reps") == 0 && a + 1 < argc)
            g_reps = atoi(argv[++a]);
        else if (strcmp(argv[a], "--dec-only") == 0 && a + 1 < argc &&
                 sscanf(argv[++a], "%d:%d", &g_dec_b, &g_dec_ctx) == 2)
            do_dec = 1;
        else {
            fprintf(stderr, "usage: bench_kernels [--gemv] [--attn] "
                    "[--attn-hd 64|128] [--attn-runs] [--small] [--dec] "
                    "[--dec-kv8] [--dec-splits] "
                    "[--dec-only "
                    "B:CTX] [--toks 1,2,..] [--reps N]\n");
            return 2;
        }
    }
    if (!do_gemv && !do_attn && !do_small && !do_dec)
        do_gemv = do_attn = do_small = do_dec = 1;
    if (g_reps < 1)
        g_reps = 1;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&g_flush, 256u << 20));
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    if (do_gemv)
        bench_gemv();
    if (do_attn)
        bench_attn();
    if (do_dec)
        bench_dec();
    if (do_small)
        bench_small();
    cudaFree(g_flush);
    return 0;
}
