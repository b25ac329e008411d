/*
 * test_stage.c - the staged UCX KV transport (kv_transport_stage.h) over
 * real UCX on loopback, two processes (fork), with host memory standing in
 * for device memory (kv_stage_ops_host): the same pipeline code that runs
 * with CUDA, D2H -> staging buffers -> puts -> receive area -> H2D.
 *
 * Parts (each forks a fresh pair; nothing UCX crosses a fork):
 *   1. modes: staged both sides (threaded copies), staged sender (sync
 *      copies) into a direct receiver, direct sender into a staged
 *      receiver.  Scenarios: scattered block lists with runs, chunks
 *      larger than a staging buffer, one block, no block, the whole
 *      receive area with no runs; 12 layers; every byte of the decode
 *      "device" pool checked after each hand-off (reserved blocks hold the
 *      source bytes, every other block is untouched); a stale epoch into a
 *      cancelled-and-regranted slot is never accepted; both staging
 *      buffers were in flight at once; the receive area is whole at the
 *      end.  Mode 0 ends with the prefill process SIGKILLed mid-stream:
 *      the decode side's wait ends with BT_ERR_TIMEOUT in bounded time.
 *   2. the decode process SIGKILLed mid-stream: the prefill transfer ends
 *      with an error within a bounded time.
 *   3. benchmark (64 MiB Llama-like hand-off, 32 layers) of the host
 *      stand-in pipeline against a plain memcpy, with and without UCX
 *      peer error handling.  `test_stage --bench` runs more repetitions.
 *
 * UCX_TLS defaults to "tcp,sm,self" (an UCX_TLS in the environment wins).
 * Every wait is bounded and alarm() guards both processes.
 * KV_STAGE_DUMP_DESC=dir writes the descriptors (fuzz corpus seeds).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
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
#include "kv/kv_transport_cuda_ipc.h"
#include "kv/kv_transport_stage.h"

#ifdef BATON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define WAIT_MS 15000
#define N_SLOTS 6
#define SENTINEL 0xEEu
#define MAX_N 128

enum { MODE_STAGED = 0, MODE_DIRECT_RECV, MODE_DIRECT_SEND, N_MODES };

static const char *mode_name[N_MODES] = {
    "staged/staged (threaded copies)",
    "staged sender (sync copies) -> direct receiver",
    "direct sender -> staged receiver",
};

/* Decode "device" pool, prefill "device" pool, receive area, staging. */
static kv_layout_t g_dev = { .n_layers = 12, .n_blocks = 96, .block_size = 4,
                             .n_kv_heads = 2, .head_dim = 8, .elem_size = 4 };
static kv_layout_t g_src = { .n_layers = 12, .n_blocks = 80, .block_size = 4,
                             .n_kv_heads = 2, .head_dim = 8, .elem_size = 4 };
static int g_recv_blocks = 64;
static int g_stage_blocks = 8;
static bool g_peer_errors = true;
/* --cuda (device machine): pools in GPU memory, kv_stage_ops_cuda. */
static bool g_cuda;

// ----------------------------------------------------------------------------
// "Device" memory: GPU memory with --cuda, else host memory

static void *dev_alloc(size_t bytes)
{
#ifdef BATON_HAVE_CUDA
    if (g_cuda) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes) != cudaSuccess)
            BT_TEST_FAIL("cudaMalloc %zu", bytes);
        return p;
    }
#endif
    return bt_malloc(bytes, "test_dev_pool");
}

static void dev_free(void *p)
{
#ifdef BATON_HAVE_CUDA
    if (g_cuda) {
        cudaFree(p);
        return;
    }
#endif
    bt_free(p);
}

static void dev_copy(void *dst, const void *src, size_t bytes)
{
    if (g_cuda)
        BT_ASSERT_OK(kv_cipc_memcpy(dst, src, bytes));
    else
        memcpy(dst, src, bytes);
}

static const kv_stage_ops_t *dev_ops(bool threaded)
{
    return g_cuda ? kv_stage_ops_cuda() : kv_stage_ops_host(threaded);
}

enum {
    MSG_DESC = 1, /* decode -> prefill: descriptor bytes follow */
    MSG_GRANT,    /* decode -> prefill: send scenario into slot/epoch */
    MSG_SENT,     /* prefill -> decode: transfer finished (status) */
    MSG_ARRIVED,  /* decode -> prefill: some layers arrived (death test) */
    MSG_BYE       /* decode -> prefill: finished */
};

typedef struct {
    int op;          /* MSG_* */
    int scen;        /* scenario */
    int tag;         /* pattern tag of the source bytes */
    int slot;        /* reservation slot */
    uint64_t epoch;  /* epoch */
    int n;           /* blocks */
    int pace_ms;     /* prefill: ms of "compute" between layers */
    int status;      /* MSG_SENT: transfer status */
    int max_busy;    /* MSG_SENT: staging buffers busy at once */
    uint64_t t0;     /* MSG_SENT: first layer queued (CLOCK_MONOTONIC) */
    uint64_t len;    /* MSG_DESC: bytes following */
    int dst[MAX_N];  /* destination ids (grant) */
} msg_t;

// ----------------------------------------------------------------------------
// Scenarios: (src, dev) block lists known to both processes

typedef struct {
    int n;
    int src[MAX_N];
    int dev[MAX_N];
} scenario_t;

#define N_SCEN 5

static void scenario_get(int scen, scenario_t *s)
{
    memset(s, 0, sizeof(*s));
    if (scen == 0) {
        /* Runs in both lists, runs in one list only, singles. */
        static const int src[] = { 3, 4, 5, 9, 10, 20, 0, 1, 11, 12, 30, 32 };
        static const int dev[] = { 7, 8, 9, 2, 3, 15, 30, 31, 40, 50, 51,
                                   52 };
        s->n = (int)BT_ARRAY_SIZE(src);
        memcpy(s->src, src, sizeof(src));
        memcpy(s->dev, dev, sizeof(dev));
    } else if (scen == 1) {
        /* 40 blocks: 5 staging chunks per layer, two long runs. */
        s->n = 40;
        for (int i = 0; i < 40; i++) {
            s->src[i] = i < 25 ? 50 + i : i - 25;
            s->dev[i] = i < 20 ? 10 + i : 50 + i;
        }
    } else if (scen == 2) {
        s->n = 1;
        s->src[0] = 79;
        s->dev[0] = 0;
    } else if (scen == 3) {
        s->n = 0;
    } else if (scen < 0) {
        /* Benchmark: 32 (128 with --cuda) contiguous blocks. */
        s->n = g_cuda ? 128 : 32;
        for (int i = 0; i < s->n; i++) {
            s->src[i] = 2 + i;
            s->dev[i] = 4 + i;
        }
    } else {
        /* The whole receive area, no run anywhere on the device side. */
        s->n = 64;
        for (int i = 0; i < 64; i++) {
            s->src[i] = (i * 7) % 80;
            s->dev[i] = 95 - i;
        }
    }
}

/* Byte j of source block b, layer l, K (kv=0) or V (kv=1), tag t. */
static uint8_t pattern(int tag, int kv, int layer, int b, size_t j)
{
    uint64_t z = ((uint64_t)tag << 48) ^ ((uint64_t)kv << 40) ^
                 ((uint64_t)layer << 32) ^ ((uint64_t)b << 16) ^ j;
    z = (z ^ (z >> 31)) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    return (uint8_t)(z == SENTINEL ? 0 : z);
}

// ----------------------------------------------------------------------------
// Socket helpers

static void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t r = write(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            BT_TEST_FAIL("write: %s", strerror(errno));
        b += r;
        n -= (size_t)r;
    }
}

typedef void (*progress_fn_t)(void *arg);

/* Reads exactly n bytes, running `progress` while waiting (bounded). */
static void recv_all(int fd, void *p, size_t n, progress_fn_t progress,
                     void *arg)
{
    uint8_t *b = p;
    uint64_t deadline = bt_time_ns() + (uint64_t)WAIT_MS * 1000000 * 2;
    while (n > 0) {
        struct pollfd pfd = { fd, POLLIN, 0 };
        ssize_t r;
        if (progress != NULL)
            progress(arg);
        if (bt_time_ns() > deadline)
            BT_TEST_FAIL("timed out waiting for the other process");
        if (poll(&pfd, 1, progress != NULL ? 0 : 100) < 0 && errno != EINTR)
            BT_TEST_FAIL("poll: %s", strerror(errno));
        if (!(pfd.revents & (POLLIN | POLLHUP))) {
            if (progress != NULL)
                usleep(50);
            continue;
        }
        r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            BT_TEST_FAIL("peer process closed the socket");
        b += r;
        n -= (size_t)r;
    }
}

static kv_ucx_t *ucx_start(void)
{
    kv_ucx_config_t cfg;
    kv_ucx_t *ucx = NULL;
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = g_peer_errors;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &ucx));
    return ucx;
}

// ----------------------------------------------------------------------------
// Decode side

typedef struct {
    kv_ucx_t *ucx;
    kv_stage_recv_t *recv;
    uint8_t *d_pool;          /* K then V, (2, L, n_blocks, ...) */
    void *k[64];              /* per-layer K base */
    void *v[64];              /* per-layer V base */
    int *exp_tag;             /* (L, n_blocks) expected tag, -1 sentinel */
    int *exp_src;             /* (L, n_blocks) expected source block */
} dec_t;

static void dec_progress(void *arg)
{
    dec_t *d = arg;
    kv_ucx_progress(d->ucx);
    kv_stage_recv_progress(d->recv);
}

static void dec_init(dec_t *d, int mode)
{
    kv_stage_recv_config_t rc;
    size_t bb = kv_layout_block_bytes(&g_dev);
    size_t lb = bb * (size_t)g_dev.n_blocks;
    size_t cells = (size_t)g_dev.n_layers * (size_t)g_dev.n_blocks;
    int L = g_dev.n_layers;

    memset(d, 0, sizeof(*d));
    d->ucx = ucx_start();
    if (mode == MODE_DIRECT_RECV)
        /* Registered with UCX directly: allocate through UCX so that the
         * one-host fast path (shared memory) applies, as a GPU pool
         * registered with a CUDA-aware UCX would be used in place. */
        BT_ASSERT_OK(kv_ucx_mem_alloc(d->ucx, 2 * lb * (size_t)L,
                                      KV_UCX_MEM_HOST, (void **)&d->d_pool));
    else
        d->d_pool = dev_alloc(2 * lb * (size_t)L);
    BT_CHECK(d->d_pool != NULL);
    {
        uint8_t *h = bt_malloc(2 * lb * (size_t)L, "test_fill");
        memset(h, SENTINEL, 2 * lb * (size_t)L);
        dev_copy(d->d_pool, h, 2 * lb * (size_t)L);
        bt_free(h);
    }
    for (int l = 0; l < L; l++) {
        d->k[l] = d->d_pool + (size_t)l * lb;
        d->v[l] = d->d_pool + (size_t)(L + l) * lb;
    }
    d->exp_tag = bt_malloc(cells * sizeof(int), "test_exp");
    d->exp_src = bt_malloc(cells * sizeof(int), "test_exp");
    for (size_t i = 0; i < cells; i++)
        d->exp_tag[i] = -1;
    kv_stage_recv_config_init(&rc);
    rc.layout = g_dev;
    rc.k_layers = d->k;
    rc.v_layers = d->v;
    rc.recv_blocks = g_recv_blocks;
    rc.n_slots = N_SLOTS;
    rc.ops = dev_ops(true);
    rc.direct = mode == MODE_DIRECT_RECV;
    BT_ASSERT_OK(kv_stage_recv_create(d->ucx, &rc, &d->recv));
}

static void dec_fini(dec_t *d, int mode)
{
    kv_stage_recv_destroy(&d->recv);
    if (mode == MODE_DIRECT_RECV)
        kv_ucx_mem_free(d->ucx, (void **)&d->d_pool);
    else
        dev_free(d->d_pool);
    bt_free(d->exp_tag);
    bt_free(d->exp_src);
    kv_ucx_destroy(&d->ucx);
}

/* Checks every byte of the decode pool against the expectations. */
static void dec_verify(const dec_t *d, const char *what)
{
    size_t bb = kv_layout_block_bytes(&g_dev);
    size_t lb = bb * (size_t)g_dev.n_blocks;
    size_t all = 2 * lb * (size_t)g_dev.n_layers;
    uint8_t *h = bt_malloc(all, "test_verify");

    dev_copy(h, d->d_pool, all);
    for (int l = 0; l < g_dev.n_layers; l++)
        for (int b = 0; b < g_dev.n_blocks; b++)
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *p =
                    h + ((size_t)(kv * g_dev.n_layers + l)) * lb +
                    (size_t)b * bb;
                int t = d->exp_tag[l * g_dev.n_blocks + b];
                int s = d->exp_src[l * g_dev.n_blocks + b];
                for (size_t j = 0; j < bb; j++) {
                    uint8_t want = t < 0 ? SENTINEL : pattern(t, kv, l, s, j);
                    if (p[j] != want)
                        BT_TEST_FAIL("%s: layer %d block %d %c byte %zu: "
                                     "%#x, want %#x (tag %d src %d)", what,
                                     l, b, kv ? 'V' : 'K', j, p[j], want, t,
                                     s);
                }
            }
    bt_free(h);
}

static void dec_expect(dec_t *d, const scenario_t *sc, int tag)
{
    for (int l = 0; l < g_dev.n_layers; l++)
        for (int i = 0; i < sc->n; i++) {
            d->exp_tag[l * g_dev.n_blocks + sc->dev[i]] = tag;
            d->exp_src[l * g_dev.n_blocks + sc->dev[i]] = sc->src[i];
        }
}

static void dump_desc(const uint8_t *desc, size_t len, int mode)
{
    const char *dir = getenv("KV_STAGE_DUMP_DESC");
    char path[512];
    FILE *f;
    if (dir == NULL)
        return;
    snprintf(path, sizeof(path), "%s/desc_mode%d", dir, mode);
    f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(desc, 1, len, f);
        fclose(f);
    }
}

/* Grants scenario `scen` (source tag `tag`) into slot/epoch; returns the
 * message sent (dst ids filled in). */
static msg_t dec_grant(dec_t *d, int fd, int scen, int tag, int slot,
                       uint64_t epoch, int pace_ms)
{
    scenario_t sc;
    msg_t m;
    scenario_get(scen, &sc);
    memset(&m, 0, sizeof(m));
    m.op = MSG_GRANT;
    m.scen = scen;
    m.tag = tag;
    m.slot = slot;
    m.epoch = epoch;
    m.n = sc.n;
    m.pace_ms = pace_ms;
    BT_ASSERT_OK(kv_stage_recv_begin(d->recv, slot, epoch, sc.dev, sc.n,
                                     m.dst));
    send_all(fd, &m, sizeof(m));
    return m;
}

/* Waits for the hand-off and the sender's report, verifies every byte. */
static void dec_complete(dec_t *d, int fd, int scen, int tag, int slot,
                         int *max_busy_p, bool verify)
{
    scenario_t sc;
    msg_t r;
    char what[64];

    scenario_get(scen, &sc);
    BT_ASSERT_OK(kv_stage_recv_wait(d->recv, slot, WAIT_MS));
    BT_ASSERT_EQ(kv_stage_recv_layers_arrived(d->recv, slot),
                 g_dev.n_layers);
    recv_all(fd, &r, sizeof(r), dec_progress, d);
    BT_ASSERT_EQ(r.op, MSG_SENT);
    BT_ASSERT_EQ(r.status, BT_OK);
    if (max_busy_p != NULL)
        *max_busy_p = BT_MAX(*max_busy_p, r.max_busy);
    kv_stage_recv_finish(d->recv, slot);
    dec_expect(d, &sc, tag);
    snprintf(what, sizeof(what), "scenario %d tag %d", scen, tag);
    if (verify)
        dec_verify(d, what);
}

static void decode_role(int fd, int mode, pid_t child)
{
    dec_t d;
    size_t len;
    const uint8_t *desc;
    msg_t m;
    uint64_t epoch = 1000;
    int tag = 1;
    int max_busy = 0;
    int wstatus;
    uint64_t t;

    dec_init(&d, mode);
    if (g_cuda)
        fprintf(stderr, "  --cuda: pools in GPU memory; UCX CUDA memory "
                        "support: %s\n",
                kv_stage_ucx_has_cuda() ? "yes" : "no");
    desc = kv_stage_recv_desc(d.recv, &len);
    dump_desc(desc, len, mode);
    {
        kv_stage_desc_info_t info;
        BT_ASSERT_OK(kv_stage_desc_parse(desc, len, &info));
        BT_ASSERT_EQ(info.direct, mode == MODE_DIRECT_RECV);
        BT_ASSERT_EQ(info.n_layers, g_dev.n_layers);
        BT_ASSERT_EQ(info.n_slots, N_SLOTS);
    }
    memset(&m, 0, sizeof(m));
    m.op = MSG_DESC;
    m.len = len;
    send_all(fd, &m, sizeof(m));
    send_all(fd, desc, len);

    /* Every scenario, one at a time, in varying slots. */
    for (int scen = 0; scen < N_SCEN; scen++, tag++) {
        int slot = scen % N_SLOTS;
        (void)dec_grant(&d, fd, scen, tag, slot, ++epoch, 0);
        dec_complete(&d, fd, scen, tag, slot, &max_busy, true);
    }
    /* Two hand-offs in flight at once (two slots, one sender). */
    {
        /* pace -1: the sender runs this grant and the next one as two
         * concurrent transfers, layers interleaved (same source tag). */
        (void)dec_grant(&d, fd, 0, tag, 1, ++epoch, -1);
        (void)dec_grant(&d, fd, 1, tag, 2, ++epoch, 0);
        dec_complete(&d, fd, 0, tag, 1, &max_busy, false);
        dec_complete(&d, fd, 1, tag, 2, &max_busy, true);
        tag++;
    }
    if (mode != MODE_DIRECT_RECV)
        BT_ASSERT_EQ(kv_stage_recv_free_blocks(d.recv), g_recv_blocks);

    /* Stale epoch: slot 3 granted (epoch e1), cancelled, granted again
     * (e2); a writer still holding e1 puts everything and commits while
     * the slot waits for e2: nothing is accepted and (staged receiver)
     * the device pool does not change.  Then the e2 writer completes. */
    {
        uint64_t e1 = ++epoch, e2 = ++epoch;
        scenario_t sc;
        msg_t g, r;
        int dst_old[MAX_N];

        scenario_get(0, &sc);
        BT_ASSERT_OK(kv_stage_recv_begin(d.recv, 3, e1, sc.dev, sc.n,
                                         dst_old));
        kv_stage_recv_cancel(d.recv, 3);
        if (mode != MODE_DIRECT_RECV)
            BT_ASSERT_EQ(kv_stage_recv_free_blocks(d.recv),
                         g_recv_blocks - sc.n);
        memset(&g, 0, sizeof(g));
        g.op = MSG_GRANT;
        g.scen = 0;
        g.slot = 3;
        g.n = sc.n;
        BT_ASSERT_OK(kv_stage_recv_begin(d.recv, 3, e2, sc.dev, sc.n,
                                         g.dst));
        if (mode != MODE_DIRECT_RECV)
            for (int i = 0; i < sc.n; i++)
                for (int j = 0; j < sc.n; j++)
                    BT_ASSERT_NE(g.dst[i], dst_old[j]); /* quarantined */
        {
            msg_t stale = g;
            stale.epoch = e1;
            stale.tag = tag;
            memcpy(stale.dst, dst_old, sizeof(int) * (size_t)sc.n);
            send_all(fd, &stale, sizeof(stale));
        }
        recv_all(fd, &r, sizeof(r), dec_progress, &d);
        BT_ASSERT_EQ(r.status, BT_OK); /* the stale writer's commits land */
        t = bt_time_ns();
        while (bt_time_ns() - t < 100000000ull)
            dec_progress(&d);
        BT_ASSERT_EQ(kv_stage_recv_poll(d.recv, 3), BT_IN_PROGRESS);
        BT_ASSERT_EQ(kv_stage_recv_layers_arrived(d.recv, 3), 0);
        if (mode != MODE_DIRECT_RECV)
            dec_verify(&d, "after the stale epoch");
        g.epoch = e2;
        g.tag = tag + 1;
        send_all(fd, &g, sizeof(g));
        dec_complete(&d, fd, 0, tag + 1, 3, NULL, true);
        /* Regranted with e3: finish cleared the words, nothing arrives by
         * itself. */
        {
            int dst[MAX_N];
            uint64_t e3 = ++epoch;
            BT_ASSERT_OK(kv_stage_recv_begin(d.recv, 3, e3, sc.dev, sc.n,
                                             dst));
            for (int i = 0; i < 20; i++)
                dec_progress(&d);
            BT_ASSERT_EQ(kv_stage_recv_poll(d.recv, 3), BT_IN_PROGRESS);
            BT_ASSERT_EQ(kv_stage_recv_layers_arrived(d.recv, 3), 0);
            kv_stage_recv_cancel(d.recv, 3);
        }
        kv_stage_recv_release_quarantine(d.recv, 3);
        tag += 2;
        if (mode != MODE_DIRECT_RECV)
            BT_ASSERT_EQ(kv_stage_recv_free_blocks(d.recv), g_recv_blocks);
    }
    if (mode == MODE_STAGED)
        BT_ASSERT_EQ(max_busy, 2); /* both staging buffers in flight */

    if (mode == MODE_STAGED) {
        /* Prefill dies mid-stream: a paced transfer, SIGKILL after three
         * layers arrived; the wait ends with a timeout, bounded. */
        int st;
        (void)dec_grant(&d, fd, 1, tag++, 4, ++epoch, 40);
        t = bt_time_ns();
        while (kv_stage_recv_layers_arrived(d.recv, 4) < 3) {
            dec_progress(&d);
            if (bt_time_ns() - t > (uint64_t)WAIT_MS * 1000000)
                BT_TEST_FAIL("layers never arrived");
            usleep(100);
        }
        BT_ASSERT_EQ(kill(child, SIGKILL), 0);
        BT_CHECK(waitpid(child, &wstatus, 0) == child);
        t = bt_time_ns();
        st = kv_stage_recv_wait(d.recv, 4, 1000);
        BT_ASSERT_EQ(st, BT_ERR_TIMEOUT);
        BT_CHECK(bt_time_ns() - t < 3000000000ull);
        BT_CHECK(kv_stage_recv_layers_arrived(d.recv, 4) < g_dev.n_layers);
        kv_stage_recv_cancel(d.recv, 4);
        kv_stage_recv_release_quarantine(d.recv, 4);
        BT_ASSERT_EQ(kv_stage_recv_free_blocks(d.recv), g_recv_blocks);
        fprintf(stderr, "  prefill killed mid-stream: decode wait ended "
                        "with a timeout after %.0f ms\n",
                (double)(bt_time_ns() - t) / 1e6);
    } else {
        memset(&m, 0, sizeof(m));
        m.op = MSG_BYE;
        send_all(fd, &m, sizeof(m));
        BT_CHECK(waitpid(child, &wstatus, 0) == child);
        BT_CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    }
    dec_fini(&d, mode);
}

// ----------------------------------------------------------------------------
// Prefill side

typedef struct {
    kv_ucx_t *ucx;
    kv_stage_send_t *send;
    kv_stage_peer_t *peer;
    uint8_t *s_pool;          /* K then V, (2, L, n_blocks, ...) */
    int fill_tag;             /* tag the pool holds, -1 none */
} pre_t;

static void pre_progress(void *arg)
{
    pre_t *p = arg;
    kv_stage_send_progress(p->send);
}

static const uint8_t *pre_layer(const pre_t *p, int kv, int l)
{
    size_t lb = kv_layout_block_bytes(&g_src) * (size_t)g_src.n_blocks;
    return p->s_pool + (size_t)(kv * g_src.n_layers + l) * lb;
}

static void pre_fill(pre_t *p, int tag)
{
    size_t bb = kv_layout_block_bytes(&g_src);
    size_t lb = bb * (size_t)g_src.n_blocks;
    size_t all = 2 * lb * (size_t)g_src.n_layers;
    uint8_t *h;
    if (p->fill_tag == tag)
        return;
    h = bt_malloc(all, "test_fill");
    for (int l = 0; l < g_src.n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int b = 0; b < g_src.n_blocks; b++) {
                uint8_t *q = h + (size_t)(kv * g_src.n_layers + l) * lb +
                             (size_t)b * bb;
                for (size_t j = 0; j < bb; j++)
                    q[j] = pattern(tag, kv, l, b, j);
            }
    dev_copy(p->s_pool, h, all);
    bt_free(h);
    p->fill_tag = tag;
}

static void pre_init(pre_t *p, int fd, int mode, const kv_stage_ops_t *ops)
{
    kv_stage_send_config_t sc;
    size_t lb = kv_layout_block_bytes(&g_src) * (size_t)g_src.n_blocks;
    msg_t m;
    uint8_t *desc;

    memset(p, 0, sizeof(*p));
    p->fill_tag = -1;
    p->ucx = ucx_start();
    p->s_pool = dev_alloc(2 * lb * (size_t)g_src.n_layers);
    BT_CHECK(p->s_pool != NULL);
    kv_stage_send_config_init(&sc);
    sc.layout = g_src;
    sc.stage_blocks = g_stage_blocks;
    sc.ops = ops;
    sc.direct = mode == MODE_DIRECT_SEND;
    BT_ASSERT_OK(kv_stage_send_create(p->ucx, &sc, &p->send));
    recv_all(fd, &m, sizeof(m), NULL, NULL);
    BT_ASSERT_EQ(m.op, MSG_DESC);
    desc = bt_malloc(m.len, "test_desc");
    recv_all(fd, desc, m.len, NULL, NULL);
    BT_ASSERT_OK(kv_stage_connect(p->send, desc, m.len, &p->peer));
    bt_free(desc);
}

static void pre_fini(pre_t *p)
{
    kv_stage_disconnect(&p->peer);
    kv_stage_send_destroy(&p->send);
    dev_free(p->s_pool);
    kv_ucx_destroy(&p->ucx);
}

/* Runs one granted transfer, queuing a layer every pace_ms. */
static bt_status_t pre_transfer(pre_t *p, const msg_t *g, uint64_t *t0_p)
{
    scenario_t sc;
    kv_stage_xfer_t *x = NULL;
    bt_status_t status;

    scenario_get(g->scen, &sc);
    BT_ASSERT_EQ(sc.n, g->n);
    pre_fill(p, g->tag);
    BT_ASSERT_OK(kv_stage_xfer_begin(p->send, p->peer, g->slot, g->epoch,
                                     sc.src, g->dst, sc.n, &x));
    *t0_p = bt_time_ns();
    for (int l = 0; l < g_src.n_layers; l++) {
        status = kv_stage_xfer_layer(x, l, pre_layer(p, 0, l),
                                     pre_layer(p, 1, l));
        if (status != BT_OK)
            break;
        if (g->pace_ms > 0) {
            uint64_t t = bt_time_ns();
            while (bt_time_ns() - t < (uint64_t)g->pace_ms * 1000000) {
                kv_stage_send_progress(p->send);
                usleep(200);
            }
        } else {
            kv_stage_send_progress(p->send);
        }
    }
    status = kv_stage_xfer_wait(x, WAIT_MS);
    kv_stage_xfer_destroy(&x);
    return status;
}

/* Two grants as concurrent transfers, layers interleaved; reports both. */
static void pre_transfer_pair(pre_t *p, int fd, const msg_t *g1)
{
    msg_t g[2], r;
    scenario_t sc[2];
    kv_stage_xfer_t *x[2] = { NULL, NULL };
    kv_stage_send_stats_t st;

    g[0] = *g1;
    recv_all(fd, &g[1], sizeof(g[1]), pre_progress, p);
    BT_ASSERT_EQ(g[1].op, MSG_GRANT);
    BT_ASSERT_EQ(g[1].tag, g[0].tag);
    pre_fill(p, g[0].tag);
    for (int i = 0; i < 2; i++) {
        scenario_get(g[i].scen, &sc[i]);
        BT_ASSERT_OK(kv_stage_xfer_begin(p->send, p->peer, g[i].slot,
                                         g[i].epoch, sc[i].src, g[i].dst,
                                         sc[i].n, &x[i]));
    }
    for (int l = 0; l < g_src.n_layers; l++)
        for (int i = 0; i < 2; i++) {
            BT_ASSERT_OK(kv_stage_xfer_layer(x[i], l, pre_layer(p, 0, l),
                                             pre_layer(p, 1, l)));
            kv_stage_send_progress(p->send);
        }
    for (int i = 0; i < 2; i++) {
        memset(&r, 0, sizeof(r));
        r.op = MSG_SENT;
        r.status = kv_stage_xfer_wait(x[i], WAIT_MS);
        kv_stage_send_stats(p->send, &st);
        r.max_busy = st.max_busy;
        kv_stage_xfer_destroy(&x[i]);
        send_all(fd, &r, sizeof(r));
    }
}

static void prefill_role(int fd, int mode)
{
    pre_t p;
    const kv_stage_ops_t *ops = dev_ops(mode != MODE_DIRECT_RECV);
    kv_stage_send_stats_t st;

    pre_init(&p, fd, mode, ops);
    for (;;) {
        msg_t g, r;
        uint64_t t0 = 0;
        recv_all(fd, &g, sizeof(g), pre_progress, &p);
        if (g.op == MSG_BYE)
            break;
        BT_ASSERT_EQ(g.op, MSG_GRANT);
        if (g.pace_ms < 0) {
            pre_transfer_pair(&p, fd, &g);
            continue;
        }
        memset(&r, 0, sizeof(r));
        r.op = MSG_SENT;
        r.status = pre_transfer(&p, &g, &t0);
        r.t0 = t0;
        kv_stage_send_stats(p.send, &st);
        r.max_busy = st.max_busy;
        send_all(fd, &r, sizeof(r));
    }
    pre_fini(&p);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
}

// ----------------------------------------------------------------------------
// Part 1: modes

static void run_mode(int mode)
{
    int sv[2];
    pid_t pid;

    BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(50);
        prefill_role(sv[1], mode);
        close(sv[1]);
        _exit(0);
    }
    close(sv[1]);
    decode_role(sv[0], mode, pid);
    close(sv[0]);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    fprintf(stderr, "  ok: %s\n", mode_name[mode]);
}

// ----------------------------------------------------------------------------
// Part 2: the decode worker dies mid-stream

static void run_decode_death(void)
{
    int sv[2];
    pid_t pid;
    pre_t p;
    msg_t g, a;
    scenario_t sc;
    kv_stage_xfer_t *x = NULL;
    bt_status_t status = BT_IN_PROGRESS;
    uint64_t t_kill = 0, t_err = 0;
    int wstatus;

    BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        /* Decode: grant scenario 1, report when two layers arrived, then
         * keep progressing until killed. */
        dec_t d;
        size_t len;
        const uint8_t *desc;
        msg_t m;
        close(sv[0]);
        alarm(50);
        dec_init(&d, MODE_STAGED);
        desc = kv_stage_recv_desc(d.recv, &len);
        memset(&m, 0, sizeof(m));
        m.op = MSG_DESC;
        m.len = len;
        send_all(sv[1], &m, sizeof(m));
        send_all(sv[1], desc, len);
        (void)dec_grant(&d, sv[1], 1, 7, 0, 77, 0);
        while (kv_stage_recv_layers_arrived(d.recv, 0) < 2) {
            dec_progress(&d);
            usleep(100);
        }
        m.op = MSG_ARRIVED;
        send_all(sv[1], &m, sizeof(m));
        for (;;) {
            dec_progress(&d);
            usleep(1000);
        }
    }
    close(sv[1]);
    pre_init(&p, sv[0], MODE_STAGED, dev_ops(true));
    recv_all(sv[0], &g, sizeof(g), pre_progress, &p);
    BT_ASSERT_EQ(g.op, MSG_GRANT);
    scenario_get(g.scen, &sc);
    pre_fill(&p, g.tag);
    BT_ASSERT_OK(kv_stage_xfer_begin(p.send, p.peer, g.slot, g.epoch, sc.src,
                                     g.dst, sc.n, &x));
    for (int l = 0; l < g_src.n_layers && status == BT_IN_PROGRESS; l++) {
        uint64_t t = bt_time_ns();
        if (kv_stage_xfer_layer(x, l, pre_layer(&p, 0, l),
                                pre_layer(&p, 1, l)) != BT_OK)
            break;
        if (l == 3) {
            recv_all(sv[0], &a, sizeof(a), pre_progress, &p);
            BT_ASSERT_EQ(a.op, MSG_ARRIVED);
            BT_ASSERT_EQ(kill(pid, SIGKILL), 0);
            BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
            t_kill = bt_time_ns();
        }
        while (bt_time_ns() - t < 30000000ull) {
            kv_stage_send_progress(p.send);
            status = kv_stage_xfer_status(x);
            if (status != BT_IN_PROGRESS)
                break;
            usleep(200);
        }
    }
    if (status == BT_IN_PROGRESS)
        status = kv_stage_xfer_wait(x, 8000);
    t_err = bt_time_ns();
    BT_CHECK(t_kill != 0);
    BT_CHECK(status != BT_OK && status != BT_IN_PROGRESS);
    BT_CHECK(status != BT_ERR_TIMEOUT);
    BT_CHECK(t_err - t_kill < 8000000000ull);
    fprintf(stderr, "  decode killed mid-stream: transfer failed with '%s' "
                    "%.0f ms after the kill\n", bt_status_str(status),
            (double)(t_err - t_kill) / 1e6);
    /* Later layers are refused, destroy and teardown stay bounded. */
    kv_stage_xfer_destroy(&x);
    pre_fini(&p);
    close(sv[0]);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
}

// ----------------------------------------------------------------------------
// Part 3: benchmark

static double bench_memcpy(size_t bytes)
{
    uint8_t *a = bt_malloc(bytes, "bench"), *b = bt_malloc(bytes, "bench");
    double best = 1e30;
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int r = 0; r < 3; r++) {
        uint64_t t = bt_time_ns();
        memcpy(b, a, bytes);
        best = BT_MIN(best, (double)(bt_time_ns() - t));
    }
    bt_free(a);
    bt_free(b);
    return (double)bytes / best; /* GB/s */
}

static void run_bench(int reps, bool peer_errors)
{
    /* Llama-3-8B KV shape (8 KV heads x 128, bf16), 32 layers, 512 tokens:
     * 64 MiB of K+V. */
    kv_layout_t saved_dev = g_dev, saved_src = g_src;
    int saved_recv = g_recv_blocks, saved_stage = g_stage_blocks;
    bool saved_pe = g_peer_errors;
    int n = g_cuda ? 128 : 32;
    int sv[2];
    pid_t pid;
    size_t bytes;
    double best = 1e30;
    int wstatus;

    g_dev = (kv_layout_t){ .n_layers = 32, .n_blocks = n + 8,
                           .block_size = 16,
                           .n_kv_heads = 8, .head_dim = 128,
                           .elem_size = 2 };
    g_src = g_dev;
    g_recv_blocks = n;
    g_stage_blocks = n; /* one chunk per layer */
    g_peer_errors = peer_errors;
    bytes = 2 * (size_t)n * kv_layout_block_bytes(&g_dev) *
            (size_t)g_dev.n_layers;

    BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(50);
        prefill_role(sv[1], MODE_STAGED);
        _exit(0);
    }
    close(sv[1]);
    {
        dec_t d;
        size_t len;
        const uint8_t *desc;
        msg_t m, r;
        dec_init(&d, MODE_STAGED);
        desc = kv_stage_recv_desc(d.recv, &len);
        memset(&m, 0, sizeof(m));
        m.op = MSG_DESC;
        m.len = len;
        send_all(sv[0], &m, sizeof(m));
        send_all(sv[0], desc, len);
        for (int rep = 0; rep < reps; rep++) {
            int dev[MAX_N];
            uint64_t t1;
            memset(&m, 0, sizeof(m));
            m.op = MSG_GRANT;
            m.scen = -1;
            m.tag = 1;
            m.slot = 0;
            m.epoch = 10 + (uint64_t)rep;
            m.n = n;
            for (int i = 0; i < n; i++)
                dev[i] = 4 + i; /* as scenario_get(-1) */
            BT_ASSERT_OK(kv_stage_recv_begin(d.recv, 0, m.epoch, dev, n,
                                             m.dst));
            send_all(sv[0], &m, sizeof(m));
            BT_ASSERT_OK(kv_stage_recv_wait(d.recv, 0, WAIT_MS));
            t1 = bt_time_ns();
            recv_all(sv[0], &r, sizeof(r), dec_progress, &d);
            BT_ASSERT_EQ(r.status, BT_OK);
            kv_stage_recv_finish(d.recv, 0);
            if (rep > 0 || reps == 1)
                best = BT_MIN(best, (double)(t1 - r.t0));
        }
        memset(&m, 0, sizeof(m));
        m.op = MSG_BYE;
        send_all(sv[0], &m, sizeof(m));
        BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
        BT_CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
        dec_fini(&d, MODE_STAGED);
    }
    close(sv[0]);
    {
        double mc = bench_memcpy(bytes);
        double gbs = (double)bytes / best;
        printf("stage_bench: bytes:%zu layers:%d peer_errors:%d "
               "pipeline_ms:%.2f pipeline_GBps:%.2f memcpy_GBps:%.2f "
               "ratio:%.2f\n", bytes, g_dev.n_layers, peer_errors ? 1 : 0,
               best / 1e6, gbs, mc, gbs / mc);
        fflush(stdout);
    }
    g_dev = saved_dev;
    g_src = saved_src;
    g_recv_blocks = saved_recv;
    g_stage_blocks = saved_stage;
    g_peer_errors = saved_pe;
}

/* With --cuda each part runs in a child of its own: a process that
 * initialised CUDA must not fork children that use it. */
static void run_part_fork(void (*fn)(int), int arg, bool cuda)
{
    pid_t pid;
    int wstatus;

    fflush(stdout);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        g_cuda = cuda;
        alarm(55);
        fn(arg);
        fflush(stdout);
        _exit(0);
    }
    BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        BT_TEST_FAIL("part failed (status %#x)", wstatus);
}

static void run_part(void (*fn)(int), int arg)
{
    if (g_cuda)
        run_part_fork(fn, arg, true);
    else
        fn(arg);
}

static void run_decode_death_part(int unused)
{
    (void)unused;
    run_decode_death();
}

static int g_bench_reps;

/* The CUDA copy table in a process without a usable GPU (CI): creating a
 * sender or receiver fails with a status, nothing crashes.  With a GPU
 * (--cuda on the device) both must succeed. */
static void run_cuda_ops_check(int unused)
{
    kv_ucx_t *ucx = ucx_start();
    kv_stage_send_config_t sc;
    kv_stage_send_t *send = NULL;
    bt_status_t status;

    (void)unused;
    kv_stage_send_config_init(&sc);
    sc.layout = g_src;
    status = kv_stage_send_create(ucx, &sc, &send);
    if (g_cuda) {
        BT_ASSERT_OK(status);
        kv_stage_send_destroy(&send);
    } else {
        BT_CHECK(status == BT_ERR_CUDA || status == BT_ERR_UNSUPPORTED ||
                 status == BT_OK);
        if (status == BT_OK) /* a GPU after all */
            kv_stage_send_destroy(&send);
        fprintf(stderr, "  CUDA copy ops here: %s\n", bt_status_str(status));
    }
    BT_CHECK(send == NULL);
    kv_ucx_destroy(&ucx);
}

static void run_forked(void (*fn)(int), int arg)
{
    bool saved = g_cuda;
    g_cuda = true; /* run_part forks only in --cuda mode */
    run_part_fork(fn, arg, saved);
    g_cuda = saved;
}

static void run_bench_part(int peer_errors)
{
    run_bench(g_bench_reps, peer_errors != 0);
}

int main(int argc, char **argv)
{
    bool bench = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0)
            bench = true;
        else if (strcmp(argv[i], "--cuda") == 0)
            g_cuda = true;
    }
#if defined(__SANITIZE_THREAD__)
    if (argc > 0 && getenv("UCX_MEM_EVENTS") == NULL) {
        setenv("UCX_MEM_EVENTS", "no", 1);
        execv("/proc/self/exe", argv);
    }
#endif
    bt_log_init("test_kv_stage");
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    setenv("UCX_TLS", "tcp,sm,self", 0);
    signal(SIGPIPE, SIG_IGN);
    alarm(bench ? 300 : 58);
#ifndef BATON_HAVE_CUDA
    if (g_cuda)
        BT_TEST_FAIL("--cuda: built without CUDA");
#endif
    if (!bench) {
        run_forked(run_cuda_ops_check, 0);
        for (int mode = 0; mode < N_MODES; mode++)
            if (!g_cuda || mode == MODE_STAGED)
                run_part(run_mode, mode);
        run_part(run_decode_death_part, 0);
    }
    g_bench_reps = bench ? 6 : 2;
    run_part(run_bench_part, 0);
    run_part(run_bench_part, 1);
    BT_TEST_PASS("kv_transport/stage");
    return 0;
}
