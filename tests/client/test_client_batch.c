/*
 * test_client_batch.c - the client library takes the router's batched
 * replies (issue 42: ClientBatch, one ZeroMQ message per connection and
 * router loop turn) exactly as the same replies sent one by one.
 *
 * This process plays the router over a real ROUTER socket on loopback;
 * a real client_t connects to it:
 *   1. every GenerateRequest says accept_batch;
 *   2. a single reply, then a batch [chunk r2, chunk r1, Finished r1,
 *      garbage, a batch inside the batch, Error r2]: client_recv hands
 *      out the four good entries one by one in order, with their
 *      fields, after the single one; the two bad entries are dropped
 *      (logged) and change nothing else; nothing more comes;
 *   3. a batch of more entries than the router ever sends is dropped
 *      whole; the next reply still arrives.
 */
#include <string.h>
#include <zmq.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "client.h"
#include "proto_batch.h"
#include "proto_msg.h"

typedef struct {
    void *sock;        /* ROUTER the client connects to */
    uint8_t id[256];   /* (id_len) the client's routing id */
    size_t id_len;
} fake_router_t;

/* Receives one GenerateRequest (5 s at most); returns its request id. */
static uint64_t recv_generate(fake_router_t *fr)
{
    zmq_pollitem_t it = { fr->sock, 0, ZMQ_POLLIN, 0 };
    Baton__ClientMessage *m = NULL;
    bt_zmq_msg_t zm;
    char err[256];
    uint64_t rid;

    BT_CHECK(zmq_poll(&it, 1, 5000) == 1);
    BT_ASSERT_OK(bt_zmq_recv(fr->sock, 0, &zm));
    BT_ASSERT_EQ(zm.n_frames, 2);
    fr->id_len = bt_zmq_frame_size(&zm, 0);
    BT_CHECK(fr->id_len <= sizeof(fr->id));
    memcpy(fr->id, bt_zmq_frame_data(&zm, 0), fr->id_len);
    BT_ASSERT_OK(proto_client_decode(bt_zmq_frame_data(&zm, 1),
                                     bt_zmq_frame_size(&zm, 1), &m, err,
                                     sizeof(err)));
    bt_zmq_msg_close(&zm);
    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_GENERATE);
    BT_CHECK(m->generate->has_accept_batch && m->generate->accept_batch);
    rid = m->generate->client_request_id;
    proto_client_free(&m);
    return rid;
}

static void make_chunk(Baton__ClientMessage *msg, Baton__TokenChunk *c,
                       uint64_t rid, uint32_t index, int32_t *id,
                       const char *text)
{
    baton__client_message__init(msg);
    baton__token_chunk__init(c);
    c->has_client_request_id = 1;
    c->client_request_id = rid;
    c->has_index = 1;
    c->index = index;
    c->n_ids = 1;
    c->ids = id;
    if (text != NULL) {
        c->has_text = 1;
        c->text.data = (uint8_t *)text;
        c->text.len = strlen(text);
    }
    msg->version = BT_PROTO_VERSION;
    msg->body_case = BATON__CLIENT_MESSAGE__BODY_CHUNK;
    msg->chunk = c;
}

/* Packs msg into a new buffer as a batch entry (freed by the caller). */
static ProtobufCBinaryData pack_entry(Baton__ClientMessage *msg)
{
    ProtobufCBinaryData d;

    msg->version = BT_PROTO_VERSION;
    d.len = baton__client_message__get_packed_size(msg);
    d.data = bt_malloc(d.len, "test_entry");
    BT_CHECK(d.data != NULL);
    baton__client_message__pack(msg, d.data);
    return d;
}

static void send_batch(fake_router_t *fr, ProtobufCBinaryData *ents,
                       size_t n)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__ClientBatch b = BATON__CLIENT_BATCH__INIT;

    b.n_msgs = n;
    b.msgs = ents;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_BATCH;
    msg.batch = &b;
    BT_ASSERT_OK(proto_client_send(fr->sock, fr->id, fr->id_len, &msg));
}

/* The next message client_recv hands out (2 s at most). */
static Baton__ClientMessage *next_msg(client_t *c)
{
    Baton__ClientMessage *m = NULL;

    BT_ASSERT_OK(client_recv(c, 2000, &m));
    return m;
}

static void expect_chunk(client_t *c, uint64_t rid, uint32_t index, int id,
                         const char *text)
{
    Baton__ClientMessage *m = next_msg(c);

    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_CHUNK);
    BT_ASSERT_EQ(m->chunk->client_request_id, rid);
    BT_ASSERT_EQ(m->chunk->index, index);
    BT_ASSERT_EQ(m->chunk->n_ids, 1);
    BT_ASSERT_EQ(m->chunk->ids[0], id);
    BT_ASSERT_EQ(m->chunk->has_text, text != NULL);
    if (text != NULL) {
        BT_ASSERT_EQ(m->chunk->text.len, strlen(text));
        BT_CHECK(memcmp(m->chunk->text.data, text, strlen(text)) == 0);
    }
    proto_client_free(&m);
}

static void expect_nothing(client_t *c, int ms)
{
    Baton__ClientMessage *m = NULL;
    bt_status_t status = client_recv(c, ms, &m);

    if (status == BT_OK)
        BT_TEST_FAIL("unexpected reply of kind %d", (int)m->body_case);
    BT_ASSERT_EQ(status, BT_ERR_TIMEOUT);
}

int main(void)
{
    fake_router_t fr;
    client_t *c = NULL;
    client_request_t req;
    void *ctx = zmq_ctx_new();
    char ep[128];
    size_t ep_len = sizeof(ep);
    uint64_t r1, r2, r3, got1, got2;
    int32_t ids[3] = { 5, 6, 7 };
    uint8_t garbage[7] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
    ProtobufCBinaryData ents[8], *many;
    Baton__ClientMessage msg;
    Baton__TokenChunk ch;
    Baton__Finished fin = BATON__FINISHED__INIT;
    Baton__Error er = BATON__ERROR__INIT;
    Baton__ClientBatch nested = BATON__CLIENT_BATCH__INIT;
    Baton__ClientMessage *m;
    size_t n_many = PROTO_BATCH_MAX_MSGS + 1;

    bt_log_init("test");
    memset(&fr, 0, sizeof(fr));
    fr.sock = zmq_socket(ctx, ZMQ_ROUTER);
    BT_CHECK(fr.sock != NULL);
    BT_CHECK(zmq_bind(fr.sock, "tcp://127.0.0.1:*") == 0);
    BT_CHECK(zmq_getsockopt(fr.sock, ZMQ_LAST_ENDPOINT, ep, &ep_len) == 0);
    BT_ASSERT_OK(client_create(ep, &c));

    /* 1 */
    client_request_init(&req);
    req.prompt = "hi";
    BT_ASSERT_OK(client_submit(c, &req, &r1));
    BT_ASSERT_OK(client_submit(c, &req, &r2));
    got1 = recv_generate(&fr);
    got2 = recv_generate(&fr);
    BT_ASSERT_EQ(got1, r1);
    BT_ASSERT_EQ(got2, r2);

    /* 2: a single reply, then the batch */
    make_chunk(&msg, &ch, r1, 0, &ids[0], NULL);
    BT_ASSERT_OK(proto_client_send(fr.sock, fr.id, fr.id_len, &msg));
    make_chunk(&msg, &ch, r2, 0, &ids[1], "b");
    ents[0] = pack_entry(&msg);
    make_chunk(&msg, &ch, r1, 1, &ids[2], "x");
    ents[1] = pack_entry(&msg);
    baton__client_message__init(&msg);
    fin.has_client_request_id = 1;
    fin.client_request_id = r1;
    fin.has_reason = 1;
    fin.reason = BATON__FINISH_REASON__FINISH_LENGTH;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_FINISHED;
    msg.finished = &fin;
    ents[2] = pack_entry(&msg);
    ents[3].len = sizeof(garbage);
    ents[3].data = bt_malloc(sizeof(garbage), "test_entry");
    memcpy(ents[3].data, garbage, sizeof(garbage));
    /* a batch inside the batch, holding a copy of the chunk of r2 that
     * must not show twice */
    nested.n_msgs = 1;
    nested.msgs = &ents[0];
    baton__client_message__init(&msg);
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_BATCH;
    msg.batch = &nested;
    ents[4] = pack_entry(&msg);
    baton__client_message__init(&msg);
    er.has_client_request_id = 1;
    er.client_request_id = r2;
    er.has_code = 1;
    er.code = BATON__ERROR_CODE__ERROR_WORKER;
    er.message = "worker failed";
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_ERROR;
    msg.error = &er;
    ents[5] = pack_entry(&msg);
    send_batch(&fr, ents, 6);

    expect_chunk(c, r1, 0, 5, NULL);
    expect_chunk(c, r2, 0, 6, "b");
    expect_chunk(c, r1, 1, 7, "x");
    m = next_msg(c);
    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_FINISHED);
    BT_ASSERT_EQ(m->finished->client_request_id, r1);
    BT_ASSERT_EQ(m->finished->reason, BATON__FINISH_REASON__FINISH_LENGTH);
    proto_client_free(&m);
    m = next_msg(c);
    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_ERROR);
    BT_ASSERT_EQ(m->error->client_request_id, r2);
    BT_ASSERT_EQ(m->error->code, BATON__ERROR_CODE__ERROR_WORKER);
    BT_ASSERT_STREQ(m->error->message, "worker failed");
    proto_client_free(&m);
    expect_nothing(c, 300);
    for (int i = 0; i < 6; i++)
        bt_free(ents[i].data);

    /* 3: an oversized batch is dropped whole */
    BT_ASSERT_OK(client_submit(c, &req, &r3));
    BT_ASSERT_EQ(recv_generate(&fr), r3);
    make_chunk(&msg, &ch, r3, 0, &ids[0], NULL);
    ents[0] = pack_entry(&msg);
    many = bt_calloc(n_many, sizeof(*many), "test_many");
    BT_CHECK(many != NULL);
    for (size_t i = 0; i < n_many; i++)
        many[i] = ents[0];
    send_batch(&fr, many, n_many);
    bt_free(many);
    expect_nothing(c, 300);
    BT_ASSERT_OK(proto_client_send(fr.sock, fr.id, fr.id_len, &msg));
    expect_chunk(c, r3, 0, 5, NULL);
    bt_free(ents[0].data);

    client_destroy(&c);
    zmq_close(fr.sock);
    zmq_ctx_term(ctx);
    BT_TEST_PASS("client/client_batch: batched replies come out one by one "
                 "in order, bad entries and oversized batches are dropped");
    return 0;
}
