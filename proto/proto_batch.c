/* proto_batch.c - many messages in one ZeroMQ message (proto_batch.h). */
#include "proto_batch.h"

#include <string.h>

#include <zmq.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "bt_zmq.h"

void proto_batch_init(proto_batch_t *b)
{
    memset(b, 0, sizeof(*b));
}

void proto_batch_cleanup(proto_batch_t *b)
{
    bt_free(b->buf);
    bt_free(b->ents);
    memset(b, 0, sizeof(*b));
}

bool proto_batch_is_full(const proto_batch_t *b, size_t len)
{
    return b->n > 0 && (b->n >= PROTO_BATCH_MAX_MSGS ||
                        b->len + len > PROTO_BATCH_MAX_BYTES);
}

/* Packs `msg` and appends it. */
static bt_status_t batch_add(proto_batch_t *b, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);

    if (b->len + len > b->cap) {
        size_t cap = BT_MAX(b->cap * 2, b->len + len + 4096);
        uint8_t *buf = bt_realloc(b->buf, cap, "proto_batch");
        if (buf == NULL)
            return BT_ERR_NO_MEMORY;
        b->buf = buf;
        b->cap = cap;
    }
    if (b->n == b->cap_ents) {
        size_t cap = BT_MAX(b->cap_ents * 2, 64);
        ProtobufCBinaryData *ents =
            bt_realloc(b->ents, cap * sizeof(*ents), "proto_batch_ents");
        if (ents == NULL)
            return BT_ERR_NO_MEMORY;
        b->ents = ents;
        b->cap_ents = cap;
    }
    protobuf_c_message_pack(msg, b->buf + b->len);
    b->ents[b->n].data = NULL;
    b->ents[b->n].len = len;
    b->n++;
    b->len += len;
    return BT_OK;
}

bt_status_t proto_batch_add_client(proto_batch_t *b,
                                   Baton__ClientMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    return batch_add(b, &msg->base);
}

bt_status_t proto_batch_add_control(proto_batch_t *b,
                                    Baton__ControlMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    return batch_add(b, &msg->base);
}

/* Sends one already packed message. */
static bt_status_t send_raw(void *sock, const void *id, size_t id_len,
                            const void *data, size_t len)
{
    const void *frames[2] = { id, data };
    size_t lens[2] = { id_len, len };

    if (id == NULL)
        return bt_zmq_send_frames(sock, frames + 1, lens + 1, 1,
                                  ZMQ_DONTWAIT);
    return bt_zmq_send_frames(sock, frames, lens, 2, ZMQ_DONTWAIT);
}

/* Points every entry into buf (it no longer moves until the reset). */
static void batch_fix(proto_batch_t *b)
{
    size_t off = 0;

    for (size_t i = 0; i < b->n; i++) {
        b->ents[i].data = b->buf + off;
        off += b->ents[i].len;
    }
}

/* Sends the entries one by one when there is one or the peer takes no
 * batches; returns true when it did (status in *status_p). */
static bool send_alone(proto_batch_t *b, void *sock, const void *id,
                       size_t id_len, bool batched, bt_status_t *status_p)
{
    bt_status_t status = BT_OK;

    if (batched && b->n > 1)
        return false;
    batch_fix(b);
    for (size_t i = 0; i < b->n; i++) {
        bt_status_t s = send_raw(sock, id, id_len, b->ents[i].data,
                                 b->ents[i].len);
        if (status == BT_OK)
            status = s;
    }
    *status_p = status;
    return true;
}

bt_status_t proto_batch_send_client(proto_batch_t *b, void *sock,
                                    const void *id, size_t id_len,
                                    bool batched)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__ClientBatch batch = BATON__CLIENT_BATCH__INIT;
    bt_status_t status = BT_OK;

    if (b->n > 0 && !send_alone(b, sock, id, id_len, batched, &status)) {
        batch_fix(b);
        batch.n_msgs = b->n;
        batch.msgs = b->ents;
        msg.body_case = BATON__CLIENT_MESSAGE__BODY_BATCH;
        msg.batch = &batch;
        status = proto_client_send(sock, id, id_len, &msg);
    }
    b->n = 0;
    b->len = 0;
    return status;
}

bt_status_t proto_batch_send_control(proto_batch_t *b, void *sock,
                                     const void *id, size_t id_len,
                                     bool batched)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__ControlBatch batch = BATON__CONTROL_BATCH__INIT;
    bt_status_t status = BT_OK;

    if (b->n > 0 && !send_alone(b, sock, id, id_len, batched, &status)) {
        batch_fix(b);
        batch.n_msgs = b->n;
        batch.msgs = b->ents;
        msg.body_case = BATON__CONTROL_MESSAGE__BODY_BATCH;
        msg.batch = &batch;
        status = proto_control_send(sock, id, id_len, &msg);
    }
    b->n = 0;
    b->len = 0;
    return status;
}
