/*
 * test_http_lists.c - prompt lists and `n` on baton-http (issue 39), in
 * front of a real cluster (router + prefill + decode on aidreams260K,
 * 127.0.0.1):
 *   - a list of 3 text prompts, greedy: choices[i].text is byte-equal to
 *     prompt i sent alone, indices 0..2 in order, usage the sums; the
 *     same streamed (chunks of the choices interleaved, each with its
 *     index and finish_reason, one usage chunk, one [DONE] at the end);
 *   - token-id lists ([[ids], [ids]]) and a single id list;
 *   - n = 2 with a seed: 2 choices per prompt (index = prompt * n + j),
 *     sample 0 equal to the prompt alone with that seed, the two samples
 *     different, the whole response reproducible; a prompt's tokens
 *     counted once in usage; chat with n = 2, greedy;
 *   - refused before anything is sent (the router's completed + failed
 *     counters do not move): a non-string element (the message names its
 *     index), an empty list, 129 prompts, prompts times n over 128, a
 *     prompt over the context (index named);
 *   - one choice the router refuses fails the whole request (non-stream
 *     and stream: an error event, no later chunk, [DONE]) and the others
 *     are cancelled: the cluster is idle afterwards;
 *   - a client that leaves a streamed list has every choice cancelled
 *     (the decode worker sleeps 10 ms a step, so they cannot just end);
 *   - tenants: a list counts as that many requests against
 *     max_concurrency (over it: 400; within it: served);
 *   - a decode worker killed -9 while a list streams: its choices fail
 *     over and every choice still equals its prompt alone.
 */
#include "gateway/http_util.h"

#define MAX_TOKENS 24

/* A completion body's choices (index-checked) and usage. */
typedef struct {
    int n;
    char *text[16];
    char finish[16][16];
    int prompt_tokens;
    int completion_tokens;
} choices_t;

static void choices_free(choices_t *c)
{
    for (int i = 0; i < c->n; i++)
        bt_free(c->text[i]);
    memset(c, 0, sizeof(*c));
}

/* Parses a non-stream response: choices[i].index must be i. */
static void parse_choices(const char *body, const char *field, choices_t *c)
{
    cJSON *j = cJSON_Parse(body), *arr, *x, *u;
    int i = 0;

    memset(c, 0, sizeof(*c));
    if (j == NULL)
        BT_TEST_FAIL("response is not JSON: %s", body);
    arr = cJSON_GetObjectItem(j, "choices");
    BT_CHECK(cJSON_IsArray(arr));
    cJSON_ArrayForEach(x, arr) {
        cJSON *t = cJSON_GetObjectItem(x, field), *f;
        BT_CHECK(i < 16);
        BT_ASSERT_EQ(cJSON_GetObjectItem(x, "index")->valueint, i);
        if (strcmp(field, "message") == 0)
            t = cJSON_GetObjectItem(t, "content");
        BT_CHECK(cJSON_IsString(t));
        c->text[i] = bt_strdup(t->valuestring, "test");
        f = cJSON_GetObjectItem(x, "finish_reason");
        BT_CHECK(cJSON_IsString(f));
        snprintf(c->finish[i], sizeof(c->finish[i]), "%s", f->valuestring);
        i++;
    }
    c->n = i;
    u = cJSON_GetObjectItem(j, "usage");
    c->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    c->completion_tokens =
        cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    BT_ASSERT_EQ(cJSON_GetObjectItem(u, "total_tokens")->valueint,
                 c->prompt_tokens + c->completion_tokens);
    cJSON_Delete(j);
}

/* POSTs body, expects 200, parses the choices. */
static void post_choices(int port, const char *path, const char *body,
                         const char *field, choices_t *c)
{
    ht_resp_t r;

    if (ht_request(port, "POST", path, body, &r) != 200)
        BT_TEST_FAIL("%s: status %d: %s", body, r.status, r.body);
    parse_choices(r.body, field, c);
    ht_resp_free(&r);
}

/* Parses a stream: text and finish_reason per index (each choice's
 * finish comes once, and no text after it), the usage chunk, [DONE] once
 * and last; *interleaved: some choice's chunk came between another's. */
static void parse_stream(const char *body, choices_t *c, bool *error_p,
                         bool *interleaved)
{
    const char *p = body;
    bool finished[16] = { false };
    int last = -1, n_done = 0;

    memset(c, 0, sizeof(*c));
    c->prompt_tokens = c->completion_tokens = -1;
    *error_p = false;
    *interleaved = false;
    while ((p = strstr(p, "data: ")) != NULL) {
        const char *e = strstr(p, "\n\n");
        cJSON *j, *arr, *x, *u;

        BT_CHECK(e != NULL);
        p += 6;
        if (e - p == 6 && memcmp(p, "[DONE]", 6) == 0) {
            n_done++;
            BT_CHECK(e[2] == '\0'); /* [DONE] is the last event */
            break;
        }
        BT_CHECK(!*error_p); /* nothing but [DONE] after an error */
        j = cJSON_ParseWithLength(p, (size_t)(e - p));
        BT_CHECK(j != NULL);
        if (cJSON_GetObjectItem(j, "error") != NULL)
            *error_p = true;
        arr = cJSON_GetObjectItem(j, "choices");
        cJSON_ArrayForEach(x, arr) {
            int i = cJSON_GetObjectItem(x, "index")->valueint;
            cJSON *t = cJSON_GetObjectItem(x, "text");
            cJSON *f = cJSON_GetObjectItem(x, "finish_reason");
            cJSON *d = cJSON_GetObjectItem(x, "delta");
            BT_CHECK(i >= 0 && i < 16);
            if (d != NULL)
                t = cJSON_GetObjectItem(d, "content");
            if (last >= 0 && last != i && !finished[last])
                *interleaved = true;
            last = i;
            if (i >= c->n) {
                for (int k = c->n; k <= i; k++)
                    c->text[k] = bt_strdup("", "test");
                c->n = i + 1;
            }
            if (cJSON_IsString(t) && t->valuestring[0] != '\0') {
                size_t a = strlen(c->text[i]), b = strlen(t->valuestring);
                BT_CHECK(!finished[i]);
                c->text[i] = bt_realloc(c->text[i], a + b + 1, "test");
                memcpy(c->text[i] + a, t->valuestring, b + 1);
            }
            if (cJSON_IsString(f)) {
                BT_CHECK(!finished[i]);
                finished[i] = true;
                snprintf(c->finish[i], sizeof(c->finish[i]), "%s",
                         f->valuestring);
            }
        }
        u = cJSON_GetObjectItem(j, "usage");
        if (cJSON_IsObject(u)) {
            BT_CHECK(cJSON_GetArraySize(arr) == 0);
            BT_ASSERT_EQ(c->prompt_tokens, -1); /* one usage chunk */
            c->prompt_tokens =
                cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
            c->completion_tokens =
                cJSON_GetObjectItem(u, "completion_tokens")->valueint;
            for (int k = 0; k < c->n; k++)
                BT_CHECK(finished[k]); /* usage after every finish */
        }
        cJSON_Delete(j);
        p = e + 2;
    }
    BT_ASSERT_EQ(n_done, 1);
}

/* A 400 whose message holds `needle`; param as given. */
static void expect_400(int port, const char *body, const char *param,
                       const char *needle)
{
    ht_resp_t r;
    cJSON *j, *e;

    ht_request(port, "POST", "/v1/completions", body, &r);
    if (r.status != 400)
        BT_TEST_FAIL("%.120s: status %d, expected 400: %s", body, r.status,
                     r.body);
    j = cJSON_Parse(r.body);
    e = cJSON_GetObjectItem(j, "error");
    BT_CHECK(e != NULL);
    BT_ASSERT_STREQ(cJSON_GetObjectItem(e, "param")->valuestring, param);
    if (needle != NULL &&
        strstr(cJSON_GetObjectItem(e, "message")->valuestring, needle) ==
            NULL)
        BT_TEST_FAIL("%.120s: message '%s' does not name '%s'", body,
                     cJSON_GetObjectItem(e, "message")->valuestring, needle);
    cJSON_Delete(j);
    ht_resp_free(&r);
}

/* A gauge or counter from baton-http's /metrics (-1: absent). */
static long long metric(int port, const char *name)
{
    ht_resp_t r;
    char key[128];
    const char *p;
    long long v = -1;

    BT_ASSERT_EQ(ht_request(port, "GET", "/metrics", NULL, &r), 200);
    snprintf(key, sizeof(key), "\n%s ", name);
    p = strstr(r.body, key);
    if (p != NULL)
        v = atoll(p + strlen(key));
    ht_resp_free(&r);
    return v;
}

/* Requests the router has ended, either way. */
static long long router_ended(int port)
{
    return metric(port, "baton_http_router_completed_total") +
           metric(port, "baton_http_router_failed_total");
}

/* Waits until the router has nothing queued or in flight. */
static void wait_router_idle(int port, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 50) {
        if (metric(port, "baton_http_router_in_flight") == 0 &&
            metric(port, "baton_http_router_queued") == 0)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("the router still has requests after %d ms", timeout_ms);
}

/* Waits until baton-http knows the cluster's context (it then refuses
 * over-long prompts itself). */
static void wait_context_known(int port)
{
    for (int t = 0; t < 100; t++) {
        ht_resp_t r;
        bool known;
        ht_request(port, "POST", "/tokenize", "{\"prompt\":\"a\"}", &r);
        known = r.status == 200 &&
                strstr(r.body, "\"max_model_len\":null") == NULL;
        ht_resp_free(&r);
        if (known)
            return;
        usleep(100000);
    }
    BT_TEST_FAIL("baton-http never learnt the cluster's context");
}

/* c holds the three prompts' choices, each as served alone (single[i]),
 * and their usage summed. */
static void expect_as_single(const choices_t *c, const choices_t *single,
                             int sum_prompt, int sum_completion)
{
    BT_ASSERT_EQ(c->n, 3);
    for (int i = 0; i < 3; i++) {
        BT_ASSERT_STREQ(c->text[i], single[i].text[0]);
        BT_ASSERT_STREQ(c->finish[i], single[i].finish[0]);
    }
    BT_ASSERT_EQ(c->prompt_tokens, sum_prompt);
    BT_ASSERT_EQ(c->completion_tokens, sum_completion);
}

/* body = {<head>"prompt":["p0","p1",...]}: count text prompts. */
static void text_prompts_body(char *body, size_t cap, const char *head,
                              int count)
{
    int n = snprintf(body, cap, "{%s\"prompt\":[", head);

    for (int i = 0; i < count; i++)
        n += snprintf(body + n, cap - (size_t)n, "%s\"p%d\"", i ? "," : "",
                      i);
    snprintf(body + n, cap - (size_t)n, "]}");
}

static const char *prompts[3] = { "The river", "A quiet machine",
                                  "Stars fall" };

int main(void)
{
    char listen[64], control[64], model[512], tok[512], body[8192];
    char keys[256];
    choices_t single[3], c;
    client_t *cl = NULL;
    int rport, hport, sum_prompt = 0, sum_completion = 0;
    bool err, inter;
    long long ended;
    pid_t d0;

    cu_init();
    rport = cu_free_port();
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", rport);
    snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", rport + 1);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin",
             BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--tokenizer", tok, "--threads", "1", "--name", "d0",
                  "--kv-blocks", "400", "--step-delay-ms", "10", NULL);
    hport = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                             "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &cl));
    cu_wait_workers(cl, 1, 1, 20000);
    ht_wait_healthy(hport, 10000);

    /* each prompt alone: the reference */
    for (int i = 0; i < 3; i++) {
        char *js = ht_json_str(prompts[i]);
        snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%d,"
                 "\"temperature\":0}", js, MAX_TOKENS);
        post_choices(hport, "/v1/completions", body, "text", &single[i]);
        BT_ASSERT_EQ(single[i].n, 1);
        sum_prompt += single[i].prompt_tokens;
        sum_completion += single[i].completion_tokens;
        bt_free(js);
    }

    /* the list, non-stream and stream */
    snprintf(body, sizeof(body), "{\"prompt\":[\"%s\",\"%s\",\"%s\"],"
             "\"max_tokens\":%d,\"temperature\":0}", prompts[0], prompts[1],
             prompts[2], MAX_TOKENS);
    post_choices(hport, "/v1/completions", body, "text", &c);
    expect_as_single(&c, single, sum_prompt, sum_completion);
    choices_free(&c);
    {
        ht_resp_t r;
        snprintf(body, sizeof(body), "{\"prompt\":[\"%s\",\"%s\",\"%s\"],"
                 "\"max_tokens\":%d,\"temperature\":0,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", prompts[0],
                 prompts[1], prompts[2], MAX_TOKENS);
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r),
                     200);
        parse_stream(r.body, &c, &err, &inter);
        BT_CHECK(!err);
        expect_as_single(&c, single, sum_prompt, sum_completion);
        fprintf(stderr, "stream of 3 choices: chunks %sinterleaved\n",
                inter ? "" : "not ");
        choices_free(&c);
        ht_resp_free(&r);
    }

    /* token-id prompts: a list of id lists, and one id list */
    {
        choices_t a, b;
        post_choices(hport, "/v1/completions",
                     "{\"prompt\":[[1,368,430,429,322,350],[1,368,430]],"
                     "\"max_tokens\":20,\"temperature\":0}", "text", &c);
        BT_ASSERT_EQ(c.n, 2);
        post_choices(hport, "/v1/completions",
                     "{\"prompt\":[1,368,430,429,322,350],"
                     "\"max_tokens\":20,\"temperature\":0}", "text", &a);
        post_choices(hport, "/v1/completions",
                     "{\"prompt\":[[1,368,430]],"
                     "\"max_tokens\":20,\"temperature\":0}", "text", &b);
        BT_ASSERT_EQ(a.n, 1);
        BT_ASSERT_EQ(b.n, 1);
        BT_ASSERT_STREQ(c.text[0], a.text[0]);
        BT_ASSERT_STREQ(c.text[1], b.text[0]);
        BT_ASSERT_EQ(c.prompt_tokens, 6 + 3);
        BT_ASSERT_EQ(c.completion_tokens,
                     a.completion_tokens + b.completion_tokens);
        choices_free(&a);
        choices_free(&b);
        choices_free(&c);
    }

    /* n = 2, sampled with a seed: index = prompt * n + sample */
    {
        choices_t a, again, alone;
        snprintf(body, sizeof(body), "{\"prompt\":[\"%s\",\"%s\"],\"n\":2,"
                 "\"max_tokens\":%d,\"temperature\":1,\"seed\":7}",
                 prompts[0], prompts[1], MAX_TOKENS);
        post_choices(hport, "/v1/completions", body, "text", &a);
        post_choices(hport, "/v1/completions", body, "text", &again);
        BT_ASSERT_EQ(a.n, 4);
        for (int i = 0; i < 4; i++)
            BT_ASSERT_STREQ(a.text[i], again.text[i]); /* reproducible */
        BT_CHECK(strcmp(a.text[0], a.text[1]) != 0);   /* distinct seeds */
        BT_CHECK(strcmp(a.text[2], a.text[3]) != 0);
        /* a prompt's tokens once, not once per sample */
        BT_ASSERT_EQ(a.prompt_tokens, single[0].prompt_tokens +
                                          single[1].prompt_tokens);
        for (int p = 0; p < 2; p++) {
            char *js = ht_json_str(prompts[p]);
            snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":%d,"
                     "\"temperature\":1,\"seed\":7}", js, MAX_TOKENS);
            post_choices(hport, "/v1/completions", body, "text", &alone);
            BT_ASSERT_STREQ(a.text[p * 2], alone.text[0]); /* sample 0 */
            choices_free(&alone);
            bt_free(js);
        }
        choices_free(&a);
        choices_free(&again);

        /* chat, n = 2, greedy: both equal the chat alone */
        post_choices(hport, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"The river\"}],\"max_tokens\":16,\"temperature\":0}",
                     "message", &alone);
        post_choices(hport, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"The river\"}],\"max_tokens\":16,\"temperature\":0,"
                     "\"n\":2}", "message", &a);
        BT_ASSERT_EQ(a.n, 2);
        BT_ASSERT_STREQ(a.text[0], alone.text[0]);
        BT_ASSERT_STREQ(a.text[1], alone.text[0]);
        BT_ASSERT_EQ(a.prompt_tokens, alone.prompt_tokens);
        BT_ASSERT_EQ(a.completion_tokens, 2 * alone.completion_tokens);
        choices_free(&a);
        choices_free(&alone);
        {
            ht_resp_t r;
            BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/chat/completions",
                                    "{\"messages\":[{\"role\":\"user\","
                                    "\"content\":\"The river\"}],"
                                    "\"max_tokens\":16,\"temperature\":0,"
                                    "\"n\":2,\"stream\":true}", &r), 200);
            parse_stream(r.body, &a, &err, &inter);
            BT_CHECK(!err);
            BT_ASSERT_EQ(a.n, 2);
            BT_ASSERT_STREQ(a.text[0], a.text[1]);
            BT_CHECK(strlen(a.text[0]) > 0);
            BT_CHECK(strstr(r.body, "\"index\":1,\"delta\":{\"role\":"
                                    "\"assistant\"") != NULL);
            choices_free(&a);
            ht_resp_free(&r);
        }
    }

    /* refused as a whole before anything reaches the router */
    wait_router_idle(hport, 5000);
    wait_context_known(hport);
    ended = router_ended(hport);
    expect_400(hport, "{\"prompt\":[\"a\",5,\"c\"]}", "prompt", "prompt[1]");
    expect_400(hport, "{\"prompt\":[\"a\",\"b\",{}]}", "prompt",
               "prompt[2]");
    expect_400(hport, "{\"prompt\":[[1,2],[1,-3]]}", "prompt", "prompt[1]");
    expect_400(hport, "{\"prompt\":[]}", "prompt", NULL);
    {
        /* 129 prompts; 65 prompts times n = 2 */
        int n;

        text_prompts_body(body, sizeof(body), "", 129);
        expect_400(hport, body, "prompt", "129 prompts, at most 128");
        text_prompts_body(body, sizeof(body), "\"n\":2,", 65);
        expect_400(hport, body, "n", "130 choices");
        /* the third prompt is over the context (128): ids, counted
         * exactly */
        n = snprintf(body, sizeof(body), "{\"prompt\":[[1,5],[1,6],[1");
        for (int i = 0; i < 140; i++)
            n += snprintf(body + n, sizeof(body) - (size_t)n, ",%d",
                          20 + i);
        snprintf(body + n, sizeof(body) - (size_t)n, "]]}");
        expect_400(hport, body, "prompt", "prompt[2]");
    }
    usleep(300000);
    BT_ASSERT_EQ(router_ended(hport), ended);
    {
        /* the counter does move for a request that is sent */
        choices_t one;
        post_choices(hport, "/v1/completions",
                     "{\"prompt\":[\"a\"],\"max_tokens\":2}", "text", &one);
        choices_free(&one);
        for (int t = 0; t < 40 && router_ended(hport) == ended; t++)
            usleep(50000);
        BT_ASSERT_EQ(router_ended(hport), ended + 1);
    }

    /* one choice the router refuses (an id outside the vocabulary):
     * the whole request fails, the other choices are cancelled */
    {
        ht_resp_t r;
        const char *bad = "{\"prompt\":[[1,368,430],[1,99999],[1,400]],"
                          "\"max_tokens\":100,\"ignore_eos\":true,"
                          "\"temperature\":0%s}";
        snprintf(body, sizeof(body), bad, "");
        ht_request(hport, "POST", "/v1/completions", body, &r);
        BT_ASSERT_EQ(r.status, 400);
        BT_CHECK(strstr(r.body, "choice 1 (prompt 1)") != NULL);
        BT_CHECK(strstr(r.body, "\"choices\"") == NULL);
        ht_resp_free(&r);
        snprintf(body, sizeof(body), bad, ",\"stream\":true");
        BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r),
                     r.status);
        if (r.status == 200) {
            parse_stream(r.body, &c, &err, &inter);
            BT_CHECK(err); /* the error event, then only [DONE] */
            choices_free(&c);
        } else {
            BT_ASSERT_EQ(r.status, 400); /* failed before the first chunk */
        }
        ht_resp_free(&r);
        wait_router_idle(hport, 5000);
        cu_wait_kv_idle(cl, 5000);
    }

    /* the client leaves a streamed list after its first chunk: every
     * choice is cancelled at the router, long before the 120 decode
     * steps (10 ms each at least) would have ended them */
    {
        char req[1024], buf[4096];
        long long cancelled = metric(hport, "baton_http_requests_cancelled_total");
        const char *b = "{\"prompt\":[\"The river\",\"A quiet machine\","
                        "\"Stars fall\"],\"max_tokens\":120,"
                        "\"ignore_eos\":true,\"temperature\":0,"
                        "\"stream\":true}";
        int rl = snprintf(req, sizeof(req),
                          "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                          "Content-Length: %zu\r\n\r\n%s", strlen(b), b);
        int fd = ht_connect(hport);
        size_t got = 0;
        uint64_t t0 = bt_time_ns(), t_idle;

        BT_CHECK(ht_send(fd, req, (size_t)rl));
        while (got + 1 < sizeof(buf)) {
            ssize_t n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
            BT_CHECK(n > 0);
            got += (size_t)n;
            buf[got] = '\0';
            if (strstr(buf, "\"text\":\"") != NULL)
                break;
        }
        BT_CHECK(metric(hport, "baton_http_requests_in_flight") == 3);
        close(fd);
        wait_router_idle(hport, 5000);
        t_idle = bt_time_ns();
        BT_ASSERT_EQ(metric(hport, "baton_http_requests_cancelled_total"),
                     cancelled + 1);
        BT_ASSERT_EQ(metric(hport, "baton_http_requests_in_flight"), 0);
        fprintf(stderr, "client left: the router idle %.0f ms after the "
                "request (its 120 steps take >= 1200 ms)\n",
                (double)(t_idle - t0) * 1e-6);
        BT_CHECK(t_idle - t0 < 900000000ull);
        cu_wait_kv_idle(cl, 5000);
    }

    /* tenants: a list of N counts as N requests */
    {
        FILE *f;
        int kport;
        ht_resp_t r;
        char req[1024];
        const char *key = "lists-test-key-0123456789";

        snprintf(keys, sizeof(keys), "/tmp/bt_lists_keys.%d", (int)getpid());
        f = fopen(keys, "w");
        BT_CHECK(f != NULL);
        fprintf(f, "%s team max_concurrency=2\n", key);
        fclose(f);
        kport = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                                 "aidreams", "--api-key-file", keys, NULL);
        ht_wait_healthy(kport, 10000);
        for (int k = 0; k < 2; k++) {
            const char *b = k == 0 ? "{\"prompt\":[\"a\",\"b\",\"c\"]}"
                                   : "{\"prompt\":[\"a\",\"b\"]}";
            int rl = snprintf(req, sizeof(req),
                              "POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
                              "Authorization: Bearer %s\r\n"
                              "Content-Length: %zu\r\n\r\n%s", key,
                              strlen(b), b);
            ht_raw(kport, req, (size_t)rl, &r);
            if (k == 0) {
                BT_ASSERT_EQ(r.status, 400);
                BT_CHECK(strstr(r.body, "max_concurrency") != NULL);
            } else {
                BT_ASSERT_EQ(r.status, 200);
                parse_choices(r.body, "text", &c);
                BT_ASSERT_EQ(c.n, 2);
                choices_free(&c);
            }
            ht_resp_free(&r);
        }
        unlink(keys);
    }

    /* a decode worker killed -9 while a list streams: the router moves
     * its choices to the other decode worker, which continues them
     * exactly (greedy), so every choice still equals its prompt alone,
     * no chunk twice, one [DONE] */
    {
        char out[] = "/tmp/bt_lists_failoverXXXXXX";
        choices_t alone[3];
        uint64_t s0, s1;
        pid_t child, d1;
        int fd, st = 0;

        d1 = cu_spawn("baton-decode", "--router", control, "--model",
                      model, "--tokenizer", tok, "--threads", "1", "--name",
                      "d1", "--kv-blocks", "400", "--step-delay-ms", "10",
                      NULL);
        cu_wait_workers(cl, 1, 2, 20000);
        for (int i = 0; i < 3; i++) {
            char *js = ht_json_str(prompts[i]);
            snprintf(body, sizeof(body), "{\"prompt\":%s,\"max_tokens\":"
                     "96,\"temperature\":0,\"ignore_eos\":true}", js);
            post_choices(hport, "/v1/completions", body, "text", &alone[i]);
            bt_free(js);
        }
        snprintf(body, sizeof(body), "{\"prompt\":[\"%s\",\"%s\",\"%s\"],"
                 "\"max_tokens\":96,\"temperature\":0,\"ignore_eos\":true,"
                 "\"stream\":true}", prompts[0], prompts[1], prompts[2]);
        fd = mkstemp(out);
        BT_CHECK(fd >= 0);
        s0 = cu_served(cl, "d0");
        s1 = cu_served(cl, "d1");
        child = fork();
        BT_CHECK(child >= 0);
        if (child == 0) { /* the client, streaming into the file */
            ht_resp_t r;
            int status = ht_request(hport, "POST", "/v1/completions", body,
                                    &r);
            FILE *f = fdopen(fd, "w");

            fprintf(f, "%d\n%s", status, r.body ? r.body : "");
            fclose(f);
            _exit(0);
        }
        close(fd);
        /* the three choices reach the decode workers; one that took
         * some dies with them mid-stream (96 steps of >= 10 ms each) */
        for (int t = 0; t < 300 && cu_served(cl, "d0") + cu_served(cl, "d1") <
                                       s0 + s1 + 3; t++)
            usleep(10000);
        BT_CHECK(cu_served(cl, "d0") + cu_served(cl, "d1") >= s0 + s1 + 3);
        usleep(300000);
        cu_kill(cu_served(cl, "d1") > s1 ? d1 : d0, SIGKILL);
        for (int t = 0; t < 3000; t++) {
            if (waitpid(child, &st, WNOHANG) == child)
                break;
            BT_CHECK(t < 2999); /* 30 s */
            usleep(10000);
        }
        {
            char *text = NULL;
            size_t len;

            BT_ASSERT_OK(bt_read_file(out, 1 << 24, &text, &len));
            unlink(out);
            BT_ASSERT_EQ(atoi(text), 200);
            parse_stream(strchr(text, '\n') + 1, &c, &err, &inter);
            BT_CHECK(!err);
            BT_ASSERT_EQ(c.n, 3);
            for (int i = 0; i < 3; i++)
                BT_ASSERT_STREQ(c.text[i], alone[i].text[0]);
            choices_free(&c);
            bt_free(text);
        }
        for (int i = 0; i < 3; i++)
            choices_free(&alone[i]);
        fprintf(stderr, "decode worker killed mid-list: 3 choices equal "
                "their prompts alone\n");
    }

    wait_router_idle(hport, 5000);
    cu_wait_kv_idle(cl, 5000);
    client_destroy(&cl);
    for (int i = 0; i < 3; i++)
        choices_free(&single[i]);
    BT_TEST_PASS("gateway/http_lists: prompt lists and n equal the prompts "
                 "alone, refused lists send nothing");
    return 0;
}
