/*
 * test_failover.c - worker failure mid-request.  kill -9 of a prefill
 * worker while it holds prompts: they are prefilled again elsewhere.
 * kill -9 of a decode worker mid-stream: its requests are re-prefilled
 * (prompt + tokens already streamed) on the other decode worker and each
 * stream continues with no duplicated or missing token.  Every output
 * must still equal golden.jsonl.  Workers are slowed (--step-delay-ms)
 * so the kills land mid-flight.
 */
#include "cluster_util.h"

#define N_REQ 8

static void start_cluster(const char *control, const char *model,
                          pid_t *p, pid_t *d)
{
    p[0] = cu_spawn("baton-prefill", "--router", control, "--model", model,
                    "--threads", "1", "--name", "p0", "--step-delay-ms",
                    "400", NULL);
    d[0] = cu_spawn("baton-decode", "--router", control, "--model", model,
                    "--threads", "1", "--name", "d0", "--step-delay-ms", "8",
                    NULL);
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512];
    client_t *c = NULL, *ctl = NULL; /* ctl: status queries only */
    pid_t p[2], d[2];
    int n_golden, retried = 0;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));

    /* Phase 1: the only prefill worker dies holding every prompt; a
     * second one (started after) takes them over. */
    start_cluster(control, model, p, d);
    cu_wait_workers(ctl, 1, 1, 20000);
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    usleep(150000);
    cu_kill(p[0], SIGKILL);
    p[1] = cu_spawn("baton-prefill", "--router", control, "--model", model,
                    "--threads", "1", "--name", "p1", NULL);
    /* Phase 2: once tokens stream from d0, start a second decode worker
     * and kill the first mid-stream. */
    cu_stream_until(c, res, N_REQ, 10, N_REQ / 2,
                    "no tokens after the prefill worker died");
    /* Freeze d0 while d1 starts: on a loaded machine start-up takes
     * seconds, and d0 must not finish any stream meanwhile. */
    kill(d[0], SIGSTOP);
    d[1] = cu_spawn("baton-decode", "--router", control, "--model", model,
                    "--threads", "1", "--name", "d1", "--step-delay-ms", "2",
                    NULL);
    for (int i = 0; i < N_REQ; i++)
        BT_CHECK(res[i].n_ids < golden[i % n_golden].n_expect);
    cu_kill(d[0], SIGKILL);
    cu_wait_workers(ctl, 1, 1, 20000);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        retried += res[i].retries > 0;
    }
    for (int i = 0; i < N_REQ; i++)
        fprintf(stderr, "request %d: %d retries\n", i, res[i].retries);
    BT_CHECK(retried == N_REQ); /* every one lost its prefill worker */
    for (int i = 0; i < N_REQ; i++) /* and then their decode worker */
        BT_ASSERT_EQ(res[i].retries, 2);
    client_destroy(&c);
    client_destroy(&ctl);
    (void)d;
    BT_TEST_PASS("cluster/failover: kill -9 prefill and decode, exact");
    return 0;
}
