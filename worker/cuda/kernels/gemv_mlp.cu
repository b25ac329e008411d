/*
 * gemv_mlp.cu - the SwiGLU MLP of a 1-2 token decode step in one
 * persistent kernel (gemv_mlp.h):
 *
 *   phase A  every block stages n = rmsnorm(x) . g in shared memory; each
 *            pair of warps streams a contiguous range of (gate, up) row
 *            pairs of w_gu, the even warp the gate rows, the odd warp the
 *            up rows, and keeps the row sums in shared memory; the block
 *            writes h = silu(gate) * up of its pairs to global memory;
 *   barrier  a grid-wide barrier (all blocks are resident: the grid is at
 *            most one wave), before which every warp has issued the loads
 *            of its first down chunks;
 *   phase B  each warp streams a contiguous range of w_down's rows
 *            against h and adds the sums into x.
 *
 * Why: at batch 1 a rows GEMV loses ~3.5 us at the boundary to the next
 * one (ARCHITECTURE.md "Batch 1 after round 15"): the next kernel's
 * blocks only start loading as the slots of the one in front free up.
 * Here the same blocks go on from gate|up into down, with loads in
 * flight across the barrier.
 *
 * Every row is summed exactly as the rows kernel (gemv.cu) sums it: lane
 * l takes chunks l + 32 u + 128 k, 4 a step, in order, then a warp sum;
 * the gate and up sums are rounded to bf16 before the SwiGLU, and h is
 * bf16.  So h and x match cuda_gemv_norm_glu then the rows GEMV bit for
 * bit (test_gemm checks it).
 */
#include "gemv_mlp.h"

#include "bt_util.h"
#include "gemv_common.cuh"
#include "kern_common.cuh"

#define MLP_WARPS 8
#define MLP_THREADS (MLP_WARPS * 32)
#define MLP_U 4             /* chunks a lane loads a step (the rows kernel's) */
#define MLP_STEP (32 * MLP_U)
#define MLP_BLOCKS_PER_SM 4 /* <= 64 registers a thread */
#define MLP_SMEM_MAX (40 * 1024)
/* A barrier wait longer than this is a bug (a block that never became
 * resident): trap instead of hanging the stream. */
#define MLP_BARRIER_TIMEOUT_NS 10000000000ull

/* One warp's stream over n_rows contiguous rows of a row-major bf16
 * matrix (n_in wide, n_in / 8 a multiple of MLP_STEP): start() issues the
 * first MLP_U loads (weights only: legal before the PDL wait or the grid
 * barrier), run() multiplies the rows by x (T rows of n_in, through
 * ordinary loads) and hands each row's warp-summed dot products to
 * put(row, sums) -- the rows kernel's loop with rows per warp > 1. */
template <int T>
struct mlp_stream {
    const uint4 *w;
    int n_ch, n_tot, lane;
    uint4 cur[MLP_U];

    __device__ __forceinline__ void start(const bf16_t *rows, int n_rows,
                                          int n_in)
    {
        lane = threadIdx.x & 31;
        n_ch = n_in / 8;
        n_tot = n_rows * n_ch;
        w = reinterpret_cast<const uint4 *>(rows);
#pragma unroll
        for (int u = 0; u < MLP_U; u++) {
            const int c = lane + 32 * u;
            cur[u] = c < n_tot ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
        }
    }

    template <typename PUT>
    __device__ __forceinline__ void run(const bf16_t *x, int n_in, PUT put)
    {
        float acc[T];
        int crow = 0;
#pragma unroll
        for (int t = 0; t < T; t++)
            acc[t] = 0.0f;
        auto flush = [&](int r) {
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t] = kern_warp_sum(acc[t]);
            put(r, acc);
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t] = 0.0f;
        };
        for (int c0 = lane; c0 < n_tot; c0 += MLP_STEP) {
            uint4 nxt[MLP_U];
            const int c1 = c0 + MLP_STEP;
            const int r = (c0 - lane) / n_ch;
            const int cb = c0 - r * n_ch;
#pragma unroll
            for (int u = 0; u < MLP_U; u++)
                nxt[u] = c1 + 32 * u < n_tot ? __ldcs(w + c1 + 32 * u)
                                             : make_uint4(0, 0, 0, 0);
            if (r != crow) {
                flush(crow);
                crow = r;
            }
#pragma unroll
            for (int u = 0; u < MLP_U; u++)
                gemv_chunk<T, true>(cur[u], x, n_in, cb + 32 * u, acc);
#pragma unroll
            for (int u = 0; u < MLP_U; u++)
                cur[u] = nxt[u];
        }
        if (n_tot > 0)
            flush(crow);
    }
};

/* [lo, hi) of n items split evenly over `parts`: part i. */
static __device__ __forceinline__ int2 mlp_share(int n, int parts, int i)
{
    return make_int2((int)((long long)n * i / parts),
                     (int)((long long)n * (i + 1) / parts));
}

static __device__ __forceinline__ unsigned mlp_ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ unsigned mlp_ld_relaxed(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];"
                 : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ unsigned long long mlp_now_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Grid-wide barrier over bar (MLP_BAR_WORDS words): the arrival count at
 * bar[0], the generation at bar[MLP_BAR_GEN], a line apart so the
 * waiting blocks' polls do not queue behind the arrivals' atomics.  The
 * last block to arrive zeroes the count and bumps the generation the
 * others wait on (so the words are left ready for the next launch).  The
 * fences make every block's writes before the barrier visible to every
 * block's loads after it (the release / acquire pattern of cooperative
 * groups' grid sync); the poll is relaxed, one acquire after it (an
 * acquire at gpu scope also invalidates the multiprocessor's L1, which
 * the blocks still streaming beside it would pay for every poll).
 * mode (BT_GEMV_MLP_BAR, A/B): 0 both words on one line, acquire polls
 * (round 16a); 1 the default; 2 as 1 with a 64 ns sleep a poll. */
#define MLP_BAR_GEN 32
static __device__ __forceinline__ void mlp_grid_sync(unsigned *bar, int mode)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *gen_p = bar + (mode == 0 ? 1 : MLP_BAR_GEN);
        const unsigned gen = mlp_ld_acquire(gen_p);
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(gen_p, 1u);
        } else {
            const unsigned long long t0 = mlp_now_ns();
            for (;;) {
                if ((mode == 0 ? mlp_ld_acquire(gen_p)
                               : mlp_ld_relaxed(gen_p)) != gen)
                    break;
                if (mode == 2)
                    __nanosleep(64);
                if (mlp_now_ns() - t0 > MLP_BARRIER_TIMEOUT_NS)
                    __trap();
            }
            (void)mlp_ld_acquire(gen_p);
        }
        __threadfence();
    }
    __syncthreads();
}

/* Phase timestamps (BT_GEMV_MLP_PROF=1, cuda_gemv_mlp_prof_print): per
 * block, thread 0's globaltimer at entry, after the PDL wait, after the
 * norm, once the block's gate|up sums are in, after the barrier, at the
 * end; the last launch's. */
#define MLP_PROF_MARKS 6
#define MLP_PROF_BLOCKS 2048
static __device__ unsigned long long mlp_prof[MLP_PROF_BLOCKS * MLP_PROF_MARKS];

template <bool PROF>
static __device__ __forceinline__ void mlp_mark(int k)
{
    if (PROF && threadIdx.x == 0 && blockIdx.x < MLP_PROF_BLOCKS)
        mlp_prof[blockIdx.x * MLP_PROF_MARKS + k] = mlp_now_ns();
}

/* The kernel (see the top of the file).  Shared memory: n (T, n_in) bf16,
 * then the row sums [MLP_WARPS][maxq][T] f32 (maxq: the most row pairs
 * of one warp pair). */
template <int T, bool PROF>
static __global__ void __launch_bounds__(MLP_THREADS, MLP_BLOCKS_PER_SM)
gemv_mlp_kernel(int n_hid, int n_in, float *xf, const bf16_t *g, float eps,
                const bf16_t *w_gu, const bf16_t *w_down, bf16_t *h,
                bool accumulate, unsigned *bar, int maxq, int pf_a,
                int pf_b, int bar_mode, int xrep)
{
    extern __shared__ __align__(16) unsigned char mlp_sm[];
    __shared__ float red[32];
    bf16_t *xs = reinterpret_cast<bf16_t *>(mlp_sm);
    float *sums = reinterpret_cast<float *>(mlp_sm + (size_t)T * n_in * 2);
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int pairs_per_block = MLP_WARPS / 2;
    /* phase A: this warp pair's (gate, up) pairs; the even warp streams
     * the gate rows [p.x, p.y), the odd one the up rows n_hid + [p.x, p.y) */
    const int2 p = mlp_share(n_hid, gridDim.x * pairs_per_block,
                             blockIdx.x * pairs_per_block + (wib >> 1));
    const bf16_t *rows_a = w_gu + ((size_t)(wib & 1) * n_hid + p.x) * n_in;
    /* token `lane`'s entry of a per-token array (static indices only) */
    auto lane_of = [&](const float *v) {
        float o = 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t == lane)
                o = v[t];
        return o;
    };

    /* Every block is resident before any can finish (the grid is one
     * wave), so the next kernel may launch at once: its blocks take the
     * slots this grid frees and load their weights under its tail. */
    kern_pdl_trigger();
    mlp_mark<PROF>(0);
    mlp_stream<T> sa;
    sa.start(rows_a, p.y - p.x, n_in);
    if (pf_a > 0 && lane == 0 && p.y > p.x)
        gemv_prefetch_l2(rows_a, min(pf_a, (p.y - p.x) * n_in * 2) & ~15);
    uint4 gpre[GEMV_NORM_GPRE];
    gemv_norm_gpre(n_in, g, gpre);
    kern_pdl_wait();
    mlp_mark<PROF>(1);
    gemv_norm_stage<T>(n_in, xf + (size_t)(blockIdx.x % xrep) * T * n_in, g, eps, xs, red, gpre);
    mlp_mark<PROF>(2);

    sa.run(xs, n_in, [&](int r, const float *acc) {
        if (lane < T)
            sums[((size_t)wib * maxq + r) * T + lane] = lane_of(acc);
    });

    /* phase B: this warp's rows [d.x, d.y) of w_down (n_in rows); their
     * first chunks (and, with pf_b, more of them into L2) load while the
     * block finishes and waits at the barrier.  (Worked out only now: live
     * across phase A they cost registers the stream needs.) */
    const int2 d = mlp_share(n_in, gridDim.x * MLP_WARPS,
                             blockIdx.x * MLP_WARPS + wib);
    const bf16_t *rows_b = w_down + (size_t)d.x * n_hid;
    mlp_stream<T> sb;
    sb.start(rows_b, d.y - d.x, n_hid);
    if (pf_b > 0 && lane == 0 && d.y > d.x)
        gemv_prefetch_l2(rows_b, min(pf_b, (d.y - d.x) * n_hid * 2) & ~15);
    __syncthreads();
    mlp_mark<PROF>(3);
    /* h of the block's pairs: gate and up sums rounded to bf16 first, as
     * the unfused gate|up GEMV's bf16 output then swiglu.cu */
    for (int i = threadIdx.x; i < pairs_per_block * maxq * T;
         i += MLP_THREADS) {
        const int k = i / (maxq * T), r = i / T % maxq, t = i % T;
        const int2 q = mlp_share(n_hid, gridDim.x * pairs_per_block,
                                 blockIdx.x * pairs_per_block + k);
        if (r >= q.y - q.x)
            continue;
        float gv = sums[((size_t)(2 * k) * maxq + r) * T + t];
        float uv = sums[((size_t)(2 * k + 1) * maxq + r) * T + t];
        gv = kern_to_f(kern_from_f<bf16_t>(gv));
        uv = kern_to_f(kern_from_f<bf16_t>(uv));
        h[(size_t)t * n_hid + q.x + r] =
            kern_from_f<bf16_t>(kern_swiglu_f(gv, uv));
    }
    mlp_grid_sync(bar, bar_mode);
    mlp_mark<PROF>(4);

    /* (the row pointer is made before the loop: fewer registers live in
     * it; at 2 tokens the only spill left, 12 bytes, is in the norm) */
    float *const y = xf + (size_t)min(lane, T - 1) * n_in + d.x;
    sb.run(h, n_hid, [&](int r, const float *acc) {
        if (lane < T) {
            float *dst = y + r;
            float v = lane_of(acc);
            if (accumulate)
                v += *dst;
            *dst = v;
        }
    });
    if (PROF) {
        __syncthreads();
        mlp_mark<PROF>(5);
    }
}

/* BT_GEMV_MLP: "0" off; unset / anything else on. */
static bool mlp_enabled(void)
{
    const char *env = getenv("BT_GEMV_MLP");

    return !(env && strcmp(env, "0") == 0);
}

static int mlp_env_int(const char *name, int dflt)
{
    const char *env = getenv(name);

    return env && *env ? atoi(env) : dflt;
}

static int mlp_prof_blocks; /* the grid of the last profiled launch */

/* L2 prefetch bytes a warp (BT_GEMV_MLP_PF_A / _PF_B, KB; default 0). */
static int mlp_pf_bytes(const char *name)
{
    const char *env = getenv(name);

    return env && *env ? (atoi(env) << 10) & ~15 : 0;
}

static size_t mlp_smem(int n_tok, int n_in, int maxq)
{
    return (size_t)n_tok * n_in * 2 +
           (size_t)MLP_WARPS * maxq * n_tok * sizeof(float);
}

/* Rows of the busiest warp for a grid of n blocks, in elements streamed
 * (phase A's rows are n_in long, phase B's n_hid). */
static long long mlp_warp_cost(int n_hid, int n_in, int n)
{
    return BT_DIV_UP((long long)n_hid, (long long)n * (MLP_WARPS / 2)) *
               n_in +
           BT_DIV_UP((long long)n_in, (long long)n * MLP_WARPS) * n_hid;
}

/* The grid: at most the resident blocks (occupancy x multiprocessors),
 * and of those the fewest that give the busiest warp no more rows than
 * the full grid would (Llama-3-8B: 512 of 528 -- 7 pairs a warp pair,
 * one down row a warp).  maxq: the most pairs of a warp pair. */
static int mlp_grid(int n_tok, int n_hid, int n_in, int *maxq)
{
    int occ = 0;
    const int n_sm = kern_sm_count();
    /* the sums' part of shared memory is a few hundred bytes; size the
     * occupancy query with a generous bound */
    const size_t smem = mlp_smem(n_tok, n_in, 64);
    cudaError_t err =
        n_tok == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         &occ, gemv_mlp_kernel<1, false>, MLP_THREADS, smem)
                   : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         &occ, gemv_mlp_kernel<2, false>, MLP_THREADS, smem);
    if (err != cudaSuccess || occ <= 0 || n_sm <= 0)
        return 0;
    const int slots = occ * n_sm;
    const long long best = mlp_warp_cost(n_hid, n_in, slots);
    int n = slots;
    while (n > 1 && mlp_warp_cost(n_hid, n_in, n - 1) == best)
        n--;
    *maxq = (int)BT_DIV_UP((long long)n_hid, (long long)n * (MLP_WARPS / 2));
    if (*maxq > 64)
        return 0;
    return n;
}

bool cuda_gemv_mlp_ok(int n_tok, int n_hid, int n_in)
{
    return mlp_enabled() && n_tok >= 1 && n_tok <= 2 && n_in > 0 &&
           n_hid > 0 && n_in % (8 * MLP_STEP) == 0 &&
           n_hid % (8 * MLP_STEP) == 0 &&
           (size_t)n_tok * n_in * 2 <= MLP_SMEM_MAX - 4096;
}

int cuda_gemv_mlp_blocks(int n_tok, int n_hid, int n_in)
{
    int maxq = 0;

    if (!cuda_gemv_mlp_ok(n_tok, n_hid, n_in))
        return 0;
    return mlp_grid(n_tok, n_hid, n_in, &maxq);
}

bt_status_t cuda_gemv_mlp(int n_tok, int n_hid, int n_in, float *d_x,
                          const void *d_g, float eps, const void *d_w_gu,
                          const void *d_w_down, void *d_h, bool accumulate,
                          unsigned *d_bar, cudaStream_t stream)
{
    int maxq = 0;

    BT_ASSERT(cuda_gemv_mlp_ok(n_tok, n_hid, n_in) && d_bar != NULL);
    const int blocks = mlp_grid(n_tok, n_hid, n_in, &maxq);
    if (blocks <= 0)
        return BT_ERR_CUDA; /* no resident grid fits */
    const size_t smem = mlp_smem(n_tok, n_in, maxq);
    const int pf_a = mlp_pf_bytes("BT_GEMV_MLP_PF_A");
    const int pf_b = mlp_pf_bytes("BT_GEMV_MLP_PF_B");
    const int bar_mode = mlp_env_int("BT_GEMV_MLP_BAR", 1);
    const bool prof = mlp_env_int("BT_GEMV_MLP_PROF", 0) != 0;
    const int xrep = mlp_env_int("BT_GEMV_MLP_XREP", 1);
    const bf16_t *g = (const bf16_t *)d_g;
    const bf16_t *wgu = (const bf16_t *)d_w_gu;
    const bf16_t *wd = (const bf16_t *)d_w_down;

#define MLP_LAUNCH(T, PROF)                                                 \
    kern_launch(gemv_mlp_kernel<T, PROF>, blocks, MLP_THREADS, smem, stream, \
                n_hid, n_in, d_x, g, eps, wgu, wd, (bf16_t *)d_h,            \
                accumulate, d_bar, maxq, pf_a, pf_b, bar_mode, xrep)
    if (n_tok == 1 && !prof)
        MLP_LAUNCH(1, false);
    else if (n_tok == 1)
        MLP_LAUNCH(1, true);
    else if (!prof)
        MLP_LAUNCH(2, false);
    else
        MLP_LAUNCH(2, true);
#undef MLP_LAUNCH
    if (prof)
        mlp_prof_blocks = BT_MIN(blocks, MLP_PROF_BLOCKS);
    return BT_CUDA_LAUNCH_STATUS();
}

static int mlp_cmp_u64(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a;
    unsigned long long y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

void cuda_gemv_mlp_prof_print(FILE *f)
{
    static const char *const names[MLP_PROF_MARKS] = {
        "entry", "PDL wait done", "norm staged", "gate|up sums in",
        "barrier passed", "end"};
    const int n = mlp_prof_blocks;
    unsigned long long *v, *col, t0 = ~0ull;

    if (n <= 0)
        return;
    v = (unsigned long long *)malloc(sizeof(*v) * n * MLP_PROF_MARKS * 2);
    if (v == NULL)
        return;
    col = v + (size_t)n * MLP_PROF_MARKS;
    if (cudaMemcpyFromSymbol(v, mlp_prof, sizeof(*v) * n * MLP_PROF_MARKS) !=
        cudaSuccess) {
        free(v);
        return;
    }
    for (int b = 0; b < n; b++)
        t0 = BT_MIN(t0, v[b * MLP_PROF_MARKS]);
    fprintf(f, "gemv_mlp phases over %d blocks, us from the first entry: "
               "min / 10%% / median / 90%% / max\n", n);
    for (int k = 0; k < MLP_PROF_MARKS; k++) {
        for (int b = 0; b < n; b++)
            col[b] = v[b * MLP_PROF_MARKS + k] - t0;
        qsort(col, n, sizeof(*col), mlp_cmp_u64);
        fprintf(f, "  %-16s %8.2f %8.2f %8.2f %8.2f %8.2f\n", names[k],
                col[0] * 1e-3, col[n / 10] * 1e-3, col[n / 2] * 1e-3,
                col[n - 1 - n / 10] * 1e-3, col[n - 1] * 1e-3);
    }
    free(v);
}
