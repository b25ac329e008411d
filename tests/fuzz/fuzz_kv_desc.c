/*
 * fuzz_kv_desc.c - the UCX KV descriptor parser (kv_ucx_desc_parse) on
 * untrusted bytes.  Each input is parsed as given, then again with its
 * length field and trailing checksum repaired, so mutations reach the
 * structural checks behind the checksum.  Seeds are real descriptors
 * (one-array pool and per-layer pool) produced by kv_ucx_pool_register.
 */
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "kv/kv_transport.h"

static void fuzz_parse(const uint8_t *data, size_t size)
{
    kv_ucx_desc_t *desc = NULL;
    if (kv_ucx_desc_parse(data, size, &desc) != BT_OK)
        return;
    /* Accepted: the accessors must be consistent. */
    if (kv_ucx_desc_layout(desc)->n_layers < 1 ||
        kv_ucx_desc_n_slots(desc) < 1)
        __builtin_trap();
    kv_ucx_desc_destroy(&desc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;

    fuzz_parse(data, size);
    if (size < 80 || size > KV_UCX_DESC_MAX_BYTES)
        return 0;
    copy = bt_malloc(size, "fuzz");
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    for (int i = 0; i < 4; i++)
        copy[8 + i] = (uint8_t)((uint32_t)size >> (8 * i));
    bt_fnv1a64_seal(copy, size);
    fuzz_parse(copy, size);
    bt_free(copy);
    return 0;
}
