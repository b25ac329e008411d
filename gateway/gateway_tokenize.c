/*
 * gateway_tokenize.c - POST /tokenize and POST /detokenize, in the shape
 * of vLLM's server: what the served tokenizer makes of a prompt or a
 * conversation (the same ids /v1/chat/completions sends), and the text
 * of a list of ids.  Answered by baton-http alone; the router never sees
 * them.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "gateway_int.h"
#include "proto_msg.h"

#define BAD(_param, ...)                                                    \
    gateway__api_error_set(err, 400, "invalid_request_error", NULL, _param, \
                           __VA_ARGS__)

/* Parses the body as a JSON object (NULL: err set). */
static cJSON *parse_object(const char *body, size_t len,
                          gateway_api_error_t *err)
{
    cJSON *root = cJSON_ParseWithLength(body, len);

    if (root == NULL) {
        BAD(NULL, "the body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD(NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

/* The common checks: a tokenizer is loaded, "model" (when given) is the
 * served one. */
static bool check_ctx(const gateway_api_ctx_t *ctx, const cJSON *root,
                      gateway_api_error_t *err)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");

    if (ctx->tok == NULL) {
        gateway__api_error_set(err, 501, "invalid_request_error",
                               "no_tokenizer", NULL,
                               "baton-http has no tokenizer: start it with "
                               "--tokenizer or --model");
        return false;
    }
    if (model != NULL && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            BAD("model", "'model' must be a string");
            return false;
        }
        if (strcmp(model->valuestring, ctx->model_name) != 0) {
            gateway__api_error_set(err, 404, "invalid_request_error",
                                   "model_not_found", "model",
                                   "the model '%.100s' does not exist",
                                   model->valuestring);
            return false;
        }
    }
    return true;
}

/* A conversation's ids, through the chat request parser itself so that
 * they are the ids /v1/chat/completions would send. */
static bool messages_ids(const gateway_api_ctx_t *ctx, const cJSON *root,
                         int **ids_p, int *n_p, gateway_api_error_t *err)
{
    cJSON *sub = cJSON_CreateObject();
    const cJSON *agp =
        cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
    gateway_api_req_t areq;
    char *text;
    bt_status_t status;

    if (sub == NULL ||
        !cJSON_AddItemToObject(sub, "messages",
                               cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(
                                                   root, "messages"),
                                               true)) ||
        (agp != NULL &&
         !cJSON_AddItemToObject(sub, "add_generation_prompt",
                                cJSON_Duplicate(agp, true))) ||
        (text = cJSON_PrintUnformatted(sub)) == NULL) {
        cJSON_Delete(sub);
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    cJSON_Delete(sub);
    status = gateway__api_parse(ctx, GATEWAY_API_CHAT, text, strlen(text),
                                &areq, err);
    cJSON_free(text);
    if (status != BT_OK)
        return false;
    *ids_p = areq.prompts[0].ids;
    *n_p = areq.prompts[0].n_ids;
    areq.prompts[0].ids = NULL; /* ours now */
    areq.prompts[0].n_ids = 0;
    gateway__api_req_cleanup(&areq);
    return true;
}

/* Appends JSON object res to out; `built` false (res NULL or a field
 * that did not fit) or an append that fails sets a 500.  Returns BT_OK
 * or BT_ERR_INVALID_ARG (the error is in err). */
static bt_status_t put_json(const cJSON *res, bool built, bt_buf_t *out,
                            gateway_api_error_t *err)
{
    char *s = built && res != NULL ? cJSON_PrintUnformatted(res) : NULL;
    bt_status_t status = BT_ERR_NO_MEMORY;

    if (s != NULL) {
        status = bt_buf_append(out, s, strlen(s));
        cJSON_free(s);
    }
    if (status == BT_OK)
        return BT_OK;
    gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                           "out of memory");
    return BT_ERR_INVALID_ARG;
}

bt_status_t gateway__tokenize(const gateway_api_ctx_t *ctx,
                              uint32_t max_model_len, const char *body,
                              size_t len, bt_buf_t *out,
                              gateway_api_error_t *err)
{
    cJSON *root = parse_object(body, len, err), *res = NULL;
    const cJSON *prompt, *messages, *special;
    bool add_special = true;
    int *ids = NULL, n = 0;
    bt_status_t status = BT_ERR_INVALID_ARG;

    if (root == NULL)
        return BT_ERR_INVALID_ARG;
    if (!check_ctx(ctx, root, err))
        goto out;
    prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    special = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    if (special != NULL && !cJSON_IsNull(special)) {
        if (!cJSON_IsBool(special)) {
            BAD("add_special_tokens", "'add_special_tokens' must be a "
                "boolean");
            goto out;
        }
        add_special = cJSON_IsTrue(special);
    }
    if ((prompt != NULL) == (messages != NULL)) {
        BAD(prompt ? "messages" : "prompt",
            "give either 'prompt' (a string) or 'messages'");
        goto out;
    }
    if (prompt != NULL) {
        if (!cJSON_IsString(prompt)) {
            BAD("prompt", "'prompt' must be a string");
            goto out;
        }
        if (tok_encode(ctx->tok, prompt->valuestring,
                       strlen(prompt->valuestring),
                       add_special && tok_adds_bos(ctx->tok), &ids,
                       &n) != BT_OK) {
            BAD("prompt", "cannot tokenize the prompt");
            goto out;
        }
    } else if (!messages_ids(ctx, root, &ids, &n, err)) {
        goto out;
    }
    res = cJSON_CreateObject();
    status = put_json(
        res,
        res != NULL && cJSON_AddNumberToObject(res, "count", n) &&
            (max_model_len > 0
                 ? cJSON_AddNumberToObject(res, "max_model_len",
                                           max_model_len)
                 : cJSON_AddNullToObject(res, "max_model_len")) &&
            cJSON_AddItemToObject(res, "tokens",
                                  n > 0 ? cJSON_CreateIntArray(ids, n)
                                        : cJSON_CreateArray()),
        out, err);
out:
    cJSON_Delete(res);
    cJSON_Delete(root);
    bt_free(ids);
    return status;
}

bt_status_t gateway__detokenize(const gateway_api_ctx_t *ctx,
                                const char *body, size_t len, bt_buf_t *out,
                                gateway_api_error_t *err)
{
    cJSON *root = parse_object(body, len, err), *res = NULL;
    const cJSON *tokens, *t;
    int *ids = NULL, n = 0, vocab;
    char *text = NULL;
    bt_status_t status = BT_ERR_INVALID_ARG;

    if (root == NULL)
        return BT_ERR_INVALID_ARG;
    if (!check_ctx(ctx, root, err))
        goto out;
    vocab = tok_vocab_size(ctx->tok);
    tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(tokens)) {
        BAD("tokens", "'tokens' must be an array of token ids");
        goto out;
    }
    if (cJSON_GetArraySize(tokens) > PROTO_MAX_PROMPT_TOKENS) {
        BAD("tokens", "at most %d tokens", PROTO_MAX_PROMPT_TOKENS);
        goto out;
    }
    ids = bt_malloc(sizeof(*ids) * (size_t)(cJSON_GetArraySize(tokens) + 1),
                    "gateway_tok");
    if (ids == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        goto out;
    }
    cJSON_ArrayForEach(t, tokens) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!cJSON_IsNumber(t) || v != floor(v)) {
            BAD("tokens", "tokens[%d] is not an integer", n);
            goto out;
        }
        if (v < 0 || v >= vocab) {
            BAD("tokens", "tokens[%d] = %.0f is out of the vocabulary "
                "[0, %d)", n, v, vocab);
            goto out;
        }
        ids[n++] = (int)v;
    }
    if (n > 0 ? tok_decode(ctx->tok, -1, ids, n, &text) != BT_OK
              : (text = bt_strdup("", "gateway_tok")) == NULL) {
        BAD("tokens", "cannot decode the tokens");
        goto out;
    }
    res = cJSON_CreateObject();
    status = put_json(res, res != NULL &&
                               cJSON_AddStringToObject(res, "prompt", text),
                      out, err);
out:
    cJSON_Delete(res);
    cJSON_Delete(root);
    bt_free(text);
    bt_free(ids);
    return status;
}
