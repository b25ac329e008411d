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
 * Test: build-DIR/gpu/test_cuda_fp8.
 */
#include "fp8.h"

#include "bt_fp8.h"
#include "kern_common.cuh"

#define QF8_THREADS 256

static __device__ __forceinline__ float qf8_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;

    v = kern_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return kern_warp_max(v);
}

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
            return __bfloat162float(__float2bfloat16_rn(
                __bfloat162float(g[i]) * (ninv * kern_to_f(xr[i]))));
        if (MODE == QF8_GLU)
            return __bfloat162float(__float2bfloat16_rn(kern_swiglu_f(
                kern_to_f(xr[i]), kern_to_f(xr[k + i]))));
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
        const uint8_t c =
            i < k ? bt_f32_to_e4m3(val(i) * inv) : (uint8_t)0;
        if (q != NULL)
            q[(size_t)blockIdx.x * ld + i] = c;
        if (xv != NULL)
            xv[(size_t)blockIdx.x * ld + i] =
                __float2bfloat16_rn(bt_e4m3_to_f32(c));
    }
    if (threadIdx.x == 0 && xs != NULL)
        xs[blockIdx.x] = s;
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
                     kern_launch(qf8_rows_kernel<T, QF8_PLAIN>, dim3(n_tok),
                                 dim3(QF8_THREADS), 0, stream,
                                 (const T *)d_x, (size_t)k, k, ld, in_scale,
                                 d_q, (bf16_t *)d_xv, d_xs,
                                 (const bf16_t *)NULL, 0.0f));
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
    kern_launch(qf8_rows_kernel<float, QF8_NORM>, dim3(n_tok),
                dim3(QF8_THREADS), 0, stream, d_x, (size_t)k, k, ld,
                in_scale, d_q, (bf16_t *)d_xv, d_xs, (const bf16_t *)d_g,
                eps);
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
    kern_launch(qf8_rows_kernel<bf16_t, QF8_GLU>, dim3(n_tok),
                dim3(QF8_THREADS), 0, stream, (const bf16_t *)d_gu,
                (size_t)2 * k, k, ld, in_scale, d_q, (bf16_t *)d_xv, d_xs,
                (const bf16_t *)NULL, 0.0f);
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
