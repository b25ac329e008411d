/*
 * test_http_tokenize.c - baton-http's /tokenize, /detokenize, /version and
 * CORS (issue 39) on an aggregated cluster (router + one aidreams260K
 * decode worker running --role both), all over real sockets:
 *   - /tokenize of a prompt gives the ids the cluster counts: a greedy
 *     completion of those ids equals the completion of the text, and its
 *     usage.prompt_tokens equals "count"; max_model_len is the cluster's
 *     context; /tokenize of messages gives the chat endpoint's count;
 *   - /detokenize gives the text back; ids out of the vocabulary, bad
 *     JSON and bad fields are 400s naming the parameter; GET is 405;
 *   - /version is {"version": "<project version>"};
 *   - CORS: an allowed origin's preflight is 204 with Allow-Origin /
 *     Methods / Headers, its responses carry Allow-Origin; another origin
 *     gets 403 on preflight and no header; "*" allows any; without
 *     --cors-origins no CORS header at all.
 */
#include "gateway/http_util.h"

#define GOOD "http://good.example:3000"

/* A request with extra header lines; returns the status. */
static int request_h(int port, const char *method, const char *path,
                     const char *headers, const char *body, ht_resp_t *r)
{
    size_t blen = body ? strlen(body) : 0;
    char *req = bt_malloc(blen + 1024, "test");
    int n = snprintf(req, 1024,
                     "%s %s HTTP/1.1\r\nHost: test\r\n%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, headers, blen);
    int status;

    memcpy(req + n, body ? body : "", blen);
    status = ht_raw(port, req, (size_t)n + blen, r);
    bt_free(req);
    return status;
}

static cJSON *post_json(int port, const char *path, const char *body,
                        int want)
{
    ht_resp_t r;
    cJSON *j;
    int st = ht_request(port, "POST", path, body, &r);

    if (st != want)
        BT_TEST_FAIL("POST %s %s: %d, expected %d (%s)", path, body, st, want,
                     r.body ? r.body : "");
    j = cJSON_Parse(r.body);
    if (j == NULL)
        BT_TEST_FAIL("POST %s: not JSON: %s", path, r.body);
    ht_resp_free(&r);
    return j;
}

static void expect_400(int port, const char *path, const char *body,
                       const char *param)
{
    cJSON *j = post_json(port, path, body, 400);
    cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param");

    if (param != NULL &&
        (!cJSON_IsString(p) || strcmp(p->valuestring, param) != 0))
        BT_TEST_FAIL("%s %s: param %s, expected %s", path, body,
                     cJSON_IsString(p) ? p->valuestring : "null", param);
    cJSON_Delete(j);
}

static int usage_prompt(const cJSON *j)
{
    return cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"),
                               "prompt_tokens")->valueint;
}

static const char *choice_text(const cJSON *j)
{
    return cJSON_GetObjectItem(
               cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
               "text")->valuestring;
}

static void test_tokenize(int http, uint32_t ctx)
{
    cJSON *tk, *a, *b, *d, *tokens;
    char *ids, body[4096];
    int count;

    /* max_model_len is the cluster's context once baton-http knows it */
    for (int t = 0;; t++) {
        tk = post_json(http, "/tokenize", "{\"prompt\":\"The river\"}", 200);
        if (cJSON_IsNumber(cJSON_GetObjectItem(tk, "max_model_len")) ||
            t == 50)
            break;
        cJSON_Delete(tk);
        usleep(100000);
    }
    BT_ASSERT_EQ(cJSON_GetObjectItem(tk, "max_model_len")->valueint,
                 (int)ctx);
    tokens = cJSON_GetObjectItem(tk, "tokens");
    count = cJSON_GetObjectItem(tk, "count")->valueint;
    BT_CHECK(count >= 2);
    BT_ASSERT_EQ(cJSON_GetArraySize(tokens), count);
    ids = cJSON_PrintUnformatted(tokens);

    /* the ids are what the cluster makes of the text */
    a = post_json(http, "/v1/completions",
                  "{\"prompt\":\"The river\",\"max_tokens\":8,"
                  "\"temperature\":0}", 200);
    snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":8,"
             "\"temperature\":0}", ids);
    b = post_json(http, "/v1/completions", body, 200);
    BT_ASSERT_EQ(usage_prompt(a), count);
    BT_ASSERT_EQ(usage_prompt(b), count);
    BT_ASSERT_STREQ(choice_text(a), choice_text(b));
    BT_CHECK(choice_text(a)[0] != '\0');
    fprintf(stderr, "tokenize: 'The river' -> %s (%d ids, context %u); "
            "completion '%s' either way\n", ids, count, ctx, choice_text(a));

    /* back to text */
    snprintf(body, sizeof(body), "{\"tokens\":%s}", ids);
    d = post_json(http, "/detokenize", body, 200);
    BT_ASSERT_STREQ(cJSON_GetObjectItem(d, "prompt")->valuestring,
                    "The river");
    cJSON_Delete(d);
    cJSON_free(ids);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(tk);

    /* messages: the chat endpoint's prompt */
    {
        const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":"
                           "\"Be brief.\"},{\"role\":\"user\",\"content\":"
                           "\"Tell me a story\"}]";
        snprintf(body, sizeof(body), "{%s}", msgs);
        tk = post_json(http, "/tokenize", body, 200);
        snprintf(body, sizeof(body), "{%s,\"max_tokens\":2}", msgs);
        a = post_json(http, "/v1/chat/completions", body, 200);
        BT_ASSERT_EQ(cJSON_GetObjectItem(tk, "count")->valueint,
                     usage_prompt(a));
        cJSON_Delete(a);
        cJSON_Delete(tk);
    }

    /* refusals */
    expect_400(http, "/tokenize", "{", NULL);
    expect_400(http, "/tokenize", "{}", "prompt");
    expect_400(http, "/tokenize", "{\"prompt\":[1,2]}", "prompt");
    expect_400(http, "/tokenize", "{\"messages\":\"hi\"}", "messages");
    expect_400(http, "/detokenize", "{\"tokens\":[1,100000]}", "tokens");
    expect_400(http, "/detokenize", "{\"tokens\":[-3]}", "tokens");
    expect_400(http, "/detokenize", "{\"tokens\":\"1 2\"}", "tokens");
    {
        ht_resp_t r;
        char v[32];
        BT_ASSERT_EQ(ht_request(http, "GET", "/tokenize", NULL, &r), 405);
        BT_ASSERT_STREQ(ht_header(&r, "Allow", v, sizeof(v)), "POST");
        ht_resp_free(&r);
        cJSON_Delete(post_json(http, "/tokenize",
                               "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404));
    }
}

/* The cluster's context, from the router's status. */
static uint32_t router_context(client_t *c)
{
    uint64_t rid;

    BT_ASSERT_OK(client_status_request(c, &rid));
    for (;;) {
        Baton__ClientMessage *m = NULL;
        uint32_t ctx;
        BT_ASSERT_OK(client_recv(c, 5000, &m));
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
            m->status->client_request_id == rid) {
            ctx = m->status->max_context;
            proto_client_free(&m);
            return ctx;
        }
        proto_client_free(&m);
    }
}

static void test_version(int http)
{
    char path[512], *cm = NULL, want[32];
    const char *v;
    size_t len;
    ht_resp_t r;
    cJSON *j;

    /* the project version, as the top CMakeLists.txt declares it */
    snprintf(path, sizeof(path), "%s/CMakeLists.txt", BT_SOURCE_DIR);
    BT_ASSERT_OK(bt_read_file(path, 1u << 20, &cm, &len));
    v = strstr(cm, "project(baton VERSION ");
    BT_CHECK(v != NULL);
    v += strlen("project(baton VERSION ");
    len = strcspn(v, " )");
    BT_CHECK(len > 0 && len < sizeof(want));
    memcpy(want, v, len);
    want[len] = '\0';
    bt_free(cm);
    BT_ASSERT_EQ(ht_request(http, "GET", "/version", NULL, &r), 200);
    j = cJSON_Parse(r.body);
    BT_CHECK(j != NULL);
    BT_ASSERT_STREQ(cJSON_GetObjectItem(j, "version")->valuestring, want);
    cJSON_Delete(j);
    ht_resp_free(&r);
}

static void test_cors(int listed, int any, int none)
{
    static const char preflight[] =
        "Access-Control-Request-Method: POST\r\n"
        "Access-Control-Request-Headers: authorization, content-type\r\n";
    char h[512], v[512];
    ht_resp_t r;

    /* allowed origin: preflight 204 and the header on real responses */
    snprintf(h, sizeof(h), "Origin: " GOOD "\r\n%s", preflight);
    BT_ASSERT_EQ(request_h(listed, "OPTIONS", "/v1/completions", h, NULL, &r),
                 204);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), GOOD);
    BT_CHECK(strstr(ht_header(&r, "Access-Control-Allow-Methods", v,
                              sizeof(v)), "POST") != NULL);
    BT_CHECK(strcasestr(ht_header(&r, "Access-Control-Allow-Headers", v,
                                  sizeof(v)), "authorization") != NULL);
    ht_resp_free(&r);
    BT_ASSERT_EQ(request_h(listed, "POST", "/v1/completions",
                           "Origin: " GOOD "\r\n",
                           "{\"prompt\":\"x\",\"max_tokens\":1}", &r), 200);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), GOOD);
    ht_resp_free(&r);
    /* another origin: refused preflight, no header */
    snprintf(h, sizeof(h), "Origin: http://evil.example\r\n%s", preflight);
    BT_ASSERT_EQ(request_h(listed, "OPTIONS", "/v1/completions", h, NULL, &r),
                 403);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), "");
    ht_resp_free(&r);
    BT_ASSERT_EQ(request_h(listed, "GET", "/v1/models",
                           "Origin: http://evil.example\r\n", NULL, &r), 200);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), "");
    ht_resp_free(&r);
    /* "*" */
    snprintf(h, sizeof(h), "Origin: http://anyone.example\r\n%s", preflight);
    BT_ASSERT_EQ(request_h(any, "OPTIONS", "/v1/chat/completions", h, NULL,
                           &r), 204);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), "*");
    ht_resp_free(&r);
    /* no --cors-origins: no CORS at all (OPTIONS is just a wrong method) */
    snprintf(h, sizeof(h), "Origin: " GOOD "\r\n%s", preflight);
    BT_ASSERT_EQ(request_h(none, "OPTIONS", "/v1/completions", h, NULL, &r),
                 405);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), "");
    ht_resp_free(&r);
    BT_ASSERT_EQ(request_h(none, "GET", "/v1/models", "Origin: " GOOD "\r\n",
                           NULL, &r), 200);
    BT_ASSERT_STREQ(ht_header(&r, "Access-Control-Allow-Origin", v,
                              sizeof(v)), "");
    ht_resp_free(&r);
}

int main(void)
{
    char listen[64], control[64], model[512], tok[512];
    client_t *c = NULL;
    int port, listed, any, none;

    cu_init();
    port = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", port + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0", "--role",
             "both", NULL);
    listed = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                              "aidreams", "--cors-origins",
                              "https://other.example, " GOOD, NULL);
    any = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                           "aidreams", "--cors-origins", "*", NULL);
    none = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                            "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, 1, 20000);
    ht_wait_healthy(listed, 10000);

    test_version(listed);
    test_tokenize(listed, router_context(c));
    test_cors(listed, any, none);

    client_destroy(&c);
    cu_kill_all();
    BT_TEST_PASS("gateway/http_tokenize: /tokenize ids are the cluster's, "
                 "/detokenize round-trips, /version, CORS");
    return 0;
}
