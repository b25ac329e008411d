/*
 * test_fence.c - no wrong token when workers pause, the router restarts,
 * names are taken or engines stall (issue 35).  Real processes on
 * loopback, the aidreams260K model; every request that finishes must
 * equal golden.jsonl exactly.
 *
 *   1. pause: the only decode worker is stopped (SIGSTOP) past the
 *      router's liveness limit while it streams 16 requests, then
 *      continued.  The router re-queues them; the worker comes back,
 *      must drop its old sequences (a new session), and serves them
 *      again: all 16 finish exact (before: 9 of 32 ended "finished" with
 *      wrong tokens).
 *   2. router restart: kill -9 of the router while 16 streams run and a
 *      restart on the same ports at once; the workers' old sequences
 *      must not feed the new router's requests: 16 new requests exact
 *      (before: request ids restarted at 1 and old sequences streamed
 *      into them).
 *   3. name takeover: a second decode worker started with a live
 *      worker's name is refused and exits with a clear error; the live
 *      one keeps serving.
 *   4. long steps: prefill steps of 1.2 s with a 300 ms liveness limit do
 *      not look like death (heartbeats come from their own thread).
 *   5. stuck engine: a decode worker whose step never ends (a 60 s step)
 *      while it still heartbeats is dropped after --stall-ms; its
 *      requests finish exact on the other decode worker.
 * About 20 s (the refused worker retries for 10 s): BT_TEST_SLOW.
 */
#include "cluster_util.h"

#define N_REQ 16

static cu_golden_t g_golden[32];
static int g_n_golden;
static char g_model[512];

static void submit_all(client_t *c, cu_result_t *res, int n)
{
    memset(res, 0, sizeof(*res) * (size_t)n);
    for (int i = 0; i < n; i++)
        res[i].rid = cu_submit_golden(c, &g_golden[i % g_n_golden]);
}

/* Every request finished (not an error) and equals golden. */
static void check_all(const cu_result_t *res, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        if (res[i].finished != 1)
            BT_TEST_FAIL("%s: request %d ended with error %d", what, i,
                         res[i].error_code);
        cu_check_golden(&res[i], &g_golden[i % g_n_golden], i);
    }
}

static pid_t spawn_router(const char *listen, const char *control,
                          const char *stall_ms)
{
    return cu_spawn("baton-router", "--listen", listen, "--control", control,
                    "--heartbeat-ms", "100", "--heartbeat-miss", "3",
                    "--stall-ms", stall_ms, "--phase-ms", "20000", NULL);
}

static void test_pause(void)
{
    static cu_result_t res[N_REQ];
    char listen[64], control[64];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0;
    int retried = 0;

    cu_router_addrs(listen, control);
    spawn_router(listen, control, "10000");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", g_model,
                  "--threads", "1", "--name", "d0", "--step-delay-ms", "15",
                  NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    submit_all(c, res, N_REQ);
    cu_stream_until(c, res, N_REQ, 3, N_REQ / 2, "no tokens before the pause");
    kill(d0, SIGSTOP);
    usleep(1000000); /* > 300 ms: the router drops d0, re-queues all */
    kill(d0, SIGCONT);
    cu_collect(c, res, N_REQ, 60000);
    check_all(res, N_REQ, "pause");
    for (int i = 0; i < N_REQ; i++)
        retried += res[i].retries > 0;
    BT_CHECK(retried > 0); /* the pause really moved requests */
    fprintf(stderr, "pause: %d of %d requests resumed, all exact\n", retried,
            N_REQ);
    client_destroy(&c);
    client_destroy(&ctl);
    cu_kill_all();
}

static void test_router_restart(void)
{
    static cu_result_t res[N_REQ];
    char listen[64], control[64];
    client_t *c = NULL, *c2 = NULL, *ctl = NULL;
    pid_t router;

    cu_router_addrs(listen, control);
    router = spawn_router(listen, control, "10000");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "d0", "--step-delay-ms", "15",
             NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    submit_all(c, res, N_REQ);
    cu_stream_until(c, res, N_REQ, 2, N_REQ / 2,
                    "no tokens before the router restart");
    cu_kill(router, SIGKILL);
    spawn_router(listen, control, "10000");
    client_destroy(&ctl);
    BT_ASSERT_OK(client_create(listen, &ctl));
    BT_ASSERT_OK(client_create(listen, &c2));
    cu_wait_workers(ctl, 1, 1, 20000);
    submit_all(c2, res, N_REQ); /* the old client's requests are gone */
    cu_collect(c2, res, N_REQ, 60000);
    check_all(res, N_REQ, "router restart");
    client_destroy(&c);
    client_destroy(&c2);
    client_destroy(&ctl);
    cu_kill_all();
}

static void test_name_takeover(void)
{
    static cu_result_t res[4];
    char listen[64], control[64], log[256], *text = NULL;
    size_t len;
    client_t *c = NULL, *ctl = NULL;
    pid_t thief;
    int code;

    cu_router_addrs(listen, control);
    spawn_router(listen, control, "10000");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "d0", NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    snprintf(log, sizeof(log), "/tmp/bt_fence_thief_%d.log", (int)getpid());
    thief = cu_spawn_log(log, "baton-decode", "--router", control,
                         "--null-model", "--name", "d0", NULL);
    code = cu_wait_exit(thief, 20000);
    BT_CHECK(code != 0 && code != -1); /* exited, with an error */
    BT_ASSERT_OK(bt_read_file(log, 1 << 20, &text, &len));
    if (strstr(text, "in use by a live worker") == NULL)
        BT_TEST_FAIL("the refused worker did not say why:\n%s", text);
    bt_free(text);
    unlink(log);
    submit_all(c, res, 4); /* the real d0 still serves, exactly */
    cu_collect(c, res, 4, 30000);
    check_all(res, 4, "name takeover");
    client_destroy(&c);
    client_destroy(&ctl);
    cu_kill_all();
}

static void test_long_steps(void)
{
    static cu_result_t res[4];
    char listen[64], control[64];
    client_t *c = NULL, *ctl = NULL;
    cu_status_t st;

    cu_router_addrs(listen, control);
    spawn_router(listen, control, "10000");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "p0", "--step-delay-ms", "1200",
             NULL);
    cu_spawn("baton-decode", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "d0", NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    submit_all(c, res, 4);
    cu_collect(c, res, 4, 30000);
    check_all(res, 4, "long steps");
    for (int i = 0; i < 4; i++)
        BT_ASSERT_EQ(res[i].retries, 0); /* never dropped */
    BT_ASSERT_EQ(cu_status(ctl, &st), 0);
    BT_ASSERT_EQ(st.n_prefill, 1);
    client_destroy(&c);
    client_destroy(&ctl);
    cu_kill_all();
}

static void test_stuck_engine(void)
{
    static cu_result_t res[4];
    char listen[64], control[64];
    client_t *c = NULL, *ctl = NULL;
    uint64_t t0;

    cu_router_addrs(listen, control);
    spawn_router(listen, control, "1500");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "d0", "--step-delay-ms", "60000",
             NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    t0 = bt_time_ns();
    submit_all(c, res, 4); /* d0 takes them and sticks in its first step */
    usleep(300000);
    cu_spawn("baton-decode", "--router", control, "--model", g_model,
             "--threads", "1", "--name", "d1", NULL);
    cu_collect(c, res, 4, 30000);
    check_all(res, 4, "stuck engine");
    for (int i = 0; i < 4; i++)
        BT_CHECK(res[i].retries >= 1);
    fprintf(stderr, "stuck engine: requests resumed elsewhere in %.1f s\n",
            (double)(bt_time_ns() - t0) * 1e-9);
    client_destroy(&c);
    client_destroy(&ctl);
    cu_kill_all();
}

int main(void)
{
    cu_init();
    g_n_golden = cu_golden_load("aidreams260K.bin", g_golden, 32);
    BT_CHECK(g_n_golden > 0);
    snprintf(g_model, sizeof(g_model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    test_pause();
    test_router_restart();
    test_name_takeover();
    test_long_steps();
    test_stuck_engine();
    BT_TEST_PASS("cluster/fence: pause, router restart, name takeover, "
                 "long steps, stuck engine: every finished request exact");
    return 0;
}
