/*
 * gemm_pdl.c - programmatic edges into cuBLASLt's kernels (gemm_pdl.h
 * says why and how each algorithm is checked first).
 */
#include "gemm_pdl.h"

#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "kernels/gemv.h"

/* How long the probe's lead holds the inputs back: far longer than a
 * kernel needs to start and read them, far shorter than a test. */
#define GEMM_PDL_SPIN_NS 20000u

bool gemm_pdl_enabled(void)
{
    const char *env = getenv("BT_GEMM_LT_PDL");

    return env != NULL && strcmp(env, "1") == 0;
}

bool gemm_pdl_edge(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *deps = NULL;
    size_t n = 0;
    cudaGraphNode_t dep;
    enum cudaGraphNodeType type;
    cudaGraphEdgeData e;

    if (cudaStreamGetCaptureInfo(stream, &cs, NULL, NULL, &deps, NULL,
                                 &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (cs != cudaStreamCaptureStatusActive || n != 1)
        return false;
    dep = deps[0];
    if (cudaGraphNodeGetType(dep, &type) != cudaSuccess ||
        type != cudaGraphNodeTypeKernel) {
        (void)cudaGetLastError();
        return false;
    }
    memset(&e, 0, sizeof(e));
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    if (cudaStreamUpdateCaptureDependencies(
            stream, &dep, &e, 1, cudaStreamSetCaptureDependencies) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

/* The probe's buffers: x's source and its poisoned copy, y's start (for
 * +=), the stream-ordered reference, the probed output; host copies. */
typedef struct {
    void *d_xs, *d_x, *d_y0, *d_ref, *d_y;
    unsigned char *h_ref, *h_y;
} gemm_pdl_bufs_t;

/* One probe: the lead writes x (and y0 into y when accumulating) late,
 * the product behind it on a programmatic edge.  *same_p: its output is
 * the reference, bit for bit. */
static bt_status_t gemm_pdl_probe_once(gemm_pdl_run_fn run, void *arg,
                                       const gemm_pdl_bufs_t *b,
                                       size_t bx, size_t by, bool acc,
                                       cudaStream_t stream, bool *same_p)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    bt_status_t status = BT_OK, st;
    bool edge = false;

    *same_p = false;
    if (acc)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(
            b->d_ref, b->d_y0, by, cudaMemcpyDeviceToDevice, stream));
    if (status == BT_OK)
        status = run(arg, b->d_xs, b->d_ref, acc, stream);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemsetAsync(b->d_x, 0xff, bx, stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemsetAsync(b->d_y, 0xff, by, stream));
    if (status != BT_OK)
        return status;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return BT_OK; /* no capture here: no edges either */
    }
    st = cuda_gemv_pdl_probe_lead(b->d_xs, b->d_x, bx, b->d_y0, b->d_y,
                                  acc ? by : 0, GEMM_PDL_SPIN_NS, stream);
    if (st == BT_OK) {
        edge = gemm_pdl_edge(stream);
        st = run(arg, b->d_x, b->d_y, acc, stream);
    }
    if (cudaStreamEndCapture(stream, &g) != cudaSuccess || st != BT_OK ||
        !edge || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        /* the edge made the capture invalid (cuBLASLt's first node is
         * no kernel, say): this algorithm gets no edge */
        bt_error_clear();
        (void)cudaGetLastError();
        if (g != NULL)
            cudaGraphDestroy(g);
        return BT_OK;
    }
    cudaGraphDestroy(g);
    status = BT_CUDA_STATUS(cudaGraphLaunch(ge, stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(b->h_ref, b->d_ref, by,
                                                cudaMemcpyDeviceToHost,
                                                stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaMemcpyAsync(b->h_y, b->d_y, by,
                                                cudaMemcpyDeviceToHost,
                                                stream));
    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(ge);
    if (status == BT_OK)
        *same_p = memcmp(b->h_ref, b->h_y, by) == 0;
    return status;
}

bt_status_t gemm_pdl_probe(gemm_pdl_run_fn run, void *arg, int n_tok,
                           int n_out, int n_in, cuda_dtype_t out_dt,
                           cudaStream_t stream, bool *waits_p)
{
    const size_t bx = (size_t)n_tok * n_in * 2;
    const size_t by = (size_t)n_tok * n_out * cuda_dtype_size(out_dt);
    gemm_pdl_bufs_t b;
    bt_status_t status;
    bool same = true;

    *waits_p = false;
    if (bx % 16 != 0 || by % 16 != 0)
        return BT_OK; /* the lead copies 16-byte units: not probed */
    memset(&b, 0, sizeof(b));
    status = cuda__dev_malloc(&b.d_xs, bx, "gemm_pdl_xs");
    if (status == BT_OK)
        status = cuda__dev_malloc(&b.d_x, bx, "gemm_pdl_x");
    if (status == BT_OK)
        status = cuda__dev_malloc(&b.d_y0, by, "gemm_pdl_y0");
    if (status == BT_OK)
        status = cuda__dev_malloc(&b.d_ref, by, "gemm_pdl_ref");
    if (status == BT_OK)
        status = cuda__dev_malloc(&b.d_y, by, "gemm_pdl_y");
    if (status == BT_OK) {
        b.h_ref = bt_malloc(by, "gemm_pdl_h_ref");
        b.h_y = bt_malloc(by, "gemm_pdl_h_y");
        if (b.h_ref == NULL || b.h_y == NULL)
            status = BT_ERR_NO_MEMORY;
    }
    if (status == BT_OK)
        status = cuda_gemv_fill(b.d_xs, (size_t)n_tok * n_in,
                                0x9d1e5eedu ^ (uint32_t)n_out, stream);
    /* a finite start for the accumulating probe */
    if (status == BT_OK)
        status = run(arg, b.d_xs, b.d_y0, false, stream);
    for (int acc = 0; status == BT_OK && same &&
                      acc <= (out_dt == CUDA_DT_F32 ? 1 : 0); acc++)
        status = gemm_pdl_probe_once(run, arg, &b, bx, by, acc != 0, stream,
                                     &same);
    *waits_p = status == BT_OK && same;
    bt_free(b.h_y);
    bt_free(b.h_ref);
    cuda__dev_free(&b.d_y);
    cuda__dev_free(&b.d_ref);
    cuda__dev_free(&b.d_y0);
    cuda__dev_free(&b.d_x);
    cuda__dev_free(&b.d_xs);
    return status;
}
