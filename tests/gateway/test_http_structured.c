/*
 * test_http_structured.c - structured output through the whole cluster
 * (issue 39): baton-http's response_format / guided_* -> the router ->
 * the prefill worker (which samples the first token) and the decode
 * worker, on the real aidreams260K model, 127.0.0.1:
 *   1. a json_schema completion (greedy) equals `baton run --json-schema`
 *      token for token, parses with cJSON and has the schema's fields;
 *      the stream equals the non-stream text; a seeded one parses too;
 *   2. chat with json_object gives a JSON object; guided_choice one of the
 *      choices; guided_regex text that POSIX regexec accepts;
 *   3. refusals are 400s naming the problem: an unsupported schema keyword
 *      (found by the worker that compiles it), guided_grammar, a bad
 *      response_format type, two specs at once, ignore_eos with a grammar;
 *   4. failover: a schema-constrained stream whose decode worker is
 *      killed (-9) mid-stream continues on another decode worker and ends
 *      with exactly the ids of the uninterrupted run (the grammar state is
 *      replayed from the tokens the new worker receives);
 *   5. an aggregated worker (decode --role both), whose own prefill's
 *      grammar carries on into its decode steps, gives the same ids.
 */
#include <regex.h>

#include "gateway/http_util.h"
#include "grammar/grammar.h"
#include "model/tokenizer.h"

#define PROMPT "I dream"

static const char schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":20},"
    "\"mood\":{\"enum\":[\"calm\",\"wild\",\"sad\"]},"
    "\"count\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":250},"
    "\"dream\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"mood\",\"count\",\"dream\"],"
    "\"additionalProperties\":false}";

static char g_schema_file[] = "/tmp/bt_http_schema_XXXXXX";

static char *completion_text(const char *body)
{
    cJSON *j = cJSON_Parse(body), *c0, *t;
    char *out;

    if (j == NULL)
        BT_TEST_FAIL("response is not JSON: %s", body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    t = cJSON_GetObjectItem(c0, "text");
    if (!cJSON_IsString(t)) { /* chat */
        t = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"),
                                "content");
    }
    if (!cJSON_IsString(t))
        BT_TEST_FAIL("no text in %s", body);
    out = bt_strdup(t->valuestring, "test");
    cJSON_Delete(j);
    return out;
}

/* POSTs body to path; expects `status`; returns the body (bt_malloc'ed). */
static char *post(int port, const char *path, const char *body, int status)
{
    ht_resp_t r;
    char *out;
    int st = ht_request(port, "POST", path, body, &r);

    if (st != status)
        BT_TEST_FAIL("%s %s: status %d, expected %d: %s", path, body, st,
                     status, r.body ? r.body : "");
    out = bt_strdup(r.body != NULL ? r.body : "", "test");
    ht_resp_free(&r);
    return out;
}

/* The schema's fields, checked by hand (the subset above). */
static void check_schema_doc(const char *text)
{
    cJSON *j = cJSON_Parse(text), *x;

    if (!cJSON_IsObject(j))
        BT_TEST_FAIL("'%s' is not a JSON object", text);
    x = cJSON_GetObjectItem(j, "name");
    BT_CHECK(cJSON_IsString(x) && strlen(x->valuestring) <= 20);
    x = cJSON_GetObjectItem(j, "mood");
    BT_CHECK(cJSON_IsString(x) && (strcmp(x->valuestring, "calm") == 0 ||
                                   strcmp(x->valuestring, "wild") == 0 ||
                                   strcmp(x->valuestring, "sad") == 0));
    x = cJSON_GetObjectItem(j, "count");
    BT_CHECK(cJSON_IsNumber(x) && x->valuedouble >= 0 &&
             x->valuedouble <= 250 && x->valuedouble == (int)x->valuedouble);
    x = cJSON_GetObjectItem(j, "dream");
    BT_CHECK(cJSON_IsBool(x));
    BT_ASSERT_EQ(cJSON_GetArraySize(j), 4);
    cJSON_Delete(j);
}

static char *schema_body(bool stream)
{
    static char body[2048];

    snprintf(body, sizeof(body),
             "{\"prompt\":\"" PROMPT "\",\"max_tokens\":300,"
             "\"temperature\":0,\"stream\":%s,\"response_format\":"
             "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"d\","
             "\"schema\":%s}}}", stream ? "true" : "false", schema);
    return body;
}

static void test_outputs(int port)
{
    char args[2048], *want, *got, *body;
    ht_resp_t r;
    ht_sse_t sse;
    regex_t re;

    fprintf(stderr, "1. json_schema equals baton run; stream equal\n");
    snprintf(args, sizeof(args), "--prompt '" PROMPT "' --max-tokens 300 "
             "--json-schema %s", g_schema_file);
    want = ht_baton_run(args);
    check_schema_doc(want);
    body = post(port, "/v1/completions", schema_body(false), 200);
    got = completion_text(body);
    BT_ASSERT_STREQ(got, want);
    bt_free(got);
    bt_free(body);
    BT_ASSERT_EQ(ht_request(port, "POST", "/v1/completions",
                            schema_body(true), &r), 200);
    ht_sse_parse(r.body, &sse);
    BT_CHECK(sse.done && !sse.error_seen);
    BT_ASSERT_STREQ(sse.text, want);
    ht_resp_free(&r);
    for (int seed = 1; seed <= 3; seed++) { /* sampled: still valid */
        snprintf(args, sizeof(args),
                 "{\"prompt\":\"" PROMPT "\",\"max_tokens\":300,"
                 "\"temperature\":1,\"seed\":%d,\"response_format\":"
                 "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"d\","
                 "\"schema\":%s}}}", seed, schema);
        body = post(port, "/v1/completions", args, 200);
        got = completion_text(body);
        check_schema_doc(got);
        bt_free(got);
        bt_free(body);
    }
    bt_free(want);

    fprintf(stderr, "2. json_object (chat), guided_choice, guided_regex\n");
    body = post(port, "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"" PROMPT
                "\"}],\"max_tokens\":200,\"temperature\":0,"
                "\"response_format\":{\"type\":\"json_object\"}}", 200);
    got = completion_text(body);
    {
        /* Any JSON object may run past max_tokens: the text must be one
         * the recognizer keeps alive, and a whole object when it
         * stopped by itself. */
        grammar_t *g = NULL;
        grammar_state_t st;
        BT_ASSERT_OK(grammar_create(GRAMMAR_JSON_OBJECT, "", NULL, &g));
        st = grammar_start(g);
        if (!grammar_advance_bytes(g, &st, got, strlen(got)))
            BT_TEST_FAIL("json_object gave '%s'", got);
        if (strstr(body, "\"finish_reason\":\"stop\"") != NULL) {
            cJSON *j = cJSON_Parse(got);
            BT_CHECK(grammar_is_accepting(g, st) && cJSON_IsObject(j));
            cJSON_Delete(j);
        }
        grammar_destroy(&g);
    }
    bt_free(got);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"" PROMPT "\",\"max_tokens\":20,"
                "\"temperature\":1,\"seed\":5,"
                "\"guided_choice\":[\"sun\",\"moon\",\"a star\"]}", 200);
    got = completion_text(body);
    BT_CHECK(strcmp(got, "sun") == 0 || strcmp(got, "moon") == 0 ||
             strcmp(got, "a star") == 0);
    bt_free(got);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"" PROMPT "\",\"max_tokens\":40,"
                "\"temperature\":1,\"seed\":7,"
                "\"guided_regex\":\"[a-z]{2,8}( [a-z]{2,8}){1,3}\\\\.\"}",
                200);
    got = completion_text(body);
    BT_ASSERT_EQ(regcomp(&re, "^[a-z]{2,8}( [a-z]{2,8}){1,3}\\.$",
                         REG_EXTENDED | REG_NOSUB), 0);
    if (regexec(&re, got, 0, NULL, 0) != 0)
        BT_TEST_FAIL("guided_regex gave '%s'", got);
    regfree(&re);
    bt_free(got);
    bt_free(body);

    fprintf(stderr, "3. refusals\n");
    body = post(port, "/v1/completions",
                "{\"prompt\":\"x\",\"max_tokens\":5,\"response_format\":"
                "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                "{\"type\":\"object\",\"patternProperties\":{}}}}}", 400);
    BT_CHECK(strstr(body, "patternProperties") != NULL);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"x\",\"guided_grammar\":\"root ::= x\"}", 400);
    BT_CHECK(strstr(body, "guided_grammar") != NULL);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"x\",\"response_format\":{\"type\":\"yaml\"}}",
                400);
    BT_CHECK(strstr(body, "response_format") != NULL);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"x\",\"guided_regex\":\"a\","
                "\"guided_choice\":[\"b\"]}", 400);
    BT_CHECK(strstr(body, "at most one") != NULL);
    bt_free(body);
    body = post(port, "/v1/completions",
                "{\"prompt\":\"x\",\"ignore_eos\":true,"
                "\"guided_regex\":\"a\"}", 400);
    BT_CHECK(strstr(body, "ignore_eos") != NULL);
    bt_free(body);
}

/* The greedy ids of the schema run, by `baton run --ids`. */
static int reference_ids(int *out, int cap)
{
    char args[512], *s, *save = NULL, *t;
    int n = 0;

    snprintf(args, sizeof(args), "--prompt '" PROMPT "' --max-tokens 300 "
             "--json-schema %s --ids", g_schema_file);
    s = ht_baton_run(args);
    for (t = strtok_r(s, " ", &save); t != NULL && n < cap;
         t = strtok_r(NULL, " ", &save))
        out[n++] = atoi(t);
    bt_free(s);
    return n;
}

static void test_failover(const char *listen, const char *control,
                          const char *model, const char *tok, pid_t d0)
{
    static int want[1024];
    static cu_result_t res[1];
    char spec[2048];
    client_request_t req;
    client_t *c = NULL;
    tok_t *tk = NULL;
    int *ids = NULL, n_ids = 0, n_want;

    fprintf(stderr, "4. failover keeps the grammar\n");
    n_want = reference_ids(want, 1024);
    BT_CHECK(n_want > 10);
    BT_ASSERT_OK(tok_load(tok, 512, &tk));
    BT_ASSERT_OK(tok_encode(tk, PROMPT, strlen(PROMPT), true, &ids, &n_ids));
    snprintf(spec, sizeof(spec), "json_schema:%s", schema);
    BT_ASSERT_OK(client_create(listen, &c));
    client_request_init(&req);
    req.prompt_ids = ids;
    req.n_prompt_ids = n_ids;
    req.max_tokens = 300;
    req.grammar = spec;
    memset(res, 0, sizeof(res));
    BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
    cu_stream_until(c, res, 1, 5, 1, "no tokens before the kill");
    /* freeze d0 while d1 starts, then kill it mid-stream */
    kill(d0, SIGSTOP);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d1",
             "--kv-blocks", "400", NULL);
    usleep(1500000);
    BT_CHECK(res[0].n_ids < n_want); /* the kill lands mid-stream */
    cu_kill(d0, SIGKILL);
    cu_collect(c, res, 1, 60000);
    BT_ASSERT_EQ(res[0].finished, 1);
    BT_ASSERT_EQ(res[0].n_ids, n_want);
    for (int i = 0; i < n_want; i++)
        if (res[0].ids[i] != want[i])
            BT_TEST_FAIL("id %d is %d after the failover, %d without", i,
                         res[0].ids[i], want[i]);
    BT_CHECK(res[0].retries >= 1 || res[0].n_ids == n_want);
    bt_free(ids);
    tok_destroy(&tk);
    client_destroy(&c);
}

static void test_aggregated(const char *model, const char *tok)
{
    static int want[1024];
    static cu_result_t res[1];
    char listen[64], control[64], spec[2048];
    client_request_t req;
    client_t *c = NULL;
    tok_t *tk = NULL;
    int *ids = NULL, n_ids = 0, n_want;

    fprintf(stderr, "5. an aggregated worker\n");
    n_want = reference_ids(want, 1024);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "agg",
             "--role", "both", "--kv-blocks", "400", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, 1, 20000);
    BT_ASSERT_OK(tok_load(tok, 512, &tk));
    BT_ASSERT_OK(tok_encode(tk, PROMPT, strlen(PROMPT), true, &ids, &n_ids));
    snprintf(spec, sizeof(spec), "json_schema:%s", schema);
    for (int round = 0; round < 2; round++) { /* the second: cached masks */
        client_request_init(&req);
        req.prompt_ids = ids;
        req.n_prompt_ids = n_ids;
        req.max_tokens = 300;
        req.grammar = spec;
        memset(res, 0, sizeof(res));
        BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
        cu_collect(c, res, 1, 60000);
        BT_ASSERT_EQ(res[0].finished, 1);
        BT_ASSERT_EQ(res[0].n_ids, n_want);
        for (int i = 0; i < n_want; i++)
            BT_ASSERT_EQ(res[0].ids[i], want[i]);
    }
    bt_free(ids);
    tok_destroy(&tk);
    client_destroy(&c);
}

int main(void)
{
    char listen[64], control[64], model[512], tok[512];
    client_t *c = NULL;
    pid_t d0;
    int hport, fd;

    cu_init();
    fd = mkstemp(g_schema_file);
    BT_CHECK(fd >= 0);
    BT_CHECK(write(fd, schema, strlen(schema)) == (ssize_t)strlen(schema));
    close(fd);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--tokenizer", tok, "--threads", "1", "--name", "d0",
                  "--kv-blocks", "400", "--step-delay-ms", "20", NULL);
    hport = ht_start_gateway(listen, "--tokenizer", tok, "--model-name",
                             "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    ht_wait_healthy(hport, 10000);

    test_outputs(hport);
    test_failover(listen, control, model, tok, d0);
    test_aggregated(model, tok);

    client_destroy(&c);
    unlink(g_schema_file);
    BT_TEST_PASS("gateway/structured: schema, object, choice, regex, "
                 "refusals, failover");
    return 0;
}
