/*
 * fuzz_llama2c_header.c - model_llama2c_parse on arbitrary bytes: the
 * header check and the exact-size check must refuse junk without reading
 * past the buffer.  The input is treated as a whole checkpoint file.
 */
#include <stdint.h>
#include <string.h>

#include "bt_util.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_config_t cfg;
    bool shared;

    if (model_llama2c_parse(data, size, &cfg, &shared) == BT_OK) {
        BT_ASSERT(cfg.dim > 0 && cfg.n_heads > 0 && cfg.n_kv_heads > 0);
        BT_ASSERT(cfg.dim % cfg.n_heads == 0);
        BT_ASSERT(cfg.n_heads % cfg.n_kv_heads == 0);
        BT_ASSERT(model_config_validate(&cfg) == BT_OK);
    }
    return 0;
}
