/*
 * workerproc_prefix.h - a worker's prefix cache as the worker processes
 * wire it (issue 38): the kv_prefix_t of its engine's pool, keyed by the
 * model identity (weights file, compute precision, KV dtype, block size)
 * and each request's cache salt; matching a prompt into a reservation's
 * block table; inserting computed blocks; publishing the cache's events
 * to the router as ControlMessage.kv_events; the statistics the
 * heartbeat and /metrics show.
 *
 * Why here and not in decode/: every KV pool owner (decode workers,
 * aggregated workers, later prefill workers for their own compute) does
 * the same calls, and the wire conversion needs proto/, which worker/
 * does not link.  Not thread-safe: the worker's main thread owns it.
 */
#ifndef BT_WORKERPROC_WORKERPROC_PREFIX_H
#define BT_WORKERPROC_WORKERPROC_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "kv/kv_prefix.h"
#include "proto_msg.h"
#include "workerproc_link.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct workerproc_prefix_s workerproc_prefix_t;

/* Creates the cache of `engine`'s pool (the engine must outlive it) and
 * logs its identity.  `ecfg` is the configuration the engine was created
 * with (its model path and precision name the KV). */
bt_status_t workerproc_prefix_create(engine_t *engine,
                                     const engine_config_t *ecfg,
                                     workerproc_prefix_t **prefix_p);

/* Forgets the cache (blocks in use stay with their sequences: call it
 * after they are gone, before the engine); logs "leak:" (WARN) when any
 * block of the pool is still held then. */
void workerproc_prefix_destroy(workerproc_prefix_t **prefix_p);

/* The chain root of a request's cache salt (absent / empty: the default
 * tenant's); salts longer than PROTO_MAX_CACHE_SALT are cut there, as
 * the router does. */
bt_blockhash_t workerproc_prefix_root(const workerproc_prefix_t *prefix,
                                      bool has_salt,
                                      const ProtobufCBinaryData *salt);

/* Matches the leading full blocks of tokens[0..n_tokens) (never the block
 * of the last token: it must be computed to sample from) and puts the
 * cached blocks in place of blocks[0..hit) of a reservation's table of
 * n_blocks plain blocks, releasing the ones replaced.  Returns the number
 * of prompt tokens whose KV is there now (hit * block size, 0 on a
 * miss). */
int workerproc_prefix_adopt(workerproc_prefix_t *prefix, bt_blockhash_t root,
                            const int *tokens, int n_tokens, int *blocks,
                            int n_blocks);

/* Caches the blocks of a sequence that became full since `cursor`
 * (kv_prefix_insert_more): tokens[0..n_computed) have their KV in
 * blocks[].  Returns the blocks newly cached. */
int workerproc_prefix_insert(workerproc_prefix_t *prefix,
                             kv_prefix_cursor_t *cursor, const int *tokens,
                             int n_computed, const int *blocks);

/* The next events publication is a full snapshot (a new session with the
 * router, or its KvResyncRequest). */
void workerproc_prefix_want_snapshot(workerproc_prefix_t *prefix);

/* Sends the pending events (a snapshot when one is owed) to the router as
 * one ControlMessage.kv_events, at most every `min_interval_ms` unless a
 * snapshot is owed.  Nothing to say: nothing sent.  Errors are logged
 * (WARN, continuing): a lost batch makes the router ask for a resync. */
void workerproc_prefix_publish(workerproc_prefix_t *prefix, void *sock,
                               int min_interval_ms);

/* A KvResyncRequest from the router: a snapshot goes out next. */
void workerproc_prefix_on_resync(workerproc_prefix_t *prefix,
                                 const Baton__KvResyncRequest *m);

/* Fills the prefix-cache part of a heartbeat (and so of /metrics). */
void workerproc_prefix_beat(const workerproc_prefix_t *prefix,
                            workerproc_beat_t *b);

kv_prefix_t *workerproc_prefix_cache(workerproc_prefix_t *prefix);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_PREFIX_H */
