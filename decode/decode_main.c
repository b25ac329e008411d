/*
 * decode_main.c - the baton-decode executable: options, signals, run.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "workerproc_metrics.h"
#include "workerproc_opts.h"
#include "decode.h"

/* SIGTERM/SIGINT: decode_stop (async-signal-safe). */
static void stop_worker(void *arg)
{
    decode_stop(arg);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-decode --router EP (--model PATH | --null-model) "
        "[options]\n"
        WORKERPROC_OPTS_USAGE_ROUTER
        "  --name NAME            worker name (default decode-PID)\n"
        "  --device cpu|cuda|auto backend (default auto)\n"
        WORKERPROC_OPTS_USAGE_GPU
        "  --threads N            CPU threads (0 = all cores)\n"
        WORKERPROC_OPTS_USAGE_KV
        "  --max-batch-tokens N   tokens per forward (2048)\n"
        "  --max-seqs N           sequences per step (default: what the KV\n"
        "                         pool and the batch allow: min(512 cuda /\n"
        "                         64 cpu, max-batch-tokens, KV blocks); cuda\n"
        "                         graphs are captured for each power of two\n"
        "                         up to it during the warm-up)\n"
        "  --step-tokens N        token budget per step (0 = max-batch-tokens)\n"
        "  --tpot-target-ms T     --role both: bound the prompt tokens of a\n"
        "                         step so that steps with running streams\n"
        "                         stay under T ms (learned step cost; at\n"
        "                         least 128 tokens; default 50, 0 = no bound)\n"
        "  --kv-timeout-ms N      free a reservation whose KV never came (30000)\n"
        "  --kv-overcommit        admit a request on its prompt's KV blocks,\n"
        "                         not prompt + max tokens (more streams in\n"
        "                         the pool); a step short of blocks gives\n"
        "                         the latest-arrived streams back to the router,\n"
        "                         which recomputes them (their tokens kept)\n"
        "  --kv-unbounded-promise N|all  growth past the prompt promised\n"
        "                         at admission to a request without max\n"
        "                         tokens (or asking past the context); it\n"
        "                         grows on from unpromised blocks and is\n"
        "                         given back (recomputed) when they run out\n"
        "                         (default 2048 tokens; all: the context)\n"
        "  --no-ucx               do not register the pool with UCX\n"
        "  --kv-pool-malloc       KV pool from malloc, not UCX shared memory\n"
        "                         (puts then need this process's CPU;\n"
        "                         with --kv-direct-writes)\n"
        "  --kv-direct-writes     UCX, staged, CUDA IPC: prefill workers write\n"
        "                         shared areas (the pool, the staged receive\n"
        "                         area, the exported device pool) instead of\n"
        "                         a receive window per reservation\n"
        "                         (weaker: a stale writer's key reaches reused\n"
        "                         blocks; saves the copy-in, SECURITY.md 5)\n"
        "  --role decode|both     both: also prefill prompts here (aggregated\n"
        "                         mode; the router uses it when no prefill\n"
        "                         worker is registered)\n"
        "  --chunk-tokens N       longest local prefill chunk per step (512)\n"
        "  --prefix-cache on|off  keep computed KV blocks for later prompts\n"
        "                         that start the same way, same cache salt\n"
        "                         (default on; docs/KV_EVENTS.md)\n"
        "  --precision f32|bf16|fp8  backend precision (default: the\n"
        "                         backend's; fp8: cpu reference only)\n"
        "  --kv-dtype auto|bf16|fp8  KV cache element type (fp8: E4M3 with\n"
        "                         per-layer/head scales; a prefill and a\n"
        "                         decode worker pair only when equal)\n"
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
        "speculative decoding (EAGLE; cpu and cuda backends):\n"
        "  --spec-head PATH       draft head .safetensors (baton eagle train)\n"
        "  --spec-depth D         draft tree depth (8)\n"
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
        WORKERPROC_OPTS_OPTIONS,
        { "step-tokens", required_argument, 0, 'c' },
        { "tpot-target-ms", required_argument, 0, 1100 },
        { "max-seqs", required_argument, 0, 'S' },
        { "kv-timeout-ms", required_argument, 0, 'K' },
        { "kv-overcommit", no_argument, 0, 1103 },
        { "kv-unbounded-promise", required_argument, 0, 1104 },
        { "kv-pool-malloc", no_argument, 0, 'M' },
        { "kv-direct-writes", no_argument, 0, 1102 },
        { "role", required_argument, 0, 'R' },
        { "chunk-tokens", required_argument, 0, 'C' },
        { "spec-head", required_argument, 0, 1000 },
        { "spec-depth", required_argument, 0, 1001 },
        { "spec-topk", required_argument, 0, 1002 },
        { "spec-tokens", required_argument, 0, 1003 },
        { "spec", required_argument, 0, 1004 },
        { "prefix-cache", required_argument, 0, 1101 },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    decode_config_t cfg;
    decode_t *dec = NULL;
    workerproc_metrics_t *metrics = NULL;
    workerproc_opts_t wo = WORKERPROC_OPTS_INIT(cfg, "baton-decode", usage);
    bt_status_t status;
    int c, bad = 0, opt_index = 0;
    bool spec_off = false;

    bt_log_init("decode");
    decode_config_init(&cfg);
    workerproc_opts_env(&wo);
    while ((c = getopt_long(argc, argv, "h", opts, &opt_index)) != -1) {
        backend_config_t *b = &cfg.engine.backend;
        status = workerproc_opts_option(&wo, c, optarg);
        if (status != BT_ERR_NOT_FOUND) {
            bad = status != BT_OK;
        } else {
            switch (c) {
            case 'c': bad = bt_parse_int(optarg, &cfg.step_tokens) != BT_OK;
                break;
            case 1100: bad = bt_parse_double(optarg, &cfg.tpot_target_ms) !=
                                 BT_OK || cfg.tpot_target_ms < 0;
                break;
            case 'S': bad = bt_parse_int(optarg, &b->max_seqs) != BT_OK; break;
            case 'K': bad = bt_parse_int(optarg, &cfg.kv_timeout_ms) != BT_OK;
                break;
            case 'M': cfg.ucx_shm_pool = false; break;
            case 1102: cfg.kv_direct_writes = true; break;
            case 1103: cfg.kv_overcommit = true; break;
            case 1104:
                if (strcmp(optarg, "all") == 0)
                    cfg.kv_unbounded_promise = -1;
                else
                    bad = bt_parse_int(optarg, &cfg.kv_unbounded_promise) !=
                              BT_OK ||
                          cfg.kv_unbounded_promise < 0;
                break;
            case 'R':
                bad = strcmp(optarg, "both") != 0 &&
                      strcmp(optarg, "decode") != 0;
                cfg.can_prefill = strcmp(optarg, "both") == 0;
                break;
            case 'C': bad = bt_parse_int(optarg, &cfg.chunk_tokens) != BT_OK ||
                            cfg.chunk_tokens <= 0; break;
            case 1101:
                bad = strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0;
                cfg.prefix_cache = strcmp(optarg, "on") == 0;
                break;
            case 1000: cfg.spec_head = optarg; break;
            case 1001: bad = bt_parse_int(optarg, &cfg.spec.depth) != BT_OK;
                break;
            case 1002: bad = bt_parse_int(optarg, &cfg.spec.topk) != BT_OK;
                break;
            case 1003: bad = bt_parse_int(optarg, &cfg.spec.tokens) != BT_OK;
                break;
            case 1004:
                spec_off = strcmp(optarg, "off") == 0;
                cfg.spec.adaptive = strcmp(optarg, "fixed") != 0;
                bad = !spec_off && strcmp(optarg, "auto") != 0 &&
                      strcmp(optarg, "fixed") != 0;
                break;
            case 'h': usage(stdout); return 0;
            default: usage(stderr); return 2;
            }
        }
        if (bad) {
            fprintf(stderr, "baton-decode: bad value '%s' for --%s\n", optarg,
                    opts[opt_index].name);
            return 2;
        }
    }
    if (!workerproc_opts_ok(&wo, argc, optind))
        return 2;
    if (spec_off)
        cfg.spec_head = NULL;
    if (cfg.spec_head != NULL && spec_config_validate(&cfg.spec) != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", bt_error_last());
        return 2;
    }
    /* Before the model loads: /health says "loading" meanwhile, and a
     * port in use fails at once, not after minutes of loading. */
    if (cfg.metrics_port >= 0) {
        workerproc_metrics_config_t mc = {
            .host = cfg.metrics_host, .port = cfg.metrics_port,
            .role = cfg.can_prefill ? "both" : "decode", .router = cfg.router,
        };
        status = workerproc_metrics_create(&mc, &metrics);
        if (status != BT_OK) {
            fprintf(stderr, "baton-decode: %s\n", bt_error_last());
            return 1;
        }
        cfg.metrics = metrics;
    }
    status = decode_create(&cfg, &dec);
    if (status != BT_OK) {
        fprintf(stderr, "baton-decode: %s\n", bt_error_last());
        workerproc_metrics_destroy(&metrics);
        return 1;
    }
    workerproc_opts_signals(stop_worker, dec);
    status = decode_run(dec);
    workerproc_opts_signals_clear();
    decode_destroy(&dec);
    workerproc_metrics_destroy(&metrics);
    bt_alloc_report();
    return status == BT_OK ? 0 : 1;
}
