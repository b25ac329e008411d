/*
 * prefill_main.c - the baton-prefill executable: options, signals, run.
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
#include "prefill.h"

/* SIGTERM/SIGINT: prefill_stop (async-signal-safe). */
static void stop_worker(void *arg)
{
    prefill_stop(arg);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-prefill --router EP (--model PATH | --null-model) "
        "[options]\n"
        WORKERPROC_OPTS_USAGE_ROUTER
        "  --name NAME            worker name (default prefill-PID)\n"
        "  --device cpu|cuda|auto backend (default auto)\n"
        WORKERPROC_OPTS_USAGE_GPU
        "  --threads N            CPU threads (0 = all cores)\n"
        WORKERPROC_OPTS_USAGE_KV
        "                         (a prefill pool sized from memory holds\n"
        "                         at most 8 full contexts: the prompts in\n"
        "                         flight)\n"
        "  --max-batch-tokens N   tokens per forward (2048)\n"
        "  --chunk-tokens N       longest prompt chunk per forward (512)\n"
        "  --no-ucx               always send KV inline (control plane)\n"
        "  --ucx-peer-errors      UCX peer failure detection (forces tcp)\n"
        "  --kv-commit-timeout-ms N  fail a KV hand-off after N ms (5000;\n"
        "                         UCX: N ms without progress)\n"
        "  --precision f32|bf16|fp8  backend precision (default: the\n"
        "                         backend's; fp8: cpu reference only)\n"
        "  --kv-dtype auto|bf16|fp8  KV cache element type (fp8: E4M3 with\n"
        "                         per-layer/head scales; a prefill and a\n"
        "                         decode worker pair only when equal)\n"
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
        "  --prefix-cache on|off  keep computed prompt blocks; prefill only\n"
        "                         the uncached suffix of later prompts (on)\n"
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
        WORKERPROC_OPTS_OPTIONS,
        { "chunk-tokens", required_argument, 0, 'c' },
        { "ucx-peer-errors", no_argument, 0, 'E' },
        { "kv-commit-timeout-ms", required_argument, 0, 'K' },
        { "spec-features", no_argument, 0, 1000 },
        { "spec-head", required_argument, 0, 1001 },
        { "prefix-cache", required_argument, 0, 1101 },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    prefill_config_t cfg;
    prefill_t *pf = NULL;
    workerproc_metrics_t *metrics = NULL;
    workerproc_opts_t wo = WORKERPROC_OPTS_INIT(cfg, "baton-prefill", usage);
    bt_status_t status;
    int c, bad = 0, opt_index = 0;

    bt_log_init("prefill");
    prefill_config_init(&cfg);
    workerproc_opts_env(&wo);
    while ((c = getopt_long(argc, argv, "h", opts, &opt_index)) != -1) {
        status = workerproc_opts_option(&wo, c, optarg);
        if (status != BT_ERR_NOT_FOUND) {
            bad = status != BT_OK;
        } else {
            switch (c) {
            case 1000: /* fall through */
            case 1001: cfg.spec_features = true; break;
            case 'c': bad = bt_parse_int(optarg, &cfg.chunk_tokens) != BT_OK;
                break;
            case 'E': cfg.ucx_peer_errors = true; break;
            case 1101:
                bad = strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0;
                cfg.prefix_cache = strcmp(optarg, "on") == 0;
                break;
            case 'K': bad = bt_parse_int(optarg, &cfg.commit_timeout_ms) !=
                            BT_OK || cfg.commit_timeout_ms <= 0; break;
            case 'h': usage(stdout); return 0;
            default: usage(stderr); return 2;
            }
        }
        if (bad) {
            fprintf(stderr, "baton-prefill: bad value '%s' for --%s\n", optarg,
                    opts[opt_index].name);
            return 2;
        }
    }
    if (!workerproc_opts_ok(&wo, argc, optind))
        return 2;
    /* Before the model loads: /health says "loading" meanwhile, and a
     * port in use fails at once, not after minutes of loading. */
    if (cfg.metrics_port >= 0) {
        workerproc_metrics_config_t mc = {
            .host = cfg.metrics_host, .port = cfg.metrics_port,
            .role = "prefill", .router = cfg.router,
        };
        status = workerproc_metrics_create(&mc, &metrics);
        if (status != BT_OK) {
            fprintf(stderr, "baton-prefill: %s\n", bt_error_last());
            return 1;
        }
        cfg.metrics = metrics;
    }
    status = prefill_create(&cfg, &pf);
    if (status != BT_OK) {
        fprintf(stderr, "baton-prefill: %s\n", bt_error_last());
        workerproc_metrics_destroy(&metrics);
        return 1;
    }
    workerproc_opts_signals(stop_worker, pf);
    status = prefill_run(pf);
    workerproc_opts_signals_clear();
    prefill_destroy(&pf);
    workerproc_metrics_destroy(&metrics);
    bt_alloc_report();
    return status == BT_OK ? 0 : 1;
}
