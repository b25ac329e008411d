/*
 * fuzz_http_request.c - libFuzzer target for baton-http's request
 * parsers (gateway/gateway_http.c, gateway/gateway_api.c).
 *
 * Each input is used as:
 *  1. raw bytes from a client: parsed as an HTTP/1.1 request under small
 *     limits.  A complete request must lie inside the input with its path
 *     starting '/' (or '*'); every shorter prefix of it must parse as
 *     "incomplete"; an error must carry a 4xx/5xx status and a reason.
 *     A complete POST's body goes through the OpenAI parsers as below.
 *  2. a JSON body: parsed as a completions and as a chat request (chat
 *     with the aidreams tokenizer, loaded once); a parsed request must be
 *     consistent, and its response JSON must build.
 * Anything else aborts, so it counts as a crash.
 *
 * Run: build-fuzz/fuzz/fuzz_http_request tests/fuzz/corpus/fuzz_http_request
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "gateway_int.h"

static tok_t *g_tok;
static bool g_tok_tried;

static void fz_check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_http_request: %s\n", what);
        abort();
    }
}

static void fz_body(const char *body, size_t len, gateway_api_kind_t kind,
                    const tok_t *tok)
{
    gateway_api_ctx_t ctx;
    gateway_api_req_t req;
    gateway_api_error_t err;
    gateway_api_resp_t resp;
    bt_buf_t out;

    memset(&ctx, 0, sizeof(ctx));
    ctx.model_name = "m";
    ctx.tok = tok;
    ctx.chat_template = kind == GATEWAY_API_CHAT && tok == NULL
                            ? CHAT_TEMPLATE_LLAMA3 : CHAT_TEMPLATE_PLAIN;
    bt_buf_init(&out);
    if (gateway__api_parse(&ctx, kind, body, len, &req, &err) != BT_OK) {
        fz_check(err.status == 400 || err.status == 404 || err.status == 500,
                 "error status");
        fz_check(err.message[0] != '\0', "error without a message");
        fz_check(gateway__api_error_json(&err, &out) == BT_OK,
                 "error JSON");
        bt_buf_cleanup(&out);
        return;
    }
    fz_check((req.req.prompt != NULL) != (req.req.n_prompt_ids > 0),
             "exactly one of text and ids");
    fz_check(req.req.max_tokens >= 0, "max_tokens");
    fz_check(req.req.temperature >= 0 && req.req.temperature <= 2,
             "temperature");
    fz_check(req.n_stops <= PARAMS_MAX_STOP_STRINGS, "stops");
    memset(&resp, 0, sizeof(resp));
    resp.kind = kind;
    resp.id = "x";
    resp.model = "m";
    fz_check(gateway__api_response_json(&resp, body, len, "stop", &out) ==
                 BT_OK, "response JSON");
    fz_check(gateway__api_chunk_json(&resp, body, len, true, NULL, true,
                                     &out) == BT_OK, "chunk JSON");
    bt_buf_cleanup(&out);
    gateway__api_req_cleanup(&req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    gateway_http_limits_t limits = { 2048, 8192 };
    gateway_http_req_t req;
    bt_status_t status;

    if (!g_tok_tried) {
        char path[512];
        g_tok_tried = true;
        snprintf(path, sizeof(path), "%s/models/aidreams-tok512.bin",
                 BT_SHARED_DIR);
        if (tok_load(path, 512, &g_tok) != BT_OK)
            g_tok = NULL;
    }

    status = gateway__http_parse(buf, size, &limits, &req);
    if (status == BT_OK) {
        fz_check(req.header_len > 0 && req.header_len <= req.total_len &&
                     req.total_len <= size, "lengths");
        fz_check(req.total_len - req.header_len == req.content_length,
                 "body length");
        fz_check(req.path >= buf && req.path + req.path_len <= buf + size &&
                     req.path_len > 0 &&
                     (req.path[0] == '/' || req.path[0] == '*'), "path");
        for (size_t cut = 0; cut < req.total_len; cut += 1 + cut / 4) {
            gateway_http_req_t part;
            fz_check(gateway__http_parse(buf, cut, &limits, &part) ==
                         BT_IN_PROGRESS, "a prefix of a request is complete");
        }
        if (req.method == GATEWAY_HTTP_POST) {
            fz_body(buf + req.header_len, req.content_length,
                    GATEWAY_API_COMPLETIONS, NULL);
            fz_body(buf + req.header_len, req.content_length,
                    GATEWAY_API_CHAT, NULL);
        }
    } else if (status == BT_IN_PROGRESS) {
        fz_check(req.header_len <= size, "header length");
        fz_check(size < limits.max_header_bytes || req.header_len > 0,
                 "header over the limit still incomplete");
    } else {
        fz_check(status == BT_ERR_FORMAT, "status");
        fz_check(req.error_status >= 400 && req.error_status < 600 &&
                     req.error != NULL, "error status");
        fz_check(strcmp(gateway__http_reason(req.error_status), "Unknown") != 0,
                 "reason phrase");
    }

    fz_body(buf, size, GATEWAY_API_COMPLETIONS, NULL);
    fz_body(buf, size, GATEWAY_API_CHAT, g_tok);
    return 0;
}
