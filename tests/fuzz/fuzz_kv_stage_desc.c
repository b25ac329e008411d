/*
 * fuzz_kv_stage_desc.c - the staged UCX KV descriptor parser
 * (kv_stage_desc_parse) on untrusted bytes.  Each input is parsed as given,
 * then again with both length fields and both checksums repaired (the
 * outer "BTKS" header's and the embedded kv_ucx descriptor's), so
 * mutations reach the structural checks behind them.  Seeds are real
 * descriptors (staged receiver, direct receiver) written by
 * KV_STAGE_DUMP_DESC=dir build/tests/kv_transport_test_stage.
 */
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "kv/kv_transport_stage.h"

#define HDR 28

static void fuzz_put(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void fuzz_parse(const uint8_t *data, size_t size)
{
    kv_stage_desc_info_t info;
    if (kv_stage_desc_parse(data, size, &info) != BT_OK)
        return;
    /* Accepted: the fields must be consistent with the bytes. */
    if (info.n_layers < 1 || info.n_slots < 1 || info.recv_blocks < 1 ||
        info.ucx != data + HDR || info.ucx_len != size - HDR - 8)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    size_t inner;

    fuzz_parse(data, size);
    if (size < HDR + 80 + 8 || size > (1u << 20))
        return 0;
    copy = bt_malloc(size, "fuzz");
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    inner = size - HDR - 8;
    /* Inner kv_ucx descriptor: length at 8, checksum at its end. */
    fuzz_put(copy + HDR + 8, inner, 4);
    bt_fnv1a64_seal(copy + HDR, inner);
    /* Outer header: total length, inner length, checksum. */
    fuzz_put(copy + 8, size, 4);
    fuzz_put(copy + 24, inner, 4);
    bt_fnv1a64_seal(copy, size);
    fuzz_parse(copy, size);
    bt_free(copy);
    return 0;
}
