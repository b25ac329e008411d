/*
 * router_main.c - the baton-router executable: options, signals, run.
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
#include "router.h"

/* The running router, for the signal handler (process-wide by nature). */
static router_t *g_router;

static void on_signal(int sig)
{
    (void)sig;
    if (g_router != NULL)
        router_stop(g_router);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-router [options]\n"
        "  --listen EP          client endpoint (tcp://127.0.0.1:5555,\n"
        "                       env BATON_LISTEN)\n"
        "  --control EP         worker endpoint (tcp://127.0.0.1:5556,\n"
        "                       env BATON_CONTROL)\n"
        "  --policy NAME        least-loaded (default) | round-robin |\n"
        "                       kv-aware (decode worker by expected prefix-\n"
        "                       cache overlap minus load; prompts given as\n"
        "                       ids only, text prompts: least-loaded)\n"
        "  --kv-weights overlap=X,load=Y  kv-aware score per cached prompt\n"
        "                       token and per outstanding token (1,1)\n"
        "  --tokenizer PATH     the workers' tokenizer (file or model dir;\n"
        "                       env BATON_TOKENIZER): text prompts are\n"
        "                       tokenized here, so kv-aware routing and\n"
        "                       decode-side prefix hits see their ids; sent\n"
        "                       as ids only to workers that loaded the same\n"
        "                       tokenizer bytes (Register.tokenizer_id)\n"
        "  --tokenize-max-bytes N  longer text prompts go as text (16384)\n"
        "  --kv-transport MODE  auto (default) | ucx | cuda-ipc | ucx-stage |\n"
        "                       inline: KV transport per prefill/decode pair\n"
        "                       (auto: CUDA IPC on one host with GPU pools,\n"
        "                       ucx-stage for GPU pools on other hosts, UCX\n"
        "                       for host pools, else inline)\n"
        "  --aggregate MODE     fallback (default): --role both decode workers\n"
        "                       prefill when no prefill worker is up; ttft:\n"
        "                       also when their predicted first token comes\n"
        "                       sooner (queued prompt tokens / measured\n"
        "                       prefill rate); always; never\n"
        "  --heartbeat-ms N     worker heartbeat interval (250)\n"
        "  --heartbeat-miss N   silent intervals before a drop (4)\n"
        "  --max-queue N        admission queue bound (1024)\n"
        "  --max-inflight N     requests past the queue (0 = no limit)\n"
        "  --max-queue-wait-ms N overload bound (1000): first attempts queued\n"
        "                       longer while workers serve end OVERLOADED with\n"
        "                       a retry hint when the next request arrives,\n"
        "                       which is refused too (0 = no bound)\n"
        "  --queue-timeout-ms N longest wait for workers or for capacity to\n"
        "                       come free (30000; 10x in all)\n"
        "  --drain-timeout-ms N longest drain on SIGTERM (30000)\n"
        "  --max-retries N      re-prefills after worker failure (3)\n"
        "  --stall-ms N         a worker whose engine turn runs this long\n"
        "                       with work assigned is stuck: dropped, its\n"
        "                       requests re-queued; 20 of its longest\n"
        "                       recent turns when longer (10000)\n"
        "  --phase-ms N         least time a request phase (reserve,\n"
        "                       prefill, first token, next token) may take\n"
        "                       before the attempt is re-queued; longer when\n"
        "                       the worker's measured step cost says so\n"
        "                       (10000)\n"
        "  --metrics-port N     serve Prometheus GET /metrics over HTTP on\n"
        "                       this port (env BATON_METRICS_PORT; 0 = any\n"
        "                       free port, logged; default: off)\n"
        "  --metrics-host H     address the metrics port binds (127.0.0.1;\n"
        "                       0.0.0.0 for a scraper on another host)\n"
        "  --curve-secret-key FILE  CURVE: the router's secret key (`baton\n"
        "                       keygen`); both sockets then admit only the\n"
        "                       listed keys (env BATON_CURVE_SECRET_KEY)\n"
        "  --allow-workers F|D  worker public keys: a file (one per line) or\n"
        "                       a directory of *.pub (env BATON_ALLOW_WORKERS)\n"
        "  --allow-clients F|D  client public keys, the same way (env\n"
        "                       BATON_ALLOW_CLIENTS)\n"
        "  --insecure           without CURVE, listen on non-loopback\n"
        "                       addresses anyway (env BATON_INSECURE=1);\n"
        "                       without keys and this, only loopback\n"
        "                       endpoints are accepted (docs/SECURITY.md)\n"
        "  --help\n"
        "SIGTERM/SIGINT: stop admitting, finish in-flight requests, exit.\n");
}

static int parse_int_opt(const char *name, const char *val, int *out)
{
    if (bt_parse_int(val, out) != BT_OK) {
        fprintf(stderr, "baton-router: bad %s '%s'\n", name, val);
        return -1;
    }
    return 0;
}

/* An environment variable, NULL when unset or empty. */
static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);

    return v != NULL && v[0] != '\0' ? v : NULL;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "listen", required_argument, 0, 'l' },
        { "control", required_argument, 0, 'c' },
        { "policy", required_argument, 0, 'p' },
        { "kv-weights", required_argument, 0, 1007 },
        { "tokenizer", required_argument, 0, 1008 },
        { "tokenize-max-bytes", required_argument, 0, 1009 },
        { "kv-transport", required_argument, 0, 'X' },
        { "aggregate", required_argument, 0, 'A' },
        { "heartbeat-ms", required_argument, 0, 'H' },
        { "heartbeat-miss", required_argument, 0, 'M' },
        { "max-queue", required_argument, 0, 'q' },
        { "max-inflight", required_argument, 0, 'i' },
        { "max-queue-wait-ms", required_argument, 0, 'w' },
        { "queue-timeout-ms", required_argument, 0, 'Q' },
        { "drain-timeout-ms", required_argument, 0, 'D' },
        { "max-retries", required_argument, 0, 'r' },
        { "stall-ms", required_argument, 0, 1001 },
        { "phase-ms", required_argument, 0, 1002 },
        { "metrics-port", required_argument, 0, 'm' },
        { "metrics-host", required_argument, 0, 'B' },
        { "curve-secret-key", required_argument, 0, 1003 },
        { "allow-workers", required_argument, 0, 1004 },
        { "allow-clients", required_argument, 0, 1005 },
        { "insecure", no_argument, 0, 1006 },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    router_config_t cfg;
    router_t *router = NULL;
    struct sigaction sa;
    bt_status_t status;
    int c, ret = 0;

    bt_log_init("router");
    router_config_init(&cfg);
    /* The executable bounds queue waits by default (router_config_init
     * leaves in-process routers unbounded). */
    cfg.max_queue_wait_ms = 1000;
    if (getenv("BATON_LISTEN"))
        cfg.listen = getenv("BATON_LISTEN");
    if (getenv("BATON_CONTROL"))
        cfg.control = getenv("BATON_CONTROL");
    if (getenv("BATON_METRICS_PORT") &&
        parse_int_opt("BATON_METRICS_PORT", getenv("BATON_METRICS_PORT"),
                      &cfg.metrics_port) != 0)
        return 2;
    cfg.tokenizer = env_nonempty("BATON_TOKENIZER");
    cfg.curve_secret_key = env_nonempty("BATON_CURVE_SECRET_KEY");
    cfg.allow_workers = env_nonempty("BATON_ALLOW_WORKERS");
    cfg.allow_clients = env_nonempty("BATON_ALLOW_CLIENTS");
    cfg.insecure = getenv("BATON_INSECURE") != NULL &&
                   strcmp(getenv("BATON_INSECURE"), "1") == 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': cfg.listen = optarg; break;
        case 'c': cfg.control = optarg; break;
        case 'p': cfg.policy = optarg; break;
        case 'X': cfg.kv_transport = optarg; break;
        case 'A': cfg.aggregate = optarg; break;
        case 'H': ret = parse_int_opt("--heartbeat-ms", optarg, &cfg.heartbeat_ms); break;
        case 'M': ret = parse_int_opt("--heartbeat-miss", optarg, &cfg.heartbeat_miss); break;
        case 'q': ret = parse_int_opt("--max-queue", optarg, &cfg.max_queue); break;
        case 'i': ret = parse_int_opt("--max-inflight", optarg, &cfg.max_inflight); break;
        case 'w': ret = parse_int_opt("--max-queue-wait-ms", optarg, &cfg.max_queue_wait_ms); break;
        case 'Q': ret = parse_int_opt("--queue-timeout-ms", optarg, &cfg.queue_timeout_ms); break;
        case 'D': ret = parse_int_opt("--drain-timeout-ms", optarg, &cfg.drain_timeout_ms); break;
        case 'r': ret = parse_int_opt("--max-retries", optarg, &cfg.max_retries); break;
        case 1001: ret = parse_int_opt("--stall-ms", optarg, &cfg.stall_ms); break;
        case 1002: ret = parse_int_opt("--phase-ms", optarg, &cfg.phase_ms); break;
        case 'm': ret = parse_int_opt("--metrics-port", optarg, &cfg.metrics_port); break;
        case 'B': cfg.metrics_host = optarg; break;
        case 1003: cfg.curve_secret_key = optarg; break;
        case 1004: cfg.allow_workers = optarg; break;
        case 1005: cfg.allow_clients = optarg; break;
        case 1006: cfg.insecure = true; break;
        case 1007: cfg.kv_weights = optarg; break;
        case 1008: cfg.tokenizer = optarg; break;
        case 1009: ret = parse_int_opt("--tokenize-max-bytes", optarg, &cfg.tokenize_max_bytes); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (ret != 0)
            return 2;
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    status = router_create(&cfg, &router);
    if (status != BT_OK) {
        fprintf(stderr, "baton-router: %s\n", bt_error_last());
        return 1;
    }
    g_router = router;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = router_run(router);
    g_router = NULL;
    router_destroy(&router);
    bt_alloc_report();
    return status == BT_OK ? 0 : 1;
}
