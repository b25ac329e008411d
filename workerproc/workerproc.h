/*
 * workerproc.h - the worker control-plane client pieces that baton-prefill
 * and baton-decode share: the role-independent fields of a Register, the
 * handling of a RegisterAck, and sending a control message to the router.
 * Role-specific fields (KV layout, transports, descriptors) stay with
 * each role.
 */
#ifndef BT_WORKERPROC_WORKERPROC_H
#define BT_WORKERPROC_WORKERPROC_H

#include <stdbool.h>

#include "engine.h"
#include "kv/kv_transport.h"
#include "kv/kv_transport_cuda_ipc.h"
#include "model/model.h"
#include "proto_msg.h"

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
    bool cuda_ipc;                 /* KV over CUDA IPC is set up */
} workerproc_register_cfg_t;

/* Initializes r->reg and fills its role-independent fields: role, name,
 * model, vocab size, max context, pid, EOS ids, host id and (with a
 * device KV pool) the GPU. */
void workerproc_register_init(workerproc_register_t *r,
                              const workerproc_register_cfg_t *cfg);

/* Opens the control connection: a new ZeroMQ context and a DEALER with
 * identity `name` connected to the router endpoint `router`.  On error
 * nothing is left open. */
bt_status_t workerproc_connect(const char *router, const char *name,
                               void **ctx_p, void **sock_p);

/* Closes what workerproc_connect() opened, giving queued messages (the
 * Shutdown) up to 500 ms to reach the router. */
void workerproc_close(void **ctx_p, void **sock_p);

/* Sends `msg` on the DEALER `sock` to the router; a failure is logged
 * (WARN) and otherwise ignored (the router notices a silent worker). */
void workerproc_send(void *sock, Baton__ControlMessage *msg);

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

/* Applies a RegisterAck: marks the worker registered and takes the
 * router's heartbeat period.  Returns true (changing nothing) when the
 * router asks the worker to register again. */
bool workerproc_register_ack(const Baton__RegisterAck *ack, bool *registered,
                             int *heartbeat_ms);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_H */
