/*
 * quant_fp8.cu - E4M3 quantization of weights and GEMM inputs, and the
 * scaled epilogue of the cuBLASLt FP8 GEMM (fp8.h).  One block per row:
 * a max-abs reduction when the scale is the row's, then every element
 * through bt_f32_to_e4m3 (common/bt_fp8.h, the cpu's own rounding), so
 * the codes are bit for bit those of cpu__fp8_quant_rows and the cpu's
 * weight quantization.  The GEMM inputs that an RMSNorm or a SwiGLU
 * produces are made in the same kernel (the row's bf16 values computed
 * as rmsnorm.cu / swiglu.cu compute them, once for the absmax and again
 * for the codes), so a layer in precision fp8 has one small kernel in
 * front of each GEMM, as the bf16 path has one unfused norm or SwiGLU;
 * the bf16 kernels themselves are untouched.
 * The conversions run on Hopper's cvt instructions (fp8_cvt.cuh: the
 * software routine was the cost of the SwiGLU / norm + quantize kernels
 * on an H100 trace, ~16 us for one 14,336-wide row at batch 1), bit for
 * bit bt_f32_to_e4m3 / bt_e4m3_to_f32.
 * Test: build-DIR/gpu/test_cuda_fp8.
 */
#include "fp8.h"

#include "bt_fp8.h"
#include "bt_util.h"
#include "fp8_cvt.cuh"
#include "kern_common.cuh"
#include "quant_fp8.cuh"

#define QF8_THREADS 256

/* Where the values of a quantized row come from. */
#define QF8_PLAIN 0 /* x itself */
#define QF8_NORM 1  /* bf16(g * (inv * x)), x the f32 residual row */
#define QF8_GLU 2   /* bf16(silu(x[i]) * x[k + i]), x a gate|up row */

/* Row blockIdx.x of x (stride ldx) -> codes / bf16 values (ld, zero
 * padded) and its scale: in_scale when > 0, else absmax / 448 of the k
 * values the row gives (MODE). */
template <typename T, int MODE>
static __global__ void __launch_bounds__(QF8_THREADS)
qf8_rows_kernel(const T *x, size_t ldx, int k, int ld, float in_scale,
                uint8_t *q, bf16_t *xv, float *xs, const bf16_t *g,
                float eps)
{
    __shared__ float sh[32];
    const T *xr = x + (size_t)blockIdx.x * ldx;
    float s = in_scale, ninv = 0.0f;

    kern_pdl_wait();
    kern_pdl_trigger();
    if (MODE == QF8_NORM) {
        /* rmsnorm.cu's arithmetic: 1 / sqrtf(mean(x^2) + eps) */
        float ss = 0.0f;

        for (int i = threadIdx.x; i < k; i += blockDim.x) {
            const float v = kern_to_f(xr[i]);
            ss += v * v;
        }
        ss = kern_block_sum(ss, sh);
        ninv = 1.0f / sqrtf(ss / (float)k + eps);
    }
    /* value i of the row, as the bf16 kernel producing it would store it */
    auto val = [&](int i) -> float {
        if (MODE == QF8_NORM)
            return qf8_norm_val(__bfloat162float(g[i]), ninv,
                                kern_to_f(xr[i]));
        if (MODE == QF8_GLU)
            return qf8_glu_val(kern_to_f(xr[i]), kern_to_f(xr[k + i]));
        return kern_to_f(xr[i]);
    };
    if (!(s > 0.0f)) {
        float amax = 0.0f;

        for (int i = threadIdx.x; i < k; i += blockDim.x)
            amax = fmaxf(amax, fabsf(val(i)));
        s = bt_fp8_scale(qf8_block_max(amax, sh));
    }
    const float inv = 1.0f / s;
    for (int i = threadIdx.x; i < ld; i += blockDim.x) {
        const uint8_t c = i < k ? fp8_e4m3(val(i) * inv) : (uint8_t)0;
        if (q != NULL)
            q[(size_t)blockIdx.x * ld + i] = c;
        if (xv != NULL)
            xv[(size_t)blockIdx.x * ld + i] =
                __float2bfloat16_rn(bt_e4m3_to_f32(c));
    }
    if (threadIdx.x == 0 && xs != NULL)
        xs[blockIdx.x] = s;
}

/* The GEMM inputs' kernel (2026-12-05: qf8_rows_kernel's element loops
 * are a dependent load each, 11-33 us a row on the H200): the row's
 * values computed once into registers from 16-byte loads (all in
 * flight), its absmax, then its codes 8 at a time.  QF8_VEC_THREADS a
 * row, QF8_VEC_NV chunks of 8 values a thread at most: k % 8 == 0, k <=
 * 8 QF8_VEC_NV QF8_VEC_THREADS, 16-byte aligned rows (qf8_vec_nv).  The
 * values are qf8_rows_kernel's own; only the RMSNorm's sum of squares
 * is added in another order (QF8_VEC_THREADS: quant_fp8.cuh, whose order
 * the fused 1-token GEMV repeats). */
#define QF8_VEC_NV 4

/* 8 consecutive bf16 values as floats (the norm's weights). */
static __device__ __forceinline__ void qf8_ld8(const bf16_t *p,
                                               float (&v)[8])
{
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const bf16_t *e = reinterpret_cast<const bf16_t *>(&u);
#pragma unroll
    for (int j = 0; j < 8; j++)
        v[j] = __bfloat162float(e[j]);
}

template <typename T> struct qf8_raw {
    static constexpr int U = sizeof(T) / 2; /* 16-byte words, 8 values */
    uint4 w[U];
};

template <typename T>
static __device__ __forceinline__ void qf8_raw_ld(const T *p, qf8_raw<T> &r)
{
#pragma unroll
    for (int u = 0; u < qf8_raw<T>::U; u++)
        r.w[u] = reinterpret_cast<const uint4 *>(p)[u];
}

template <typename T>
static __device__ __forceinline__ void qf8_raw_f(const qf8_raw<T> &r,
                                                 float (&v)[8])
{
    const T *e = reinterpret_cast<const T *>(r.w);
#pragma unroll
    for (int j = 0; j < 8; j++)
        v[j] = kern_to_f(e[j]);
}

/* A row's chunks as this thread holds them before any arithmetic
 * (GLU: the up half in b), QF8_VEC_THREADS threads a row, chunk j of
 * thread t at column 8 (t + j QF8_VEC_THREADS). */
template <typename T, int MODE, int NV> struct qf8_row_raw {
    qf8_raw<T> a[NV], b[MODE == QF8_GLU ? NV : 1];
};

template <typename T, int MODE, int NV>
static __device__ __forceinline__ void
qf8_fetch(const T *xr, int k, qf8_row_raw<T, MODE, NV> &r)
{
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * QF8_VEC_THREADS) * 8;
        if (i < k) {
            qf8_raw_ld(xr + i, r.a[j]);
            if (MODE == QF8_GLU)
                qf8_raw_ld(xr + k + i, r.b[MODE == QF8_GLU ? j : 0]);
        }
    }
}

/* The row's values from its chunks (0 past k; GLU: SwiGLU's bf16). */
template <typename T, int MODE, int NV>
static __device__ __forceinline__ void
qf8_values(const qf8_row_raw<T, MODE, NV> &r, int k, float (&v)[NV][8])
{
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * QF8_VEC_THREADS) * 8;
        if (i < k) {
            qf8_raw_f(r.a[j], v[j]);
            if (MODE == QF8_GLU) {
                float u[8];
                qf8_raw_f(r.b[MODE == QF8_GLU ? j : 0], u);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[j][e] = qf8_glu_val(v[j][e], u[e]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[j][e] = 0.0f;
        }
    }
}

/* The rest of a row once its values are in v: the RMSNorm (MODE
 * QF8_NORM: the sum of squares in this thread-chunk order, then
 * kern_block_sum), the scale (in_scale, or the block's absmax / 448),
 * the codes and their bf16 values of row `row`. */
template <int MODE, int NV>
static __device__ __forceinline__ void
qf8_vec_finish(float (&v)[NV][8], int row, int k, int ld, float in_scale,
               uint8_t *q, bf16_t *xv, float *xs, const bf16_t *g,
               float eps, float *sh)
{
    float s = in_scale, amax = 0.0f;

    if (MODE == QF8_NORM) {
        /* rmsnorm.cu's arithmetic: 1 / sqrtf(mean(x^2) + eps) */
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                ss += v[j][e] * v[j][e];
        ss = kern_block_sum(ss, sh);
        const float ninv = 1.0f / sqrtf(ss / (float)k + eps);
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int i = (threadIdx.x + j * QF8_VEC_THREADS) * 8;
            if (i < k) {
                float gv[8];
                qf8_ld8(g + i, gv);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[j][e] = qf8_norm_val(gv[e], ninv, v[j][e]);
            }
        }
    }
    if (!(s > 0.0f)) {
#pragma unroll
        for (int j = 0; j < NV; j++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                amax = fmaxf(amax, fabsf(v[j][e]));
        s = bt_fp8_scale(qf8_block_max(amax, sh));
    }
    const float inv = 1.0f / s;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = (threadIdx.x + j * QF8_VEC_THREADS) * 8;
        if (i < ld) { /* codes past k (up to ld) are the zero padding */
            /* k % 8 == 0: a chunk is all in the row or all padding.  The
             * hardware conversions (fp8_cvt.cuh, bt's codes bit for bit):
             * the software ones were ~25 branchy instructions an element
             * and, with xv, the software conversion back again, in a
             * kernel on the critical path (~16 us for one 14,336 row at
             * batch 1 on the H100 trace). */
            uint32_t c[2] = {0, 0};
            if (i < k) {
                c[0] = fp8_e4m3x4(v[j][0] * inv, v[j][1] * inv,
                                  v[j][2] * inv, v[j][3] * inv);
                c[1] = fp8_e4m3x4(v[j][4] * inv, v[j][5] * inv,
                                  v[j][6] * inv, v[j][7] * inv);
            }
            if (q != NULL)
                *reinterpret_cast<uint2 *>(q + (size_t)row * ld + i) =
                    make_uint2(c[0], c[1]);
            if (xv != NULL) {
                const uint2 lo = fp8_e4m3x4_to_bf16x4(c[0]);
                const uint2 hi = fp8_e4m3x4_to_bf16x4(c[1]);
                *reinterpret_cast<uint4 *>(xv + (size_t)row * ld +
                                           i) =
                    make_uint4(lo.x, lo.y, hi.x, hi.y);
            }
        }
    }
    if (threadIdx.x == 0 && xs != NULL)
        xs[row] = s;
}

template <typename T, int MODE, int NV>
static __global__ void __launch_bounds__(QF8_VEC_THREADS)
qf8_vec_kernel(const T *x, size_t ldx, int k, int ld, float in_scale,
               uint8_t *q, bf16_t *xv, float *xs, const bf16_t *g,
               float eps)
{
    __shared__ float sh[32];
    qf8_row_raw<T, MODE, NV> r;
    float v[NV][8];

    kern_pdl_wait();
    kern_pdl_trigger();
    qf8_fetch(x + (size_t)blockIdx.x * ldx, k, r);
    qf8_values(r, k, v);
    qf8_vec_finish<MODE, NV>(v, blockIdx.x, k, ld, in_scale, q, xv, xs, g,
                             eps, sh);
}

/* The SwiGLU rows of a step of many tokens (2026-12-07, H100, the
 * workbench tests/gpu/bench_quant_glu.cu of 1022b14: 0.91 of
 * qf8_vec_kernel's time at 512 to 2,114 rows of 14,336, codes
 * byte-equal; 1.29x its time at 64 rows).
 * qf8_vec_kernel holds a row in the registers of 512 threads (two rows
 * an SM), so between a row's loads and its codes the SM's DRAM traffic
 * rests on one other row; here 256 threads take a row in two passes:
 * pass 1 streams gate|up, QF8_GLU2_U 16-byte loads of each in flight a
 * thread, and keeps the bf16 SwiGLU values (qf8_glu_val, exactly) in
 * shared memory (2 k bytes) with their absmax; pass 2 writes the codes.
 * Five rows an SM at Llama-3-8B's 14,336.  Dynamic or static scale,
 * codes only (xv: qf8_vec_kernel). */
#define QF8_GLU2_THREADS 256
#define QF8_GLU2_U 2
#define QF8_GLU2_MIN_ROWS 256       /* below: qf8_vec_kernel (faster) */
/* k at most: 2 k bytes and sh within 48 KB (no shared-memory opt-in) */
#define QF8_GLU2_MAX_K ((48 * 1024 - 1024) / 2)

static __device__ __forceinline__ uint4 qf8_ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __global__ void __launch_bounds__(QF8_GLU2_THREADS)
qf8_glu2_kernel(const bf16_t *gu, int k, int ld, float in_scale,
                uint8_t *q, float *xs)
{
    extern __shared__ __align__(16) unsigned char qf8_glu2_sm[];
    __shared__ float sh[32];
    uint4 *sv = reinterpret_cast<uint4 *>(qf8_glu2_sm); /* k / 8 chunks */
    const bf16_t *g = gu + (size_t)blockIdx.x * 2 * k, *u = g + k;
    const int n8 = k / 8;
    float s = in_scale, amax = 0.0f;

    kern_pdl_wait();
    kern_pdl_trigger();
    for (int c0 = threadIdx.x; c0 < n8; c0 += QF8_GLU2_THREADS * QF8_GLU2_U) {
        uint4 gv[QF8_GLU2_U], uv[QF8_GLU2_U];
#pragma unroll
        for (int j = 0; j < QF8_GLU2_U; j++) {
            const int c = c0 + j * QF8_GLU2_THREADS;
            if (c < n8) {
                gv[j] = qf8_ld_stream(g + 8 * (size_t)c);
                uv[j] = qf8_ld_stream(u + 8 * (size_t)c);
            }
        }
#pragma unroll
        for (int j = 0; j < QF8_GLU2_U; j++) {
            const int c = c0 + j * QF8_GLU2_THREADS;
            if (c < n8) {
                const bf16_t *ge = reinterpret_cast<const bf16_t *>(&gv[j]);
                const bf16_t *ue = reinterpret_cast<const bf16_t *>(&uv[j]);
                uint4 o;
                bf16_t *oe = reinterpret_cast<bf16_t *>(&o);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float v = qf8_glu_val(__bfloat162float(ge[e]),
                                                __bfloat162float(ue[e]));
                    amax = fmaxf(amax, fabsf(v));
                    oe[e] = __float2bfloat16_rn(v); /* exact: v is bf16 */
                }
                sv[c] = o;
            }
        }
    }
    /* (qf8_block_max's barriers also publish sv) */
    if (!(s > 0.0f))
        s = bt_fp8_scale(qf8_block_max(amax, sh));
    else
        __syncthreads();
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < ld / 8; c += QF8_GLU2_THREADS) {
        uint32_t w[2] = {0u, 0u}; /* past k: the zero padding */
        if (c < n8) {
            const uint4 o = sv[c];
            const bf16_t *oe = reinterpret_cast<const bf16_t *>(&o);
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = __bfloat162float(oe[e]) * inv;
            w[0] = fp8_e4m3x4(v[0], v[1], v[2], v[3]);
            w[1] = fp8_e4m3x4(v[4], v[5], v[6], v[7]);
        }
        *reinterpret_cast<uint2 *>(q + (size_t)blockIdx.x * ld + 8 * c) =
            make_uint2(w[0], w[1]);
    }
    if (threadIdx.x == 0 && xs != NULL)
        xs[blockIdx.x] = s;
}

/* Chunks a thread of qf8_vec_kernel holds for rows of k (0: the row
 * kernel must take them).  ld (a multiple of 16) is at most k rounded up
 * to 16, so the padding codes are written by the chunk threads too. */
static int qf8_vec_nv(int k, int ld, size_t ldx, size_t es, const void *x,
                      const void *q, const void *xv, const void *g)
{
    if (k % 8 != 0 || ld > k + 8 || (ldx * es) % 16 != 0 ||
        (uintptr_t)x % 16 != 0 || (uintptr_t)q % 16 != 0 ||
        (uintptr_t)xv % 16 != 0 || (uintptr_t)g % 16 != 0 ||
        ((size_t)k * es) % 16 != 0)
        return 0;
    int nv = (int)BT_DIV_UP(ld, 8 * QF8_VEC_THREADS);
    return nv <= 1 ? 1 : nv <= 2 ? 2 : nv <= QF8_VEC_NV ? QF8_VEC_NV : 0;
}

/* Launches the row quantization of n rows: the vector kernel when it
 * takes the shape, else the row kernel. */
template <typename T, int MODE>
static void qf8_rows_launch(int n, const T *x, size_t ldx, int k, int ld,
                            float in_scale, uint8_t *q, bf16_t *xv,
                            float *xs, const bf16_t *g, float eps,
                            cudaStream_t stream)
{
    const int nv = qf8_vec_nv(k, ld, ldx, sizeof(T), x, q, xv, g);
    switch (nv) {
    case 1:
        kern_launch(qf8_vec_kernel<T, MODE, 1>, dim3(n),
                    dim3(QF8_VEC_THREADS), 0, stream, x, ldx, k, ld,
                    in_scale, q, xv, xs, g, eps);
        break;
    case 2:
        kern_launch(qf8_vec_kernel<T, MODE, 2>, dim3(n),
                    dim3(QF8_VEC_THREADS), 0, stream, x, ldx, k, ld,
                    in_scale, q, xv, xs, g, eps);
        break;
    case QF8_VEC_NV:
        kern_launch(qf8_vec_kernel<T, MODE, QF8_VEC_NV>, dim3(n),
                    dim3(QF8_VEC_THREADS), 0, stream, x, ldx, k, ld,
                    in_scale, q, xv, xs, g, eps);
        break;
    default:
        kern_launch(qf8_rows_kernel<T, MODE>, dim3(n), dim3(QF8_THREADS), 0,
                    stream, x, ldx, k, ld, in_scale, q, xv, xs, g, eps);
        break;
    }
}

bt_status_t cuda_fp8_quant_weight(const float *d_w, int rows, int k, int ld,
                                  uint8_t *d_q, float *d_ws,
                                  cudaStream_t stream)
{
    if (rows <= 0 || k <= 0 || ld < k || ld % 16 != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 weight quantization of %d x %d (ld %d)", rows,
                        k, ld);
    qf8_rows_kernel<float, QF8_PLAIN><<<rows, QF8_THREADS, 0, stream>>>(
        d_w, (size_t)k, k, ld, 0.0f, d_q, (bf16_t *)NULL, d_ws,
        (const bf16_t *)NULL, 0.0f);
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_fp8_quant_act(const void *d_x, cuda_dtype_t dt, int n_tok,
                               int k, int ld, float in_scale, uint8_t *d_q,
                               void *d_xv, float *d_xs, cudaStream_t stream)
{
    if (n_tok <= 0)
        return BT_OK;
    if (k <= 0 || ld < k || ld % 16 != 0 || in_scale < 0.0f)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 input quantization of %d x %d (ld %d, scale "
                        "%g)", n_tok, k, ld, (double)in_scale);
    KERN_DISPATCH_DT(dt, T,
                     qf8_rows_launch<T, QF8_PLAIN>(
                         n_tok, (const T *)d_x, (size_t)k, k, ld, in_scale,
                         d_q, (bf16_t *)d_xv, d_xs, (const bf16_t *)NULL,
                         0.0f, stream));
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_fp8_norm_quant(const float *d_x, const void *d_g, float eps,
                                int n_tok, int k, int ld, float in_scale,
                                uint8_t *d_q, void *d_xv, float *d_xs,
                                cudaStream_t stream)
{
    if (n_tok <= 0)
        return BT_OK;
    if (k <= 0 || ld < k || ld % 16 != 0 || in_scale < 0.0f)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 norm + quantization of %d x %d (ld %d)", n_tok,
                        k, ld);
    qf8_rows_launch<float, QF8_NORM>(n_tok, d_x, (size_t)k, k, ld, in_scale,
                                     d_q, (bf16_t *)d_xv, d_xs,
                                     (const bf16_t *)d_g, eps, stream);
    return BT_CUDA_LAUNCH_STATUS();
}

bt_status_t cuda_fp8_glu_quant(const void *d_gu, int n_tok, int k, int ld,
                               float in_scale, uint8_t *d_q, void *d_xv,
                               float *d_xs, cudaStream_t stream)
{
    if (n_tok <= 0)
        return BT_OK;
    if (k <= 0 || ld < k || ld % 16 != 0 || in_scale < 0.0f)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 SwiGLU + quantization of %d x %d (ld %d)",
                        n_tok, k, ld);
    if (n_tok >= QF8_GLU2_MIN_ROWS && d_q != NULL && d_xv == NULL &&
        k % 8 == 0 && k <= QF8_GLU2_MAX_K && ld % 8 == 0 &&
        (uintptr_t)d_gu % 16 == 0 && (uintptr_t)d_q % 8 == 0) {
        kern_launch(qf8_glu2_kernel, dim3(n_tok), dim3(QF8_GLU2_THREADS),
                    (size_t)2 * k, stream, (const bf16_t *)d_gu, k, ld,
                    in_scale, d_q, d_xs);
        return BT_CUDA_LAUNCH_STATUS();
    }
    qf8_rows_launch<bf16_t, QF8_GLU>(n_tok, (const bf16_t *)d_gu,
                                     (size_t)2 * k, k, ld, in_scale, d_q,
                                     (bf16_t *)d_xv, d_xs,
                                     (const bf16_t *)NULL, 0.0f, stream);
    return BT_CUDA_LAUNCH_STATUS();
}

/* Four values a thread through fp8_cvt.cuh's helpers (the test's). */
static __global__ void __launch_bounds__(QF8_THREADS)
qf8_cvt_check_kernel(const float *x, int n, uint8_t *q, uint8_t *q1,
                     uint16_t *xv)
{
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;

    if (i >= n)
        return;
    uint32_t w = 0;
    if (i + 4 <= n) {
        w = fp8_e4m3x4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else {
        for (int e = 0; i + e < n; e++)
            w |= (uint32_t)fp8_e4m3(x[i + e]) << (8 * e);
    }
    const uint2 b = fp8_e4m3x4_to_bf16x4(w);
    const uint16_t bv[4] = {(uint16_t)b.x, (uint16_t)(b.x >> 16),
                            (uint16_t)b.y, (uint16_t)(b.y >> 16)};
    for (int e = 0; e < 4 && i + e < n; e++) {
        q[i + e] = (uint8_t)(w >> (8 * e));
        if (q1 != NULL)
            q1[i + e] = fp8_e4m3(x[i + e]);
        if (xv != NULL)
            xv[i + e] = bv[e];
    }
}

bt_status_t cuda_fp8_cvt_check(const float *d_x, int n, uint8_t *d_q,
                               uint8_t *d_q1, uint16_t *d_xv,
                               cudaStream_t stream)
{
    if (n < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA", "fp8 cvt check of %d",
                        n);
    if (n == 0)
        return BT_OK;
    const int blocks = (int)BT_DIV_UP(BT_DIV_UP(n, 4), QF8_THREADS);
    qf8_cvt_check_kernel<<<blocks, QF8_THREADS, 0, stream>>>(d_x, n, d_q,
                                                            d_q1, d_xv);
    return BT_CUDA_LAUNCH_STATUS();
}

/* y[t, n] (+)= acc[t, n] * xs[t] * ws[n]: the cpu epilogue's arithmetic
 * (cpu__fp8_epilogue: (acc * xs) * ws).  Grid (column blocks, n_tok). */
template <typename OUT>
static __global__ void __launch_bounds__(QF8_THREADS)
qf8_scale_out_kernel(const float *acc, int ld_acc, const float *xs,
                     const float *ws, int n_out, OUT *y, bool accumulate)
{
    const int t = blockIdx.y;
    const int n = blockIdx.x * blockDim.x + threadIdx.x;

    kern_pdl_wait();
    kern_pdl_trigger();
    if (n >= n_out)
        return;
    float v = acc[(size_t)t * ld_acc + n] * xs[t] * ws[n];
    OUT *d = y + (size_t)t * n_out + n;
    if (accumulate)
        v += kern_to_f(*d);
    *d = kern_from_f<OUT>(v);
}

bt_status_t cuda_fp8_scale_out(const float *d_acc, int ld_acc,
                               const float *d_xs, const float *d_ws,
                               int n_tok, int n_out, void *d_y,
                               cuda_dtype_t out_dt, bool accumulate,
                               cudaStream_t stream)
{
    if (n_tok <= 0 || n_out <= 0)
        return BT_OK;
    if (ld_acc < n_out || n_tok > 65535)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "fp8 epilogue of %d x %d (ld %d)", n_tok, n_out,
                        ld_acc);
    dim3 grid((n_out + QF8_THREADS - 1) / QF8_THREADS, n_tok);
    KERN_DISPATCH_DT(out_dt, OUT,
                     kern_launch(qf8_scale_out_kernel<OUT>, grid,
                                 dim3(QF8_THREADS), 0, stream, d_acc, ld_acc,
                                 d_xs, d_ws, n_out, (OUT *)d_y, accumulate));
    return BT_CUDA_LAUNCH_STATUS();
}
