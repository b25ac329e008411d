/*
 * test_http_golden.c - baton-http in front of a real cluster (router + 1
 * prefill + 1 decode on aidreams260K, 127.0.0.1) gives exactly what
 * `baton run` gives: greedy completions for every golden prompt, non
 * streaming and streaming (SSE chunks joined), a token-id prompt, a chat
 * completion in the plain template (and streamed with usage), 16
 * concurrent connections, keep-alive and pipelined requests; /v1/models
 * and /health answer; afterwards the KV pool is idle.
 */
#include "gateway/http_util.h"

#define MAX_TOKENS 60
#define N_PROMPTS 8

static char *completion_text(const ht_resp_t *r, const char *field,
                             char *finish, size_t fcap)
{
    cJSON *j = cJSON_Parse(r->body), *c0, *t, *u;
    char *out;

    if (j == NULL)
        BT_TEST_FAIL("response is not JSON: %s", r->body);
    BT_ASSERT_STREQ(cJSON_GetObjectItem(j, "model")->valuestring, "aidreams");
    BT_CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "id")));
    BT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "created")));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    BT_CHECK(c0 != NULL);
    if (strcmp(field, "message") == 0) {
        t = cJSON_GetObjectItem(c0, "message");
        BT_ASSERT_STREQ(cJSON_GetObjectItem(t, "role")->valuestring,
                        "assistant");
        t = cJSON_GetObjectItem(t, "content");
    } else {
        t = cJSON_GetObjectItem(c0, "text");
    }
    BT_CHECK(cJSON_IsString(t));
    snprintf(finish, fcap, "%s",
             cJSON_GetObjectItem(c0, "finish_reason")->valuestring);
    u = cJSON_GetObjectItem(j, "usage");
    BT_CHECK(cJSON_GetObjectItem(u, "prompt_tokens")->valueint > 0);
    BT_CHECK(cJSON_GetObjectItem(u, "completion_tokens")->valueint > 0);
    BT_ASSERT_EQ(cJSON_GetObjectItem(u, "total_tokens")->valueint,
                 cJSON_GetObjectItem(u, "prompt_tokens")->valueint +
                     cJSON_GetObjectItem(u, "completion_tokens")->valueint);
    out = bt_strdup(t->valuestring, "test");
    cJSON_Delete(j);
    return out;
}

static char *load_prompts(char **prompts, int max)
{
    char path[512], *data = NULL, *line, *save = NULL;
    size_t len;
    int n = 0;

    snprintf(path, sizeof(path), "%s/models/golden.jsonl", BT_SHARED_DIR);
    BT_ASSERT_OK(bt_read_file(path, 1 << 24, &data, &len));
    for (line = strtok_r(data, "\n", &save); line && n < max;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *m = j ? cJSON_GetObjectItem(j, "model") : NULL;
        cJSON *p = j ? cJSON_GetObjectItem(j, "prompt") : NULL;
        if (cJSON_IsString(m) && strcmp(m->valuestring, "aidreams260K.bin") == 0 &&
            cJSON_IsString(p))
            prompts[n++] = bt_strdup(p->valuestring, "test");
        cJSON_Delete(j);
    }
    prompts[n] = NULL;
    return data;
}

int main(void)
{
    char *prompts[N_PROMPTS + 1], *expect[N_PROMPTS];
    char listen[64], control[64], model[512], tok[512], arg[512];
    char body[2048], finish[32];
    client_t *c = NULL;
    int rport, hport, n_prompts;
    char *data;

    cu_init();
    data = load_prompts(prompts, N_PROMPTS);
    for (n_prompts = 0; prompts[n_prompts]; n_prompts++)
        ;
    BT_CHECK(n_prompts >= 3);
    rport = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", rport);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", rport + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0",
             "--kv-blocks", "400", NULL);
    hport = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                             "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    ht_wait_healthy(hport, 10000);

    /* the reference: baton run, greedy */
    for (int i = 0; i < n_prompts; i++) {
        snprintf(arg, sizeof(arg), "--prompt '%s' --max-tokens %d",
                 prompts[i], MAX_TOKENS);
        expect[i] = ht_baton_run(arg);
        BT_CHECK(strlen(expect[i]) > 0);
    }

    /* non-streaming and streaming completions */
    for (int i = 0; i < n_prompts; i++) {
        char *js = ht_json_str(prompts[i]), *text;
        ht_resp_t r;
        ht_sse_t sse;

        snprintf(body, sizeof(body),
                 "{\"model\":\"aidreams\",\"prompt\":%s,\"max_tokens\":%d,"
                 "\"temperature\":0}", js, MAX_TOKENS);
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r),
                     200);
        text = completion_text(&r, "text", finish, sizeof(finish));
        if (strcmp(text, expect[i]) != 0)
            BT_TEST_FAIL("prompt '%s':\n http: '%s'\n  run: '%s'", prompts[i],
                         text, expect[i]);
        BT_CHECK(strcmp(finish, "length") == 0 || strcmp(finish, "stop") == 0);
        bt_free(text);
        ht_resp_free(&r);

        snprintf(body, sizeof(body),
                 "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,"
                 "\"stream\":true}", js, MAX_TOKENS);
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r),
                     200);
        BT_CHECK(strstr(r.head, "text/event-stream") != NULL);
        ht_sse_parse(r.body, &sse);
        BT_CHECK(sse.done);
        BT_CHECK(sse.n_events >= 2);
        BT_ASSERT_STREQ(sse.text, expect[i]);
        BT_ASSERT_STREQ(sse.finish, finish);
        BT_ASSERT_EQ(sse.usage_completion, -1); /* not asked for */
        ht_resp_free(&r);
        bt_free(js);
    }

    /* a token-id prompt ("The river" encoded) */
    {
        char *want = ht_baton_run("--prompt-ids '1 368 430 429 322 350' "
                                  "--max-tokens 20");
        char *text;
        ht_resp_t r;

        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions",
                                "{\"prompt\":[1,368,430,429,322,350],"
                                "\"max_tokens\":20,\"temperature\":0}",
                                &r), 200);
        text = completion_text(&r, "text", finish, sizeof(finish));
        BT_ASSERT_STREQ(text, want);
        bt_free(text);
        bt_free(want);
        ht_resp_free(&r);
    }

    /* chat, plain template (what aidreams' tokenizer implies) */
    {
        char *want = ht_baton_run("--chat --chat-template plain --system "
                                  "'You dream.' --prompt 'The river' "
                                  "--max-tokens 30");
        char *text;
        ht_resp_t r;
        ht_sse_t sse;
        const char *msgs =
            "\"messages\":[{\"role\":\"system\",\"content\":\"You dream.\"},"
            "{\"role\":\"user\",\"content\":[{\"type\":\"text\","
            "\"text\":\"The \"},{\"type\":\"text\",\"text\":\"river\"}]}]";

        snprintf(body, sizeof(body),
                 "{\"model\":\"aidreams\",%s,\"max_tokens\":30,"
                 "\"temperature\":0}", msgs);
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/chat/completions", body,
                                &r), 200);
        BT_CHECK(strstr(r.body, "\"chat.completion\"") != NULL);
        text = completion_text(&r, "message", finish, sizeof(finish));
        BT_ASSERT_STREQ(text, want);
        bt_free(text);
        ht_resp_free(&r);

        snprintf(body, sizeof(body),
                 "{%s,\"max_completion_tokens\":30,\"temperature\":0,"
                 "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                 msgs);
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/chat/completions", body,
                                &r), 200);
        BT_CHECK(strstr(r.body, "\"chat.completion.chunk\"") != NULL);
        ht_sse_parse(r.body, &sse);
        BT_CHECK(sse.done && sse.role_seen);
        BT_ASSERT_STREQ(sse.text, want);
        BT_CHECK(sse.usage_completion > 0 && sse.usage_completion <= 30);
        BT_CHECK(sse.usage_prompt > 0);
        ht_resp_free(&r);
        bt_free(want);
    }

    /* 16 concurrent connections, each with a golden prompt */
    {
        int fds[16];
        for (int k = 0; k < 16; k++) {
            char *js = ht_json_str(prompts[k % n_prompts]);
            char req[2048];
            int bl = snprintf(body, sizeof(body),
                              "{\"prompt\":%s,\"max_tokens\":%d,"
                              "\"temperature\":0,\"stream\":%s}",
                              js, MAX_TOKENS, k % 2 ? "true" : "false");
            int rl = snprintf(req, sizeof(req),
                              "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                              "Content-Length: %d\r\n\r\n%s", bl, body);
            fds[k] = ht_connect(hport);
            BT_CHECK(ht_send(fds[k], req, (size_t)rl));
            bt_free(js);
        }
        for (int k = 0; k < 16; k++) {
            ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
            ht_resp_t r;
            ht_conn_init(hc, fds[k]);
            BT_ASSERT_EQ(ht_read(hc, &r), 200);
            if (k % 2) {
                ht_sse_t sse;
                ht_sse_parse(r.body, &sse);
                BT_ASSERT_STREQ(sse.text, expect[k % n_prompts]);
            } else {
                char *text = completion_text(&r, "text", finish,
                                             sizeof(finish));
                BT_ASSERT_STREQ(text, expect[k % n_prompts]);
                bt_free(text);
            }
            ht_resp_free(&r);
            close(fds[k]);
            bt_free(hc);
        }
    }

    /* keep-alive + pipelining: three requests in one write, answered in
     * order on one connection; then one more on the same connection */
    {
        char req[8192];
        int fd = ht_connect(hport), rl = 0;
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        ht_resp_t r;
        char *js = ht_json_str(prompts[1]);
        int bl = snprintf(body, sizeof(body),
                          "{\"prompt\":%s,\"max_tokens\":%d,"
                          "\"temperature\":0}", js, MAX_TOKENS);

        rl += snprintf(req + rl, sizeof(req) - (size_t)rl,
                       "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n");
        rl += snprintf(req + rl, sizeof(req) - (size_t)rl,
                       "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                       "Content-Length: %d\r\n\r\n%s", bl, body);
        rl += snprintf(req + rl, sizeof(req) - (size_t)rl,
                       "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
        ht_conn_init(hc, fd);
        BT_CHECK(ht_send(fd, req, (size_t)rl));
        BT_ASSERT_EQ(ht_read(hc, &r), 200);
        BT_CHECK(strstr(r.body, "\"id\":\"aidreams\"") != NULL);
        BT_CHECK(strstr(r.body, "\"object\":\"list\"") != NULL);
        ht_resp_free(&r);
        BT_ASSERT_EQ(ht_read(hc, &r), 200);
        {
            char *text = completion_text(&r, "text", finish, sizeof(finish));
            BT_ASSERT_STREQ(text, expect[1]);
            bt_free(text);
        }
        ht_resp_free(&r);
        BT_ASSERT_EQ(ht_read(hc, &r), 200);
        BT_CHECK(strstr(r.body, "\"status\":\"ok\"") != NULL);
        BT_CHECK(!r.closed);
        ht_resp_free(&r);
        rl = snprintf(req, sizeof(req),
                      "GET /v1/models/aidreams HTTP/1.1\r\nHost: t\r\n"
                      "Connection: close\r\n\r\n");
        BT_CHECK(ht_send(fd, req, (size_t)rl));
        BT_ASSERT_EQ(ht_read(hc, &r), 200);
        BT_CHECK(r.closed);
        BT_CHECK(strstr(r.body, "\"object\":\"model\"") != NULL);
        ht_resp_free(&r);
        close(fd);
        bt_free(hc);
        bt_free(js);
    }

    /* HTTP/1.0 stream: no chunked encoding, ends with the close */
    {
        char req[1024];
        ht_resp_t r;
        ht_sse_t sse;
        int bl = snprintf(body, sizeof(body),
                          "{\"prompt\":\"The river\",\"max_tokens\":%d,"
                          "\"temperature\":0,\"stream\":true}", MAX_TOKENS);
        int rl = snprintf(req, sizeof(req),
                          "POST /v1/completions HTTP/1.0\r\n"
                          "Content-Length: %d\r\n\r\n%s", bl, body);
        BT_ASSERT_EQ(ht_raw(hport, req, (size_t)rl, &r), 200);
        BT_CHECK(strstr(r.head, "chunked") == NULL);
        ht_sse_parse(r.body, &sse);
        BT_CHECK(sse.done);
        ht_resp_free(&r);
    }

    cu_wait_kv_idle(c, 5000);
    client_destroy(&c);
    for (int i = 0; i < n_prompts; i++) {
        bt_free(prompts[i]);
        bt_free(expect[i]);
    }
    bt_free(data);
    BT_TEST_PASS("gateway/http_golden: completions, streams and chat equal "
                 "baton run");
    return 0;
}
