/*
 * attn_prefill.h - tiled paged attention for prompt chunks (flash
 * attention on tensor cores, bf16 activations, bf16 or FP8 E4M3 KV):
 * 64 queries of one sequence and one head per block, causal or masked,
 * attending to the cached prefix too (chunked prefill).
 */
#ifndef BT_WORKER_CUDA_KERNELS_ATTN_PREFILL_H
#define BT_WORKER_CUDA_KERNELS_ATTN_PREFILL_H

#include "attn_decode.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_PREFILL_BQ 64 /* queries per tile */

/* One tile of queries: ints, CUDA_PREFILL_TILE_INTS per tile. */
enum {
    CUDA_PT_TOK0 = 0,  /* batch index of the sequence's first new token */
    CUDA_PT_I0,        /* first query of the tile within the sequence */
    CUDA_PT_NQ,        /* queries in the tile (<= CUDA_PREFILL_BQ) */
    CUDA_PT_NTOK,      /* new tokens of the sequence */
    CUDA_PT_CTX,       /* cached tokens of the sequence */
    CUDA_PT_BT_OFF,    /* start of its block table in d_block_tables */
    CUDA_PT_MASK_OFF,  /* start of its (n, n) mask in d_masks, or -1 */
    CUDA_PT_PAD,
    CUDA_PREFILL_TILE_INTS
};

/* True when the tiled kernel supports this head size and dtype (bf16,
 * head_dim 16, 32, 64, 128 or 256).  FP8 KV (args->d_kv_scale) runs the
 * FA2 kernels at head 64 and 128 (fa2wqv, or fa2 without sm_90a wgmma;
 * not the ping-pong ones) and the shared-memory kernel at the others. */
bool cuda_attn_prefill_ok(int head_dim, cuda_dtype_t dt);

/* Runs the n_tiles tiles of d_tiles (n_tiles, CUDA_PREFILL_TILE_INTS);
 * uses args' tensors and sizes (not its per-token arrays). */
bt_status_t cuda_attn_prefill(const cuda_attn_args_t *args,
                              const int *d_tiles, int n_tiles,
                              cuda_dtype_t dt, cudaStream_t stream);

/* The FlashAttention-2 class kernel (attn_prefill_fa2.cu; what
 * cuda_attn_prefill runs at head 64/128): bf16, head_dim 64 or 128, KV
 * of bf16 or (kv8) FP8 E4M3 codes with args->d_kv_scale.  With kv8 only
 * the cp.async-ring variants exist (fa2, fa2wqv): a wgmma of 3 or 4 runs
 * as fa2wqv. */
bool cuda_attn_prefill_fa2_ok(int head_dim, cuda_dtype_t dt, bool kv8);

/* True when an FP8 KV cache's prefill attention gains by widening: the
 * bf16 cache would take the TMA ping-pong kernel on 128-key tiles
 * (fa2pp128: head 128, sm_90a, an even query group, blocks of 8..128
 * slots dividing 128 or multiples of 128), which the codes cannot (their
 * TMA boxes would land unwidened).  Then the caller widens the pages the
 * prefill reads (cuda_kv8_widen_pages) and passes them as bf16 with
 * args->kv_widened (H100, llama3-8b fp8 + FP8 KV: a 1,990-token chunk's
 * attention 151 -> 106 us a layer, the widening under PDL behind the
 * decode attention; prefill 2048 / 8192 tokens -4% / -12%,
 * docs/PERFORMANCE.md). */
bool cuda_attn_prefill_widen_ok(int head_dim, int n_heads, int n_kv_heads,
                                int block_size);

/* Same tiles and semantics as cuda_attn_prefill; the query heads of one
 * KV head share a block.  n_warps: 4 or 8 per block, anything else =
 * 8 when n_heads / n_kv_heads is even, else 4.  wgmma: 2 runs S = Q K^T
 * and O += P V on wgmma (fa2wqv), 3 the two warpgroups of 8 warps in
 * ping-pong fed by a TMA producer warp (fa2pp), 4 that on 128-key tiles
 * (fa2pp128), each falling back to the one before where it cannot run;
 * 0 (or no wgmma, cuda_wgmma_available in kernels/wgmma.cuh) mma.sync
 * only.  FP8 KV (args->d_kv_scale != NULL): 2, 3 and 4 all run fa2wqv.
 * cuda_attn_prefill passes 4 at head 128 and 2 at head 64; tests name
 * the others to check the fallbacks. */
cudaError_t cuda_attn_prefill_fa2(const cuda_attn_args_t *args,
                                  const int *d_tiles, int n_tiles,
                                  int n_warps, int wgmma,
                                  cudaStream_t stream);

/* The ping-pong prefill kernels' phase profile (a build with cmake
 * -DBT_PREFILL_PROF=ON, tests/gpu/bench_kernels --attn): cycles summed
 * over lane 0 of each consumer warpgroup's first warp, [warpgroup][phase]
 * (row 2: the producer warp's lane 0, PROD_* and the counts), since the
 * last take; false (out untouched) in a normal build. */
enum {
    F2_PROF_PROLOGUE, /* block start to the key loop (Q staged) */
    F2_PROF_FULL,     /* waits for a stage's copies */
    F2_PROF_TURN,     /* waits for the warpgroup's turn on the tensor cores */
    F2_PROF_S,        /* S issued until complete */
    F2_PROF_SOFTMAX,  /* masks, maxima, O rescale, P */
    F2_PROF_PV,       /* P V issued until complete */
    F2_PROF_SKIPPED,  /* turns taken on tiles past the warpgroup's keys */
    F2_PROF_TAIL,     /* after the loop, the last turn handed over */
    F2_PROF_EPILOGUE, /* l reduced, O written */
    F2_PROF_PROD_EMPTY, /* producer: waits for a stage to be released */
    F2_PROF_PROD_ISSUE, /* producer: block-table reads and copies issued */
    F2_PROF_TILES,    /* count: tiles computed */
    F2_PROF_WARPS,    /* count: warps that reported */
    F2_PROF_N
};
bool cuda_attn_prefill_prof_take(unsigned long long out[3][F2_PROF_N]);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_KERNELS_ATTN_PREFILL_H */
