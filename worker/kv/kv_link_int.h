/*
 * kv_link_int.h - what a KV link implements (kv_link.h).  A link is one
 * file under worker/kv/ defining one kv_link_ops_t, listed once in
 * kv_links[] (kv_link.c).  Every op may be NULL where the link has
 * nothing to do (inline has no endpoints; local no sender at all).
 */
#ifndef BT_WORKER_KV_KV_LINK_INT_H
#define BT_WORKER_KV_KV_LINK_INT_H

#include "kv/kv_link.h"
#include "kv/kv_transport.h"

/* State the links of one sender share: one UCX context serves the UCX and
 * the staged links (one worker, one endpoint per decode process). */
typedef struct {
    const kv_link_config_t *cfg; /* sender: its copy; NULL in a receiver */
    const kv_link_recv_config_t *rcfg; /* receiver: its copy, else NULL */
    backend_t *backend;          /* the local pool (NULL: null model) */
    bool kv_on_device;           /* it is in GPU memory */
    int max_context;             /* receiver: the engine's context */
    kv_ucx_t *ucx;               /* NULL until a link asks for it */
    int ucx_users;               /* links holding it */
    bool ucx_failed;             /* it could not start: not again */
} kv_link_shared_t;

/* The part of every xfer the generic code reads; a link's own xfer
 * struct embeds it first. */
typedef struct {
    const char *error;           /* set with a failing status */
    uint64_t request_id;
} kv_link_xfer_base_t;

/* What a remote link's hand-off (UCX, CUDA IPC, staged UCX) keeps of
 * its route: the receiver's endpoint (a copy: the task's message is gone
 * before the commit), the arrival slot and epoch the commit writes, and
 * the destination block ids (the route's, which outlive the xfer). */
typedef struct {
    uint8_t *desc;               /* (desc_len), owned */
    size_t desc_len;
    int slot;
    uint64_t epoch;
    const int *dst;              /* pool or receive-area block ids */
    uint8_t *window;             /* (window_len) the grant's UCX receive
                                    window, owned; NULL without */
    size_t window_len;
    uint8_t cipc_window[20];     /* KvGrant.cipc_window: token, u32 n */
    bool has_cipc_window;
} kv_link_remote_t;

/* Creates a remote link's xfer: `size` zeroed bytes that start with the
 * kv_link_xfer_base_t and hold a kv_link_remote_t at `remote_off`,
 * filled from route r with destination `dst`.  BT_ERR_UNSUPPORTED (no
 * log) when r cannot be a remote hand-off into a pool laid out as `lay`
 * (no endpoint, no arrival slot, another block size): the caller goes
 * inline. */
bt_status_t kv_link__remote_xfer_create(const kv_link_route_t *r,
                                        const kv_layout_t *lay, size_t size,
                                        size_t remote_off, const int *dst,
                                        kv_link_xfer_base_t **xfer_p);

/* Frees what kv_link__remote_xfer_create copied (not the xfer). */
void kv_link__remote_cleanup(kv_link_remote_t *rt);

/* What a receiving link's windows are (UCX: kv_ucx_window_t; CUDA IPC:
 * kv_cipc_window_t, behind void *).  ctx is the link's receiver state,
 * handed back to every call. */
typedef struct {
    const char *name;            /* bt_malloc's name for the slots */
    /* Grant g's window of g->n blocks into *win_p; an error when it
     * cannot be made (bt_error_last() says why): BT_ERR_NO_RESOURCE
     * when the windows' budget is spent for now. */
    bt_status_t (*create)(void *ctx, const kv_link_grant_t *g,
                          void **win_p);
    /* Frees a window: a writer's key or FD reaches nothing after. */
    void (*destroy)(void *win);
    /* Waits (bounded) until the grant's epoch arrived, in window win or
     * (win NULL: no windows) in the pool's slot.  BT_OK, BT_ERR_TIMEOUT,
     * or another error. */
    bt_status_t (*wait)(void *ctx, void *win, int slot, uint64_t epoch);
    /* Copies the window's n blocks into the pool's `blocks`, once its
     * epoch arrived (or queues the copy where the pool's next readers
     * are ordered after it: CUDA IPC; destroy's release then waits for
     * it).  An error: the KV is not in the pool. */
    bt_status_t (*copy_in)(void *ctx, void *win, const int *blocks, int n);
    /* Says that grant g goes without a window (bt_error_last() says
     * why); called for the table's first such grant only. */
    void (*warn)(void *ctx, const kv_link_grant_t *g);
} kv_link_win_ops_t;

/* A receiving link's window per reservation slot (the UCX and CUDA IPC
 * links without --kv-direct-writes): a grant gets a window the writer
 * fills, KvReady copies it into the reservation's blocks, and a
 * reservation that ends otherwise frees it, so no writer ever holds a key
 * to the pool.  A NULL table (the link exposes its pool instead) arms no
 * window and revokes none.  Not thread-safe: the decode loop's. */
typedef struct kv_link_win_slots_s kv_link_win_slots_t;

/* A table of n_slots empty slots; ops (static) and ctx are kept.
 * BT_ERR_NO_MEMORY only. */
bt_status_t kv_link__win_slots_create(const kv_link_win_ops_t *ops,
                                      void *ctx, int n_slots,
                                      kv_link_win_slots_t **slots_p);

/* Frees every live window, then the table; NULL-safe. */
void kv_link__win_slots_destroy(kv_link_win_slots_t **slots_p);

/* Grant g's window: frees the slot's old one, then makes one for g's
 * blocks and epoch into *win_p.  *win_p NULL when g gets none (a slot
 * out of range, no blocks, a grant for the staged link's area, or the
 * window could not be made: warned once, the grant goes without and its
 * KV comes inline).  BT_ERR_NO_RESOURCE (no window, no warning) when the
 * windows' budget is spent for now: the caller refuses the grant, so the
 * request waits for a window at the router instead of sending KV inline
 * (a 2,048-token prompt of an 8B model is 256 MiB of bf16 KV, past what
 * a control message carries).  The window stays the table's, live until
 * the slot's next arm or reset, its arrival, or the table's destroy. */
bt_status_t kv_link__win_slots_arm(kv_link_win_slots_t *ws,
                                   const kv_link_grant_t *g, void **win_p);

/* The slot's reservation ended (or is granted again): frees its window
 * and forgets what was copied in.  True when a window was still live
 * and `writer` says a writer held it: its key is revoked. */
bool kv_link__win_slots_reset(kv_link_win_slots_t *ws, int slot,
                              bool writer);

/* KvReady for (slot, epoch), on a table (not NULL): BT_OK at once when
 * that epoch's window is already in the pool (asked again);
 * BT_ERR_INVALID_ARG when the slot holds no window of that grant; else
 * waits for the epoch (ops->wait: its error returned, the window kept),
 * then copies the window into the reservation's blocks and frees it
 * (its writer is done: nothing revoked), returning copy_in's error as it
 * is. */
bt_status_t kv_link__win_slots_arrived(kv_link_win_slots_t *ws, int slot,
                                       uint64_t epoch);

typedef struct kv_link_ops_s {
    const char *name;
    int id;                      /* KV_LINK_* (proto KvTransport) */
    int alias;                   /* another id the router's route may name
                                    for this link (ucx-shm), or -1 */
    bool spins;                  /* a commit completes in microseconds
                                    whatever the peer does */
    /* Sender: BT_ERR_UNSUPPORTED (no log) or an error (logged) leaves
     * the link out. */
    bt_status_t (*send_create)(kv_link_shared_t *sh, void **state_p);
    void (*send_destroy)(void **state_p);
    /* KvPeers: this link's endpoints only. */
    void (*send_sync)(void *state, const kv_link_endpoint_t *eps, int n);
    /* one pass; true if anything happened */
    bool (*send_progress)(void *state);
    /* closes dropped endpoints with nothing in flight */
    void (*send_reap)(void *state);
    /* A task's hand-off.  BT_ERR_UNSUPPORTED: the route does not fit
     * (the caller goes inline).  A remote link sees only the route's
     * range (kv_link.c offsets dst_blocks/n_dst here and src/n in
     * xfer_start by route->first_block); inline gets the whole tables
     * and moves tokens from first_block * dst_block_size. */
    bt_status_t (*xfer_create)(void *state, const kv_link_route_t *route,
                               kv_link_xfer_base_t **xfer_p);
    /* errors: fall back to inline */
    bt_status_t (*xfer_start)(kv_link_xfer_base_t *x, const int *src,
                              int n);
    /* an error: fall back to inline (BT_OK also when the failure is to
     * be reported by the commit) */
    bt_status_t (*xfer_layer)(kv_link_xfer_base_t *x, int layer);
    bt_status_t (*xfer_commit)(kv_link_xfer_base_t *x);
    /* BT_IN_PROGRESS, BT_OK, or an error (x->error set) */
    bt_status_t (*xfer_query)(kv_link_xfer_base_t *x);
    /* a counter that moves while the hand-off moves (stall detection) */
    uint64_t (*xfer_moved)(kv_link_xfer_base_t *x);
    /* the stall verdict: the peer is presumed dead */
    void (*xfer_abandon)(kv_link_xfer_base_t *x);
    int (*xfer_payload)(const kv_link_xfer_base_t *x,
                        uint8_t *const **parts_p, size_t *part_len_p);
    void (*xfer_destroy)(kv_link_xfer_base_t *x);
    /* Receiver, once the pool exists.  BT_ERR_UNSUPPORTED (no log) or an
     * error (logged) leaves the link out. */
    bt_status_t (*recv_create)(kv_link_shared_t *sh, void **state_p);
    void (*recv_destroy)(void **state_p);
    /* its endpoint (NULL: none to publish) */
    const uint8_t *(*recv_desc)(void *state, size_t *len_p);
    bt_status_t (*recv_arm)(void *state, kv_link_grant_t *g);
    bt_status_t (*recv_arrived)(void *state, int slot, uint64_t epoch);
    /* true: a receive window was revoked (unmapped) with a writer */
    bool (*recv_reset)(void *state, int slot, bool writer);
    /* true when a remote writer holds a key to the pool's own blocks
     * (NULL: true for every remote link) */
    bool (*recv_pool_exposed)(void *state);
    bool (*recv_progress)(void *state);
    void (*recv_expire)(void *state, uint64_t now);
} kv_link_ops_t;

extern const kv_link_ops_t kv_link_ucx_ops;
extern const kv_link_ops_t kv_link_cuda_ipc_ops;
extern const kv_link_ops_t kv_link_stage_ops;
extern const kv_link_ops_t kv_link_inline_ops;
extern const kv_link_ops_t kv_link_local_ops;

/* The shared UCX context, created on first use (NULL and a warning when
 * UCX cannot start).  Each acquire is matched by a release. */
kv_ucx_t *kv_link__ucx_acquire(kv_link_shared_t *sh);
void kv_link__ucx_release(kv_link_shared_t *sh);

/* Unpacks inline KV into the local pool (kv_link_receiver_unpack). */
bt_status_t kv_link__inline_unpack(const kv_link_shared_t *sh,
                                   const uint8_t *const *parts,
                                   const size_t *lens, int n_parts,
                                   const int *blocks, int n_blocks,
                                   int n_tokens);

/* Inline hand-off of a route (the fallback every link ends in).
 * BT_ERR_NO_RESOURCE (bt_error_last() says why) when its KV would be
 * more than the config's inline_max_bytes (KV_LINK_INLINE_MAX_BYTES). */
bt_status_t kv_link__inline_create(const kv_link_shared_t *sh,
                                   const kv_link_route_t *route,
                                   kv_link_xfer_base_t **xfer_p);

#endif /* BT_WORKER_KV_KV_LINK_INT_H */
