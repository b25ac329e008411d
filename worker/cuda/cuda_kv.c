/*
 * cuda_kv.c - the CUDA backend's KV pool from outside a forward: device
 * pointers, block and slot copies, the copy-in from a CUDA IPC window,
 * and the prefix cache's host tier (backend_kv_save / backend_kv_load).
 */
#include "cuda_backend_int.h"

// ---------------------------------------------------------------------
// KV pool access

void *cuda__kv_data_rank(void *impl, int rank, int layer, int kv)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[rank];
    size_t bytes = cuda__layer_kv_elems(b) * b->kv.elem_size;

    return (char *)(kv ? r->d_v : r->d_k) + (size_t)layer * bytes;
}

void *cuda__kv_data(void *impl, int layer, int kv)
{
    return cuda__kv_data_rank(impl, 0, layer, kv);
}

/* Rank op: copies block op_i0 to block op_i1 in every layer. */
static bt_status_t cuda_rank_kv_copy_block(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status = cuda__rank_enter(r);

    if (status != BT_OK)
        return status;
    for (int l = 0; l < b->kv.n_layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            char *base = cuda__kv_data_rank(b, rank, l, kv);
            status = BT_CUDA_STATUS(cudaMemcpyAsync(
                base + (size_t)b->op_i1 * blk, base + (size_t)b->op_i0 * blk,
                blk, cudaMemcpyDeviceToDevice, r->stream));
            if (status != BT_OK)
                return status;
        }
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
}

bt_status_t cuda__kv_copy_block(void *impl, int src_block,
                                int dst_block)
{
    cuda_backend_t *b = impl;

    if (src_block == dst_block)
        return BT_OK;
    b->op_i0 = src_block;
    b->op_i1 = dst_block;
    return cuda__each_rank(b, cuda_rank_kv_copy_block);
}

/* Rank op: op_i0 slot pairs (sources, then destinations, in h_meta) up
 * through the rank's metadata buffer, one kernel for K and V of every
 * layer. */
static bt_status_t cuda_rank_kv_copy_slots(void *arg, int rank)
{
    cuda_backend_t *b = arg;
    cuda_rank_t *r = &b->ranks[rank];
    int n = b->op_i0;
    bt_status_t status = cuda__rank_enter(r);

    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaMemcpyAsync(r->d_meta, b->h_meta,
                                            2 * (size_t)n * sizeof(int),
                                            cudaMemcpyHostToDevice,
                                            r->stream));
    if (status == BT_OK)
        status = cuda_kv_copy_slots(
            r->d_k, r->d_v, b->kv.n_layers,
            cuda__layer_kv_elems(b) * b->kv.elem_size,
            (size_t)b->kv_dim * b->kv.elem_size, r->d_meta, r->d_meta + n, n,
            r->stream);
    if (status != BT_OK) {
        (void)cudaStreamSynchronize(r->stream);
        return status;
    }
    return BT_CUDA_STATUS(cudaStreamSynchronize(r->stream));
}

/* backend_kv_copy_slots: slots up through the metadata buffer (free
 * between forwards), on every rank's pool. */
bt_status_t cuda__kv_copy_slots_op(void *impl, int n,
                                   const int *src_slots,
                                   const int *dst_slots)
{
    cuda_backend_t *b = impl;
    bt_status_t status = cuda__meta_reserve(b, 2 * (size_t)n, 1);

    if (status != BT_OK)
        return status;
    memcpy(b->h_meta, src_slots, (size_t)n * sizeof(int));
    memcpy(b->h_meta + n, dst_slots, (size_t)n * sizeof(int));
    b->op_i0 = n;
    return cuda__each_rank(b, cuda_rank_kv_copy_slots);
}

// ---------------------------------------------------------------------
// Host tier of the prefix cache (backend_kv_save / backend_kv_load)

/* The copy stream and its events, made at the first host-tier copy
 * (after cuda__rank_enter: rank 0's device). */
static bt_status_t cuda_host_tier_init(cuda_backend_t *b)
{
    bt_status_t status;

    if (b->copy_stream != NULL)
        return BT_OK;
    status = BT_CUDA_STATUS(cudaStreamCreateWithFlags(&b->copy_stream,
                                                      cudaStreamNonBlocking));
    if (status != BT_OK)
        return status;
    status = BT_CUDA_STATUS(cudaEventCreateWithFlags(&b->ev_queued,
                                                     cudaEventDisableTiming));
    if (status != BT_OK)
        goto err_stream;
    status = BT_CUDA_STATUS(cudaEventCreateWithFlags(&b->ev_copied,
                                                     cudaEventDisableTiming));
    if (status != BT_OK)
        goto err_queued;
    return BT_OK;

err_queued:
    (void)cudaEventDestroy(b->ev_queued);
    b->ev_queued = NULL;
err_stream:
    (void)cudaStreamDestroy(b->copy_stream);
    b->copy_stream = NULL;
    return status;
}

/* Waits for copies in flight (a load reads host memory the caller is
 * about to free), then frees the stream and events.  NULL-safe. */
void cuda__host_tier_free(cuda_backend_t *b)
{
    if (b->copy_stream == NULL)
        return;
    (void)cudaStreamSynchronize(b->copy_stream);
    (void)cudaEventDestroy(b->ev_copied);
    (void)cudaEventDestroy(b->ev_queued);
    (void)cudaStreamDestroy(b->copy_stream);
    b->copy_stream = NULL;
    b->ev_copied = NULL;
    b->ev_queued = NULL;
}

/* The copy stream's work after what the compute stream has queued
 * (ev_queued), and the compute stream's next work after the copies
 * (ev_copied): the two fences of cuda__kv_host_copy and cuda__kv_copy_in. */
static bt_status_t copy_after_compute(cuda_backend_t *b, cuda_rank_t *r)
{
    bt_status_t status =
        BT_CUDA_STATUS(cudaEventRecord(b->ev_queued, r->stream));

    if (status == BT_OK)
        status = BT_CUDA_STATUS(
            cudaStreamWaitEvent(b->copy_stream, b->ev_queued, 0));
    return status;
}

static bt_status_t compute_after_copy(cuda_backend_t *b, cuda_rank_t *r)
{
    bt_status_t status =
        BT_CUDA_STATUS(cudaEventRecord(b->ev_copied, b->copy_stream));

    if (status == BT_OK)
        status = BT_CUDA_STATUS(cudaStreamWaitEvent(r->stream, b->ev_copied,
                                                    0));
    return status;
}

/* One copy per layer, K and V, per run of blocks whose ids and host
 * slots are both consecutive (a 2D copy: device rows of one block, host
 * rows a slot apart), on the copy stream, so that neither waits for the
 * step in flight on the compute stream nor holds up the next one:
 *   - a save reads a cached block: complete (inserted only after the
 *     step or the verified hand-off that wrote it) and never written
 *     while cached, so it waits for nothing.  It returns complete: the
 *     evicted block may be handed at once to a peer that writes it
 *     outside these streams (CUDA IPC, UCX).
 *   - a load writes a block just taken from the allocator, which work
 *     queued on the compute stream may still read (its last owner's
 *     step): it waits for that work on the device (ev_queued), and is
 *     left in flight.  The host memory it reads is written only by later
 *     saves (this stream, so after it) and freed after host_pin(false)
 *     or destroy, which wait for it.
 * Either way the compute stream waits for the copies (ev_copied) before
 * its next work: no kernel writes a saved slot before the save read it,
 * none reads a loaded block before it landed, and every other use of the
 * pool (hand-off reads, block copies) runs on the compute stream or
 * after a step it finished.  tp == 1 (backend.c refuses more). */
bt_status_t cuda__kv_host_copy(void *impl, int n, const int *blocks,
                               void *const *host, bool to_host)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[0];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    size_t slot = 2 * (size_t)b->kv.n_layers * blk;
    bt_status_t status = cuda__rank_enter(r);

    if (status == BT_OK)
        status = cuda_host_tier_init(b);
    if (status != BT_OK)
        return status;
    if (!to_host)
        status = copy_after_compute(b, r);
    for (int i = 0, run; i < n && status == BT_OK; i += run) {
        for (run = 1; i + run < n && blocks[i + run] == blocks[i] + run &&
                      (char *)host[i + run] == (char *)host[i] + run * slot;
             run++)
            ;
        for (int l = 0; l < b->kv.n_layers && status == BT_OK; l++) {
            for (int kv = 0; kv < 2 && status == BT_OK; kv++) {
                char *dev = (char *)cuda__kv_data_rank(b, 0, l, kv) +
                            (size_t)blocks[i] * blk;
                char *h = (char *)host[i] + (2 * (size_t)l + kv) * blk;

                status = BT_CUDA_STATUS(
                    to_host ? cudaMemcpy2DAsync(h, slot, dev, blk, blk,
                                                (size_t)run,
                                                cudaMemcpyDeviceToHost,
                                                b->copy_stream)
                            : cudaMemcpy2DAsync(dev, blk, h, slot, blk,
                                                (size_t)run,
                                                cudaMemcpyHostToDevice,
                                                b->copy_stream));
            }
        }
    }
    if (status == BT_OK)
        status = compute_after_copy(b, r);
    if (status != BT_OK) {
        /* nothing half-done left behind: the caller drops the entry */
        (void)cudaStreamSynchronize(b->copy_stream);
        return status;
    }
    if (to_host)
        return BT_CUDA_STATUS(cudaEventSynchronize(b->ev_copied));
    return BT_OK;
}

/* backend_kv_copy_in: a CUDA IPC window (device memory of this GPU) into
 * the pool, one kernel for all of it (cuda_kv_window_to_pool: a
 * cudaMemcpyAsync per run of consecutive blocks, layer and K|V was up to
 * 64 calls a block of a fragmented pool on the loop), on the copy stream
 * after the work already queued
 * (the blocks' last owner may still be read: as a host-tier load), the
 * compute stream waiting for it.  Left in flight: waiting here would
 * hold the decode loop for the step in flight (~5 ms a hand-off at 16
 * req/s of 2,048-token prompts, H200); a host function behind the copies
 * says done, and the window's release waits for that on its own thread.
 * On an error nothing is left in flight (done not called).  tp == 1
 * (backend.c refuses more). */
bt_status_t cuda__kv_copy_in(void *impl, const void *src, int n,
                             const int *blocks, backend_done_fn_t done,
                             void *done_arg)
{
    cuda_backend_t *b = impl;
    cuda_rank_t *r = &b->ranks[0];
    size_t blk = (size_t)b->kv.block_size * b->kv_dim * b->kv.elem_size;
    bt_status_t status = cuda__rank_enter(r);

    if (status == BT_OK)
        status = cuda_host_tier_init(b);
    if (status == BT_OK)
        status = copy_after_compute(b, r);
    if (status == BT_OK)
        status = cuda_kv_window_to_pool(
            r->d_k, r->d_v, b->kv.n_layers,
            cuda__layer_kv_elems(b) * b->kv.elem_size, blk, src, blocks, n,
            b->copy_stream);
    if (status == BT_OK)
        status = compute_after_copy(b, r);
    if (status == BT_OK)
        status = BT_CUDA_STATUS(
            cudaLaunchHostFunc(b->copy_stream, done, done_arg));
    /* an error: nothing reads the window after return */
    if (status != BT_OK && b->copy_stream != NULL)
        (void)cudaStreamSynchronize(b->copy_stream);
    return status;
}

/* Page-locks the host tier (cudaHostRegister) so its copies are DMA at
 * PCIe speed instead of staged through a driver buffer. */
bt_status_t cuda__host_pin(void *impl, void *ptr, size_t bytes,
                           bool pin)
{
    cuda_backend_t *b = impl;

    /* a load in flight may still read it */
    if (!pin && b->copy_stream != NULL) {
        bt_status_t status = BT_CUDA_STATUS(
            cudaStreamSynchronize(b->copy_stream));
        if (status != BT_OK)
            return status;
    }
    if (!pin)
        return BT_CUDA_STATUS(cudaHostUnregister(ptr));
    return BT_CUDA_STATUS(
        cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
}
