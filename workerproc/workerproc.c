/*
 * workerproc.c - control-plane client pieces shared by the worker
 * processes (see workerproc.h).
 */
#include "workerproc.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include <string.h>

#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "model/tokenizer.h"

/* The precision class the engine computes in, as Register.precision
 * says it: the backend's effective precision (its default resolved: cpu
 * f32, the GPU backends bf16), which is what a request's class names. */
static const char *engine_precision_class(engine_t *engine)
{
    const backend_t *be = engine_backend(engine);

    switch (backend_config(be)->precision) {
    case BACKEND_PRECISION_F32: return "f32";
    case BACKEND_PRECISION_BF16: return "bf16";
    case BACKEND_PRECISION_FP8: return "fp8";
    default: break;
    }
    return strcmp(backend_name(be), "cpu") == 0 ? "f32" : "bf16";
}

void workerproc_register_init(workerproc_register_t *r,
                              const workerproc_register_cfg_t *cfg)
{
    Baton__Register reg = BATON__REGISTER__INIT;
    Baton__GpuInfo gpu = BATON__GPU_INFO__INIT;
    int n_eos = 0;
    bool ipc = cfg->cuda_ipc;

    r->reg = reg;
    r->gpu = gpu;
    r->reg.has_role = 1;
    r->reg.role = cfg->role;
    r->reg.name = (char *)cfg->name;
    r->reg.model = cfg->engine ? (char *)cfg->ecfg->model_path : "null";
    r->reg.has_vocab_size = 1;
    r->reg.vocab_size = (uint32_t)cfg->vocab;
    r->reg.has_max_context = 1;
    r->reg.max_context = (uint32_t)cfg->max_context;
    r->reg.has_pid = 1;
    r->reg.pid = (uint32_t)getpid();
    r->reg.has_batches = 1; /* workerproc_handle_messages unpacks them */
    r->reg.batches = 1;
    if (cfg->engine != NULL) {
        const model_config_t *mc = model_config(engine_model(cfg->engine));
        for (int i = 0; i < mc->n_eos && i < MODEL_MAX_EOS; i++)
            r->eos[n_eos++] = mc->eos_ids[i];
    }
    if (cfg->engine != NULL) {
        /* by the pool's element size: what the hand-off actually moves */
        size_t elem = backend_kv_layout(engine_backend(cfg->engine))->elem_size;
        r->reg.kv_dtype = elem == 1 ? "fp8" : elem == 2 ? "bf16" : "f32";
        r->reg.precision = (char *)engine_precision_class(cfg->engine);
        if (engine_tokenizer(cfg->engine) != NULL) {
            r->reg.has_tokenizer_id = 1;
            r->reg.tokenizer_id = tok_identity(engine_tokenizer(cfg->engine));
        }
    }
    r->reg.n_eos_ids = (size_t)n_eos;
    r->reg.eos_ids = r->eos;
    if (cfg->host_id != NULL && cfg->host_id[0] != '\0')
        snprintf(r->host, sizeof(r->host), "%s", cfg->host_id);
    else
        kv_cipc_host_id(r->host, sizeof(r->host));
    r->reg.host_id = r->host;
    for (int i = 0; i < cfg->n_links && i < KV_LINK_N_IDS; i++) {
        r->transports[i] = (Baton__KvTransport)cfg->links[i];
        ipc |= cfg->links[i] == KV_LINK_CUDA_IPC;
    }
    r->reg.n_transports = (size_t)BT_MIN(cfg->n_links, KV_LINK_N_IDS);
    if (r->reg.n_transports == 0)
        r->transports[r->reg.n_transports++] =
            BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE;
    r->reg.transports = r->transports;
    for (int i = 0; i < cfg->n_eps && i < KV_LINK_N_IDS; i++) {
        Baton__KvEndpoint *e = &r->eps[i];
        baton__kv_endpoint__init(e);
        e->has_transport = 1;
        e->transport = (Baton__KvTransport)cfg->eps[i].transport;
        e->has_desc = 1;
        e->desc.data = (uint8_t *)cfg->eps[i].desc;
        e->desc.len = cfg->eps[i].len;
        r->ep_ptrs[i] = e;
    }
    r->reg.n_endpoints = (size_t)BT_MIN(BT_MAX(cfg->n_eps, 0), KV_LINK_N_IDS);
    r->reg.endpoints = r->ep_ptrs;
    if (cfg->kv_on_device &&
        kv_cipc_gpu_info(cfg->ecfg->backend.device_index, &r->gi) == BT_OK) {
        r->gpu.has_device_index = 1;
        r->gpu.device_index = r->gi.device;
        r->gpu.pci_bus_id = r->gi.bus_id;
        r->gpu.has_ipc = 1;
        r->gpu.ipc = r->gi.ipc && ipc;
        r->gpu.name = r->gi.name;
        r->reg.gpu = &r->gpu;
    }
}

/* The control socket's monitor (one control socket per worker process),
 * read by the main thread in workerproc_poll(); NULL without CURVE. */
static void *g_monitor;
static bool g_auth_logged;

/* Logs (once) a handshake the router refused.  Main thread only. */
static void monitor_drain(void)
{
    while (g_monitor != NULL) {
        zmq_msg_t ev;
        uint16_t event = 0;
        int more;

        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, g_monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        if (zmq_msg_size(&ev) >= sizeof(event))
            memcpy(&event, zmq_msg_data(&ev), sizeof(event));
        more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&ev);
            if (zmq_msg_recv(&ev, g_monitor, 0) < 0)
                more = 0;
            else
                more = zmq_msg_more(&ev);
            zmq_msg_close(&ev);
        }
        if (!g_auth_logged && (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)) {
            g_auth_logged = true;
            BT_LOG_ERROR("WORKER", "the router refused the connection (%s): "
                         "check --curve-secret-key/--router-public-key "
                         "(BATON_CURVE_SECRET_KEY, BATON_ROUTER_PUBLIC_KEY) "
                         "and the router's --allow-workers; retrying",
                         event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                             ? "this worker's key is not allowed"
                             : "security handshake failed: CURVE on one "
                               "side only, or the wrong router key?");
        }
    }
}

/* Opens the monitor of a CURVE control socket; failures only cost the
 * diagnostic. */
static void monitor_open(void *ctx, void *sock)
{
    const bt_curve_client_t *id = NULL;
    char ep[64];
    int linger = 0;

    if (bt_curve_identity(&id) != BT_OK || !id->on)
        return;
    snprintf(ep, sizeof(ep), "inproc://bt-worker-mon-%p", sock);
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        return;
    g_monitor = zmq_socket(ctx, ZMQ_PAIR);
    if (g_monitor == NULL)
        return;
    zmq_setsockopt(g_monitor, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(g_monitor, ep) != 0) {
        zmq_close(g_monitor);
        g_monitor = NULL;
    }
}

bt_status_t workerproc_connect(const char *router, const char *name,
                               void **ctx_p, void **sock_p)
{
    bt_zmq_socket_config_t scfg;
    bt_status_t status;
    char rid[128];
    void *ctx;

    if (strlen(name) > 100)
        return BT_ERROR(BT_ERR_INVALID_ARG, "WORKER", "worker name longer "
                        "than 63 bytes: %.40s...", name);
    snprintf(rid, sizeof(rid), "%s#%016llx", name,
             (unsigned long long)bt_random_u64());
    ctx = zmq_ctx_new();
    if (ctx == NULL)
        return BT_ZMQ_ERROR("zmq_ctx_new");
    bt_zmq_socket_config_init(&scfg);
    scfg.type = ZMQ_DEALER;
    scfg.endpoint = router;
    scfg.identity = rid;
    scfg.max_msg = PROTO_CONTROL_MAX_BYTES;
    status = bt_zmq_socket_create(ctx, &scfg, sock_p);
    if (status != BT_OK) {
        zmq_ctx_term(ctx);
        return status;
    }
    monitor_open(ctx, *sock_p);
    *ctx_p = ctx;
    return BT_OK;
}

void workerproc_close(void **ctx_p, void **sock_p)
{
    int linger = 500; /* let the Shutdown reach the router */

    workerproc_sock_lock();
    if (g_monitor != NULL) {
        zmq_socket_monitor(*sock_p, NULL, 0);
        zmq_close(g_monitor);
        g_monitor = NULL;
    }
    zmq_setsockopt(*sock_p, ZMQ_LINGER, &linger, sizeof(linger));
    bt_zmq_socket_destroy(sock_p);
    workerproc_sock_unlock();
    zmq_ctx_term(*ctx_p);
    *ctx_p = NULL;
}

void workerproc_send(void *sock, Baton__ControlMessage *msg)
{
    bt_status_t status;

    workerproc_sock_lock();
    status = proto_control_send(sock, NULL, 0, msg);
    workerproc_sock_unlock();
    if (status != BT_OK)
        BT_LOG_WARN("NET", "cannot send %s to the router",
                    proto_control_body_name(msg->body_case));
}

void workerproc_send_batch(void *sock, proto_batch_t *b, bool batched)
{
    size_t n = b->n;
    bt_status_t status;

    if (n == 0)
        return;
    workerproc_sock_lock();
    status = proto_batch_send_control(b, sock, NULL, 0, batched);
    workerproc_sock_unlock();
    if (status != BT_OK)
        BT_LOG_WARN("NET", "cannot send %zu messages to the router", n);
}

void workerproc_queue(void *sock, proto_batch_t *b, bool batched,
                      Baton__ControlMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    if (proto_batch_is_full(b, baton__control_message__get_packed_size(msg)))
        workerproc_send_batch(sock, b, batched);
    if (proto_batch_add_control(b, msg) == BT_OK)
        return;
    workerproc_send_batch(sock, b, batched);
    workerproc_send(sock, msg);
}

void workerproc_send_drain(void *sock, const char *name)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__Drain d = BATON__DRAIN__INIT;

    d.name = (char *)name;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_DRAIN;
    msg.drain = &d;
    workerproc_send(sock, &msg);
}

void workerproc_send_shutdown(void *sock, const char *name)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__Shutdown s = BATON__SHUTDOWN__INIT;

    s.name = (char *)name;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_SHUTDOWN;
    msg.shutdown = &s;
    workerproc_send(sock, &msg);
}

bt_status_t workerproc_poll(void *sock, kv_ucx_t *ucx, int timeout_ms)
{
    int fd = -1;

    if (ucx != NULL && timeout_ms > 0 && kv_ucx_event_fd(ucx) >= 0) {
        bt_status_t armed = kv_ucx_arm(ucx);
        if (armed == BT_OK)
            fd = kv_ucx_event_fd(ucx);
        else if (armed == BT_IN_PROGRESS)
            timeout_ms = 0;
    }
    return workerproc_poll_fd(sock, fd, timeout_ms);
}

bt_status_t workerproc_poll_fd(void *sock, int fd, int timeout_ms)
{
    zmq_pollitem_t items[2];
    int n_items = 1;

    monitor_drain();
    items[0] = (zmq_pollitem_t){ sock, 0, ZMQ_POLLIN, 0 };
    if (fd >= 0) {
        items[1] = (zmq_pollitem_t){ NULL, fd, ZMQ_POLLIN, 0 };
        n_items = 2;
    }
    /* The socket is shared with the heartbeat thread: sleep in slices of
     * at most 5 ms with the lock, so a heartbeat never waits longer. */
    for (;;) {
        int slice = timeout_ms < 0 ? 5 : BT_MIN(timeout_ms, 5);
        int rc, err;

        workerproc_sock_lock();
        rc = zmq_poll(items, n_items, slice);
        err = rc < 0 ? zmq_errno() : 0;
        workerproc_sock_unlock();
        if (rc < 0 && err != EINTR)
            return BT_ZMQ_ERROR("zmq_poll");
        if (rc != 0 || timeout_ms == slice)
            break;
        if (timeout_ms > 0)
            timeout_ms -= slice;
    }
    return BT_OK;
}

void workerproc_name_init(char *buf, size_t size, const char *name,
                          const char *role)
{
    if (name != NULL)
        snprintf(buf, size, "%s", name);
    else
        snprintf(buf, size, "%s-%d", role, (int)getpid());
}

void workerproc_send_register(void *sock, Baton__Register *reg)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;

    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER;
    msg.register_ = reg;
    workerproc_send(sock, &msg);
}

void workerproc_heartbeat_init(Baton__Heartbeat *hb, const char *name,
                               uint32_t running, uint64_t outstanding,
                               bool draining)
{
    Baton__Heartbeat init = BATON__HEARTBEAT__INIT;

    *hb = init;
    hb->name = (char *)name;
    hb->has_running = 1;
    hb->running = running;
    hb->has_outstanding_tokens = 1;
    hb->outstanding_tokens = outstanding;
    hb->has_draining = 1;
    hb->draining = draining;
}

void workerproc_send_heartbeat(void *sock, Baton__Heartbeat *hb)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;

    msg.body_case = BATON__CONTROL_MESSAGE__BODY_HEARTBEAT;
    msg.heartbeat = hb;
    workerproc_send(sock, &msg);
}

void workerproc_prefill_failure_init(Baton__PrefillDone *done, uint64_t id,
                                     uint64_t epoch, Baton__ErrorCode code,
                                     const char *text)
{
    done->has_request_id = 1;
    done->request_id = id;
    done->has_epoch = epoch != 0;
    done->epoch = epoch;
    done->has_ok = 1;
    done->ok = 0;
    done->has_error_code = 1;
    done->error_code = code;
    done->error = (char *)text;
}

void workerproc_send_prefill_failure(void *sock, uint64_t id, uint64_t epoch,
                                     Baton__ErrorCode code, const char *text)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;

    workerproc_prefill_failure_init(&done, id, epoch, code, text);
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE;
    msg.prefill_done = &done;
    workerproc_send(sock, &msg);
}

/* Handles one control message (alone or a batch's entry); frees it
 * unless the role kept it. */
static void handle_one(const workerproc_handlers_t *h,
                       Baton__ControlMessage *msg)
{
    if (workerproc_link_on_ack(h->link, msg)) {
        proto_control_free(&msg);
        return;
    }
    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_SHUTDOWN:
    case BATON__CONTROL_MESSAGE__BODY_DRAIN:
        *h->stop = 1;
        break;
    default:
        if (!workerproc_link_registered(h->link)) {
            BT_LOG_DEBUG("NET", "%s of a given-up registration dropped",
                         proto_control_body_name(msg->body_case));
            break;
        }
        switch (h->on_msg(h->arg, msg)) {
        case WORKERPROC_MSG_KEPT:
            return;
        case WORKERPROC_MSG_UNKNOWN:
            BT_LOG_WARN("NET", "unexpected %s dropped",
                        proto_control_body_name(msg->body_case));
            break;
        case WORKERPROC_MSG_DONE:
            break;
        }
        break;
    }
    proto_control_free(&msg);
}

/* A ControlBatch from the router (issue 42): each entry is handled as if
 * it had come alone, in order.  An entry that does not decode or is
 * itself a batch is dropped with a log line; the others still count. */
static void handle_batch(const workerproc_handlers_t *h,
                         const Baton__ControlBatch *batch)
{
    char err[256];

    if (batch->n_msgs > PROTO_BATCH_MAX_MSGS) {
        BT_LOG_WARN("NET", "control batch of %zu messages dropped (at most "
                    "%d)", batch->n_msgs, PROTO_BATCH_MAX_MSGS);
        return;
    }
    for (size_t i = 0; i < batch->n_msgs; i++) {
        Baton__ControlMessage *m = NULL;

        if (proto_control_decode(batch->msgs[i].data, batch->msgs[i].len, &m,
                                 err, sizeof(err)) != BT_OK) {
            BT_LOG_WARN("NET", "entry %zu of a control batch dropped: %s", i,
                        err);
            proto_control_free(&m);
        } else if (m->body_case == BATON__CONTROL_MESSAGE__BODY_BATCH) {
            BT_LOG_WARN("NET", "entry %zu of a control batch dropped: a "
                        "batch inside a batch", i);
            proto_control_free(&m);
        } else {
            handle_one(h, m);
        }
    }
}

void workerproc_handle_messages(const workerproc_handlers_t *h)
{
    for (int k = 0; k < 1024; k++) {
        Baton__ControlMessage *msg = NULL;
        bt_status_t status;

        workerproc_sock_lock();
        status = proto_control_recv(h->sock, &msg);
        workerproc_sock_unlock();
        if (status == BT_ERR_FORMAT)
            continue;
        if (status != BT_OK)
            return;
        if (msg->body_case == BATON__CONTROL_MESSAGE__BODY_BATCH) {
            handle_batch(h, msg->batch);
            proto_control_free(&msg);
            continue;
        }
        handle_one(h, msg);
    }
}
