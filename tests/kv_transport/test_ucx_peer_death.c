/*
 * test_ucx_peer_death.c - a decode worker killed with SIGKILL in the
 * middle of KV hand-offs: the prefill side's puts and commits must end
 * (an error, or BT_ERR_TIMEOUT from a bounded wait), never hang, and the
 * peer and context must tear down cleanly with nothing leaked.  Run with
 * peer error handling on (tcp: UCX reports the failure) and off (shared
 * memory: the caller's timeout ends it).  Without peer error handling the
 * caller then abandons the peer (kv_ucx_peer_abandon, as a prefill
 * worker's commit timeout does): a new connect to the pool never returns
 * the abandoned endpoint, and the close returns at once instead of
 * waiting seconds for operations that never complete (a prefill worker's
 * loop stalled there missed its heartbeats and was dropped by the
 * router).  Before the kill, a live peer is abandoned with a commit in
 * flight: its callback runs once, failed, and the closed peer is freed
 * once nothing is in flight (it used to wait for kv_ucx_destroy).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_transport.h"

static const kv_layout_t layout = {
    .n_layers = 2, .n_blocks = 256, .block_size = 16, .n_kv_heads = 4,
    .head_dim = 64, .elem_size = 2
};

/* Decode side: register, send the descriptor, progress until killed. */
static int decode_main(int fd, bool peer_errors)
{
    size_t lb = kv_layout_layer_bytes(&layout), len;
    uint8_t *k = bt_malloc_aligned(lb * 2, "test");
    uint8_t *v = bt_malloc_aligned(lb * 2, "test");
    void *kl[2] = { k, k + lb }, *vl[2] = { v, v + lb };
    kv_ucx_config_t cfg;
    kv_ucx_pool_t *pool = NULL;
    kv_ucx_t *ctx = NULL;
    const uint8_t *desc;
    uint64_t n;

    kv_ucx_config_init(&cfg);
    cfg.peer_errors = peer_errors;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &ctx));
    BT_ASSERT_OK(kv_ucx_pool_register(ctx, &layout, kl, vl, KV_UCX_MEM_HOST,
                                      4, &pool));
    desc = kv_ucx_pool_desc(pool, &len);
    n = len;
    BT_CHECK(write(fd, &n, sizeof(n)) == (ssize_t)sizeof(n));
    BT_CHECK(write(fd, desc, len) == (ssize_t)len);
    for (;;)
        kv_ucx_wait(ctx, 10);
}

static void read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        BT_CHECK(r > 0);
        b += r;
        n -= (size_t)r;
    }
}

/* The peer's operations are stuck (dead process, no peer error
 * handling): abandoning it fails further commits, a connect to the same
 * pool never returns it, and closing takes milliseconds, not seconds. */
static void abandon_and_close(kv_ucx_t *ctx, kv_ucx_peer_t **peer_p,
                              const uint8_t *desc, uint64_t len)
{
    kv_ucx_peer_t *fresh = NULL;
    uint64_t t0;

    BT_CHECK(kv_ucx_peer_pending(*peer_p) > 0);
    kv_ucx_peer_abandon(*peer_p);
    BT_ASSERT_EQ(kv_ucx_commit(*peer_p, 1, 99, NULL, NULL), BT_ERR_NET);
    /* Not the cached endpoint: a new one, or an error (the pool's
     * process is gone, so attaching may fail). */
    if (kv_ucx_connect(ctx, desc, len, &fresh) == BT_OK)
        BT_CHECK(fresh != *peer_p);
    kv_ucx_peer_abandon(fresh); /* its pool is dead too: no close wait */
    t0 = bt_time_ns();
    kv_ucx_disconnect(&fresh);
    kv_ucx_disconnect(peer_p);
    fprintf(stderr, "peer_errors=0: abandoned peers closed in %.1f ms\n",
            (double)(bt_time_ns() - t0) * 1e-6);
    BT_CHECK(bt_time_ns() - t0 < 500000000ull); /* was 4 s and more */
}

static int n_live_cb;
static bt_status_t live_cb_status;

static void live_cb(void *arg, int slot, uint64_t epoch, bt_status_t status)
{
    (void)arg;
    (void)slot;
    (void)epoch;
    n_live_cb++;
    live_cb_status = status;
}

/* A live peer abandoned with a hand-off in flight (a false presumption,
 * or the staged path's abandon racing a completion): the forced close
 * keeps the peer while UCX may still call back, the commit's callback
 * runs once (failed), and the peer is freed as soon as nothing is in
 * flight, not only at kv_ucx_destroy.  *peer_p is then a fresh endpoint
 * to the same pool, which works. */
static void abandon_live(kv_ucx_t *ctx, kv_ucx_peer_t **peer_p,
                         const uint8_t *desc, uint64_t len,
                         const uint8_t *src, const int *ids)
{
    size_t live = bt_alloc_live_count();
    uint64_t t0 = bt_time_ns();

    n_live_cb = 0;
    BT_ASSERT_OK(kv_ucx_put_layer(*peer_p, 1, src, src, &layout,
                                  KV_UCX_MEM_HOST, ids, ids, 64));
    BT_ASSERT_OK(kv_ucx_commit(*peer_p, 2, 7, live_cb, NULL));
    kv_ucx_peer_abandon(*peer_p);
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* the cancelled commit */
    kv_ucx_disconnect(peer_p);
    while (bt_alloc_live_count() >= live && bt_time_ns() - t0 < 5000000000ull)
        kv_ucx_wait(ctx, 10);
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    fprintf(stderr, "abandoned live peer: %d callback(s) (%s), freed: %s "
            "after %.1f ms\n", n_live_cb, bt_status_str(live_cb_status),
            bt_alloc_live_count() < live ? "yes" : "no",
            (double)(bt_time_ns() - t0) * 1e-6);
    BT_ASSERT_EQ(n_live_cb, 1);
    BT_ASSERT_EQ(live_cb_status, BT_ERR_NET); /* never on a closed ep */
    BT_CHECK(bt_alloc_live_count() < live);   /* was kept to destroy */
    BT_ASSERT_OK(kv_ucx_connect(ctx, desc, len, peer_p));
    BT_ASSERT_OK(kv_ucx_put_layer(*peer_p, 0, src, src, &layout,
                                  KV_UCX_MEM_HOST, ids, ids, 64));
    BT_ASSERT_OK(kv_ucx_commit(*peer_p, 3, 8, NULL, NULL));
    BT_ASSERT_OK(kv_ucx_peer_wait(*peer_p, 10000));
}

static void run(bool peer_errors)
{
    size_t lb = kv_layout_layer_bytes(&layout);
    uint8_t *src = bt_malloc_aligned(lb, "test");
    int ids[64], sv[2], wstatus, round;
    kv_ucx_config_t cfg;
    kv_ucx_peer_t *peer = NULL;
    kv_ucx_t *ctx = NULL;
    bt_status_t status = BT_OK;
    uint8_t *desc;
    uint64_t len, t0;
    pid_t pid;

    memset(src, 7, lb);
    for (int i = 0; i < 64; i++)
        ids[i] = 2 * i;
    BT_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(60);
        _exit(decode_main(sv[1], peer_errors));
    }
    close(sv[1]);
    kv_ucx_config_init(&cfg);
    cfg.peer_errors = peer_errors;
    BT_ASSERT_OK(kv_ucx_create(&cfg, &ctx));
    read_all(sv[0], &len, sizeof(len));
    BT_CHECK(len > 0 && len <= KV_UCX_DESC_MAX_BYTES);
    desc = bt_malloc(len, "test");
    read_all(sv[0], desc, len);
    BT_ASSERT_OK(kv_ucx_connect(ctx, desc, len, &peer));

    /* A healthy hand-off first. */
    BT_ASSERT_OK(kv_ucx_put_layer(peer, 0, src, src, &layout,
                                  KV_UCX_MEM_HOST, ids, ids, 64));
    BT_ASSERT_OK(kv_ucx_commit(peer, 0, 1, NULL, NULL));
    BT_ASSERT_OK(kv_ucx_peer_wait(peer, 10000));
    abandon_live(ctx, &peer, desc, len, src, ids);

    /* Kill the decode worker; keep handing off until something fails.
     * Each wait is bounded, so the loop is too. */
    BT_ASSERT_EQ(kill(pid, SIGKILL), 0);
    BT_CHECK(waitpid(pid, &wstatus, 0) == pid);
    t0 = bt_time_ns();
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* expected errors */
    for (round = 0; round < 50 && status == BT_OK; round++) {
        status = kv_ucx_put_layer(peer, round % 2, src, src, &layout,
                                  KV_UCX_MEM_HOST, ids, ids, 64);
        if (status == BT_OK)
            status = kv_ucx_commit(peer, 1, 2 + (uint64_t)round, NULL, NULL);
        if (status == BT_OK)
            status = kv_ucx_peer_wait(peer, 3000);
    }
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    fprintf(stderr, "peer_errors=%d: failed after %d rounds, %.1f s: %s\n",
            peer_errors, round, (double)(bt_time_ns() - t0) * 1e-9,
            bt_status_str(status));
    BT_CHECK(status == BT_ERR_NET || status == BT_ERR_TIMEOUT);
    if (peer_errors)
        BT_ASSERT_EQ(status, BT_ERR_NET);

    bt_log_set_level(BT_LOG_LEVEL_ERROR); /* the close warns */
    if (!peer_errors)
        abandon_and_close(ctx, &peer, desc, len);
    kv_ucx_disconnect(&peer);
    kv_ucx_destroy(&ctx);
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    BT_CHECK((double)(bt_time_ns() - t0) * 1e-9 < 40);
    close(sv[0]);
    bt_free(desc);
    bt_free(src);
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
}

int main(int argc, char **argv)
{
#if defined(__SANITIZE_THREAD__)
    /* UCX's memory hooks (UCM, installed when the library loads) crash
     * inside ThreadSanitizer's interceptors: run again without them. */
    if (argc > 0 && getenv("UCX_MEM_EVENTS") == NULL) {
        setenv("UCX_MEM_EVENTS", "no", 1);
        execv("/proc/self/exe", argv);
    }
#endif
    (void)argc;
    (void)argv;
    bt_log_init("test_kv_ucx_death");
    bt_log_set_level(BT_LOG_LEVEL_WARN);
    setenv("UCX_TLS", "tcp,sm,self", 0);
    signal(SIGPIPE, SIG_IGN);
    alarm(58);
    run(true);
    run(false);
    BT_TEST_PASS("kv_transport/ucx_peer_death");
    return 0;
}
