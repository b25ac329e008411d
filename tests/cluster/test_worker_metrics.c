/*
 * test_worker_metrics.c - every worker's --metrics-port (issue 40): real
 * baton-prefill and baton-decode processes (aidreams260K) serve
 * Prometheus /metrics and /health from a thread of their own.
 *   1. before any router: /health is 503 and names the endpoint the
 *      worker waits on; /metrics already answers (registered 0).
 *   2. the router starts: /health turns 200 on both; the strict parser
 *      answers 400 / 404 / 405 there too.
 *   3. a 2-second prefill step (--step-delay-ms 2000): scrapes of the
 *      prefill worker answer within 500 ms while it runs, /metrics shows
 *      the running turn, and /health says "stuck" once the turn passes
 *      BATON_HEALTH_STALL_MS (500 here).
 *   4. after the request: prefill tokens, one KV hand-off with bytes and
 *      a latency observation, generated tokens, steps and batch sizes,
 *      KV gauges that add up, and the sequence gauges back at 0.
 *   5. the router is killed: /health turns 503 (not registered) within
 *      the link's silence limit; SIGTERM then stops both workers cleanly.
 */
#include <errno.h>
#include <sys/time.h>

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define RESP_MAX (1 << 20)

/* GETs (or sends `raw` when not NULL) on 127.0.0.1:port; returns the
 * status (-1: no connection) and the whole response in resp; *ms_p: how
 * long the answer took. */
static int http_get(int port, const char *path, const char *raw, char *resp,
                    size_t cap, double *ms_p)
{
    char req[256];
    uint64_t t0 = bt_time_ns();
    int status;

    if (raw == NULL)
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
    else
        snprintf(req, sizeof(req), "%s", raw);
    status = prom_http_raw(port, req, strlen(req), resp, cap);
    if (ms_p != NULL)
        *ms_p = (double)(bt_time_ns() - t0) / 1e6;
    return status;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");

    BT_CHECK(b != NULL);
    return b + 4;
}

static double scrape(int port, const char *sample, char *resp, size_t cap)
{
    BT_ASSERT_EQ(http_get(port, "/metrics", NULL, resp, cap, NULL), 200);
    BT_CHECK(strstr(resp, "text/plain; version=0.0.4") != NULL);
    return metric(body_of(resp), sample);
}

/* Waits until /health on `port` answers `want` (bounded). */
static void wait_health(int port, int want, char *resp, size_t cap,
                        int timeout_ms)
{
    int got = -1;

    for (int t = 0; t < timeout_ms; t += 50) {
        got = http_get(port, "/health", NULL, resp, cap, NULL);
        if (got == want)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("/health on %d answers %d, want %d: %s", port, got, want,
                 resp);
}

int main(void)
{
    static char resp[RESP_MAX];
    static cu_golden_t golden[1];
    static cu_result_t res[1];
    char listen[64], control[64], model[512];
    char pport_s[16], dport_s[16];
    int pport, dport, max_tokens = 8;
    double ms, worst = 0, used, total, running_seen = 0;
    bool stuck_seen = false;
    client_t *c = NULL;
    pid_t pf, dec, router;
    client_request_t req;

    cu_init();
    BT_CHECK(cu_golden_load("aidreams260K.bin", golden, 1) == 1);
    cu_router_addrs(listen, control);
    pport = cu_free_port();
    dport = pport + 1;
    snprintf(pport_s, sizeof(pport_s), "%d", pport);
    snprintf(dport_s, sizeof(dport_s), "%d", dport);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);

    /* 1: workers first, no router yet. */
    setenv("BATON_HEALTH_STALL_MS", "500", 1);
    pf = cu_spawn("baton-prefill", "--router", control, "--model", model,
                  "--name", "wm-p0", "--threads", "1", "--step-delay-ms",
                  "2000", "--metrics-port", pport_s, NULL);
    unsetenv("BATON_HEALTH_STALL_MS");
    setenv("BATON_METRICS_PORT", dport_s, 1); /* the env form */
    dec = cu_spawn("baton-decode", "--router", control, "--model", model,
                   "--name", "wm-d0", "--threads", "1", "--kv-blocks", "64",
                   NULL);
    unsetenv("BATON_METRICS_PORT");
    for (int t = 0; t < 200 && (http_get(pport, "/health", NULL, resp,
                                         sizeof(resp), NULL) < 0 ||
                                http_get(dport, "/health", NULL, resp,
                                         sizeof(resp), NULL) < 0); t++)
        usleep(50000);
    wait_health(dport, 503, resp, sizeof(resp), 5000);
    wait_health(pport, 503, resp, sizeof(resp), 5000);
    for (int t = 0; t < 100 && strstr(resp, "not registered") == NULL; t++) {
        usleep(50000); /* past "loading the model" */
        http_get(pport, "/health", NULL, resp, sizeof(resp), NULL);
    }
    BT_CHECK(strstr(resp, "not registered: waiting for the router at") !=
             NULL);
    BT_CHECK(strstr(resp, control) != NULL);
    BT_ASSERT_EQ(scrape(pport, "baton_worker_registered", resp,
                        sizeof(resp)), 0);
    BT_CHECK(strstr(resp, "baton_worker_info{worker=\"wm-p0\","
                          "role=\"prefill\"} 1") != NULL);

    /* 2: the router comes; both turn healthy. */
    router = cu_spawn("baton-router", "--listen", listen, "--control",
                      control, "--heartbeat-ms", "100", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    wait_health(pport, 200, resp, sizeof(resp), 10000);
    wait_health(dport, 200, resp, sizeof(resp), 10000);
    BT_CHECK(strcmp(body_of(resp), "ok\n") == 0);
    BT_ASSERT_EQ(scrape(dport, "baton_worker_registered", resp,
                        sizeof(resp)), 1);
    BT_ASSERT_EQ(http_get(dport, NULL, "GET /metrics HTTP/1.1\r\n\r\n", resp,
                          sizeof(resp), NULL), 400); /* no Host */
    BT_ASSERT_EQ(http_get(dport, "/nope", NULL, resp, sizeof(resp), NULL),
                 404);
    BT_ASSERT_EQ(http_get(dport, NULL, "DELETE /health HTTP/1.1\r\nHost: "
                          "t\r\n\r\n", resp, sizeof(resp), NULL), 405);

    /* 3: one request; the prefill step sleeps 2 s: scrape meanwhile. */
    client_request_init(&req);
    req.prompt_ids = golden[0].prompt;
    req.n_prompt_ids = golden[0].n_prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.want_text = false;
    BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
    for (uint64_t until = bt_time_ns() + 1800000000ull;
         bt_time_ns() < until;) {
        double v;
        int h;
        BT_ASSERT_EQ(http_get(pport, "/metrics", NULL, resp, sizeof(resp),
                              &ms), 200);
        worst = BT_MAX(worst, ms);
        v = metric(body_of(resp), "baton_worker_turn_running_seconds");
        running_seen = BT_MAX(running_seen, v);
        h = http_get(pport, "/health", NULL, resp, sizeof(resp), &ms);
        worst = BT_MAX(worst, ms);
        if (h == 503 && strstr(resp, "stuck") != NULL)
            stuck_seen = true;
        usleep(100000);
    }
    printf("worst scrape during the 2 s step: %.1f ms; turn seen running "
           "%.2f s\n", worst, running_seen);
    BT_CHECK(worst < 500);
    BT_CHECK(running_seen >= 0.5);
    BT_CHECK(stuck_seen);
    cu_collect(c, res, 1, 30000);
    BT_ASSERT_EQ(res[0].finished, 1);
    BT_ASSERT_EQ(res[0].n_ids, max_tokens);

    /* 4: what the workers counted. */
    wait_health(pport, 200, resp, sizeof(resp), 5000);
    BT_ASSERT_EQ(scrape(pport, "baton_worker_prefill_tokens_total", resp,
                        sizeof(resp)), golden[0].n_prompt);
    BT_ASSERT_EQ(metric(body_of(resp), "baton_worker_kv_handoffs_total"), 1);
    BT_CHECK(metric(body_of(resp), "baton_worker_kv_handoff_bytes_total") >
             0);
    BT_ASSERT_EQ(metric(body_of(resp), "baton_worker_kv_handoff_seconds_count"),
                 1);
    BT_CHECK(metric(body_of(resp), "baton_worker_step_seconds_sum") >= 2.0);
    BT_CHECK(metric(body_of(resp), "baton_worker_prefill_tokens_per_second") >
             0);
    BT_ASSERT_EQ(metric(body_of(resp), "baton_worker_running_sequences"), 0);
    /* the decode worker emits the first token from the hand-off */
    for (int t = 0; t < 100; t++) {
        if (scrape(dport, "baton_worker_running_sequences", resp,
                   sizeof(resp)) == 0 &&
            metric(body_of(resp), "baton_worker_kv_blocks_used") == 0)
            break;
        usleep(50000);
    }
    BT_CHECK(metric(body_of(resp), "baton_worker_generated_tokens_total") >=
             max_tokens - 1);
    BT_CHECK(metric(body_of(resp), "baton_worker_steps_total") >= 1);
    BT_CHECK(metric(body_of(resp), "baton_worker_batch_size_count") ==
             metric(body_of(resp), "baton_worker_steps_total"));
    used = metric(body_of(resp), "baton_worker_kv_blocks_used");
    total = metric(body_of(resp), "baton_worker_kv_blocks");
    BT_ASSERT_EQ(total, 64);
    BT_ASSERT_EQ(used, 0);
    BT_ASSERT_EQ(metric(body_of(resp), "baton_worker_kv_usage_ratio"), 0);
    BT_ASSERT_EQ(metric(body_of(resp), "baton_worker_waiting_sequences"), 0);
    BT_CHECK(strstr(resp, "role=\"decode\"") != NULL);

    /* 5: no router: not registered. */
    cu_kill(router, SIGKILL);
    wait_health(dport, 503, resp, sizeof(resp), 15000);
    BT_CHECK(strstr(resp, "not registered") != NULL);
    client_destroy(&c);
    kill(pf, SIGTERM);
    kill(dec, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(pf, 20000), 0);
    BT_ASSERT_EQ(cu_wait_exit(dec, 20000), 0);
    printf("test_worker_metrics: OK\n");
    return 0;
}
