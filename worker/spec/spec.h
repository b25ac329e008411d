/*
 * spec.h - EAGLE-style speculative decoding over the engine's sequences.
 *
 * Each step, for every sequence of a batch:
 *   1. draft: the draft head (spec_head.h) grows a dynamic tree (EAGLE-2):
 *      the top-k children of the most probable nodes by cumulative draft
 *      log-probability, level by level, then the `tokens` best nodes;
 *   2. verify: ONE target forward scores every sequence's tree at once
 *      (the backend's per-sequence tree mask over the paged KV cache);
 *   3. accept: walk the tree from the root with recursive rejection
 *      sampling against the target's sampling distribution (children are
 *      deterministic top-k picks, so child c is accepted with probability
 *      p(c) and on rejection p loses c and is renormalised; the bonus
 *      token is drawn from what is left).  The output distribution is
 *      exactly the target's; at temperature 0 it is exactly the tokens
 *      of plain greedy decoding.  Penalties see the accepted tokens.
 *   4. keep only the accepted tokens' K/V: the few accepted slots move
 *      into place with one backend_kv_copy_slots call for the whole
 *      batch (any backend), and the sequence's cached count moves past
 *      them.  Rejected slots are simply overwritten by the next step.
 * Sequences still in prefill run their prompt chunk in the same forward.
 *
 * Adaptive: every step picks one of a few tree sizes (off, chains of 2
 * and 4, the configured tree) per batch-size bucket from measured
 * tokens/s.  Plain decoding is the baseline, measured on every plain
 * step; speculative arms are tried in short episodes, smallest first,
 * and every lost try doubles the wait before the next, so where
 * speculation does not pay it costs almost nothing (and while it is off
 * no draft-head feature work is done at all).
 *
 * Designed for a decode worker's continuous batching: spec_step takes
 * any set of sequences each step; sequences join and leave freely.  Not
 * thread-safe: one scheduler thread drives it (with the engine).
 */
#ifndef BT_WORKER_SPEC_SPEC_H
#define BT_WORKER_SPEC_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"
#include "engine.h"
#include "spec_head.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPEC_MAX_DEPTH 16
#define SPEC_MAX_TOPK 16
#define SPEC_MAX_TOKENS 128

typedef struct {
    int depth;     /* most draft tokens on one path, 1..SPEC_MAX_DEPTH */
    int topk;      /* children per expanded node, nodes expanded per
                      level, 1..SPEC_MAX_TOPK */
    int tokens;    /* draft tokens verified per step, 1..SPEC_MAX_TOKENS */
    bool adaptive; /* choose the tree size per step from measurements */
} spec_config_t;

/* Defaults: depth 8, top-k 4, 16 tokens, adaptive. */
void spec_config_init(spec_config_t *cfg);
/* BT_ERR_INVALID_ARG naming the bad field. */
bt_status_t spec_config_validate(const spec_config_t *cfg);

typedef struct spec_s spec_t;
typedef struct spec_seq_s spec_seq_t;

/* The engine and head are borrowed and must outlive the decoder.  With
 * the cpu backend the head runs on the host; with cuda it is copied to
 * the GPU (cuda_draft.h: its layer, the target's embedding, classifier
 * and final norm, and one draft state per backend max_seqs; later
 * sequences decode plainly) and greedy tree steps verify there. */
bt_status_t spec_create(engine_t *engine, spec_head_t *head,
                        const spec_config_t *cfg, spec_t **spec_p);
void spec_destroy(spec_t **spec_p);

/* Wraps an engine sequence (borrowed; it must not be stepped by
 * engine_step while wrapped) with its draft state. */
bt_status_t spec_seq_create(spec_t *spec, engine_seq_t *seq,
                            spec_seq_t **sseq_p);
void spec_seq_destroy(spec_seq_t **sseq_p);
engine_seq_t *spec_seq_engine_seq(spec_seq_t *sseq);

/* Seeds the draft state with the target's last hidden states (before
 * the final norm; backend_forward's `hidden` rows) of the last n cached
 * tokens, computed elsewhere: the speculation-aware hand-off, where the
 * prefill worker ships them with the KV so the decode worker drafts from
 * its first step.  A sequence whose cached tokens have no features
 * (imported without them, or stepped by engine_step) still works: its
 * first step decodes plainly and drafting starts from the next. */
bt_status_t spec_seq_import(spec_t *spec, spec_seq_t *sseq,
                            const float *hidden, int n);

/* Caps the KV slots a sequence's steps may take (draft tree included)
 * at max_slots (0 = the context): a decode worker's admission promise
 * (prompt + max tokens) then holds however much is drafted. */
void spec_seq_set_max_slots(spec_seq_t *sseq, int max_slots);

/* Draft tokens verified for the sequence in its last step (0: it was
 * decoded plainly or fed a prompt chunk). */
int spec_seq_last_drafted(const spec_seq_t *sseq);

/* Most tokens one step may add to one sequence (depth + 1). */
int spec_max_step_tokens(const spec_t *spec);

/* One step over n sequences in one target forward.  Sequence i gets
 * n_out[i] new tokens (0 while its prompt is still being fed) written to
 * out[i * spec_max_step_tokens(spec) ...], already appended to its engine
 * sequence.  BT_ERR_NO_RESOURCE when the KV pool cannot hold even plain
 * decoding (nothing changes then). */
bt_status_t spec_step(spec_t *spec, spec_seq_t **seqs, int n, int *n_out,
                      int *out);

/* One-sequence convenience (baton run): the next generated token, from
 * the tokens of the last step or a new step. */
bt_status_t spec_seq_next(spec_t *spec, spec_seq_t *sseq, int *tok_p);

typedef struct {
    uint64_t steps;         /* spec_step calls */
    uint64_t verify_seqs;   /* sequence-steps verified with a tree */
    uint64_t verify_tokens; /* tokens those produced (accepted + bonus) */
    uint64_t plain_seqs;    /* sequence-steps decoded without a tree */
    uint64_t draft_tokens;  /* draft tokens sent to verification */
    uint64_t draft_ns;      /* time planning + drafting */
    uint64_t verify_ns;     /* time in the target forward */
    uint64_t verify_gpu_ns; /* cuda: its GPU time (cuda_backend_gpu_ns) */
    uint64_t accept_ns;     /* time accepting, compacting, feeding */
    /* work asked of the backend and the head (tests: a plain step must
     * cost what engine_step costs) */
    uint64_t fwd_calls;     /* target forwards (backend_forward_sample) */
    uint64_t hidden_rows;   /* hidden rows those asked for (brought to
                               the host, or kept on the device for a
                               device head) */
    uint64_t logits_rows;   /* whole logits rows they brought there */
    uint64_t head_rows;     /* rows run through the draft head (feeding
                               target features and tree levels) */
    uint64_t head_replays;  /* cuda: head passes replayed from graphs */
    uint64_t head_captures; /* cuda: head passes captured */
    uint64_t head_eager;    /* cuda: head passes launched eagerly */
    uint64_t head_gpu_ns;   /* cuda: GPU time of the head passes' work
                               (part of draft_ns, or of accept_ns when
                               a full buffer is fed there) */
} spec_stats_t;

void spec_get_stats(const spec_t *spec, spec_stats_t *stats);
/* Mean tokens per verified sequence-step (accepted + the bonus), 0 when
 * none. */
double spec_accept_length(const spec_t *spec);

/* Forces a fixed tree (tokens 0 = plain decoding), disabling
 * adaptation; for tests and benchmarks. */
void spec_set_fixed(spec_t *spec, int tokens, int depth, int topk);

/* Back to the adaptive controller (after spec_set_fixed) with every
 * measurement forgotten: benchmarks warm a decoder up (graph captures,
 * GEMM tuning) and then measure from a clean start.  No-op when the
 * decoder was created with adaptive = false. */
void spec_set_adaptive(spec_t *spec);

/* Tests only: with `on`, accept every drafted child the target could
 * sample (a deliberately wrong rule that shows the distribution test can
 * fail). */
void spec_test_wrong_accept(spec_t *spec, bool on);

/* Benchmarks only (`baton bench-engine --spec-accept-rate`): the output
 * is no longer the target's.  At every level of the walk down a verified
 * tree, the best-scored child of the current node is accepted with
 * probability `rate` (a seeded stream), whatever the target says; on
 * rejection the target's greedy token is the bonus.  Drafting,
 * verification, KV compaction and feature feeding all run as usual, so a
 * step costs what a real one with that acceptance costs; the mean
 * accepted length of a tree of depth D is sum_{j=0..D} rate^j.
 * rate < 0 turns it off. */
void spec_test_force_accept(spec_t *spec, double rate, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SPEC_SPEC_H */
