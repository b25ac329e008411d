/*
 * test_fd_channel.c - the FD channel of the CUDA IPC link's windows
 * (worker/kv/kv_fd_channel.h) between real processes, memfds standing in
 * for the CUDA handles: this process serves, children (this binary run
 * again with a role) fetch.
 *
 *   - an FD is handed for a live token, once: the child reads what the
 *     server wrote into the memfd and writes back into the same memory;
 *   - a wrong token, a revoked (ended) token and a token already handed
 *     are refused with a status, never an FD;
 *   - an offer bound to a pid is refused to another process (and kept
 *     for its own: this process fetches it);
 *   - a peer of another uid (a child that drops to uid 65534, when the
 *     test runs as root; the check itself is unit-tested always) is
 *     refused;
 *   - malformed requests (bad magic, bad version, short then closed,
 *     silent) are refused or dropped after the deadline and change
 *     nothing: a live offer is still handed afterwards;
 *   - every wait has a deadline: a fetch from a socket that never
 *     answers ends in BT_ERR_TIMEOUT within its timeout, a fetch from no
 *     socket fails at once.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_fd_channel.h"

#define CHILD_DEADLINE_MS 5000

static const char *self_exe;

static void hex_encode(const uint8_t *t, char *out)
{
    for (int i = 0; i < KV_FDCH_TOKEN_BYTES; i++)
        sprintf(out + 2 * i, "%02x", t[i]);
}

static bool hex_decode(const char *s, uint8_t *t)
{
    if (strlen(s) != 2 * KV_FDCH_TOKEN_BYTES)
        return false;
    for (int i = 0; i < KV_FDCH_TOKEN_BYTES; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return false;
        t[i] = (uint8_t)v;
    }
    return true;
}

// ---------------------------------------------------------------------------
// Children

/* fetch NAME TOKEN EXPECT [nobody]: EXPECT is "ok:TEXT" (the memfd starts
 * with TEXT; the child writes "child" at offset 64) or "refused:CODE". */
static int child_fetch(char **argv, int argc)
{
    uint8_t token[KV_FDCH_TOKEN_BYTES];
    const char *expect = argv[4];
    int fd = -1, refusal = -1;
    bt_status_t status;

    if (argc > 5 && strcmp(argv[5], "nobody") == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            return 3;
    }
    if (!hex_decode(argv[3], token))
        return 4;
    status = kv_fdch_fetch(argv[2], token, 2000, &fd, &refusal);
    bt_error_clear();
    if (strncmp(expect, "ok:", 3) == 0) {
        char buf[64] = { 0 };
        size_t n = strlen(expect + 3);
        if (status != BT_OK || fd < 0)
            return 10;
        if (pread(fd, buf, n, 0) != (ssize_t)n || memcmp(buf, expect + 3, n))
            return 11;
        if (pwrite(fd, "child", 5, 64) != 5)
            return 12;
        close(fd);
        return 0;
    }
    if (strncmp(expect, "refused:", 8) == 0) {
        if (status != BT_ERR_NOT_FOUND || fd != -1)
            return 20;
        return refusal == atoi(expect + 8) ? 0 : 21;
    }
    return 5;
}

/* garbage NAME KIND: a malformed request; exits 0 when the server
 * answered as expected (refusal, or closed the connection). */
static int child_garbage(char **argv)
{
    const char *kind = argv[3];
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t n = strlen(argv[2]);
    uint8_t req[24] = { 0 }, rep[24];
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = { 2, 0 };
    ssize_t got;

    memcpy(sa.sun_path + 1, argv[2], n);
    if (s < 0 || connect(s, (struct sockaddr *)&sa,
                         (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                     1 + n)) != 0)
        return 30;
    (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    memcpy(req, "BKFD", 4);
    req[4] = 1;
    if (strcmp(kind, "magic") == 0)
        req[0] = 'X';
    else if (strcmp(kind, "version") == 0)
        req[4] = 9;
    if (strcmp(kind, "short") == 0) {
        if (send(s, req, 10, MSG_NOSIGNAL) != 10)
            return 31;
        shutdown(s, SHUT_WR);
    } else if (strcmp(kind, "silent") == 0) {
        /* nothing: the server must drop us after its deadline */
    } else if (send(s, req, sizeof(req), MSG_NOSIGNAL) != sizeof(req)) {
        return 32;
    }
    got = recv(s, rep, sizeof(rep), MSG_WAITALL);
    close(s);
    if (strcmp(kind, "short") == 0 || strcmp(kind, "silent") == 0)
        return got == 0 ? 0 : 33; /* dropped without an answer */
    if (got != (ssize_t)sizeof(rep) || memcmp(rep, "BKFD", 4) != 0)
        return 34;
    return rep[4] == KV_FDCH_MALFORMED ? 0 : 35;
}

// ---------------------------------------------------------------------------
// Parent

/* Runs this binary with `args` and returns its exit code (-1: killed at
 * the deadline or by a signal). */
static int run_child(const char *const *args)
{
    char *argv[8];
    uint64_t until = bt_time_ns() + CHILD_DEADLINE_MS * 1000000ull;
    int n = 0, st = 0;
    pid_t pid;

    argv[n++] = (char *)self_exe;
    for (; args[n - 1] != NULL && n < 7; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    pid = fork();
    BT_CHECK(pid >= 0);
    if (pid == 0) {
        execv(self_exe, argv);
        _exit(127);
    }
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (bt_time_ns() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(2000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int make_memfd(const char *text)
{
    int fd = memfd_create("kvfd-test", MFD_CLOEXEC);

    BT_CHECK(fd >= 0);
    BT_CHECK(ftruncate(fd, 4096) == 0);
    BT_CHECK(pwrite(fd, text, strlen(text), 0) == (ssize_t)strlen(text));
    return fd;
}

static void new_token(uint8_t *t, char *hex)
{
    BT_ASSERT_OK(bt_random_secret(t, KV_FDCH_TOKEN_BYTES));
    hex_encode(t, hex);
}

static void test_peer_check(void)
{
    BT_CHECK(kv_fdch__peer_allowed(1000, 7, 1000, 0));
    BT_CHECK(kv_fdch__peer_allowed(1000, 7, 1000, 7));
    BT_CHECK(!kv_fdch__peer_allowed(1000, 8, 1000, 7));
    BT_CHECK(!kv_fdch__peer_allowed(1001, 7, 1000, 0));
    BT_CHECK(!kv_fdch__peer_allowed(0, 7, 1000, 7));
    BT_TEST_PASS("fd_channel peer check");
}

static void test_channel(void)
{
    kv_fdch_t *ch = NULL;
    uint8_t ta[KV_FDCH_TOKEN_BYTES], tb[KV_FDCH_TOKEN_BYTES];
    uint8_t tc[KV_FDCH_TOKEN_BYTES], tw[KV_FDCH_TOKEN_BYTES];
    char ha[40], hb[40], hc[40], hw[40], refused[16], buf[8] = { 0 };
    int fa = make_memfd("window A"), fb = make_memfd("window B");
    int fc = make_memfd("window C");
    uint64_t refused0;
    const char *name;

    BT_ASSERT_OK(kv_fdch_create(&ch));
    name = kv_fdch_name(ch);
    new_token(ta, ha);
    new_token(tb, hb);
    new_token(tc, hc);
    new_token(tw, hw);
    BT_ASSERT_OK(kv_fdch_offer(ch, ta, fa, 0));
    BT_ASSERT_OK(kv_fdch_offer(ch, tb, fb, 0));
    /* a token offered twice is a caller bug: refused, nothing changes */
    BT_ASSERT_EQ(kv_fdch_offer(ch, ta, fb, 0), BT_ERR_INVALID_ARG);
    bt_error_clear();

    /* live token: handed; the child shares the memory */
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, ha,
                                             "ok:window A", NULL }), 0);
    BT_CHECK(pread(fa, buf, 5, 64) == 5 && memcmp(buf, "child", 5) == 0);
    BT_ASSERT_EQ(kv_fdch_handed(ch), 1);
    /* handed once: a second request for A is refused */
    snprintf(refused, sizeof(refused), "refused:%d", KV_FDCH_UNKNOWN);
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, ha, refused,
                                             NULL }), 0);
    /* a wrong token */
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, hw, refused,
                                             NULL }), 0);
    /* the reservation of B ended: revoked, refused */
    BT_CHECK(kv_fdch_revoke(ch, tb));
    BT_CHECK(!kv_fdch_revoke(ch, tb));
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, hb, refused,
                                             NULL }), 0);
    BT_ASSERT_EQ(kv_fdch_handed(ch), 1);
    BT_TEST_PASS("fd_channel live / handed / wrong / revoked");

    /* bound to a pid: another process is refused, the offer stays */
    BT_ASSERT_OK(kv_fdch_offer(ch, tc, fc, getpid()));
    snprintf(refused, sizeof(refused), "refused:%d", KV_FDCH_PEER);
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, hc, refused,
                                             NULL }), 0);
    {
        int fd = -1;
        BT_ASSERT_OK(kv_fdch_fetch(name, tc, 2000, &fd, NULL));
        BT_CHECK(fd >= 0 && pread(fd, buf, 8, 0) == 8 &&
                 memcmp(buf, "window C", 8) == 0);
        close(fd);
    }
    BT_TEST_PASS("fd_channel pid-bound offer");

    /* another uid: refused before the request is read */
    BT_ASSERT_OK(kv_fdch_offer(ch, tb, fb, 0)); /* a live offer again */
    if (geteuid() == 0) {
        BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, hb,
                                                 refused, "nobody", NULL }),
                     0);
        BT_TEST_PASS("fd_channel other uid refused");
    } else {
        fprintf(stderr, "SKIP other-uid peer (not root; check unit-tested)\n");
    }

    /* malformed requests: refused or dropped, counted, nothing changes */
    refused0 = kv_fdch_refused(ch);
    {
        uint64_t t0 = bt_time_ns();
        BT_ASSERT_EQ(run_child((const char *[]){ "garbage", name, "magic",
                                                 NULL }), 0);
        BT_ASSERT_EQ(run_child((const char *[]){ "garbage", name, "version",
                                                 NULL }), 0);
        BT_ASSERT_EQ(run_child((const char *[]){ "garbage", name, "short",
                                                 NULL }), 0);
        BT_ASSERT_EQ(run_child((const char *[]){ "garbage", name, "silent",
                                                 NULL }), 0);
        /* the silent one was dropped after the deadline, not hung */
        BT_CHECK(bt_time_ns() - t0 < 3000000000ull);
    }
    BT_ASSERT_EQ(kv_fdch_refused(ch) - refused0, 4);
    BT_ASSERT_EQ(run_child((const char *[]){ "fetch", name, hb,
                                             "ok:window B", NULL }), 0);
    BT_TEST_PASS("fd_channel malformed requests change nothing");

    kv_fdch_destroy(&ch);
    BT_CHECK(ch == NULL);
    close(fa);
    close(fb);
    close(fc);
}

/* Deadlines on the client side. */
static void test_deadlines(void)
{
    uint8_t t[KV_FDCH_TOKEN_BYTES] = { 1 };
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    const char *mute = "baton-kvfd-test-mute";
    uint64_t t0;
    int fd = -1, s;

    /* nobody listens: fails at once */
    t0 = bt_time_ns();
    BT_CHECK(kv_fdch_fetch("baton-kvfd-test-nobody", t, 2000, &fd, NULL) !=
             BT_OK);
    BT_CHECK(bt_time_ns() - t0 < 500000000ull);
    /* a listener that never accepts nor answers: the timeout ends it */
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memcpy(sa.sun_path + 1, mute, strlen(mute));
    BT_CHECK(bind(s, (struct sockaddr *)&sa,
                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                              strlen(mute))) == 0);
    BT_CHECK(listen(s, 4) == 0);
    t0 = bt_time_ns();
    BT_ASSERT_EQ(kv_fdch_fetch(mute, t, 300, &fd, NULL), BT_ERR_TIMEOUT);
    BT_CHECK(bt_time_ns() - t0 >= 250000000ull);
    BT_CHECK(bt_time_ns() - t0 < 1500000000ull);
    BT_ASSERT_EQ(fd, -1);
    close(s);
    /* bad arguments */
    BT_ASSERT_EQ(kv_fdch_fetch("", t, 100, &fd, NULL), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_fdch_fetch(mute, t, 0, &fd, NULL), BT_ERR_INVALID_ARG);
    bt_error_clear();
    BT_TEST_PASS("fd_channel client deadlines");
}

int main(int argc, char **argv)
{
    self_exe = "/proc/self/exe";
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    if (argc >= 5 && strcmp(argv[1], "fetch") == 0)
        return child_fetch(argv, argc);
    if (argc >= 4 && strcmp(argv[1], "garbage") == 0)
        return child_garbage(argv);
    {
        static char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        BT_CHECK(n > 0);
        exe[n] = '\0';
        self_exe = exe;
    }
    signal(SIGPIPE, SIG_IGN);
    test_peer_check();
    test_deadlines();
    test_channel();
    return 0;
}
