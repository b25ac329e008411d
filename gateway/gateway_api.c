/*
 * gateway_api.c - OpenAI request bodies to baton requests, and baton
 * results to OpenAI-shaped JSON (completions, chat completions, their
 * stream chunks, errors).
 *
 * Unsupported OpenAI (and vLLM) parameters are refused with 400 rather
 * than silently ignored (api_param_rules below is the list), so a client
 * never gets something other than it asked for.  Unknown fields are
 * ignored, as most OpenAI-compatible servers do.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "gateway_int.h"
#include "proto_msg.h"

void gateway__api_error_set(gateway_api_error_t *err, int status,
                            const char *type, const char *code,
                            const char *param, const char *fmt, ...)
{
    va_list ap;

    err->status = status;
    err->type = type;
    err->code = code;
    err->retry_after_ms = 0;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

#define BAD_PARAM(_param, ...)                                              \
    gateway__api_error_set(err, 400, "invalid_request_error", NULL, _param, \
                           __VA_ARGS__)

// ---------------------------------------------------------------------------
// Field readers: each returns false (err set) when the field is present
// with a wrong type or value; an absent field (or JSON null) keeps *out.

static bool get_number(const cJSON *root, const char *name, double lo,
                       double hi, double *out, gateway_api_error_t *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);

    if (j == NULL || cJSON_IsNull(j))
        return true;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        BAD_PARAM(name, "'%s' must be a number", name);
        return false;
    }
    if (j->valuedouble < lo || j->valuedouble > hi) {
        BAD_PARAM(name, "'%s' is %g, must be in [%g, %g]", name,
                  j->valuedouble, lo, hi);
        return false;
    }
    *out = j->valuedouble;
    return true;
}

static bool get_float(const cJSON *root, const char *name, double lo,
                      double hi, float *out, gateway_api_error_t *err)
{
    double v = *out;

    if (!get_number(root, name, lo, hi, &v, err))
        return false;
    *out = (float)v;
    return true;
}

static bool get_int(const cJSON *root, const char *name, double lo,
                    double hi, double *out, gateway_api_error_t *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);

    if (j != NULL && !cJSON_IsNull(j) &&
        (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble))) {
        BAD_PARAM(name, "'%s' must be an integer", name);
        return false;
    }
    return get_number(root, name, lo, hi, out, err);
}

static bool get_bool(const cJSON *root, const char *name, bool *out,
                     gateway_api_error_t *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);

    if (j == NULL || cJSON_IsNull(j))
        return true;
    if (!cJSON_IsBool(j)) {
        BAD_PARAM(name, "'%s' must be a boolean", name);
        return false;
    }
    *out = cJSON_IsTrue(j);
    return true;
}

// ---------------------------------------------------------------------------
// Parameters baton does not implement (issue 39: no silently ignored
// parameter).  This table is the one list of them; README.md's baton-http
// section documents it.  A field named here that is present with a value
// other than those in `accepted` is refused with 400 naming it, so a client
// never trusts a result that ignored what it asked for.  `accepted` holds
// JSON texts separated by '|', compared with the field's value printed by
// cJSON_PrintUnformatted(); absent and null are always accepted, "" accepts
// nothing else.  `chat_reads`: /v1/chat/completions parses the field itself
// (the row applies to /v1/completions only).

typedef struct {
    const char *name;     /* the body field */
    const char *accepted; /* JSON values that match what baton does */
    bool chat_reads;      /* implemented for chat: checked on completions */
    const char *why;      /* in the error message */
} api_param_rule_t;

static const api_param_rule_t api_param_rules[] = {
    {"best_of", "1", false, "no server-side ranking of samples (use n)"},
    {"suffix", "\"\"", false, "no insertion (suffix) mode"},
    {"logit_bias", "{}", false, "the sampler has no logit bias"},
    {"tools", "[]", false, "no tool calling"},
    {"functions", "[]", false, "no tool calling"},
    {"tool_choice", "\"none\"", false, "no tool calling"},
    {"min_tokens", "0", false, "the sampler has no minimum length"},
    {"include_stop_str_in_output", "false", false,
     "a matched stop string is always left out of the text"},
    {"return_tokens_as_token_ids", "false", false,
     "no per-token output"},
    {"truncate_prompt_tokens", "", false,
     "prompts are never truncated (too long is a 400)"},
    {"add_generation_prompt", "true", true,
     "a completions prompt is not templated"},
    {"continue_final_message", "false", false,
     "the last message is always closed by the chat template"},
    {"chat_template", "", false,
     "the chat template is chosen at start (--chat-template)"},
    {"chat_template_kwargs", "{}", false,
     "the chat template takes no arguments"},
};

/* Whether `value` (unformatted JSON) is one of the '|'-separated texts. */
static bool value_accepted(const char *value, const char *accepted)
{
    size_t vlen = strlen(value);

    while (*accepted != '\0') {
        const char *bar = strchr(accepted, '|');
        size_t n = bar ? (size_t)(bar - accepted) : strlen(accepted);

        if (n == vlen && memcmp(value, accepted, n) == 0)
            return true;
        accepted += n + (bar ? 1 : 0);
    }
    return false;
}

/* Refuses the first field of api_param_rules present with a value baton
 * does not implement. */
static bool check_param_rules(const cJSON *root, gateway_api_kind_t kind,
                              gateway_api_error_t *err)
{
    for (size_t i = 0; i < BT_ARRAY_SIZE(api_param_rules); i++) {
        const api_param_rule_t *r = &api_param_rules[i];
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, r->name);
        char *value;
        bool ok;

        if (j == NULL || cJSON_IsNull(j) ||
            (r->chat_reads && kind == GATEWAY_API_CHAT))
            continue;
        value = cJSON_PrintUnformatted(j);
        if (value == NULL) {
            gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                                   "out of memory");
            return false;
        }
        ok = value_accepted(value, r->accepted);
        cJSON_free(value);
        if (ok)
            continue;
        if (r->accepted[0] != '\0')
            BAD_PARAM(r->name, "'%s' is not supported by baton except as "
                      "%s: %s", r->name, r->accepted, r->why);
        else
            BAD_PARAM(r->name, "'%s' is not supported by baton: %s",
                      r->name, r->why);
        return false;
    }
    return true;
}

/* An array of token ids into a bt_malloc'ed array. */
static bool get_ids(const cJSON *arr, const char *param, int max_n,
                    int **ids_p, int *n_p, gateway_api_error_t *err)
{
    int n = cJSON_GetArraySize(arr), i = 0;
    int *ids;
    const cJSON *x;

    if (n <= 0 || n > max_n) {
        BAD_PARAM(param, "'%s' must hold 1 to %d token ids", param, max_n);
        return false;
    }
    ids = bt_malloc((size_t)n * sizeof(*ids), "gateway_ids");
    if (ids == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    cJSON_ArrayForEach(x, arr) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 ||
            x->valuedouble > 2147483647.0 ||
            x->valuedouble != floor(x->valuedouble)) {
            bt_free(ids);
            BAD_PARAM(param, "'%s' must hold non-negative integer token ids",
                      param);
            return false;
        }
        ids[i++] = (int)x->valuedouble;
    }
    *ids_p = ids;
    *n_p = n;
    return true;
}

// ---------------------------------------------------------------------------
// Prompts

static bool oom(gateway_api_error_t *err)
{
    gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                           "out of memory");
    return false;
}

/* A one-entry prompt list (chat, a single completions prompt). */
static gateway_api_prompt_t *one_prompt(gateway_api_req_t *out,
                                        gateway_api_error_t *err)
{
    out->prompts = bt_calloc(1, sizeof(*out->prompts), "gateway_prompts");
    if (out->prompts == NULL) {
        oom(err);
        return NULL;
    }
    out->n_prompts = 1;
    return out->prompts;
}

/* One prompt: a string, or (ids_ok) an array of token ids.  `index` >= 0
 * names its place in a list in the error messages. */
static bool parse_one_prompt(const cJSON *p, int index,
                             gateway_api_prompt_t *out,
                             gateway_api_error_t *err)
{
    char name[32];

    if (index >= 0)
        snprintf(name, sizeof(name), "prompt[%d]", index);
    else
        snprintf(name, sizeof(name), "prompt");
    if (cJSON_IsString(p)) {
        out->text = bt_strdup(p->valuestring, "gateway_prompt");
        return out->text != NULL || oom(err);
    }
    if (cJSON_IsArray(p)) {
        if (get_ids(p, name, PROTO_MAX_PROMPT_TOKENS, &out->ids,
                    &out->n_ids, err))
            return true;
        snprintf(err->param, sizeof(err->param), "prompt");
        return false;
    }
    BAD_PARAM("prompt", "'%s' must be a string or an array of token ids",
              name);
    return false;
}

/* OpenAI's (and vLLM's) prompt forms: a string, an array of token ids,
 * or a list of either (one choice each, in order; GATEWAY_MAX_CHOICES at
 * most).  Every entry is checked here, before anything is sent. */
static bool parse_prompt(const cJSON *root, gateway_api_req_t *out,
                         gateway_api_error_t *err)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *x;
    int n, i = 0;

    if (p == NULL || cJSON_IsNull(p)) {
        BAD_PARAM("prompt", "'prompt' is required");
        return false;
    }
    if (!cJSON_IsArray(p) || p->child == NULL || cJSON_IsNumber(p->child)) {
        /* a string or one array of ids ([] is refused by get_ids) */
        if (one_prompt(out, err) == NULL)
            return false;
        return parse_one_prompt(p, -1, &out->prompts[0], err);
    }
    n = cJSON_GetArraySize(p);
    if (n > GATEWAY_MAX_CHOICES) {
        BAD_PARAM("prompt", "'prompt' holds %d prompts, at most %d", n,
                  GATEWAY_MAX_CHOICES);
        return false;
    }
    out->prompts = bt_calloc((size_t)n, sizeof(*out->prompts),
                             "gateway_prompts");
    if (out->prompts == NULL)
        return oom(err);
    out->n_prompts = n;
    cJSON_ArrayForEach(x, p) {
        if (!parse_one_prompt(x, i, &out->prompts[i], err))
            return false;
        i++;
    }
    return true;
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts joined; null for an assistant turn is "". Returns a bt_malloc'ed
 * string or NULL with err set. */
static char *message_content(const cJSON *content, int index,
                             gateway_api_error_t *err)
{
    bt_buf_t buf;
    const cJSON *part;
    char param[64];

    snprintf(param, sizeof(param), "messages[%d].content", index);
    if (content == NULL || cJSON_IsNull(content))
        return bt_strdup("", "gateway_msg");
    if (cJSON_IsString(content))
        return bt_strdup(content->valuestring, "gateway_msg");
    if (!cJSON_IsArray(content)) {
        BAD_PARAM(param, "'%s' must be a string or an array of parts", param);
        return NULL;
    }
    bt_buf_init(&buf);
    if (bt_buf_reserve(&buf, 0) != BT_OK)
        goto err_oom;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            bt_buf_cleanup(&buf);
            BAD_PARAM(param, "'%s' parts must be {\"type\": \"text\", "
                      "\"text\": ...} (baton serves text models)", param);
            return NULL;
        }
        if (bt_buf_append(&buf, text->valuestring,
                                strlen(text->valuestring)) != BT_OK)
            goto err_oom;
    }
    return buf.data;

err_oom:
    bt_buf_cleanup(&buf);
    gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                           "out of memory");
    return NULL;
}

#define MAX_CHAT_MESSAGES 4096

/* messages -> chat template text -> (with a tokenizer) ids. */
static bool parse_messages(const gateway_api_ctx_t *ctx, const cJSON *root,
                           gateway_api_req_t *out, gateway_api_error_t *err)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    chat_msg_t *cm = NULL;
    char **contents = NULL;
    const cJSON *m;
    char *text = NULL;
    bool add_generation_prompt = true;
    bool ok = false;
    int n, i = 0;

    if (!cJSON_IsArray(msgs) || (n = cJSON_GetArraySize(msgs)) == 0) {
        BAD_PARAM("messages", "'messages' must be a non-empty array");
        return false;
    }
    if (n > MAX_CHAT_MESSAGES) {
        BAD_PARAM("messages", "at most %d messages", MAX_CHAT_MESSAGES);
        return false;
    }
    cm = bt_calloc((size_t)n, sizeof(*cm), "gateway_chat");
    contents = bt_calloc((size_t)n, sizeof(*contents), "gateway_chat");
    if (cm == NULL || contents == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        goto out;
    }
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        char param[64];

        if (!cJSON_IsObject(m) || !cJSON_IsString(role) ||
            role->valuestring[0] == '\0') {
            snprintf(param, sizeof(param), "messages[%d].role", i);
            BAD_PARAM(param, "each message needs a 'role' string");
            goto out;
        }
        contents[i] = message_content(
            cJSON_GetObjectItemCaseSensitive(m, "content"), i, err);
        if (contents[i] == NULL)
            goto out;
        /* OpenAI's "developer" role is the system prompt of newer models */
        cm[i].role = strcmp(role->valuestring, "developer") == 0
                         ? "system" : role->valuestring;
        cm[i].content = contents[i];
        i++;
    }
    if (!get_bool(root, "add_generation_prompt", &add_generation_prompt,
                  err))
        goto out;
    if (chat_format(ctx->chat_template, cm, n, add_generation_prompt,
                    ctx->bos, ctx->eos, &text) != BT_OK) {
        BAD_PARAM("messages", "cannot format the messages");
        goto out;
    }
    if (one_prompt(out, err) == NULL)
        goto out;
    if (ctx->tok != NULL) {
        gateway_api_prompt_t *pr = &out->prompts[0];
        if (tok_encode(ctx->tok, text, strlen(text), tok_adds_bos(ctx->tok),
                       &pr->ids, &pr->n_ids) != BT_OK) {
            BAD_PARAM("messages", "cannot tokenize the messages");
            goto out;
        }
        if (pr->n_ids > PROTO_MAX_PROMPT_TOKENS) {
            BAD_PARAM("messages", "the conversation is too long");
            goto out;
        }
    } else {
        out->prompts[0].text = text;
        text = NULL;
    }
    ok = true;
out:
    bt_free(text);
    for (int k = 0; contents != NULL && k < n; k++)
        bt_free(contents[k]);
    bt_free(contents);
    bt_free(cm);
    return ok;
}

static bool add_stop(const cJSON *x, gateway_api_req_t *out,
                     gateway_api_error_t *err)
{
    if (!cJSON_IsString(x) || x->valuestring[0] == '\0' ||
        strlen(x->valuestring) > PARAMS_MAX_STOP_LEN) {
        BAD_PARAM("stop", "stop sequences must be non-empty strings of at "
                  "most %d bytes", PARAMS_MAX_STOP_LEN);
        return false;
    }
    out->stops[out->n_stops] = bt_strdup(x->valuestring, "gateway_stop");
    if (out->stops[out->n_stops] == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    out->n_stops++;
    return true;
}

static bool parse_stop(const cJSON *root, gateway_api_req_t *out,
                       gateway_api_error_t *err)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    const cJSON *x;

    if (s == NULL || cJSON_IsNull(s))
        return true;
    if (cJSON_IsString(s))
        return add_stop(s, out, err);
    if (!cJSON_IsArray(s)) {
        BAD_PARAM("stop", "'stop' must be a string or an array of strings");
        return false;
    }
    if (cJSON_GetArraySize(s) > PARAMS_MAX_STOP_STRINGS) {
        BAD_PARAM("stop", "at most %d stop sequences",
                  PARAMS_MAX_STOP_STRINGS);
        return false;
    }
    cJSON_ArrayForEach(x, s) {
        if (!add_stop(x, out, err))
            return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// Structured output (issue 39): OpenAI's response_format and vLLM's
// guided_json / guided_regex / guided_choice become one grammar spec,
// "<kind>:<text>" (worker/grammar/grammar.h), that the workers compile
// against their vocabulary and apply to every sampled token.  A spec they
// cannot compile (an unsupported schema keyword, say) fails the request
// with a 400 naming the problem; nothing is ignored.

static const cJSON *present(const cJSON *root, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);

    return j != NULL && !cJSON_IsNull(j) ? j : NULL;
}

/* kind + ':' + text into out->grammar; takes nothing over. */
static bool set_grammar(gateway_api_req_t *out, const char *param,
                        const char *kind, const char *text,
                        gateway_api_error_t *err)
{
    size_t len = strlen(kind) + 1 + strlen(text);

    if (out->grammar != NULL) {
        BAD_PARAM(param, "at most one of response_format (json_object, "
                  "json_schema), guided_json, guided_regex and "
                  "guided_choice");
        return false;
    }
    if (len > PROTO_MAX_GRAMMAR) {
        BAD_PARAM(param, "'%s' is longer than %d bytes", param,
                  PROTO_MAX_GRAMMAR);
        return false;
    }
    out->grammar = bt_malloc(len + 1, "gateway_grammar");
    if (out->grammar == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    snprintf(out->grammar, len + 1, "%s:%s", kind, text);
    return true;
}

/* set_grammar with j printed as JSON text. */
static bool set_grammar_json(gateway_api_req_t *out, const char *param,
                             const char *kind, const cJSON *j,
                             gateway_api_error_t *err)
{
    char *text = cJSON_PrintUnformatted(j);
    bool ok;

    if (text == NULL) {
        gateway__api_error_set(err, 500, "server_error", NULL, NULL,
                               "out of memory");
        return false;
    }
    ok = set_grammar(out, param, kind, text, err);
    cJSON_free(text);
    return ok;
}

static bool parse_structured(const cJSON *root, gateway_api_req_t *out,
                             gateway_api_error_t *err)
{
    const cJSON *rf = present(root, "response_format");
    const cJSON *gj = present(root, "guided_json");
    const cJSON *gr = present(root, "guided_regex");
    const cJSON *gc = present(root, "guided_choice");
    const cJSON *x;

    if (present(root, "guided_grammar") != NULL) {
        BAD_PARAM("guided_grammar", "'guided_grammar' (EBNF) is not "
                  "supported by baton: use response_format json_schema, "
                  "guided_json, guided_regex or guided_choice");
        return false;
    }
    if (rf != NULL) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) {
            BAD_PARAM("response_format", "'response_format' must be an "
                      "object with a 'type' string");
            return false;
        }
        if (strcmp(type->valuestring, "json_object") == 0) {
            if (!set_grammar(out, "response_format", "json_object", "", err))
                return false;
        } else if (strcmp(type->valuestring, "json_schema") == 0) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(
                rf, "json_schema");
            const cJSON *schema = cJSON_IsObject(js)
                ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!cJSON_IsObject(schema)) {
                BAD_PARAM("response_format", "'response_format.json_schema"
                          ".schema' must be a JSON schema object");
                return false;
            }
            if (!set_grammar_json(out, "response_format", "json_schema",
                                  schema, err))
                return false;
        } else if (strcmp(type->valuestring, "text") != 0) {
            BAD_PARAM("response_format", "'response_format.type' must be "
                      "text, json_object or json_schema");
            return false;
        }
    }
    if (gj != NULL) {
        if (cJSON_IsString(gj)) {
            if (!set_grammar(out, "guided_json", "json_schema",
                             gj->valuestring, err))
                return false;
        } else if (!cJSON_IsObject(gj)) {
            BAD_PARAM("guided_json", "'guided_json' must be a JSON schema "
                      "(an object or its text)");
            return false;
        } else if (!set_grammar_json(out, "guided_json", "json_schema", gj,
                                     err)) {
            return false;
        }
    }
    if (gr != NULL) {
        if (!cJSON_IsString(gr) || gr->valuestring[0] == '\0') {
            BAD_PARAM("guided_regex", "'guided_regex' must be a non-empty "
                      "string");
            return false;
        }
        if (!set_grammar(out, "guided_regex", "regex", gr->valuestring, err))
            return false;
    }
    if (gc != NULL) {
        if (!cJSON_IsArray(gc) || cJSON_GetArraySize(gc) == 0) {
            BAD_PARAM("guided_choice", "'guided_choice' must be a non-empty "
                      "array of strings");
            return false;
        }
        cJSON_ArrayForEach(x, gc) {
            if (!cJSON_IsString(x) || x->valuestring[0] == '\0') {
                BAD_PARAM("guided_choice", "'guided_choice' must be a "
                          "non-empty array of non-empty strings");
                return false;
            }
        }
        if (!set_grammar_json(out, "guided_choice", "choice", gc, err))
            return false;
    }
    if (out->grammar != NULL && out->req.ignore_eos) {
        /* a finished grammar allows only EOS */
        BAD_PARAM("ignore_eos", "'ignore_eos' cannot be combined with "
                  "structured output");
        return false;
    }
    out->req.grammar = out->grammar;
    return true;
}

// ---------------------------------------------------------------------------
// The request

void gateway__api_req_cleanup(gateway_api_req_t *r)
{
    bt_free(r->grammar);
    for (int i = 0; r->prompts != NULL && i < r->n_prompts; i++) {
        bt_free(r->prompts[i].text);
        bt_free(r->prompts[i].ids);
    }
    bt_free(r->prompts);
    bt_free(r->stop_ids);
    for (int i = 0; i < r->n_stops; i++)
        bt_free(r->stops[i]);
    memset(r, 0, sizeof(*r));
}

// ---------------------------------------------------------------------------
// Log-probabilities and echo (issue 39)

/* A bounds-table check (row `row`) as a 400 naming the parameter as the
 * body does (completions' `logprobs` is the top_logprobs row). */
static bool check_bound(const char *name, const char *row, double v,
                        gateway_api_error_t *err)
{
    const params_bound_t *b = params_bound(row);

    if (params_check(row, v, NULL, 0) == BT_OK)
        return true;
    BAD_PARAM(name, "%s is %g, must be in [%g, %g]", name, v, b->min,
              b->max);
    return false;
}

/* completions: integer `logprobs` (OpenAI's legacy: the sampled token and
 * N alternatives; false as off), `echo`; chat: boolean `logprobs` and
 * `top_logprobs`.  Both: vLLM's integer `prompt_logprobs`.  echo with
 * logprobs N asks for the prompt's logprobs with N alternatives. */
static bool parse_logprobs(const gateway_api_ctx_t *ctx, const cJSON *root,
                           gateway_api_req_t *out, params_t *p,
                           gateway_api_error_t *err)
{
    const cJSON *lp = present(root, "logprobs");
    const cJSON *tl = present(root, "top_logprobs");
    params_sampling_t *s = &p->sampling;
    double v = 0;

    if (out->kind == GATEWAY_API_COMPLETIONS) {
        if (tl != NULL && !(cJSON_IsNumber(tl) && tl->valuedouble == 0)) {
            BAD_PARAM("top_logprobs", "'top_logprobs' is a chat parameter: "
                      "completions take an integer 'logprobs'");
            return false;
        }
        if (lp != NULL && cJSON_IsTrue(lp)) {
            BAD_PARAM("logprobs", "'logprobs' must be an integer (0 to %d) "
                      "on /v1/completions", PARAMS_MAX_LOGPROBS);
            return false;
        }
        if (lp != NULL && !cJSON_IsFalse(lp)) {
            if (!get_int(root, "logprobs", -INFINITY, INFINITY, &v, err) ||
                !check_bound("logprobs", "top_logprobs", v, err))
                return false;
            s->logprobs = true;
            s->top_logprobs = (int)v;
        }
        if (!get_bool(root, "echo", &p->echo, err))
            return false;
    } else {
        if (!get_bool(root, "logprobs", &s->logprobs, err) ||
            !get_int(root, "top_logprobs", -INFINITY, INFINITY, &v, err) ||
            !check_bound("top_logprobs", "top_logprobs", v, err))
            return false;
        if (v > 0 && !s->logprobs) {
            BAD_PARAM("top_logprobs", "'top_logprobs' needs 'logprobs': "
                      "true");
            return false;
        }
        s->top_logprobs = (int)v;
        if (present(root, "echo") != NULL && !cJSON_IsFalse(present(root,
                                                                  "echo"))) {
            BAD_PARAM("echo", "'echo' is a /v1/completions parameter");
            return false;
        }
    }
    if (present(root, "prompt_logprobs") != NULL) {
        v = 0;
        if (!get_int(root, "prompt_logprobs", -INFINITY, INFINITY, &v,
                     err) ||
            !check_bound("prompt_logprobs", "prompt_logprobs", v, err))
            return false;
        s->prompt_logprobs = true;
        s->prompt_top_logprobs = (int)v;
        out->show_prompt_logprobs = true;
    }
    if (p->echo && s->logprobs && !s->prompt_logprobs) {
        s->prompt_logprobs = true;
        s->prompt_top_logprobs = s->top_logprobs;
    }
    if ((s->logprobs || s->prompt_logprobs) && ctx->tok == NULL) {
        BAD_PARAM(s->logprobs ? "logprobs" : "prompt_logprobs",
                  "logprobs need baton-http --tokenizer (token strings)");
        return false;
    }
    out->echo = p->echo;
    return true;
}

static bool parse_fields(const gateway_api_ctx_t *ctx, const cJSON *root,
                         gateway_api_req_t *out, gateway_api_error_t *err)
{
    client_request_t *req = &out->req;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *so, *sti;
    params_t params;
    const char *param = NULL;
    char msg[sizeof(err->message)];
    double v;

    if (model != NULL && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            BAD_PARAM("model", "'model' must be a string");
            return false;
        }
        if (strcmp(model->valuestring, ctx->model_name) != 0) {
            gateway__api_error_set(err, 404, "invalid_request_error",
                                   "model_not_found", "model",
                                   "The model '%.200s' does not exist "
                                   "(this server serves '%.80s')",
                                   model->valuestring, ctx->model_name);
            return false;
        }
    }
    if (!check_param_rules(root, out->kind, err))
        return false;

    client_request_init(req);
    params_init(&params);
    /* OpenAI's default temperature is 1; completions default to 16
     * tokens, chat to "until the context is full".  Values are read with
     * their JSON types checked here and their bounds checked below by the
     * contract's validator, as the router and the workers check them. */
    params.sampling.temperature = 1.0f;
    v = out->kind == GATEWAY_API_COMPLETIONS ? 16 : 0;
    if (!get_int(root, "max_tokens", 1, PARAMS_MAX_TOKENS, &v, err))
        return false;
    if (!get_int(root, "max_completion_tokens", 1, PARAMS_MAX_TOKENS, &v,
                 err))
        return false;
    params.max_tokens = (int)v;
    if (!get_float(root, "temperature", -INFINITY, INFINITY,
                   &params.sampling.temperature, err) ||
        !get_float(root, "top_p", -INFINITY, INFINITY,
                   &params.sampling.top_p, err) ||
        !get_float(root, "min_p", -INFINITY, INFINITY,
                   &params.sampling.min_p, err) ||
        !get_float(root, "presence_penalty", -INFINITY, INFINITY,
                   &params.sampling.presence_penalty, err) ||
        !get_float(root, "frequency_penalty", -INFINITY, INFINITY,
                   &params.sampling.frequency_penalty, err) ||
        !get_float(root, "repetition_penalty", -INFINITY, INFINITY,
                   &params.sampling.repetition_penalty, err))
        return false;
    v = 0;
    if (!get_int(root, "top_k", -2147483648.0, 2147483647.0, &v, err))
        return false;
    /* -1 = off, as in vLLM; the contract's off is 0 */
    params.sampling.top_k = v == -1 ? 0 : (int)v;
    v = 0;
    if (!get_int(root, "seed", -9223372036854775808.0, 18446744073709549568.0,
                 &v, err))
        return false;
    params.sampling.seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    out->has_seed = present(root, "seed") != NULL;
    v = 1;
    if (!get_int(root, "n", 1, GATEWAY_MAX_CHOICES, &v, err))
        return false;
    out->n = (int)v;
    if (!get_bool(root, "skip_special_tokens",
                  &params.sampling.skip_special_tokens, err) ||
        !get_bool(root, "ignore_eos", &params.ignore_eos, err))
        return false;
    if (!parse_stop(root, out, err) ||
        !parse_logprobs(ctx, root, out, &params, err))
        return false;
    sti = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");
    if (sti != NULL && !cJSON_IsNull(sti) &&
        (!cJSON_IsArray(sti) ||
         (sti->child != NULL &&
          !get_ids(sti, "stop_token_ids", PARAMS_MAX_STOP_IDS - 8,
                   &out->stop_ids, &out->n_stop_ids, err)))) {
        if (!cJSON_IsArray(sti))
            BAD_PARAM("stop_token_ids", "'stop_token_ids' must be an array");
        return false;
    }
    for (int i = 0; i < out->n_stop_ids; i++)
        params.stop_ids[i] = out->stop_ids[i];
    params.n_stop_ids = out->n_stop_ids;
    for (int i = 0; i < out->n_stops; i++) {
        params.stop_strings[i].data = out->stops[i];
        params.stop_strings[i].len = strlen(out->stops[i]);
    }
    params.n_stop_strings = out->n_stops;
    if (params_validate(&params, msg, sizeof(msg), &param) != BT_OK) {
        BAD_PARAM(param, "%s", msg);
        return false;
    }
    client_request_set_params(req, &params);
    if (!parse_structured(root, out, err))
        return false;
    so = cJSON_GetObjectItemCaseSensitive(root, "cache_salt");
    if (so != NULL && !cJSON_IsNull(so)) {
        size_t len = cJSON_IsString(so) ? strlen(so->valuestring) : 0;
        if (len == 0 || len > GATEWAY_CACHE_SALT_MAX) {
            BAD_PARAM("cache_salt", "'cache_salt' must be a string of 1 to "
                      "%d bytes", GATEWAY_CACHE_SALT_MAX);
            return false;
        }
        memcpy(out->cache_salt, so->valuestring, len + 1);
        req->cache_salt = out->cache_salt;
    }
    /* Extension (issue 37): the precision class to serve it in; the
     * canonical names are static, so nothing is copied. */
    so = cJSON_GetObjectItemCaseSensitive(root, "precision");
    if (so != NULL && !cJSON_IsNull(so)) {
        req->precision = cJSON_IsString(so)
                             ? proto_precision_find(so->valuestring) : NULL;
        if (req->precision == NULL) {
            BAD_PARAM("precision", "'precision' must be one of %s",
                      PROTO_PRECISIONS);
            return false;
        }
    }
    v = 0;
    if (!get_int(root, "priority", -1000000, 1000000, &v, err))
        return false;
    req->priority = (int)v;
    v = ctx->default_deadline_ms;
    if (!get_int(root, "deadline_ms", 0, 86400000, &v, err))
        return false;
    req->deadline_ms = (uint32_t)v;
    if (!get_bool(root, "stream", &out->stream, err))
        return false;
    so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so != NULL && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            BAD_PARAM("stream_options", "'stream_options' must be an object");
            return false;
        }
        if (!get_bool(so, "include_usage", &out->include_usage, err))
            return false;
    }
    return true;
}

bt_status_t gateway__api_parse(const gateway_api_ctx_t *ctx,
                               gateway_api_kind_t kind, const char *body,
                               size_t len, gateway_api_req_t *out,
                               gateway_api_error_t *err)
{
    cJSON *root;
    bool ok;

    memset(out, 0, sizeof(*out));
    memset(err, 0, sizeof(*err));
    out->kind = kind;
    root = cJSON_ParseWithLength(body, len);
    if (root == NULL) {
        BAD_PARAM(NULL, "the body is not valid JSON");
        return BT_ERR_INVALID_ARG;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD_PARAM(NULL, "the body must be a JSON object");
        return BT_ERR_INVALID_ARG;
    }
    ok = parse_fields(ctx, root, out, err);
    if (ok)
        ok = kind == GATEWAY_API_COMPLETIONS ? parse_prompt(root, out, err)
                                             : parse_messages(ctx, root, out,
                                                              err);
    cJSON_Delete(root);
    if (ok && out->n_prompts * out->n > GATEWAY_MAX_CHOICES) {
        BAD_PARAM("n", "%d prompts times n = %d make %d choices, at most %d",
                  out->n_prompts, out->n, out->n_prompts * out->n,
                  GATEWAY_MAX_CHOICES);
        ok = false;
    }
    if (!ok) {
        gateway__api_req_cleanup(out);
        return BT_ERR_INVALID_ARG;
    }
    out->kind = kind;
    gateway__api_req_use_prompt(out, 0);
    out->req.stop_ids = out->stop_ids;
    out->req.n_stop_ids = out->n_stop_ids;
    out->req.stop_strings = (const char *const *)out->stops;
    out->req.n_stop_strings = out->n_stops;
    out->req.want_text = true;
    if (out->prompts[0].ids != NULL && kind == GATEWAY_API_CHAT)
        out->req.add_bos = false; /* tok_encode already decided */
    return BT_OK;
}

void gateway__api_req_use_prompt(gateway_api_req_t *areq, int p)
{
    const gateway_api_prompt_t *pr = &areq->prompts[p];

    areq->req.prompt = pr->ids != NULL ? NULL : pr->text;
    areq->req.prompt_ids = pr->ids;
    areq->req.n_prompt_ids = pr->ids != NULL ? pr->n_ids : 0;
}

// ---------------------------------------------------------------------------
// Responses

/* Prints j unformatted, appends it to out and frees j. */
static bt_status_t emit(cJSON *j, bt_buf_t *out)
{
    char *s;
    bt_status_t status;

    if (j == NULL)
        return BT_ERR_NO_MEMORY;
    s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s == NULL)
        return BT_ERR_NO_MEMORY;
    status = bt_buf_append(out, s, strlen(s));
    cJSON_free(s);
    return status;
}

bt_status_t gateway__api_error_json(const gateway_api_error_t *err,
                                    bt_buf_t *out)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");

    if (e == NULL) {
        cJSON_Delete(root);
        return BT_ERR_NO_MEMORY;
    }
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "server_error");
    if (err->param[0] != '\0')
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err->code != NULL)
        cJSON_AddStringToObject(e, "code", err->code);
    else
        cJSON_AddNullToObject(e, "code");
    return emit(root, out);
}

void gateway__api_error_from_router(int router_code, const char *message,
                                    uint32_t retry_after_ms,
                                    gateway_api_error_t *err)
{
    const char *msg = message != NULL ? message : "";

    switch (router_code) {
    case BATON__ERROR_CODE__ERROR_INVALID:
        gateway__api_error_set(err, 400, "invalid_request_error", NULL, NULL,
                               "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_TOO_LONG:
        gateway__api_error_set(err, 400, "invalid_request_error",
                               "context_length_exceeded", "prompt", "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_OVERLOADED:
        gateway__api_error_set(err, 429, "rate_limit_error", "overloaded",
                               NULL, "the server is overloaded: %s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_NO_WORKERS:
        gateway__api_error_set(err, 503, "service_unavailable", "no_workers",
                               NULL, "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_DRAINING:
        gateway__api_error_set(err, 503, "service_unavailable", "draining",
                               NULL, "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_TIMEOUT:
        gateway__api_error_set(err, 504, "timeout", "deadline_exceeded",
                               NULL, "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_WORKER:
        gateway__api_error_set(err, 502, "server_error", "worker_failed",
                               NULL, "%s", msg);
        break;
    case BATON__ERROR_CODE__ERROR_ROUTER_LOST:
        /* The router died or stopped answering with the request in
         * flight: a gateway error; the request may be sent again. */
        gateway__api_error_set(err, 502, "server_error", "router_lost",
                               NULL, "%s", msg);
        break;
    default:
        gateway__api_error_set(err, 500, "server_error",
                               client_error_name(router_code), NULL, "%s",
                               msg);
        break;
    }
    err->retry_after_ms = retry_after_ms;
}

static void add_usage(cJSON *root, const gateway_api_resp_t *r)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");

    if (u == NULL)
        return;
    cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens",
                            (double)r->prompt_tokens + r->completion_tokens);
}

/* id, object, created, model: the head of every response object. */
static cJSON *head(const gateway_api_resp_t *r, const char *object)
{
    cJSON *root = cJSON_CreateObject();

    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)r->created);
    cJSON_AddStringToObject(root, "model", r->model);
    return root;
}

/* A string item from bytes that may hold NUL (cut there: JSON text from
 * the cluster is valid UTF-8 without NUL). */
static cJSON *string_n(const char *text, size_t len)
{
    char small[256];
    char *tmp = small;
    cJSON *s;

    if (len >= sizeof(small)) {
        tmp = bt_malloc(len + 1, "gateway_text");
        if (tmp == NULL)
            return NULL;
    }
    if (len > 0)
        memcpy(tmp, text, len);
    tmp[len] = '\0';
    s = cJSON_CreateString(tmp);
    if (tmp != small)
        bt_free(tmp);
    return s;
}

static void add_finish(cJSON *choice, const char *finish)
{
    if (finish != NULL)
        cJSON_AddStringToObject(choice, "finish_reason", finish);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

// ---------------------------------------------------------------------------
// Log-probabilities in the response (issue 39)

/* A token's string: its text in the middle of a sequence (tok_decode after
 * `prev`), valid UTF-8 (a partial character shows as U+FFFD; the chat
 * format's `bytes` has the exact bytes).  bt_malloc'ed; NULL: no memory
 * or an id out of the vocabulary. */
static char *lp_token(const gateway_api_resp_t *r, int prev, int id)
{
    char *text = NULL;

    if (tok_decode(r->tok, prev, &id, 1, &text) != BT_OK)
        return NULL;
    return text;
}

static uint32_t utf8_chars(const char *s)
{
    uint32_t n = 0;

    for (; *s != '\0'; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

uint32_t gateway__api_lp_chars(const gateway_api_resp_t *r,
                               const gateway_api_choice_t *c)
{
    uint32_t n = 0;

    for (int i = 0; r->tok != NULL && i < c->n_lp; i++) {
        char *t = lp_token(r, i > 0 ? c->lp[i - 1].id : c->prev_id,
                           c->lp[i].id);
        if (t != NULL)
            n += utf8_chars(t);
        bt_free(t);
    }
    return n;
}

/* cJSON number of a logprob: -inf (an impossible token) as JSON cannot
 * say it: -9999, as vLLM does. */
static cJSON *lp_number(float v)
{
    return cJSON_CreateNumber(isfinite(v) ? (double)v : -9999.0);
}

/* The exact bytes of a token, as chat's `bytes` array: a byte-fallback
 * piece (<0xXX>) is its one raw byte, which the token string shows as
 * U+FFFD when it is part of a character; other tokens are their string's
 * bytes. */
static cJSON *lp_bytes(const gateway_api_resp_t *r, int prev, int id)
{
    cJSON *a = cJSON_CreateArray();
    char *t = NULL;
    const char *s = NULL;
    size_t n = 0;
    char byte = 0;

    if (!tok_id_bytes_mid(r->tok, id, &s, &n, &byte) || s != &byte) {
        t = lp_token(r, prev, id);
        s = t;
        n = t != NULL ? strlen(t) : 0;
    }
    for (size_t i = 0; a != NULL && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    bt_free(t);
    return a;
}

/* Legacy completions: {tokens, token_logprobs, top_logprobs, text_offset}
 * (top_logprobs: one {token: logprob} object per token, the sampled
 * token included, as vLLM does; null for the prompt's first token). */
static cJSON *lp_completions(const gateway_api_resp_t *r,
                             const gateway_api_choice_t *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    uint32_t off = c->text_offset;

    for (int i = 0; i < c->n_lp; i++) {
        const gateway_lp_t *e = &c->lp[i];
        int prev = i > 0 ? c->lp[i - 1].id : c->prev_id;
        char *t = lp_token(r, prev, e->id);
        cJSON *top;

        cJSON_AddItemToArray(tokens, cJSON_CreateString(t ? t : ""));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(off));
        off += t != NULL ? utf8_chars(t) : 0;
        if (!e->has_logprob) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            bt_free(t);
            continue;
        }
        cJSON_AddItemToArray(lps, lp_number(e->logprob));
        top = cJSON_CreateObject();
        for (int k = 0; k < e->n_top; k++) {
            char *a = lp_token(r, prev, e->top_ids[k]);
            if (a != NULL && !cJSON_HasObjectItem(top, a))
                cJSON_AddItemToObject(top, a, lp_number(e->top_logprobs[k]));
            bt_free(a);
        }
        if (t != NULL && !cJSON_HasObjectItem(top, t))
            cJSON_AddItemToObject(top, t, lp_number(e->logprob));
        cJSON_AddItemToArray(tops, top);
        bt_free(t);
    }
    return o;
}

/* One chat entry {token, logprob, bytes}. */
static cJSON *lp_chat_entry(const gateway_api_resp_t *r, int prev, int id,
                            float logprob)
{
    cJSON *o = cJSON_CreateObject();
    char *t = lp_token(r, prev, id);

    cJSON_AddStringToObject(o, "token", t ? t : "");
    cJSON_AddItemToObject(o, "logprob", lp_number(logprob));
    cJSON_AddItemToObject(o, "bytes", lp_bytes(r, prev, id));
    bt_free(t);
    return o;
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}],
 * "refusal": null}. */
static cJSON *lp_chat(const gateway_api_resp_t *r,
                      const gateway_api_choice_t *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");

    for (int i = 0; i < c->n_lp; i++) {
        const gateway_lp_t *e = &c->lp[i];
        int prev = i > 0 ? c->lp[i - 1].id : c->prev_id;
        cJSON *x = lp_chat_entry(r, prev, e->id, e->logprob);
        cJSON *top = cJSON_AddArrayToObject(x, "top_logprobs");

        for (int k = 0; k < e->n_top; k++)
            cJSON_AddItemToArray(top, lp_chat_entry(r, prev, e->top_ids[k],
                                                    e->top_logprobs[k]));
        cJSON_AddItemToArray(content, x);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}},
 * ...]: the prompt token and its alternatives (rank: 1-based place among
 * them, absent when it is not among them). */
static cJSON *lp_prompt(const gateway_api_resp_t *r,
                        const gateway_api_choice_t *c)
{
    cJSON *a = cJSON_CreateArray();

    for (int i = 0; i < c->n_plp; i++) {
        const gateway_lp_t *e = &c->plp[i];
        int prev = i > 0 ? c->plp[i - 1].id : -1;
        cJSON *d;
        char key[16];
        int rank = 0;

        if (!e->has_logprob) {
            cJSON_AddItemToArray(a, cJSON_CreateNull());
            continue;
        }
        d = cJSON_CreateObject();
        for (int k = -1; k < e->n_top; k++) {
            int id = k < 0 ? e->id : e->top_ids[k];
            cJSON *x;
            char *t;

            snprintf(key, sizeof(key), "%d", id);
            if (cJSON_HasObjectItem(d, key))
                continue;
            for (int j = 0; k < 0 && j < e->n_top; j++)
                if (e->top_ids[j] == id)
                    rank = j + 1;
            x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "logprob",
                                  lp_number(k < 0 ? e->logprob
                                                  : e->top_logprobs[k]));
            if (k >= 0 || rank > 0)
                cJSON_AddNumberToObject(x, "rank", k < 0 ? rank : k + 1);
            t = lp_token(r, prev, id);
            cJSON_AddStringToObject(x, "decoded_token", t ? t : "");
            bt_free(t);
            cJSON_AddItemToObject(d, key, x);
        }
        cJSON_AddItemToArray(a, d);
    }
    return a;
}

/* choices[].logprobs (null when not asked) and prompt_logprobs. */
static void add_logprobs(cJSON *o, const gateway_api_resp_t *r,
                         const gateway_api_choice_t *c)
{
    if (!c->logprobs || r->tok == NULL)
        cJSON_AddNullToObject(o, "logprobs");
    else
        cJSON_AddItemToObject(o, "logprobs",
                              r->kind == GATEWAY_API_CHAT ? lp_chat(r, c)
                                                          : lp_completions(r,
                                                                           c));
    if (c->plp != NULL && r->tok != NULL)
        cJSON_AddItemToObject(o, "prompt_logprobs", lp_prompt(r, c));
}

bt_status_t gateway__api_response_json(const gateway_api_resp_t *r,
                                       const gateway_api_choice_t *choices,
                                       int n, bt_buf_t *out)
{
    bool chat = r->kind == GATEWAY_API_CHAT;
    cJSON *root = head(r, chat ? "chat.completion" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");

    for (int i = 0; i < n; i++) {
        const gateway_api_choice_t *c = &choices[i];
        cJSON *o = cJSON_CreateObject();

        cJSON_AddItemToArray(arr, o);
        cJSON_AddNumberToObject(o, "index", c->index);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content",
                                  string_n(c->text, c->text_len));
        } else {
            cJSON_AddItemToObject(o, "text", string_n(c->text, c->text_len));
        }
        add_logprobs(o, r, c);
        add_finish(o, c->finish);
    }
    add_usage(root, r);
    return emit(root, out);
}

bt_status_t gateway__api_chunk_json(const gateway_api_resp_t *r,
                                    const gateway_api_choice_t *c,
                                    bool role, bool usage_null,
                                    bt_buf_t *out)
{
    bool chat = r->kind == GATEWAY_API_CHAT;
    cJSON *root = head(r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *o = cJSON_CreateObject();

    cJSON_AddItemToArray(choices, o);
    cJSON_AddNumberToObject(o, "index", c->index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(o, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (c->text != NULL && (c->text_len > 0 || role))
            cJSON_AddItemToObject(d, "content",
                                  string_n(c->text, c->text_len));
    } else {
        cJSON_AddItemToObject(o, "text", string_n(c->text, c->text_len));
    }
    add_logprobs(o, r, c);
    add_finish(o, c->finish);
    if (usage_null)
        cJSON_AddNullToObject(root, "usage");
    return emit(root, out);
}

bt_status_t gateway__api_usage_chunk_json(const gateway_api_resp_t *r,
                                          bt_buf_t *out)
{
    bool chat = r->kind == GATEWAY_API_CHAT;
    cJSON *root = head(r, chat ? "chat.completion.chunk" : "text_completion");

    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, r);
    return emit(root, out);
}

bt_status_t gateway__api_models_json(const char *model, long long created,
                                     bool list, bt_buf_t *out)
{
    cJSON *m = cJSON_CreateObject();
    cJSON *root, *data;

    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "baton");
    if (!list)
        return emit(m, out);
    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, m);
    return emit(root, out);
}
