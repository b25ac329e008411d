/*
 * backend.c - picks a backend implementation by name and forwards calls
 * to its function table; validates batches for every implementation.
 */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "model/model_shard.h"

struct backend_s {
    const backend_ops_t *ops;
    void *impl;
    const model_t *model;
    backend_config_t cfg;
    /* backend_forward_sample's host path */
    float *sample_rows;     /* (sample_cap, vocab) logits when the caller
                             * gave none */
    int sample_cap;
    int sample_state;       /* 0 idle, 1 begun on the device, 2 begun on
                             * the host (status below) */
    bt_status_t sample_status;
};

static const backend_ops_t *backend_find(const char *name)
{
#ifdef BATON_HAVE_CUDA
    if (strcmp(name, "cuda") == 0)
        return &cuda_backend_ops;
    if (strcmp(name, "auto") == 0 && cuda_backend_ops.is_available())
        return &cuda_backend_ops;
#endif
    if (strcmp(name, "cpu") == 0 || strcmp(name, "auto") == 0)
        return &cpu_backend_ops;
    return NULL;
}

void backend_config_init(backend_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_kv_blocks = 256;
    cfg->block_size = 16;
    cfg->max_batch_tokens = 2048;
    cfg->max_seqs = 64;
    cfg->n_threads = 0;
    cfg->device_index = 0;
    cfg->precision = BACKEND_PRECISION_DEFAULT;
    cfg->kv_memory_fraction = 0.90;
}

const char *backend_kv_dtype_name(backend_kv_dtype_t dtype)
{
    switch (dtype) {
    case BACKEND_KV_DTYPE_AUTO:
        return "auto";
    case BACKEND_KV_DTYPE_BF16:
        return "bf16";
    case BACKEND_KV_DTYPE_FP8:
        return "fp8";
    }
    return "?";
}

bt_status_t backend_kv_dtype_parse(const char *name,
                                   backend_kv_dtype_t *dtype_p)
{
    if (strcmp(name, "auto") == 0)
        *dtype_p = BACKEND_KV_DTYPE_AUTO;
    else if (strcmp(name, "bf16") == 0)
        *dtype_p = BACKEND_KV_DTYPE_BF16;
    else if (strcmp(name, "fp8") == 0)
        *dtype_p = BACKEND_KV_DTYPE_FP8;
    else
        return BT_ERR_INVALID_ARG;
    return BT_OK;
}

void backend_kv8_scales(const model_layer_t *ml, int n_kv_heads,
                        float *scales)
{
    for (int h = 0; h < n_kv_heads; h++) {
        scales[h] = ml->k_scale ? ml->k_scale[h] : 1.0f;
        scales[n_kv_heads + h] = ml->v_scale ? ml->v_scale[h] : 1.0f;
    }
}

void backend_calib_add(backend_calib_stat_t *st, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        int bin;

        if (!(a > 0.0f)) {  /* zero (and NaN) count in the lowest bin */
            bin = 0;
        } else {
            bin = (int)floor((log2((double)a) + 32.0) * 16.0);
            bin = BT_MAX(0, BT_MIN(bin, BACKEND_CALIB_BINS - 1));
        }
        if (a > st->absmax)
            st->absmax = a;
        st->hist[bin]++;
        st->count++;
    }
}

double backend_calib_percentile(const backend_calib_stat_t *st, double p)
{
    uint64_t want, seen = 0;

    if (st->count == 0)
        return 0.0;
    if (p >= 100.0)
        return st->absmax;
    want = (uint64_t)ceil(p / 100.0 * (double)st->count);
    for (int b = 0; b < BACKEND_CALIB_BINS; b++) {
        seen += st->hist[b];
        if (seen >= want && seen > 0)
            return BT_MIN(st->absmax, exp2((b + 1) / 16.0 - 32.0));
    }
    return st->absmax;
}

bt_status_t backend__kv_blocks_auto(const backend_config_t *cfg,
                                    const model_config_t *mc,
                                    size_t token_bytes, size_t budget,
                                    int default_contexts, const char *what,
                                    int *n_blocks_p)
{
    int contexts = cfg->kv_auto_contexts > 0 ? cfg->kv_auto_contexts
                                              : default_contexts;
    size_t tokens = token_bytes > 0 ? budget / token_bytes : 0;
    size_t blocks;

    if (contexts > 0 && mc->max_seq_len > 0)
        tokens = BT_MIN(tokens, (size_t)contexts * (size_t)mc->max_seq_len);
    tokens = BT_MIN(tokens, (size_t)BACKEND_KV_MAX_TOKENS);
    blocks = tokens / (size_t)cfg->block_size;
    if (blocks < 1)
        return BT_ERROR(BT_ERR_NO_MEMORY, "ENGINE",
                        "no room for the KV pool: %s is %.1f MiB, one "
                        "block of %d tokens needs %.3f MiB (give "
                        "--kv-blocks, --kv-memory-gb or a larger "
                        "--kv-memory-fraction)", what,
                        (double)budget / 1048576.0, cfg->block_size,
                        (double)token_bytes * cfg->block_size / 1048576.0);
    *n_blocks_p = (int)blocks;
    return BT_OK;
}

int backend__max_seqs_auto(const backend_config_t *cfg, int n_kv_blocks,
                           int cap)
{
    int n = BT_MIN(cap, cfg->max_batch_tokens);

    if (n_kv_blocks > 0)
        n = BT_MIN(n, n_kv_blocks);
    return BT_MAX(n, 1);
}

size_t backend__host_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;

    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}

bt_status_t backend_create(const char *name, const model_t *model,
                           const backend_config_t *cfg, backend_t **backend_p)
{
    const backend_ops_t *ops = backend_find(name ? name : "auto");
    backend_t *backend;
    bt_status_t status;

    if (ops == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "unknown or unavailable device '%s' (this build "
                        "has: cpu%s)", name,
#ifdef BATON_HAVE_CUDA
                        ", cuda"
#else
                        ""
#endif
        );
    if (!ops->is_available())
        return BT_ERROR(BT_ERR_UNSUPPORTED, "ENGINE",
                        "device '%s' is not available on this machine",
                        ops->name);
    if (cfg->n_kv_blocks < 0 || cfg->block_size <= 0 ||
        cfg->max_batch_tokens <= 0 || cfg->max_seqs < 0 ||
        cfg->n_threads < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "backend sizes must be positive (kv blocks %d, "
                        "block size %d, batch tokens %d, seqs %d)",
                        cfg->n_kv_blocks, cfg->block_size,
                        cfg->max_batch_tokens, cfg->max_seqs);
    if (cfg->n_kv_blocks == 0 && cfg->kv_memory_bytes == 0 &&
        !(cfg->kv_memory_fraction > 0 && cfg->kv_memory_fraction <= 1))
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "KV memory fraction %g is outside (0, 1]",
                        cfg->kv_memory_fraction);
    if (cfg->precision == BACKEND_PRECISION_FP8 &&
        strcmp(ops->name, "cpu") != 0 && strcmp(ops->name, "cuda") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "ENGINE",
                        "precision fp8 runs on the cpu and cuda backends, "
                        "not on %s", ops->name);
    if (cfg->kv_dtype == BACKEND_KV_DTYPE_FP8 &&
        strcmp(ops->name, "cpu") != 0 && strcmp(ops->name, "cuda") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "ENGINE",
                        "--kv-dtype fp8 runs on the cpu and cuda backends, "
                        "not on %s", ops->name);
    if (cfg->calib != NULL && strcmp(ops->name, "cpu") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "ENGINE",
                        "calibration runs on the cpu backend only, not on "
                        "%s", ops->name);
    if (cfg->tp_size < 0 || cfg->tp_size > MODEL_SHARD_MAX_TP)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "tensor parallelism %d is outside 1..%d",
                        cfg->tp_size, MODEL_SHARD_MAX_TP);
    if (cfg->tp_size > 1) {
        if (ops->kv_data_rank == NULL)
            return BT_ERROR(BT_ERR_UNSUPPORTED, "ENGINE",
                            "tensor parallelism (tp %d) needs the cuda "
                            "backend, not %s", cfg->tp_size, ops->name);
        status = model_shard_check(model_config(model), cfg->tp_size);
        if (status != BT_OK)
            return status;
    }
    backend = bt_calloc(1, sizeof(*backend), "backend");
    if (backend == NULL)
        return BT_ERR_NO_MEMORY;
    backend->ops = ops;
    backend->model = model;
    backend->cfg = *cfg;
    status = ops->create(model, &backend->cfg, &backend->impl);
    if (status != BT_OK) {
        bt_free(backend);
        return status;
    }
    /* the sizes the implementation chose (auto KV, auto max_seqs) */
    BT_ASSERT(backend->cfg.n_kv_blocks > 0 && backend->cfg.max_seqs > 0);
    BT_ASSERT(ops->kv_layout(backend->impl)->n_blocks ==
              backend->cfg.n_kv_blocks);
    *backend_p = backend;
    return BT_OK;
}

void backend_destroy(backend_t **backend_p)
{
    backend_t *backend = *backend_p;

    if (backend == NULL)
        return;
    backend->ops->destroy(backend->impl);
    bt_free(backend->sample_rows);
    bt_free(backend);
    *backend_p = NULL;
}

const char *backend_name(const backend_t *backend)
{
    return backend->ops->name;
}

const backend_config_t *backend_config(const backend_t *backend)
{
    return &backend->cfg;
}

bt_status_t backend_mem_info(const backend_t *backend, size_t *free_p,
                             size_t *total_p)
{
    if (backend->ops->mem_info == NULL)
        return BT_ERR_UNSUPPORTED;
    return backend->ops->mem_info(backend->impl, free_p, total_p);
}

size_t backend_kv_token_bytes(const backend_t *backend)
{
    const kv_layout_t *lay = backend->ops->kv_layout(backend->impl);

    return 2 * (size_t)lay->n_layers * (size_t)lay->n_kv_heads *
           (size_t)lay->head_dim * (size_t)lay->elem_size;
}

int backend_step_quantum(const backend_t *backend)
{
    return backend->ops->step_quantum != NULL
               ? backend->ops->step_quantum(backend->impl)
               : 1;
}

void *backend__impl(const backend_t *backend)
{
    return backend->impl;
}

const char *backend_resolve(const char *name)
{
    const backend_ops_t *ops = backend_find(name ? name : "auto");

    return ops != NULL && ops->is_available() ? ops->name : NULL;
}

int backend_tp_size(const backend_t *backend)
{
    return backend->cfg.tp_size > 1 ? backend->cfg.tp_size : 1;
}

void *backend_kv_data_rank(backend_t *backend, int rank, int layer, int kv)
{
    BT_ASSERT(kv == 0 || kv == 1);
    BT_ASSERT(rank >= 0 && rank < backend_tp_size(backend));
    if (backend->ops->kv_data_rank == NULL)
        return backend->ops->kv_data(backend->impl, layer, kv);
    return backend->ops->kv_data_rank(backend->impl, rank, layer, kv);
}

bt_status_t backend_forward(backend_t *backend, const backend_batch_t *batch,
                            float *logits, float *hidden)
{
    bt_status_t status;

    status = backend_batch_validate(batch, model_config(backend->model),
                                    &backend->cfg);
    if (status != BT_OK)
        return status;
    return backend->ops->forward(backend->impl, batch, logits, hidden);
}

/* Host path: forward with logits rows on the host, then the sampler. */
static bt_status_t backend_sample_host(backend_t *backend,
                                       const backend_batch_t *batch,
                                       sampler_t *const *samplers, int *ids,
                                       float *logits, float *hidden)
{
    int vocab = model_config(backend->model)->vocab_size, rows = 0;
    float *buf = logits;
    bt_status_t status;

    for (int s = 0; s < batch->n_seqs; s++)
        rows += batch->seqs[s].n_logits;
    if (buf == NULL) {
        if (rows > backend->sample_cap) {
            float *grown = bt_malloc(sizeof(float) * (size_t)rows *
                                     (size_t)vocab, "backend_sample");
            if (grown == NULL)
                return BT_ERR_NO_MEMORY;
            bt_free(backend->sample_rows);
            backend->sample_rows = grown;
            backend->sample_cap = rows;
        }
        buf = backend->sample_rows;
    }
    status = backend->ops->forward(backend->impl, batch, buf, hidden);
    if (status != BT_OK)
        return status;
    for (int r = 0; r < rows; r++) {
        sampler_t *sm = samplers ? samplers[r] : NULL;
        ids[r] = sm ? sampler_sample(sm, buf + (size_t)r * vocab) : -1;
    }
    return BT_OK;
}

bt_status_t backend_forward_sample_begin(backend_t *backend,
                                         const backend_batch_t *batch,
                                         sampler_t *const *samplers, int *ids,
                                         float *logits, float *hidden)
{
    bool handled = false;
    bt_status_t status;

    BT_ASSERT(backend->sample_state == 0);
    status = backend_batch_validate(batch, model_config(backend->model),
                                    &backend->cfg);
    if (status != BT_OK)
        return status;
    if (backend->ops->forward_sample_begin != NULL) {
        status = backend->ops->forward_sample_begin(
            backend->impl, batch, samplers, ids, logits, hidden, &handled);
        if (status != BT_OK)
            return status;
    }
    if (handled) {
        backend->sample_state = 1;
        return BT_OK;
    }
    status = backend_sample_host(backend, batch, samplers, ids, logits,
                                 hidden);
    if (status != BT_OK)
        return status;
    backend->sample_state = 2;
    backend->sample_status = BT_OK;
    return BT_OK;
}

bt_status_t backend_forward_sample_end(backend_t *backend)
{
    int state = backend->sample_state;

    BT_ASSERT(state != 0);
    backend->sample_state = 0;
    if (state == 2)
        return backend->sample_status;
    return backend->ops->forward_sample_end(backend->impl);
}

bt_status_t backend_forward_sample(backend_t *backend,
                                   const backend_batch_t *batch,
                                   sampler_t *const *samplers, int *ids,
                                   float *logits, float *hidden)
{
    bt_status_t status = backend_forward_sample_begin(
        backend, batch, samplers, ids, logits, hidden);

    if (status != BT_OK)
        return status;
    return backend_forward_sample_end(backend);
}

const kv_layout_t *backend_kv_layout(const backend_t *backend)
{
    return backend->ops->kv_layout(backend->impl);
}

void *backend_kv_data(backend_t *backend, int layer, int kv)
{
    BT_ASSERT(kv == 0 || kv == 1);
    return backend->ops->kv_data(backend->impl, layer, kv);
}

bt_status_t backend_kv_copy_block(backend_t *backend, int src_block,
                                  int dst_block)
{
    if (src_block < 0 || src_block >= backend->cfg.n_kv_blocks ||
        dst_block < 0 || dst_block >= backend->cfg.n_kv_blocks)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "block copy %d -> %d outside the pool of %d",
                        src_block, dst_block, backend->cfg.n_kv_blocks);
    return backend->ops->kv_copy_block(backend->impl, src_block, dst_block);
}

size_t backend_kv_host_block_bytes(const backend_t *backend)
{
    const kv_layout_t *lay = backend->ops->kv_layout(backend->impl);

    return 2 * (size_t)lay->n_layers * kv_layout_block_bytes(lay);
}

static bt_status_t kv_host_copy(backend_t *backend, int n, const int *blocks,
                                void *const *host, bool to_host)
{
    if (backend_tp_size(backend) > 1 || backend->ops->kv_host_copy == NULL)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "BACKEND",
                        "%s backend%s: no host copies of KV blocks (the "
                        "prefix cache's host tier needs one GPU)",
                        backend->ops->name,
                        backend_tp_size(backend) > 1 ? " with tp > 1" : "");
    if (n < 0 || (n > 0 && (blocks == NULL || host == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "BACKEND",
                        "host copy of %d KV blocks without arrays", n);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= backend->cfg.n_kv_blocks ||
            host[i] == NULL)
            return BT_ERROR(BT_ERR_INVALID_ARG, "BACKEND",
                            "host copy of block %d outside the pool of %d "
                            "(or no host memory)", blocks[i],
                            backend->cfg.n_kv_blocks);
    if (n == 0)
        return BT_OK;
    return backend->ops->kv_host_copy(backend->impl, n, blocks, host,
                                      to_host);
}

bt_status_t backend_kv_save(backend_t *backend, int n, const int *blocks,
                            void *const *host)
{
    return kv_host_copy(backend, n, blocks, host, true);
}

bt_status_t backend_kv_load(backend_t *backend, int n, const int *blocks,
                            void *const *host)
{
    return kv_host_copy(backend, n, blocks, host, false);
}

bt_status_t backend_kv_copy_in(backend_t *backend, const void *src, int n,
                               const int *blocks, backend_done_fn_t done,
                               void *done_arg)
{
    if (backend_tp_size(backend) > 1 || backend->ops->kv_copy_in == NULL)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "BACKEND", "%s backend%s: no "
                        "KV window copy-in", backend->ops->name,
                        backend_tp_size(backend) > 1 ? " with tp > 1" : "");
    if (src == NULL || blocks == NULL || n < 1 || done == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "BACKEND", "window copy-in of "
                        "%d blocks without arrays", n);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= backend->cfg.n_kv_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, "BACKEND", "window copy-in "
                            "into block %d outside the pool of %d",
                            blocks[i], backend->cfg.n_kv_blocks);
    return backend->ops->kv_copy_in(backend->impl, src, n, blocks, done,
                                    done_arg);
}

bt_status_t backend_host_pin(backend_t *backend, void *ptr, size_t bytes,
                             bool pin)
{
    if (backend->ops->host_pin == NULL)
        return BT_OK;
    return backend->ops->host_pin(backend->impl, ptr, bytes, pin);
}

static int backend_int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;

    return (x > y) - (x < y);
}

bt_status_t backend_kv_copy_slots(backend_t *backend, int n,
                                  const int *src_slots, const int *dst_slots)
{
    long n_slots = (long)backend->cfg.n_kv_blocks * backend->cfg.block_size;
    int stack[64], *sorted = stack;
    bool dup = false;

    if (n < 0 || n > BACKEND_KV_COPY_MAX_SLOTS ||
        (n > 0 && (src_slots == NULL || dst_slots == NULL)))
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "slot copy of %d slots (0..%d allowed)", n,
                        BACKEND_KV_COPY_MAX_SLOTS);
    if (n == 0)
        return BT_OK;
    for (int i = 0; i < n; i++) {
        if (src_slots[i] < 0 || src_slots[i] >= n_slots ||
            dst_slots[i] < 0 || dst_slots[i] >= n_slots)
            return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                            "slot copy %d -> %d outside the pool of %ld "
                            "slots", src_slots[i], dst_slots[i], n_slots);
    }
    if (n > (int)BT_ARRAY_SIZE(stack)) {
        sorted = bt_malloc((size_t)n * sizeof(int), "backend");
        if (sorted == NULL)
            return BT_ERR_NO_MEMORY;
    }
    memcpy(sorted, dst_slots, (size_t)n * sizeof(int));
    qsort(sorted, (size_t)n, sizeof(int), backend_int_cmp);
    for (int i = 1; i < n && !dup; i++)
        dup = sorted[i] == sorted[i - 1];
    if (sorted != stack)
        bt_free(sorted);
    if (dup)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV",
                        "slot copy writes one destination slot twice");
    return backend->ops->kv_copy_slots(backend->impl, n, src_slots,
                                       dst_slots);
}

bt_status_t backend__kv_copy_slots_host(const kv_layout_t *lay, void *k,
                                        void *v, int n, const int *src_slots,
                                        const int *dst_slots)
{
    size_t row = (size_t)lay->n_kv_heads * lay->head_dim * lay->elem_size;
    size_t layer = kv_layout_layer_bytes(lay);
    char *tmp;

    if (n <= 0)
        return BT_OK;
    tmp = bt_malloc((size_t)n * row, "backend");
    if (tmp == NULL)
        return BT_ERR_NO_MEMORY;
    /* per layer and array: gather every source row, then scatter */
    for (int l = 0; l < lay->n_layers; l++) {
        for (int a = 0; a < 2; a++) {
            char *base = (char *)(a ? v : k) + (size_t)l * layer;

            for (int i = 0; i < n; i++)
                memcpy(tmp + (size_t)i * row,
                       base + (size_t)src_slots[i] * row, row);
            for (int i = 0; i < n; i++)
                if (src_slots[i] != dst_slots[i])
                    memcpy(base + (size_t)dst_slots[i] * row,
                           tmp + (size_t)i * row, row);
        }
    }
    bt_free(tmp);
    return BT_OK;
}

/* Whether any of ids[0..n) lies outside [0, limit).  One branch-free
 * pass the compiler vectorizes: every step checks the whole block table
 * of every sequence (256 sequences of 48 blocks at 512/512 on a GPU),
 * and an early exit per id kept it scalar (issue 36). */
static bool ids_out_of_range(const int *ids, int n, int limit)
{
    unsigned bad = 0;

    for (int i = 0; i < n; i++)
        bad |= (unsigned)ids[i] >= (unsigned)limit;
    return bad != 0;
}

/* The first of ids[0..n) outside [0, limit) (one is). */
static int first_out_of_range(const int *ids, int n, int limit)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit)
            return ids[i];
    return ids[0];
}

bt_status_t backend_batch_validate(const backend_batch_t *batch,
                                   const model_config_t *mcfg,
                                   const backend_config_t *cfg)
{
    long total = 0;

    if (batch == NULL || batch->n_seqs <= 0 || batch->seqs == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE", "empty batch");
    if (batch->n_seqs > cfg->max_seqs)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "batch of %d sequences exceeds max_seqs %d",
                        batch->n_seqs, cfg->max_seqs);
    for (int s = 0; s < batch->n_seqs; s++) {
        const backend_seq_t *seq = &batch->seqs[s];
        long end;
        int n_blocks;

        if (seq->n_tokens <= 0 || seq->ctx_len < 0 || seq->tokens == NULL ||
            seq->block_table == NULL || seq->n_logits < 0 ||
            seq->n_logits > seq->n_tokens)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "sequence %d of the batch is malformed "
                            "(n_tokens %d, ctx_len %d, n_logits %d)", s,
                            seq->n_tokens, seq->ctx_len, seq->n_logits);
        total += seq->n_tokens;
        end = (long)seq->ctx_len + seq->n_tokens;
        n_blocks = (int)BT_DIV_UP(end, cfg->block_size);
        if (n_blocks > cfg->n_kv_blocks)
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "sequence %d needs %d KV blocks, pool has %d",
                            s, n_blocks, cfg->n_kv_blocks);
        if (ids_out_of_range(seq->block_table, n_blocks, cfg->n_kv_blocks))
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "sequence %d: block id %d out of range", s,
                            first_out_of_range(seq->block_table, n_blocks,
                                               cfg->n_kv_blocks));
        if (ids_out_of_range(seq->tokens, seq->n_tokens, mcfg->vocab_size))
            return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                            "sequence %d: token id %d outside the "
                            "vocabulary of %d", s,
                            first_out_of_range(seq->tokens, seq->n_tokens,
                                               mcfg->vocab_size),
                            mcfg->vocab_size);
        for (int i = 0; seq->positions != NULL && i < seq->n_tokens; i++) {
            if (seq->positions[i] < 0)
                return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                                "sequence %d: negative position", s);
        }
    }
    if (total > cfg->max_batch_tokens)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "batch of %ld tokens exceeds max_batch_tokens %d",
                        total, cfg->max_batch_tokens);
    return BT_OK;
}
