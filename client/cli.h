/*
 * cli.h - subcommands of the `baton` CLI.  Each takes argv starting at
 * the subcommand name and returns the process exit code (0 ok, 1 runtime
 * error, 2 usage error).
 */
#ifndef BT_CLIENT_CLI_H
#define BT_CLIENT_CLI_H

typedef struct {
    const char *name;
    const char *help;
    int (*main)(int argc, char **argv);
} cli_command_t;

int cli_run_main(int argc, char **argv);          /* cli_run.c */
int cli_model_main(int argc, char **argv);        /* cli_model.c */
int cli_model_quantize(int argc, char **argv);    /* cli_quantize.c */
int cli_bench_engine_main(int argc, char **argv); /* cli_bench_engine.c */
int cli_generate_main(int argc, char **argv);     /* cli_generate.c */
int cli_up_main(int argc, char **argv);           /* cli_up.c */
int cli_bench_main(int argc, char **argv);        /* cli_bench.c */
int cli_bench_kv_main(int argc, char **argv);     /* cli_bench_kv.c */
int cli_tokenize_main(int argc, char **argv);     /* cli_tokenize.c */
int cli_detokenize_main(int argc, char **argv);   /* cli_tokenize.c */
int cli_eagle_main(int argc, char **argv);        /* cli_eagle.c */
int cli_status_main(int argc, char **argv);       /* cli_status.c */
int cli_keygen_main(int argc, char **argv);       /* cli_keygen.c */

#endif /* BT_CLIENT_CLI_H */
