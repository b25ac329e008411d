/*
 * cli_generate.c - `baton generate`: send one request to a router and
 * stream the completion to stdout (text, or ids with --ids).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "cli_common.h"
#include "client.h"

static void generate_usage(FILE *out)
{
    fprintf(out,
"usage: baton generate --router tcp://HOST:PORT (--prompt TEXT |\n"
"                      --prompt-ids \"1 2 3\") [options]\n"
"\n"
"Sends one request to a baton router and streams the completion.\n"
"\n"
"  --router EP            client endpoint (env BATON_ROUTER)\n"
"  --prompt TEXT          prompt text (tokenized by the cluster, BOS first)\n"
"  --prompt-ids IDS       prompt token ids, space or comma separated\n"
"  --ids                  print generated ids on one line instead of text\n"
"  --stats                print usage and timings to stderr\n"
"  --priority N           higher first (default 0)\n"
"  --deadline-ms N        fail the request after N ms (0 = none)\n"
"  --precision CLASS      served only by workers of f32, bf16 or fp8\n"
"                         (default: any)\n"
"  --timeout-ms N         give up waiting for the router (default 60000)\n"
CLI_SAMPLING_HELP);
}

int cli_generate_main(int argc, char **argv)
{
    static const struct option long_opts[] = {
        CLI_SAMPLING_OPTIONS,
        { "router", required_argument, NULL, 'r' },
        { "prompt", required_argument, NULL, 'p' },
        { "prompt-ids", required_argument, NULL, 'I' },
        { "ids", no_argument, NULL, 'i' },
        { "stats", no_argument, NULL, 'S' },
        { "priority", required_argument, NULL, 'P' },
        { "deadline-ms", required_argument, NULL, 'D' },
        { "timeout-ms", required_argument, NULL, 'T' },
        { "precision", required_argument, NULL, 'X' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *router = getenv("BATON_ROUTER");
    const char *prompt = NULL, *prompt_ids = NULL, *precision = NULL;
    bool print_ids = false, stats = false;
    int timeout_ms = 60000, priority = 0, deadline_ms = 0;
    cli_gen_opts_t gen;
    client_request_t req;
    client_t *client = NULL;
    int *ids = NULL, n_ids = 0, ret = 1, n_out = 0;
    uint64_t rid;
    bt_status_t status;

    cli_gen_opts_init(&gen);
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case 'r': router = optarg; break;
        case 'p': prompt = optarg; break;
        case 'I': prompt_ids = optarg; break;
        case 'i': print_ids = true; break;
        case 'S': stats = true; break;
        case 'X':
            if (proto_precision_find(optarg) == NULL) {
                fprintf(stderr, "baton generate: --precision is one of %s, "
                                "not '%s'\n", PROTO_PRECISIONS, optarg);
                goto usage;
            }
            precision = optarg;
            break;
        case 'P':
        case 'D':
        case 'T':
            if (bt_parse_int(optarg, c == 'P' ? &priority
                                     : c == 'D' ? &deadline_ms
                                                : &timeout_ms) != BT_OK) {
                fprintf(stderr, "baton generate: bad value '%s'\n", optarg);
                goto usage;
            }
            break;
        case 'h':
            generate_usage(stdout);
            cli_gen_opts_cleanup(&gen);
            return 0;
        default:
            if (cli_sampling_option(c, optarg, &gen) == 0)
                break;
            goto usage;
        }
    }
    if (optind < argc || router == NULL ||
        (prompt == NULL) == (prompt_ids == NULL)) {
        fprintf(stderr, "baton generate: need --router and exactly one of "
                        "--prompt or --prompt-ids\n");
        goto usage;
    }
    if (prompt_ids != NULL &&
        bt_parse_int_list(prompt_ids, &ids, &n_ids) != BT_OK) {
        fprintf(stderr, "baton generate: --prompt-ids must be integers\n");
        goto usage;
    }
    if (cli_gen_validate(&gen, "baton generate") != BT_OK) {
        bt_free(ids);
        return 2;
    }
    client_request_init(&req);
    req.prompt = prompt;
    req.prompt_ids = ids;
    req.n_prompt_ids = n_ids;
    client_request_set_params(&req, &gen.params);
    req.stop_ids = gen.params.stop_ids;
    req.n_stop_ids = gen.params.n_stop_ids;
    req.stop_strings = gen.stops;
    req.n_stop_strings = gen.params.n_stop_strings;
    req.priority = priority;
    req.deadline_ms = (uint32_t)deadline_ms;
    req.want_text = !print_ids;
    (void)client_request_set_precision(&req, precision); /* checked */

    status = client_create(router, &client);
    if (status != BT_OK)
        goto out;
    status = client_submit(client, &req, &rid);
    if (status != BT_OK)
        goto out;
    for (;;) {
        Baton__ClientMessage *msg = NULL;
        status = client_recv(client, timeout_ms, &msg);
        if (status == BT_ERR_TIMEOUT) {
            fprintf(stderr, "baton generate: no answer from %s within %d "
                            "ms\n", router, timeout_ms);
            goto out;
        }
        if (status != BT_OK)
            goto out;
        if (client_msg_request_id(msg) != rid) {
            proto_client_free(&msg);
            continue;
        }
        if (msg->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
            const Baton__TokenChunk *c = msg->chunk;
            if (print_ids) {
                for (size_t i = 0; i < c->n_ids; i++)
                    printf("%s%d", n_out++ ? " " : "", c->ids[i]);
            } else if (c->has_text) {
                fwrite(c->text.data, 1, c->text.len, stdout);
            }
            fflush(stdout);
        } else if (msg->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
            const Baton__Finished *f = msg->finished;
            /* End the text's line before the stats go to stderr (stdout
             * is fully buffered when it is a pipe or a file). */
            printf("\n");
            fflush(stdout);
            if (stats && f->usage && f->timings)
                fprintf(stderr,
                        "prompt_tokens:%u generated:%u finish:%s "
                        "ttft_ms:%.3f queue_ms:%.3f prefill_ms:%.3f "
                        "transfer_ms:%.3f decode_ms:%.3f total_ms:%.3f "
                        "retries:%u preemptions:%u\n",
                        f->usage->prompt_tokens, f->usage->completion_tokens,
                        client_finish_name(f->reason),
                        f->timings->ttft_us / 1e3, f->timings->queue_us / 1e3,
                        f->timings->prefill_us / 1e3,
                        f->timings->transfer_us / 1e3,
                        f->timings->decode_us / 1e3,
                        f->timings->total_us / 1e3, f->timings->retries,
                        f->timings->preemptions);
            proto_client_free(&msg);
            ret = 0;
            break;
        } else if (msg->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
            fprintf(stderr, "baton generate: %s: %s\n",
                    client_error_name(msg->error->code),
                    msg->error->message ? msg->error->message : "");
            proto_client_free(&msg);
            goto out;
        }
        proto_client_free(&msg);
    }

out:
    if (ret != 0 && bt_error_last()[0])
        fprintf(stderr, "baton generate: %s\n", bt_error_last());
    client_destroy(&client);
    bt_free(ids);
    cli_gen_opts_cleanup(&gen);
    return ret;

usage:
    generate_usage(stderr);
    bt_free(ids);
    cli_gen_opts_cleanup(&gen);
    return 2;
}
