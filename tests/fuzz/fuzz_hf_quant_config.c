/*
 * fuzz_hf_quant_config.c - model_hf_quant_parse (issue 37: which FP8
 * checkpoint formats load, everything else refused by name) on arbitrary
 * bytes.  The input is split at the first NUL byte: config.json before
 * it, and when present hf_quant_config.json (ModelOpt) after it.
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
    const char *hfq = nul != NULL ? (const char *)nul + 1 : NULL;
    size_t hfq_len = nul != NULL ? size - len - 1 : 0;
    model_quant_t q;

    (void)model_hf_quant_parse(text, len, hfq, hfq_len, &q);
    return 0;
}
