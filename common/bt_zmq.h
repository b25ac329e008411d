/*
 * bt_zmq.h - ZeroMQ helpers shared by the router, the workers and the
 * client library: socket setup with baton's defaults, multipart send and
 * receive, and the errno -> bt_status_t conversion at the boundary.
 *
 * Framing: a DEALER sends and receives one payload frame per message; a
 * ROUTER sees [routing id][payload].  Helpers here never block unless
 * asked to (timeouts are explicit), so callers drive them from zmq_poll.
 */
#ifndef BT_COMMON_ZMQ_H
#define BT_COMMON_ZMQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "bt_curve.h"
#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest message a baton socket accepts by default (KV inline payloads
 * make control messages big); larger frames are dropped by ZeroMQ. */
#define BT_ZMQ_MAX_MSG_DEFAULT (256LL << 20)
#define BT_ZMQ_ID_MAX 255

/* Converts a failed zmq call (errno) into a status, logging it once with
 * `what`.  Evaluates to the status. */
bt_status_t bt_zmq_error(const char *what, const char *file, int line,
                         const char *func);
#define BT_ZMQ_ERROR(_what) bt_zmq_error(_what, __FILE__, __LINE__, __func__)

typedef struct {
    int type;             /* ZMQ_ROUTER, ZMQ_DEALER */
    const char *endpoint; /* "tcp://127.0.0.1:5555" */
    bool bind;            /* bind (server) or connect (client) */
    const char *identity; /* routing id for a DEALER, NULL = random */
    int64_t max_msg;      /* ZMQ_MAXMSGSIZE, 0 = BT_ZMQ_MAX_MSG_DEFAULT */
    int hwm;              /* send/receive high-water mark, 0 = 100000 */
    /* CURVE (docs/SECURITY.md).  A bound socket is a CURVE server when
     * curve_secret is set; its ZAP domain tells the router's ZAP handler
     * which allow list applies.  A connecting socket uses curve_client,
     * or the process identity (bt_curve_identity()) when NULL. */
    const char *curve_secret;  /* bind: the server's secret key (Z85) */
    const char *zap_domain;    /* bind: BT_CURVE_DOMAIN_* */
    const bt_curve_client_t *curve_client; /* connect: NULL = identity */
} bt_zmq_socket_config_t;

void bt_zmq_socket_config_init(bt_zmq_socket_config_t *cfg);

/* Creates, configures (linger 0, hwm, max message size, ROUTER_MANDATORY
 * off, TCP keepalive, CURVE keys) and binds or connects a socket.
 * BT_ERR_NET with a message naming the endpoint on failure;
 * BT_ERR_INVALID_ARG when the process identity's key files cannot be
 * read. */
bt_status_t bt_zmq_socket_create(void *ctx, const bt_zmq_socket_config_t *cfg,
                                 void **sock_p);

/* Closes a socket (NULL-safe) and sets *sock_p to NULL. */
void bt_zmq_socket_destroy(void **sock_p);

/* Sends a message of `n` frames (ZMQ_SNDMORE between them).  `flags` may
 * hold ZMQ_DONTWAIT.  BT_ERR_NET on failure (EHOSTUNREACH, EAGAIN...). */
bt_status_t bt_zmq_send_frames(void *sock, const void *const *data,
                               const size_t *len, int n, int flags);

/* A received message: up to BT_ZMQ_MAX_FRAMES frames; extra frames are
 * received and dropped (counted in n_dropped). */
#define BT_ZMQ_MAX_FRAMES 4
typedef struct {
    zmq_msg_t frames[BT_ZMQ_MAX_FRAMES];
    int n_frames;
    int n_dropped;
} bt_zmq_msg_t;

/* Receives one whole multipart message.  `flags` may hold ZMQ_DONTWAIT;
 * BT_ERR_TIMEOUT when nothing is waiting (EAGAIN).  On BT_OK the caller
 * must call bt_zmq_msg_close(). */
bt_status_t bt_zmq_recv(void *sock, int flags, bt_zmq_msg_t *msg);
void bt_zmq_msg_close(bt_zmq_msg_t *msg);

static inline const void *bt_zmq_frame_data(bt_zmq_msg_t *msg, int i)
{
    return zmq_msg_data(&msg->frames[i]);
}

static inline size_t bt_zmq_frame_size(bt_zmq_msg_t *msg, int i)
{
    return zmq_msg_size(&msg->frames[i]);
}

/* The ZAP User-Id of a received frame: the Z85 public key of the CURVE
 * peer that sent it (the router's ZAP handler sets it), or "" without
 * CURVE.  The pointer lives as long as the frame. */
const char *bt_zmq_frame_user(bt_zmq_msg_t *msg, int i);

/* The port a socket bound to (after binding port 0 on
 * any interface), or -1. */
int bt_zmq_bound_port(void *sock);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_ZMQ_H */
