/*
 * fuzz_kv_cipc_desc.c - the CUDA IPC KV descriptor parser
 * (kv_cipc_desc_parse) on untrusted bytes.  Each input is parsed as
 * given, then again with its trailing checksum repaired, so mutations
 * reach the field checks behind the checksum.  An accepted descriptor
 * must survive an encode/parse round trip.  Seeds are real descriptors:
 * version 1 (one pool) and version 2 (one pool per TP rank, 2 and 4).
 */
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "kv/kv_transport_cuda_ipc.h"

static void fuzz_parse(const uint8_t *data, size_t size)
{
    kv_cipc_desc_t desc, back;
    uint8_t again[2048], twice[2048];

    if (kv_cipc_desc_parse(data, size, &desc) != BT_OK)
        return;
    /* Accepted: it must survive an encode / parse / encode round trip. */
    if (desc.layout.n_layers < 1 || desc.n_slots < 1 ||
        kv_cipc_desc_encoded_size(&desc) != size ||
        kv_cipc_desc_n_ranks(&desc) < 1 ||
        kv_cipc_desc_heads_total(&desc) <
            kv_cipc_desc_n_ranks(&desc) * desc.layout.n_kv_heads ||
        kv_cipc_desc_encode(&desc, again, sizeof(again)) != BT_OK ||
        kv_cipc_desc_parse(again, size, &back) != BT_OK ||
        kv_cipc_desc_encode(&back, twice, sizeof(twice)) != BT_OK ||
        memcmp(again, twice, size) != 0 || back.pool_id != desc.pool_id)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;

    fuzz_parse(data, size);
    if (size < 8 || size > 4096)
        return 0;
    copy = bt_malloc(size, "fuzz");
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    bt_fnv1a64_seal(copy, size);
    fuzz_parse(copy, size);
    bt_free(copy);
    return 0;
}
