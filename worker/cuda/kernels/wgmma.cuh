/*
 * wgmma.cuh - Hopper warpgroup MMA (wgmma.mma_async) building blocks:
 * shared-memory matrix descriptors for K-major tiles in the 128-byte
 * swizzle the cp.async rings of tc_common.cuh already write (16-byte
 * chunk c of 128-byte row r at chunk c ^ (r & 7), tile base 1024-byte
 * aligned), the fences, commit and wait, and m64nNk16 bf16 -> f32 for
 * N = 8 NT, NT in {1, 2, 4, 8, 16}; m64nNk32 E4M3 -> f32 for NT in {1,
 * 2, 4, 8} (the same tiles: a k32 step of E4M3 codes is the 32 bytes of
 * a bf16 k16 step); and the register-A form with an
 * N-major B (wg_mma_rs, wg_desc_mn) for P V in attention.
 *
 * Operands: A is 64 rows x 16 K (rows 128 bytes apart, 8-row groups
 * 1024 bytes apart), B is N rows x 16 K in the same layout (B "K-major":
 * both transposes 0); a k16 step inside a 64-wide tile advances both
 * start addresses by 32 bytes and the hardware applies the swizzle to
 * the absolute address bits.  Accumulator layout per warp of the
 * warpgroup (warp w of 4, lane = 4 g + q): c[j][0..1] = row 16 w + g,
 * columns 8 j + 2 q + {0, 1}; c[j][2..3] = row 16 w + g + 8 -- the
 * mma.m16n8k16 C layout repeated over the N / 8 column tiles.
 *
 * Only sm_90a has these instructions: everything here compiles to a trap
 * elsewhere, and callers check cuda_wgmma_available() (BT_HAVE_WGMMA,
 * set by the build when it targets 90a, and a compute-capability-9
 * device) before they launch a kernel that uses them.
 */
#ifndef BT_WORKER_CUDA_KERNELS_WGMMA_CUH
#define BT_WORKER_CUDA_KERNELS_WGMMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#else
#define WG_ENABLED 0
#endif

/* True when kernels may use wgmma: a build for sm_90a (BT_HAVE_WGMMA,
 * set by worker/cuda/CMakeLists.txt) on a compute-capability-9 device.
 * Host code; the answer is cached per translation unit. */
static inline bool cuda_wgmma_available(void)
{
#ifdef BT_HAVE_WGMMA
    static int avail = -1;

    if (avail < 0) {
        int dev = 0, major = 0;

        avail = cudaGetDevice(&dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&major,
                                       cudaDevAttrComputeCapabilityMajor,
                                       dev) == cudaSuccess &&
                major == 9;
    }
    return avail == 1;
#else
    return false;
#endif
}

/* Descriptor of a K-major, 128-byte-swizzled tile at shared address
 * `saddr` (1024-byte aligned base, plus 32 bytes per k16 step): start
 * address >> 4 in bits 0-13, leading offset 16 bytes (unused by swizzled
 * K-major layouts), stride offset 1024 bytes (one 8-row group) in bits
 * 32-45, swizzle mode 1 (128 bytes) in bits 62-63. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* mbarriers (sm_90; CTA scope).  mbar_wait: until the phase of parity
 * `parity` has completed (a fresh barrier counts the phase before it,
 * parity 1, as completed); a wait of more than ~2^34 cycles (seconds)
 * aborts (wg_abort), so a pipeline bug becomes a launch error instead of
 * a hung GPU. */
static __device__ __forceinline__ uint32_t mbar_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
#if WG_ENABLED
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                 :: "r"(mbar_smem(bar)), "r"(count) : "memory");
#endif
}

/* After the mbarrier.init of a block's barriers (one thread), before
 * the block barrier that publishes them: makes the inits visible to the
 * async proxy (the TMA copies that complete on them). */
static __device__ __forceinline__ void mbar_init_fence(void)
{
#if WG_ENABLED
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

static __device__ __forceinline__ void mbar_expect(uint64_t *bar,
                                                   uint32_t bytes)
{
#if WG_ENABLED
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(mbar_smem(bar)), "r"(bytes) : "memory");
#endif
}

static __device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
#if WG_ENABLED
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];"
                 :: "r"(mbar_smem(bar)) : "memory");
#endif
}

/* Ends a wait that can never finish with an error the host sees (an
 * illegal address), then exits the thread.  Not __trap(): ptxas ignores
 * every setmaxnreg.inc of a kernel whose code can reach a trap, so a
 * consumer warpgroup keeps the launch's register budget (168 at 384
 * threads) and spills (round 25: the prefill attention's overlap). */
static __device__ __forceinline__ void wg_abort(void)
{
    *(volatile int *)(uintptr_t)16 = 1;
    asm volatile("exit;");
}

static __device__ __forceinline__ void mbar_wait(uint64_t *bar,
                                                 uint32_t parity)
{
#if WG_ENABLED
    uint32_t done = 0, spins = 0;
    long long t0 = 0;

    for (;;) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                     "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(mbar_smem(bar)), "r"(parity)
                     : "memory");
        if (done)
            return;
        if (++spins % 4096 == 0) {
            const long long t = clock64();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > (1LL << 34))
                wg_abort();
        }
    }
#endif
}

/* Starts fetching a tensor map's descriptor (kernel parameter space)
 * into the copy engine's cache before the first copy needs it. */
static __device__ __forceinline__ void wg_tma_prefetch(const CUtensorMap *m)
{
#if WG_ENABLED
    asm volatile("prefetch.tensormap [%0];" :: "l"((uint64_t)m) : "memory");
#endif
}

/* Box (c0, c1, c2) of the 3-D tensor map into dst (shared memory),
 * completing on bar with its byte count (zeros outside the tensor). */
static __device__ __forceinline__ void wg_tma_load_3d(void *dst,
                                                      const CUtensorMap *map,
                                                      int c0, int c1, int c2,
                                                      uint64_t *bar)
{
#if WG_ENABLED
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier"
                 "::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(mbar_smem(dst)), "l"((uint64_t)map), "r"(c0),
                    "r"(c1), "r"(c2), "r"(mbar_smem(bar)) : "memory");
#endif
}

/* The driver's cuTensorMapEncodeTiled (host; NULL without it), looked up
 * once per translation unit. */
static inline PFN_cuTensorMapEncodeTiled_v12000 wg_tensor_map_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static int tried;

    if (!tried) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;

        tried = 1;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p,
                                             12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        else
            (void)cudaGetLastError();
    }
    return fn;
}

/* A 3-D tensor map over one layer's paged K or V cache at p ({head dims,
 * KV heads, slots}, bf16, 128-byte swizzle): boxes of 64 dims x 1 head x
 * box_rows slots, which land as box_rows rows of 128 bytes in the swizzle
 * the attention kernels read.  False without the driver's encoder or
 * when the cache cannot be mapped. */
static inline bool wg_cache_map(CUtensorMap *m, const void *p, int head_dim,
                                int n_kv_heads, long long slots,
                                int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = wg_tensor_map_encoder();
    const cuuint64_t dims[3] = {(cuuint64_t)head_dim, (cuuint64_t)n_kv_heads,
                                (cuuint64_t)slots};
    const cuuint64_t strides[2] = {(cuuint64_t)head_dim * 2,
                                   (cuuint64_t)n_kv_heads * head_dim * 2};
    const cuuint32_t box[3] = {64, 1, (cuuint32_t)box_rows};
    const cuuint32_t estr[3] = {1, 1, 1};

    if (fn == NULL || ((uintptr_t)p & 15) != 0)
        return false;
    return fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(p),
              dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Named barriers (id 1..15; 0 is __syncthreads) over n threads: wait
 * for n arrivals, or arrive without waiting. */
static __device__ __forceinline__ void bar_sync_n(int id, int n)
{
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

static __device__ __forceinline__ void bar_arrive_n(int id, int n)
{
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(n) : "memory");
}

/* Hands registers between warpgroups (FlashAttention-3's producer /
 * consumer split): every warp of a warpgroup executes the same one; N a
 * multiple of 8 in 24..256.  The block must have been launched with at
 * most as many registers a thread as the smallest N gives back. */
template <int N> static __device__ __forceinline__ void wg_regs_dec(void)
{
#if WG_ENABLED
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
#endif
}

template <int N> static __device__ __forceinline__ void wg_regs_inc(void)
{
#if WG_ENABLED
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
#endif
}

/* Orders this thread's generic-proxy shared-memory writes (cp.async
 * included) before later async-proxy reads (wgmma operands). */
static __device__ __forceinline__ void wg_fence_proxy(void)
{
#if WG_ENABLED
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Before the first wgmma of a batch (accumulators and operands ready). */
static __device__ __forceinline__ void wg_fence(void)
{
#if WG_ENABLED
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void wg_commit(void)
{
#if WG_ENABLED
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N> static __device__ __forceinline__ void wg_wait(void)
{
#if WG_ENABLED
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
#endif
}

/* Keeps the compiler from moving accumulator reads or writes across the
 * asynchronous MMAs (CUTLASS's warpgroup_fence_operand). */
template <int NT>
static __device__ __forceinline__ void wg_fence_acc(float (&c)[NT][4])
{
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(c[j][e]) :: "memory");
}

/* c (64 x 8 NT f32, per warpgroup) += A (64 x 16) . B (8 NT x 16)^T. */
template <int NT> struct wg_mma {
    static __device__ __forceinline__ void run(float (&c)[NT][4],
                                               uint64_t da, uint64_t db)
    {
        (void)c; (void)da; (void)db;
        __trap();
    }
};

/* c (64 x 8 NT f32, per warpgroup) += A (64 x 32 E4M3) . B (8 NT x 32
 * E4M3)^T, both K-major in shared memory (wg_desc; FP8 has no
 * transposed forms). */
template <int NT> struct wg_mma_e4m3 {
    static __device__ __forceinline__ void run(float (&c)[NT][4],
                                               uint64_t da, uint64_t db)
    {
        (void)c; (void)da; (void)db;
        __trap();
    }
};

/* c (64 x 8 NT f32, per warpgroup) += A (64 x 16, registers) . B
 * (16 x 8 NT, shared memory, N-major: K rows of contiguous N values,
 * wg_desc_mn), NT in {8, 16}.  A per warp w: its rows 16 w .. 16 w + 15
 * in the mma.m16n8k16 A layout (a[0] row g, k 2q..2q+1; a[1] row g + 8;
 * a[2] row g, k 2q+8..; a[3] row g + 8, k 2q+8..) -- what the S
 * accumulators of the FlashAttention kernels re-pack into as P. */
template <int NT> struct wg_mma_rs {
    static __device__ __forceinline__ void run(float (&c)[NT][4],
                                               const uint32_t (&a)[4],
                                               uint64_t db)
    {
        (void)c; (void)a; (void)db;
        __trap();
    }
};

/* Descriptor of an N-major (MN-major), 128-byte-swizzled B operand at
 * `saddr`: 8-row K groups of 128-byte rows (64 bf16 of N each) `sbo`
 * bytes apart, the next 64 N values `lbo` bytes on (CUTLASS's canonical
 * MN-major SW128 layout ((8,n),(8,k)):((1,LBO),(8,SBO)) in 16-byte
 * units; both offsets >> 4). */
static __device__ __forceinline__ uint64_t wg_desc_mn(uint32_t saddr,
                                                      uint32_t lbo,
                                                      uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) |
           (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}

/* Descriptor d (wg_desc / wg_desc_mn) moved `bytes` on in shared
 * memory (a multiple of 16): only the start-address field, bits 0-13,
 * changes, and a shared address >> 4 stays below 2^14, so the add never
 * carries into the other fields.  Built once per tile and advanced per
 * k step, a descriptor costs one add instead of the ~14 instructions
 * ptxas emits to rebuild it before every wgmma (round 25). */
static __device__ __forceinline__ uint64_t wg_desc_add(uint64_t d,
                                                       uint32_t bytes)
{
    const uint32_t lo = (uint32_t)d + (bytes >> 4);

    return (d & 0xFFFFFFFF00000000ull) | lo;
}

#if WG_ENABLED
/* One specialisation per NT and operand type: the asm text and operand
 * lists differ only in the accumulator count (4 NT registers, then the
 * two descriptors and the scale-d predicate's source: WG_NT<NT>) and in
 * the instruction's shape and types (SHAPE) and trailing immediates
 * (TAIL: scale-a, scale-b, and for bf16 the two transposes FP8 has not).
 * WG_MMA expands its arguments once more so a WG_NT list can be one. */
#define WG_C(j) "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
#define WG_MMA_DEF(STRUCT, SHAPE, TAIL, NT, N, REGS, DA, DB, ONE, ...)     \
    template <> struct STRUCT<NT> {                                        \
        static __device__ __forceinline__ void run(float (&c)[NT][4],      \
                                                   uint64_t da,            \
                                                   uint64_t db)            \
        {                                                                  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n" \
                         "wgmma.mma_async.sync.aligned.m64n" N SHAPE       \
                         " {" REGS "}, %" DA ", %" DB ", p" TAIL ";\n}\n"  \
                         : __VA_ARGS__                                     \
                         : "l"(da), "l"(db), "r"(1));                      \
        }                                                                  \
    }
#define WG_MMA(...) WG_MMA_DEF(__VA_ARGS__)
#define WG_BF16 wg_mma, "k16.f32.bf16.bf16", ", 1, 1, 0, 0"
#define WG_E4M3 wg_mma_e4m3, "k32.f32.e4m3.e4m3", ", 1, 1"

#define WG_NT1 1, "8", "%0,%1,%2,%3", "4", "5", "6", WG_C(0)
#define WG_NT2 2, "16", "%0,%1,%2,%3,%4,%5,%6,%7", "8", "9", "10",         \
               WG_C(0), WG_C(1)
#define WG_NT4 4, "32",                                                    \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15",    \
               "16", "17", "18", WG_C(0), WG_C(1), WG_C(2), WG_C(3)
#define WG_NT8 8, "64",                                                    \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"    \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"  \
               "%30,%31",                                                  \
               "32", "33", "34", WG_C(0), WG_C(1), WG_C(2), WG_C(3),       \
               WG_C(4), WG_C(5), WG_C(6), WG_C(7)
#define WG_NT16 16, "128",                                                 \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"    \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"  \
               "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,"  \
               "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,"  \
               "%58,%59,%60,%61,%62,%63",                                  \
               "64", "65", "66", WG_C(0), WG_C(1), WG_C(2), WG_C(3),       \
               WG_C(4), WG_C(5), WG_C(6), WG_C(7), WG_C(8), WG_C(9),       \
               WG_C(10), WG_C(11), WG_C(12), WG_C(13), WG_C(14), WG_C(15)

WG_MMA(WG_BF16, WG_NT1);
WG_MMA(WG_BF16, WG_NT2);
WG_MMA(WG_BF16, WG_NT4);
WG_MMA(WG_BF16, WG_NT8);
WG_MMA(WG_BF16, WG_NT16);
WG_MMA(WG_E4M3, WG_NT1);
WG_MMA(WG_E4M3, WG_NT2);
WG_MMA(WG_E4M3, WG_NT4);
WG_MMA(WG_E4M3, WG_NT8);

#undef WG_NT16
#undef WG_NT8
#undef WG_NT4
#undef WG_NT2
#undef WG_NT1
#undef WG_E4M3
#undef WG_BF16
#undef WG_MMA
#undef WG_MMA_DEF

#define WG_MMA_RS(NT, N, REGS, AREGS, DB, ONE, ...)                        \
    template <> struct wg_mma_rs<NT> {                                     \
        static __device__ __forceinline__ void run(float (&c)[NT][4],      \
                                                   const uint32_t (&a)[4], \
                                                   uint64_t db)            \
        {                                                                  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n" \
                         "wgmma.mma_async.sync.aligned.m64n" N             \
                         "k16.f32.bf16.bf16 {" REGS "}, {" AREGS "}, %" DB \
                         ", p, 1, 1, 1;\n}\n"                              \
                         : __VA_ARGS__                                     \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),     \
                           "l"(db), "r"(1));                               \
        }                                                                  \
    }

WG_MMA_RS(8, "64",
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
          "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
          "%30,%31",
          "%32,%33,%34,%35", "36", "37",
          WG_C(0), WG_C(1), WG_C(2), WG_C(3), WG_C(4), WG_C(5), WG_C(6),
          WG_C(7));

WG_MMA_RS(16, "128",
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
          "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
          "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,"
          "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,"
          "%58,%59,%60,%61,%62,%63",
          "%64,%65,%66,%67", "68", "69",
          WG_C(0), WG_C(1), WG_C(2), WG_C(3), WG_C(4), WG_C(5), WG_C(6),
          WG_C(7), WG_C(8), WG_C(9), WG_C(10), WG_C(11), WG_C(12),
          WG_C(13), WG_C(14), WG_C(15));

#undef WG_MMA_RS
#undef WG_C
#endif /* WG_ENABLED */

#endif /* BT_WORKER_CUDA_KERNELS_WGMMA_CUH */
