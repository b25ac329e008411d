/*
 * test_http_auth.c - baton-http's API keys and tenant limits (issue 42,
 * items 4 and 5), on a null-model cluster.
 *
 *   1. Fail closed: a missing key file, and a malformed one, stop
 *      baton-http at start with a clear error that never prints a key.
 *   2. /livez and /health answer without a key; /v1/completions and
 *      /v1/models without a key, with a wrong key, with a prefix of a
 *      right key, and with two Authorization fields get 401 in OpenAI's
 *      error shape (WWW-Authenticate: Bearer); /metrics too under
 *      --metrics-auth.  None of them reaches the router: its
 *      baton_router_admitted_total and rejected counts stay 0.
 *   3. A right key is served (the router admits exactly that one).
 *   4. A tenant with max_concurrency=1 and one stream in flight gets 429
 *      with Retry-After for its second request; another tenant is served
 *      meanwhile; the refused request never reaches the router.
 *   5. A tenant with tokens_per_min=60 is served once, then gets 429 with
 *      a Retry-After of many seconds; nothing reaches the router.
 *
 * Run: ctest -R gateway/test_http_auth (about 10 s).
 */
#include <sys/stat.h>

#include "gateway/http_util.h"
#include "bt_prom_test.h"

#define KEY_ALPHA "sk-test-alpha-0123456789"
#define KEY_BETA "sk-test-beta-0123456789ab"
#define KEY_GAMMA "sk-test-gamma-0123456789"

static const char key_file_text[] =
    "# baton-http API keys: KEY TENANT [options]\n"
    "\n"
    KEY_ALPHA " alpha max_concurrency=1\n"
    KEY_BETA "  beta tokens_per_min=60   # a tiny token rate\n"
    KEY_GAMMA " gamma priority=1 weight=2 cache_salt=g-salt\n";

static const char body_short[] =
    "{\"model\":\"baton\",\"prompt\":\"hello\",\"max_tokens\":4}";

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    BT_CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
}

/* A POST /v1/completions with the given Authorization lines ("" none). */
static int post_auth(int port, const char *auth_lines, const char *body,
                     ht_resp_t *r)
{
    char req[2048];
    int n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: t\r\n%s"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     auth_lines, strlen(body), body);

    return ht_raw(port, req, (size_t)n, r);
}

static int get_auth(int port, const char *path, const char *auth_lines,
                    ht_resp_t *r)
{
    char req[1024];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n%s\r\n",
                     path, auth_lines);

    return ht_raw(port, req, (size_t)n, r);
}

/* The router's admitted and rejected+failed counts. */
static void router_counts(int mport, double *admitted, double *rejected)
{
    ht_resp_t r;

    BT_ASSERT_EQ(ht_request(mport, "GET", "/metrics", NULL, &r), 200);
    *admitted = metric(r.body, "baton_router_admitted_total");
    *rejected = metric_sum(r.body, "baton_router_rejected_total");
    BT_CHECK(*admitted >= 0);
    ht_resp_free(&r);
}

static void check_401(const ht_resp_t *r)
{
    char v[128];
    cJSON *j, *e;

    if (r->status != 401)
        BT_TEST_FAIL("status %d, expected 401 (body %s)", r->status,
                     r->body ? r->body : "");
    BT_CHECK(ht_header(r, "WWW-Authenticate", v, sizeof(v)) != NULL);
    j = cJSON_Parse(r->body);
    BT_CHECK(j != NULL);
    e = cJSON_GetObjectItem(j, "error");
    BT_CHECK(cJSON_IsObject(e));
    BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    BT_CHECK(strcmp(cJSON_GetObjectItem(e, "code")->valuestring,
                    "invalid_api_key") == 0);
    /* the key is never echoed */
    BT_CHECK(strstr(r->body, "sk-test") == NULL);
    cJSON_Delete(j);
}

static void check_429(const ht_resp_t *r, int min_retry_s)
{
    char v[64];

    if (r->status != 429)
        BT_TEST_FAIL("status %d, expected 429 (body %s)", r->status,
                     r->body ? r->body : "");
    BT_CHECK(ht_header(r, "Retry-After", v, sizeof(v)) != NULL);
    fprintf(stderr, "  429 Retry-After: %s (%s)\n", v, r->body);
    BT_CHECK(atoi(v) >= min_retry_s);
}

/* baton-http with `args` must exit non-zero at start, its log naming
 * `expect` and no key. */
static void expect_refusal(const char *router, const char *key_file,
                           const char *expect)
{
    char log[] = "/tmp/bt_http_auth_logXXXXXX";
    char *text = NULL;
    size_t len;
    pid_t pid;
    int fd = mkstemp(log), rc;

    BT_CHECK(fd >= 0);
    close(fd);
    pid = cu_spawn_log(log, "baton-http", "--router", router, "--listen",
                       "127.0.0.1:0", "--api-key-file", key_file, NULL);
    rc = cu_wait_exit(pid, 10000);
    BT_ASSERT_OK(bt_read_file(log, 1 << 20, &text, &len));
    fprintf(stderr, "  refused (exit %d): %s", rc, text);
    BT_CHECK(rc > 0);
    BT_CHECK(strstr(text, expect) != NULL);
    BT_CHECK(strstr(text, "sk-") == NULL);
    bt_free(text);
    unlink(log);
}

int main(void)
{
    char listen[64], control[64], mport_s[16];
    char key_path[] = "/tmp/bt_http_keysXXXXXX";
    char bad_path[] = "/tmp/bt_http_badkeysXXXXXX";
    double adm0, rej0, adm, rej;
    ht_resp_t r;
    int port, mport, fd;

    cu_init();
    fd = mkstemp(key_path);
    BT_CHECK(fd >= 0);
    close(fd);
    write_file(key_path, key_file_text);
    fd = mkstemp(bad_path);
    BT_CHECK(fd >= 0);
    close(fd);
    write_file(bad_path, "sk-short gamma\n");

    cu_router_addrs(listen, control);
    mport = cu_free_port();
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--metrics-port", mport_s, NULL);
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", "--step-delay-ms", "20", NULL);

    /* 1. fail closed */
    expect_refusal(listen, "/nonexistent/baton-keys", "API key file");
    expect_refusal(listen, bad_path, "line 1");

    port = ht_start_gateway(listen, "--api-key-file", key_path,
                            "--metrics-auth", NULL);
    /* 2. probes stay open */
    BT_ASSERT_EQ(get_auth(port, "/livez", "", &r), 200);
    ht_resp_free(&r);
    ht_wait_healthy(port, 20000);
    router_counts(mport, &adm0, &rej0);

    post_auth(port, "", body_short, &r);
    check_401(&r);
    ht_resp_free(&r);
    post_auth(port, "Authorization: Bearer sk-test-wrong-0123456789\r\n",
              body_short, &r);
    check_401(&r);
    ht_resp_free(&r);
    post_auth(port, "Authorization: Bearer sk-test-alpha-012345678\r\n",
              body_short, &r); /* one character short */
    check_401(&r);
    ht_resp_free(&r);
    post_auth(port, "Authorization: Basic " KEY_GAMMA "\r\n", body_short, &r);
    check_401(&r);
    ht_resp_free(&r);
    post_auth(port, "Authorization: Bearer " KEY_GAMMA "\r\n"
                    "Authorization: Bearer " KEY_GAMMA "\r\n",
              body_short, &r); /* ambiguous */
    check_401(&r);
    ht_resp_free(&r);
    get_auth(port, "/v1/models", "", &r);
    check_401(&r);
    ht_resp_free(&r);
    get_auth(port, "/metrics", "", &r);
    check_401(&r);
    ht_resp_free(&r);
    router_counts(mport, &adm, &rej);
    BT_ASSERT_EQ((long long)adm, (long long)adm0);
    BT_ASSERT_EQ((long long)rej, (long long)rej0);
    fprintf(stderr, "7 refused requests: router admitted %.0f -> %.0f\n",
            adm0, adm);

    /* 3. a right key */
    BT_ASSERT_EQ(get_auth(port, "/v1/models",
                          "Authorization: Bearer " KEY_GAMMA "\r\n", &r),
                 200);
    ht_resp_free(&r);
    BT_ASSERT_EQ(post_auth(port, "Authorization: bearer " KEY_GAMMA "\r\n",
                           body_short, &r),
                 200);
    ht_resp_free(&r);
    router_counts(mport, &adm, &rej);
    BT_ASSERT_EQ((long long)adm, (long long)adm0 + 1);

    /* 4. alpha: one stream in flight, the second request 429 */
    {
        static const char stream_body[] =
            "{\"model\":\"baton\",\"prompt\":\"hello\",\"max_tokens\":200,"
            "\"stream\":true}";
        char req[1024], line[512];
        ht_conn_t *c = bt_malloc(sizeof(*c), "test");
        int sfd = ht_connect(port);
        int n = snprintf(req, sizeof(req),
                         "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                         "Authorization: Bearer " KEY_ALPHA "\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         strlen(stream_body), stream_body);

        ht_conn_init(c, sfd);
        BT_CHECK(ht_send(sfd, req, (size_t)n));
        BT_CHECK(ht_line(c, line, sizeof(line)));
        BT_CHECK(strstr(line, "200") != NULL); /* streaming now */
        router_counts(mport, &adm0, &rej0);
        post_auth(port, "Authorization: Bearer " KEY_ALPHA "\r\n",
                  body_short, &r);
        check_429(&r, 1);
        ht_resp_free(&r);
        /* another tenant is not limited by alpha's stream */
        BT_ASSERT_EQ(post_auth(port, "Authorization: Bearer " KEY_GAMMA
                                     "\r\n", body_short, &r),
                     200);
        ht_resp_free(&r);
        router_counts(mport, &adm, &rej);
        BT_ASSERT_EQ((long long)adm, (long long)adm0 + 1); /* gamma's */
        BT_ASSERT_EQ((long long)rej, (long long)rej0);
        close(sfd); /* cancels the stream: alpha's slot comes back */
        bt_free(c);
        for (int t = 0;; t += 50) {
            int st = post_auth(port, "Authorization: Bearer " KEY_ALPHA
                                     "\r\n", body_short, &r);
            ht_resp_free(&r);
            if (st == 200)
                break;
            if (t > 5000)
                BT_TEST_FAIL("alpha's slot did not come back (%d)", st);
            usleep(50000);
        }
    }

    /* 5. beta: 60 tokens a minute; the first request overdraws it */
    BT_ASSERT_EQ(post_auth(port, "Authorization: Bearer " KEY_BETA "\r\n",
                           "{\"model\":\"baton\",\"prompt\":\"hello\","
                           "\"max_tokens\":64}", &r),
                 200);
    ht_resp_free(&r);
    router_counts(mport, &adm0, &rej0);
    post_auth(port, "Authorization: Bearer " KEY_BETA "\r\n", body_short, &r);
    check_429(&r, 2);
    ht_resp_free(&r);
    router_counts(mport, &adm, &rej);
    BT_ASSERT_EQ((long long)adm, (long long)adm0);
    BT_ASSERT_EQ((long long)rej, (long long)rej0);

    /* baton-http's own counters, read with a key */
    BT_ASSERT_EQ(get_auth(port, "/metrics",
                          "Authorization: Bearer " KEY_GAMMA "\r\n", &r),
                 200);
    BT_ASSERT_EQ((long long)metric(r.body, "baton_http_unauthorized_total"),
                 7);
    BT_CHECK(metric(r.body, "baton_http_tenant_limited_total") >= 2);
    ht_resp_free(&r);

    unlink(key_path);
    unlink(bad_path);
    BT_TEST_PASS("gateway/http_auth: fail closed; 401 without or with a "
                 "wrong key, nothing reaching the router; 429 over a "
                 "tenant's concurrency and token rate with Retry-After");
    return 0;
}
