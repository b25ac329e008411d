/* cli_bench.c - `baton bench` (load generator); filled in below. */
#include <stdio.h>

#include "cli.h"

int cli_bench_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "baton bench: not built yet\n");
    return 2;
}
