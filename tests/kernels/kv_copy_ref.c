/* kv_copy_ref.c - CPU reference of cuda_kv_copy_slots(). */
#include <stdlib.h>
#include <string.h>

#include "kernels_ref.h"

void kv_copy_ref(void *k, void *v, int n_layers, size_t layer_bytes,
                 size_t row_bytes, const int *src, const int *dst, int n)
{
    char *tmp = malloc(row_bytes * (size_t)(n > 0 ? n : 1));

    for (int l = 0; l < n_layers; l++) {
        for (int a = 0; a < 2; a++) {
            char *base = (char *)(a ? v : k) + (size_t)l * layer_bytes;

            for (int i = 0; i < n; i++)
                memcpy(tmp + (size_t)i * row_bytes,
                       base + (size_t)src[i] * row_bytes, row_bytes);
            for (int i = 0; i < n; i++)
                memcpy(base + (size_t)dst[i] * row_bytes,
                       tmp + (size_t)i * row_bytes, row_bytes);
        }
    }
    free(tmp);
}
