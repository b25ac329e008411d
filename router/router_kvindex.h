/*
 * router_kvindex.h - the router's view of which worker holds which KV
 * prefix (issue 38), and the policy that routes by it.
 *
 * Workers publish their prefix caches' changes as numbered event batches
 * (proto/kv_events.proto, docs/KV_EVENTS.md).  The index applies them per
 * worker slot into a set of block hashes and answers "how many leading
 * blocks of this prompt's hash chain does worker w hold?".  It trusts a
 * stream only while it is complete: a missing sequence number, or a
 * stream of an instance it never saw start, drops what the slot held and
 * marks it as needing a resync until a snapshot arrives.  A stale view is
 * harmless (the worker verifies every hit itself); a missing one only
 * routes less well.
 *
 * Not thread-safe: the router's loop owns it.
 */
#ifndef BT_ROUTER_ROUTER_KVINDEX_H
#define BT_ROUTER_ROUTER_KVINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_blockhash.h"
#include "bt_status.h"
#include "kv_events.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int max_workers;           /* worker slots, 0..max_workers-1 */
    int max_blocks_per_worker; /* a worker claiming more is dropped and
                                  asked to resync (bounds our memory) */
    int max_events;            /* events in one batch, more is malformed */
} router_kvindex_config_t;

/* Defaults: 256 workers, 4M blocks each, 1M events per batch. */
void router_kvindex_config_init(router_kvindex_config_t *cfg);

typedef struct router_kvindex_s router_kvindex_t;

bt_status_t router_kvindex_create(const router_kvindex_config_t *cfg,
                                  router_kvindex_t **idx_p);
void router_kvindex_destroy(router_kvindex_t **idx_p);

/* Slot w belongs to a new registration: everything it held is forgotten
 * and its stream starts over (a batch of any instance is then judged as
 * the first of that instance). */
void router_kvindex_reset(router_kvindex_t *idx, int w);

/* One event, as the index takes it (the fields of a KvEvent). */
typedef struct {
    int type;               /* KV_EVENT_STORED / _EVICTED / _CLEARED */
    uint64_t parent;        /* STORED: parent of hashes[0] */
    int n_hashes;
    const uint64_t *hashes; /* (n_hashes) wire hashes, never 0 */
} router_kvindex_event_t;

typedef enum {
    ROUTER_KVINDEX_APPLIED = 0, /* the batch (or its new part) applied */
    ROUTER_KVINDEX_STALE,       /* already applied before: ignored */
    ROUTER_KVINDEX_RESYNC,      /* events were lost (gap, unknown instance,
                                   over the block cap, or still waiting
                                   for a snapshot): the slot is empty and
                                   the worker must be asked to resync */
} router_kvindex_result_t;

/* Applies one batch from the worker in slot w (see the file comment and
 * docs/KV_EVENTS.md for the ordering rules).  BT_ERR_FORMAT for a
 * malformed batch (sequence 0, unknown event type, a 0 hash, too many
 * events): nothing applied, and the slot then needs a resync. */
bt_status_t router_kvindex_apply(router_kvindex_t *idx, int w,
                                 uint64_t instance, uint64_t seq_first,
                                 bool resync, int n_events,
                                 const router_kvindex_event_t *events,
                                 router_kvindex_result_t *result_p);

/* The same for an unpacked KvEvents message; also records the worker's
 * pool identity and block size when the message carries them. */
bt_status_t router_kvindex_apply_msg(router_kvindex_t *idx, int w,
                                     const Baton__KvEvents *msg,
                                     router_kvindex_result_t *result_p);

/* True while slot w waits for a snapshot. */
bool router_kvindex_needs_resync(const router_kvindex_t *idx, int w);

/* The instance slot w's stream comes from (0: none yet) and the sequence
 * number expected next: what a KvResyncRequest carries. */
uint64_t router_kvindex_instance(const router_kvindex_t *idx, int w);
uint64_t router_kvindex_seq_next(const router_kvindex_t *idx, int w);

/* Blocks slot w is known to hold. */
int router_kvindex_blocks(const router_kvindex_t *idx, int w);

/* True when slot w published its pool identity and block size. */
bool router_kvindex_identity(const router_kvindex_t *idx, int w,
                             bt_blockhash_t *identity_p,
                             int *block_size_p);

/* The number of leading hashes of chain[0..n) slot w holds. */
int router_kvindex_overlap(const router_kvindex_t *idx, int w,
                           const uint64_t *chain, int n);

// ----------------------------------------------------------------------------
// the "kv-aware" policy (router_policy_kv.c)

typedef struct {
    double w_overlap; /* score per prompt token already cached */
    double w_load;    /* score lost per unit of the candidate's load */
} router_kv_weights_t;

/* Defaults: 1 and 1 (a cached token is worth one unit of load). */
void router_kv_weights_init(router_kv_weights_t *w);

/* Parses "overlap=<x>,load=<y>" (either part may be left out; values
 * finite and >= 0).  BT_ERR_INVALID_ARG, *w untouched, for anything
 * else. */
bt_status_t router_kv_weights_parse(const char *spec,
                                    router_kv_weights_t *w);

typedef struct {
    int worker;  /* index slot */
    double load; /* the caller's load measure (outstanding tokens, ...) */
} router_kv_candidate_t;

/* Picks among cands[0..n) the one maximizing
 *     w_overlap * overlap_tokens - w_load * load
 * where overlap_tokens = block_size * the leading blocks of chain[0..
 * n_chain) the candidate holds.  Ties go to the lower load, then the
 * earlier candidate (so w_overlap 0 is least-loaded).  Returns the
 * position in cands, -1 when n is 0; *overlap_p (may be NULL) gets the
 * winner's overlap in blocks. */
int router_kv_pick(const router_kvindex_t *idx,
                   const router_kv_candidate_t *cands, int n,
                   const uint64_t *chain, int n_chain, int block_size,
                   const router_kv_weights_t *w, int *overlap_p);

/* A prompt's block-hash chain for one pool identity and block size, kept
 * with its request: a request that waits in the queue is hashed once,
 * not on every dispatch attempt (a 64K-token prompt costs ~1 ms).
 * Zeroed = empty; router_kv_chain_cleanup frees it. */
typedef struct {
    uint64_t *hashes;      /* (cap) */
    int cap;
    int n;                 /* hashes of the computed chain */
    bt_blockhash_t id;     /* what it was computed for */
    int block_size;        /* 0: nothing computed yet */
    int n_tokens;
} router_kv_chain_t;

void router_kv_chain_cleanup(router_kv_chain_t *chain);

/* The same from a prompt: computes the chain of tokens[0..n_tokens)
 * under `salt` from each candidate's published identity and block size
 * (candidates that published none count as holding nothing).  `memo`
 * (NULL: none) keeps the chain between calls for the same tokens and
 * salt. */
bt_status_t router_kv_pick_tokens(const router_kvindex_t *idx,
                                  const router_kv_candidate_t *cands, int n,
                                  const void *salt, size_t salt_len,
                                  const int *tokens, int n_tokens,
                                  router_kv_chain_t *memo,
                                  const router_kv_weights_t *w,
                                  int *pick_p, int *overlap_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_ROUTER_ROUTER_KVINDEX_H */
