/*
 * test_cuda_ipc_window.c - the CUDA IPC link's per-reservation windows on
 * a GPU (issue 42 item 3; worker/kv/kv_transport_cuda_ipc.h "Windows",
 * kv_link_cuda_ipc.c, kv_fd_channel.h, backend_kv_copy_in).  This process
 * is the decode worker (a cuda backend on stories260K and the real link
 * receiver: kv_link_receiver_arm / _arrived / _reset); a second process,
 * this binary run again as `writer`, is the prefill side (the transport:
 * kv_cipc_connect, kv_cipc_window_open, puts, commits) driven over a pipe.
 *
 *   1. hand-off: a grant's window is fetched by token, written, committed
 *      and copied into the reservation's scattered blocks: byte-exact.
 *   2. stale writer: A's window is fetched and written, then A ends
 *      without KvReady: the reset reports the window revoked (counted);
 *      a token of an ended reservation gets no FD; B is granted the SAME
 *      blocks, its writer writes B, and the stale writer, still holding
 *      A's mapping, writes garbage before and after B's copy-in: B is
 *      byte-exact and no other block changed.
 *   3. control, --kv-direct-writes (the whole pool exported once): the
 *      same stale writer, holding the pool mapping, overwrites B's blocks
 *      after B landed: B is corrupted (the test sees the attack windows
 *      guard against).
 *   1b. a window made ahead (kv_window_pool.h) for a larger class than
 *      its grant: 3 blocks in a 4-block allocation, the epoch word where
 *      3 blocks put it and the writer mapping only that much: byte-exact;
 *      backend_kv_copy_in, left in flight, says done exactly once.
 *   4. cost (printed, not checked): a 2048-token Llama-3-8B-shaped window
 *      (32 layers, 8 KV heads, head_dim 128, bf16: 256 MiB) created and
 *      destroyed on the caller's (the decode loop's) thread: the first of
 *      its class made there (cuMemCreate + map + export + offer), the
 *      next ones made ahead by the window pool's thread (checked: they
 *      are), so the loop only arms them (token, epoch word, export,
 *      offer); destroy revokes and leaves the release to that thread.
 *      And a 256 MiB device-to-device copy out of it in 128-block runs.
 * Prints PASS/FAIL lines; exits non-zero on any failure.
 *
 * First run (H100, plain and under MPS): steps 1 and 2 up to A2 passed;
 * B's step and the plain control failed with the writer answering "ERR "
 * and no text.  Cause: the writer's commit poll stopped at the first
 * BT_IN_PROGRESS (its loop required st == BT_OK to go on), so a commit
 * still in flight at the first cudaEventQuery was answered ERR without
 * any message -- timing-dependent, hence MPS passing the control.  The
 * copies did land (kv_cipc_commit_destroy waits), but the test's chained
 * && skipped B's copy-in and the control's corruption check.  Now the
 * writer polls to completion (5 s, then a TIMEOUT with text), syncs the
 * device before it answers, every failing path records its text (the
 * answer is "ERR <status>: <text>", CUDA calls named with their
 * cudaError / CUresult name), and each step of B and the control is a
 * check of its own.
 *
 * Build here and pack (repository root, after building build-cuda):
 *   cmake --build build-cuda -j2 --target gpu_test_cuda_ipc_window
 *   bash tests/gpu/pack_carry.sh cipcwin tests/gpu/run_cuda_ipc_window.sh \
 *       gpu/test_cuda_ipc_window shared
 * Run on the device machine:
 *   run(carry=[".carry"], command="bash .carry/call.sh")
 * (tests/gpu/run_cuda_ipc_window.sh BUILD runs BUILD/gpu/test_cuda_ipc_window
 * with BT_SHARED_DIR=BUILD/shared and the carried libraries; by hand:
 *   BT_SHARED_DIR=build-cipcwin/shared LD_LIBRARY_PATH=build-cipcwin/lib \
 *       build-cipcwin/gpu/test_cuda_ipc_window
 * --writer-gpu 1 puts the writer on a second GPU: cuda-ipc(p2p).)
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_golden.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_link.h"
#include "kv/kv_transport_cuda_ipc.h"

#define POOL 64
#define BS 8
#define MAX_WIN 64
#define LINE_MAX_BYTES 8192

static int g_fail;

static void report(bool ok, const char *what)
{
    printf("%s cuda ipc window: %s\n", ok ? "PASS" : "FAIL", what);
    fflush(stdout);
    g_fail += !ok;
}

/* Byte b of source block i of layer l, K (kv 0) or V, for seed s. */
static uint8_t pattern(int s, int l, int kv, int i, size_t b)
{
    return (uint8_t)(s * 71 + l * 37 + kv * 101 + i * 13 +
                     (int)(b * 7 % 251) + 1);
}

static void hex_put(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static size_t hex_get(const char *s, uint8_t *out, size_t cap)
{
    size_t n = strlen(s) / 2;

    if (n > cap)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return 0;
        out[i] = (uint8_t)v;
    }
    return n;
}

// ---------------------------------------------------------------------------
// The writer (prefill side), commands on stdin, one answer line each:
//   OPEN k DESCHEX GRANTHEX n   window k of the grant
//   PUT k SEED EPOCH            pattern SEED into window k, commit EPOCH
//   POOL DESCHEX SEED SLOT EPOCH n ID...   the whole pool (control)
//   CLOSE k                     drop window k's mapping
//   QUIT
// The answer is "OK" or "ERR <status>: <what failed>"; every failing path
// records its text (writer_fail or the library's BT_ERROR), and an answer
// comes only after the command's copies have completed on the device (the
// commit's event, then cudaDeviceSynchronize), so the decode side checks
// memory the writer is done with.

typedef struct {
    kv_cipc_t *cipc;
    kv_cipc_peer_t *win[8];
    int win_n[8];
    kv_layout_t src_lay;        /* the source pool: MAX_WIN blocks */
    char *d_k, *d_v;            /* (n_layers, MAX_WIN, block) each */
} writer_t;

/* Records why a writer command failed (the answer's text) and returns
 * `st`. */
static bt_status_t writer_fail(bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static bt_status_t writer_fail(bt_status_t st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return BT_ERROR(st, "TEST", "writer: %s", msg);
}

/* A CUDA runtime result as a writer status (named). */
static bt_status_t writer_cuda(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return BT_OK;
    (void)cudaGetLastError();
    return writer_fail(BT_ERR_CUDA, "%s failed: %s (%s)", what,
                       cudaGetErrorName(err), cudaGetErrorString(err));
}

/* The source pool, shaped after the first descriptor's layout (once). */
static bt_status_t writer_source(writer_t *w, kv_cipc_peer_t *pool)
{
    size_t bytes;
    bt_status_t st;

    if (w->d_k != NULL)
        return BT_OK;
    w->src_lay = kv_cipc_peer_desc(pool)->layout;
    w->src_lay.n_blocks = MAX_WIN;
    bytes = kv_layout_layer_bytes(&w->src_lay) * w->src_lay.n_layers;
    st = writer_cuda(cudaMalloc((void **)&w->d_k, bytes),
                     "cudaMalloc(source K)");
    if (st == BT_OK)
        st = writer_cuda(cudaMalloc((void **)&w->d_v, bytes),
                         "cudaMalloc(source V)");
    if (st != BT_OK) {
        cudaFree(w->d_k);
        cudaFree(w->d_v);
        w->d_k = w->d_v = NULL;
    }
    return st;
}

/* Fills the source with seed's pattern for blocks 0..n-1. */
static bt_status_t writer_fill(writer_t *w, int seed, int n)
{
    size_t bb = kv_layout_block_bytes(&w->src_lay);
    uint8_t *h;
    bt_status_t st = BT_OK;

    if (w->d_k == NULL || n < 1 || n > MAX_WIN)
        return writer_fail(BT_ERR_INVALID_ARG, "fill of %d blocks without "
                           "a source pool", n);
    h = malloc(bb * (size_t)n);
    if (h == NULL)
        return writer_fail(BT_ERR_NO_MEMORY, "fill: no host memory");
    for (int l = 0; l < (int)w->src_lay.n_layers && st == BT_OK; l++)
        for (int kv = 0; kv < 2 && st == BT_OK; kv++) {
            for (int i = 0; i < n; i++)
                for (size_t b = 0; b < bb; b++)
                    h[(size_t)i * bb + b] = pattern(seed, l, kv, i, b);
            st = writer_cuda(
                cudaMemcpy((kv ? w->d_v : w->d_k) +
                               (size_t)l * kv_layout_layer_bytes(&w->src_lay),
                           h, bb * (size_t)n, cudaMemcpyHostToDevice),
                "fill: cudaMemcpy(host to source)");
        }
    free(h);
    return st;
}

/* Puts blocks 0..n-1 of the source into `dst` ids of `peer`, commits and
 * waits for the commit (then for the whole device: the stale writer's
 * garbage is in memory before the decode side looks). */
static bt_status_t writer_put(writer_t *w, kv_cipc_peer_t *peer,
                              const int *dst, int n, int slot,
                              uint64_t epoch)
{
    int src[MAX_WIN];
    kv_cipc_commit_t *c = NULL;
    uint64_t until = bt_time_ns() + 5000000000ull;
    bt_status_t st = BT_OK;

    for (int i = 0; i < n; i++)
        src[i] = i;
    for (int l = 0; l < (int)w->src_lay.n_layers && st == BT_OK; l++) {
        size_t off = (size_t)l * kv_layout_layer_bytes(&w->src_lay);
        st = kv_cipc_put_layer(peer, l, w->d_k + off, w->d_v + off,
                               &w->src_lay, src, dst, n);
    }
    if (st == BT_OK)
        st = kv_cipc_commit(peer, slot, epoch, &c);
    /* BT_IN_PROGRESS until the event completes: poll it (an earlier
     * version stopped at the first BT_IN_PROGRESS and answered ERR with
     * no text whenever the copies were still in flight) */
    while (st == BT_OK) {
        st = kv_cipc_commit_query(c);
        if (st != BT_IN_PROGRESS)
            break;
        if (bt_time_ns() >= until) {
            st = writer_fail(BT_ERR_TIMEOUT, "commit of epoch %llu not "
                             "complete after 5 s",
                             (unsigned long long)epoch);
            break;
        }
        usleep(100);
        st = BT_OK;
    }
    kv_cipc_commit_destroy(&c);
    if (st == BT_OK)
        st = writer_cuda(cudaDeviceSynchronize(),
                         "cudaDeviceSynchronize after the commit");
    return st;
}

/* One command; BT_OK or a failure whose text is recorded. */
static bt_status_t writer_cmd(writer_t *w, const char *line)
{
    static char a[LINE_MAX_BYTES / 2];
    char cmd[16], b[128];
    uint8_t desc[1024], grant[64];
    int k = 0, n = 0, seed = 0, slot = 0, off = 0;
    unsigned long long epoch = 0;
    bt_status_t st;

    if (sscanf(line, "%15s", cmd) != 1)
        return writer_fail(BT_ERR_INVALID_ARG, "empty command");
    if (strcmp(cmd, "OPEN") == 0) {
        kv_cipc_peer_t *pool = NULL;
        size_t dl, gl;

        if (sscanf(line, "%*s %d %4095s %127s %d", &k, a, b, &n) != 4 ||
            k < 0 || k >= 8)
            return writer_fail(BT_ERR_INVALID_ARG, "bad OPEN command");
        if (w->win[k] != NULL)
            return writer_fail(BT_ERR_INVALID_ARG, "OPEN %d: window %d is "
                               "open", k, k);
        dl = hex_get(a, desc, sizeof(desc));
        gl = hex_get(b, grant, sizeof(grant));
        st = kv_cipc_connect(w->cipc, desc, dl, &pool);
        if (st == BT_OK)
            st = writer_source(w, pool);
        if (st == BT_OK)
            st = kv_cipc_window_open(pool, grant, gl, n, &w->win[k]);
        if (st == BT_OK)
            w->win_n[k] = n;
        kv_cipc_release(&pool);
        return st;
    }
    if (strcmp(cmd, "PUT") == 0) {
        int ids[MAX_WIN];

        if (sscanf(line, "%*s %d %d %llu", &k, &seed, &epoch) != 3 ||
            k < 0 || k >= 8)
            return writer_fail(BT_ERR_INVALID_ARG, "bad PUT command");
        if (w->win[k] == NULL)
            return writer_fail(BT_ERR_INVALID_ARG, "PUT %d: window %d is "
                               "not open", k, k);
        for (int i = 0; i < w->win_n[k]; i++)
            ids[i] = i;
        st = writer_fill(w, seed, w->win_n[k]);
        if (st == BT_OK)
            st = writer_put(w, w->win[k], ids, w->win_n[k], 0, epoch);
        return st;
    }
    if (strcmp(cmd, "POOL") == 0) {
        int ids[MAX_WIN], used = 0, pos;
        kv_cipc_peer_t *pool = NULL;
        size_t dl;

        if (sscanf(line, "%*s %4095s %d %d %llu %d%n", a, &seed, &slot,
                   &epoch, &n, &off) != 5 ||
            n < 1 || n > MAX_WIN)
            return writer_fail(BT_ERR_INVALID_ARG, "bad POOL command");
        pos = off;
        for (int i = 0; i < n; i++, pos += used)
            if (sscanf(line + pos, "%d%n", &ids[i], &used) != 1)
                return writer_fail(BT_ERR_INVALID_ARG, "POOL: %d block "
                                   "ids expected", n);
        dl = hex_get(a, desc, sizeof(desc));
        st = kv_cipc_connect(w->cipc, desc, dl, &pool);
        if (st == BT_OK)
            st = writer_source(w, pool);
        if (st == BT_OK)
            st = writer_fill(w, seed, n);
        if (st == BT_OK)
            st = writer_put(w, pool, ids, n, slot, epoch);
        kv_cipc_release(&pool);
        return st;
    }
    if (strcmp(cmd, "CLOSE") == 0) {
        if (sscanf(line, "%*s %d", &k) != 1 || k < 0 || k >= 8)
            return writer_fail(BT_ERR_INVALID_ARG, "bad CLOSE command");
        kv_cipc_window_close(&w->win[k]);
        return BT_OK;
    }
    return writer_fail(BT_ERR_INVALID_ARG, "unknown command %s", cmd);
}

static int writer_main(int gpu)
{
    static char line[LINE_MAX_BYTES];
    writer_t w;

    memset(&w, 0, sizeof(w));
    if (kv_cipc_create_on(gpu, &w.cipc) != BT_OK)
        return 2;
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char cmd[16];
        bt_status_t st;

        if (strchr(line, '\n') == NULL && !feof(stdin)) {
            printf("ERR %s: command longer than %d bytes\n",
                   bt_status_str(BT_ERR_INVALID_ARG), LINE_MAX_BYTES - 1);
            fflush(stdout);
            break; /* the rest of the line would read as a command */
        }
        if (sscanf(line, "%15s", cmd) == 1 && strcmp(cmd, "QUIT") == 0)
            break;
        bt_error_clear();
        st = writer_cmd(&w, line);
        if (st == BT_OK)
            printf("OK\n");
        else
            printf("ERR %s: %s\n", bt_status_str(st),
                   bt_error_last()[0] != '\0'
                       ? bt_error_last()
                       : "(no text recorded: a failure path without "
                         "BT_ERROR)");
        fflush(stdout);
    }
    for (int k = 0; k < 8; k++)
        kv_cipc_window_close(&w.win[k]);
    cudaFree(w.d_k);
    cudaFree(w.d_v);
    kv_cipc_destroy(&w.cipc);
    return 0;
}

// ---------------------------------------------------------------------------
// The decode side

typedef struct {
    pid_t pid;
    FILE *to;     /* the writer's stdin */
    int from;     /* its stdout */
} child_t;

/* The writer's GPU (--writer-gpu; 0: the decode side's). */
static int writer_gpu;

static void child_start(child_t *c, const char *self)
{
    char gpu[16];
    int in[2], out[2];

    snprintf(gpu, sizeof(gpu), "%d", writer_gpu);

    BT_CHECK(pipe(in) == 0 && pipe(out) == 0);
    c->pid = fork();
    BT_CHECK(c->pid >= 0);
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(self, self, "writer", gpu, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->to = fdopen(in[1], "w");
    c->from = out[0];
}

/* Sends one command; true when the writer answered OK within 20 s (it
 * answers after its copies completed).  Anything else is printed with
 * the command: the writer's "ERR <status>: <text>", no answer, or EOF. */
static bool child_cmd(child_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static bool child_cmd(child_t *c, const char *fmt, ...)
{
    char line[2048], cmd[48];
    size_t got = 0;
    uint64_t until = bt_time_ns() + 20000000000ull;
    va_list ap;

    va_start(ap, fmt);
    vfprintf(c->to, fmt, ap);
    va_end(ap);
    fputc('\n', c->to);
    fflush(c->to);
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap); /* its head, for the report */
    va_end(ap);
    for (;;) {
        struct pollfd p = { .fd = c->from, .events = POLLIN };
        uint64_t now = bt_time_ns();
        ssize_t n;
        char ch;
        if (now >= until ||
            poll(&p, 1, (int)((until - now) / 1000000)) <= 0) {
            fprintf(stderr, "writer: no answer to \"%s...\" in 20 s\n", cmd);
            return false;
        }
        n = read(c->from, &ch, 1);
        if (n <= 0) {
            fprintf(stderr, "writer: gone (EOF) during \"%s...\"\n", cmd);
            return false;
        }
        if (ch == '\n')
            break;
        if (got + 1 < sizeof(line)) /* a longer answer is cut, read whole */
            line[got++] = ch;
    }
    line[got] = '\0';
    if (strcmp(line, "OK") != 0)
        fprintf(stderr, "writer: \"%s...\": %s\n", cmd,
                line[0] != '\0' ? line : "(empty answer)");
    return strcmp(line, "OK") == 0;
}

static void child_stop(child_t *c)
{
    int st;
    uint64_t until = bt_time_ns() + 5000000000ull;

    fprintf(c->to, "QUIT\n");
    fclose(c->to);
    close(c->from);
    while (waitpid(c->pid, &st, WNOHANG) == 0) {
        if (bt_time_ns() > until) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            break;
        }
        usleep(1000);
    }
}

/* Every block of the pool, to host (layer 0 K, layer 0 V, ...). */
static uint8_t *pool_snapshot(backend_t *be)
{
    size_t hb = backend_kv_host_block_bytes(be);
    uint8_t *h = malloc(hb * POOL);
    void *ptrs[POOL];
    int ids[POOL];

    for (int i = 0; i < POOL; i++) {
        ids[i] = i;
        ptrs[i] = h + (size_t)i * hb;
    }
    BT_ASSERT_OK(backend_kv_save(be, POOL, ids, ptrs));
    return h;
}

/* blocks[i] hold seed's source block i; the others equal `before` (when
 * given). */
static bool pool_holds(backend_t *be, int seed, const int *blocks, int n,
                       const uint8_t *before)
{
    const kv_layout_t *lay = backend_kv_layout(be);
    size_t bb = kv_layout_block_bytes(lay), hb = backend_kv_host_block_bytes(be);
    uint8_t *now = pool_snapshot(be);
    bool ok = true;

    for (int blk = 0; blk < POOL && ok; blk++) {
        int i = -1;
        for (int k = 0; k < n; k++)
            if (blocks[k] == blk)
                i = k;
        if (i < 0) {
            if (before != NULL)
                ok = memcmp(now + (size_t)blk * hb,
                            before + (size_t)blk * hb, hb) == 0;
            continue;
        }
        for (int l = 0; l < (int)lay->n_layers && ok; l++)
            for (int kv = 0; kv < 2 && ok; kv++)
                for (size_t b = 0; b < bb && ok; b++)
                    ok = now[(size_t)blk * hb + (2 * (size_t)l + kv) * bb +
                             b] == pattern(seed, l, kv, i, b);
    }
    free(now);
    return ok;
}

static const uint8_t *cipc_endpoint(kv_link_receiver_t *rcv, size_t *len_p)
{
    kv_link_endpoint_t eps[8];
    int n = kv_link_receiver_endpoints(rcv, eps, 8);

    for (int i = 0; i < n; i++)
        if (eps[i].transport == KV_LINK_CUDA_IPC) {
            *len_p = eps[i].len;
            return eps[i].desc;
        }
    return NULL;
}

static kv_link_receiver_t *receiver(backend_t *be, bool direct)
{
    kv_link_recv_config_t rc = {
        .use_cuda_ipc = true, .n_slots = 4, .quarantine_ms = 2000,
        .kv_direct_writes = direct, .device_index = 0,
    };
    kv_link_receiver_t *rcv = NULL;

    BT_ASSERT_OK(kv_link_receiver_create(&rc, &rcv));
    BT_ASSERT_OK(kv_link_receiver_attach(rcv, be, true, POOL * BS));
    return rcv;
}

/* Arms slot `slot` for `blocks`; the grant's window as hex into `hex`. */
static bool grant(kv_link_receiver_t *rcv, int slot, uint64_t epoch,
                  const int *blocks, int n, char *hex)
{
    kv_link_grant_t g = { .request_id = epoch, .slot = slot, .epoch = epoch,
                          .blocks = blocks, .n = n };

    if (kv_link_receiver_arm(rcv, &g) != BT_OK ||
        g.cipc_window_len != KV_CIPC_GRANT_BYTES)
        return false;
    hex_put(g.cipc_window, g.cipc_window_len, hex);
    return true;
}

static bool arrived(kv_link_receiver_t *rcv, int slot, uint64_t epoch)
{
    const char *why = NULL;
    bt_status_t st = kv_link_receiver_arrived(rcv, KV_LINK_CUDA_IPC, slot,
                                              epoch, &why);

    if (st != BT_OK)
        fprintf(stderr, "receiver: slot %d epoch %llu not arrived: %s (%s)\n",
                slot, (unsigned long long)epoch, bt_status_str(st),
                why != NULL ? why : "");
    return st == BT_OK;
}

static void test_windows(backend_t *be, const char *self)
{
    kv_link_receiver_t *rcv = receiver(be, false);
    static char dhex[4096];
    char ga[64], ga2[64], gb[64], gh[64];
    const int h_blocks[4] = { 5, 6, 7, 30 };
    const int ab_blocks[4] = { 40, 41, 42, 43 };
    size_t dlen = 0;
    const uint8_t *desc = cipc_endpoint(rcv, &dlen);
    int revoked = 0;
    uint8_t *before;
    child_t c;
    bool ok;

    report(desc != NULL && kv_link_receiver_pool_exposed(rcv) == false,
           "windowed receiver starts, pool not exposed");
    if (desc == NULL) {
        kv_link_receiver_destroy(&rcv);
        return;
    }
    hex_put(desc, dlen, dhex);
    child_start(&c, self);

    /* 1. a hand-off */
    report(grant(rcv, 0, 11, h_blocks, 4, gh) &&
               child_cmd(&c, "OPEN 0 %s %s 4", dhex, gh) &&
               child_cmd(&c, "PUT 0 1 11") && child_cmd(&c, "CLOSE 0") &&
               arrived(rcv, 0, 11) && pool_holds(be, 1, h_blocks, 4, NULL),
           "hand-off through a window is byte-exact");
    report(!kv_link_receiver_reset(rcv, 0, false),
           "a landed window is not counted revoked");

    /* 2. the stale writer */
    before = pool_snapshot(be);
    report(grant(rcv, 1, 21, ab_blocks, 4, ga) &&
               child_cmd(&c, "OPEN 1 %s %s 4", dhex, ga) &&
               child_cmd(&c, "PUT 1 2 21"),
           "A's window written");
    revoked += kv_link_receiver_reset(rcv, 1, true); /* A cancelled */
    report(revoked == 1, "A's window revoked and counted");
    report(grant(rcv, 3, 23, h_blocks, 1, ga2), "A2 granted");
    revoked += kv_link_receiver_reset(rcv, 3, true);
    report(!child_cmd(&c, "OPEN 2 %s %s 1", dhex, ga2),
           "an ended reservation's token gets no FD");
    report(!child_cmd(&c, "OPEN 2 %s %s 4", dhex, ga),
           "A's token gets no second FD");
    /* one check per step: a failure names its step (and the writer's
     * answer its call), not the first link of a chain */
    ok = grant(rcv, 1, 22, ab_blocks, 4, gb);
    report(ok, "B granted A's blocks");
    ok = ok && child_cmd(&c, "OPEN 3 %s %s 4", dhex, gb);
    report(ok, "B's window opened while the stale writer maps A's");
    ok = ok && child_cmd(&c, "PUT 3 3 22");
    report(ok, "B's window written and committed");
    report(child_cmd(&c, "PUT 1 99 21"), /* stale: garbage, synchronized */
           "stale writer wrote A's window before B's copy-in");
    report(child_cmd(&c, "CLOSE 3"), "B's window closed by its writer");
    report(ok && arrived(rcv, 1, 22),
           "B landed while the stale writer wrote A's window");
    report(child_cmd(&c, "PUT 1 98 21"), "stale writer wrote again after B");
    report(pool_holds(be, 3, ab_blocks, 4, before),
           "B byte-exact in A's blocks, no other block changed");
    report(revoked == 2, "revocations counted (A and A2)");
    child_cmd(&c, "CLOSE 1");
    child_stop(&c);
    free(before);
    kv_link_receiver_reset(rcv, 1, false);
    kv_link_receiver_destroy(&rcv);
}

/* backend_kv_copy_in's done for a window: counted, then passed on. */
typedef struct {
    void *reader;  /* kv_cipc_window_read_begin's */
    atomic_int n;
} copy_done_t;

static void copy_done(void *arg)
{
    copy_done_t *cd = arg;

    kv_cipc_window_read_done(cd->reader);
    atomic_fetch_add(&cd->n, 1);
}

/* 1b. A window made ahead for a larger class than its grant, through the
 * transport as the link uses it (the link's budget for this tiny model
 * is about one 2 MiB granule: nothing would be made ahead there). */
static void test_made_ahead(backend_t *be, const char *self)
{
    const int blocks[3] = { 10, 11, 20 };
    static char dhex[4096];
    char gh[64];
    kv_cipc_pool_t *pool = NULL;
    kv_cipc_window_t *w = NULL;
    const uint8_t *desc, *g;
    size_t dlen = 0, glen = 0;
    bool arrived = false, ok;
    child_t c;

    if (kv_cipc_pool_export_windowed(backend_kv_layout(be), 0,
                                     (size_t)64 << 20, &pool) != BT_OK) {
        report(false, "made ahead: windowed pool");
        return;
    }
    desc = kv_cipc_pool_desc(pool, &dlen);
    hex_put(desc, dlen, dhex);
    /* the first of the class of 4 is made here; the pool's thread then
     * makes the class's ready ones */
    ok = kv_cipc_window_create(pool, 4, &w) == BT_OK;
    kv_cipc_window_destroy(&w);
    usleep(100000);
    ok = ok && kv_cipc_window_create(pool, 3, &w) == BT_OK;
    report(ok && kv_cipc_window_made_ahead(w),
           "made ahead: a 3-block grant takes a 4-block window made ahead");
    if (!ok) {
        kv_cipc_pool_destroy(&pool);
        return;
    }
    g = kv_cipc_window_grant(w, &glen);
    hex_put(g, glen, gh);
    child_start(&c, self);
    ok = child_cmd(&c, "OPEN 0 %s %s 3", dhex, gh) &&
         child_cmd(&c, "PUT 0 5 12") && child_cmd(&c, "CLOSE 0");
    report(ok, "made ahead: the writer maps 3 blocks' worth and commits");
    ok = ok && kv_cipc_window_has_arrived(w, 12, &arrived) == BT_OK &&
         arrived;
    report(ok, "made ahead: the epoch lands where 3 blocks put it");
    if (ok) { /* the copy is left in flight; its done is counted */
        copy_done_t cd = { kv_cipc_window_read_begin(w), 0 };
        uint64_t until = bt_time_ns() + 5000000000ull;

        if (backend_kv_copy_in(be, kv_cipc_window_data(w), 3, blocks,
                               copy_done, &cd) != BT_OK) {
            kv_cipc_window_read_done(cd.reader);
            ok = false;
        }
        ok = ok && pool_holds(be, 5, blocks, 3, NULL);
        while (atomic_load(&cd.n) == 0 && bt_time_ns() < until)
            usleep(100);
        report(atomic_load(&cd.n) == 1,
               "made ahead: the copy in flight said done once");
    }
    report(ok, "made ahead: byte-exact in the reservation's blocks");
    kv_cipc_window_destroy(&w);
    report(!child_cmd(&c, "OPEN 1 %s %s 3", dhex, gh),
           "made ahead: a destroyed window's token gets no FD");
    child_stop(&c);
    kv_cipc_pool_destroy(&pool);
}

/* 3. --kv-direct-writes: the stale writer reaches B's blocks. */
static void test_control(backend_t *be, const char *self)
{
    kv_link_receiver_t *rcv = receiver(be, true);
    static char dhex[4096];
    const int ab_blocks[4] = { 40, 41, 42, 43 };
    kv_link_grant_t g = { .request_id = 32, .slot = 1, .epoch = 32,
                          .blocks = ab_blocks, .n = 4 };
    size_t dlen = 0;
    const uint8_t *desc = cipc_endpoint(rcv, &dlen);
    child_t c;

    if (desc == NULL) {
        report(false, "control: whole-pool export");
        kv_link_receiver_destroy(&rcv);
        return;
    }
    hex_put(desc, dlen, dhex);
    child_start(&c, self);
    report(kv_link_receiver_arm(rcv, &g) == BT_OK &&
               g.cipc_window == NULL &&
               child_cmd(&c, "POOL %s 3 1 32 4 40 41 42 43", dhex) &&
               arrived(rcv, 1, 32) && pool_holds(be, 3, ab_blocks, 4, NULL),
           "control: B lands through the exported pool");
    kv_link_receiver_reset(rcv, 1, false);
    /* A's writer, long ended, still maps the pool */
    /* the writer answers after its copies completed: the check below
     * sees them, whatever the timing */
    report(child_cmd(&c, "POOL %s 99 2 5 4 40 41 42 43", dhex),
           "control: the stale writer wrote through its pool mapping");
    report(!pool_holds(be, 3, ab_blocks, 4, NULL),
           "control (--kv-direct-writes): the stale writer corrupts B");
    child_stop(&c);
    kv_link_receiver_destroy(&rcv);
}

/* 4. what a window costs at the 8B shape (printed). */
static void bench(void)
{
    kv_layout_t lay = { .n_layers = 32, .n_blocks = 4096, .block_size = 16,
                        .n_kv_heads = 8, .head_dim = 128, .elem_size = 2 };
    const int n = 128; /* 2048 tokens */
    kv_cipc_pool_t *pool = NULL;
    kv_cipc_window_t *w = NULL;
    size_t bytes = kv_cipc_window_data_bytes(&lay, n);
    void *dst = NULL;
    cudaEvent_t e0, e1;
    float ms = 0;
    uint64_t t0, t1, t2;

    (void)cudaSetDevice(0);
    if (kv_cipc_pool_export_windowed(&lay, 0, (size_t)1 << 30, &pool) !=
            BT_OK ||
        cudaMalloc(&dst, bytes) != cudaSuccess) {
        report(false, "bench: windowed pool");
        kv_cipc_pool_destroy(&pool);
        return;
    }
    (void)cudaSetDevice(0);
    for (int rep = 0; rep < 4; rep++) {
        bool ahead;

        /* time for the pool's thread: the previous window's release
         * (~1 ms) and the next one's make (~1 ms) */
        usleep(50000);
        t0 = bt_time_ns();
        BT_ASSERT_OK(kv_cipc_window_create(pool, n, &w));
        t1 = bt_time_ns();
        ahead = kv_cipc_window_made_ahead(w);
        if (rep > 0)
            report(ahead, "bench: a window of a class asked before is made "
                          "ahead");
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int l = 0; l < 2 * (int)lay.n_layers; l++)
            cudaMemcpyAsync((char *)dst + (size_t)l * bytes / 64,
                            (const char *)kv_cipc_window_data(w) +
                                (size_t)l * bytes / 64,
                            bytes / 64, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        t2 = bt_time_ns();
        kv_cipc_window_destroy(&w);
        printf("INFO window of %zu MiB: create (%s) %.3f ms, "
               "D2D copy-out %.3f ms (%.0f GB/s), destroy (revoke; release "
               "on the pool's thread) %.3f ms\n", bytes >> 20,
               ahead ? "made ahead: arm, export, offer"
                     : "made here: cuMemCreate, map, export, offer",
               (double)(t1 - t0) / 1e6, (double)ms,
               (double)bytes / ((double)ms * 1e6),
               (double)(bt_time_ns() - t2) / 1e6);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cudaFree(dst);
    kv_cipc_pool_destroy(&pool);
}

int main(int argc, char **argv)
{
    char path[512], self[4096];
    model_t *m = NULL;
    backend_config_t cfg;
    backend_t *be = NULL;
    ssize_t n;

    if (argc > 2 && strcmp(argv[1], "writer") == 0) {
        bt_log_set_level(BT_LOG_LEVEL_ERROR);
        return writer_main(atoi(argv[2]));
    }
    if (argc > 2 && strcmp(argv[1], "--writer-gpu") == 0)
        writer_gpu = atoi(argv[2]);
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    signal(SIGPIPE, SIG_IGN);
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    BT_CHECK(n > 0);
    self[n] = '\0';
    if (!kv_cipc_windows_supported(0)) {
        report(false, "device 0 supports POSIX FD handles (windows)");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/models/stories260K.bin",
             bt_golden_shared_dir());
    BT_ASSERT_OK(model_load(path, &m));
    backend_config_init(&cfg);
    cfg.n_kv_blocks = POOL;
    cfg.block_size = BS;
    cfg.max_batch_tokens = 256;
    cfg.max_seqs = 4;
    cfg.precision = BACKEND_PRECISION_F32;
    BT_ASSERT_OK(backend_create("cuda", m, &cfg, &be));
    test_windows(be, self);
    test_made_ahead(be, self);
    test_control(be, self);
    bench();
    backend_destroy(&be);
    model_destroy(&m);
    printf("test_cuda_ipc_window: %s\n", g_fail ? "FAILED" : "all passed");
    return g_fail ? 1 : 0;
}
