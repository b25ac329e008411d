/*
 * workerproc.h - the worker control-plane client pieces that baton-prefill
 * and baton-decode share: the role-independent fields of a Register, the
 * handling of a RegisterAck, and sending a control message to the router.
 * Role-specific fields (KV layout, transports, descriptors) stay with
 * each role.
 */
#ifndef BT_WORKERPROC_WORKERPROC_H
#define BT_WORKERPROC_WORKERPROC_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine.h"
#include "kv/kv_link.h"
#include "kv/kv_transport.h"
#include "kv/kv_transport_cuda_ipc.h"
#include "model/model.h"
#include "proto_batch.h"
#include "proto_msg.h"
#include "workerproc_link.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A Register being built and the storage its fields point into; keep it
 * alive until the message is sent. */
typedef struct {
    Baton__Register reg;
    Baton__GpuInfo gpu;
    kv_cipc_gpu_info_t gi;
    char host[320];
    int eos[MODEL_MAX_EOS];
    Baton__KvTransport transports[KV_LINK_N_IDS]; /* reg.transports */
    Baton__KvEndpoint eps[KV_LINK_N_IDS];         /* reg.endpoints */
    Baton__KvEndpoint *ep_ptrs[KV_LINK_N_IDS];
} workerproc_register_t;

/* What workerproc_register_init() fills a Register from. */
typedef struct {
    Baton__Role role;
    const char *name;
    engine_t *engine;              /* NULL: --null-model */
    const engine_config_t *ecfg;   /* model path, device index */
    int vocab;
    int max_context;
    const char *host_id;           /* NULL or "": hostname/boot-id */
    bool kv_on_device;             /* send the GPU's facts */
    bool cuda_ipc;                 /* KV over CUDA IPC is set up (also
                                      implied by `links`) */
    const int *links;              /* (n_links) KV links offered
                                      (kv_link_*_offers); none: inline */
    int n_links;
    const kv_link_endpoint_t *eps; /* (n_eps) decode: its KV endpoints */
    int n_eps;
} workerproc_register_cfg_t;

/* Initializes r->reg and fills its role-independent fields: role, name,
 * model, vocab size, max context, pid, EOS ids, host id, (with a device
 * KV pool) the GPU, and the KV links offered with their endpoints.  The
 * endpoints' bytes must outlive the send.  It also says the worker takes
 * ControlBatch (Register.batches), which workerproc_handle_messages()
 * unpacks: a caller with a receive loop of its own clears
 * r->reg.has_batches. */
void workerproc_register_init(workerproc_register_t *r,
                              const workerproc_register_cfg_t *cfg);

/* Opens the control connection: a new ZeroMQ context and a DEALER
 * connected to the router endpoint `router`, its routing id `name` plus
 * "#" and 16 random hex digits: unique per process, so no other process
 * (a second worker with the same name, or anyone who read the name in
 * the cluster status) can speak as this one.  With CURVE (the process
 * identity, bt_curve_identity()) a socket monitor watches the handshake:
 * a router that refuses this worker's key is logged once, as an ERROR,
 * from workerproc_poll().  On error nothing is left open. */
bt_status_t workerproc_connect(const char *router, const char *name,
                               void **ctx_p, void **sock_p);

/* Closes what workerproc_connect() opened, giving queued messages (the
 * Shutdown) up to 500 ms to reach the router. */
void workerproc_close(void **ctx_p, void **sock_p);

/* Sends `msg` on the DEALER `sock` to the router; a failure is logged
 * (WARN) and otherwise ignored (the router notices a silent worker). */
void workerproc_send(void *sock, Baton__ControlMessage *msg);

/* Sends what `b` holds to the router as one message, a ControlBatch
 * when `batched` (workerproc_link_batches), else one by one; empties
 * `b`.  CURVE's cost is per message (issue 42): a decode step's TokenOuts
 * go out this way.  A failure is logged (WARN) and otherwise ignored. */
void workerproc_send_batch(void *sock, proto_batch_t *b, bool batched);

/* Queues `msg` in the outbox `b` (the caller sends it with
 * workerproc_send_batch within this loop turn, in order).  A full `b` is
 * sent first; a message that cannot be queued goes alone, after the
 * queued ones.  The message is packed now: its fields may change after
 * the call. */
void workerproc_queue(void *sock, proto_batch_t *b, bool batched,
                      Baton__ControlMessage *msg);

/* Tells the router this worker drains (takes no new work) or has shut
 * down; `name` is the worker's. */
void workerproc_send_drain(void *sock, const char *name);
void workerproc_send_shutdown(void *sock, const char *name);

/* Waits up to `timeout_ms` for a message on the control socket `sock`
 * or, when `ucx` is not NULL and has an event fd, for UCX activity (it
 * sleeps on the fd only when UCX has nothing pending: completions queued
 * for the next progress, or tcp software RMA needing this process, must
 * not wait for the timeout).  Returns BT_OK (also when interrupted by a
 * signal) or the zmq_poll failure. */
bt_status_t workerproc_poll(void *sock, kv_ucx_t *ucx, int timeout_ms);

/* workerproc_poll with an fd the caller armed already (-1: none), e.g.
 * kv_link_sender_arm's. */
bt_status_t workerproc_poll_fd(void *sock, int fd, int timeout_ms);

/* Writes the worker's name into `buf`: `name` when it is not NULL,
 * else "<role>-<pid>". */
void workerproc_name_init(char *buf, size_t size, const char *name,
                          const char *role);

/* Sends the Register `reg` (built with workerproc_register_init()). */
void workerproc_send_register(void *sock, Baton__Register *reg);

/* Initializes `hb` with the fields every role reports: its name, the
 * running requests, the tokens it still owes and whether it drains.
 * The role adds its KV (and other) counts, then sends it with
 * workerproc_send_heartbeat(). */
void workerproc_heartbeat_init(Baton__Heartbeat *hb, const char *name,
                               uint32_t running, uint64_t outstanding,
                               bool draining);
void workerproc_send_heartbeat(void *sock, Baton__Heartbeat *hb);

/* Fills `done` as the failure of request `id`'s prefill (ok = false,
 * `code` and the message `text`, borrowed), stamped with the KV grant's
 * `epoch` (0: no grant known) so that the router can tell a failure of
 * this attempt from a late one of an attempt it already re-queued.  The
 * roles queue it in their outbox; workerproc_send_prefill_failure sends
 * it at once. */
void workerproc_prefill_failure_init(Baton__PrefillDone *done, uint64_t id,
                                     uint64_t epoch, Baton__ErrorCode code,
                                     const char *text);
void workerproc_send_prefill_failure(void *sock, uint64_t id, uint64_t epoch,
                                     Baton__ErrorCode code, const char *text);

/* What a role's message handler did with one control message. */
typedef enum {
    WORKERPROC_MSG_DONE = 0, /* handled; the loop frees it */
    WORKERPROC_MSG_KEPT,     /* the role took ownership (frees it later
                                with proto_control_free()) */
    WORKERPROC_MSG_UNKNOWN,  /* not a kind the role takes: dropped with a
                                warning */
} workerproc_msg_t;

/* The role's side of workerproc_handle_messages(): the state the common
 * kinds update and the role's callback (it gets `arg`). */
typedef struct {
    void *sock;                   /* DEALER to the router */
    workerproc_link_t *link;      /* takes RegisterAck and HeartbeatAck */
    volatile sig_atomic_t *stop;  /* set by a Shutdown or a Drain */
    workerproc_msg_t (*on_msg)(void *arg, Baton__ControlMessage *msg);
    void *arg;
} workerproc_handlers_t;

/* Handles the control messages waiting on h->sock without blocking (at
 * most 1024 in one call, so a flood cannot starve the role's work).
 * RegisterAck, HeartbeatAck, Shutdown and Drain are handled here; every
 * other kind goes to h->on_msg, but only while the link's current
 * session is acknowledged: work that arrives between a Register and its
 * ack was meant for a registration the worker has given up (the router
 * re-queued it), and is dropped.  Malformed messages are skipped
 * (proto_control_recv logged them).  The entries of a ControlBatch are
 * handled in order as if each had come alone. */
void workerproc_handle_messages(const workerproc_handlers_t *h);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_H */
