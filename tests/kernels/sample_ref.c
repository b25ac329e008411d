/* sample_ref.c - CPU reference of cuda_argmax(). */
#include "kernels_ref.h"

#include <math.h>
#include <stdlib.h>

int argmax_ref(const float *row, int n)
{
    int best = 0;

    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

typedef struct {
    float v;
    int id;
} top_ref_t;

static int top_ref_cmp(const void *a, const void *b)
{
    const top_ref_t *x = a, *y = b;
    int xn = isnan(x->v), yn = isnan(y->v);

    if (xn != yn)
        return xn - yn; /* NaN last */
    if (!xn && x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* CPU reference of cuda_sample_top() for one row. */
void sample_top_ref(const float *row, int vocab, float inv_t, int k,
                    int *ids, float *vals, double *sum)
{
    top_ref_t *t = malloc(sizeof(*t) * (size_t)vocab);
    float mx = -INFINITY;
    double s = 0.0;
    int kk = k < vocab ? k : vocab;

    for (int i = 0; i < vocab; i++) {
        t[i].v = row[i];
        t[i].id = i;
        if (row[i] > mx)
            mx = row[i];
    }
    for (int i = 0; i < vocab; i++)
        if (!isnan(row[i]))
            s += (double)expf((row[i] - mx) * inv_t);
    qsort(t, (size_t)vocab, sizeof(*t), top_ref_cmp);
    for (int i = 0; i < kk; i++) {
        ids[i] = t[i].id;
        vals[i] = t[i].v;
    }
    *sum = s;
    free(t);
}
