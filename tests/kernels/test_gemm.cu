/*
 * test_gemm.cu - worker_gemm() (cuBLASLt + autotuned GEMV variants)
 * against gemm_ref(): f32 in/out (exactness mode, no TF32), bf16 in/out,
 * bf16 in with f32 out added to the existing output (the residual add),
 * odd shapes; output poisoned before each plain run.  Then every GEMV
 * variant of kernels/gemv.h (cuda_gemv_run) on every shape it supports,
 * the RMSNorm-fused GEMV (rows and ring kernels) and the rows kernel with
 * SwiGLU fused into its output.  --bench times the Llama-3-8B projection
 * shapes; --variant NAME runs only that variant's cases, --norm only the
 * fused-RMSNorm / SwiGLU ones (a new kernel's quick check on the device).
 * --cache: only the BT_GEMM_CACHE rounds (test_cache).
 * Run: build-cuda/gpu/test_gemm [--bench | --variant NAME | --norm | --cache]
 * (make gpu-test)
 */
#include "gemm.h"
#include "kernels/gemv.h"
#include "kernels/swiglu.h"
#include "kernels_ref.h"
#include "kt_common.h"

#include <unistd.h>

static void run_case(worker_gemm_ctx_t *g, int t, int o, int i,
                     cuda_dtype_t in_dt, cuda_dtype_t out_dt, int acc)
{
    float *x = kt_rand_vec((size_t)t * i, -1, 1, in_dt);
    float *w = kt_rand_vec((size_t)o * i, -1, 1, in_dt);
    float *y0 = kt_rand_vec((size_t)t * o, -1, 1, out_dt);
    float *ref = (float *)malloc(sizeof(float) * t * o);
    memcpy(ref, y0, sizeof(float) * t * o);
    gemm_ref(t, o, i, x, w, ref, acc);
    void *d_x = kt_upload(x, (size_t)t * i, in_dt);
    void *d_w = kt_upload(w, (size_t)o * i, in_dt);
    void *d_y = acc ? kt_upload(y0, (size_t)t * o, out_dt)
                    : kt_poisoned((size_t)t * o, out_dt);
    KT_OK(worker_gemm(g, t, o, i, d_x, d_w, in_dt, d_y, out_dt, acc != 0, 0));
    float *y = kt_download(d_y, (size_t)t * o, out_dt);
    char what[160];
    snprintf(what, sizeof(what), "gemm%s%s %s->%s%s t=%d o=%d i=%d",
             cuda_switches()->gemv_force ? " force=" : "",
             cuda_switches()->gemv_force ? cuda_switches()->gemv_force : "",
             kt_dt_name(in_dt), kt_dt_name(out_dt), acc ? " +=" : "", t, o, i);
    kt_compare(what, y, ref, (size_t)t * o,
               in_dt == CUDA_DT_F32 ? 1e-5 : 1e-2);
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_y);
    free(x); free(w); free(y0); free(ref); free(y);
}

/* BT_GEMM_CACHE: a context tunes one skinny family (o=1000 i=4096, f32
 * out) and one prefill shape (256 tokens) and writes the file; a second
 * context installs both from it (cache hits, the same picks, correct
 * products); a corrupt file is ignored, re-tuned and rewritten. */
static void test_cache(void)
{
    char path[96];
    const int t_run[] = {1, 3, 64, 256};
    worker_gemm_ctx_t *c = NULL;
    char picks[2][8][16];
    FILE *f;

    snprintf(path, sizeof(path), "/tmp/bt_test_gemm_cache.%d", (int)getpid());
    remove(path);
    kt_switch("BT_GEMM_CACHE", path);
    for (int round = 0; round < 4; round++) {
        if (round == 2) { /* corrupt the file */
            f = fopen(path, "w");
            kt_check("cache file writable", f != NULL);
            if (f) {
                fputs("baton-gemm-cache 1 key\n1 2 garbage\n", f);
                fclose(f);
            }
        }
        KT_OK(worker_gemm_ctx_create(32u << 20, &c));
        for (size_t k = 0; k < sizeof(t_run) / sizeof(t_run[0]); k++)
            run_case(c, t_run[k], 1000, 4096, CUDA_DT_BF16,
                     t_run[k] > 128 ? CUDA_DT_BF16 : CUDA_DT_F32, 0);
        const int hits = worker_gemm_cache_hits(c);
        char what[96];
        snprintf(what, sizeof(what), "gemm cache round %d: %d families "
                 "from the file", round, hits);
        kt_check(what, hits == (round == 0 || round == 2 ? 0 : 3));
        for (int b = 0, t = 1; t <= 128; t *= 2, b++) {
            const char *ch = worker_gemm_choice(c, t, 1000, 4096,
                                                CUDA_DT_F32, NULL);
            if (round == 0 || round == 2)
                snprintf(picks[round / 2][b], 16, "%s", ch ? ch : "-");
            else {
                snprintf(what, sizeof(what), "gemm cache round %d t=%d: "
                         "%s as tuned (%s)", round, t, ch ? ch : "-",
                         picks[round / 2][b]);
                kt_check(what, ch && strcmp(ch, picks[round / 2][b]) == 0);
            }
        }
        worker_gemm_ctx_destroy(&c);
    }
    /* not unset: unset means the per-host default file, and the
     * other tests here time every variant afresh */
    kt_switch("BT_GEMM_CACHE", "off");
    remove(path);
}

/* Split-K scratch for the tc variant (as worker_gemm's context holds). */
static cuda_gemv_ws_t g_ws;

/* One GEMV variant k on (t, o, i), out_dt, plain (poisoned output) or
 * accumulating; ws: split-K scratch (NULL: none). */
static void run_variant_ws(int k, int t, int o, int i, cuda_dtype_t out_dt,
                           int acc, const cuda_gemv_ws_t *ws)
{
    float *x = kt_rand_vec((size_t)t * i, -1, 1, CUDA_DT_BF16);
    float *w = kt_rand_vec((size_t)o * i, -1, 1, CUDA_DT_BF16);
    float *y0 = kt_rand_vec((size_t)t * o, -1, 1, out_dt);
    float *ref = (float *)malloc(sizeof(float) * t * o);
    memcpy(ref, y0, sizeof(float) * t * o);
    gemm_ref(t, o, i, x, w, ref, acc);
    void *d_x = kt_upload(x, (size_t)t * i, CUDA_DT_BF16);
    void *d_w = kt_upload(w, (size_t)o * i, CUDA_DT_BF16);
    void *d_y = acc ? kt_upload(y0, (size_t)t * o, out_dt)
                    : kt_poisoned((size_t)t * o, out_dt);
    KT_OK(cuda_gemv_run((cuda_gemv_kernel_t)k, t, o, i, d_x, d_w, d_y, out_dt,
                        acc != 0, ws, 0));
    KT_CUDA(cudaGetLastError());
    float *y = kt_download(d_y, (size_t)t * o, out_dt);
    char what[160];
    snprintf(what, sizeof(what), "gemv %s bf16->%s%s t=%d o=%d i=%d%s",
             cuda_gemv_kernel_name((cuda_gemv_kernel_t)k), kt_dt_name(out_dt),
             acc ? " +=" : "", t, o, i,
             (k == CUDA_GEMV_TC || k == CUDA_GEMV_WG) && ws == NULL
                 ? " no-split" : "");
    kt_compare(what, y, ref, (size_t)t * o, 1e-2);
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_y);
    free(x); free(w); free(y0); free(ref); free(y);
}

static void run_variant(int k, int t, int o, int i, cuda_dtype_t out_dt,
                        int acc)
{
    run_variant_ws(k, t, o, i, out_dt, acc, &g_ws);
}

/* cuda_gemv_norm: RMSNorm of f32 rows fused into the GEMV input, against
 * rmsnorm_ref (rounded to bf16, as the unfused path stores it) then
 * gemm_ref. */
static void run_norm_case(int t, int o, int i, cuda_dtype_t out_dt)
{
    float *x = kt_rand_vec((size_t)t * i, -2, 2, CUDA_DT_F32);
    float *gw = kt_rand_vec((size_t)i, 0.5f, 1.5f, CUDA_DT_BF16);
    float *w = kt_rand_vec((size_t)o * i, -1, 1, CUDA_DT_BF16);
    float *xn = (float *)malloc(sizeof(float) * t * i);
    float *ref = (float *)malloc(sizeof(float) * t * o);
    rmsnorm_ref(x, NULL, gw, NULL, t, i, 1e-5f, xn);
    for (size_t k = 0; k < (size_t)t * i; k++)
        xn[k] = kt_bf16_to_f32(kt_f32_to_bf16(xn[k]));
    gemm_ref(t, o, i, xn, w, ref, 0);
    void *d_x = kt_upload(x, (size_t)t * i, CUDA_DT_F32);
    void *d_g = kt_upload(gw, (size_t)i, CUDA_DT_BF16);
    void *d_w = kt_upload(w, (size_t)o * i, CUDA_DT_BF16);
    void *d_y = kt_poisoned((size_t)t * o, out_dt);
    KT_OK(cuda_gemv_norm(t, o, i, (const float *)d_x, d_g, 1e-5f, d_w, d_y,
                         out_dt, 0));
    KT_CUDA(cudaDeviceSynchronize());
    float *y = kt_download(d_y, (size_t)t * o, out_dt);
    char what[160];
    snprintf(what, sizeof(what), "gemv+rmsnorm (%s) bf16->%s t=%d o=%d i=%d",
             cuda_switches()->gemv_norm ? "ring" : "rows",
             kt_dt_name(out_dt), t, o, i);
    kt_compare(what, y, ref, (size_t)t * o, 1e-2);
    cudaFree(d_x); cudaFree(d_g); cudaFree(d_w); cudaFree(d_y);
    free(x); free(gw); free(w); free(xn); free(ref); free(y);
}

/* cuda_gemv_norm_glu: RMSNorm in, SwiGLU out, over a fused gate|up
 * matrix (2 hid, i): against rmsnorm_ref, gemm_ref, rounding to bf16,
 * swiglu_ref; and bit for bit against cuda_gemv_norm then cuda_swiglu
 * (the unfused path it replaces). */
static void run_glu_case(int t, int hid, int i)
{
    float *x = kt_rand_vec((size_t)t * i, -2, 2, CUDA_DT_F32);
    float *gw = kt_rand_vec((size_t)i, 0.5f, 1.5f, CUDA_DT_BF16);
    float *w = kt_rand_vec((size_t)2 * hid * i, -1, 1, CUDA_DT_BF16);
    float *xn = (float *)malloc(sizeof(float) * t * i);
    float *gu = (float *)malloc(sizeof(float) * t * 2 * hid);
    float *ref = (float *)malloc(sizeof(float) * t * hid);
    rmsnorm_ref(x, NULL, gw, NULL, t, i, 1e-5f, xn);
    for (size_t k = 0; k < (size_t)t * i; k++)
        xn[k] = kt_bf16_to_f32(kt_f32_to_bf16(xn[k]));
    gemm_ref(t, 2 * hid, i, xn, w, gu, 0);
    for (size_t k = 0; k < (size_t)t * 2 * hid; k++)
        gu[k] = kt_bf16_to_f32(kt_f32_to_bf16(gu[k]));
    swiglu_ref(gu, t, hid, ref);
    void *d_x = kt_upload(x, (size_t)t * i, CUDA_DT_F32);
    void *d_g = kt_upload(gw, (size_t)i, CUDA_DT_BF16);
    void *d_w = kt_upload(w, (size_t)2 * hid * i, CUDA_DT_BF16);
    void *d_h = kt_poisoned((size_t)t * hid, CUDA_DT_BF16);
    void *d_gu = kt_poisoned((size_t)t * 2 * hid, CUDA_DT_BF16);
    void *d_h2 = kt_poisoned((size_t)t * hid, CUDA_DT_BF16);
    KT_OK(cuda_gemv_norm_glu(t, hid, i, (const float *)d_x, d_g, 1e-5f, d_w,
                             d_h, 0));
    KT_OK(cuda_gemv_norm(t, 2 * hid, i, (const float *)d_x, d_g, 1e-5f, d_w,
                         d_gu, CUDA_DT_BF16, 0));
    KT_OK(cuda_swiglu(d_gu, t, hid, d_h2, CUDA_DT_BF16, 0));
    KT_CUDA(cudaDeviceSynchronize());
    float *h = kt_download(d_h, (size_t)t * hid, CUDA_DT_BF16);
    float *h2 = kt_download(d_h2, (size_t)t * hid, CUDA_DT_BF16);
    char what[160];
    snprintf(what, sizeof(what), "gemv+rmsnorm+swiglu %s t=%d hid=%d i=%d",
             cuda_switches()->gemv_glu ? cuda_switches()->gemv_glu : "", t,
             hid, i);
    kt_compare(what, h, ref, (size_t)t * hid, 1e-2);
    size_t diff = 0;
    for (size_t k = 0; k < (size_t)t * hid; k++)
        diff += memcmp(&h[k], &h2[k], sizeof(float)) != 0;
    snprintf(what, sizeof(what), "gemv+rmsnorm+swiglu t=%d hid=%d i=%d "
             "bit-identical to the unfused path (%zu differ)", t, hid, i,
             diff);
    kt_check(what, diff == 0);
    cudaFree(d_x); cudaFree(d_g); cudaFree(d_w); cudaFree(d_h);
    cudaFree(d_gu); cudaFree(d_h2);
    free(x); free(gw); free(w); free(xn); free(gu); free(ref); free(h);
    free(h2);
}

static void bench(worker_gemm_ctx_t *g, const char *label, int max_t)
{
    /* (n_out, n_in) of Llama-3-8B: qkv, o, gate|up, down, classifier */
    const int sh[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096},
                         {4096, 14336}, {128256, 4096}};
    const int toks[] = {1, 4, 8, 64, 2048};
    printf("\nbench: bf16 GEMM (%s), Llama-3-8B projections\n", label);
    for (size_t s = 0; s < sizeof(sh) / sizeof(sh[0]); s++)
        for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++) {
            int o = sh[s][0], i = sh[s][1], t = toks[k];
            if (t > max_t)
                continue;
            void *d_x = kt_poisoned((size_t)t * i, CUDA_DT_BF16);
            void *d_w = kt_poisoned((size_t)o * i, CUDA_DT_BF16);
            void *d_y = kt_poisoned((size_t)t * o, CUDA_DT_BF16);
            /* Non-zero data, so the timing is not of zeros. */
            KT_CUDA(cudaMemset(d_x, 0x3c, (size_t)t * i * 2));
            KT_CUDA(cudaMemset(d_w, 0x3c, (size_t)o * i * 2));
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            float ms[10];
            for (int it = 0; it < 13; it++) {
                kt_flush_l2();
                cudaEventRecord(e0);
                KT_OK(worker_gemm(g, t, o, i, d_x, d_w, CUDA_DT_BF16, d_y,
                                  CUDA_DT_BF16, false, 0));
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                if (it >= 3)
                    cudaEventElapsedTime(&ms[it - 3], e0, e1);
            }
            float med = kt_median(ms, 10);
            double bytes = 2.0 * ((double)o * i + (double)t * i + (double)t * o);
            double fl = 2.0 * t * (double)o * i;
            printf("gemm %s t=%5d o=%6d i=%5d: %8.1f us  %5.2f TB/s  %6.1f "
                   "TFLOP/s\n", label, t, o, i, med * 1e3, bytes / (med * 1e-3) / 1e12,
                   fl / (med * 1e-3) / 1e12);
            cudaFree(d_x); cudaFree(d_w); cudaFree(d_y);
        }
}

int main(int argc, char **argv)
{
    /* line-buffered: a bench killed by its timeout keeps its rows */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* every variant timed here, not read from the per-host default
     * tuning cache (test_cache sets its own file) */
    setenv("BT_GEMM_CACHE", "off", 0);
    cuda_switches_reload();
    worker_gemm_ctx_t *g = NULL;
    const char *only = argc > 2 && strcmp(argv[1], "--variant") == 0
                           ? argv[2] : NULL;
    const bool norm_only = argc > 1 && strcmp(argv[1], "--norm") == 0;
    if (argc > 1 && strcmp(argv[1], "--cache") == 0) {
        test_cache(); /* BT_GEMM_CACHE only (a quick device check) */
        return kt_finish("test_gemm");
    }
    KT_OK(worker_gemm_ctx_create(32u << 20, &g));
    g_ws.part_bytes = 32u << 20;
    g_ws.n_cnt = 4096;
    KT_CUDA(cudaMalloc((void **)&g_ws.d_part, g_ws.part_bytes));
    KT_CUDA(cudaMalloc((void **)&g_ws.d_cnt, g_ws.n_cnt * sizeof(int)));
    KT_CUDA(cudaMemset(g_ws.d_cnt, 0, g_ws.n_cnt * sizeof(int)));
    kt_seed(7);
    const int sh[][3] = {{1, 6144, 4096}, {7, 129, 65}, {33, 512, 64},
                         {64, 172, 64}, {130, 1000, 300}, {3, 64, 172},
                         /* the skinny GEMV path: t <= 8, n_in % 8 == 0 */
                         {2, 300, 1024}, {5, 1000, 4096}, {8, 77, 512},
                         {4, 33, 14336}, {1, 77, 8}, {1, 33, 264},
                         {2, 1000, 14336}, {1, 5, 512}, {2, 20000, 256}};
    for (size_t s = 0; !only && !norm_only && s < sizeof(sh) / sizeof(sh[0]);
         s++) {
        run_case(g, sh[s][0], sh[s][1], sh[s][2], CUDA_DT_F32, CUDA_DT_F32, 0);
        run_case(g, sh[s][0], sh[s][1], sh[s][2], CUDA_DT_F32, CUDA_DT_F32, 1);
        run_case(g, sh[s][0], sh[s][1], sh[s][2], CUDA_DT_BF16, CUDA_DT_BF16,
                 0);
        run_case(g, sh[s][0], sh[s][1], sh[s][2], CUDA_DT_BF16, CUDA_DT_F32,
                 0);
        run_case(g, sh[s][0], sh[s][1], sh[s][2], CUDA_DT_BF16, CUDA_DT_F32,
                 1);
    }
    {
        /* Every variant on every shape it supports: odd row counts, token
         * counts that are not multiples of 8, K not a power of two. */
        const int vsh[][3] = {{1, 77, 256}, {2, 1000, 1024}, {3, 4099, 512},
                              {4, 33, 2304}, {1, 6144, 4096},
                              {5, 1000, 4096}, {8, 77, 512}, {13, 300, 1024},
                              {16, 513, 1280}, {33, 260, 768},
                              {64, 1000, 4096}, {2, 20000, 256},
                              {1, 4096, 14336}, {7, 129, 96}, {1, 5, 512},
                              {3, 131, 32}, {1, 1, 256}, {4, 200, 8},
                              {64, 17, 64}, {24, 4100, 4096},
                              {16, 4096, 7168}, {40, 6144, 4096},
                              {9, 640, 8192},
                              /* wg: 65-128 tokens */
                              {65, 77, 64}, {100, 1000, 4096},
                              {128, 6144, 4096}, {72, 130, 320},
                              {128, 4096, 14336}};
        for (int k = 0; k < (norm_only ? 0 : CUDA_GEMV_N_KERNELS); k++) {
            int n = 0;
            if (only && strcmp(only, cuda_gemv_kernel_name(
                                         (cuda_gemv_kernel_t)k)) != 0)
                continue;
            for (size_t s = 0; s < sizeof(vsh) / sizeof(vsh[0]); s++) {
                int t = vsh[s][0], o = vsh[s][1], i = vsh[s][2];
                if (!cuda_gemv_kernel_ok((cuda_gemv_kernel_t)k, t, o, i,
                                         CUDA_DT_BF16))
                    continue;
                run_variant(k, t, o, i, CUDA_DT_BF16, 0);
                run_variant(k, t, o, i, CUDA_DT_F32, 0);
                run_variant(k, t, o, i, CUDA_DT_F32, 1);
                if (k == CUDA_GEMV_TC || k == CUDA_GEMV_WG) /* unsplit */
                    run_variant_ws(k, t, o, i, CUDA_DT_F32, 1, NULL);
                n++;
            }
            printf("INFO variant %s: %d shapes\n",
                   cuda_gemv_kernel_name((cuda_gemv_kernel_t)k), n);
        }
    }
    if (!only) {
        /* cuda_gemv_norm: the rows kernel (default), then the ring
         * kernel (BT_GEMV_NORM=1). */
        const int nsh[][3] = {{1, 6144, 4096}, {2, 1000, 4096}, {1, 7, 256},
                              {2, 3000, 1024}, {1, 28672, 4096},
                              {2, 77, 264}, {1, 4100, 14336}};
        for (int mode = 0; mode < 2; mode++) {
            kt_switch("BT_GEMV_NORM", mode ? "1" : NULL);
            for (size_t s = 0; s < sizeof(nsh) / sizeof(nsh[0]); s++) {
                int t = nsh[s][0], o = nsh[s][1], i = nsh[s][2];
                if (mode > 0 && i % 256 != 0)
                    continue; /* rows kernel only */
                if ((size_t)t * i * 2 > 48 * 1024)
                    continue;
                if (!cuda_gemv_norm_ok(t, i)) {
                    printf("FAIL gemv_norm_ok false for t=%d i=%d\n", t, i);
                    kt_failures++;
                    continue;
                }
                run_norm_case(t, o, i, CUDA_DT_BF16);
                run_norm_case(t, o, i, CUDA_DT_F32);
            }
        }
        /* cuda_gemv_norm_glu, both kernels at 1 and 2 tokens (two warps a
         * pair, then one warp a pair): the Llama-3-8B MLP (14336 x 2 over
         * 4096), odd pair counts, n_in 1024 (the smallest with whole
         * 128-chunk steps) */
        kt_switch("BT_GEMV_NORM", NULL);
        const int gsh[][3] = {{1, 14336, 4096}, {2, 14336, 4096},
                              {1, 77, 1024}, {2, 1001, 2048},
                              {1, 3, 1024}};
        for (size_t s2 = 0; s2 < 2 * sizeof(gsh) / sizeof(gsh[0]); s2++) {
            kt_switch("BT_GEMV_GLU",
                      s2 < sizeof(gsh) / sizeof(gsh[0]) ? "pair" : "warp");
            const int *sh2 = gsh[s2 % (sizeof(gsh) / sizeof(gsh[0]))];
            int t = sh2[0], hid = sh2[1], i = sh2[2];
            if (!cuda_gemv_norm_glu_ok(t, i)) {
                printf("FAIL gemv_norm_glu_ok false for t=%d i=%d\n", t, i);
                kt_failures++;
                continue;
            }
            run_glu_case(t, hid, i);
        }
        kt_switch("BT_GEMV_GLU", NULL);
        if (cuda_gemv_norm_glu_ok(1, 264) || cuda_gemv_norm_glu_ok(3, 4096)) {
            printf("FAIL gemv_norm_glu_ok true for i=264 or 3 tokens\n");
            kt_failures++;
        }
        /* Late PDL triggers (cuda__pdl_late, the batch-1 default of the
         * backend) change no result. */
        cuda__pdl_late = 1;
        run_variant(CUDA_GEMV_ROWS, 1, 6144, 4096, CUDA_DT_BF16, 0);
        run_variant(CUDA_GEMV_ROWS, 2, 4100, 14336, CUDA_DT_F32, 1);
        run_norm_case(1, 6144, 4096, CUDA_DT_BF16);
        run_glu_case(1, 14336, 4096);
        cuda__pdl_late = 0;
    }
    if (!only && !norm_only) {
        /* worker_gemm with a forced variant, and the tuned choices. */
        const char *force[] = {"mma1", "mma2", "ring", "bulk", "rows8", "lt"};
        for (size_t f = 0; f < sizeof(force) / sizeof(force[0]); f++) {
            kt_switch("BT_GEMV_FORCE", force[f]);
            run_case(g, 3, 1000, 4096, CUDA_DT_BF16, CUDA_DT_F32, 1);
            run_case(g, 2, 333, 512, CUDA_DT_BF16, CUDA_DT_BF16, 0);
        }
        kt_switch("BT_GEMV_FORCE", NULL);
        for (int t = 1; t <= 128; t *= 2) {
            float us = 0.0f;
            const char *c = worker_gemm_choice(g, t, 1000, 4096, CUDA_DT_F32,
                                               &us);
            printf("INFO tuned o=1000 i=4096 t=%d: %s %.1f us\n", t,
                   c ? c : "(none)", us);
        }
        test_cache();
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench(g, "worker_gemm", 1 << 30);
        worker_gemm_ctx_t *g2 = NULL;
        kt_switch("BT_GEMV", "0");
        KT_OK(worker_gemm_ctx_create(32u << 20, &g2));
        bench(g2, "cuBLASLt only", 1 << 30);
        worker_gemm_ctx_destroy(&g2);
    }
    worker_gemm_ctx_destroy(&g);
    return kt_finish("test_gemm");
}
