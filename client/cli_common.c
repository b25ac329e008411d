/* cli_common.c - shared CLI option parsing (see cli_common.h). */
#include "cli_common.h"

#include <stdio.h>
#include <string.h>

#include "bt_error.h"
#include "bt_util.h"

void cli_gen_opts_init(cli_gen_opts_t *gen)
{
    memset(gen, 0, sizeof(*gen));
    params_init(&gen->params);
}

void cli_gen_opts_cleanup(cli_gen_opts_t *gen)
{
    (void)gen; /* strings point into argv */
}

static int cli_bad(const char *name, const char *arg)
{
    fprintf(stderr, "baton: invalid value '%s' for --%s\n", arg, name);
    return -1;
}

int cli_engine_option(int opt, const char *arg, engine_config_t *cfg)
{
    switch (opt) {
    case CLI_OPT_MODEL:
        cfg->model_path = arg;
        return 0;
    case CLI_OPT_TOKENIZER:
        cfg->tokenizer_path = arg;
        return 0;
    case CLI_OPT_DEVICE:
        if (strcmp(arg, "cpu") && strcmp(arg, "cuda") && strcmp(arg, "auto"))
            return cli_bad("device", arg);
        cfg->device = arg;
        return 0;
    case CLI_OPT_THREADS:
        if (bt_parse_int(arg, &cfg->backend.n_threads) != BT_OK ||
            cfg->backend.n_threads < 0 || cfg->backend.n_threads > 1024)
            return cli_bad("threads", arg);
        return 0;
    case CLI_OPT_BLOCK_SIZE:
        if (bt_parse_int(arg, &cfg->backend.block_size) != BT_OK ||
            cfg->backend.block_size <= 0 || cfg->backend.block_size > 4096)
            return cli_bad("block-size", arg);
        return 0;
    case CLI_OPT_KV_BLOCKS:
        if (bt_parse_int(arg, &cfg->backend.n_kv_blocks) != BT_OK ||
            cfg->backend.n_kv_blocks <= 0)
            return cli_bad("kv-blocks", arg);
        return 0;
    case CLI_OPT_MAX_BATCH_TOKENS:
        if (bt_parse_int(arg, &cfg->backend.max_batch_tokens) != BT_OK ||
            cfg->backend.max_batch_tokens <= 0)
            return cli_bad("max-batch-tokens", arg);
        return 0;
    case CLI_OPT_TP:
        if (bt_parse_int(arg, &cfg->backend.tp_size) != BT_OK ||
            cfg->backend.tp_size < 1 || cfg->backend.tp_size > 64)
            return cli_bad("tp", arg);
        return 0;
    case CLI_OPT_PRECISION:
        if (strcmp(arg, "f32") == 0)
            cfg->backend.precision = BACKEND_PRECISION_F32;
        else if (strcmp(arg, "bf16") == 0)
            cfg->backend.precision = BACKEND_PRECISION_BF16;
        else if (strcmp(arg, "fp8") == 0)
            cfg->backend.precision = BACKEND_PRECISION_FP8;
        else
            return cli_bad("precision", arg);
        return 0;
    case CLI_OPT_KV_DTYPE:
        if (backend_kv_dtype_parse(arg, &cfg->backend.kv_dtype) != BT_OK)
            return cli_bad("kv-dtype", arg);
        return 0;
    default:
        return 1;
    }
}

int cli_sampling_option(int opt, const char *arg, cli_gen_opts_t *gen)
{
    params_sampling_t *sp = &gen->params.sampling;
    params_t *p = &gen->params;
    uint64_t seed;
    int id;

    switch (opt) {
    case CLI_OPT_MAX_TOKENS:
        if (bt_parse_int(arg, &p->max_tokens) != BT_OK ||
            p->max_tokens <= 0)
            return cli_bad("max-tokens", arg);
        return 0;
    case CLI_OPT_TEMPERATURE:
        return bt_parse_float(arg, &sp->temperature) ? cli_bad("temperature",
                                                              arg) : 0;
    case CLI_OPT_TOP_K:
        return bt_parse_int(arg, &sp->top_k) ? cli_bad("top-k", arg) : 0;
    case CLI_OPT_TOP_P:
        return bt_parse_float(arg, &sp->top_p) ? cli_bad("top-p", arg) : 0;
    case CLI_OPT_MIN_P:
        return bt_parse_float(arg, &sp->min_p) ? cli_bad("min-p", arg) : 0;
    case CLI_OPT_REP_PENALTY:
        return bt_parse_float(arg, &sp->repetition_penalty)
                   ? cli_bad("repetition-penalty", arg) : 0;
    case CLI_OPT_PRESENCE_PENALTY:
        return bt_parse_float(arg, &sp->presence_penalty)
                   ? cli_bad("presence-penalty", arg) : 0;
    case CLI_OPT_FREQUENCY_PENALTY:
        return bt_parse_float(arg, &sp->frequency_penalty)
                   ? cli_bad("frequency-penalty", arg) : 0;
    case CLI_OPT_SEED:
        if (bt_parse_u64(arg, &seed) != BT_OK)
            return cli_bad("seed", arg);
        sp->seed = seed;
        return 0;
    case CLI_OPT_STOP:
        if (p->n_stop_strings >= PARAMS_MAX_STOP_STRINGS || arg[0] == '\0')
            return cli_bad("stop", arg);
        gen->stops[p->n_stop_strings] = arg;
        p->stop_strings[p->n_stop_strings].data = arg;
        p->stop_strings[p->n_stop_strings].len = strlen(arg);
        p->n_stop_strings++;
        return 0;
    case CLI_OPT_STOP_ID:
        if (p->n_stop_ids >= PARAMS_MAX_STOP_IDS - MODEL_MAX_EOS ||
            bt_parse_int(arg, &id) != BT_OK || id < 0)
            return cli_bad("stop-id", arg);
        p->stop_ids[p->n_stop_ids++] = id;
        return 0;
    case CLI_OPT_IGNORE_EOS:
        p->ignore_eos = true;
        return 0;
    case CLI_OPT_NO_SKIP_SPECIAL:
        sp->skip_special_tokens = false;
        return 0;
    default:
        return 1;
    }
}

bt_status_t cli_gen_validate(const cli_gen_opts_t *gen, const char *prog)
{
    char err[160];

    if (params_validate(&gen->params, err, sizeof(err), NULL) != BT_OK) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return BT_ERR_INVALID_ARG;
    }
    return BT_OK;
}

bt_status_t cli_stop_config(const cli_gen_opts_t *gen,
                            const model_config_t *mcfg, int max_context,
                            int n_prompt, stop_config_t *scfg)
{
    const params_t *p = &gen->params;

    stop_config_init(scfg);
    if (!p->ignore_eos) {
        for (int i = 0; i < mcfg->n_eos; i++)
            scfg->ids[scfg->n_ids++] = mcfg->eos_ids[i];
    }
    for (int i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] >= mcfg->vocab_size)
            return BT_ERROR(BT_ERR_INVALID_ARG, "CLI",
                            "stop id %d is outside the vocabulary of %d",
                            p->stop_ids[i], mcfg->vocab_size);
        scfg->ids[scfg->n_ids++] = p->stop_ids[i];
    }
    for (int i = 0; i < p->n_stop_strings; i++)
        scfg->strings[scfg->n_strings++] = gen->stops[i];
    scfg->max_tokens = p->max_tokens > 0 ? p->max_tokens
                                         : max_context - n_prompt + 1;
    if (scfg->max_tokens <= 0)
        scfg->max_tokens = 1;
    return BT_OK;
}
