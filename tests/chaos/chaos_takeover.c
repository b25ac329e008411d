/*
 * chaos_takeover.c - the fault suite's name-takeover attacker
 * (tests/chaos/README.md, issue 35 item 6).
 *
 * Connects to a router's control endpoint pretending to be the live
 * worker NAME, --count times, --interval-ms apart.  Each attempt uses two
 * sockets, so it bites whichever way the router ties a worker to its
 * connection:
 *   1. a DEALER whose ZMQ routing id is NAME, sending a Heartbeat and a
 *      Register that both carry NAME (a plain message under the victim's
 *      id, then a registration);
 *   2. a DEALER with a random routing id sending a Register carrying NAME
 *      (a takeover by name alone).
 * It reads and drops whatever the router answers, then closes both.  The
 * suite judges the attack only by the victim's requests: they must end
 * identical or with a clear error, never wrong, never hung, and the
 * cluster must serve again afterwards.
 *
 * usage: chaos_takeover --control EP --name NAME --role prefill|decode
 *                       [--count N] [--interval-ms MS] [--hold-ms MS]
 * Exits 0 after sending, 2 on a usage or setup error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_log.h"
#include "bt_zmq.h"
#include "proto_msg.h"
#include "workerproc.h"

static int send_register(void *sock, const char *name, int role)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    workerproc_register_cfg_t rc = {
        .role = (Baton__Role)role, .name = name, .vocab = PROTO_NULL_VOCAB,
        .max_context = PROTO_NULL_CONTEXT, .host_id = "chaos-takeover",
    };
    workerproc_register_t r;

    workerproc_register_init(&r, &rc);
    r.reg.has_batches = 0; /* its own receive loop: one message at a time */
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER;
    msg.register_ = &r.reg;
    return proto_control_send(sock, NULL, 0, &msg) == BT_OK ? 0 : -1;
}

static int send_heartbeat(void *sock, const char *name)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__Heartbeat hb = BATON__HEARTBEAT__INIT;

    hb.name = (char *)name;
    hb.has_free_kv_blocks = 1;
    hb.free_kv_blocks = 0;
    hb.has_total_kv_blocks = 1;
    hb.total_kv_blocks = 16;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_HEARTBEAT;
    msg.heartbeat = &hb;
    return proto_control_send(sock, NULL, 0, &msg) == BT_OK ? 0 : -1;
}

/* Reads and drops what arrives on `sock` for `ms` milliseconds. */
static void drain_for(void *sock, int ms)
{
    for (int t = 0; t < ms; t += 10) {
        zmq_pollitem_t it = { sock, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, 10) > 0) {
            bt_zmq_msg_t m;
            if (bt_zmq_recv(sock, ZMQ_DONTWAIT, &m) == BT_OK)
                bt_zmq_msg_close(&m);
        }
    }
}

int main(int argc, char **argv)
{
    const char *control = NULL, *name = NULL, *role_s = "decode";
    int count = 2, interval_ms = 500, hold_ms = 200, role;
    void *ctx;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--control") == 0)
            control = argv[i + 1];
        else if (strcmp(argv[i], "--name") == 0)
            name = argv[i + 1];
        else if (strcmp(argv[i], "--role") == 0)
            role_s = argv[i + 1];
        else if (strcmp(argv[i], "--count") == 0)
            count = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--interval-ms") == 0)
            interval_ms = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--hold-ms") == 0)
            hold_ms = atoi(argv[i + 1]);
        else
            control = NULL, i = argc;
    }
    if (control == NULL || name == NULL || argc % 2 == 0) {
        fprintf(stderr, "usage: chaos_takeover --control EP --name NAME "
                "--role prefill|decode [--count N] [--interval-ms MS] "
                "[--hold-ms MS]\n");
        return 2;
    }
    role = strcmp(role_s, "prefill") == 0 ? BATON__ROLE__ROLE_PREFILL
                                          : BATON__ROLE__ROLE_DECODE;
    bt_log_init("chaos_takeover");
    ctx = zmq_ctx_new();
    for (int k = 0; k < count; k++) {
        bt_zmq_socket_config_t cfg;
        void *same_id = NULL, *by_name = NULL;

        bt_zmq_socket_config_init(&cfg);
        cfg.type = ZMQ_DEALER;
        cfg.endpoint = control;
        cfg.bind = false;
        cfg.identity = name;
        if (bt_zmq_socket_create(ctx, &cfg, &same_id) != BT_OK)
            return 2;
        cfg.identity = NULL;
        if (bt_zmq_socket_create(ctx, &cfg, &by_name) != BT_OK)
            return 2;
        /* Let both connections complete before sending. */
        usleep(50000);
        send_heartbeat(same_id, name);
        send_register(same_id, name, role);
        send_register(by_name, name, role);
        drain_for(same_id, hold_ms / 2);
        drain_for(by_name, hold_ms / 2);
        bt_zmq_socket_destroy(&same_id);
        bt_zmq_socket_destroy(&by_name);
        fprintf(stderr, "chaos_takeover: attempt %d on %s sent\n", k + 1,
                name);
        if (k + 1 < count)
            usleep((useconds_t)interval_ms * 1000);
    }
    zmq_ctx_term(ctx);
    return 0;
}
