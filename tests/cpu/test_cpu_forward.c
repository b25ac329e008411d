/* test_cpu_forward.c - the cpu backend's whole forward pass against the
 * naive single-sequence reference in ref_llama.h, on the real trained
 * models (stories260K: GQA; aidreams260K: tied; the -hf conversions: half
 * RoPE) and synthetic shapes (q/k/v bias, bf16 weights):
 *   - logits and hidden rows equal the reference within 1e-5 relative;
 *   - paged KV with block sizes 1, 8, 16 and shuffled blocks changes
 *     nothing;
 *   - a prompt fed in chunks of 1, 3, 7 equals one prefill;
 *   - a batch mixing prefill chunks and decode tokens of several
 *     sequences equals each sequence alone;
 *   - a tree mask equals the corresponding linear sequences;
 *   - malformed batches are rejected with no state change;
 *   - kv_copy_block copies a block in every layer.
 * Everything runs with 1 and with 3 threads, every op split
 * (BT_CPU_MIN_WORK=1). */
#include <stdlib.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv.h"
#include "model/model_synth.h"
#include "ref_llama.h"

#define REL_TOL 1e-5

static int g_threads = 1;

/* |got - ref| <= REL_TOL * max(1, max |ref row|) for every element. */
static void check_rows(const float *got, const float *ref, int n, int rows,
                       const char *what)
{
    for (int r = 0; r < rows; r++) {
        double scale = 1.0;

        for (int i = 0; i < n; i++)
            if (fabs(ref[(size_t)r * n + i]) > scale)
                scale = fabs(ref[(size_t)r * n + i]);
        for (int i = 0; i < n; i++) {
            double g = got[(size_t)r * n + i], w = ref[(size_t)r * n + i];

            if (!(fabs(g - w) <= REL_TOL * scale))
                BT_TEST_FAIL("%s (threads %d): row %d elem %d: got %.9g "
                             "want %.9g", what, g_threads, r, i, g, w);
        }
    }
}

/* Reference logits and hidden rows for every position of `tokens`. */
typedef struct {
    float *logits; /* (n, vocab) */
    float *hidden; /* (n, dim) */
} ref_out_t;

static ref_out_t ref_run(const model_t *m, const int *tokens, int n)
{
    const model_config_t *c = model_config(m);
    ref_llama_t r;
    ref_out_t o;

    o.logits = malloc(sizeof(float) * (size_t)n * c->vocab_size);
    o.hidden = malloc(sizeof(float) * (size_t)n * c->dim);
    ref_llama_init(&r, m, n);
    for (int p = 0; p < n; p++) {
        float *l = ref_llama_forward(&r, tokens[p], p,
                                     o.hidden + (size_t)p * c->dim);

        memcpy(o.logits + (size_t)p * c->vocab_size, l,
               sizeof(float) * c->vocab_size);
    }
    ref_llama_free(&r);
    return o;
}

static void ref_free(ref_out_t *o)
{
    free(o->logits);
    free(o->hidden);
}

static void make_tokens(int *tok, int n, int vocab, unsigned seed)
{
    tok[0] = 1;
    for (int i = 1; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        tok[i] = (int)((seed >> 8) % (unsigned)vocab);
    }
}

/* A sequence under test: its block table drawn from the allocator. */
typedef struct {
    int *table;
    int n_blocks;
} tseq_t;

static void tseq_alloc(tseq_t *s, kv_allocator_t *a, int n_tokens, int bs)
{
    s->n_blocks = (n_tokens + bs - 1) / bs;
    s->table = malloc(sizeof(int) * (size_t)(s->n_blocks + 1));
    BT_ASSERT_OK(kv_allocator_alloc(a, s->n_blocks, s->table));
}

static void tseq_free(tseq_t *s, kv_allocator_t *a)
{
    kv_allocator_release(a, s->n_blocks, s->table);
    free(s->table);
}

/* Scrambles the pool order: takes every free block, then releases them in
 * a shuffled order... the allocator hands out lowest first, so instead
 * shuffle a sequence's table in place (any permutation of held ids is a
 * valid table). */
static void tseq_shuffle(tseq_t *s, unsigned seed)
{
    for (int i = s->n_blocks - 1; i > 0; i--) {
        int j, t;

        seed = seed * 1103515245u + 12345u;
        j = (int)((seed >> 8) % (unsigned)(i + 1));
        t = s->table[i]; s->table[i] = s->table[j]; s->table[j] = t;
    }
}

static backend_t *make_backend(const model_t *m, int bs, int n_blocks)
{
    backend_config_t cfg;
    backend_t *be = NULL;

    backend_config_init(&cfg);
    cfg.block_size = bs;
    cfg.n_kv_blocks = n_blocks;
    cfg.max_batch_tokens = 256;
    cfg.max_seqs = 8;
    cfg.n_threads = g_threads;
    BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
    BT_ASSERT_STREQ(backend_name(be), "cpu");
    return be;
}

/* Feeds tokens [0, n) of one sequence in chunks of `chunk` tokens, every
 * token emitting logits; compares against the reference. */
static void run_chunked(const model_t *m, const int *tok, int n, int chunk,
                        int bs, bool shuffle, const ref_out_t *ref,
                        const char *what)
{
    const model_config_t *c = model_config(m);
    int n_blocks = (n + bs - 1) / bs + 4;
    backend_t *be = make_backend(m, bs, n_blocks);
    kv_allocator_t *a = NULL;
    float *logits = malloc(sizeof(float) * (size_t)n * c->vocab_size);
    float *hidden = malloc(sizeof(float) * (size_t)n * c->dim);
    tseq_t s;

    BT_ASSERT_OK(kv_allocator_create(n_blocks, &a));
    tseq_alloc(&s, a, n, bs);
    if (shuffle)
        tseq_shuffle(&s, 7u + (unsigned)bs);
    for (int p = 0; p < n; p += chunk) {
        int len = BT_MIN(chunk, n - p);
        backend_seq_t seq = { .n_tokens = len, .ctx_len = p,
                              .tokens = tok + p, .block_table = s.table,
                              .n_logits = len };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

        BT_ASSERT_OK(backend_forward(be, &batch,
                                     logits + (size_t)p * c->vocab_size,
                                     hidden + (size_t)p * c->dim));
    }
    check_rows(logits, ref->logits, c->vocab_size, n, what);
    check_rows(hidden, ref->hidden, c->dim, n, what);
    tseq_free(&s, a);
    kv_allocator_destroy(&a);
    backend_destroy(&be);
    free(logits);
    free(hidden);
}

// ----------------------------------------------------------------------------

/* Several sequences at different stages in one batch: seq s has a prefix
 * of pre[s] tokens (prefilled together in a first batch), then the second
 * batch carries chunk[s] new tokens of each (1 = decode).  Only the last
 * new token of some sequences emits logits. */
static void test_mixed_batch(const model_t *m, const char *name)
{
    enum { NS = 5, N = 48, BS = 4 };
    static const int pre[NS] = { 0, 12, 5, 20, 1 };
    static const int chunk[NS] = { 9, 1, 6, 1, 3 };
    static const int n_logits[NS] = { 9, 1, 2, 1, 0 };
    const model_config_t *c = model_config(m);
    int tok[NS][N];
    ref_out_t ref[NS];
    tseq_t s[NS];
    backend_seq_t seqs[NS];
    backend_batch_t batch = { .n_seqs = NS, .seqs = seqs };
    backend_t *be = make_backend(m, BS, 64);
    kv_allocator_t *a = NULL;
    float *logits = malloc(sizeof(float) * 64 * c->vocab_size);
    float *hidden = malloc(sizeof(float) * 64 * c->dim);
    int row = 0, n_pre = 0;
    int burn[3];

    BT_ASSERT_OK(kv_allocator_create(64, &a));
    BT_ASSERT_OK(kv_allocator_alloc(a, 3, burn)); /* tables start at 3 */
    for (int i = 0; i < NS; i++) {
        make_tokens(tok[i], N, c->vocab_size, 100u + (unsigned)i);
        ref[i] = ref_run(m, tok[i], pre[i] + chunk[i]);
        tseq_alloc(&s[i], a, pre[i] + chunk[i], BS);
        tseq_shuffle(&s[i], 3u * (unsigned)i + 1u);
    }
    /* batch 1: every non-empty prefix, no logits */
    for (int i = 0; i < NS; i++) {
        if (pre[i] == 0)
            continue;
        seqs[n_pre++] = (backend_seq_t){ .n_tokens = pre[i], .ctx_len = 0,
                                         .tokens = tok[i],
                                         .block_table = s[i].table };
    }
    batch.n_seqs = n_pre;
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    /* batch 2: the mix */
    for (int i = 0; i < NS; i++)
        seqs[i] = (backend_seq_t){ .n_tokens = chunk[i], .ctx_len = pre[i],
                                   .tokens = tok[i] + pre[i],
                                   .block_table = s[i].table,
                                   .n_logits = n_logits[i] };
    batch.n_seqs = NS;
    BT_ASSERT_OK(backend_forward(be, &batch, logits, hidden));
    for (int i = 0; i < NS; i++) {
        int first = pre[i] + chunk[i] - n_logits[i];

        check_rows(logits + (size_t)row * c->vocab_size,
                   ref[i].logits + (size_t)first * c->vocab_size,
                   c->vocab_size, n_logits[i], name);
        check_rows(hidden + (size_t)row * c->dim,
                   ref[i].hidden + (size_t)first * c->dim, c->dim,
                   n_logits[i], name);
        row += n_logits[i];
        tseq_free(&s[i], a);
        ref_free(&ref[i]);
    }
    kv_allocator_release(a, 3, burn);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 64);
    kv_allocator_destroy(&a);
    backend_destroy(&be);
    free(logits);
    free(hidden);
}

/* A draft tree after a prefix of P tokens: new tokens a, b, c form a
 * chain, d is a sibling of a (same position, sees only the prefix and
 * itself).  Logits of a, b, c equal the linear sequence prefix+a+b+c;
 * logits of d equal prefix+d. */
static void test_tree_mask(const model_t *m, const char *name)
{
    enum { P = 10, BS = 8 };
    const model_config_t *c = model_config(m);
    int lin1[P + 3], lin2[P + 1], pos[4] = { P, P + 1, P + 2, P };
    int tree[4];
    static const uint8_t mask[16] = { 1, 0, 0, 0,
                                      1, 1, 0, 0,
                                      1, 1, 1, 0,
                                      0, 0, 0, 1 };
    ref_out_t r1, r2;
    backend_t *be = make_backend(m, BS, 8);
    int table[3] = { 5, 2, 7 };
    float *logits = malloc(sizeof(float) * 4 * c->vocab_size);
    backend_seq_t seq = { .n_tokens = P, .ctx_len = 0, .tokens = lin1,
                          .block_table = table };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

    make_tokens(lin1, P + 3, c->vocab_size, 77u);
    memcpy(lin2, lin1, sizeof(int) * P);
    lin2[P] = (lin1[P] + 17) % c->vocab_size;
    memcpy(tree, lin1 + P, sizeof(int) * 3);
    tree[3] = lin2[P];
    r1 = ref_run(m, lin1, P + 3);
    r2 = ref_run(m, lin2, P + 1);
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    seq = (backend_seq_t){ .n_tokens = 4, .ctx_len = P, .tokens = tree,
                           .positions = pos, .block_table = table,
                           .mask = mask, .n_logits = 4 };
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    check_rows(logits, r1.logits + (size_t)P * c->vocab_size, c->vocab_size,
               3, name);
    check_rows(logits + 3 * (size_t)c->vocab_size,
               r2.logits + (size_t)P * c->vocab_size, c->vocab_size, 1,
               name);
    ref_free(&r1);
    ref_free(&r2);
    backend_destroy(&be);
    free(logits);
}

#define EXPECT_INVALID(_be, _batch, _logits, _msg)                          \
    do {                                                                    \
        bt_error_clear();                                                   \
        BT_ASSERT_EQ(backend_forward(_be, _batch, _logits, NULL),           \
                     BT_ERR_INVALID_ARG);                                   \
        if (strstr(bt_error_last(), _msg) == NULL)                          \
            BT_TEST_FAIL("error \"%s\" does not mention \"%s\"",          \
                         bt_error_last(), _msg);                            \
    } while (0)

/* Malformed batches: BT_ERR_INVALID_ARG and the KV pool untouched. */
static void test_invalid(const model_t *m)
{
    const model_config_t *c = model_config(m);
    backend_t *be = make_backend(m, 4, 80);
    const kv_layout_t *lay = backend_kv_layout(be);
    size_t bytes = kv_layout_layer_bytes(lay);
    unsigned char *snap = malloc(bytes);
    float *logits = malloc(sizeof(float) * 300 * c->vocab_size);
    int tok[300] = { 1, 2, 3 }, table[80];
    int bad_table[2] = { 0, 80 }, neg_pos[2] = { 0, -1 };
    backend_seq_t seq = { .n_tokens = 2, .ctx_len = 0, .tokens = tok,
                          .block_table = table, .n_logits = 1 };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
    backend_seq_t good;

    for (int i = 0; i < 80; i++)
        table[i] = i;
    BT_ASSERT_OK(backend_forward(be, &batch, logits, NULL));
    memcpy(snap, backend_kv_data(be, 0, 0), bytes);
    good = seq;

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* expected errors: asserted */
    tok[1] = c->vocab_size; /* token out of the vocabulary */
    EXPECT_INVALID(be, &batch, logits, "vocabulary");
    tok[1] = -1;
    EXPECT_INVALID(be, &batch, logits, "vocabulary");
    tok[1] = 2;
    seq.block_table = bad_table; seq.ctx_len = 3; /* block 4 of 4 */
    EXPECT_INVALID(be, &batch, logits, "block id 80 out of range");
    seq = good; seq.ctx_len = 319; /* past the pool */
    EXPECT_INVALID(be, &batch, logits, "pool has 80");
    seq = good; seq.n_logits = 3;
    EXPECT_INVALID(be, &batch, logits, "malformed");
    seq = good; seq.n_tokens = 0;
    EXPECT_INVALID(be, &batch, logits, "malformed");
    seq = good; seq.positions = neg_pos;
    EXPECT_INVALID(be, &batch, logits, "negative position");
    seq = good; seq.n_tokens = 257; /* > max_batch_tokens 256 */
    EXPECT_INVALID(be, &batch, logits, "max_batch_tokens");
    seq = good; batch.n_seqs = 0;
    EXPECT_INVALID(be, &batch, logits, "empty batch");
    batch.n_seqs = 9; /* > max_seqs 8 */
    EXPECT_INVALID(be, &batch, logits, "max_seqs");
    BT_CHECK(memcmp(snap, backend_kv_data(be, 0, 0), bytes) == 0);
    BT_ASSERT_EQ(backend_kv_copy_block(be, 0, 80), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(backend_kv_copy_block(be, -1, 0), BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(bt_error_last(), "outside the pool") != NULL);
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    free(snap);
    free(logits);
    backend_destroy(&be);
}

/* kv_copy_block: the destination block equals the source in every layer
 * and a sequence reading it through the copy gets the same logits. */
static void test_copy_block(const model_t *m, const char *name)
{
    enum { N = 12, BS = 4 };
    const model_config_t *c = model_config(m);
    backend_t *be = make_backend(m, BS, 8);
    const kv_layout_t *lay = backend_kv_layout(be);
    int tok[N + 1], t1[4] = { 0, 1, 2, 3 }, t2[4] = { 0, 5, 2, 3 };
    float *l1 = malloc(sizeof(float) * c->vocab_size);
    float *l2 = malloc(sizeof(float) * c->vocab_size);
    backend_seq_t seq = { .n_tokens = N, .ctx_len = 0, .tokens = tok,
                          .block_table = t1 };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };
    size_t bb = kv_layout_block_bytes(lay);

    BT_ASSERT_EQ(lay->elem_size, 4);
    BT_ASSERT_EQ(lay->n_layers, c->n_layers);
    make_tokens(tok, N + 1, c->vocab_size, 5u);
    BT_ASSERT_OK(backend_forward(be, &batch, l1, NULL));
    BT_ASSERT_OK(backend_kv_copy_block(be, 1, 5));
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const char *base = backend_kv_data(be, l, kv);

            BT_CHECK(memcmp(base + 1 * bb, base + 5 * bb, bb) == 0);
        }
    /* decode the next token through t1 and through t2 (block 5 = copy) */
    seq = (backend_seq_t){ .n_tokens = 1, .ctx_len = N, .tokens = tok + N,
                           .block_table = t1, .n_logits = 1 };
    BT_ASSERT_OK(backend_forward(be, &batch, l1, NULL));
    seq.block_table = t2;
    BT_ASSERT_OK(backend_forward(be, &batch, l2, NULL));
    check_rows(l2, l1, c->vocab_size, 1, name);
    free(l1);
    free(l2);
    backend_destroy(&be);
}

static void test_model(const model_t *m, const char *name)
{
    enum { N = 40 };
    const model_config_t *c = model_config(m);
    int tok[N];
    ref_out_t ref;
    static const int bss[] = { 1, 8, 16 };
    static const int chunks[] = { 1, 3, 7, N };
    char what[160];

    make_tokens(tok, N, c->vocab_size, 42u);
    ref = ref_run(m, tok, N);
    for (size_t b = 0; b < BT_ARRAY_SIZE(bss); b++) {
        for (size_t k = 0; k < BT_ARRAY_SIZE(chunks); k++) {
            snprintf(what, sizeof(what), "%s bs %d chunk %d", name, bss[b],
                     chunks[k]);
            run_chunked(m, tok, N, chunks[k], bss[b], b > 0, &ref, what);
        }
    }
    ref_free(&ref);
    test_mixed_batch(m, name);
    test_tree_mask(m, name);
    test_copy_block(m, name);
    fprintf(stderr, "PASS %s (threads %d)\n", name, g_threads);
}

static model_t *load(const char *rel)
{
    char path[512];
    model_t *m = NULL;

    if (strncmp(rel, "synth:", 6) == 0)
        snprintf(path, sizeof(path), "%s", rel);
    else
        snprintf(path, sizeof(path), "%s/models/%s", BT_SHARED_DIR, rel);
    BT_ASSERT_OK(model_load(path, &m));
    return m;
}

/* The sequence split computes each token exactly as one thread does (the
 * packed matmul does not depend on the batch a token is in): 8 sequences
 * prefilled then decoded 3 steps with 1 thread and with 3 threads
 * (BT_CPU_SPLIT=seqs) give bitwise-equal logits and hidden states. */
static void test_split_bitwise(const model_t *m, const char *name)
{
    enum { NS = 8, PRE = 9, STEPS = 3, BS = 4 };
    const model_config_t *c = model_config(m);
    int n_blocks = NS * BT_DIV_UP(PRE + STEPS, BS) + 1;
    size_t rows = (size_t)NS * (PRE + STEPS);
    float *out[2][2];
    int tok[NS][PRE + STEPS];
    int saved = g_threads;

    for (int s = 0; s < NS; s++)
        for (int i = 0; i < PRE + STEPS; i++)
            tok[s][i] = (s * 31 + i * 7 + 1) % c->vocab_size;
    setenv("BT_CPU_SPLIT", "seqs", 1);
    for (int run = 0; run < 2; run++) {
        backend_t *be;
        kv_allocator_t *a = NULL;
        tseq_t ts[NS];
        backend_seq_t seqs[NS];
        backend_batch_t batch = { .n_seqs = NS, .seqs = seqs };
        size_t row = 0;

        g_threads = run == 0 ? 1 : 3;
        be = make_backend(m, BS, n_blocks);
        out[run][0] = malloc(sizeof(float) * rows * c->vocab_size);
        out[run][1] = malloc(sizeof(float) * rows * c->dim);
        BT_ASSERT_OK(kv_allocator_create(n_blocks, &a));
        for (int s = 0; s < NS; s++)
            tseq_alloc(&ts[s], a, PRE + STEPS, BS);
        for (int step = 0; step <= STEPS; step++) {
            int ctx = step == 0 ? 0 : PRE + step - 1;
            int n = step == 0 ? PRE : 1;

            for (int s = 0; s < NS; s++)
                seqs[s] = (backend_seq_t){ .n_tokens = n, .ctx_len = ctx,
                                           .tokens = &tok[s][ctx],
                                           .block_table = ts[s].table,
                                           .n_logits = n };
            BT_ASSERT_OK(backend_forward(be, &batch,
                                         out[run][0] + row * c->vocab_size,
                                         out[run][1] + row * c->dim));
            row += (size_t)NS * n;
        }
        for (int s = 0; s < NS; s++)
            tseq_free(&ts[s], a);
        kv_allocator_destroy(&a);
        backend_destroy(&be);
    }
    BT_CHECK(memcmp(out[0][0], out[1][0],
                    sizeof(float) * rows * c->vocab_size) == 0);
    BT_CHECK(memcmp(out[0][1], out[1][1], sizeof(float) * rows * c->dim) ==
             0);
    for (int run = 0; run < 2; run++) {
        free(out[run][0]);
        free(out[run][1]);
    }
    unsetenv("BT_CPU_SPLIT");
    g_threads = saved;
    fprintf(stderr, "PASS %s split bitwise\n", name);
}

int main(void)
{
    static const char *models[] = { "stories260K.bin", "aidreams260K.bin",
                                    "stories260K-hf", "synth:tiny-qwen2",
                                    "synth:tiny-gqa" };
    size_t before = bt_alloc_live_count();

    setenv("BT_CPU_MIN_WORK", "1", 1);
    /* one thread; three with the sequence split whenever a batch has
     * several sequences (BT_CPU_SPLIT=seqs: not left to the timing
     * heuristic); three with every op split (BT_CPU_SPLIT=ops) */
    for (int pass = 0; pass < 3; pass++) {
        g_threads = pass == 0 ? 1 : 3;
        if (pass > 0)
            setenv("BT_CPU_SPLIT", pass == 1 ? "seqs" : "ops", 1);
        for (size_t i = 0; i < BT_ARRAY_SIZE(models); i++) {
            model_t *m = load(models[i]);

            test_model(m, models[i]);
            if (i == 0)
                test_invalid(m);
            model_destroy(&m);
        }
    }
    unsetenv("BT_CPU_SPLIT");
    for (size_t i = 0; i < 2; i++) {
        model_t *m = load(models[i]);

        test_split_bitwise(m, models[i]);
        model_destroy(&m);
    }
    {
        /* bf16 weights: converted once at create, same math */
        model_config_t cfg;
        const char *arch;
        model_t *m = NULL;

        BT_ASSERT_OK(model_synth_shape_config("tiny", &cfg, &arch));
        BT_ASSERT_OK(model_synth_from_cfg(&cfg, arch, 3, MODEL_DTYPE_BF16,
                                          &m));
        test_model(m, "synth tiny bf16");
        model_destroy(&m);
    }
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
