/*
 * gemm_cache.h - the GEMM tuner's picks as a text file (BT_GEMM_CACHE).
 *
 * worker_gemm (gemm.c) times every skinny and prefill weight shape the
 * first time it sees it, and the pick varies from process to process
 * (two cuBLASLt tiles within 2% of each other trade places).  The cache
 * keeps the picks of one device + library combination across processes,
 * so a restarted worker serves its first requests without tuning pauses
 * and an A/B of two builds runs the same GEMMs.  Plain C without CUDA
 * (the parser is fuzzed on any build): gemm.c builds the key, reads and
 * writes the file, and checks each cuBLASLt algorithm before using it.
 *
 * Format, one record a line ('#' starts a comment line):
 *   baton-gemm-cache 1 KEY
 *   T O I OUT CHOICE US [A0 .. A7]
 * KEY: one token without spaces naming device, driver-independent
 * library versions and build (gemm.c); a file whose key differs holds no
 * entries for this process (it is rewritten on the next tune).  T tokens
 * (bucket), O x I weight, OUT the kind of product: "bf16" or "f32" (bf16
 * inputs, that output), or for the FP8 GEMM with its scale vectors
 * applied inside cuBLASLt (gemm_fp8.c, worker_gemm_fp8) "fp8v-bf16",
 * "fp8v-f32", with "+" appended when it accumulates into the output (I
 * is then the codes' row stride); CHOICE a GEMV variant name
 * (kernels/gemv.h) or "ltN" (cuBLASLt, N the candidate's index, kept for
 * the log), for an FP8 product also "ptN" (cuBLASLt's plain FP8 plan:
 * f32 sums, then the scaling pass) or "skinny" (the skinny FP8 GEMM), US
 * its median time, A0..A7 (ltN and ptN only) the 8 words of
 * cublasLtMatmulAlgo_t in hex.
 */
#ifndef BT_WORKER_CUDA_GEMM_CACHE_H
#define BT_WORKER_CUDA_GEMM_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_CACHE_VERSION 1
#define GEMM_CACHE_KEY_MAX 256
#define GEMM_CACHE_CHOICE_MAX 16
#define GEMM_CACHE_ALGO_WORDS 8
#define GEMM_CACHE_MAX_BYTES (4u << 20)

/* What an entry's product is: its inputs and how they are scaled. */
typedef enum {
    GEMM_CACHE_KIND_DENSE = 0,  /* bf16 inputs (worker_gemm) */
    GEMM_CACHE_KIND_FP8_VEC = 1 /* E4M3 inputs, per-token and per-row f32
                                   scales inside the GEMM (worker_gemm_fp8) */
} gemm_cache_kind_t;

typedef struct {
    int bucket;                         /* tokens, 1 .. 65536 */
    int n_out;
    int n_in;
    int out_f32;                        /* 1: f32 output, 0: bf16 */
    int kind;                           /* gemm_cache_kind_t */
    int accumulate;                     /* FP8_VEC only: 1 when y += */
    char choice[GEMM_CACHE_CHOICE_MAX]; /* "rows", "lt3", ... */
    float us;                           /* median time when tuned */
    int lt;                             /* choice is "ltN" or "ptN": algo
                                         * is set */
    uint64_t algo[GEMM_CACHE_ALGO_WORDS];
} gemm_cache_entry_t;

/* Parses a cache file's text (len bytes, need not be NUL-terminated).
 * BT_OK with *n_p entries (at most max) when the header's key is `key`;
 * BT_OK with *n_p = 0 when the key differs (a stale file, not an error);
 * BT_ERR_FORMAT (and *n_p = 0) on anything malformed: no header, an
 * unknown version, a bad field, a duplicate (T, O, I, OUT). */
bt_status_t gemm_cache_parse(const char *text, size_t len, const char *key,
                             gemm_cache_entry_t *out, int max, int *n_p);

/* The text of a cache file holding entries e[0, n) under `key`, in a
 * bt_malloc'ed NUL-terminated buffer (*text_p, *len_p), or
 * BT_ERR_INVALID_ARG when the key or an entry is not representable. */
bt_status_t gemm_cache_format(const char *key, const gemm_cache_entry_t *e,
                              int n, char **text_p, size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_GEMM_CACHE_H */
