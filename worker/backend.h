/*
 * backend.h - the compute interface every engine backend implements.
 *
 * A backend owns the model weights in its own format and the paged KV pool
 * (kv.h), and runs one forward pass over a *batch* of sequences per call:
 * prompt chunks and single decode tokens mixed freely.  Callers (the
 * engine, prefill and decode workers) build a backend_batch_t and never
 * see which implementation runs it.
 *
 * Attention semantics for one sequence in a batch:
 *   - slots [0, ctx_len) of its block table already hold K/V from earlier
 *     steps;
 *   - its n_tokens new tokens are written to slots [ctx_len, ctx_len+n);
 *   - new token i attends to every cached slot and to new token j when
 *     mask[i*n + j] != 0, or when j <= i if mask is NULL (causal).
 *     A mask lets a chunk carry an EAGLE draft tree: siblings share a
 *     position but not a slot, and see only their ancestors.
 *   - RoPE uses positions[i], or ctx_len + i when positions is NULL.
 *   - the last n_logits new tokens produce a row of logits (and of hidden
 *     state when asked), in batch order.
 */
#ifndef BT_WORKER_BACKEND_H
#define BT_WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_tokens;           /* new tokens in this step (>= 1) */
    int ctx_len;            /* tokens already cached for this sequence */
    const int *tokens;      /* (n_tokens) token ids */
    const int *positions;   /* (n_tokens) RoPE positions or NULL */
    const int *block_table; /* (DIV_UP(ctx_len + n_tokens, block_size)) */
    const uint8_t *mask;    /* (n_tokens, n_tokens) or NULL for causal */
    int n_logits;           /* last n_logits tokens emit logits, 0..n */
} backend_seq_t;

typedef struct {
    int n_seqs;
    const backend_seq_t *seqs; /* (n_seqs) */
    /* Optional: called once per layer, in order, as soon as that layer's
     * K/V for this batch are written to the pool (for CUDA: recorded on
     * the compute stream).  Lets a prefill worker ship layer l's KV while
     * layer l+1 computes.  NULL = no callback. */
    void (*on_layer_done)(void *arg, int layer);
    void *on_layer_arg;
    /* cuda: the hidden rows (those a hidden destination would get) stay
     * on the device after the forward even without one, for a draft head
     * there (cuda_backend_hidden).  Other backends ignore it. */
    bool keep_hidden;
} backend_batch_t;

typedef enum {
    BACKEND_PRECISION_DEFAULT = 0, /* CPU: f32, CUDA: bf16 */
    BACKEND_PRECISION_F32,         /* float32 weights and activations */
    BACKEND_PRECISION_BF16,        /* CUDA: bf16 weights and activations,
                                      f32 accumulation and residual; CPU:
                                      the same roundings in f32 math */
    BACKEND_PRECISION_FP8          /* cpu, and cuda on one GPU (bf16 KV;
                                      worker/cuda/kernels/fp8.h):
                                      bf16 mode, plus FP8 E4M3 linear
                                      weights (per-channel or per-tensor
                                      scales) and GEMM inputs (static
                                      per-tensor or dynamic per-token
                                      scales), f32 accumulation; the
                                      embeddings, norms and classifier
                                      stay bf16 */
} backend_precision_t;

/* The dtype K/V are stored in. */
typedef enum {
    BACKEND_KV_DTYPE_AUTO = 0, /* the precision's (cpu: f32 storage, bf16
                                  values in bf16/fp8 precision) */
    BACKEND_KV_DTYPE_BF16,     /* bf16 values (cpu: in f32 storage) */
    BACKEND_KV_DTYPE_FP8       /* E4M3 bytes (kv_layout_t.elem_size 1),
                                  value = code * scale with a scale per
                                  layer and KV head (the checkpoint's
                                  k_scale / v_scale, else 1, from
                                  backend_kv8_scales); cpu and cuda */
} backend_kv_dtype_t;

/* Name of a KV dtype ("auto", "bf16", "fp8") and the parser of one;
 * BT_ERR_INVALID_ARG for an unknown name. */
const char *backend_kv_dtype_name(backend_kv_dtype_t dtype);

/* The FP8 KV scales of one layer: scales[h] for K head h and
 * scales[n_kv_heads + h] for V, the checkpoint's k_scale / v_scale, else
 * 1.0 (every backend takes them from here, so they store the same
 * codes). */
void backend_kv8_scales(const model_layer_t *ml, int n_kv_heads,
                        float *scales);
bt_status_t backend_kv_dtype_parse(const char *name,
                                   backend_kv_dtype_t *dtype_p);

/* ---- Calibration (baton model quantize --fp8) ----
 * With backend_config_t.calib set, the cpu backend records, for every
 * layer, the magnitudes of each GEMM input (the normed attention input,
 * the attention output, the normed feed-forward input, the SwiGLU output)
 * and of K and V per KV head: their absmax and a log2 histogram, from
 * which a percentile is read.  It then runs on one thread. */
#define BACKEND_CALIB_BINS 1024        /* 1/16 octave from 2^-32 to 2^32 */
#define BACKEND_CALIB_GEMMS 4          /* qkv, o, gate/up, down inputs */
/* stats of one layer: the GEMM inputs, then K per KV head, V per KV
 * head */
#define BACKEND_CALIB_PER_LAYER(n_kv_heads) \
    (BACKEND_CALIB_GEMMS + 2 * (n_kv_heads))

typedef struct {
    double absmax;                      /* largest |x| seen */
    uint64_t count;                     /* values seen */
    uint64_t hist[BACKEND_CALIB_BINS];  /* |x| by log2 bin */
} backend_calib_stat_t;

typedef struct {
    int n_layers;
    int n_kv_heads;
    backend_calib_stat_t *stats; /* (n_layers, BACKEND_CALIB_PER_LAYER) */
} backend_calib_t;

/* Adds n values to a statistic. */
void backend_calib_add(backend_calib_stat_t *st, const float *x, size_t n);
/* The p-th percentile (0 < p <= 100) of |x|: the upper edge of the bin
 * where the cumulative count reaches p%, never above absmax; 100 gives
 * absmax; 0 when nothing was seen. */
double backend_calib_percentile(const backend_calib_stat_t *st, double p);

typedef struct {
    int n_kv_blocks;       /* KV pool size in blocks; 0 = sized from
                            * memory (see "KV pool sizing" below) */
    int block_size;        /* tokens per KV block */
    int max_batch_tokens;  /* most new tokens one forward may carry */
    int max_seqs;          /* most sequences one forward may carry; 0 =
                            * from the KV capacity and the batch limits
                            * (backend__max_seqs_auto) */
    /* KV pool sizing when n_kv_blocks is 0.  cuda: kv_memory_fraction
     * of the device memory free after the weights and activations are
     * allocated (measured with cudaMemGetInfo, the least over the TP
     * ranks); the rest stays for CUDA graphs, cuBLASLt, sampling and
     * other processes.  cpu: a host budget (BACKEND_KV_HOST_DEFAULT_*).
     * kv_memory_bytes > 0 is an absolute budget for either (it wins
     * over the fraction). */
    double kv_memory_fraction; /* 0 < f <= 1 (default 0.90) */
    size_t kv_memory_bytes;    /* bytes for K + V of every layer, 0: none */
    /* Auto sizing holds at most kv_auto_contexts sequences of the
     * model's full context (a prefill worker needs only the prompts in
     * flight); 0 = no cap (cpu: max_seqs contexts, all it can use). */
    int kv_auto_contexts;
    int n_threads;         /* CPU worker threads (0 = all cores) */
    int device_index;      /* CUDA device ordinal */
    backend_precision_t precision;
    backend_kv_dtype_t kv_dtype; /* KV storage (see backend_kv_dtype_t) */
    backend_calib_t *calib;      /* cpu: record calibration statistics
                                    (model quantize); NULL = off */
    /* Optional allocator for the KV arrays (K and V, each
     * (n_layers, n_blocks, block_size, n_kv_heads, head_dim)), so a decode
     * worker can place its pool in memory a transport maps, e.g.
     * kv_ucx_mem_alloc.  NULL = the backend's own allocation.  kv_alloc
     * returns NULL on failure; kv_free is called for each non-NULL block
     * kv_alloc returned, when the backend is destroyed.  CPU backend only
     * for now (others ignore it). */
    void *(*kv_alloc)(void *arg, size_t bytes);
    void (*kv_free)(void *arg, void *ptr);
    void *kv_alloc_arg;    /* passed to kv_alloc / kv_free */
    /* Tensor parallelism (cuda only): ranks = GPUs device_index ..
     * device_index + tp_size - 1, one host thread each; 0 or 1 = one GPU.
     * Rank r holds query heads [r*nh/tp, ...), KV heads [r*nkv/tp, ...),
     * a hidden/tp slice of the feed-forward and a vocab/tp slice of the
     * classifier (model/model_shard.h). */
    int tp_size;
    /* Host tier of the prefix cache (--kv-host-gb; issue 38): bytes of
     * host memory for pool blocks the cache evicts, 0 = none.  Not used
     * by the backend itself: workerproc_prefix sizes the tier from it
     * and copies through backend_kv_save / backend_kv_load. */
    size_t kv_host_bytes;
} backend_config_t;

/* Defaults: 256 blocks of 16 tokens, 2048 batch tokens, 64 seqs, all
 * cores; kv_memory_fraction 0.90 (used only when n_kv_blocks is set to
 * 0, as the worker executables do). */
void backend_config_init(backend_config_t *cfg);

/* cpu KV host budget when n_kv_blocks is 0 and no kv_memory_bytes:
 * MemAvailable / BACKEND_KV_HOST_DEFAULT_DIV, at most
 * BACKEND_KV_HOST_DEFAULT_MAX bytes (and never more than max_seqs full
 * contexts).  Conservative on purpose: the cpu backend is the reference
 * and CI backend, it zeroes its whole pool (every page is touched), a CI
 * host runs several workers at once (ctest -j, a cluster test starts up
 * to six), and a decode worker's pool is UCX shared memory. */
#define BACKEND_KV_HOST_DEFAULT_DIV 32
#define BACKEND_KV_HOST_DEFAULT_MAX ((size_t)64 << 20)
/* Auto max_seqs: at most this many (cuda), or BACKEND_MAX_SEQS_CPU
 * (cpu: wider batches only lengthen its steps). */
#define BACKEND_MAX_SEQS_AUTO 512
#define BACKEND_MAX_SEQS_CPU 64

typedef struct backend_s backend_t;

/* Said once when an asynchronous operation no longer needs its input
 * (backend_kv_copy_in). */
typedef void (*backend_done_fn_t)(void *arg);

/* The function table an implementation provides (see cpu/cpu_backend.c).
 * `impl` is the implementation's own state. */
typedef struct {
    const char *name;
    bool (*is_available)(void);
    /* cfg: in, the configuration; out (on success), with n_kv_blocks and
     * max_seqs resolved when they were 0 (auto). */
    bt_status_t (*create)(const model_t *model, backend_config_t *cfg,
                          void **impl_p);
    void (*destroy)(void *impl);
    bt_status_t (*forward)(void *impl, const backend_batch_t *batch,
                           float *logits, float *hidden);
    void *(*kv_data)(void *impl, int layer, int kv); /* kv: 0 = K, 1 = V */
    bt_status_t (*kv_copy_block)(void *impl, int src_block, int dst_block);
    const kv_layout_t *(*kv_layout)(void *impl);
    /* Slot copy (see backend_kv_copy_slots); arguments already checked.
     * Synchronous: the copies are complete on return. */
    bt_status_t (*kv_copy_slots)(void *impl, int n, const int *src_slots,
                                 const int *dst_slots);
    /* Rank `rank`'s pool (tensor parallelism); NULL when the backend has
     * one rank (kv_data then serves rank 0). */
    void *(*kv_data_rank)(void *impl, int rank, int layer, int kv);
    /* Sampling in the backend (see backend_forward_sample); optional.
     * begin validates nothing (backend.c did) and either enqueues the
     * forward + sampling and sets *handled, or leaves *handled false and
     * changes nothing (backend.c then runs forward + the host sampler).
     * end waits and writes the ids; called once after a handled begin. */
    bt_status_t (*forward_sample_begin)(void *impl,
                                        const backend_batch_t *batch,
                                        sampler_t *const *samplers, int *ids,
                                        float *logits, float *hidden,
                                        bool *handled);
    bt_status_t (*forward_sample_end)(void *impl);
    /* Device memory free now and in all (bytes, rank 0's GPU); optional
     * (NULL: host memory, nothing to report). */
    bt_status_t (*mem_info)(void *impl, size_t *free_p, size_t *total_p);
    /* Host tier copies (see backend_kv_save); arguments checked, one
     * rank.  to_host: blocks[i] -> host[i], else host[i] -> blocks[i].
     * Complete on return.  Optional (NULL: BT_ERR_UNSUPPORTED). */
    bt_status_t (*kv_host_copy)(void *impl, int n, const int *blocks,
                                void *const *host, bool to_host);
    /* Page-locks (pin) or releases host memory the copies go through;
     * optional (NULL: nothing to do). */
    bt_status_t (*host_pin)(void *impl, void *ptr, size_t bytes, bool pin);
    /* Window copy-in (see backend_kv_copy_in); arguments checked, one
     * rank.  Optional (NULL: BT_ERR_UNSUPPORTED). */
    bt_status_t (*kv_copy_in)(void *impl, const void *src, int n,
                              const int *blocks, backend_done_fn_t done,
                              void *done_arg);
    /* See backend_step_quantum; optional (NULL: 1). */
    int (*step_quantum)(void *impl);
} backend_ops_t;

/* Creates a backend by name: "cpu", "cuda" or "auto" (cuda when a GPU is
 * present and the binary was built with CUDA, else cpu).  The model must
 * outlive the backend. */
bt_status_t backend_create(const char *name, const model_t *model,
                           const backend_config_t *cfg, backend_t **backend_p);
void backend_destroy(backend_t **backend_p);
const char *backend_name(const backend_t *backend);

/* The configuration the backend runs with: the caller's, with the
 * sizes it chose (n_kv_blocks, max_seqs) filled in. */
const backend_config_t *backend_config(const backend_t *backend);

/* The device memory free now and in all on the backend's (first) GPU;
 * BT_ERR_UNSUPPORTED for host backends. */
bt_status_t backend_mem_info(const backend_t *backend, size_t *free_p,
                             size_t *total_p);

/* Bytes one token takes in the KV pool (K and V, every layer, one
 * rank's heads). */
size_t backend_kv_token_bytes(const backend_t *backend);

/* The token count a forward's large GEMMs tile by: a step of a multiple
 * of it leaves no tile partly empty (cuda: cuBLASLt's; 1: no such
 * granularity).  A scheduler that may choose a step's size rounds to
 * it. */
int backend_step_quantum(const backend_t *backend);

/* Runs one forward pass.  `logits` receives (sum of n_logits, vocab)
 * float32 rows; `hidden`, when not NULL, the matching (rows, dim) final
 * hidden states (before the final norm), for speculative drafting.
 * The batch is validated first (token ids, block ids, sizes, mask):
 * BT_ERR_INVALID_ARG and no state change when it is malformed.
 * Not thread-safe: one caller at a time. */
bt_status_t backend_forward(backend_t *backend, const backend_batch_t *batch,
                            float *logits, float *hidden);

/* ---- Sampling in the backend (issue 4) ----
 * backend_forward_sample = backend_forward + sampler_sample on every
 * logits row, without the rows necessarily crossing to the host: the
 * cuda backend picks greedy rows on the device (argmax, the CPU's tie
 * rule), sends the top CUDA_SAMPLE_TOP_MAX candidates + the softmax
 * normalizer of temperature rows that sampler_need() marks TOP and
 * samples them on the host with sampler_sample_top() when that is exact,
 * and copies the whole row only for the rest (penalties, plain
 * temperature, top-k without top-p, or candidates that do not suffice).
 * The cpu backend (and tp > 1) runs forward and sampler_sample.
 *
 * rows = sum of n_logits, in batch order.  samplers[row] is that row's
 * sampler or NULL (samplers NULL: all NULL); ids[row] receives the
 * token (-1 for NULL rows).  Samplers draw exactly as sampler_sample
 * (one uniform per sampled temperature row) and observe nothing (the
 * caller observes).  logits (optional, (rows, vocab)): the rows whose
 * sampler is NULL get their logits there (other rows: unspecified).
 * hidden as in backend_forward.
 * Contract: on cpu the ids equal forward + sampler_sample exactly.  On
 * cuda, greedy rows equal the host argmax of the same logits; sampled
 * rows use the same uniform, candidate order and probabilities as the
 * host sampler on the same logits, except that the normalizer is summed
 * on the device (another order, the device's expf): probabilities agree
 * within float rounding, so a draw within rounding of a boundary may
 * differ. */
bt_status_t backend_forward_sample(backend_t *backend,
                                   const backend_batch_t *batch,
                                   sampler_t *const *samplers, int *ids,
                                   float *logits, float *hidden);

/* The same in two halves: begin validates and enqueues (the cpu
 * backend, and any fallback, does all the work in begin); the caller
 * may do host work that touches neither the backend, nor the batch's
 * arrays, samplers or output buffers; end waits and fills ids (and the
 * outputs).  Every begin that returns BT_OK needs one end; a failed
 * begin needs none. */
bt_status_t backend_forward_sample_begin(backend_t *backend,
                                         const backend_batch_t *batch,
                                         sampler_t *const *samplers, int *ids,
                                         float *logits, float *hidden);
bt_status_t backend_forward_sample_end(backend_t *backend);

/* The KV pool: its layout and the base of layer `layer`'s K (kv=0) or V
 * (kv=1) array (host memory for cpu, device memory for cuda). */
const kv_layout_t *backend_kv_layout(const backend_t *backend);
void *backend_kv_data(backend_t *backend, int layer, int kv);

/* Tensor parallelism: the number of ranks (1 without TP).  With TP,
 * backend_kv_layout() describes ONE rank's pool (n_kv_heads = KV heads
 * per rank), rank r holds KV heads [r*n, (r+1)*n), backend_kv_data() is
 * rank 0's pool and backend_kv_data_rank() any rank's (device memory of
 * GPU device_index + rank).  Block ids are the same on every rank. */
int backend_tp_size(const backend_t *backend);
void *backend_kv_data_rank(backend_t *backend, int rank, int layer, int kv);

/* The implementation "auto", "cpu" or "cuda" resolves to on this
 * machine ("cpu" or "cuda"), NULL when unknown or unavailable. */
const char *backend_resolve(const char *name);

/* Copies one block's K and V in every layer (copy-on-write, compaction). */
bt_status_t backend_kv_copy_block(backend_t *backend, int src_block,
                                  int dst_block);

/* Most slots one backend_kv_copy_slots call may copy. */
#define BACKEND_KV_COPY_MAX_SLOTS 8192

/* Copies the K and V of n token slots in every layer: slot src_slots[i]
 * to slot dst_slots[i], where a slot is block * block_size + offset in
 * the pool (speculative decoding compacts accepted draft tokens with it).
 * Semantics: every read happens before every write, so the sets may
 * overlap in any order (a -> b with b -> c copies the OLD b to c; a
 * permutation works).  dst slots must be distinct; src == dst is a no-op.
 * BT_ERR_INVALID_ARG (nothing copied) for n outside
 * 0..BACKEND_KV_COPY_MAX_SLOTS, a slot outside the pool or a repeated
 * dst.  Host arrays; synchronous. */
bt_status_t backend_kv_copy_slots(backend_t *backend, int n,
                                  const int *src_slots, const int *dst_slots);

/* ---- Host tier of the prefix cache (issue 38 item 4) ----
 * A block's K and V of every layer copied out of the pool to host memory
 * and back: host[i] holds backend_kv_host_block_bytes() bytes, layer 0
 * K, layer 0 V, layer 1 K, ...  After a save the bytes are in host
 * memory.  After a load the blocks hold them before any later forward or
 * KV copy of this backend reads them; the load may still be reading the
 * host memory (cuda: a copy stream the compute stream waits for), so the
 * caller changes it only through later saves and frees it only after
 * backend_host_pin(false) or backend_destroy, which wait for it.
 * BT_ERR_INVALID_ARG (nothing copied) for n < 0 or a block outside the
 * pool; BT_ERR_UNSUPPORTED with tp > 1 or a backend without the copies. */
size_t backend_kv_host_block_bytes(const backend_t *backend);
bt_status_t backend_kv_save(backend_t *backend, int n, const int *blocks,
                            void *const *host);
bt_status_t backend_kv_load(backend_t *backend, int n, const int *blocks,
                            void *const *host);
/* Pins host memory for those copies (cuda: cudaHostRegister, so they run
 * at PCIe speed; cpu: nothing); pin false undoes it. */
bt_status_t backend_host_pin(backend_t *backend, void *ptr, size_t bytes,
                             bool pin);

/* Copies a KV window into the pool: `src` (device memory for cuda, host
 * for cpu) holds n blocks per layer and K|V, laid out (n_layers, K|V, n)
 * of kv_layout_block_bytes each, and window block i goes to pool block
 * blocks[i] (the CUDA IPC link's per-reservation windows).  cuda: one
 * kernel (cuda_kv_window_to_pool) on the copy stream, behind the work
 * already queued on the compute stream (a block's last owner may still
 * be read), the compute stream's next work waiting for it; the caller's
 * thread never waits for the step in flight.  BT_OK: done(done_arg) is called exactly once when nothing
 * reads src any more (cpu: before return; cuda: from a thread of the
 * CUDA runtime, so it must not call CUDA): the window may be freed then,
 * not before.  An error: done is not called and nothing reads src after
 * return.  BT_ERR_INVALID_ARG (nothing copied) for n < 1 or a block
 * outside the pool; BT_ERR_UNSUPPORTED with tp > 1 or a backend without
 * it. */
bt_status_t backend_kv_copy_in(backend_t *backend, const void *src, int n,
                               const int *blocks, backend_done_fn_t done,
                               void *done_arg);

/* Shared batch check used by every implementation. */
bt_status_t backend_batch_validate(const backend_batch_t *batch,
                                   const model_config_t *mcfg,
                                   const backend_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_BACKEND_H */
