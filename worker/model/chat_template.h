/*
 * chat_template.h - built-in chat formats (not a Jinja interpreter).
 *
 * A model's tokenizer_config.json carries its chat format as a Jinja
 * template; baton recognises the common families by their markers and
 * formats messages with a fixed C implementation of each:
 *
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n        (Qwen, many others)
 *   qwen     chatml with Qwen 2.5's default system message when none given
 *   mistral  [INST] USER [/INST]ASSISTANT</s>           (system folded in)
 *   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ASSISTANT </s><s>
 *   plain    "System: ...\nUser: ...\nAssistant:"        (fallback)
 *
 * The formatted text does not start with BOS: encode it with
 * tok_encode(..., tok_adds_bos(tok), ...), which gives the one BOS that
 * Hugging Face's apply_chat_template puts in the text.  BOS/EOS strings
 * inside a conversation (llama2, mistral) are the tokenizer's own, and
 * match as added tokens when the text is encoded.
 */
#ifndef BT_WORKER_MODEL_CHAT_TEMPLATE_H
#define BT_WORKER_MODEL_CHAT_TEMPLATE_H

#include <stdbool.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CHAT_TEMPLATE_PLAIN = 0,
    CHAT_TEMPLATE_LLAMA3,
    CHAT_TEMPLATE_CHATML,
    CHAT_TEMPLATE_QWEN,
    CHAT_TEMPLATE_MISTRAL,
    CHAT_TEMPLATE_LLAMA2
} chat_template_t;

typedef struct {
    const char *role;    /* "system", "user", "assistant" (others kept) */
    const char *content; /* message text */
} chat_msg_t;

/* The template called `name` ("llama3", "chatml", "qwen", "mistral",
 * "llama2", "plain").  BT_ERR_INVALID_ARG for an unknown name (the message
 * lists the known ones). */
bt_status_t chat_template_from_name(const char *name, chat_template_t *t_p);

const char *chat_template_name(chat_template_t t);

/* Picks the template from a Jinja chat_template text (may be NULL) by its
 * markers, else from config.json's model_type (may be NULL), else plain. */
chat_template_t chat_template_detect(const char *jinja,
                                     const char *model_type);

/* Formats n messages into a bt_malloc'ed string (caller frees); with
 * add_generation_prompt the text ends where the assistant's reply starts.
 * bos/eos are the tokenizer's BOS/EOS strings (NULL: "<s>"/"</s>"), used
 * between turns by llama2 and mistral.  BT_ERR_INVALID_ARG for a NULL
 * role or content. */
bt_status_t chat_format(chat_template_t t, const chat_msg_t *msgs, int n,
                        bool add_generation_prompt, const char *bos,
                        const char *eos, char **text_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_CHAT_TEMPLATE_H */
