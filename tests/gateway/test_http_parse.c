/*
 * test_http_parse.c - baton-http's parsers without sockets: the CORS
 * origin list, /tokenize and /detokenize (round trips, refusals), the
 * OpenAI request parser (defaults, every field, refusals) and the
 * Prometheus rendering of histograms.  HTTP/1.1 itself is
 * libmicrohttpd's; test_http_errors.c checks it on the wire.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "gateway_int.h"

/* The CORS origin list: exact matches only, "*" explicitly, bad specs
 * refused at start. */
static void test_cors(void)
{
    gateway_cors_t *cors = NULL;

    BT_ASSERT_OK(gateway__cors_create("https://a.example, http://b:3000",
                                      &cors));
    BT_ASSERT_STREQ(gateway__cors_match(cors, "https://a.example"),
                    "https://a.example");
    BT_ASSERT_STREQ(gateway__cors_match(cors, "http://b:3000"),
                    "http://b:3000");
    BT_CHECK(gateway__cors_match(cors, "http://b:3001") == NULL);
    BT_CHECK(gateway__cors_match(cors, "https://a.example.evil") == NULL);
    BT_CHECK(gateway__cors_match(cors, "") == NULL);
    BT_CHECK(gateway__cors_match(cors, NULL) == NULL);
    gateway__cors_destroy(&cors);
    BT_CHECK(cors == NULL);
    BT_ASSERT_OK(gateway__cors_create("*", &cors));
    BT_ASSERT_STREQ(gateway__cors_match(cors, "http://anything"), "*");
    gateway__cors_destroy(&cors);
    BT_ASSERT_EQ(gateway__cors_create("", &cors), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(gateway__cors_create(" , ", &cors), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(gateway__cors_create("a.example", &cors),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(gateway__cors_create("https://a.example/path", &cors),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(cors == NULL);
    BT_ASSERT_STREQ(gateway__http_reason(408), "Request Timeout");
}

/* /tokenize and /detokenize on the aidreams tokenizer: round trips,
 * chat ids equal the chat parser's, and every refusal. */
static void test_tokenize(void)
{
    gateway_api_ctx_t ctx;
    gateway_api_error_t err;
    gateway_api_req_t areq;
    tok_t *tok = NULL;
    bt_buf_t out;
    char path[512], body[512];

    snprintf(path, sizeof(path), "%s/models/aidreams-tok512.bin",
             BT_SHARED_DIR);
    BT_ASSERT_OK(tok_load(path, 512, &tok));
    memset(&ctx, 0, sizeof(ctx));
    ctx.model_name = "tiny";
    ctx.tok = tok;
    ctx.chat_template = CHAT_TEMPLATE_CHATML;
    bt_buf_init(&out);
    BT_ASSERT_OK(gateway__tokenize(&ctx, 128, "{\"prompt\":\"The river\"}",
                                   23, &out, &err));
    BT_CHECK(strstr(out.data, "\"max_model_len\":128") != NULL);
    {
        /* the ids decode back to the text */
        const char *t = strstr(out.data, "\"tokens\":");
        BT_CHECK(t != NULL);
        snprintf(body, sizeof(body), "{\"tokens\":%s", t + 9);
        out.len = 0;
        BT_ASSERT_OK(gateway__detokenize(&ctx, body, strlen(body), &out,
                                         &err));
        BT_ASSERT_STREQ(out.data, "{\"prompt\":\"The river\"}");
    }
    out.len = 0;
    BT_ASSERT_OK(gateway__tokenize(&ctx, 0, "{\"prompt\":\"\",\"add_special_"
                                   "tokens\":false}", 42, &out, &err));
    BT_ASSERT_STREQ(out.data,
                    "{\"count\":0,\"max_model_len\":null,\"tokens\":[]}");
    /* messages: the ids the chat endpoint sends */
    {
        const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"hi\"}]}";
        char want[64];
        BT_ASSERT_OK(gateway__api_parse(&ctx, GATEWAY_API_CHAT, msgs,
                                        strlen(msgs), &areq, &err));
        out.len = 0;
        BT_ASSERT_OK(gateway__tokenize(&ctx, 0, msgs, strlen(msgs), &out,
                                       &err));
        snprintf(want, sizeof(want), "{\"count\":%d,", areq.req.n_prompt_ids);
        BT_CHECK(strncmp(out.data, want, strlen(want)) == 0);
        gateway__api_req_cleanup(&areq);
    }
    /* refusals */
    {
        static const struct {
            const char *body;
            bool detok;
            int status;
            const char *param;
        } bad[] = {
            { "{", false, 400, "" },
            { "[]", false, 400, "" },
            { "{}", false, 400, "prompt" },
            { "{\"prompt\":5}", false, 400, "prompt" },
            { "{\"prompt\":\"a\",\"messages\":[]}", false, 400, "messages" },
            { "{\"messages\":[]}", false, 400, "messages" },
            { "{\"prompt\":\"a\",\"add_special_tokens\":1}", false, 400,
              "add_special_tokens" },
            { "{\"prompt\":\"a\",\"model\":\"other\"}", false, 404, "model" },
            { "{}", true, 400, "tokens" },
            { "{\"tokens\":[1,\"a\"]}", true, 400, "tokens" },
            { "{\"tokens\":[1.5]}", true, 400, "tokens" },
            { "{\"tokens\":[512]}", true, 400, "tokens" },
            { "{\"tokens\":[-1]}", true, 400, "tokens" },
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            bt_status_t st =
                bad[i].detok
                    ? gateway__detokenize(&ctx, bad[i].body,
                                          strlen(bad[i].body), &out, &err)
                    : gateway__tokenize(&ctx, 0, bad[i].body,
                                        strlen(bad[i].body), &out, &err);
            if (st != BT_ERR_INVALID_ARG || err.status != bad[i].status ||
                strcmp(err.param, bad[i].param) != 0)
                BT_TEST_FAIL("%s: status %d param '%s' (%s), expected %d "
                             "'%s'", bad[i].body, err.status, err.param,
                             err.message, bad[i].status, bad[i].param);
        }
    }
    ctx.tok = NULL;
    BT_ASSERT_EQ(gateway__tokenize(&ctx, 0, "{\"prompt\":\"a\"}", 14, &out,
                                   &err), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(err.status, 501);
    bt_buf_cleanup(&out);
    tok_destroy(&tok);
}

static bt_status_t api(gateway_api_kind_t kind, const char *body,
                       gateway_api_req_t *req, gateway_api_error_t *err)
{
    gateway_api_ctx_t ctx;

    memset(&ctx, 0, sizeof(ctx));
    ctx.model_name = "tiny";
    ctx.chat_template = CHAT_TEMPLATE_CHATML;
    ctx.default_deadline_ms = 7;
    return gateway__api_parse(&ctx, kind, body, strlen(body), req, err);
}

static void expect_api_error(gateway_api_kind_t kind, const char *body,
                             int status, const char *param)
{
    gateway_api_req_t req;
    gateway_api_error_t err;

    if (api(kind, body, &req, &err) != BT_ERR_INVALID_ARG ||
        err.status != status || strcmp(err.param, param) != 0)
        BT_TEST_FAIL("%s: status %d param '%s' (%s), expected %d '%s'", body,
                     err.status, err.param, err.message, status, param);
}

static void test_api(void)
{
    gateway_api_req_t req;
    gateway_api_error_t err;
    bt_buf_t out;

    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"hi\"}", &req,
                     &err));
    BT_ASSERT_STREQ(req.req.prompt, "hi");
    BT_ASSERT_EQ(req.req.max_tokens, 16);         /* OpenAI's default */
    BT_ASSERT_NEAR(req.req.temperature, 1.0, 0);  /* OpenAI's default */
    BT_ASSERT_EQ(req.req.deadline_ms, 7);
    BT_CHECK(!req.stream && req.req.want_text);
    gateway__api_req_cleanup(&req);

    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS,
                     "{\"model\":\"tiny\",\"prompt\":[[5,6,7]],"
                     "\"max_tokens\":3,\"temperature\":0,\"top_p\":0.5,"
                     "\"top_k\":-1,\"min_p\":0.2,\"presence_penalty\":1,"
                     "\"frequency_penalty\":-1,\"repetition_penalty\":1.2,"
                     "\"seed\":42,\"stop\":\"END\",\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true},"
                     "\"n\":1,\"echo\":false,\"logprobs\":null,"
                     "\"stop_token_ids\":[9],\"ignore_eos\":true,"
                     "\"deadline_ms\":0,\"user\":\"u\"}",
                     &req, &err));
    BT_ASSERT_EQ(req.req.n_prompt_ids, 3);
    BT_ASSERT_EQ(req.req.prompt_ids[2], 7);
    BT_ASSERT_EQ(req.req.max_tokens, 3);
    BT_ASSERT_EQ(req.req.top_k, 0);
    BT_ASSERT_EQ(req.req.seed, 42);
    BT_ASSERT_EQ(req.req.n_stop_strings, 1);
    BT_ASSERT_STREQ(req.req.stop_strings[0], "END");
    BT_ASSERT_EQ(req.req.n_stop_ids, 1);
    BT_ASSERT_EQ(req.req.deadline_ms, 0);
    BT_CHECK(req.stream && req.include_usage && req.req.ignore_eos);
    BT_ASSERT_NEAR(req.req.repetition_penalty, 1.2, 1e-6);
    gateway__api_req_cleanup(&req);

    /* chat without a tokenizer: the template's text goes to the cluster */
    BT_ASSERT_OK(api(GATEWAY_API_CHAT,
                     "{\"messages\":[{\"role\":\"developer\",\"content\":"
                     "\"S\"},{\"role\":\"user\",\"content\":\"U\"}],"
                     "\"stop\":[\"a\",\"b\"]}", &req, &err));
    BT_ASSERT_STREQ(req.req.prompt, "<|im_start|>system\nS<|im_end|>\n"
                                    "<|im_start|>user\nU<|im_end|>\n"
                                    "<|im_start|>assistant\n");
    BT_ASSERT_EQ(req.req.max_tokens, 0); /* chat: until the context ends */
    BT_ASSERT_EQ(req.req.n_stop_strings, 2);
    gateway__api_req_cleanup(&req);

    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":"
                     "\"other\"}", 404, "model");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2}",
                     400, "best_of");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":"
                     "\"y\"}", 400, "suffix");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":"
                     "{\"5\":1}}", 400, "logit_bias");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":1.5}",
                     400, "seed");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":-2}",
                     400, "top_k");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":"
                     "[\"\"]}", 400, "stop");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":"
                     "[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
                     "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\","
                     "\"17\"]}", 400, "stop");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"min_p\":2}",
                     400, "min_p");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\","
                     "\"stream_options\":5}", 400, "stream_options");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":[1.5]}", 400,
                     "prompt");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\","
                     "\"temperature\":1e999}", 400, "temperature");
    expect_api_error(GATEWAY_API_CHAT, "{\"messages\":[{\"role\":\"user\","
                     "\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                     "messages[0].content");
    expect_api_error(GATEWAY_API_CHAT, "{\"messages\":[5]}", 400,
                     "messages[0].role");
    expect_api_error(GATEWAY_API_CHAT, "{\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\"}],\"tools\":[{}]}", 400, "tools");

    /* error JSON shape */
    bt_buf_init(&out);
    gateway__api_error_set(&err, 400, "invalid_request_error", NULL, "n",
                           "bad \"n\"");
    BT_ASSERT_OK(gateway__api_error_json(&err, &out));
    BT_ASSERT_STREQ(out.data, "{\"error\":{\"message\":\"bad \\\"n\\\"\","
                    "\"type\":\"invalid_request_error\",\"param\":\"n\","
                    "\"code\":null}}");
    bt_buf_cleanup(&out);
}

static void test_metrics(void)
{
    gateway_metrics_t m;
    bt_buf_t out;

    gateway__metrics_init(&m);
    bt_prom_hist_observe(&m.ttft, 0.003);
    bt_prom_hist_observe(&m.ttft, 100);
    gateway__metrics_request(&m, GATEWAY_EP_CHAT, 200);
    gateway__metrics_request(&m, GATEWAY_EP_CHAT, 200);
    gateway__metrics_request(&m, GATEWAY_EP_OTHER, 404);
    bt_buf_init(&out);
    BT_ASSERT_OK(gateway__metrics_render(&m, NULL, &out));
    BT_CHECK(strstr(out.data, "baton_http_requests_total{endpoint="
                              "\"/v1/chat/completions\",code=\"200\"} 2\n"));
    BT_CHECK(strstr(out.data, "baton_http_requests_total{endpoint=\"other\","
                              "code=\"404\"} 1\n"));
    BT_CHECK(strstr(out.data, "baton_http_time_to_first_token_seconds_bucket"
                              "{le=\"0.0025\"} 0\n"));
    BT_CHECK(strstr(out.data, "baton_http_time_to_first_token_seconds_bucket"
                              "{le=\"0.005\"} 1\n"));
    BT_CHECK(strstr(out.data, "baton_http_time_to_first_token_seconds_bucket"
                              "{le=\"60\"} 1\n"));
    BT_CHECK(strstr(out.data, "baton_http_time_to_first_token_seconds_bucket"
                              "{le=\"+Inf\"} 2\n"));
    BT_CHECK(strstr(out.data, "baton_http_time_to_first_token_seconds_count"
                              " 2\n"));
    BT_CHECK(strstr(out.data, "baton_http_router_up 0\n"));
    bt_buf_cleanup(&out);
}

/* The cache_salt extension (issue 38): a string of 1..32 bytes handed to
 * the router as GenerateRequest.cache_salt; anything else is a 400. */
static void test_cache_salt(void)
{
    gateway_api_req_t req;
    gateway_api_error_t err;

    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS,
                     "{\"prompt\":\"hi\",\"cache_salt\":\"team-a\"}", &req,
                     &err));
    BT_ASSERT_STREQ(req.req.cache_salt, "team-a");
    gateway__api_req_cleanup(&req);
    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS,
                     "{\"prompt\":\"hi\",\"cache_salt\":null}", &req, &err));
    BT_CHECK(req.req.cache_salt == NULL);
    gateway__api_req_cleanup(&req);
    expect_api_error(GATEWAY_API_COMPLETIONS,
                     "{\"prompt\":\"hi\",\"cache_salt\":\"\"}", 400,
                     "cache_salt");
    expect_api_error(GATEWAY_API_COMPLETIONS,
                     "{\"prompt\":\"hi\",\"cache_salt\":7}", 400,
                     "cache_salt");
    expect_api_error(GATEWAY_API_CHAT,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"cache_salt\":\"0123456789abcdef0123456789abcdefX\"}",
                     400, "cache_salt");
}

/* Prompt lists and n (issue 39): the forms OpenAI and vLLM take, each
 * entry checked with its index named, the choices bound; the response
 * lists the choices with their indices. */
static void test_lists(void)
{
    gateway_api_req_t req;
    gateway_api_error_t err;
    gateway_api_resp_t r;
    gateway_api_choice_t ch[2];
    bt_buf_t out;

    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS,
                     "{\"prompt\":[\"a\",[5,6],\"\"],\"n\":2,\"seed\":3}",
                     &req, &err));
    BT_ASSERT_EQ(req.n_prompts, 3);
    BT_ASSERT_EQ(req.n, 2);
    BT_CHECK(req.has_seed);
    BT_ASSERT_STREQ(req.prompts[0].text, "a");
    BT_ASSERT_EQ(req.prompts[1].n_ids, 2);
    BT_ASSERT_EQ(req.prompts[1].ids[1], 6);
    BT_ASSERT_STREQ(req.prompts[2].text, "");
    BT_ASSERT_STREQ(req.req.prompt, "a"); /* req holds prompt 0 */
    gateway__api_req_use_prompt(&req, 1);
    BT_CHECK(req.req.prompt == NULL && req.req.n_prompt_ids == 2);
    gateway__api_req_cleanup(&req);

    BT_ASSERT_OK(api(GATEWAY_API_COMPLETIONS, "{\"prompt\":[7,8,9]}", &req,
                     &err));
    BT_ASSERT_EQ(req.n_prompts, 1);
    BT_ASSERT_EQ(req.n, 1);
    BT_CHECK(!req.has_seed);
    BT_ASSERT_EQ(req.req.n_prompt_ids, 3);
    gateway__api_req_cleanup(&req);

    BT_ASSERT_EQ(api(GATEWAY_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",7]}",
                     &req, &err), BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(err.param, "prompt");
    BT_CHECK(strstr(err.message, "prompt[2]") != NULL);
    BT_ASSERT_EQ(api(GATEWAY_API_COMPLETIONS, "{\"prompt\":[[1],[1,2.5]]}",
                     &req, &err), BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(err.param, "prompt");
    BT_CHECK(strstr(err.message, "prompt[1]") != NULL);
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":[[]]}", 400,
                     "prompt");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}",
                     400, "n");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":1.5}",
                     400, "n");
    expect_api_error(GATEWAY_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"],"
                     "\"n\":65}", 400, "n");
    BT_ASSERT_OK(api(GATEWAY_API_CHAT, "{\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\"}],\"n\":128}", &req, &err));
    BT_ASSERT_EQ(req.n, 128);
    gateway__api_req_cleanup(&req);

    memset(&r, 0, sizeof(r));
    memset(ch, 0, sizeof(ch));
    r.kind = GATEWAY_API_COMPLETIONS;
    r.id = "cmpl-1";
    r.model = "m";
    r.prompt_tokens = 4;
    r.completion_tokens = 6;
    ch[0].text = "x";
    ch[0].text_len = 1;
    ch[0].finish = "stop";
    ch[1].index = 1;
    ch[1].text = "yz";
    ch[1].text_len = 2;
    ch[1].finish = "length";
    bt_buf_init(&out);
    BT_ASSERT_OK(gateway__api_response_json(&r, ch, 2, &out));
    BT_CHECK(strstr(out.data, "\"choices\":[{\"index\":0,\"text\":\"x\","
                              "\"logprobs\":null,\"finish_reason\":\"stop\"},"
                              "{\"index\":1,\"text\":\"yz\",\"logprobs\":null,"
                              "\"finish_reason\":\"length\"}],\"usage\":"
                              "{\"prompt_tokens\":4,\"completion_tokens\":6,"
                              "\"total_tokens\":10}") != NULL);
    out.len = 0;
    BT_ASSERT_OK(gateway__api_chunk_json(&r, &ch[1], false, false, &out));
    BT_CHECK(strstr(out.data, "\"choices\":[{\"index\":1,\"text\":\"yz\"") !=
             NULL);
    bt_buf_cleanup(&out);
}

int main(void)
{
    bt_log_init("test");
    test_cors();
    test_cache_salt();
    test_tokenize();
    test_api();
    test_lists();
    test_metrics();
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("gateway/http_parse");
    return 0;
}
