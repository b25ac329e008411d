/*
 * cli_quantize.c - `baton model quantize --fp8`: turns a model (HF dir,
 * llama2.c .bin or synth:NAME) into a compressed-tensors FP8 checkpoint
 * (model_write_hf_fp8); with --kv-only, a dense checkpoint (weights as
 * they are) carrying only the FP8 KV-cache scales.
 *
 * Calibration (--calib FILE) runs the cpu backend in bf16 precision over
 * the tokenized text, in windows of up to CLI_CALIB_WINDOW tokens that
 * each start with BOS, and reads every GEMM input's and every KV head's
 * magnitude statistics from it (backend_calib_t): the static input
 * scales and KV scales are absmax / 448, or the --percentile of |x| /
 * 448.  Without --calib the activations stay dynamic (per token).
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_fp8.h"
#include "bt_util.h"
#include "cli.h"
#include "model/model.h"
#include "model/model_write.h"
#include "model/tokenizer.h"

#define CLI_CALIB_WINDOW 256       /* tokens per calibration sequence */
#define CLI_CALIB_TOKENS 8192      /* default --calib-tokens */
#define CLI_CALIB_MAX_TEXT (64u << 20)

static void quantize_usage(FILE *out)
{
    fprintf(out,
            "usage: baton model quantize --fp8 --out DIR [options] MODEL\n\n"
            "Writes MODEL (HF dir, llama2.c .bin or synth:NAME) as a "
            "compressed-tensors\n\"float-quantized\" FP8 checkpoint: E4M3 "
            "linear weights with F32 scales;\nembeddings, norms and the "
            "classifier in bf16.\n\n"
            "  --fp8                  FP8 E4M3 (the only scheme)\n"
            "  --out DIR              output directory\n"
            "  --per-tensor           one weight scale per tensor (default: "
            "per output channel)\n"
            "  --calib FILE           calibration text: static input scales "
            "(default:\n"
            "                         dynamic per-token activation scales)\n"
            "  --tokenizer PATH       tokenizer for --calib (default: MODEL's "
            "directory)\n"
            "  --percentile P         scale from the P-th percentile of |x| "
            "(default 100 = absmax)\n"
            "  --calib-tokens N       at most N calibration tokens (default "
            "%d)\n"
            "  --kv-scales[=head|tensor]  write k_scale/v_scale from "
            "calibration, per KV\n"
            "                         head (default) or per layer\n"
            "  --keep-f32             embeddings, norms and the classifier "
            "in f32 (default bf16)\n"
            "  --kv-only              leave every weight as it is (bf16, "
            "f32 with --keep-f32)\n"
            "                         and write only the KV scales (needs "
            "--calib): a dense\n"
            "                         checkpoint for --kv-dtype fp8 under "
            "bf16 weights\n",
            CLI_CALIB_TOKENS);
}

/* Runs the calibration text through a bf16 cpu backend with statistics. */
static bt_status_t quantize_calibrate(const model_t *m, const char *tok_path,
                                      const char *text_path, int max_tokens,
                                      backend_calib_t *calib)
{
    const model_config_t *c = model_config(m);
    int window = BT_MIN(CLI_CALIB_WINDOW, c->max_seq_len);
    char *text = NULL;
    size_t len;
    int *ids = NULL, n_ids = 0, used = 0, *seq = NULL, *table = NULL;
    float *logits = NULL;
    tok_t *tok = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    bt_status_t status;

    status = bt_read_file(text_path, CLI_CALIB_MAX_TEXT, &text, &len);
    if (status != BT_OK)
        return status;
    status = tok_load(tok_path, c->vocab_size, &tok);
    if (status != BT_OK)
        goto out;
    status = tok_encode(tok, text, len, false, &ids, &n_ids);
    if (status != BT_OK)
        goto out;
    if (n_ids == 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "CLI", "%s: no calibration "
                          "tokens", text_path);
        goto out;
    }
    backend_config_init(&cfg);
    cfg.block_size = 16;
    cfg.n_kv_blocks = BT_DIV_UP(window, cfg.block_size);
    cfg.max_batch_tokens = window;
    cfg.max_seqs = 1;
    cfg.n_threads = 1;
    cfg.precision = BACKEND_PRECISION_BF16;
    cfg.calib = calib;
    status = backend_create("cpu", m, &cfg, &be);
    if (status != BT_OK)
        goto out;
    seq = bt_malloc(sizeof(int) * (size_t)window, "calib");
    table = bt_malloc(sizeof(int) * (size_t)cfg.n_kv_blocks, "calib");
    logits = bt_malloc(sizeof(float) * (size_t)c->vocab_size, "calib");
    if (seq == NULL || table == NULL || logits == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < cfg.n_kv_blocks; i++)
        table[i] = i;
    /* windows of BOS + window - 1 text tokens */
    for (int s = 0; s < n_ids && used < max_tokens; s += window - 1) {
        int n = 0;
        backend_seq_t bs;
        backend_batch_t batch;

        if (c->bos_id >= 0 || tok_bos_id(tok) >= 0)
            seq[n++] = c->bos_id >= 0 ? c->bos_id : tok_bos_id(tok);
        while (n < window && s + n - 1 < n_ids && used + n < max_tokens)
            seq[n] = ids[s + n - 1], n++;
        if (n < 2)
            break;
        bs = (backend_seq_t){ .n_tokens = n, .ctx_len = 0, .tokens = seq,
                              .block_table = table, .n_logits = 1 };
        batch = (backend_batch_t){ .n_seqs = 1, .seqs = &bs };
        status = backend_forward(be, &batch, logits, NULL);
        if (status != BT_OK)
            goto out;
        used += n;
    }
    printf("calibrated on %d tokens of %s\n", used, text_path);

out:
    bt_free(logits);
    bt_free(table);
    bt_free(seq);
    backend_destroy(&be);
    bt_free(ids);
    tok_destroy(&tok);
    bt_free(text);
    return status;
}

/* Copies file `src` into dir under `name` when src exists. */
static bt_status_t quantize_copy(const char *src, const char *dir,
                                 const char *name)
{
    char dst[PATH_MAX + 64];
    char *data;
    size_t len;
    bt_status_t status;

    if (access(src, R_OK) != 0)
        return BT_OK;
    status = bt_read_file(src, 1u << 30, &data, &len);
    if (status != BT_OK)
        return status;
    snprintf(dst, sizeof(dst), "%s/%s", dir, name);
    status = bt_write_file(dst, data, len);
    bt_free(data);
    return status;
}

/* Tokenizer files next to the model (HF dir) or the --tokenizer file. */
static bt_status_t quantize_copy_tokenizer(const char *model_path,
                                           const char *tok_path,
                                           const char *out)
{
    static const char *const files[] = {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "tokenizer.model",
    };
    struct stat st;
    char src[PATH_MAX + 64], base[PATH_MAX];
    bt_status_t status = BT_OK;

    if (stat(model_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        for (size_t i = 0; i < BT_ARRAY_SIZE(files) && status == BT_OK;
             i++) {
            snprintf(src, sizeof(src), "%s/%s", model_path, files[i]);
            status = quantize_copy(src, out, files[i]);
        }
    }
    if (status == BT_OK && tok_path != NULL &&
        stat(tok_path, &st) == 0 && S_ISREG(st.st_mode)) {
        snprintf(base, sizeof(base), "%s", tok_path);
        status = quantize_copy(tok_path, out, basename(base));
    }
    return status;
}

int cli_model_quantize(int argc, char **argv)
{
    const char *out = NULL, *calib_path = NULL, *tok_path = NULL;
    const char *model_path = NULL;
    bool fp8 = false, per_tensor = false, kv = false, kv_head = true;
    bool keep_f32 = false, kv_only = false;
    double pct = 100.0;
    int max_tokens = CLI_CALIB_TOKENS;
    model_t *m = NULL;
    backend_calib_t calib = { 0, 0, NULL };
    float *in_scale = NULL, *kv_scale = NULL;
    model_fp8_write_t wq;
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            quantize_usage(stdout);
            return 0;
        } else if (strcmp(a, "--fp8") == 0) {
            fp8 = true;
        } else if (strcmp(a, "--per-tensor") == 0) {
            per_tensor = true;
        } else if (strcmp(a, "--keep-f32") == 0) {
            keep_f32 = true;
        } else if (strcmp(a, "--kv-only") == 0) {
            kv_only = kv = true;
        } else if (strcmp(a, "--kv-scales") == 0 ||
                   strcmp(a, "--kv-scales=head") == 0) {
            kv = true;
        } else if (strcmp(a, "--kv-scales=tensor") == 0) {
            kv = true;
            kv_head = false;
        } else if (strcmp(a, "--out") == 0 && has_val) {
            out = argv[++i];
        } else if (strcmp(a, "--calib") == 0 && has_val) {
            calib_path = argv[++i];
        } else if (strcmp(a, "--tokenizer") == 0 && has_val) {
            tok_path = argv[++i];
        } else if (strcmp(a, "--percentile") == 0 && has_val) {
            if (bt_parse_double(argv[++i], &pct) != BT_OK || !(pct > 0.0) ||
                pct > 100.0) {
                fprintf(stderr, "baton model quantize: bad --percentile '%s' "
                                "(0 < P <= 100)\n", argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--calib-tokens") == 0 && has_val) {
            if (bt_parse_int(argv[++i], &max_tokens) != BT_OK ||
                max_tokens < 2) {
                fprintf(stderr, "baton model quantize: bad --calib-tokens "
                                "'%s'\n", argv[i]);
                return 2;
            }
        } else if (a[0] != '-' && model_path == NULL) {
            model_path = a;
        } else {
            fprintf(stderr, "baton model quantize: unexpected argument '%s'\n",
                    a);
            quantize_usage(stderr);
            return 2;
        }
    }
    if (!fp8 || out == NULL || model_path == NULL) {
        fprintf(stderr, "baton model quantize: --fp8, --out and MODEL are "
                        "required\n");
        quantize_usage(stderr);
        return 2;
    }
    if (kv && calib_path == NULL) {
        fprintf(stderr, "baton model quantize: %s needs --calib\n",
                kv_only ? "--kv-only" : "--kv-scales");
        return 2;
    }
    if (kv_only && per_tensor) {
        fprintf(stderr, "baton model quantize: --per-tensor quantizes "
                        "weights, --kv-only none\n");
        return 2;
    }
    if (model_load(model_path, &m) != BT_OK) {
        fprintf(stderr, "baton model quantize: %s: %s\n", model_path,
                bt_error_last());
        return 1;
    }
    wq = (model_fp8_write_t){ per_tensor, NULL, NULL, kv_head, keep_f32,
                              kv_only };
    if (calib_path != NULL) {
        const model_config_t *c = model_config(m);
        int per = BACKEND_CALIB_PER_LAYER(c->n_kv_heads);

        calib.n_layers = c->n_layers;
        calib.n_kv_heads = c->n_kv_heads;
        calib.stats = bt_calloc((size_t)c->n_layers * per,
                                sizeof(*calib.stats), "calib");
        in_scale = bt_malloc(sizeof(float) * (size_t)c->n_layers *
                             MODEL_N_LINEAR, "calib");
        kv_scale = bt_malloc(sizeof(float) * (size_t)c->n_layers * 2 *
                             c->n_kv_heads, "calib");
        if (calib.stats == NULL || in_scale == NULL || kv_scale == NULL) {
            fprintf(stderr, "baton model quantize: out of memory\n");
            goto out;
        }
        if (quantize_calibrate(m, tok_path ? tok_path : model_path,
                               calib_path, max_tokens, &calib) != BT_OK) {
            fprintf(stderr, "baton model quantize: calibration: %s\n",
                    bt_error_last());
            goto out;
        }
        for (int l = 0; l < c->n_layers; l++) {
            const backend_calib_stat_t *st = calib.stats + (size_t)l * per;
            /* linear -> the GEMM input it reads */
            static const int gemm[MODEL_N_LINEAR] = { 0, 0, 0, 1, 2, 2, 3 };

            for (int k = 0; k < MODEL_N_LINEAR; k++)
                in_scale[l * MODEL_N_LINEAR + k] = bt_fp8_scale(
                    (float)backend_calib_percentile(&st[gemm[k]], pct));
            for (int h = 0; h < 2 * c->n_kv_heads; h++)
                kv_scale[(size_t)l * 2 * c->n_kv_heads + h] = bt_fp8_scale(
                    (float)backend_calib_percentile(
                        &st[BACKEND_CALIB_GEMMS + h], pct));
        }
        wq.input_scale = kv_only ? NULL : in_scale;
        wq.kv_scale = kv ? kv_scale : NULL;
    }
    if (model_write_hf_fp8(m, out, &wq) != BT_OK ||
        quantize_copy_tokenizer(model_path, tok_path, out) != BT_OK) {
        fprintf(stderr, "baton model quantize: %s: %s\n", out,
                bt_error_last());
        goto out;
    }
    if (kv_only)
        printf("wrote %s (compressed-tensors dense, weights %s, fp8 kv "
               "scales per %s)\n", out, keep_f32 ? "f32" : "bf16",
               kv_head ? "head" : "layer");
    else
        printf("wrote %s (compressed-tensors fp8, weights per %s, "
               "activations %s%s)\n", out, per_tensor ? "tensor" : "channel",
               calib_path ? "static" : "dynamic per token",
               kv ? (kv_head ? ", kv scales per head"
                             : ", kv scales per layer")
                  : "");
    rc = 0;

out:
    bt_free(kv_scale);
    bt_free(in_scale);
    bt_free(calib.stats);
    model_destroy(&m);
    return rc;
}
