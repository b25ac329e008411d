/*
 * workerproc_metrics.h - a worker's Prometheus metrics and health
 * endpoint (--metrics-port; issue 40): GET /metrics (text format 0.0.4)
 * and GET /health.
 *
 * Off the compute thread.  The listener runs on a thread of its own and
 * renders from the beat the main loop publishes to its link once a turn
 * (workerproc_link_health(): the same snapshot the heartbeats send)
 * plus counters and histograms the main loop bumps after each step; each
 * takes one short mutex, never held while the engine runs.  A scrape therefore never stalls a step, and is
 * answered while a 2-second step runs.
 *
 * /health answers 200 "ok" while the worker is registered with its
 * router (its current session acknowledged) and its engine turns
 * progress; 503 with the reason otherwise: still loading the model, not
 * registered (the router endpoint it waits on is named), a turn running
 * longer than the stall limit (BATON_HEALTH_STALL_MS, default 10000, or
 * 20 of the longest recent turns when longer, as the router judges), or
 * stopping.
 *
 * Every function is NULL-safe in the metrics object, so a role without
 * --metrics-port calls the hooks unconditionally.
 */
#ifndef BT_WORKERPROC_WORKERPROC_METRICS_H
#define BT_WORKERPROC_WORKERPROC_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"
#include "workerproc_link.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct workerproc_metrics_s workerproc_metrics_t;

/* Where and what to serve. */
typedef struct {
    const char *host;    /* address to bind ("127.0.0.1") */
    int port;            /* 0: any free port */
    const char *role;    /* "prefill", "decode", "both" (label) */
    const char *router;  /* the router endpoint (for /health's reason) */
} workerproc_metrics_config_t;

/* Starts the listener and its thread; the strings are copied.  Errors
 * (a port in use) are logged and returned. */
bt_status_t workerproc_metrics_create(const workerproc_metrics_config_t *cfg,
                                      workerproc_metrics_t **m_p);
/* Stops the thread, closes the listener, frees.  NULL-safe. */
void workerproc_metrics_destroy(workerproc_metrics_t **m_p);
/* The bound port (-1 for NULL). */
int workerproc_metrics_port(const workerproc_metrics_t *m);

/* Attaches the worker's link (health reads its registration and turn
 * ages) and its name (label); `link` NULL detaches, after which /health
 * says "stopping".  Call with NULL before destroying the link: it waits
 * for a scrape that reads it.  Main thread. */
void workerproc_metrics_attach(workerproc_metrics_t *m,
                               workerproc_link_t *link, const char *name);

/* Counts one engine step: `batch` sequences in it, `seconds` of wall
 * time, prompt tokens prefilled and tokens generated in it. */
void workerproc_metrics_step(workerproc_metrics_t *m, int batch,
                             double seconds, uint64_t prefill_tokens,
                             uint64_t generated_tokens);

/* One decode step's wall time by phase (seconds; issue 36).  build and
 * post are the serial host work every device step waits for; emit runs
 * while the device works. */
typedef struct {
    double build;   /* host, from the turn's start (messages, scheduling,
                       the batch) until the forward is enqueued */
    double enqueue; /* enqueuing the forward (cpu: the forward itself) */
    double emit;    /* host, while the device runs: the previous step's
                       tokens out */
    double wait;    /* waiting for the device's ids */
    double post;    /* host, from then to the turn's end (bookkeeping,
                       prefix cache, expiry, messages, the beat) */
} workerproc_step_split_t;

/* Counts one decode step's split: build + post into the histogram
 * baton_worker_step_host_seconds, each phase into
 * baton_worker_step_phase_seconds_total.  Decode roles call it once for
 * every step they pass to workerproc_metrics_step(). */
void workerproc_metrics_step_split(workerproc_metrics_t *m,
                                   const workerproc_step_split_t *split);

/* Counts one KV hand-off sent: `bytes` of KV, `seconds` spent moving it
 * (the puts and the commit; inline: packing). */
void workerproc_metrics_handoff(workerproc_metrics_t *m, uint64_t bytes,
                                double seconds);

/* Counts one KV commit dropped because the capability it presented is
 * not its live reservation's (issue 42). */
void workerproc_metrics_kv_rejected(workerproc_metrics_t *m);

/* Counts one KV grant refused because the hand-offs in flight fill the
 * receive room (the staged area, the CUDA IPC windows' budget): the
 * router asks again.  NULL-safe. */
void workerproc_metrics_kv_grant_waited(workerproc_metrics_t *m);

/* Counts one receive window (UCX or staged) mapped for a grant: only
 * for the link the router announced (issue 36).  NULL-safe. */
void workerproc_metrics_kv_window_mapped(workerproc_metrics_t *m);

/* Counts one UCX receive window unmapped while its writer may still hold
 * the key (issue 42).  NULL-safe. */
void workerproc_metrics_kv_window_revoked(workerproc_metrics_t *m);

/* Counts `n` KV writes the UCX link refused: messages naming no live
 * receive window of their slot, epoch and token, or out of its bounds
 * (a stale or forged writer; docs/SECURITY.md 5).  NULL-safe. */
void workerproc_metrics_kv_writes_refused(workerproc_metrics_t *m,
                                          uint64_t n);

/* One hand-off's blocks (issue 38): `moved` put (sent: the prefill side)
 * or arrived (the decode side), `held` skipped because the decode
 * worker's prefix cache held them.  NULL-safe. */
void workerproc_metrics_kv_blocks(workerproc_metrics_t *m, bool sent,
                                  uint64_t moved, uint64_t held);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_METRICS_H */
