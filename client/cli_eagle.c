/*
 * cli_eagle.c - `baton eagle`: EAGLE draft heads for speculative decoding.
 *   train  fit a head to a target by self-distillation (CPU)
 *   bench  greedy tokens/s with and without speculation, and the mean
 *          accepted length, for a batch of sequences
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "cli.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "engine.h"
#include "spec/spec.h"
#include "spec/spec_head.h"
#include "spec/spec_train.h"

static void eagle_usage(FILE *out)
{
    fprintf(out,
"usage: baton eagle train --target MODEL --out HEAD.safetensors [options]\n"
"       baton eagle bench --target MODEL --head HEAD.safetensors [options]\n"
"\n"
"train: samples text from the target itself, records its features and fits\n"
"an EAGLE draft head (fusion layer + one decoder layer) with AdamW.\n"
"  --tokens N         training tokens to sample (default 262144)\n"
"  --epochs E         passes over them (default 8)\n"
"  --seed S           sampling/noise seed (default 1)\n"
"  --seq-len L        tokens per sampled text (default min(128, context))\n"
"  --lr X             AdamW peak learning rate (default 0.01)\n"
"  --batch B          texts per optimizer step (default 8)\n"
"  --temperature T    sampling temperature of the texts (default 0.3:\n"
"                     texts close to greedy teach the continuations that\n"
"                     decoding follows; 1 for heads that serve mostly\n"
"                     sampled decoding)\n"
"  --token-weight W   token cross-entropy weight (default 0.1, EAGLE)\n"
"  --noise X          uniform feature noise half-width (default 0.1)\n"
"  --hidden N         the head's feed-forward width (default: the\n"
"                     target's, as public EAGLE heads have)\n"
"\n"
"bench: greedy decoding of --batch sequences, plain then speculative\n"
"  (batch > 1: every slot decodes sequences back to back, as a server\n"
"  refills its batch; only steps with the whole batch are timed).\n"
"  --batch B          sequences decoded together (default 1)\n"
"  --gen N            tokens per sequence (default 96, capped by context)\n"
"  --prompt-ids IDS   prompt of every sequence (default BOS + one token\n"
"                     that differs per sequence)\n"
"  --spec-depth D     draft tree depth (default 8)\n"
"  --spec-topk K      draft children per node (default 4)\n"
"  --spec-tokens T    draft tokens per step (default 16)\n"
"  --spec-fixed       always use the full tree (no adaptation)\n"
"  --rounds R         measured runs of each (default 3)\n"
"  --spec-plain       run the speculative loop with speculation off\n"
"  --device DEV       cpu (default), cuda or auto: where the target and\n"
"                     the draft head run\n"
"  --precision P      cuda only: bf16 (default) or f32\n"
"\n"
"common:\n"
"  --threads N        CPU threads (default: all cores)\n");
}

enum {
    EO_TARGET = 2000, EO_OUT, EO_HEAD, EO_TOKENS, EO_EPOCHS, EO_SEED,
    EO_SEQ_LEN, EO_LR, EO_BATCH, EO_TEMP, EO_THREADS, EO_GEN, EO_PROMPT,
    EO_DEPTH, EO_TOPK, EO_STOKENS, EO_FIXED, EO_ROUNDS, EO_PLAIN, EO_WTOK,
    EO_NOISE, EO_DEVICE, EO_PRECISION, EO_HIDDEN
};

typedef struct {
    const char *target;
    const char *out;
    const char *head;
    const char *prompt_ids;
    const char *device;    /* bench: cpu (default), cuda or auto */
    backend_precision_t precision; /* bench on cuda: bf16 or f32 */
    int threads;
    int batch;
    int gen;
    int rounds;
    int hidden;  /* train: the head's feed-forward width, 0 = target's */
    bool fixed;
    bool plain; /* speculative loop with speculation off (overhead) */
    spec_train_config_t tcfg;
    spec_config_t scfg;
} eagle_opts_t;

static int eagle_parse(int argc, char **argv, eagle_opts_t *o)
{
    static const struct option long_opts[] = {
        { "target", required_argument, NULL, EO_TARGET },
        { "out", required_argument, NULL, EO_OUT },
        { "head", required_argument, NULL, EO_HEAD },
        { "tokens", required_argument, NULL, EO_TOKENS },
        { "epochs", required_argument, NULL, EO_EPOCHS },
        { "seed", required_argument, NULL, EO_SEED },
        { "seq-len", required_argument, NULL, EO_SEQ_LEN },
        { "lr", required_argument, NULL, EO_LR },
        { "batch", required_argument, NULL, EO_BATCH },
        { "temperature", required_argument, NULL, EO_TEMP },
        { "threads", required_argument, NULL, EO_THREADS },
        { "gen", required_argument, NULL, EO_GEN },
        { "prompt-ids", required_argument, NULL, EO_PROMPT },
        { "spec-depth", required_argument, NULL, EO_DEPTH },
        { "spec-topk", required_argument, NULL, EO_TOPK },
        { "spec-tokens", required_argument, NULL, EO_STOKENS },
        { "spec-fixed", no_argument, NULL, EO_FIXED },
        { "rounds", required_argument, NULL, EO_ROUNDS },
        { "spec-plain", no_argument, NULL, EO_PLAIN },
        { "token-weight", required_argument, NULL, EO_WTOK },
        { "noise", required_argument, NULL, EO_NOISE },
        { "hidden", required_argument, NULL, EO_HIDDEN },
        { "device", required_argument, NULL, EO_DEVICE },
        { "precision", required_argument, NULL, EO_PRECISION },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL), bad = 0;
        uint64_t u;

        if (c == -1)
            break;
        switch (c) {
        case EO_TARGET: o->target = optarg; break;
        case EO_OUT: o->out = optarg; break;
        case EO_HEAD: o->head = optarg; break;
        case EO_PROMPT: o->prompt_ids = optarg; break;
        case EO_FIXED: o->fixed = true; break;
        case EO_PLAIN: o->plain = true; break;
        case EO_DEVICE: o->device = optarg; break;
        case EO_PRECISION:
            if (strcmp(optarg, "f32") == 0)
                o->precision = BACKEND_PRECISION_F32;
            else if (strcmp(optarg, "bf16") == 0)
                o->precision = BACKEND_PRECISION_BF16;
            else
                bad = 1;
            break;
        case EO_TOKENS:
            bad = bt_parse_int(optarg, &o->tcfg.n_tokens) != BT_OK ||
                  o->tcfg.n_tokens < 16;
            break;
        case EO_EPOCHS:
            bad = bt_parse_int(optarg, &o->tcfg.epochs) != BT_OK ||
                  o->tcfg.epochs < 1;
            break;
        case EO_SEED:
            bad = bt_parse_u64(optarg, &u) != BT_OK;
            o->tcfg.seed = u;
            break;
        case EO_SEQ_LEN:
            bad = bt_parse_int(optarg, &o->tcfg.seq_len) != BT_OK ||
                  o->tcfg.seq_len < 3;
            break;
        case EO_LR:
            bad = bt_parse_float(optarg, &o->tcfg.lr) != BT_OK ||
                  !(o->tcfg.lr > 0);
            break;
        case EO_BATCH:
            bad = bt_parse_int(optarg, &o->batch) != BT_OK || o->batch < 1;
            o->tcfg.batch_seqs = o->batch;
            break;
        case EO_TEMP:
            bad = bt_parse_float(optarg, &o->tcfg.temperature) != BT_OK ||
                  !(o->tcfg.temperature > 0);
            break;
        case EO_THREADS:
            bad = bt_parse_int(optarg, &o->threads) != BT_OK ||
                  o->threads < 0;
            break;
        case EO_WTOK:
            bad = bt_parse_float(optarg, &o->tcfg.w_tok) != BT_OK ||
                  o->tcfg.w_tok < 0;
            break;
        case EO_NOISE:
            bad = bt_parse_float(optarg, &o->tcfg.noise) != BT_OK ||
                  o->tcfg.noise < 0;
            break;
        case EO_ROUNDS:
            bad = bt_parse_int(optarg, &o->rounds) != BT_OK ||
                  o->rounds < 1;
            break;
        case EO_HIDDEN:
            bad = bt_parse_int(optarg, &o->hidden) != BT_OK ||
                  o->hidden < 1 || o->hidden > 65536;
            break;
        case EO_GEN:
            bad = bt_parse_int(optarg, &o->gen) != BT_OK || o->gen < 1;
            break;
        case EO_DEPTH:
            bad = bt_parse_int(optarg, &o->scfg.depth) != BT_OK;
            break;
        case EO_TOPK:
            bad = bt_parse_int(optarg, &o->scfg.topk) != BT_OK;
            break;
        case EO_STOKENS:
            bad = bt_parse_int(optarg, &o->scfg.tokens) != BT_OK;
            break;
        case 'h':
            eagle_usage(stdout);
            return 0;
        default:
            eagle_usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "baton eagle: invalid value '%s'\n", optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton eagle: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    if (spec_config_validate(&o->scfg) != BT_OK) {
        fprintf(stderr, "baton eagle: %s\n", bt_error_last());
        return 2;
    }
    return -1;
}

static bt_status_t eagle_engine(const eagle_opts_t *o, int max_seqs,
                                engine_t **engine_p)
{
    engine_config_t ecfg;

    engine_config_init(&ecfg);
    ecfg.model_path = o->target;
    ecfg.device = o->device != NULL ? o->device : "cpu";
    ecfg.backend.precision = o->precision;
    ecfg.backend.n_threads = o->threads;
    ecfg.backend.max_seqs = BT_MAX(ecfg.backend.max_seqs, max_seqs);
    ecfg.backend.n_kv_blocks = 1024;
    return engine_create(&ecfg, engine_p);
}

static int eagle_train(const eagle_opts_t *o)
{
    engine_t *engine = NULL;
    spec_train_data_t *data = NULL;
    spec_head_t *head = NULL;
    spec_train_report_t rep;
    spec_train_config_t tcfg = o->tcfg;
    uint64_t t0 = bt_time_ns();
    double t_data;
    bt_status_t status;
    int ret = 1;

    if (o->target == NULL || o->out == NULL) {
        fprintf(stderr, "baton eagle train: need --target and --out\n");
        return 2;
    }
    tcfg.verbose = 1;
    tcfg.n_threads = o->threads;
    status = eagle_engine(o, 64, &engine);
    if (status != BT_OK)
        goto out;
    status = spec_train_data_create(engine, &tcfg, &data);
    if (status != BT_OK)
        goto out;
    t_data = (double)(bt_time_ns() - t0) * 1e-9;
    status = spec_head_create(engine_model(engine), o->hidden, tcfg.seed,
                              &head);
    if (status != BT_OK)
        goto out;
    status = spec_train(head, data, &tcfg, &rep);
    if (status != BT_OK)
        goto out;
    status = spec_head_save(head, o->out);
    if (status != BT_OK)
        goto out;
    fprintf(stderr, "texts:%d tokens:%d data_s:%.1f train_s:%.1f "
            "first_loss:%.5f last_loss:%.5f top1:%.3f\n",
            spec_train_data_texts(data), spec_train_data_tokens(data),
            t_data, rep.seconds, rep.first_loss, rep.last_loss,
            rep.last_top1);
    ret = 0;

out:
    if (ret != 0)
        fprintf(stderr, "baton eagle train: %s\n",
                bt_error_last()[0] ? bt_error_last() : "failed");
    spec_head_destroy(&head);
    spec_train_data_destroy(&data);
    engine_destroy(&engine);
    return ret;
}

/* The prompt of sequence number k: the given one, its second id varied
 * per sequence when it has two (BOS + one token). */
static void eagle_prompt(const engine_t *engine, const int *prompt,
                         int n_prompt, int k, int *p)
{
    memcpy(p, prompt, sizeof(int) * (size_t)n_prompt);
    if (n_prompt == 2)
        p[1] = (prompt[1] + 37 * k) %
               model_config(engine_model(engine))->vocab_size;
}

static bt_status_t eagle_seq_new(engine_t *engine, spec_t *spec,
                                 const int *p, int n_prompt,
                                 engine_seq_t **seq_p, spec_seq_t **ss_p)
{
    sampler_params_t sp;
    bt_status_t status;

    sampler_params_init(&sp);
    status = engine_seq_create(engine, p, n_prompt, &sp, seq_p);
    if (status == BT_OK && spec != NULL)
        status = spec_seq_create(spec, *seq_p, ss_p);
    return status;
}

/* Batch > 1, as a server runs it: every slot of the batch decodes
 * sequences back to back (a finished one is replaced at once, its
 * successor's prefill joining the next step), and the clock stops when
 * the first slot has run EAGLE_REFILL sequences, so every timed step
 * has the whole batch.  (Decoding `batch` sequences in lockstep to the
 * end instead gives speculation a ragged tail that plain decoding does
 * not have: sequences that accept more finish first and the last steps
 * run a fraction of the batch at full step cost.)  Tokens: every id
 * generated in the timed steps. */
#define EAGLE_REFILL 3

static bt_status_t eagle_decode_refill(engine_t *engine, spec_t *spec,
                                       const int *prompt, int n_prompt,
                                       int batch, int gen, int *p,
                                       engine_seq_t **seqs,
                                       spec_seq_t **ss, int *n_out,
                                       int *out, double *secs_p,
                                       long *tokens_p)
{
    int *runs = bt_calloc((size_t)batch, sizeof(int), "cli");
    int next = 0;
    long total = 0;
    uint64_t t0;
    bt_status_t status = BT_OK;

    if (runs == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < batch && status == BT_OK; i++) {
        eagle_prompt(engine, prompt, n_prompt, next++, p);
        status = eagle_seq_new(engine, spec, p, n_prompt, &seqs[i], &ss[i]);
        runs[i] = 1;
    }
    t0 = bt_time_ns();
    for (bool full = true; full && status == BT_OK;) {
        long before = 0, after = 0;

        for (int i = 0; i < batch; i++)
            before += engine_seq_n_generated(seqs[i]);
        status = spec != NULL ? spec_step(spec, ss, batch, n_out, out)
                              : engine_step(engine, seqs, batch, 0, out);
        if (status != BT_OK)
            break;
        for (int i = 0; i < batch; i++)
            after += engine_seq_n_generated(seqs[i]);
        total += after - before;
        for (int i = 0; i < batch && status == BT_OK; i++) {
            if (engine_seq_n_generated(seqs[i]) < gen)
                continue;
            if (runs[i] == EAGLE_REFILL) {
                full = false; /* the batch would shrink from here */
                break;
            }
            spec_seq_destroy(&ss[i]);
            engine_seq_destroy(engine, &seqs[i]);
            eagle_prompt(engine, prompt, n_prompt, next++, p);
            status = eagle_seq_new(engine, spec, p, n_prompt, &seqs[i],
                                   &ss[i]);
            runs[i]++;
        }
    }
    *secs_p = (double)(bt_time_ns() - t0) * 1e-9;
    *tokens_p = total;
    bt_free(runs);
    return status;
}

/* Greedy decoding of `batch` sequences for `gen` tokens each; with spec
 * when spec != NULL.  Returns wall seconds of the decode phase (batch >
 * 1: eagle_decode_refill). */
static bt_status_t eagle_decode(engine_t *engine, spec_t *spec,
                                const int *prompt, int n_prompt, int batch,
                                int gen, double *secs_p, long *tokens_p)
{
    engine_seq_t **seqs = bt_calloc((size_t)batch, sizeof(*seqs), "cli");
    spec_seq_t **ss = bt_calloc((size_t)batch, sizeof(*ss), "cli");
    int *n_out = bt_calloc((size_t)batch, sizeof(int), "cli");
    int *out = bt_calloc((size_t)batch * (size_t)(SPEC_MAX_DEPTH + 2),
                         sizeof(int), "cli");
    int *p = bt_malloc(sizeof(int) * (size_t)n_prompt, "cli");
    uint64_t t0 = 0;
    long total = 0;
    bt_status_t status = BT_OK;

    if (seqs == NULL || ss == NULL || n_out == NULL || out == NULL ||
        p == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    if (batch > 1) {
        status = eagle_decode_refill(engine, spec, prompt, n_prompt, batch,
                                     gen, p, seqs, ss, n_out, out, secs_p,
                                     tokens_p);
        goto out;
    }
    for (int i = 0; i < batch; i++) {
        eagle_prompt(engine, prompt, n_prompt, i, p);
        status = eagle_seq_new(engine, spec, p, n_prompt, &seqs[i], &ss[i]);
        if (status != BT_OK)
            goto out;
    }
    /* prefill (untimed), then decode */
    for (;;) {
        bool prefilling = false;

        for (int i = 0; i < batch; i++)
            prefilling |= engine_seq_len(seqs[i]) -
                          engine_seq_cached(seqs[i]) > 1 ||
                          engine_seq_n_generated(seqs[i]) == 0;
        if (!prefilling)
            break;
        status = spec != NULL ? spec_step(spec, ss, batch, n_out, out)
                              : engine_step(engine, seqs, batch, 0, out);
        if (status != BT_OK)
            goto out;
    }
    t0 = bt_time_ns();
    for (;;) {
        int live = 0;
        engine_seq_t *ls[256];
        spec_seq_t *lss[256];

        for (int i = 0; i < batch; i++)
            if (engine_seq_n_generated(seqs[i]) < gen) {
                ls[live] = seqs[i];
                lss[live++] = ss[i];
            }
        if (live == 0)
            break;
        status = spec != NULL ? spec_step(spec, lss, live, n_out, out)
                              : engine_step(engine, ls, live, 0, out);
        if (status != BT_OK)
            goto out;
    }
    for (int i = 0; i < batch; i++)
        total += engine_seq_n_generated(seqs[i]) - 1;
    *secs_p = (double)(bt_time_ns() - t0) * 1e-9;
    *tokens_p = total;

out:
    for (int i = 0; seqs != NULL && i < batch; i++) {
        if (ss != NULL)
            spec_seq_destroy(&ss[i]);
        engine_seq_destroy(engine, &seqs[i]);
    }
    bt_free(seqs);
    bt_free(ss);
    bt_free(n_out);
    bt_free(out);
    bt_free(p);
    return status;
}

static int eagle_bench(const eagle_opts_t *o)
{
    engine_t *engine = NULL;
    spec_head_t *head = NULL;
    spec_t *spec = NULL;
    int *prompt = NULL, n_prompt = 0, gen, batch = BT_MAX(1, o->batch);
    double t_plain, t_spec;
    uint64_t plain_gpu_ns = 0; /* cuda: the plain rounds' GPU time */
    long n_plain, n_spec;
    spec_stats_t st, st0;
    bt_status_t status;
    int ret = 1;

    if (o->target == NULL || o->head == NULL) {
        fprintf(stderr, "baton eagle bench: need --target and --head\n");
        return 2;
    }
    if (batch > 256) {
        fprintf(stderr, "baton eagle bench: --batch at most 256\n");
        return 2;
    }
    if (o->prompt_ids != NULL) {
        if (bt_parse_int_list(o->prompt_ids, &prompt, &n_prompt) != BT_OK ||
            n_prompt < 1) {
            fprintf(stderr, "baton eagle bench: bad --prompt-ids\n");
            return 2;
        }
    } else {
        n_prompt = 2;
        prompt = bt_malloc(sizeof(int) * 2, "cli");
        if (prompt == NULL)
            return 1;
        prompt[0] = 1;
        prompt[1] = 300;
    }
    status = eagle_engine(o, batch, &engine);
    if (status != BT_OK)
        goto out;
    gen = BT_MIN(o->gen, engine_max_context(engine) - n_prompt -
                             o->scfg.tokens - 1);
    if (gen < 2) {
        BT_ERROR(BT_ERR_INVALID_ARG, "CLI", "prompt too long to bench");
        goto out;
    }
    status = spec_head_load(engine_model(engine), o->head, &head);
    if (status != BT_OK)
        goto out;
    spec_config_t scfg = o->scfg;
    scfg.adaptive = !o->fixed;
    status = spec_create(engine, head, &scfg, &spec);
    if (status != BT_OK)
        goto out;
    if (o->plain)
        spec_set_fixed(spec, 0, 1, 1);
    /* a warm-up run, then `rounds` measured runs of each (the adaptive
     * decoder keeps learning across rounds, as a server would) */
    status = eagle_decode(engine, NULL, prompt, n_prompt, batch, gen,
                          &t_plain, &n_plain);
    /* warm speculation up too (draft and verification graphs, GEMM
     * tuning of their shapes): one run with the full tree and, when
     * adaptive, one with every chain and one adaptive run (the plain
     * steps that fetch a try's root feature have graphs of their own),
     * then the controller starts over: the measured rounds include its
     * whole learning, not one-time graph captures */
    if (status == BT_OK && !o->plain) {
        spec_set_fixed(spec, scfg.tokens, scfg.depth, scfg.topk);
        status = eagle_decode(engine, spec, prompt, n_prompt, batch, gen,
                              &t_plain, &n_plain);
        for (int c = 1; c <= 8 && status == BT_OK && scfg.adaptive;
             c *= 2) { /* the controller's chain arms */
            spec_set_fixed(spec, c, c, 1);
            status = eagle_decode(engine, spec, prompt, n_prompt, batch,
                                  gen, &t_plain, &n_plain);
        }
        if (scfg.adaptive && status == BT_OK) {
            spec_set_adaptive(spec);
            status = eagle_decode(engine, spec, prompt, n_prompt, batch,
                                  gen, &t_plain, &n_plain);
        }
        if (scfg.adaptive)
            spec_set_adaptive(spec);
        else
            spec_set_fixed(spec, scfg.tokens, scfg.depth, scfg.topk);
    }
    memset(&st0, 0, sizeof(st0));
    if (spec != NULL)
        spec_get_stats(spec, &st0);
    BT_LOG_DEBUG("SPEC", "eagle bench: the measured rounds start");
    t_plain = t_spec = 0.0;
    n_plain = n_spec = 0;
    for (int r = 0; r < o->rounds && status == BT_OK; r++) {
        double t;
        long n;
#ifdef BATON_HAVE_CUDA
        uint64_t g0 = cuda_backend_gpu_ns(engine_backend(engine));
#endif

        status = eagle_decode(engine, NULL, prompt, n_prompt, batch, gen,
                              &t, &n);
#ifdef BATON_HAVE_CUDA
        plain_gpu_ns += cuda_backend_gpu_ns(engine_backend(engine)) -
                        g0;
#endif
        t_plain += t;
        n_plain += n;
        if (status == BT_OK)
            status = eagle_decode(engine, spec, prompt, n_prompt, batch,
                                  gen, &t, &n);
        t_spec += t;
        n_spec += n;
    }
    if (status != BT_OK)
        goto out;
    spec_get_stats(spec, &st);
    /* the measured rounds only */
    st.verify_seqs -= st0.verify_seqs;
    st.verify_tokens -= st0.verify_tokens;
    st.plain_seqs -= st0.plain_seqs;
    st.draft_ns -= st0.draft_ns;
    st.verify_ns -= st0.verify_ns;
    st.verify_gpu_ns -= st0.verify_gpu_ns;
    st.accept_ns -= st0.accept_ns;
    st.head_replays -= st0.head_replays;
    st.head_captures -= st0.head_captures;
    st.head_eager -= st0.head_eager;
    printf("batch:%d gen:%d plain_tok_s:%.1f spec_tok_s:%.1f speedup:%.2f "
           "accept-length:%.3f tree_steps:%llu plain_steps:%llu "
           "draft_ms:%.1f verify_ms:%.1f accept_ms:%.1f head_replays:%llu "
           "head_captures:%llu head_eager:%llu verify_gpu_ms:%.1f "
           "plain_ms:%.1f plain_gpu_ms:%.1f\n", batch, gen,
           n_plain / t_plain, n_spec / t_spec,
           (n_spec / t_spec) / (n_plain / t_plain),
           st.verify_seqs ? (double)st.verify_tokens / st.verify_seqs
                          : 0.0,
           (unsigned long long)st.verify_seqs,
           (unsigned long long)st.plain_seqs, st.draft_ns * 1e-6,
           st.verify_ns * 1e-6, st.accept_ns * 1e-6,
           (unsigned long long)st.head_replays,
           (unsigned long long)st.head_captures,
           (unsigned long long)st.head_eager, st.verify_gpu_ns * 1e-6,
           t_plain * 1e3, plain_gpu_ns * 1e-6);
    ret = 0;

out:
    if (ret != 0)
        fprintf(stderr, "baton eagle bench: %s\n",
                bt_error_last()[0] ? bt_error_last() : "failed");
    spec_destroy(&spec);
    spec_head_destroy(&head);
    engine_destroy(&engine);
    bt_free(prompt);
    return ret;
}

int cli_eagle_main(int argc, char **argv)
{
    eagle_opts_t o;
    int rc;

    if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        eagle_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    memset(&o, 0, sizeof(o));
    spec_train_config_init(&o.tcfg);
    /* The recipe that works (docs/PERFORMANCE.md, "A better-trained
     * aidreams260K head"): 256K tokens at T = 0.3 took the accepted
     * length on aidreams260K from 3.5 to 6.0 with the full tree.  The
     * library's defaults stay small and fast for the unit tests. */
    o.tcfg.n_tokens = 262144;
    o.tcfg.temperature = 0.3f;
    spec_config_init(&o.scfg);
    o.gen = 96;
    o.rounds = 3;
    rc = eagle_parse(argc - 1, argv + 1, &o);
    if (rc >= 0)
        return rc;
    if (strcmp(argv[1], "train") == 0)
        return eagle_train(&o);
    if (strcmp(argv[1], "bench") == 0)
        return eagle_bench(&o);
    fprintf(stderr, "baton eagle: unknown action '%s' (train, bench)\n",
            argv[1]);
    return 2;
}
