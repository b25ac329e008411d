/*
 * chat_template.c - built-in chat formats (see chat_template.h).  Each
 * format reproduces the official Jinja template of its family for plain
 * text messages (no tools, no multimodal parts); the leading BOS is left
 * to the encoder.
 */
#include "chat_template.h"

#include <ctype.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

static const struct {
    const char *name;
    chat_template_t t;
} chat_names[] = {
    {"plain", CHAT_TEMPLATE_PLAIN},   {"llama3", CHAT_TEMPLATE_LLAMA3},
    {"chatml", CHAT_TEMPLATE_CHATML}, {"qwen", CHAT_TEMPLATE_QWEN},
    {"mistral", CHAT_TEMPLATE_MISTRAL}, {"llama2", CHAT_TEMPLATE_LLAMA2},
};

#define CHAT_N_NAMES (sizeof(chat_names) / sizeof(chat_names[0]))

static const char chat_qwen_system[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bt_status_t chat_template_from_name(const char *name, chat_template_t *t_p)
{
    for (size_t i = 0; name != NULL && i < CHAT_N_NAMES; i++) {
        if (strcmp(name, chat_names[i].name) == 0) {
            *t_p = chat_names[i].t;
            return BT_OK;
        }
    }
    return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                    "unknown chat template '%s' (known: plain, llama3, "
                    "chatml, qwen, mistral, llama2)",
                    name != NULL ? name : "(null)");
}

const char *chat_template_name(chat_template_t t)
{
    for (size_t i = 0; i < CHAT_N_NAMES; i++)
        if (chat_names[i].t == t)
            return chat_names[i].name;
    return "plain";
}

chat_template_t chat_template_detect(const char *jinja,
                                     const char *model_type)
{
    if (jinja != NULL) {
        if (strstr(jinja, "<|start_header_id|>") != NULL)
            return CHAT_TEMPLATE_LLAMA3;
        if (strstr(jinja, "<|im_start|>") != NULL)
            return strstr(jinja, "You are Qwen") != NULL
                       ? CHAT_TEMPLATE_QWEN
                       : CHAT_TEMPLATE_CHATML;
        if (strstr(jinja, "<<SYS>>") != NULL)
            return CHAT_TEMPLATE_LLAMA2;
        if (strstr(jinja, "[INST]") != NULL)
            return CHAT_TEMPLATE_MISTRAL;
    }
    if (model_type != NULL) {
        if (strncmp(model_type, "qwen", 4) == 0)
            return CHAT_TEMPLATE_QWEN;
        if (strcmp(model_type, "mistral") == 0 ||
            strcmp(model_type, "mixtral") == 0)
            return CHAT_TEMPLATE_MISTRAL;
    }
    return CHAT_TEMPLATE_PLAIN;
}

// ----------------------------------------------------------------------------
// output buffer

typedef struct {
    char *p;    /* NUL-terminated text */
    size_t n;   /* bytes */
    size_t cap; /* allocated */
    bool oom;   /* an append failed */
} chat_buf_t;

static void chat_putn(chat_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = BT_MAX(2 * b->cap, b->n + n + 64);
        char *q = bt_realloc(b->p, cap, "chat_text");
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void chat_put(chat_buf_t *b, const char *s)
{
    chat_putn(b, s, strlen(s));
}

/* Appends s without leading and trailing whitespace (Jinja's trim). */
static void chat_put_trim(chat_buf_t *b, const char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    chat_putn(b, s, n);
}

// ----------------------------------------------------------------------------
// formats

static void chat_llama3(chat_buf_t *b, const chat_msg_t *m, int n, bool gen)
{
    for (int i = 0; i < n; i++) {
        chat_put(b, "<|start_header_id|>");
        chat_put(b, m[i].role);
        chat_put(b, "<|end_header_id|>\n\n");
        chat_put_trim(b, m[i].content);
        chat_put(b, "<|eot_id|>");
    }
    if (gen)
        chat_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void chat_chatml(chat_buf_t *b, const chat_msg_t *m, int n, bool gen,
                        bool qwen)
{
    if (qwen && (n == 0 || strcmp(m[0].role, "system") != 0)) {
        chat_put(b, "<|im_start|>system\n");
        chat_put(b, chat_qwen_system);
        chat_put(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        chat_put(b, "<|im_start|>");
        chat_put(b, m[i].role);
        chat_put(b, "\n");
        chat_put(b, m[i].content);
        chat_put(b, "<|im_end|>\n");
    }
    if (gen)
        chat_put(b, "<|im_start|>assistant\n");
}

/* Llama 2 chat: the system message goes inside the first user turn; each
 * user turn after the first starts with BOS (the first one's BOS is the
 * encoder's). */
static void chat_llama2(chat_buf_t *b, const chat_msg_t *m, int n,
                        const char *bos, const char *eos)
{
    const char *system = NULL;
    int first = 0;

    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        system = m[0].content;
        first = 1;
    }
    for (int i = first; i < n; i++) {
        if (strcmp(m[i].role, "assistant") == 0) {
            chat_put(b, " ");
            chat_put_trim(b, m[i].content);
            chat_put(b, " ");
            chat_put(b, eos);
            continue;
        }
        if (b->n > 0)
            chat_put(b, bos);
        chat_put(b, "[INST] ");
        if (i == first && system != NULL) {
            chat_put(b, "<<SYS>>\n");
            chat_put(b, system);
            chat_put(b, "\n<</SYS>>\n\n");
        }
        chat_put_trim(b, m[i].content);
        chat_put(b, " [/INST]");
    }
}

/* Mistral instruct (v0.1/v0.2): "[INST] user [/INST]assistant</s>"; a
 * system message is put before the first user message. */
static void chat_mistral(chat_buf_t *b, const chat_msg_t *m, int n,
                         const char *eos)
{
    const char *system = NULL;
    int first = 0;

    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        system = m[0].content;
        first = 1;
    }
    for (int i = first; i < n; i++) {
        if (strcmp(m[i].role, "assistant") == 0) {
            chat_put(b, m[i].content);
            chat_put(b, eos);
            continue;
        }
        chat_put(b, "[INST] ");
        if (i == first && system != NULL) {
            chat_put(b, system);
            chat_put(b, "\n\n");
        }
        chat_put(b, m[i].content);
        chat_put(b, " [/INST]");
    }
}

static void chat_plain(chat_buf_t *b, const chat_msg_t *m, int n, bool gen)
{
    for (int i = 0; i < n; i++) {
        char first[2] = {(char)toupper((unsigned char)m[i].role[0]), '\0'};
        if (m[i].role[0] != '\0') {
            chat_put(b, first);
            chat_put(b, m[i].role + 1);
        }
        chat_put(b, ": ");
        chat_put(b, m[i].content);
        chat_put(b, "\n");
    }
    if (gen)
        chat_put(b, "Assistant:");
}

bt_status_t chat_format(chat_template_t t, const chat_msg_t *msgs, int n,
                        bool add_generation_prompt, const char *bos,
                        const char *eos, char **text_p)
{
    chat_buf_t b = {NULL, 0, 0, false};

    if (text_p == NULL || n < 0 || (msgs == NULL && n > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "bad chat arguments");
    for (int i = 0; i < n; i++)
        if (msgs[i].role == NULL || msgs[i].content == NULL)
            return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                            "chat message %d has no role or content", i);
    if (bos == NULL)
        bos = "<s>";
    if (eos == NULL)
        eos = "</s>";
    chat_put(&b, ""); /* an empty conversation is an empty string */
    switch (t) {
    case CHAT_TEMPLATE_LLAMA3:
        chat_llama3(&b, msgs, n, add_generation_prompt);
        break;
    case CHAT_TEMPLATE_CHATML:
    case CHAT_TEMPLATE_QWEN:
        chat_chatml(&b, msgs, n, add_generation_prompt,
                    t == CHAT_TEMPLATE_QWEN);
        break;
    case CHAT_TEMPLATE_LLAMA2:
        chat_llama2(&b, msgs, n, bos, eos);
        break;
    case CHAT_TEMPLATE_MISTRAL:
        chat_mistral(&b, msgs, n, eos);
        break;
    default:
        chat_plain(&b, msgs, n, add_generation_prompt);
        break;
    }
    if (b.oom) {
        bt_free(b.p);
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "chat text");
    }
    *text_p = b.p;
    return BT_OK;
}
