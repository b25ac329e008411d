/*
 * workerproc_link.h - a worker's link to its router: registration
 * sessions, the router's acknowledgements, and heartbeats sent from a
 * thread of their own (issue 35).
 *
 * Sessions.  Every Register a worker sends starts a new session: before
 * sending it the role drops every sequence, task and reservation it holds
 * (the router re-queues what it had given the old registration), and it
 * takes no work until the RegisterAck that echoes the session.  So a
 * worker that the router dropped (paused, partitioned) and that comes
 * back can never stream tokens of an attempt the router gave away.
 *
 * The router answers every heartbeat.  A worker that hears no answer for
 * a while (the router died, restarted, or lost track of it) registers
 * again, dropping what it holds; one refused (its name is live in
 * another process) retries for a while and then stops with the reason.
 *
 * Liveness off the compute thread.  Heartbeats come from a thread of the
 * link, every heartbeat interval, whatever the length of the main loop's
 * turn (a 2-second prefill step does not look like death).  They carry
 * a progress counter, the age of the turn running now and the longest
 * recent turn, so the router can tell a stuck engine from a slow one.
 * The ZeroMQ socket is shared by the two threads under one lock; every
 * workerproc_* function that touches a socket takes it.
 */
#ifndef BT_WORKERPROC_WORKERPROC_LINK_H
#define BT_WORKERPROC_WORKERPROC_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"
#include "proto_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct workerproc_link_s workerproc_link_t;

/* What a role reports in its heartbeats (published by the main thread,
 * sent by the link's thread). */
typedef struct {
    uint32_t running;            /* sequences / prompts started */
    uint32_t waiting;            /* held, not started yet (prefill: no
                                    chunk fed; decode: reservations whose
                                    KV has not arrived); the heartbeat
                                    says running + waiting ("held") */
    uint64_t outstanding;        /* tokens owed */
    bool draining;
    bool has_kv;                 /* the KV counts below are meaningful */
    uint32_t free_kv;
    uint32_t total_kv;
    bool has_reserved;
    uint32_t reserved;           /* decode: granted, KV not yet arrived */
    bool has_recv_frees;         /* decode with remote links */
    uint64_t recv_frees;         /* Heartbeat.recv_frees */
    bool has_spec;               /* decode --spec-head */
    uint64_t spec_verify_steps;
    uint64_t spec_verify_tokens;
    double spec_accept_length;
    double prefill_tokens_per_s; /* measured prefill rate, 0 unknown */
    /* Prefix cache (issue 38; kv_prefix_stats_t, cumulative since
     * start): shown by /metrics, the hit rate and cached blocks also in
     * the heartbeat (baton status). */
    bool has_prefix;             /* the worker keeps a prefix cache */
    uint64_t prefix_lookups;     /* prompts looked up */
    uint64_t prefix_lookup_tokens; /* their prompt tokens */
    uint64_t prefix_hit_tokens;  /* of them, found cached */
    uint64_t prefix_lookup_blocks; /* full blocks looked up */
    uint64_t prefix_hit_blocks;  /* of them, found cached */
    uint64_t prefix_inserted;    /* blocks that entered the cache */
    uint64_t prefix_evictions;   /* blocks evicted to make room */
    uint32_t prefix_cached_blocks; /* blocks cached now */
    uint32_t prefix_cached_unused; /* of them, no sequence uses */
    uint32_t prefix_host_blocks; /* host tier slots (0: no tier) */
    uint32_t prefix_host_cached; /* blocks cached in the host tier */
    uint64_t prefix_host_saves;  /* pool evictions kept in the host */
    uint64_t prefix_host_loads;  /* host blocks loaded back on a hit */
    uint64_t prefix_host_evictions; /* host blocks dropped for good */
} workerproc_beat_t;

/* What the role must do after workerproc_link_check(). */
typedef enum {
    WORKERPROC_LINK_OK = 0,      /* nothing */
    WORKERPROC_LINK_REGISTER,    /* drop everything held, send a Register */
    WORKERPROC_LINK_REFUSED,     /* the router kept refusing: stop */
} workerproc_link_action_t;

/* Starts the link on the control socket `sock` (workerproc_connect) for
 * worker `name` (copied) and its heartbeat thread.  The socket must
 * outlive the link. */
bt_status_t workerproc_link_create(void *sock, const char *name,
                                   workerproc_link_t **link_p);
/* Stops the heartbeat thread and frees the link. */
void workerproc_link_destroy(workerproc_link_t **link_p);

/* Starts a new session: the caller has dropped everything it held and
 * sends a Register carrying the returned session number. */
uint64_t workerproc_link_begin_session(workerproc_link_t *link);

/* True when the router acknowledged the current session (work may be
 * taken). */
bool workerproc_link_registered(const workerproc_link_t *link);

/* True when the router's RegisterAck said it takes ControlBatch (issue
 * 42): the worker may coalesce its messages (workerproc_send_batch). */
bool workerproc_link_batches(const workerproc_link_t *link);

/* Applies a RegisterAck or HeartbeatAck (other kinds: false).  Returns
 * true when it was one of them. */
bool workerproc_link_on_ack(workerproc_link_t *link,
                            const Baton__ControlMessage *msg);

/* Called by the main loop after handling messages: says whether to
 * register (first start, the router forgot this worker or stopped
 * answering) or to give up (refused for too long; the reason is in
 * workerproc_link_refusal()). */
workerproc_link_action_t workerproc_link_check(workerproc_link_t *link);
const char *workerproc_link_refusal(const workerproc_link_t *link);

/* Publishes what the next heartbeats say; `now` sends one at once (a
 * change the router should see soon). */
void workerproc_link_publish(workerproc_link_t *link,
                             const workerproc_beat_t *beat, bool now);

/* Brackets one turn of the main loop (messages, a step, bookkeeping;
 * not the idle wait): heartbeats report the running turn's age and the
 * longest recent turn, and count completed turns. */
void workerproc_link_turn_begin(workerproc_link_t *link);
void workerproc_link_turn_end(workerproc_link_t *link);

/* What a health check or a scrape needs, read from any thread. */
typedef struct {
    bool registered;   /* the current session was acknowledged */
    uint64_t progress; /* turns completed */
    uint32_t busy_ms;  /* age of the running turn (0: idle) */
    uint32_t step_ms;  /* longest recent turn */
    workerproc_beat_t beat; /* the last published beat (zero before) */
} workerproc_link_health_t;

/* Fills *h (thread-safe: the metrics thread calls it). */
void workerproc_link_health(workerproc_link_t *link,
                            workerproc_link_health_t *h);

/* The lock every use of a worker's control socket holds (the main
 * thread's sends, receives and polls, and the heartbeat thread). */
void workerproc_sock_lock(void);
void workerproc_sock_unlock(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_LINK_H */
