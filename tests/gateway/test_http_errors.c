/*
 * test_http_errors.c - every error baton-http promises, and that it keeps
 * serving after each: malformed HTTP (garbage, binary, bad versions,
 * folded or bad headers, huge headers, chunked or missing or conflicting
 * Content-Length, oversized bodies, slow senders) gets its 4xx/5xx; bad
 * JSON and bad parameters get OpenAI-shaped 400s naming the parameter;
 * unknown models and paths 404; wrong methods 405; a full router 429; no
 * workers 503; deadlines 504 (also for a stream that has not begun); too
 * many connections: the longest idle one is closed for the new one.  A
 * client that disconnects mid-stream has its request cancelled at the router (KV back to idle long before the
 * generation would have ended).  /metrics parses as Prometheus text and
 * counts all of it.
 *
 * Cluster A: router + prefill + decode (aidreams260K, 20 ms per decode
 * step so generations last seconds).  Router B: no workers, at most one
 * live request.
 */
#include "gateway/http_util.h"
#include "bt_prom_test.h"

/* Checks an OpenAI error body: {"error": {message, type, param, code}}. */
static void check_error(const ht_resp_t *r, int status, const char *param,
                        const char *code)
{
    cJSON *j, *e, *p, *c;

    if (r->status != status)
        BT_TEST_FAIL("status %d, expected %d (body %s)", r->status, status,
                     r->body ? r->body : "");
    j = cJSON_Parse(r->body);
    if (j == NULL)
        BT_TEST_FAIL("error body is not JSON: %s", r->body);
    e = cJSON_GetObjectItem(j, "error");
    BT_CHECK(cJSON_IsObject(e));
    BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    p = cJSON_GetObjectItem(e, "param");
    c = cJSON_GetObjectItem(e, "code");
    BT_CHECK(p != NULL && c != NULL);
    if (param != NULL) {
        if (!cJSON_IsString(p) || strcmp(p->valuestring, param) != 0)
            BT_TEST_FAIL("param %s, expected %s (body %s)",
                         cJSON_IsString(p) ? p->valuestring : "null", param,
                         r->body);
    }
    if (code != NULL) {
        if (!cJSON_IsString(c) || strcmp(c->valuestring, code) != 0)
            BT_TEST_FAIL("code %s, expected %s (body %s)",
                         cJSON_IsString(c) ? c->valuestring : "null", code,
                         r->body);
    }
    cJSON_Delete(j);
}

static void expect_json_error(int port, const char *path, const char *body,
                              int status, const char *param, const char *code)
{
    ht_resp_t r;

    ht_request(port, "POST", path, body, &r);
    check_error(&r, status, param, code);
    ht_resp_free(&r);
}

static void still_serving(int port)
{
    ht_resp_t r;

    BT_ASSERT_EQ(ht_request(port, "GET", "/health", NULL, &r), 200);
    ht_resp_free(&r);
}

static void expect_raw(int port, const char *req, size_t len, int status)
{
    ht_resp_t r;

    if (ht_raw(port, req, len, &r) != status)
        BT_TEST_FAIL("raw request '%.40s...': status %d, expected %d",
                     req, r.status, status);
    BT_CHECK(r.closed);
    ht_resp_free(&r);
    still_serving(port);
}

/* Malformed bytes that libmicrohttpd refuses by closing the connection,
 * with or without a 4xx first (it answers what it can parse; garbage that
 * never forms a request line is closed at once or at the header
 * timeout, 408). */
static void expect_refused(int port, const char *req, size_t len)
{
    ht_resp_t r;
    int st = ht_raw(port, req, len, &r);

    if (st != -1 && st != 400 && st != 408)
        BT_TEST_FAIL("raw request '%.40s...': status %d, expected a close, "
                     "400 or 408", req, st);
    BT_CHECK(r.closed);
    ht_resp_free(&r);
    still_serving(port);
}

/* Obsolete line folding and a bare CR inside a field value: RFC 9112
 * lets a recipient refuse them or read them as spaces; libmicrohttpd
 * reads them into the value and serves the request (one request either
 * way: nothing to smuggle).  A 400 would do as well. */
static void expect_unfolded(int port, const char *req, size_t len)
{
    ht_resp_t r;
    int st = ht_raw(port, req, len, &r);

    if (st != 200 && st != 400)
        BT_TEST_FAIL("raw request '%.40s...': status %d, expected 200 "
                     "(unfolded) or 400", req, st);
    ht_resp_free(&r);
    still_serving(port);
}

/* Validates Prometheus text: comments, or `name{labels} value`. */
static void check_prometheus(const char *text)
{
    const char *line = text;
    int n = 0;

    while (*line) {
        const char *end = strchr(line, '\n'), *p = line;
        char *num_end;
        if (end == NULL)
            BT_TEST_FAIL("metrics text does not end with a newline");
        if (strncmp(line, "# HELP ", 7) == 0 ||
            strncmp(line, "# TYPE ", 7) == 0) {
            line = end + 1;
            continue;
        }
        if (!(*p == '_' || *p == ':' || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            BT_TEST_FAIL("bad metric line: %.*s", (int)(end - line), line);
        while (p < end && (*p == '_' || *p == ':' || (*p >= 'a' && *p <= 'z') ||
                           (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            p++;
        if (*p == '{') {
            p++;
            while (p < end && *p != '}') {
                while (p < end && *p != '=')
                    p++;
                if (p + 1 >= end || p[1] != '"')
                    BT_TEST_FAIL("bad label: %.*s", (int)(end - line), line);
                p += 2;
                while (p < end && *p != '"')
                    p += *p == '\\' ? 2 : 1;
                p++;
                if (*p == ',')
                    p++;
            }
            p++;
        }
        if (*p != ' ')
            BT_TEST_FAIL("bad metric line: %.*s", (int)(end - line), line);
        strtod(p + 1, &num_end);
        if (num_end != end)
            BT_TEST_FAIL("bad value: %.*s", (int)(end - line), line);
        n++;
        line = end + 1;
    }
    BT_CHECK(n > 20);
}

int main(void)
{
    char listen_a[64], control_a[64], listen_b[64], model[512], tok[512];
    char big[16384], req[20000];
    client_t *ca = NULL;
    int port, a, b, n;
    cu_status_t st;

    cu_init();
    port = cu_free_port();
    snprintf(listen_a, sizeof(listen_a), "tcp://127.0.0.1:%d", port);
    snprintf(control_a, sizeof(control_a), "tcp://127.0.0.1:%d", port + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen_a, "--control", control_a,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control_a, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control_a, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0",
             "--step-delay-ms", "20", NULL);
    port = cu_free_port();
    snprintf(listen_b, sizeof(listen_b), "tcp://127.0.0.1:%d", port);
    {
        char control_b[64];
        snprintf(control_b, sizeof(control_b), "tcp://127.0.0.1:%d", port + 1);
        cu_spawn("baton-router", "--listen", listen_b, "--control", control_b,
                 "--max-inflight", "1", "--queue-timeout-ms", "1500", NULL);
    }
    a = ht_start_gateway(listen_a, "--tokenizer", tok, "--model-name",
                         "aidreams", "--max-body-bytes", "65536",
                         "--max-header-bytes", "4096", "--max-connections",
                         "12", "--read-timeout-ms", "500", NULL);
    b = ht_start_gateway(listen_b, "--model-name", "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen_a, &ca));
    cu_wait_workers(ca, 1, 1, 20000);
    ht_wait_healthy(a, 10000);

    /* --- malformed HTTP: an answer, a close, and the server goes on */
    expect_refused(a, "garbage\r\n\r\n", 11);
    expect_refused(a, "\x01\x02\x03\xff\xfe", 5);
    expect_raw(a, "GET / HTTP/2.0\r\n\r\n", 18, 505);
    expect_raw(a, "GET /health HTTP/1.1\r\nBad Header\r\n\r\n", 36, 400);
    expect_unfolded(a, "GET /health HTTP/1.1\r\nA: b\r\n folded\r\n"
                    "Connection: close\r\n\r\n", 58);
    expect_unfolded(a, "GET /health HTTP/1.1\r\nA: b\rc\r\n"
                    "Connection: close\r\n\r\n", 51);
    memset(big, 'x', sizeof(big));
    n = snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\nX-Big: %.8000s\r\n\r\n",
                 big);
    expect_raw(a, req, (size_t)n, 431);
    n = snprintf(req, sizeof(req), "GET /%.3000s HTTP/1.1\r\n\r\n", big);
    expect_raw(a, req, (size_t)n, 414);
    n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    expect_raw(a, req, (size_t)n, 411);
    n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n\r\n");
    expect_raw(a, req, (size_t)n, 411);
    n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                 "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}");
    expect_raw(a, req, (size_t)n, 400);
    n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                 "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}");
    expect_raw(a, req, (size_t)n, 400);
    n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                 "Content-Length: -2\r\n\r\n{}");
    expect_raw(a, req, (size_t)n, 400);
    n = snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\n"
                 "Expect: teapot\r\n\r\n");
    expect_raw(a, req, (size_t)n, 417);
    {
        /* a body over --max-body-bytes, sent whole: 413, readable */
        size_t blen = 70000;
        char *body = bt_malloc(blen + 256, "test");
        int hl = snprintf(body, 256, "POST /v1/completions HTTP/1.1\r\n"
                          "Content-Length: %zu\r\n\r\n", blen);
        memset(body + hl, ' ', blen);
        expect_raw(a, body, (size_t)hl + blen, 413);
        bt_free(body);
    }
    {
        /* a slow sender: 408 after --read-timeout-ms */
        int fd = ht_connect(a);
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        ht_resp_t r;
        uint64_t t0 = bt_time_ns();
        ht_conn_init(hc, fd);
        BT_CHECK(ht_send(fd, "GET /health HTTP/1.1\r\nHo", 24));
        BT_ASSERT_EQ(ht_read(hc, &r), 408);
        BT_CHECK(r.closed);
        BT_CHECK(bt_time_ns() - t0 < 3000000000ull);
        ht_resp_free(&r);
        close(fd);
        bt_free(hc);
    }
    {
        /* Expect: 100-continue gets an interim 100, then the answer */
        const char *body = "{\"prompt\":\"The river\",\"max_tokens\":2,"
                           "\"temperature\":0}";
        int fd = ht_connect(a);
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        char line[256];
        ht_resp_t r;
        n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                     "Expect: 100-continue\r\nContent-Length: %zu\r\n\r\n",
                     strlen(body));
        ht_conn_init(hc, fd);
        BT_CHECK(ht_send(fd, req, (size_t)n));
        BT_CHECK(ht_line(hc, line, sizeof(line)));
        BT_CHECK(strstr(line, "100 Continue") != NULL);
        BT_CHECK(ht_send(fd, body, strlen(body)));
        BT_ASSERT_EQ(ht_read(hc, &r), 200);
        ht_resp_free(&r);
        close(fd);
        bt_free(hc);
    }
    still_serving(a);

    /* --- paths and methods */
    {
        ht_resp_t r;
        char v[64];
        ht_request(a, "GET", "/nope", NULL, &r);
        check_error(&r, 404, NULL, "not_found");
        ht_resp_free(&r);
        ht_request(a, "GET", "/v1/models/gpt-4", NULL, &r);
        check_error(&r, 404, NULL, "model_not_found");
        ht_resp_free(&r);
        ht_request(a, "GET", "/v1/completions", NULL, &r);
        check_error(&r, 405, NULL, NULL);
        BT_ASSERT_STREQ(ht_header(&r, "Allow", v, sizeof(v)), "POST");
        ht_resp_free(&r);
        ht_request(a, "POST", "/health", "{}", &r);
        check_error(&r, 405, NULL, NULL);
        BT_ASSERT_STREQ(ht_header(&r, "Allow", v, sizeof(v)), "GET");
        ht_resp_free(&r);
        ht_request(a, "DELETE", "/v1/models", NULL, &r);
        check_error(&r, 405, NULL, NULL);
        ht_resp_free(&r);
    }

    /* --- bad JSON and bad parameters */
    expect_json_error(a, "/v1/completions", "{", 400, NULL, NULL);
    expect_json_error(a, "/v1/completions", "", 400, NULL, NULL);
    expect_json_error(a, "/v1/completions", "null", 400, NULL, NULL);
    expect_json_error(a, "/v1/completions", "[]", 400, NULL, NULL);
    expect_json_error(a, "/v1/completions", "{}", 400, "prompt", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":5}", 400, "prompt",
                      NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":[\"a\",5]}", 400,
                      "prompt", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":[1,-2]}", 400,
                      "prompt", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":\"x\",\"n\":0}", 400,
                      "n", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":\"x\",\"n\":129}",
                      400, "n", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":\"x\",\"echo\":1}",
                      400, "echo", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs",
                      NULL);
    /* logprobs (issue 39): each API's own form, nothing else */
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"logprobs\":true}", 400,
                      "logprobs", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"top_logprobs\":3}", 400,
                      "top_logprobs", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"prompt_logprobs\":-1}", 400,
                      "prompt_logprobs", NULL);
    expect_json_error(a, "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"echo\":true}", 400, "echo", NULL);
    expect_json_error(a, "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"top_logprobs\":2}", 400, "top_logprobs", NULL);
    expect_json_error(a, "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"logprobs\":true,\"top_logprobs\":21}", 400,
                      "top_logprobs", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"temperature\":-1}", 400,
                      "temperature", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400,
                      "temperature", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"max_tokens\":0}", 400,
                      "max_tokens", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400,
                      "max_tokens", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":\"x\",\"top_p\":0}",
                      400, "top_p", NULL);
    expect_json_error(a, "/v1/completions", "{\"prompt\":\"x\",\"stop\":5}",
                      400, "stop", NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream",
                      NULL);
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model",
                      "model_not_found");
    expect_json_error(a, "/v1/completions", "{\"prompt\":[1,100000]}", 400,
                      NULL, NULL); /* outside the vocabulary: the router */
    {
        /* deeply nested JSON */
        char *deep = bt_malloc(8192, "test");
        memset(deep, '[', 4000);
        memset(deep + 4000, ']', 4000);
        deep[8000] = '\0';
        expect_json_error(a, "/v1/completions", deep, 400, NULL, NULL);
        bt_free(deep);
    }
    {
        /* a prompt longer than the context (128) */
        char *ids = bt_malloc(4096, "test");
        int o = snprintf(ids, 4096, "{\"prompt\":[1");
        for (int i = 0; i < 200; i++)
            o += snprintf(ids + o, 4096 - (size_t)o, ",300");
        snprintf(ids + o, 4096 - (size_t)o, "]}");
        expect_json_error(a, "/v1/completions", ids, 400, NULL,
                          "context_length_exceeded");
        bt_free(ids);
    }
    expect_json_error(a, "/v1/chat/completions", "{\"messages\":[]}", 400,
                      "messages", NULL);
    expect_json_error(a, "/v1/chat/completions", "{\"messages\":\"hi\"}", 400,
                      "messages", NULL);
    expect_json_error(a, "/v1/chat/completions",
                      "{\"messages\":[{\"content\":\"x\"}]}", 400,
                      "messages[0].role", NULL);
    expect_json_error(a, "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
                      400, "messages[0].content", NULL);
    still_serving(a);

    /* --- 504: the router's deadline passes mid-generation */
    expect_json_error(a, "/v1/completions",
                      "{\"prompt\":\"The river\",\"max_tokens\":100,"
                      "\"ignore_eos\":true,\"deadline_ms\":300}",
                      504, NULL, "deadline_exceeded");

    /* --- a client that disconnects mid-stream is cancelled */
    {
        const char *body = "{\"prompt\":\"The river\",\"max_tokens\":100,"
                           "\"ignore_eos\":true,\"stream\":true}";
        int fd = ht_connect(a);
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        char line[4096];
        uint64_t t0;
        bool idle = false;

        n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
        ht_conn_init(hc, fd);
        BT_CHECK(ht_send(fd, req, (size_t)n));
        while (ht_line(hc, line, sizeof(line)) &&
               strncmp(line, "data: ", 6) != 0)
            ;
        BT_CHECK(strncmp(line, "data: ", 6) == 0);
        BT_ASSERT_OK(cu_status(ca, &st));
        BT_ASSERT_EQ(st.in_flight + st.queued, 1);
        close(fd);
        bt_free(hc);
        t0 = bt_time_ns();
        /* 100 tokens at 20 ms would take 2 s; a cancel takes far less */
        while (bt_time_ns() - t0 < 1000000000ull) {
            if (cu_status(ca, &st) == 0 && st.in_flight == 0 &&
                st.queued == 0 && st.free_kv == st.total_kv) {
                idle = true;
                break;
            }
            usleep(20000);
        }
        if (!idle)
            BT_TEST_FAIL("request not cancelled: in flight %d, KV %lld/%lld free",
                         st.in_flight, st.free_kv, st.total_kv);
        fprintf(stderr, "cancelled and idle %.0f ms after the disconnect\n",
                (double)(bt_time_ns() - t0) * 1e-6);
    }

    /* --- too many connections (--max-connections 12): idle ones are
     * closed for a new client (slowloris cannot keep it out), the
     * longest idle first */
    {
        int fds[12];
        ht_resp_t r;
        char byte;
        usleep(200000); /* earlier connections closed at the server */
        for (int i = 0; i < 12; i++) {
            fds[i] = ht_connect(a);
            usleep(5000); /* distinct idle ages */
        }
        usleep(200000);
        BT_ASSERT_EQ(ht_request(a, "GET", "/health", NULL, &r), 200);
        ht_resp_free(&r);
        /* the oldest idle connection was the one closed */
        BT_ASSERT_EQ(recv(fds[0], &byte, 1, 0), 0);
        for (int i = 0; i < 12; i++)
            close(fds[i]);
        usleep(200000);
        still_serving(a);
    }

    /* --- router B: no workers, one live request at most */
    {
        const char *body = "{\"prompt\":\"The river\",\"max_tokens\":5}";
        int fd = ht_connect(b);
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        ht_resp_t r;

        ht_request(b, "GET", "/health", NULL, &r);
        BT_ASSERT_EQ(r.status, 503);
        BT_CHECK(strstr(r.body, "no_workers") != NULL);
        ht_resp_free(&r);
        n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
        ht_conn_init(hc, fd);
        BT_CHECK(ht_send(fd, req, (size_t)n));
        usleep(200000); /* queued at router B now */
        expect_json_error(b, "/v1/completions", body, 429, NULL, "overloaded");
        ht_read(hc, &r); /* after the 1.5 s queue timeout */
        check_error(&r, 503, NULL, "no_workers");
        ht_resp_free(&r);
        close(fd);
        bt_free(hc);
        /* a stream that never began still gets a real status */
        ht_request(b, "POST", "/v1/completions",
                   "{\"prompt\":\"x\",\"stream\":true,\"deadline_ms\":200}",
                   &r);
        check_error(&r, 504, NULL, "deadline_exceeded");
        ht_resp_free(&r);
    }

    /* --- /metrics: valid Prometheus text counting the above */
    {
        ht_resp_t r;
        BT_ASSERT_EQ(ht_request(a, "GET", "/metrics", NULL, &r), 200);
        BT_CHECK(strstr(r.head, "text/plain") != NULL);
        check_prometheus(r.body);
        BT_CHECK(metric(r.body, "baton_http_router_up") == 1);
        BT_CHECK(metric(r.body, "baton_http_requests_total{endpoint="
                                "\"/v1/completions\",code=\"400\"}") >= 15);
        BT_CHECK(metric(r.body, "baton_http_requests_total{endpoint="
                                "\"/v1/completions\",code=\"504\"}") == 1);
        BT_CHECK(metric(r.body, "baton_http_requests_total{endpoint="
                                "\"/v1/completions\",code=\"200\"}") >= 1);
        BT_CHECK(metric(r.body, "baton_http_requests_cancelled_total") == 1);
        BT_CHECK(metric(r.body, "baton_http_connections_evicted_total") >= 1);
        BT_CHECK(metric(r.body, "baton_http_requests_in_flight") == 0);
        BT_CHECK(metric(r.body,
                        "baton_http_time_to_first_token_seconds_count") >= 2);
        BT_CHECK(metric(r.body, "baton_http_completion_tokens_total") >= 2);
        BT_CHECK(metric(r.body, "baton_http_worker_kv_blocks{worker=\"d0\","
                                "role=\"decode\"}") > 0);
        BT_CHECK(metric(r.body, "baton_http_router_workers{role=\"prefill\"}") == 1);
        ht_resp_free(&r);
        BT_ASSERT_EQ(ht_request(b, "GET", "/metrics", NULL, &r), 200);
        check_prometheus(r.body);
        BT_CHECK(metric(r.body, "baton_http_requests_total{endpoint="
                                "\"/v1/completions\",code=\"429\"}") == 1);
        ht_resp_free(&r);
    }

    cu_wait_kv_idle(ca, 5000);
    still_serving(a);
    client_destroy(&ca);
    BT_TEST_PASS("gateway/http_errors: every error answered, server kept "
                 "serving, disconnect cancelled");
    return 0;
}
