/*
 * baton.c - the `baton` command line: dispatches to subcommands.
 * Each subcommand lives in client/cli_<name>.c and declares its entry in
 * cli.h.
 */
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "cli.h"
#include "client.h"

static const cli_command_t cli_commands[] = {
    { "run", "generate text from a model in one process", cli_run_main },
    { "model", "inspect, synthesize or convert model files", cli_model_main },
    { "bench-engine", "measure engine prefill/decode tokens/s",
      cli_bench_engine_main },
    { "generate", "stream a completion from a baton cluster",
      cli_generate_main },
    { "status", "cluster status; --wait-workers: wait until it can serve",
      cli_status_main },
    { "up", "start a local cluster (router + prefill + decode workers)",
      cli_up_main },
    { "bench", "load-test a cluster: TTFT/TPOT/ITL, throughput, goodput",
      cli_bench_main },
    { "bench-kv", "measure UCX KV hand-off bandwidth", cli_bench_kv_main },
    { "tokenize", "text -> token ids with a model's tokenizer",
      cli_tokenize_main },
    { "detokenize", "token ids -> text", cli_detokenize_main },
    { "eagle", "train or benchmark EAGLE draft heads", cli_eagle_main },
    { "keygen", "write a CURVE key pair (PREFIX.key, PREFIX.pub)",
      cli_keygen_main },
};

static void usage(FILE *out)
{
    fprintf(out, "usage: baton COMMAND [options]   (baton COMMAND --help)\n\n"
                 "Every command that talks to a router also takes\n"
                 "  --curve-secret-key FILE --router-public-key FILE\n"
                 "(env BATON_CURVE_SECRET_KEY, BATON_ROUTER_PUBLIC_KEY) to "
                 "connect with CURVE.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cli_commands) / sizeof(cli_commands[0]);
         i++)
        fprintf(out, "  %-14s %s\n", cli_commands[i].name,
                cli_commands[i].help);
}

int main(int argc, char **argv)
{
    bt_log_init("baton");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (client_curve_args(&argc, argv, "baton") != 0)
        return 2;
    for (size_t i = 0; i < sizeof(cli_commands) / sizeof(cli_commands[0]);
         i++) {
        if (strcmp(argv[1], cli_commands[i].name) == 0)
            return cli_commands[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "baton: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
