/* proto_msg.c - envelope decode/validate/send (see proto_msg.h). */
#include "proto_msg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "bt_log.h"
#include "bt_proto.h"
#include "bt_zmq.h"

bt_status_t proto_client_decode(const void *data, size_t len,
                                Baton__ClientMessage **msg_p, char *err,
                                size_t err_len)
{
    ProtobufCMessage *raw = NULL;
    Baton__ClientMessage *msg;

    if (bt_proto_unpack(&baton__client_message__descriptor, data, len,
                        PROTO_CLIENT_MAX_BYTES, &raw) != BT_OK) {
        snprintf(err, err_len, "undecodable client message (%zu bytes)",
                 len);
        return BT_ERR_FORMAT;
    }
    msg = (Baton__ClientMessage *)raw;
    if (msg->version != BT_PROTO_VERSION) {
        snprintf(err, err_len, "protocol version %u not supported (want %u)",
                 msg->version, BT_PROTO_VERSION);
        *msg_p = msg;
        return BT_ERR_UNSUPPORTED;
    }
    if (msg->body_case == BATON__CLIENT_MESSAGE__BODY__NOT_SET) {
        snprintf(err, err_len, "client message without a body");
        bt_proto_free(&raw);
        return BT_ERR_FORMAT;
    }
    *msg_p = msg;
    return BT_OK;
}

void proto_client_free(Baton__ClientMessage **msg_p)
{
    bt_proto_free((ProtobufCMessage **)msg_p);
}

bt_status_t proto_control_decode(const void *data, size_t len,
                                 Baton__ControlMessage **msg_p, char *err,
                                 size_t err_len)
{
    ProtobufCMessage *raw = NULL;
    Baton__ControlMessage *msg;

    if (bt_proto_unpack(&baton__control_message__descriptor, data, len,
                        PROTO_CONTROL_MAX_BYTES, &raw) != BT_OK) {
        snprintf(err, err_len, "undecodable control message (%zu bytes)",
                 len);
        return BT_ERR_FORMAT;
    }
    msg = (Baton__ControlMessage *)raw;
    if (msg->version != BT_PROTO_VERSION) {
        snprintf(err, err_len, "protocol version %u not supported (want %u)",
                 msg->version, BT_PROTO_VERSION);
        *msg_p = msg;
        return BT_ERR_UNSUPPORTED;
    }
    if (msg->body_case == BATON__CONTROL_MESSAGE__BODY__NOT_SET) {
        snprintf(err, err_len, "control message without a body");
        bt_proto_free(&raw);
        return BT_ERR_FORMAT;
    }
    *msg_p = msg;
    return BT_OK;
}

void proto_control_free(Baton__ControlMessage **msg_p)
{
    bt_proto_free((ProtobufCMessage **)msg_p);
}

bt_status_t proto_client_send(void *sock, const void *id, size_t id_len,
                              Baton__ClientMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    return bt_proto_send(sock, id, id_len, &msg->base, ZMQ_DONTWAIT);
}

bt_status_t proto_control_send(void *sock, const void *id, size_t id_len,
                               Baton__ControlMessage *msg)
{
    msg->version = BT_PROTO_VERSION;
    return bt_proto_send(sock, id, id_len, &msg->base, ZMQ_DONTWAIT);
}

bt_status_t proto_client_send_error(void *sock, const void *id,
                                    size_t id_len, uint64_t rid,
                                    Baton__ErrorCode code, const char *fmt,
                                    ...)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Error e = BATON__ERROR__INIT;
    char text[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    e.has_client_request_id = 1;
    e.client_request_id = rid;
    e.has_code = 1;
    e.code = code;
    e.message = text;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_ERROR;
    msg.error = &e;
    return proto_client_send(sock, id, id_len, &msg);
}

const char *proto_precision_find(const char *name)
{
    static const char *const classes[] = { "", "f32", "bf16", "fp8" };

    if (name == NULL)
        return classes[0];
    for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++)
        if (strcmp(name, classes[i]) == 0)
            return classes[i];
    return NULL;
}

bt_status_t proto_generate_validate(const Baton__GenerateRequest *req,
                                    char *err, size_t err_len)
{
    if (req->n_prompt_ids == 0 && (!req->has_prompt || req->prompt.len == 0)) {
        snprintf(err, err_len, "empty prompt");
        return BT_ERR_INVALID_ARG;
    }
    if (req->n_prompt_ids > PROTO_MAX_PROMPT_TOKENS ||
        req->prompt.len > PROTO_MAX_PROMPT_TOKENS) {
        snprintf(err, err_len, "prompt too long");
        return BT_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < req->n_prompt_ids; i++) {
        if (req->prompt_ids[i] < 0) {
            snprintf(err, err_len, "negative prompt id at %zu", i);
            return BT_ERR_INVALID_ARG;
        }
    }
    if (req->max_tokens < 0) {
        snprintf(err, err_len, "max_tokens must be >= 0 (got %d)",
                 req->max_tokens);
        return BT_ERR_INVALID_ARG;
    }
    if (req->n_stop_ids > PROTO_MAX_STOP ||
        req->n_stop_strings > PROTO_MAX_STOP) {
        snprintf(err, err_len, "too many stop conditions (max %d)",
                 PROTO_MAX_STOP);
        return BT_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < req->n_stop_strings; i++) {
        if (req->stop_strings[i].len == 0 ||
            req->stop_strings[i].len > PROTO_MAX_STOP_BYTES) {
            snprintf(err, err_len, "stop string %zu empty or too long", i);
            return BT_ERR_INVALID_ARG;
        }
    }
    if (req->tenant != NULL && strlen(req->tenant) > PROTO_MAX_TENANT) {
        snprintf(err, err_len, "tenant longer than %d bytes",
                 PROTO_MAX_TENANT);
        return BT_ERR_INVALID_ARG;
    }
    if (req->has_cache_salt && req->cache_salt.len > PROTO_MAX_CACHE_SALT) {
        snprintf(err, err_len, "cache_salt longer than %d bytes",
                 PROTO_MAX_CACHE_SALT);
        return BT_ERR_INVALID_ARG;
    }
    if (req->grammar != NULL && req->grammar[0] != '\0') {
        /* The shape only: the workers compile it (grammar_spec_parse is
         * the authority on the kinds; these are its names). */
        static const char *const kinds[] = { "json_object:", "json_schema:",
                                             "regex:", "choice:" };
        bool known = false;
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
            known |= strncmp(req->grammar, kinds[i], strlen(kinds[i])) == 0;
        if (strlen(req->grammar) > PROTO_MAX_GRAMMAR) {
            snprintf(err, err_len, "grammar longer than %d bytes",
                     PROTO_MAX_GRAMMAR);
            return BT_ERR_INVALID_ARG;
        }
        if (!known) {
            snprintf(err, err_len, "grammar must start with json_object:, "
                     "json_schema:, regex: or choice:");
            return BT_ERR_INVALID_ARG;
        }
        if (req->ignore_eos) {
            /* a finished grammar allows only EOS: ignoring it would leave
             * no token to sample */
            snprintf(err, err_len, "a grammar (structured output) cannot "
                     "be combined with ignore_eos");
            return BT_ERR_INVALID_ARG;
        }
    }
    if (proto_precision_find(req->precision) == NULL) {
        /* the class is routing, not sampling: the router picks workers
         * by it (router_pool.c) */
        snprintf(err, err_len, "precision '%.16s' is not a precision "
                 "class: use one of %s (or none for any)", req->precision,
                 PROTO_PRECISIONS);
        return BT_ERR_INVALID_ARG;
    }
    if (req->has_tenant_weight && (req->tenant_weight < 1 ||
                                   req->tenant_weight >
                                       PROTO_MAX_TENANT_WEIGHT)) {
        snprintf(err, err_len, "tenant_weight must be 1..%d",
                 PROTO_MAX_TENANT_WEIGHT);
        return BT_ERR_INVALID_ARG;
    }
    return BT_OK;
}

Baton__ErrorCode proto_error_code(bt_status_t status)
{
    switch (status) {
    case BT_OK:
        return BATON__ERROR_CODE__ERROR_NONE;
    case BT_ERR_INVALID_ARG:
        return BATON__ERROR_CODE__ERROR_INVALID;
    case BT_ERR_FORMAT:
        return BATON__ERROR_CODE__ERROR_MALFORMED;
    case BT_ERR_UNSUPPORTED:
        return BATON__ERROR_CODE__ERROR_VERSION;
    case BT_ERR_OVERLOADED:
        return BATON__ERROR_CODE__ERROR_OVERLOADED;
    case BT_ERR_TIMEOUT:
        return BATON__ERROR_CODE__ERROR_TIMEOUT;
    case BT_ERR_REMOTE:
        return BATON__ERROR_CODE__ERROR_WORKER;
    default:
        return BATON__ERROR_CODE__ERROR_INTERNAL;
    }
}

const char *proto_control_body_name(Baton__ControlMessage__BodyCase body)
{
    static const char *const names[] = {
        "none", "?", "register", "register_ack", "heartbeat", "kv_reserve",
        "kv_grant", "kv_release", "prefill_task", "prefill_done", "kv_ready",
        "token_out", "cancel_task", "task_error", "drain", "shutdown",
        "kv_peers", "heartbeat_ack", "kv_events", "kv_resync", "batch",
    };
    if ((unsigned)body < sizeof(names) / sizeof(names[0]))
        return names[body];
    return "?";
}

bt_status_t proto_control_recv(void *sock, Baton__ControlMessage **msg_p)
{
    bt_zmq_msg_t zm;
    char err[256];
    bt_status_t status;

    status = bt_zmq_recv(sock, ZMQ_DONTWAIT, &zm);
    if (status != BT_OK)
        return status;
    if (zm.n_frames != 1 || zm.n_dropped != 0) {
        bt_zmq_msg_close(&zm);
        BT_LOG_WARN("NET", "control message with %d frames dropped",
                    zm.n_frames + zm.n_dropped);
        return BT_ERR_FORMAT;
    }
    status = proto_control_decode(bt_zmq_frame_data(&zm, 0),
                                  bt_zmq_frame_size(&zm, 0), msg_p, err,
                                  sizeof(err));
    bt_zmq_msg_close(&zm);
    if (status != BT_OK) {
        BT_LOG_WARN("NET", "control message dropped: %s", err);
        if (status == BT_ERR_UNSUPPORTED)
            proto_control_free(msg_p);
        return BT_ERR_FORMAT;
    }
    return BT_OK;
}
