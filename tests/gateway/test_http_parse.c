/*
 * test_http_parse.c - baton-http's parsers without sockets: the HTTP/1.1
 * request parser (a table of good and bad requests, byte-by-byte arrival,
 * keep-alive rules, limits), the OpenAI request parser (defaults, every
 * field, refusals) and the Prometheus rendering of histograms.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "gateway_int.h"

static const gateway_http_limits_t limits = { 1024, 4096 };

static bt_status_t parse(const char *s, gateway_http_req_t *req)
{
    return gateway__http_parse(s, strlen(s), &limits, req);
}

static void expect_error(const char *s, int status)
{
    gateway_http_req_t req;

    if (parse(s, &req) != BT_ERR_FORMAT || req.error_status != status)
        BT_TEST_FAIL("'%s': status %d, expected error %d", s,
                     req.error_status, status);
}

static void test_http(void)
{
    gateway_http_req_t req;
    const char *post = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\n"
                       "content-length: 5\r\nConnection: Keep-Alive, Upgrade"
                       "\r\n\r\nhelloGET";
    size_t full = strlen(post) - 3;

    BT_ASSERT_EQ(parse(post, &req), BT_OK);
    BT_ASSERT_EQ(req.method, GATEWAY_HTTP_POST);
    BT_ASSERT_EQ(req.path_len, 15);
    BT_CHECK(memcmp(req.path, "/v1/completions", 15) == 0);
    BT_ASSERT_EQ(req.content_length, 5);
    BT_ASSERT_EQ(req.total_len, full);
    BT_CHECK(memcmp(post + req.header_len, "hello", 5) == 0);
    BT_CHECK(req.keep_alive);
    /* byte by byte: incomplete until the last body byte */
    for (size_t n = 0; n < full; n++) {
        BT_ASSERT_EQ(gateway__http_parse(post, n, &limits, &req),
                     BT_IN_PROGRESS);
        if (n >= full - 5)
            BT_CHECK(req.header_len == full - 5);
    }

    BT_ASSERT_EQ(parse("GET /health HTTP/1.0\r\n\r\n", &req), BT_OK);
    BT_CHECK(!req.keep_alive && req.minor == 0);
    BT_ASSERT_EQ(parse("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                       &req), BT_OK);
    BT_CHECK(req.keep_alive);
    BT_ASSERT_EQ(parse("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n",
                       &req), BT_OK);
    BT_CHECK(!req.keep_alive);
    BT_ASSERT_EQ(parse("\r\nGET / HTTP/1.1\nHost: x\n\n", &req), BT_OK);
    BT_ASSERT_EQ(req.method, GATEWAY_HTTP_GET);
    BT_ASSERT_EQ(parse("PATCH /x HTTP/1.1\r\n\r\n", &req), BT_OK);
    BT_ASSERT_EQ(req.method, GATEWAY_HTTP_OTHER);
    BT_ASSERT_EQ(parse("POST /x HTTP/1.1\r\nExpect: 100-continue\r\n"
                       "Content-Length: 3\r\n\r\n", &req), BT_IN_PROGRESS);
    BT_CHECK(req.expect_continue && req.header_len > 0);

    expect_error("garbage\r\n\r\n", 400);
    expect_error("\x16\x03\x01", 400); /* a TLS hello */
    expect_error("GET / HTTP/2.0\r\n\r\n", 505);
    expect_error("GET / HTTX/1.1\r\n\r\n", 400);
    expect_error("GET  / HTTP/1.1\r\n\r\n", 400);
    expect_error("GET http://x/ HTTP/1.1\r\n\r\n", 400);
    expect_error("GET /\x01 HTTP/1.1\r\n\r\n", 400);
    expect_error("GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400);
    expect_error("GET / HTTP/1.1\r\nA : b\r\n\r\n", 400);
    expect_error("GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400);
    expect_error("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400);
    expect_error("GET / HTTP/1.1\rX\r\n\r\n", 400);
    expect_error("POST / HTTP/1.1\r\n\r\n", 411);
    expect_error("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411);
    expect_error("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501);
    expect_error("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                 "Content-Length: 1\r\n\r\nx", 400);
    expect_error("POST / HTTP/1.1\r\nContent-Length: 1\r\n"
                 "Content-Length: 2\r\n\r\nxx", 400);
    expect_error("POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400);
    expect_error("POST / HTTP/1.1\r\nContent-Length: 4097\r\n\r\n", 413);
    expect_error("POST / HTTP/1.1\r\nContent-Length: "
                 "99999999999999999999999\r\n\r\n", 413);
    expect_error("GET / HTTP/1.1\r\nExpect: tea\r\n\r\n", 417);
    expect_error("ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1\r\n\r\n", 501);
    {
        char big[2048];
        int n = snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nX: ");
        memset(big + n, 'a', sizeof(big) - (size_t)n - 1);
        big[sizeof(big) - 1] = '\0';
        expect_error(big, 431);
        n = snprintf(big, sizeof(big), "GET /");
        memset(big + n, 'a', sizeof(big) - (size_t)n - 1);
        expect_error(big, 431); /* no line end within the header limit */
    }
    {
        /* too many header lines */
        char many[4096];
        gateway_http_limits_t wide = { 4096, 16 };
        int n = snprintf(many, sizeof(many), "GET / HTTP/1.1\r\n");
        for (int i = 0; i <= GATEWAY_HTTP_MAX_HEADERS; i++)
            n += snprintf(many + n, sizeof(many) - (size_t)n, "A:b\r\n");
        n += snprintf(many + n, sizeof(many) - (size_t)n, "\r\n");
        BT_ASSERT_EQ(gateway__http_parse(many, (size_t)n, &wide, &req),
                     BT_ERR_FORMAT);
        BT_ASSERT_EQ(req.error_status, 431);
    }
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

int main(void)
{
    bt_log_init("test");
    test_http();
    test_api();
    test_metrics();
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("gateway/http_parse");
    return 0;
}
