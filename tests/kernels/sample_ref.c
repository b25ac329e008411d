/* sample_ref.c - CPU reference of cuda_argmax(). */
#include "kernels_ref.h"

int argmax_ref(const float *row, int n)
{
    int best = 0;

    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}
