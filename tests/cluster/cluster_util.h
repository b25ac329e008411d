/*
 * cluster_util.h - helpers for multi-process cluster tests: free ports,
 * starting baton-router / baton-prefill / baton-decode from BT_BIN_DIR,
 * waiting for registration, loading golden.jsonl, and running many
 * requests concurrently through the client library.  Every process a
 * test starts is killed at exit, so nothing outlives a failed test.
 * Set BT_TEST_LOGS=1 to keep the processes' stderr.
 */
#ifndef BT_TESTS_CLUSTER_UTIL_H
#define BT_TESTS_CLUSTER_UTIL_H

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "client.h"

#define CU_MAX_PROCS 32
#define CU_MAX_IDS 1024

static pid_t cu_pids[CU_MAX_PROCS];
static int cu_n_pids;

static void cu_kill_all(void)
{
    for (int i = 0; i < cu_n_pids; i++)
        if (cu_pids[i] > 0) {
            kill(cu_pids[i], SIGKILL);
            waitpid(cu_pids[i], NULL, 0);
            cu_pids[i] = 0;
        }
}

static void cu_init(void)
{
    bt_log_init("test");
    atexit(cu_kill_all);
    signal(SIGPIPE, SIG_IGN);
}

/* Where test ports are picked: below the kernel's ephemeral range, so an
 * outgoing connection of a test running beside this one (ZeroMQ, UCX over
 * tcp) cannot take a port between the check here and the worker's bind. */
static void cu_port_span(int *lo_p, int *n_p)
{
    int eph_lo = 32768, eph_hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (f != NULL) {
        if (fscanf(f, "%d %d", &eph_lo, &eph_hi) != 2)
            eph_lo = 32768;
        fclose(f);
    }
    if (eph_lo >= 12000) { /* [10000, ephemeral low) */
        *lo_p = 10000;
        *n_p = eph_lo - 10000 - 2;
    } else { /* an unusual range: above it */
        *lo_p = eph_hi + 1;
        *n_p = 65535 - eph_hi - 2;
    }
    if (*n_p < 1000) { /* no room outside it: the old span */
        *lo_p = 20000;
        *n_p = 30000;
    }
}

/* A TCP port that was free a moment ago (and the next one too), and
 * neither was handed out before in this process: a test picks all its
 * ports before its processes bind them, so a repeat would make two of
 * them fight for one (a worker that cannot bind never registers, and
 * the test fails after its 30 s wait for it). */
static int cu_free_port(void)
{
    static int given[64];
    static int n_given;
    int lo, n;

    cu_port_span(&lo, &n);
    for (int tries = 0; tries < 100; tries++) {
        int port = lo + (int)((getpid() * 7919u + (unsigned)tries * 104729u +
                               (unsigned)bt_time_ns()) % (unsigned)n);
        int ok = 1;
        for (int i = 0; i < n_given && ok; i++)
            if (port >= given[i] - 1 && port <= given[i] + 1)
                ok = 0;
        for (int k = 0; k < 2 && ok; k++) {
            struct sockaddr_in a;
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            memset(&a, 0, sizeof(a));
            a.sin_family = AF_INET;
            a.sin_port = htons((uint16_t)(port + k));
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
                ok = 0;
            close(fd);
        }
        if (ok) {
            if (n_given < (int)(sizeof(given) / sizeof(given[0])))
                given[n_given++] = port;
            return port;
        }
    }
    BT_TEST_FAIL("no free port");
    return -1;
}

/* A router's two loopback addresses on a free port pair: the client
 * socket (listen) and the workers' control socket (control, port + 1). */
__attribute__((unused)) static void cu_router_addrs(char listen[64],
                                                  char control[64])
{
    int port = cu_free_port();

    snprintf(listen, 64, "tcp://127.0.0.1:%d", port);
    snprintf(control, 64, "tcp://127.0.0.1:%d", port + 1);
}

/* Starts BT_BIN_DIR/exe with argument list `ap`; its stderr goes to
 * `log` when not NULL, else to /dev/null (unless BT_TEST_LOGS is set). */
static pid_t cu_spawn_va(const char *log, const char *exe, va_list ap)
{
    char path[512];
    char *args[64];
    int n = 0;
    pid_t pid;

    snprintf(path, sizeof(path), "%s/%s", BT_BIN_DIR, exe);
    args[n++] = path;
    while (n < 63 && (args[n] = va_arg(ap, char *)) != NULL)
        n++;
    args[n] = NULL;
    pid = fork();
    if (pid == 0) {
        if (log != NULL || getenv("BT_TEST_LOGS") == NULL) {
            int fd = log != NULL
                         ? open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644)
                         : open("/dev/null", O_WRONLY);
            dup2(fd, 2);
            close(fd);
        }
        execv(path, args);
        _exit(127);
    }
    BT_CHECK(pid > 0 && cu_n_pids < CU_MAX_PROCS);
    cu_pids[cu_n_pids++] = pid;
    return pid;
}

/* Starts BT_BIN_DIR/exe with a NULL-terminated argument list. */
__attribute__((unused)) static pid_t cu_spawn(const char *exe, ...)
{
    va_list ap;
    pid_t pid;

    va_start(ap, exe);
    pid = cu_spawn_va(NULL, exe, ap);
    va_end(ap);
    return pid;
}

/* cu_spawn with the process's stderr written to the file `log`. */
__attribute__((unused)) static pid_t cu_spawn_log(const char *log,
                                                  const char *exe, ...)
{
    va_list ap;
    pid_t pid;

    va_start(ap, exe);
    pid = cu_spawn_va(log, exe, ap);
    va_end(ap);
    return pid;
}

__attribute__((unused)) static void cu_kill(pid_t pid, int sig)
{
    kill(pid, sig);
    if (sig == SIGKILL) {
        waitpid(pid, NULL, 0);
        for (int i = 0; i < cu_n_pids; i++)
            if (cu_pids[i] == pid)
                cu_pids[i] = 0;
    }
}

/* Waits for a process to exit by itself; returns its exit code or -1. */
__attribute__((unused)) static int cu_wait_exit(pid_t pid, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            for (int i = 0; i < cu_n_pids; i++)
                if (cu_pids[i] == pid)
                    cu_pids[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        usleep(10000);
    }
    return -1;
}

/* SIGTERMs a worker that logs to `log` and fails the test unless it exits
 * 0 with no "leak" in its log: every KV block and host allocation came
 * back.  `who` names it in the failure. */
__attribute__((unused)) static void cu_stop_no_leak(pid_t pid,
                                                    const char *log,
                                                    const char *who)
{
    char *text = NULL;
    size_t len;

    cu_kill(pid, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(pid, 10000), 0);
    BT_ASSERT_OK(bt_read_file(log, 1 << 24, &text, &len));
    if (strstr(text, "leak") != NULL)
        BT_TEST_FAIL("the %s reports a leak:\n%s", who, text);
    bt_free(text);
    unlink(log);
}

typedef struct {
    int n_workers;
    int n_prefill;
    int n_decode;
    long long free_kv; /* summed over decode workers (64 bits: a fuzzed
                          registration may claim INT_MAX blocks) */
    long long total_kv;
    int in_flight;
    int queued;
    int n_draining;  /* workers the router knows are draining */
    char names[16][64];
    uint64_t served[16];
} cu_status_t;

static int cu_status(client_t *c, cu_status_t *st)
{
    uint64_t rid;
    memset(st, 0, sizeof(*st));
    if (client_status_request(c, &rid) != BT_OK)
        return -1;
    for (;;) {
        Baton__ClientMessage *m = NULL;
        if (client_recv(c, 2000, &m) != BT_OK)
            return -1;
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
            m->status->client_request_id == rid) {
            for (size_t i = 0; i < m->status->n_workers; i++) {
                Baton__WorkerStatus *w = m->status->workers[i];
                if (i < 16) {
                    snprintf(st->names[i], 64, "%s", w->name);
                    st->served[i] = w->served;
                }
                st->n_workers++;
                st->n_draining += w->draining ? 1 : 0;
                if (w->role == 1)
                    st->n_prefill++;
                if (w->role == 2) {
                    st->n_decode++;
                    st->free_kv += w->free_kv_blocks;
                    st->total_kv += w->total_kv_blocks;
                }
            }
            st->in_flight = (int)m->status->in_flight;
            st->queued = (int)m->status->queued;
            proto_client_free(&m);
            return 0;
        }
        proto_client_free(&m);
    }
}

/* Waits until the router knows exactly n_prefill + n_decode workers. */
__attribute__((unused)) static void cu_wait_workers(client_t *c, int n_prefill, int n_decode,
                            int timeout_ms)
{
    cu_status_t st;
    for (int t = 0; t < timeout_ms; t += 50) {
        if (cu_status(c, &st) == 0 && st.n_prefill == n_prefill &&
            st.n_decode == n_decode)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("workers did not register (%d prefill, %d decode wanted)",
                 n_prefill, n_decode);
}

/* Waits until the router knows at least n of the n_before registered
 * workers are draining or already gone (a SIGTERM reaches the router as a
 * message: requests sent before it may still go to the draining worker;
 * a worker with nothing left to stream drains at once and deregisters,
 * maybe before a status poll sees it draining). */
__attribute__((unused)) static void cu_wait_draining(client_t *c, int n,
                                                     int n_before,
                                                     int timeout_ms)
{
    cu_status_t st;
    memset(&st, 0, sizeof(st));
    for (int t = 0; t < timeout_ms; t += 10) {
        if (cu_status(c, &st) == 0 &&
            st.n_draining + (n_before - st.n_workers) >= n)
            return;
        usleep(10000);
    }
    BT_TEST_FAIL("the router saw %d draining workers and %d of %d gone, "
                 "%d wanted", st.n_draining, n_before - st.n_workers,
                 n_before, n);
}

/* Waits until every decode worker reports all its KV blocks free. */
__attribute__((unused)) static void cu_wait_kv_idle(client_t *c, int timeout_ms)
{
    cu_status_t st;
    for (int t = 0; t < timeout_ms; t += 50) {
        if (cu_status(c, &st) == 0 && st.total_kv > 0 &&
            st.free_kv == st.total_kv)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("KV blocks did not return to idle: %lld of %lld free",
                 st.free_kv, st.total_kv);
}

typedef struct {
    int prompt[CU_MAX_IDS];
    int n_prompt;
    int expect[CU_MAX_IDS];
    int n_expect;
    int max_tokens;
} cu_golden_t;

/* Loads golden.jsonl lines for `model` (e.g. "aidreams260K.bin"). */
__attribute__((unused)) static int cu_golden_load(const char *model, cu_golden_t *out, int max)
{
    char path[512];
    char *data = NULL, *line, *save = NULL;
    size_t len;
    int n = 0;

    snprintf(path, sizeof(path), "%s/models/golden.jsonl", BT_SHARED_DIR);
    BT_ASSERT_OK(bt_read_file(path, 1 << 24, &data, &len));
    for (line = strtok_r(data, "\n", &save); line && n < max;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *m, *p, *g, *s;
        if (j == NULL)
            continue;
        m = cJSON_GetObjectItem(j, "model");
        p = cJSON_GetObjectItem(j, "prompt_ids");
        g = cJSON_GetObjectItem(j, "greedy_ids");
        s = cJSON_GetObjectItem(j, "steps");
        if (cJSON_IsString(m) && strcmp(m->valuestring, model) == 0 && p &&
            g && s) {
            cu_golden_t *e = &out[n++];
            e->n_prompt = 0;
            e->n_expect = 0;
            for (cJSON *x = p->child; x && e->n_prompt < CU_MAX_IDS; x = x->next)
                e->prompt[e->n_prompt++] = x->valueint;
            for (cJSON *x = g->child; x && e->n_expect < CU_MAX_IDS; x = x->next)
                e->expect[e->n_expect++] = x->valueint;
            e->max_tokens = s->valueint - e->n_prompt + 1;
        }
        cJSON_Delete(j);
    }
    bt_free(data);
    return n;
}

typedef struct {
    uint64_t rid;
    int ids[CU_MAX_IDS];
    int n_ids;
    int next_index;  /* chunks must arrive in order without gaps */
    int finished;    /* 1 finished, 2 error */
    int finish_reason;
    int error_code;
    int retries;
    int preemptions;
    uint64_t ttft_us;
} cu_result_t;

/* Applies one client message to the result it belongs to (if any of
 * `res`, not yet finished): a chunk's ids (in order, without gaps), the
 * finish or the error.  Returns 1 when it finished that result. */
__attribute__((unused)) static int cu_apply(cu_result_t *res, int n,
                                            const Baton__ClientMessage *m)
{
    uint64_t rid = client_msg_request_id(m);
    cu_result_t *r = NULL;

    for (int i = 0; i < n; i++)
        if (res[i].rid == rid)
            r = &res[i];
    if (r == NULL || r->finished)
        return 0;
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
        if ((int)m->chunk->index != r->next_index)
            BT_TEST_FAIL("request %llu: chunk index %u, expected %d",
                         (unsigned long long)rid, m->chunk->index,
                         r->next_index);
        for (size_t k = 0; k < m->chunk->n_ids && r->n_ids < CU_MAX_IDS; k++)
            r->ids[r->n_ids++] = m->chunk->ids[k];
        r->next_index += (int)m->chunk->n_ids;
    } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
        r->finished = 1;
        r->finish_reason = m->finished->reason;
        if (m->finished->timings) {
            r->retries = (int)m->finished->timings->retries;
            r->preemptions = (int)m->finished->timings->preemptions;
            r->ttft_us = m->finished->timings->ttft_us;
        }
        return 1;
    } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
        r->finished = 2;
        r->error_code = m->error->code;
        fprintf(stderr, "request %llu error %s: %s\n",
                (unsigned long long)rid, client_error_name(m->error->code),
                m->error->message ? m->error->message : "");
        return 1;
    }
    return 0;
}

/* Receives until every result in `res` finished or timeout. */
__attribute__((unused)) static void cu_collect(client_t *c, cu_result_t *res,
                                              int n, int timeout_ms)
{
    uint64_t until = bt_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    int done = 0;

    for (int i = 0; i < n; i++)
        done += res[i].finished != 0;
    while (done < n) {
        Baton__ClientMessage *m = NULL;
        if (bt_time_ns() > until)
            BT_TEST_FAIL("%d of %d requests unfinished after %d ms", n - done,
                         n, timeout_ms);
        if (client_recv(c, 100, &m) != BT_OK)
            continue;
        done += cu_apply(res, n, m);
        proto_client_free(&m);
    }
}

/* Receives (cu_apply) until at least `need` of the n results hold
 * min_ids ids, e.g. before a worker is killed mid-stream.  Fails with
 * `what` when 10 s pass without a message.  Finishes and errors are kept
 * for cu_collect (a stream that ends here is not lost to it). */
__attribute__((unused)) static void cu_stream_until(client_t *c,
                                                   cu_result_t *res, int n,
                                                   int min_ids, int need,
                                                   const char *what)
{
    for (;;) {
        Baton__ClientMessage *m = NULL;
        int got = 0;
        if (client_recv(c, 10000, &m) != BT_OK)
            BT_TEST_FAIL("%s", what);
        cu_apply(res, n, m);
        proto_client_free(&m);
        for (int i = 0; i < n; i++)
            got += res[i].n_ids >= min_ids;
        if (got >= need)
            return;
    }
}

/* req as a greedy request of max_tokens tokens with no prompt yet (stop
 * at id 1 only; ids back, no text). */
__attribute__((unused)) static void cu_greedy_request(client_request_t *req,
                                                      int max_tokens)
{
    static const int stop1[] = { 1 };

    client_request_init(req);
    req->max_tokens = max_tokens;
    req->ignore_eos = true;
    req->stop_ids = stop1;
    req->n_stop_ids = 1;
    req->want_text = false;
}

/* req as a greedy request (cu_greedy_request) for prompt ids[0..n). */
__attribute__((unused)) static void cu_ids_request(client_request_t *req,
                                                   const int *ids, int n,
                                                   int max_tokens)
{
    cu_greedy_request(req, max_tokens);
    req->prompt_ids = ids;
    req->n_prompt_ids = n;
}

/* req as a greedy request (cu_greedy_request) for the text prompt
 * `text`, which the router or the prefill worker tokenizes. */
__attribute__((unused)) static void cu_text_request(client_request_t *req,
                                                    const char *text,
                                                    int max_tokens)
{
    cu_greedy_request(req, max_tokens);
    req->prompt = text;
}

/* req sampled (temperature 0.9, top-k 40) with `seed`: a seeded stream
 * the tests compare token for token across cache on/off and failover. */
__attribute__((unused)) static void cu_request_sampled(client_request_t *req,
                                                       uint64_t seed)
{
    req->temperature = 0.9f;
    req->top_k = 40;
    req->seed = seed;
}

/* req as golden line g's greedy request (stop at id 1 only). */
__attribute__((unused)) static void cu_golden_request(client_request_t *req,
                                                      const cu_golden_t *g)
{
    cu_ids_request(req, g->prompt, g->n_prompt, g->max_tokens);
}

/* Submits req and waits (30 s) until it finished; res holds its ids. */
__attribute__((unused)) static void cu_run_request(client_t *c,
                                                   const client_request_t *req,
                                                   cu_result_t *res)
{
    memset(res, 0, sizeof(*res));
    BT_ASSERT_OK(client_submit(c, req, &res->rid));
    cu_collect(c, res, 1, 30000);
    BT_ASSERT_EQ(res->finished, 1);
}

/* Requests the router gave worker `name` so far (an aggregated worker
 * that prefills its own request counts it twice). */
__attribute__((unused)) static uint64_t cu_served(client_t *c,
                                                  const char *name)
{
    cu_status_t st;

    BT_ASSERT_EQ(cu_status(c, &st), 0);
    for (int i = 0; i < st.n_workers && i < 16; i++)
        if (strcmp(st.names[i], name) == 0)
            return st.served[i];
    BT_TEST_FAIL("worker %s is not registered", name);
    return 0;
}

/* Whether the file at `path` (a worker's log, at most 16 MiB) holds
 * `needle` now; false when it cannot be read. */
__attribute__((unused)) static bool cu_file_has(const char *path,
                                                const char *needle)
{
    char *text = NULL;
    size_t len = 0;
    bool has;

    if (bt_read_file(path, 1 << 24, &text, &len) != BT_OK) {
        bt_error_clear();
        return false;
    }
    has = strstr(text, needle) != NULL;
    bt_free(text);
    return has;
}

/* Lines of the file at `path` holding `needle` (0 without the file). */
__attribute__((unused)) static int cu_count_lines(const char *path,
                                                  const char *needle)
{
    char line[2048];
    int n = 0;
    FILE *f = fopen(path, "r");

    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Runs the shell command `cmd` (a `baton run ... --ids`, the reference a
 * test compares with) and reads the ids it prints into out (at most cap);
 * fails the test when it does not exit 0.  Returns how many. */
__attribute__((unused)) static int cu_popen_ids(const char *cmd, int *out,
                                                int cap)
{
    FILE *f;
    int n = 0;

    f = popen(cmd, "r");
    BT_CHECK(f != NULL);
    while (n < cap && fscanf(f, "%d", &out[n]) == 1)
        n++;
    BT_ASSERT_EQ(pclose(f), 0);
    return n;
}

/* `baton run` (cpu, one thread) of golden prompt g with the extra
 * options `opts` (e.g. "--precision fp8"), stopping as cu_golden_request's
 * requests do; its greedy ids into out (at most cap).  Returns how many. */
__attribute__((unused)) static int cu_baton_run_golden(const char *model,
                                                       const char *opts,
                                                       const cu_golden_t *g,
                                                       int *out, int cap)
{
    char cmd[8192], *p = cmd;

    p += snprintf(p, sizeof(cmd), "%s/baton run --model %s %s --threads 1 "
                  "--device cpu --ids --ignore-eos --stop-id 1 --max-tokens "
                  "%d --prompt-ids '", BT_BIN_DIR, model, opts,
                  g->max_tokens);
    for (int i = 0; i < g->n_prompt; i++)
        p += snprintf(p, sizeof(cmd) - (size_t)(p - cmd), "%s%d",
                      i ? " " : "", g->prompt[i]);
    snprintf(p, sizeof(cmd) - (size_t)(p - cmd), "'");
    return cu_popen_ids(cmd, out, cap);
}

/* The ids `baton run` samples for golden prompt g of aidreams260K at
 * temperature 0.9, top-p 0.95, seed `seed`, at most max_tokens: the
 * reference of a seeded request in the cluster.  Returns how many. */
__attribute__((unused)) static int cu_baton_run_sampled(const cu_golden_t *g,
                                                        uint64_t seed,
                                                        int max_tokens,
                                                        int *ids)
{
    char cmd[8192], *p = cmd;

    p += snprintf(p, sizeof(cmd), "%s/baton run --model %s/models/"
                  "aidreams260K.bin --threads 1 --temperature 0.9 "
                  "--top-p 0.95 --seed %llu --max-tokens %d --ids "
                  "--prompt-ids '", BT_BIN_DIR, BT_SHARED_DIR,
                  (unsigned long long)seed, max_tokens);
    for (int i = 0; i < g->n_prompt; i++)
        p += snprintf(p, (size_t)(cmd + sizeof(cmd) - p), "%d ",
                      g->prompt[i]);
    snprintf(p, (size_t)(cmd + sizeof(cmd) - p), "'");
    return cu_popen_ids(cmd, ids, CU_MAX_IDS);
}

/* Submits golden line g as a greedy request (stop at id 1 only). */
__attribute__((unused)) static uint64_t cu_submit_golden(client_t *c, const cu_golden_t *g)
{
    client_request_t req;
    uint64_t rid;

    cu_golden_request(&req, g);
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

__attribute__((unused)) static void cu_check_golden(const cu_result_t *r, const cu_golden_t *g,
                            int which)
{
    if (r->finished != 1)
        BT_TEST_FAIL("request %d did not finish (state %d)", which,
                     r->finished);
    if (r->n_ids != g->n_expect)
        BT_TEST_FAIL("request %d: %d ids, golden has %d", which, r->n_ids,
                     g->n_expect);
    for (int k = 0; k < g->n_expect; k++)
        if (r->ids[k] != g->expect[k])
            BT_TEST_FAIL("request %d: id %d is %d, golden %d", which, k,
                         r->ids[k], g->expect[k]);
}

/* Each of the n results finished with the ids of want[i] (baton run's,
 * n_want[i] of them); `what` names the requests in a failure. */
__attribute__((unused)) static void cu_check_baton_run(const cu_result_t *res,
                                                      int n,
                                                      int want[][CU_MAX_IDS],
                                                      const int *n_want,
                                                      const char *what)
{
    for (int i = 0; i < n; i++) {
        BT_ASSERT_EQ(res[i].finished, 1);
        BT_ASSERT_EQ(res[i].n_ids, n_want[i]);
        for (int k = 0; k < n_want[i]; k++)
            if (res[i].ids[k] != want[i][k])
                BT_TEST_FAIL("%s request %d: id %d is %d, baton run %d",
                             what, i, k, res[i].ids[k], want[i][k]);
    }
}

#endif /* BT_TESTS_CLUSTER_UTIL_H */
