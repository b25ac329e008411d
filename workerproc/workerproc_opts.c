/*
 * workerproc_opts.c - options, environment defaults and signals shared by
 * the worker executables (see workerproc_opts.h).
 */
#include "workerproc_opts.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "bt_curve.h"
#include "bt_error.h"
#include "bt_util.h"

/* Where the router endpoint came from (for the start-up line). */
static const char *g_router_from = "the default";
/* --curve-secret-key, --router-public-key (NULL: the environment). */
static const char *g_curve_secret;
static const char *g_router_public;

void workerproc_opts_env(const workerproc_opts_t *o)
{
    const char *port = getenv("BATON_METRICS_PORT");

    if (getenv("BATON_ROUTER")) {
        *o->router = getenv("BATON_ROUTER");
        g_router_from = "BATON_ROUTER";
    }
    if (port != NULL && port[0] != '\0' &&
        (bt_parse_int(port, o->metrics_port) != BT_OK ||
         *o->metrics_port < 0 || *o->metrics_port > 65535)) {
        fprintf(stderr, "%s: ignoring BATON_METRICS_PORT='%s' (not a "
                        "port)\n", o->prog, port);
        *o->metrics_port = -1;
    }
    if (getenv("BATON_HOST_ID") && getenv("BATON_HOST_ID")[0] != '\0')
        *o->host_id = getenv("BATON_HOST_ID");
}

static const char *g_gpu_uuid; /* --gpu named a UUID */

/* --gpu: an ordinal, or a GPU / MIG instance UUID.  CUDA selects by UUID
 * only through CUDA_VISIBLE_DEVICES (a MIG instance has no ordinal of
 * its own), so a UUID becomes the one visible device, ordinal 0; the
 * worker makes no CUDA call before its options are parsed. */
static bool parse_gpu(const char *arg, backend_config_t *b)
{
    size_t n = strlen(arg);

    if (strncmp(arg, "GPU-", 4) == 0 || strncmp(arg, "MIG-", 4) == 0) {
        if (n < 8 || n > 128 || strspn(arg, "0123456789abcdefABCDEF"
                                            "GPUMI-/") != n)
            return true;
        if (setenv("CUDA_VISIBLE_DEVICES", arg, 1) != 0)
            return true;
        b->device_index = 0;
        g_gpu_uuid = arg;
        return false;
    }
    return bt_parse_int(arg, &b->device_index) != BT_OK ||
           b->device_index < 0 || b->device_index > 1023;
}

bt_status_t workerproc_opts_option(const workerproc_opts_t *o, int c,
                              const char *arg)
{
    backend_config_t *b = &o->engine->backend;
    bool bad = false;

    switch (c) {
    case 'r': *o->router = arg; g_router_from = NULL; break;
    case 1030: bad = bt_parse_int(arg, o->metrics_port) != BT_OK ||
                     *o->metrics_port < 0 || *o->metrics_port > 65535;
        break;
    case 1031: *o->metrics_host = arg; break;
    case 1032: g_curve_secret = arg; break;
    case 1033: g_router_public = arg; break;
    case 1020: *o->host_id = arg; break;
    case 'm': o->engine->model_path = arg; break;
    case 't': o->engine->tokenizer_path = arg; break;
    case 'N': *o->null_model = true; break;
    case 'n': *o->name = arg; break;
    case 'd': o->engine->device = arg; break;
    case 'T': bad = bt_parse_int(arg, &b->n_threads) != BT_OK; break;
    case 'k': bad = bt_parse_int(arg, &b->n_kv_blocks) != BT_OK; break;
    case 'b': bad = bt_parse_int(arg, &b->block_size) != BT_OK; break;
    case 'B': bad = bt_parse_int(arg, &b->max_batch_tokens) != BT_OK; break;
    case 'U': *o->use_ucx = false; break;
    case 'W': bad = bt_parse_int(arg, o->step_delay_ms) != BT_OK; break;
    case 'P':
        if (strcmp(arg, "f32") == 0)
            b->precision = BACKEND_PRECISION_F32;
        else if (strcmp(arg, "bf16") == 0)
            b->precision = BACKEND_PRECISION_BF16;
        else if (strcmp(arg, "fp8") == 0) /* backend_create refuses what a
                                             backend cannot run */
            b->precision = BACKEND_PRECISION_FP8;
        else
            bad = true;
        break;
    case 1034: bad = backend_kv_dtype_parse(arg, &b->kv_dtype) != BT_OK;
        break;
    case 'I': *o->use_cuda_ipc = false; break;
    case 1010: *o->kv_stage = false; break;
    case 1011: *o->kv_stage_direct = false; break;
    case 1012: bad = bt_parse_int(arg, o->kv_stage_blocks) != BT_OK ||
                     *o->kv_stage_blocks < 0; break;
    case 1013: *o->kv_stage_host = true; break;
    case 1021: bad = parse_gpu(arg, b); break;
    case 1022: bad = bt_parse_int(arg, &b->tp_size) != BT_OK ||
                     b->tp_size < 1 || b->tp_size > 64; break;
    case 1023: bad = bt_parse_double(arg, &b->kv_memory_fraction) != BT_OK ||
                     !(b->kv_memory_fraction > 0 &&
                       b->kv_memory_fraction <= 1); break;
    case 1024: {
        double gb;

        bad = bt_parse_double(arg, &gb) != BT_OK || !(gb > 0 && gb < 1e6);
        if (!bad)
            b->kv_memory_bytes = (size_t)(gb * 1073741824.0);
        break;
    }
    case 1035: {
        double gb;

        bad = bt_parse_double(arg, &gb) != BT_OK || !(gb >= 0 && gb < 1e6);
        if (!bad)
            b->kv_host_bytes = (size_t)(gb * 1073741824.0);
        break;
    }
    case 1025:
        if (strcmp(arg, "auto") == 0)
            *o->warmup = WORKERPROC_OPTS_WARMUP_AUTO;
        else if (strcmp(arg, "on") == 0)
            *o->warmup = WORKERPROC_OPTS_WARMUP_ON;
        else if (strcmp(arg, "off") == 0)
            *o->warmup = WORKERPROC_OPTS_WARMUP_OFF;
        else
            bad = true;
        break;
    default: return BT_ERR_NOT_FOUND;
    }
    return bad ? BT_ERR_INVALID_ARG : BT_OK;
}

bool workerproc_opts_ok(const workerproc_opts_t *o, int argc, int optind_)
{
    const char *host_id = *o->host_id;

    if (host_id != NULL && (host_id[0] == '\0' || strlen(host_id) > 127)) {
        fprintf(stderr, "%s: --host-id/BATON_HOST_ID must be 1 to "
                        "127 bytes\n", o->prog);
        return false;
    }
    if (optind_ != argc ||
        (o->engine->model_path == NULL) == !*o->null_model) {
        fprintf(stderr, "%s: need exactly one of --model or "
                        "--null-model\n", o->prog);
        o->usage(stderr);
        return false;
    }
    if (g_gpu_uuid != NULL && o->engine->backend.tp_size > 1) {
        fprintf(stderr, "%s: --gpu %s names one device; --tp %d needs a "
                        "device ordinal (ranks use gpu..gpu+tp-1)\n",
                o->prog, g_gpu_uuid, o->engine->backend.tp_size);
        return false;
    }
    if (g_gpu_uuid != NULL)
        fprintf(stderr, "%s: --gpu %s: CUDA_VISIBLE_DEVICES=%s, device 0\n",
                o->prog, g_gpu_uuid, g_gpu_uuid);
    if (bt_curve_identity_init(g_curve_secret, g_router_public) != BT_OK) {
        fprintf(stderr, "%s: %s\n", o->prog, bt_error_last());
        return false;
    }
    if (g_router_from != NULL)
        fprintf(stderr, "%s: no --router given: waiting for the router at "
                        "%s (%s; set --router or BATON_ROUTER)\n", o->prog,
                *o->router, g_router_from);
    return true;
}

/* The running worker's stop function and its argument, for the signal
 * handler. */
static void (*volatile g_stop)(void *arg);
static void *volatile g_stop_arg;

static void on_signal(int sig)
{
    void (*stop)(void *arg) = g_stop;

    (void)sig;
    if (stop != NULL)
        stop(g_stop_arg);
}

void workerproc_opts_signals(void (*stop)(void *arg), void *arg)
{
    struct sigaction sa;

    g_stop_arg = arg;
    g_stop = stop;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void workerproc_opts_signals_clear(void)
{
    g_stop = NULL;
}

bool workerproc_opts_warmup_wanted(int mode, const char *backend_name)
{
    if (mode == WORKERPROC_OPTS_WARMUP_AUTO)
        return backend_name != NULL && strcmp(backend_name, "cuda") == 0;
    return mode == WORKERPROC_OPTS_WARMUP_ON;
}
