/*
 * tokenizer.h - text <-> token ids.
 *
 * Today: the llama2.c tokenizer format (sentencepiece-style BPE with merge
 * scores and byte fallback, ../shared/models/README.md).  The Hugging Face
 * tokenizer.json forms arrive behind this same interface later.
 *
 * Streaming: tok_stream_t turns generated ids into text incrementally and
 * never emits part of a UTF-8 character; bytes of an incomplete character
 * are held until it completes (or flushed as U+FFFD at the end).
 */
#ifndef BT_WORKER_MODEL_TOKENIZER_H
#define BT_WORKER_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok_s tok_t;

/* Loads a llama2.c tokenizer file holding `vocab_size` pieces (the model's
 * vocab size).  BT_ERR_FORMAT names what is wrong with a corrupt file
 * (truncation with its byte offset, negative or oversized lengths,
 * max_token_length outside [1, 1024], ids 3..258 not <0x00>..<0xFF>,
 * trailing bytes).  A loaded tok_t is immutable: every function below may
 * be called on it from several threads at once. */
bt_status_t tok_load_llama2c(const char *path, int vocab_size, tok_t **tok_p);

/* Same, from a memory buffer (fuzzing, tests). */
bt_status_t tok_load_llama2c_mem(const void *data, size_t len, int vocab_size,
                                 tok_t **tok_p);

void tok_destroy(tok_t **tok_p);

/* Loads any supported tokenizer (tokenizer_json.c): a Hugging Face model
 * directory or its tokenizer.json (tokenizer_config.json and
 * generation_config.json beside it are read when present: BOS/EOS,
 * add_bos_token, the EOS set, the chat template), or a llama2.c tokenizer
 * file.  vocab_size is the model's vocab size: a llama2.c file must hold
 * exactly that many pieces (<= 0: as many as the file holds), a
 * tokenizer.json may not use ids at or above it (<= 0: no check). */
bt_status_t tok_load(const char *path, int vocab_size, tok_t **tok_p);

/* A tokenizer.json from memory, with an optional tokenizer_config.json
 * text (config NULL: none).  For tests and fuzzing. */
bt_status_t tok_load_json_mem(const char *json, size_t len,
                              const char *config, size_t config_len,
                              tok_t **tok_p);

/* The tokenizer's identity: a 64-bit digest (SipHash) of every byte it
 * was loaded from (the llama2.c file; tokenizer.json with the
 * tokenizer_config.json and generation_config.json read beside it).  Two
 * tokenizers with equal identities encode every text to the same ids, so
 * a router may tokenize for a worker that reports the same identity
 * (Register.tokenizer_id).  Never 0. */
uint64_t tok_identity(const tok_t *tok);

/* "llama2.c", "tokenizer.json byte-level BPE" or "tokenizer.json
 * sentencepiece-style BPE". */
const char *tok_kind_name(const tok_t *tok);

/* Whether encoding for the model should start with BOS / end with EOS
 * (tokenizer_config's add_bos_token / add_eos_token, else the
 * tokenizer.json post-processor; llama2.c: BOS yes, EOS no). */
bool tok_adds_bos(const tok_t *tok);
bool tok_adds_eos(const tok_t *tok);

/* The EOS set used for stopping: the tokenizer's EOS plus
 * generation_config.json's eos_token_id (an int or a list).  Writes at
 * most cap ids and returns how many. */
int tok_eos_ids(const tok_t *tok, int *ids, int cap);

/* The id of a token string exactly as the tokenizer lists it (an added
 * token such as "<|eot_id|>", or a vocab entry), -1 when none. */
int tok_token_id(const tok_t *tok, const char *piece);

/* Whether id is a special token: for tokenizer.json, a special added
 * token (BOS, EOS, chat markers); for llama2.c, BOS, EOS and <unk>. */
bool tok_is_special(const tok_t *tok, int id);

/* Makes decoding and streaming print nothing for special tokens (the
 * `skip_special_tokens` of Hugging Face; default off).  Call before the
 * tokenizer is shared between threads.  No effect on llama2.c ones. */
void tok_set_skip_special(tok_t *tok, bool skip);

/* tokenizer_config.json's chat_template text (Jinja), NULL when none. */
const char *tok_chat_template(const tok_t *tok);

int tok_vocab_size(const tok_t *tok);
int tok_bos_id(const tok_t *tok); /* -1 when none */
int tok_eos_id(const tok_t *tok); /* -1 when none */

/* Encodes `len` bytes of UTF-8 (invalid bytes fall back to byte pieces).
 * Prepends BOS when add_bos.  Returns a bt_malloc'ed array the caller frees
 * with bt_free.  Gives exactly llama2.c run.c's `encode` ids (dummy prefix
 * " " before non-empty text; on a piece listed twice, the lower id) in
 * O(n log n). */
bt_status_t tok_encode(const tok_t *tok, const char *text, size_t len,
                       bool add_bos, int **ids_p, int *n_p);

/* The raw piece of an id (NULL when out of range). */
const char *tok_piece(const tok_t *tok, int id);

/* The bytes id adds to text in the middle of a sequence (after an
 * ordinary token: no leading space dropped; a <0xXX> piece is its byte,
 * written to byte_buf[0]).  *s_p points into the tokenizer or byte_buf.
 * Structured output (worker/grammar/) builds its masks from these.
 * Returns false for an id out of range. */
bool tok_id_bytes_mid(const tok_t *tok, int id, const char **s_p,
                      size_t *n_p, char *byte_buf);

/* The merge score of an id (0 when out of range). */
float tok_score(const tok_t *tok, int id);

/* The longest piece in bytes (the file's max_token_length).  A stream push
 * writes at most 3 * (tok_max_piece_len + 3) + 1 bytes, since invalid
 * bytes become 3-byte U+FFFDs. */
int tok_max_piece_len(const tok_t *tok);

/* Decodes ids to a bt_malloc'ed NUL-terminated string.  `prev_id` is the
 * token before ids[0] (-1 for none), which decides whether the first
 * piece's leading space is dropped (it is, after BOS).  As in run.c, BOS
 * prints nothing, `<0xXX>` pieces are raw bytes and other pieces (EOS's
 * "\n</s>\n" included) print as stored; unlike run.c's safe_printf,
 * control bytes are kept.  The result is always valid UTF-8: invalid
 * sequences become U+FFFD and NUL bytes are dropped.  Equals streaming
 * the same ids and flushing.  BT_ERR_INVALID_ARG for an id out of range. */
bt_status_t tok_decode(const tok_t *tok, int prev_id, const int *ids, int n,
                       char **text_p);

typedef struct tok_stream_s tok_stream_t;

/* A streaming detokenizer whose first token follows `prev_id` (usually the
 * prompt's last id). */
bt_status_t tok_stream_create(const tok_t *tok, int prev_id,
                              tok_stream_t **stream_p);
void tok_stream_destroy(tok_stream_t **stream_p);

/* Makes this stream print nothing for special ids (tok_is_special: BOS,
 * EOS, <unk> and a tokenizer.json's special added tokens; a
 * tokenizer.json stream then goes on as if they were not there, as
 * Hugging Face's decode does): the request's `skip_special_tokens`
 * (issue 39; every
 * serving path sets it, true by default).  Off at creation, so streams
 * and tok_decode print every piece unless asked (tok_set_skip_special
 * remains the tokenizer-wide switch of tokenizer.json tokenizers). */
void tok_stream_set_skip_special(tok_stream_t *stream, bool skip);

/* Feeds one id.  Appends only complete UTF-8 characters to `out` (NUL
 * terminated, capacity `cap`, at least 64 bytes) and returns their length
 * in *len_p (0 when the bytes so far end mid-character).  An invalid
 * sequence comes out as U+FFFD at once.  BT_ERR_INVALID_ARG (stream
 * unchanged) for an id out of range or output larger than cap, which
 * 3 * (tok_max_piece_len() + 3) + 1 bytes always hold. */
bt_status_t tok_stream_push(tok_stream_t *stream, int id, char *out,
                            size_t cap, size_t *len_p);

/* Emits held bytes of an unfinished character as U+FFFD. */
bt_status_t tok_stream_flush(tok_stream_t *stream, char *out, size_t cap,
                             size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_MODEL_TOKENIZER_H */
