/*
 * engine.h - one model ready to serve: weights, tokenizer, backend, KV
 * block allocator, and per-request sequences.
 *
 * The engine is what `baton run`, the prefill worker and the decode worker
 * share.  A sequence holds its tokens, its block table and its sampler;
 * engine_step() feeds every given sequence its pending tokens (prompt
 * chunks under a token budget, or the last sampled token) in one batched
 * forward and samples the next token for each sequence whose input is
 * complete.  Schedulers decide *which* sequences step together; the
 * engine does the work.  Not thread-safe: one scheduler thread drives it.
 */
#ifndef BT_WORKER_ENGINE_H
#define BT_WORKER_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "bt_status.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *model_path;     /* .bin file, HF directory or synth:NAME */
    const char *tokenizer_path; /* llama2.c .bin, tokenizer.json or an HF
                                 * directory; NULL: the model directory's
                                 * tokenizer.json if any, else none */
    const char *device;         /* "auto", "cpu" or "cuda" */
    backend_config_t backend;
} engine_config_t;

void engine_config_init(engine_config_t *cfg);

typedef struct engine_s engine_t;
typedef struct engine_seq_s engine_seq_t;

bt_status_t engine_create(const engine_config_t *cfg, engine_t **engine_p);
void engine_destroy(engine_t **engine_p);

const model_t *engine_model(const engine_t *engine);
const tok_t *engine_tokenizer(const engine_t *engine); /* NULL when none */
backend_t *engine_backend(engine_t *engine);
kv_allocator_t *engine_kv(engine_t *engine);
int engine_block_size(const engine_t *engine);

/* Longest sequence (prompt + generated) the engine accepts. */
int engine_max_context(const engine_t *engine);

/* Creates a sequence for `prompt` (copied).  Checks that the prompt is not
 * empty, its ids are in the vocabulary and it fits the context, and that
 * the sampling parameters are valid (BT_ERR_INVALID_ARG with a message).
 * KV blocks are taken lazily by engine_step. */
bt_status_t engine_seq_create(engine_t *engine, const int *prompt,
                              int n_prompt, const sampler_params_t *params,
                              engine_seq_t **seq_p);

/* Releases the sequence's KV blocks and frees it.  NULL-safe. */
void engine_seq_destroy(engine_t *engine, engine_seq_t **seq_p);

int engine_seq_len(const engine_seq_t *seq);      /* all tokens */
int engine_seq_cached(const engine_seq_t *seq);   /* tokens in KV */
int engine_seq_prompt_len(const engine_seq_t *seq);
const int *engine_seq_tokens(const engine_seq_t *seq);
/* Tokens generated so far (those after the prompt). */
int engine_seq_n_generated(const engine_seq_t *seq);

/* The prompt's logprobs (sampler_params_t.prompt_logprobs; NULL when not
 * asked), filled as the prompt is fed: complete once the first token is
 * sampled.  Every prompt position gets a logits row (its chunks feed at
 * most 64 tokens a step, one such sequence a step). */
const sampler_prompt_lp_t *engine_seq_prompt_logprobs(
    const engine_seq_t *seq);

/* Runs one forward over `n` sequences.  Each feeds up to its pending
 * tokens, with at most `token_budget` new tokens in all (0 = backend
 * limit); a sequence left without budget is skipped this step.  For each
 * sequence whose pending tokens were all fed, the next token is sampled,
 * appended to it, and written to sampled[i]; others get -1.
 * BT_ERR_NO_RESOURCE when the KV pool cannot hold the new tokens (nothing
 * changes then). */
bt_status_t engine_step(engine_t *engine, engine_seq_t **seqs, int n,
                        int token_budget, int *sampled);

/* Warm-up before a worker takes work (issue 36): runs forwards of the
 * shapes it will serve so that what a backend does the first time it
 * sees a shape happens now, not inside a request: the CUDA backend tunes
 * its GEMMs on the first uncaptured use of a weight shape (a 16-token
 * prompt tunes every decode bucket, a `chunk_tokens` prompt the prefill
 * shape; `batch_tokens`, when it differs, a full batch), then captures
 * the decode graph of every power-of-two batch up to max_seqs (one
 * token per sequence, greedy sampling on the device, as the decode
 * worker runs it).  `decode` false: no decode steps (a prefill worker).
 * Takes KV blocks from the pool and gives them all back (shapes the pool
 * cannot hold are left out).  Logs what ran, how long it took and (cuda)
 * the device memory still free.  Not thread-safe; call before serving. */
bt_status_t engine_warmup(engine_t *engine, int chunk_tokens,
                          int batch_tokens, bool decode);

/* ---- speculative decoding support (worker/spec/) ----
 * The speculative decoder drives the backend itself (tree verification)
 * and uses these to read and update a sequence's state. */

/* The engine's configuration (backend sizes). */
const engine_config_t *engine_config(const engine_t *engine);

/* The sequence's block table and the number of blocks in it. */
const int *engine_seq_blocks(const engine_seq_t *seq, int *n_blocks_p);

/* The sequence's sampler (its penalties see every committed token). */
sampler_t *engine_seq_sampler(engine_seq_t *seq);

/* Makes the block table cover `n_slots` KV slots, taking blocks from the
 * pool.  All or nothing: BT_ERR_NO_RESOURCE and no change when the pool
 * cannot; BT_ERR_INVALID_ARG beyond the context. */
bt_status_t engine_seq_reserve(engine_t *engine, engine_seq_t *seq,
                               int n_slots);

/* Appends `n` tokens (observing each in the sampler) and sets the count
 * of tokens whose K/V are in the pool to `n_cached` (at most the new
 * length; the caller has written those slots).  BT_ERR_INVALID_ARG when
 * the tokens do not fit the context or n_cached is out of range. */
bt_status_t engine_seq_commit(engine_t *engine, engine_seq_t *seq,
                              const int *tokens, int n, int n_cached);

/* Gives the sequence KV computed elsewhere (the decode worker's
 * reservation): appends the `n_blocks` block ids (the sequence takes over
 * their references; its table must be empty) and marks the first
 * `n_cached` tokens cached.  BT_ERR_INVALID_ARG when the blocks do not
 * fit the table or cannot hold n_cached slots. */
bt_status_t engine_seq_adopt_kv(engine_t *engine, engine_seq_t *seq,
                                const int *blocks, int n_blocks,
                                int n_cached);

/* ---- structured output (worker/grammar/, issue 39) ---- */

/* The engine's grammar vocabulary (its tokenizer's token bytes, the
 * model's EOS ids), built on the first call; owned by the engine.
 * BT_ERR_INVALID_ARG when the engine has no tokenizer. */
bt_status_t engine_grammar_vocab(engine_t *engine,
                                 const grammar_vocab_t **vocab_p);

/* Holds the sequence's output to `grammar` (compiled for
 * engine_grammar_vocab; borrowed, it must outlive the sequence; several
 * sequences may share one since the engine is single-threaded) from
 * token index `start` on (-1: the prompt's end).  Tokens already past
 * start are replayed: a decode worker taking a request over creates the
 * sequence from the prompt plus the tokens generated so far and passes
 * the original prompt length, and the grammar state moves with the
 * request.  Each step then samples under the state's mask, EOS only
 * where the output is complete.  BT_ERR_INVALID_ARG when the replayed
 * tokens do not fit the grammar.  Speculative decoding verifies against
 * the first position's mask only: do not draft for such a sequence. */
bt_status_t engine_seq_set_grammar(engine_t *engine, engine_seq_t *seq,
                                   grammar_t *grammar, int start);

bool engine_seq_has_grammar(const engine_seq_t *seq);

/* True when the grammar accepts the output and no byte can follow: the
 * next token can only be EOS (a caller may stop without stepping). */
bool engine_seq_grammar_final(const engine_seq_t *seq);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_ENGINE_H */
