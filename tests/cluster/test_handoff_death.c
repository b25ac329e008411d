/*
 * test_handoff_death.c - kill -9 of a decode worker in the middle of KV
 * hand-offs, with the prefill worker's UCX endpoints WITHOUT peer error
 * handling (the default: shared memory is only used then).  UCX then never
 * reports the dead peer, so the prefill worker's commit timeout
 * (--kv-commit-timeout-ms) must end each hung hand-off; the router retries
 * the request on another decode worker.  The router's own liveness check
 * is set far longer than the test's bound, so only the timeout can end
 * them in time.  Every request must still end with exactly the golden
 * tokens, the prefill worker must keep serving, and it must shut down
 * cleanly (bounded); the timeout abandoned the dead endpoint (closed at
 * once, test_ucx_abandon.c), so shutdown has no close to wait for.
 *
 * A dead d0 hangs the commit: the epoch goes to its malloc'ed arrival
 * slots by software RMA, which needs d0's progress (the KV puts land in
 * its shared-memory receive window and complete anyway; --kv-pool-malloc
 * only matters under --kv-direct-writes).
 */
#include "cluster_util.h"

#define N_REQ 8

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ], warm, after;
    char listen[64], control[64], model[512];
    client_t *c = NULL, *ctl = NULL;
    pid_t p0, d0, d1;
    int n_golden, retried = 0;
    uint64_t t_kill;
    double secs;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    /* Liveness: a silent worker is dropped only after 30 s, so a
     * recovery well inside that comes from the commit timeout.  (Under
     * ASan on a loaded 2-core machine recovery has taken ~10 s: each
     * retry waits out the 400 ms step delay again.) */
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "300", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    p0 = cu_spawn("baton-prefill", "--router", control, "--model", model,
                  "--threads", "1", "--name", "p0", "--step-delay-ms", "400",
                  "--kv-commit-timeout-ms", "300", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d0", "--kv-pool-malloc", NULL);
    cu_wait_workers(ctl, 1, 1, 20000);

    /* A healthy hand-off first: p0 connects to d0's pool. */
    warm.rid = cu_submit_golden(c, &golden[0]);
    cu_collect(c, &warm, 1, 20000);
    cu_check_golden(&warm, &golden[0], -1);

    /* The prompts get their grants on d0 at once, then wait in p0's
     * 400 ms step delay; d0 dies meanwhile, so their puts and commits go
     * to a dead process. */
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    usleep(150000);
    cu_kill(d0, SIGKILL);
    t_kill = bt_time_ns();
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d1", NULL);
    cu_collect(c, res, N_REQ, 30000);
    secs = (double)(bt_time_ns() - t_kill) * 1e-9;
    for (int i = 0; i < N_REQ; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        retried += res[i].retries > 0;
    }
    fprintf(stderr, "%d of %d requests retried; all done %.2f s after the "
            "kill\n", retried, N_REQ, secs);
    BT_CHECK(retried == N_REQ); /* each lost its hand-off */
    BT_CHECK(secs < 20.0);      /* well before the router drops d0 */

    /* p0 keeps serving (through d1). */
    after.rid = cu_submit_golden(c, &golden[1 % n_golden]);
    cu_collect(c, &after, 1, 20000);
    cu_check_golden(&after, &golden[1 % n_golden], -1);

    /* A clean, bounded shutdown. */
    cu_kill(p0, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p0, 20000), 0);
    cu_kill(d1, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(d1, 20000), 0);
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/handoff_death: kill -9 decode mid-hand-off, "
                 "commit timeout, exact");
    return 0;
}
