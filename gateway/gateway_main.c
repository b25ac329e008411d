/*
 * gateway_main.c - the baton-http executable: options, signals, run.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "client.h"
#include "gateway.h"

/* The running gateway, for the signal handler (process-wide by nature). */
static gateway_t *g_gateway;

static void on_signal(int sig)
{
    (void)sig;
    if (g_gateway != NULL)
        gateway_stop(g_gateway);
}

static void usage(FILE *out)
{
    fprintf(out,
        "usage: baton-http --router tcp://HOST:PORT [options]\n"
        "OpenAI-compatible HTTP API in front of a baton router.\n"
        "  --router EP            router client endpoint (env BATON_ROUTER)\n"
        "  --curve-secret-key F   CURVE: this front end's secret key (env\n"
        "                         BATON_CURVE_SECRET_KEY)\n"
        "  --router-public-key F  CURVE: the router's public key (env\n"
        "                         BATON_ROUTER_PUBLIC_KEY)\n"
        "  --listen HOST:PORT     where to serve HTTP (127.0.0.1:8000)\n"
        "  --model-name NAME      model id in the API (default: the --model\n"
        "                         basename, else \"baton\")\n"
        "  --model PATH           model path: a Hugging Face directory gives\n"
        "                         the tokenizer and chat template\n"
        "  --tokenizer PATH       tokenizer (llama2.c .bin, tokenizer.json or\n"
        "                         HF directory) for chat prompts\n"
        "  --chat-template NAME   llama3, chatml, qwen, mistral, llama2, plain\n"
        "                         (default: from the tokenizer, else plain)\n"
        "  --max-connections N    open client connections (1024); when all\n"
        "                         are taken, the one idle longest or slowest\n"
        "                         to send its request is closed for the new\n"
        "  --max-conns-per-client N  connections per client address (128;\n"
        "                         0 = no limit; raise it behind a proxy)\n"
        "  --header-timeout-ms N  a started request's headers, and a new\n"
        "                         connection's first request, must arrive\n"
        "                         within (5000)\n"
        "  --max-header-bytes N   request line + headers (16384)\n"
        "  --max-body-bytes N     request body (4194304)\n"
        "  --read-timeout-ms N    a started request must arrive within (10000)\n"
        "  --idle-timeout-ms N    idle keep-alive connections close (60000)\n"
        "  --write-timeout-ms N   stalled readers are dropped (30000)\n"
        "  --request-timeout-ms N no router answer: 504 (600000)\n"
        "  --max-token-bytes N    without a tokenizer, a text prompt over\n"
        "                         context x N bytes is refused as too long\n"
        "                         before the router sees it (128)\n"
        "  --deadline-ms N        router deadline of every request (0 = none;\n"
        "                         a request's \"deadline_ms\" field overrides)\n"
        "  --api-key-file FILE    API keys and tenants, one key per line:\n"
        "                         KEY TENANT [priority=N] [weight=N]\n"
        "                         [max_concurrency=N] [tokens_per_min=N]\n"
        "                         [cache_salt=S] (docs/SECURITY.md); every\n"
        "                         /v1 request then needs Authorization:\n"
        "                         Bearer KEY (401 otherwise), tenants over\n"
        "                         their limits get 429.  Unreadable or\n"
        "                         malformed: baton-http does not start.\n"
        "                         (env BATON_API_KEY_FILE)\n"
        "  --metrics-auth         /metrics needs a key too (/health, /livez\n"
        "                         stay open)\n"
        "  --tls-cert FILE        serve HTTPS only, with this PEM certificate\n"
        "  --tls-key FILE         (chain) and PEM private key; a missing,\n"
        "                         unreadable or invalid file, or a key that\n"
        "                         does not match, stops baton-http (never\n"
        "                         plain HTTP instead)\n"
        "  --cors-origins LIST    CORS for these origins, comma-separated\n"
        "                         http[s]://host[:port], or * for any\n"
        "                         (default: no CORS headers)\n"
        "  --help\n"
        "Endpoints: POST /v1/completions, POST /v1/chat/completions,\n"
        "GET /v1/models, POST /tokenize, POST /detokenize, GET /version,\n"
        "GET /metrics, GET /health (200 once the router\n"
        "has a worker that can prefill and one that decodes: readiness),\n"
        "GET /livez (200 while this process serves: liveness).\n"
        "Prompts over the cluster's context get 400 here (token ids, text\n"
        "bounded by bytes, counted with --tokenizer); bodies over\n"
        "--max-body-bytes 413; router overload 429 with Retry-After.  A lost\n"
        "router (dead, stopped, restarted: noticed within ~2 s by ZeroMQ\n"
        "heartbeats) fails requests in flight with 502 router_lost (an SSE\n"
        "error event once a stream began); they may be sent again.\n"
        "SIGTERM/SIGINT: stop (in-flight requests are cancelled).\n");
}

static int parse_int_opt(const char *name, const char *val, int lo, int *out)
{
    if (bt_parse_int(val, out) != BT_OK || *out < lo) {
        fprintf(stderr, "baton-http: bad %s '%s'\n", name, val);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "router", required_argument, 0, 'r' },
        { "listen", required_argument, 0, 'l' },
        { "model-name", required_argument, 0, 'n' },
        { "model", required_argument, 0, 'm' },
        { "tokenizer", required_argument, 0, 't' },
        { "chat-template", required_argument, 0, 'c' },
        { "max-connections", required_argument, 0, 'C' },
        { "max-header-bytes", required_argument, 0, 'H' },
        { "max-body-bytes", required_argument, 0, 'B' },
        { "read-timeout-ms", required_argument, 0, 'R' },
        { "idle-timeout-ms", required_argument, 0, 'I' },
        { "write-timeout-ms", required_argument, 0, 'W' },
        { "request-timeout-ms", required_argument, 0, 'T' },
        { "deadline-ms", required_argument, 0, 'D' },
        { "max-conns-per-client", required_argument, 0, 'P' },
        { "header-timeout-ms", required_argument, 0, 'E' },
        { "max-token-bytes", required_argument, 0, 'K' },
        { "api-key-file", required_argument, 0, 'A' },
        { "metrics-auth", no_argument, 0, 'M' },
        { "tls-cert", required_argument, 0, 'X' },
        { "tls-key", required_argument, 0, 'Y' },
        { "cors-origins", required_argument, 0, 'O' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    gateway_config_t cfg;
    gateway_t *gw = NULL;
    const char *model = NULL;
    char name[256];
    struct sigaction sa;
    bt_status_t status;
    int c, v, ret = 0;
    bool named = false;
    const char *router_from = "the default"; /* NULL: --router */

    bt_log_init("http");
    if (client_curve_args(&argc, argv, "baton-http") != 0)
        return 2;
    gateway_config_init(&cfg);
    if (getenv("BATON_ROUTER")) {
        cfg.router = getenv("BATON_ROUTER");
        router_from = "BATON_ROUTER";
    }
    if (getenv("BATON_API_KEY_FILE") && getenv("BATON_API_KEY_FILE")[0])
        cfg.api_key_file = getenv("BATON_API_KEY_FILE");
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r': cfg.router = optarg; router_from = NULL; break;
        case 'l': cfg.listen = optarg; break;
        case 'n': cfg.model_name = optarg; named = true; break;
        case 'm': model = optarg; break;
        case 't': cfg.tokenizer = optarg; break;
        case 'c': cfg.chat_template = optarg; break;
        case 'C':
            if (parse_int_opt("--max-connections", optarg, 1,
                              &cfg.max_connections))
                return 2;
            break;
        case 'H':
            if (parse_int_opt("--max-header-bytes", optarg, 256, &v))
                return 2;
            cfg.max_header_bytes = (size_t)v;
            break;
        case 'B':
            if (parse_int_opt("--max-body-bytes", optarg, 1, &v))
                return 2;
            cfg.max_body_bytes = (size_t)v;
            break;
        case 'R':
            if (parse_int_opt("--read-timeout-ms", optarg, 1,
                              &cfg.read_timeout_ms))
                return 2;
            break;
        case 'I':
            if (parse_int_opt("--idle-timeout-ms", optarg, 1,
                              &cfg.idle_timeout_ms))
                return 2;
            break;
        case 'W':
            if (parse_int_opt("--write-timeout-ms", optarg, 1,
                              &cfg.write_timeout_ms))
                return 2;
            break;
        case 'T':
            if (parse_int_opt("--request-timeout-ms", optarg, 1,
                              &cfg.request_timeout_ms))
                return 2;
            break;
        case 'D':
            if (parse_int_opt("--deadline-ms", optarg, 0, &v))
                return 2;
            cfg.deadline_ms = (uint32_t)v;
            break;
        case 'P':
            if (parse_int_opt("--max-conns-per-client", optarg, 0,
                              &cfg.max_conns_per_client))
                return 2;
            break;
        case 'E':
            if (parse_int_opt("--header-timeout-ms", optarg, 1,
                              &cfg.header_timeout_ms))
                return 2;
            break;
        case 'K':
            if (parse_int_opt("--max-token-bytes", optarg, 1,
                              &cfg.max_token_bytes))
                return 2;
            break;
        case 'A': cfg.api_key_file = optarg; break;
        case 'M': cfg.metrics_auth = true; break;
        case 'X': cfg.tls_cert = optarg; break;
        case 'Y': cfg.tls_key = optarg; break;
        case 'O': cfg.cors_origins = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    /* A front end that waits on the wrong port looks like a slow one:
     * say where it waits when the endpoint was not given explicitly. */
    if (router_from != NULL)
        fprintf(stderr, "baton-http: no --router given: waiting for the "
                        "router at %s (%s; set --router or BATON_ROUTER)\n",
                cfg.router, router_from);
    if (model != NULL) {
        struct stat st;
        size_t len = strlen(model);
        const char *base;

        while (len > 1 && model[len - 1] == '/')
            len--;
        snprintf(name, sizeof(name), "%.*s", (int)len, model);
        base = strrchr(name, '/');
        if (!named)
            cfg.model_name = base ? base + 1 : name;
        /* a Hugging Face directory carries its tokenizer and template */
        if (cfg.tokenizer == NULL && stat(model, &st) == 0 &&
            S_ISDIR(st.st_mode))
            cfg.tokenizer = model;
    }

    status = gateway_create(&cfg, &gw);
    if (status != BT_OK) {
        fprintf(stderr, "baton-http: %s\n", bt_error_last());
        return 1;
    }
    g_gateway = gw;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    status = gateway_run(gw);
    if (status != BT_OK) {
        fprintf(stderr, "baton-http: %s\n", bt_error_last());
        ret = 1;
    }
    g_gateway = NULL;
    gateway_destroy(&gw);
    return ret;
}
