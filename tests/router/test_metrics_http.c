/*
 * test_metrics_http.c - baton-router --metrics-port: Prometheus metrics
 * over HTTP from a real router process (with real prefill and decode
 * workers), read by a small C client on 127.0.0.1:
 *   1. GET /metrics: 200, text format 0.0.4, every line well formed and
 *      every sample's family announced by HELP and TYPE; HEAD: headers
 *      only; a query string and a leading empty line are fine.
 *   2. admission with no workers: one request waits (queue_depth 1,
 *      admitted 1), the next is refused (rejected{overloaded}, and
 *      requests_total{outcome="overloaded"}).
 *   3. malformed requests get 400 (431 for an oversized head, 505 for
 *      another HTTP version, 405 for another method, 404 for another
 *      path), and the metrics afterwards equal the metrics before: a bad
 *      request changes nothing.
 *   4. workers register: the waiting request finishes (outcome length),
 *      the queue-wait, TTFT and TPOT histograms count it, one KV hand-off
 *      is counted under a transport, per-worker up / role / KV gauges.
 *   5. kill -9 of the decode worker mid-stream: retries_total and
 *      worker_drops_total count it, the request still finishes.
 */
#include <errno.h>
#include <sys/time.h>

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define RESP_MAX (1 << 20)
#define BIG_REQUEST 12000 /* more than the router reads of a head */

static int g_port; /* the router's metrics port */

/* Sends req[0..len) on a new connection and reads the whole response
 * (the router closes after it).  Returns the HTTP status, -1 on a
 * connection error; the response goes to resp (NUL-terminated). */
static int http_raw(const char *req, size_t len, char *resp, size_t cap)
{
    return prom_http_raw(g_port, req, len, resp, cap);
}

static int http_str(const char *req, char *resp, size_t cap)
{
    return http_raw(req, strlen(req), resp, cap);
}

/* GET /metrics; returns the body (inside resp). */
static const char *scrape(char *resp, size_t cap)
{
    const char *body;

    BT_ASSERT_EQ(http_str("GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n",
                          resp, cap),
                 200);
    body = strstr(resp, "\r\n\r\n");
    BT_CHECK(body != NULL);
    return body + 4;
}

/* Waits until metric(sample) == want (the router catches up). */
static void wait_metric(const char *sample, double want, char *resp,
                        size_t cap)
{
    double v = -1;

    for (int t = 0; t < 200; t++) {
        v = metric(scrape(resp, cap), sample);
        if (v == want)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("%s is %g, want %g", sample, v, want);
}

/* Every line: "# HELP name text", "# TYPE name type" or
 * "name[{k="v",...}] value", each sample's family typed before it. */
static void check_format(const char *body)
{
    char typed[64][96];
    int n_typed = 0, n_samples = 0;
    const char *p = body;

    while (*p != '\0') {
        const char *end = strchr(p, '\n');
        char line[512], name[96];
        size_t len;

        BT_CHECK(end != NULL); /* the text ends with a newline */
        len = (size_t)(end - p);
        BT_CHECK(len > 0 && len < sizeof(line));
        memcpy(line, p, len);
        line[len] = '\0';
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char type[32];
            BT_CHECK(sscanf(line + 7, "%95s %31s", name, type) == 2);
            BT_CHECK(strcmp(type, "counter") == 0 ||
                     strcmp(type, "gauge") == 0 ||
                     strcmp(type, "histogram") == 0);
            BT_CHECK(n_typed < 64);
            snprintf(typed[n_typed++], sizeof(typed[0]), "%s", name);
        } else if (strncmp(line, "# HELP ", 7) == 0) {
            BT_CHECK(sscanf(line + 7, "%95s", name) == 1);
        } else {
            size_t k = 0;
            char *val;
            int found = 0;
            while ((line[k] >= 'a' && line[k] <= 'z') || line[k] == '_' ||
                   (line[k] >= '0' && line[k] <= '9' && k > 0))
                k++;
            BT_CHECK(k > 0 && k < sizeof(name));
            memcpy(name, line, k);
            name[k] = '\0';
            if (line[k] == '{') {
                char *close = strchr(line + k, '}');
                BT_CHECK(close != NULL && strchr(line + k, '=') != NULL);
                k = (size_t)(close - line) + 1;
            }
            BT_CHECK(line[k] == ' ');
            val = line + k + 1;
            BT_CHECK(*val != '\0' && strchr(val, ' ') == NULL);
            for (int i = 0; i < n_typed && !found; i++) {
                size_t tl = strlen(typed[i]);
                found = strncmp(name, typed[i], tl) == 0 &&
                        (name[tl] == '\0' || strcmp(name + tl, "_bucket") == 0 ||
                         strcmp(name + tl, "_sum") == 0 ||
                         strcmp(name + tl, "_count") == 0);
            }
            if (!found)
                BT_TEST_FAIL("sample of an untyped family: %s", line);
            n_samples++;
        }
        p = end + 1;
    }
    BT_CHECK(n_samples > 20);
}

/* The metrics text without the lines that change with time alone. */
static void steady(const char *body, char *out, size_t cap)
{
    size_t o = 0;

    for (const char *p = body; *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) + 1 : strlen(p);
        if (strncmp(p, "baton_router_worker_last_seen_seconds{", 38) != 0) {
            BT_CHECK(o + len < cap);
            memcpy(out + o, p, len);
            o += len;
        }
        p += len;
    }
    out[o] = '\0';
}

static uint64_t submit(client_t *c, const cu_golden_t *g, int max_tokens)
{
    client_request_t req;
    uint64_t rid;

    client_request_init(&req);
    req.prompt_ids = g->prompt;
    req.n_prompt_ids = g->n_prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.want_text = false;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

int main(void)
{
    static cu_golden_t golden[4];
    static char resp[RESP_MAX], before[RESP_MAX], after[RESP_MAX];
    static char big[BIG_REQUEST];
    static cu_result_t res[3];
    static const struct {
        const char *req;
        int status;
    } bad[] = {
        { "GARBAGE\r\n\r\n", 400 },
        { "GET /metrics\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\rX: y\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\x01\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: "
          "chunked\r\n\r\n0\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n",
          400 },
        { "GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
          "Content-Length: 2\r\n\r\n", 400 },
        { "GET metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400 },
        { "GET  /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 400 },
        { "GET /metrics HTTP/2.0\r\nHost: a\r\n\r\n", 505 },
        { "POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n"
          "abc", 405 },
        { "GET /other HTTP/1.1\r\nHost: a\r\n\r\n", 404 },
    };
    char listen[64], control[64], mport[16], model[512];
    const char *body;
    client_t *c = NULL, *ctl = NULL; /* ctl: status queries only */
    pid_t d0;
    int port, n;

    cu_init();
    BT_CHECK(cu_golden_load("aidreams260K.bin", golden, 4) > 0);
    port = cu_free_port();
    g_port = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", port + 1);
    snprintf(mport, sizeof(mport), "%d", g_port);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3",
             "--max-queue", "1", "--metrics-port", mport, "--metrics-host",
             "127.0.0.1", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));

    /* 1: the text and its format. */
    for (int t = 0; t < 200 && http_str("GET /metrics HTTP/1.0\r\n\r\n", resp,
                                        sizeof(resp)) != 200; t++)
        usleep(25000); /* the router starts */
    body = scrape(resp, sizeof(resp));
    BT_CHECK(strstr(resp, "Content-Type: text/plain; version=0.0.4") != NULL);
    BT_CHECK(strstr(resp, "Connection: close") != NULL);
    check_format(body);
    BT_ASSERT_EQ(metric(body, "baton_router_queue_depth"), 0);
    BT_ASSERT_EQ(metric(body, "baton_router_workers"), 0);
    BT_ASSERT_EQ(metric(body, "baton_router_queue_limit"), 1);
    BT_ASSERT_EQ(http_str("HEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\n", resp,
                          sizeof(resp)), 200);
    BT_CHECK(strstr(resp, "\r\n\r\n") != NULL &&
             strstr(resp, "\r\n\r\n")[4] == '\0'); /* no body */
    BT_ASSERT_EQ(http_str("\r\nGET /metrics?x=1 HTTP/1.0\r\n\r\n", resp,
                          sizeof(resp)), 200);

    /* 2: one request waits for workers, the next is refused. */
    res[0].rid = submit(c, &golden[0], 8);
    wait_metric("baton_router_queue_depth", 1, resp, sizeof(resp));
    res[1].rid = submit(c, &golden[0], 8);
    cu_collect(c, &res[1], 1, 5000);
    BT_ASSERT_EQ(res[1].error_code, BATON__ERROR_CODE__ERROR_OVERLOADED);
    body = scrape(resp, sizeof(resp));
    BT_ASSERT_EQ(metric(body, "baton_router_admitted_total"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_rejected_total{reason="
                              "\"overloaded\"}"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_requests_total{outcome="
                              "\"overloaded\"}"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_in_flight"), 0);

    /* 3: malformed requests answer an error and change nothing (the
     * waiting request stays; no worker state to drift meanwhile). */
    steady(scrape(resp, sizeof(resp)), before, sizeof(before));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = http_str(bad[i].req, resp, sizeof(resp));
        if (st != bad[i].status)
            BT_TEST_FAIL("request %zu answered %d, want %d: %s", i, st,
                         bad[i].status, resp);
        BT_CHECK(strstr(resp, "Connection: close") != NULL);
    }
    /* An oversized head (more than the router reads): 431, and the
     * client still reads it (no reset). */
    n = snprintf(big, sizeof(big), "GET /metrics HTTP/1.1\r\nHost: a\r\n");
    while (n + 64 < (int)sizeof(big))
        n += snprintf(big + n, sizeof(big) - (size_t)n, "X-Pad: %s\r\n",
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    BT_ASSERT_EQ(http_raw(big, (size_t)n, resp, sizeof(resp)), 431);
    /* A body after a GET is read past; the answer is the metrics. */
    BT_ASSERT_EQ(http_str("GET /metrics HTTP/1.1\r\nHost: a\r\n"
                          "Content-Length: 5\r\n\r\nhello", resp,
                          sizeof(resp)), 200);
    steady(scrape(resp, sizeof(resp)), after, sizeof(after));
    if (strcmp(before, after) != 0)
        BT_TEST_FAIL("metrics changed across bad requests:\n%s\n---\n%s",
                     before, after);
    /* 4: workers come; the waiting request is served. */
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d0", "--step-delay-ms", "30",
                  NULL);
    cu_wait_workers(ctl, 1, 1, 20000);
    cu_collect(c, &res[0], 1, 30000);
    BT_ASSERT_EQ(res[0].finished, 1);
    BT_ASSERT_EQ(res[0].n_ids, 8);
    body = scrape(resp, sizeof(resp));
    check_format(body);
    BT_ASSERT_EQ(metric(body, "baton_router_requests_total{outcome="
                              "\"length\"}"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_queue_depth"), 0);
    BT_ASSERT_EQ(metric(body, "baton_router_generated_tokens_total"), 8);
    BT_CHECK(metric(body, "baton_router_prompt_tokens_total") > 0);
    BT_ASSERT_EQ(metric(body, "baton_router_queue_wait_seconds_count"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_ttft_seconds_count"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_ttft_seconds_bucket{le="
                              "\"+Inf\"}"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_tpot_seconds_count"), 1);
    BT_CHECK(metric(body, "baton_router_tpot_seconds_sum") > 0.02); /* 30 ms
                                                     steps, a little less */
    BT_ASSERT_EQ(metric_sum(body, "baton_router_kv_handoffs_total"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_workers"), 2);
    BT_ASSERT_EQ(metric(body, "baton_router_worker_up{worker=\"d0\",role="
                              "\"decode\"}"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_worker_up{worker=\"p0\",role="
                              "\"prefill\"}"), 1);
    BT_CHECK(metric(body, "baton_router_worker_total_kv_blocks{worker="
                          "\"d0\",role=\"decode\"}") > 0);
    BT_ASSERT_EQ(metric(body, "baton_router_worker_served_total{worker="
                              "\"d0\",role=\"decode\"}"), 1);

    /* 5: the decode worker dies mid-stream; another one finishes. */
    memset(&res[2], 0, sizeof(res[2]));
    res[2].rid = submit(c, &golden[0], 60);
    for (;;) {
        Baton__ClientMessage *m = NULL;
        if (client_recv(c, 20000, &m) != BT_OK)
            BT_TEST_FAIL("no tokens from d0");
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK)
            res[2].n_ids += (int)m->chunk->n_ids;
        res[2].next_index = res[2].n_ids;
        BT_CHECK(m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK);
        proto_client_free(&m);
        if (res[2].n_ids >= 3)
            break;
    }
    kill(d0, SIGSTOP); /* while d1 starts: d0 must not finish first */
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--threads", "1", "--name", "d1", NULL);
    cu_kill(d0, SIGKILL);
    cu_collect(c, &res[2], 1, 30000);
    BT_ASSERT_EQ(res[2].finished, 1);
    BT_ASSERT_EQ(res[2].retries, 1);
    wait_metric("baton_router_worker_up{worker=\"d1\",role=\"decode\"}", 1,
                resp, sizeof(resp));
    body = scrape(resp, sizeof(resp));
    BT_ASSERT_EQ(metric(body, "baton_router_retries_total"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_worker_drops_total"), 1);
    BT_ASSERT_EQ(metric(body, "baton_router_requests_total{outcome="
                              "\"length\"}"), 2);
    BT_ASSERT_EQ(metric_sum(body, "baton_router_kv_handoffs_total"), 3);
    BT_ASSERT_EQ(metric(body, "baton_router_worker_up{worker=\"d0\",role="
                              "\"decode\"}"), -1); /* gone */
    cu_wait_kv_idle(ctl, 5000);

    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("router/metrics_http: counters, gauges, histograms over "
                 "HTTP; bad requests answered and harmless");
    return 0;
}
