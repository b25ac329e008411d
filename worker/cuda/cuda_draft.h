/*
 * cuda_draft.h - the EAGLE draft head (spec_head.h) on the GPU, so that
 * speculation with the cuda backend never runs the head on the host.
 *
 * Same math as spec_head_forward / spec_head_logits, batched over many
 * sequences ("draft states") per call: every row names its state, and
 * each state has its own contiguous slice of the head's KV cache (slots
 * 0..state_slots-1, paged with an identity block table so the backend's
 * attention kernels serve it) and of a feature store (store_rows rows of
 * dim, activation dtype) where outputs are kept for later rows (the tree
 * root and expanded nodes) without a round trip to the host.  Target
 * features arrive as raw hidden states (before the final norm): from the
 * host, or stashed on the device from the target's own rows
 * (cuda_draft_stash) so they never cross to the host; they are
 * normalised on the device.  Only top-k (token, log-prob) candidates come
 * back, computed on the device.  Passes of more than 32 rows run padded
 * to a multiple of 16 so captured passes are reused.
 *
 * Device memory: the head's own layer, a copy of the target's embedding
 * and classifier (2 x vocab x dim in the activation dtype: 2.1 GB for a
 * Llama-3-8B shape in bf16) and final norm, the KV slices (n_states x
 * state_slots x 2 x kv_dim), the feature store and the stash (n_states x
 * pend_rows x dim f32).  Not thread-safe.
 *
 * BT_DRAFT_PROFILE=1: passes run eagerly with CUDA events between their
 * stages; the per-stage sums are printed to stderr at destroy.
 */
#ifndef BT_WORKER_CUDA_CUDA_DRAFT_H
#define BT_WORKER_CUDA_CUDA_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "spec/spec_head.h"
#include "spec/spec_tree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most candidates per row (cuda_topk_logprob). */
#define CUDA_DRAFT_TOPK_MAX 16

typedef struct {
    int device_index;  /* CUDA device (the target backend's) */
    int bf16;          /* 1: bf16 weights/activations, 0: f32 */
    int n_states;      /* sequences that may hold draft state at once */
    int state_slots;   /* head KV slots per state */
    int store_rows;    /* feature rows per state */
    int pend_rows;     /* stashed target rows per state (cuda_draft_stash),
                          0: none */
} cuda_draft_config_t;

typedef struct cuda_draft_s cuda_draft_t;

/* Uploads the head's weights (and the target tables it borrows). */
bt_status_t cuda_draft_create(const spec_head_t *head,
                              const cuda_draft_config_t *cfg,
                              cuda_draft_t **draft_p);
void cuda_draft_destroy(cuda_draft_t **draft_p);

/* Device bytes the draft holds. */
size_t cuda_draft_device_bytes(const cuda_draft_t *draft);

/* One input row of cuda_draft_forward. */
typedef struct {
    int state;           /* draft state, 0..n_states-1 */
    int token;           /* x[t+1] (its embedding is fused in) */
    int pos;             /* RoPE position */
    int slot;            /* head KV slot written, 0..state_slots-1 */
    int ctx;             /* slots [0, ctx) are visible */
    int kv_len;          /* slots [ctx, kv_len) are visible when
                            mask[s - ctx] != 0 (all when mask is NULL);
                            must include `slot` */
    const uint8_t *mask; /* (kv_len - ctx) or NULL */
    int feat;            /* input feature: >= 0 a store row of the state,
                            -1 - i: row i of h_hidden, or with h_hidden
                            NULL the state's stashed row i */
    int out;             /* store row that receives the output feature,
                            -1: none */
} cuda_draft_row_t;

/* Runs the head over n rows in order (a row sees the K/V of earlier rows
 * of the same call).  h_hidden (n_hidden, dim) f32 target hidden states
 * before the final norm, or NULL: rows name stashed rows (n_hidden is
 * then ignored).  With k > 0: top_ids / top_logp (n, k) = the k
 * best draft tokens of each row's output and their log-probabilities.
 * Tests: h_feat (n, dim) f32 output features and h_logits (n, vocab)
 * classifier rows when not NULL. */
bt_status_t cuda_draft_forward(cuda_draft_t *draft, int n,
                               const cuda_draft_row_t *rows,
                               const float *h_hidden, int n_hidden, int k,
                               int *top_ids, float *top_logp, float *h_feat,
                               float *h_logits);

/* The stash: target hidden rows (f32, before the final norm) waiting on
 * the device to be fed, pend_rows per state, so a target whose hidden
 * rows are on this GPU (cuda_backend_hidden) hands them over without a
 * trip to the host.  Row src_rows[i] of d_src (dim wide, this GPU) goes
 * to state states[i]'s stash row rows[i].  Synchronous: d_src may change
 * once this returns. */
bt_status_t cuda_draft_stash(cuda_draft_t *draft, int n, const float *d_src,
                             const int *src_rows, const int *states,
                             const int *rows);

/* The same from n host rows h_rows (n, dim) into stash rows
 * [row0, row0 + n) of one state (imported features). */
bt_status_t cuda_draft_stash_host(cuda_draft_t *draft, int state, int row0,
                                  const float *h_rows, int n);

/* Top-k of the classifier applied to n stored features (states[i],
 * store row rows[i]); h_logits as above (NULL: not copied). */
bt_status_t cuda_draft_topk(cuda_draft_t *draft, int n, const int *states,
                            const int *store_rows, int k, int *top_ids,
                            float *top_logp, float *h_logits);

/* Verification on the device: the target's logits rows recomputed from
 * its hidden rows h_hidden (n, dim) f32 (before the final norm; the
 * draft holds the target's final norm and classifier) and reduced to
 * argmax (n) there (lowest id on ties), so a greedy step moves
 * n x dim floats instead of n x vocab.  Rows listed in full_rows
 * (n_full) also get their whole logits row at h_logits + row * vocab. */
bt_status_t cuda_draft_target_argmax(cuda_draft_t *draft, int n,
                                     const float *h_hidden, int *argmax,
                                     int n_full, const int *full_rows,
                                     float *h_logits);

/* cuda_draft_target_argmax of rows already on this GPU: row i is
 * d_hidden + map[i] * dim (cuda_backend_hidden). */
bt_status_t cuda_draft_target_argmax_dev(cuda_draft_t *draft, int n,
                                         const float *d_hidden,
                                         const int *map, int *argmax,
                                         int n_full, const int *full_rows,
                                         float *h_logits);

/* Head passes so far (cuda_draft_forward chunks): replayed from a CUDA
 * graph, captured (a key's second sight), launched kernel by kernel, and
 * the GPU time of their device work (events around each pass, ns). */
void cuda_draft_graph_stats(const cuda_draft_t *draft, uint64_t *replays,
                            uint64_t *captures, uint64_t *eager,
                            uint64_t *gpu_ns);

/* ---- the device draft loop: a whole EAGLE-2 tree per sequence on the
 * device, for n sequences at once, with no host round trip between
 * levels (spec.c uses it when BT_DRAFT_LOOP=device).  Level 1's
 * candidates come from the caller (the feeding pass returns them); each
 * further level writes its head rows (tokens, positions, parents' store
 * rows, tree masks) into the fixed metadata buffers on the device, runs
 * the head pass and expands the tree with spec_tree_impl.h's steps
 * (the host path's text, compiled for the device), and the last step
 * selects each sequence's `tokens` best nodes.  Rows, KV slots, store
 * rows, masks and attention plans are the ones the host path
 * (spec_level_rows + cuda_draft_forward) uses, so the tree is the host
 * path's bit for bit.  One upload, one CUDA graph per (n, depth, k,
 * per-level attention plans) (captured on a key's second sight), one
 * download, one synchronisation. */

/* One drafting sequence of cuda_draft_tree. */
typedef struct {
    int state;     /* draft state; store row 0 holds the root feature */
    int draft_len; /* head KV slots holding true pairs: the tree's rows
                      see [0, draft_len) and their tree ancestors */
    int cached;    /* target tokens cached: level d's rows (d >= 1) get
                      RoPE position cached + d - 1 */
    int tokens;    /* draft tokens to select, >= 1 */
} cuda_draft_tree_seq_t;

/* Nodes per sequence of a device-loop tree: k + (depth - 1) * k * k
 * (every frontier has k nodes, each with k candidates). */
int cuda_draft_tree_nodes(int depth, int k);

/* Whether cuda_draft_tree takes n sequences of this shape whose longest
 * draft_len is max_draft_len (slots and store rows suffice, one pass of
 * rows per level). */
bool cuda_draft_tree_ok(const cuda_draft_t *draft, int n, int depth, int k,
                        int max_draft_len);

/* Grows the trees: l1_ids / l1_logp (n, k) level-1 candidates (best
 * first); depth >= 2 levels in all.  Out, per sequence i (node_cap =
 * cuda_draft_tree_nodes): nodes + i * node_cap every node (vidx set by
 * the selection), order + i * node_cap the selected ids best first,
 * n_sel[i] how many. */
bt_status_t cuda_draft_tree(cuda_draft_t *draft, int n,
                            const cuda_draft_tree_seq_t *seqs, int depth,
                            int k, const int *l1_ids, const float *l1_logp,
                            spec_node_t *nodes, int *order, int *n_sel);

/* Pinned host memory (faster transfers for the hidden/logits buffers
 * that spec_step hands the backend); NULL on failure.  Free with
 * cuda_draft_host_free. */
void *cuda_draft_host_alloc(size_t bytes);
void cuda_draft_host_free(void *p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_CUDA_CUDA_DRAFT_H */
