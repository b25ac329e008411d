/*
 * test_http_edge.c - baton-http and the router under abuse (issue 35,
 * item 7), on a null-model cluster of small capacity (one decode worker,
 * 8 KV blocks: 4 requests at a time, each 16 tokens at 20 ms a step):
 *   - overload: 60 requests offered over 1.5 s (about 3x capacity) with
 *     the router's --max-queue-wait-ms 300: some are served (200, all
 *     their tokens), the rest get 429 code "overloaded" with Retry-After,
 *     and everything is answered long before a queue would have drained;
 *   - a body over --max-body-bytes: 413 at once;
 *   - prompts over the cluster's context (ids, and text bounded by bytes
 *     without a tokenizer): 400 context_length_exceeded from baton-http,
 *     the router never sees them (its failed counter does not move);
 *   - slowloris: half-open connections from five other loopback
 *     addresses (127.0.0.2-6), more than --max-connections, reconnecting
 *     when closed, and more than --max-conns-per-client from one: a real
 *     client on 127.0.0.1 is served every round.
 */
#include <arpa/inet.h>

#include "gateway/http_util.h"
#include "gateway_int.h"

#define N_OVER 60

static int connect_from(const char *src, int port)
{
    struct sockaddr_in a, b;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&b, 0, sizeof(b));
    b.sin_family = AF_INET;
    inet_pton(AF_INET, src, &b.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&b, sizeof(b)) != 0)
        BT_TEST_FAIL("bind %s: %s", src, strerror(errno));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void router_counters(client_t *c, uint32_t *ctx, uint64_t *failed)
{
    uint64_t rid;

    BT_ASSERT_OK(client_status_request(c, &rid));
    for (;;) {
        Baton__ClientMessage *m = NULL;
        BT_ASSERT_OK(client_recv(c, 5000, &m));
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
            m->status->client_request_id == rid) {
            *ctx = m->status->max_context;
            *failed = m->status->failed;
            proto_client_free(&m);
            return;
        }
        proto_client_free(&m);
    }
}

static void overload(int http)
{
    static const char body[] = "{\"prompt\":[1,5,9,13],\"max_tokens\":16,"
                               "\"ignore_eos\":true}";
    int fds[N_OVER], n_ok = 0, n_429 = 0;
    uint64_t t0 = bt_time_ns();
    double secs;

    for (int i = 0; i < N_OVER; i++) {
        char req[512];
        int n = snprintf(req, sizeof(req),
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         sizeof(body) - 1, body);
        fds[i] = ht_connect(http);
        BT_CHECK(ht_send(fds[i], req, (size_t)n));
        usleep(25000);
    }
    for (int i = 0; i < N_OVER; i++) {
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        ht_resp_t r;
        char v[64];
        int st;

        ht_conn_init(hc, fds[i]);
        st = ht_read(hc, &r);
        if (st == 200) {
            BT_CHECK(strstr(r.body, "\"completion_tokens\":16") != NULL);
            n_ok++;
        } else if (st == 429) {
            BT_CHECK(strstr(r.body, "\"overloaded\"") != NULL);
            if (ht_header(&r, "Retry-After", v, sizeof(v)) == NULL ||
                atoi(v) < 1)
                BT_TEST_FAIL("429 without Retry-After: %s", r.head);
            n_429++;
        } else {
            BT_TEST_FAIL("overload: request %d got %d %s", i, st,
                         r.body ? r.body : "");
        }
        ht_resp_free(&r);
        bt_free(hc);
        close(fds[i]);
    }
    secs = (double)(bt_time_ns() - t0) * 1e-9;
    fprintf(stderr, "overload: %d served, %d refused 429, all answered in "
            "%.2f s\n", n_ok, n_429, secs);
    BT_CHECK(n_ok >= 8);
    BT_CHECK(n_429 >= 10);
    /* 60 requests one after another at 4 a time would take 4.8 s of
     * decode alone, queued behind each other */
    BT_CHECK(secs < 4.0);
}

static void too_long(int http, client_t *c)
{
    uint32_t ctx;
    uint64_t failed0, failed1;
    bt_buf_t b;
    ht_resp_t r;

    router_counters(c, &ctx, &failed0);
    BT_CHECK(ctx > 0);
    /* token ids: exactly the context */
    bt_buf_init(&b);
    BT_ASSERT_OK(bt_buf_printf(&b, "{\"prompt\":["));
    for (uint32_t i = 0; i < ctx; i++)
        BT_ASSERT_OK(bt_buf_printf(&b, "%s%u", i ? "," : "",
                                         1 + i % 7));
    BT_ASSERT_OK(bt_buf_printf(&b, "],\"max_tokens\":4}"));
    BT_ASSERT_EQ(ht_request(http, "POST", "/v1/completions", b.data, &r),
                 400);
    BT_CHECK(strstr(r.body, "context_length_exceeded") != NULL);
    ht_resp_free(&r);
    /* text, no tokenizer: more than context x 128 bytes */
    b.len = 0;
    BT_ASSERT_OK(bt_buf_printf(&b, "{\"prompt\":\""));
    for (uint32_t i = 0; i <= ctx * 128u / 8; i++)
        BT_ASSERT_OK(bt_buf_printf(&b, "abc def "));
    BT_ASSERT_OK(bt_buf_printf(&b, "\",\"max_tokens\":4}"));
    BT_ASSERT_EQ(ht_request(http, "POST", "/v1/completions", b.data, &r),
                 400);
    BT_CHECK(strstr(r.body, "context_length_exceeded") != NULL);
    ht_resp_free(&r);
    bt_buf_cleanup(&b);
    router_counters(c, &ctx, &failed1);
    BT_ASSERT_EQ(failed1, failed0); /* the router never saw them */
    /* one token shorter is the router's to judge: it is served */
    BT_ASSERT_EQ(ht_request(http, "POST", "/v1/completions",
                            "{\"prompt\":[1,2,3],\"max_tokens\":2}", &r),
                 200);
    ht_resp_free(&r);
    /* 413: a body over --max-body-bytes (default 4 MiB), refused on the
     * headers alone */
    {
        static const char big[] = "POST /v1/completions HTTP/1.1\r\n"
                                   "Host: x\r\nContent-Length: 5000000\r\n"
                                   "\r\n{";
        BT_ASSERT_EQ(ht_raw(http, big, sizeof(big) - 1, &r), 413);
        ht_resp_free(&r);
    }
    fprintf(stderr, "edge: over-long prompts 400 (context %u), router "
            "failed counter unchanged (%llu); big body 413\n", ctx,
            (unsigned long long)failed1);
}

static void slowloris(int http)
{
    static const char partial[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    enum { N_ADDR = 5, PER_ADDR = 12 };
    int fds[N_ADDR][PER_ADDR];
    char src[32];

    for (int a = 0; a < N_ADDR; a++)
        for (int k = 0; k < PER_ADDR; k++)
            fds[a][k] = -1;
    for (int round = 0; round < 3; round++) {
        ht_resp_t r;
        uint64_t t;
        int open_ok = 0;

        /* the attackers (re)connect and start requests they never end */
        for (int a = 0; a < N_ADDR; a++) {
            snprintf(src, sizeof(src), "127.0.0.%d", a + 2);
            for (int k = 0; k < PER_ADDR; k++) {
                char byte;
                if (fds[a][k] >= 0 &&
                    recv(fds[a][k], &byte, 1, MSG_DONTWAIT) != 0)
                    continue; /* still open (EAGAIN) */
                if (fds[a][k] >= 0)
                    close(fds[a][k]);
                fds[a][k] = connect_from(src, http);
                if (fds[a][k] >= 0 &&
                    send(fds[a][k], partial, sizeof(partial) - 1,
                         MSG_NOSIGNAL) > 0)
                    open_ok++;
                usleep(1000);
            }
        }
        usleep(100000);
        t = bt_time_ns();
        BT_ASSERT_EQ(ht_request(http, "POST", "/v1/completions",
                                "{\"prompt\":[1,2,3],\"max_tokens\":2}", &r),
                     200);
        ht_resp_free(&r);
        fprintf(stderr, "slowloris round %d: %d attacker connections "
                "(re)opened, real request served in %.0f ms\n", round,
                open_ok, (double)(bt_time_ns() - t) * 1e-6);
        BT_CHECK(bt_time_ns() - t < 2000000000ull);
    }
    {
        ht_resp_t r;
        BT_ASSERT_EQ(ht_request(http, "GET", "/metrics", NULL, &r), 200);
        BT_CHECK(strstr(r.body, "baton_http_connections_evicted_total 0") ==
                 NULL);
        BT_CHECK(strstr(r.body, "baton_http_connections_rejected_total 0") ==
                 NULL);
        BT_CHECK(strstr(r.body, "baton_http_prompts_too_long_total 2") !=
                 NULL);
        ht_resp_free(&r);
    }
    for (int a = 0; a < N_ADDR; a++)
        for (int k = 0; k < PER_ADDR; k++)
            if (fds[a][k] >= 0)
                close(fds[a][k]);
}

int main(void)
{
    char listen[64], control[64];
    client_t *c = NULL;
    int http, http_open;

    cu_init();
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--max-queue-wait-ms", "300", NULL);
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", "--step-delay-ms", "20", "--kv-blocks", "8", NULL);
    http = ht_start_gateway(listen, "--max-connections", "32",
                            "--max-conns-per-client", "8", NULL);
    /* a second baton-http with default connection limits, for the
     * overload (its 60 clients share one address) */
    http_open = ht_start_gateway(listen, NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    ht_wait_healthy(http, 10000);
    ht_wait_healthy(http_open, 10000);
    usleep(300000); /* baton-http has asked the context by now */

    too_long(http, c);
    overload(http_open);
    slowloris(http);

    client_destroy(&c);
    cu_kill_all();
    printf("PASS gateway/http_edge\n");
    return 0;
}
