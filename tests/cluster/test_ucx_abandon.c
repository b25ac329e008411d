/*
 * test_ucx_abandon.c - the prefill worker's commit timeout over the plain
 * UCX transport (no peer error handling, as on one host): it must tell a
 * dead decode worker from a live one that its own slow loop kept waiting.
 *
 * Each hand-off's commit needs the decode worker's progress (the epoch
 * goes to its malloc'ed arrival slots by software RMA; the KV itself to a
 * shared-memory receive window, and with --kv-pool-malloc, which only
 * matters under --kv-direct-writes, to its pool by software RMA too): a
 * dead one never completes it.  The
 * prefill worker's forwards take 400 ms (--step-delay-ms), longer than
 * its 300 ms commit timeout; the router drops a silent worker only after
 * 30 s, so only the timeout can end a hand-off to a dead process.
 *
 *   1. Live but slow: prompts arrive 150 ms apart, so a commit is still
 *      in flight while the next prompt's forward holds the loop.  None
 *      may time out (the timeout counts from the last completed
 *      operation on the endpoint, not from the end of compute).
 *   2. kill -9 of d0 while its prompts wait in the step delay: each is
 *      retried exactly once on d1, and the prefill worker abandons the
 *      dead endpoint and closes it at once (it used to stay open, with
 *      its stuck operations, until the worker exited).
 *   3. The prefill worker keeps serving through d1, staggered as in 1,
 *      without a retry, and shuts down cleanly.
 */
#include "cluster_util.h"

#define N_SLOW 6
#define N_KILL 6

/* Submits n golden requests `gap_ms` apart and collects them exact;
 * returns how many were retried. */
static int run_spaced(client_t *c, const cu_golden_t *golden, int n_golden,
                      cu_result_t *res, int n, int gap_ms)
{
    int retried = 0;

    memset(res, 0, sizeof(*res) * (size_t)n);
    for (int i = 0; i < n; i++) {
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
        usleep((useconds_t)gap_ms * 1000u);
    }
    cu_collect(c, res, n, 30000);
    for (int i = 0; i < n; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        retried += res[i].retries > 0;
    }
    return retried;
}

/* The prefill worker's log from byte `from` on (NUL-terminated; the
 * caller frees it), "" when it cannot be read. */
static char *log_read(const char *log, size_t from)
{
    char *text = NULL;
    size_t len = 0;

    if (bt_read_file(log, 1 << 24, &text, &len) != BT_OK || len < from) {
        bt_free(text);
        text = bt_calloc(1, 1, "test");
        BT_CHECK(text != NULL);
        return text;
    }
    memmove(text, text + from, len - from + 1);
    return text;
}

/* Bytes in the log now: later searches start there. */
static size_t log_mark(const char *log)
{
    char *text = log_read(log, 0);
    size_t n = strlen(text);

    bt_free(text);
    return n;
}

/* How many times `what` occurs in the log from byte `from` on. */
static int log_count(const char *log, size_t from, const char *what)
{
    char *text = log_read(log, from), *p;
    int n = 0;

    for (p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    bt_free(text);
    return n;
}

/* Waits (bounded) until the log holds `what` after byte `from`. */
static void wait_log(const char *log, size_t from, const char *what,
                     int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 20) {
        if (log_count(log, from, what) > 0)
            return;
        usleep(20000);
    }
    BT_TEST_FAIL("no \"%s\" in the prefill worker's log after %d ms", what,
                 timeout_ms);
}

/* The KV pool of the first endpoint dropped after byte `from` (16 hex
 * digits). */
static void dropped_pool(const char *log, size_t from, char *id, size_t n)
{
    static const char key[] = "dropping the endpoint to KV pool ";
    char *text = log_read(log, from);
    char *p = strstr(text, key);

    BT_CHECK(p != NULL);
    snprintf(id, n, "%.16s", p + strlen(key));
    bt_free(text);
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_KILL + N_SLOW];
    char listen[64], control[64], model[512], log[256], pool[17];
    char closed[64];
    client_t *c = NULL, *ctl = NULL;
    pid_t p0, d0, d1;
    int n_golden, retried;
    size_t mark;
    uint64_t t_kill;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(log, sizeof(log), "/tmp/bt_ucx_abandon_%d.log", (int)getpid());
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "300", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    setenv("BT_LOG", "info", 1); /* its endpoint life cycle */
    p0 = cu_spawn_log(log, "baton-prefill", "--router", control, "--model",
                      model, "--threads", "1", "--name", "p0",
                      "--step-delay-ms", "400", "--kv-commit-timeout-ms",
                      "300", NULL);
    unsetenv("BT_LOG");
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d0", "--kv-pool-malloc", NULL);
    cu_wait_workers(ctl, 1, 1, 20000);

    /* 1. Live but slow: no hand-off times out. */
    retried = run_spaced(c, golden, n_golden, res, N_SLOW, 150);
    fprintf(stderr, "phase 1: %d spaced requests exact, %d retried\n",
            N_SLOW, retried);
    BT_ASSERT_EQ(retried, 0);
    BT_ASSERT_EQ(log_count(log, 0, "presumed dead"), 0);

    /* 2. kill -9 of d0 mid-hand-off: the commit timeout drops its
     * endpoint and closes it; d1 comes up only then (so the router lists
     * d0's pool again after the close); one retry each. */
    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_KILL; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    usleep(150000);
    mark = log_mark(log);
    cu_kill(d0, SIGKILL);
    t_kill = bt_time_ns();
    wait_log(log, mark, "presumed dead", 5000);
    /* logged just after "presumed dead" (peer_abandon): reading the log
     * between the two lines once failed in CI */
    wait_log(log, mark, "dropping the endpoint to KV pool ", 3000);
    dropped_pool(log, mark, pool, sizeof(pool));
    snprintf(closed, sizeof(closed), "closed the endpoint to KV pool %s",
             pool);
    wait_log(log, mark, closed, 3000); /* it stayed open until exit */
    fprintf(stderr, "phase 2: endpoint to d0's pool %s closed %.2f s after "
            "the kill\n", pool, (double)(bt_time_ns() - t_kill) * 1e-9);
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d1", "--kv-pool-malloc", NULL);
    cu_collect(c, res, N_KILL, 30000);
    retried = 0;
    for (int i = 0; i < N_KILL; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        retried += res[i].retries > 0;
        if (res[i].retries > 1)
            BT_TEST_FAIL("request %llu retried %d times after one death",
                         (unsigned long long)res[i].rid, res[i].retries);
    }
    fprintf(stderr, "phase 2: %d of %d retried once, all exact %.2f s after "
            "the kill\n", retried, N_KILL,
            (double)(bt_time_ns() - t_kill) * 1e-9);
    BT_CHECK(retried > 0);
    mark = log_mark(log);

    /* 3. Still serving, slow and live, through d1: nothing abandoned. */
    retried = run_spaced(c, golden, n_golden, res, N_SLOW, 150);
    fprintf(stderr, "phase 3: %d spaced requests exact via d1, %d "
            "retried\n", N_SLOW, retried);
    BT_ASSERT_EQ(retried, 0);
    BT_ASSERT_EQ(log_count(log, mark, "presumed dead"), 0);

    cu_kill(p0, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p0, 20000), 0);
    cu_kill(d1, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(d1, 20000), 0);
    unlink(log);
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/ucx_abandon: plain UCX commit timeout tells a "
                 "dead decode worker from a slow loop");
    return 0;
}
