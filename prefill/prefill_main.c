/*
 * prefill_main.c - the baton-prefill executable: options, signals, run.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "prefill.h"

/* The running worker, for the signal handler. */
static prefill_t *g_prefill;

static void on_signal(int sig)
{
    (void)sig;
    if (g_prefill != NULL)
        prefill_stop(g_prefill);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-prefill --router EP (--model PATH | --null-model) "
        "[options]\n"
        "  --router EP            router control endpoint (env BATON_ROUTER;\n"
        "                         the flag wins)\n"
        "  --host-id ID           host identity for the router's transport\n"
        "                         choice (env BATON_HOST_ID; default\n"
        "                         hostname/boot-id): equal ids mean CUDA IPC\n"
        "                         / UCX shared memory work between the two\n"
        "                         (containers on one node sharing /dev/shm\n"
        "                         and the IPC namespace); at most 127 bytes\n"
        "  --model PATH           llama2.c .bin, HF directory or synth:NAME\n"
        "  --tokenizer PATH       llama2.c tokenizer (for text prompts)\n"
        "  --null-model           no model: instant deterministic tokens\n"
        "  --name NAME            worker name (default prefill-PID)\n"
        "  --device cpu|cuda|auto backend (default auto)\n"
        "  --threads N            CPU threads (0 = all cores)\n"
        "  --kv-blocks N          local KV pool blocks (256)\n"
        "  --block-size N         KV block size (16; equal to the decode\n"
        "                         workers' for UCX hand-off)\n"
        "  --max-batch-tokens N   tokens per forward (2048)\n"
        "  --chunk-tokens N       longest prompt chunk per forward (512)\n"
        "  --no-ucx               always send KV inline (control plane)\n"
        "  --ucx-peer-errors      UCX peer failure detection (forces tcp)\n"
        "  --kv-commit-timeout-ms N  fail a KV hand-off after N ms (5000)\n"
        "  --precision f32|bf16   backend precision (default: backend's)\n"
        "  --no-cuda-ipc          never copy KV over CUDA IPC\n"
        "  --no-kv-stage          no staged UCX sender for device KV (decode\n"
        "                         workers on other hosts: inline)\n"
        "  --no-kv-stage-direct   always stage through pinned host memory,\n"
        "                         even when UCX moves CUDA memory itself\n"
        "  --kv-stage-blocks N    blocks per staging buffer (0 = 2048 tokens)\n"
        "  --kv-stage-host        test/diagnostic: the staged UCX sender on\n"
        "                         the CPU pool, host memcpys standing in for\n"
        "                         the CUDA copies (router --kv-transport\n"
        "                         ucx-stage uses it)\n"
        "  --step-delay-ms N      tests: sleep N ms per step\n"
        "  --spec-features        send the last prompt token's hidden state\n"
        "                         with the KV (EAGLE decode workers draft\n"
        "                         from their first step)\n"
        "  --spec-head PATH       the same (the head itself is not needed)\n"
        "SIGTERM/SIGINT: stop taking work, finish prompts, exit.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "router", required_argument, 0, 'r' },
        { "host-id", required_argument, 0, 1020 },
        { "model", required_argument, 0, 'm' },
        { "tokenizer", required_argument, 0, 't' },
        { "null-model", no_argument, 0, 'N' },
        { "name", required_argument, 0, 'n' },
        { "device", required_argument, 0, 'd' },
        { "threads", required_argument, 0, 'T' },
        { "kv-blocks", required_argument, 0, 'k' },
        { "block-size", required_argument, 0, 'b' },
        { "max-batch-tokens", required_argument, 0, 'B' },
        { "chunk-tokens", required_argument, 0, 'c' },
        { "no-ucx", no_argument, 0, 'U' },
        { "ucx-peer-errors", no_argument, 0, 'E' },
        { "kv-commit-timeout-ms", required_argument, 0, 'K' },
        { "step-delay-ms", required_argument, 0, 'W' },
        { "precision", required_argument, 0, 'P' },
        { "no-cuda-ipc", no_argument, 0, 'I' },
        { "no-kv-stage", no_argument, 0, 1010 },
        { "no-kv-stage-direct", no_argument, 0, 1011 },
        { "kv-stage-blocks", required_argument, 0, 1012 },
        { "kv-stage-host", no_argument, 0, 1013 },
        { "spec-features", no_argument, 0, 1000 },
        { "spec-head", required_argument, 0, 1001 },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    prefill_config_t cfg;
    prefill_t *pf = NULL;
    struct sigaction sa;
    bt_status_t status;
    int c, bad = 0;

    bt_log_init("prefill");
    prefill_config_init(&cfg);
    if (getenv("BATON_ROUTER"))
        cfg.router = getenv("BATON_ROUTER");
    if (getenv("BATON_HOST_ID") && getenv("BATON_HOST_ID")[0] != '\0')
        cfg.host_id = getenv("BATON_HOST_ID");
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        backend_config_t *b = &cfg.engine.backend;
        switch (c) {
        case 'r': cfg.router = optarg; break;
        case 1020: cfg.host_id = optarg; break;
        case 'm': cfg.engine.model_path = optarg; break;
        case 'P':
            if (strcmp(optarg, "f32") == 0)
                b->precision = BACKEND_PRECISION_F32;
            else if (strcmp(optarg, "bf16") == 0)
                b->precision = BACKEND_PRECISION_BF16;
            else
                bad = 1;
            break;
        case 'I': cfg.use_cuda_ipc = false; break;
        case 1010: cfg.kv_stage = false; break;
        case 1011: cfg.kv_stage_direct = false; break;
        case 1012: bad = bt_parse_int(optarg, &cfg.kv_stage_blocks) != BT_OK ||
                         cfg.kv_stage_blocks < 0; break;
        case 1013: cfg.kv_stage_host = true; break;
        case 1000: /* fall through */
        case 1001: cfg.spec_features = true; break;
        case 't': cfg.engine.tokenizer_path = optarg; break;
        case 'N': cfg.null_model = true; break;
        case 'n': cfg.name = optarg; break;
        case 'd': cfg.engine.device = optarg; break;
        case 'T': bad = bt_parse_int(optarg, &b->n_threads) != BT_OK; break;
        case 'k': bad = bt_parse_int(optarg, &b->n_kv_blocks) != BT_OK; break;
        case 'b': bad = bt_parse_int(optarg, &b->block_size) != BT_OK; break;
        case 'B': bad = bt_parse_int(optarg, &b->max_batch_tokens) != BT_OK; break;
        case 'c': bad = bt_parse_int(optarg, &cfg.chunk_tokens) != BT_OK; break;
        case 'U': cfg.use_ucx = false; break;
        case 'E': cfg.ucx_peer_errors = true; break;
        case 'K': bad = bt_parse_int(optarg, &cfg.commit_timeout_ms) != BT_OK ||
                        cfg.commit_timeout_ms <= 0; break;
        case 'W': bad = bt_parse_int(optarg, &cfg.step_delay_ms) != BT_OK; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton-prefill: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (cfg.host_id != NULL &&
        (cfg.host_id[0] == '\0' || strlen(cfg.host_id) > 127)) {
        fprintf(stderr, "baton-prefill: --host-id/BATON_HOST_ID must be 1 to "
                        "127 bytes\n");
        return 2;
    }
    if (optind != argc ||
        (cfg.engine.model_path == NULL) == !cfg.null_model) {
        fprintf(stderr, "baton-prefill: need exactly one of --model or "
                        "--null-model\n");
        usage(stderr);
        return 2;
    }
    status = prefill_create(&cfg, &pf);
    if (status != BT_OK) {
        fprintf(stderr, "baton-prefill: %s\n", bt_error_last());
        return 1;
    }
    g_prefill = pf;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = prefill_run(pf);
    g_prefill = NULL;
    prefill_destroy(&pf);
    bt_alloc_report();
    return status == BT_OK ? 0 : 1;
}
