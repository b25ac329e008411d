/* embed_ref.c - CPU reference of cuda_embed(). */
#include <string.h>

#include "kernels_ref.h"

void embed_ref(const float *table, const int *ids, int n, int dim,
               float *out)
{
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * dim, table + (size_t)ids[i] * dim,
               sizeof(float) * dim);
}
