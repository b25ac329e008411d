/*
 * test_curve_startup.c - the CURVE start-up rules (docs/SECURITY.md):
 *   1. a missing or unreadable key file stops the router, a worker and
 *      the CLI with an error naming the file;
 *   2. without keys the router refuses a non-loopback --listen or
 *      --control (tcp://[*]:P) unless --insecure, which it then logs and
 *      reports in the cluster status ("insecure"; "loopback" otherwise);
 *   3. half a configuration (a secret key without allow lists, allow lists
 *      without a key, a worker key without the router's) is an error.
 */
#include <sys/stat.h>

#include "bt_curve.h"
#include "cluster/cluster_util.h"

static char g_dir[256];

static bool file_has(const char *path, const char *needle)
{
    char *text = NULL;
    size_t len;
    bool found;

    if (bt_read_file(path, 1 << 20, &text, &len) != BT_OK)
        return false;
    found = strstr(text, needle) != NULL;
    if (!found)
        fprintf(stderr, "%s lacks '%s':\n%s\n", path, needle, text);
    bt_free(text);
    return found;
}

/* Runs exe with the given arguments; expects it to exit non-zero within
 * 10 s with `needle` in its stderr. */
#define EXPECT_FAIL(needle, exe, ...)                                        \
    do {                                                                     \
        char log_[320];                                                      \
        pid_t p_;                                                            \
        int code_;                                                           \
        snprintf(log_, sizeof(log_), "%s/fail.log", g_dir);                  \
        p_ = cu_spawn_log(log_, exe, __VA_ARGS__, NULL);                     \
        code_ = cu_wait_exit(p_, 10000);                                     \
        if (code_ == -1)                                                     \
            cu_kill(p_, SIGKILL);                                            \
        fprintf(stderr, "  %s ... exits %d\n", exe, code_);                  \
        BT_CHECK(code_ > 0);                                                 \
        BT_CHECK(file_has(log_, needle));                                    \
    } while (0)

static const char *security_of(client_t *c)
{
    static char sec[32];
    uint64_t rid;

    BT_ASSERT_OK(client_status_request(c, &rid));
    for (;;) {
        Baton__ClientMessage *m = NULL;
        BT_ASSERT_OK(client_recv(c, 5000, &m));
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS) {
            snprintf(sec, sizeof(sec), "%s",
                     m->status->security ? m->status->security : "");
            proto_client_free(&m);
            return sec;
        }
        proto_client_free(&m);
    }
}

int main(void)
{
    char listen[64], control[64], star[64], key[340], pub[340], prefix[300];
    char missing[320], rlog[320], cmd[300], junk[320];
    client_t *c = NULL;
    pid_t r;

    cu_init();
    unsetenv("BATON_CURVE_SECRET_KEY");
    unsetenv("BATON_ROUTER_PUBLIC_KEY");
    unsetenv("BATON_ALLOW_WORKERS");
    unsetenv("BATON_ALLOW_CLIENTS");
    unsetenv("BATON_INSECURE");
    snprintf(g_dir, sizeof(g_dir), "/tmp/bt_curve_start_%d_XXXXXX",
             (int)getpid());
    BT_CHECK(mkdtemp(g_dir) != NULL);
    snprintf(prefix, sizeof(prefix), "%s/k", g_dir);
    BT_ASSERT_OK(bt_curve_keygen(prefix, NULL));
    /* never overwritten */
    BT_CHECK(bt_curve_keygen(prefix, NULL) != BT_OK);
    {
        struct stat st;
        snprintf(key, sizeof(key), "%s.key", prefix);
        BT_ASSERT_OK(stat(key, &st));
        BT_ASSERT_EQ(st.st_mode & 0777, 0600);
    }
    snprintf(pub, sizeof(pub), "%s.pub", prefix);
    snprintf(missing, sizeof(missing), "%s/no-such.key", g_dir);
    snprintf(junk, sizeof(junk), "%s/junk.key", g_dir);
    {
        FILE *f = fopen(junk, "w");
        BT_CHECK(f != NULL);
        fprintf(f, "not a key\n");
        fclose(f);
    }
    cu_router_addrs(listen, control);

    fprintf(stderr, "1. a missing key file stops the process\n");
    EXPECT_FAIL("cannot read CURVE secret key file", "baton-router",
                "--listen", listen, "--control", control,
                "--curve-secret-key", missing, "--allow-workers", pub,
                "--allow-clients", pub);
    EXPECT_FAIL("no-such.key", "baton-router", "--listen", listen,
                "--control", control, "--curve-secret-key", missing,
                "--allow-workers", pub, "--allow-clients", pub);
    EXPECT_FAIL("cannot read allow list", "baton-router", "--listen", listen,
                "--control", control, "--curve-secret-key", key,
                "--allow-workers", missing, "--allow-clients", pub);
    EXPECT_FAIL("cannot read CURVE secret key file", "baton-decode",
                "--router", control, "--null-model", "--curve-secret-key",
                missing, "--router-public-key", pub);
    EXPECT_FAIL("cannot read CURVE public key file", "baton-prefill",
                "--router", control, "--null-model", "--curve-secret-key",
                key, "--router-public-key", missing);
    EXPECT_FAIL("cannot read CURVE secret key file", "baton", "status",
                "--router", listen, "--curve-secret-key", missing,
                "--router-public-key", pub);
    EXPECT_FAIL("not hold a Z85 key", "baton-decode", "--router", control,
                "--null-model", "--curve-secret-key", junk,
                "--router-public-key", pub);

    fprintf(stderr, "3. half a configuration is an error\n");
    EXPECT_FAIL("needs both --allow-workers and --allow-clients",
                "baton-router", "--listen", listen, "--control", control,
                "--curve-secret-key", key);
    EXPECT_FAIL("need --curve-secret-key", "baton-router", "--listen",
                listen, "--control", control, "--allow-workers", pub);
    EXPECT_FAIL("only the secret key was given", "baton-decode", "--router",
                control, "--null-model", "--curve-secret-key", key);

    fprintf(stderr, "2. no keys: loopback only, unless --insecure\n");
    snprintf(star, sizeof(star), "tcp://*:%s", strrchr(listen, ':') + 1);
    EXPECT_FAIL("refusing to listen on tcp://*", "baton-router", "--listen",
                star, "--control", control);
    EXPECT_FAIL("refusing to listen on tcp://0.0.0.0", "baton-router",
                "--listen", listen, "--control", "tcp://0.0.0.0:1");
    snprintf(rlog, sizeof(rlog), "%s/insecure.log", g_dir);
    r = cu_spawn_log(rlog, "baton-router", "--listen", star, "--control",
                     control, "--insecure", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_STREQ(security_of(c), "insecure");
    client_destroy(&c);
    BT_CHECK(file_has(rlog, "--insecure: no CURVE"));
    cu_kill(r, SIGKILL);
    r = cu_spawn("baton-router", "--listen", listen, "--control", control,
                 NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_STREQ(security_of(c), "loopback");
    client_destroy(&c);
    cu_kill(r, SIGKILL);

    cu_kill_all();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", g_dir);
    bt_alloc_report();
    fprintf(stderr, "PASS\n");
    return 0;
}
