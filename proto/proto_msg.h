/*
 * proto_msg.h - baton's two envelopes (ClientMessage, ControlMessage):
 * decode with version check and body validation, send with the version
 * stamped, and small reply builders.  The generated protobuf-c code
 * (client.pb-c.h, control.pb-c.h) is produced at build time from
 * proto/client.proto and proto/control.proto.
 *
 * Everything decoded here came from the network: it is validated and an
 * error is returned, never asserted.
 */
#ifndef BT_PROTO_PROTO_MSG_H
#define BT_PROTO_PROTO_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "client.pb-c.h"
#include "control.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The protocol version every message carries. */
#define BT_PROTO_VERSION 1

/* Sizes a peer may send.  Larger values are rejected as malformed. */
#define PROTO_CLIENT_MAX_BYTES (16u << 20)
#define PROTO_CONTROL_MAX_BYTES (256u << 20)
#define PROTO_MAX_PROMPT_TOKENS (1 << 20)
#define PROTO_MAX_STOP 64
#define PROTO_MAX_STOP_BYTES 256
#define PROTO_MAX_TENANT 64        /* GenerateRequest.tenant bytes */
#define PROTO_MAX_CACHE_SALT 64    /* GenerateRequest.cache_salt bytes */
#define PROTO_MAX_GRAMMAR (1 << 16) /* GenerateRequest.grammar bytes */
#define PROTO_MAX_TENANT_WEIGHT 1000
#define PROTO_CAPABILITY_BYTES 16  /* KvGrant.capability */

/* Decodes a client message.  BT_ERR_FORMAT when it does not parse or has
 * no body (nothing returned); BT_ERR_UNSUPPORTED when its version is not
 * BT_PROTO_VERSION (the message is returned in *msg_p so that the caller
 * can name the request in its reply).  `err` receives a reason. */
bt_status_t proto_client_decode(const void *data, size_t len,
                                Baton__ClientMessage **msg_p, char *err,
                                size_t err_len);
void proto_client_free(Baton__ClientMessage **msg_p);

/* Same for control messages. */
bt_status_t proto_control_decode(const void *data, size_t len,
                                 Baton__ControlMessage **msg_p, char *err,
                                 size_t err_len);
void proto_control_free(Baton__ControlMessage **msg_p);

/* Stamps the version and sends (routing id frame first when id != NULL). */
bt_status_t proto_client_send(void *sock, const void *id, size_t id_len,
                              Baton__ClientMessage *msg);
bt_status_t proto_control_send(void *sock, const void *id, size_t id_len,
                               Baton__ControlMessage *msg);

/* Sends an Error reply for client request `rid`. */
bt_status_t proto_client_send_error(void *sock, const void *id,
                                    size_t id_len, uint64_t rid,
                                    Baton__ErrorCode code, const char *fmt,
                                    ...) __attribute__((format(printf, 6, 7)));

/* Checks the fields of a GenerateRequest that do not need the model and
 * are not the parameter contract's: the prompt, sizes of the stop lists
 * on the wire, tenant fields, the precision class.  Sampling and stop
 * values are checked by params/params_proto.h's params_from_generate
 * (the one validator).
 * BT_ERR_INVALID_ARG with a reason in `err`. */
bt_status_t proto_generate_validate(const Baton__GenerateRequest *req,
                                    char *err, size_t err_len);

/* The precision classes a request may ask for (GenerateRequest.precision)
 * and a worker may register (Register.precision), as the error messages
 * list them. */
#define PROTO_PRECISIONS "f32, bf16, fp8"

/* The canonical (static) spelling of precision class `name`: "" for NULL
 * or "" (any), "f32", "bf16" or "fp8"; NULL for anything else. */
const char *proto_precision_find(const char *name);

/* Maps a status to the client error code that best describes it. */
Baton__ErrorCode proto_error_code(bt_status_t status);

/* The null model (--null-model workers): a deterministic "next token"
 * of the previous token and its position, never 0..2, so cluster tests
 * and overhead benchmarks run without weights and still check exact,
 * resumable streams. */
#define PROTO_NULL_VOCAB 512
#define PROTO_NULL_CONTEXT 4096
static inline int proto_null_next_token(int prev, int pos)
{
    uint32_t h = (uint32_t)prev * 2654435761u + (uint32_t)pos * 40503u;
    return 3 + (int)((h >> 7) % (PROTO_NULL_VOCAB - 3));
}

/* Receives one control message from a DEALER (one frame) without
 * waiting.  BT_ERR_TIMEOUT when none is queued; BT_ERR_FORMAT for an
 * undecodable one (logged and dropped). */
bt_status_t proto_control_recv(void *sock, Baton__ControlMessage **msg_p);

/* A name for a control body case (logs). */
const char *proto_control_body_name(Baton__ControlMessage__BodyCase body);

#ifdef __cplusplus
}
#endif
#endif /* BT_PROTO_PROTO_MSG_H */
