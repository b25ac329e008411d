/*
 * tokenizer_int.h - private interface between the two tokenizer kinds.
 *
 * tokenizer.c owns tok_t (the llama2.c format); a Hugging Face
 * tokenizer.json tokenizer (tokenizer_json.c, a tokjson_t) lives inside a
 * tok_t, and the public tok_* calls forward to it, so callers see one
 * interface (tokenizer.h) whatever the file was.
 */
#ifndef BT_WORKER_MODEL_TOKENIZER_INT_H
#define BT_WORKER_MODEL_TOKENIZER_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "bt_status.h"
#include "tokenizer.h"

/* Decoded pieces longer than this are refused (the stream buffers of
 * tokenizer.c are sized by it). */
#define TOKJSON_MAX_PIECE_LEN 1024

typedef struct tokjson_s tokjson_t;

/* Loads tokenizer.json text (`json`, `len` bytes), with the optional
 * tokenizer_config.json and generation_config.json texts (NULL: absent).
 * BT_ERR_FORMAT names what is wrong with a malformed file. */
bt_status_t tokjson_load_mem(const char *json, size_t len, const char *config,
                             size_t config_len, const char *gen_config,
                             size_t gen_len, tokjson_t **tj_p);
void tokjson_destroy(tokjson_t **tj_p);

int tokjson_vocab_size(const tokjson_t *tj);
int tokjson_max_piece_len(const tokjson_t *tj);
int tokjson_bos_id(const tokjson_t *tj);
int tokjson_eos_id(const tokjson_t *tj);
const char *tokjson_piece(const tokjson_t *tj, int id);
bt_status_t tokjson_encode(const tokjson_t *tj, const char *text, size_t len,
                           bool add_bos, int **ids_p, int *n_p);

/* The bytes id decodes to after prev_id (-1: sequence start): the
 * decoder's per-token output, with the leading space stripped at the
 * start of a sequence where the decoder says so, and nothing for special
 * tokens when they are skipped.  *s_p points into the tokenizer. */
void tokjson_id_bytes(const tokjson_t *tj, int prev_id, int id,
                      const char **s_p, size_t *n_p);

/* tokenizer.c: wraps a tokjson_t in a tok_t (takes ownership of tj, also
 * on failure). */
bt_status_t tok__create_json(tokjson_t *tj, tok_t **tok_p);
/* tokenizer.c: tok_identity's digest: `len` bytes of data chained onto
 * the digest `prev` (0 to start); never 0. */
uint64_t tok__digest(uint64_t prev, const void *data, size_t len);
/* tokenizer.c: sets what tok_identity returns (the loaders, once). */
void tok__set_identity(tok_t *tok, uint64_t identity);
/* tokenizer.c: the tokjson_t inside tok, or NULL for a llama2.c one. */
tokjson_t *tok__json(const tok_t *tok);

/* tokenizer_json.c: settings and queries behind the tok_* extensions. */
void tokjson_set_skip_special(tokjson_t *tj, bool skip);
bool tokjson_adds_bos(const tokjson_t *tj);
bool tokjson_adds_eos(const tokjson_t *tj);
int tokjson_eos_ids(const tokjson_t *tj, int *ids, int cap);
int tokjson_token_id(const tokjson_t *tj, const char *piece);
bool tokjson_is_special(const tokjson_t *tj, int id);
const char *tokjson_chat_template(const tokjson_t *tj);
const char *tokjson_kind_name(const tokjson_t *tj);

#endif /* BT_WORKER_MODEL_TOKENIZER_INT_H */
