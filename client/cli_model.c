/* cli_model.c - placeholder until the subcommand lands. */
#include <stdio.h>

#include "cli.h"

int cli_model_main(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "baton %s: not built yet\n", argv[0]);
    return 1;
}
