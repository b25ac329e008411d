/*
 * bench_attn_kv8t.cu - workbench: the FP8-KV decode attention's step with
 * the keys as the MMA's rows (the engine's for groups of <= 8 heads since
 * 2026-12-07) with options the engine does not run, against the engine's
 * kernel on the same cache.  ON THE DEVICE MACHINE.
 *
 * Why: on the H200 the engine's FP8-KV decode attention (attn_decode_tc.cu)
 * reads K/V at 0.84 of the board (3.68 TB/s inside 2048/2048's step,
 * 2026-12-07), where the H100 reads 0.93-0.96 of its own.  A byte of FP8
 * cache carries twice the keys of a bf16 one and the H200 brings 1.45x the
 * bytes an SM, so the kernel handles ~1.8x the keys a second that the bf16
 * kernel ever did, and its work per key may be what bounds it.  The
 * engine's step (tc_attend16_kv8) puts the group's heads in the rows of
 * m16n8k16: a group of 4 heads (Llama-3) uses 4 of 16 rows, so per 16 keys
 * a warp runs 32 MMAs, its online softmax works on 8 values a lane of
 * which 4 are empty rows, and it rescales 64 accumulators.
 *
 * The step tc_attend16_kv8t (attn_decode_tc.cuh) turns the products
 * around (the GQA packing of decode kernels that put the query group in
 * the MMA's n):
 *   S^T = K Q^T     m16 = 16 keys, n8 = the group's heads (<= 8), k16 =
 *                   dims: K's codes are the A fragment, converted in
 *                   registers exactly as the engine converts them (the
 *                   same loads, the same tc_kv8_at layout), Q^T the B one;
 *   softmax         per head over the 16 keys: 4 values a lane, a max
 *                   over the 8 lanes of a column, the sums kept per lane
 *                   and added up once at the end;
 *   P^T -> B        two movmatrix.trans (8x8 f16) turn the accumulators
 *                   (key rows, head columns) into the B fragment of
 *   O^T = V^T P^T   m16 = 16 dims (of each lane's 16 contiguous V bytes:
 *                   the engine's V loads and byte permutes), k16 = keys.
 * 16 MMAs per 16 keys instead of 32, 32 accumulators instead of 64.
 * It won in the engine (H100, 2026-12-07, bench_cuda: batch 64 @2k's step
 * -4.3%, the mixed steps' decode -4 to -5%; docs/PERFORMANCE.md), and the
 * heads-as-rows step stays for groups of more than 8 heads.
 * Variants: engine (cuda_attn_decode as it runs) and this file's kernel
 * (the engine's skeleton without the fused RoPE, PDL and masks) around
 * the step with options the engine does not run (template flags, all
 * exact):
 *   lazy  O rescaled only when a running max of the warp moved (else the
 *         factor is 1.0);
 *   alu   codes to f16 by bits instead of cvt.rn.f16x2.e4m3x2
 *         (tc_kv8_f16x2_alu: x 2^-8, taken back in Q's and V's scales):
 *         integer pipes instead of the conversion pipe (alu1: K only,
 *         alu2: K and V);
 * (A 4-deep cp.async ring was dropped unmeasured: ptxas 13.0 compiled
 * its prologue with uniform registers it never wrote, "an illegal
 * instruction" on the H100 (sass_check.py and compute-sanitizer named
 * it), and it holds three blocks an SM where the step holds four.)
 * Split runs merge through a combine kernel as the engine's do.
 *
 * Check: each variant's output against the engine's (max |diff| over max
 * |engine|, bound 1e-2: both round P to f16, the sums run in another
 * order, the outputs are bf16), random E4M3 codes (|value| 1/8 .. 7.5 x
 * the head's scale), shuffled pages.  Times: each variant's median of
 * --reps runs with L2 flushed before each, in the order A B .. B A.
 *   bench_attn_kv8t [--shapes B:CTX[,B:CTX...]] [--reps N]
 * (defaults 300:3072,64:2048,124:2048,1:2048: 2048/2048's and 2048/128's
 * decode rows, batch 64 and batch 1 at 2k; Llama-3-8B's 32 / 8 heads.)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "bench_ab.cuh"
#include "gpu_test_util.h" /* CK */
#include "kernels/attn_decode.h"
#include "kernels/attn_decode_tc.cuh"

#define KT_HD 128
#define KT_WARPS 4
#define KT_TK 64 /* keys a tile: 16 a warp */
#define KT_STAGES 3 /* the engine's */
#define KT_BT 512
#define KT_MAXG 8
#define KT_OROW (KT_HD + 4) /* floats a head's row in the merge */
/* the code stages: [STAGES][TK][HD] bytes of K, then of V */
#define KT_STAGE ((size_t)KT_STAGES * KT_TK * KT_HD)
#define KT_SMEM (2 * KT_STAGE)

/* One block per (KV head, token, key split), as attn_decode_tc_kernel:
 * 4 warps, each the 16 keys of its own in every 64-key tile, the
 * engine's 3-stage cp.async ring of codes per warp, then the warps'
 * states merged in shared memory; out (one split) or the engine's split
 * partials (ws: natural-log max, sum, unnormalized O). */
template <bool LAZY, int ALU>
static __global__ void __launch_bounds__(KT_WARPS * 32)
kv8t_kernel(cuda_attn_args_t a, int split_len, int n_splits, float *ws)
{
    extern __shared__ __align__(16) unsigned char kt_sm[];
    __shared__ int sh_bt[KT_BT];
    uint8_t *sk8 = kt_sm, *sv8 = kt_sm + KT_STAGE;
    const int G = a.n_heads / a.n_kv_heads;
    const int kvh = blockIdx.x, ti = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gr = lane >> 2, tq = lane & 3;
    const int kv_len = a.d_kv_len[ti];
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    const int bs = a.block_size;
    const int *bt = a.d_block_tables + a.d_bt_off[ti];
    const size_t slot_stride = (size_t)a.n_kv_heads * KT_HD;
    const uint8_t *kbase = (const uint8_t *)a.d_k_cache + (size_t)kvh * KT_HD;
    const uint8_t *vbase = (const uint8_t *)a.d_v_cache + (size_t)kvh * KT_HD;
    const int blk0 = start / bs;
    const int n_blk = end > start ? (end - 1) / bs - blk0 + 1 : 0;
    const bool bt_sm = n_blk <= KT_BT;

    if (bt_sm)
        for (int i = threadIdx.x; i < n_blk; i += blockDim.x)
            sh_bt[i] = bt[blk0 + i];
    __syncthreads();
    const int n_tiles = end > start ? (end - start + KT_TK - 1) / KT_TK : 0;
    const uint64_t pol = tc_policy_evict_first();
    auto load_tile = [&](int stage, int kt) {
        const int k = start + kt * KT_TK + warp * 16 + (lane & 15);
        long long off = -1; /* past the split: zero-filled */
        if (k < end) {
            const int blk = k / bs;
            const int bid = bt_sm ? sh_bt[blk - blk0] : bt[blk];
            off = ((long long)bid * bs + (k - blk * bs)) *
                  (long long)slot_stride;
        }
        tc_copy_rows16_kv8<KT_HD>(
            sk8 + (size_t)stage * KT_TK * KT_HD + warp * 16 * KT_HD,
            sv8 + (size_t)stage * KT_TK * KT_HD + warp * 16 * KT_HD, kbase,
            vbase, off, lane, pol);
    };
#pragma unroll 1
    for (int s = 0; s < KT_STAGES - 1; s++) {
        if (s < n_tiles)
            load_tile(s, s);
        tc_cp_commit();
    }

    /* Q as tc_load_q8's fragments, x sl2 (alu: x 2^8 for K's 2^-8) */
    const float sl2 = a.scale * a.d_kv_scale[kvh] * 1.4426950408889634f *
                      (ALU >= 1 ? 256.0f : 1.0f);
    uint32_t qa[KT_HD / 16][4];
    tc_load_q8<KT_HD>(qa,
                      (const bf16_t *)a.d_q +
                          ((size_t)ti * a.n_heads + kvh * G) * KT_HD,
                      G, sl2, lane);
    float o[KT_HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < KT_HD / 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

#pragma unroll 1
    for (int kt = 0; kt < n_tiles; kt++) {
        tc_cp_wait<KT_STAGES - 2>();
        __syncwarp();
        {
            const int nk = kt + KT_STAGES - 1;
            if (nk < n_tiles)
                load_tile(nk % KT_STAGES, nk);
            tc_cp_commit();
        }
        const int kb = start + kt * KT_TK + warp * 16;
        if (kb >= end)
            continue;
        const size_t so =
            (size_t)(kt % KT_STAGES) * KT_TK * KT_HD + warp * 16 * KT_HD;
        tc_attend16_kv8t<KT_HD, false, LAZY, ALU>(qa, sk8 + so, sv8 + so,
                                                  kb, end, end, NULL, o, mA,
                                                  mB, lA, lB, lane);
    }
    tc_cp_wait<0>();
    __syncthreads(); /* the stages become the merge rows */

#pragma unroll
    for (int o2 = 4; o2 <= 16; o2 <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, o2);
        lB += __shfl_xor_sync(0xffffffffu, lB, o2);
    }
    float *sm_o = reinterpret_cast<float *>(kt_sm); /* [W][MAXG][OROW] */
    float *sm_m = sm_o + KT_WARPS * KT_MAXG * KT_OROW;
    float *sm_l = sm_m + KT_WARPS * KT_MAXG;
    float *ow = sm_o + warp * KT_MAXG * KT_OROW;
    const int hA = 2 * tq, hB = 2 * tq + 1;
#pragma unroll
    for (int mt = 0; mt < KT_HD / 16; mt++) {
        const int d0 = 16 * gr + mt, d1 = d0 + 8;
        ow[hA * KT_OROW + d0] = o[mt][0];
        ow[hB * KT_OROW + d0] = o[mt][1];
        ow[hA * KT_OROW + d1] = o[mt][2];
        ow[hB * KT_OROW + d1] = o[mt][3];
    }
    if (gr == 0) {
        sm_m[warp * KT_MAXG + hA] = mA;
        sm_m[warp * KT_MAXG + hB] = mB;
        sm_l[warp * KT_MAXG + hA] = lA;
        sm_l[warp * KT_MAXG + hB] = lB;
    }
    __syncthreads();
    const float vs = a.d_kv_scale[a.n_kv_heads + kvh] *
                     (ALU >= 2 ? 256.0f : 1.0f);
    for (int idx = threadIdx.x; idx < G * KT_HD; idx += blockDim.x) {
        const int g = idx / KT_HD, d = idx - g * KT_HD;
        float mx = -INFINITY, ls = 0.0f, as = 0.0f;
#pragma unroll
        for (int w = 0; w < KT_WARPS; w++)
            mx = fmaxf(mx, sm_m[w * KT_MAXG + g]);
#pragma unroll
        for (int w = 0; w < KT_WARPS; w++) {
            const float mw = sm_m[w * KT_MAXG + g];
            const float sc = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
            ls += sm_l[w * KT_MAXG + g] * sc;
            as += sm_o[(w * KT_MAXG + g) * KT_OROW + d] * sc;
        }
        as *= vs;
        const int h = kvh * G + g;
        if (n_splits == 1) {
            bf16_t *op = (bf16_t *)a.d_out + ((size_t)ti * a.n_heads + h) * KT_HD;
            op[d] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
        } else {
            float *p = ws + (((size_t)ti * a.n_heads + h) * n_splits + split) *
                                (KT_HD + 2);
            p[2 + d] = as;
            if (d == 0) {
                p[0] = mx == -INFINITY ? -INFINITY : mx * 0.6931471805599453f;
                p[1] = ls;
            }
        }
    }
}

/* The split partials of each (token, head) merged (attn_decode.cu's
 * attn_combine_kernel). */
static __global__ void kt_combine(cuda_attn_args_t a, int n_splits,
                                  const float *ws)
{
    const int ti = blockIdx.x, h = blockIdx.y;
    const float *p0 =
        ws + ((size_t)ti * a.n_heads + h) * n_splits * (KT_HD + 2);
    float mx = -INFINITY;

    for (int s = 0; s < n_splits; s++)
        mx = fmaxf(mx, p0[s * (KT_HD + 2)]);
    for (int d = threadIdx.x; d < KT_HD; d += blockDim.x) {
        float ls = 0.0f, as = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float *p = p0 + s * (KT_HD + 2);
            const float sc = p[0] == -INFINITY ? 0.0f : __expf(p[0] - mx);
            ls += p[1] * sc;
            as += p[2 + d] * sc;
        }
        bf16_t *o = (bf16_t *)a.d_out + ((size_t)ti * a.n_heads + h) * KT_HD;
        o[d] = __float2bfloat16_rn(ls > 0.0f ? as / ls : 0.0f);
    }
}

/* Random E4M3 codes: sign, exponent 4..9 (|value| 1/8 .. 7.5), mantissa. */
static __global__ void kt_fill_codes(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 0x9E3779B1u ^ seed;
        x ^= x >> 15;
        x *= 0x2C1B3C6Du;
        x ^= x >> 12;
        p[i] = (uint8_t)((x & 0x80u) | ((((x >> 8) % 6u) + 4u) << 3) |
                         ((x >> 16) & 7u));
    }
}

/* Random bf16 in [-4, 4). */
static __global__ void kt_fill_q(bf16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 0x85EBCA6Bu ^ seed;
        x ^= x >> 13;
        x *= 0xC2B2AE35u;
        x ^= x >> 16;
        p[i] = __float2bfloat16_rn(((float)(x & 0xFFFFu) / 65536.0f) * 8.0f -
                                   4.0f);
    }
}

typedef void (*kt_kernel_t)(cuda_attn_args_t, int, int, float *);

struct kt_variant {
    const char *name;
    kt_kernel_t kern; /* NULL: the engine's cuda_attn_decode */
};

static const kt_variant kt_variants[] = {
    {"engine", NULL},
    {"t", kv8t_kernel<false, 0>},
    {"t+lazy", kv8t_kernel<true, 0>},
    {"t+alu1", kv8t_kernel<false, 1>},
    {"t+alu2", kv8t_kernel<false, 2>},
    {"t+lazy+alu2", kv8t_kernel<true, 2>},
};
#define KT_NV ((int)(sizeof(kt_variants) / sizeof(kt_variants[0])))

static void kt_run(const kt_variant &v, const cuda_attn_args_t &a, int B,
                   int ns, int sl, float *ws)
{
    if (v.kern == NULL) {
        if (cuda_attn_decode(&a, NULL, B, ns, sl, ws, CUDA_DT_BF16, 0) !=
            BT_OK) {
            fprintf(stderr, "bench_attn_kv8t: cuda_attn_decode failed\n");
            exit(1);
        }
        return;
    }
    v.kern<<<dim3(a.n_kv_heads, B, ns), KT_WARPS * 32,
             KT_SMEM>>>(a, sl, ns, ws);
    if (ns > 1)
        kt_combine<<<dim3(B, a.n_heads), KT_HD>>>(a, ns, ws);
}

int main(int argc, char **argv)
{
    const char *shapes = "300:3072,64:2048,124:2048,1:2048";
    int reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shapes"))
            shapes = argv[i + 1];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    const int nh = 32, nkv = 8, bs = 16;
    int dev = 0, n_sm = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    n_sm = prop.multiProcessorCount;
    for (int v = 0; v < KT_NV; v++)
        if (kt_variants[v].kern != NULL)
            CK(cudaFuncSetAttribute(
                kt_variants[v].kern,
                cudaFuncAttributeMaxDynamicSharedMemorySize,
                (int)KT_SMEM));
    int occ_t = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &occ_t, kv8t_kernel<false, 0>, KT_WARPS * 32, KT_SMEM));
    const int occ_e = cuda_attn_decode_blocks_per_sm(KT_HD, true, nh / nkv);

    printf("bench_attn_kv8t on %s (%d SMs): blocks an SM engine %d, t %d\n",
           prop.name, n_sm, occ_e, occ_t);
    printf("| rows | ctx | splits | variant | us | TB/s | / engine | max err |\n");
    printf("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", shapes);
    int bad = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int B = 0, ctx = 0;
        if (sscanf(tok, "%d:%d", &B, &ctx) != 2 || B < 1 || ctx < 1) {
            fprintf(stderr, "bench_attn_kv8t: bad shape %s\n", tok);
            return 2;
        }
        const int nbs = (ctx + bs - 1) / bs, nb = B * nbs;
        const size_t kv = (size_t)nb * bs * nkv * KT_HD;
        std::vector<int> h((size_t)nb + 4 * (size_t)B);
        int *btab = h.data(), *kvl = btab + nb, *bto = kvl + B,
            *ctxa = bto + B, *mo = ctxa + B;
        uint32_t r = 12345;
        for (int i = 0; i < nb; i++)
            btab[i] = i;
        for (int i = nb - 1; i > 0; i--) { /* a used pool: shuffled */
            r = r * 1664525u + 1013904223u;
            std::swap(btab[i], btab[(int)(r % (uint32_t)(i + 1))]);
        }
        for (int b = 0; b < B; b++) {
            kvl[b] = ctx;
            bto[b] = b * nbs;
            ctxa[b] = ctx - 1;
            mo[b] = -1;
        }
        int *d_meta;
        bf16_t *q, *out, *ref;
        uint8_t *kc, *vc;
        float *ws, *d_scale;
        CK(cudaMalloc((void **)&d_meta, h.size() * sizeof(int)));
        CK(cudaMemcpy(d_meta, h.data(), h.size() * sizeof(int),
                      cudaMemcpyHostToDevice));
        CK(cudaMalloc((void **)&q, (size_t)B * nh * KT_HD * 2));
        CK(cudaMalloc((void **)&out, (size_t)B * nh * KT_HD * 2));
        CK(cudaMalloc((void **)&ref, (size_t)B * nh * KT_HD * 2));
        CK(cudaMalloc((void **)&kc, kv));
        CK(cudaMalloc((void **)&vc, kv));
        CK(cudaMalloc((void **)&ws,
                      4 * cuda_attn_decode_ws_floats(B, nh, KT_HD, 64) + 4));
        kt_fill_codes<<<1024, 256>>>(kc, kv, 0x1234u);
        kt_fill_codes<<<1024, 256>>>(vc, kv, 0x5678u);
        kt_fill_q<<<256, 256>>>(q, (size_t)B * nh * KT_HD, 0x9abcu);
        {
            float sc[2 * 8];
            for (int i = 0; i < 2 * nkv; i++)
                sc[i] = i < nkv ? 0.5f + 0.05f * i : 0.02f + 0.01f * i;
            CK(cudaMalloc((void **)&d_scale, sizeof(sc)));
            CK(cudaMemcpy(d_scale, sc, sizeof(sc), cudaMemcpyHostToDevice));
        }
        cuda_attn_args_t a;
        memset(&a, 0, sizeof(a));
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = KT_HD;
        a.block_size = bs;
        a.scale = 0.08838834764f;
        a.d_q = q;
        a.d_k_cache = kc;
        a.d_v_cache = vc;
        a.d_kv_scale = d_scale;
        a.d_block_tables = d_meta;
        a.d_kv_len = d_meta + nb;
        a.d_bt_off = a.d_kv_len + B;
        a.d_ctx_len = a.d_bt_off + B;
        a.d_mask_off = a.d_ctx_len + B;
        int ns, sl;
        cuda_attn_decode_plan(B, ctx, nh, nkv, n_sm, occ_e, 64, &ns, &sl);

        /* the check: every variant against the engine */
        const size_t n_out = (size_t)B * nh * KT_HD;
        std::vector<uint16_t> hr(n_out), ho(n_out);
        double err[KT_NV] = {0};
        a.d_out = ref;
        kt_run(kt_variants[0], a, B, ns, sl, ws);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hr.data(), ref, n_out * 2, cudaMemcpyDeviceToHost));
        double rmax = 0.0;
        for (size_t i = 0; i < n_out; i++)
            rmax = std::max(rmax, (double)fabsf(f32_of_bf16(hr[i])));
        a.d_out = out;
        for (int v = 1; v < KT_NV; v++) {
            CK(cudaMemset(out, 0xFF, n_out * 2)); /* NaN until written */
            kt_run(kt_variants[v], a, B, ns, sl, ws);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(ho.data(), out, n_out * 2, cudaMemcpyDeviceToHost));
            double m = 0.0;
            for (size_t i = 0; i < n_out; i++) {
                const double d =
                    fabs((double)f32_of_bf16(ho[i]) - f32_of_bf16(hr[i]));
                m = d == d ? std::max(m, d) : INFINITY;
            }
            err[v] = rmax > 0.0 ? m / rmax : m;
            if (!(err[v] <= 1e-2))
                bad = 1;
        }

        /* times: A B .. B A, the median of each variant's runs */
        const std::vector<double> t = bench_ab_medians_us(
            KT_NV, reps, [&](int v) {
                kt_run(kt_variants[v], a, B, ns, sl, ws);
            });
        const double bytes = 2.0 * B * (double)ctx * nkv * KT_HD;
        for (int v = 0; v < KT_NV; v++) {
            const double us = t[v];
            char e[32] = "-";
            if (v > 0)
                snprintf(e, sizeof(e), "%.1e", err[v]);
            printf("| %d | %d | %d x %d | %s | %.1f | %.2f | %.3f | %s |\n", B,
                   ctx, ns, sl, kt_variants[v].name, us,
                   bytes / (us * 1e-6) / 1e12, us / t[0], e);
        }
        fflush(stdout);
        cudaFree(d_meta);
        cudaFree(q);
        cudaFree(out);
        cudaFree(ref);
        cudaFree(kc);
        cudaFree(vc);
        cudaFree(ws);
        cudaFree(d_scale);
    }
    printf("%s\n", bad ? "FAIL: a variant differs from the engine by more "
                         "than 1e-2 of its largest output"
                       : "check: every variant within 1e-2 of the engine");
    return bad;
}
