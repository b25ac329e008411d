/*
 * decode_main.c - the baton-decode executable: options, signals, run.
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
#include "decode.h"

/* The running worker, for the signal handler. */
static decode_t *g_decode;

static void on_signal(int sig)
{
    (void)sig;
    if (g_decode != NULL)
        decode_stop(g_decode);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-decode --router EP (--model PATH | --null-model) "
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
        "  --name NAME            worker name (default decode-PID)\n"
        "  --device cpu|cuda|auto backend (default auto)\n"
        "  --threads N            CPU threads (0 = all cores)\n"
        "  --kv-blocks N          KV pool blocks (256)\n"
        "  --block-size N         KV block size in tokens (16)\n"
        "  --max-batch-tokens N   tokens per forward (2048)\n"
        "  --max-seqs N           sequences per step (64)\n"
        "  --step-tokens N        token budget per step (0 = max-batch-tokens)\n"
        "  --kv-timeout-ms N      free a reservation whose KV never came (30000)\n"
        "  --no-ucx               do not register the pool with UCX\n"
        "  --kv-pool-malloc       KV pool from malloc, not UCX shared memory\n"
        "                         (puts then need this process's CPU)\n"
        "  --role decode|both     both: also prefill prompts here (aggregated\n"
        "                         mode; the router uses it when no prefill\n"
        "                         worker is registered)\n"
        "  --chunk-tokens N       longest local prefill chunk per step (512)\n"
        "  --precision f32|bf16   backend precision (default: backend's)\n"
        "  --no-cuda-ipc          do not export a device KV pool over CUDA IPC\n"
        "  --no-kv-stage          no staged UCX receiver for a device pool\n"
        "                         (prefill workers on other hosts: inline)\n"
        "  --no-kv-stage-direct   always stage through pinned host memory,\n"
        "                         even when UCX moves CUDA memory itself\n"
        "  --kv-stage-blocks N    staged receive-area blocks per layer\n"
        "                         (0 = 4 longest prompts' worth)\n"
        "  --kv-stage-host        test/diagnostic: the staged UCX receiver on\n"
        "                         the CPU pool, host memcpys standing in for\n"
        "                         the CUDA copies (router --kv-transport\n"
        "                         ucx-stage uses it)\n"
        "  --step-delay-ms N      tests: sleep N ms per step\n"
        "speculative decoding (EAGLE; cpu backend):\n"
        "  --spec-head PATH       draft head .safetensors (baton eagle train)\n"
        "  --spec-depth D         draft tree depth (5)\n"
        "  --spec-topk K          draft children per node (4)\n"
        "  --spec-tokens N        draft tokens verified per step (16)\n"
        "  --spec off|auto|fixed  off: ignore the head; auto (default): tree\n"
        "                         size per step from measured speed, off\n"
        "                         where it does not pay; fixed: always the\n"
        "                         configured tree\n"
        "SIGTERM/SIGINT: stop taking work, finish running requests, exit.\n");
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
        { "step-tokens", required_argument, 0, 'c' },
        { "max-seqs", required_argument, 0, 'S' },
        { "kv-timeout-ms", required_argument, 0, 'K' },
        { "no-ucx", no_argument, 0, 'U' },
        { "kv-pool-malloc", no_argument, 0, 'M' },
        { "step-delay-ms", required_argument, 0, 'W' },
        { "role", required_argument, 0, 'R' },
        { "chunk-tokens", required_argument, 0, 'C' },
        { "precision", required_argument, 0, 'P' },
        { "no-cuda-ipc", no_argument, 0, 'I' },
        { "no-kv-stage", no_argument, 0, 1010 },
        { "no-kv-stage-direct", no_argument, 0, 1011 },
        { "kv-stage-blocks", required_argument, 0, 1012 },
        { "kv-stage-host", no_argument, 0, 1013 },
        { "spec-head", required_argument, 0, 1000 },
        { "spec-depth", required_argument, 0, 1001 },
        { "spec-topk", required_argument, 0, 1002 },
        { "spec-tokens", required_argument, 0, 1003 },
        { "spec", required_argument, 0, 1004 },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    decode_config_t cfg;
    decode_t *dec = NULL;
    struct sigaction sa;
    bt_status_t status;
    int c, bad = 0;
    bool spec_off = false;

    bt_log_init("decode");
    decode_config_init(&cfg);
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
        case 't': cfg.engine.tokenizer_path = optarg; break;
        case 'N': cfg.null_model = true; break;
        case 'n': cfg.name = optarg; break;
        case 'd': cfg.engine.device = optarg; break;
        case 'T': bad = bt_parse_int(optarg, &b->n_threads) != BT_OK; break;
        case 'k': bad = bt_parse_int(optarg, &b->n_kv_blocks) != BT_OK; break;
        case 'b': bad = bt_parse_int(optarg, &b->block_size) != BT_OK; break;
        case 'B': bad = bt_parse_int(optarg, &b->max_batch_tokens) != BT_OK; break;
        case 'c': bad = bt_parse_int(optarg, &cfg.step_tokens) != BT_OK; break;
        case 'S': bad = bt_parse_int(optarg, &b->max_seqs) != BT_OK; break;
        case 'K': bad = bt_parse_int(optarg, &cfg.kv_timeout_ms) != BT_OK; break;
        case 'U': cfg.use_ucx = false; break;
        case 'M': cfg.ucx_shm_pool = false; break;
        case 'W': bad = bt_parse_int(optarg, &cfg.step_delay_ms) != BT_OK; break;
        case 'R':
            bad = strcmp(optarg, "both") != 0 && strcmp(optarg, "decode") != 0;
            cfg.can_prefill = strcmp(optarg, "both") == 0;
            break;
        case 'C': bad = bt_parse_int(optarg, &cfg.chunk_tokens) != BT_OK ||
                        cfg.chunk_tokens <= 0; break;
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
        case 1000: cfg.spec_head = optarg; break;
        case 1001: bad = bt_parse_int(optarg, &cfg.spec.depth) != BT_OK; break;
        case 1002: bad = bt_parse_int(optarg, &cfg.spec.topk) != BT_OK; break;
        case 1003: bad = bt_parse_int(optarg, &cfg.spec.tokens) != BT_OK; break;
        case 1004:
            spec_off = strcmp(optarg, "off") == 0;
            cfg.spec.adaptive = strcmp(optarg, "fixed") != 0;
            bad = !spec_off && strcmp(optarg, "auto") != 0 &&
                  strcmp(optarg, "fixed") != 0;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton-decode: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (cfg.host_id != NULL &&
        (cfg.host_id[0] == '\0' || strlen(cfg.host_id) > 127)) {
        fprintf(stderr, "baton-decode: --host-id/BATON_HOST_ID must be 1 to "
                        "127 bytes\n");
        return 2;
    }
    if (optind != argc ||
        (cfg.engine.model_path == NULL) == !cfg.null_model) {
        fprintf(stderr, "baton-decode: need exactly one of --model or "
                        "--null-model\n");
        usage(stderr);
        return 2;
    }
    if (spec_off)
        cfg.spec_head = NULL;
    if (cfg.spec_head != NULL && spec_config_validate(&cfg.spec) != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", bt_error_last());
        return 2;
    }
    status = decode_create(&cfg, &dec);
    if (status != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", bt_error_last());
        return 1;
    }
    g_decode = dec;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = decode_run(dec);
    g_decode = NULL;
    decode_destroy(&dec);
    bt_alloc_report();
    return status == BT_OK ? 0 : 1;
}
