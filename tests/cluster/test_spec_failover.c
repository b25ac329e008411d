/*
 * test_spec_failover.c - kill -9 of a speculating decode worker
 * mid-stream.  d0 runs --spec-head (fixed tree, so every step drafts);
 * once every request has streamed some tokens, d1 starts (plain: no
 * head) and d0 is killed.  The router re-prefills prompt + streamed
 * tokens on d1 and every stream continues with no duplicated or missing
 * token: the ids equal golden.jsonl.  Then the other way round: a plain
 * d1 dies and a speculating d2 takes over, again exact.
 */
#include "spec_cluster_util.h"

#define N_REQ 8

/* Every request is streaming from the current decode worker once each
 * has `min_ids` ids (none still waits for a reservation that the next
 * worker could take). */
static void stream_until(client_t *c, cu_result_t *res, int min_ids)
{
    cu_stream_until(c, res, N_REQ, min_ids, N_REQ, "no tokens streamed");
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512], head[128], log[128];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0, d1, d2;
    int n_golden;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(head, sizeof(head), "/tmp/bt_spec_failover_%d.safetensors",
             (int)getpid());
    snprintf(log, sizeof(log), "/tmp/bt_spec_failover_%d.log",
             (int)getpid());
    unlink(log);
    scu_train_head(model, head);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--threads", "1", "--name", "p0", "--spec-features", NULL);
    d0 = scu_spawn_logged(log, "baton-decode", "--router", control,
                          "--model", model, "--threads", "1", "--name",
                          "d0", "--spec-head", head, "--spec", "fixed",
                          "--step-delay-ms", "150", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 1, 1, 20000);

    /* speculating d0 dies; plain d1 continues.  The step delays keep
     * every stream unfinished while the next worker starts, even on a
     * loaded machine (a speculating step emits several tokens). */
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    stream_until(c, res, 8);
    /* Freeze d0 so that nothing it does after this point can finish a
     * request while d1 starts (start-up takes seconds on a loaded
     * machine, and the client's counts are not updated meanwhile). */
    kill(d0, SIGSTOP);
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d1", "--step-delay-ms", "25",
                  NULL);
    /* Far from done (a speculating step emits up to ~6 tokens, and the
     * client sees them a little late), so d0 dies mid-stream. */
    for (int i = 0; i < N_REQ; i++)
        BT_CHECK(res[i].n_ids + 30 < golden[i % n_golden].n_expect);
    cu_kill(d0, SIGKILL);
    cu_wait_workers(ctl, 1, 1, 20000); /* d1 (the router drops d0) */
    BT_CHECK(cu_count_lines(log, "first decode step: drafted ") > 0);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++)
        fprintf(stderr, "phase 1 request %d: %d ids, %d retries\n", i,
                res[i].n_ids, res[i].retries);
    for (int i = 0; i < N_REQ; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        BT_ASSERT_EQ(res[i].retries, 1);
    }

    /* plain d1 dies; speculating d2 continues */
    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[(i + 1) % n_golden]);
    stream_until(c, res, 8);
    kill(d1, SIGSTOP); /* as d0 above */
    d2 = scu_spawn_logged(log, "baton-decode", "--router", control,
                          "--model", model, "--threads", "1", "--name",
                          "d2", "--spec-head", head, NULL);
    cu_kill(d1, SIGKILL);
    cu_wait_workers(ctl, 1, 1, 20000);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++) {
        cu_check_golden(&res[i], &golden[(i + 1) % n_golden], i);
        BT_ASSERT_EQ(res[i].retries, 1);
    }
    client_destroy(&c);
    client_destroy(&ctl);
    (void)d2;
    unlink(head);
    unlink(log);
    BT_TEST_PASS("cluster/spec_failover: kill -9 of a speculating decode "
                 "worker (and of a plain one), exact");
    return 0;
}
