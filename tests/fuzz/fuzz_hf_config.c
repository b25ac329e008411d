/*
 * fuzz_hf_config.c - model_hf_config_parse on arbitrary bytes.  The input
 * is split at the first NUL byte: config.json before it, and when present
 * generation_config.json after it.
 */
#include <stdint.h>
#include <string.h>

#include "bt_util.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul != NULL ? (size_t)(nul - data) : size;
    const char *gen = nul != NULL ? (const char *)nul + 1 : NULL;
    size_t gen_len = nul != NULL ? size - len - 1 : 0;
    model_config_t cfg;
    char arch[64];

    if (model_hf_config_parse(text, len, gen, gen_len, &cfg, arch,
                              sizeof(arch)) == BT_OK)
        BT_ASSERT(model_config_validate(&cfg) == BT_OK);
    return 0;
}
