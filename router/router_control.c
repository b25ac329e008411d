/*
 * router_control.c - the worker side of the router's sockets: decodes
 * each control message, asks unknown workers to register again, and
 * routes the rest to the registry (Register, Heartbeat, Drain, Shutdown)
 * or the request state machine (KvGrant, PrefillDone, TokenOut,
 * TaskError); and the small sends to one worker (KvRelease, CancelTask).
 *
 * With CURVE every message carries the public key of the connection it
 * came on (ZAP User-Id).  A registration is bound to the key that made
 * it: a message whose key is not its registration's is dropped
 * (foreign_msgs), so one worker can neither speak for, drain nor drop
 * another's registration.
 */
#include <string.h>

#include "bt_log.h"
#include "bt_proto.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "proto_batch.h"
#include "router_int.h"

void router__worker_flush(router_t *r, router_worker_t *w)
{
    size_t n = w->outbox.n;

    if (n > 0 && proto_batch_send_control(&w->outbox, r->control_sock, w->rid,
                                          w->rid_len, true) != BT_OK)
        BT_LOG_WARN("NET", "cannot send %zu messages to worker %s", n,
                    w->name);
}

void router__control_flush(router_t *r)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++)
        if (r->workers[i].used)
            router__worker_flush(r, &r->workers[i]);
}

/* To a worker that takes batches, messages wait in its outbox for the
 * end of the loop turn (router__control_flush): a turn that dispatches
 * many requests sends each worker one message.  One that is too large
 * for a batch, or cannot be queued, goes at once after what the outbox
 * holds, so the worker sees them in the order they were made. */
void router__send_control(router_t *r, router_worker_t *w,
                          Baton__ControlMessage *msg)
{
    size_t len;

    if (w == NULL)
        return;
    if (w->batches) {
        msg->version = BT_PROTO_VERSION;
        len = baton__control_message__get_packed_size(msg);
        if (proto_batch_is_full(&w->outbox, len))
            router__worker_flush(r, w);
        if (len <= PROTO_BATCH_MAX_BYTES &&
            proto_batch_add_control(&w->outbox, msg) == BT_OK)
            return;
        router__worker_flush(r, w);
    }
    if (proto_control_send(r->control_sock, w->rid, w->rid_len, msg) != BT_OK)
        BT_LOG_WARN("NET", "cannot send %s to worker %s",
                    proto_control_body_name(msg->body_case), w->name);
}

void router__send_kv_release(router_t *r, router_worker_t *d, uint64_t id,
                             uint64_t epoch)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvRelease rel = BATON__KV_RELEASE__INIT;

    rel.has_request_id = 1;
    rel.request_id = id;
    rel.has_epoch = 1;
    rel.epoch = epoch;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_RELEASE;
    msg.kv_release = &rel;
    router__send_control(r, d, &msg);
}

void router__send_cancel_task(router_t *r, router_worker_t *w, uint64_t id)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__CancelTask c = BATON__CANCEL_TASK__INIT;

    c.has_request_id = 1;
    c.request_id = id;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_CANCEL_TASK;
    msg.cancel_task = &c;
    router__send_control(r, w, &msg);
}

static void on_worker_msg(router_t *r, router_worker_t *w,
                          const Baton__ControlMessage *msg);

/* A ControlBatch (issue 42): each entry is handled as if it had come
 * alone, in order, with the batch's sender and key, so fencing judges
 * every entry on its own (a stale TokenOut drops that entry, not the
 * batch).  An entry that does not decode, a Register (it must come
 * alone: it binds the connection's key) and a nested batch are dropped
 * with a log line; the rest still count.  A batch with more entries
 * than any worker sends is dropped whole.  Stops early when an entry
 * (a Shutdown) dropped the worker. */
static void on_batch(router_t *r, router_worker_t *w,
                     const Baton__ControlBatch *batch)
{
    uint64_t uid = w->uid;
    char err[256];

    if (batch->n_msgs > PROTO_BATCH_MAX_MSGS) {
        BT_LOG_WARN("NET", "control batch of %zu messages from worker %s "
                    "dropped (at most %d)", batch->n_msgs, w->name,
                    PROTO_BATCH_MAX_MSGS);
        return;
    }
    for (size_t i = 0; i < batch->n_msgs && w->used && w->uid == uid; i++) {
        Baton__ControlMessage *m = NULL;
        bt_status_t status;

        status = proto_control_decode(batch->msgs[i].data, batch->msgs[i].len,
                                      &m, err, sizeof(err));
        if (status != BT_OK) {
            BT_LOG_WARN("NET", "entry %zu of a control batch from worker %s "
                        "dropped: %s", i, w->name, err);
        } else if (m->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER ||
                   m->body_case == BATON__CONTROL_MESSAGE__BODY_BATCH) {
            BT_LOG_WARN("NET", "entry %zu of a control batch from worker %s "
                        "dropped: a %s must come alone", i, w->name,
                        proto_control_body_name(m->body_case));
        } else {
            on_worker_msg(r, w, m);
        }
        proto_control_free(&m);
    }
}

/* Acts on one message of registered worker `w` (alone or a batch's
 * entry). */
static void on_worker_msg(router_t *r, router_worker_t *w,
                          const Baton__ControlMessage *msg)
{
    switch (msg->body_case) {
    case BATON__CONTROL_MESSAGE__BODY_HEARTBEAT:
        if (msg->heartbeat->has_session &&
            msg->heartbeat->session != w->session) {
            r->stale_msgs++; /* sent before its latest Register */
            break;
        }
        router__on_heartbeat(r, w, msg->heartbeat);
        break;
    case BATON__CONTROL_MESSAGE__BODY_KV_GRANT:
        router__on_kv_grant(r, w, msg->kv_grant);
        break;
    case BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE:
        router__on_prefill_done(r, w, msg->prefill_done);
        break;
    case BATON__CONTROL_MESSAGE__BODY_TOKEN_OUT:
        router__on_token_out(r, w, msg->token_out);
        break;
    case BATON__CONTROL_MESSAGE__BODY_TASK_ERROR:
        router__on_task_error(r, w, msg->task_error);
        break;
    case BATON__CONTROL_MESSAGE__BODY_DRAIN:
        BT_LOG_INFO("ROUTER", "worker %s is draining", w->name);
        w->draining = true;
        break;
    case BATON__CONTROL_MESSAGE__BODY_SHUTDOWN:
        router__worker_drop(r, w, "left");
        break;
    case BATON__CONTROL_MESSAGE__BODY_KV_EVENTS:
        router__on_kv_events(r, w, msg->kv_events);
        break;
    case BATON__CONTROL_MESSAGE__BODY_BATCH:
        on_batch(r, w, msg->batch);
        break;
    default:
        BT_LOG_WARN("NET", "unexpected %s from worker %s dropped",
                    proto_control_body_name(msg->body_case), w->name);
        break;
    }
}

void router__handle_control(router_t *r, bt_zmq_msg_t *zm)
{
    const uint8_t *id;
    size_t id_len;
    Baton__ControlMessage *msg = NULL;
    router_worker_t *w;
    const char *key;
    char err[256];
    bt_status_t status;

    if (zm->n_frames != 2 || zm->n_dropped != 0) {
        BT_LOG_WARN("NET", "control message with %d frames dropped",
                    zm->n_frames + zm->n_dropped);
        return;
    }
    id = bt_zmq_frame_data(zm, 0);
    id_len = bt_zmq_frame_size(zm, 0);
    key = bt_zmq_frame_user(zm, 1);
    if (r->curve && key[0] == '\0') {
        /* Cannot happen: every CURVE connection went through ZAP. */
        r->foreign_msgs++;
        return;
    }
    status = proto_control_decode(bt_zmq_frame_data(zm, 1),
                                  bt_zmq_frame_size(zm, 1), &msg, err,
                                  sizeof(err));
    if (status != BT_OK) {
        BT_LOG_WARN("NET", "control message dropped: %s", err);
        proto_control_free(&msg);
        return;
    }
    if (msg->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER) {
        router__on_register(r, id, id_len, key, msg->register_);
        goto out;
    }
    w = router__worker_by_rid(r, id, id_len);
    if (w != NULL && strcmp(w->key, key) != 0) {
        /* Not the registration's key: never acted on, never answered. */
        r->foreign_msgs++;
        BT_LOG_WARN("ROUTER", "%s for worker %s from another CURVE key (%s) "
                    "dropped", proto_control_body_name(msg->body_case),
                    w->name, key);
        goto out;
    }
    if (w == NULL) {
        /* Unknown (dropped, or the router restarted): ask to register.
         * Whatever it says belongs to a registration that is gone. */
        Baton__ControlMessage reply = BATON__CONTROL_MESSAGE__INIT;
        Baton__RegisterAck ack = BATON__REGISTER_ACK__INIT;
        ack.has_reregister = 1;
        ack.reregister = 1;
        ack.has_router_instance = 1;
        ack.router_instance = r->instance;
        reply.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK;
        reply.register_ack = &ack;
        proto_control_send(r->control_sock, id, id_len, &reply);
        r->stale_msgs++;
        goto out;
    }
    w->last_seen_ns = bt_time_ns();
    on_worker_msg(r, w, msg);
out:
    proto_control_free(&msg);
}
