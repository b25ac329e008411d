/*
 * test_http_health.c - baton-http's probes on an aggregated cluster (no
 * prefill worker at all):
 *   - /livez is 200 from the start, whatever the cluster (no workers, the
 *     router gone); POST /livez is 405;
 *   - /health is 503 with no worker, 503 with only a plain decode worker
 *     (nothing can prefill), 200 once a decode worker runs --role both
 *     (it prefills: aggregated mode) and a completion is served; 503
 *     again when that worker drains away; 503 router_lost when the
 *     router is gone;
 *   - /metrics counts /livez under its own endpoint label.
 * Router: aidreams260K decode workers, 100 ms heartbeats.
 */
#include "gateway/http_util.h"

/* GET path; checks the status and returns the body (caller frees). */
static char *get(int port, const char *path, int want)
{
    ht_resp_t r;
    int st = ht_request(port, "GET", path, NULL, &r);

    if (st != want)
        BT_TEST_FAIL("GET %s: %d, expected %d (body %s)", path, st, want,
                     r.body ? r.body : "");
    return r.body;
}

/* Polls /health until it answers `want`; returns the body. */
static char *wait_health(int port, int want, int timeout_ms)
{
    int st = -1;

    for (int t = 0; t < timeout_ms; t += 50) {
        ht_resp_t r;
        st = ht_request(port, "GET", "/health", NULL, &r);
        if (st == want)
            return r.body;
        ht_resp_free(&r);
        usleep(50000);
    }
    BT_TEST_FAIL("/health stayed %d, expected %d", st, want);
    return NULL;
}

static int json_int(const char *body, const char *key)
{
    cJSON *j = cJSON_Parse(body), *v;
    int n;

    if (j == NULL)
        BT_TEST_FAIL("not JSON: %s", body);
    v = cJSON_GetObjectItem(j, key);
    if (!cJSON_IsNumber(v))
        BT_TEST_FAIL("no %s in %s", key, body);
    n = v->valueint;
    cJSON_Delete(j);
    return n;
}

int main(void)
{
    char listen[64], control[64], model[512];
    client_t *c = NULL;
    char *body;
    int port, http;
    pid_t router, both;

    cu_init();
    port = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", port + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    router = cu_spawn("baton-router", "--listen", listen, "--control",
                      control, "--heartbeat-ms", "100", NULL);
    http = ht_start_gateway(listen, "--model-name", "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));

    /* no workers: alive, not ready */
    bt_free(get(http, "/livez", 200));
    body = wait_health(http, 503, 10000);
    BT_CHECK(strstr(body, "\"no_workers\"") != NULL);
    bt_free(body);
    {
        ht_resp_t r;
        BT_ASSERT_EQ(ht_request(http, "POST", "/livez", "{}", &r), 405);
        ht_resp_free(&r);
    }

    /* a plain decode worker: nothing can prefill */
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--threads", "1", "--name", "d-plain", NULL);
    cu_wait_workers(c, 0, 1, 20000);
    body = get(http, "/health", 503);
    BT_ASSERT_EQ(json_int(body, "decode_workers"), 1);
    BT_ASSERT_EQ(json_int(body, "prefill_workers"), 0);
    BT_ASSERT_EQ(json_int(body, "aggregated_workers"), 0);
    bt_free(body);

    /* a decode worker with --role both: aggregated, healthy */
    both = cu_spawn("baton-decode", "--router", control, "--model", model,
                    "--threads", "1", "--name", "d-both", "--role", "both",
                    NULL);
    cu_wait_workers(c, 0, 2, 20000);
    body = wait_health(http, 200, 10000);
    BT_ASSERT_EQ(json_int(body, "prefill_workers"), 0);
    BT_ASSERT_EQ(json_int(body, "decode_workers"), 2);
    BT_ASSERT_EQ(json_int(body, "aggregated_workers"), 1);
    BT_CHECK(strstr(body, "\"ok\"") != NULL);
    bt_free(body);
    {
        ht_resp_t r;
        BT_ASSERT_EQ(ht_request(http, "POST", "/v1/completions",
                                "{\"model\":\"aidreams\",\"prompt\":[1,403,"
                                "407,261],\"max_tokens\":6,"
                                "\"ignore_eos\":true}", &r),
                     200);
        BT_CHECK(strstr(r.body, "\"completion_tokens\":6") != NULL);
        ht_resp_free(&r);
    }

    /* the aggregated worker drains away: not ready again */
    cu_kill(both, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(both, 15000), 0);
    body = wait_health(http, 503, 10000);
    BT_ASSERT_EQ(json_int(body, "aggregated_workers"), 0);
    bt_free(body);

    /* the router gone: still alive */
    cu_kill(router, SIGKILL);
    body = wait_health(http, 503, 10000);
    BT_CHECK(strstr(body, "router_lost") != NULL);
    bt_free(body);
    bt_free(get(http, "/livez", 200));

    body = get(http, "/metrics", 200);
    BT_CHECK(strstr(body, "baton_http_requests_total{endpoint=\"/livez\","
                          "code=\"200\"} 2") != NULL);
    BT_CHECK(strstr(body, "baton_http_requests_total{endpoint=\"/livez\","
                          "code=\"405\"} 1") != NULL);
    bt_free(body);

    client_destroy(&c);
    cu_kill_all();
    printf("PASS gateway/http_health\n");
    return 0;
}
