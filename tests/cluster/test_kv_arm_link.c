/*
 * test_kv_arm_link.c - a decode worker arms only the KV link the router
 * announced in KvReserve.kv_transport (issue 36): a receive window is
 * mapped only for a hand-off that will write through one.  Real router,
 * prefill and decode processes (aidreams260K, CPU, UCX on shared memory
 * with receive windows, the default), counted by the decode worker's
 * baton_worker_kv_windows_total:
 *   1. an aggregated worker (--role both) prefills N golden prompts
 *      itself (link local): exact outputs, 0 windows (before issue 36
 *      every grant mapped one and unmapped it unused).
 *   2. 1 prefill + 1 decode worker, the router's automatic link (ucx
 *      over shared memory): exact outputs, one window per grant (N plus
 *      the retries), and the KV blocks arrived at the decode worker.
 *   3. the same pair with the router forcing --kv-transport inline: exact
 *      outputs, the KV arrived, 0 windows.
 *   4. the router forcing ucx-stage, both workers --kv-stage-host, but a
 *      1-block receive area on the decode worker (its prefix cache off,
 *      so every hand-off needs a prompt's 2 blocks): every grant comes
 *      without receive blocks (the armed link failed), the router sends
 *      the task inline rather than over the UCX link nothing was armed
 *      for (its debug line, once a request): exact outputs, the KV
 *      arrived, 0 windows.
 */
#include "cluster_util.h"
#include "bt_prom_test.h"

#define N_REQ 6

static const char *const windows_metric = "baton_worker_kv_windows_total";
static const char *const received_metric =
    "baton_worker_kv_blocks_received_total";

/* One cluster: a router (with `router_mode` as --kv-transport, or the
 * automatic choice when NULL), a decode worker with a metrics port
 * (--role both when `agg`, else beside a prefill worker), N_REQ golden
 * requests.  `stage`: both workers run the staged receiver over their
 * CPU pools, the decode worker's receive area too small for any prompt.
 * Returns the windows the decode worker mapped minus the retries (each
 * retry is a new grant); *received_p: KV blocks that arrived there over
 * a hand-off; *downgraded_p: tasks the router sent inline because their
 * link was not the one announced. */
static double run_cluster(const cu_golden_t *golden, int n_golden, bool agg,
                          const char *router_mode, bool stage,
                          double *received_p, int *downgraded_p)
{
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512], tok[512], mport_s[16];
    char router_log[128];
    client_t *c = NULL, *ctl = NULL;
    pid_t router, d0, p0 = 0;
    int mport = cu_free_port(), retries = 0;
    double windows;

    cu_router_addrs(listen, control);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    snprintf(router_log, sizeof(router_log), "/tmp/bt_kv_arm_link_%d.log",
             (int)getpid());
    setenv("BT_LOG", "debug", 1); /* its line for a task sent inline */
    router = cu_spawn_log(router_log, "baton-router", "--listen", listen,
                          "--control", control, "--heartbeat-ms", "100",
                          "--heartbeat-miss", "3",
                          router_mode ? "--kv-transport" : NULL, router_mode,
                          NULL);
    unsetenv("BT_LOG");
    if (stage)
        d0 = cu_spawn("baton-decode", "--router", control, "--model",
                      model, "--tokenizer", tok, "--threads", "1", "--name",
                      "d0", "--metrics-port", mport_s, "--block-size", "4",
                      "--kv-stage-host", "--kv-stage-blocks", "1",
                      /* request 5 repeats request 0's prompt: a cached
                       * first block would leave one block to receive,
                       * which fits, whenever request 0 ended first */
                      "--prefix-cache", "off", NULL);
    else
        d0 = cu_spawn("baton-decode", "--router", control, "--model",
                      model, "--tokenizer", tok, "--threads", "1", "--name",
                      "d0", "--metrics-port", mport_s,
                      agg ? "--role" : NULL, "both", NULL);
    if (!agg)
        p0 = cu_spawn("baton-prefill", "--router", control, "--model",
                      model, "--tokenizer", tok, "--threads", "1", "--name",
                      "p0", stage ? "--kv-stage-host" : NULL,
                      "--block-size", "4", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, agg ? 0 : 1, 1, 20000);

    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++) {
        cu_check_golden(&res[i], &golden[i % n_golden], i);
        retries += res[i].retries;
    }
    cu_wait_kv_idle(ctl, 5000);
    /* the worker publishes its counters once a turn: read them settled
     * (two reads 100 ms apart agree) */
    windows = -2;
    for (int t = 0; t < 30; t++) {
        double w = prom_scrape(mport, windows_metric);
        double rcv = prom_scrape(mport, received_metric);
        if (w == windows && rcv == *received_p)
            break;
        windows = w;
        *received_p = rcv;
        usleep(100000);
    }
    fprintf(stderr, "%s%s: %.0f windows, %.0f KV blocks received, %d "
            "retries\n", agg ? "aggregated" : "1P+1D ",
            agg ? "" : router_mode ? router_mode : "auto", windows,
            *received_p, retries);
    BT_CHECK(windows >= 0); /* the decode worker answered */
    client_destroy(&c);
    client_destroy(&ctl);
    if (p0 != 0)
        cu_kill(p0, SIGKILL);
    cu_kill(d0, SIGKILL);
    /* a clean stop: every log line written before they are counted */
    cu_kill(router, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(router, 10000), 0);
    *downgraded_p = cu_count_lines(router_log, "was armed, not ");
    unlink(router_log);
    return windows - retries;
}

int main(void)
{
    static cu_golden_t golden[32];
    double received;
    int n_golden, downgraded;

    setenv("UCX_TLS", "tcp,sm,self", 0);
    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);

    /* 1: prefilled in place: nothing to receive, no window */
    BT_ASSERT_EQ(run_cluster(golden, n_golden, true, NULL, false, &received,
                             &downgraded),
                 0);
    BT_ASSERT_EQ(received, 0);
    BT_ASSERT_EQ(downgraded, 0);

    /* 2: UCX hand-offs: one window per grant, and the KV came */
    BT_ASSERT_EQ(run_cluster(golden, n_golden, false, NULL, false, &received,
                             &downgraded),
                 N_REQ);
    BT_CHECK(received >= N_REQ);
    BT_ASSERT_EQ(downgraded, 0);

    /* 3: inline hand-offs: the KV came, no window */
    BT_ASSERT_EQ(run_cluster(golden, n_golden, false, "inline", false,
                             &received, &downgraded),
                 0);
    BT_CHECK(received >= N_REQ);
    BT_ASSERT_EQ(downgraded, 0);

    /* 4: the staged link announced, its receive area refused: inline,
     * not over a link nothing was armed for */
    BT_ASSERT_EQ(run_cluster(golden, n_golden, false, "ucx-stage", true,
                             &received, &downgraded),
                 0);
    BT_CHECK(received >= N_REQ);
    BT_ASSERT_EQ(downgraded, N_REQ);

    BT_TEST_PASS("cluster/kv_arm_link: no receive window for local or "
                 "inline hand-offs, one per grant for UCX ones; a task "
                 "whose announced link was not armed goes inline");
    return 0;
}
