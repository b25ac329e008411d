/* client.c - the baton client library (see client.h). */
#include "client.h"

#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "bt_zmq.h"

struct client_s {
    void *ctx;        /* ZeroMQ context, owned */
    void *sock;       /* DEALER connected to the router */
    uint64_t next_id; /* next request id */
};

void client_request_init(client_request_t *req)
{
    memset(req, 0, sizeof(*req));
    req->add_bos = true;
    req->top_p = 1.0f;
    req->repetition_penalty = 1.0f;
    req->max_tokens = 0;
    req->want_text = true;
}

bt_status_t client_create(const char *endpoint, client_t **client_p)
{
    bt_zmq_socket_config_t scfg;
    client_t *client;
    bt_status_t status;

    client = bt_calloc(1, sizeof(*client), "client");
    if (client == NULL)
        return BT_ERR_NO_MEMORY;
    client->next_id = 1;
    client->ctx = zmq_ctx_new();
    if (client->ctx == NULL) {
        status = BT_ZMQ_ERROR("zmq_ctx_new");
        goto err_free;
    }
    bt_zmq_socket_config_init(&scfg);
    scfg.type = ZMQ_DEALER;
    scfg.endpoint = endpoint;
    scfg.max_msg = PROTO_CLIENT_MAX_BYTES;
    status = bt_zmq_socket_create(client->ctx, &scfg, &client->sock);
    if (status != BT_OK)
        goto err_ctx;
    *client_p = client;
    return BT_OK;

err_ctx:
    zmq_ctx_term(client->ctx);
err_free:
    bt_free(client);
    return status;
}

void client_destroy(client_t **client_p)
{
    client_t *client = *client_p;

    if (client == NULL)
        return;
    bt_zmq_socket_destroy(&client->sock);
    zmq_ctx_term(client->ctx);
    bt_free(client);
    *client_p = NULL;
}

bt_status_t client_submit(client_t *client, const client_request_t *req,
                          uint64_t *rid_p)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__GenerateRequest gen = BATON__GENERATE_REQUEST__INIT;
    Baton__SamplingParams sp = BATON__SAMPLING_PARAMS__INIT;
    ProtobufCBinaryData stops[PROTO_MAX_STOP];
    bt_status_t status;
    uint64_t rid = client->next_id;

    if (req->n_stop_strings > PROTO_MAX_STOP)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CLIENT",
                        "too many stop strings (%d)", req->n_stop_strings);
    gen.has_client_request_id = 1;
    gen.client_request_id = rid;
    if (req->n_prompt_ids > 0) {
        gen.n_prompt_ids = (size_t)req->n_prompt_ids;
        gen.prompt_ids = (int32_t *)req->prompt_ids;
    } else if (req->prompt != NULL) {
        gen.has_prompt = 1;
        gen.prompt.data = (uint8_t *)req->prompt;
        gen.prompt.len = strlen(req->prompt);
    }
    gen.has_add_bos = 1;
    gen.add_bos = req->add_bos;
    sp.has_temperature = 1;
    sp.temperature = req->temperature;
    sp.has_top_k = 1;
    sp.top_k = req->top_k;
    sp.has_top_p = 1;
    sp.top_p = req->top_p;
    sp.has_min_p = 1;
    sp.min_p = req->min_p;
    sp.has_repetition_penalty = 1;
    sp.repetition_penalty = req->repetition_penalty;
    sp.has_presence_penalty = 1;
    sp.presence_penalty = req->presence_penalty;
    sp.has_frequency_penalty = 1;
    sp.frequency_penalty = req->frequency_penalty;
    sp.has_seed = 1;
    sp.seed = req->seed;
    gen.sampling = &sp;
    gen.has_max_tokens = 1;
    gen.max_tokens = req->max_tokens;
    gen.n_stop_ids = (size_t)req->n_stop_ids;
    gen.stop_ids = (int32_t *)req->stop_ids;
    for (int i = 0; i < req->n_stop_strings; i++) {
        stops[i].data = (uint8_t *)req->stop_strings[i];
        stops[i].len = strlen(req->stop_strings[i]);
    }
    gen.n_stop_strings = (size_t)req->n_stop_strings;
    gen.stop_strings = stops;
    gen.has_ignore_eos = 1;
    gen.ignore_eos = req->ignore_eos;
    gen.has_priority = 1;
    gen.priority = req->priority;
    gen.has_deadline_ms = 1;
    gen.deadline_ms = req->deadline_ms;
    gen.has_want_text = 1;
    gen.want_text = req->want_text;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_GENERATE;
    msg.generate = &gen;
    status = proto_client_send(client->sock, NULL, 0, &msg);
    if (status != BT_OK)
        return BT_ERROR(BT_ERR_NET, "CLIENT", "cannot send request");
    client->next_id++;
    *rid_p = rid;
    return BT_OK;
}

bt_status_t client_send_raw(client_t *client, const void *data, size_t len)
{
    const void *frames[1] = { data };
    size_t lens[1] = { len };

    return bt_zmq_send_frames(client->sock, frames, lens, 1, ZMQ_DONTWAIT);
}

bt_status_t client_cancel(client_t *client, uint64_t rid)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__Cancel c = BATON__CANCEL__INIT;

    c.has_client_request_id = 1;
    c.client_request_id = rid;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_CANCEL;
    msg.cancel = &c;
    return proto_client_send(client->sock, NULL, 0, &msg);
}

bt_status_t client_status_request(client_t *client, uint64_t *rid_p)
{
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__StatusRequest s = BATON__STATUS_REQUEST__INIT;
    bt_status_t status;

    s.has_client_request_id = 1;
    s.client_request_id = client->next_id;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS_REQUEST;
    msg.status_request = &s;
    status = proto_client_send(client->sock, NULL, 0, &msg);
    if (status != BT_OK)
        return status;
    *rid_p = client->next_id++;
    return BT_OK;
}

bt_status_t client_recv(client_t *client, int timeout_ms,
                        Baton__ClientMessage **msg_p)
{
    zmq_pollitem_t item = { client->sock, 0, ZMQ_POLLIN, 0 };
    bt_zmq_msg_t zmsg;
    char err[256];
    bt_status_t status;
    int rc;

    rc = zmq_poll(&item, 1, timeout_ms);
    if (rc < 0)
        return BT_ZMQ_ERROR("zmq_poll");
    if (rc == 0)
        return BT_ERR_TIMEOUT;
    status = bt_zmq_recv(client->sock, ZMQ_DONTWAIT, &zmsg);
    if (status != BT_OK)
        return status;
    if (zmsg.n_frames != 1) {
        bt_zmq_msg_close(&zmsg);
        return BT_ERR_FORMAT;
    }
    status = proto_client_decode(bt_zmq_frame_data(&zmsg, 0),
                                 bt_zmq_frame_size(&zmsg, 0), msg_p, err,
                                 sizeof(err));
    bt_zmq_msg_close(&zmsg);
    if (status == BT_ERR_UNSUPPORTED) {
        proto_client_free(msg_p);
        return BT_ERROR(BT_ERR_FORMAT, "CLIENT", "router reply: %s", err);
    }
    return status;
}

bt_status_t client_fd(client_t *client, int *fd_p)
{
    int fd = -1;
    size_t len = sizeof(fd);

    if (zmq_getsockopt(client->sock, ZMQ_FD, &fd, &len) != 0)
        return BT_ZMQ_ERROR("zmq_getsockopt(ZMQ_FD)");
    *fd_p = fd;
    return BT_OK;
}

uint64_t client_msg_request_id(const Baton__ClientMessage *msg)
{
    switch (msg->body_case) {
    case BATON__CLIENT_MESSAGE__BODY_CHUNK:
        return msg->chunk->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_FINISHED:
        return msg->finished->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_ERROR:
        return msg->error->client_request_id;
    case BATON__CLIENT_MESSAGE__BODY_STATUS:
        return msg->status->client_request_id;
    default:
        return 0;
    }
}

const char *client_error_name(Baton__ErrorCode code)
{
    static const char *const names[] = {
        "none", "invalid", "overloaded", "version", "malformed",
        "no_workers", "timeout", "internal", "worker_failed", "too_long",
        "draining", "duplicate",
    };
    if ((unsigned)code < BT_ARRAY_SIZE(names))
        return names[code];
    return "unknown";
}

const char *client_finish_name(Baton__FinishReason reason)
{
    static const char *const names[] = { "none", "stop", "length",
                                         "cancelled" };
    if ((unsigned)reason < BT_ARRAY_SIZE(names))
        return names[reason];
    return "unknown";
}
