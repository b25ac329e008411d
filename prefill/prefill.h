/*
 * prefill.h - baton-prefill: computes prompts and hands their KV to the
 * decode worker the router reserved blocks on.
 *
 * Loop: receive PrefillTask messages from the router, batch the waiting
 * prompts into one forward (long ones in --chunk-tokens chunks), and as
 * each layer of a prompt's final chunk is written, ship that layer's KV
 * to the decode worker (UCX puts into its reserved blocks while later
 * layers compute; or packed inline into the reply when UCX is not in
 * use), sample the first token and send PrefillDone.  --null-model skips
 * the model (instant, deterministic tokens) for overhead benchmarks.
 *
 * The router names the transport per task (PrefillTask.transport, chosen
 * per prefill/decode pair): UCX / UCX_SHM puts, CUDA_IPC device-to-device
 * copies into the decode worker's mapped device pool
 * (kv_transport_cuda_ipc.h; with the CUDA backend), UCX_STAGE for a
 * decode worker's device pool on another host (kv_transport_stage.h:
 * each layer copied to pinned staging buffers and put into the decode
 * worker's receive area while later layers compute; PrefillDone only
 * once every layer's commit landed, else the task fails and the router
 * retries it elsewhere), or INLINE bytes.  --kv-stage-host runs the
 * staged path over the CPU pool with host memcpys standing in for the
 * CUDA copies (tests, diagnostics).
 */
#ifndef BT_PREFILL_PREFILL_H
#define BT_PREFILL_PREFILL_H

#include <signal.h>
#include <stdbool.h>

#include "bt_status.h"
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A prefill worker's pool sized from memory holds at most this many
 * full contexts (backend_config_t.kv_auto_contexts). */
#define PREFILL_KV_AUTO_CONTEXTS 8

typedef struct {
    const char *router;      /* control endpoint of the router */
    const char *name;        /* unique worker name (default prefill-PID) */
    engine_config_t engine;  /* model, tokenizer, backend sizes */
    bool null_model;         /* no model: instant deterministic tokens */
    int chunk_tokens;        /* longest prompt chunk per forward (512) */
    bool use_ucx;            /* push KV over UCX when the decode offers it */
    bool ucx_peer_errors;    /* UCX peer error handling on the endpoints:
                              * a dead decode fails commits at once, but
                              * UCX 1.13 then refuses shared memory (tcp,
                              * ~10x slower); off (default): shared memory,
                              * and commit_timeout_ms ends a dead one */
    int commit_timeout_ms;   /* a KV hand-off not complete by then fails
                              * (the router retries it elsewhere) (5000) */
    int step_delay_ms;       /* tests: sleep before each batch */
    bool use_cuda_ipc;       /* device KV: copy it into decode pools over
                              * CUDA IPC when the router says so */
    bool kv_stage;           /* device KV: staged UCX sender (on); its
                              * UCX endpoints use peer error handling (a
                              * dead decode worker fails the puts) */
    bool kv_stage_direct;    /* ... putting from device memory when UCX
                              * moves CUDA memory itself (on) */
    int kv_stage_blocks;     /* blocks per staging buffer (0: 2048
                              * tokens' worth) */
    bool kv_stage_host;      /* tests/diagnostics: the staged sender over
                              * the CPU pool, host memcpys standing in for
                              * the CUDA copies */
    bool spec_features;      /* speculation-aware hand-off: send the last
                              * prompt token's hidden state (dim floats)
                              * in PrefillDone.spec_feature, so an EAGLE
                              * decode worker drafts from its first step */
    const char *host_id;     /* host identity sent to the router (NULL:
                              * hostname/boot-id); workers with equal ids
                              * are paired over CUDA IPC / UCX shared
                              * memory, so they must really share them */
    int warmup;              /* WORKERPROC_OPTS_WARMUP_*: engine_warmup()
                              * before registering (auto: cuda only) */
    bool prefix_cache;       /* --prefix-cache on|off (on): keep computed
                              * prompt blocks and prefill only the
                              * uncached suffix of later prompts */
    /* Metrics (issue 40; workerproc_metrics.h): */
    int metrics_port;        /* --metrics-port (-1: none, 0: any free) */
    const char *metrics_host;/* address it binds ("127.0.0.1") */
    struct workerproc_metrics_s *metrics; /* the listener the main
                              * started (not owned; NULL: none): the
                              * role publishes its state and counts steps
                              * into it, and attaches its router link */
} prefill_config_t;

void prefill_config_init(prefill_config_t *cfg);

typedef struct prefill_s prefill_t;

bt_status_t prefill_create(const prefill_config_t *cfg, prefill_t **pf_p);
void prefill_destroy(prefill_t **pf_p);

/* Serves until prefill_stop(): then drains (tells the router, finishes
 * its tasks) and returns. */
bt_status_t prefill_run(prefill_t *pf);
void prefill_stop(prefill_t *pf); /* async-signal-safe */

#ifdef __cplusplus
}
#endif
#endif /* BT_PREFILL_PREFILL_H */
