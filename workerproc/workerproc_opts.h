/*
 * workerproc_opts.h - process plumbing shared by the worker executables
 * (baton-prefill, baton-decode): the options both take, their
 * environment defaults (BATON_ROUTER, BATON_HOST_ID), the checks on them,
 * and SIGTERM/SIGINT handling that asks the running worker to stop.
 *
 * Each main keeps its own option table and config struct: the table
 * starts with WORKERPROC_OPTS_OPTIONS, a workerproc_opts_t points at the
 * config fields the shared options fill, and the main's getopt loop hands
 * every option to workerproc_opts_option() first.
 */
#ifndef BT_WORKERPROC_WORKERPROC_OPTS_H
#define BT_WORKERPROC_WORKERPROC_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "bt_status.h"
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The struct option entries of the shared options (the values are their
 * getopt codes; role-specific options must not reuse them). */
#define WORKERPROC_OPTS_OPTIONS                                      \
    { "router", required_argument, 0, 'r' },                    \
    { "host-id", required_argument, 0, 1020 },                  \
    { "model", required_argument, 0, 'm' },                     \
    { "tokenizer", required_argument, 0, 't' },                 \
    { "null-model", no_argument, 0, 'N' },                      \
    { "name", required_argument, 0, 'n' },                      \
    { "device", required_argument, 0, 'd' },                    \
    { "threads", required_argument, 0, 'T' },                   \
    { "kv-blocks", required_argument, 0, 'k' },                 \
    { "block-size", required_argument, 0, 'b' },                \
    { "max-batch-tokens", required_argument, 0, 'B' },          \
    { "no-ucx", no_argument, 0, 'U' },                          \
    { "step-delay-ms", required_argument, 0, 'W' },             \
    { "precision", required_argument, 0, 'P' },                 \
    { "no-cuda-ipc", no_argument, 0, 'I' },                     \
    { "no-kv-stage", no_argument, 0, 1010 },                    \
    { "no-kv-stage-direct", no_argument, 0, 1011 },             \
    { "kv-stage-blocks", required_argument, 0, 1012 },          \
    { "kv-stage-host", no_argument, 0, 1013 },                  \
    { "gpu", required_argument, 0, 1021 },                      \
    { "tp", required_argument, 0, 1022 },                       \
    { "kv-memory-fraction", required_argument, 0, 1023 },       \
    { "kv-memory-gb", required_argument, 0, 1024 },             \
    { "warmup", required_argument, 0, 1025 },                   \
    { "metrics-port", required_argument, 0, 1030 },             \
    { "metrics-host", required_argument, 0, 1031 },             \
    { "curve-secret-key", required_argument, 0, 1032 },         \
    { "router-public-key", required_argument, 0, 1033 },         \
    { "kv-dtype", required_argument, 0, 1034 },                 \
    { "kv-host-gb", required_argument, 0, 1035 }

/* Usage lines of the first shared options, the same in every worker. */
#define WORKERPROC_OPTS_USAGE_ROUTER                                              \
    "  --router EP            router control endpoint (env BATON_ROUTER;\n" \
    "                         the flag wins)\n"                             \
    "  --host-id ID           host identity for the router's transport\n"  \
    "                         choice (env BATON_HOST_ID; default\n"         \
    "                         hostname/boot-id): equal ids mean CUDA IPC\n" \
    "                         / UCX shared memory work between the two\n"   \
    "                         (containers on one node sharing /dev/shm\n"   \
    "                         and the IPC namespace); at most 127 bytes\n"  \
    "  --model PATH           llama2.c .bin, HF directory or synth:NAME\n"  \
    "  --tokenizer PATH       llama2.c tokenizer (for text prompts)\n"      \
    "  --null-model           no model: instant deterministic tokens\n"  \
    "  --metrics-port N       serve Prometheus /metrics and /health on N\n" \
    "                         (env BATON_METRICS_PORT; 0: any free port;\n"\
    "                         default: off); see docs/OPERATIONS.md\n"     \
    "  --metrics-host ADDR    address the metrics port binds (127.0.0.1)\n"\
    "  --curve-secret-key F   CURVE: this worker's secret key (`baton\n"   \
    "                         keygen`; env BATON_CURVE_SECRET_KEY)\n"     \
    "  --router-public-key F  CURVE: the router's public key (env\n"      \
    "                         BATON_ROUTER_PUBLIC_KEY); both or neither\n"

/* Usage lines of the KV pool size (every worker). */
#define WORKERPROC_OPTS_USAGE_KV                                                  \
    "  --kv-blocks N          KV pool blocks; overrides the two below\n"    \
    "                         (default: sized from memory)\n"              \
    "  --kv-memory-fraction F cuda: the pool takes F of the device memory\n" \
    "                         free after weights and activations, measured\n"\
    "                         with cudaMemGetInfo (0.90; the rest is for\n" \
    "                         CUDA graphs, cuBLASLt and sampling; give\n"   \
    "                         each of two workers sharing a GPU its part)\n"\
    "  --kv-memory-gb G       the pool's size in GiB (cuda per GPU, or cpu;\n"\
    "                         wins over the fraction).  cpu default: 1/32\n"\
    "                         of MemAvailable, at most 64 MiB and at most\n" \
    "                         max-seqs full contexts (CI hosts run many\n"  \
    "                         workers; the cpu pool is zeroed, so touched)\n"\
    "  --kv-host-gb G         with --prefix-cache: a host-memory tier of\n"\
    "                         G GiB (pinned for cuda) that blocks the pool\n"\
    "                         evicts spill to and come back from on a hit\n"\
    "                         (one GPU; default 0: off)\n"                  \
    "  --block-size N         KV block size in tokens (16; equal on\n"      \
    "                         prefill and decode for UCX hand-off)\n"       \
    "  --warmup auto|on|off   run the shapes this worker serves (GEMM\n"    \
    "                         tuning, CUDA graph capture) before it\n"      \
    "                         registers with the router; auto: on for\n"   \
    "                         cuda, off for cpu (nothing to warm)\n"

/* Usage line of --gpu (after --device in every worker's usage). */
#define WORKERPROC_OPTS_USAGE_GPU                                                 \
    "  --gpu ID               the backend's GPU: a CUDA ordinal (default\n" \
    "                         0), a GPU UUID (GPU-...) or a MIG instance\n"\
    "                         UUID (MIG-...; sets CUDA_VISIBLE_DEVICES)\n" \
    "  --tp N                 tensor parallelism over GPUs gpu..gpu+N-1\n" \
    "                         (cuda; default 1)\n"

/* Where the shared options land: fields of the main's config struct. */
typedef struct {
    const char *prog;             /* "baton-prefill", for messages */
    void (*usage)(FILE *out);     /* the main's usage text */
    const char **router;
    const char **host_id;
    const char **name;
    engine_config_t *engine;      /* model, tokenizer, device, backend */
    bool *null_model;
    bool *use_ucx;
    int *step_delay_ms;
    bool *use_cuda_ipc;
    bool *kv_stage;
    bool *kv_stage_direct;
    int *kv_stage_blocks;
    bool *kv_stage_host;
    int *warmup;                  /* WORKERPROC_OPTS_WARMUP_* */
    int *metrics_port;            /* -1: no metrics listener */
    const char **metrics_host;
} workerproc_opts_t;

/* --warmup */
#define WORKERPROC_OPTS_WARMUP_AUTO 0  /* on for cuda, off for cpu */
#define WORKERPROC_OPTS_WARMUP_ON 1
#define WORKERPROC_OPTS_WARMUP_OFF 2

/* Whether --warmup `mode` warms a worker whose engine runs on backend
 * `backend_name` ("cpu", "cuda"). */
bool workerproc_opts_warmup_wanted(int mode, const char *backend_name);

/* Points a workerproc_opts_t at the same-named fields of config struct
 * `cfg` (prefill_config_t, decode_config_t). */
#define WORKERPROC_OPTS_INIT(cfg, prog_, usage_)                            \
    {                                                                      \
        .prog = (prog_), .usage = (usage_), .router = &(cfg).router,       \
        .host_id = &(cfg).host_id, .name = &(cfg).name,                    \
        .engine = &(cfg).engine, .null_model = &(cfg).null_model,          \
        .use_ucx = &(cfg).use_ucx, .step_delay_ms = &(cfg).step_delay_ms,  \
        .use_cuda_ipc = &(cfg).use_cuda_ipc, .kv_stage = &(cfg).kv_stage,  \
        .kv_stage_direct = &(cfg).kv_stage_direct,                         \
        .kv_stage_blocks = &(cfg).kv_stage_blocks,                         \
        .kv_stage_host = &(cfg).kv_stage_host,                             \
        .warmup = &(cfg).warmup,                                           \
        .metrics_port = &(cfg).metrics_port,                               \
        .metrics_host = &(cfg).metrics_host,                               \
    }

/* Applies the environment defaults (BATON_ROUTER; BATON_HOST_ID when not
 * empty; BATON_METRICS_PORT); call before parsing so flags win. */
void workerproc_opts_env(const workerproc_opts_t *o);

/* Applies getopt result `c` with argument `arg` when it is a shared
 * option.  Returns BT_OK when applied, BT_ERR_INVALID_ARG for a bad value
 * (nothing printed), BT_ERR_NOT_FOUND when `c` is not a shared option. */
bt_status_t workerproc_opts_option(const workerproc_opts_t *o, int c,
                              const char *arg);

/* Checks the parsed shared options (host id 1 to 127 bytes, no operands,
 * exactly one of --model and --null-model), printing what is wrong (and
 * the usage, for the latter) to stderr.  Returns true when they are
 * fine.  It also loads the CURVE identity (--curve-secret-key,
 * --router-public-key, else the environment): a key file that cannot be
 * read is reported and fails the check.
 * A worker started without --router then says on stderr which
 * endpoint it waits on (the default or BATON_ROUTER): a worker that
 * silently waits on the wrong port is hard to tell from a slow one. */
bool workerproc_opts_ok(const workerproc_opts_t *o, int argc, int optind_);

/* Makes SIGTERM and SIGINT call stop(arg) (which must be async-signal-
 * safe) and ignores SIGPIPE.  workerproc_opts_signals_clear() makes the
 * signals do nothing again; call it before freeing `arg`. */
void workerproc_opts_signals(void (*stop)(void *arg), void *arg);
void workerproc_opts_signals_clear(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKERPROC_WORKERPROC_OPTS_H */
