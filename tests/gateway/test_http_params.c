/*
 * test_http_params.c - no silently ignored parameter (issue 39), against
 * a real cluster and baton-http: every OpenAI/vLLM parameter baton does
 * not implement, sent with a value other than what baton does, gets an
 * OpenAI-shaped 400 naming it on /v1/completions and
 * /v1/chat/completions; the values that match what baton does (and
 * add_generation_prompt, implemented for chat) are served; X-Request-Id
 * is echoed (the client's, or a new one when absent or unusable) on
 * successes, errors and streams.
 *
 * Cluster: router + prefill + decode (aidreams260K), greedy, few tokens.
 */
#include "gateway/http_util.h"

/* An OpenAI 400 naming `param`, type invalid_request_error. */
static void expect_refused(int port, const char *path, const char *body,
                           const char *param)
{
    ht_resp_t r;
    cJSON *j, *e, *p, *t;

    ht_request(port, "POST", path, body, &r);
    if (r.status != 400)
        BT_TEST_FAIL("%s %s: status %d, expected 400 (body %s)", path, body,
                     r.status, r.body ? r.body : "");
    j = cJSON_Parse(r.body);
    BT_CHECK(j != NULL);
    e = cJSON_GetObjectItem(j, "error");
    p = cJSON_GetObjectItem(e, "param");
    t = cJSON_GetObjectItem(e, "type");
    if (!cJSON_IsString(p) || strcmp(p->valuestring, param) != 0)
        BT_TEST_FAIL("%s %s: param %s, expected %s", path, body,
                     cJSON_IsString(p) ? p->valuestring : "null", param);
    BT_CHECK(cJSON_IsString(t) &&
             strcmp(t->valuestring, "invalid_request_error") == 0);
    BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    cJSON_Delete(j);
    ht_resp_free(&r);
}

/* A 200 completion; returns usage.prompt_tokens. */
static int expect_served(int port, const char *path, const char *body)
{
    ht_resp_t r;
    cJSON *j, *u;
    int prompt_tokens;

    ht_request(port, "POST", path, body, &r);
    if (r.status != 200)
        BT_TEST_FAIL("%s %s: status %d, expected 200 (body %s)", path, body,
                     r.status, r.body ? r.body : "");
    j = cJSON_Parse(r.body);
    BT_CHECK(j != NULL);
    u = cJSON_GetObjectItem(j, "usage");
    BT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(u, "completion_tokens")));
    prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    cJSON_Delete(j);
    ht_resp_free(&r);
    return prompt_tokens;
}

/* A parameter and a value baton refuses for it (a JSON text). */
typedef struct {
    const char *name;
    const char *value;
} refused_t;

static const refused_t refused[] = {
    {"response_format", "{\"type\":\"yaml\"}"},
    {"guided_grammar", "\"root ::= x\""},
    {"min_tokens", "5"},
    {"include_stop_str_in_output", "true"},
    {"continue_final_message", "true"},
    {"chat_template", "\"{{ messages }}\""},
    {"chat_template_kwargs", "{\"enable_thinking\":false}"},
    {"truncate_prompt_tokens", "10"},
    {"tool_choice", "\"auto\""},
    {"tool_choice", "\"required\""},
    {"tool_choice", "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"},
    {"return_tokens_as_token_ids", "true"},
    {"n", "129"}, /* over GATEWAY_MAX_CHOICES */
    {"best_of", "2"},
    {"suffix", "\"end\""},
    {"logit_bias", "{\"5\":1}"},
    {"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"},
};

#define CHAT_MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"

/* Every table value baton implements: a request carrying all of them. */
#define ACCEPTED_PARAMS                                                     \
    "\"temperature\":0,\"max_tokens\":4,\"n\":1,\"best_of\":1,"            \
    "\"echo\":false,\"logprobs\":false,\"top_logprobs\":0,"                \
    "\"prompt_logprobs\":null,\"logit_bias\":{},\"tools\":[],"             \
    "\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"},"    \
    "\"min_tokens\":0,\"include_stop_str_in_output\":false,"               \
    "\"return_tokens_as_token_ids\":false,\"truncate_prompt_tokens\":null," \
    "\"continue_final_message\":false,\"chat_template_kwargs\":{},"        \
    "\"chat_template\":null,\"skip_special_tokens\":true"

/* The value of X-Request-Id of one raw request (header line or ""). */
static void request_id_of(int port, const char *extra_header,
                          const char *path, const char *body, int status,
                          char *out, size_t cap)
{
    char req[4096];
    ht_resp_t r;
    int n;

    n = snprintf(req, sizeof(req),
                 "POST %s HTTP/1.1\r\nHost: test\r\n%s"
                 "Content-Length: %zu\r\n\r\n%s",
                 path, extra_header, strlen(body), body);
    ht_raw(port, req, (size_t)n, &r);
    if (r.status != status)
        BT_TEST_FAIL("%s %s: status %d, expected %d (body %s)", path, body,
                     r.status, status, r.body ? r.body : "");
    ht_header(&r, "X-Request-Id", out, cap);
    ht_resp_free(&r);
}

int main(void)
{
    char listen[64], control[64], model[512], tok[512];
    char body[1024], id[256], id2[256];
    const char *paths[2] = {"/v1/completions", "/v1/chat/completions"};
    client_t *c = NULL;
    int port, g, with_gen, without_gen;

    cu_init();
    port = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", port + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control, NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0", NULL);
    g = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                         "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    ht_wait_healthy(g, 10000);

    /* --- every refused value: 400 naming it, on both endpoints */
    for (size_t i = 0; i < BT_ARRAY_SIZE(refused); i++) {
        snprintf(body, sizeof(body), "{\"prompt\":\"The river\","
                 "\"max_tokens\":2,\"%s\":%s}", refused[i].name,
                 refused[i].value);
        expect_refused(g, paths[0], body, refused[i].name);
        snprintf(body, sizeof(body), "{" CHAT_MSGS ",\"max_tokens\":2,"
                 "\"%s\":%s}", refused[i].name, refused[i].value);
        expect_refused(g, paths[1], body, refused[i].name);
    }
    /* a completions prompt is not templated: only the default is served */
    expect_refused(g, paths[0], "{\"prompt\":\"x\",\"max_tokens\":2,"
                   "\"add_generation_prompt\":false}",
                   "add_generation_prompt");
    /* a stream is refused before it begins, as a plain 400 */
    expect_refused(g, paths[1], "{" CHAT_MSGS ",\"stream\":true,"
                   "\"min_tokens\":3}",
                   "min_tokens");

    /* --- only supported values: served */
    expect_served(g, paths[0], "{\"prompt\":\"The river\","
                  "\"add_generation_prompt\":true," ACCEPTED_PARAMS "}");
    expect_served(g, paths[1], "{" CHAT_MSGS "," ACCEPTED_PARAMS "}");

    /* --- add_generation_prompt works for chat: false leaves the
     * assistant header out of the prompt (fewer prompt tokens) */
    with_gen = expect_served(g, paths[1], "{" CHAT_MSGS ",\"max_tokens\":2,"
                             "\"temperature\":0,"
                             "\"add_generation_prompt\":true}");
    without_gen = expect_served(g, paths[1], "{" CHAT_MSGS ","
                                "\"max_tokens\":2,\"temperature\":0,"
                                "\"add_generation_prompt\":false}");
    if (!(without_gen > 0 && without_gen < with_gen))
        BT_TEST_FAIL("add_generation_prompt: %d prompt tokens with, %d "
                     "without", with_gen, without_gen);
    expect_refused(g, paths[1], "{" CHAT_MSGS ",\"add_generation_prompt\":1}",
                   "add_generation_prompt");

    /* --- X-Request-Id: echoed on success, error and stream; made when
     * absent (unique) or unusable */
    request_id_of(g, "X-Request-Id: trace-42/abc\r\n", paths[0],
                  "{\"prompt\":\"x\",\"max_tokens\":2}", 200, id, sizeof(id));
    BT_ASSERT_STREQ(id, "trace-42/abc");
    request_id_of(g, "x-request-id: err-1\r\n", paths[0],
                  "{\"prompt\":\"x\",\"min_tokens\":3}", 400, id, sizeof(id));
    BT_ASSERT_STREQ(id, "err-1");
    request_id_of(g, "X-Request-Id: s-7\r\n", paths[1],
                  "{" CHAT_MSGS ",\"max_tokens\":2,\"stream\":true}", 200, id,
                  sizeof(id));
    BT_ASSERT_STREQ(id, "s-7");
    request_id_of(g, "", paths[0], "{\"prompt\":\"x\",\"max_tokens\":2}",
                  200, id, sizeof(id));
    request_id_of(g, "", paths[0], "{\"prompt\":\"x\",\"max_tokens\":2}",
                  200, id2, sizeof(id2));
    BT_CHECK(id[0] != '\0' && id2[0] != '\0' && strcmp(id, id2) != 0);
    {
        char longid[300];
        memset(longid, 'a', 200);
        snprintf(longid + 200, sizeof(longid) - 200, "\r\n");
        char hdr[320];
        snprintf(hdr, sizeof(hdr), "X-Request-Id: %s", longid);
        request_id_of(g, hdr, paths[0], "{\"prompt\":\"x\",\"max_tokens\":2}",
                      200, id, sizeof(id));
        BT_CHECK(id[0] != '\0' && strlen(id) <= 128);
    }
    {
        ht_resp_t r;
        BT_ASSERT_EQ(ht_request(g, "GET", "/health", NULL, &r), 200);
        BT_CHECK(ht_header(&r, "X-Request-Id", id, sizeof(id))[0] != '\0');
        ht_resp_free(&r);
    }

    cu_wait_kv_idle(c, 5000);
    client_destroy(&c);
    BT_TEST_PASS("gateway/http_params: refused values answered 400 "
                 "naming the parameter on both endpoints, supported values "
                 "served, add_generation_prompt works, X-Request-Id echoed");
    return 0;
}
