/*
 * cuda_allreduce_bench.c - the tensor-parallel all-reduce's benchmark and
 * check (cuda_backend.h): every path of the reduction timed or checked
 * on the ranks of a created backend.
 */
#include "cuda_backend_int.h"

// ---------------------------------------------------------------------
// All-reduce benchmark (cuda_backend.h)

/* Rank op: a graph of op_i0 all-reduces, replayed; rank 0 times it. */
static bt_status_t cuda_rank_bench_ar(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    const int reps = 5;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    bt_status_t status, st2;
    float ms = 0;

    status = cuda__rank_enter(r);
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaMemsetAsync(r->d_x, 0, b->op_n * 4,
                                            r->stream));
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaStreamBeginCapture(
        r->stream, cudaStreamCaptureModeThreadLocal));
    if (status != BT_OK)
        return status;
    for (int i = 0; i < b->op_i0 && status == BT_OK; i++)
        status = cuda__allreduce_via(r, b->op_n, b->op_custom);
    st2 = BT_CUDA_STATUS(cudaStreamEndCapture(r->stream, &graph));
    if (status == BT_OK)
        status = st2;
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (status == BT_OK) /* warm-up */
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&ev[0]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventCreate(&ev[1]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(ev[0], r->stream));
    for (int i = 0; i < reps && status == BT_OK; i++)
        status = BT_CUDA_STATUS(cudaGraphLaunch(exec, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventRecord(ev[1], r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventSynchronize(ev[1]));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    if (status == BT_OK && rank == 0)
        b->op_us = 1e3 * ms / ((double)reps * b->op_i0);
    (void)cudaStreamSynchronize(r->stream);
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    return status;
}

/* Shared by the all-reduce benchmark and check: the backend must be a
 * tensor-parallel cuda one, and `path` ("custom" or "nccl") available
 * for n_floats; sets b->op_custom for the rank functions. */
static bt_status_t cuda_ar_select(backend_t *backend, const char *what,
                                  const char *path, size_t n_floats)
{
    cuda_backend_t *b = backend__impl(backend);

    if (strcmp(backend_name(backend), "cuda") != 0 || b->tp < 2)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "the all-reduce %s needs the cuda backend with "
                        "tp > 1", what);
    b->op_custom = strcmp(path, "custom") == 0;
    if ((b->op_custom && (!b->ar_custom_ok || n_floats % 4 != 0)) ||
        (!b->op_custom && b->nccl == NULL))
        return BT_ERROR(BT_ERR_UNSUPPORTED, "CUDA",
                        "all-reduce path %s is not available here", path);
    return BT_OK;
}

bt_status_t cuda_backend_bench_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int iters,
                                         double *us_p)
{
    cuda_backend_t *b = backend__impl(backend);
    bt_status_t status = cuda_ar_select(backend, "benchmark", path, n_floats);

    if (status != BT_OK)
        return status;
    if (n_floats == 0 || n_floats > (size_t)b->max_tok * b->mc.dim ||
        iters < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "all-reduce bench of %zu floats x %d", n_floats,
                        iters);
    b->op_n = n_floats;
    b->op_i0 = iters;
    status = backend_tp_crew_run(b->crew, cuda_rank_bench_ar, b);
    if (status == BT_OK)
        *us_p = b->op_us;
    return status;
}

/* The pattern rank r contributes to element i of call k of the
 * all-reduce check: small integers, so every sum is exact in f32. */
static float cuda_ar_pattern(int r, size_t i, int k)
{
    return (float)((int)((i * 7 + (size_t)k * 13 + (size_t)r * 5) % 61) -
                   30);
}

/* Rank op: op_i0 all-reduces of varying sizes (up to op_n floats) on the
 * rank's stream with no host wait between them: each call's input copied
 * from a device pattern, its result saved; then every result is checked
 * on the host.  op_us gets the number of wrong elements (rank 0 first). */
static bt_status_t cuda_rank_check_ar(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    const int calls = b->op_i0;
    const size_t n = b->op_n;
    float *h = NULL, *d_pat = NULL, *d_res = NULL;
    size_t *sizes = NULL;
    long bad = 0;
    bt_status_t status;

    status = cuda__rank_enter(r);
    if (status != BT_OK)
        return status;
    h = bt_malloc((size_t)calls * n * sizeof(float), "ar_check");
    sizes = bt_malloc((size_t)calls * sizeof(size_t), "ar_check");
    if (h == NULL || sizes == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int k = 0; k < calls; k++) {
        /* whole, halves, a few tokens, one float4 more than a grid row */
        const size_t pick[] = { n, n / 2, n / 8, 4 * CUDA_AR_THREADS + 4,
                                n / 3, 4 };
        sizes[k] = BT_MAX((size_t)4, pick[k % 6] / 4 * 4);
        for (size_t i = 0; i < sizes[k]; i++)
            h[(size_t)k * n + i] = cuda_ar_pattern(rank, i, k);
    }
    status = cuda__dev_malloc((void **)&d_pat,
                              (size_t)calls * n * sizeof(float), "ar_check");
    if (status == BT_OK)
        status = cuda__dev_malloc((void **)&d_res,
                                  (size_t)calls * n * sizeof(float),
                                  "ar_check");
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            d_pat, h, (size_t)calls * n * sizeof(float),
            cudaMemcpyHostToDevice, r->stream));
    for (int k = 0; k < calls && status == BT_OK; k++) {
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            r->d_x, d_pat + (size_t)k * n, sizes[k] * sizeof(float),
            cudaMemcpyDeviceToDevice, r->stream));
        if (status == BT_OK)
            status = cuda__allreduce_via(r, sizes[k], b->op_custom);
        if (status == BT_OK)
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                d_res + (size_t)k * n, r->d_x, sizes[k] * sizeof(float),
                cudaMemcpyDeviceToDevice, r->stream));
    }
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            h, d_res, (size_t)calls * n * sizeof(float),
            cudaMemcpyDeviceToHost, r->stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
    for (int k = 0; k < calls && status == BT_OK; k++) {
        for (size_t i = 0; i < sizes[k]; i++) {
            float want = 0;
            for (int p = 0; p < b->tp; p++)
                want += cuda_ar_pattern(p, i, k);
            bad += h[(size_t)k * n + i] != want;
        }
    }
    b->op_bad[rank] = bad;
out:
    (void)cudaStreamSynchronize(r->stream);
    cuda__dev_free((void **)&d_pat);
    cuda__dev_free((void **)&d_res);
    bt_free(h);
    bt_free(sizes);
    return status;
}

bt_status_t cuda_backend_check_allreduce(backend_t *backend, const char *path,
                                         size_t n_floats, int calls,
                                         long *bad_p)
{
    cuda_backend_t *b = backend__impl(backend);
    bt_status_t status = cuda_ar_select(backend, "check", path, n_floats);

    if (status != BT_OK)
        return status;
    if (n_floats < 8 || n_floats % 4 != 0 ||
        n_floats > (size_t)b->max_tok * b->mc.dim || calls < 1)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                        "all-reduce check of %zu floats x %d", n_floats,
                        calls);
    b->op_n = n_floats;
    b->op_i0 = calls;
    status = backend_tp_crew_run(b->crew, cuda_rank_check_ar, b);
    *bad_p = 0;
    for (int r = 0; r < b->tp && status == BT_OK; r++)
        *bad_p += b->op_bad[r];
    return status;
}
