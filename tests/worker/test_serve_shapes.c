/*
 * test_serve_shapes.c - the forward shapes an aggregated worker serves,
 * against the same sequences run alone (issue 37: FP8 serving failed
 * every request on the H200 while single prompts and uniform decode
 * batches passed).  The engine is made and warmed exactly as
 * `baton-decode --role both` makes it (engine_create, KV sized from
 * memory unless --kv-blocks, engine_warmup with the chunk and the batch
 * budget, decode graphs up to --max-seqs), then:
 *   ref     each sequence alone, its blocks at the bottom of the pool:
 *           K prompts of P tokens, each then fed D teacher-forced decode
 *           tokens one step at a time; one prompt of T - K tokens per
 *           entry T of --mixed;
 *   high    sequence 0's reference again with its blocks at the TOP of
 *           the pool (the offsets a pool sized from memory reaches: FP8
 *           KV holds twice the blocks of bf16);
 *   burst   the K prompts in one step (the cold burst's first step: one
 *           multi-sequence prefill), blocks at the top of the pool;
 *   mixed   per entry T: the K decode rows plus a fresh prompt of T - K
 *           tokens, one step of T tokens (odd counts: not multiples of
 *           16, cuBLASLt's FP8 token alignment);
 *   decode  the K decode rows alone once more (a captured graph on cuda).
 * Every logits row (device sampling path, rows without a sampler) must
 * be finite and within --tol relative L2 of its reference (another batch
 * shape may take another GEMM algorithm; unrelated rows are ~1.4 apart;
 * cuda fp8 0.7: main() says why).  Prints one line
 * per step (status, error, worst row); exits 1 on the first failed step
 * after printing why (--keep-going: checks every step, then exits 1 if
 * any failed).  With no arguments (CTest): stories260K on the cpu
 * in fp8 with FP8 KV.  On the GPU (tests/gpu/run_gpu_fp8_diag.sh):
 *   test_serve_shapes --device cuda --model synth:llama3-8b \
 *     --precision fp8 --kv-dtype fp8 --kv-blocks 0 --max-seqs 256 \
 *     --max-batch-tokens 8192 --chunk 2048 --prompt 2048 \
 *     --mixed 2053,8191,37
 */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "engine.h"

#define MAX_SEQS_T 64  /* K: burst sequences */
#define MAX_MIXED 16   /* entries of --mixed */

typedef struct {
    const char *device;
    const char *model;
    backend_precision_t precision;
    backend_kv_dtype_t kv_dtype;
    int kv_blocks;        /* 0: sized from memory */
    int max_seqs;
    int max_batch_tokens;
    int chunk;
    int prompt;           /* P */
    int k;                /* K */
    int mixed[MAX_MIXED]; /* step token counts T */
    int n_mixed;
    double tol;
    bool warmup;
    bool keep_going; /* --keep-going: every step checked, exit 1 at the end */
} opts_t;

typedef struct {
    engine_t *e;
    backend_t *be;
    int vocab;
    int bs;
    int n_blocks;
    int top;          /* next free block counting down from the top */
    int bottom;       /* next free block counting up from 0 */
    float *logits;    /* (K + 1, vocab) one step's rows */
    double worst;     /* worst relative error of the current step */
    int step_fails;   /* rows of the current step that failed */
    int fails;        /* failed steps (--keep-going) */
} run_t;

static int tok_prompt(const run_t *r, int seq, int j)
{
    return 1 + (seq * 131 + j * 17) % (r->vocab - 1);
}

static int tok_fed(const run_t *r, int seq, int m)
{
    return 1 + (seq * 7 + m * 13 + 5) % (r->vocab - 1);
}

/* n blocks for one sequence: from the bottom or the top of the pool. */
static void take_blocks(run_t *r, bool high, int n, int *ids)
{
    for (int i = 0; i < n; i++)
        ids[i] = high ? r->top-- : r->bottom++;
    BT_CHECK(r->bottom <= r->top + 1);
}

/* One forward (device sampling path, every row without a sampler, so
 * the logits come back); prints its line and exits on an error. */
static void forward(run_t *r, const char *name, int n,
                    const backend_seq_t *seqs)
{
    backend_batch_t batch;
    int nt = 0, rows = 0;
    int ids[MAX_SEQS_T + 1];
    uint64_t t0 = bt_time_ns();
    bt_status_t status;

    for (int s = 0; s < n; s++) {
        nt += seqs[s].n_tokens;
        rows += seqs[s].n_logits;
    }
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = n;
    batch.seqs = seqs;
    status = backend_forward_sample(r->be, &batch, NULL, ids, r->logits,
                                    NULL);
    printf("STEP %-8s seqs %3d tokens %5d rows %2d: %s (%.1f ms)%s%s\n",
           name, n, nt, rows, bt_status_str(status),
           (double)(bt_time_ns() - t0) * 1e-6,
           status != BT_OK ? ": " : "",
           status != BT_OK ? bt_error_last() : "");
    fflush(stdout);
    if (status != BT_OK) {
        printf("FAIL %s: the step failed (what serving would fail every "
               "request of)\n", name);
        exit(1);
    }
}

/* Row `row` of the last step against ref (vocab floats): finite, within
 * tol relative L2; the worst error is kept for the step's line. */
static void check_row(run_t *r, const opts_t *o, const char *what, int row,
                      const float *ref)
{
    const float *x = r->logits + (size_t)row * r->vocab;
    double d2 = 0.0, n2 = 0.0, rel;
    int bad = 0, am_x = 0, am_r = 0;

    for (int v = 0; v < r->vocab; v++) {
        double d = (double)x[v] - ref[v];

        if (!isfinite(x[v]))
            bad++;
        d2 += d * d;
        n2 += (double)ref[v] * ref[v];
        if (x[v] > x[am_x])
            am_x = v;
        if (ref[v] > ref[am_r])
            am_r = v;
    }
    rel = sqrt(d2 / (n2 > 0 ? n2 : 1.0));
    if (bad > 0 || !(rel <= o->tol)) {
        printf("FAIL %s row %d: %d non-finite logits, relative L2 %.3g "
               "(tol %g), argmax %d vs %d; first values %g %g %g vs %g %g "
               "%g\n", what, row, bad, rel, o->tol, am_x, am_r, x[0], x[1],
               x[2], ref[0], ref[1], ref[2]);
        if (!o->keep_going)
            exit(1);
        r->step_fails++;
        return;
    }
    if (rel > r->worst)
        r->worst = rel;
}

/* The device memory still free (cuda): what the pool sized from memory
 * left for graphs, tuning and sampling. */
static void mem_line(run_t *r, const char *when)
{
    size_t free_b = 0, total_b = 0;

    if (backend_mem_info(r->be, &free_b, &total_b) == BT_OK)
        printf("INFO device memory %s: %zu MiB free of %zu MiB\n", when,
               free_b >> 20, total_b >> 20);
}

static void step_done(run_t *r, const char *name)
{
    printf("%s %s: worst relative L2 of the rows within tolerance %.3g\n",
           r->step_fails ? "FAIL" : "PASS", name, r->worst);
    r->fails += r->step_fails > 0;
    r->step_fails = 0;
    r->worst = 0.0;
}

static void parse_list(const char *s, opts_t *o)
{
    char *end;

    o->n_mixed = 0;
    while (*s != '\0' && o->n_mixed < MAX_MIXED) {
        o->mixed[o->n_mixed++] = (int)strtol(s, &end, 10);
        if (end == s)
            BT_TEST_FAIL("bad --mixed list");
        s = *end == ',' ? end + 1 : end;
    }
}

static void parse(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        { "device", required_argument, NULL, 'd' },
        { "model", required_argument, NULL, 'm' },
        { "precision", required_argument, NULL, 'p' },
        { "kv-dtype", required_argument, NULL, 'k' },
        { "kv-blocks", required_argument, NULL, 'b' },
        { "max-seqs", required_argument, NULL, 's' },
        { "max-batch-tokens", required_argument, NULL, 't' },
        { "chunk", required_argument, NULL, 'c' },
        { "prompt", required_argument, NULL, 'P' },
        { "seqs", required_argument, NULL, 'K' },
        { "mixed", required_argument, NULL, 'x' },
        { "tol", required_argument, NULL, 'o' },
        { "no-warmup", no_argument, NULL, 'n' },
        { "keep-going", no_argument, NULL, 'g' },
        { NULL, 0, NULL, 0 }
    };
    int c;

    memset(o, 0, sizeof(*o));
    o->device = "cpu";
    o->model = BT_SHARED_DIR "/models/stories260K.bin";
    o->precision = BACKEND_PRECISION_FP8;
    o->kv_dtype = BACKEND_KV_DTYPE_FP8;
    o->kv_blocks = 0;
    o->max_seqs = 16;
    o->max_batch_tokens = 256;
    o->chunk = 64;
    o->prompt = 40;
    o->k = 4;
    o->tol = -1.0; /* by device: see below */
    o->warmup = true;
    parse_list("37,101,255", o);
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'd': o->device = optarg; break;
        case 'm': o->model = optarg; break;
        case 'p':
            o->precision = strcmp(optarg, "fp8") == 0
                               ? BACKEND_PRECISION_FP8
                           : strcmp(optarg, "f32") == 0
                               ? BACKEND_PRECISION_F32
                               : BACKEND_PRECISION_BF16;
            break;
        case 'k':
            if (backend_kv_dtype_parse(optarg, &o->kv_dtype) != BT_OK)
                BT_TEST_FAIL("bad --kv-dtype %s", optarg);
            break;
        case 'b': o->kv_blocks = atoi(optarg); break;
        case 's': o->max_seqs = atoi(optarg); break;
        case 't': o->max_batch_tokens = atoi(optarg); break;
        case 'c': o->chunk = atoi(optarg); break;
        case 'P': o->prompt = atoi(optarg); break;
        case 'K': o->k = atoi(optarg); break;
        case 'x': parse_list(optarg, o); break;
        case 'o': o->tol = atof(optarg); break;
        case 'n': o->warmup = false; break;
        case 'g': o->keep_going = true; break;
        default: BT_TEST_FAIL("unknown option");
        }
    }
    /* the cpu backend is batch-invariant (every row's sums in one order
     * whatever the batch); cuda's GEMMs may pick another algorithm for
     * another token count.  cuda fp8: a last-bit difference flips an
     * E4M3 code (a step of 6-12%) somewhere in ~100 quantizations a
     * token, and a random synth model amplifies that layer after layer:
     * on the H100 (2026-12-05) the decode rows of a batched step against
     * the same rows run alone differed by 0.20-0.25 relative L2 with
     * exact f32 sums everywhere (the GEMV forced for every product) and
     * 0.25-0.38 with cuBLASLt in mixed steps, argmax often unchanged;
     * unrelated logits are ~1.4 apart.  So fp8 here checks finite,
     * correlated rows; exactness is checked op by op (test_cuda_fp8) */
    if (o->tol < 0)
        o->tol = strcmp(o->device, "cpu") == 0 ? 1e-6
                 : o->precision == BACKEND_PRECISION_FP8 ? 0.7
                                                         : 5e-2;
    if (o->k < 1 || o->k > MAX_SEQS_T || o->prompt < 1 ||
        o->prompt > o->chunk || o->k * o->prompt > o->max_batch_tokens)
        BT_TEST_FAIL("need 1 <= K <= %d, P <= chunk, K x P <= batch "
                     "tokens", MAX_SEQS_T);
    for (int i = 0; i < o->n_mixed; i++)
        if (o->mixed[i] <= o->k || o->mixed[i] > o->max_batch_tokens)
            BT_TEST_FAIL("--mixed %d: needs K < T <= batch tokens",
                         o->mixed[i]);
}

int main(int argc, char **argv)
{
    opts_t o;
    run_t r;
    engine_config_t cfg;
    int n_dec, bs, max_ctx;
    float *ref_pre, *ref_dec, *ref_late;
    int *toks, *bt_ref, *bt_run, *late_bt, *late_toks;
    backend_seq_t seqs[MAX_SEQS_T + 1];
    int per_burst, per_late_max = 0;
    char name[64];

    bt_log_init("test");
    parse(argc, argv, &o);
    engine_config_init(&cfg);
    cfg.model_path = o.model;
    cfg.device = o.device;
    cfg.backend.n_threads = 1;
    cfg.backend.n_kv_blocks = o.kv_blocks;
    cfg.backend.max_seqs = o.max_seqs;
    cfg.backend.max_batch_tokens = o.max_batch_tokens;
    cfg.backend.precision = o.precision;
    cfg.backend.kv_dtype = o.kv_dtype;
    memset(&r, 0, sizeof(r));
    if (engine_create(&cfg, &r.e) != BT_OK) {
        printf("FAIL engine_create: %s\n", bt_error_last());
        return 1;
    }
    r.be = engine_backend(r.e);
    r.vocab = model_config(engine_model(r.e))->vocab_size;
    bs = r.bs = engine_block_size(r.e);
    max_ctx = engine_max_context(r.e);
    r.n_blocks = backend_config(r.be)->n_kv_blocks;
    r.top = r.n_blocks - 1;
    printf("INFO %s %s, precision %d, KV %s (%zu bytes an element), %d "
           "blocks of %d, max_seqs %d, batch tokens %d, context %d\n",
           backend_name(r.be), o.model, (int)o.precision,
           backend_kv_dtype_name(o.kv_dtype),
           backend_kv_layout(r.be)->elem_size, r.n_blocks, bs,
           backend_config(r.be)->max_seqs, o.max_batch_tokens, max_ctx);
    if (o.warmup) {
        uint64_t t0 = bt_time_ns();
        bt_status_t status = engine_warmup(r.e, o.chunk, o.max_batch_tokens,
                                           true);

        printf("STEP warmup: %s (%.1f s)%s%s\n", bt_status_str(status),
               (double)(bt_time_ns() - t0) * 1e-9,
               status != BT_OK ? ": " : "",
               status != BT_OK ? bt_error_last() : "");
        if (status != BT_OK)
            return 1;
    }
    mem_line(&r, "after the warm-up");

    n_dec = o.n_mixed + 1; /* one per mixed step, then a decode step */
    BT_CHECK(o.prompt + n_dec <= max_ctx);
    per_burst = (int)BT_DIV_UP(o.prompt + n_dec, bs);
    for (int m = 0; m < o.n_mixed; m++) {
        BT_CHECK(o.mixed[m] - o.k <= max_ctx);
        per_late_max = BT_MAX(per_late_max,
                              (int)BT_DIV_UP(o.mixed[m] - o.k, bs));
    }
    if ((long)2 * (o.k * per_burst + o.n_mixed * per_late_max) +
            per_burst > r.n_blocks) {
        printf("FAIL the pool (%d blocks) is too small for this plan\n",
               r.n_blocks);
        return 1;
    }
    r.logits = bt_malloc((size_t)(o.k + 1) * r.vocab * sizeof(float),
                         "test");
    ref_pre = bt_malloc((size_t)o.k * r.vocab * sizeof(float), "test");
    ref_dec = bt_malloc((size_t)o.k * n_dec * r.vocab * sizeof(float),
                        "test");
    ref_late = bt_malloc((size_t)BT_MAX(o.n_mixed, 1) * r.vocab *
                         sizeof(float), "test");
    toks = bt_malloc((size_t)o.k * (o.prompt + n_dec) * sizeof(int),
                     "test");
    bt_ref = bt_malloc((size_t)o.k * per_burst * sizeof(int), "test");
    bt_run = bt_malloc((size_t)(o.k + 1) * per_burst * sizeof(int), "test");
    late_bt = bt_malloc((size_t)2 * BT_MAX(o.n_mixed, 1) *
                        BT_MAX(per_late_max, 1) * sizeof(int), "test");
    late_toks = bt_malloc((size_t)max_ctx * sizeof(int), "test");
    BT_CHECK(r.logits && ref_pre && ref_dec && ref_late && toks && bt_ref &&
             bt_run && late_bt && late_toks);
    for (int i = 0; i < o.k; i++) {
        int *t = toks + (size_t)i * (o.prompt + n_dec);

        for (int j = 0; j < o.prompt; j++)
            t[j] = tok_prompt(&r, i, j);
        for (int m = 0; m < n_dec; m++)
            t[o.prompt + m] = tok_fed(&r, i, m);
    }

    /* ref: each burst sequence alone (bottom blocks), then each late
     * prompt alone */
    for (int i = 0; i < o.k; i++) {
        int *t = toks + (size_t)i * (o.prompt + n_dec);
        int *b = bt_ref + (size_t)i * per_burst;

        take_blocks(&r, false, per_burst, b);
        seqs[0] = (backend_seq_t){ o.prompt, 0, t, NULL, b, NULL, 1 };
        snprintf(name, sizeof(name), "ref%d", i);
        forward(&r, name, 1, seqs);
        memcpy(ref_pre + (size_t)i * r.vocab, r.logits,
               (size_t)r.vocab * sizeof(float));
        for (int m = 0; m < n_dec; m++) {
            seqs[0] = (backend_seq_t){ 1, o.prompt + m, t + o.prompt + m,
                                       NULL, b, NULL, 1 };
            forward(&r, name, 1, seqs);
            memcpy(ref_dec + ((size_t)i * n_dec + m) * r.vocab, r.logits,
                   (size_t)r.vocab * sizeof(float));
        }
    }
    for (int m = 0; m < o.n_mixed; m++) {
        int n = o.mixed[m] - o.k;
        int *b = late_bt + (size_t)m * per_late_max;

        for (int j = 0; j < n; j++)
            late_toks[j] = tok_prompt(&r, o.k + m, j);
        take_blocks(&r, false, (int)BT_DIV_UP(n, bs), b);
        seqs[0] = (backend_seq_t){ n, 0, late_toks, NULL, b, NULL, 1 };
        snprintf(name, sizeof(name), "ref-l%d", o.mixed[m]);
        forward(&r, name, 1, seqs);
        memcpy(ref_late + (size_t)m * r.vocab, r.logits,
               (size_t)r.vocab * sizeof(float));
    }
    printf("PASS ref: %d sequences of %d + %d decode tokens, %d late "
           "prompts\n", o.k, o.prompt, n_dec, o.n_mixed);

    /* high: sequence 0 alone again, its blocks at the top of the pool */
    {
        int *b = bt_run + (size_t)o.k * per_burst;
        int *t = toks;

        take_blocks(&r, true, per_burst, b);
        printf("INFO high blocks %d .. %d (their K ends %lld bytes into a "
               "layer's K array)\n", b[per_burst - 1], b[0],
               (long long)(b[0] + 1) * bs *
                   (long long)backend_kv_token_bytes(r.be) /
                   (2 * (long long)model_config(engine_model(r.e))
                            ->n_layers));
        seqs[0] = (backend_seq_t){ o.prompt, 0, t, NULL, b, NULL, 1 };
        forward(&r, "high", 1, seqs);
        check_row(&r, &o, "high prompt", 0, ref_pre);
        for (int m = 0; m < n_dec; m++) {
            seqs[0] = (backend_seq_t){ 1, o.prompt + m, t + o.prompt + m,
                                       NULL, b, NULL, 1 };
            forward(&r, "high", 1, seqs);
            check_row(&r, &o, "high decode", 0, ref_dec + (size_t)m *
                                                             r.vocab);
        }
        step_done(&r, "high");
    }

    /* burst: the K prompts in one step, blocks at the top */
    for (int i = 0; i < o.k; i++) {
        int *b = bt_run + (size_t)i * per_burst;

        take_blocks(&r, true, per_burst, b);
        seqs[i] = (backend_seq_t){ o.prompt, 0,
                                   toks + (size_t)i * (o.prompt + n_dec),
                                   NULL, b, NULL, 1 };
    }
    forward(&r, "burst", o.k, seqs);
    for (int i = 0; i < o.k; i++)
        check_row(&r, &o, "burst prompt", i, ref_pre + (size_t)i * r.vocab);
    step_done(&r, "burst");

    /* mixed: K decode rows + one fresh prompt of T - K tokens */
    for (int m = 0; m < n_dec; m++) {
        bool late = m < o.n_mixed;
        int n_late = late ? o.mixed[m] - o.k : 0;
        int *lb = late_bt + (size_t)(o.n_mixed + m) * per_late_max;

        for (int i = 0; i < o.k; i++) {
            int *t = toks + (size_t)i * (o.prompt + n_dec);

            seqs[i] = (backend_seq_t){ 1, o.prompt + m, t + o.prompt + m,
                                       NULL, bt_run + (size_t)i * per_burst,
                                       NULL, 1 };
        }
        if (late) {
            for (int j = 0; j < n_late; j++)
                late_toks[j] = tok_prompt(&r, o.k + m, j);
            take_blocks(&r, true, (int)BT_DIV_UP(n_late, bs), lb);
            seqs[o.k] = (backend_seq_t){ n_late, 0, late_toks, NULL, lb,
                                         NULL, 1 };
            snprintf(name, sizeof(name), "mixed%d", o.mixed[m]);
        } else {
            snprintf(name, sizeof(name), "decode");
        }
        forward(&r, name, o.k + late, seqs);
        for (int i = 0; i < o.k; i++)
            check_row(&r, &o, name, i,
                      ref_dec + ((size_t)i * n_dec + m) * r.vocab);
        if (late)
            check_row(&r, &o, name, o.k, ref_late + (size_t)m * r.vocab);
        step_done(&r, name);
    }

    mem_line(&r, "at the end");
    bt_free(r.logits);
    bt_free(ref_pre);
    bt_free(ref_dec);
    bt_free(ref_late);
    bt_free(toks);
    bt_free(bt_ref);
    bt_free(bt_run);
    bt_free(late_bt);
    bt_free(late_toks);
    engine_destroy(&r.e);
    if (r.fails > 0) {
        printf("FAIL serve_shapes: %d steps failed\n", r.fails);
        return 1;
    }
    BT_TEST_PASS("serve_shapes");
    return 0;
}
