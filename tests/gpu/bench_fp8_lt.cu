/*
 * bench_fp8_lt.cu - every cuBLASLt FP8 algorithm for decode's Llama-3-8B
 * shapes (64 / 128 / 256 tokens; qkv, o, gate|up, down), ON THE DEVICE
 * MACHINE: the heuristic's picks and each one's K splits, with the
 * per-token and per-row scale vectors inside the GEMM (vec, as
 * worker_gemm_fp8 runs it) and with plain f32 sums (the scaling pass
 * not counted), each timed alone after an L2 flush (median of 7).  Why
 * gemm_fp8.c's tuner times the plain plan at decode counts: H100,
 * 2026-12-06, the vec plan has one algorithm and no split, o at 64
 * tokens 18.5 us (0.91 TB/s of weights) against the plain plan's 13.8,
 * down 45.7 against 32.1; splits never won.  Prints a BEST line a shape.
 * --prefill: 2048 tokens (a prompt chunk), every
 * way of passing the scales (mode_name below), writing bf16 and, for o
 * and down, adding into an f32 residual as the engine does (no K
 * splits); the BEST lines give TFLOP/s too.  What it found (2026-12-07,
 * inputs of one repeated code, so the clocks run higher than on real
 * data): cuBLASLt 13.0 has no algorithm that mixes a vector and a
 * scalar (a row vector with a static input scalar, a per-row alpha
 * vector), so a per-channel checkpoint with static input scales runs
 * the vec plan like a dynamic one (a plan built that way fell back to
 * f32 sums + scaling pass: H200 prefill 2048 30.1 -> 41.2 ms, serving
 * 2048/128 3,224 -> 2,493 tok/s; reverted).  Two scalars (a per-tensor
 * checkpoint, static inputs) against the vectors: H200 qkv 64.4 / 65.5
 * us, o 46.2 / 46.2, gate|up 260 / 268, down += 146 / 154 (-3% of a
 * layer's GEMMs); an H100 of the same day read gate|up 279 / 337, down
 * 137 / 173.  Not built: fused q/k/v and gate/up would first need one
 * scale (vLLM requantizes them to the largest).
 *   bench_fp8_lt [--prefill]
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    printf("cuda %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static cublasLtHandle_t lt;
static void *ws; static size_t ws_bytes = 64u << 20;
static void *flush;
static int g_no_split; /* --prefill: split 1 only (prompt shapes) */

static float time_one(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                      const cublasLtMatmulAlgo_t *algo, void *w, void *x,
                      void *y, float beta, const float *alpha)
{
    cudaEvent_t e0, e1; float t[7]; const float one_h = 1.0f;
    const float *one = alpha != NULL ? alpha : &one_h;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    if (cublasLtMatmul(lt, op, one, w, la, x, lb, &beta, y, ld, y, ld, algo,
                       ws, ws_bytes, 0) != CUBLAS_STATUS_SUCCESS)
        return -1.0f;
    for (int r = 0; r < 7; r++) {
        cudaMemsetAsync(flush, r, 128u << 20, 0);
        cudaEventRecord(e0, 0);
        cublasLtMatmul(lt, op, one, w, la, x, lb, &beta, y, ld, y, ld, algo,
                       ws, ws_bytes, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[r], e0, e1);
    }
    if (cudaGetLastError() != cudaSuccess) return -1.0f;
    for (int i = 0; i < 7; i++) for (int j = i + 1; j < 7; j++)
        if (t[j] < t[i]) { float s = t[i]; t[i] = t[j]; t[j] = s; }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return t[3] * 1000.0f;
}

/* vec: 1 scale vectors, 2 scalar scales (bf16 out, or f32 += with
 * acc), 3 a vector for the weights (per channel) and a scalar for the
 * inputs (static), 4 a scalar for the weights (per tensor) and a vector
 * for the inputs (per token), 5 scalar scales and a per-row alpha vector
 * (the weights' channel scales as alpha; beta 0, or 1 with acc), 0 plain
 * f32 sums */
static const char *const mode_name[] = {"plain", "vec", "scalar", "wvec+xscalar",
                                        "wscalar+xvec", "scalar+alphavec"};
static void probe(int n_tok, int n_out, int n_in, int vec, int acc)
{
    cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res[32];
    int n_res = 0; const int8_t on = 1;
    void *w, *x, *y; float *sw, *sx;
    cudaDataType_t out = vec && !acc ? CUDA_R_16BF : CUDA_R_32F;
    float *alpha = NULL;
    size_t es = out == CUDA_R_32F ? 4 : 2;
    int ldd = vec ? n_out : (n_out + 15) / 16 * 16;

    CK(cudaMalloc(&w, (size_t)n_out * n_in)); CK(cudaMalloc(&x, (size_t)n_tok * n_in));
    CK(cudaMalloc(&y, (size_t)ldd * n_tok * es));
    CK(cudaMalloc(&sw, n_out * 4)); CK(cudaMalloc(&sx, n_tok * 4));
    cudaMemset(w, 0x30, (size_t)n_out * n_in); cudaMemset(x, 0x30, (size_t)n_tok * n_in);
    cudaMemset(sw, 0, n_out * 4); cudaMemset(sx, 0, n_tok * 4);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on));
    if (vec >= 2) {
        const int32_t mv = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (vec == 3)
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mv, sizeof(mv));
        if (vec == 4)
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mv, sizeof(mv));
        if (vec == 5) {
            const int32_t pm = acc ? CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST
                                   : CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
            CK(cudaMalloc((void **)&alpha, n_out * 4));
            cudaMemset(alpha, 0, n_out * 4);
        }
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw));
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof(sx));
    } else if (vec) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode));
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode));
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof(sw));
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof(sx));
    }
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n_in, n_out, n_in);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n_in, n_tok, n_in);
    cublasLtMatrixLayoutCreate(&ld, out, n_out, n_tok, ldd);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 32, res, &n_res);
    float best = 1e9f; char bname[64] = "";
    printf("t=%d o=%d k=%d %s%s: %d heuristic algos\n", n_tok, n_out, n_in,
           mode_name[vec], acc ? " +=" : "", n_res);
    for (int i = 0; i < n_res; i++) {
        static const int splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
        int32_t split_ok = 0, algo_id = 0, tile = 0, stages = 0; size_t wr;
        uint32_t red_mask = 0;
        cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_ok, sizeof(split_ok), &wr);
        cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask, sizeof(red_mask), &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id), &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &wr);
        for (int s = 0; s < 8; s++) {
            for (uint32_t red = 1; red <= 4; red <<= 1) {
                cublasLtMatmulAlgo_t a = res[i].algo;
                cublasLtMatmulHeuristicResult_t chk;
                int32_t sp = splits[s]; uint32_t rr = sp == 1 ? 0 : red;
                if (sp == 1 && red != 1) break;
                if (sp > 1 && g_no_split) break;
                if (sp > 1 && (!split_ok || !(red_mask & red))) continue;
                if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sp, sizeof(sp)) ||
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &rr, sizeof(rr)))
                    continue;
                memset(&chk, 0, sizeof(chk));
                if (cublasLtMatmulAlgoCheck(lt, op, la, lb, ld, ld, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
                    chk.workspaceSize > ws_bytes) continue;
                float us = time_one(op, la, lb, ld, &a, w, x, y, acc ? 1.0f : 0.0f, alpha);
                if (us < 0) { cudaGetLastError(); continue; }
                printf("  algo %d id %d tile %d stages %d split %d red %u: %.1f us\n",
                       i, algo_id, tile, stages, sp, rr, us);
                if (us < best) { best = us; snprintf(bname, sizeof(bname), "algo %d split %d red %u", i, sp, rr); }
            }
        }
    }
    printf("BEST t=%d o=%d k=%d %s%s: %s %.1f us (%.2f TB/s of weights, "
           "%.0f TFLOP/s)\n", n_tok, n_out, n_in,
           mode_name[vec], acc ? " +=" : "", bname, best, (double)n_out * n_in / (best * 1e-6) / 1e12,
           2.0 * n_tok * n_out * n_in / (best * 1e-6) / 1e12);
    cudaFree(w); cudaFree(x); cudaFree(y); cudaFree(sw); cudaFree(sx); cudaFree(alpha);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

int main(int argc, char **argv)
{
    static const int shapes[4][3] = {{6144, 4096, 0}, {4096, 4096, 1}, {28672, 4096, 0}, {4096, 14336, 1}};
    static const int toks[] = {64, 128, 256}, ptoks[] = {2048};
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, ws_bytes)); CK(cudaMalloc(&flush, 128u << 20));
    if (argc > 1 && strcmp(argv[1], "--prefill") == 0) {
        g_no_split = 1;
        for (size_t t = 0; t < sizeof(ptoks) / sizeof(ptoks[0]); t++)
            for (int s = 0; s < 4; s++)
                for (int m = 1; m <= 5; m++) {
                    if (shapes[s][2]) /* o, down: f32 += as the engine */
                        probe(ptoks[t], shapes[s][0], shapes[s][1], m, 1);
                    probe(ptoks[t], shapes[s][0], shapes[s][1], m, 0);
                }
        return 0;
    }
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++) {
            probe(toks[t], shapes[s][0], shapes[s][1], 1, shapes[s][2]);
            probe(toks[t], shapes[s][0], shapes[s][1], 0, 0);
        }
    return 0;
}
