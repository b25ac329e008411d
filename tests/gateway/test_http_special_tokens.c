/*
 * test_http_special_tokens.c - special tokens are not text unless asked
 * (issue 39).  aidreams260K generates EOS (id 2, whose llama2.c piece is
 * "\n</s>\n") as the 120th token after "I sense" (golden.jsonl); EOS is
 * not one of its stop ids (llama2.c stops on BOS only), so the token is
 * generated and counted.  Through a real cluster (router + prefill +
 * decode, 127.0.0.1) and baton-http:
 *   - completions, streamed and not, have no "</s>" by default and equal
 *     `baton run` (which hides it too);
 *   - "skip_special_tokens": false makes it appear, and then equals
 *     `baton run --no-skip-special`;
 *   - a client-library request (the router's stream) does the same with
 *     client_request_t.skip_special_tokens;
 *   - the first generated token (sampled by the prefill worker) is
 *     hidden too: a prompt ending just before EOS.
 */
#include "gateway/http_util.h"
#include "model/tokenizer.h"

#define PROMPT "I sense"
#define MAX_TOKENS 124

static char *completion_text(const ht_resp_t *r, int *n_tokens)
{
    cJSON *j = cJSON_Parse(r->body), *c0, *t;
    char *out;

    if (j == NULL)
        BT_TEST_FAIL("response is not JSON: %s", r->body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    t = cJSON_GetObjectItem(c0, "text");
    BT_CHECK(cJSON_IsString(t));
    *n_tokens = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"),
                                    "completion_tokens")->valueint;
    out = bt_strdup(t->valuestring, "test");
    cJSON_Delete(j);
    return out;
}

/* One completion over HTTP, streamed or not; returns its text. */
static char *http_text(int port, const char *extra, bool stream)
{
    char body[512];
    ht_resp_t r;
    char *text;
    int n = 0;

    snprintf(body, sizeof(body), "{\"prompt\":\"%s\",\"max_tokens\":%d,"
             "\"temperature\":0,\"stream\":%s%s}", PROMPT, MAX_TOKENS,
             stream ? "true" : "false", extra);
    BT_ASSERT_EQ(ht_request(port, "POST", "/v1/completions", body, &r), 200);
    if (stream) {
        ht_sse_t sse;
        ht_sse_parse(r.body, &sse);
        BT_CHECK(sse.done && !sse.error_seen);
        text = bt_strdup(sse.text, "test");
    } else {
        text = completion_text(&r, &n);
        BT_CHECK(n >= 120); /* EOS (the 120th) was generated */
    }
    ht_resp_free(&r);
    return text;
}

/* The text of a library request through the router (ids given). */
static char *lib_text(client_t *c, const int *ids, int n, int max_tokens,
                      bool skip)
{
    client_request_t req;
    Baton__ClientMessage *m = NULL;
    uint64_t rid, t_end = bt_time_ns() + 30000000000ull;
    char *text = bt_calloc(1, 8192, "test");
    size_t len = 0;

    client_request_init(&req);
    req.prompt_ids = ids;
    req.n_prompt_ids = n;
    req.max_tokens = max_tokens;
    req.skip_special_tokens = skip;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    for (;;) {
        BT_CHECK(bt_time_ns() < t_end);
        if (client_recv(c, 200, &m) != BT_OK)
            continue;
        if (client_msg_request_id(m) != rid) {
            proto_client_free(&m);
            continue;
        }
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
            const Baton__TokenChunk *ch = m->chunk;
            BT_CHECK(len + ch->text.len < 8192);
            if (ch->text.len > 0) /* a chunk of a skipped token has none */
                memcpy(text + len, ch->text.data, ch->text.len);
            len += ch->text.len;
        } else {
            BT_ASSERT_EQ(m->body_case,
                         BATON__CLIENT_MESSAGE__BODY_FINISHED);
            proto_client_free(&m);
            break;
        }
        proto_client_free(&m);
    }
    return text;
}

int main(void)
{
    char listen[64], control[64], model[512], tok[512];
    char *want, *want_raw, *t;
    client_t *c = NULL;
    int hport;

    cu_init();
    cu_router_addrs(listen, control);
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

    /* the reference: baton run, both ways */
    want = ht_baton_run("--prompt '" PROMPT "' --max-tokens 124");
    want_raw = ht_baton_run("--prompt '" PROMPT "' --max-tokens 124 "
                            "--no-skip-special");
    BT_CHECK(strstr(want, "</s>") == NULL);
    BT_CHECK(strstr(want_raw, "\n</s>\n") != NULL);

    /* baton-http, default: no "</s>" (not streamed, streamed) */
    t = http_text(hport, "", false);
    BT_ASSERT_STREQ(t, want);
    bt_free(t);
    t = http_text(hport, "", true);
    BT_ASSERT_STREQ(t, want);
    bt_free(t);
    t = http_text(hport, ",\"skip_special_tokens\":true", false);
    BT_ASSERT_STREQ(t, want);
    bt_free(t);
    /* asked for: it appears */
    t = http_text(hport, ",\"skip_special_tokens\":false", false);
    BT_ASSERT_STREQ(t, want_raw);
    bt_free(t);
    t = http_text(hport, ",\"skip_special_tokens\":false", true);
    BT_ASSERT_STREQ(t, want_raw);
    bt_free(t);
    printf("http: completion without </s>, with it when asked; equal to "
           "baton run\n");

    /* the router's stream (the client library) */
    {
        int *ids = NULL, n = 0, max_tokens = 0;
        char *a, *b;
        tok_t *tk = NULL;

        BT_ASSERT_OK(tok_load(tok, 512, &tk));
        BT_ASSERT_OK(tok_encode(tk, PROMPT, strlen(PROMPT), true, &ids, &n));
        a = lib_text(c, ids, n, MAX_TOKENS, true);
        b = lib_text(c, ids, n, MAX_TOKENS, false);
        BT_ASSERT_STREQ(a, want);
        BT_ASSERT_STREQ(b, want_raw);
        bt_free(a);
        bt_free(b);
        /* The first token, sampled by the prefill worker, is EOS: the
         * prompt is "I sense" and its first 119 generated ids. */
        {
            char cmd[1024], *gen_ids, *save = NULL, *tokn;
            int *all;

            snprintf(cmd, sizeof(cmd), "--prompt '" PROMPT "' "
                     "--max-tokens 119 --ids");
            gen_ids = ht_baton_run(cmd);
            all = bt_malloc(sizeof(int) * (size_t)(n + 200), "test");
            memcpy(all, ids, sizeof(int) * (size_t)n);
            max_tokens = n;
            for (tokn = strtok_r(gen_ids, " ", &save); tokn != NULL;
                 tokn = strtok_r(NULL, " ", &save))
                all[max_tokens++] = atoi(tokn);
            BT_ASSERT_EQ(max_tokens, n + 119);
            a = lib_text(c, all, max_tokens, 1, true);
            b = lib_text(c, all, max_tokens, 1, false);
            BT_ASSERT_STREQ(a, "");
            BT_ASSERT_STREQ(b, "\n</s>\n");
            bt_free(a);
            bt_free(b);
            bt_free(all);
            bt_free(gen_ids);
        }
        bt_free(ids);
        tok_destroy(&tk);
        printf("router stream: the same, the prefill-sampled first token "
               "included\n");
    }

    bt_free(want);
    bt_free(want_raw);
    client_destroy(&c);
    cu_kill_all();
    BT_TEST_PASS("gateway/http_special_tokens");
    return 0;
}
