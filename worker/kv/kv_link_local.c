/*
 * kv_link_local.c - the aggregated worker's link (decode --role both):
 * the decode worker prefills the prompt itself, into the reservation's
 * own blocks, so nothing moves.  It has no sender; the router names it
 * (kv_link_choose) so KvReady says how the KV came.
 */
#include "kv/kv_link_int.h"

const kv_link_ops_t kv_link_local_ops = {
    .name = "local",
    .id = KV_LINK_LOCAL,
    .alias = -1,
};
