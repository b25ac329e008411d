/*
 * test_cuda_ipc.c - the CUDA IPC KV transport (kv_transport_cuda_ipc.h)
 * between two processes, on one GPU or across two (cuda-ipc(p2p)).
 *
 *   test_cuda_ipc [--src-dev S] [--dst-dev D] [--bench]
 *
 * The parent is the decode side: a KV pool (one cudaMalloc for K, one for
 * V) on device D filled with sentinel bytes, exported; the child (forked
 * before either touches CUDA) is the prefill side on device S: it maps the
 * pool, puts every layer of a block list with runs, commits, and the
 * parent checks the arrival epoch and every byte of its pool (reserved
 * blocks = the source blocks, the rest untouched).  Then a re-sharding
 * hand-off: two source "ranks" (prefill TP 2, each half the KV heads, two
 * allocations) put into the TP 1 pool with kv_cipc_put_layer_heads
 * (cudaMemcpy2DAsync rows), checked the same way.
 *
 * --bench: a Llama-3-8B-shaped hand-off (32 layers, 8 KV heads x 128,
 * bf16, 16-token blocks, 2048 tokens = 256 MiB of K+V): put of all layers
 * + commit until the epoch landed, best of 5 after a warm-up, for
 * contiguous blocks, scattered single blocks and the 2 -> 1 re-shard,
 * against cudaMemcpyPeerAsync (S != D) or cudaMemcpyAsync (S == D) of the
 * same bytes in one call.  Prints `cipc_bench:` lines.
 *
 * Without a GPU (CI) the test checks that the calls fail cleanly and
 * passes.
 */
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

#ifdef BATON_HAVE_CUDA
#include <cuda_runtime.h>

#define SENTINEL 0xEE
#define CU(_e)                                                           \
    do {                                                                 \
        cudaError_t _err = (_e);                                         \
        if (_err != cudaSuccess)                                         \
            BT_TEST_FAIL("%s: %s", #_e, cudaGetErrorString(_err));       \
    } while (0)

typedef struct {
    int op;          /* 1 check data, 2 bench rep done, 3 bye */
    int scen;        /* scenario */
    uint64_t epoch;
    int status;
} msg_t;

static int g_src_dev, g_dst_dev;
static bool g_bench;

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0)
            BT_TEST_FAIL("write");
        c += w;
        n -= (size_t)w;
    }
}

static void recv_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r <= 0)
            BT_TEST_FAIL("read");
        c += r;
        n -= (size_t)r;
    }
}

/* Scenarios: the layouts and block lists both processes derive. */
typedef struct {
    kv_layout_t src;  /* one source rank's pool */
    kv_layout_t dst;  /* the decode pool (all heads) */
    int tp_src;       /* source ranks (1 or 2) */
    int n;
    int src_ids[256];
    int dst_ids[256];
} scen_t;

enum { SC_CHECK = 0, SC_CHECK_RESHARD, SC_CONTIG, SC_SCATTER, SC_RESHARD,
       N_SC };

static void scen_get(int id, scen_t *s)
{
    bool big = id >= SC_CONTIG;
    memset(s, 0, sizeof(*s));
    s->dst = (kv_layout_t){ .n_layers = big ? 32 : 4,
                            .n_blocks = big ? 272 : 40, .block_size = 16,
                            .n_kv_heads = 8, .head_dim = 128,
                            .elem_size = 2 };
    s->tp_src = id == SC_CHECK_RESHARD || id == SC_RESHARD ? 2 : 1;
    s->src = s->dst;
    s->src.n_kv_heads = 8 / s->tp_src;
    s->src.n_blocks = big ? 136 : 24;
    if (!big) { /* runs that differ on the two sides */
        static const int a[] = { 0, 1, 2, 3, 4, 5, 10, 12, 13, 23 };
        static const int b[] = { 3, 4, 5, 6, 7, 8, 20, 30, 31, 0 };
        s->n = 10;
        memcpy(s->src_ids, a, sizeof(a));
        memcpy(s->dst_ids, b, sizeof(b));
        return;
    }
    s->n = 128; /* 2048 tokens */
    for (int i = 0; i < s->n; i++) {
        s->src_ids[i] = i;
        /* scattered: every other destination block, so no run merges */
        s->dst_ids[i] = id == SC_SCATTER ? 2 * i + 1 : 8 + i;
    }
}

/* Byte `c` of head `head` (global) of token slot `slot` of source block
 * `blk`, layer `l`, array kv. */
static uint8_t src_byte(int kv, int l, int blk, int slot, int head, int c)
{
    uint32_t h = (uint32_t)((((kv * 64 + l) * 512 + blk) * 16 + slot) * 16 +
                            head) * 256u + (uint32_t)c;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return (uint8_t)h;
}

static size_t row_bytes(const kv_layout_t *l)
{
    return (size_t)l->n_kv_heads * l->head_dim * l->elem_size;
}

/* Host image of source rank r's K or V (all layers). */
static uint8_t *src_image(const scen_t *s, int kv, int rank)
{
    size_t lb = kv_layout_layer_bytes(&s->src), row = row_bytes(&s->src);
    size_t hb = (size_t)s->src.head_dim * s->src.elem_size;
    uint8_t *p = bt_malloc(lb * s->src.n_layers, "test");
    BT_CHECK(p != NULL);
    for (int l = 0; l < s->src.n_layers; l++)
        for (int b = 0; b < s->src.n_blocks; b++)
            for (int t = 0; t < 16; t++)
                for (int h = 0; h < s->src.n_kv_heads; h++)
                    for (size_t c = 0; c < hb; c++)
                        p[l * lb + ((size_t)b * 16 + t) * row + h * hb + c] =
                            src_byte(kv, l, b, t,
                                     rank * s->src.n_kv_heads + h, (int)c);
    return p;
}

// ---------------------------------------------------------------------------
// Decode side (parent): the exported pool on g_dst_dev

static void check_pool(const scen_t *s, void *d_k, void *d_v)
{
    size_t lb = kv_layout_layer_bytes(&s->dst), row = row_bytes(&s->dst);
    size_t hb = (size_t)s->dst.head_dim * s->dst.elem_size;
    size_t total = lb * s->dst.n_layers;
    uint8_t *h = bt_malloc(total, "test");
    long bad = 0;
    BT_CHECK(h != NULL);
    for (int kv = 0; kv < 2; kv++) {
        CU(cudaMemcpy(h, kv ? d_v : d_k, total, cudaMemcpyDeviceToHost));
        for (int l = 0; l < s->dst.n_layers; l++)
            for (int b = 0; b < s->dst.n_blocks; b++) {
                int pos = -1;
                for (int i = 0; i < s->n; i++)
                    if (s->dst_ids[i] == b)
                        pos = i;
                for (int t = 0; t < 16; t++)
                    for (int hd = 0; hd < s->dst.n_kv_heads; hd++)
                        for (size_t c = 0; c < hb; c++) {
                            uint8_t got = h[l * lb + ((size_t)b * 16 + t) *
                                                         row + hd * hb + c];
                            uint8_t want = pos < 0 ? SENTINEL
                                         : src_byte(kv, l, s->src_ids[pos], t,
                                                    hd, (int)c);
                            bad += got != want;
                        }
            }
    }
    bt_free(h);
    if (bad)
        BT_TEST_FAIL("%ld pool bytes wrong", bad);
}

static void decode_side(int fd, pid_t child)
{
    scen_t s;
    kv_cipc_pool_t *pool = NULL;
    void *d_k = NULL, *d_v = NULL;
    void **kl, **vl;
    size_t lb, len;
    const uint8_t *desc;
    int wstatus;
    uint32_t dlen;

    scen_get(SC_CONTIG, &s); /* the biggest pool serves every scenario */
    if (!g_bench)
        scen_get(SC_CHECK, &s);
    lb = kv_layout_layer_bytes(&s.dst);
    CU(cudaSetDevice(g_dst_dev));
    CU(cudaMalloc(&d_k, lb * s.dst.n_layers));
    CU(cudaMalloc(&d_v, lb * s.dst.n_layers));
    kl = bt_calloc((size_t)s.dst.n_layers * 2, sizeof(void *), "test");
    BT_CHECK(kl != NULL);
    vl = kl + s.dst.n_layers;
    for (int l = 0; l < s.dst.n_layers; l++) {
        kl[l] = (char *)d_k + l * lb;
        vl[l] = (char *)d_v + l * lb;
    }
    BT_ASSERT_OK(kv_cipc_pool_export(&s.dst, kl, vl, g_dst_dev, 4, &pool));
    desc = kv_cipc_pool_desc(pool, &len);
    dlen = (uint32_t)len;
    send_all(fd, &dlen, sizeof(dlen));
    send_all(fd, desc, len);
    for (;;) {
        msg_t m;
        bool arrived = false;
        recv_all(fd, &m, sizeof(m));
        if (m.op == 3)
            break;
        if (m.op == 0) { /* reset the pool for a checked scenario */
            scen_t c;
            scen_get(m.scen, &c);
            BT_CHECK(c.dst.n_layers * kv_layout_layer_bytes(&c.dst) <=
                     (size_t)s.dst.n_layers * lb);
            CU(cudaMemset(d_k, SENTINEL, lb * s.dst.n_layers));
            CU(cudaMemset(d_v, SENTINEL, lb * s.dst.n_layers));
            CU(cudaDeviceSynchronize());
            BT_ASSERT_OK(kv_cipc_pool_slot_reset(pool, 1));
            m.status = 0;
            send_all(fd, &m, sizeof(m));
            continue;
        }
        BT_ASSERT_OK(kv_cipc_pool_has_arrived(pool, 1, m.epoch, &arrived));
        BT_CHECK(arrived);
        if (m.op == 1) {
            scen_t c;
            scen_get(m.scen, &c);
            check_pool(&c, d_k, d_v);
            fprintf(stderr, "  scenario %d: every byte of the pool right\n",
                    m.scen);
        }
        m.status = 0;
        send_all(fd, &m, sizeof(m));
    }
    BT_CHECK(waitpid(child, &wstatus, 0) == child);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        BT_TEST_FAIL("prefill side failed (status %#x)", wstatus);
    kv_cipc_pool_destroy(&pool);
    cudaFree(d_k);
    cudaFree(d_v);
    bt_free(kl);
}

// ---------------------------------------------------------------------------
// Prefill side (child): device g_src_dev

typedef struct {
    void *k[2];   /* per source rank, device */
    void *v[2];
} src_pools_t;

static void src_alloc(const scen_t *s, src_pools_t *p, bool fill)
{
    size_t bytes = kv_layout_layer_bytes(&s->src) * s->src.n_layers;
    for (int r = 0; r < s->tp_src; r++)
        for (int kv = 0; kv < 2; kv++) {
            void **d = kv ? &p->v[r] : &p->k[r];
            CU(cudaMalloc(d, bytes));
            if (fill) {
                uint8_t *img = src_image(s, kv, r);
                CU(cudaMemcpy(*d, img, bytes, cudaMemcpyHostToDevice));
                bt_free(img);
            } else {
                CU(cudaMemset(*d, 0x11 * (kv + 1), bytes));
            }
        }
}

static void src_free(const scen_t *s, src_pools_t *p)
{
    for (int r = 0; r < s->tp_src; r++) {
        cudaFree(p->k[r]);
        cudaFree(p->v[r]);
    }
}

/* Puts every layer from every source rank and commits; waits for it. */
static void handoff(kv_cipc_peer_t *peer, const scen_t *s,
                    const src_pools_t *p, uint64_t epoch)
{
    size_t lb = kv_layout_layer_bytes(&s->src);
    kv_cipc_commit_t *c = NULL;
    bt_status_t st;

    for (int l = 0; l < s->src.n_layers; l++)
        for (int r = 0; r < s->tp_src; r++) {
            kv_reshard_side_t side = kv_reshard_side_rank(&s->src, s->tp_src,
                                                          r);
            if (s->tp_src == 1)
                BT_ASSERT_OK(kv_cipc_put_layer(
                    peer, l, (char *)p->k[r] + l * lb,
                    (char *)p->v[r] + l * lb, &s->src, s->src_ids,
                    s->dst_ids, s->n));
            else
                BT_ASSERT_OK(kv_cipc_put_layer_heads(
                    peer, l, (char *)p->k[r] + l * lb,
                    (char *)p->v[r] + l * lb, &side, 0, s->src_ids,
                    s->dst_ids, s->n));
        }
    BT_ASSERT_OK(kv_cipc_commit(peer, 1, epoch, &c));
    while ((st = kv_cipc_commit_query(c)) == BT_IN_PROGRESS)
        ;
    BT_ASSERT_OK(st);
    kv_cipc_commit_destroy(&c);
}

static void rpc(int fd, int op, int scen, uint64_t epoch)
{
    msg_t m = { .op = op, .scen = scen, .epoch = epoch, .status = -1 };
    send_all(fd, &m, sizeof(m));
    recv_all(fd, &m, sizeof(m));
    BT_ASSERT_EQ(m.status, 0);
}

/* Best time of `reps` copies of `bytes` in one call, device-to-device
 * (peer when the devices differ). */
static double bench_peer_copy(size_t bytes, int reps)
{
    void *a = NULL, *b = NULL;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    float best = 1e30f;

    CU(cudaSetDevice(g_dst_dev));
    CU(cudaMalloc(&b, bytes));
    CU(cudaSetDevice(g_src_dev));
    CU(cudaMalloc(&a, bytes));
    CU(cudaMemset(a, 1, bytes));
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int r = 0; r <= reps; r++) {
        float ms;
        CU(cudaEventRecord(e0, st));
        if (g_src_dev != g_dst_dev)
            CU(cudaMemcpyPeerAsync(b, g_dst_dev, a, g_src_dev, bytes, st));
        else
            CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms < best)
            best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b);
    return best * 1e-3;
}

static void prefill_side(int fd)
{
    kv_cipc_t *ctx = NULL;
    kv_cipc_peer_t *peer = NULL;
    uint8_t desc[1024];
    uint32_t dlen;
    uint64_t epoch = 100;
    static const char *names[N_SC] = { "check", "check-reshard",
                                       "contiguous", "scattered",
                                       "reshard-2to1" };

    recv_all(fd, &dlen, sizeof(dlen));
    BT_CHECK(dlen <= sizeof(desc));
    recv_all(fd, desc, dlen);
    CU(cudaSetDevice(g_src_dev));
    BT_ASSERT_OK(kv_cipc_create(&ctx));
    BT_ASSERT_OK(kv_cipc_connect(ctx, desc, dlen, &peer));
    BT_CHECK(kv_cipc_peer_is_p2p(peer) == (g_src_dev != g_dst_dev));
    fprintf(stderr, "  device %d -> pool on device %d: %s\n", g_src_dev,
            g_dst_dev, kv_cipc_peer_transport(peer));
    if (!g_bench) {
        for (int id = SC_CHECK; id <= SC_CHECK_RESHARD; id++) {
            scen_t s;
            src_pools_t p;
            scen_get(id, &s);
            src_alloc(&s, &p, true);
            rpc(fd, 0, id, 0);
            handoff(peer, &s, &p, ++epoch);
            rpc(fd, 1, id, epoch);
            src_free(&s, &p);
        }
    } else {
        double peer_s;
        scen_t s;
        scen_get(SC_CONTIG, &s);
        peer_s = bench_peer_copy(2 * (size_t)s.n *
                                     kv_layout_block_bytes(&s.dst) *
                                     (size_t)s.dst.n_layers, 5);
        CU(cudaSetDevice(g_src_dev));
        for (int id = SC_CONTIG; id < N_SC; id++) {
            src_pools_t p;
            double best = 1e30;
            size_t bytes;
            uint64_t copies0 = kv_cipc_copies(ctx);
            scen_get(id, &s);
            bytes = 2 * (size_t)s.n * kv_layout_block_bytes(&s.dst) *
                    (size_t)s.dst.n_layers;
            src_alloc(&s, &p, false);
            CU(cudaDeviceSynchronize());
            for (int rep = 0; rep <= 5; rep++) {
                uint64_t t0 = bt_time_ns();
                handoff(peer, &s, &p, ++epoch);
                if (rep > 0)
                    best = BT_MIN(best, (double)(bt_time_ns() - t0) * 1e-9);
                rpc(fd, 2, id, epoch);
            }
            printf("cipc_bench: pattern:%s src_dev:%d dst_dev:%d "
                   "transport:%s bytes:%zu copies:%llu handoff_ms:%.3f "
                   "handoff_GBps:%.1f %s_GBps:%.1f ratio:%.2f\n", names[id],
                   g_src_dev, g_dst_dev, kv_cipc_peer_transport(peer), bytes,
                   (unsigned long long)((kv_cipc_copies(ctx) - copies0) / 6),
                   best * 1e3, bytes / best / 1e9,
                   g_src_dev != g_dst_dev ? "memcpy_peer" : "memcpy_d2d",
                   bytes / peer_s / 1e9, peer_s / best);
            fflush(stdout);
            src_free(&s, &p);
        }
    }
    {
        msg_t bye = { .op = 3 }; /* no reply: the parent stops reading */
        send_all(fd, &bye, sizeof(bye));
    }
    kv_cipc_release(&peer);
    kv_cipc_destroy(&ctx);
}
#endif /* BATON_HAVE_CUDA */

int main(int argc, char **argv)
{
    bt_log_init("test_cuda_ipc");
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    alarm(120);
#ifdef BATON_HAVE_CUDA
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0)
            g_bench = true;
        else if (strcmp(argv[i], "--src-dev") == 0 && i + 1 < argc)
            g_src_dev = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dst-dev") == 0 && i + 1 < argc)
            g_dst_dev = atoi(argv[++i]);
    }
    {
        /* Probe in a child: this process must not initialise CUDA before
         * it forks the prefill side. */
        pid_t pid = fork();
        int wstatus;
        BT_CHECK(pid >= 0);
        if (pid == 0)
            _exit(kv_cipc_is_available() ? 0 : 1);
        BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
        if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
            kv_cipc_t *ctx = NULL;
            BT_CHECK(kv_cipc_create(&ctx) != BT_OK && ctx == NULL);
            BT_TEST_PASS("kv_transport/cuda_ipc (no GPU here: calls fail "
                         "cleanly)");
            return 0;
        }
    }
    {
        int sv[2];
        pid_t pid;
        BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        fflush(stdout);
        pid = fork();
        BT_CHECK(pid >= 0);
        if (pid == 0) {
            close(sv[0]);
            prefill_side(sv[1]);
            fflush(stdout);
            _exit(0);
        }
        close(sv[1]);
        decode_side(sv[0], pid);
        close(sv[0]);
    }
    BT_TEST_PASS("kv_transport/cuda_ipc");
#else
    (void)argc;
    (void)argv;
    {
        kv_cipc_t *ctx = NULL;
        BT_CHECK(kv_cipc_create(&ctx) == BT_ERR_UNSUPPORTED && ctx == NULL);
    }
    BT_TEST_PASS("kv_transport/cuda_ipc (built without CUDA: calls fail "
                 "cleanly)");
#endif
    return 0;
}
