/*
 * cli_tokenize.c - `baton tokenize` and `baton detokenize`: text <-> ids
 * with any tokenizer baton reads (a Hugging Face directory or
 * tokenizer.json, or a llama2.c tokenizer file).  Exit codes: 0 ok, 1
 * runtime error, 2 bad usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "model/tokenizer.h"

#define CLI_TOK_MAX_FILE (1u << 30)

enum {
    TOK_OPT_TOKENIZER = 1,
    TOK_OPT_TEXT,
    TOK_OPT_FILE,
    TOK_OPT_IDS,
    TOK_OPT_PIECES,
    TOK_OPT_LINES,
    TOK_OPT_BOS,
    TOK_OPT_NO_BOS,
    TOK_OPT_VOCAB,
    TOK_OPT_TIME,
    TOK_OPT_REPEAT,
    TOK_OPT_SKIP_SPECIAL,
    TOK_OPT_HELP
};

static void tokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: baton tokenize --tokenizer PATH (--text T | --file F)\n"
            "                      [--ids | --pieces] [--lines] "
            "[--bos | --no-bos]\n"
            "                      [--vocab-size N] [--time] [--repeat N]\n\n"
            "  --tokenizer PATH  Hugging Face dir or tokenizer.json, or a "
            "llama2.c\n"
            "                    tokenizer file\n"
            "  --ids             print ids separated by spaces (default)\n"
            "  --pieces          print one \"id<TAB>piece\" per line\n"
            "  --lines           encode each input line on its own and print "
            "one id\n"
            "                    list per line (the newline is not encoded)\n"
            "  --bos / --no-bos  add BOS or not (default: what the tokenizer "
            "says)\n"
            "  --vocab-size N    model vocab size (llama2.c files: piece "
            "count)\n"
            "  --time            print encode throughput to stderr\n"
            "  --repeat N        encode N times (for --time)\n");
}

static void detokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: baton detokenize --tokenizer PATH --ids \"1 2 3\" "
            "[--skip-special]\n"
            "                        [--vocab-size N]\n\n"
            "  prints the text (streamed token by token, UTF-8 safe) and a "
            "newline\n");
}

static const struct option tok_long_opts[] = {
    {"tokenizer", required_argument, NULL, TOK_OPT_TOKENIZER},
    {"text", required_argument, NULL, TOK_OPT_TEXT},
    {"file", required_argument, NULL, TOK_OPT_FILE},
    {"ids", no_argument, NULL, TOK_OPT_IDS},
    {"pieces", no_argument, NULL, TOK_OPT_PIECES},
    {"lines", no_argument, NULL, TOK_OPT_LINES},
    {"bos", no_argument, NULL, TOK_OPT_BOS},
    {"no-bos", no_argument, NULL, TOK_OPT_NO_BOS},
    {"vocab-size", required_argument, NULL, TOK_OPT_VOCAB},
    {"time", no_argument, NULL, TOK_OPT_TIME},
    {"repeat", required_argument, NULL, TOK_OPT_REPEAT},
    {"skip-special", no_argument, NULL, TOK_OPT_SKIP_SPECIAL},
    {"help", no_argument, NULL, TOK_OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* detokenize: --ids takes the list. */
static const struct option detok_long_opts[] = {
    {"tokenizer", required_argument, NULL, TOK_OPT_TOKENIZER},
    {"ids", required_argument, NULL, TOK_OPT_IDS},
    {"vocab-size", required_argument, NULL, TOK_OPT_VOCAB},
    {"skip-special", no_argument, NULL, TOK_OPT_SKIP_SPECIAL},
    {"help", no_argument, NULL, TOK_OPT_HELP},
    {NULL, 0, NULL, 0},
};

typedef struct {
    const char *tokenizer; /* --tokenizer */
    const char *text;      /* --text */
    const char *file;      /* --file */
    const char *ids;       /* detokenize --ids */
    bool pieces;           /* --pieces */
    bool lines;            /* --lines */
    int bos;               /* -1 default, 0 no, 1 yes */
    int vocab_size;        /* --vocab-size, 0 unknown */
    bool time;             /* --time */
    int repeat;            /* --repeat */
    bool skip_special;     /* --skip-special */
} tok_cli_opts_t;

/* Parses the options shared by both commands; returns -1 to continue,
 * else the exit code. */
static int tok_cli_parse(int argc, char **argv, bool detok,
                         tok_cli_opts_t *o)
{
    int opt;

    memset(o, 0, sizeof(*o));
    o->bos = -1;
    o->repeat = 1;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h",
                              detok ? detok_long_opts : tok_long_opts, NULL)) != -1) {
        switch (opt) {
        case TOK_OPT_TOKENIZER: o->tokenizer = optarg; break;
        case TOK_OPT_TEXT: o->text = optarg; break;
        case TOK_OPT_FILE: o->file = optarg; break;
        case TOK_OPT_IDS: o->ids = optarg; break; /* NULL for tokenize */
        case TOK_OPT_PIECES: o->pieces = true; break;
        case TOK_OPT_LINES: o->lines = true; break;
        case TOK_OPT_BOS: o->bos = 1; break;
        case TOK_OPT_NO_BOS: o->bos = 0; break;
        case TOK_OPT_TIME: o->time = true; break;
        case TOK_OPT_SKIP_SPECIAL: o->skip_special = true; break;
        case TOK_OPT_VOCAB:
            if (bt_parse_int(optarg, &o->vocab_size) != BT_OK ||
                o->vocab_size < 0) {
                fprintf(stderr, "baton: bad --vocab-size '%s'\n", optarg);
                return 2;
            }
            break;
        case TOK_OPT_REPEAT:
            if (bt_parse_int(optarg, &o->repeat) != BT_OK || o->repeat < 1) {
                fprintf(stderr, "baton: bad --repeat '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
        case TOK_OPT_HELP:
            (detok ? detokenize_usage : tokenize_usage)(stdout);
            return 0;
        default:
            (detok ? detokenize_usage : tokenize_usage)(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->tokenizer == NULL) {
        fprintf(stderr, "baton: --tokenizer is required\n");
        return 2;
    }
    return -1;
}

/* Prints a piece with control bytes, backslashes and non-UTF-8-safe bytes
 * escaped, so one piece stays on one line. */
static void tok_print_piece(const char *s)
{
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static void tok_print_ids(const tok_t *tok, const int *ids, int n,
                          bool pieces)
{
    for (int i = 0; i < n; i++) {
        if (pieces) {
            printf("%d\t", ids[i]);
            tok_print_piece(tok_piece(tok, ids[i]));
            putchar('\n');
        } else {
            printf(i > 0 ? " %d" : "%d", ids[i]);
        }
    }
    if (!pieces)
        putchar('\n');
}

int cli_tokenize_main(int argc, char **argv)
{
    tok_cli_opts_t o;
    tok_t *tok = NULL;
    char *data = NULL;
    const char *text;
    size_t len = 0, total_bytes = 0, total_ids = 0;
    bool add_bos;
    double t_enc = 0;
    int ret = tok_cli_parse(argc, argv, false, &o);

    if (ret >= 0)
        return ret;
    if ((o.text == NULL) == (o.file == NULL)) {
        fprintf(stderr, "baton tokenize: give exactly one of --text and "
                        "--file\n");
        return 2;
    }
    if (tok_load(o.tokenizer, o.vocab_size, &tok) != BT_OK) {
        fprintf(stderr, "baton tokenize: %s: %s\n", o.tokenizer,
                bt_error_last());
        return 1;
    }
    if (o.file != NULL) {
        if (bt_read_file(o.file, CLI_TOK_MAX_FILE, &data, &len) != BT_OK) {
            fprintf(stderr, "baton tokenize: %s: %s\n", o.file,
                    bt_error_last());
            ret = 1;
            goto out;
        }
        text = data;
    } else {
        text = o.text;
        len = strlen(text);
    }
    add_bos = o.bos >= 0 ? o.bos == 1 : tok_adds_bos(tok);

    for (int r = 0; r < o.repeat; r++) {
        size_t pos = 0;
        bool print = r == o.repeat - 1;
        do {
            const char *line = text + pos;
            size_t n = len - pos;
            const char *nl = o.lines ? memchr(line, '\n', n) : NULL;
            int *ids = NULL;
            int n_ids = 0;
            double t0;

            if (nl != NULL)
                n = (size_t)(nl - line);
            t0 = bt_time_s();
            if (tok_encode(tok, line, n, add_bos, &ids, &n_ids) != BT_OK) {
                fprintf(stderr, "baton tokenize: %s\n", bt_error_last());
                ret = 1;
                goto out;
            }
            t_enc += bt_time_s() - t0;
            total_bytes += n;
            total_ids += (size_t)n_ids;
            if (print)
                tok_print_ids(tok, ids, n_ids, o.pieces);
            bt_free(ids);
            pos += n + (nl != NULL ? 1 : 0);
        } while (o.lines && pos < len);
    }
    if (o.time)
        fprintf(stderr,
                "encode: bytes:%zu ids:%zu seconds:%.6f MB/s:%.2f "
                "tokenizer:%s\n",
                total_bytes, total_ids, t_enc,
                t_enc > 0 ? total_bytes / t_enc / 1e6 : 0.0,
                tok_kind_name(tok));
    ret = fflush(stdout) == 0 ? 0 : 1;

out:
    bt_free(data);
    tok_destroy(&tok);
    return ret;
}

int cli_detokenize_main(int argc, char **argv)
{
    tok_cli_opts_t o;
    tok_t *tok = NULL;
    tok_stream_t *st = NULL;
    int *ids = NULL;
    int n_ids = 0;
    char *chunk = NULL;
    size_t cap, got;
    int ret = tok_cli_parse(argc, argv, true, &o);

    if (ret >= 0)
        return ret;
    if (o.ids == NULL) {
        fprintf(stderr, "baton detokenize: --ids is required\n");
        return 2;
    }
    if (bt_parse_int_list(o.ids, &ids, &n_ids) != BT_OK) {
        fprintf(stderr, "baton detokenize: bad --ids '%s'\n", o.ids);
        return 2;
    }
    if (tok_load(o.tokenizer, o.vocab_size, &tok) != BT_OK) {
        fprintf(stderr, "baton detokenize: %s: %s\n", o.tokenizer,
                bt_error_last());
        ret = 1;
        goto out;
    }
    tok_set_skip_special(tok, o.skip_special);
    cap = 3 * ((size_t)tok_max_piece_len(tok) + 3) + 1;
    cap = BT_MAX(cap, (size_t)64);
    chunk = bt_malloc(cap, "cli_detok");
    if (chunk == NULL || tok_stream_create(tok, -1, &st) != BT_OK) {
        fprintf(stderr, "baton detokenize: %s\n", bt_error_last());
        ret = 1;
        goto out;
    }
    ret = 0;
    for (int i = 0; i <= n_ids; i++) {
        bt_status_t status = i < n_ids
                                 ? tok_stream_push(st, ids[i], chunk, cap,
                                                   &got)
                                 : tok_stream_flush(st, chunk, cap, &got);
        if (status != BT_OK) {
            fprintf(stderr, "baton detokenize: %s\n", bt_error_last());
            ret = 1;
            goto out;
        }
        fwrite(chunk, 1, got, stdout);
    }
    putchar('\n');
    ret = fflush(stdout) == 0 ? 0 : 1;

out:
    tok_stream_destroy(&st);
    bt_free(chunk);
    bt_free(ids);
    tok_destroy(&tok);
    return ret;
}
