/*
 * kv_transport_stage.h - KV hand-off between GPU pools on different hosts:
 * UCX one-sided puts through pinned host staging buffers, pipelined layer
 * by layer and double-buffered, on top of the UCX transport of
 * kv_transport.h (whose puts, commits and epochs it reuses).
 *
 * Pipeline for one hand-off of n blocks and L layers (C = blocks per
 * staging buffer; a layer of more than C blocks goes in several chunks):
 *
 *   prefill  compute l ─┐
 *   (copy stream)       D2H chunk(l) -> h_stage[b]  (runs of src ids,
 *                       packed; event recorded)
 *   (UCX)                   event done -> ucp puts h_stage[b] ->
 *                           decode's receive area (runs of dst ids) ->
 *                           commit epoch into arrival[s, l] (flush, put
 *                           epoch, flush) -> commit done: b is free again
 *   decode   (poll)             arrival[s, l] == epoch -> H2D recv(l) ->
 *   (copy stream)               device blocks (runs), event recorded
 *
 * With two staging buffers the D2H of chunk i+1, the network put of chunk
 * i and the decode side's H2D of the layers already arrived overlap each
 * other and the prefill compute of later layers.  Every step is
 * non-blocking; both sides drive it by calling their progress function
 * (kv_stage_send_progress / kv_stage_recv_progress) from their event
 * loop, next to kv_ucx_progress.
 *
 * Receive area.  The decode worker owns a pinned host "receive area" laid
 * out like its KV pool (K and V arrays, (n_layers, recv_blocks,
 * block_size, n_kv_heads, head_dim)) but with recv_blocks blocks per
 * layer, registered with UCX (kv_ucx_mem_alloc: on one host a shared
 * memory segment, so puts are a plain memcpy by the writer) and with
 * cudaHostRegister.  A grant reserves receive blocks next to the device
 * blocks (kv_stage_recv_begin); the prefill side puts into the receive
 * blocks; the decode side copies each arrived layer into the device
 * blocks and frees the receive blocks when the last H2D completed.  So
 * the receive area only needs to hold the hand-offs in flight (n blocks x
 * L layers x K,V each); with recv_blocks == the pool's n_blocks it is a
 * full host mirror.  kv_stage_recv_begin returns BT_ERR_NO_RESOURCE when
 * the area is full: delay the grant (or fall back to another transport).
 *
 * Arrival and epochs (as in kv_transport.h).  The UCX pool over the
 * receive area has n_slots * L + 1 arrival words: arrival[s * L + l] is
 * reservation slot s, layer l; the last one is a scratch word that
 * commits of non-final chunks write only to learn that their staging
 * buffer's puts are remotely complete (its value means nothing).  A layer
 * is copied to the device only after its word holds the reservation's
 * epoch (acquire load), and the commit writes the epoch after a flush of
 * every earlier put, so decode never reads a half-written block.  Epochs
 * are never reused (non-zero, fresh per grant): a stale writer of an older
 * grant of the same slot writes an older epoch and is never accepted.  As
 * with kv_transport.h, one-sided puts cannot be refused: after
 * kv_stage_recv_cancel the caller must not give the receive blocks to a
 * new grant before the old writer is fenced (abort acknowledged or the
 * prefill worker known dead) - kv_stage_recv_cancel therefore keeps them
 * quarantined until kv_stage_recv_release_quarantine.
 *
 * Receive windows (cfg.windows; the decode worker's default, issue 42).
 * A receive area registered once lets every writer that ever held its key
 * write any receive block for as long as the area lives, so a writer
 * stopped past its reservation (SIGSTOP) could write into blocks that
 * now carry another reservation's KV.  With windows the receiver
 * registers only its arrival words; kv_stage_recv_begin maps a window of
 * the reservation's n blocks (kv_ucx_window_create: its own shared memory
 * segment on one host, its own memory region on RDMA), pins it
 * (ops->host_register, for the async H2D) and hands out its descriptor
 * (kv_stage_recv_window: KvGrant.ucx_window) and the ids 0..n-1.  The
 * sender puts into it (kv_stage_xfer_begin_window) exactly as into an
 * area; the decode side copies each arrived layer from the window to the
 * device blocks and unmaps the window once the last H2D completed, or at
 * once on kv_stage_recv_cancel (its key is revoked: nothing the decode
 * worker reads is reachable with it).  Commits then go by message, not
 * epoch puts: a layer's last chunk commits with
 * kv_ucx_commit_window_layer (the decode worker checks slot, epoch,
 * token and that layer's bytes before it sets the layer's arrival word,
 * and answers; a refused commit fails the transfer at once), the other
 * chunks only flush (kv_ucx_flush), so the receiver's UCX needs no RMA
 * (docs/SECURITY.md 5).  recv_blocks then only bounds the
 * blocks in flight (BT_ERR_NO_RESOURCE as before) and freed blocks need
 * no quarantine.  Not with direct mode (it registers the device pool
 * itself: the operator's --kv-direct-writes).
 *
 * Direct mode (no staging).  When UCX was built with CUDA support
 * (kv_stage_ucx_has_cuda(): ucp_context_query reports
 * UCS_MEMORY_TYPE_CUDA, i.e. the cuda_copy / cuda_ipc / gdr_copy
 * transports are loaded), either side may skip its staging:
 *   - send cfg.direct: chunks are put straight from the prefill pool's
 *     device memory (UCX moves device memory itself: GPUDirect RDMA on
 *     InfiniBand, or its own pipelined staging); no D2H, no buffers;
 *   - recv cfg.direct: the device KV pool itself is registered with UCX
 *     (no receive area, no H2D); kv_stage_recv_begin returns the device
 *     ids as destination ids.
 * The two choices are independent: the sender never needs to know how the
 * decode side receives (it puts into whatever ids the grant carried).
 * The descriptor says which one the decode side chose (for the registry).
 *
 * Memory copies are pluggable (kv_stage_ops_t), so one pipeline runs in
 * production with CUDA (kv_stage_ops_cuda(): cudaMemcpyAsync on a
 * non-blocking stream, cudaEvent, cudaHostRegister) and in CI with host
 * memory standing in for device memory (kv_stage_ops_host(): memcpy on a
 * helper thread per stream, events as sequence numbers).
 *
 * How prefill/ and decode/ call it (integration plan; they are not
 * changed by this module):
 *   both   kv_ucx_create as today (one kv_ucx_t per process, after fork);
 *          call kv_stage_*_progress wherever kv_ucx_progress is called.
 *   decode at startup, when the backend's KV pool is on the GPU and the
 *          transport is "ucx": kv_stage_recv_config_init(&rc); rc.layout =
 *          the pool layout, rc.k_layers / v_layers = backend_kv_data bases,
 *          rc.recv_blocks = --kv-stage-blocks (default: blocks of 4 max
 *          prompts), rc.n_slots = the reservation slots, rc.ops =
 *          kv_stage_ops_cuda(), rc.direct = kv_stage_ucx_has_cuda() &&
 *          flag; kv_stage_recv_create(ucx, &rc, &recv).  Register sends
 *          kv_stage_recv_desc() (instead of kv_ucx_pool_desc) with the
 *          transport kind "ucx-stage".
 *          grant of slot s, epoch e, device ids d[n]: kv_stage_recv_begin
 *          (recv, s, e, d, n, dst) and send dst[] (receive-area ids) in
 *          the grant where the device ids went before; BT_ERR_NO_RESOURCE
 *          -> keep the request queued.
 *          each loop turn: kv_stage_recv_progress(recv); before a
 *          reservation joins a batch (on KvReady):
 *          kv_stage_recv_poll(recv, s) == BT_OK (it may still be
 *          BT_IN_PROGRESS for a few microseconds after KvReady while the
 *          last layer's H2D runs: keep the request pending, do not
 *          block).  Timeout/abort/free: kv_stage_recv_cancel(recv, s);
 *          when the prefill worker acknowledged the abort or is dead:
 *          kv_stage_recv_release_quarantine(recv, s).
 *   prefill at startup: kv_stage_send_config_init(&sc); sc.layout = the
 *          local pool layout, sc.stage_blocks = --kv-stage-blocks
 *          (default 2048 tokens' worth), sc.ops = kv_stage_ops_cuda(),
 *          sc.direct = kv_stage_ucx_has_cuda() && flag;
 *          kv_stage_send_create(ucx, &sc, &send).
 *          per decode pool: kv_stage_connect(send, desc, len, &peer)
 *          (cache it per pool id as with kv_ucx_connect).
 *          PrefillTask: kv_stage_xfer_begin(send, peer, s, e, src_ids,
 *          dst_ids, n, &x); in on_layer_done(l) (after the backend's
 *          K/V-written event, as for CUDA IPC): kv_stage_xfer_layer(x, l,
 *          k_layer_base, v_layer_base); then kv_stage_send_progress(send);
 *          after the last layer keep progressing until
 *          kv_stage_xfer_status(x) != BT_IN_PROGRESS, then PrefillDone
 *          (BT_OK) or fail the task (error), kv_stage_xfer_destroy(&x).
 *          The prefill pool's blocks of x must not be reused before that.
 *
 * Threading: a sender or receiver and everything made from it belong to
 * the thread that owns the kv_ucx_t (the host ops' helper threads are
 * internal).
 */
#ifndef BT_WORKER_KV_KV_TRANSPORT_STAGE_H
#define BT_WORKER_KV_KV_TRANSPORT_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "kv/kv.h"
#include "kv/kv_transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_STAGE_DESC_VERSION 1
#define KV_STAGE_MAX_BUFFERS 4
#define KV_STAGE_MAX_SLOTS (1 << 16)

/* ------------------------------------------------------------------------
 * Pluggable memory copies
 * --------------------------------------------------------------------- */

/* Copy and event operations on "device" memory.  A stream orders the
 * copies and event records issued on it; an event completes when every
 * copy issued on its stream before the record completed.  Every function
 * returns BT_OK or an error (logged once); event_query returns BT_OK
 * (complete, or never recorded) or BT_IN_PROGRESS. */
typedef struct {
    const char *name;                 /* "cuda", "host", "host-sync" */
    kv_ucx_mem_type_t mem_type;       /* memory type of "device" memory */
    bt_status_t (*stream_create)(void **stream_p);
    void (*stream_destroy)(void *stream); /* waits for pending copies */
    bt_status_t (*copy_async)(void *stream, void *dst, const void *src,
                              size_t bytes); /* any direction */
    bt_status_t (*event_create)(void **event_p);
    void (*event_destroy)(void *event);
    bt_status_t (*event_record)(void *event, void *stream);
    bt_status_t (*event_query)(void *event);
    bt_status_t (*host_register)(void *ptr, size_t bytes); /* pin */
    void (*host_unregister)(void *ptr);
} kv_stage_ops_t;

/* Host memory standing in for device memory: copies are memcpy on one
 * helper thread per stream (so they run asynchronously, as DMA does) when
 * `threaded`, else synchronously inside copy_async.  Pinning is a no-op.
 * For CI and tests. */
const kv_stage_ops_t *kv_stage_ops_host(bool threaded);

/* The CUDA runtime: cudaStreamNonBlocking streams on the current device,
 * cudaMemcpyAsync(cudaMemcpyDefault), cudaEventDisableTiming events,
 * cudaHostRegister.  Always returns a table; without CUDA (built without
 * it, or no device) stream_create fails with BT_ERR_UNSUPPORTED or
 * BT_ERR_CUDA, so kv_stage_send_create / kv_stage_recv_create fail
 * cleanly. */
const kv_stage_ops_t *kv_stage_ops_cuda(void);

/* True when this process's UCX can move CUDA memory itself (a throwaway
 * ucp context, queried once and cached: UCP_ATTR_FIELD_MEMORY_TYPES has
 * UCS_MEMORY_TYPE_CUDA).  UCX_TLS applies, so it says what a kv_ucx_t
 * created with the same environment will have. */
bool kv_stage_ucx_has_cuda(void);

/* ------------------------------------------------------------------------
 * Descriptor (decode -> router -> prefill, opaque bytes)
 * --------------------------------------------------------------------- */

/* Wire format, little-endian: magic "BTKS", version u8, flags u8 (bit 0:
 * direct), reserved u16 = 0, total length u32, n_layers u32, recv_blocks
 * u32, n_slots u32, kv_ucx descriptor length u32, the kv_ucx descriptor
 * (kv_transport.h), FNV-1a 64 of every byte before it. */
typedef struct {
    bool direct;          /* decode receives into device memory itself */
    bool windowed;        /* a receive window per reservation (no area) */
    int n_layers;         /* layers per reservation */
    int recv_blocks;      /* blocks per layer of the receive area */
    int n_slots;          /* reservation slots */
    const uint8_t *ucx;   /* the embedded kv_ucx descriptor (in buf) */
    size_t ucx_len;       /* its bytes */
} kv_stage_desc_info_t;

/* Validates untrusted descriptor bytes: magic, version, flags, lengths,
 * checksum, bounds, and the embedded kv_ucx descriptor (parsed with
 * kv_ucx_desc_parse) against the header (layers, blocks, n_slots * L + 1
 * arrival words).  *info_p points into `buf` and is written only on
 * success.  BT_ERR_FORMAT on any defect. */
bt_status_t kv_stage_desc_parse(const void *buf, size_t len,
                                kv_stage_desc_info_t *info_p);

/* ------------------------------------------------------------------------
 * Decode side: the receiver
 * --------------------------------------------------------------------- */

typedef struct kv_stage_recv_s kv_stage_recv_t;

typedef struct {
    kv_layout_t layout;      /* the device KV pool */
    void *const *k_layers;   /* (n_layers) device K base of each layer */
    void *const *v_layers;   /* (n_layers) device V base of each layer */
    int recv_blocks;         /* receive-area blocks per layer (staged) */
    int n_slots;             /* reservation slots */
    const kv_stage_ops_t *ops; /* copies (required unless direct) */
    bool direct;             /* register the device pool with UCX instead */
    bool windows;            /* a receive window per reservation instead
                                of one registered area (not with direct) */
} kv_stage_recv_config_t;

/* Defaults: recv_blocks 0 (= layout.n_blocks, a full mirror), 16 slots,
 * CUDA ops, not direct, one registered area (no windows); the caller
 * fills layout and the layer bases. */
void kv_stage_recv_config_init(kv_stage_recv_config_t *cfg);

/* Allocates and registers the receive area (or registers the device pool
 * in direct mode; or, with windows, nothing but the arrival words), its
 * arrival words and the H2D stream.  The device pool is not owned and
 * must outlive the receiver.  BT_ERR_INVALID_ARG for a bad config
 * (windows with direct), BT_ERR_NET, BT_ERR_CUDA, BT_ERR_NO_MEMORY. */
bt_status_t kv_stage_recv_create(kv_ucx_t *ucx,
                                 const kv_stage_recv_config_t *cfg,
                                 kv_stage_recv_t **recv_p);

/* Waits (bounded, 2 s) for H2D copies in flight, then frees everything.
 * Writers must have stopped.  NULL-safe; sets *recv_p = NULL. */
void kv_stage_recv_destroy(kv_stage_recv_t **recv_p);

/* The serialized descriptor, valid while the receiver lives. */
const uint8_t *kv_stage_recv_desc(const kv_stage_recv_t *recv,
                                  size_t *len_p);

/* Starts reservation slot `slot` (idle) with `epoch` (non-zero, never
 * reused) for device blocks dev_ids[0..n): reserves n receive blocks
 * (lowest ids first, so runs stay runs), clears the slot's arrival words
 * and writes into dst_ids[0..n) the ids the prefill side must put to
 * (receive-area ids; the device ids in direct mode; 0..n-1 with windows,
 * where n > 0 also maps and pins the slot's window).  BT_ERR_INVALID_ARG
 * (bad slot/epoch/ids, slot busy), BT_ERR_NO_RESOURCE (area full), with
 * windows BT_ERR_NET / BT_ERR_UNSUPPORTED (UCX cannot map a revocable
 * window) or the pinning's error: nothing is reserved then. */
bt_status_t kv_stage_recv_begin(kv_stage_recv_t *recv, int slot,
                                uint64_t epoch, const int *dev_ids, int n,
                                int *dst_ids);

/* With windows: the descriptor of `slot`'s window (KvGrant.ucx_window),
 * valid until the window is unmapped (the slot completes or is
 * cancelled); NULL when the slot has none (no windows, idle, n == 0). */
const uint8_t *kv_stage_recv_window(const kv_stage_recv_t *recv, int slot,
                                    size_t *len_p);

/* Advances every active reservation: enqueues the H2D copies of each
 * layer whose arrival word holds the epoch, and completes reservations
 * whose copies finished (receive blocks freed).  Call after
 * kv_ucx_progress.  Returns true if anything happened. */
bool kv_stage_recv_progress(kv_stage_recv_t *recv);

/* BT_OK when every layer of `slot` is in the device blocks (the
 * reservation stays complete until kv_stage_recv_finish),
 * BT_IN_PROGRESS while not, BT_ERR_INVALID_ARG for an idle slot, the
 * copy error if one failed.  Advances the slot first. */
bt_status_t kv_stage_recv_poll(kv_stage_recv_t *recv, int slot);

/* Progresses UCX and the receiver until kv_stage_recv_poll(slot) is not
 * BT_IN_PROGRESS, at most timeout_ms (BT_ERR_TIMEOUT: e.g. the prefill
 * worker died mid-stream; then kv_stage_recv_cancel). */
bt_status_t kv_stage_recv_wait(kv_stage_recv_t *recv, int slot,
                               int timeout_ms);

/* Layers of `slot` whose H2D has been enqueued (diagnostics, tests). */
int kv_stage_recv_layers_arrived(const kv_stage_recv_t *recv, int slot);

/* Returns a completed slot to idle (call when the request is admitted;
 * the device blocks are the decode worker's business from then on). */
void kv_stage_recv_finish(kv_stage_recv_t *recv, int slot);

/* Abandons `slot` (timeout, abort): waits for its H2D copies in flight
 * (bounded), clears its arrival words and makes it idle, but keeps its
 * receive blocks quarantined (a stale writer may still put into them)
 * until kv_stage_recv_release_quarantine(slot).  With windows the
 * slot's window is unmapped instead (its key revoked) and its blocks are
 * free at once.  The device blocks may have been partly written.  A slot
 * whose quarantine is not released can be begun again (the quarantined
 * blocks simply stay out of use).  Returns true when a window was
 * unmapped here, i.e. its KV had not all arrived. */
bool kv_stage_recv_cancel(kv_stage_recv_t *recv, int slot);

/* Frees the receive blocks quarantined by cancels of `slot`. */
void kv_stage_recv_release_quarantine(kv_stage_recv_t *recv, int slot);

/* Free receive-area blocks (not reserved, not quarantined). */
int kv_stage_recv_free_blocks(const kv_stage_recv_t *recv);

/* ------------------------------------------------------------------------
 * Prefill side: the sender
 * --------------------------------------------------------------------- */

typedef struct kv_stage_send_s kv_stage_send_t;
typedef struct kv_stage_peer_s kv_stage_peer_t;
typedef struct kv_stage_xfer_s kv_stage_xfer_t;

typedef struct {
    kv_layout_t layout;      /* the local (device) KV pool */
    int stage_blocks;        /* blocks per staging buffer (K and V each) */
    int n_buffers;           /* staging buffers, 1..KV_STAGE_MAX_BUFFERS */
    const kv_stage_ops_t *ops; /* copies (required unless direct) */
    bool direct;             /* put from device memory, no staging */
} kv_stage_send_config_t;

/* Defaults: stage_blocks 256, 2 buffers, CUDA ops, not direct. */
void kv_stage_send_config_init(kv_stage_send_config_t *cfg);

/* Allocates the pinned staging buffers (kv_ucx_mem_alloc +
 * ops->host_register) and the D2H stream.  BT_ERR_INVALID_ARG,
 * BT_ERR_NET, BT_ERR_CUDA, BT_ERR_NO_MEMORY. */
bt_status_t kv_stage_send_create(kv_ucx_t *ucx,
                                 const kv_stage_send_config_t *cfg,
                                 kv_stage_send_t **send_p);

/* Waits (bounded, 2 s) for the chunks in flight, then frees the buffers.
 * Transfers and peers must have been destroyed (asserted).  NULL-safe. */
void kv_stage_send_destroy(kv_stage_send_t **send_p);

/* Parses a receiver's descriptor and connects to it (kv_ucx_connect,
 * which caches endpoints per pool).  BT_ERR_FORMAT, BT_ERR_INVALID_ARG
 * when its block shape differs from the local pool's, BT_ERR_NET. */
bt_status_t kv_stage_connect(kv_stage_send_t *send, const void *desc,
                             size_t len, kv_stage_peer_t **peer_p);

/* Drops the caller's reference; the connection closes when the last
 * transfer using it is gone.  NULL-safe; sets *peer_p = NULL. */
void kv_stage_disconnect(kv_stage_peer_t **peer_p);

/* Gives up on the staged chunks in flight to `peer`, whose decode worker
 * is presumed dead (without UCX peer error handling its commits may never
 * complete, which would hold the staging buffers forever): their
 * transfers fail with BT_ERR_NET and the buffers are free at once.  Puts
 * already issued may still read those buffers and reach the dead peer; a
 * late completion of an abandoned commit is ignored.  Direct-mode layers
 * are not affected (they hold no buffer).  The UCX endpoint is abandoned
 * too (kv_ucx_peer_abandon): later puts to it fail, the next connect to
 * that receiver makes a new one, and closing it never blocks. */
void kv_stage_peer_abandon(kv_stage_peer_t *peer);

/* The peer's parsed descriptor header. */
const kv_stage_desc_info_t *kv_stage_peer_info(const kv_stage_peer_t *peer);

/* Starts a hand-off into reservation `slot` / `epoch` of the peer: local
 * block src_ids[i] goes to the peer's destination id dst_ids[i] (as the
 * grant gave them) in every layer.  The lists are copied.  Layers are
 * then queued with kv_stage_xfer_layer.  BT_ERR_INVALID_ARG for bad ids,
 * slot or epoch, or a windowed peer with n > 0 (it has no area: use
 * kv_stage_xfer_begin_window). */
bt_status_t kv_stage_xfer_begin(kv_stage_send_t *send, kv_stage_peer_t *peer,
                                int slot, uint64_t epoch, const int *src_ids,
                                const int *dst_ids, int n,
                                kv_stage_xfer_t **xfer_p);

/* As kv_stage_xfer_begin, into a receiver with windows
 * (kv_stage_peer_info(peer)->windowed): block src_ids[i] goes to block i
 * of the reservation's window, whose descriptor (`window`, the grant's
 * KvGrant.ucx_window, copied as needed) is opened on the peer's
 * endpoint.  window may be NULL when n == 0.  BT_ERR_INVALID_ARG for bad
 * ids, slot or epoch; BT_ERR_FORMAT for a descriptor that is not one of
 * this peer's windows or holds fewer than n blocks; BT_ERR_NET when the
 * window is gone (its reservation ended, or its process died). */
bt_status_t kv_stage_xfer_begin_window(kv_stage_send_t *send,
                                       kv_stage_peer_t *peer, int slot,
                                       uint64_t epoch, const int *src_ids,
                                       int n, const void *window,
                                       size_t window_len,
                                       kv_stage_xfer_t **xfer_p);

/* Queues layer `layer` (each layer once): src_k / src_v are that layer's
 * K / V base in the local pool (device memory), which must hold the
 * layer's final values and stay unchanged until the transfer ends.
 * Starts D2H at once if a buffer is free.  BT_ERR_INVALID_ARG, or the
 * transfer's error. */
bt_status_t kv_stage_xfer_layer(kv_stage_xfer_t *xfer, int layer,
                                const void *src_k, const void *src_v);

/* Advances the pipeline: UCX progress, finished D2H copies become puts +
 * commits, free buffers take the next queued chunks.  Returns true if
 * anything happened. */
bool kv_stage_send_progress(kv_stage_send_t *send);

/* BT_OK when every layer has been queued, put and its epoch committed in
 * the peer's arrival words; BT_IN_PROGRESS before; the first error
 * (BT_ERR_NET: the decode worker died) after which nothing more is put. */
bt_status_t kv_stage_xfer_status(const kv_stage_xfer_t *xfer);

/* Chunks (and direct layers) of the transfer whose commit has landed so
 * far.  It grows as long as the peer takes data, however slowly the
 * caller's loop turns: a caller times out a transfer that stopped moving,
 * not one that is merely long. */
uint64_t kv_stage_xfer_landed(const kv_stage_xfer_t *xfer);

/* Progresses until the transfer's status is not BT_IN_PROGRESS, at most
 * timeout_ms (BT_ERR_TIMEOUT). */
bt_status_t kv_stage_xfer_wait(kv_stage_xfer_t *xfer, int timeout_ms);

/* Frees a transfer.  One still in flight is cancelled: queued chunks are
 * dropped, chunks already in a buffer finish on their own (their
 * buffers are reused afterwards).  NULL-safe; sets *xfer_p = NULL. */
void kv_stage_xfer_destroy(kv_stage_xfer_t **xfer_p);

typedef struct {
    uint64_t chunks;         /* chunks staged (or put directly) */
    uint64_t d2h_copies;     /* copy_async calls for D2H (coalesced) */
    uint64_t bytes;          /* KV bytes moved (K + V) */
    int max_busy;            /* most staging buffers busy at once */
} kv_stage_send_stats_t;

/* Counters since kv_stage_send_create. */
void kv_stage_send_stats(const kv_stage_send_t *send,
                         kv_stage_send_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_TRANSPORT_STAGE_H */
