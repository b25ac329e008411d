/*
 * cli_keygen.c - `baton keygen --out PREFIX`: writes a CURVE key pair
 * (PREFIX.key, the secret, mode 0600; PREFIX.pub, the public key) for a
 * router, a worker or a client (docs/SECURITY.md).
 */
#include <getopt.h>
#include <stdio.h>

#include "bt_curve.h"
#include "bt_error.h"
#include "cli.h"

static void keygen_usage(FILE *out)
{
    fprintf(out,
        "usage: baton keygen --out PREFIX\n"
        "  writes a CurveZMQ key pair: PREFIX.key (secret, Z85, mode 0600,\n"
        "  never overwritten) and PREFIX.pub (public, Z85), and prints the\n"
        "  public key.  Give the router its .key and list the workers' and\n"
        "  clients' .pub files in --allow-workers / --allow-clients; give\n"
        "  each worker or client its .key and the router's .pub\n"
        "  (--curve-secret-key, --router-public-key).  docs/SECURITY.md\n");
}

int cli_keygen_main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "out", required_argument, 0, 'o' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *prefix = NULL;
    char pub[BT_CURVE_Z85_LEN + 1];
    int c;

    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': prefix = optarg; break;
        case 'h': keygen_usage(stdout); return 0;
        default: keygen_usage(stderr); return 2;
        }
    }
    if (prefix == NULL || prefix[0] == '\0' || optind != argc) {
        keygen_usage(stderr);
        return 2;
    }
    if (bt_curve_keygen(prefix, pub) != BT_OK) {
        fprintf(stderr, "baton keygen: %s\n", bt_error_last());
        return 1;
    }
    printf("%s\n", pub);
    return 0;
}
