/*
 * router_zap.c - CURVE authentication of the router's two sockets
 * (docs/SECURITY.md): the key files and allow lists, the loopback rule
 * without keys, and the ZAP handler (RFC 27) that libzmq's I/O threads
 * ask about every CURVE handshake.
 *
 * The handler is a REP socket on inproc://zeromq.zap.01 in the router's
 * context, served from the router's own zmq_poll loop (router_run): the
 * router stays single-threaded and the handler reads the worker table
 * without locks.  It is bound before either socket binds, and libzmq
 * refuses every handshake while no handler answers, so a connection is
 * never admitted unauthenticated.  The ZAP domain of the socket a
 * handshake arrives on (BT_CURVE_DOMAIN_*) picks the allow list; the
 * reply's User-Id is the client's public key in Z85, which every message
 * from that connection then carries (bt_zmq_frame_user), and which the
 * registry binds a worker's registration to.
 */
#include <stdio.h>
#include <string.h>

#include "bt_error.h"
#include "bt_log.h"
#include "router_int.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_MAX_FRAMES 8
#define ZAP_LOG_FIRST 20    /* denials logged one by one, then ... */
#define ZAP_LOG_EVERY 1000  /* ... every this many */

bt_status_t router__zap_create(router_t *r, char *secret_p)
{
    const router_config_t *cfg = &r->cfg;
    char pub[BT_CURVE_Z85_LEN + 1];
    bt_status_t status;

    if (cfg->curve_secret_key == NULL || cfg->curve_secret_key[0] == '\0') {
        if (cfg->allow_workers != NULL || cfg->allow_clients != NULL)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "--allow-workers "
                            "and --allow-clients need --curve-secret-key");
        if (cfg->insecure) {
            BT_LOG_WARN("ROUTER", "--insecure: no CURVE; anyone who reaches "
                        "%s can submit work and anyone who reaches %s can "
                        "register as a worker and read prompts",
                        cfg->listen, cfg->control);
            return BT_OK;
        }
        if (!bt_endpoint_is_local(cfg->listen) ||
            !bt_endpoint_is_local(cfg->control))
            return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "refusing to listen "
                            "on %s without CURVE keys: give "
                            "--curve-secret-key, --allow-workers and "
                            "--allow-clients (docs/SECURITY.md), bind a "
                            "loopback address, or pass --insecure",
                            bt_endpoint_is_local(cfg->listen) ? cfg->control
                                                              : cfg->listen);
        return BT_OK;
    }
    if (cfg->allow_workers == NULL || cfg->allow_clients == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ROUTER", "--curve-secret-key "
                        "needs both --allow-workers and --allow-clients "
                        "(missing: %s)", cfg->allow_workers == NULL
                            ? "--allow-workers" : "--allow-clients");
    status = bt_curve_load_secret(cfg->curve_secret_key, secret_p, pub);
    if (status != BT_OK)
        return status;
    status = bt_curve_allow_load(cfg->allow_workers, &r->allow_workers);
    if (status != BT_OK)
        goto err;
    status = bt_curve_allow_load(cfg->allow_clients, &r->allow_clients);
    if (status != BT_OK)
        goto err;
    {
        bt_zmq_socket_config_t scfg;
        bt_zmq_socket_config_init(&scfg);
        scfg.type = ZMQ_REP;
        scfg.bind = true;
        scfg.endpoint = ZAP_ENDPOINT;
        scfg.max_msg = 4096;
        status = bt_zmq_socket_create(r->ctx, &scfg, &r->zap_sock);
        if (status != BT_OK)
            goto err;
    }
    r->curve = true;
    BT_LOG_INFO("ROUTER", "CURVE on: router public key %s; %zu worker "
                "key(s) from %s, %zu client key(s) from %s", pub,
                bt_curve_allow_count(r->allow_workers), cfg->allow_workers,
                bt_curve_allow_count(r->allow_clients), cfg->allow_clients);
    if (bt_curve_allow_count(r->allow_workers) == 0 ||
        bt_curve_allow_count(r->allow_clients) == 0)
        BT_LOG_WARN("ROUTER", "an allow list is empty: no %s can connect",
                    bt_curve_allow_count(r->allow_workers) == 0 ? "worker"
                                                                 : "client");
    return BT_OK;

err:
    memset(secret_p, 0, BT_CURVE_Z85_LEN + 1);
    router__zap_destroy(r);
    return status;
}

void router__zap_destroy(router_t *r)
{
    bt_zmq_socket_destroy(&r->zap_sock);
    bt_curve_allow_destroy(&r->allow_workers);
    bt_curve_allow_destroy(&r->allow_clients);
}

static void zap_reply(void *sock, const zmq_msg_t *req_id, const char *code,
                      const char *text, const char *user)
{
    const void *data[6] = { "1.0", zmq_msg_data((zmq_msg_t *)req_id), code,
                            text, user, "" };
    size_t len[6] = { 3, zmq_msg_size((zmq_msg_t *)req_id), strlen(code),
                      strlen(text), strlen(user), 0 };

    /* Blocking: libzmq's ZAP client reads at once (inproc), and a REP
     * that failed to answer would refuse every later request. */
    (void)bt_zmq_send_frames(sock, data, len, 6, 0);
}

/* Decides one handshake.  Frames (RFC 27): version, request id, domain,
 * address, routing id, mechanism, then the client's 32-byte key. */
static void zap_answer(router_t *r, zmq_msg_t *f, int n)
{
    char user[BT_CURVE_Z85_LEN + 1] = "";
    const char *domain_s = "?";
    char domain[32] = "", addr[64] = "";
    const uint8_t *key;
    bool worker, ok;

    if (n < 7 || zmq_msg_size(&f[0]) != 3 ||
        memcmp(zmq_msg_data(&f[0]), "1.0", 3) != 0) {
        zmq_msg_t empty;
        zmq_msg_init(&empty);
        zap_reply(r->zap_sock, n >= 2 ? &f[1] : &empty, "400",
                  "malformed ZAP request", "");
        zmq_msg_close(&empty);
        return;
    }
    snprintf(domain, sizeof(domain), "%.*s",
             (int)zmq_msg_size(&f[2]), (const char *)zmq_msg_data(&f[2]));
    snprintf(addr, sizeof(addr), "%.*s",
             (int)zmq_msg_size(&f[3]), (const char *)zmq_msg_data(&f[3]));
    worker = strcmp(domain, BT_CURVE_DOMAIN_CONTROL) == 0;
    if (zmq_msg_size(&f[5]) != 5 ||
        memcmp(zmq_msg_data(&f[5]), "CURVE", 5) != 0 ||
        zmq_msg_size(&f[6]) != BT_CURVE_KEY_BYTES ||
        (!worker && strcmp(domain, BT_CURVE_DOMAIN_CLIENT) != 0)) {
        ok = false;
    } else {
        key = zmq_msg_data(&f[6]);
        zmq_z85_encode(user, key, BT_CURVE_KEY_BYTES);
        domain_s = worker ? "worker" : "client";
        ok = bt_curve_allow_has(worker ? r->allow_workers : r->allow_clients,
                                key);
    }
    if (ok) {
        r->zap_allowed++;
        zap_reply(r->zap_sock, &f[1], "200", "OK", user);
        return;
    }
    r->zap_denied[worker]++;
    if (r->zap_denied[worker] <= ZAP_LOG_FIRST ||
        r->zap_denied[worker] % ZAP_LOG_EVERY == 0)
        BT_LOG_WARN("ROUTER", "refused %s connection from %s: key %s is not "
                    "in the allow list (%llu refused so far)", domain_s,
                    addr, user[0] ? user : "(none)",
                    (unsigned long long)r->zap_denied[worker]);
    zap_reply(r->zap_sock, &f[1], "400", "key not allowed", "");
}

void router__zap_process(router_t *r)
{
    for (int k = 0; k < 64; k++) {
        zmq_msg_t f[ZAP_MAX_FRAMES];
        int n = 0, more = 1;

        while (more) {
            zmq_msg_t scratch, *m = n < ZAP_MAX_FRAMES ? &f[n] : &scratch;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, r->zap_sock,
                             n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&f[i]);
                return; /* nothing waiting */
            }
            more = zmq_msg_more(m);
            if (m == &scratch)
                zmq_msg_close(m);
            else
                n++;
        }
        zap_answer(r, f, n);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}
