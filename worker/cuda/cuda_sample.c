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
 * Rows sampled from their whole distribution (cuda_sample_dist): specs
 * h_spec -> d_spec, results d_dout -> h_dout, probabilities in d_p
 * (CS_DIST_CHUNK rows at a time); those sampled at enqueue take slots
 * [0, n_dist), the top misses of finish the slots after them.
 */
#include "cuda_sample.h"

#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "cuda_switches.h"
#include "cuda_int.h"
#include "kernels/sample.h"

#define CS_K CUDA_SAMPLE_TOP_MAX
/* Rows per cuda_sample_dist launch: its scratch is CS_DIST_CHUNK rows
 * (32 MB at a 128K vocabulary), whatever max_rows is. */
#define CS_DIST_CHUNK 64
/* A wide request (sampler_wide) goes back to the candidates when its
 * nucleus is at most this many tokens: half of them, so that a nucleus
 * hovering near CS_K does not flip the route every step. */
#define CS_WIDE_OFF (CS_K / 2)

typedef enum {
    CS_NONE = 0, /* no sampler */
    CS_ARGMAX,
    CS_TOP,
    CS_ROW,
    CS_DIST  /* whole distribution on the device (cuda_sample_dist) */
} cs_kind_t;

struct cuda_sampling_s {
    int vocab;
    int max_rows;
    /* device */
    int *d_meta;         /* (3 * max_rows) rows | rows | inv_t bits */
    void *d_out;         /* sums | ids | cand ids | cand vals */
    void *d_top_ws;      /* cuda_sample_top's scratch (max_rows rows) */
    /* host, pinned */
    int *h_meta;         /* (3 * max_rows) */
    void *h_out;         /* same layout as d_out */
    float *h_rows;       /* (rows_cap, vocab) whole rows */
    int rows_cap;
    bool dist_on;        /* BT_SAMPLE_DIST != 0: cuda_sample_dist used */
    cuda_dist_spec_t *d_spec;  /* (max_rows) */
    cuda_dist_out_t *d_dout;   /* (max_rows) */
    float *d_p;                /* (CS_DIST_CHUNK, vocab) scratch */
    cuda_dist_spec_t *h_spec;  /* (max_rows) pinned */
    cuda_dist_out_t *h_dout;   /* (max_rows) pinned */
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
    int n_dist;          /* rows sent to cuda_sample_dist at enqueue */
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
    BT_CHECK_GOTO(cuda__dev_malloc(&cs->d_top_ws,
                                   cuda_sample_top_ws_bytes(max_rows, vocab),
                                   "sample_top_ws"), status, fail);
    BT_CUDA_CHECK_GOTO(cudaMallocHost((void **)&cs->h_meta,
                                      3 * (size_t)max_rows * sizeof(int)),
                       status, fail);
    BT_CUDA_CHECK_GOTO(cudaMallocHost(&cs->h_out, cs_out_bytes(max_rows)),
                       status, fail);
    {
        /* 0: misses and plain-temperature rows copied whole (exact host
         * replay, slow); default: cuda_sample_dist (tests/gpu/
         * test_sample_dist holds it to the host with a near-tie
         * allowance: device and host P differ by <= 4 ulp, so a draw
         * may land one near-tie neighbour away) */
        const char *env = cuda_switches()->sample_dist;
        cs->dist_on = env == NULL || strcmp(env, "0") != 0;
    }
    if (cs->dist_on) {
        BT_CHECK_GOTO(cuda__dev_malloc((void **)&cs->d_spec,
                                       (size_t)max_rows *
                                           sizeof(*cs->d_spec),
                                       "sample_dist"), status, fail);
        BT_CHECK_GOTO(cuda__dev_malloc((void **)&cs->d_dout,
                                       (size_t)max_rows *
                                           sizeof(*cs->d_dout),
                                       "sample_dist"), status, fail);
        BT_CHECK_GOTO(cuda__dev_malloc((void **)&cs->d_p,
                                       (size_t)BT_MIN(max_rows,
                                                      CS_DIST_CHUNK) *
                                           (size_t)vocab * sizeof(float),
                                       "sample_dist"), status, fail);
        BT_CUDA_CHECK_GOTO(cudaMallocHost((void **)&cs->h_spec,
                                          (size_t)max_rows *
                                              sizeof(*cs->h_spec)),
                           status, fail);
        BT_CUDA_CHECK_GOTO(cudaMallocHost((void **)&cs->h_dout,
                                          (size_t)max_rows *
                                              sizeof(*cs->h_dout)),
                           status, fail);
    }
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
    cuda__dev_free(&cs->d_top_ws);
    cuda__dev_free((void **)&cs->d_spec);
    cuda__dev_free((void **)&cs->d_dout);
    cuda__dev_free((void **)&cs->d_p);
    if (cs->h_spec)
        cudaFreeHost(cs->h_spec);
    if (cs->h_dout)
        cudaFreeHost(cs->h_dout);
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

/* Fills spec slot `slot` for row r (its sampler's next uniform: the
 * stream advances only once the device's token is taken). */
static void cs_dist_spec(cuda_sampling_t *cs, int r, int slot)
{
    const sampler_params_t *p = sampler_params(cs->samplers[r]);
    cuda_dist_spec_t *sp = &cs->h_spec[slot];

    sp->row = cs->dev_row[r];
    sp->top_k = p->top_k;
    sp->inv_t = 1.0f / p->temperature;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->u = sampler_uniform_peek(cs->samplers[r]);
    cs->kind[r] = CS_DIST;
    cs->slot[r] = slot;
}

/* Enqueues cuda_sample_dist for spec slots [first, first + n): specs up,
 * the kernel (CS_DIST_CHUNK rows a launch: the scratch), results down. */
static bt_status_t cs_dist_launch(cuda_sampling_t *cs, int first, int n,
                                  cudaStream_t stream)
{
    bt_status_t status;

    if (n == 0)
        return BT_OK;
    status = BT_CUDA_STATUS(cudaMemcpyAsync(
        cs->d_spec + first, cs->h_spec + first, (size_t)n * sizeof(*cs->h_spec),
        cudaMemcpyHostToDevice, stream));
    for (int i = 0; i < n && status == BT_OK; i += CS_DIST_CHUNK)
        status = cuda_sample_dist(cs->d_logits, cs->ld, cs->vocab,
                                  cs->d_spec + first + i,
                                  BT_MIN(CS_DIST_CHUNK, n - i), cs->d_p,
                                  cs->d_dout + first + i, stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            cs->h_dout + first, cs->d_dout + first,
            (size_t)n * sizeof(*cs->h_dout), cudaMemcpyDeviceToHost, stream));
    return status;
}

/* Takes the device's token for a CS_DIST row (advancing the sampler's
 * stream past the uniform it used); false when the device declined it
 * (non-finite logits): the row is then sampled whole on the host. */
static bool cs_dist_take(cuda_sampling_t *cs, int r, int *token)
{
    const cuda_dist_out_t *o = &cs->h_dout[cs->slot[r]];

    if (o->token < 0 || o->token >= cs->vocab) {
        cs->stats.dist_declined++;
        return false;
    }
    (void)sampler_uniform(cs->samplers[r]);
    /* back to the candidates once the nucleus fits well inside them */
    if (o->n <= CS_WIDE_OFF)
        sampler_set_wide(cs->samplers[r], false);
    *token = o->token;
    cs->stats.dist++;
    return true;
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
    cs->n_arg = cs->n_top = cs->n_full = cs->n_dist = 0;
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
            if (cs->dist_on && sampler_wide(sm) && sampler_is_dist(sm)) {
                /* missed its candidates lately: the whole row at once */
                cs_dist_spec(cs, r, cs->n_dist++);
                break;
            }
            cs->kind[r] = CS_TOP;
            cs->slot[r] = cs->n_top;
            inv_t[cs->n_top] = 1.0f / sampler_temperature(sm);
            top_rows[cs->n_top++] = dev_row[r];
            break;
        default:
            if (cs->dist_on && sampler_is_dist(sm)) {
                cs_dist_spec(cs, r, cs->n_dist++);
                break;
            }
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
                                      CS_K, d_cids, d_cvals, d_sums,
                                      cs->d_top_ws, stream),
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
    BT_CHECK_GOTO(cs_dist_launch(cs, 0, cs->n_dist, stream), status, out);
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
    int kk = BT_MIN(CS_K, cs->vocab), n_miss = 0, n_d2 = 0;
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
            } else if (cs->dist_on && sampler_is_dist(sm)) {
                /* the whole distribution on the device, below; and at
                 * once in the steps after (sampler_wide) */
                sampler_set_wide(sm, true);
                cs_dist_spec(cs, r, cs->n_dist + n_d2++);
                cs->stats.top_miss++;
                continue;
            } else { /* the whole row, below (every miss in one wait) */
                cs->kind[r] = CS_ROW;
                cs->slot[r] = cs->n_full + n_miss++;
                cs->stats.top_miss++;
                continue;
            }
            break;
        case CS_DIST:
            if (!cs_dist_take(cs, r, &tok)) {
                cs->kind[r] = CS_ROW;
                cs->slot[r] = cs->n_full + n_miss++;
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
    if (n_d2 > 0) {
        /* top misses: one more launch and wait (4 + 20 bytes a row) */
        status = cs_dist_launch(cs, cs->n_dist, n_d2, stream);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
        if (status != BT_OK) {
            (void)cudaStreamSynchronize(stream);
            return status;
        }
        for (int r = 0; r < cs->n_rows; r++) {
            int tok;
            if (cs->kind[r] != CS_DIST || cs->slot[r] < cs->n_dist)
                continue;
            if (cs_dist_take(cs, r, &tok)) {
                cs->ids[r] = tok;
            } else {
                cs->kind[r] = CS_ROW;
                cs->slot[r] = cs->n_full + n_miss++;
            }
        }
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
