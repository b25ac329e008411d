/*
 * test_teacher_top1.c - teacher-forced top-1 of every position of a token
 * sequence on a model, for comparing baton with another implementation
 * (issue 37: tests/gpu/hf_fp8_check.py holds baton's cuda bf16 / fp8 to
 * transformers on an 8B-shaped checkpoint).
 *
 * Tool mode (any argument):
 *   test_teacher_top1 --model DIR --tokens FILE --out FILE
 *     [--device cpu|cuda] [--precision f32|bf16|fp8] [--kv-dtype auto|bf16|fp8]
 *     [--chunk N] [--threads N]
 * FILE holds token ids separated by blanks or commas (`baton tokenize
 * --ids` prints them so).  The sequence runs as one sequence in chunks of
 * --chunk tokens (default: all at once), every position emitting logits;
 * --out gets a '#' header line, then one line per position i:
 *   i  top1  margin  top_logit
 * (margin = the largest logit minus the second largest: how far from a
 * flip the choice is).  Prints load and forward times.  Exit 0 ok, 1
 * runtime error, 2 bad usage or input.
 *
 * CTest mode (no arguments): on the shared -hf models in float32 on the
 * cpu, every golden.jsonl line fed as prompt + greedy ids gives, at every
 * position after the prompt, exactly the greedy id llama2.c chose (one
 * chunk and chunks of 7); the first line of each model also goes through
 * the tool path (tokens file in, output file back, parsed); a token id
 * out of range is refused with exit 2 and no output file.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_golden.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"

#define TOP1_BLOCK 16
#define TOP1_MAX_FILE (16u << 20)

typedef struct {
    const char *model;
    const char *tokens;
    const char *out;
    const char *device;
    const char *precision_name; /* as given: "f32", "bf16", "fp8" */
    backend_precision_t precision;
    backend_kv_dtype_t kv_dtype;
    int chunk;        /* 0: the whole sequence in one forward */
    int threads;
} top1_opts_t;

typedef struct {
    int top1;
    float margin;     /* top logit - second logit */
    float top_logit;
} top1_row_t;

/* Largest and second largest of one logits row. */
static top1_row_t top1_of(const float *logits, int vocab)
{
    int best = 0;
    float second = -INFINITY;

    for (int v = 1; v < vocab; v++) {
        if (logits[v] > logits[best]) {
            second = logits[best];
            best = v;
        } else if (logits[v] > second) {
            second = logits[v];
        }
    }
    return (top1_row_t){ best, logits[best] - second, logits[best] };
}

/* Feeds tokens[0..n) in chunks (each position emits logits) and fills
 * rows[0..n).  The KV table is 0..; the backend must hold n tokens. */
static bt_status_t top1_run(backend_t *be, int vocab, const int *tokens,
                            int n, int chunk, top1_row_t *rows)
{
    int n_blocks = BT_DIV_UP(n, TOP1_BLOCK);
    int *table = bt_malloc(sizeof(int) * (size_t)n_blocks, "top1");
    float *logits;
    bt_status_t status = BT_OK;

    if (chunk <= 0 || chunk > n)
        chunk = n;
    logits = bt_malloc(sizeof(float) * (size_t)chunk * (size_t)vocab,
                       "top1");
    if (table == NULL || logits == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < n_blocks; i++)
        table[i] = i;
    for (int at = 0; at < n; at += chunk) {
        int len = BT_MIN(chunk, n - at);
        backend_seq_t seq = { .n_tokens = len, .ctx_len = at,
                              .tokens = tokens + at, .block_table = table,
                              .n_logits = len };
        backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

        status = backend_forward(be, &batch, logits, NULL);
        if (status != BT_OK)
            goto out;
        for (int i = 0; i < len; i++)
            rows[at + i] = top1_of(logits + (size_t)i * vocab, vocab);
    }

out:
    bt_free(logits);
    bt_free(table);
    return status;
}

/* Token ids from a file (blanks, newlines or commas between them). */
static bt_status_t top1_read_tokens(const char *path, int **ids_p, int *n_p)
{
    char *text = NULL, *p, *end;
    size_t len;
    int *ids = NULL, n = 0, cap = 0;
    bt_status_t status;

    status = bt_read_file(path, TOP1_MAX_FILE, &text, &len);
    if (status != BT_OK)
        return status;
    for (p = text; *p != '\0';) {
        long v;

        if (*p == ' ' || *p == '\n' || *p == '\t' || *p == ',' ||
            *p == '\r') {
            p++;
            continue;
        }
        errno = 0;
        v = strtol(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > INT32_MAX) {
            status = BT_ERROR(BT_ERR_FORMAT, "TEST", "%s: not a token id "
                              "at byte %td", path, p - text);
            goto out;
        }
        if (n == cap) {
            int *grown;

            cap = cap ? cap * 2 : 1024;
            grown = bt_realloc(ids, sizeof(int) * (size_t)cap, "top1");
            if (grown == NULL) {
                status = BT_ERR_NO_MEMORY;
                goto out;
            }
            ids = grown;
        }
        ids[n++] = (int)v;
        p = end;
    }
    if (n == 0)
        status = BT_ERROR(BT_ERR_FORMAT, "TEST", "%s: no token ids", path);

out:
    bt_free(text);
    if (status != BT_OK) {
        bt_free(ids);
        return status;
    }
    *ids_p = ids;
    *n_p = n;
    return BT_OK;
}

static bt_status_t top1_write(const top1_opts_t *o, const top1_row_t *rows,
                              int n)
{
    char tmp[4096];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s.tmp", o->out);
    f = fopen(tmp, "w");
    if (f == NULL)
        return BT_ERROR(BT_ERR_IO, "TEST", "%s: %s", tmp, strerror(errno));
    fprintf(f, "# model %s device %s precision %s kv %s tokens %d chunk %d\n",
            o->model, o->device, o->precision_name,
            backend_kv_dtype_name(o->kv_dtype), n, o->chunk);
    for (int i = 0; i < n; i++)
        fprintf(f, "%d %d %.6g %.6g\n", i, rows[i].top1, rows[i].margin,
                rows[i].top_logit);
    if (fclose(f) != 0 || rename(tmp, o->out) != 0)
        return BT_ERROR(BT_ERR_IO, "TEST", "%s: %s", o->out,
                        strerror(errno));
    return BT_OK;
}

/* The tool: loads, runs, writes.  Returns 0, 1 (runtime) or 2 (input). */
static int top1_tool(const top1_opts_t *o)
{
    model_t *m = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    int *ids = NULL, n = 0, rc = 1, vocab;
    top1_row_t *rows = NULL;
    uint64_t t0 = bt_time_ns(), t1, t2;

    if (top1_read_tokens(o->tokens, &ids, &n) != BT_OK) {
        fprintf(stderr, "teacher_top1: %s\n", bt_error_last());
        return 2;
    }
    if (model_load(o->model, &m) != BT_OK) {
        fprintf(stderr, "teacher_top1: %s: %s\n", o->model, bt_error_last());
        goto out;
    }
    vocab = model_config(m)->vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] >= vocab) {
            fprintf(stderr, "teacher_top1: %s: token %d at %d is outside "
                            "the vocabulary (%d)\n", o->tokens, ids[i], i,
                    vocab);
            rc = 2;
            goto out;
        }
    if (n > model_config(m)->max_seq_len) {
        fprintf(stderr, "teacher_top1: %d tokens exceed the model's context "
                        "(%d)\n", n, model_config(m)->max_seq_len);
        rc = 2;
        goto out;
    }
    backend_config_init(&cfg);
    cfg.block_size = TOP1_BLOCK;
    cfg.n_kv_blocks = BT_DIV_UP(n, TOP1_BLOCK);
    cfg.max_batch_tokens = o->chunk > 0 ? BT_MIN(o->chunk, n) : n;
    cfg.max_seqs = 1;
    cfg.n_threads = o->threads;
    cfg.precision = o->precision;
    cfg.kv_dtype = o->kv_dtype;
    if (backend_create(o->device, m, &cfg, &be) != BT_OK) {
        fprintf(stderr, "teacher_top1: backend %s: %s\n", o->device,
                bt_error_last());
        goto out;
    }
    t1 = bt_time_ns();
    rows = bt_malloc(sizeof(*rows) * (size_t)n, "top1");
    if (rows == NULL ||
        top1_run(be, vocab, ids, n, o->chunk, rows) != BT_OK) {
        fprintf(stderr, "teacher_top1: forward: %s\n", bt_error_last());
        goto out;
    }
    t2 = bt_time_ns();
    if (top1_write(o, rows, n) != BT_OK) {
        fprintf(stderr, "teacher_top1: %s\n", bt_error_last());
        goto out;
    }
    printf("teacher_top1: %s on %s: %d positions, load %.2f s, forward "
           "%.2f s -> %s\n", o->model, o->device, n, (t1 - t0) * 1e-9,
           (t2 - t1) * 1e-9, o->out);
    rc = 0;

out:
    bt_free(rows);
    backend_destroy(&be);
    model_destroy(&m);
    bt_free(ids);
    return rc;
}

static int top1_main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "model", required_argument, NULL, 'm' },
        { "tokens", required_argument, NULL, 't' },
        { "out", required_argument, NULL, 'o' },
        { "device", required_argument, NULL, 'd' },
        { "precision", required_argument, NULL, 'p' },
        { "kv-dtype", required_argument, NULL, 'k' },
        { "chunk", required_argument, NULL, 'c' },
        { "threads", required_argument, NULL, 'n' },
        { NULL, 0, NULL, 0 }
    };
    top1_opts_t o = { NULL, NULL, NULL, "cpu", "f32", BACKEND_PRECISION_F32,
                      BACKEND_KV_DTYPE_AUTO, 0, 1 };
    int c;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 't': o.tokens = optarg; break;
        case 'o': o.out = optarg; break;
        case 'd': o.device = optarg; break;
        case 'p':
            if (strcmp(optarg, "f32") == 0)
                o.precision = BACKEND_PRECISION_F32;
            else if (strcmp(optarg, "bf16") == 0)
                o.precision = BACKEND_PRECISION_BF16;
            else if (strcmp(optarg, "fp8") == 0)
                o.precision = BACKEND_PRECISION_FP8;
            else {
                fprintf(stderr, "teacher_top1: bad --precision %s "
                                "(f32|bf16|fp8)\n", optarg);
                return 2;
            }
            o.precision_name = optarg;
            break;
        case 'k':
            if (backend_kv_dtype_parse(optarg, &o.kv_dtype) != BT_OK) {
                fprintf(stderr, "teacher_top1: bad --kv-dtype %s\n", optarg);
                return 2;
            }
            break;
        case 'c':
        case 'n':
            if (bt_parse_int(optarg, c == 'c' ? &o.chunk : &o.threads) !=
                    BT_OK || (c == 'c' ? o.chunk : o.threads) < 0) {
                fprintf(stderr, "teacher_top1: bad number %s\n", optarg);
                return 2;
            }
            break;
        default:
            return 2;
        }
    }
    if (o.model == NULL || o.tokens == NULL || o.out == NULL ||
        optind != argc) {
        fprintf(stderr, "usage: test_teacher_top1 --model DIR --tokens FILE "
                        "--out FILE [--device cpu|cuda] [--precision "
                        "f32|bf16|fp8] [--kv-dtype D] [--chunk N] "
                        "[--threads N]\n");
        return 2;
    }
    return top1_tool(&o);
}

// ---------------------------------------------------------------------
// CTest mode

/* Reads back a tool output file: rows[i].top1 for each line. */
static int read_out(const char *path, int *top1, int max)
{
    char line[256];
    int n = 0;
    FILE *f = fopen(path, "r");

    BT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL) {
        int i, id;
        float margin, logit;

        if (line[0] == '#')
            continue;
        BT_CHECK(sscanf(line, "%d %d %f %f", &i, &id, &margin, &logit) == 4);
        BT_ASSERT_EQ(i, n);
        BT_CHECK(n < max && margin >= 0.0f && isfinite(logit));
        top1[n++] = id;
    }
    fclose(f);
    return n;
}

/* Positions after the prompt must predict the next golden id. */
static int golden_mismatches(const bt_golden_t *g, const int *top1)
{
    int bad = 0;

    for (int k = 0; k < g->n_want; k++)
        if (top1[g->n_prompt - 1 + k] != g->want[k])
            bad++;
    return bad;
}

static void self_test(void)
{
    bt_golden_t *g;
    int n_lines = bt_golden_read(&g), checked = 0;
    char dir[256], tok_path[] = "/tmp/bt_top1_XXXXXX", out_path[300];
    int fd = mkstemp(tok_path);
    bool tool_done[2] = { false, false };

    BT_CHECK(n_lines > 0 && fd >= 0);
    close(fd);
    snprintf(out_path, sizeof(out_path), "%s.out", tok_path);
    for (int li = 0; li < n_lines; li++) {
        int mi = strncmp(g[li].model, "aidreams", 8) == 0 ? 0 : 1;
        /* the last greedy id is predicted, never fed (n_want >= 1) */
        int n = g[li].n_prompt + g[li].n_want - 1, *seq, *got;
        model_t *m = NULL;
        backend_t *be = NULL;
        backend_config_t cfg;
        top1_row_t *rows;
        static const int chunks[] = { 0, 7 };

        BT_CHECK(g[li].n_want >= 1);
        snprintf(dir, sizeof(dir), "%s/models/%.*s-hf",
                 bt_golden_shared_dir(), (int)strlen(g[li].model) - 4,
                 g[li].model);
        seq = malloc(sizeof(int) * (size_t)n);
        got = malloc(sizeof(int) * (size_t)n);
        rows = malloc(sizeof(*rows) * (size_t)n);
        BT_CHECK(seq && got && rows);
        memcpy(seq, g[li].prompt, sizeof(int) * (size_t)g[li].n_prompt);
        memcpy(seq + g[li].n_prompt, g[li].want,
               sizeof(int) * (size_t)(g[li].n_want - 1));
        BT_ASSERT_OK(model_load(dir, &m));
        backend_config_init(&cfg);
        cfg.block_size = TOP1_BLOCK;
        cfg.n_kv_blocks = BT_DIV_UP(n, TOP1_BLOCK);
        cfg.max_batch_tokens = n;
        cfg.max_seqs = 1;
        cfg.n_threads = 1;
        cfg.precision = BACKEND_PRECISION_F32;
        BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
        for (size_t c = 0; c < BT_ARRAY_SIZE(chunks); c++) {
            int bad;

            BT_ASSERT_OK(top1_run(be, model_config(m)->vocab_size, seq, n,
                                  chunks[c], rows));
            for (int i = 0; i < n; i++)
                got[i] = rows[i].top1;
            bad = golden_mismatches(&g[li], got);
            if (bad != 0)
                BT_TEST_FAIL("%s line %d chunk %d: %d of %d positions off "
                             "the golden greedy ids", dir, li, chunks[c],
                             bad, g[li].n_want);
            checked += g[li].n_want;
        }
        backend_destroy(&be);
        model_destroy(&m);
        if (!tool_done[mi]) {
            /* the tool path: tokens file in, output file back */
            top1_opts_t o = { dir, tok_path, out_path, "cpu", "f32",
                              BACKEND_PRECISION_F32, BACKEND_KV_DTYPE_AUTO,
                              5, 1 };
            FILE *f = fopen(tok_path, "w");

            BT_CHECK(f != NULL);
            for (int i = 0; i < n; i++)
                fprintf(f, "%d%s", seq[i], i % 3 == 2 ? ",\n" : " ");
            fclose(f);
            BT_ASSERT_EQ(top1_tool(&o), 0);
            BT_ASSERT_EQ(read_out(out_path, got, n), n);
            BT_ASSERT_EQ(golden_mismatches(&g[li], got), 0);
            /* an id outside the vocabulary: refused, nothing written */
            unlink(out_path);
            f = fopen(tok_path, "w");
            BT_CHECK(f != NULL);
            fprintf(f, "1 5 %d 7\n", 1 << 20);
            fclose(f);
            BT_ASSERT_EQ(top1_tool(&o), 2);
            BT_CHECK(access(out_path, F_OK) != 0);
            tool_done[mi] = true;
        }
        free(rows);
        free(got);
        free(seq);
    }
    BT_CHECK(tool_done[0] && tool_done[1]);
    unlink(tok_path);
    bt_golden_free(g, n_lines);
    printf("PASS teacher_top1: %d golden positions (2 chunkings) on the -hf "
           "models, the tool path on each, an out-of-vocabulary id "
           "refused\n", checked);
}

int main(int argc, char **argv)
{
    bt_log_init("teacher_top1");
    if (argc > 1)
        return top1_main(argc, argv);
    self_test();
    return 0;
}
