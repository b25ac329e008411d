/*
 * fuzz_kv_events.c - the router's KV-event index (router/router_kvindex.h,
 * docs/KV_EVENTS.md) on arbitrary bytes from a worker: each input is a
 * sequence of frames (2-byte little-endian length, then a KvEvents
 * message) applied in order to one small index, alternating two worker
 * slots, with a reset now and then.  Whatever arrives, the index keeps
 * its bounds (blocks per worker) and answers overlap queries.
 */
#include <stdint.h>
#include <string.h>

#include "bt_util.h"
#include "router_kvindex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    router_kvindex_config_t cfg;
    router_kvindex_t *idx = NULL;
    size_t off = 0;
    int frame = 0;

    router_kvindex_config_init(&cfg);
    cfg.max_workers = 2;
    cfg.max_blocks_per_worker = 64;
    cfg.max_events = 256;
    if (router_kvindex_create(&cfg, &idx) != BT_OK)
        return 0;
    while (off + 2 <= size) {
        size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
        Baton__KvEvents *msg;
        router_kvindex_result_t res;
        int w = frame & 1;

        off += 2;
        if (len > size - off)
            len = size - off;
        msg = baton__kv_events__unpack(NULL, len, data + off);
        off += len;
        if (msg != NULL) {
            (void)router_kvindex_apply_msg(idx, w, msg, &res);
            baton__kv_events__free_unpacked(msg, NULL);
        }
        BT_ASSERT(router_kvindex_blocks(idx, w) <= 64);
        if (frame % 7 == 6)
            router_kvindex_reset(idx, w);
        frame++;
    }
    router_kvindex_destroy(&idx);
    return 0;
}
