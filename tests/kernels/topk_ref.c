/* topk_ref.c - CPU reference of cuda_topk_logprob() (the host path's
 * top-k in worker/spec/spec.c, with logsumexp in double). */
#include <math.h>
#include <stdlib.h>

#include "kernels_ref.h"

void topk_ref(const float *logits, int n, int vocab, int k, int *ids,
              float *logp)
{
    char *used = calloc((size_t)vocab, 1);

    for (int r = 0; r < n && used; r++) {
        const float *row = logits + (size_t)r * vocab;
        float mx = -INFINITY;
        double sum = 0.0, lse;

        for (int j = 0; j < vocab; j++) {
            used[j] = row[j] != row[j]; /* NaN: never chosen */
            if (!used[j] && row[j] > mx)
                mx = row[j];
        }
        for (int j = 0; j < vocab; j++)
            if (row[j] == row[j])
                sum += exp((double)row[j] - mx);
        lse = mx + log(sum);
        for (int c = 0; c < k; c++) {
            int best = -1;

            for (int j = 0; j < vocab; j++)
                if (!used[j] && (best < 0 || row[j] > row[best]))
                    best = j; /* strict: the lower id wins a tie */
            if (best >= 0)
                used[best] = 1;
            ids[(size_t)r * k + c] = best < 0 ? 0 : best;
            logp[(size_t)r * k + c] =
                best < 0 ? -INFINITY : (float)(row[best] - lse);
        }
    }
    free(used);
}
