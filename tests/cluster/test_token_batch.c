/*
 * test_token_batch.c - a decode worker's ControlBatch of TokenOuts (issue
 * 42) is judged entry by entry: fencing drops the stale entry, never the
 * batch, and never appends it.
 *
 * This process plays the decode worker (workerproc's helpers over a real
 * DEALER) beside a real router and a real null-model prefill worker; a
 * real client submits three requests A, B, C (3 tokens each; the first
 * comes from the prefill worker).  Once the fake holds all three
 * (KvReady), it sends:
 *   batch 1: A (id 100), B with another grant's epoch (id 101), an entry
 *            that does not decode, C (id 102);
 *   batch 2: A (id 103, finish), B with its own epoch (id 104), C (id
 *            105, finish);
 *   batch 3: B (id 106, finish).
 * The client must see A = [first, 100, 103], C = [first, 102, 105] and
 * B = [first, 104, 106]: the stale entry reached nobody, the garbage
 * entry changed nothing, and the entries around both were relayed.
 * The RegisterAck must have offered batches.
 */
#include <zmq.h>

#include "bt_error.h"
#include "cluster_util.h"
#include "proto_batch.h"
#include "workerproc.h"

#define N_REQ 3

typedef struct {
    void *ctx;
    void *sock;
    bool registered;
    bool batches;            /* RegisterAck.batches */
    uint64_t last_hb_ns;
    uint64_t next_epoch;
    int n_ready;
    uint64_t ids[N_REQ];     /* KvReady request ids, in arrival order */
    uint64_t epochs[N_REQ];
    uint32_t n_gen[N_REQ];   /* KvReady.n_generated */
} fake_decode_t;

static void fake_register(fake_decode_t *f)
{
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_DECODE, .name = "fake-decode",
        .vocab = PROTO_NULL_VOCAB, .max_context = PROTO_NULL_CONTEXT,
        .host_id = "fake-host",
    };
    workerproc_register_t r;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;

    workerproc_register_init(&r, &rc);
    r.reg.has_batches = 0; /* fake_pump takes one message at a time */
    lay.has_n_blocks = 1;
    lay.n_blocks = 1024;
    lay.has_block_size = 1;
    lay.block_size = 16;
    r.reg.kv_layout = &lay;
    workerproc_send_register(f->sock, &r.reg);
}

/* Grants every reservation (epochs of its own, a fixed capability). */
static void fake_grant(fake_decode_t *f, const Baton__KvReserve *rs)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvGrant g = BATON__KV_GRANT__INIT;
    Baton__KvLayout lay = BATON__KV_LAYOUT__INIT;
    static uint8_t cap[PROTO_CAPABILITY_BYTES] = { 1, 2, 3 };
    int32_t blocks[64];
    int need = BT_DIV_UP((int)rs->max_total_tokens, 16);

    BT_CHECK(need > 0 && need <= 64);
    for (int i = 0; i < need; i++)
        blocks[i] = (int32_t)(f->next_epoch % 16) * 64 + i;
    g.has_request_id = 1;
    g.request_id = rs->request_id;
    g.has_ok = 1;
    g.ok = 1;
    g.n_block_ids = (size_t)need;
    g.block_ids = blocks;
    g.has_epoch = 1;
    g.epoch = f->next_epoch++;
    g.has_capability = 1;
    g.capability.data = cap;
    g.capability.len = sizeof(cap);
    g.has_attempt = rs->has_attempt;
    g.attempt = rs->attempt;
    g.has_free_blocks = 1;
    g.free_blocks = 512;
    lay.has_n_blocks = 1;
    lay.n_blocks = 1024;
    lay.has_block_size = 1;
    lay.block_size = 16;
    g.kv_layout = &lay;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_GRANT;
    msg.kv_grant = &g;
    workerproc_send(f->sock, &msg);
}

/* Serves the fake's control socket for `ms`: acks, heartbeats, grants,
 * and the KvReady messages (kept in f). */
static void fake_pump(fake_decode_t *f, int ms)
{
    uint64_t end = bt_time_ns() + (uint64_t)ms * 1000000ull;

    while (bt_time_ns() < end) {
        Baton__ControlMessage *m = NULL;
        zmq_pollitem_t it = { f->sock, 0, ZMQ_POLLIN, 0 };

        if (f->registered && bt_time_ns() - f->last_hb_ns > 100000000ull) {
            Baton__Heartbeat hb;
            workerproc_heartbeat_init(&hb, "fake-decode", (uint32_t)f->n_ready,
                                      0, false);
            hb.has_free_kv_blocks = 1;
            hb.free_kv_blocks = 512;
            hb.has_total_kv_blocks = 1;
            hb.total_kv_blocks = 1024;
            workerproc_send_heartbeat(f->sock, &hb);
            f->last_hb_ns = bt_time_ns();
        }
        (void)zmq_poll(&it, 1, 10);
        while (proto_control_recv(f->sock, &m) == BT_OK) {
            switch (m->body_case) {
            case BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK:
                if (m->register_ack->reregister) {
                    fake_register(f);
                } else if (m->register_ack->refused == NULL) {
                    f->registered = true;
                    f->batches = m->register_ack->has_batches &&
                                 m->register_ack->batches;
                }
                break;
            case BATON__CONTROL_MESSAGE__BODY_KV_RESERVE:
                fake_grant(f, m->kv_reserve);
                break;
            case BATON__CONTROL_MESSAGE__BODY_KV_READY:
                BT_CHECK(f->n_ready < N_REQ);
                f->ids[f->n_ready] = m->kv_ready->request_id;
                f->epochs[f->n_ready] = m->kv_ready->epoch;
                f->n_gen[f->n_ready] = m->kv_ready->n_generated;
                f->n_ready++;
                break;
            default:
                break;
            }
            proto_control_free(&m);
        }
        bt_error_clear();
    }
}

/* Adds a TokenOut of request slot k (ids[0] at the next index) to b. */
static void add_out(proto_batch_t *b, const fake_decode_t *f, int k,
                    uint64_t epoch, int32_t id, uint32_t index, bool finish)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__TokenOut out = BATON__TOKEN_OUT__INIT;

    out.has_request_id = 1;
    out.request_id = f->ids[k];
    out.has_epoch = 1;
    out.epoch = epoch;
    out.has_index = 1;
    out.index = index;
    out.n_ids = 1;
    out.ids = &id;
    if (finish) {
        out.has_finish = 1;
        out.finish = BATON__FINISH_REASON__FINISH_LENGTH;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_TOKEN_OUT;
    msg.token_out = &out;
    BT_ASSERT_OK(proto_batch_add_control(b, &msg));
}

/* Sends b as one ControlBatch with a garbage entry inserted at `at`
 * (-1: none). */
static void send_batch(fake_decode_t *f, proto_batch_t *b, int at)
{
    static uint8_t garbage[5] = { 0xff, 0xff, 0xff, 0xff, 0xff };
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__ControlBatch batch = BATON__CONTROL_BATCH__INIT;
    ProtobufCBinaryData ents[8];
    size_t off = 0, n = 0;

    BT_CHECK(b->n < 8);
    for (size_t i = 0; i < b->n; i++) {
        if ((int)i == at) {
            ents[n].data = garbage;
            ents[n++].len = sizeof(garbage);
        }
        ents[n].data = b->buf + off;
        ents[n++].len = b->ents[i].len;
        off += b->ents[i].len;
    }
    batch.n_msgs = n;
    batch.msgs = ents;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_BATCH;
    msg.batch = &batch;
    workerproc_send(f->sock, &msg);
    b->n = 0;
    b->len = 0;
}

typedef struct {
    uint64_t rid;
    int ids[8];
    int n;
    bool finished;
} stream_t;

/* Collects the client's replies for `ms` while pumping the fake. */
static void collect(client_t *c, fake_decode_t *f, stream_t *s, int ms)
{
    for (int t = 0; t < ms; t += 10) {
        Baton__ClientMessage *m = NULL;
        fake_pump(f, 5);
        if (client_recv(c, 5, &m) != BT_OK) {
            bt_error_clear();
            continue;
        }
        for (int k = 0; k < N_REQ; k++) {
            if (client_msg_request_id(m) != s[k].rid)
                continue;
            if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
                BT_ASSERT_EQ(m->chunk->index, (uint32_t)s[k].n);
                for (size_t i = 0; i < m->chunk->n_ids && s[k].n < 8; i++)
                    s[k].ids[s[k].n++] = m->chunk->ids[i];
            } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
                s[k].finished = true;
            } else {
                BT_TEST_FAIL("request %d: reply of kind %d", k,
                             (int)m->body_case);
            }
        }
        proto_client_free(&m);
    }
}

int main(void)
{
    fake_decode_t f;
    client_t *c = NULL, *ctl = NULL;
    client_request_t req;
    char listen[64], control[64];
    stream_t s[N_REQ]; /* the client's view of A, B, C */
    proto_batch_t b;
    stream_t *a = &s[0], *bb = &s[1], *cc = &s[2];

    cu_init();
    memset(&f, 0, sizeof(f));
    memset(s, 0, sizeof(s));
    f.next_epoch = 1000;
    proto_batch_init(&b);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "20",
             "--phase-ms", "20000", NULL);
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    BT_ASSERT_OK(workerproc_connect(control, "fake-decode", &f.ctx, &f.sock));
    fake_register(&f);
    for (int t = 0;; t++) {
        cu_status_t st;
        if (f.registered && cu_status(ctl, &st) == 0 && st.n_prefill == 1 &&
            st.n_decode == 1)
            break;
        if (t == 200)
            BT_TEST_FAIL("the fake decode worker and p0 did not register");
        fake_pump(&f, 50);
    }
    BT_CHECK(f.batches);

    client_request_init(&req);
    req.prompt = "hello";
    req.max_tokens = 3;
    req.ignore_eos = true;
    for (int k = 0; k < N_REQ; k++)
        BT_ASSERT_OK(client_submit(c, &req, &s[k].rid));
    /* the first token of each comes from p0 */
    for (int t = 0; f.n_ready < N_REQ; t++) {
        if (t == 1000)
            BT_TEST_FAIL("only %d of %d requests reached the fake",
                         f.n_ready, N_REQ);
        collect(c, &f, s, 10);
    }
    collect(c, &f, s, 200);
    for (int k = 0; k < N_REQ; k++) {
        BT_ASSERT_EQ(f.n_gen[k], 1u);
        BT_ASSERT_EQ(s[k].n, 1);
    }
    /* The fake's slot k is the client's request k: router ids grow in
     * admission (= submit) order, and the KvReady messages came in it. */
    BT_CHECK(f.ids[0] < f.ids[1] && f.ids[1] < f.ids[2]);

    /* batch 1: A, B stale, garbage, C */
    add_out(&b, &f, 0, f.epochs[0], 100, 1, false);
    add_out(&b, &f, 1, f.epochs[1] + 77, 101, 1, false);
    add_out(&b, &f, 2, f.epochs[2], 102, 1, false);
    send_batch(&f, &b, 2);
    collect(c, &f, s, 300);
    BT_ASSERT_EQ(a->n, 2);
    BT_ASSERT_EQ(a->ids[1], 100);
    BT_ASSERT_EQ(bb->n, 1); /* the stale entry reached nobody */
    BT_ASSERT_EQ(cc->n, 2);
    BT_ASSERT_EQ(cc->ids[1], 102);

    /* batch 2: A ends, B with its own epoch, C ends */
    add_out(&b, &f, 0, f.epochs[0], 103, 2, true);
    add_out(&b, &f, 1, f.epochs[1], 104, 1, false);
    add_out(&b, &f, 2, f.epochs[2], 105, 2, true);
    send_batch(&f, &b, -1);
    /* batch 3: B ends */
    add_out(&b, &f, 1, f.epochs[1], 106, 2, true);
    send_batch(&f, &b, -1);
    collect(c, &f, s, 500);
    BT_CHECK(a->finished && bb->finished && cc->finished);
    BT_ASSERT_EQ(a->n, 3);
    BT_ASSERT_EQ(a->ids[2], 103);
    BT_ASSERT_EQ(bb->n, 3);
    BT_ASSERT_EQ(bb->ids[1], 104);
    BT_ASSERT_EQ(bb->ids[2], 106);
    BT_ASSERT_EQ(cc->n, 3);
    BT_ASSERT_EQ(cc->ids[2], 105);

    proto_batch_cleanup(&b);
    workerproc_send_shutdown(f.sock, "fake-decode");
    workerproc_close(&f.ctx, &f.sock);
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/token_batch: a stale TokenOut in a batch is "
                 "dropped alone, the others are relayed");
    return 0;
}
