/*
 * kernel_trace.c - a CUPTI injection library that writes the start and
 * end of every kernel a CUDA program runs, including each kernel node of
 * a CUDA graph (what `nsys --cuda-graph-trace=node` shows; the device
 * machine has no nsys).  Kernels keep running concurrently (CUPTI's
 * CONCURRENT_KERNEL activity), so overlap under programmatic dependent
 * launch stays visible.
 *
 *   CUDA_INJECTION64_PATH=build-DIR/gpu/libbt_kernel_trace.so \
 *   BT_TRACE_OUT=trace.csv build-DIR/gpu/bench_cuda ...
 *
 * The driver calls InitializeInjection() when the program first uses
 * CUDA; the records are written at exit as CSV (start and end in ns of
 * the GPU clock, grid, block, graph node, mangled name), read by
 * tests/gpu/step_timeline.py.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

#define TRACE_BUF_BYTES (8u << 20)

static FILE *trace_out;

static void CUPTIAPI trace_buffer_requested(uint8_t **buf, size_t *size,
                                            size_t *max_records)
{
    *buf = aligned_alloc(8, TRACE_BUF_BYTES);
    *size = *buf ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream,
                                            uint8_t *buf, size_t size,
                                            size_t valid)
{
    CUpti_Activity *rec = NULL;

    (void)ctx;
    (void)stream;
    (void)size;
    while (trace_out &&
           cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(trace_out, "%llu,%llu,%d,%d,%u,%llu,%s\n",
                (unsigned long long)k->start,
                (unsigned long long)(k->end - k->start),
                k->gridX * k->gridY * k->gridZ,
                k->blockX * k->blockY * k->blockZ, k->graphId,
                (unsigned long long)k->graphNodeId,
                k->name ? k->name : "?");
    }
    free(buf);
}

static void trace_at_exit(void)
{
    cuptiActivityFlushAll(1);
    if (trace_out) {
        fclose(trace_out);
        trace_out = NULL;
    }
}

int InitializeInjection(void)
{
    const char *path = getenv("BT_TRACE_OUT");

    trace_out = fopen(path && *path ? path : "kernel_trace.csv", "w");
    if (trace_out == NULL)
        return 0;
    fprintf(trace_out, "Start (ns),Duration (ns),Grid,Block,Graph,Node,Name\n");
    if (cuptiActivityRegisterCallbacks(trace_buffer_requested,
                                       trace_buffer_completed) !=
            CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) !=
            CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity unavailable\n");
        fclose(trace_out);
        trace_out = NULL;
        return 0;
    }
    atexit(trace_at_exit);
    return 1;
}
