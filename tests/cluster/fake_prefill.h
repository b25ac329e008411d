/*
 * fake_prefill.h - a prefill worker played by a cluster test over a real
 * DEALER with workerproc's helpers: it registers (inline KV only, or UCX
 * too with offer_ucx), heartbeats and keeps the PrefillTask it receives
 * (id, grant epoch, KV capability, the route's UCX endpoint and the
 * grant's receive window), so a test can answer it as it likes
 * (test_stale_prefill, test_kv_capability, test_kv_stale_writer,
 * test_kv_stale_writer_stage);
 * fake_start and fake_wait_task are the steps all three take.
 */
#ifndef BT_TESTS_CLUSTER_FAKE_PREFILL_H
#define BT_TESTS_CLUSTER_FAKE_PREFILL_H

#include <string.h>
#include <zmq.h>

#include "bt_error.h"
#include "bt_util.h"
#include "cluster_util.h"
#include "proto_msg.h"
#include "workerproc.h"

typedef struct {
    void *ctx;
    void *sock;
    bool registered;
    uint64_t last_hb_ns;
    uint64_t task_id;    /* the PrefillTask received (0: none yet) */
    uint64_t task_epoch;
    uint8_t cap[PROTO_CAPABILITY_BYTES];
    size_t cap_len;
    bool offer_ucx;      /* register with UCX besides inline */
    bool offer_stage;    /* register with staged UCX besides inline */
    const char *precision;/* precision class and KV dtype ("f32"), so a
                             real model's decode worker pairs with it;
                             NULL: none (a null-model decode worker) */
    uint8_t route[16384];/* (route_len) PrefillTask.route's endpoint */
    size_t route_len;
    uint8_t window[4096];/* (window_len) KvGrant.ucx_window */
    size_t window_len;
} fake_prefill_t;

static void fake_register(fake_prefill_t *f)
{
    static Baton__KvTransport inline_only[] = {
        BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE};
    static Baton__KvTransport with_ucx[] = {
        BATON__KV_TRANSPORT__KV_TRANSPORT_UCX,
        BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE};
    static Baton__KvTransport with_stage[] = {
        BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE,
        BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE};
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_PREFILL, .name = "fake-prefill",
        .vocab = PROTO_NULL_VOCAB, .max_context = PROTO_NULL_CONTEXT,
        .host_id = "fake-host",
    };
    workerproc_register_t r;

    workerproc_register_init(&r, &rc);
    r.reg.has_batches = 0; /* fake_pump takes one message at a time */
    if (f->precision != NULL) { /* pairs with a real decode worker */
        r.reg.precision = (char *)f->precision;
        r.reg.kv_dtype = (char *)f->precision;
    }
    r.reg.n_transports = f->offer_ucx || f->offer_stage ? 2 : 1;
    r.reg.transports = f->offer_stage ? with_stage
                       : f->offer_ucx ? with_ucx
                                      : inline_only;
    workerproc_send_register(f->sock, &r.reg);
}

/* Keeps a copy of optional bytes (len 0 when absent or too long). */
static void fake_keep(uint8_t *dst, size_t cap, size_t *len_p, bool has,
                      const ProtobufCBinaryData *b)
{
    *len_p = 0;
    if (has && b != NULL && b->len <= cap) {
        memcpy(dst, b->data, b->len);
        *len_p = b->len;
    }
}

/* Serves the fake's control socket for `ms`: RegisterAck, heartbeats,
 * and the PrefillTask (its id, epoch and capability kept in f). */
static void fake_pump(fake_prefill_t *f, int ms)
{
    uint64_t end = bt_time_ns() + (uint64_t)ms * 1000000ull;

    while (bt_time_ns() < end) {
        Baton__ControlMessage *m = NULL;
        zmq_pollitem_t it = {f->sock, 0, ZMQ_POLLIN, 0};

        if (f->registered && bt_time_ns() - f->last_hb_ns > 100000000ull) {
            Baton__Heartbeat hb;
            workerproc_heartbeat_init(&hb, "fake-prefill",
                                      f->task_id != 0, 0, false);
            workerproc_send_heartbeat(f->sock, &hb);
            f->last_hb_ns = bt_time_ns();
        }
        (void)zmq_poll(&it, 1, 10);
        while (proto_control_recv(f->sock, &m) == BT_OK) {
            if (m->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK) {
                if (m->register_ack->reregister)
                    fake_register(f);
                else if (m->register_ack->refused == NULL)
                    f->registered = true;
            }
            if (m->body_case == BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK &&
                m->prefill_task->grant != NULL) {
                const Baton__KvGrant *g = m->prefill_task->grant;
                f->task_id = m->prefill_task->request_id;
                f->task_epoch = g->epoch;
                f->cap_len = 0;
                if (g->has_capability &&
                    g->capability.len == PROTO_CAPABILITY_BYTES) {
                    memcpy(f->cap, g->capability.data, sizeof(f->cap));
                    f->cap_len = sizeof(f->cap);
                }
                fake_keep(f->route, sizeof(f->route), &f->route_len,
                          m->prefill_task->route != NULL &&
                              m->prefill_task->route->has_desc,
                          m->prefill_task->route != NULL
                              ? &m->prefill_task->route->desc : NULL);
                fake_keep(f->window, sizeof(f->window), &f->window_len,
                          g->has_ucx_window, &g->ucx_window);
            }
            proto_control_free(&m);
        }
        bt_error_clear();
    }
}

/* Connects the fake to the router's control endpoint, registers it and
 * pumps it until the router (asked through the client `adm`) knows it and
 * one decode worker; fails the test when that takes more than `ms`. */
__attribute__((unused)) static void fake_start(fake_prefill_t *f,
                                               const char *control,
                                               client_t *adm, int ms)
{
    BT_ASSERT_OK(workerproc_connect(control, "fake-prefill", &f->ctx,
                                    &f->sock));
    fake_register(f);
    for (int t = 0;; t += 50) {
        cu_status_t st;
        if (f->registered && cu_status(adm, &st) == 0 &&
            st.n_prefill == 1 && st.n_decode == 1)
            break;
        if (t >= ms)
            BT_TEST_FAIL("the fake prefill worker and the decode worker "
                         "did not register within %d ms", ms);
        fake_pump(f, 50);
    }
}

/* Pumps the fake until a PrefillTask other than `old` (a request id, 0:
 * none yet) reached it; fails the test after `ms`. */
__attribute__((unused)) static void fake_wait_task(fake_prefill_t *f,
                                                   uint64_t old, int ms)
{
    for (int t = 0; f->task_id == old; t += 20) {
        if (t > ms)
            BT_TEST_FAIL("no PrefillTask reached the fake prefill worker "
                         "within %d ms", ms);
        fake_pump(f, 20);
    }
}

#endif /* BT_TESTS_CLUSTER_FAKE_PREFILL_H */
