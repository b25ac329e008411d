/*
 * kv_transport.h - KV hand-off from a prefill worker to a decode worker's
 * paged pool over UCX one-sided puts (ucp RMA).
 *
 * Roles and flow:
 *   decode  kv_ucx_create -> [kv_ucx_mem_alloc for the KV arrays] ->
 *           kv_ucx_pool_register(pool memory) ->
 *           kv_ucx_pool_desc() bytes travel to prefill workers in control
 *           messages (register / KV grant) -> on grant of reservation slot
 *           s with epoch e: kv_ucx_pool_slot_reset(s) -> poll
 *           kv_ucx_pool_has_arrived(s, e) after each kv_ucx_progress ->
 *           decode -> on free: kv_ucx_pool_slot_reset(s).
 *   prefill kv_ucx_create -> kv_ucx_connect(desc bytes) (cached: the same
 *           descriptor returns the same peer) -> for each layer l as soon
 *           as it is computed: kv_ucx_put_layer(peer, l, ...) ->
 *           kv_ucx_commit(peer, s, e, cb) -> cb / kv_ucx_peer_pending()==0
 *           says the KV and the epoch have landed in the decode pool.
 *
 * Data path: K and V live in separate arrays laid out as in kv.h,
 * (n_layers, n_blocks, block_size, n_kv_heads, head_dim), so a run of
 * consecutive block ids is one contiguous byte range in one layer.
 * kv_ucx_put_layer coalesces runs where BOTH the source and destination ids
 * are consecutive into a single ucp_put_nbx per run, per K and per V.
 *
 * Arrival and epochs: the descriptor also exposes an "arrival" array of
 * n_slots uint64 (host memory, registered), one per reservation slot.  The
 * decode side gives each reservation a fresh, never reused, non-zero 64-bit
 * epoch.  kv_ucx_commit writes that epoch into the slot as the LAST step:
 *     1. ucp_ep_flush_nbx(ep)   - completes when every put issued on the
 *        endpoint before it is *remotely* complete (the bytes are in the
 *        decode pool), on every lane and transport the endpoint uses;
 *     2. ucp_put_nbx(epoch -> arrival[slot]);
 *     3. ucp_ep_flush_nbx(ep)   - completes when the epoch has landed;
 *        then the commit callback runs.
 * We flush rather than ucp_worker_fence: a fence only orders operations
 * (the 8-byte epoch may travel on another lane than the bulk data, and
 * how a fence is enforced across lanes is up to the transports), while a
 * flush is a remote-completion guarantee on every lane, and the prefill
 * side needs that completion anyway to report the hand-off done.  So
 * whenever the decode side reads arrival[slot] == e (an acquire load), all
 * of that reservation's puts issued before the commit have landed.
 * Because epochs are never reused, a stale writer (one whose reservation
 * timed out and whose slot was reset and granted again with a new epoch)
 * writes an old epoch, so it can never make the new reservation look
 * complete: has_arrived(s, e_new) stays false.  (A stale epoch landing
 * after the new one can only hide an arrival: that reservation times out
 * and is retried, never accepted early.)  A windowed pool's commit is a
 * message the decode worker checks and answers instead
 * (kv_ucx_commit_window, "Receive windows" below).
 *
 * What epochs can NOT do: one-sided RMA cannot be refused by the target, so
 * a writer that is still running after its reservation timed out could
 * still put *data* into blocks that were freed and re-granted.  The decode
 * side must therefore not re-grant the blocks of a timed-out reservation
 * until that writer is fenced: the prefill worker acknowledged an abort on
 * the control plane, or it is known dead (heartbeat lost; UCX endpoints of
 * a dead process fail).  A quarantine period covers in-flight bytes.
 * Receive windows (below) remove the need: a windowed pool is never a
 * target, and each reservation's window is unmapped when it ends.
 *
 * Progress: all progress is driven by the caller (no UCX thread).  Both
 * sides must call kv_ucx_progress() regularly: on transports without true
 * one-sided RMA in hardware (tcp, and UCX's software RMA emulation) the
 * *target* worker writes the incoming bytes into its memory during its own
 * progress, so a decode worker that never progresses never receives KV.
 * To sleep instead of spinning, poll kv_ucx_event_fd() for POLLIN after
 * kv_ucx_arm() returned BT_OK, or call kv_ucx_wait().
 *
 * Transports: UCX chooses them (UCX_TLS; the tests and `baton bench-kv`
 * set UCX_TLS=tcp,sm,self unless it is already set).  What it picks here
 * (UCX 1.13, loopback, no InfiniBand, no usable cma), with `baton
 * bench-kv` numbers for a 64 MiB hand-off on the 2-core CI machine:
 *   - pool from kv_ucx_mem_alloc + peer_errors off: sysv/posix shared
 *     memory, true one-sided puts (the writer memcpys into the mapped
 *     pool): 0.9-1.05x memcpy, ~7-11 GB/s, no decode CPU needed;
 *   - malloc'ed pool + peer_errors off: shared-memory active messages,
 *     software RMA copied by the decode worker: 0.07-0.8x memcpy,
 *     depending on how much CPU the decode process gets;
 *   - peer_errors on: UCX 1.13 refuses shared memory for endpoints with
 *     peer error handling, so everything goes through tcp on lo with
 *     software RMA: ~0.5-1 GB/s, 0.05-0.13x memcpy.
 * A same-host deployment should use a kv_ucx_mem_alloc pool and
 * peer_errors off, and bound every commit with its own timeout.
 *
 * Memory: host memory today (CPU backend).  The pool and the put source
 * carry a kv_ucx_mem_type_t so CUDA memory can be passed later (UCX
 * cuda_copy / cuda_ipc); the arrival array is always host memory.
 *
 * Threading: a kv_ucx_t and everything made from it belong to one thread
 * at a time (UCS_THREAD_MODE_SINGLE); with cfg.serialized the caller may
 * use it from several threads provided it serialises the calls itself.
 */
#ifndef BT_WORKER_KV_KV_TRANSPORT_H
#define BT_WORKER_KV_KV_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bt_status.h"
#include "kv/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Descriptor wire format version; a descriptor with another is rejected. */
#define KV_UCX_DESC_VERSION 1
/* Upper bound on descriptor size accepted by the parser. */
#define KV_UCX_DESC_MAX_BYTES (1u << 20)

typedef enum {
    KV_UCX_MEM_HOST = 0, /* ordinary host memory */
    KV_UCX_MEM_CUDA = 1  /* CUDA device memory (not yet exercised) */
} kv_ucx_mem_type_t;

typedef struct kv_ucx_s kv_ucx_t;           /* ucp context + worker */
typedef struct kv_ucx_pool_s kv_ucx_pool_t; /* decode: registered pool */
typedef struct kv_ucx_peer_s kv_ucx_peer_t; /* prefill: one decode pool */
typedef struct kv_ucx_desc_s kv_ucx_desc_t; /* a parsed descriptor */

/* Commit completion: status BT_OK when the epoch landed, an error when the
 * endpoint failed (the decode worker died).  Runs inside kv_ucx_progress. */
typedef void (*kv_ucx_commit_cb_t)(void *arg, int slot, uint64_t epoch,
                                   bt_status_t status);

typedef struct {
    bool serialized; /* UCS_THREAD_MODE_SERIALIZED instead of SINGLE */
    bool wakeup;     /* request UCP_FEATURE_WAKEUP (event fd); default on */
    bool peer_errors;/* UCP_ERR_HANDLING_MODE_PEER on prefill endpoints:
                      * a dead decode worker fails puts and commits with
                      * BT_ERR_NET at once; default on.  Off: UCX may use
                      * shared memory (10x faster on one host, see
                      * "Transports") but a dead peer's commits never
                      * complete, so the caller's timeout must end them
                      * (kv_ucx_peer_wait, then kv_ucx_disconnect). */
    bool rma;        /* UCP_FEATURE_RMA; default on.  Off on a decode
                      * worker whose pool takes KV through receive windows
                      * only: its UCX then runs no software-RMA handler,
                      * so a put reaching it over tcp (where no key is
                      * checked) is dropped instead of written to the
                      * address it names; shared-memory and RDMA puts into
                      * windows still work (they need no target code). */
} kv_ucx_config_t;

/* Fills `cfg` with the defaults (single thread, wakeup, peer error
 * detection and RMA on). */
void kv_ucx_config_init(kv_ucx_config_t *cfg);

/* ------------------------------------------------------------------------
 * Context
 * --------------------------------------------------------------------- */

/* Creates a UCX context and worker.  Call after fork(), never before.
 * BT_ERR_NET when UCX cannot start. */
bt_status_t kv_ucx_create(const kv_ucx_config_t *cfg, kv_ucx_t **ctx_p);

/* Destroys the context.  Pools, peers and kv_ucx_mem_alloc blocks made
 * from it must be released first (asserted).  Commits still in flight on
 * a peer that died are dropped here without their callbacks.  NULL-safe;
 * sets *ctx_p = NULL. */
void kv_ucx_destroy(kv_ucx_t **ctx_p);

/* Runs UCX progress until it has nothing more to do right now and runs
 * the transport's completion steps (commit state machine, callbacks).
 * Returns true if anything happened. */
bool kv_ucx_progress(kv_ucx_t *ctx);

/* The worker's event fd (-1 if wakeup is off): readable when there may be
 * progress to make.  Arm before sleeping on it. */
int kv_ucx_event_fd(const kv_ucx_t *ctx);

/* Arms the event fd.  BT_OK: armed, safe to sleep on the fd.
 * BT_IN_PROGRESS: events are pending, call kv_ucx_progress() first. */
bt_status_t kv_ucx_arm(kv_ucx_t *ctx);

/* Progresses, then sleeps on the event fd at most `timeout_ms` (0: do not
 * sleep) if nothing happened.  BT_OK in every non-error case; BT_ERR_NET
 * on a UCX or poll failure. */
bt_status_t kv_ucx_wait(kv_ucx_t *ctx, int timeout_ms);

/* ------------------------------------------------------------------------
 * Decode side: the registered pool
 * --------------------------------------------------------------------- */

/* Allocates `bytes` of pool memory through UCX (ucp_mem_map ALLOCATE).
 * On one host UCX places it in a shared-memory segment (sysv/posix), so
 * a writer maps it and kv_ucx_put_layer becomes a one-sided memcpy with no
 * work for the decode side; memory from malloc goes through UCX's software
 * RMA emulation instead (tcp or shm active messages, copied by the decode
 * worker during its progress), several times slower (bench-kv).  A
 * backend that can place its KV arrays here should.  The memory is
 * registered already: kv_ucx_pool_register uses this registration for
 * layers that lie inside it.  Free with kv_ucx_mem_free after the pool
 * using it is deregistered.  Host memory only for now. */
bt_status_t kv_ucx_mem_alloc(kv_ucx_t *ctx, size_t bytes,
                             kv_ucx_mem_type_t mem_type, void **ptr_p);
/* Frees memory from kv_ucx_mem_alloc.  NULL-safe; sets *ptr_p = NULL. */
void kv_ucx_mem_free(kv_ucx_t *ctx, void **ptr_p);

/* Registers the KV pool memory and builds its descriptor.
 * `k_layers[l]` / `v_layers[l]` are the base of layer l's K / V array
 * (n_blocks * block_bytes each, as backend_kv_data returns them).  Layers
 * that are adjacent in memory are merged, so a backend that allocates K
 * (or V) as one array for all layers costs one ucp_mem_map for K and one
 * for V; `n_slots` arrival slots are allocated and registered too (all 0).
 * The pool does not own the KV memory, which must outlive it.
 * BT_ERR_INVALID_ARG on a bad layout or overlapping layers. */
bt_status_t kv_ucx_pool_register(kv_ucx_t *ctx, const kv_layout_t *layout,
                                 void *const *k_layers,
                                 void *const *v_layers,
                                 kv_ucx_mem_type_t mem_type, int n_slots,
                                 kv_ucx_pool_t **pool_p);

/* As kv_ucx_pool_register, but only the arrival slots are registered:
 * the KV arrays are never exposed and every hand-off goes through a
 * receive window (below).  The descriptor says so; kv_ucx_put_layer into
 * such a pool is refused. */
bt_status_t kv_ucx_pool_register_windowed(kv_ucx_t *ctx,
                                          const kv_layout_t *layout,
                                          int n_slots,
                                          kv_ucx_pool_t **pool_p);

/* Unmaps and frees the pool's registrations and arrival slots.  Writers
 * must have stopped (see "What epochs can NOT do").  NULL-safe. */
void kv_ucx_pool_deregister(kv_ucx_pool_t **pool_p);

/* The serialized descriptor, valid while the pool lives.  Send it as an
 * opaque byte string; kv_ucx_connect on the prefill side consumes it. */
const uint8_t *kv_ucx_pool_desc(const kv_ucx_pool_t *pool, size_t *len_p);

/* True when reservation slot `slot` holds `epoch`, i.e. a commit for this
 * epoch completed and every put issued before it landed.  Does not
 * progress UCX itself (call kv_ucx_progress first).  False for an
 * out-of-range slot or epoch 0. */
bool kv_ucx_pool_has_arrived(const kv_ucx_pool_t *pool, int slot,
                             uint64_t epoch);

/* The raw value of an arrival slot (0 after reset), for diagnostics. */
uint64_t kv_ucx_pool_slot_value(const kv_ucx_pool_t *pool, int slot);

/* Clears an arrival slot to 0.  Call when a reservation is granted and
 * when it is freed, so a reused slot never carries an old arrival. */
void kv_ucx_pool_slot_reset(kv_ucx_pool_t *pool, int slot);

/* ------------------------------------------------------------------------
 * Receive windows: one per reservation (issue 42)
 *
 * A remote key of the pool lets its holder write any block of it for as
 * long as the pool lives, long after its reservation ended (a prefill
 * worker stopped with SIGSTOP and resumed).  A window is host memory
 * mapped for ONE reservation (ucp_mem_map ALLOCATE: its own shared memory
 * segment on one host, its own memory region on RDMA), laid out
 * (n_layers, K|V, n_blocks, block), whose descriptor (address + a fresh
 * packed rkey) travels in that grant only.  The decode worker copies it
 * into the reservation's pool blocks once the capability was checked and
 * the epoch arrived, then unmaps it; a reservation that ends otherwise
 * unmaps it too.  After the unmap a stale rkey reaches nothing the decode
 * worker reads: on shared memory the writer's attachment is an orphaned
 * segment, on RDMA the key is invalid (the put fails).
 *
 * Where UCX checks no key - an endpoint without RMA lanes, i.e. software
 * RMA over tcp - the receiver decides where bytes land: the writer sends
 * the data as active messages naming (pool, slot, epoch, the window's
 * random 128-bit token, layer, K|V, offset, length), and the decode
 * worker's handler copies each into the live window of that slot, epoch
 * and token, within its bounds, or drops it and counts it
 * (kv_ucx_writes_refused).  The commit always goes that way, after the
 * data (shared memory and RDMA put the data, flush, then send the
 * commit): the handler sets the arrival slot itself once every announced
 * byte came.  The staged link's windows commit layer by layer that way
 * (kv_ucx_window_create_layers), so no windowed pool takes epoch puts.
 * A decode context created with cfg.rma off runs no software-RMA handler,
 * so a forged put over tcp cannot write it either (docs/SECURITY.md 5).
 * --------------------------------------------------------------------- */

typedef struct kv_ucx_window_s kv_ucx_window_t;   /* decode: mapped */
typedef struct kv_ucx_rwindow_s kv_ucx_rwindow_t; /* prefill: opened */

/* Maps a window of `n_blocks` blocks per layer for `pool`'s layout, for
 * the grant of arrival slot `slot` with `epoch` (its messages must name
 * both, and its fresh token).  BT_ERR_INVALID_ARG for n_blocks outside
 * 1..pool blocks, a slot out of range or holding a window, epoch 0 or a
 * pool that is not windowed; BT_ERR_NET when UCX cannot map it;
 * BT_ERR_NO_MEMORY; the error of bt_random_secret. */
bt_status_t kv_ucx_window_create(kv_ucx_pool_t *pool, int slot,
                                 uint64_t epoch, int n_blocks,
                                 kv_ucx_window_t **win_p);

/* As kv_ucx_window_create, for a window whose writer commits it layer
 * by layer (the staged link): layer l's commit
 * (kv_ucx_commit_window_layer) sets arrival slot `slot + l`, so slots
 * slot .. slot + n_layers - 1 must exist; once a layer committed, its
 * messages are refused (the decode worker may be reading it). */
bt_status_t kv_ucx_window_create_layers(kv_ucx_pool_t *pool, int slot,
                                        uint64_t epoch, int n_blocks,
                                        kv_ucx_window_t **win_p);

/* The window's descriptor bytes (KvGrant.ucx_window), valid while it
 * lives. */
const uint8_t *kv_ucx_window_desc(const kv_ucx_window_t *win,
                                  size_t *len_p);

/* Layer `layer`'s K (`kv` 0) or V (1) array of the window: n_blocks
 * blocks of the pool's block bytes. */
const void *kv_ucx_window_data(const kv_ucx_window_t *win, int layer,
                               int kv);
int kv_ucx_window_blocks(const kv_ucx_window_t *win);

/* Unmaps the window (its rkey dies with it; its messages are refused
 * from now on).  NULL-safe. */
void kv_ucx_window_destroy(kv_ucx_window_t **win_p);

/* Prefill: unpacks a window descriptor of the peer's pool (BT_ERR_FORMAT
 * for bytes that are not one, or one of another pool or shape).  On an
 * endpoint without RMA lanes the window is written by message (its key
 * is not unpacked). */
bt_status_t kv_ucx_window_open(kv_ucx_peer_t *peer, const void *desc,
                               size_t len, kv_ucx_rwindow_t **rw_p);

/* Blocks per layer of an opened window. */
int kv_ucx_rwindow_blocks(const kv_ucx_rwindow_t *rw);

/* True when the window is written by active message (no RMA lanes). */
bool kv_ucx_rwindow_by_message(const kv_ucx_rwindow_t *rw);

/* As kv_ucx_put_layer into the window: source block src_ids[i] goes to
 * window block i (n at most the window's blocks).  By message on an
 * endpoint without RMA lanes (eager, at most 256 KiB each). */
bt_status_t kv_ucx_put_layer_window(kv_ucx_peer_t *peer,
                                    kv_ucx_rwindow_t *rw, int layer,
                                    const void *src_k, const void *src_v,
                                    const kv_layout_t *src_layout,
                                    kv_ucx_mem_type_t src_mem,
                                    const int *src_ids, int n);

/* As kv_ucx_put_layer_window, into window blocks first .. first + n - 1
 * (source block src_ids[i] goes to window block first + i): the staged
 * link (kv_transport_stage.h) puts a layer in chunks. */
bt_status_t kv_ucx_put_layer_window_at(kv_ucx_peer_t *peer,
                                       kv_ucx_rwindow_t *rw, int layer,
                                       int first, const void *src_k,
                                       const void *src_v,
                                       const kv_layout_t *src_layout,
                                       kv_ucx_mem_type_t src_mem,
                                       const int *src_ids, int n);

/* Commits the window's reservation: waits for its messages to complete,
 * flushes, sends the commit message (slot, epoch, token, the bytes sent
 * by message) and waits for the decode worker's answer: `cb` gets BT_OK
 * when it set the arrival slot (the commit and every byte it announced
 * were accepted), BT_ERR_REMOTE when it refused (the window ended), the
 * endpoint's error if it failed.  As kv_ucx_commit otherwise: `cb` runs
 * from kv_ucx_progress; an error return means it never runs. */
bt_status_t kv_ucx_commit_window(kv_ucx_peer_t *peer, kv_ucx_rwindow_t *rw,
                                 kv_ucx_commit_cb_t cb, void *arg);

/* As kv_ucx_commit_window for layer `layer` of a window that commits
 * layer by layer (kv_ucx_window_create_layers; BT_ERR_INVALID_ARG for
 * any other): the decode worker sets that layer's arrival slot once the
 * commit and every byte of that layer sent by message came, and refuses
 * it for anything but the live window of that slot, epoch and token.
 * Call it after the layer's last put or message. */
bt_status_t kv_ucx_commit_window_layer(kv_ucx_peer_t *peer,
                                       kv_ucx_rwindow_t *rw, int layer,
                                       kv_ucx_commit_cb_t cb, void *arg);

/* Drops the unpacked key (at the peer's next quiet moment when puts are
 * still in flight).  NULL-safe; sets *rw_p = NULL. */
void kv_ucx_window_close(kv_ucx_rwindow_t **rw_p);

/* Decode: KV messages this context's handlers dropped (a window that
 * ended or never was, a wrong token or epoch, out of bounds, after the
 * commit, malformed, a rendezvous offer).  NULL: 0. */
uint64_t kv_ucx_writes_refused(const kv_ucx_t *ctx);

/* ------------------------------------------------------------------------
 * Descriptors (exposed for tests, fuzzing and the control plane)
 * --------------------------------------------------------------------- */

/* Parses and validates descriptor bytes: magic, version, every length and
 * count against the bytes present and sane bounds, layout sizes without
 * overflow, every layer inside its region, and a trailing checksum.
 * Never trusts a field before checking it.  BT_ERR_FORMAT on any defect
 * (logged once), BT_ERR_NO_MEMORY.  `buf` is copied. */
bt_status_t kv_ucx_desc_parse(const void *buf, size_t len,
                              kv_ucx_desc_t **desc_p);
void kv_ucx_desc_destroy(kv_ucx_desc_t **desc_p);

/* The remote pool's layout, slot count and identity (random per pool). */
const kv_layout_t *kv_ucx_desc_layout(const kv_ucx_desc_t *desc);
int kv_ucx_desc_n_slots(const kv_ucx_desc_t *desc);
uint64_t kv_ucx_desc_pool_id(const kv_ucx_desc_t *desc);
/* True for a pool that takes KV through receive windows only. */
bool kv_ucx_desc_windowed(const kv_ucx_desc_t *desc);

/* ------------------------------------------------------------------------
 * Prefill side: peers, puts, commits
 * --------------------------------------------------------------------- */


/* Connects to the pool described by `desc` (parses it first; BT_ERR_FORMAT
 * for a bad one).  Peers are cached in `ctx` by pool id: connecting to a
 * pool already connected returns the same peer and takes a reference. */
bt_status_t kv_ucx_connect(kv_ucx_t *ctx, const void *desc, size_t len,
                           kv_ucx_peer_t **peer_p);

/* Drops a reference; the last one waits (bounded, 2 s) for outstanding
 * operations, then closes the endpoint (an abandoned peer: at once, no
 * wait).  NULL-safe; sets *peer_p = NULL. */
void kv_ucx_disconnect(kv_ucx_peer_t **peer_p);

/* Gives up on a peer presumed dead (a commit timed out; without peer
 * error handling its operations may never complete): puts and commits
 * fail with BT_ERR_NET from now on, kv_ucx_connect to its pool makes a
 * new endpoint instead of returning this one, and the last
 * kv_ucx_disconnect closes it without waiting for what is in flight.
 * NULL-safe, idempotent. */
void kv_ucx_peer_abandon(kv_ucx_peer_t *peer);

/* The remote layout (blocks per layer, slot count...). */
const kv_ucx_desc_t *kv_ucx_peer_desc(const kv_ucx_peer_t *peer);

/* Puts layer `layer` of `n` blocks: source block src_ids[i] of
 * `src_k`/`src_v` (this layer's K / V base, laid out by `src_layout`,
 * whose block shape must equal the remote one; n_blocks may differ) goes
 * to destination block dst_ids[i] of the remote pool.  Runs consecutive in
 * both lists become one put each.  Non-blocking: the source memory must
 * stay unchanged until the next kv_ucx_commit on this peer completes (or
 * kv_ucx_peer_pending() == 0).  Every id is bounds-checked
 * (BT_ERR_INVALID_ARG); BT_ERR_NET if the endpoint failed. */
bt_status_t kv_ucx_put_layer(kv_ucx_peer_t *peer, int layer,
                             const void *src_k, const void *src_v,
                             const kv_layout_t *src_layout,
                             kv_ucx_mem_type_t src_mem, const int *src_ids,
                             const int *dst_ids, int n);

/* Marks reservation `slot` complete with `epoch` (non-zero) after every
 * put and message issued so far on this peer: flush, put epoch, flush
 * (see top).  Refused (BT_ERR_INVALID_ARG) for a windowed pool, whose
 * decode worker may run without RMA: windows commit by message
 * (kv_ucx_commit_window, kv_ucx_commit_window_layer).
 * Non-blocking; `cb` (may be NULL) runs from kv_ucx_progress when done.
 * An error return means `cb` will never run. */
bt_status_t kv_ucx_commit(kv_ucx_peer_t *peer, int slot, uint64_t epoch,
                          kv_ucx_commit_cb_t cb, void *arg);

/* Completes (`cb` gets slot -1 and `tag` as its epoch) once every put
 * issued so far on this peer is remotely complete and every message
 * sent: a staging buffer may then be reused.  Nothing reaches the decode
 * worker's arrival slots.  As kv_ucx_commit otherwise. */
bt_status_t kv_ucx_flush(kv_ucx_peer_t *peer, uint64_t tag,
                         kv_ucx_commit_cb_t cb, void *arg);

/* Operations still in flight on this peer (puts + commits). */
int kv_ucx_peer_pending(const kv_ucx_peer_t *peer);

/* Puts issued and bytes put since connect (after coalescing). */
uint64_t kv_ucx_peer_puts(const kv_ucx_peer_t *peer);
uint64_t kv_ucx_peer_bytes(const kv_ucx_peer_t *peer);

/* Writes UCX's description of the endpoint (lanes, transports) to
 * `stream`, for diagnostics. */
void kv_ucx_peer_print_info(const kv_ucx_peer_t *peer, FILE *stream);

/* BT_OK, or the error that failed the endpoint (sticky). */
bt_status_t kv_ucx_peer_status(const kv_ucx_peer_t *peer);

/* Operations (puts and commit stages) the endpoint has completed
 * successfully since connect.  Without peer error handling a dead peer
 * never completes anything again, while a live one completes what is in
 * flight as soon as the caller progresses, however rarely: a caller
 * times out an endpoint that stopped moving, not a hand-off that merely
 * waited for its own loop. */
uint64_t kv_ucx_peer_completed(const kv_ucx_peer_t *peer);

/* True once kv_ucx_peer_abandon was called on the peer (NULL: false). */
bool kv_ucx_peer_abandoned(const kv_ucx_peer_t *peer);

/* Progresses until kv_ucx_peer_pending(peer) == 0, at most `timeout_ms`.
 * BT_ERR_TIMEOUT when time ran out, the peer's error if it failed. */
bt_status_t kv_ucx_peer_wait(kv_ucx_peer_t *peer, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_TRANSPORT_H */
