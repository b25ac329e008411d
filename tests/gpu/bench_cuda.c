/*
 * bench_cuda.c - the CUDA backend's decode and prefill speed against the
 * physical floor of the H200 (run by `make gpu-bench`).
 *
 *   bench_cuda [--model synth:llama3-8b] [--batch 1,8,32,64,128]
 *              [--ctx 512,2048,8192] [--prefill 512,2048,8192]
 *              [--steps 20] [--table FILE] [--precision bf16|fp8]
 *              [--kv-dtype bf16|fp8] [--mixed B:C:N:L:K,...]
 *              [--kv-scatter]
 *
 * Decode rows: B sequences each at context C (the KV pool is filled with
 * non-zero values; contexts are not computed, only read), one token per
 * sequence per step, median step time over --steps steps after warm-up
 * (the first step captures the CUDA graph).  "step" keeps the logits on
 * the device (as an engine sampling on the GPU does); "+logits" also
 * copies the f32 logits to the host, as backend_forward's contract does;
 * "+sample" samples on the device with backend_forward_sample (greedy:
 * the argmax, only ids cross), "+top-p" the same with temperature 0.8,
 * top-p 0.95 (the top 256 candidates per row cross, sampled on the host).
 *   floor = (weight bytes + KV bytes read) / 4.5 TB/s.  The table ends
 *   with this device's own read ceiling (a read-only pass over 4 GiB,
 *   measured first), which says how fast a machine this one is; the
 *   last decode column is floor / step with the floor at that ceiling.
 * Mixed rows (--mixed, an aggregated worker's serving step): B decode
 *   rows at context C plus N prompt chunks of L tokens, each chunk at
 *   context K (0: a prompt's first chunk; K > 0: a later chunk that
 *   attends to K earlier tokens), one forward; the same call times the
 *   decode rows alone and the chunks alone, so "extra" is what mixing
 *   costs over running them apart, and "prompt tok/s" the chunks' rate
 *   inside the mixed step with the decode rows' own time taken out.
 * --kv-scatter: every table's blocks scattered over the whole pool (a
 *   fixed random permutation), as a serving worker's are, instead of
 *   one contiguous run a sequence.
 * Prefill rows: one prompt of P tokens, logits of its last token.
 *   floor = (2 x per-token params x P + causal attention FLOPs) /
 *           790 TFLOP/s (per-token params: every layer matrix; the
 *           classifier once).
 * ratio = floor / measured (1.0 = at the floor).
 * --precision fp8 (rows "decode fp8" / "prefill fp8"): the linears are
 * E4M3 (one byte a weight; embeddings, norms and classifier bf16), so
 * the decode floor reads those bytes, and the prefill floor counts the
 * linears' FLOPs at the dense fp8 rate (~1,400 TFLOP/s measured,
 * DEVICE.md), the classifier and attention at the bf16 one.
 * --kv-dtype fp8 (rows tagged "kv8"): the KV cache in E4M3 codes (one
 * byte an element, per-KV-head scales; the pool holds twice the tokens),
 * so the decode floor reads half the KV bytes.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kernels/gemv.h"
#include "model/model.h"
#include "sampler.h"

#define BW_READ 4.5e12   /* measured read bandwidth, B/s */
#define BF16_RATE 790e12 /* measured dense bf16 rate, FLOP/s */
#define FP8_RATE 1400e12 /* measured dense fp8 rate, FLOP/s */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return v[n / 2];
}

#ifdef BT_KPROF
/* kernels/kern_common.cuh's phase profile (a -DBT_KPROF=1 build) */
void cuda_kprof_dump_gemv(FILE *f);
void cuda_kprof_dump_attn_tc(FILE *f);
void cuda_kprof_dump_combine(FILE *f);
#endif

/* This device's read ceiling in bytes/s: the GEMM tuner's read-only L2
 * flush kernel (cuda_l2_flush: 528 blocks streaming 16-byte __ldcg
 * loads) over `bytes`, best of five; 0 when it cannot be measured.
 * H200s of one kind
 * differ by ~2-3% in decode speed (PERFORMANCE.md round 22); the floor
 * keeps the 4.5 TB/s, and this line says which kind of machine
 * a table came from. */
/* --kv-scatter: block id i of every table below is bench_blocks[i], a
 * fixed random permutation of the pool, as a serving worker's tables
 * are (its allocator hands a growing sequence one block at a time, the
 * lowest id free, among hundreds of other sequences); NULL: ids in
 * order, every sequence one contiguous run. */
static int *bench_blocks;

static int bench_block(int i)
{
    return bench_blocks != NULL ? bench_blocks[i] : i;
}

static void bench_scatter(int n_blocks)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;

    bench_blocks = malloc(sizeof(int) * (size_t)n_blocks);
    if (bench_blocks == NULL)
        return;
    for (int i = 0; i < n_blocks; i++)
        bench_blocks[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* Fisher-Yates, xorshift */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1)), t = bench_blocks[i];
        bench_blocks[i] = bench_blocks[j];
        bench_blocks[j] = t;
    }
}

static double read_ceiling(size_t bytes)
{
    void *d = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    float best = 0.0f;

    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    cudaMemset(d, 0, bytes);
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    for (int r = 0; r < 6; r++) {
        float ms = 0.0f;
        cudaEventRecord(ev[0], 0);
        if (cuda_l2_flush(d, bytes, 0) != BT_OK)
            break;
        cudaEventRecord(ev[1], 0);
        cudaEventSynchronize(ev[1]);
        cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (r > 0 && ms > 0.0f && (best == 0.0f || ms < best))
            best = ms; /* run 0 warms up */
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    cudaFree(d);
    (void)cudaGetLastError();
    return best > 0.0f ? (double)bytes / (best * 1e-3) : 0.0;
}

/* Median ms of `reps` forwards of `batch` (after two untimed). */
static double forward_ms(backend_t *be, backend_batch_t *batch, int reps)
{
    double t[16];

    reps = BT_MIN(reps, 16);
    for (int it = -2; it < reps; it++) {
        double a = bt_time_s();
        if (backend_forward(be, batch, NULL, NULL) != BT_OK)
            return -1.0;
        if (it >= 0)
            t[it] = bt_time_s() - a;
    }
    return median(t, reps) * 1e3;
}

/* The --mixed rows (see the header): entries B:C:N:L:K, comma
 * separated.  Decode rows take blocks from 0, prompt chunks after them. */
static int bench_mixed(backend_t *be, const model_config_t *mc,
                       const backend_config_t *cfg, const char *spec,
                       int n_blocks, const char *tag, FILE *tf)
{
    const int block_size = cfg->block_size;
    char *copy = strdup(spec), *save = NULL;
    char line[256];
    int rc = 0;

    snprintf(line, sizeof(line), "\n| mixed%s | decode rows @ctx | prompt "
             "chunks | step ms | decode alone ms | chunks alone ms | extra "
             "ms | prompt tok/s | |\n| --- | --- | --- | ---: | ---: | ---: "
             "| ---: | ---: | |\n", tag);
    fputs(line, stdout);
    if (tf)
        fputs(line, tf);
    for (char *e = strtok_r(copy, ",", &save); e != NULL && rc == 0;
         e = strtok_r(NULL, ",", &save)) {
        int B, C, N, L, K;
        if (sscanf(e, "%d:%d:%d:%d:%d", &B, &C, &N, &L, &K) != 5 || B < 0 ||
            C < 1 || N < 1 || L < 1 || K < 0 || B + N > cfg->max_seqs ||
            B + (long)N * L > cfg->max_batch_tokens) {
            fprintf(stderr, "bench_cuda: --mixed entry \"%s\": want "
                    "B:C:N:L:K, B + N <= %d sequences, B + N x L <= %d "
                    "tokens\n", e, cfg->max_seqs, cfg->max_batch_tokens);
            rc = 2;
            break;
        }
        int per_d = (int)BT_DIV_UP(C + 1, block_size);
        int per_p = (int)BT_DIV_UP(K + L, block_size);
        long need = (long)B * per_d + (long)N * per_p;
        if (need > n_blocks) {
            printf("| mixed%s | %d @%d | %d x %d @%d | skipped: %ld blocks "
                   "of %d | | | | | |\n", tag, B, C, N, L, K, need, n_blocks);
            continue;
        }
        backend_seq_t *seqs = calloc((size_t)(B + N), sizeof(*seqs));
        int *tables = malloc(sizeof(int) * (size_t)need);
        int *toks = malloc(sizeof(int) * (size_t)(B + (long)N * L));
        int next_block = 0, *tok = toks;
        for (int s = 0; s < B + N; s++) {
            bool dec = s < B;
            int n_tok = dec ? 1 : L, per = dec ? per_d : per_p;
            for (int i = 0; i < per; i++)
                tables[next_block + i] = bench_block(next_block + i);
            for (int i = 0; i < n_tok; i++)
                tok[i] = (int)(((long)s * 7919 + i * 104729L + 11) %
                               mc->vocab_size);
            seqs[s].n_tokens = n_tok;
            seqs[s].ctx_len = dec ? C - 1 : K;
            seqs[s].tokens = tok;
            seqs[s].block_table = &tables[next_block];
            seqs[s].n_logits = 1;
            next_block += per;
            tok += n_tok;
        }
        backend_batch_t all = { .n_seqs = B + N, .seqs = seqs };
        backend_batch_t dec = { .n_seqs = B, .seqs = seqs };
        backend_batch_t pre = { .n_seqs = N, .seqs = seqs + B };
        double m = forward_ms(be, &all, 7);
        double d = B > 0 ? forward_ms(be, &dec, 7) : 0.0;
        double p = forward_ms(be, &pre, 7);
        if (m < 0 || d < 0 || p < 0) {
            fprintf(stderr, "bench_cuda: mixed forward failed\n");
            rc = 1;
        } else {
            snprintf(line, sizeof(line), "| mixed%s | %d @%d | %d x %d @%d | "
                     "%.2f | %.2f | %.2f | %.2f | %.0f | |\n", tag, B, C, N,
                     L, K, m, d, p, m - d - p,
                     (double)N * L / ((m - d) * 1e-3));
            fputs(line, stdout);
            if (tf)
                fputs(line, tf);
        }
        free(seqs);
        free(tables);
        free(toks);
    }
    free(copy);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_path = "synth:llama3-8b";
    const char *batch_s = "1,8,32,64,128", *ctx_s = "512,2048,8192";
    const char *pre_s = "512,2048,8192", *table_path = NULL;
    const char *mixed_s = NULL;
    bool fp8 = false, kv8 = false, scatter = false;
    int *batches, *ctxs, *pres, nb, nc, np, steps = 20;
    int block_size = 16, n_blocks;
    model_t *m = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    FILE *tf = NULL;
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"batch", required_argument, NULL, 'b'},
        {"ctx", required_argument, NULL, 'c'},
        {"prefill", required_argument, NULL, 'p'},
        {"steps", required_argument, NULL, 's'},
        {"table", required_argument, NULL, 't'},
        {"precision", required_argument, NULL, 'P'},
        {"kv-dtype", required_argument, NULL, 'K'},
        {"mixed", required_argument, NULL, 'x'},
        {"kv-scatter", no_argument, NULL, 'S'},
        {NULL, 0, NULL, 0}};
    int opt;

    bt_log_init("bench_cuda"); /* BT_LOG=INFO: the tuner's picks */

    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case 'b': batch_s = optarg; break;
        case 'c': ctx_s = optarg; break;
        case 'p': pre_s = optarg; break;
        case 's': steps = atoi(optarg); break;
        case 't': table_path = optarg; break;
        case 'x': mixed_s = optarg; break;
        case 'S': scatter = true; break;
        case 'P':
            if (strcmp(optarg, "fp8") != 0 && strcmp(optarg, "bf16") != 0) {
                fprintf(stderr, "bench_cuda: --precision bf16 or fp8\n");
                return 2;
            }
            fp8 = strcmp(optarg, "fp8") == 0;
            break;
        case 'K':
            if (strcmp(optarg, "fp8") != 0 && strcmp(optarg, "bf16") != 0) {
                fprintf(stderr, "bench_cuda: --kv-dtype bf16 or fp8\n");
                return 2;
            }
            kv8 = strcmp(optarg, "fp8") == 0;
            break;
        default:
            fprintf(stderr, "usage: bench_cuda [--model M] [--batch L] "
                    "[--ctx L] [--prefill L] [--steps N] [--table F] "
                    "[--precision bf16|fp8] [--kv-dtype bf16|fp8] "
                    "[--mixed B:C:N:L:K,...] [--kv-scatter]\n");
            return 2;
        }
    }
    if (bt_parse_int_list(batch_s, &batches, &nb) != BT_OK ||
        bt_parse_int_list(ctx_s, &ctxs, &nc) != BT_OK ||
        bt_parse_int_list(pre_s, &pres, &np) != BT_OK) {
        fprintf(stderr, "bench_cuda: bad list\n");
        return 2;
    }

    /* before the model and the KV pool take the memory */
    const double ceiling = read_ceiling((size_t)4 << 30);
    double t0 = bt_time_s();
    /* large synth models are generated on the device (no host copy) */
    if (model_load_ex(model_path, MODEL_LOAD_SYNTH_LAZY_LARGE, &m) != BT_OK) {
        fprintf(stderr, "bench_cuda: cannot load %s\n", model_path);
        return 1;
    }
    const model_config_t *mc = model_config(m);
    double t1 = bt_time_s();
    /* KV pool: what the device has left after weights and ~6 GB for
     * activations and workspace. */
    {
        size_t free_b = 0, total_b = 0;
        double weights = (double)model_param_count(m) * 2;
        double blk = 2.0 * mc->n_layers * block_size * mc->n_kv_heads *
                     mc->head_dim * (kv8 ? 1 : 2);
        cudaMemGetInfo(&free_b, &total_b);
        double avail = (double)free_b - weights - 6e9;
        /* at most what a serving worker's pool holds on an H200 (bf16
         * KV ~56K blocks of 16, FP8 ~113K): the mixes of 2048/2048's
         * serving steps (342-512 rows @3072) need 66-99K FP8 blocks */
        const int cap = kv8 ? 120000 : 60000;

        n_blocks = BT_MIN((int)(avail / blk), cap);
    }
    if (scatter) {
        bench_scatter(n_blocks);
        if (bench_blocks == NULL) {
            fprintf(stderr, "bench_cuda: out of memory\n");
            return 1;
        }
    }
    backend_config_init(&cfg);
    cfg.block_size = block_size;
    cfg.n_kv_blocks = n_blocks;
    cfg.max_seqs = 128;
    cfg.max_batch_tokens = 8192;
    if (fp8)
        cfg.precision = BACKEND_PRECISION_FP8;
    if (kv8)
        cfg.kv_dtype = BACKEND_KV_DTYPE_FP8;
    for (int i = 0; i < np; i++)
        cfg.max_batch_tokens = BT_MAX(cfg.max_batch_tokens, pres[i]);
    /* --mixed entries of more sequences (a serving step of 342 rows) */
    for (const char *e = mixed_s; e != NULL && *e != '\0';) {
        int B = 0, C = 0, N = 0, L = 0, K = 0;
        if (sscanf(e, "%d:%d:%d:%d:%d", &B, &C, &N, &L, &K) == 5 && B >= 0 &&
            N >= 1 && L >= 1) {
            cfg.max_seqs = BT_MAX(cfg.max_seqs, B + N);
            cfg.max_batch_tokens =
                BT_MAX(cfg.max_batch_tokens, B + N * L);
        }
        e = strchr(e, ',');
        e = e != NULL ? e + 1 : NULL;
    }
    if (backend_create("cuda", m, &cfg, &be) != BT_OK) {
        fprintf(stderr, "bench_cuda: backend_create failed\n");
        return 1;
    }
    double t2 = bt_time_s();
    printf("model %s: %.2f B params, load %.1f s, upload %.1f s, KV pool "
           "%d blocks of %d\n", model_path, model_param_count(m) / 1e9,
           t1 - t0, t2 - t1, n_blocks, block_size);

    /* Non-zero KV contents (the pool is read, never computed here). */
    const kv_layout_t *kl = backend_kv_layout(be);
    size_t layer_bytes = (size_t)kl->n_blocks * kl->block_size *
                         kl->n_kv_heads * kl->head_dim * kl->elem_size;
    for (int l = 0; l < kl->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            cudaMemset(backend_kv_data(be, l, kv), 0x3c, layer_bytes);
    cudaDeviceSynchronize();

    /* Weight bytes one decode step reads (every matrix but the
     * embedding table, of which only B rows are read). */
    double layer_params = (double)mc->n_layers *
        ((double)mc->dim * (mc->n_heads + 2 * mc->n_kv_heads) * mc->head_dim +
         (double)mc->n_heads * mc->head_dim * mc->dim +
         3.0 * mc->dim * mc->hidden_dim + 2.0 * mc->dim);
    double cls_params = (double)mc->vocab_size * mc->dim;
    /* fp8: the linears one byte a weight, the 2 dim norms a layer bf16 */
    double lin_params = layer_params - 2.0 * mc->n_layers * mc->dim;
    double w_bytes = fp8 ? lin_params + 2.0 * (layer_params - lin_params +
                                               cls_params)
                         : 2.0 * (layer_params + cls_params);
    const char *tag = fp8 ? (kv8 ? " fp8 kv8" : " fp8")
                          : (kv8 ? " kv8" : "");
    double kv_tok_bytes = 2.0 * mc->n_layers * mc->n_kv_heads *
                          mc->head_dim * (double)kl->elem_size;

    if (table_path)
        tf = fopen(table_path, "w");
    float *logits = malloc(sizeof(float) * (size_t)mc->vocab_size * 128);
    char line[256];
#define EMIT(...)                                                           \
    do {                                                                    \
        snprintf(line, sizeof(line), __VA_ARGS__);                          \
        fputs(line, stdout);                                                \
        if (tf)                                                             \
            fputs(line, tf);                                                \
    } while (0)

    /* One small prompt first, outside any graph capture: the GEMM
     * autotuner (worker/cuda/gemm.c) times every decode token bucket of
     * each weight shape at its first uncaptured use; without this the
     * decode graphs below would be captured with the untuned defaults. */
    {
        int wt[64], wtab[4] = {0, 1, 2, 3};
        for (int i = 0; i < 64; i++)
            wt[i] = (i * 7919 + 11) % mc->vocab_size;
        backend_seq_t ws = { .n_tokens = 64, .ctx_len = 0, .tokens = wt,
                             .block_table = wtab, .n_logits = 1 };
        backend_batch_t wb = { .n_seqs = 1, .seqs = &ws };
        double a = bt_time_s();
        if (backend_forward(be, &wb, logits, NULL) != BT_OK) {
            fprintf(stderr, "warm-up prefill failed\n");
            return 1;
        }
        printf("warm-up prefill (64 tokens, includes GEMM autotuning): "
               "%.0f ms\n", (bt_time_s() - a) * 1e3);
    }

    EMIT("\n| decode%s | batch | ctx | step ms | +logits ms | +sample ms | "
         "+top-p ms | TPOT ms | floor ms | floor/step | tok/s | "
         "own floor/step |\n", tag);
    EMIT("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: |\n");
    for (int ci = 0; ci < nc; ci++) {
        for (int bi = 0; bi < nb; bi++) {
            int B = batches[bi], C = ctxs[ci];
            int per = (int)BT_DIV_UP(C + 1, block_size);
            if (B > 128 || (long)B * per > n_blocks) {
                EMIT("| decode%s | %d | %d | skipped: KV of %.0f GB does not "
                     "fit | | | | | | | | |\n", tag, B, C,
                     B * (double)C * kv_tok_bytes / 1e9);
                continue;
            }
            backend_seq_t *seqs = calloc(B, sizeof(*seqs));
            int *tables = malloc(sizeof(int) * (size_t)B * per);
            int *toks = malloc(sizeof(int) * B);
            for (int s = 0; s < B; s++) {
                for (int i = 0; i < per; i++)
                    tables[(size_t)s * per + i] = bench_block(s * per + i);
                toks[s] = (s * 7919 + 11) % mc->vocab_size;
                seqs[s].n_tokens = 1;
                seqs[s].ctx_len = C - 1;
                seqs[s].tokens = &toks[s];
                seqs[s].block_table = &tables[(size_t)s * per];
                seqs[s].n_logits = 1;
            }
            backend_batch_t batch = { .n_seqs = B, .seqs = seqs };
            double *dev = malloc(sizeof(double) * steps);
            double *host = malloc(sizeof(double) * steps);
            for (int w = 0; w < 3; w++)
                if (backend_forward(be, &batch, NULL, NULL) != BT_OK) {
                    fprintf(stderr, "forward failed\n");
                    return 1;
                }
            for (int it = 0; it < steps; it++) {
                double a = bt_time_s();
                backend_forward(be, &batch, NULL, NULL);
                dev[it] = bt_time_s() - a;
            }
            for (int it = 0; it < steps; it++) {
                double a = bt_time_s();
                backend_forward(be, &batch, logits, NULL);
                host[it] = bt_time_s() - a;
            }
            double smp[2];
            for (int kind = 0; kind < 2; kind++) {
                sampler_t **sm = calloc(B, sizeof(*sm));
                int *ids = malloc(sizeof(int) * B);
                double *t = malloc(sizeof(double) * steps);
                sampler_params_t sp;
                sampler_params_init(&sp);
                if (kind == 1) {
                    sp.temperature = 0.8f;
                    sp.top_p = 0.95f;
                }
                for (int s = 0; s < B; s++) {
                    sp.seed = (uint64_t)s;
                    if (sampler_create(&sp, mc->vocab_size, &sm[s]) != BT_OK)
                        return 1;
                }
                for (int it = -2; it < steps; it++) {
                    double a = bt_time_s();
                    if (backend_forward_sample(be, &batch, sm, ids, NULL,
                                               NULL) != BT_OK) {
                        fprintf(stderr, "forward_sample failed\n");
                        return 1;
                    }
                    if (it >= 0)
                        t[it] = bt_time_s() - a;
                }
                smp[kind] = median(t, steps) * 1e3;
                for (int s = 0; s < B; s++)
                    sampler_destroy(&sm[s]);
                free(sm); free(ids); free(t);
            }
            double d = median(dev, steps) * 1e3, h = median(host, steps) * 1e3;
            double floor_ms = (w_bytes + (double)B * C * kv_tok_bytes) /
                              BW_READ * 1e3;
            /* the last column: the floor at this device's own read
             * ceiling (the "measured read bandwidth") */
            const double own = ceiling > 0.0 ? floor_ms * BW_READ / ceiling
                                             : 0.0;
            EMIT("| decode%s | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | "
                 "%.3f | %.2f | %.0f | %.2f |\n", tag, B, C, d, h, smp[0],
                 smp[1], d, floor_ms, floor_ms / d, B / (d * 1e-3),
                 own / d);
#ifdef BT_KPROF
            /* the per-block phases of the last step's last layer */
            printf("KPROF batch %d ctx %d\n", B, C);
            cuda_kprof_dump_gemv(stdout);
            cuda_kprof_dump_attn_tc(stdout);
            cuda_kprof_dump_combine(stdout);
#endif
            free(seqs); free(tables); free(toks); free(dev); free(host);
        }
    }

    if (mixed_s != NULL &&
        bench_mixed(be, mc, &cfg, mixed_s, n_blocks, tag, tf) != 0)
        return 1;

    EMIT("\n| prefill%s | tokens | | TTFT ms | | | | | floor ms | floor/TTFT | "
         "tok/s | |\n", tag);
    EMIT("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | |\n");
    for (int pi = 0; pi < np; pi++) {
        if (pres[pi] <= 0)
            continue; /* --prefill 0: decode rows only */
        int P = pres[pi], per = (int)BT_DIV_UP(P, block_size);
        int *tables = malloc(sizeof(int) * per);
        int *toks = malloc(sizeof(int) * P);
        double t[5];
        for (int i = 0; i < per; i++)
            tables[i] = bench_block(i);
        for (int i = 0; i < P; i++)
            toks[i] = (i * 7919 + 11) % mc->vocab_size;
        backend_seq_t seq = { .n_tokens = P, .ctx_len = 0, .tokens = toks,
                              .block_table = tables, .n_logits = 1 };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
        backend_forward(be, &batch, logits, NULL);
        for (int it = 0; it < 5; it++) {
            double a = bt_time_s();
            if (backend_forward(be, &batch, logits, NULL) != BT_OK) {
                fprintf(stderr, "prefill failed\n");
                return 1;
            }
            t[it] = bt_time_s() - a;
        }
        double ms = median(t, 5) * 1e3;
        double flops = 2.0 * layer_params * P + 2.0 * cls_params +
                       4.0 * mc->n_layers * mc->n_heads * mc->head_dim *
                           (double)P * (P + 1) / 2;
        double floor_ms = flops / BF16_RATE * 1e3;
        if (fp8) /* the linears at the fp8 rate */
            floor_ms = (2.0 * lin_params * P / FP8_RATE +
                        (flops - 2.0 * lin_params * P) / BF16_RATE) * 1e3;
        EMIT("| prefill%s | %d | | %.2f | | | | | %.2f | %.2f | %.0f | |\n",
             tag, P, ms, floor_ms, floor_ms / ms, P / (ms * 1e-3));
        free(tables);
        free(toks);
    }
    if (ceiling > 0.0)
        EMIT("\nread ceiling of this device: %.2f TB/s (a read-only pass over "
             "4 GiB, best of 5; the floors use %.1f TB/s)\n",
             ceiling / 1e12, BW_READ / 1e12);
    if (tf)
        fclose(tf);
    free(logits);
    backend_destroy(&be);
    model_destroy(&m);
    bt_free(batches);
    bt_free(ctxs);
    bt_free(pres);
    free(bench_blocks);
    return 0;
}
