/*
 * fuzz_safetensors.c - model_st_parse on arbitrary bytes: every accepted
 * tensor's byte range must lie inside the data area.
 */
#include <stdint.h>
#include <string.h>

#include "bt_util.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_st_file_t st;

    memset(&st, 0, sizeof(st));
    if (model_st_parse(data, size, "fuzz", &st) == BT_OK) {
        for (int i = 0; i < st.n_tensors; i++) {
            const model_st_tensor_t *t = &st.tensors[i];
            BT_ASSERT(t->begin <= t->end && t->end <= st.data_len);
            BT_ASSERT(model_st_find(&st, t->name) == t);
        }
        model_st_cleanup(&st);
    }
    return 0;
}
