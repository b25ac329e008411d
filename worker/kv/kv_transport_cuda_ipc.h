/*
 * kv_transport_cuda_ipc.h - KV hand-off between two processes on one host
 * whose KV pools live in GPU memory: the decode worker exports its device
 * pool with CUDA IPC handles, the prefill worker maps it once and copies
 * each freshly computed layer device-to-device into the reserved blocks.
 *
 * Roles and flow (mirrors kv_transport.h, the UCX transport):
 *   decode  kv_cipc_pool_export(K/V layer bases from backend_kv_data) ->
 *           kv_cipc_pool_desc() bytes go to the router in Register and
 *           from there to prefill workers in PrefillTask / KvPeers ->
 *           on grant of slot s: kv_cipc_pool_slot_reset(s) -> on KvReady:
 *           kv_cipc_pool_has_arrived(s, epoch) before the first read.
 *   prefill kv_cipc_create (copy stream) -> kv_cipc_connect(desc) (cached
 *           per pool: cudaIpcOpenMemHandle once per decode pool) -> in
 *           on_layer_done(l): kv_cipc_put_layer(peer, l, ...) ->
 *           kv_cipc_commit(peer, s, epoch) -> kv_cipc_commit_query() until
 *           BT_OK, then PrefillDone goes to the router.
 *
 * Data path: K and V are each ONE cudaMalloc for all layers in the CUDA
 * backend, (n_layers, n_blocks, block_size, n_kv_heads, head_dim), so one
 * IPC handle per array suffices; kv_cipc_pool_export checks that the layer
 * bases are contiguous.  kv_cipc_put_layer coalesces runs where both the
 * source and the destination block ids are consecutive into one
 * cudaMemcpyAsync (device to device; peer GPUs go over NVLink) per run,
 * per K and per V, on the context's own non-blocking copy stream.  The
 * CUDA backend calls on_layer_done only after cudaEventSynchronize on the
 * layer's K/V-written event (cuda_forward.c), so layer l is complete in
 * memory when its copies are enqueued: the copy stream needs no device-side
 * wait on the compute stream, and copies of layer l overlap the compute of
 * layers l+1.. .  (A backend that called back earlier would have to export
 * that event so the copy stream can cudaStreamWaitEvent on it.)
 *
 * Completion (decode never reads a half-written block): the decode pool
 * has an arrival array of n_slots uint64 in device memory, exported like
 * K and V.  kv_cipc_commit enqueues, on the copy stream AFTER the layer
 * copies, a 8-byte copy of the reservation's epoch into arrival[slot],
 * then records an event.  Stream order makes the epoch land after every
 * block.  The prefill worker polls that event (kv_cipc_commit_query) and
 * only then sends PrefillDone; the router then sends KvReady, and the
 * decode worker checks arrival[slot] == epoch (kv_cipc_pool_has_arrived)
 * before the reservation's blocks join a batch.  Epochs are never reused,
 * so a stale writer whose reservation was freed and re-granted can never
 * make the new reservation look complete (as with UCX: see the epoch
 * discussion in kv_transport.h; the decode worker's quarantine of
 * aborted reservations covers late data copies too).  An IPC event
 * (cudaIpcGetEventHandle) would let the decode side wait on the GPU
 * instead, but the first token has to travel through the router anyway,
 * so the control message is the cheaper signal and the flag is the check.
 *
 * Why a copy, and what writing in place would take.  The prefill worker's
 * RoPE/KV kernel writes K/V into its OWN pool, through its own block
 * table; the copy moves 2 * n_layers * n_tokens * n_kv_heads * head_dim *
 * elem_size bytes once more.  To write directly into the decode worker's
 * reserved blocks, backend_seq_t would need a per-sequence KV base
 * override (remote K/V array bases + the remote block table for the
 * sequence's new slots) that the CUDA backend passes to cuda_rope_kv and
 * to the attention kernels (which must read earlier chunks of the same
 * prompt from the remote pool too), i.e. a change to backend.h and to
 * every kernel launch that takes d_k_cache / d_v_cache.  Cost of the copy
 * today: a 2048-token Llama-3-8B prompt (32 layers, 8 KV heads, head_dim
 * 128, bf16) is 2*32*2048*8*128*2 = 268 MB; a device-to-device copy runs
 * at 4.3 TB/s (read + write counted, DEVICE.md), so 268 MB read + 268 MB
 * written = 537 MB / 4.3 TB/s = 0.125 ms in total, spread over the layers
 * and hidden behind the prefill compute except for the last layer's
 * 8.4 MB, ~4 us.  The in-place write would save the bandwidth (about 0.1%
 * of a ~100 ms prefill at that size), not latency.
 *
 * Across GPUs (cuda-ipc(p2p)).  The decode pool may live on another GPU of
 * the host than the prefill worker's (`--gpu N` on each worker).
 * kv_cipc_connect finds the exporter's GPU here by its PCI bus id (the
 * ordinals of two processes can differ), enables peer access from the
 * context's device to it and opens the handles on the context's device;
 * the same cudaMemcpyAsync / cudaMemcpy2DAsync calls (cudaMemcpyDefault,
 * unified addressing) then run on the copy engine as peer writes over
 * NVLink into the decode GPU's pool, and the epoch write lands after them
 * in stream order as before.  kv_cipc_peer_transport() names the mapping
 * "cuda-ipc(p2p)" (the router's status does the same for a pair whose
 * GPUs differ).  Two GPUs without peer access fail the connect
 * (BT_ERR_CUDA): the prefill worker then sends the KV inline.
 *
 * Re-sharding (prefill TP != decode TP).  Every put goes through
 * kv_reshard_plan (kv_reshard.h): the source side says which KV heads its
 * pool holds, the destination which heads the remote pool holds, and
 * only the common heads are copied, one 2D copy per run of consecutive
 * blocks (one 1D copy per run when both hold the same heads: TP 1 -> 1
 * is exactly the plan of one cudaMemcpyAsync per run).  A decode rank
 * fed by several prefill ranks gets one put per source rank.
 *
 * TP workers.  A TP decode worker exports one pool per rank
 * (kv_cipc_pool_export_ranks: descriptor version 2, each rank's device,
 * bus id, first head and K/V handles; the arrival slots on rank 0's GPU).
 * A TP prefill worker makes its context on its rank 0 GPU
 * (kv_cipc_create_on), adds its other ranks' GPUs as sources
 * (kv_cipc_add_source: peer access, the copy engine of rank 0's GPU
 * reads them) and calls kv_cipc_put_layer_ranks once per source rank:
 * every copy of every rank is on the one copy stream, so the commit's
 * epoch still lands after all of them.
 *
 * Without CUDA (binary built without it, or no GPU): every call fails
 * with BT_ERR_UNSUPPORTED or BT_ERR_CUDA, logged once; the descriptor
 * encoder and parser are plain C and always work (fuzzed).
 *
 * Threading: a context and its peers belong to one thread at a time.
 */
#ifndef BT_WORKER_KV_KV_TRANSPORT_CUDA_IPC_H
#define BT_WORKER_KV_KV_TRANSPORT_CUDA_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "kv/kv.h"
#include "kv/kv_reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_CIPC_DESC_VERSION 1   /* one pool (TP 1) */
#define KV_CIPC_DESC_VERSION_TP 2 /* one pool per tensor-parallel rank */
#define KV_CIPC_DESC_VERSION_WIN 3 /* windowed: no handle, an FD channel */
#define KV_CIPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */
#define KV_CIPC_BUS_ID_LEN 32   /* "0000:19:00.0" and NUL */
#define KV_CIPC_MAX_SLOTS (1 << 20)
#define KV_CIPC_MAX_RANKS 8     /* ranks of one exported TP pool */
#define KV_CIPC_SOCKET_LEN 48   /* FD channel name and NUL (KV_FDCH_NAME_MAX) */
#define KV_CIPC_TOKEN_BYTES 16  /* a window's token */
#define KV_CIPC_GRANT_BYTES 20  /* KvGrant.cipc_window: token, u32 n_blocks */

/* One rank's pool of a TP decode worker (descriptor version 2). */
typedef struct {
    int32_t device;                     /* its CUDA ordinal */
    char bus_id[KV_CIPC_BUS_ID_LEN];    /* its GPU's PCI bus id */
    int head0;                          /* first KV head it holds */
    uint8_t k_handle[KV_CIPC_HANDLE_BYTES];
    uint8_t v_handle[KV_CIPC_HANDLE_BYTES];
} kv_cipc_rank_desc_t;

/* A parsed descriptor: everything a prefill worker needs to map a pool.
 * Version 1 (n_ranks 0): one pool holding every KV head, the top-level
 * fields.  Version 2 (n_ranks >= 2, a TP decode worker): rank r's pool
 * holds KV heads [ranks[r].head0, + layout.n_kv_heads) of n_heads_total
 * (head0 = r * layout.n_kv_heads), on its own GPU; layout is ONE rank's;
 * the top-level device, bus_id, k_handle, v_handle repeat rank 0's, and
 * the arrival array lives on rank 0's GPU. */
typedef struct {
    uint64_t pool_id;                   /* random per export */
    uint32_t pid;                       /* exporting process */
    int32_t device;                     /* its CUDA ordinal */
    char bus_id[KV_CIPC_BUS_ID_LEN];    /* its GPU's PCI bus id */
    kv_layout_t layout;                 /* the pool's layout */
    int n_slots;                        /* arrival slots */
    uint8_t k_handle[KV_CIPC_HANDLE_BYTES];   /* K array, all layers */
    uint8_t v_handle[KV_CIPC_HANDLE_BYTES];   /* V array, all layers */
    uint8_t arrival_handle[KV_CIPC_HANDLE_BYTES]; /* (n_slots) uint64 */
    int n_ranks;                        /* 0: version 1; else 2..MAX */
    int n_heads_total;                  /* version 2: KV heads of the model */
    kv_cipc_rank_desc_t ranks[KV_CIPC_MAX_RANKS]; /* (n_ranks) */
    bool windowed;                      /* version 3: no handles; windows
                                           per grant from fd_socket */
    char fd_socket[KV_CIPC_SOCKET_LEN]; /* version 3: the FD channel */
} kv_cipc_desc_t;

/* Encoded size of a version-1 descriptor (fixed). */
size_t kv_cipc_desc_size(void);

/* Encoded size of `desc`: version 1 when desc->n_ranks <= 1, else 2. */
size_t kv_cipc_desc_encoded_size(const kv_cipc_desc_t *desc);

/* Pool `rank` of a parsed descriptor as (device, bus id, head0, handles):
 * rank 0 of a version-1 descriptor is its top-level pool. */
kv_cipc_rank_desc_t kv_cipc_desc_rank(const kv_cipc_desc_t *desc, int rank);

/* Ranks of a parsed descriptor (1 for version 1). */
int kv_cipc_desc_n_ranks(const kv_cipc_desc_t *desc);

/* KV heads of the model per a parsed descriptor (version 1: the pool's). */
int kv_cipc_desc_heads_total(const kv_cipc_desc_t *desc);

/* Encodes `desc` into `buf` (kv_cipc_desc_encoded_size() bytes,
 * checksummed); version 2 needs 2 <= n_ranks <= KV_CIPC_MAX_RANKS and
 * n_heads_total = n_ranks * layout.n_kv_heads (BT_ERR_INVALID_ARG). */
bt_status_t kv_cipc_desc_encode(const kv_cipc_desc_t *desc, uint8_t *buf,
                                size_t cap);

/* Parses and validates untrusted descriptor bytes: magic, version, exact
 * size, checksum, layout bounds and sizes without overflow, slot count,
 * NUL-terminated bus ids; version 2: rank count, head ranges (rank r
 * holds heads from r * layout.n_kv_heads, n_ranks of them make the
 * model's).  BT_ERR_FORMAT on any defect; *desc is written only on
 * success. */
bt_status_t kv_cipc_desc_parse(const void *buf, size_t len,
                               kv_cipc_desc_t *desc);

/* ------------------------------------------------------------------------
 * Device facts
 * --------------------------------------------------------------------- */

typedef struct {
    int device;                       /* CUDA ordinal */
    char bus_id[KV_CIPC_BUS_ID_LEN];  /* PCI bus id */
    char name[64];                    /* device name */
    bool ipc;                         /* CUDA IPC supported here */
} kv_cipc_gpu_info_t;

/* This host's identity for transport choice: "hostname/boot-id" (the
 * boot id tells two containers with one hostname apart only when they
 * are on different kernels; same kernel = same host for IPC purposes). */
void kv_cipc_host_id(char *buf, size_t len);

/* True when built with CUDA and at least one device is visible. */
bool kv_cipc_is_available(void);

/* Facts about device `device`.  BT_ERR_UNSUPPORTED without CUDA. */
bt_status_t kv_cipc_gpu_info(int device, kv_cipc_gpu_info_t *info);

/* Copies `bytes` between any two of host / device memory (UVA,
 * cudaMemcpyDefault, synchronous).  For the inline transport when the
 * KV pool is on the device.  BT_ERR_UNSUPPORTED without CUDA. */
bt_status_t kv_cipc_memcpy(void *dst, const void *src, size_t bytes);

/* The 2D form (cudaMemcpy2D, cudaMemcpyDefault, synchronous): `height`
 * rows of `width` bytes; for the inline transport of a TP worker (one
 * rank's heads are a column range of a token's row). */
bt_status_t kv_cipc_memcpy2d(void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height);

/* ------------------------------------------------------------------------
 * Decode side: the exported pool
 * --------------------------------------------------------------------- */

typedef struct kv_cipc_pool_s kv_cipc_pool_t;

/* Exports the device KV pool whose layer l bases are k_layers[l] /
 * v_layers[l] (device pointers on `device`, contiguous per array, the
 * first one the base of its cudaMalloc) and allocates `n_slots` zeroed
 * arrival slots.  The pool does not own the KV memory, which must outlive
 * it.  BT_ERR_INVALID_ARG for a non-contiguous layout, BT_ERR_CUDA. */
bt_status_t kv_cipc_pool_export(const kv_layout_t *layout,
                                void *const *k_layers, void *const *v_layers,
                                int device, int n_slots,
                                kv_cipc_pool_t **pool_p);
/* The same for a TP decode worker: rank r's pool has layer bases
 * k_layers[r * n_layers + l] / v_layers[...] on devices[r] and holds KV
 * heads [r * layout->n_kv_heads, ...) (layout: one rank's); the arrival
 * slots live on devices[0].  n_ranks == 1 is kv_cipc_pool_export
 * (descriptor version 1, byte for byte); n_ranks >= 2 exports version 2. */
bt_status_t kv_cipc_pool_export_ranks(const kv_layout_t *layout, int n_ranks,
                                      void *const *k_layers,
                                      void *const *v_layers,
                                      const int *devices, int n_slots,
                                      kv_cipc_pool_t **pool_p);
void kv_cipc_pool_destroy(kv_cipc_pool_t **pool_p);

/* The encoded descriptor, valid while the pool lives. */
const uint8_t *kv_cipc_pool_desc(const kv_cipc_pool_t *pool, size_t *len_p);

/* ---- Windows (issue 42): a device allocation per grant ----
 *
 * A windowed pool (kv_cipc_pool_export_windowed; the default, and
 * --kv-direct-writes keeps the whole-pool export above) exports no
 * handle at all: its descriptor (version 3) names the decode worker's FD
 * channel (kv_fd_channel.h).  Per grant, kv_cipc_window_create takes a
 * physical allocation of the reservation's n blocks x layers x K|V plus
 * an 8-byte epoch word (cuMemCreate, POSIX-FD shareable, rounded to the
 * allocation granularity) mapped here, zeroes the epoch word, exports
 * its FD and offers it on the channel under a fresh random 128-bit token;
 * the token and n travel in KvGrant.cipc_window (kv_cipc_window_grant,
 * 20 bytes) over the control plane only.  The prefill worker fetches the
 * FD for that token (kv_cipc_window_open: import, map for its copy
 * stream's device, close the FD), copies the layers into window blocks
 * 0..n-1 (coalesced runs as into a pool: layer l's K at
 * window + 2*l*n*block_bytes, V n blocks after it) and commits the epoch
 * into the window's own word; then closes its mapping.  On KvReady the
 * decode worker waits for the epoch (kv_cipc_window_has_arrived), queues
 * the copy of the window into the reservation's pool blocks on the
 * backend's copy stream (backend_kv_copy_in) and destroys the window,
 * whose release waits for that copy.  A reservation
 * that ends otherwise destroys it at once: the token is revoked; our
 * handle and mapping are released soon after; a stale writer keeps only
 * its own reference to memory nobody reads any more.  The pool is never
 * exported, so its freed blocks need no quarantine.
 * Off the loop (kv_window_pool.h): allocations are made ahead on a
 * thread of the pool's own, for n rounded up to a power of two, and
 * released there after destroy; one is taken by one grant only, never
 * again, and no FD of it exists before its grant.  A grant whose class
 * has none ready makes its own here, as before.  Every allocation, ready
 * or pending release too, counts against the pool's window budget: past
 * it kv_cipc_window_create says BT_ERR_NO_RESOURCE and the grant goes
 * without a window (its KV comes inline).  One rank only (TP 1 decode).
 * The driver API is reached through cudaGetDriverEntryPointByVersion (the
 * build links cudart, not libcuda). */

typedef struct kv_cipc_window_s kv_cipc_window_t;

/* True when device `device` can make windows: the driver's virtual
 * memory management and POSIX file descriptor handles. */
bool kv_cipc_windows_supported(int device);

/* Data bytes of a window of n blocks (without the epoch word and the
 * granularity rounding). */
size_t kv_cipc_window_data_bytes(const kv_layout_t *layout, int n_blocks);

/* KvGrant.cipc_window: `token` (KV_CIPC_TOKEN_BYTES) and n_blocks (u32
 * LE), KV_CIPC_GRANT_BYTES into `out`; the parser checks the size and
 * 1 <= n <= 2^24 (BT_ERR_FORMAT), writing its outputs only on success. */
void kv_cipc_window_grant_encode(const uint8_t *token, int n_blocks,
                                 uint8_t *out);
bt_status_t kv_cipc_window_grant_parse(const uint8_t *buf, size_t len,
                                       uint8_t *token, int *n_blocks_p);

/* The windowed pool of a TP-1 decode worker on `device`: an FD channel
 * and a descriptor naming it; windows' allocations (live, ready, pending
 * release) may take `window_budget` bytes in all.  BT_ERR_UNSUPPORTED
 * (not logged: the caller says it once) when the device cannot make
 * windows. */
bt_status_t kv_cipc_pool_export_windowed(const kv_layout_t *layout,
                                         int device, size_t window_budget,
                                         kv_cipc_pool_t **pool_p);
bool kv_cipc_pool_is_windowed(const kv_cipc_pool_t *pool);

/* A window of n_blocks for one grant (see above).  BT_ERR_NO_RESOURCE
 * over the budget, BT_ERR_CUDA, BT_ERR_IO (the channel). */
bt_status_t kv_cipc_window_create(kv_cipc_pool_t *pool, int n_blocks,
                                  kv_cipc_window_t **win_p);
/* True when its allocation was made ahead (off the caller's thread). */
bool kv_cipc_window_made_ahead(const kv_cipc_window_t *win);
/* KvGrant.cipc_window's bytes (KV_CIPC_GRANT_BYTES), while it lives. */
const uint8_t *kv_cipc_window_grant(const kv_cipc_window_t *win,
                                    size_t *len_p);
/* Its device memory here: (n_layers, K|V, n_blocks) blocks. */
const void *kv_cipc_window_data(const kv_cipc_window_t *win);
/* Before an asynchronous copy out of it (backend_kv_copy_in): its
 * release, after destroy, waits (on the window pool's thread, up to 60 s,
 * then leaves it mapped with an error) until kv_cipc_window_read_done is
 * called with what this returned (a backend_done_fn_t: it calls no
 * CUDA).  Each begin wants one done. */
void *kv_cipc_window_read_begin(kv_cipc_window_t *win);
void kv_cipc_window_read_done(void *reader);
/* Reads its epoch word (synchronous): *arrived_p = (value == epoch). */
bt_status_t kv_cipc_window_has_arrived(kv_cipc_window_t *win, uint64_t epoch,
                                       bool *arrived_p);
/* Revokes its token at once; our handle and mapping go to the window
 * pool's thread for release.  NULL-safe. */
void kv_cipc_window_destroy(kv_cipc_window_t **win_p);

/* Reads arrival[slot] from the device: *arrived_p = (value == epoch).
 * Synchronous (an 8-byte device-to-host copy). */
bt_status_t kv_cipc_pool_has_arrived(kv_cipc_pool_t *pool, int slot,
                                     uint64_t epoch, bool *arrived_p);

/* Zeroes arrival[slot] (synchronous).  Call on grant and on free. */
bt_status_t kv_cipc_pool_slot_reset(kv_cipc_pool_t *pool, int slot);

/* ------------------------------------------------------------------------
 * Prefill side: mapped pools, copies, commits
 * --------------------------------------------------------------------- */

typedef struct kv_cipc_s kv_cipc_t;           /* copy stream + peers */
typedef struct kv_cipc_peer_s kv_cipc_peer_t; /* one mapped pool */
typedef struct kv_cipc_commit_s kv_cipc_commit_t;

/* Creates the copy stream on the current device (the source device of
 * every copy: the prefill backend's).  BT_ERR_UNSUPPORTED
 * without CUDA, BT_ERR_CUDA without a device. */
bt_status_t kv_cipc_create(kv_cipc_t **ctx_p);

/* The same on CUDA device `device`, whatever the thread's current device
 * (every later call of the context switches to it first). */
bt_status_t kv_cipc_create_on(int device, kv_cipc_t **ctx_p);

/* Source memory on another GPU of this process (a TP prefill worker's
 * rank > 0): enables peer access from the context's device to `device`
 * so its copy engine reads that GPU directly.  No-op for its own device;
 * BT_ERR_CUDA when the GPUs cannot access each other. */
bt_status_t kv_cipc_add_source(kv_cipc_t *ctx, int device);

/* Unmaps every pool (waits for the copy stream first).  Peers must have
 * been released (asserted).  NULL-safe. */
void kv_cipc_destroy(kv_cipc_t **ctx_p);

/* Maps the pool of `desc` (cudaIpcOpenMemHandle, with lazy peer access
 * for a pool on another GPU) or returns the cached mapping, taking a
 * reference.  BT_ERR_FORMAT for a bad descriptor, BT_ERR_CUDA when the
 * handles cannot be opened (other host, no P2P, same process). */
bt_status_t kv_cipc_connect(kv_cipc_t *ctx, const void *desc, size_t len,
                            kv_cipc_peer_t **peer_p);

/* Drops a reference.  The mapping stays cached in the context until
 * kv_cipc_retire_unlisted or kv_cipc_destroy.  NULL-safe. */
void kv_cipc_release(kv_cipc_peer_t **peer_p);

/* Unmaps cached pools with no reference whose id is not in `ids` (their
 * decode worker left: its memory is freed only when every mapping is
 * closed).  Waits for the copy stream first. */
void kv_cipc_retire_unlisted(kv_cipc_t *ctx, const uint64_t *ids, int n);

/* The mapped pool's descriptor. */
const kv_cipc_desc_t *kv_cipc_peer_desc(const kv_cipc_peer_t *peer);

/* Enqueues the copies of layer `layer`: source block src_ids[i] of
 * `src_k` / `src_v` (this layer's K / V base in the prefill pool, laid
 * out by `src_layout`, same block shape as the remote pool) to block
 * dst_ids[i] of the remote pool.  Consecutive runs become one copy.
 * Non-blocking; sources must stay unchanged until the commit completes.
 * BT_ERR_INVALID_ARG for a bad id or a block shape mismatch. */
bt_status_t kv_cipc_put_layer(kv_cipc_peer_t *peer, int layer,
                              const void *src_k, const void *src_v,
                              const kv_layout_t *src_layout,
                              const int *src_ids, const int *dst_ids, int n);

/* kv_cipc_put_layer with re-sharding: the prefill pool holds the heads
 * `src` describes (src->layout is its layout, n_kv_heads of them from
 * src->head0 of src->n_heads_total), the remote pool holds its layout's
 * n_kv_heads heads from `dst_head0` of the same total; only the heads
 * both hold are copied (kv_reshard_plan: 2D copies, runs merged).
 * BT_ERR_INVALID_ARG when the shapes disagree or an id is out of range. */
bt_status_t kv_cipc_put_layer_heads(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    int dst_head0, const int *src_ids,
                                    const int *dst_ids, int n);

/* The put of a (TP) prefill rank into every rank of the mapped pool:
 * the source holds the heads `src` describes (src->n_heads_total must be
 * the descriptor's), each destination rank r gets the heads both hold
 * (kv_reshard_plan against its head range), nothing else.  A TP prefill
 * worker calls it once per source rank per layer; with one rank on both
 * sides it is kv_cipc_put_layer.  BT_ERR_INVALID_ARG as there. */
bt_status_t kv_cipc_put_layer_ranks(kv_cipc_peer_t *peer, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_reshard_side_t *src,
                                    const int *src_ids, const int *dst_ids,
                                    int n);

/* True when the mapped pool is on another GPU than the context's. */
bool kv_cipc_peer_is_p2p(const kv_cipc_peer_t *peer);

/* "cuda-ipc(p2p)" for a pool on another GPU, else "cuda-ipc". */
const char *kv_cipc_peer_transport(const kv_cipc_peer_t *peer);

/* After every copy enqueued so far: writes `epoch` into the remote
 * arrival[slot] and records an event.  *commit_p is polled with
 * kv_cipc_commit_query and freed with kv_cipc_commit_destroy. */
bt_status_t kv_cipc_commit(kv_cipc_peer_t *peer, int slot, uint64_t epoch,
                           kv_cipc_commit_t **commit_p);

/* BT_OK when the copies and the epoch are in the decode pool,
 * BT_IN_PROGRESS while not, BT_ERR_CUDA on a device fault. */
bt_status_t kv_cipc_commit_query(kv_cipc_commit_t *commit);

/* Frees a commit (waits for it if still in flight).  NULL-safe. */
void kv_cipc_commit_destroy(kv_cipc_commit_t **commit_p);

/* Prefill side of the windows: true when the mapped pool is windowed
 * (puts and commits into it are refused; they go into a window). */
bool kv_cipc_peer_is_windowed(const kv_cipc_peer_t *peer);

/* Opens the window of a grant (KvGrant.cipc_window, `len` bytes) of the
 * windowed pool `peer`: fetches its FD from the pool's channel (1 s
 * deadline), imports and maps it for the context's device and returns it
 * as a peer of one rank whose blocks are 0..n-1 (n: the window's, from
 * the grant) and whose one arrival slot (0) is the window's epoch word:
 * kv_cipc_put_layer*, kv_cipc_commit(win, 0, epoch) and
 * kv_cipc_commit_query work on it.  n_blocks, the range to be written,
 * must fit (1..n; BT_ERR_INVALID_ARG otherwise).  BT_ERR_NOT_FOUND when
 * refused (the reservation ended), BT_ERR_TIMEOUT, BT_ERR_CUDA. */
bt_status_t kv_cipc_window_open(kv_cipc_peer_t *peer, const uint8_t *grant,
                                size_t len, int n_blocks,
                                kv_cipc_peer_t **win_p);

/* Waits for the copy stream, unmaps and releases the window (the
 * decode worker's memory is freed once both sides let go).  NULL-safe. */
void kv_cipc_window_close(kv_cipc_peer_t **win_p);

/* Copies enqueued and bytes copied since the context was created. */
uint64_t kv_cipc_copies(const kv_cipc_t *ctx);
uint64_t kv_cipc_bytes(const kv_cipc_t *ctx);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_TRANSPORT_CUDA_IPC_H */
