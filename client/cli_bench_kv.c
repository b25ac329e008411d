/*
 * cli_bench_kv.c - `baton bench-kv`: UCX KV hand-off bandwidth over
 * loopback, as a fraction of a plain memcpy of the same bytes.
 *
 * Two processes (fork): a decode side that registers a KV pool of twice
 * the blocks needed and keeps progressing UCX, and a prefill side that
 * hands one prompt's KV over, layer by layer then a commit (flush, epoch
 * put, flush), and times it until the commit completes.  Three block-list
 * patterns: contiguous (one put per layer per K/V), runs of 4 blocks, and
 * fully scattered single blocks.  The memcpy baseline copies the same runs
 * between two pre-faulted buffers in one process, one thread.
 *
 * Default shape: Llama-3.2-1B-like (16 layers, 8 KV heads, head_dim 64,
 * bf16), a 2048-token prompt, 16-token blocks: 64 MiB of K+V.
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
#include "bt_util.h"
#include "cli.h"
#include "kv/kv_transport.h"

#define BENCH_KV_WAIT_MS 30000
#define BENCH_KV_PATTERNS 3

typedef struct {
    kv_layout_t src;      /* prefill pool: exactly the prompt's blocks */
    kv_layout_t dst;      /* decode pool: twice as many blocks */
    int n;                /* blocks per layer in one hand-off */
    int iters;            /* timed hand-offs per pattern */
    bool verbose;         /* print UCX endpoint info */
    bool ucx_pool;        /* decode pool from kv_ucx_mem_alloc (shm) */
    kv_ucx_config_t ucx;  /* UCX options */
} bench_kv_t;

static const char *bench_kv_names[BENCH_KV_PATTERNS] = {
    "contiguous", "runs-of-4", "scattered"
};

static void bench_kv_usage(FILE *out)
{
    fprintf(out,
            "usage: baton bench-kv [--tokens N | --bytes N] [--block-size B]\n"
            "         [--layers L] [--kv-heads H] [--head-dim D]"
            " [--elem-size 2|4]\n"
            "         [--iters N] [--no-peer-errors] [--no-wakeup]"
            " [--verbose]\n"
            "         [--pool-alloc ucx|malloc]\n"
            "Hands one prompt's KV from a prefill process to a decode "
            "process over UCX\n(loopback) and compares with memcpy. "
            "UCX_TLS defaults to tcp,sm,self.\n");
}

/* Destination ids for pattern p (source ids are 0..n-1). */
static void bench_kv_dst_ids(int pattern, int n, int *dst)
{
    if (pattern == 0) {
        for (int i = 0; i < n; i++)
            dst[i] = i;
    } else if (pattern == 1) {
        for (int i = 0; i < n; i++)
            dst[(i / 4) * 4 + i % 4] = (i / 4) * 8 + i % 4;
    } else {
        /* Even ids in a shuffled order: no two adjacent in either list. */
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < n; i++)
            dst[i] = 2 * i;
        for (int i = n - 1; i > 0; i--) {
            int j;
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            j = (int)(s % (uint64_t)(i + 1));
            BT_ASSERT(j <= i);
            int t = dst[i];
            dst[i] = dst[j];
            dst[j] = t;
        }
        /* A shuffle can put 2k, 2k+2 next to each other; they are not
         * adjacent blocks, so every pair stays its own put. */
    }
}

static int bench_kv_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// ----------------------------------------------------------------------------
// Socket helpers (bounded waits, progressing UCX meanwhile)

static int bench_kv_send(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t r = write(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int bench_kv_recv(kv_ucx_t *ctx, int fd, void *p, size_t n)
{
    uint8_t *b = p;
    uint64_t deadline = bt_time_ns() + (uint64_t)BENCH_KV_WAIT_MS * 1000000 *
                                           10;
    while (n > 0) {
        struct pollfd pfd[2] = { { fd, POLLIN, 0 }, { -1, POLLIN, 0 } };
        int timeout = 100;
        ssize_t r;
        if (ctx != NULL) {
            kv_ucx_progress(ctx);
            pfd[1].fd = kv_ucx_event_fd(ctx);
            if (pfd[1].fd < 0)
                timeout = 0; /* no event fd: spin */
            else if (kv_ucx_arm(ctx) != BT_OK)
                continue;
        }
        if (bt_time_ns() > deadline)
            return -1;
        if (poll(pfd, 2, timeout) < 0 && errno != EINTR)
            return -1;
        if (!(pfd[0].revents & (POLLIN | POLLHUP)))
            continue;
        r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Decode side

static int bench_kv_decode(const bench_kv_t *bk, int fd)
{
    size_t bb = kv_layout_block_bytes(&bk->dst);
    size_t lb = bb * (size_t)bk->dst.n_blocks;
    size_t total = lb * (size_t)bk->dst.n_layers;
    void **k = NULL, **v = NULL;
    uint8_t *kmem = NULL, *vmem = NULL;
    kv_ucx_pool_t *pool = NULL;
    kv_ucx_t *ctx = NULL;
    const uint8_t *desc;
    uint64_t len;
    size_t dlen;
    int rc = 1;
    char bye;

    if (kv_ucx_create(&bk->ucx, &ctx) != BT_OK)
        goto out;
    if (bk->ucx_pool) {
        if (kv_ucx_mem_alloc(ctx, total, KV_UCX_MEM_HOST,
                             (void **)&kmem) != BT_OK ||
            kv_ucx_mem_alloc(ctx, total, KV_UCX_MEM_HOST,
                             (void **)&vmem) != BT_OK)
            goto out;
    } else {
        kmem = bt_malloc_aligned(total, "bench_kv_pool");
        vmem = bt_malloc_aligned(total, "bench_kv_pool");
    }
    k = bt_calloc((size_t)bk->dst.n_layers, sizeof(*k), "bench_kv");
    v = bt_calloc((size_t)bk->dst.n_layers, sizeof(*v), "bench_kv");
    if (kmem == NULL || vmem == NULL || k == NULL || v == NULL)
        goto out;
    memset(kmem, 0, total); /* pre-fault */
    memset(vmem, 0, total);
    for (int l = 0; l < bk->dst.n_layers; l++) {
        k[l] = kmem + (size_t)l * lb;
        v[l] = vmem + (size_t)l * lb;
    }
    if (kv_ucx_pool_register(ctx, &bk->dst, k, v, KV_UCX_MEM_HOST, 4,
                             &pool) != BT_OK)
        goto out;
    desc = kv_ucx_pool_desc(pool, &dlen);
    len = dlen;
    if (bench_kv_send(fd, &len, sizeof(len)) != 0 ||
        bench_kv_send(fd, desc, dlen) != 0)
        goto out;
    /* Serve (progress) until the prefill side says it is done. */
    if (bench_kv_recv(ctx, fd, &bye, 1) != 0)
        goto out;
    rc = 0;
out:
    kv_ucx_pool_deregister(&pool);
    if (bk->ucx_pool && ctx != NULL) {
        kv_ucx_mem_free(ctx, (void **)&kmem);
        kv_ucx_mem_free(ctx, (void **)&vmem);
    } else {
        bt_free(kmem);
        bt_free(vmem);
    }
    kv_ucx_destroy(&ctx);
    bt_free(k);
    bt_free(v);
    return rc;
}

// ----------------------------------------------------------------------------
// Prefill side

typedef struct {
    double ucx_s;      /* median hand-off seconds */
    double ucx_best_s; /* fastest hand-off */
    double copy_s;     /* median memcpy seconds */
    uint64_t puts;     /* puts per hand-off */
} bench_kv_result_t;

static void bench_kv_commit_cb(void *arg, int slot, uint64_t epoch,
                               bt_status_t status)
{
    *(bt_status_t *)arg = status;
}

/* One hand-off: every layer, then the commit; returns seconds or -1. */
static double bench_kv_handoff(kv_ucx_peer_t *peer, const bench_kv_t *bk,
                               uint8_t *const *sk, uint8_t *const *sv,
                               const int *src, const int *dst,
                               uint64_t epoch)
{
    bt_status_t done = BT_IN_PROGRESS;
    uint64_t t0 = bt_time_ns();

    for (int l = 0; l < bk->src.n_layers; l++)
        if (kv_ucx_put_layer(peer, l, sk[l], sv[l], &bk->src,
                             KV_UCX_MEM_HOST, src, dst, bk->n) != BT_OK)
            return -1;
    if (kv_ucx_commit(peer, 0, epoch, bench_kv_commit_cb, &done) != BT_OK ||
        kv_ucx_peer_wait(peer, BENCH_KV_WAIT_MS) != BT_OK || done != BT_OK)
        return -1;
    return (double)(bt_time_ns() - t0) * 1e-9;
}

static int bench_kv_prefill(const bench_kv_t *bk, int fd)
{
    size_t bb = kv_layout_block_bytes(&bk->src);
    size_t lb = bb * (size_t)bk->src.n_blocks;
    size_t dlb = bb * (size_t)bk->dst.n_blocks;
    size_t bytes = 2 * lb * (size_t)bk->src.n_layers;
    bench_kv_result_t res[BENCH_KV_PATTERNS];
    uint8_t **sk = NULL, **sv = NULL, *dk = NULL, *dv = NULL;
    int *src = NULL, *dst = NULL;
    double *t = NULL;
    kv_ucx_peer_t *peer = NULL;
    kv_ucx_t *ctx = NULL;
    uint8_t *desc = NULL;
    uint64_t len = 0, epoch = 1;
    int rc = 1;

    sk = bt_calloc((size_t)bk->src.n_layers, sizeof(*sk), "bench_kv");
    sv = bt_calloc((size_t)bk->src.n_layers, sizeof(*sv), "bench_kv");
    src = bt_calloc((size_t)bk->n, sizeof(*src), "bench_kv");
    dst = bt_calloc((size_t)bk->n, sizeof(*dst), "bench_kv");
    t = bt_calloc((size_t)bk->iters, sizeof(*t), "bench_kv");
    if (sk == NULL || sv == NULL || src == NULL || dst == NULL || t == NULL)
        goto out;
    for (int l = 0; l < bk->src.n_layers; l++) {
        sk[l] = bt_malloc_aligned(lb, "bench_kv_src");
        sv[l] = bt_malloc_aligned(lb, "bench_kv_src");
        if (sk[l] == NULL || sv[l] == NULL)
            goto out;
        for (size_t j = 0; j < lb; j++) {
            sk[l][j] = (uint8_t)(j * 7 + (size_t)l);
            sv[l][j] = (uint8_t)(j * 13 + (size_t)l);
        }
    }
    for (int i = 0; i < bk->n; i++)
        src[i] = i;

    if (kv_ucx_create(&bk->ucx, &ctx) != BT_OK)
        goto out;
    if (bench_kv_recv(ctx, fd, &len, sizeof(len)) != 0 || len == 0 ||
        len > KV_UCX_DESC_MAX_BYTES)
        goto out;
    desc = bt_malloc(len, "bench_kv");
    if (desc == NULL || bench_kv_recv(ctx, fd, desc, len) != 0 ||
        kv_ucx_connect(ctx, desc, len, &peer) != BT_OK)
        goto out;
    if (bk->verbose)
        kv_ucx_peer_print_info(peer, stdout);

    for (int p = 0; p < BENCH_KV_PATTERNS; p++) {
        uint64_t puts0;
        bench_kv_dst_ids(p, bk->n, dst);
        /* Warm-up (connection wire-up, registration caches). */
        if (bench_kv_handoff(peer, bk, sk, sv, src, dst, epoch++) < 0)
            goto out;
        puts0 = kv_ucx_peer_puts(peer);
        for (int it = 0; it < bk->iters; it++) {
            t[it] = bench_kv_handoff(peer, bk, sk, sv, src, dst, epoch++);
            if (t[it] < 0)
                goto out;
        }
        res[p].puts = (kv_ucx_peer_puts(peer) - puts0) / (uint64_t)bk->iters;
        qsort(t, (size_t)bk->iters, sizeof(*t), bench_kv_cmp_double);
        res[p].ucx_s = t[bk->iters / 2];
        res[p].ucx_best_s = t[0];
    }
    kv_ucx_disconnect(&peer);
    if (bench_kv_send(fd, "q", 1) != 0)
        goto out;

    /* memcpy baseline: the same runs into a pool-sized destination. */
    dk = bt_malloc_aligned(dlb * (size_t)bk->dst.n_layers, "bench_kv_copy");
    dv = bt_malloc_aligned(dlb * (size_t)bk->dst.n_layers, "bench_kv_copy");
    if (dk == NULL || dv == NULL)
        goto out;
    memset(dk, 0, dlb * (size_t)bk->dst.n_layers);
    memset(dv, 0, dlb * (size_t)bk->dst.n_layers);
    for (int p = 0; p < BENCH_KV_PATTERNS; p++) {
        bench_kv_dst_ids(p, bk->n, dst);
        for (int it = -1; it < bk->iters; it++) {
            uint64_t t0 = bt_time_ns();
            for (int l = 0; l < bk->src.n_layers; l++) {
                for (int i = 0, run; i < bk->n; i += run) {
                    size_t doff = (size_t)l * dlb + (size_t)dst[i] * bb;
                    for (run = 1; i + run < bk->n &&
                                  src[i + run] == src[i] + run &&
                                  dst[i + run] == dst[i] + run;
                         run++)
                        ;
                    memcpy(dk + doff, sk[l] + (size_t)src[i] * bb,
                           (size_t)run * bb);
                    memcpy(dv + doff, sv[l] + (size_t)src[i] * bb,
                           (size_t)run * bb);
                }
            }
            if (it >= 0)
                t[it] = (double)(bt_time_ns() - t0) * 1e-9;
        }
        qsort(t, (size_t)bk->iters, sizeof(*t), bench_kv_cmp_double);
        res[p].copy_s = t[bk->iters / 2];
    }

    printf("bench-kv: %d layers x %d kv heads x %d head_dim x %zu B, "
           "%d tokens in %d blocks of %d -> %.1f MiB per hand-off\n",
           bk->src.n_layers, bk->src.n_kv_heads, bk->src.head_dim,
           bk->src.elem_size, bk->n * bk->src.block_size, bk->n,
           bk->src.block_size, (double)bytes / (1 << 20));
    printf("UCX_TLS=%s pool=%s peer_errors=%s wakeup=%s, %d hand-offs per "
           "pattern (median)\n",
           getenv("UCX_TLS") ? getenv("UCX_TLS") : "(all)",
           bk->ucx_pool ? "ucx" : "malloc",
           bk->ucx.peer_errors ? "on" : "off", bk->ucx.wakeup ? "on" : "off",
           bk->iters);
    printf("%-11s %8s %9s %9s %9s %9s %8s\n", "pattern", "puts", "ucx_ms",
           "ucx_GB/s", "best_GB/s", "cpy_GB/s", "ucx/cpy");
    for (int p = 0; p < BENCH_KV_PATTERNS; p++) {
        double g = (double)bytes / res[p].ucx_s * 1e-9;
        double gb = (double)bytes / res[p].ucx_best_s * 1e-9;
        double gc = (double)bytes / res[p].copy_s * 1e-9;
        printf("%-11s %8llu %9.2f %9.2f %9.2f %9.2f %8.3f\n",
               bench_kv_names[p], (unsigned long long)res[p].puts,
               res[p].ucx_s * 1e3, g, gb, gc, g / gc);
    }
    for (int p = 0; p < BENCH_KV_PATTERNS; p++)
        printf("bench_kv pattern:%s bytes:%zu puts:%llu ucx_ms:%.3f "
               "ucx_gbps:%.3f memcpy_gbps:%.3f ratio:%.4f\n",
               bench_kv_names[p], bytes, (unsigned long long)res[p].puts,
               res[p].ucx_s * 1e3, (double)bytes / res[p].ucx_s * 1e-9,
               (double)bytes / res[p].copy_s * 1e-9,
               res[p].copy_s / res[p].ucx_s);
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "baton bench-kv: failed: %s\n", bt_error_last());
    kv_ucx_disconnect(&peer);
    kv_ucx_destroy(&ctx);
    if (sk != NULL && sv != NULL)
        for (int l = 0; l < bk->src.n_layers; l++) {
            bt_free(sk[l]);
            bt_free(sv[l]);
        }
    bt_free(sk);
    bt_free(sv);
    bt_free(dk);
    bt_free(dv);
    bt_free(src);
    bt_free(dst);
    bt_free(t);
    bt_free(desc);
    return rc;
}

// ----------------------------------------------------------------------------
// Entry

int cli_bench_kv_main(int argc, char **argv)
{
    bench_kv_t bk;
    int tokens = 2048, wstatus = 0, sv[2], rc;
    uint64_t want_bytes = 0;
    size_t token_bytes;
    pid_t pid;

    memset(&bk, 0, sizeof(bk));
    bk.src.n_layers = 16;
    bk.src.n_kv_heads = 8;
    bk.src.head_dim = 64;
    bk.src.elem_size = 2;
    bk.src.block_size = 16;
    bk.iters = 10;
    bk.ucx_pool = true;
    kv_ucx_config_init(&bk.ucx);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int *ip = NULL, e;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_kv_usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-peer-errors") == 0) {
            bk.ucx.peer_errors = false;
            continue;
        } else if (strcmp(a, "--no-wakeup") == 0) {
            bk.ucx.wakeup = false;
            continue;
        } else if (strcmp(a, "--pool-alloc") == 0) {
            if (val == NULL ||
                (strcmp(val, "ucx") != 0 && strcmp(val, "malloc") != 0))
                goto usage;
            bk.ucx_pool = strcmp(val, "ucx") == 0;
            i++;
            continue;
        } else if (strcmp(a, "--verbose") == 0) {
            bk.verbose = true;
            continue;
        } else if (strcmp(a, "--bytes") == 0) {
            if (val == NULL || bt_parse_u64(val, &want_bytes) != BT_OK ||
                want_bytes == 0)
                goto usage;
            i++;
            continue;
        } else if (strcmp(a, "--tokens") == 0) {
            ip = &tokens;
        } else if (strcmp(a, "--block-size") == 0) {
            ip = &bk.src.block_size;
        } else if (strcmp(a, "--layers") == 0) {
            ip = &bk.src.n_layers;
        } else if (strcmp(a, "--kv-heads") == 0) {
            ip = &bk.src.n_kv_heads;
        } else if (strcmp(a, "--head-dim") == 0) {
            ip = &bk.src.head_dim;
        } else if (strcmp(a, "--iters") == 0) {
            ip = &bk.iters;
        } else if (strcmp(a, "--elem-size") == 0) {
            if (val == NULL || bt_parse_int(val, &e) != BT_OK ||
                (e != 2 && e != 4))
                goto usage;
            bk.src.elem_size = (size_t)e;
            i++;
            continue;
        } else {
            goto usage;
        }
        if (val == NULL || bt_parse_int(val, ip) != BT_OK || *ip < 1 ||
            *ip > (1 << 20))
            goto usage;
        i++;
    }
    token_bytes = 2 * (size_t)bk.src.n_layers * (size_t)bk.src.n_kv_heads *
                  (size_t)bk.src.head_dim * bk.src.elem_size;
    if (want_bytes > 0)
        tokens = (int)BT_MAX(want_bytes / token_bytes, 1);
    bk.n = BT_DIV_UP(tokens, bk.src.block_size);
    bk.src.n_blocks = bk.n;
    bk.dst = bk.src;
    bk.dst.n_blocks = 2 * bk.n;

    setenv("UCX_TLS", "tcp,sm,self", 0);
    signal(SIGPIPE, SIG_IGN);
    fflush(stdout);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("baton bench-kv: socketpair");
        return 1;
    }
    pid = fork();
    if (pid < 0) {
        perror("baton bench-kv: fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[1]);
        _exit(bench_kv_decode(&bk, sv[0]));
    }
    close(sv[0]);
    rc = bench_kv_prefill(&bk, sv[1]);
    close(sv[1]);
    if (waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus) ||
        WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "baton bench-kv: decode process failed\n");
        rc = 1;
    }
    return rc;

usage:
    bench_kv_usage(stderr);
    return 2;
}
