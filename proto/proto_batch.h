/*
 * proto_batch.h - many protocol messages in one ZeroMQ message (issue
 * 42).  CURVE's cost is per ZeroMQ message (one XSalsa20-Poly1305 box
 * and its buffers per message and hop), so the hot path sends one
 * message per loop turn instead of one per request: a ControlBatch from
 * a decode worker's step, a ClientBatch per client connection from the
 * router's loop turn.
 *
 * A proto_batch_t collects messages packed as they are added (the
 * caller's fields may point into buffers that change right after), in
 * order.  Sending it sends the single message as itself, or the batch
 * envelope holding them all.  Not thread-safe; an embedded object
 * (proto_batch_init / proto_batch_cleanup).
 */
#ifndef BT_PROTO_PROTO_BATCH_H
#define BT_PROTO_PROTO_BATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "proto_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds of one batch: an add that would pass them sends what the
 * batch holds first (proto_batch_is_full), so a batch stays far below
 * PROTO_CLIENT_MAX_BYTES and the receivers' per-batch limits. */
#define PROTO_BATCH_MAX_MSGS 1024
#define PROTO_BATCH_MAX_BYTES (1u << 20)

typedef struct {
    uint8_t *buf;             /* (len, cap) the packed messages, in order */
    size_t len;
    size_t cap;
    ProtobufCBinaryData *ents; /* (n) each message's slice; .data is set
                                * only while sending (buf may move) */
    size_t n;
    size_t cap_ents;
} proto_batch_t;

void proto_batch_init(proto_batch_t *b);
void proto_batch_cleanup(proto_batch_t *b);

/* True when a message of `len` packed bytes does not fit in `b` any
 * more (send it first). */
bool proto_batch_is_full(const proto_batch_t *b, size_t len);

/* Stamps the protocol version on `msg`, packs it and appends it.  The
 * message is not kept: its fields may change after the call.
 * BT_ERR_NO_MEMORY (nothing added). */
bt_status_t proto_batch_add_client(proto_batch_t *b,
                                   Baton__ClientMessage *msg);
bt_status_t proto_batch_add_control(proto_batch_t *b,
                                    Baton__ControlMessage *msg);

/* Sends what `b` holds as one ZeroMQ message (routing id frame first
 * when id != NULL): one message as itself, more as a ClientBatch /
 * ControlBatch; `batched` false sends each message alone, in order (a
 * peer that does not take batches).  Empties `b` either way (its memory
 * is kept for the next turn).  Returns the first failure. */
bt_status_t proto_batch_send_client(proto_batch_t *b, void *sock,
                                    const void *id, size_t id_len,
                                    bool batched);
bt_status_t proto_batch_send_control(proto_batch_t *b, void *sock,
                                     const void *id, size_t id_len,
                                     bool batched);

#ifdef __cplusplus
}
#endif
#endif /* BT_PROTO_PROTO_BATCH_H */
