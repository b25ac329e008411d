/*
 * cli_up.c - `baton up`: a whole local cluster (router + N prefill + N
 * decode workers on 127.0.0.1) in one command.  Prints the client
 * endpoint; Ctrl-C or SIGTERM drains the workers, then the router, and
 * exits.  The binaries are taken from the directory of this executable.
 *
 * A cluster of its own or none (issue 40): the ports are checked before
 * anything starts, and the workers start only once this run's router
 * listens; a router that cannot bind fails `baton up` at once, instead
 * of its workers joining whatever else listens there.  Worker names
 * carry this run's pid, so two runs never present the same name to a
 * router (which would take one for the other).
 *
 * CURVE (docs/SECURITY.md): the run makes three key pairs (router,
 * workers, clients) in DIR/keys with --log-dir, else in a fresh
 * /tmp/baton-up-PID-XXXXXX; the router admits only the workers' and
 * clients' keys, and the run prints the client flags and writes
 * keys/client.env (`. keys/client.env` and every baton command uses
 * them).  --no-curve: no keys (the cluster is on loopback either way).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bt_curve.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "client.h"

#define UP_MAX_PROCS 66
#define UP_MAX_ARGS 48

/* Set by the signal handler; read by the supervision loop. */
static volatile sig_atomic_t up_stop;

static void up_on_signal(int sig)
{
    (void)sig;
    up_stop = 1;
}

static void up_usage(FILE *out)
{
    fprintf(out,
"usage: baton up (--model PATH [--tokenizer PATH] | --null-model)\n"
"                [--prefill N] [--decode N] [--port P] [options]\n"
"\n"
"Starts baton-router on 127.0.0.1:P (clients) and P+1 (workers), N prefill\n"
"and N decode workers, prints the client endpoint, and stops them all on\n"
"Ctrl-C or SIGTERM (workers drain first).\n"
"\n"
"  --prefill N          prefill workers (default 1); 0: aggregated mode,\n"
"                       every decode worker runs --role both\n"
"  --decode N           decode workers (default 1)\n"
"  --role-both          decode workers also prefill (--role both) even\n"
"                       with prefill workers (the router's fallback)\n"
"  --kv-transport MODE  auto | ucx | cuda-ipc | inline (router flag)\n"
"  --device DEV         cpu | cuda | auto, passed to every worker\n"
"  --precision P        f32 | bf16, passed to every worker\n"
"  --port P             client port (default 5555; control is P+1)\n"
"  --threads N          CPU threads per worker (default 1)\n"
"  --kv-blocks N        decode KV pool blocks (default 256)\n"
"  --block-size N       KV block size (default 16)\n"
"  --chunk-tokens N     prefill chunk (default 512)\n"
"  --no-ucx             KV travels inline on the control plane\n"
"  --null-model         workers without a model (overhead benchmarks)\n"
"  --log-dir DIR        write each process's log to DIR/NAME.log (DIR is\n"
"                       created when missing)\n"
"  --http-port H        also start baton-http (OpenAI API) on\n"
"                       127.0.0.1:H and print its URL\n"
"  --no-curve           no CURVE keys (default: the run makes a router, a\n"
"                       worker and a client key pair in LOG_DIR/keys or a\n"
"                       temp dir, and prints the client flags)\n"
"  --metrics-port M     Prometheus /metrics: the router on M, each worker\n"
"                       on M+1, M+2, ... (/health too; printed)\n"
"  --spec-head PATH     EAGLE draft head: decode workers speculate, prefill\n"
"                       workers ship features (--spec-features)\n"
"  --spec-depth D, --spec-topk K, --spec-tokens N, --spec off|auto|fixed\n"
"                       passed to decode workers\n");
}

typedef struct {
    pid_t pid;
    char name[64];
    int role; /* 0 router, 1 prefill, 2 decode, 3 baton-http */
} up_proc_t;

/* True when nothing listens on 127.0.0.1:port (we could bind it). */
static bool up_port_free(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    bool ok;

    if (fd < 0)
        return true; /* cannot tell; the router will say */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* True when something accepts connections on 127.0.0.1:port. */
static bool up_port_listens(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok;

    if (fd < 0)
        return false;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Waits until this run's router (pid) listens on both of its ports.
 * Returns false, having said why, when it exited first (it could not
 * bind, or a bad flag) or did not listen within 15 s. */
static bool up_wait_router(pid_t pid, int port, const char *log_dir)
{
    struct timespec ts = { 0, 20 * 1000000 };

    for (int waited = 0; waited < 15000; waited += 20) {
        int st;
        bool listens = up_port_listens(port) && up_port_listens(port + 1);
        if (listens) /* a bind failure ends the router within moments */
            nanosleep(&ts, NULL);
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "baton up: the router exited (%s %d) before "
                    "it listened on 127.0.0.1:%d/%d; %s%s%s\n",
                    WIFSIGNALED(st) ? "signal" : "status",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), port,
                    port + 1, log_dir ? "see " : "its error is above",
                    log_dir ? log_dir : "", log_dir ? "/router.log" : "");
            return false;
        }
        /* Listening and still alive a moment later: the listener is
         * ours (the ports were free before it started). */
        if (listens)
            return true;
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "baton up: the router does not listen on 127.0.0.1:%d "
            "after 15 s\n", port);
    return false;
}

/* mkdir -p: creates `dir` and its missing parents.  Returns false (with
 * errno) when it cannot. */
static bool up_mkdirs(const char *dir)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);

    if (len == 0 || len >= sizeof(path)) {
        errno = ENAMETOOLONG;
        return false;
    }
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return false;
        path[i] = i < len ? '/' : '\0';
    }
    return access(dir, W_OK | X_OK) == 0;
}

static pid_t up_spawn(const char *bin_dir, const char *exe, char **args,
                      const char *log_dir, const char *name)
{
    char path[PATH_MAX];
    pid_t pid;

    snprintf(path, sizeof(path), "%s/%s", bin_dir, exe);
    args[0] = path;
    pid = fork();
    if (pid == 0) {
        if (log_dir != NULL) {
            char log[PATH_MAX];
            FILE *f;
            snprintf(log, sizeof(log), "%s/%s.log", log_dir, name);
            f = freopen(log, "w", stderr);
            if (f == NULL) { /* stderr is still the terminal's */
                fprintf(stderr, "baton up: cannot write %s: %s\n", log,
                        strerror(errno));
                _exit(126);
            }
        }
        execv(path, args);
        fprintf(stderr, "baton up: cannot run %s: %s\n", path,
                strerror(errno));
        _exit(127);
    }
    return pid;
}

static void up_signal_role(up_proc_t *procs, int n, int role, int sig)
{
    for (int i = 0; i < n; i++)
        if (procs[i].pid > 0 && procs[i].role == role)
            kill(procs[i].pid, sig);
}

/* Waits until every process of `role` exited or `ms` passed. */
static void up_reap_role(up_proc_t *procs, int n, int role, int ms)
{
    struct timespec ts = { 0, 20 * 1000000 };

    for (int waited = 0;; waited += 20) {
        int alive = 0;
        for (int i = 0; i < n; i++) {
            if (procs[i].pid <= 0 || procs[i].role != role)
                continue;
            if (waitpid(procs[i].pid, NULL, WNOHANG) == procs[i].pid)
                procs[i].pid = 0;
            else
                alive++;
        }
        if (alive == 0)
            return;
        if (waited >= ms) {
            up_signal_role(procs, n, role, SIGKILL);
            for (int i = 0; i < n; i++)
                if (procs[i].pid > 0 && procs[i].role == role) {
                    waitpid(procs[i].pid, NULL, 0);
                    procs[i].pid = 0;
                }
            return;
        }
        nanosleep(&ts, NULL);
    }
}

/* Paths of one run's keys (empty `dir`: no CURVE). */
typedef struct {
    char dir[PATH_MAX - 64];
    char router_key[PATH_MAX];
    char router_pub[PATH_MAX];
    char worker_key[PATH_MAX];
    char worker_pub[PATH_MAX];
    char client_key[PATH_MAX];
    char client_pub[PATH_MAX];
} up_keys_t;

/* Makes the run's key directory and three key pairs, writes
 * client.env, and makes the client key this process's identity. */
static bool up_make_keys(const char *log_dir, up_keys_t *k)
{
    static const char *const names[3] = { "router", "worker", "client" };
    char prefix[PATH_MAX], env[PATH_MAX];
    FILE *f;

    if (log_dir != NULL) {
        snprintf(k->dir, sizeof(k->dir), "%s/keys", log_dir);
        if (mkdir(k->dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "baton up: cannot create %s: %s\n", k->dir,
                    strerror(errno));
            return false;
        }
    } else {
        snprintf(k->dir, sizeof(k->dir), "/tmp/baton-up-%ld-XXXXXX",
                 (long)getpid());
        if (mkdtemp(k->dir) == NULL) {
            fprintf(stderr, "baton up: cannot create a key directory: %s\n",
                    strerror(errno));
            return false;
        }
    }
    for (int i = 0; i < 3; i++) {
        snprintf(prefix, sizeof(prefix), "%.*s/%s", PATH_MAX - 80, k->dir,
                 names[i]);
        /* a --log-dir reused: a new run, new keys */
        snprintf(env, sizeof(env), "%.*s.key", PATH_MAX - 8, prefix);
        unlink(env);
        if (bt_curve_keygen(prefix, NULL) != BT_OK) {
            fprintf(stderr, "baton up: %s\n", bt_error_last());
            return false;
        }
    }
#define UP_KEY(field, name, ext)                                             \
    snprintf(k->field, sizeof(k->field), "%s/%s.%s", k->dir, name, ext)
    UP_KEY(router_key, "router", "key");
    UP_KEY(router_pub, "router", "pub");
    UP_KEY(worker_key, "worker", "key");
    UP_KEY(worker_pub, "worker", "pub");
    UP_KEY(client_key, "client", "key");
    UP_KEY(client_pub, "client", "pub");
#undef UP_KEY
    snprintf(env, sizeof(env), "%s/client.env", k->dir);
    f = fopen(env, "w");
    if (f == NULL || fprintf(f, "export BATON_CURVE_SECRET_KEY=%s\n"
                             "export BATON_ROUTER_PUBLIC_KEY=%s\n",
                             k->client_key, k->router_pub) < 0 ||
        fclose(f) != 0) {
        fprintf(stderr, "baton up: cannot write %s\n", env);
        return false;
    }
    if (bt_curve_identity_init(k->client_key, k->router_pub) != BT_OK) {
        fprintf(stderr, "baton up: %s\n", bt_error_last());
        return false;
    }
    return true;
}

/* Waits (bounded) until the router knows `n_workers` workers, then
 * prints each worker and the KV transport of every prefill/decode pair. */
static void up_print_status(const char *endpoint, int n_workers)
{
    client_t *c = NULL;
    struct timespec ts = { 0, 100 * 1000000 };

    if (client_create(endpoint, &c) != BT_OK)
        return;
    for (int tries = 0; tries < 600 && !up_stop; tries++) {
        Baton__ClientMessage *m = NULL;
        uint64_t rid;
        bool done = false;
        if (client_status_request(c, &rid) != BT_OK)
            break;
        while (client_recv(c, 1000, &m) == BT_OK) {
            const Baton__ClusterStatus *st = m->status;
            if (m->body_case != BATON__CLIENT_MESSAGE__BODY_STATUS ||
                st->client_request_id != rid) {
                proto_client_free(&m);
                continue;
            }
            if ((int)st->n_workers >= n_workers) {
                printf("workers:\n");
                for (size_t i = 0; i < st->n_workers; i++) {
                    const Baton__WorkerStatus *w = st->workers[i];
                    printf("  %-24s %-15s host %s%s%s\n", w->name,
                           w->role == 1 ? "prefill"
                           : w->can_prefill ? "decode+prefill" : "decode",
                           w->host_id ? w->host_id : "?",
                           w->gpu && w->gpu[0] ? " gpu " : "",
                           w->gpu ? w->gpu : "");
                }
                printf("kv transports (--kv-transport %s):\n",
                       st->kv_transport_mode ? st->kv_transport_mode : "?");
                for (size_t i = 0; i < st->n_transports; i++)
                    printf("  %s -> %s: %s\n", st->transports[i]->prefill,
                           st->transports[i]->decode,
                           st->transports[i]->name);
                fflush(stdout);
                done = true;
            }
            proto_client_free(&m);
            break;
        }
        if (done)
            break;
        nanosleep(&ts, NULL);
    }
    client_destroy(&c);
}

int cli_up_main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "tokenizer", required_argument, NULL, 't' },
        { "prefill", required_argument, NULL, 'P' },
        { "decode", required_argument, NULL, 'D' },
        { "port", required_argument, NULL, 'p' },
        { "threads", required_argument, NULL, 'T' },
        { "kv-blocks", required_argument, NULL, 'k' },
        { "block-size", required_argument, NULL, 'b' },
        { "chunk-tokens", required_argument, NULL, 'c' },
        { "no-ucx", no_argument, NULL, 'U' },
        { "null-model", no_argument, NULL, 'N' },
        { "log-dir", required_argument, NULL, 'L' },
        { "role-both", no_argument, NULL, 'R' },
        { "kv-transport", required_argument, NULL, 'X' },
        { "device", required_argument, NULL, 'd' },
        { "precision", required_argument, NULL, 'r' },
        { "spec-head", required_argument, NULL, 1000 },
        { "spec-depth", required_argument, NULL, 1001 },
        { "spec-topk", required_argument, NULL, 1002 },
        { "spec-tokens", required_argument, NULL, 1003 },
        { "spec", required_argument, NULL, 1004 },
        { "http-port", required_argument, NULL, 1005 },
        { "metrics-port", required_argument, NULL, 1006 },
        { "no-curve", no_argument, NULL, 1007 },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *model = NULL, *tokenizer = NULL, *log_dir = NULL;
    const char *threads = "1", *kv_blocks = "256", *block_size = "16";
    const char *chunk = "512", *kv_transport = "auto", *device = NULL;
    const char *precision = NULL;
    /* speculative decoding, passed through: --spec-head and 4 values */
    const char *spec_head = NULL, *spec_opt[4] = { NULL, NULL, NULL, NULL };
    static const char *const spec_flag[4] = { "--spec-depth", "--spec-topk",
                                              "--spec-tokens", "--spec" };
    bool null_model = false, no_ucx = false, role_both = false;
    bool curve = true;
    static up_keys_t keys; /* large: not on the stack */
    int n_prefill = 1, n_decode = 1, port = 5555, n = 0;
    int http_port = -1, metrics_port = -1, ret = 0;
    char run_tag[16]; /* this run's pid: unique worker names */
    up_proc_t procs[UP_MAX_PROCS];
    char self[PATH_MAX], bin_dir[PATH_MAX];
    char listen_ep[64], control_ep[64];
    struct sigaction sa;
    ssize_t len;

    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL), bad = 0;
        if (c == -1)
            break;
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokenizer = optarg; break;
        case 'P': bad = bt_parse_int(optarg, &n_prefill) != BT_OK; break;
        case 'D': bad = bt_parse_int(optarg, &n_decode) != BT_OK; break;
        case 'p': bad = bt_parse_int(optarg, &port) != BT_OK; break;
        case 'T': threads = optarg; break;
        case 'k': kv_blocks = optarg; break;
        case 'b': block_size = optarg; break;
        case 'c': chunk = optarg; break;
        case 'U': no_ucx = true; break;
        case 'N': null_model = true; break;
        case 'L': log_dir = optarg; break;
        case 'R': role_both = true; break;
        case 'X': kv_transport = optarg; break;
        case 'd': device = optarg; break;
        case 'r': precision = optarg; break;
        case 1000: spec_head = optarg; break;
        case 1001: case 1002: case 1003: case 1004:
            spec_opt[c - 1001] = optarg;
            break;
        case 1005: bad = bt_parse_int(optarg, &http_port) != BT_OK ||
                         http_port <= 0 || http_port > 65535; break;
        case 1006: bad = bt_parse_int(optarg, &metrics_port) != BT_OK ||
                         metrics_port <= 0 || metrics_port > 65535 - 66;
            break;
        case 1007: curve = false; break;
        case 'h': up_usage(stdout); return 0;
        default: up_usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton up: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (n_prefill == 0)
        role_both = true; /* aggregated: decode workers prefill */
    if (optind < argc || (model == NULL) == !null_model || n_prefill < 0 ||
        n_decode < 1 || n_prefill + n_decode + 2 > UP_MAX_PROCS ||
        port <= 0 || port > 65534) {
        fprintf(stderr, "baton up: need --model or --null-model, 0..32 "
                        "prefill and 1..32 decode workers and a port\n");
        up_usage(stderr);
        return 2;
    }
    if (log_dir != NULL && !up_mkdirs(log_dir)) {
        fprintf(stderr, "baton up: cannot create or write the log directory "
                "%s: %s\n", log_dir, strerror(errno));
        return 1;
    }
    /* Every port this run binds must be free now: a router that cannot
     * bind would leave its workers to join whatever listens there. */
    {
        int ports[3 + UP_MAX_PROCS], n_ports = 0;
        ports[n_ports++] = port;
        ports[n_ports++] = port + 1;
        if (http_port > 0)
            ports[n_ports++] = http_port;
        for (int i = 0; metrics_port > 0 && i <= n_prefill + n_decode; i++)
            ports[n_ports++] = metrics_port + i;
        for (int i = 0; i < n_ports; i++) {
            if (up_port_free(ports[i]))
                continue;
            fprintf(stderr, "baton up: port %d on 127.0.0.1 is in use "
                    "(another router or cluster?); choose other ports "
                    "(--port%s)\n", ports[i],
                    http_port > 0 || metrics_port > 0
                        ? ", --http-port, --metrics-port" : "");
            return 1;
        }
    }
    if (curve && !up_make_keys(log_dir, &keys))
        return 1;
    snprintf(run_tag, sizeof(run_tag), "%ld", (long)getpid());
    len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) {
        fprintf(stderr, "baton up: cannot find my own binary\n");
        return 1;
    }
    self[len] = '\0';
    snprintf(bin_dir, sizeof(bin_dir), "%s", dirname(self));
    snprintf(listen_ep, sizeof(listen_ep), "tcp://127.0.0.1:%d", port);
    snprintf(control_ep, sizeof(control_ep), "tcp://127.0.0.1:%d", port + 1);

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = up_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    memset(procs, 0, sizeof(procs));

    {
        char mport[16];
        char *args[20] = { NULL, "--listen", listen_ep, "--control",
                           control_ep, "--kv-transport", (char *)kv_transport,
                           NULL };
        int a = 7;
        if (tokenizer != NULL) { /* the workers': text prompts' ids */
            args[a++] = "--tokenizer";
            args[a++] = (char *)tokenizer;
        }
        if (metrics_port > 0) {
            snprintf(mport, sizeof(mport), "%d", metrics_port);
            args[a++] = "--metrics-port";
            args[a++] = mport;
        }
        if (curve) {
            args[a++] = "--curve-secret-key";
            args[a++] = keys.router_key;
            args[a++] = "--allow-workers";
            args[a++] = keys.worker_pub;
            args[a++] = "--allow-clients";
            args[a++] = keys.client_pub;
        }
        args[a] = NULL;
        procs[n].pid = up_spawn(bin_dir, "baton-router", args, log_dir,
                                "router");
        snprintf(procs[n].name, sizeof(procs[n].name), "router");
        procs[n++].role = 0;
        if (procs[0].pid < 0 || !up_wait_router(procs[0].pid, port,
                                                log_dir)) {
            if (procs[0].pid > 0 && waitpid(procs[0].pid, NULL, WNOHANG) == 0) {
                kill(procs[0].pid, SIGKILL);
                waitpid(procs[0].pid, NULL, 0);
            }
            fprintf(stderr, "baton up: no cluster started\n");
            return 1;
        }
    }
    for (int role = 1; role <= 2; role++) {
        int count = role == 1 ? n_prefill : n_decode;
        for (int i = 0; i < count; i++) {
            char *args[UP_MAX_ARGS];
            char name[64], mport[16];
            int a = 1;
            snprintf(name, sizeof(name), "%s-%d-%d-%s",
                     role == 1 ? "prefill" : "decode", port, i, run_tag);
            args[a++] = "--router";
            args[a++] = control_ep;
            args[a++] = "--name";
            args[a++] = name;
            if (curve) {
                args[a++] = "--curve-secret-key";
                args[a++] = keys.worker_key;
                args[a++] = "--router-public-key";
                args[a++] = keys.router_pub;
            }
            if (metrics_port > 0) {
                snprintf(mport, sizeof(mport), "%d", metrics_port + n);
                args[a++] = "--metrics-port";
                args[a++] = mport;
            }
            if (null_model) {
                args[a++] = "--null-model";
            } else {
                args[a++] = "--model";
                args[a++] = (char *)model;
                if (tokenizer != NULL) {
                    args[a++] = "--tokenizer";
                    args[a++] = (char *)tokenizer;
                }
                args[a++] = "--threads";
                args[a++] = (char *)threads;
            }
            args[a++] = "--block-size";
            args[a++] = (char *)block_size;
            if (role == 2) {
                args[a++] = "--kv-blocks";
                args[a++] = (char *)kv_blocks;
            } else {
                args[a++] = "--chunk-tokens";
                args[a++] = (char *)chunk;
            }
            if (no_ucx)
                args[a++] = "--no-ucx";
            if (role == 2 && role_both) {
                args[a++] = "--role";
                args[a++] = "both";
                args[a++] = "--chunk-tokens";
                args[a++] = (char *)chunk;
            }
            if (device != NULL && !null_model) {
                args[a++] = "--device";
                args[a++] = (char *)device;
            }
            if (precision != NULL && !null_model) {
                args[a++] = "--precision";
                args[a++] = (char *)precision;
            }
            if (spec_head != NULL && !null_model && role == 1) {
                args[a++] = "--spec-features";
            } else if (spec_head != NULL && !null_model) {
                args[a++] = "--spec-head";
                args[a++] = (char *)spec_head;
                for (int k = 0; k < 4; k++) {
                    if (spec_opt[k] == NULL)
                        continue;
                    args[a++] = (char *)spec_flag[k];
                    args[a++] = (char *)spec_opt[k];
                }
            }
            args[a] = NULL;
            procs[n].pid = up_spawn(bin_dir,
                                    role == 1 ? "baton-prefill"
                                              : "baton-decode",
                                    args, log_dir, name);
            snprintf(procs[n].name, sizeof(procs[n].name), "%s", name);
            procs[n++].role = role;
        }
    }
    if (http_port > 0) {
        char hlisten[32];
        char *args[16];
        int a = 1;
        snprintf(hlisten, sizeof(hlisten), "127.0.0.1:%d", http_port);
        args[a++] = "--router";
        args[a++] = listen_ep;
        if (curve) {
            args[a++] = "--curve-secret-key";
            args[a++] = keys.client_key;
            args[a++] = "--router-public-key";
            args[a++] = keys.router_pub;
        }
        args[a++] = "--listen";
        args[a++] = hlisten;
        if (!null_model) {
            args[a++] = "--model";
            args[a++] = (char *)model;
            if (tokenizer != NULL) {
                args[a++] = "--tokenizer";
                args[a++] = (char *)tokenizer;
            }
        }
        args[a] = NULL;
        procs[n].pid = up_spawn(bin_dir, "baton-http", args, log_dir,
                                "http");
        snprintf(procs[n].name, sizeof(procs[n].name), "baton-http");
        procs[n++].role = 3;
    }
    printf("baton up: router %s (workers on %s), %d prefill + %d decode\n",
           listen_ep, control_ep, n_prefill, n_decode);
    printf("endpoint: %s\n", listen_ep);
    if (http_port > 0)
        printf("http: http://127.0.0.1:%d/v1 (OpenAI API; /health, "
               "/metrics)\n", http_port);
    if (metrics_port > 0)
        for (int i = 0; i < n; i++)
            if (procs[i].role <= 2)
                printf("metrics: %-24s http://127.0.0.1:%d/metrics\n",
                       procs[i].name, metrics_port + i);
    if (log_dir != NULL)
        printf("logs: %s/NAME.log\n", log_dir);
    if (curve)
        printf("curve: clients connect with --curve-secret-key %s "
               "--router-public-key %s (or: . %s/client.env)\n",
               keys.client_key, keys.router_pub, keys.dir);
    fflush(stdout);
    up_print_status(listen_ep, n_prefill + n_decode);

    while (!up_stop) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (procs[i].pid != pid)
                continue;
            procs[i].pid = 0;
            fprintf(stderr, "baton up: %s exited (%s %d)\n", procs[i].name,
                    WIFSIGNALED(status) ? "signal" : "status",
                    WIFSIGNALED(status) ? WTERMSIG(status)
                                        : WEXITSTATUS(status));
            if (procs[i].role == 0) {
                up_stop = 1; /* no router, no cluster */
                ret = 1;
            }
        }
    }
    fprintf(stderr, "baton up: stopping\n");
    up_signal_role(procs, n, 3, SIGTERM);
    up_reap_role(procs, n, 3, 5000);
    up_signal_role(procs, n, 1, SIGTERM);
    up_signal_role(procs, n, 2, SIGTERM);
    up_reap_role(procs, n, 1, 15000);
    up_reap_role(procs, n, 2, 15000);
    up_signal_role(procs, n, 0, SIGTERM);
    up_reap_role(procs, n, 0, 5000);
    if (curve && log_dir == NULL) { /* the temp key directory goes too */
        const char *files[7] = { keys.router_key, keys.router_pub,
                                 keys.worker_key, keys.worker_pub,
                                 keys.client_key, keys.client_pub, NULL };
        char env[PATH_MAX];
        snprintf(env, sizeof(env), "%s/client.env", keys.dir);
        files[6] = env;
        for (int i = 0; i < 7; i++)
            unlink(files[i]);
        rmdir(keys.dir);
    }
    fprintf(stderr, "baton up: stopped\n");
    return ret;
}
