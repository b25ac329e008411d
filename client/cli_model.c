/*
 * cli_model.c - `baton model inspect|synth|convert|quantize`: look inside a model,
 * write a seeded random model to disk, convert between llama2.c and
 * Hugging Face formats.  Exit codes: 0 ok, 1 runtime error, 2 bad usage.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "model/model.h"
#include "model/model_synth.h"
#include "model/model_write.h"

#define CLI_TABLE_MAX 64 /* print every tensor up to this many */

static void model_usage(FILE *out)
{
    fprintf(out,
            "usage: baton model COMMAND [options]\n\n"
            "commands:\n"
            "  inspect PATH [--tensors]  config, tensors, parameter count\n"
            "  synth (--shape NAME | --config FILE) --out DIR\n"
            "        [--dtype f32|bf16|f16] [--seed S]\n"
            "                            write a seeded random model as a "
            "Hugging Face dir\n"
            "  convert --in PATH --out PATH [--to hf|llama2c] "
            "[--dtype f32|bf16|f16]\n"
            "                            llama2.c .bin <-> Hugging Face dir\n"
            "  quantize --fp8 --out DIR [--per-tensor] [--calib FILE]\n"
            "        [--percentile P] [--kv-scales] MODEL\n"
            "                            write a compressed-tensors FP8 "
            "checkpoint\n\n"
            "PATH is a llama2.c .bin, a Hugging Face directory (or its "
            "config.json),\nor synth:NAME[:SEED].  `baton model COMMAND "
            "--help` for details.\n");
}

static bool cli_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* Matches "--name VALUE" or "--name=VALUE"; advances *i past the value.
 * Returns 1 on match, 0 on no match, -1 when the value is missing. */
static int cli_opt(int argc, char **argv, int *i, const char *name,
                   const char **val_p)
{
    size_t n = strlen(name);

    if (strncmp(argv[*i], name, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *val_p = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val_p = argv[++*i];
    return 1;
}

static bool cli_parse_dtype(const char *s, model_dtype_t *dtype_p)
{
    if (strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0)
        *dtype_p = MODEL_DTYPE_F32;
    else if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0)
        *dtype_p = MODEL_DTYPE_BF16;
    else if (strcmp(s, "f16") == 0 || strcmp(s, "float16") == 0)
        *dtype_p = MODEL_DTYPE_F16;
    else
        return false;
    return true;
}

static int cli_fail(const char *cmd, const char *what)
{
    fprintf(stderr, "baton model %s: %s: %s\n", cmd, what, bt_error_last());
    return 1;
}

// ----------------------------------------------------------------------------
// inspect

typedef struct {
    int n;       /* tensors seen */
    bool all;    /* print every tensor */
    int layers;  /* n_layers, to summarise */
} cli_inspect_t;

static bt_status_t cli_print_tensor(const char *name, const model_tensor_t *t,
                                    void *arg)
{
    cli_inspect_t *ins = arg;
    bool print = ins->all || strncmp(name, "model.layers.", 13) != 0 ||
                 strncmp(name, "model.layers.0.", 15) == 0;
    char shape[64];

    ins->n++;
    if (!print)
        return BT_OK;
    if (t->rows == 1)
        snprintf(shape, sizeof(shape), "[%" PRId64 "]", t->cols);
    else
        snprintf(shape, sizeof(shape), "[%" PRId64 ", %" PRId64 "]", t->rows,
                 t->cols);
    printf("  %-48s %-5s %-16s %12" PRId64 "\n", name,
           model_dtype_name(t->dtype), shape,
           t->rows * t->cols * (int64_t)model_dtype_size(t->dtype));
    return BT_OK;
}

static void cli_print_config(const model_config_t *c)
{
    static const char *const scaling[] = { "none", "linear", "llama3" };

    printf("  dim (hidden_size)          %d\n", c->dim);
    printf("  hidden_dim (intermediate)  %d\n", c->hidden_dim);
    printf("  n_layers                   %d\n", c->n_layers);
    printf("  n_heads                    %d\n", c->n_heads);
    printf("  n_kv_heads                 %d\n", c->n_kv_heads);
    printf("  head_dim                   %d\n", c->head_dim);
    printf("  vocab_size                 %d\n", c->vocab_size);
    printf("  max_seq_len                %d\n", c->max_seq_len);
    printf("  rope_theta                 %g\n", (double)c->rope_theta);
    printf("  rms_eps                    %g\n", (double)c->rms_eps);
    printf("  rope_layout                %s\n",
           c->rope_layout == MODEL_ROPE_ADJACENT ? "adjacent (llama2.c)"
                                                 : "half (Hugging Face)");
    printf("  rope_scaling               %s\n",
           (unsigned)c->rope_scaling < 3 ? scaling[c->rope_scaling] : "?");
    if (c->rope_scaling != MODEL_ROPE_SCALING_NONE)
        printf("  rope_factor                %g\n", (double)c->rope_factor);
    if (c->rope_scaling == MODEL_ROPE_SCALING_LLAMA3) {
        printf("  rope_low_freq_factor       %g\n",
               (double)c->rope_low_freq_factor);
        printf("  rope_high_freq_factor      %g\n",
               (double)c->rope_high_freq_factor);
        printf("  rope_orig_max_pos          %d\n", c->rope_orig_max_pos);
    }
    printf("  tied_embeddings            %s\n",
           c->tied_embeddings ? "true" : "false");
    printf("  qkv_bias                   %s\n", c->qkv_bias ? "true" : "false");
    printf("  bos_id                     %d\n", c->bos_id);
    printf("  eos_ids                    ");
    for (int i = 0; i < c->n_eos; i++)
        printf("%s%d", i ? "," : "", c->eos_ids[i]);
    printf("%s\n", c->n_eos == 0 ? "(none)" : "");
}

/* What the checkpoint's quantization_config declared (model/quant_config.c):
 * FP8 weights with their scale layout, or the KV-cache scales alone. */
static void cli_print_quant(const model_quant_t *q)
{
    if (!q->fp8 && !q->kv_scales) {
        printf("quantization   none\n");
        return;
    }
    if (!q->fp8) {
        printf("quantization   %s: weights as stored, fp8 KV scales\n",
               q->scheme);
        return;
    }
    printf("quantization   %s fp8 e4m3: weight scales per %s, %s "
           "activation scales%s\n", q->scheme,
           q->per_channel ? "channel" : "tensor",
           q->static_act ? "static" : "dynamic per-token",
           q->kv_scales ? ", fp8 KV scales" : "");
}

static int cli_inspect(int argc, char **argv)
{
    const char *path = NULL;
    cli_inspect_t ins = { 0, false, 0 };
    model_t *model = NULL;
    int64_t params, bytes;

    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: baton model inspect PATH [--tensors]\n"
                   "Prints the format, architecture, quantization, every "
                   "config field, the\ntensors (layer 0 only unless --tensors "
                   "or the model is small), parameter\ncount and bytes.\n");
            return 0;
        } else if (strcmp(argv[i], "--tensors") == 0) {
            ins.all = true;
        } else if (argv[i][0] == '-' || path != NULL) {
            fprintf(stderr, "baton model inspect: unexpected argument '%s'\n",
                    argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (path == NULL) {
        fprintf(stderr, "usage: baton model inspect PATH [--tensors]\n");
        return 2;
    }
    /* shapes only: a synth model's weights are never generated here
     * (synth:llama3-70b would need 140 GB of host memory) */
    if (model_load_ex(path, MODEL_LOAD_SYNTH_LAZY, &model) != BT_OK)
        return cli_fail("inspect", path);
    params = model_param_count(model);
    bytes = model_weight_bytes(model);
    printf("path           %s\n", path);
    printf("format         %s\n", model_format_name(model_format(model)));
    printf("architecture   %s\n", model_architecture(model));
    cli_print_quant(model_quant(model));
    printf("config:\n");
    cli_print_config(model_config(model));
    ins.layers = model_config(model)->n_layers;
    if (!ins.all && ins.layers * 12 + 3 <= CLI_TABLE_MAX)
        ins.all = true;
    printf("tensors%s:\n", ins.all ? "" : " (layer 0 shown; others alike)");
    printf("  %-48s %-5s %-16s %12s\n", "name", "dtype", "shape", "bytes");
    model_for_each_tensor(model, cli_print_tensor, &ins);
    printf("n_tensors      %d\n", ins.n);
    printf("params         %" PRId64 " (%.3f M)\n", params, params / 1e6);
    printf("weight_bytes   %" PRId64 " (%.3f MiB)\n", bytes,
           bytes / (1024.0 * 1024.0));
    model_destroy(&model);
    return 0;
}

// ----------------------------------------------------------------------------
// synth

static int cli_synth(int argc, char **argv)
{
    const char *shape = NULL, *config = NULL, *out = NULL, *v = NULL;
    int dtype = MODEL_SYNTH_DTYPE_DEFAULT;
    uint64_t seed = 0;
    model_t *model = NULL;
    model_dtype_t dt;
    double t0;
    int r;

    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: baton model synth (--shape NAME | --config FILE) "
                   "--out DIR\n"
                   "                         [--dtype f32|bf16|f16] "
                   "[--seed S]\n"
                   "Writes a model with seeded random weights (std 0.02, "
                   "norms 1) as a Hugging\nFace directory.  Default dtype: "
                   "f32 for tiny shapes, bf16 otherwise.\nshapes:\n");
            for (int s = 0; s < model_synth_shape_count(); s++)
                printf("  %-12s %s\n", model_synth_shape_name(s),
                       model_synth_shape_desc(s));
            return 0;
        }
        if ((r = cli_opt(argc, argv, &i, "--shape", &shape)) ||
            (r = cli_opt(argc, argv, &i, "--config", &config)) ||
            (r = cli_opt(argc, argv, &i, "--out", &out))) {
            if (r < 0)
                goto err_missing;
        } else if ((r = cli_opt(argc, argv, &i, "--dtype", &v))) {
            if (r < 0)
                goto err_missing;
            if (!cli_parse_dtype(v, &dt)) {
                fprintf(stderr, "baton model synth: bad --dtype '%s' (f32, "
                                "bf16, f16)\n", v);
                return 2;
            }
            dtype = (int)dt;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v))) {
            if (r < 0)
                goto err_missing;
            if (bt_parse_u64(v, &seed) != BT_OK) {
                fprintf(stderr, "baton model synth: bad --seed '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "baton model synth: unexpected argument '%s'\n",
                    argv[i]);
            return 2;
        }
    }
    if ((shape == NULL) == (config == NULL) || out == NULL) {
        fprintf(stderr, "usage: baton model synth (--shape NAME | --config "
                        "FILE) --out DIR [--dtype f32|bf16|f16] [--seed S]\n");
        return 2;
    }
    t0 = bt_time_s();
    if (shape != NULL) {
        if (model_synth_create(shape, seed, dtype, &model) != BT_OK)
            return cli_fail("synth", shape);
    } else if (model_synth_from_config(config, seed, dtype, &model) !=
               BT_OK) {
        return cli_fail("synth", config);
    }
    dt = model_tok_embedding(model)->dtype;
    if (model_write_hf(model, out, dt) != BT_OK) {
        model_destroy(&model);
        return cli_fail("synth", out);
    }
    printf("wrote %s: %s, %" PRId64 " params, %s, seed %" PRIu64
           " (%.2f s)\n", out, model_architecture(model),
           model_param_count(model), model_dtype_name(dt), seed,
           bt_time_s() - t0);
    model_destroy(&model);
    return 0;

err_missing:
    fprintf(stderr, "baton model synth: option needs a value\n");
    return 2;
}

// ----------------------------------------------------------------------------
// convert

static int cli_convert(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *to = NULL, *v = NULL;
    bool have_dtype = false, to_hf;
    model_dtype_t dtype = MODEL_DTYPE_F32;
    model_t *model = NULL;
    bt_status_t status;
    int r;

    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: baton model convert --in PATH --out PATH "
                   "[--to hf|llama2c]\n"
                   "                           [--dtype f32|bf16|f16]\n"
                   "Converts llama2.c .bin <-> Hugging Face directory "
                   "(default: the other format;\nsynth:NAME inputs go to "
                   "hf).  q/k rows are permuted between the RoPE layouts.\n"
                   "--dtype applies to hf output (default: the input's "
                   "dtype); llama2c output is\nalways f32 and only for "
                   "models the v0 format can express.\n");
            return 0;
        }
        if ((r = cli_opt(argc, argv, &i, "--in", &in)) ||
            (r = cli_opt(argc, argv, &i, "--out", &out)) ||
            (r = cli_opt(argc, argv, &i, "--to", &to))) {
            if (r < 0)
                goto err_missing;
        } else if ((r = cli_opt(argc, argv, &i, "--dtype", &v))) {
            if (r < 0)
                goto err_missing;
            if (!cli_parse_dtype(v, &dtype)) {
                fprintf(stderr, "baton model convert: bad --dtype '%s' (f32, "
                                "bf16, f16)\n", v);
                return 2;
            }
            have_dtype = true;
        } else {
            fprintf(stderr, "baton model convert: unexpected argument '%s'\n",
                    argv[i]);
            return 2;
        }
    }
    if (in == NULL || out == NULL) {
        fprintf(stderr, "usage: baton model convert --in PATH --out PATH "
                        "[--to hf|llama2c] [--dtype f32|bf16|f16]\n");
        return 2;
    }
    if (to != NULL && strcmp(to, "hf") != 0 && strcmp(to, "llama2c") != 0) {
        fprintf(stderr, "baton model convert: bad --to '%s' (hf, llama2c)\n",
                to);
        return 2;
    }
    if (model_load(in, &model) != BT_OK)
        return cli_fail("convert", in);
    to_hf = to != NULL ? strcmp(to, "hf") == 0
                       : model_format(model) != MODEL_FORMAT_HF;
    if (to_hf) {
        if (!have_dtype)
            dtype = model_tok_embedding(model)->dtype;
        status = model_write_hf(model, out, dtype);
    } else {
        if (have_dtype && dtype != MODEL_DTYPE_F32) {
            fprintf(stderr, "baton model convert: llama2c output is always "
                            "f32\n");
            model_destroy(&model);
            return 2;
        }
        status = model_write_llama2c(model, out);
    }
    if (status != BT_OK) {
        model_destroy(&model);
        return cli_fail("convert", out);
    }
    printf("wrote %s (%s, %s)\n", out, to_hf ? "hf" : "llama2c",
           model_dtype_name(to_hf ? dtype : MODEL_DTYPE_F32));
    model_destroy(&model);
    return 0;

err_missing:
    fprintf(stderr, "baton model convert: option needs a value\n");
    return 2;
}

int cli_model_main(int argc, char **argv)
{
    if (argc < 2) {
        model_usage(stderr);
        return 2;
    }
    if (cli_is_help(argv[1])) {
        model_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "inspect") == 0)
        return cli_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "synth") == 0)
        return cli_synth(argc - 1, argv + 1);
    if (strcmp(argv[1], "convert") == 0)
        return cli_convert(argc - 1, argv + 1);
    if (strcmp(argv[1], "quantize") == 0)
        return cli_model_quantize(argc - 1, argv + 1);
    fprintf(stderr, "baton model: unknown command '%s'\n", argv[1]);
    model_usage(stderr);
    return 2;
}
