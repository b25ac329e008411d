/*
 * test_aggregate_ttft.c - conditional disaggregation (issue 36 item 4,
 * `baton-router --aggregate ttft`), with real processes on 127.0.0.1: a
 * slow prefill worker (--step-delay-ms 150) beside an aggregated decode
 * worker (--role both).
 *   1. --aggregate ttft: a first request measures the prefill worker's
 *      rate; then a burst of N golden requests goes partly to the
 *      aggregated worker, whose predicted first token (its queued prompt
 *      tokens / rate) comes sooner than behind the prefill worker's
 *      queue, and partly to the prefill worker (at least one each); every
 *      request gives its golden ids.
 *   2. --aggregate fallback (the default), the same burst: every prompt
 *      goes to the prefill worker (the aggregated one only decodes).
 * Which worker prefilled is read from the router's served counts: an
 * aggregated worker that prefills its own request counts it twice.
 */
#include "cluster_util.h"

#define MODEL BT_SHARED_DIR "/models/aidreams260K.bin"
#define N_BURST 6

/* Runs golden requests [first, first + n) at once; each must give its
 * golden ids. */
static void burst(client_t *c, const cu_golden_t *golden, int n_golden,
                  int first, int n)
{
    static cu_result_t res[N_BURST];

    BT_CHECK(n <= N_BURST);
    memset(res, 0, sizeof(res));
    for (int i = 0; i < n; i++)
        res[i].rid = cu_submit_golden(c, &golden[(first + i) % n_golden]);
    cu_collect(c, res, n, 60000);
    for (int i = 0; i < n; i++)
        cu_check_golden(&res[i], &golden[(first + i) % n_golden], i);
}

/* Starts the cluster with --aggregate `mode`, runs one request, then a
 * burst; returns how many of the burst the aggregated worker prefilled
 * itself. */
static int run(const char *mode, const cu_golden_t *golden, int n_golden)
{
    char listen[64], control[64];
    client_t *c = NULL;
    uint64_t p0, a0, dp, da;

    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--aggregate", mode, NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "slowp", "--step-delay-ms", "150",
             NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "both", "--role", "both",
             "--kv-blocks", "400", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    /* the prefill worker's rate, measured and heard in a heartbeat */
    burst(c, golden, n_golden, 0, 1);
    usleep(400000);
    p0 = cu_served(c, "slowp");
    a0 = cu_served(c, "both");
    burst(c, golden, n_golden, 1, N_BURST);
    dp = cu_served(c, "slowp") - p0;
    da = cu_served(c, "both") - a0;
    fprintf(stderr, "--aggregate %s: prefill worker took %llu prompts, "
            "the aggregated worker prefilled %llu and decoded %d\n", mode,
            (unsigned long long)dp, (unsigned long long)(da - N_BURST),
            N_BURST);
    /* every request decodes on the one decode worker, and is prefilled
     * by exactly one of the two */
    BT_CHECK(da >= N_BURST);
    BT_ASSERT_EQ(dp + (da - N_BURST), (uint64_t)N_BURST);
    client_destroy(&c);
    cu_kill_all();
    return (int)(da - N_BURST);
}

int main(void)
{
    static cu_golden_t golden[8];
    int n_golden, local;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 8);
    BT_CHECK(n_golden >= 2);
    fprintf(stderr, "1. --aggregate ttft\n");
    local = run("ttft", golden, n_golden);
    BT_CHECK(local >= 1 && local <= N_BURST - 1);
    fprintf(stderr, "2. --aggregate fallback\n");
    BT_ASSERT_EQ(run("fallback", golden, n_golden), 0);
    BT_TEST_PASS("cluster/aggregate_ttft: --aggregate ttft prefills on the "
                 "aggregated worker when its first token comes sooner than "
                 "behind a busy prefill worker; fallback never does; golden "
                 "ids either way");
    return 0;
}
