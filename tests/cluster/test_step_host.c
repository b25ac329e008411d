/*
 * test_step_host.c - the decode step's host-time split (issue 36): a real
 * router and one aggregated baton-decode (--role both, aidreams260K,
 * --metrics-port) serve 16 concurrent greedy requests.
 *   1. before any request: baton_worker_step_host_seconds and the phase
 *      counters are there, at 0, with no steps.
 *   2. the requests give exactly golden.jsonl's ids (timing changes
 *      nothing).
 *   3. once idle: the histogram counted every step, once
 *      (_count == baton_worker_steps_total > 0); its sum is the build and
 *      post phases' and is non-zero; every phase the cpu backend has
 *      (build, enqueue, emit, post) is non-zero; the phases cover each
 *      step's wall time (their sum is at least baton_worker_step_seconds'
 *      sum: they run from the turn's start to its end).
 *   4. SIGTERM stops the worker cleanly.
 */
#include "cluster_util.h"
#include "bt_prom_test.h"

#define N_REQ 16
#define RESP_MAX (1 << 20)

static const char *const phases[] = { "build", "enqueue", "emit", "wait",
                                      "post" };

/* GET /metrics on port into resp; returns the body. */
static const char *scrape(int port, char *resp, size_t cap)
{
    const char *body;

    BT_ASSERT_EQ(prom_http_get(port, "/metrics", resp, cap), 200);
    body = strstr(resp, "\r\n\r\n");
    BT_CHECK(body != NULL);
    return body + 4;
}

static double phase(const char *body, const char *name)
{
    char sample[128];

    snprintf(sample, sizeof(sample),
             "baton_worker_step_phase_seconds_total{phase=\"%s\"}", name);
    return metric(body, sample);
}

int main(void)
{
    static char resp[RESP_MAX];
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512], port_s[16];
    const char *body;
    double steps = -1, count = -2, sum, phase_sum = 0, step_sum;
    int n_golden, port;
    client_t *c = NULL;
    pid_t dec;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    port = cu_free_port();
    snprintf(port_s, sizeof(port_s), "%d", port);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    dec = cu_spawn("baton-decode", "--router", control, "--model", model,
                   "--threads", "1", "--name", "sh-d0", "--role", "both",
                   "--kv-blocks", "400", "--metrics-port", port_s, NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, 1, 20000);

    /* 1: the families exist before the first step. */
    body = scrape(port, resp, sizeof(resp));
    BT_ASSERT_EQ(metric(body, "baton_worker_steps_total"), 0);
    BT_ASSERT_EQ(metric(body, "baton_worker_step_host_seconds_count"), 0);
    BT_ASSERT_EQ(metric(body, "baton_worker_step_host_seconds_sum"), 0);
    for (size_t i = 0; i < BT_ARRAY_SIZE(phases); i++)
        BT_ASSERT_EQ(phase(body, phases[i]), 0);

    /* 2: outputs are golden's. */
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_REQ, 60000);
    for (int i = 0; i < N_REQ; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);

    /* 3: idle now; the last step is observed at its turn's end. */
    prom_wait(port, "baton_worker_running_sequences", 0, 0, 5000);
    for (int t = 0; t < 250; t++) {
        body = scrape(port, resp, sizeof(resp));
        steps = metric(body, "baton_worker_steps_total");
        count = metric(body, "baton_worker_step_host_seconds_count");
        if (steps > 0 && steps == count)
            break;
        usleep(20000);
    }
    sum = metric(body, "baton_worker_step_host_seconds_sum");
    step_sum = metric(body, "baton_worker_step_seconds_sum");
    printf("steps %.0f, host-split steps %.0f, serial host %.1f us/step, "
           "step %.1f us/step;", steps, count, sum * 1e6 / steps,
           step_sum * 1e6 / steps);
    for (size_t i = 0; i < BT_ARRAY_SIZE(phases); i++) {
        double v = phase(body, phases[i]);
        printf(" %s %.1f", phases[i], v * 1e6 / steps);
        BT_CHECK(v >= 0);
        phase_sum += v;
    }
    printf(" us/step\n");
    BT_CHECK(steps > 0);
    BT_ASSERT_EQ(count, steps);
    BT_ASSERT_EQ(metric(body, "baton_worker_step_host_seconds_bucket"
                              "{le=\"+Inf\"}"), count);
    BT_CHECK(sum > 0);
    /* the phase counters print 6 decimals: a rounding slack of 1e-5 */
    BT_CHECK(fabs(sum - (phase(body, "build") + phase(body, "post"))) <
             1e-5 + 1e-6 * steps);
    BT_CHECK(phase(body, "build") > 0);
    BT_CHECK(phase(body, "enqueue") > 0); /* cpu: the forward */
    BT_CHECK(phase(body, "emit") > 0);
    BT_CHECK(phase(body, "post") > 0);
    BT_CHECK(phase_sum >= step_sum - 1e-5 * BT_ARRAY_SIZE(phases));

    /* 4: a clean stop. */
    client_destroy(&c);
    kill(dec, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(dec, 20000), 0);
    printf("test_step_host: OK\n");
    return 0;
}
