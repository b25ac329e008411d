/* bt_proto.c - protobuf-c allocation, unpack and send helpers. */
#include "bt_proto.h"

#include <zmq.h>

#include "bt_alloc.h"
#include "bt_zmq.h"

static void *bt_proto_alloc(void *data, size_t size)
{
    (void)data;
    return bt_malloc(size ? size : 1, "protobuf");
}

static void bt_proto_dealloc(void *data, void *ptr)
{
    (void)data;
    bt_free(ptr);
}

/* Stateless function table; never modified. */
static ProtobufCAllocator bt_proto_alloc_table = {
    .alloc = bt_proto_alloc,
    .free = bt_proto_dealloc,
    .allocator_data = NULL,
};

ProtobufCAllocator *bt_proto_allocator(void)
{
    return &bt_proto_alloc_table;
}

bt_status_t bt_proto_unpack(const ProtobufCMessageDescriptor *desc,
                            const void *data, size_t len, size_t max_len,
                            ProtobufCMessage **msg_p)
{
    ProtobufCMessage *msg;

    if (max_len != 0 && len > max_len)
        return BT_ERR_FORMAT;
    msg = protobuf_c_message_unpack(desc, bt_proto_allocator(), len,
                                    (const uint8_t *)data);
    if (msg == NULL)
        return BT_ERR_FORMAT;
    *msg_p = msg;
    return BT_OK;
}

void bt_proto_free(ProtobufCMessage **msg_p)
{
    if (*msg_p == NULL)
        return;
    protobuf_c_message_free_unpacked(*msg_p, bt_proto_allocator());
    *msg_p = NULL;
}

static void bt_proto_zmq_free(void *data, void *hint)
{
    (void)hint;
    bt_free(data);
}

bt_status_t bt_proto_send(void *sock, const void *id, size_t id_len,
                          const ProtobufCMessage *msg, int flags)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = bt_malloc(len ? len : 1, "proto_send");
    zmq_msg_t frame;

    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    protobuf_c_message_pack(msg, buf);
    if (id != NULL && zmq_send(sock, id, id_len, flags | ZMQ_SNDMORE) < 0) {
        bt_free(buf);
        return BT_ERR_NET;
    }
    /* Zero-copy hand-off: ZeroMQ frees the buffer when it is sent. */
    if (zmq_msg_init_data(&frame, buf, len, bt_proto_zmq_free, NULL) != 0) {
        bt_free(buf);
        return BT_ZMQ_ERROR("zmq_msg_init_data");
    }
    if (zmq_msg_send(&frame, sock, flags) < 0) {
        zmq_msg_close(&frame);
        return BT_ERR_NET;
    }
    return BT_OK;
}
