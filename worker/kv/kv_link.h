/*
 * kv_link.h - one interface to every way a request's KV moves from a
 * prefill worker into a decode worker's paged pool.
 *
 * A link is one transport behind a small vtable (kv_link_int.h), one file
 * each: kv_link_ucx.c (ucp RMA puts, kv_transport.h), kv_link_cuda_ipc.c
 * (device copies into a pool mapped over CUDA IPC), kv_link_stage.c (UCX
 * puts through pinned staging buffers), kv_link_inline.c (bytes in the
 * control messages) and kv_link_local.c (aggregated: nothing moves).  The
 * registry, kv_links[] in kv_link.c, is the one place that lists them.
 *
 * The prefill worker holds one kv_link_sender_t.  It says which links it
 * offers (Register), keeps endpoints to every decode pool the router lists
 * (KvPeers), and for each task makes a kv_link_xfer_t from the route the
 * router chose (PrefillTask.route): start once the local blocks exist,
 * one call per computed layer, commit after the last, then poll until it
 * lands.  A link that cannot carry a task (bad endpoint, a failed put)
 * falls back to inline inside the xfer, so the worker never names a
 * transport.
 *
 * The decode worker holds one kv_link_receiver_t: it registers or exports
 * its pool per link, publishes one endpoint per link (Register), arms the
 * arrival slot of each grant, and on KvReady asks the link the KV came
 * over whether it arrived.  Which link a pair uses is the router's
 * choice, kv_link_choose.h (pure logic, no transport code).
 *
 * Threading: a sender and its xfers belong to the worker's main thread.
 */
#ifndef BT_WORKER_KV_KV_LINK_H
#define BT_WORKER_KV_KV_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "bt_status.h"
#include "kv/kv_link_choose.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One decode pool endpoint (proto KvEndpoint): a transport id and its
 * receiver description, borrowed for the call. */
typedef struct {
    int transport;       /* KV_LINK_* */
    const uint8_t *desc; /* (len) opaque to everything but its link */
    size_t len;
} kv_link_endpoint_t;

/* What the sender's links may use: the worker's local pool and its
 * command-line switches. */
typedef struct {
    backend_t *backend;  /* the local KV pool; NULL: null model (no link
                            but inline is offered) */
    bool kv_on_device;   /* backend KV in GPU memory */
    int device_index;    /* CUDA ordinal of rank 0 (device KV) */
    bool use_ucx;        /* --no-ucx clears it */
    bool ucx_peer_errors;/* UCX peer error handling on host pools */
    bool use_cuda_ipc;   /* --no-cuda-ipc clears it */
    bool kv_stage;       /* staged UCX sender for device KV */
    bool kv_stage_direct;/* staged: put straight from device memory */
    bool kv_stage_host;  /* staged UCX over the CPU pool too */
    int kv_stage_blocks; /* staging area in blocks (0: 2048 tokens) */
    size_t inline_max_bytes; /* inline KV at most (0: KV_LINK_INLINE_MAX_
                                BYTES; tests set less) */
} kv_link_config_t;

/* Inline KV a hand-off may carry at most: it travels in one PrefillDone
 * and one KvReady, and a control message is at most PROTO_CONTROL_MAX_
 * BYTES (256 MiB; the router drops a bigger one and disconnects its
 * sender), less room for the rest of the message (logprobs, text).  A
 * hand-off past it fails at once with a clear error instead of vanishing
 * (2,048 tokens of Llama-3-8B in bf16 are 256 MiB). */
#define KV_LINK_INLINE_MAX_BYTES ((size_t)248 << 20)

/* Where one task's KV goes: the router's route plus the grant. */
typedef struct {
    uint64_t request_id;    /* for logs */
    int transport;          /* KV_LINK_*: PrefillTask.transport, or -1
                               when the router named none */
    const uint8_t *desc;    /* (desc_len) PrefillTask.route's endpoint */
    size_t desc_len;
    int slot;               /* the grant's arrival slot (-1: none) */
    uint64_t epoch;         /* the grant's epoch */
    const int *dst_blocks;  /* (n_dst) the reserved blocks */
    int n_dst;
    const int *stage_blocks;/* (n_stage) receive-area ids (staged UCX) */
    int n_stage;
    const uint8_t *ucx_window; /* (ucx_window_len) KvGrant.ucx_window: the
                               UCX and staged links put there, not into
                               the pool or receive area */
    size_t ucx_window_len;
    const uint8_t *cipc_window; /* (cipc_window_len) KvGrant.cipc_window:
                               the CUDA IPC link copies into that window,
                               not into the pool */
    size_t cipc_window_len;
    int dst_block_size;     /* the decode pool's block size (0: unknown) */
    int n_tokens;           /* prompt tokens whose KV the decode needs */
    int first_block;        /* the range moved: dst blocks [first_block,
                               n_dst), tokens [first_block * dst_block_size,
                               n_tokens); the decode pool holds the ones
                               before (its prefix cache).  0: all */
} kv_link_route_t;

typedef struct kv_link_sender_s kv_link_sender_t;
typedef struct kv_link_xfer_s kv_link_xfer_t;

// ---------------------------------------------------------------------------
// Sender (prefill)

/* Creates every link the configuration and the machine allow; a link
 * that cannot start is left out with a warning (its tasks go inline).
 * `cfg->backend` must outlive the sender. */
bt_status_t kv_link_sender_create(const kv_link_config_t *cfg,
                                  kv_link_sender_t **sender_p);

/* Waits (bounded) for what is in flight, then frees.  Xfers must be gone.
 * NULL-safe; sets *sender_p = NULL. */
void kv_link_sender_destroy(kv_link_sender_t **sender_p);

/* The KV_LINK_* ids offered (Register.transports), at most `max`;
 * returns how many.  Inline is always last. */
int kv_link_sender_offers(const kv_link_sender_t *sender, int *ids, int max);

/* Short names of the remote links running, "" without ("ucx,ucx-stage"),
 * for the start-up log line. */
const char *kv_link_sender_names(const kv_link_sender_t *sender);

/* KvPeers: the router's complete list of decode endpoints.  Each link
 * connects to its new ones now, off any request's critical path, and
 * drops those no longer listed. */
void kv_link_sender_sync(kv_link_sender_t *sender,
                         const kv_link_endpoint_t *eps, int n);

/* Runs every link's progress until idle (bounded). */
void kv_link_sender_progress(kv_link_sender_t *sender);

/* Closes endpoints that were dropped (KvPeers, a failed or abandoned
 * hand-off) once no xfer uses them and nothing is in flight, so closing
 * never blocks the loop. */
void kv_link_sender_reap(kv_link_sender_t *sender);

/* Before sleeping in poll: BT_OK and *fd_p (-1: none) is safe to sleep
 * on; BT_IN_PROGRESS: events are pending, do not sleep. */
bt_status_t kv_link_sender_arm(kv_link_sender_t *sender, int *fd_p);

// ---------------------------------------------------------------------------
// One hand-off

/* Makes the hand-off of one task.  The route's link is used when this
 * worker runs it and the route fits (endpoint, slot, block sizes); else
 * the KV goes inline (a warning), or, past KV_LINK_INLINE_MAX_BYTES,
 * BT_ERR_NO_RESOURCE (bt_error_last() says why).  `route`'s arrays are
 * copied. */
bt_status_t kv_link_xfer_create(kv_link_sender_t *sender,
                                const kv_link_route_t *route,
                                kv_link_xfer_t **xfer_p);

/* The task's local blocks exist (`src_blocks`, the prompt's whole table,
 * borrowed until destroy): connects, begins the transfer of the route's
 * range.  Falls back to inline on failure (a grant without a window on
 * a windowed CUDA IPC pool, an endpoint it cannot map), unless inline
 * cannot take it either: then kv_link_xfer_failed says so at once, and
 * the task fails before its prompt is computed. */
void kv_link_xfer_start(kv_link_xfer_t *xfer, const int *src_blocks, int n);

/* True when the hand-off has already failed (kv_link_xfer_error says
 * why): nothing it could still do would deliver the KV. */
bool kv_link_xfer_failed(const kv_link_xfer_t *xfer);

/* Layer `layer` of the prompt is computed: ships it (or packs it inline)
 * while later layers compute.  A failed put falls back to inline,
 * repacking layers 0..layer. */
void kv_link_xfer_layer(kv_link_xfer_t *xfer, int layer);

/* After the last layer.  BT_OK: nothing more to wait for (inline, none);
 * BT_IN_PROGRESS: poll; an error: the hand-off failed (reason in
 * kv_link_xfer_error). */
bt_status_t kv_link_xfer_commit(kv_link_xfer_t *xfer);

/* A committing hand-off: BT_IN_PROGRESS, BT_OK (landed) or an error
 * (kv_link_xfer_error says why).  `stall_ns`: a hand-off that has not
 * moved for this long is given up, its decode worker presumed dead. */
bt_status_t kv_link_xfer_poll(kv_link_xfer_t *xfer, uint64_t stall_ns);

/* Why the hand-off failed, for the TaskError. */
const char *kv_link_xfer_error(const kv_link_xfer_t *xfer);

/* True when the KV moves outside the control messages (the transfer
 * time and bytes are the link's). */
bool kv_link_xfer_is_remote(const kv_link_xfer_t *xfer);

/* True while a fresh commit completes within microseconds whatever the
 * decode worker does (device copies): the loop spins instead of
 * sleeping a poll tick on the first-token path. */
bool kv_link_xfer_spins(const kv_link_xfer_t *xfer);

/* Inline KV for PrefillDone.kv_inline: 2 * n_layers parts (layer l's K
 * then V) of *part_len_p bytes each; 0 for any other link. */
int kv_link_xfer_payload(const kv_link_xfer_t *xfer,
                         uint8_t *const **parts_p, size_t *part_len_p);

/* Frees the hand-off.  One still in flight is cancelled: nothing more is
 * put, what was queued finishes on its own.  NULL-safe. */
void kv_link_xfer_destroy(kv_link_xfer_t **xfer_p);

// ---------------------------------------------------------------------------
// Receiver (decode)

/* The decode worker's switches for its receiving links. */
typedef struct {
    bool use_ucx;        /* --no-ucx clears it */
    bool ucx_shm_pool;   /* KV arrays in UCX-mapped shared memory */
    bool use_cuda_ipc;   /* export a device pool over CUDA IPC */
    bool kv_stage;       /* staged UCX receiver for a device pool */
    bool kv_stage_direct;/* staged: puts straight into device memory */
    bool kv_stage_host;  /* staged UCX receiver over the CPU pool too */
    int kv_stage_blocks; /* receive area in blocks (0: 4 prompts) */
    int n_slots;         /* reservations: one arrival slot each */
    int quarantine_ms;   /* receive blocks of a cancelled staged slot */
    bool kv_direct_writes;/* register shared areas (the weaker
                            --kv-direct-writes: UCX the pool itself,
                            staged one receive area or the device pool,
                            CUDA IPC the whole device pool) instead of a
                            receive window per reservation */
    int device_index;    /* CUDA ordinal of rank 0 (device KV) */
} kv_link_recv_config_t;

typedef struct kv_link_receiver_s kv_link_receiver_t;

/* One reservation being granted (KvGrant). */
typedef struct {
    uint64_t request_id;  /* for logs */
    int slot;             /* its arrival slot */
    uint64_t epoch;       /* the epoch it is stamped with */
    const int *blocks;    /* (n) the reserved blocks */
    int n;
    bool has_want_link;   /* the router named its link (a zeroed grant,
                             an older router: every link is armed) */
    int want_link;        /* KV_LINK_* the router means to use
                             (KvReserve.kv_transport): only it is armed */
    bool want_recv_area;  /* the router means to use a link that writes
                             through a receive area (KvReserve.kv_stage,
                             or want_link is staged UCX) */
    int *recv_ids;        /* (n) out: the receive-area ids */
    bool has_recv_ids;    /* out: recv_ids were filled */
    const uint8_t *ucx_window; /* out: the receive window's descriptor
                                  (KvGrant.ucx_window): the UCX link's, or
                                  with want_recv_area the staged link's;
                                  valid until the slot is reset; NULL
                                  without */
    size_t ucx_window_len;
    const uint8_t *cipc_window; /* out: the CUDA IPC window's token and
                                   block count (KvGrant.cipc_window),
                                   valid until the slot is reset; NULL
                                   without */
    size_t cipc_window_len;
} kv_link_grant_t;

/* Before the engine: the UCX context, so the backend can place its KV
 * arrays in memory UCX maps into prefill workers (kv_link_receiver_kv_alloc).
 * A link that cannot start is left out with a warning. */
bt_status_t kv_link_receiver_create(const kv_link_recv_config_t *cfg,
                                    kv_link_receiver_t **recv_p);

/* Points the backend's KV allocator at UCX-mapped memory when the UCX
 * link runs with ucx_shm_pool and kv_direct_writes (puts become one-sided
 * memcpys); with receive windows no writer maps the pool. */
void kv_link_receiver_kv_alloc(kv_link_receiver_t *recv,
                               backend_config_t *bcfg);

/* After the engine: registers / exports the pool `be` holds (it must
 * outlive kv_link_receiver_detach) and starts every receiving link.
 * `max_context` sizes the default receive area (4 prompts). */
bt_status_t kv_link_receiver_attach(kv_link_receiver_t *recv, backend_t *be,
                                    bool kv_on_device, int max_context);

/* Stops the links (before the engine frees the pool); writers must be
 * fenced.  Idempotent. */
void kv_link_receiver_detach(kv_link_receiver_t *recv);

/* Frees the rest (after the engine: the pool memory may be UCX's).
 * NULL-safe; sets *recv_p = NULL. */
void kv_link_receiver_destroy(kv_link_receiver_t **recv_p);

/* Register: the links it receives on (inline last) and their endpoints,
 * valid while the receiver lives.  Each returns how many it wrote. */
int kv_link_receiver_offers(const kv_link_receiver_t *recv, int *ids,
                            int max);
int kv_link_receiver_endpoints(const kv_link_receiver_t *recv,
                               kv_link_endpoint_t *eps, int max);

/* Short names of the remote links running ("" without). */
const char *kv_link_receiver_names(const kv_link_receiver_t *recv);

/* True when a remote writer may target the pool (any link but inline):
 * blocks of a reservation whose KV did not land are quarantined. */
bool kv_link_receiver_is_remote(const kv_link_receiver_t *recv);

/* True when a remote writer holds a key to the pool's own blocks (UCX
 * with kv_direct_writes, CUDA IPC, the staged link in direct mode); false
 * when every remote link writes through receive windows or areas that the
 * links guard themselves: freed blocks need no quarantine then. */
bool kv_link_receiver_pool_exposed(const kv_link_receiver_t *recv);

/* A reservation is granted: the link the router means to use
 * (g->want_link; every link without has_want_link) arms the slot: it
 * clears its arrival slot, maps a receive window or reserves its receive
 * area (g->recv_ids).  The other links only clear the slot and map
 * nothing: a prompt prefilled here (local) or sent inline has no window.
 * BT_ERR_NO_RESOURCE: the receive area is full, refuse the grant for
 * now. */
bt_status_t kv_link_receiver_arm(kv_link_receiver_t *recv,
                                 kv_link_grant_t *g);

/* KvReady said the KV came over `transport`: BT_OK when slot `slot`
 * holds `epoch` (bounded wait for links whose data is already there),
 * BT_IN_PROGRESS while copies still run (ask again, do not block), an
 * error when it did not arrive (*why_p says so). */
bt_status_t kv_link_receiver_arrived(kv_link_receiver_t *recv, int transport,
                                     int slot, uint64_t epoch,
                                     const char **why_p);

/* Inline KV (KvReady.kv_inline): `n_parts` parts of `lens` bytes, layer
 * l's K then V, n_tokens rows each, into `blocks` (row 0 at the start of
 * blocks[0]: a hand-off of a range passes the range's blocks).
 * BT_ERR_FORMAT when they do not match the pool, BT_ERR_CUDA. */
bt_status_t kv_link_receiver_unpack(kv_link_receiver_t *recv,
                                    const uint8_t *const *parts,
                                    const size_t *lens, int n_parts,
                                    const int *blocks, int n_blocks,
                                    int n_tokens);

/* The reservation of `slot` ends.  `writer`: a remote writer may still
 * target it (its KV did not land): receive blocks are quarantined.
 * Returns true when a receive window that writer holds a key to was
 * unmapped (revoked) here. */
bool kv_link_receiver_reset(kv_link_receiver_t *recv, int slot, bool writer);

/* Progresses every link (software RMA, staged copies). */
void kv_link_receiver_progress(kv_link_receiver_t *recv);

/* Ends quarantines that are over. */
void kv_link_receiver_expire(kv_link_receiver_t *recv, uint64_t now);

/* KV messages refused by the UCX link's checks (a stale or forged
 * write: kv_ucx_writes_refused); 0 without UCX. */
uint64_t kv_link_receiver_writes_refused(const kv_link_receiver_t *recv);

/* As kv_link_sender_arm. */
bt_status_t kv_link_receiver_arm_fd(kv_link_receiver_t *recv, int *fd_p);

/* "ucx:3 cuda-ipc:0 ucx-stage:12": KV arrivals per remote link. */
void kv_link_receiver_stats(const kv_link_receiver_t *recv, char *buf,
                            size_t len);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_LINK_H */
