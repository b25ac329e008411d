/*
 * decode.h - baton-decode: owns a paged KV pool, grants reservations to
 * the router, receives prompts' KV from prefill workers, and runs the
 * continuous-batching loop (requests join and leave the running batch at
 * every step, under a per-step token budget), streaming tokens back.
 *
 * Reservations carry an epoch that is never reused; KV (UCX arrival or
 * inline bytes) with another epoch is refused, and a reservation whose KV
 * never arrives within --kv-timeout-ms is freed.  UCX KV lands in a
 * receive window per reservation, unmapped when it ends, so a late remote
 * write cannot reach blocks granted to someone else; where a writer holds
 * a key to the pool itself (--kv-direct-writes, CUDA IPC, staged) the
 * freed blocks stay quarantined for a while instead.
 *
 * Aggregated mode (--role both): the router may send this worker the
 * PrefillTask of a reservation it granted; the prompt is then computed
 * here, chunk by chunk, in the same forward as the running decode tokens
 * (decode tokens first, prompt chunks fill the rest of the step's token
 * budget), its KV written straight into the reserved blocks; the first
 * token goes back in PrefillDone and the KvReady that follows finds the
 * KV already in place (transport LOCAL).
 *
 * Speculative decoding (--spec-head): every step runs spec_step over the
 * running batch: each sequence may get several tokens (accepted draft +
 * the target's own), streamed in one TokenOut in order; stop ids, stop
 * strings and max_tokens are checked token by token so nothing after a
 * stop goes out.  A draft tree never takes KV slots beyond the
 * request's admission promise (prompt + max tokens).  When KvReady
 * carries the prompt's last hidden state (spec_feature, shipped by the
 * prefill worker) the request drafts from its first step.  Greedy
 * output equals plain decoding; sampled output keeps the target
 * distribution, but a seeded request draws a different random stream
 * than plain decoding (rejection sampling draws more uniforms).
 *
 * With the CUDA backend the KV pool is in device memory: it is exported
 * over CUDA IPC (kv_transport_cuda_ipc.h) instead of UCX, and inline KV
 * is copied to the device.  For prefill workers on other hosts it also
 * runs a staged UCX receiver (kv_transport_stage.h): a grant the router
 * marks KvReserve.kv_stage reserves receive-area blocks too and sends
 * their ids; each arrived layer is copied to the device blocks, and the
 * request joins the batch on KvReady only once every layer is there
 * (kv_stage_recv_poll, never blocking the loop: the KvReady waits).
 * --kv-stage-host runs the same receiver over the CPU pool with host
 * memcpys standing in for the CUDA copies (tests, diagnostics).
 */
#ifndef BT_DECODE_DECODE_H
#define BT_DECODE_DECODE_H

#include <signal.h>
#include <stdbool.h>

#include "bt_status.h"
#include "engine.h"
#include "spec/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a request without max_tokens is promised past its prompt, by
 * default: a long answer.  Promising the whole context instead (what
 * max_tokens asks, when given, and gets) would let a 128K-context
 * model's pool admit a handful of chat requests. */
#define DECODE_UNBOUNDED_PROMISE 2048

typedef struct {
    const char *router;      /* control endpoint of the router */
    const char *name;        /* unique worker name (default decode-PID) */
    engine_config_t engine;  /* model, tokenizer, --kv-blocks, --block-size */
    bool null_model;         /* no model: deterministic instant tokens */
    int step_tokens;         /* token budget per step (0 = max_batch_tokens) */
    double tpot_target_ms;   /* --role both: prompt tokens per step are
                                bounded so that steps with running streams
                                stay under this (learned step cost,
                                decode_budget.h); 0 = no bound */
    int kv_timeout_ms;       /* reservation without KV is freed (30000) */
    int quarantine_ms;       /* UCX: blocks of an aborted reservation (2000) */
    int max_reservations;    /* concurrent reservations = UCX slots (1024) */
    bool use_ucx;            /* register the pool with UCX */
    bool ucx_shm_pool;       /* KV arrays from kv_ucx_mem_alloc (shared
                              * memory: one-sided puts, no decode CPU);
                              * off: malloc, copied by UCX's software RMA;
                              * only with kv_direct_writes */
    bool kv_direct_writes;   /* UCX: prefill workers write the pool itself
                              * (weaker: a stale writer can reach reused
                              * blocks); default off: a receive window per
                              * reservation, copied in (SECURITY.md 5) */
    int step_delay_ms;       /* tests: sleep after each step (slow streams) */
    bool kv_overcommit;      /* --kv-overcommit: admit on the prompt's
                              * blocks (and a watermark) instead of prompt
                              * + max tokens; a step short of blocks gives
                              * the latest-arrived streams back to the router,
                              * which recomputes them later (off) */
    int kv_unbounded_promise; /* --kv-unbounded-promise: tokens of growth
                              * past its prompt promised at admission to a
                              * request whose max tokens reach past the
                              * context (none given: chat's default); it
                              * grows on from unpromised blocks and is
                              * given back when they run out (-1: all of
                              * it; default DECODE_UNBOUNDED_PROMISE) */
    bool can_prefill;        /* --role both: also prefill prompts locally
                              * (aggregated mode), chunked inside the
                              * step's token budget, written in place into
                              * the reservation's blocks */
    int chunk_tokens;        /* longest local prefill chunk per step (512) */
    bool prefix_cache;       /* --prefix-cache on|off (on): keep computed
                              * full KV blocks for later prompts with the
                              * same prefix and salt (issue 38;
                              * workerproc_prefix.h) */
    bool use_cuda_ipc;       /* export a device KV pool over CUDA IPC */
    bool kv_stage;           /* device pool: staged UCX receiver (on) */
    bool kv_stage_direct;    /* ... registering the device pool itself
                              * when UCX moves CUDA memory (on) */
    int kv_stage_blocks;     /* receive-area blocks (0: 4 longest
                              * prompts' worth, at most the pool's) */
    bool kv_stage_host;      /* tests/diagnostics: the staged receiver
                              * over the CPU pool, host memcpys standing
                              * in for the CUDA copies */
    /* Speculative decoding (EAGLE; cpu and cuda): the running batch is
     * stepped by spec_step (worker/spec/spec.h).  NULL: plain decoding. */
    const char *spec_head;   /* draft head .safetensors */
    spec_config_t spec;      /* depth, top-k, tokens; adaptive (auto)
                              * or the configured tree (fixed) */
    const char *host_id;     /* host identity sent to the router (NULL:
                              * hostname/boot-id); see prefill.h */
    int warmup;              /* WORKERPROC_OPTS_WARMUP_*: engine_warmup()
                              * before registering (auto: cuda only) */
    /* Metrics (issue 40; workerproc_metrics.h): */
    int metrics_port;        /* --metrics-port (-1: none, 0: any free) */
    const char *metrics_host;/* address it binds ("127.0.0.1") */
    struct workerproc_metrics_s *metrics; /* the listener the main
                              * started (not owned; NULL: none): the
                              * role publishes its state and counts steps
                              * into it, and attaches its router link */
} decode_config_t;

void decode_config_init(decode_config_t *cfg);

typedef struct decode_s decode_t;

bt_status_t decode_create(const decode_config_t *cfg, decode_t **dec_p);
void decode_destroy(decode_t **dec_p);

/* Serves until decode_stop(): then drains and returns. */
bt_status_t decode_run(decode_t *dec);
void decode_stop(decode_t *dec); /* async-signal-safe */

#ifdef __cplusplus
}
#endif
#endif /* BT_DECODE_DECODE_H */
