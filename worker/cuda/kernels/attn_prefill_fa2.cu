/*
 * attn_prefill_fa2.cu - FlashAttention-2 class prefill attention (bf16
 * activations, head 64/128) over the paged KV cache of bf16 or FP8
 * codes, the default prefill kernel: as fa2pp128 below on sm_90a at
 * head 128 (fa2pp, then fa2wqv, where it does not apply), fa2wqv at
 * head 64 and with FP8 KV, as fa2 elsewhere (cuda_attn_prefill_fa2's
 * wgmma argument names each, for tests).
 *
 * Work split: a block takes NW warps (4 or 8) of 16 query rows each, and
 * its warps are (query sub-tile, head) pairs of ONE KV head: a backend
 * tile of 64 queries has 4 sub-tiles of 16, and the G = nh / nkv query
 * heads sharing the KV head give 4 G warp units, ordered sub-tile major
 * (unit u: sub-tile u / G, head u % G), cut into ceil(4 G / NW) blocks.
 * So every K/V tile brought to shared memory serves NW x 16 rows (up to
 * G heads at once), and the warps of a block cover the fewest queries
 * (the causal key range of the block is as short as possible).
 *
 * Per warp: the Q fragments (16 rows x HD) stay in registers for the
 * whole key loop; S = Q K^T and O += P V run on mma.m16n8k16 (bf16 in,
 * f32 accumulate) with ldmatrix (.trans for V) from shared memory; the
 * online softmax runs in registers in base 2 (p = 2^(s * scale * log2 e
 * - m), one FFMA and one MUFU.EX2 per score; one rescale of O per key
 * tile), P is re-packed
 * from the S accumulators as the A operand of P V.
 *
 * K/V tiles of 64 keys stream through an STAGES-deep cp.async ring (16-
 * byte copies, zero fill past the end); rows are 128-byte swizzled (16-
 * byte chunk c of key row r lives at chunk c ^ (r & 7)), so the 8 rows
 * one ldmatrix phase reads hit 8 different bank groups without padding.
 * Each thread copies a fixed 16-byte column of a fixed set of rows; the
 * cache slots of its rows for tile kt + STAGES are resolved from the
 * block table one iteration ahead of their copy, so the block-id loads
 * never stall the copy issue.
 *
 * fa2wqv (WQ + WV, sm_90a): each warpgroup's four warp units stage their
 * Q rows once in shared memory and K tiles are written as wgmma's
 * K-major 128-byte-swizzle slabs of 64 dims, so S for 64 rows is 4 (HD
 * 64) or 8 (HD 128) m64n64k16 wgmmas reading both operands from shared
 * memory -- no Q registers, no K ldmatrix; the accumulators land in the
 * same m16n8 layout, so masks and softmax are shared with fa2.  A
 * warpgroup skips a key tile only when all four of its warps would.
 * O += P V runs on wgmma as well: P stays in registers as the A operand
 * (the re-packed S accumulators are already wgmma's register-A layout
 * per warp), V tiles are written as the same 128-byte-swizzle slabs as K
 * and read N-major (wg_desc_mn), one m64n(HD)k16 per 16 keys; the O
 * accumulators keep the m16n8 layout, so the rescale and the epilogue
 * are fa2's.  A warp runs every tile its warpgroup runs (the wgmma is
 * collective), fully masked where it sees nothing.  S alone on wgmma
 * (WQ without WV) measured equal to fa2 and is not built.  test_attn
 * pass "fa2wqv".
 *
 * fa2pp (PP, two warpgroups a block): fa2wqv with
 * FlashAttention-3's structure.  A ninth warp is the producer: one lane
 * loads each 64-key tile by TMA, as boxes of min(block, 64) cache slots
 * x 64 dims of a 3-D tensor map over the layer cache ({dims, KV heads,
 * slots}, 128-byte swizzle: exactly the slab layout), pages past the
 * keys from an out-of-range slot (zeros); slots past the keys inside a
 * loaded page come from the pool, which the backend zeroes at
 * allocation, so P = 0 never meets a NaN.  No block barrier in the key
 * loop: the consumer warpgroups take turns issuing S (named barriers 1
 * and 2), so one's softmax runs under the other's wgmma, and stages pass
 * on per-stage full mbarriers (the producer's expect_tx) and empty ones
 * (one arrival per warpgroup after its wgmma waits); 5 stages.  The
 * producer is a warp since round 26: lane p reads page p's block-table
 * entry and issues its boxes, and when all the blocks a block of the
 * grid reads follow each other in the pool, each tile goes as one box a
 * slab (maps k_run / v_run).  The copy engine costs ~100 cycles a box,
 * so one lane issuing 32 boxes of 2 KB a 128-key tile kept the consumers
 * waiting for their stage (the phase profiler below).  Faster than
 * fa2wqv (the ping-pong alone, with the consumers still copying, was
 * equal to it: their copy addressing kept the integer pipe busiest at
 * two warps a scheduler; round 11 of docs/PERFORMANCE.md).  Needs
 * cuda_attn_args_t.kv_slots and blocks of 8..64 slots dividing 64 (or
 * multiples of 64); else it runs as fa2wqv.  test_attn pass "fa2pp".
 *
 * fa2pp128 (BK = 128, the default at head 128): fa2pp on 128-key tiles,
 * m64n128 S, so the per-tile work (the row maxima's shuffles, the O
 * rescale, the barriers and waits) is paid once per 128 keys; 3 stages
 * at head 128 (64 KB each; 5 at head 64).  Its accumulators (S 64 + O 64
 * + P 32 registers a thread) barely fit the 168 registers that 9 warps
 * allow (ceil(9 / 4) warps share a scheduler's 16 K; ptxas spilled), so
 * the producer is a whole warpgroup that gives its registers to the
 * consumers (setmaxnreg: 24 / 240) before they start.  Faster than
 * fa2pp at 8192 tokens, equal at 2048 (rounds 25-26).
 * FlashAttention-3's overlap inside a warpgroup on top (a turn issues
 * tile kt's S with tile kt-1's P V, kt's softmax under that P V) lost
 * three times (rounds 25-26: spilling; without the spill; on the
 * producer warp, faster with the blocks in order but slower scattered,
 * its producer making two passes a tile) and is not built (git log:
 * "fa3").  Blocks of 8..128 slots dividing 128 or multiples of 128; else
 * fa2pp.  test_attn pass "fa2pp128".
 *
 * FP8 KV (KV8, d_kv_scale; fa2 and fa2wqv, not the ping-pong kernels,
 * whose TMA boxes land in the wgmma slabs as they are): the ring holds
 * E4M3 code tiles (a key row of HD bytes, 16-byte copies of 16 codes),
 * and before the loop's barrier each thread widens the chunks it copied
 * itself (its own cp.async wait makes them visible to it) to bf16 in
 * one of two K / V tiles of the bf16 layout above (exact: every E4M3
 * value is a bf16), so the products are bf16's, one barrier a tile as
 * before.  Shared memory: codes at half the bytes + two bf16 tiles, as
 * much as the bf16 ring of 4 stages (8 warps); 16 KB more at 3 stages
 * (4 warps), which at head 128 leaves one block an SM instead of two
 * (not measured).  Scales as attn_decode_tc.cu: the KV head's
 * K scale joins the score scale, its V scale multiplies O at the end (O
 * is a convex combination of V rows).  test_attn: "kv8" cases.
 * Where the ping-pong would run for bf16 (cuda_attn_prefill_widen_ok),
 * the backend widens the pages a prefill reads to bf16 first
 * (cuda_kv8_widen_pages, exact) and passes them with kv_widened: every
 * kernel here then reads bf16 and applies the scales as for the codes
 * (`scaled`), the ping-pong included.  test_attn: "widened" cases.
 *
 * Causal: warps skip key tiles wholly above their diagonal, masks are
 * evaluated only on tiles that are not fully visible (the diagonal, the
 * end of the keys, draft-tree masks), and blocks run heaviest first
 * (the last backend tile, all its KV heads and parts, is launched first).
 *
 * Semantics are those of cuda_attn_prefill (attn_prefill.h): query i of
 * a chunk after `ctx` cached tokens sees every cached key and the new
 * keys j <= i (or mask[i][j] when the sequence has a mask).
 * Test: test_attn (pass "fa2"); bench: bench_kernels --attn.
 */
#include "attn_prefill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_common.cuh"
#include "kv8.cuh"
#include "tc_common.cuh"
#include "wgmma.cuh"

#define F2_BK 64           /* keys per tile */
#define F2_SUB 16          /* query rows per warp */
#define F2_SUBS (CUDA_PREFILL_BQ / F2_SUB) /* sub-tiles per backend tile */

/* WQ: S = Q K^T on wgmma (sm_90a): each warpgroup's 64 query rows are
 * staged once in shared memory and K tiles are laid out as wgmma's
 * K-major 128-byte-swizzle slabs of 64 dims (f2_slab). */
template <int HD, int NW, bool WQ, bool PP, int BK = F2_BK,
          bool KV8 = false>
struct f2_cfg {
    /* PP: a producer warp refills a stage once both warpgroups released
     * it; 5 stages keep up to 4 tiles ahead (128-key tiles at head 128:
     * 3, all that fits in 227 KB beside Q) */
    static constexpr int STAGES =
        PP ? (BK * HD > 64 * 128 ? 3 : 5) : NW == 8 ? 4 : 3;
    /* bf16 K and V tiles: the ring itself; KV8: two, the ring holding
     * the codes (STAGES x 2 x TILE bytes after Q) */
    static constexpr int NBUF = KV8 ? 2 : STAGES;
    static constexpr int CH = HD / 8;       /* bf16 chunks (16 B) per row */
    static constexpr int CCH = KV8 ? HD / 16 : CH; /* copied chunks */
    static constexpr int TILE = BK * HD;               /* elements */
    static constexpr int THREADS = NW * 32; /* the consumers (the copies) */
    static constexpr int RSTEP = THREADS / CCH;        /* row step */
    static constexpr int RPT = F2_BK * CCH / THREADS;  /* rows per thread */
    static constexpr int QTILE = 64 * HD;              /* per warpgroup */
    /* PP's producer: a warp; on 128-key tiles a whole warpgroup, so the
     * consumers can take its registers with setmaxnreg (9 warps give
     * each at most 168 registers, ceil(9 / 4) warps sharing a
     * scheduler's 16 K; 12 warps 168 at launch, then 240 for the
     * consumers and 24 for the producer) */
    static constexpr bool PRODUCER_WG = PP && BK == 128;
    static constexpr int BLOCK =
        THREADS + (PRODUCER_WG ? 128 : PP ? 32 : 0); /* all threads */
    static constexpr size_t BYTES =
        (size_t)NBUF * 2 * TILE * 2 +
        (WQ ? (size_t)(NW / 4) * QTILE * 2 + 1024 : 0) +
        (KV8 ? (size_t)STAGES * 2 * TILE : 0) +
        (PP ? (size_t)4 * STAGES * sizeof(uint64_t) : 0);
    static_assert(THREADS % CCH == 0, "thread count");
    static_assert(PP || (BK == F2_BK && RPT * THREADS == F2_BK * CCH),
                  "tile split");
    static_assert(BK == 64 || BK == 128, "key tile");
    static_assert(!KV8 || !PP, "FP8 KV: the cp.async ring only");
};

/* 2^x (MUFU; -inf -> +0). */
static __device__ __forceinline__ float f2_ex2(float x)
{
    float y;

    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The maximum of one row's scores of a tile (the m16n8 C layout: s[nt][c]
 * and s[nt][c + 1], c = 0 for the lane's first row, 2 for its second),
 * in four independent chains: one chain of 2 KB dependent FMNMX is
 * latency that a scheduler's two consumer warps cannot hide. */
template <int KB>
static __device__ __forceinline__ float f2_rowmax(const float (&s)[KB][4],
                                                  int c)
{
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};

#pragma unroll
    for (int nt = 0; nt < KB; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            m[(2 * nt + j) & 3] = fmaxf(m[(2 * nt + j) & 3], s[nt][c + j]);
    return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

static __device__ __forceinline__ void f2_mma(float *c, const uint32_t *a,
                                              uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Element offset of 16-byte chunk c of key row r in a swizzled tile. */
template <int HD>
static __device__ __forceinline__ int f2_swz(int r, int c)
{
    return r * HD + ((c ^ (r & 7)) << 3);
}

/* The same for wgmma operands (tiles of `rows` rows): slab c / 8 of 64
 * dims, 128-byte rows, chunk c % 8 at (c % 8) ^ (r & 7). */
static __device__ __forceinline__ int f2_slab(int rows, int r, int c)
{
    return (c >> 3) * rows * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

/* PP: the layer's K and V caches as 3-D tensors {dims, KV heads,
 * slots}, read in boxes of 64 dims x 1 head x min(block, 64) slots,
 * 128-byte swizzled (the f2_slab layout). */
struct f2_maps {
    CUtensorMap k, v;
    CUtensorMap k_run, v_run; /* boxes of a whole tile's BK slots */
    int runs;     /* k_run / v_run made */
};

/* Phase profiler of the ping-pong kernels (a build with -DBT_F2_PROF,
 * cmake -DBT_PREFILL_PROF=ON; bench_kernels --attn prints it): lane 0 of
 * each consumer warpgroup's first warp charges the cycles since its last
 * mark to a phase (F2_PROF_* in attn_prefill.h) and adds its sums to
 * f2_prof at the end.  Off: the marks compile to nothing. */
#ifdef BT_F2_PROF
__device__ unsigned long long f2_prof[3][F2_PROF_N];
#define F2_MARK(i)                                                          \
    do {                                                                    \
        const unsigned t_ = (unsigned)clock();                              \
        f2_acc[i] += t_ - f2_t;                                             \
        f2_t = t_;                                                          \
    } while (0)
#else
#define F2_MARK(i) ((void)0)
#endif

template <int HD, int NW, bool WQ, bool WV, bool PP, int BK = F2_BK,
          bool KV8 = false>
static __global__ void __launch_bounds__(
    f2_cfg<HD, NW, WQ, PP, BK, KV8>::BLOCK, 1)
attn_prefill_fa2_kernel(cuda_attn_args_t a, const int *tiles, int n_tiles,
                        int parts, const __grid_constant__ f2_maps maps)
{
    static_assert(!WV || WQ, "P V on wgmma needs the wgmma S");
    static_assert(!PP || (WV && NW == 8), "ping-pong: two wgmma warpgroups");
    static_assert(PP || BK == F2_BK, "128-key tiles: the ping-pong only");
    typedef f2_cfg<HD, NW, WQ, PP, BK, KV8> C;
    constexpr int STAGES = C::STAGES;
    constexpr int NBUF = C::NBUF;
    constexpr int TILE = C::TILE;
    constexpr int CH = C::CH;
    constexpr int RPT = C::RPT;
    constexpr int KS = HD / 16; /* 16-dim k steps of S */
    constexpr int NT = HD / 8;  /* 8-wide column tiles of O */
    constexpr int KB = BK / 8;    /* 8-key column tiles of S */
    extern __shared__ __align__(128) char smem[];
#ifdef BT_F2_PROF
    unsigned f2_t = (unsigned)clock(), f2_acc[F2_PROF_N] = {};
#endif
    /* wgmma operands need 1024-byte aligned tiles */
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(smem);
    bf16_t *sk = (bf16_t *)(smem + (WQ ? (1024 - (sm0 & 1023)) & 1023 : 0));
    /* [NBUF][BK][HD] swizzled (WQ: [NBUF][HD / 64][BK][64] slabs) */
    bf16_t *sv = sk + NBUF * TILE; /* [NBUF][BK][HD] swizzled (WV: slabs
                                      as K's) */
    bf16_t *sq = sv + NBUF * TILE; /* WQ: [NW / 4][HD / 64][64][64] */
    /* KV8: the copy ring of codes, [STAGES][BK][HD] bytes of K, then of
     * V, rows unswizzled (each thread reads back only its own chunks) */
    uint8_t *ck8 =
        reinterpret_cast<uint8_t *>(WQ ? sq + (NW / 4) * C::QTILE : sq);
    uint8_t *cv8 = ck8 + STAGES * TILE;
    /* PP: per stage, "full" (the producer's copies landed) and "empty"
     * (both warpgroups' wgmmas on it done) */
    uint64_t *bar_full =
        reinterpret_cast<uint64_t *>(sq + (NW / 4) * C::QTILE);
    uint64_t *bar_empty = bar_full + STAGES;

    /* Heaviest first: the last backend tile's blocks come first. */
    int bid = blockIdx.x;
    const int n_kv = a.n_kv_heads;
    const int kvh = bid % n_kv;
    bid /= n_kv;
    const int part = bid % parts;
    const int tix = n_tiles - 1 - bid / parts;
    const int *t = tiles + (size_t)tix * CUDA_PREFILL_TILE_INTS;
    const int tok0 = t[CUDA_PT_TOK0];
    const int i0 = t[CUDA_PT_I0];
    const int n_q = t[CUDA_PT_NQ];
    const int n_tok = t[CUDA_PT_NTOK];
    const int ctx = t[CUDA_PT_CTX];
    const int *bt = a.d_block_tables + t[CUDA_PT_BT_OFF];
    const int moff = t[CUDA_PT_MASK_OFF];
    const uint8_t *mask = moff >= 0 ? a.d_masks + moff : NULL;
    const int G = a.n_heads / n_kv;
    const int units = F2_SUBS * G;
    const int u_first = part * NW;
    const int u_last = min(u_first + NW, units) - 1;
    /* Queries of the block: sub-tiles u_first / G .. u_last / G. */
    const int q_first = (u_first / G) * F2_SUB;
    if (q_first >= n_q)
        return; /* whole block past the end of a short tile */
    const int q_last = min((u_last / G) * F2_SUB + F2_SUB, n_q) - 1;
    const int kv_end = mask ? ctx + n_tok : ctx + i0 + q_last + 1;
    const int n_kt = (kv_end + BK - 1) / BK;

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int gr = lane >> 2, tq = lane & 3;
    const int unit = u_first + warp;
    const int sub = unit / G;
    const int h = kvh * G + unit % G;
    const bool warp_live = unit < units && sub * F2_SUB < n_q;
    const int row0 = sub * F2_SUB + gr; /* this lane's rows: row0, +8 */
    const int qi0 = i0 + row0, qi1 = qi0 + 8;
    const bool ok0 = warp_live && row0 < n_q;
    const bool ok1 = warp_live && row0 + 8 < n_q;
    /* Last key any row of this warp may see. */
    const int warp_last =
        mask ? kv_end - 1 : ctx + min(i0 + sub * F2_SUB + F2_SUB - 1,
                                      n_tok - 1);
    /* First row of the warp sees every key up to this one (causal). */
    const int warp_full = ctx + i0 + sub * F2_SUB;

    const int bs = a.block_size;
    const int bs_sh = (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1;
    const size_t slot_stride = (size_t)n_kv * HD;
    /* this thread's 16-byte chunk (KV8: of 16 codes) and first row */
    const int col = threadIdx.x % C::CCH;
    const int rbase = threadIdx.x / C::CCH;
    const bf16_t *kbase =
        (const bf16_t *)a.d_k_cache + (size_t)kvh * HD + col * 8;
    const bf16_t *vbase =
        (const bf16_t *)a.d_v_cache + (size_t)kvh * HD + col * 8;
    /* KV8: one byte an element */
    const uint8_t *kbase8 =
        (const uint8_t *)a.d_k_cache + (size_t)kvh * HD + col * 16;
    const uint8_t *vbase8 =
        (const uint8_t *)a.d_v_cache + (size_t)kvh * HD + col * 16;

    /* Cache slot of each of this thread's rows of tile kt (-1: past the
     * keys, zero-filled). */
    auto resolve = [&](int kt, int *slot) {
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            const int k = kt * F2_BK + rbase + j * C::RSTEP;
            int s = -1;
            if (k < kv_end) {
                const int blk = bs_sh >= 0 ? k >> bs_sh : k / bs;
                s = bt[blk] * bs + (k - blk * bs);
            }
            slot[j] = s;
        }
    };
    auto issue = [&](int stage, const int *slot) {
        if constexpr (KV8) {
            /* the codes as they are; widen() makes the bf16 tile */
            uint8_t *dk = ck8 + stage * TILE + rbase * HD + col * 16;
            uint8_t *dv = cv8 + stage * TILE + rbase * HD + col * 16;
#pragma unroll
            for (int j = 0; j < RPT; j++) {
                const bool ok = slot[j] >= 0;
                const size_t off = ok ? (size_t)slot[j] * slot_stride : 0;
                tc_cp16(dk + j * C::RSTEP * HD, kbase8 + off, ok);
                tc_cp16(dv + j * C::RSTEP * HD, vbase8 + off, ok);
            }
            return;
        }
        bf16_t *dk = sk + stage * TILE;
        bf16_t *dv = sv + stage * TILE;
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            const int r = rbase + j * C::RSTEP;
            const bool ok = slot[j] >= 0;
            const size_t off = ok ? (size_t)slot[j] * slot_stride : 0;
            const int so = f2_swz<HD>(r, col);
            tc_cp16(dk + (WQ ? f2_slab(F2_BK, r, col) : so), kbase + off, ok);
            tc_cp16(dv + (WV ? f2_slab(F2_BK, r, col) : so), vbase + off,
                    ok);
        }
    };
    /* KV8: this thread's code chunks of ring stage `stage` (its own
     * copies: complete and visible to it after its cp.async wait, no
     * barrier needed) widened to bf16 into K / V buffer buf, in the
     * layout the bf16 copies land in: 16 codes are the bf16 chunks
     * 2 col and 2 col + 1 of the row.  Exact (every E4M3 value is a
     * bf16); zero-filled codes (past the keys) are +0.  Threads 4..7 of
     * each 8 store their odd chunk first, so the 8 stores of an access
     * phase hit 8 different 16-byte bank groups under the XOR swizzle. */
    auto widen = [&](int stage, int buf) {
        const bool odd_first = (col >> 2) & 1;
        const int c0 = 2 * col + (odd_first ? 1 : 0);
        const int c1 = c0 ^ 1;
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            const int r = rbase + j * C::RSTEP;
            const uint4 kc = *reinterpret_cast<const uint4 *>(
                ck8 + stage * TILE + r * HD + col * 16);
            const uint4 vc = *reinterpret_cast<const uint4 *>(
                cv8 + stage * TILE + r * HD + col * 16);
            const uint4 klo = kv8_to_bf16x8(make_uint2(kc.x, kc.y));
            const uint4 khi = kv8_to_bf16x8(make_uint2(kc.z, kc.w));
            const uint4 vlo = kv8_to_bf16x8(make_uint2(vc.x, vc.y));
            const uint4 vhi = kv8_to_bf16x8(make_uint2(vc.z, vc.w));
            bf16_t *dk = sk + buf * TILE;
            bf16_t *dv = sv + buf * TILE;
            *reinterpret_cast<uint4 *>(
                dk + (WQ ? f2_slab(F2_BK, r, c0) : f2_swz<HD>(r, c0))) =
                odd_first ? khi : klo;
            *reinterpret_cast<uint4 *>(
                dk + (WQ ? f2_slab(F2_BK, r, c1) : f2_swz<HD>(r, c1))) =
                odd_first ? klo : khi;
            *reinterpret_cast<uint4 *>(
                dv + (WV ? f2_slab(F2_BK, r, c0) : f2_swz<HD>(r, c0))) =
                odd_first ? vhi : vlo;
            *reinterpret_cast<uint4 *>(
                dv + (WV ? f2_slab(F2_BK, r, c1) : f2_swz<HD>(r, c1))) =
                odd_first ? vlo : vhi;
        }
    };

    /* Prologue: tiles 0 .. STAGES-2 in flight (PP: 0 .. STAGES-3),
     * slots of the next one known. */
    if constexpr (PP) {
        if (threadIdx.x == 0) {
            for (int st = 0; st < STAGES; st++) {
                mbar_init(&bar_full[st], 1);
                mbar_init(&bar_empty[st], 2);
            }
            mbar_init_fence();
        }
        __syncthreads(); /* the last barrier of all the block's warps */
        /* 128-key tiles: the producer warpgroup gives the consumers its
         * registers (24 x 128 + 240 x 256 <= 64 K) */
        if (warp >= NW) {
            if (C::PRODUCER_WG)
                wg_regs_dec<24>();
            /* The producer warp: a tile's BK keys as boxes of
             * min(block, BK) cache slots (pages past the keys from an
             * out-of-range slot: zeros), K and V of each 64-dim slab.
             * Lane p takes page p: it reads its block-table entry and
             * issues its copies beside the other lanes' (one lane
             * reading each entry, then issuing, page after page, kept
             * the consumers waiting for their stage: round 26).  The
             * warpgroup's other warps (128-key tiles) idle. */
            if (warp == NW) {
                const int rows = min(bs, BK), npg = BK / rows;
                if (lane == 0) {
                    wg_tma_prefetch(&maps.k);
                    wg_tma_prefetch(&maps.v);
                    if (maps.runs) {
                        wg_tma_prefetch(&maps.k_run);
                        wg_tma_prefetch(&maps.v_run);
                    }
                }
                /* First cache slot of page pg of tile kt (past the keys:
                 * an out-of-range slot, read as zeros). */
                auto page_slot = [&](int kt, int pg) {
                    const int key0 = kt * BK + pg * rows;
                    if (key0 >= kv_end)
                        return (int)a.kv_slots;
                    const int blk = bs_sh >= 0 ? key0 >> bs_sh : key0 / bs;
                    return bt[blk] * bs + (key0 - blk * bs);
                };
                /* Runs: when every block the tiles read follows the
                 * previous one in the pool (the KV allocator hands out
                 * the lowest free ids, so a fresh prompt's blocks
                 * usually do), each tile goes as one box of BK slots a
                 * slab: 2 HD / 64 boxes instead of 2 HD / 64 a page; the
                 * copy engine takes ~100 cycles a box whatever its size
                 * (a third of the issue time as runs: round 26).
                 * Checked once a block: a check a tile (a shuffle and a
                 * vote) cost time with scattered blocks, where the
                 * producer is the limit. */
                bool runs = false;
                int run0 = 0;
                if (npg > 1 && maps.runs) {
                    const int nblk = (kv_end + bs - 1) / bs;
                    run0 = bt[0];
                    /* no early exit: the loads go out together (one
                     * a lane at a time was slower at 8192 tokens) */
                    bool in_run = true;
#pragma unroll 8
                    for (int b = lane; b < nblk; b += 32)
                        in_run &= bt[b] == run0 + b;
                    runs = __all_sync(~0u, in_run);
                }
                /* K (which & 1) and / or V (which & 2) of tile kt into
                 * stage st, completing on bar */
                auto issue_tile = [&](int kt, int st, int which,
                                      uint64_t *bar) {
                    if (runs) {
                        /* slots past the keys: the pool's next blocks,
                         * finite and masked, as in a partly used page */
                        if (lane == 0) {
                            const int base = run0 * bs + kt * BK;
#pragma unroll
                            for (int h2 = 0; h2 < HD / 64; h2++) {
                                const int off = h2 * BK * 64;
                                if (which & 1)
                                    wg_tma_load_3d(sk + st * TILE + off,
                                                   &maps.k_run, h2 * 64, kvh,
                                                   base, bar);
                                if (which & 2)
                                    wg_tma_load_3d(sv + st * TILE + off,
                                                   &maps.v_run, h2 * 64, kvh,
                                                   base, bar);
                            }
                        }
                        return;
                    }
                    __syncwarp();
                    if (lane < npg) {
                        const int pg = lane, slot0 = page_slot(kt, pg);
#pragma unroll
                        for (int h2 = 0; h2 < HD / 64; h2++) {
                            const int off = h2 * BK * 64 + pg * rows * 64;
                            if (which & 1)
                                wg_tma_load_3d(sk + st * TILE + off, &maps.k,
                                               h2 * 64, kvh, slot0, bar);
                            if (which & 2)
                                wg_tma_load_3d(sv + st * TILE + off, &maps.v,
                                               h2 * 64, kvh, slot0, bar);
                        }
                    }
                };
                /* (Reading the next tile's entries a tile ahead,
                 * across the wait, measured no faster: round 26.) */
                for (int kt = 0; kt < n_kt; kt++) {
                    const int st = kt % STAGES;
                    const uint32_t par = (uint32_t)((kt / STAGES - 1) & 1);
                    F2_MARK(F2_PROF_PROD_ISSUE);
                    if (kt >= STAGES)
                        mbar_wait(&bar_empty[st], par);
                    F2_MARK(F2_PROF_PROD_EMPTY);
                    if (lane == 0)
                        mbar_expect(&bar_full[st], 2 * TILE * 2);
                    issue_tile(kt, st, 3, &bar_full[st]);
                }
                F2_MARK(F2_PROF_PROD_ISSUE);
#ifdef BT_F2_PROF
                if (lane == 0) {
                    f2_acc[F2_PROF_TILES] = n_kt;
                    f2_acc[F2_PROF_WARPS] = 1;
                    for (int i = 0; i < F2_PROF_N; i++)
                        atomicAdd(&f2_prof[2][i],
                                  (unsigned long long)f2_acc[i]);
                }
#endif
            }
            return; /* the consumers wait for every copy it issued */
        }
        if (C::PRODUCER_WG)
            wg_regs_inc<240>();
    }
    int slot[RPT];
    if constexpr (!PP) {
#pragma unroll
        for (int st = 0; st < STAGES - 1; st++) {
            if (st < n_kt) {
                resolve(st, slot);
                issue(st, slot);
            }
            tc_cp_commit();
        }
        resolve(STAGES - 1, slot);
    }

    /* Q fragments of this warp's 16 rows, kept for the whole loop (WQ:
     * staged as rows 16 (warp % 4) .. +15 of its warpgroup's Q tile). */
    uint32_t qa[WQ ? 1 : KS][4];
    if constexpr (WQ) {
        bf16_t *dq = sq + (warp >> 2) * C::QTILE;
#pragma unroll
        for (int j = 0; j < 16 * CH / 32; j++) {
            const int c = lane + 32 * j, r = c / CH, ch = c % CH;
            const int qr = sub * F2_SUB + r;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (warp_live && qr < n_q)
                v = *reinterpret_cast<const uint4 *>(
                    (const bf16_t *)a.d_q +
                    ((size_t)(tok0 + i0 + qr) * a.n_heads + h) * HD + ch * 8);
            *reinterpret_cast<uint4 *>(
                dq + f2_slab(64, 16 * (warp & 3) + r, ch)) = v;
        }
        wg_fence_proxy(); /* before wgmma reads them (the loop's barrier) */
    } else {
        const bf16_t *q0 = (const bf16_t *)a.d_q +
                           ((size_t)(tok0 + (ok0 ? qi0 : i0)) * a.n_heads +
                            h) * HD;
        const bf16_t *q1 = (const bf16_t *)a.d_q +
                           ((size_t)(tok0 + (ok1 ? qi1 : i0)) * a.n_heads +
                            h) * HD;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int c = ks * 16 + 2 * tq;
            qa[ks][0] = ok0 ? tc_ld32(q0 + c) : 0u;
            qa[ks][1] = ok1 ? tc_ld32(q1 + c) : 0u;
            qa[ks][2] = ok0 ? tc_ld32(q0 + c + 8) : 0u;
            qa[ks][3] = ok1 ? tc_ld32(q1 + c + 8) : 0u;
        }
    }
    /* WQ: the last key any warp of this warpgroup may see (the wgmma is
     * the warpgroup's, so it skips a tile only when all four do). */
    int wg_last = -1;
    if (WQ) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int u = u_first + 4 * (warp >> 2) + j, sj = u / G;
            if (u < units && sj * F2_SUB < n_q)
                wg_last = max(wg_last,
                              mask ? kv_end - 1
                                   : ctx + min(i0 + sj * F2_SUB + F2_SUB - 1,
                                               n_tok - 1));
        }
    }

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    /* KV8 (or widened codes): the KV head's K scale joins the score
     * scale (> 0: the max of the unscaled scores is the max of the
     * scaled ones) */
    const bool scaled = KV8 || a.d_kv_scale != NULL;
    const float sl2 = (scaled ? a.scale * a.d_kv_scale[kvh] : a.scale) *
                      1.4426950408889634f;
    const int sw = lane & 7; /* row & 7 of every ldmatrix row address */

    /* One key tile's scores s (this lane's rows, keys kb0 ..): masked
     * where some key may be hidden (one branch around the whole pass: a
     * test per score pair cost ~100 instructions and as many branch
     * stalls on every fully visible tile, round 26), the running maxima
     * and sums moved on; the earlier O's correction in c0 / c1, the
     * exponent bases in b0 / b1.  Raw scores stay unscaled (the scale
     * goes into the exponent's FFMA). */
    float b0 = 0.0f, b1 = 0.0f;
    auto softmax_tile = [&](int kb0, float (&s)[KB][4], float &c0,
                            float &c1) {
        const bool full = kb0 + BK <= ctx ||
                          (mask == NULL && kb0 + BK - 1 <= warp_full);
        if (!full) {
#pragma unroll
            for (int nt = 0; nt < KB; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int key = kb0 + nt * 8 + 2 * tq + j;
                    bool vis0 = ok0 && key < kv_end;
                    bool vis1 = ok1 && key < kv_end;
                    if (key >= ctx) {
                        if (mask) {
                            vis0 = vis0 &&
                                   mask[(size_t)qi0 * n_tok + key - ctx];
                            vis1 = vis1 &&
                                   mask[(size_t)qi1 * n_tok + key - ctx];
                        } else {
                            vis0 = vis0 && key - ctx <= qi0;
                            vis1 = vis1 && key - ctx <= qi1;
                        }
                    }
                    if (!vis0)
                        s[nt][j] = -INFINITY;
                    if (!vis1)
                        s[nt][2 + j] = -INFINITY;
                }
        }
        float mx0 = f2_rowmax<KB>(s, 0), mx1 = f2_rowmax<KB>(s, 2);
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        /* Running maxima in base-2 units (sl2 > 0: max commutes). */
        const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
        /* A row with nothing visible yet keeps m = -inf: subtract 0. */
        b0 = mn0 == -INFINITY ? 0.0f : mn0;
        b1 = mn1 == -INFINITY ? 0.0f : mn1;
        c0 = f2_ex2(m0 - b0);
        c1 = f2_ex2(m1 - b1);
        m0 = mn0;
        m1 = mn1;
        l0 *= c0;
        l1 *= c1;
    };
    /* O *= the correction */
    auto rescale_o = [&](float c0, float c1) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] *= c0;
            o[nt][1] *= c0;
            o[nt][2] *= c1;
            o[nt][3] *= c1;
        }
    };
    /* P of 16 keys from the S accumulators (bf16; the A fragment layout
     * equals the C layout of two 8-key tiles); l sums the f32 p as
     * FlashAttention does (round 26: summing the bf16 p that P V
     * multiplies cost a PRMT and an IMAD to unpack each), in a partial
     * per 16 keys so no chain of adds runs through the whole tile. */
    float ls0[BK / 16], ls1[BK / 16];
    auto make_p = [&](const float (&s)[KB][4], int kk, uint32_t (&pa)[4]) {
        float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int nt = 2 * kk + hh;
            const float e0 = f2_ex2(fmaf(s[nt][0], sl2, -b0));
            const float e1 = f2_ex2(fmaf(s[nt][1], sl2, -b0));
            const float e2 = f2_ex2(fmaf(s[nt][2], sl2, -b1));
            const float e3 = f2_ex2(fmaf(s[nt][3], sl2, -b1));
            pa[2 * hh] = tc_pack(e0, e1);
            pa[2 * hh + 1] = tc_pack(e2, e3);
            r0 += e0 + e1;
            r1 += e2 + e3;
        }
        ls0[kk] = r0;
        ls1[kk] = r1;
    };
    /* l += the partials, pairwise. */
    auto add_l = [&](int n) {
#pragma unroll
        for (int w = 1; w < n; w <<= 1)
#pragma unroll
            for (int i = 0; i + w < n; i += 2 * w) {
                ls0[i] += ls0[i + w];
                ls1[i] += ls1[i + w];
            }
        l0 += ls0[0];
        l1 += ls1[0];
    };
    /* WQ: S = Q K^T of the key tile in buffer st on wgmma, committed (64
     * x BK per warpgroup; this warp's 16 rows in the m16n8 C layout),
     * k16 steps over the HD / 64 slabs; s holds its start (zeros) */
    auto wgmma_s = [&](int st, float (&s)[KB][4]) {
        const unsigned qs = (unsigned)__cvta_generic_to_shared(
            sq + (warp >> 2) * C::QTILE);
        const unsigned ks0 =
            (unsigned)__cvta_generic_to_shared(sk + st * TILE);
        wg_fence_acc<KB>(s);
        wg_fence();
        const uint64_t dq = wg_desc(qs), dk = wg_desc(ks0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            const unsigned sl = (unsigned)(kk >> 2), kin = kk & 3;
            wg_mma<KB>::run(s, wg_desc_add(dq, sl * 64 * 64 * 2 + 32 * kin),
                            wg_desc_add(dk, sl * BK * 64 * 2 + 32 * kin));
        }
        wg_commit();
    };
    /* WV: O += P V of the tile in buffer st on wgmma, committed: m64n(HD)k16
     * per 16 keys, A = P from registers, B = the V slabs N-major (16 key
     * rows from row 16 kk, 128 bytes each; the next 64 dims one slab =
     * BK rows on) */
    auto wgmma_pv = [&](int st, const uint32_t (&pa)[BK / 16][4]) {
        const unsigned vs0 =
            (unsigned)__cvta_generic_to_shared(sv + st * TILE);
        wg_fence_acc<NT>(o);
        wg_fence();
        const uint64_t dv = wg_desc_mn(vs0, BK * 64 * 2, 1024);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wg_mma_rs<NT>::run(o, pa[kk], wg_desc_add(dv, kk * 16 * 128));
        wg_commit();
    };

    /* PP (FlashAttention-3's ping-pong): no block barrier in the loop.
     * The warpgroups take turns issuing S on the tensor cores (named
     * barrier 1 + wg is warpgroup wg's turn, given by the other after
     * its issue), so one runs its softmax while the other's wgmmas run;
     * the producer warp's copies and the releases pass on the full /
     * empty mbarriers.  Both warpgroups walk every tile of the block (the
     * turns must pair up), a warpgroup past its causal range only taking
     * its turns and releasing the stages. */
    const int wg = warp >> 2;
    if (PP) {
        bar_sync_n(3, NW * 32); /* Q staged, in the consumers only */
        F2_MARK(F2_PROF_PROLOGUE);
        if (wg == 1)
            bar_arrive_n(1, 256); /* warpgroup 0 goes first */
    }
    for (int kt = 0; kt < n_kt; kt++) {
        if constexpr (PP) {
            /* TMA writes through the async proxy, as wgmma reads */
            mbar_wait(&bar_full[kt % STAGES], (uint32_t)((kt / STAGES) & 1));
            F2_MARK(F2_PROF_FULL);
        } else {
            tc_cp_wait<STAGES - 2>();
            /* KV8: tile kt's codes, the thread's own, into buffer kt & 1,
             * last read by tile kt - 2 (before the previous barrier) */
            if constexpr (KV8)
                widen(kt % STAGES, kt & 1);
            if (WQ)
                wg_fence_proxy(); /* the copies, before wgmma reads them */
            __syncthreads(); /* tile kt landed; stage (kt-1) % STAGES free */
            const int nk = kt + STAGES - 1;
            if (nk < n_kt) {
                issue(nk % STAGES, slot);
                if (nk + 1 < n_kt)
                    resolve(nk + 1, slot);
            }
            tc_cp_commit();
        }
        const int kb0 = kt * BK;
        if (PP && kb0 > wg_last) {
            bar_sync_n(1 + wg, 256);
            bar_arrive_n(2 - wg, 256);
            if ((threadIdx.x & 127) == 0)
                mbar_arrive(&bar_empty[kt % STAGES]);
            F2_MARK(F2_PROF_SKIPPED);
            continue; /* past this warpgroup's keys: its turn, released */
        }
        if (WQ ? kb0 > wg_last : !warp_live || kb0 > warp_last)
            continue; /* every key of the tile is hidden from the warp(s) */
        const int buf = KV8 ? kt & 1 : kt % STAGES; /* tile kt's K / V */
        const bf16_t *tk = sk + buf * TILE;
        const bf16_t *tv = sv + buf * TILE;

        float s[KB][4];
#pragma unroll
        for (int nt = 0; nt < KB; nt++)
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        if constexpr (WQ) {
            if (PP)
                bar_sync_n(1 + wg, 256); /* this warpgroup's turn */
            F2_MARK(F2_PROF_TURN);
            wgmma_s(buf, s);
            if (PP)
                bar_arrive_n(2 - wg, 256); /* the other's turn */
            wg_wait<0>();
            F2_MARK(F2_PROF_S);
            wg_fence_acc<KB>(s);
            /* WV: P V is the warpgroup's too, so a warp that sees none
             * of the tile still runs it, with every score masked (its
             * rows are not written, or see no key of this tile) */
            if (!WV && (!warp_live || kb0 > warp_last))
                continue; /* nothing visible to this warp */
        } else {
            /* S (16 x 64) = Q K^T: per 32 dims, the 8 key column tiles'
             * fragments (one ldmatrix.x4 each: dims 32 k2 + 0..31 of keys
             * 8 nt + 0..7) are loaded before their 16 products. */
#pragma unroll
            for (int k2 = 0; k2 < HD / 32; k2++) {
                uint32_t b[KB][4];
#pragma unroll
                for (int nt = 0; nt < KB; nt++)
                    tc_ldm(b[nt], tk + (nt * 8 + sw) * HD +
                                      (((k2 * 4 + (lane >> 3)) ^ sw) << 3));
#pragma unroll
                for (int nt = 0; nt < KB; nt++) {
                    f2_mma(s[nt], qa[2 * k2], b[nt][0], b[nt][1]);
                    f2_mma(s[nt], qa[2 * k2 + 1], b[nt][2], b[nt][3]);
                }
            }
        }

        float c0, c1;
        softmax_tile(kb0, s, c0, c1);
        rescale_o(c0, c1);

        if constexpr (WV) {
            uint32_t pa[BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                make_p(s, kk, pa[kk]);
            F2_MARK(F2_PROF_SOFTMAX);
            wgmma_pv(buf, pa);
            add_l(BK / 16); /* under the products */
            wg_wait<0>();
            F2_MARK(F2_PROF_PV);
#ifdef BT_F2_PROF
            f2_acc[F2_PROF_TILES]++;
#endif
            wg_fence_acc<NT>(o);
            if (PP && (threadIdx.x & 127) == 0)
                mbar_arrive(&bar_empty[kt % STAGES]); /* tile kt read */
        } else {
            /* V fragments by ldmatrix.trans (keys 16 kk + 0..15, dims
             * 16 dn + 0..15), all loaded before their products. */
#pragma unroll
            for (int kk = 0; kk < F2_BK / 16; kk++) {
                uint32_t pa[4];
                make_p(s, kk, pa);
                uint32_t b[HD / 16][4];
                const int vr = kk * 16 + ((lane >> 3) & 1) * 8 + sw;
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++)
                    tc_ldm_t(b[dn], tv + vr * HD +
                                        (((dn * 2 + (lane >> 4)) ^ sw) << 3));
#pragma unroll
                for (int dn = 0; dn < HD / 16; dn++) {
                    f2_mma(o[2 * dn], pa, b[dn][0], b[dn][1]);
                    f2_mma(o[2 * dn + 1], pa, b[dn][2], b[dn][3]);
                }
            }
            add_l(F2_BK / 16);
        }
    }
    tc_cp_wait<0>();
    if (PP && wg == 0)
        bar_sync_n(1, 256); /* warpgroup 1's last turn handed over */
    F2_MARK(F2_PROF_TAIL);

    if (!warp_live)
        return;
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f;
    float inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    if (scaled) {
        /* O is a convex combination of code rows: times the V scale */
        const float vsc = a.d_kv_scale[n_kv + kvh];
        inv0 *= vsc;
        inv1 *= vsc;
    }
    bf16_t *out0 = (bf16_t *)a.d_out +
                   ((size_t)(tok0 + qi0) * a.n_heads + h) * HD + 2 * tq;
    bf16_t *out1 = out0 + (size_t)8 * a.n_heads * HD;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        if (ok0)
            *(__nv_bfloat162 *)(out0 + nt * 8) =
                __floats2bfloat162_rn(o[nt][0] * inv0, o[nt][1] * inv0);
        if (ok1)
            *(__nv_bfloat162 *)(out1 + nt * 8) =
                __floats2bfloat162_rn(o[nt][2] * inv1, o[nt][3] * inv1);
    }
#ifdef BT_F2_PROF
    F2_MARK(F2_PROF_EPILOGUE);
    if (PP && (threadIdx.x & 127) == 0) {
        f2_acc[F2_PROF_WARPS] = 1;
        for (int i = 0; i < F2_PROF_N; i++)
            atomicAdd(&f2_prof[wg][i], (unsigned long long)f2_acc[i]);
    }
#endif
}

bool cuda_attn_prefill_fa2_ok(int head_dim, cuda_dtype_t dt, bool kv8)
{
    (void)kv8; /* both KV types at both head sizes (kv8: no ping-pong) */
    return dt == CUDA_DT_BF16 && (head_dim == 64 || head_dim == 128);
}

bool cuda_attn_prefill_widen_ok(int head_dim, int n_heads, int n_kv_heads,
                                int block_size)
{
    const int bs = block_size;

    return head_dim == 128 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
           (n_heads / n_kv_heads) % 2 == 0 && cuda_wgmma_available() &&
           bs >= 8 && (bs <= 128 ? 128 % bs == 0 : bs % 128 == 0);
}

/* PP's map of one layer cache (see f2_maps), boxes of min(block, bk)
 * slots. */
static bool f2_map(CUtensorMap *m, const cuda_attn_args_t *a, const void *p,
                   int rows)
{
    return wg_cache_map(m, p, a->head_dim, a->n_kv_heads, a->kv_slots,
                        rows);
}

/* PP's maps for key tiles of bk (64 or 128), where they can be made: the
 * caches' size known, blocks of 8 .. bk slots dividing a tile or
 * multiples of bk, slot indices in an int. */
static bool f2_pp_maps(const cuda_attn_args_t *a, int bk, f2_maps *maps)
{
    const int bs = a->block_size;

    if (a->kv_slots <= 0 || a->kv_slots >= 0x7fffffffLL ||
        !(bs >= 8 && (bs <= bk ? bk % bs == 0 : bs % bk == 0)))
        return false;
    const int rows = bs < bk ? bs : bk;

    maps->runs = bs < bk && f2_map(&maps->k_run, a, a->d_k_cache, bk) &&
                 f2_map(&maps->v_run, a, a->d_v_cache, bk);
    return f2_map(&maps->k, a, a->d_k_cache, rows) &&
           f2_map(&maps->v, a, a->d_v_cache, rows);
}

/* maps: PP's (f2_pp_maps), unused by the others. */
template <int HD, int NW, bool WQ, bool WV, bool PP, int BK = F2_BK,
          bool KV8 = false>
static cudaError_t f2_launch(const cuda_attn_args_t *a, const int *tiles,
                             int n_tiles, const f2_maps &maps,
                             cudaStream_t stream)
{
    const int G = a->n_heads / a->n_kv_heads;
    const int parts = (F2_SUBS * G + NW - 1) / NW;
    typedef f2_cfg<HD, NW, WQ, PP, BK, KV8> C;
    const size_t bytes = C::BYTES;
    const long long blocks = (long long)n_tiles * parts * a->n_kv_heads;
    cudaError_t err;

    if (blocks > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    err = cudaFuncSetAttribute(
        attn_prefill_fa2_kernel<HD, NW, WQ, WV, PP, BK, KV8>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess)
        return err;
    attn_prefill_fa2_kernel<HD, NW, WQ, WV, PP, BK, KV8>
        <<<(unsigned)blocks, C::BLOCK, bytes, stream>>>(
            *a, tiles, n_tiles, parts, maps);
    return cudaGetLastError();
}

/* The cp.async-ring kernels (fa2, fa2wqv) at a's head size, bf16 or FP8
 * KV (KV8). */
template <bool WQ, bool WV, bool KV8>
static cudaError_t f2_launch_hd(const cuda_attn_args_t *a, const int *tiles,
                                int n_tiles, int n_warps, cudaStream_t st)
{
    f2_maps none;

    memset(&none, 0, sizeof(none));
    if (a->head_dim == 64)
        return n_warps == 8 ? f2_launch<64, 8, WQ, WV, false, F2_BK, KV8>(
                                  a, tiles, n_tiles, none, st)
                            : f2_launch<64, 4, WQ, WV, false, F2_BK, KV8>(
                                  a, tiles, n_tiles, none, st);
    return n_warps == 8 ? f2_launch<128, 8, WQ, WV, false, F2_BK, KV8>(
                              a, tiles, n_tiles, none, st)
                        : f2_launch<128, 4, WQ, WV, false, F2_BK, KV8>(
                              a, tiles, n_tiles, none, st);
}

cudaError_t cuda_attn_prefill_fa2(const cuda_attn_args_t *args,
                                  const int *d_tiles, int n_tiles,
                                  int n_warps, int wgmma,
                                  cudaStream_t stream)
{
    const int G = args->n_heads / args->n_kv_heads;
    f2_maps maps;

    if (n_tiles == 0)
        return cudaSuccess;
    /* Auto: 8 warps when the 4 G warp units of a tile fill blocks of 8
     * (G even), else 4 (every unit count is a multiple of 4). */
    if (n_warps != 4 && n_warps != 8)
        n_warps = G % 2 == 0 ? 8 : 4;
    /* FP8 KV: the cp.async-ring kernels only (the ping-pong's TMA boxes
     * land as they are, nobody to widen them): wgmma 3 and 4 run as
     * fa2wqv */
    if (args->d_kv_scale != NULL && !args->kv_widened) {
        if (wgmma >= 2 && cuda_wgmma_available())
            return f2_launch_hd<true, true, true>(args, d_tiles, n_tiles,
                                                  n_warps, stream);
        return f2_launch_hd<false, false, true>(args, d_tiles, n_tiles,
                                                n_warps, stream);
    }
    /* wgmma 4 (fa2pp128): the ping-pong on 128-key tiles; wgmma 3
     * (fa2pp): on 64-key tiles.  The ping-pong needs two warpgroups a
     * block and its tensor maps; without them it runs as fa2wqv */
    if (wgmma >= 4 && n_warps == 8 && cuda_wgmma_available() &&
        f2_pp_maps(args, 128, &maps))
        return args->head_dim == 64
                   ? f2_launch<64, 8, true, true, true, 128>(
                         args, d_tiles, n_tiles, maps, stream)
                   : f2_launch<128, 8, true, true, true, 128>(
                         args, d_tiles, n_tiles, maps, stream);
    if (wgmma >= 3 && n_warps == 8 && cuda_wgmma_available() &&
        f2_pp_maps(args, F2_BK, &maps))
        return args->head_dim == 64
                   ? f2_launch<64, 8, true, true, true>(args, d_tiles,
                                                        n_tiles, maps, stream)
                   : f2_launch<128, 8, true, true, true>(
                         args, d_tiles, n_tiles, maps, stream);
    if (wgmma >= 2 && cuda_wgmma_available())
        return f2_launch_hd<true, true, false>(args, d_tiles, n_tiles,
                                               n_warps, stream);
    return f2_launch_hd<false, false, false>(args, d_tiles, n_tiles,
                                             n_warps, stream);
}

bool cuda_attn_prefill_prof_take(unsigned long long out[3][F2_PROF_N])
{
#ifdef BT_F2_PROF
    static const unsigned long long zero[3][F2_PROF_N] = {};

    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpyFromSymbol(out, f2_prof, sizeof(zero)) != cudaSuccess ||
        cudaMemcpyToSymbol(f2_prof, zero, sizeof(zero)) != cudaSuccess)
        return false;
    return true;
#else
    (void)out;
    return false;
#endif
}
