/*
 * fuzz_http_request.c - libFuzzer target for baton-http's request body
 * parsers (gateway/gateway_api.c, gateway/gateway_tokenize.c).  HTTP/1.1
 * itself is libmicrohttpd's (the hand-written parser this target used to
 * fuzz is gone).
 *
 * Each input is used as a JSON body: parsed as a completions and as a
 * chat request (chat with the aidreams tokenizer, loaded once; a parsed
 * request must be consistent, and its response JSON must build), and as
 * a /tokenize and a /detokenize body (an answer or a 4xx/5xx error).
 * Anything else aborts, so it counts as a crash.
 *
 * Run: build-fuzz/fuzz/fuzz_http_request tests/fuzz/corpus/fuzz_http_request
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
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
    gateway_api_choice_t ch[2];
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
    fz_check(req.n_prompts >= 1 && req.n >= 1 &&
                 req.n_prompts * req.n <= GATEWAY_MAX_CHOICES, "choices");
    for (int i = 0; i < req.n_prompts; i++)
        fz_check((req.prompts[i].text != NULL) != (req.prompts[i].ids != NULL),
                 "each prompt text or ids");
    memset(&resp, 0, sizeof(resp));
    memset(ch, 0, sizeof(ch));
    resp.kind = kind;
    resp.id = "x";
    resp.model = "m";
    for (int i = 0; i < 2; i++) {
        ch[i].index = i;
        ch[i].text = body;
        ch[i].text_len = len;
        ch[i].finish = "stop";
    }
    fz_check(gateway__api_response_json(&resp, ch, 2, &out) == BT_OK,
             "response JSON");
    ch[0].finish = NULL;
    fz_check(gateway__api_chunk_json(&resp, &ch[0], true, true, &out) ==
                 BT_OK, "chunk JSON");
    fz_check(req.req.top_logprobs >= 0 &&
                 req.req.top_logprobs <= PARAMS_MAX_LOGPROBS &&
                 req.req.prompt_top_logprobs >= 0 &&
                 req.req.prompt_top_logprobs <= PARAMS_MAX_LOGPROBS,
             "logprobs bounds");
    if (tok != NULL) {
        /* logprobs of ids from the body's bytes: out of the vocabulary,
         * negative, -inf, the asked count of alternatives */
        gateway_lp_t lp[4];
        memset(lp, 0, sizeof(lp));
        for (int i = 0; i < 4; i++) {
            lp[i].id = (len > (size_t)i ? (unsigned char)body[i] : i) * 3 -
                       100;
            lp[i].has_logprob = i > 0;
            lp[i].logprob = i == 3 ? -INFINITY : -0.5f * (float)i;
            lp[i].n_top = req.req.top_logprobs;
            for (int k = 0; k < lp[i].n_top; k++) {
                lp[i].top_ids[k] = lp[i].id + k;
                lp[i].top_logprobs[k] = -(float)k;
            }
        }
        resp.tok = tok;
        for (int i = 0; i < 2; i++) {
            ch[i].logprobs = true;
            ch[i].lp = lp;
            ch[i].n_lp = 4;
            ch[i].prev_id = -1;
            ch[i].plp = lp;
            ch[i].n_plp = 4;
        }
        for (int k = 0; k < 2; k++) {
            resp.kind = k ? GATEWAY_API_CHAT : GATEWAY_API_COMPLETIONS;
            fz_check(gateway__api_response_json(&resp, ch, 2, &out) == BT_OK,
                     "logprobs response JSON");
            fz_check(gateway__api_chunk_json(&resp, &ch[1], false, false,
                                             &out) == BT_OK,
                     "logprobs chunk JSON");
        }
        (void)gateway__api_lp_chars(&resp, &ch[0]);
    }
    bt_buf_cleanup(&out);
    gateway__api_req_cleanup(&req);
}

/* /tokenize and /detokenize: an error is a 4xx/5xx with a message; a
 * success is a JSON object. */
static void fz_tokenize(const char *body, size_t len, const tok_t *tok)
{
    gateway_api_ctx_t ctx;
    gateway_api_error_t err;
    bt_buf_t out;

    memset(&ctx, 0, sizeof(ctx));
    ctx.model_name = "m";
    ctx.tok = tok;
    ctx.chat_template = CHAT_TEMPLATE_CHATML;
    for (int detok = 0; detok < 2; detok++) {
        bt_status_t st;
        bt_buf_init(&out);
        st = detok ? gateway__detokenize(&ctx, body, len, &out, &err)
                   : gateway__tokenize(&ctx, 64, body, len, &out, &err);
        if (st == BT_OK)
            fz_check(out.len > 1 && out.data[0] == '{', "tokenize JSON");
        else
            fz_check(err.status >= 400 && err.status < 600 &&
                         err.message[0] != '\0', "tokenize error");
        bt_buf_cleanup(&out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;

    if (!g_tok_tried) {
        char path[512];
        g_tok_tried = true;
        snprintf(path, sizeof(path), "%s/models/aidreams-tok512.bin",
                 BT_SHARED_DIR);
        if (tok_load(path, 512, &g_tok) != BT_OK)
            g_tok = NULL;
    }
    fz_body(buf, size, GATEWAY_API_COMPLETIONS, NULL);
    fz_body(buf, size, GATEWAY_API_CHAT, g_tok);
    fz_tokenize(buf, size, g_tok);
    return 0;
}
