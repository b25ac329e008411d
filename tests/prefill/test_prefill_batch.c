/*
 * test_prefill_batch.c - baton-prefill sends a loop turn's PrefillDones
 * as one ControlBatch when the router takes batches (issue 42), and one
 * by one when it does not.
 *
 * This process plays the router (a ROUTER socket on loopback) for a real
 * null-model baton-prefill.  It acknowledges the Register, then sends
 * N_TASKS PrefillTasks plus one without a KV grant, all in one
 * ControlBatch, so the worker handles them in one turn.  Every task must
 * be answered exactly once: the grant-less one with a failure, the others
 * with the null model's first token and their grant's epoch.  With
 * RegisterAck.batches the N_TASKS successes must arrive in one message;
 * without, each alone.  Every wait has a deadline.
 */
#include <zmq.h>

#include "bt_error.h"
#include "cluster/cluster_util.h"
#include "proto_batch.h"
#include "proto_msg.h"

#define N_TASKS 8
#define BAD_ID 999 /* the task without a grant */

typedef struct {
    void *ctx;
    void *sock;
    uint8_t id[256]; /* the worker's routing id */
    size_t id_len;
    uint64_t session;
    int n_ok[N_TASKS];     /* successes per task */
    int n_bad;             /* failures of BAD_ID */
    int n_other;           /* anything else wrong */
    int max_per_msg;       /* most PrefillDones in one ZeroMQ message */
    int n_msgs;            /* ZeroMQ messages that carried PrefillDones */
} fake_router_t;

/* Receives one message (routing id, body) within `ms`; false: none. */
static bool recv_msg(fake_router_t *f, int ms, Baton__ControlMessage **m_p)
{
    zmq_pollitem_t it = { f->sock, 0, ZMQ_POLLIN, 0 };
    zmq_msg_t id, body;
    char err[256];
    bool ok;

    if (zmq_poll(&it, 1, ms) <= 0)
        return false;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    BT_CHECK(zmq_msg_recv(&id, f->sock, 0) >= 0);
    BT_CHECK(zmq_msg_more(&id));
    BT_CHECK(zmq_msg_recv(&body, f->sock, 0) >= 0);
    BT_CHECK(zmq_msg_size(&id) <= sizeof(f->id));
    f->id_len = zmq_msg_size(&id);
    memcpy(f->id, zmq_msg_data(&id), f->id_len);
    ok = proto_control_decode(zmq_msg_data(&body), zmq_msg_size(&body), m_p,
                              err, sizeof(err)) == BT_OK;
    if (!ok)
        BT_LOG_WARN("TEST", "undecodable message: %s", err);
    zmq_msg_close(&body);
    zmq_msg_close(&id);
    return ok;
}

static void on_done(fake_router_t *f, const Baton__PrefillDone *d)
{
    int k = (int)d->request_id - 1;

    if (d->request_id == BAD_ID && d->has_ok && !d->ok) {
        f->n_bad++;
        return;
    }
    if (k < 0 || k >= N_TASKS || !d->ok || d->epoch != 100u + (uint64_t)k ||
        !d->has_first_token || d->n_prompt_ids != 3 ||
        d->first_token != proto_null_next_token(d->prompt_ids[2], 3)) {
        f->n_other++;
        return;
    }
    f->n_ok[k]++;
}

/* Counts the PrefillDones in `m` (alone or a ControlBatch's entries). */
static void on_msg(fake_router_t *f, const Baton__ControlMessage *m)
{
    int n = 0;

    if (m->body_case == BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE) {
        on_done(f, m->prefill_done);
        n = 1;
    } else if (m->body_case == BATON__CONTROL_MESSAGE__BODY_BATCH) {
        for (size_t i = 0; i < m->batch->n_msgs; i++) {
            Baton__ControlMessage *e = NULL;
            char err[256];
            BT_CHECK(proto_control_decode(m->batch->msgs[i].data,
                                          m->batch->msgs[i].len, &e, err,
                                          sizeof(err)) == BT_OK);
            if (e->body_case == BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE) {
                on_done(f, e->prefill_done);
                n++;
            }
            proto_control_free(&e);
        }
    }
    if (n > 0) {
        f->n_msgs++;
        f->max_per_msg = BT_MAX(f->max_per_msg, n);
    }
}

/* Waits for the worker's Register and acknowledges it. */
static void register_worker(fake_router_t *f, bool batches)
{
    uint64_t deadline = bt_time_ns() + 20ull * 1000000000ull;

    while (bt_time_ns() < deadline) {
        Baton__ControlMessage *m = NULL;
        if (!recv_msg(f, 100, &m))
            continue;
        if (m->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER) {
            Baton__ControlMessage out = BATON__CONTROL_MESSAGE__INIT;
            Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;
            BT_CHECK(m->register_->has_batches && m->register_->batches);
            ack.heartbeat_ms = 100;
            ack.has_session = 1;
            ack.session = m->register_->session;
            ack.has_router_instance = 1;
            ack.router_instance = 42;
            ack.has_batches = batches;
            ack.batches = batches;
            out.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
            out.register_ack = &ack;
            BT_ASSERT_OK(proto_control_send(f->sock, f->id, f->id_len, &out));
            proto_control_free(&m);
            return;
        }
        proto_control_free(&m);
    }
    BT_TEST_FAIL("no Register within 20 s");
}

/* Adds PrefillTask `id` (a grant of epoch `epoch`; none when 0). */
static void add_task(proto_batch_t *b, uint64_t id, uint64_t epoch)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillTask t = BATON__PREFILL_TASK__INIT;
    Baton__KvGrant g = BATON__KV_GRANT__INIT;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;
    int32_t prompt[3] = { 5, 7, (int32_t)(10 + id % 100) };
    int blocks[1] = { (int)id };
    uint8_t cap[16] = { 1 };

    t.has_request_id = 1;
    t.request_id = id;
    t.n_prompt_ids = 3;
    t.prompt_ids = prompt;
    if (epoch != 0) {
        g.has_request_id = 1;
        g.request_id = id;
        g.has_ok = 1;
        g.ok = 1;
        g.has_epoch = 1;
        g.epoch = epoch;
        g.n_block_ids = 1;
        g.block_ids = blocks;
        g.has_capability = 1;
        g.capability.data = cap;
        g.capability.len = sizeof(cap);
        lay.has_block_size = 1;
        lay.block_size = 16;
        g.kv_layout = &lay;
        t.grant = &g;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_TASK;
    msg.prefill_task = &t;
    BT_ASSERT_OK(proto_batch_add_control(b, &msg));
}

static void run(bool batches)
{
    fake_router_t f;
    char addr[64], name[64];
    proto_batch_t b;
    uint64_t deadline;
    bool all = false;

    memset(&f, 0, sizeof(f));
    snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", cu_free_port());
    snprintf(name, sizeof(name), "pbatch-%d", batches);
    f.ctx = zmq_ctx_new();
    f.sock = zmq_socket(f.ctx, ZMQ_ROUTER);
    BT_CHECK(f.sock != NULL && zmq_bind(f.sock, addr) == 0);
    cu_spawn("baton-prefill", "--null-model", "--router", addr, "--name",
             name, NULL);
    register_worker(&f, batches);

    proto_batch_init(&b);
    for (int k = 0; k < N_TASKS; k++)
        add_task(&b, (uint64_t)k + 1, 100u + (uint64_t)k);
    add_task(&b, BAD_ID, 0);
    BT_ASSERT_OK(proto_batch_send_control(&b, f.sock, f.id, f.id_len, true));
    proto_batch_cleanup(&b);

    deadline = bt_time_ns() + 10ull * 1000000000ull;
    while (!all && bt_time_ns() < deadline) {
        Baton__ControlMessage *m = NULL;
        if (!recv_msg(&f, 100, &m))
            continue;
        on_msg(&f, m);
        proto_control_free(&m);
        all = f.n_bad >= 1;
        for (int k = 0; k < N_TASKS; k++)
            all = all && f.n_ok[k] >= 1;
    }
    /* anything late (a duplicate) still counts */
    for (Baton__ControlMessage *m = NULL; recv_msg(&f, 200, &m);) {
        on_msg(&f, m);
        proto_control_free(&m);
    }
    printf("batches %d: %d PrefillDone messages, at most %d in one\n",
           batches, f.n_msgs, f.max_per_msg);
    BT_CHECK(all);
    BT_ASSERT_EQ(f.n_other, 0);
    BT_ASSERT_EQ(f.n_bad, 1);
    for (int k = 0; k < N_TASKS; k++)
        BT_ASSERT_EQ(f.n_ok[k], 1);
    if (batches)
        BT_ASSERT_EQ(f.max_per_msg, N_TASKS); /* one turn, one message */
    else
        BT_ASSERT_EQ(f.max_per_msg, 1);
    cu_kill_all();
    zmq_close(f.sock);
    zmq_ctx_term(f.ctx);
}

int main(void)
{
    cu_init();
    run(true);
    run(false);
    BT_TEST_PASS("prefill/prefill_batch: a turn's PrefillDones go out as "
                 "one ControlBatch, one by one without batches");
    return 0;
}
