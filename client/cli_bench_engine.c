/*
 * cli_bench_engine.c - `baton bench-engine`: prefill and decode tokens/s
 * of a backend at several batch sizes.
 *
 * Drives backend_forward directly with a kv_allocator (no engine, no
 * sampler): for each batch size B it times a prefill of B prompts of
 * prompt-len tokens, then `steps` decode steps in which all B sequences
 * advance one token together starting from context ctx (each sequence
 * feeds back its own argmax, picked by backend_forward_sample: on the
 * device for cuda, so only ids cross, as in the decode worker).  Every
 * measurement repeats until it has run for at least --seconds, and
 * reports the mean; decode also reports the median step (forward +
 * argmax of every sequence), which a shared box's scheduler stalls move
 * much less than the mean.
 */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "engine.h"
#include "kv/kv.h"
#include "spec/spec.h"

typedef struct {
    const char *model_path;
    const char *device;
    int *batches;         /* (n_batches) batch sizes */
    int n_batches;
    int ctx;              /* decode starts at this context length */
    int prompt_len;       /* prefill prompt length (default ctx) */
    int steps;            /* decode steps per timed window */
    int threads;          /* 0 = backend default (all cores) */
    int block_size;
    double seconds;       /* minimum time per measurement */
    int tp;               /* tensor-parallel ranks (cuda) */
    double bw_gbs;        /* read bandwidth per GPU for the floor */
    double spec_accept_rate; /* >= 0: speculative mode (forced rate) */
    int *spec_tokens;     /* (n_spec_tokens) tree sizes */
    int n_spec_tokens;
    int spec_depth;
    int spec_topk;
    int spec_warmup;      /* unmeasured spec steps before each cell */
    const char *spec_head; /* a real head instead of the synthetic one */
} bench_opts_t;

typedef struct {
    double prefill_tps;   /* prompt tokens per second */
    double prefill_ms;    /* per prefill batch */
    double decode_tps;    /* generated tokens per second, all sequences */
    double step_ms;       /* per decode step, mean */
    double step_med_ms;   /* per decode step, median */
} bench_result_t;

static void bench_usage(FILE *out)
{
    fprintf(out,
"usage: baton bench-engine --model PATH [options]\n"
"\n"
"Measures prefill and decode tokens/s of the compute backend.\n"
"\n"
"  --model PATH        llama2.c .bin, Hugging Face directory, or synth:NAME\n"
"  --device DEV        cpu, cuda or auto (default auto)\n"
"  --batch LIST        batch sizes, e.g. 1,8,32 (default 1,8,32)\n"
"  --ctx N             context length decode steps start from (default 64)\n"
"  --prompt-len P      prefill prompt length (default: ctx)\n"
"  --steps S           decode steps per timed window (default 32)\n"
"  --threads T         CPU threads, 0 = all cores (default 0)\n"
"  --block-size B      KV block size in tokens (default 16)\n"
"  --seconds X         minimum time per measurement (default 0.5)\n"
"  --tp N              tensor parallelism over GPUs 0..N-1 (cuda)\n"
"  --bw GBS            per-GPU read bandwidth of the decode floor column\n"
"                      (cuda; default 4500 GB/s, the H200's measured)\n"
"\n"
"Speculative decoding (EAGLE) cost per tree size:\n"
"  --spec-accept-rate R  instead of the table above: per batch size, plain\n"
"                      greedy decode (engine_step) vs speculative steps\n"
"                      with each tree size, through the engine.  The draft\n"
"                      head is synthetic (random weights, fc bias along one\n"
"                      token's classifier row: confident drafts, so trees\n"
"                      have a deep best path) and acceptance is FORCED: at\n"
"                      every level the best-scored child is accepted with\n"
"                      probability R whatever the target says, the bonus is\n"
"                      the target's greedy token.  Drafting, tree\n"
"                      verification, KV compaction and feature feeding run\n"
"                      as in serving; the tokens are not the model's.\n"
"  --spec-tokens LIST  tree sizes (draft tokens verified), default 4,8,16\n"
"  --spec-depth D      tree depth limit (default 5; depth = min(D, T))\n"
"  --spec-topk K       children per node (default 4)\n"
"  --spec-head PATH    a trained head instead of the synthetic one (with\n"
"                      no --spec-accept-rate: real acceptance)\n"
"  --spec-warmup N     unmeasured speculative steps before each cell\n"
"                      (default 16: at batch 32-64 the head's passes see\n"
"                      new row counts for their first dozen steps, each\n"
"                      run eagerly, then captured once; with 3 the cells\n"
"                      understated the steady state by 10-15%%)\n"
"  (--ctx is the prompt length, --steps the measured steps per cell)\n");
}

/* The decode step's physical floor in ms on the GPU backend: every rank
 * reads its shard of the layer weights and of the classifier (bf16) and
 * its KV heads of every sequence's context (the middle of the timed
 * window), all ranks in parallel at bw_gbs each. */
static double bench_floor_ms(const model_config_t *mc, const bench_opts_t *o,
                             int B)
{
    double hd = mc->head_dim, dim = mc->dim;
    double qd = mc->n_heads * hd, kvd = mc->n_kv_heads * hd;
    double layer = dim * (qd + 2 * kvd) + qd * dim + 3.0 * dim * mc->hidden_dim;
    double weights = 2.0 * (mc->n_layers * layer + (double)mc->vocab_size * dim);
    double ctx = o->ctx + o->steps / 2.0;
    double kv = 2.0 * B * ctx * mc->n_layers * 2.0 * kvd;

    return (weights + kv) / o->tp / (o->bw_gbs * 1e9) * 1e3;
}

static int bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* Runs one batch size; returns BT_OK and fills *res. */
static bt_status_t bench_one(backend_t *be, kv_allocator_t *alloc,
                             const model_config_t *mc,
                             const bench_opts_t *o, int B,
                             bench_result_t *res)
{
    int P = o->prompt_len, ctx = o->ctx, S = o->steps;
    int bs = o->block_size;
    int span = BT_MAX(P, ctx + S);
    int blocks_per_seq = BT_DIV_UP(span, bs);
    int *tables = NULL, *prompt = NULL, *cur = NULL;
    float *logits = NULL;
    sampler_t **greedy = NULL; /* (B) decode steps sample on the backend */
    uint64_t *step_ns = NULL; /* (cap_steps) timed decode steps */
    size_t n_steps = 0, cap_steps = 0;
    backend_seq_t *seqs = NULL;
    backend_batch_t batch = { .n_seqs = B };
    bt_status_t status = BT_ERR_NO_MEMORY;
    double t0, elapsed = 0;
    long reps;

    tables = bt_malloc((size_t)B * blocks_per_seq * sizeof(int), "bench");
    prompt = bt_malloc((size_t)BT_MAX(P, ctx) * sizeof(int), "bench");
    cur = bt_malloc((size_t)B * sizeof(int), "bench");
    logits = bt_malloc((size_t)B * mc->vocab_size * sizeof(float), "bench");
    seqs = bt_calloc((size_t)B, sizeof(*seqs), "bench");
    greedy = bt_calloc((size_t)B, sizeof(*greedy), "bench");
    if (tables == NULL || prompt == NULL || cur == NULL || logits == NULL ||
        seqs == NULL || greedy == NULL)
        goto out;
    for (int s = 0; s < B; s++) {
        sampler_params_t sp;
        sampler_params_init(&sp);
        status = sampler_create(&sp, mc->vocab_size, &greedy[s]);
        if (status != BT_OK)
            goto out;
    }
    status = kv_allocator_alloc(alloc, B * blocks_per_seq, tables);
    if (status != BT_OK) {
        status = BT_ERROR(status, "BENCH", "KV pool too small for batch %d",
                          B);
        goto out;
    }
    prompt[0] = BT_MAX(mc->bos_id, 0);
    for (int i = 1; i < BT_MAX(P, ctx); i++)
        prompt[i] = (int)((1103515245u * (unsigned)i + 12345u) >> 8) %
                    mc->vocab_size;
    batch.seqs = seqs;

    /* prefill: B prompts of P tokens */
    for (int s = 0; s < B; s++)
        seqs[s] = (backend_seq_t){ .n_tokens = P, .ctx_len = 0,
                                   .tokens = prompt,
                                   .block_table = tables +
                                       (size_t)s * blocks_per_seq,
                                   .n_logits = 1 };
    status = backend_forward(be, &batch, logits, NULL); /* warm-up */
    if (status != BT_OK)
        goto out_release;
    t0 = bt_time_s();
    reps = 0;
    do {
        status = backend_forward(be, &batch, logits, NULL);
        if (status != BT_OK)
            goto out_release;
        reps++;
        elapsed = bt_time_s() - t0;
    } while (elapsed < o->seconds);
    res->prefill_ms = elapsed * 1e3 / (double)reps;
    res->prefill_tps = (double)B * P * reps / elapsed;

    /* context [0, ctx) must be cached before decoding from ctx */
    if (ctx > 0 && ctx != P) {
        for (int s = 0; s < B; s++)
            seqs[s].n_tokens = ctx;
        status = backend_forward(be, &batch, logits, NULL);
        if (status != BT_OK)
            goto out_release;
    }

    /* decode: all B sequences advance S steps together from ctx */
    reps = 0;
    t0 = 0;
    for (long window = 0;; window++) {
        if (window == 1)
            t0 = bt_time_s(); /* window 0 is the warm-up */
        for (int s = 0; s < B; s++)
            cur[s] = prompt[BT_MAX(ctx, 1) - 1];
        if (window >= 1 && n_steps + (size_t)S > cap_steps) {
            size_t cap = BT_MAX(2 * cap_steps, (size_t)S * 64);
            uint64_t *p = bt_realloc(step_ns, cap * sizeof(*p), "bench");

            if (p == NULL) {
                status = BT_ERR_NO_MEMORY;
                goto out_release;
            }
            step_ns = p;
            cap_steps = cap;
        }
        for (int step = 0; step < S; step++) {
            uint64_t ts = bt_time_ns();

            for (int s = 0; s < B; s++)
                seqs[s] = (backend_seq_t){ .n_tokens = 1,
                                           .ctx_len = ctx + step,
                                           .tokens = &cur[s],
                                           .block_table = tables +
                                               (size_t)s * blocks_per_seq,
                                           .n_logits = 1 };
            /* greedy where the logits are (cuda: on the device, ids
             * come back), as the decode worker does */
            status = backend_forward_sample(be, &batch, greedy, cur, NULL,
                                            NULL);
            if (status != BT_OK)
                goto out_release;
            if (window >= 1)
                step_ns[n_steps++] = bt_time_ns() - ts;
        }
        if (window >= 1) {
            reps++;
            elapsed = bt_time_s() - t0;
            if (elapsed >= o->seconds)
                break;
        }
    }
    res->step_ms = elapsed * 1e3 / ((double)reps * S);
    res->decode_tps = (double)B * S * reps / elapsed;
    qsort(step_ns, n_steps, sizeof(*step_ns), bench_cmp_u64);
    res->step_med_ms = (double)step_ns[n_steps / 2] / 1e6;
    status = BT_OK;

out_release:
    kv_allocator_release(alloc, B * blocks_per_seq, tables);
out:
    bt_free(step_ns);
    bt_free(seqs);
    for (int s = 0; greedy != NULL && s < B; s++)
        sampler_destroy(&greedy[s]);
    bt_free(greedy);
    bt_free(logits);
    bt_free(cur);
    bt_free(prompt);
    bt_free(tables);
    return status;
}

// ----------------------------------------------------------------------------
// speculative decoding: --spec-accept-rate

/* The synthetic draft head of --spec-accept-rate: seeded random weights
 * (spec_head_create), then its fc bias is set to 30 / |c| * c for the
 * target's classifier row c of one token, so every draft distribution is
 * confident (that token near log-prob 0, the rest near -30): trees grow a
 * deep best path and a few side branches, like a trained head's. */
static bt_status_t bench_synth_head(engine_t *engine, spec_head_t **head_p)
{
    const model_config_t *mc = model_config(engine_model(engine));
    spec_head_t *head = NULL;
    const float *c;
    double norm = 0.0;
    int tok = mc->vocab_size / 3;
    bt_status_t status;

    status = spec_head_create(engine_model(engine), 0, 7, &head);
    if (status != BT_OK)
        return status;
    c = spec_head_classifier(head) + (size_t)tok * mc->dim;
    for (int i = 0; i < mc->dim; i++)
        norm += (double)c[i] * c[i];
    norm = sqrt(norm);
    for (int i = 0; i < mc->dim; i++)
        spec_head_weights(head)->fc_b[i] = (float)(30.0 / BT_MAX(norm, 1e-6) *
                                                   c[i]);
    *head_p = head;
    return BT_OK;
}

/* Feeds every pending prompt token of seqs (engine_step until each has
 * sampled its first token).  Only the sequences still prefilling step:
 * one whose prompt is done waits (otherwise the first ones decode while
 * the last prefill, start the measured steps with longer contexts and
 * hold more KV than the pool was sized for). */
static bt_status_t bench_prefill(engine_t *engine, engine_seq_t **seqs, int n,
                                 int *out)
{
    engine_seq_t **todo = bt_malloc(sizeof(*todo) * (size_t)BT_MAX(n, 1),
                                    "bench");
    bt_status_t status = BT_OK;

    if (todo == NULL)
        return BT_ERR_NO_MEMORY;
    for (;;) {
        int m = 0;

        for (int i = 0; i < n; i++)
            if (engine_seq_n_generated(seqs[i]) == 0)
                todo[m++] = seqs[i];
        if (m == 0)
            break;
        status = engine_step(engine, todo, m, 0, out);
        if (status != BT_OK)
            break;
    }
    bt_free(todo);
    return status;
}

/* B fresh sequences of a ctx-token prompt (distinct per sequence),
 * prefilled (their first token sampled). */
static bt_status_t bench_seqs(engine_t *engine, const bench_opts_t *o, int B,
                              engine_seq_t **seqs, int *prompt, int *out)
{
    const model_config_t *mc = model_config(engine_model(engine));
    sampler_params_t sp;
    bt_status_t status;

    sampler_params_init(&sp); /* greedy */
    for (int i = 0; i < B; i++) {
        prompt[0] = BT_MAX(mc->bos_id, 0);
        for (int j = 1; j < o->ctx; j++)
            prompt[j] = (int)((1103515245u * (unsigned)(j + 977 * i) +
                               12345u) >> 8) % mc->vocab_size;
        status = engine_seq_create(engine, prompt, o->ctx, &sp, &seqs[i]);
        if (status != BT_OK)
            return status;
    }
    return bench_prefill(engine, seqs, B, out);
}

/* GPU time of the engine's forwards so far (cuda; 0 elsewhere). */
static uint64_t bench_gpu_ns(engine_t *engine)
{
#ifdef BATON_HAVE_CUDA
    return cuda_backend_gpu_ns(engine_backend(engine));
#else
    (void)engine;
    return 0;
#endif
}

/* One batch size: plain engine_step decode of B fresh sequences for
 * `steps` steps, then for each tree size B fresh sequences, a few
 * warm-up and `steps` measured spec_step calls. */
static bt_status_t bench_spec_batch(engine_t *engine, spec_t **specs,
                                    const bench_opts_t *o, int B)
{
    engine_seq_t **seqs = bt_calloc((size_t)B, sizeof(*seqs), "bench");
    spec_seq_t **ss = bt_calloc((size_t)B, sizeof(*ss), "bench");
    int *prompt = bt_malloc((size_t)o->ctx * sizeof(int), "bench");
    int *out = bt_malloc((size_t)B * (SPEC_MAX_DEPTH + 2) * sizeof(int),
                         "bench");
    int *n_out = bt_malloc((size_t)B * sizeof(int), "bench");
    double plain_tps = 0.0, plain_ms = 0.0, plain_gpu_ms = 0.0;
    uint64_t plain_gpu0 = 0;
    bt_status_t status = BT_ERR_NO_MEMORY;

    if (seqs == NULL || ss == NULL || prompt == NULL || out == NULL ||
        n_out == NULL)
        goto out;
    status = bench_seqs(engine, o, B, seqs, prompt, out);
    if (status != BT_OK)
        goto out;
    /* plain: 2 warm-up steps, then `steps` timed */
    for (int s = 0; s < 2 + o->steps; s++) {
        uint64_t t0 = bt_time_ns();

        if (s == 2)
            plain_gpu0 = bench_gpu_ns(engine);
        status = engine_step(engine, seqs, B, 0, out);
        if (status != BT_OK)
            goto out;
        if (s >= 2)
            plain_ms += (double)(bt_time_ns() - t0) * 1e-6;
    }
    plain_gpu_ms = (double)(bench_gpu_ns(engine) - plain_gpu0) * 1e-6 /
                   o->steps;
    plain_tps = (double)B * o->steps / (plain_ms * 1e-3);
    for (int i = 0; i < B; i++)
        engine_seq_destroy(engine, &seqs[i]);
    printf("%6d %6s %8s %10.0f %10.3f %8s %8s %8s %8s %8s %8s\n", B, "plain",
           "-", plain_tps, plain_ms / o->steps, "1.00", "1.00", "-", "-", "-",
           "-");
    for (int t = 0; t < o->n_spec_tokens; t++) {
        spec_stats_t s0, s1;
        double ms = 0.0;
        long tokens = 0;

        status = bench_seqs(engine, o, B, seqs, prompt, out);
        if (status != BT_OK)
            goto out;
        for (int i = 0; i < B; i++) {
            status = spec_seq_create(specs[t], seqs[i], &ss[i]);
            if (status != BT_OK)
                goto out;
        }
        /* warm-up: the first step of a wrapped sequence is plain (no
         * draft features yet); then first sights of pass shapes */
        for (int s = 0; s < o->spec_warmup; s++) {
            status = spec_step(specs[t], ss, B, n_out, out);
            if (status != BT_OK)
                goto out;
        }
        spec_get_stats(specs[t], &s0);
        for (int s = 0; s < o->steps; s++) {
            uint64_t t0 = bt_time_ns();

            status = spec_step(specs[t], ss, B, n_out, out);
            if (status != BT_OK)
                goto out;
            ms += (double)(bt_time_ns() - t0) * 1e-6;
            for (int i = 0; i < B; i++)
                tokens += n_out[i];
        }
        spec_get_stats(specs[t], &s1);
        {
            double vs = (double)(s1.verify_seqs - s0.verify_seqs);
            double tps = (double)tokens / (ms * 1e-3);
            double n_st = (double)o->steps;

            printf("%6d %6d %8.2f %10.0f %10.3f %8.2f %8.2f %8.3f %8.3f "
                   "%8.3f %8.3f\n", B, o->spec_tokens[t],
                   vs > 0 ? (double)(s1.verify_tokens - s0.verify_tokens) /
                                vs : 0.0,
                   tps, ms / n_st, tps / plain_tps,
                   (ms / n_st) / (plain_ms / o->steps),
                   (double)(s1.draft_ns - s0.draft_ns) * 1e-6 / n_st,
                   (double)(s1.verify_ns - s0.verify_ns) * 1e-6 / n_st,
                   (double)(s1.accept_ns - s0.accept_ns) * 1e-6 / n_st,
                   (double)(s1.head_gpu_ns - s0.head_gpu_ns) * 1e-6 / n_st);
            fflush(stdout);
            if (s1.head_replays + s1.head_captures + s1.head_eager > 0)
                fprintf(stderr, "bench-engine: batch %d tree %d: measured "
                        "head passes %llu replayed, %llu captured, %llu "
                        "eager; GPU ms a step: verify %.3f, plain %.3f\n",
                        B, o->spec_tokens[t],
                        (unsigned long long)(s1.head_replays -
                                             s0.head_replays),
                        (unsigned long long)(s1.head_captures -
                                             s0.head_captures),
                        (unsigned long long)(s1.head_eager - s0.head_eager),
                        (double)(s1.verify_gpu_ns - s0.verify_gpu_ns) *
                            1e-6 / n_st,
                        plain_gpu_ms);
        }
        for (int i = 0; i < B; i++) {
            spec_seq_destroy(&ss[i]);
            engine_seq_destroy(engine, &seqs[i]);
        }
    }
    status = BT_OK;

out:
    for (int i = 0; ss != NULL && i < B; i++)
        spec_seq_destroy(&ss[i]);
    for (int i = 0; seqs != NULL && i < B; i++)
        engine_seq_destroy(engine, &seqs[i]);
    bt_free(seqs);
    bt_free(ss);
    bt_free(prompt);
    bt_free(out);
    bt_free(n_out);
    return status;
}

/* --spec-accept-rate: plain vs speculative decode tokens/s per batch size
 * and tree size (see bench_usage). */
static int bench_spec_main(const bench_opts_t *o)
{
    engine_config_t ecfg;
    engine_t *engine = NULL;
    spec_head_t *head = NULL;
    spec_t **specs = NULL;
    int max_b = 0, max_t = 0, depth_max = 0, ret = 1, span;
    bt_status_t status;

    for (int i = 0; i < o->n_batches; i++)
        max_b = BT_MAX(max_b, o->batches[i]);
    for (int t = 0; t < o->n_spec_tokens; t++) {
        max_t = BT_MAX(max_t, o->spec_tokens[t]);
        depth_max = BT_MAX(depth_max, BT_MIN(o->spec_depth,
                                             o->spec_tokens[t]));
    }
    /* prompt, then the plain steps or a tree's warm-up and measured steps
     * (each adds at most depth + 1 tokens) and one tree's slots */
    span = o->ctx + BT_MAX(2 + o->steps,
                           (o->spec_warmup + o->steps) * (depth_max + 1)) +
           max_t + 1;
    engine_config_init(&ecfg);
    ecfg.model_path = o->model_path;
    ecfg.device = o->device;
    ecfg.backend.block_size = o->block_size;
    ecfg.backend.max_seqs = max_b;
    ecfg.backend.n_threads = o->threads;
    ecfg.backend.tp_size = o->tp;
    ecfg.backend.n_kv_blocks = max_b * BT_DIV_UP(span, o->block_size) + 16;
    ecfg.backend.max_batch_tokens = BT_MAX(512, max_b * (max_t + 1));
    status = engine_create(&ecfg, &engine);
    if (status != BT_OK)
        goto out;
    if (span > engine_max_context(engine)) {
        BT_ERROR(BT_ERR_INVALID_ARG, "BENCH", "the run needs %d tokens of "
                 "context, the model has %d (lower --ctx or --steps)", span,
                 engine_max_context(engine));
        goto out;
    }

    if (o->spec_head != NULL)
        status = spec_head_load(engine_model(engine), o->spec_head, &head);
    else
        status = bench_synth_head(engine, &head);
    if (status != BT_OK)
        goto out;
    specs = bt_calloc((size_t)o->n_spec_tokens, sizeof(*specs), "bench");
    if (specs == NULL)
        goto out;
    for (int t = 0; t < o->n_spec_tokens; t++) {
        spec_config_t scfg;
        int tk = o->spec_tokens[t];

        spec_config_init(&scfg);
        scfg.tokens = tk;
        scfg.depth = BT_MIN(o->spec_depth, tk);
        scfg.topk = o->spec_topk;
        scfg.adaptive = false;
        status = spec_create(engine, head, &scfg, &specs[t]);
        if (status != BT_OK)
            goto out;
        if (o->spec_accept_rate >= 0.0)
            spec_test_force_accept(specs[t], o->spec_accept_rate, 1);
    }
    printf("model %s on %s, prompt %d tokens, %d measured steps; tree "
           "depth <= %d, top-k %d; %s head; forced acceptance %.2f per "
           "level (expected accepted length of a depth-D path: "
           "sum_{j=0..D} %.2f^j)\n\n", o->model_path,
           backend_name(engine_backend(engine)), o->ctx, o->steps,
           o->spec_depth, o->spec_topk,
           o->spec_head ? o->spec_head : "synthetic", o->spec_accept_rate,
           o->spec_accept_rate);
    printf("%6s %6s %8s %10s %10s %8s %8s %8s %8s %8s %8s\n", "batch",
           "tree", "acc.len", "tok/s", "ms/step", "speedup", "step x",
           "draft", "verify", "accept", "head gpu");
    for (int i = 0; i < o->n_batches; i++) {
        status = bench_spec_batch(engine, specs, o, o->batches[i]);
        if (status != BT_OK)
            goto out;
    }
    ret = 0;

out:
    for (int t = 0; specs != NULL && t < o->n_spec_tokens; t++)
        spec_destroy(&specs[t]);
    bt_free(specs);
    spec_head_destroy(&head);
    engine_destroy(&engine);
    return ret;
}

int cli_bench_engine_main(int argc, char **argv)
{
    bench_opts_t o = { .device = "auto", .ctx = 64, .prompt_len = -1,
                       .steps = 32, .threads = 0, .block_size = 16,
                       .seconds = 0.5, .tp = 1, .bw_gbs = 4500,
                       .spec_accept_rate = -1.0, .spec_depth = 5,
                       .spec_topk = 4, .spec_warmup = 16 };
    const char *batch_list = "1,8,32";
    const char *tree_list = "4,8,16";
    static const struct option long_opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "device", required_argument, NULL, 'd' },
        { "batch", required_argument, NULL, 'b' },
        { "ctx", required_argument, NULL, 'c' },
        { "prompt-len", required_argument, NULL, 'p' },
        { "steps", required_argument, NULL, 's' },
        { "threads", required_argument, NULL, 't' },
        { "block-size", required_argument, NULL, 'B' },
        { "seconds", required_argument, NULL, 'S' },
        { "tp", required_argument, NULL, 'T' },
        { "bw", required_argument, NULL, 'W' },
        { "spec-accept-rate", required_argument, NULL, 1001 },
        { "spec-tokens", required_argument, NULL, 1002 },
        { "spec-depth", required_argument, NULL, 1003 },
        { "spec-topk", required_argument, NULL, 1004 },
        { "spec-head", required_argument, NULL, 1005 },
        { "spec-warmup", required_argument, NULL, 1006 },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    model_t *model = NULL;
    backend_t *be = NULL;
    kv_allocator_t *alloc = NULL;
    backend_config_t cfg;
    const model_config_t *mc;
    int max_b = 0, ret = 1;
    bool floor = false;
    bt_status_t status;

    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL), bad = 0;

        if (c == -1)
            break;
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case 'd': o.device = optarg; break;
        case 'b': batch_list = optarg; break;
        case 'c': bad = bt_parse_int(optarg, &o.ctx) || o.ctx < 0; break;
        case 'p':
            bad = bt_parse_int(optarg, &o.prompt_len) || o.prompt_len < 1;
            break;
        case 's': bad = bt_parse_int(optarg, &o.steps) || o.steps < 1; break;
        case 't':
            bad = bt_parse_int(optarg, &o.threads) || o.threads < 0;
            break;
        case 'B':
            bad = bt_parse_int(optarg, &o.block_size) || o.block_size < 1;
            break;
        case 'S':
            bad = bt_parse_double(optarg, &o.seconds) || o.seconds < 0;
            break;
        case 'T':
            bad = bt_parse_int(optarg, &o.tp) || o.tp < 1 || o.tp > 64;
            break;
        case 'W':
            bad = bt_parse_double(optarg, &o.bw_gbs) || o.bw_gbs <= 0;
            break;
        case 1001:
            bad = bt_parse_double(optarg, &o.spec_accept_rate) ||
                  o.spec_accept_rate < 0 || o.spec_accept_rate > 1;
            break;
        case 1002: tree_list = optarg; break;
        case 1003:
            bad = bt_parse_int(optarg, &o.spec_depth) || o.spec_depth < 1 ||
                  o.spec_depth > SPEC_MAX_DEPTH;
            break;
        case 1004:
            bad = bt_parse_int(optarg, &o.spec_topk) || o.spec_topk < 1 ||
                  o.spec_topk > SPEC_MAX_TOPK;
            break;
        case 1005: o.spec_head = optarg; break;
        case 1006:
            bad = bt_parse_int(optarg, &o.spec_warmup) ||
                  o.spec_warmup < 1 || o.spec_warmup > 1000;
            break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton bench-engine: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (o.model_path == NULL || optind != argc) {
        bench_usage(stderr);
        return 2;
    }
    if (bt_parse_int_list(batch_list, &o.batches, &o.n_batches) != BT_OK) {
        fprintf(stderr, "baton bench-engine: bad --batch '%s'\n", batch_list);
        return 2;
    }
    for (int i = 0; i < o.n_batches; i++) {
        if (o.batches[i] < 1) {
            fprintf(stderr, "baton bench-engine: batch sizes must be >= 1\n");
            ret = 2;
            goto out;
        }
        max_b = BT_MAX(max_b, o.batches[i]);
    }
    if (o.prompt_len < 0)
        o.prompt_len = BT_MAX(o.ctx, 1);
    if (o.spec_accept_rate >= 0.0 || o.spec_head != NULL) {
        if (bt_parse_int_list(tree_list, &o.spec_tokens,
                              &o.n_spec_tokens) != BT_OK) {
            fprintf(stderr, "baton bench-engine: bad --spec-tokens '%s'\n",
                    tree_list);
            ret = 2;
            goto out;
        }
        for (int i = 0; i < o.n_spec_tokens; i++)
            if (o.spec_tokens[i] < 1 || o.spec_tokens[i] > SPEC_MAX_TOKENS) {
                fprintf(stderr, "baton bench-engine: tree sizes are "
                        "1..%d\n", SPEC_MAX_TOKENS);
                ret = 2;
                goto out;
            }
        o.ctx = BT_MAX(o.ctx, 1);
        ret = bench_spec_main(&o);
        goto out;
    }

    /* large synthesized models are generated on the GPU (seconds, no
     * host copy) */
    {
        const char *dev = backend_resolve(o.device);
        unsigned flags = dev != NULL && strcmp(dev, "cuda") == 0
                             ? MODEL_LOAD_SYNTH_LAZY_LARGE : 0;

        status = model_load_ex(o.model_path, flags, &model);
    }
    if (status != BT_OK)
        goto out;
    mc = model_config(model);
    if (o.ctx + o.steps > mc->max_seq_len)
        fprintf(stderr, "baton bench-engine: note: ctx + steps = %d is past "
                "the model's trained context %d\n", o.ctx + o.steps,
                mc->max_seq_len);
    backend_config_init(&cfg);
    cfg.block_size = o.block_size;
    cfg.n_kv_blocks = max_b * BT_DIV_UP(BT_MAX(o.prompt_len,
                                               o.ctx + o.steps),
                                        o.block_size);
    cfg.max_batch_tokens = max_b * BT_MAX(o.prompt_len, o.ctx);
    cfg.max_seqs = max_b;
    cfg.n_threads = o.threads;
    cfg.tp_size = o.tp;
    status = backend_create(o.device, model, &cfg, &be);
    if (status != BT_OK)
        goto out;
    status = kv_allocator_create(cfg.n_kv_blocks, &alloc);
    if (status != BT_OK)
        goto out;

    printf("model %s: dim %d, %d layers, %d/%d heads, vocab %d\n",
           o.model_path, mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads,
           mc->vocab_size);
    printf("device %s, threads %d (0 = all cores), block size %d, prompt "
           "%d tokens, decode ctx %d..%d\n\n", backend_name(be), o.threads,
           o.block_size, o.prompt_len, o.ctx, o.ctx + o.steps - 1);
    floor = strcmp(backend_name(be), "cuda") == 0;
    if (floor)
        printf("decode floor: (weights + KV read per step) / %d GPU(s) / "
               "%.0f GB/s each\n\n", o.tp, o.bw_gbs);
    printf("%6s %14s %12s %14s %10s %14s %10s%s\n", "batch", "prefill tok/s",
           "prefill ms", "decode tok/s", "ms/step", "med. tok/s",
           "med. ms", floor ? "   floor ms  floor/med" : "");
    for (int i = 0; i < o.n_batches; i++) {
        bench_result_t r = { 0 };

        status = bench_one(be, alloc, mc, &o, o.batches[i], &r);
        if (status != BT_OK)
            goto out;
        printf("%6d %14.0f %12.3f %14.0f %10.4f %14.0f %10.4f",
               o.batches[i], r.prefill_tps, r.prefill_ms, r.decode_tps,
               r.step_ms, o.batches[i] / (r.step_med_ms * 1e-3),
               r.step_med_ms);
        if (floor) {
            double f = bench_floor_ms(mc, &o, o.batches[i]);

            printf(" %10.4f %10.2f", f, f / r.step_med_ms);
        }
        printf("\n");
        fflush(stdout);
    }
    ret = 0;

out:
    if (ret == 1 && bt_error_last()[0] != '\0')
        fprintf(stderr, "baton bench-engine: %s\n", bt_error_last());
    kv_allocator_destroy(&alloc);
    backend_destroy(&be);
    model_destroy(&model);
    bt_free(o.batches);
    bt_free(o.spec_tokens);
    return ret;
}
