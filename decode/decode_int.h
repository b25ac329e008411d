/*
 * decode_int.h - the decode worker's private state and the functions its
 * files share (decode__ prefix; the public API is decode.h).  Each file
 * holds one concern:
 *   decode.c        the loop, message dispatch, sequences, the plain step,
 *                   lifecycle
 *   decode_resv.c   the reservation table: grants (with prefix-cache
 *                   blocks held for the hand-off), release, expiry and
 *                   the quarantine of blocks a remote writer may still hit
 *   decode_ready.c  KvReady: checks the hand-off and starts the sequence
 *   decode_local.c  aggregated mode: PrefillTask for our own reservation
 *   decode_emit.c   sampled tokens: detokenize, stop conditions, logprobs,
 *                   TokenOut into the outbox
 *   decode_spec.c   speculative decoding: draft head setup, spec step
 */
#ifndef BT_DECODE_DECODE_INT_H
#define BT_DECODE_DECODE_INT_H

#include "decode.h"

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "bt_zmq.h"
#include "decode_budget.h"
#include "kv/kv_link.h"
#include "params_proto.h"
#include "proto_msg.h"
#include "stop.h"
#include "workerproc.h"
#include "workerproc_intake.h"
#include "workerproc_metrics.h"
#include "workerproc_opts.h"
#include "workerproc_prefix.h"

#define DECODE_NAME_MAX 64
#define DECODE_BLOCK_WAIT_NS (30ull * 1000000000ull)
#define DECODE_PREFILL_FLOOR 128 /* prompt tokens a step always may take */
/* A heartbeat goes out at once, at most this often, when the free block
 * count moved (the router admits on it). */
#define DECODE_HB_URGENT_NS 10000000ull
/* --kv-overcommit: admission leaves 1/64 of the pool, and at least a
 * block a running stream (its next block_size tokens), free for the
 * streams' growth, as vLLM's watermark does: a stream given back is not
 * admitted again straight into the shortage that preempted it */
#define DECODE_OVERCOMMIT_WATERMARK_DIV 64
/* A KvReady whose link still copies (staged: every layer's commit
 * landed, only the last host-to-device copies may still run) waits at
 * most this long; longer means something broke: fail it (the router
 * retries). */
#define DECODE_ARRIVAL_WAIT_NS (2000ull * 1000000ull)
/* Prefix cache events go to the router at most this often (batched). */
#define DECODE_KV_EVENTS_MS 20

/* Kinds of the loop's host work the stop line accounts for. */
enum {
    DECODE_HOST_RESERVE,  /* KvReserve: blocks, prefix lookup, grant */
    DECODE_HOST_READY,    /* KvReady: the KV into the pool, the stream */
    DECODE_HOST_OTHER_MSG, /* every other control message */
    DECODE_HOST_LINKS,    /* the KV links' progress */
    DECODE_HOST_PENDING,  /* KvReady retried while its copies run */
    DECODE_HOST_KINDS
};

/* A local prompt waiting for prefill, by arrival (a step's scratch). */
typedef struct {
    uint64_t t_start;
    uint64_t epoch;
    int slot;
} decode_arrival_t;

typedef struct {
    bool used;
    uint64_t id;        /* request id */
    uint64_t epoch;     /* never reused */
    uint8_t cap[PROTO_CAPABILITY_BYTES]; /* random capability of the
                           grant (issue 42): a KvReady must present it */
    int *blocks;        /* (n_blocks) */
    int n_blocks;
    int limit_blocks;   /* blocks promised to it at admission: all it may
                           grow to, or less (decode_resv.c: without
                           max_tokens, or --kv-overcommit) */
    int growth_blocks;  /* blocks it may grow to (prompt + max tokens) */
    uint64_t expires_ns;
    /* Aggregated mode: a PrefillTask for this reservation runs here. */
    bool local;         /* prompt being prefilled locally */
    bool local_done;    /* its KV is in the blocks (LOCAL arrival) */
    workerproc_prompt_t p; /* the admitted prompt (+ resumed tokens) */
    int n_fed;          /* prompt tokens whose KV is written */
    sampler_params_t sp;
    uint64_t t_start;   /* PrefillTask arrival */
    float *feat;        /* (dim) speculation: hidden state of the last
                           locally prefilled token, NULL when none */
    sampler_prompt_lp_t *plp; /* the prompt's logprobs (local prefill with
                           sp.prompt_logprobs: a row per position), or
                           NULL */
    /* The KV links' arrival slot is the reservation's index. */
    Baton__ControlMessage *pending; /* KvReady waiting for its link's
                           last copies to the pool; owned */
    uint64_t pending_since;
    /* Prefix cache (issue 38): the local prompt's chain under its salt;
     * its full blocks are cached as they are computed. */
    kv_prefix_cursor_t pcur;
    int n_hit;          /* prompt tokens found cached (not computed) */
    /* Disaggregated hits: blocks[0..held) were cached here at the grant
     * (KvGrant.cached_blocks, bound to this epoch); the hand-off moves
     * only blocks[held..).  held_hash is their chain hash: the KvReady's
     * prompt must start with the tokens they hold. */
    int held;
    bt_blockhash_t held_hash;
} decode_resv_t;

typedef struct {
    int *blocks;        /* (n_blocks) */
    int n_blocks;
    uint64_t release_ns;
} decode_quarantine_t;

/* A local prompt with prompt logprobs takes a logits row per position:
 * one such prompt a step, at most this many tokens of it. */
#define DECODE_LP_ROWS 64

typedef struct decode_seq_s decode_seq_t;
struct decode_seq_s {
    uint64_t id;
    uint64_t epoch;     /* of the reservation it came from: every TokenOut
                           and TaskError carries it (the router relays
                           only its current attempt's) */
    int *tokens;        /* (cap) prompt, generated; last one not yet fed */
    int n_tokens;
    int cap;
    int n_cached;       /* tokens whose KV is in the pool */
    int *blocks;        /* (max_blocks) block table */
    int n_blocks;
    int max_blocks;
    int limit_blocks;   /* blocks promised to it at admission */
    bool borrows;       /* promised less than its growth: past its promise
                           it takes unpromised blocks (preempt_for_room) */
    sampler_t *sampler; /* NULL for the null model */
    /* Structured output (KvReady.grammar): the sampler is masked with
     * gmask, written from gstate when the step is built; gstate follows
     * every sampled token.  NULL: none. */
    grammar_t *grammar; /* owned */
    grammar_state_t gstate;
    uint64_t *gmask;    /* (grammar_mask_words), owned */
    stop_t *stop;
    tok_stream_t *stream; /* NULL without text */
    int n_generated;    /* generated tokens of the request so far */
    uint64_t wait_since; /* blocked on a KV block since (0 = not) */
    /* Speculative decoding: the engine sequence owns tokens, blocks and
     * sampler for spec_step (`blocks` above stays empty). */
    engine_seq_t *eseq;
    spec_seq_t *sseq;
    bool spec_started;  /* its first decode step was taken */
    /* Overlapped steps (step()): */
    bool pend;          /* its last token is sampled but not yet emitted
                           (dec->emit_q; the next step emits it while
                           the GPU runs) */
    bool in_step;       /* part of the step in flight */
    bool has_lp;        /* lp holds the pending token's logprobs */
    sampler_logprobs_t lp; /* taken when sampled: the sampler's own is
                           overwritten by the step that runs while the
                           token is emitted */
    bool finished;      /* ended when emitted during the step in flight:
                           removed after the step, its row discarded */
    /* Prefix cache: its blocks are cached as they fill (prompt and
     * generated), and left cached when it ends. */
    bool pcache;        /* its blocks are its own (moved, verified) */
    kv_prefix_cursor_t pcur;
    decode_seq_t *next;
};

struct decode_s {
    decode_config_t cfg;
    proto_batch_t outbox; /* control messages of this turn's phase (the
                           * messages handled, the step's TokenOuts), sent
                           * as one message (issue 42); zeroed = empty */
    char name[DECODE_NAME_MAX];
    engine_t *engine;   /* NULL with --null-model */
    kv_allocator_t *kv; /* engine's, or own with --null-model */
    kv_layout_t layout;
    int vocab;
    int max_context;
    int block_size;
    int n_layers;
    int max_seqs;
    int budget;
    void *ctx;
    void *sock;
    kv_link_receiver_t *links;  /* the KV links it receives on */
    bool kv_on_device;          /* backend KV in GPU memory (cuda) */
    int step_quantum;           /* backend_step_quantum (1: none) */
    double tps;                 /* local prefill tokens/s, moving average */
    decode_budget_t cost;       /* step cost model: prefill tokens a step
                                   may take under --tpot-target-ms */
    workerproc_prefix_t *prefix; /* the pool's prefix cache (NULL: off,
                                   or the null model) */
    volatile sig_atomic_t stop;
    bool draining;
    workerproc_link_t *link;    /* sessions, acks, the heartbeat thread */
    uint64_t last_hb_ns;        /* last urgent heartbeat */
    int last_hb_free;           /* free blocks the last urgent one said */
    bool hb_owed;               /* the count moved inside the 10 ms: an
                                   urgent beat is owed (the idle poll
                                   waits no longer than that) */
    uint64_t recv_frees;        /* reservations with receive room ended
                                   (Heartbeat.recv_frees) */
    uint64_t last_hb_recv_frees; /* ... as the last urgent beat said */
    bool recv_refused;          /* a grant was refused for receive room
                                   since: a change of recv_frees is owed
                                   to the router at once */
    uint64_t next_epoch;        /* random start: never reused, even by a
                                   restarted process */
    decode_resv_t *resv;        /* (max_reservations) */
    decode_quarantine_t *quar;  /* (max_reservations) */
    /* Bit i: resv[i].used, quar[i].blocks != NULL.  Every turn visits
     * the reservations several times; the bits let it visit only the
     * used ones, in slot order (at 1024 slots the full scans took ~20 us
     * a step; issue 36).  DECODE_RESV_FOREACH walks them. */
    uint64_t *resv_bits;        /* (DECODE_BIT_WORDS(max_reservations)) */
    uint64_t *quar_bits;        /* (DECODE_BIT_WORDS(max_reservations)) */
    int n_resv;                 /* reservations used */
    decode_seq_t *seqs;         /* running batch */
    int n_seqs;
    sampler_t **rsamp;          /* (max_seqs + DECODE_LP_ROWS) sampler of
                                   each logits row */
    int *rids;                  /* (max_seqs + DECODE_LP_ROWS) token
                                   sampled for each row */
    float *lp_logits;           /* (max_seqs + DECODE_LP_ROWS, vocab) rows
                                   of a local prompt's positions (prompt
                                   logprobs), made on first use */
    sampler_t **psamp;          /* (max_seqs) local prefill rows' samplers */
    decode_seq_t **emit_q;      /* (max_seqs) sampled, not yet emitted */
    int *emit_tok;              /* (max_seqs) their tokens */
    int n_emit;
    /* Each step's wall time by phase (issue 36; workerproc_metrics.h
     * says what each is): build runs from the turn's start, so the
     * messages handled before the step count; post runs to the turn's
     * end, so the prefix cache, expiry, outbox and beat after it count.
     * Observed at the turn's end (decode__step_split_close). */
    uint64_t turn_t0;           /* this turn's start (ns) */
    uint64_t step_ended_ns;     /* the step's ids came back (ns); 0: no
                                   plain step this turn */
    uint64_t busy_end_ns;       /* a step ended with streams running (ns;
                                   0: none since the last step began): the
                                   next step's start minus it is the
                                   loop's time between steps, which every
                                   stream's TPOT pays (decode_budget.h) */
    workerproc_step_split_t split; /* this turn's step (seconds) */
    workerproc_step_split_t split_sum; /* summed over n_timed steps */
    uint64_t n_timed;
    /* The loop's host work by kind (DECODE_HOST_*), for the stop line:
     * which message or pass the serial time per step goes to (1P+1D's
     * decode loop spent 0.65 ms a step there, aggregated 0.04). */
    uint64_t host_ns[DECODE_HOST_KINDS];
    uint64_t host_max_ns[DECODE_HOST_KINDS];
    uint64_t host_n[DECODE_HOST_KINDS];
    backend_seq_t *bseqs;       /* (max_seqs) */
    decode_seq_t **bmap;        /* (max_seqs) */
    decode_resv_t **pmap;       /* (max_seqs) local prefill rows */
    decode_arrival_t *porder;   /* (max_reservations) a step's local
                                   prompts, oldest first */
    uint64_t steps;
    uint64_t tokens_out;
    uint64_t grants_waited;     /* grants refused: the receive area or
                                   windows were full (the router asks
                                   again) */
    uint64_t preempted;         /* sequences past their promise given
                                   back to the router for want of blocks */
    uint64_t windows_mapped;    /* receive windows mapped for grants
                                 * (only the announced link maps one) */
    uint64_t windows_revoked;   /* UCX receive windows unmapped while
                                 * their writer may still hold the key */
    uint64_t writes_refused;    /* KV messages the UCX link refused, as
                                 * last reported to the metrics */
    uint64_t cap_rejected;      /* KvReady / local PrefillTask with a
                                   wrong capability, dropped (issue 42) */
    /* Speculative decoding (--spec-head) */
    spec_head_t *head;
    spec_t *spec;
    spec_seq_t **sseqs;         /* (max_seqs) this step's sequences */
    int *n_out;                 /* (max_seqs) */
    int *out;                   /* (max_seqs, spec_max_step_tokens) */
    float *hidden;              /* (max_seqs, dim) local prefill rows */
    float *feat;                /* (dim) a shipped feature, aligned */
    int dim;
    uint64_t first_drafted;     /* requests whose first step drafted */
    uint64_t first_plain;       /* ... decoded plainly */
};

// ---------------------------------------------------------------------------
// Slot bitmaps (resv_bits, quar_bits)

#define DECODE_BIT_WORDS(n) (((size_t)(n) + 63) / 64)

/* The first set bit of bits[0..n) at or after i, or -1. */
static inline int decode__bit_next(const uint64_t *bits, int n, int i)
{
    while (i < n) {
        uint64_t w = bits[i >> 6] >> (i & 63);
        if (w != 0) {
            i += __builtin_ctzll(w);
            return i < n ? i : -1;
        }
        i = (i | 63) + 1;
    }
    return -1;
}

/* The first clear bit of bits[0..n), or -1. */
static inline int decode__bit_first_clear(const uint64_t *bits, int n)
{
    for (int w = 0; w < (int)DECODE_BIT_WORDS(n); w++) {
        if (~bits[w] != 0) {
            int i = w * 64 + __builtin_ctzll(~bits[w]);
            return i < n ? i : -1;
        }
    }
    return -1;
}

static inline void decode__bit_put(uint64_t *bits, int i, bool on)
{
    if (on)
        bits[i >> 6] |= 1ull << (i & 63);
    else
        bits[i >> 6] &= ~(1ull << (i & 63));
}

/* for (each used reservation slot i, ascending): the body may free it. */
#define DECODE_RESV_FOREACH(dec, i)                                         \
    for (int i = decode__bit_next((dec)->resv_bits,                         \
                                  (dec)->cfg.max_reservations, 0);          \
         i >= 0; i = decode__bit_next((dec)->resv_bits,                     \
                                      (dec)->cfg.max_reservations, i + 1))

// ---------------------------------------------------------------------------
// decode.c: messages, sequences

void decode__send_outbox(decode_t *dec);
void decode__send_msg(decode_t *dec, Baton__ControlMessage *msg);
void decode__send_task_error(decode_t *dec, uint64_t id, uint64_t epoch,
                             Baton__ErrorCode code, const char *text);
void decode__fill_layout(const decode_t *dec, Baton__KvLayout *l);
int decode__available_blocks(const decode_t *dec);
void decode__seq_destroy(decode_t *dec, decode_seq_t *s);
void decode__seq_remove(decode_t *dec, decode_seq_t *s);
void decode__seq_fail(decode_t *dec, decode_seq_t *s, Baton__ErrorCode code,
                      const char *why);
void decode__seq_no_room(decode_t *dec, decode_seq_t *s, uint64_t now);
void decode__seq_cache_blocks(decode_t *dec, decode_seq_t *s);
void decode__step_split_observe(decode_t *dec);

// ---------------------------------------------------------------------------
// decode_resv.c: the reservation table, grants, expiry and quarantine

decode_resv_t *decode__resv_find(decode_t *dec, uint64_t id);
void decode__resv_free(decode_t *dec, decode_resv_t *r, bool safe);
void decode__cap_rejected(decode_t *dec);
bool decode__capability_ok(const decode_resv_t *r,
                           const ProtobufCBinaryData *cap, bool has);
bt_blockhash_t decode__held_chain(const decode_t *dec, bt_blockhash_t root,
                                  const int *tokens, int n_blocks);
void decode__on_reserve(decode_t *dec, const Baton__KvReserve *m);
void decode__on_release(decode_t *dec, const Baton__KvRelease *m);
void decode__resv_expire(decode_t *dec);

// ---------------------------------------------------------------------------
// decode_ready.c: KvReady, the hand-off that starts a sequence

bool decode__on_ready(decode_t *dec, Baton__ControlMessage *msg);
void decode__arrivals_pending(decode_t *dec);
bool decode__has_arrivals_pending(const decode_t *dec);

// ---------------------------------------------------------------------------
// decode_local.c: aggregated mode's local prefill

void decode__send_prefill_failure(decode_t *dec, uint64_t id, uint64_t epoch,
                                  Baton__ErrorCode code, const char *text);
void decode__on_prefill_task(decode_t *dec, const Baton__PrefillTask *m);
bool decode__has_local_prefill(const decode_t *dec);
sampler_t *decode__local_prefill_sampler(decode_t *dec, decode_resv_t *r);
void decode__local_prefill_done(decode_t *dec, decode_resv_t *r, int first,
                                const sampler_logprobs_t *lp);

// ---------------------------------------------------------------------------
// decode_emit.c: sampled tokens to TokenOuts

bool decode__seq_emit_n(decode_t *dec, decode_seq_t *s, const int *toks,
                        int n);
void decode__emit_pending(decode_t *dec);

// ---------------------------------------------------------------------------
// decode_spec.c: speculative decoding (--spec-head)

bt_status_t decode__spec_setup(decode_t *dec);
void decode__spec_teardown(decode_t *dec);
void decode__spec_import_feature(decode_t *dec, decode_seq_t *s,
                                 const decode_resv_t *r,
                                 const Baton__KvReady *m);
void decode__step_spec(decode_t *dec);

#endif /* BT_DECODE_DECODE_INT_H */
