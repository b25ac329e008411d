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

/* A router (--stall-ms `stall_ms`), prefill p0 and decode d0 with the
 * step delays given ("0": none), a client for requests and one for
 * status polls; returns once both workers registered. */
typedef struct {
    char listen[64];
    char control[64];
    client_t *c;
    client_t *ctl;
    pid_t router;
    pid_t p0;
    pid_t d0;
} fence_t;

static void fence_start(fence_t *f, const char *stall_ms,
                        const char *p_delay, const char *d_delay)
{
    memset(f, 0, sizeof(*f));
    cu_router_addrs(f->listen, f->control);
    f->router = spawn_router(f->listen, f->control, stall_ms);
    BT_ASSERT_OK(client_create(f->listen, &f->c));
    BT_ASSERT_OK(client_create(f->listen, &f->ctl));
    f->p0 = cu_spawn("baton-prefill", "--router", f->control, "--model",
                     g_model, "--threads", "1", "--name", "p0",
                     "--step-delay-ms", p_delay, NULL);
    f->d0 = cu_spawn("baton-decode", "--router", f->control, "--model",
                     g_model, "--threads", "1", "--name", "d0",
                     "--step-delay-ms", d_delay, NULL);
    cu_wait_workers(f->ctl, 1, 1, 20000);
}

static void fence_stop(fence_t *f)
{
    client_destroy(&f->c);
    client_destroy(&f->ctl);
    cu_kill_all();
}

static void test_pause(void)
{
    static cu_result_t res[N_REQ];
    fence_t f;
    int retried = 0;

    fence_start(&f, "10000", "0", "15");
    submit_all(f.c, res, N_REQ);
    cu_stream_until(f.c, res, N_REQ, 3, N_REQ / 2,
                    "no tokens before the pause");
    kill(f.d0, SIGSTOP);
    /* stopped until the router has dropped d0 (its liveness limit is
     * 300 ms; on a loaded machine the router may take longer to see it)
     * and re-queued what it streamed */
    cu_wait_workers(f.ctl, 1, 0, 20000);
    kill(f.d0, SIGCONT);
    cu_collect(f.c, res, N_REQ, 60000);
    check_all(res, N_REQ, "pause");
    for (int i = 0; i < N_REQ; i++)
        retried += res[i].retries > 0;
    BT_CHECK(retried > 0); /* the pause really moved requests */
    fprintf(stderr, "pause: %d of %d requests resumed, all exact\n", retried,
            N_REQ);
    fence_stop(&f);
}

static void test_router_restart(void)
{
    static cu_result_t res[N_REQ];
    fence_t f;
    client_t *c2 = NULL;

    fence_start(&f, "10000", "0", "15");
    submit_all(f.c, res, N_REQ);
    cu_stream_until(f.c, res, N_REQ, 2, N_REQ / 2,
                    "no tokens before the router restart");
    cu_kill(f.router, SIGKILL);
    spawn_router(f.listen, f.control, "10000");
    client_destroy(&f.ctl);
    BT_ASSERT_OK(client_create(f.listen, &f.ctl));
    BT_ASSERT_OK(client_create(f.listen, &c2));
    cu_wait_workers(f.ctl, 1, 1, 20000);
    submit_all(c2, res, N_REQ); /* the old client's requests are gone */
    cu_collect(c2, res, N_REQ, 60000);
    check_all(res, N_REQ, "router restart");
    client_destroy(&c2);
    fence_stop(&f);
}

static void test_name_takeover(void)
{
    static cu_result_t res[4];
    char log[256], *text = NULL;
    size_t len;
    fence_t f;
    pid_t thief;
    int code;

    fence_start(&f, "10000", "0", "0");
    snprintf(log, sizeof(log), "/tmp/bt_fence_thief_%d.log", (int)getpid());
    thief = cu_spawn_log(log, "baton-decode", "--router", f.control,
                         "--null-model", "--name", "d0", NULL);
    code = cu_wait_exit(thief, 20000);
    BT_CHECK(code != 0 && code != -1); /* exited, with an error */
    BT_ASSERT_OK(bt_read_file(log, 1 << 20, &text, &len));
    if (strstr(text, "in use by a live worker") == NULL)
        BT_TEST_FAIL("the refused worker did not say why:\n%s", text);
    bt_free(text);
    unlink(log);
    submit_all(f.c, res, 4); /* the real d0 still serves, exactly */
    cu_collect(f.c, res, 4, 30000);
    check_all(res, 4, "name takeover");
    fence_stop(&f);
}

static void test_long_steps(void)
{
    static cu_result_t res[4];
    fence_t f;
    cu_status_t st;

    fence_start(&f, "10000", "1200", "0");
    submit_all(f.c, res, 4);
    cu_collect(f.c, res, 4, 30000);
    check_all(res, 4, "long steps");
    for (int i = 0; i < 4; i++)
        BT_ASSERT_EQ(res[i].retries, 0); /* never dropped */
    BT_ASSERT_EQ(cu_status(f.ctl, &st), 0);
    BT_ASSERT_EQ(st.n_prefill, 1);
    fence_stop(&f);
}

static void test_stuck_engine(void)
{
    static cu_result_t res[4];
    fence_t f;
    uint64_t t0;

    fence_start(&f, "1500", "0", "60000");
    t0 = bt_time_ns();
    submit_all(f.c, res, 4); /* d0 takes them and sticks in its first step */
    usleep(300000);
    cu_spawn("baton-decode", "--router", f.control, "--model", g_model,
             "--threads", "1", "--name", "d1", NULL);
    cu_collect(f.c, res, 4, 30000);
    check_all(res, 4, "stuck engine");
    for (int i = 0; i < 4; i++)
        BT_CHECK(res[i].retries >= 1);
    fprintf(stderr, "stuck engine: requests resumed elsewhere in %.1f s\n",
            (double)(bt_time_ns() - t0) * 1e-9);
    fence_stop(&f);
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
