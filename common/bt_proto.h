/*
 * bt_proto.h - protobuf-c helpers shared by every process: an allocator
 * that goes through bt_malloc (so decoded messages count in the leak
 * report), checked unpack, and pack-and-send over ZeroMQ.
 *
 * These work on any generated message through protobuf-c's generic API;
 * the baton envelopes (version check, body validation) are in
 * proto/proto_msg.h.
 */
#ifndef BT_COMMON_PROTO_H
#define BT_COMMON_PROTO_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The allocator decoded messages use (bt_malloc, name "protobuf"). */
ProtobufCAllocator *bt_proto_allocator(void);

/* Decodes `len` bytes as a `desc` message.  BT_ERR_FORMAT when the bytes
 * do not parse or exceed `max_len` (0 = no limit).  Free the result with
 * bt_proto_free().  Does not log (input from the network is routine). */
bt_status_t bt_proto_unpack(const ProtobufCMessageDescriptor *desc,
                            const void *data, size_t len, size_t max_len,
                            ProtobufCMessage **msg_p);

/* Frees a message from bt_proto_unpack; NULL-safe; sets *msg_p to NULL. */
void bt_proto_free(ProtobufCMessage **msg_p);

/* Packs `msg` and sends it as the last frame of a message, preceded by a
 * routing-id frame when `id` is not NULL (ROUTER sockets).  `flags` may
 * hold ZMQ_DONTWAIT.  BT_ERR_NET when ZeroMQ refuses it. */
bt_status_t bt_proto_send(void *sock, const void *id, size_t id_len,
                          const ProtobufCMessage *msg, int flags);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_PROTO_H */
