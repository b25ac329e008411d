/*
 * test_curve.c - CURVE on the control plane (issue 42 items 1 and 2,
 * docs/SECURITY.md), with real processes on loopback:
 *   1. a cluster whose every socket uses CURVE serves requests;
 *   2. an unlisted worker key cannot register and receives nothing (a raw
 *      connection that sends a Register gets no byte back; a real
 *      baton-decode with that key never shows up and never gets work);
 *   3. an unlisted client key, and a client without CURVE, get no reply;
 *   4. a worker with a listed key cannot take over another's name (Register
 *      refused), nor its routing id (the duplicate connection is ignored:
 *      its Shutdown does not drop the victim), nor drop or drain it by
 *      name;
 *   5. registration bytes recorded on the wire and replayed on a new TCP
 *      connection register nothing (control: the same replay against a
 *      router without CURVE does re-register, so the replay is real).
 */
#include <poll.h>
#include <sys/stat.h>
#include <pthread.h>

#include "bt_curve.h"
#include "bt_proto.h"
#include "bt_zmq.h"
#include "cluster/cluster_util.h"
#include "workerproc.h"

static char g_dir[256];

static void key_path(char *out, size_t n, const char *name, const char *ext)
{
    snprintf(out, n, "%s/%s.%s", g_dir, name, ext);
}

static void keygen(const char *name)
{
    char prefix[320];

    snprintf(prefix, sizeof(prefix), "%s/%s", g_dir, name);
    BT_ASSERT_OK(bt_curve_keygen(prefix, NULL));
}

static bt_curve_client_t curve_of(const char *name)
{
    char sec[320], pub[320];
    bt_curve_client_t c;

    key_path(sec, sizeof(sec), name, "key");
    key_path(pub, sizeof(pub), "router", "pub");
    BT_ASSERT_OK(bt_curve_client_load(sec, pub, &c));
    BT_CHECK(c.on);
    return c;
}

// ---------------------------------------------------------------------------
// Raw control connections

/* A DEALER to `ep` with routing id `rid` and keys `curve` (NULL: none). */
static void *raw_dealer(void *ctx, const char *ep, const char *rid,
                        const bt_curve_client_t *curve)
{
    static const bt_curve_client_t off = { 0 };
    bt_zmq_socket_config_t cfg;
    void *s = NULL;

    bt_zmq_socket_config_init(&cfg);
    cfg.type = ZMQ_DEALER;
    cfg.endpoint = ep;
    cfg.identity = rid;
    cfg.curve_client = curve != NULL ? curve : &off;
    BT_ASSERT_OK(bt_zmq_socket_create(ctx, &cfg, &s));
    return s;
}

static size_t pack_register(const char *name, uint8_t *buf, size_t cap)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    workerproc_register_cfg_t rc = {
        .role = BATON__ROLE__ROLE_DECODE, .name = name,
        .vocab = PROTO_NULL_VOCAB, .max_context = PROTO_NULL_CONTEXT,
        .host_id = "test-host",
    };
    workerproc_register_t r;
    size_t len;

    workerproc_register_init(&r, &rc);
    r.reg.has_batches = 0; /* its own receive loop: one message at a time */
    r.reg.has_session = 1;
    r.reg.session = 7;
    msg.version = BT_PROTO_VERSION;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER;
    msg.register_ = &r.reg;
    len = baton__control_message__get_packed_size(&msg);
    BT_CHECK(len <= cap);
    baton__control_message__pack(&msg, buf);
    return len;
}

static void send_register(void *s, const char *name)
{
    uint8_t buf[512];
    size_t len = pack_register(name, buf, sizeof(buf));

    BT_CHECK(zmq_send(s, buf, len, 0) == (int)len);
}

static void send_body(void *s, Baton__ControlMessage__BodyCase body,
                      const char *name)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__Shutdown sd = BATON__SHUTDOWN__INIT;
    Baton__Drain dr = BATON__DRAIN__INIT;
    Baton__Heartbeat hb = BATON__HEARTBEAT__INIT;

    msg.version = BT_PROTO_VERSION;
    msg.body_case = body;
    sd.name = dr.name = (char *)name;
    hb.has_session = 1;
    hb.session = 7;
    hb.has_free_kv_blocks = 1;
    hb.free_kv_blocks = 16;
    hb.has_total_kv_blocks = 1;
    hb.total_kv_blocks = 16;
    if (body == BATON__CONTROL_MESSAGE__BODY_SHUTDOWN)
        msg.shutdown = &sd;
    else if (body == BATON__CONTROL_MESSAGE__BODY_DRAIN)
        msg.drain = &dr;
    else
        msg.heartbeat = &hb;
    BT_ASSERT_OK(proto_control_send(s, NULL, 0, &msg));
}

/* Receives for up to ms; returns the number of messages, keeping the
 * last RegisterAck's accepted (1) / refused (2) state in *ack_p. */
static int drain_msgs(void *s, int ms, int *ack_p)
{
    uint64_t until = bt_time_ns() + (uint64_t)ms * 1000000ull;
    int n = 0;

    while (bt_time_ns() < until) {
        zmq_pollitem_t it = { s, 0, ZMQ_POLLIN, 0 };
        bt_zmq_msg_t zm;
        Baton__ControlMessage *m = NULL;
        char err[128];

        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        if (bt_zmq_recv(s, ZMQ_DONTWAIT, &zm) != BT_OK)
            continue;
        n++;
        if (proto_control_decode(bt_zmq_frame_data(&zm, 0),
                                 bt_zmq_frame_size(&zm, 0), &m, err,
                                 sizeof(err)) == BT_OK &&
            m->body_case == BATON__CONTROL_MESSAGE__BODY_REGISTER_ACK &&
            ack_p != NULL && !m->register_ack->reregister)
            *ack_p = m->register_ack->refused != NULL ? 2 : 1;
        proto_control_free(&m);
        bt_zmq_msg_close(&zm);
    }
    return n;
}

/* Keeps a raw registration alive for ms (heartbeats every 50 ms). */
static void pump(void *s, int ms, int *ack_p)
{
    for (int t = 0; t < ms; t += 50) {
        send_body(s, BATON__CONTROL_MESSAGE__BODY_HEARTBEAT, NULL);
        drain_msgs(s, 50, ack_p);
    }
}

static bool has_worker(client_t *ctl, const char *name, int *draining_p)
{
    uint64_t rid;

    if (draining_p != NULL)
        *draining_p = 0;
    BT_ASSERT_OK(client_status_request(ctl, &rid));
    for (;;) {
        Baton__ClientMessage *m = NULL;
        bool found = false;
        BT_ASSERT_OK(client_recv(ctl, 3000, &m));
        if (m->body_case != BATON__CLIENT_MESSAGE__BODY_STATUS ||
            m->status->client_request_id != rid) {
            proto_client_free(&m);
            continue;
        }
        for (size_t i = 0; i < m->status->n_workers; i++)
            if (strcmp(m->status->workers[i]->name, name) == 0) {
                found = true;
                if (draining_p != NULL)
                    *draining_p = m->status->workers[i]->draining;
            }
        proto_client_free(&m);
        return found;
    }
}

static int count_in_file(const char *path, const char *needle)
{
    char *text = NULL, *p;
    size_t len;
    int n = 0;

    if (bt_read_file(path, 16 << 20, &text, &len) != BT_OK)
        return 0;
    for (p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    bt_free(text);
    return n;
}

// ---------------------------------------------------------------------------
// A TCP relay that records what the worker side sends

typedef struct {
    int lfd;            /* listening socket */
    int port;           /* its port */
    int target;         /* router control port */
    uint8_t rec[65536]; /* (n_rec) bytes client -> router */
    size_t n_rec;
    volatile int stop;
} relay_t;

static int tcp_connect(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BT_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    return fd;
}

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    int c = accept(r->lfd, NULL, NULL), s;
    uint8_t buf[8192];

    if (c < 0)
        return NULL;
    s = tcp_connect(r->target);
    while (!r->stop) {
        struct pollfd p[2] = { { c, POLLIN, 0 }, { s, POLLIN, 0 } };
        ssize_t n;
        if (poll(p, 2, 50) <= 0)
            continue;
        if (p[0].revents) {
            n = read(c, buf, sizeof(buf));
            if (n <= 0)
                break;
            if (r->n_rec + (size_t)n <= sizeof(r->rec)) {
                memcpy(r->rec + r->n_rec, buf, (size_t)n);
                r->n_rec += (size_t)n;
            }
            if (write(s, buf, (size_t)n) != n)
                break;
        }
        if (p[1].revents) {
            n = read(s, buf, sizeof(buf));
            if (n <= 0 || write(c, buf, (size_t)n) != n)
                break;
        }
    }
    close(c);
    close(s);
    return NULL;
}

static void relay_start(relay_t *r, int target, pthread_t *th)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);

    memset(r, 0, sizeof(*r));
    r->target = target;
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BT_CHECK(bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    BT_CHECK(listen(r->lfd, 1) == 0);
    BT_CHECK(getsockname(r->lfd, (struct sockaddr *)&a, &alen) == 0);
    r->port = ntohs(a.sin_port);
    BT_CHECK(pthread_create(th, NULL, relay_main, r) == 0);
}

/* Registers `name` through a recording relay, vanishes without a
 * Shutdown, waits until the router dropped it, then replays the recorded
 * bytes on a fresh TCP connection.  Returns how many times the router
 * logged the name's registration (1: the replay did nothing). */
static int replay_registration(void *ctx, int control_port, const char *log,
                               const bt_curve_client_t *curve,
                               client_t *ctl)
{
    relay_t *r = bt_calloc(1, sizeof(*r), "test_relay");
    char ep[64], needle[64];
    pthread_t th;
    int ack = 0, fd, n;
    void *s;

    relay_start(r, control_port, &th);
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", r->port);
    s = raw_dealer(ctx, ep, "ghost#42", curve);
    send_register(s, "ghost");
    drain_msgs(s, 1500, &ack);
    BT_ASSERT_EQ(ack, 1);
    zmq_close(s);
    r->stop = 1;
    pthread_join(th, NULL);
    close(r->lfd);
    BT_CHECK(r->n_rec > 64);
    /* heartbeat-ms 100 x 4: gone within a second */
    for (int t = 0; t < 5000 && has_worker(ctl, "ghost", NULL); t += 100)
        usleep(100000);
    BT_CHECK(!has_worker(ctl, "ghost", NULL));
    /* Paced as a real peer sends: the greeting's two parts, then one
     * ZMTP frame at a time (libzmq drops a peer whose greeting and first
     * command arrive in one read). */
    fd = tcp_connect(control_port);
    {
        size_t off = 0, end;
        while (off < r->n_rec) {
            if (off == 0) {
                end = 10;
            } else if (off == 10) {
                end = 64;
            } else if (r->rec[off] & 0x02) { /* long frame: 8-byte size */
                uint64_t len = 0;
                for (int i = 1; i <= 8 && off + i < r->n_rec; i++)
                    len = (len << 8) | r->rec[off + i];
                end = off + 9 + (size_t)len;
            } else {
                end = off + 2 + (off + 1 < r->n_rec ? r->rec[off + 1] : 0);
            }
            if (end > r->n_rec)
                end = r->n_rec;
            if (write(fd, r->rec + off, end - off) != (ssize_t)(end - off))
                break; /* the router closed it */
            off = end;
            usleep(50000);
        }
    }
    usleep(300000);
    close(fd);
    snprintf(needle, sizeof(needle), "worker ghost registered");
    n = count_in_file(log, needle);
    bt_free(r);
    return n;
}

// ---------------------------------------------------------------------------

static void run_curve(void)
{
    char listen[64], control[64], wdir[320], rkey[320], cpub[320];
    char rlog[320], elog[320], sec[320], rpub[320];
    bt_curve_client_t ck, bad, thief, victim, evil;
    client_config_t cc;
    client_t *c = NULL, *ctl = NULL, *cbad = NULL;
    cu_result_t res[4];
    void *ctx = zmq_ctx_new(), *s, *v, *t;
    pid_t evil_pid;
    int ack, draining;

    const char *names[] = { "router", "pre", "dec", "thief", "victim",
                            "evil", "client", "badclient" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        keygen(names[i]);
    snprintf(wdir, sizeof(wdir), "%s/workers", g_dir);
    BT_CHECK(mkdir(wdir, 0700) == 0);
    {
        const char *allowed[] = { "pre", "dec", "thief", "victim" };
        for (int i = 0; i < 4; i++) {
            char src[320], dst[400], cmd[900];
            key_path(src, sizeof(src), allowed[i], "pub");
            snprintf(dst, sizeof(dst), "%s/%s.pub", wdir, allowed[i]);
            snprintf(cmd, sizeof(cmd), "cp %s %s", src, dst);
            BT_ASSERT_OK(system(cmd));
        }
    }
    key_path(rkey, sizeof(rkey), "router", "key");
    key_path(rpub, sizeof(rpub), "router", "pub");
    key_path(cpub, sizeof(cpub), "client", "pub");
    snprintf(rlog, sizeof(rlog), "%s/router.log", g_dir);
    cu_router_addrs(listen, control);
    cu_spawn_log(rlog, "baton-router", "--listen", listen, "--control",
                 control, "--heartbeat-ms", "100", "--curve-secret-key",
                 rkey, "--allow-workers", wdir, "--allow-clients", cpub,
                 NULL);
    key_path(sec, sizeof(sec), "pre", "key");
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", "--curve-secret-key", sec, "--router-public-key", rpub,
             NULL);
    key_path(sec, sizeof(sec), "dec", "key");
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", "--curve-secret-key", sec, "--router-public-key", rpub,
             NULL);
    ck = curve_of("client");
    bad = curve_of("badclient");
    thief = curve_of("thief");
    victim = curve_of("victim");
    evil = curve_of("evil");
    client_config_init(&cc);
    cc.curve = &ck;
    BT_ASSERT_OK(client_create_cfg(listen, &cc, &c));
    BT_ASSERT_OK(client_create_cfg(listen, &cc, &ctl));
    cu_wait_workers(ctl, 1, 1, 20000);

    fprintf(stderr, "1. a CURVE cluster serves\n");
    {
        client_request_t req;
        int ids[3] = { 1, 2, 3 };
        memset(res, 0, sizeof(res));
        client_request_init(&req);
        req.prompt_ids = ids;
        req.n_prompt_ids = 3;
        req.max_tokens = 8;
        req.ignore_eos = true;
        for (int i = 0; i < 4; i++)
            BT_ASSERT_OK(client_submit(c, &req, &res[i].rid));
        cu_collect(c, res, 4, 20000);
        for (int i = 0; i < 4; i++) {
            BT_ASSERT_EQ(res[i].finished, 1);
            BT_ASSERT_EQ(res[i].n_ids, 8);
        }
    }

    fprintf(stderr, "2. an unlisted worker key cannot register\n");
    s = raw_dealer(ctx, control, "evil#1", &evil);
    send_register(s, "evil");
    send_body(s, BATON__CONTROL_MESSAGE__BODY_HEARTBEAT, NULL);
    BT_ASSERT_EQ(drain_msgs(s, 1500, NULL), 0); /* not one message */
    zmq_close(s);
    key_path(sec, sizeof(sec), "evil", "key");
    snprintf(elog, sizeof(elog), "%s/evil.log", g_dir);
    evil_pid = cu_spawn_log(elog, "baton-decode", "--router", control,
                            "--null-model", "--name", "evil",
                            "--curve-secret-key", sec, "--router-public-key",
                            rpub, NULL);
    usleep(1500000);
    BT_CHECK(!has_worker(ctl, "evil", NULL));
    BT_CHECK(count_in_file(rlog, "refused worker connection") >= 2);
    BT_ASSERT_EQ(count_in_file(elog, "this worker's key is not allowed"), 1);
    cu_kill(evil_pid, SIGKILL);

    fprintf(stderr, "3. an unlisted client key gets no reply\n");
    {
        Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
        Baton__StatusRequest sr = BATON__STATUS_REQUEST__INIT;
        Baton__ClientMessage *m = NULL;
        uint64_t rid;
        const bt_curve_client_t *keys[2] = { &bad, NULL };

        msg.version = BT_PROTO_VERSION;
        msg.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS_REQUEST;
        sr.has_client_request_id = 1;
        sr.client_request_id = 1;
        msg.status_request = &sr;
        for (int k = 0; k < 2; k++) { /* unlisted key; no CURVE at all */
            s = raw_dealer(ctx, listen, NULL, keys[k]);
            BT_ASSERT_OK(proto_client_send(s, NULL, 0, &msg));
            BT_ASSERT_EQ(drain_msgs(s, 1500, NULL), 0);
            zmq_close(s);
        }
        /* Through the library: only its own ROUTER_LOST, after the
         * connect timeout. */
        cc.curve = &bad;
        cc.connect_timeout_ms = 1000;
        BT_ASSERT_OK(client_create_cfg(listen, &cc, &cbad));
        BT_ASSERT_OK(client_status_request(cbad, &rid));
        BT_ASSERT_OK(client_recv(cbad, 5000, &m));
        BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_ERROR);
        BT_ASSERT_EQ(m->error->code, BATON__ERROR_CODE__ERROR_ROUTER_LOST);
        proto_client_free(&m);
        BT_CHECK(client_recv(cbad, 500, &m) == BT_ERR_TIMEOUT);
        client_destroy(&cbad);
        BT_CHECK(count_in_file(rlog, "refused client connection") >= 2);
    }

    fprintf(stderr, "4. a listed key cannot take over another worker\n");
    v = raw_dealer(ctx, control, "victim#0001", &victim);
    ack = 0;
    send_register(v, "victim");
    pump(v, 300, &ack);
    BT_ASSERT_EQ(ack, 1);
    /* 4a. its name, from the thief's own connection: refused */
    t = raw_dealer(ctx, control, "thief#0002", &thief);
    ack = 0;
    send_register(t, "victim");
    send_body(t, BATON__CONTROL_MESSAGE__BODY_DRAIN, "victim");
    send_body(t, BATON__CONTROL_MESSAGE__BODY_SHUTDOWN, "victim");
    for (int i = 0; i < 10; i++) {
        send_body(v, BATON__CONTROL_MESSAGE__BODY_HEARTBEAT, NULL);
        drain_msgs(t, 50, &ack);
        drain_msgs(v, 50, NULL);
    }
    BT_ASSERT_EQ(ack, 2);
    zmq_close(t);
    /* 4b. its routing id (as if leaked), from the thief's key: the
     * duplicate connection is ignored, nothing reaches the router */
    t = raw_dealer(ctx, control, "victim#0001", &thief);
    ack = 0;
    send_register(t, "victim");
    send_body(t, BATON__CONTROL_MESSAGE__BODY_DRAIN, "victim");
    send_body(t, BATON__CONTROL_MESSAGE__BODY_SHUTDOWN, "victim");
    for (int i = 0; i < 10; i++) {
        send_body(v, BATON__CONTROL_MESSAGE__BODY_HEARTBEAT, NULL);
        BT_ASSERT_EQ(drain_msgs(t, 50, &ack), 0);
        drain_msgs(v, 50, NULL);
    }
    zmq_close(t);
    pump(v, 300, NULL);
    BT_CHECK(has_worker(ctl, "victim", &draining));
    BT_ASSERT_EQ(draining, 0);
    BT_ASSERT_EQ(count_in_file(rlog, "worker victim registered"), 1);
    BT_ASSERT_EQ(count_in_file(rlog, "worker victim (decode) dropped"), 0);
    /* 4c. a real worker process with a listed key and d0's name */
    {
        char tlog[320];
        pid_t tp;
        int code;
        key_path(sec, sizeof(sec), "thief", "key");
        snprintf(tlog, sizeof(tlog), "%s/thief.log", g_dir);
        tp = cu_spawn_log(tlog, "baton-decode", "--router", control,
                          "--null-model", "--name", "d0",
                          "--curve-secret-key", sec, "--router-public-key",
                          rpub, NULL);
        for (int i = 0; i < 30; i++)
            pump(v, 100, NULL);
        code = cu_wait_exit(tp, 100);
        if (code == -1)
            cu_kill(tp, SIGKILL);
        BT_CHECK(count_in_file(tlog, "registered by another CURVE key") +
                     count_in_file(rlog, "registered by another CURVE key") >
                 0);
        BT_ASSERT_EQ(count_in_file(rlog, "worker d0 registered"), 1);
    }
    send_body(v, BATON__CONTROL_MESSAGE__BODY_SHUTDOWN, "victim");
    drain_msgs(v, 100, NULL);
    zmq_close(v);
    /* the cluster still serves, on d0 */
    {
        client_request_t req;
        int ids[2] = { 4, 5 };
        memset(res, 0, sizeof(res));
        client_request_init(&req);
        req.prompt_ids = ids;
        req.n_prompt_ids = 2;
        req.max_tokens = 4;
        req.ignore_eos = true;
        BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
        cu_collect(c, res, 1, 20000);
        BT_ASSERT_EQ(res[0].finished, 1);
    }

    fprintf(stderr, "5. replayed registration bytes register nothing\n");
    BT_ASSERT_EQ(replay_registration(ctx, atoi(strrchr(control, ':') + 1),
                                     rlog, &victim, ctl), 1);

    client_destroy(&c);
    client_destroy(&ctl);
    zmq_ctx_term(ctx);
}

/* The replay's control experiment: without CURVE it does register. */
static void run_plain_replay(void)
{
    char listen[64], control[64], rlog[320];
    client_t *ctl = NULL;
    void *ctx = zmq_ctx_new();
    client_config_t cc;
    static const bt_curve_client_t off = { 0 };

    fprintf(stderr, "5'. the same replay without CURVE re-registers\n");
    snprintf(rlog, sizeof(rlog), "%s/router_plain.log", g_dir);
    cu_router_addrs(listen, control);
    cu_spawn_log(rlog, "baton-router", "--listen", listen, "--control",
                 control, "--heartbeat-ms", "100", NULL);
    client_config_init(&cc);
    cc.curve = &off;
    BT_ASSERT_OK(client_create_cfg(listen, &cc, &ctl));
    BT_CHECK(!has_worker(ctl, "ghost", NULL));
    BT_ASSERT_EQ(replay_registration(ctx, atoi(strrchr(control, ':') + 1),
                                     rlog, NULL, ctl), 2);
    client_destroy(&ctl);
    zmq_ctx_term(ctx);
}

int main(void)
{
    char cmd[300];

    cu_init();
    setenv("BT_LOG", "INFO", 1);
    unsetenv("BATON_CURVE_SECRET_KEY");
    unsetenv("BATON_ROUTER_PUBLIC_KEY");
    snprintf(g_dir, sizeof(g_dir), "/tmp/bt_curve_%d_XXXXXX", (int)getpid());
    BT_CHECK(mkdtemp(g_dir) != NULL);
    run_curve();
    run_plain_replay();
    cu_kill_all();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", g_dir);
    bt_alloc_report();
    fprintf(stderr, "PASS\n");
    return 0;
}
