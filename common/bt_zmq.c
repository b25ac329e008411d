/* bt_zmq.c - ZeroMQ socket setup and multipart helpers (see bt_zmq.h). */
#include "bt_zmq.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_error.h"
#include "bt_log.h"

bt_status_t bt_zmq_error(const char *what, const char *file, int line,
                         const char *func)
{
    int err = zmq_errno();

    if (err == EAGAIN)
        return BT_ERR_TIMEOUT;
    return bt_error_record(BT_ERR_NET, "NET", file, line, func, "%s: %s",
                           what, zmq_strerror(err));
}

void bt_zmq_socket_config_init(bt_zmq_socket_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->type = ZMQ_DEALER;
}

bt_status_t bt_zmq_socket_create(void *ctx, const bt_zmq_socket_config_t *cfg,
                                 void **sock_p)
{
    int linger = 0;
    int hwm = cfg->hwm > 0 ? cfg->hwm : 100000;
    int keepalive = 1;
    int64_t max_msg = cfg->max_msg > 0 ? cfg->max_msg : BT_ZMQ_MAX_MSG_DEFAULT;
    bt_status_t status;
    void *sock;

    sock = zmq_socket(ctx, cfg->type);
    if (sock == NULL)
        return BT_ZMQ_ERROR("zmq_socket");
    if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg)) != 0 ||
        zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE, &keepalive,
                       sizeof(keepalive)) != 0) {
        status = BT_ZMQ_ERROR("zmq_setsockopt");
        goto err_close;
    }
    if (cfg->bind && cfg->curve_secret != NULL) {
        status = bt_curve_server_apply(sock, cfg->curve_secret,
                                       cfg->zap_domain != NULL
                                           ? cfg->zap_domain : "");
        if (status != BT_OK)
            goto err_close;
    } else if (!cfg->bind) {
        const bt_curve_client_t *curve = cfg->curve_client;
        if (curve == NULL) {
            status = bt_curve_identity(&curve);
            if (status != BT_OK)
                goto err_close;
        }
        status = bt_curve_client_apply(sock, curve);
        if (status != BT_OK)
            goto err_close;
    }
    if (cfg->identity != NULL &&
        zmq_setsockopt(sock, ZMQ_ROUTING_ID, cfg->identity,
                       strlen(cfg->identity)) != 0) {
        status = BT_ZMQ_ERROR("ZMQ_ROUTING_ID");
        goto err_close;
    }
    if (cfg->bind ? zmq_bind(sock, cfg->endpoint)
                  : zmq_connect(sock, cfg->endpoint)) {
        status = bt_error_record(BT_ERR_NET, "NET", __FILE__, __LINE__,
                                 __func__, "%s %s: %s",
                                 cfg->bind ? "bind" : "connect",
                                 cfg->endpoint, zmq_strerror(zmq_errno()));
        goto err_close;
    }
    *sock_p = sock;
    return BT_OK;

err_close:
    zmq_close(sock);
    return status;
}

void bt_zmq_socket_destroy(void **sock_p)
{
    if (*sock_p == NULL)
        return;
    zmq_close(*sock_p);
    *sock_p = NULL;
}

bt_status_t bt_zmq_send_frames(void *sock, const void *const *data,
                               const size_t *len, int n, int flags)
{
    for (int i = 0; i < n; i++) {
        int f = flags | (i + 1 < n ? ZMQ_SNDMORE : 0);
        if (zmq_send(sock, data[i], len[i], f) < 0) {
            int err = zmq_errno();
            if (err == EAGAIN || err == EHOSTUNREACH)
                return BT_ERR_NET; /* peer gone or full: caller decides */
            return BT_ZMQ_ERROR("zmq_send");
        }
    }
    return BT_OK;
}

bt_status_t bt_zmq_recv(void *sock, int flags, bt_zmq_msg_t *msg)
{
    int more = 1;
    size_t more_len = sizeof(more);

    msg->n_frames = 0;
    msg->n_dropped = 0;
    while (more) {
        zmq_msg_t *frame;
        zmq_msg_t scratch;
        bool keep = msg->n_frames < BT_ZMQ_MAX_FRAMES;

        frame = keep ? &msg->frames[msg->n_frames] : &scratch;
        zmq_msg_init(frame);
        /* Only the first frame may report EAGAIN; the rest of a multipart
         * message is always there once its first frame arrived. */
        if (zmq_msg_recv(frame, sock, msg->n_frames || msg->n_dropped
                                          ? 0 : flags) < 0) {
            bt_status_t status = zmq_errno() == EAGAIN
                                     ? BT_ERR_TIMEOUT
                                     : BT_ZMQ_ERROR("zmq_msg_recv");
            zmq_msg_close(frame);
            bt_zmq_msg_close(msg);
            return status;
        }
        if (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len) != 0)
            more = 0;
        if (keep) {
            msg->n_frames++;
        } else {
            zmq_msg_close(frame);
            msg->n_dropped++;
        }
    }
    return BT_OK;
}

void bt_zmq_msg_close(bt_zmq_msg_t *msg)
{
    for (int i = 0; i < msg->n_frames; i++)
        zmq_msg_close(&msg->frames[i]);
    msg->n_frames = 0;
}

const char *bt_zmq_frame_user(bt_zmq_msg_t *msg, int i)
{
    const char *user;

    if (i < 0 || i >= msg->n_frames)
        return "";
    user = zmq_msg_gets(&msg->frames[i], "User-Id");
    return user != NULL ? user : "";
}

int bt_zmq_bound_port(void *sock)
{
    char endpoint[256];
    size_t len = sizeof(endpoint);
    const char *colon;

    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0)
        return -1;
    colon = strrchr(endpoint, ':');
    if (colon == NULL)
        return -1;
    return atoi(colon + 1);
}
