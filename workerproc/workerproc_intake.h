/*
 * workerproc_intake.h - the prefill intake shared by baton-prefill and
 * baton-decode --role both (issue 41): admitting a PrefillTask's prompt
 * (ids, or text through the tokenizer or the null model's stand-in, each
 * id inside the vocabulary, the whole inside the context and the KV
 * reservation), the first token's sampler and text, and the PrefillDone
 * that reports them.  What differs between the two stays with each
 * role: where the prompt is computed (a prefill batch, or chunks inside
 * the decode step) and where its KV goes.
 */
#ifndef BT_WORKERPROC_WORKERPROC_INTAKE_H
#define BT_WORKERPROC_WORKERPROC_INTAKE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "proto_msg.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a prompt must fit. */
typedef struct {
    engine_t *engine;     /* its tokenizer; NULL: the null model */
    int vocab;            /* ids in [0, vocab) */
    int max_context;      /* prompts shorter than this */
    int reserved_tokens;  /* the KV reservation holds this many tokens
                             (0: not checked) */
} workerproc_intake_t;

/* An admitted prompt. */
typedef struct {
    int *tokens;          /* (n_tokens) prompt (+ resumed tokens), owned */
    int n_tokens;
    int n_resumed;        /* tail of tokens generated before (failover) */
    /* Structured output (PrefillTask.grammar): compiled at admission, its
     * state replayed over the resumed tokens; the first token's sampler
     * is masked with it.  NULL: none. */
    grammar_t *grammar;   /* owned */
    grammar_state_t gstate;
    uint64_t *gmask;      /* (grammar_mask_words) the sampler's mask, owned */
} workerproc_prompt_t;

/* Admits task `m`'s prompt into *p (and compiles its grammar, if any,
 * against the engine's vocabulary: a spec that does not compile is
 * refused here, INVALID naming why).  On a refusal returns an error, sets
 * *code_p (INVALID, TOO_LONG, INTERNAL) and writes why into `err` (for
 * the PrefillDone failure); *p holds nothing then. */
bt_status_t workerproc_intake_prompt(const workerproc_intake_t *in,
                                     const Baton__PrefillTask *m,
                                     workerproc_prompt_t *p,
                                     Baton__ErrorCode *code_p, char *err,
                                     size_t err_len);

/* Frees p's tokens and grammar.  Idempotent. */
void workerproc_prompt_cleanup(workerproc_prompt_t *p);

/* The sampler of the first token: it observed the prompt and skipped
 * the draws of the tokens generated before a failover, so it continues
 * the request's random stream (as baton run does); with a grammar it is
 * masked by p's (p must outlive the sampler). */
bt_status_t workerproc_intake_sampler(const sampler_params_t *sp, int vocab,
                                      const workerproc_prompt_t *p,
                                      sampler_t **sampler_p);

/* The text of the first token after the prompt's last one (0 bytes
 * without a tokenizer; special tokens none unless !skip_special); at
 * most `len` bytes in `buf`. */
size_t workerproc_intake_first_text(engine_t *engine,
                                    const workerproc_prompt_t *p, int first,
                                    bool skip_special, char *buf,
                                    size_t len);

/* Sets the first token's logprobs (SamplingParams.logprobs) in `done`;
 * lp NULL: none.  Borrows lp until done is sent. */
void workerproc_prefill_done_logprobs(Baton__PrefillDone *done,
                                      const sampler_logprobs_t *lp);

/* Sets the prompt's logprobs (SamplingParams.prompt_logprobs) in `done`;
 * plp NULL: none.  Borrows plp until done is sent. */
void workerproc_prefill_done_prompt_logprobs(Baton__PrefillDone *done,
                                             const sampler_prompt_lp_t *plp);

/* Fills `done` as a successful PrefillDone: the prompt ids, first token
 * and text, the grant's epoch and capability, timings (all borrowed
 * until it is queued or sent); `done` may carry more (inline KV, the
 * spec feature, logprobs) set by the caller.  The roles queue it in
 * their outbox (workerproc_queue): one ControlBatch a loop turn. */
void workerproc_prefill_done_init(Baton__PrefillDone *done, uint64_t id,
                                  const workerproc_prompt_t *p, int first,
                                  const char *text, size_t text_len,
                                  uint64_t epoch, const uint8_t *cap,
                                  size_t cap_len, uint64_t compute_us,
                                  uint64_t transfer_us);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_INTAKE_H */
