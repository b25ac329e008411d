/*
 * cli_common.h - option sets shared by CLI subcommands: engine options
 * (model, tokenizer, device, KV sizing) and generation options (sampling,
 * stop conditions), so `baton run`, `baton generate` and the benchmarks
 * spell them the same way.
 */
#ifndef BT_CLIENT_CLI_COMMON_H
#define BT_CLIENT_CLI_COMMON_H

#include <getopt.h>
#include <stdbool.h>

#include "engine.h"
#include "params.h"
#include "stop.h"

enum {
    CLI_OPT_MODEL = 1000,
    CLI_OPT_TOKENIZER,
    CLI_OPT_DEVICE,
    CLI_OPT_THREADS,
    CLI_OPT_BLOCK_SIZE,
    CLI_OPT_KV_BLOCKS,
    CLI_OPT_MAX_BATCH_TOKENS,
    CLI_OPT_PRECISION,
    CLI_OPT_TP,
    CLI_OPT_KV_DTYPE,
    CLI_OPT_MAX_TOKENS = 1100,
    CLI_OPT_TEMPERATURE,
    CLI_OPT_TOP_K,
    CLI_OPT_TOP_P,
    CLI_OPT_MIN_P,
    CLI_OPT_REP_PENALTY,
    CLI_OPT_PRESENCE_PENALTY,
    CLI_OPT_FREQUENCY_PENALTY,
    CLI_OPT_SEED,
    CLI_OPT_STOP,
    CLI_OPT_STOP_ID,
    CLI_OPT_IGNORE_EOS,
    CLI_OPT_NO_SKIP_SPECIAL
};

#define CLI_ENGINE_OPTIONS                                                  \
    { "model", required_argument, NULL, CLI_OPT_MODEL },                    \
    { "tokenizer", required_argument, NULL, CLI_OPT_TOKENIZER },            \
    { "device", required_argument, NULL, CLI_OPT_DEVICE },                  \
    { "threads", required_argument, NULL, CLI_OPT_THREADS },                \
    { "block-size", required_argument, NULL, CLI_OPT_BLOCK_SIZE },          \
    { "kv-blocks", required_argument, NULL, CLI_OPT_KV_BLOCKS },            \
    { "max-batch-tokens", required_argument, NULL, CLI_OPT_MAX_BATCH_TOKENS },\
    { "precision", required_argument, NULL, CLI_OPT_PRECISION },            \
    { "tp", required_argument, NULL, CLI_OPT_TP },                          \
    { "kv-dtype", required_argument, NULL, CLI_OPT_KV_DTYPE }

#define CLI_SAMPLING_OPTIONS                                                \
    { "max-tokens", required_argument, NULL, CLI_OPT_MAX_TOKENS },          \
    { "temperature", required_argument, NULL, CLI_OPT_TEMPERATURE },        \
    { "top-k", required_argument, NULL, CLI_OPT_TOP_K },                    \
    { "top-p", required_argument, NULL, CLI_OPT_TOP_P },                    \
    { "min-p", required_argument, NULL, CLI_OPT_MIN_P },                    \
    { "repetition-penalty", required_argument, NULL, CLI_OPT_REP_PENALTY }, \
    { "presence-penalty", required_argument, NULL, CLI_OPT_PRESENCE_PENALTY },\
    { "frequency-penalty", required_argument, NULL, CLI_OPT_FREQUENCY_PENALTY },\
    { "seed", required_argument, NULL, CLI_OPT_SEED },                      \
    { "stop", required_argument, NULL, CLI_OPT_STOP },                      \
    { "stop-id", required_argument, NULL, CLI_OPT_STOP_ID },                \
    { "ignore-eos", no_argument, NULL, CLI_OPT_IGNORE_EOS },             \
    { "no-skip-special", no_argument, NULL, CLI_OPT_NO_SKIP_SPECIAL }

#define CLI_ENGINE_HELP                                                     \
"\nengine:\n"                                                               \
"  --device cpu|cuda|auto  backend (default auto: cuda when a GPU is present)\n"\
"  --threads N            CPU threads (default: all cores)\n"               \
"  --block-size N         KV block size in tokens (default 16)\n"           \
"  --kv-blocks N          KV pool size in blocks (default 256)\n"          \
"  --max-batch-tokens N   most tokens in one forward (default 2048)\n"      \
"  --precision f32|bf16|fp8  compute precision (default: cpu f32, cuda\n"  \
"                         bf16; fp8: cpu reference only)\n"                \
"  --kv-dtype auto|bf16|fp8  KV cache dtype (fp8: E4M3, cpu only)\n"      \
"  --tp N                 tensor parallelism over GPUs 0..N-1 (cuda)\n"

#define CLI_SAMPLING_HELP                                                   \
"\ngeneration:\n"                                                           \
"  --max-tokens N         tokens to generate (default: until the context\n" \
"                         is full)\n"                                       \
"  --temperature T        [0, 2], 0 = greedy (default 0)\n"                \
"  --top-k K              keep the K most likely tokens (0 = off)\n"        \
"  --top-p P              nucleus sampling, (0, 1] (1 = off)\n"             \
"  --min-p P              drop tokens below P x the top probability, [0, 1]\n"\
"  --repetition-penalty R (0, 10], 1 = off\n"                               \
"  --presence-penalty X   [-2, 2]\n"                                        \
"  --frequency-penalty X  [-2, 2]\n"                                        \
"  --seed S               random seed (same seed, same output)\n"          \
"  --stop TEXT            stop string (repeatable)\n"                       \
"  --stop-id ID           stop token id (repeatable)\n"                     \
"  --ignore-eos           do not stop at the model's end-of-text ids\n"     \
"  --no-skip-special      print special tokens (BOS, EOS, control tokens)\n"\
"                         in the text (default: they print as nothing)\n"  \
"  (bounds: params/params.h, the contract baton-http and the router check)\n"

/* The generation options: the parameter contract (params.h), checked by
 * cli_gen_validate as baton-http and the router check it. */
typedef struct {
    params_t params;      /* max_tokens 0: until the context is full */
    const char *stops[PARAMS_MAX_STOP_STRINGS]; /* (params.n_stop_strings)
                           * the same stop strings, from argv */
} cli_gen_opts_t;

void cli_gen_opts_init(cli_gen_opts_t *gen);
void cli_gen_opts_cleanup(cli_gen_opts_t *gen);

/* Each returns 0 when `opt` was one of its options and the value parsed,
 * 1 when opt is not one of its options, -1 for a bad value (a message is
 * printed). */
int cli_engine_option(int opt, const char *arg, engine_config_t *cfg);
int cli_sampling_option(int opt, const char *arg, cli_gen_opts_t *gen);

/* params_validate; prints "PROG: <message>" to stderr and returns
 * BT_ERR_INVALID_ARG when it refuses. */
bt_status_t cli_gen_validate(const cli_gen_opts_t *gen, const char *prog);

/* Builds the stop configuration: the model's EOS ids (unless
 * --ignore-eos) plus --stop-id, --stop strings, and max_tokens (default:
 * what is left of the context after the prompt). */
bt_status_t cli_stop_config(const cli_gen_opts_t *gen,
                            const model_config_t *mcfg, int max_context,
                            int n_prompt, stop_config_t *scfg);

#endif /* BT_CLIENT_CLI_COMMON_H */
