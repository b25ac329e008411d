/*
 * cuda_sample.c - device sampling of a forward's logits rows (see
 * cuda_sample.h).
 *
 * Buffers: h_meta (pinned) = argmax rows | top rows | 1/temperature of
 * each top row, copied up in one piece; d_out = normalizers (double) |
 * argmax ids | candidate ids | candidate logits, copied down in four
 * pieces into h_out (pinned).  Whole rows go to h_rows (pinned, grown on
 * demand) or straight into the caller's logits; rows whose candidates
 * did not suffice follow them in h_rows, fetched together in finish.
 */
#include "cuda_sample.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "cuda_int.h"
#include "kernels/sample.h"

#define CS_K CUDA_SAMPLE_TOP_MAX

typedef enum {
    CS_NONE = 0, /* no sampler */
    CS_ARGMAX,
    CS_TOP,
    CS_ROW
} cs_kind_t;

struct cuda_sampling_s {
    int vocab;
    int max_rows;
    /* device */
    int *d_meta;         /* (3 * max_rows) rows | rows | inv_t bits */
    void *d_out;         /* sums | ids | cand ids | cand vals */
    /* host, pinned */
    int *h_meta;         /* (3 * max_rows) */
    void *h_out;         /* same layout as d_out */
    float *h_rows;       /* (rows_cap, vocab) whole rows */
    int rows_cap;
    /* the pending step */
    int n_rows;
    const float *d_logits;
    size_t ld;
    sampler_t *const *samplers;
    int *ids;
    float *logits;
    cs_kind_t *kind;     /* (max_rows) */
    int *slot;           /* (max_rows) index in its kind's list */
    int *dev_row;        /* (max_rows) */
    int n_arg, n_top, n_full;
    cuda_sampling_stats_t stats;
};

static size_t cs_out_bytes(int max_rows)
{
    return (size_t)max_rows * sizeof(double) +
           (size_t)max_rows * sizeof(int) +
           (size_t)max_rows * CS_K * (sizeof(int) + sizeof(float));
}

/* Pointers into an out block (device or host). */
static void cs_out_parts(void *base, int max_rows, double **sums, int **ids,
                         int **cids, float **cvals)
{
    char *p = base;

    *sums = (double *)p;
    p += (size_t)max_rows * sizeof(double);
    *ids = (int *)p;
    p += (size_t)max_rows * sizeof(int);
    *cids = (int *)p;
    p += (size_t)max_rows * CS_K * sizeof(int);
    *cvals = (float *)p;
}

bt_status_t cuda_sampling_create(int vocab, int max_rows,
                                 cuda_sampling_t **cs_p)
{
    cuda_sampling_t *cs;
    bt_status_t status;

    BT_ASSERT(vocab > 0 && max_rows > 0);
    cs = bt_calloc(1, sizeof(*cs), "cuda_sampling");
    if (cs == NULL)
        return BT_ERR_NO_MEMORY;
    cs->vocab = vocab;
    cs->max_rows = max_rows;
    cs->kind = bt_calloc((size_t)max_rows, sizeof(*cs->kind), "cuda_sampling");
    cs->slot = bt_calloc((size_t)max_rows, sizeof(int), "cuda_sampling");
    cs->dev_row = bt_calloc((size_t)max_rows, sizeof(int), "cuda_sampling");
    if (cs->kind == NULL || cs->slot == NULL || cs->dev_row == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto fail;
    }
    BT_CHECK_GOTO(cuda__dev_malloc((void **)&cs->d_meta,
                                   3 * (size_t)max_rows * sizeof(int),
                                   "sample_meta"), status, fail);
    BT_CHECK_GOTO(cuda__dev_malloc(&cs->d_out, cs_out_bytes(max_rows),
                                   "sample_out"), status, fail);
    BT_CUDA_CHECK_GOTO(cudaMallocHost((void **)&cs->h_meta,
                                      3 * (size_t)max_rows * sizeof(int)),
                       status, fail);
    BT_CUDA_CHECK_GOTO(cudaMallocHost(&cs->h_out, cs_out_bytes(max_rows)),
                       status, fail);
    *cs_p = cs;
    return BT_OK;
fail:
    cuda_sampling_destroy(&cs);
    return status;
}

void cuda_sampling_destroy(cuda_sampling_t **cs_p)
{
    cuda_sampling_t *cs = *cs_p;

    if (cs == NULL)
        return;
    cuda__dev_free((void **)&cs->d_meta);
    cuda__dev_free(&cs->d_out);
    if (cs->h_meta)
        cudaFreeHost(cs->h_meta);
    if (cs->h_out)
        cudaFreeHost(cs->h_out);
    if (cs->h_rows)
        cudaFreeHost(cs->h_rows);
    bt_free(cs->kind);
    bt_free(cs->slot);
    bt_free(cs->dev_row);
    bt_free(cs);
    *cs_p = NULL;
}

static bt_status_t cs_rows_reserve(cuda_sampling_t *cs, int n)
{
    float *grown = NULL;

    if (n <= cs->rows_cap)
        return BT_OK;
    if (cs->h_rows)
        cudaFreeHost(cs->h_rows);
    cs->h_rows = NULL;
    cs->rows_cap = 0;
    if (BT_CUDA_STATUS(cudaMallocHost((void **)&grown,
                                      (size_t)n * cs->vocab *
                                          sizeof(float))) != BT_OK)
        return BT_ERR_CUDA;
    cs->h_rows = grown;
    cs->rows_cap = n;
    return BT_OK;
}

bt_status_t cuda_sampling_enqueue(cuda_sampling_t *cs, const float *d_logits,
                                  size_t ld, int n_rows, const int *dev_row,
                                  sampler_t *const *samplers, int *ids,
                                  float *logits, cudaStream_t stream)
{
    const int mr = cs->max_rows;
    int *arg_rows = cs->h_meta, *top_rows = cs->h_meta + mr;
    float *inv_t = (float *)(cs->h_meta + 2 * mr);
    double *d_sums, *h_sums;
    int *d_ids, *d_cids, *h_ids, *h_cids;
    float *d_cvals, *h_cvals;
    size_t rowb = (size_t)cs->vocab * sizeof(float);
    bt_status_t status;

    BT_ASSERT(n_rows >= 0 && n_rows <= mr);
    cs->n_rows = n_rows;
    cs->d_logits = d_logits;
    cs->ld = ld;
    cs->samplers = samplers;
    cs->ids = ids;
    cs->logits = logits;
    cs->n_arg = cs->n_top = cs->n_full = 0;
    for (int r = 0; r < n_rows; r++) {
        sampler_t *sm = samplers ? samplers[r] : NULL;
        cs->dev_row[r] = dev_row[r];
        if (sm == NULL) {
            cs->kind[r] = CS_NONE;
            continue;
        }
        switch (sampler_need(sm)) {
        case SAMPLER_NEED_ARGMAX:
            cs->kind[r] = CS_ARGMAX;
            cs->slot[r] = cs->n_arg;
            arg_rows[cs->n_arg++] = dev_row[r];
            break;
        case SAMPLER_NEED_TOP:
            cs->kind[r] = CS_TOP;
            cs->slot[r] = cs->n_top;
            inv_t[cs->n_top] = 1.0f / sampler_temperature(sm);
            top_rows[cs->n_top++] = dev_row[r];
            break;
        default:
            cs->kind[r] = CS_ROW;
            cs->slot[r] = cs->n_full++;
            break;
        }
    }
    status = cs_rows_reserve(cs, cs->n_full);
    if (status != BT_OK)
        return status;
    cs_out_parts(cs->d_out, mr, &d_sums, &d_ids, &d_cids, &d_cvals);
    cs_out_parts(cs->h_out, mr, &h_sums, &h_ids, &h_cids, &h_cvals);
    if (cs->n_arg + cs->n_top > 0)
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          cs->d_meta, cs->h_meta,
                          3 * (size_t)mr * sizeof(int),
                          cudaMemcpyHostToDevice, stream)),
                      status, out);
    if (cs->n_arg > 0) {
        BT_CHECK_GOTO(cuda_argmax_rows(d_logits, ld, cs->d_meta, cs->n_arg,
                                       cs->vocab, d_ids, stream),
                      status, out);
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          h_ids, d_ids, (size_t)cs->n_arg * sizeof(int),
                          cudaMemcpyDeviceToHost, stream)),
                      status, out);
    }
    if (cs->n_top > 0) {
        BT_CHECK_GOTO(cuda_sample_top(d_logits, ld, cs->d_meta + mr,
                                      cs->n_top, cs->vocab,
                                      (const float *)(cs->d_meta + 2 * mr),
                                      CS_K, d_cids, d_cvals, d_sums, stream),
                      status, out);
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          h_sums, d_sums, (size_t)cs->n_top * sizeof(double),
                          cudaMemcpyDeviceToHost, stream)),
                      status, out);
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          h_cids, d_cids,
                          (size_t)cs->n_top * CS_K * sizeof(int),
                          cudaMemcpyDeviceToHost, stream)),
                      status, out);
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          h_cvals, d_cvals,
                          (size_t)cs->n_top * CS_K * sizeof(float),
                          cudaMemcpyDeviceToHost, stream)),
                      status, out);
    }
    for (int r = 0; r < n_rows; r++) {
        float *dst;
        if (cs->kind[r] == CS_ROW)
            dst = cs->h_rows + (size_t)cs->slot[r] * cs->vocab;
        else if (cs->kind[r] == CS_NONE && logits != NULL)
            dst = logits + (size_t)r * cs->vocab;
        else
            continue;
        BT_CHECK_GOTO(BT_CUDA_STATUS(cudaMemcpyAsync(
                          dst, d_logits + (size_t)dev_row[r] * ld, rowb,
                          cudaMemcpyDeviceToHost, stream)),
                      status, out);
    }
    return BT_OK;
out:
    (void)cudaStreamSynchronize(stream);
    return status;
}

bt_status_t cuda_sampling_finish(cuda_sampling_t *cs, cudaStream_t stream)
{
    const int mr = cs->max_rows;
    double *h_sums;
    int *h_ids, *h_cids;
    float *h_cvals;
    int kk = BT_MIN(CS_K, cs->vocab), n_miss = 0;
    bt_status_t status;

    status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
    if (status != BT_OK)
        return status;
    cs_out_parts(cs->h_out, mr, &h_sums, &h_ids, &h_cids, &h_cvals);
    for (int r = 0; r < cs->n_rows; r++) {
        sampler_t *sm = cs->samplers ? cs->samplers[r] : NULL;
        int s = cs->slot[r], tok = -1;

        switch (cs->kind[r]) {
        case CS_NONE:
            break;
        case CS_ARGMAX:
            tok = h_ids[s];
            cs->stats.argmax++;
            break;
        case CS_TOP:
            if (sampler_sample_top(sm, h_cids + (size_t)s * CS_K,
                                   h_cvals + (size_t)s * CS_K, kk, h_sums[s],
                                   &tok)) {
                cs->stats.top++;
            } else { /* the whole row, below (every miss in one wait) */
                cs->kind[r] = CS_ROW;
                cs->slot[r] = cs->n_full + n_miss++;
                cs->stats.top_miss++;
                continue;
            }
            break;
        case CS_ROW:
            tok = sampler_sample(sm, cs->h_rows + (size_t)s * cs->vocab);
            cs->stats.row++;
            break;
        }
        cs->ids[r] = tok;
    }
    if (n_miss == 0)
        return BT_OK;
    /* the logits are still in the device buffer: fetch the missed rows
     * (after the whole rows already there) and sample them */
    if (cs->n_full + n_miss > cs->rows_cap) {
        float *keep = NULL;
        size_t bytes = (size_t)cs->n_full * cs->vocab * sizeof(float);
        if (cs->n_full > 0) {
            keep = bt_malloc(bytes, "cuda_sampling");
            if (keep == NULL)
                return BT_ERR_NO_MEMORY;
            memcpy(keep, cs->h_rows, bytes);
        }
        status = cs_rows_reserve(cs, cs->n_full + n_miss);
        if (status == BT_OK && keep != NULL)
            memcpy(cs->h_rows, keep, bytes);
        bt_free(keep);
        if (status != BT_OK)
            return status;
    }
    for (int r = 0; r < cs->n_rows; r++) {
        if (cs->kind[r] != CS_ROW || cs->slot[r] < cs->n_full)
            continue;
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            cs->h_rows + (size_t)cs->slot[r] * cs->vocab,
            cs->d_logits + (size_t)cs->dev_row[r] * cs->ld,
            (size_t)cs->vocab * sizeof(float), cudaMemcpyDeviceToHost,
            stream));
        if (status != BT_OK) {
            (void)cudaStreamSynchronize(stream);
            return status;
        }
    }
    status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
    if (status != BT_OK)
        return status;
    for (int r = 0; r < cs->n_rows; r++) {
        if (cs->kind[r] != CS_ROW || cs->slot[r] < cs->n_full)
            continue;
        cs->ids[r] = sampler_sample(cs->samplers[r],
                                    cs->h_rows +
                                        (size_t)cs->slot[r] * cs->vocab);
    }
    return BT_OK;
}

void cuda_sampling_stats(const cuda_sampling_t *cs, cuda_sampling_stats_t *st)
{
    *st = cs->stats;
}
