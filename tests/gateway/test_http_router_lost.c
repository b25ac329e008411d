/*
 * test_http_router_lost.c - a lost router is a clear error, never a hang
 * (issue 35, item 3).  Two null-model clusters (1 prefill + 1 decode
 * worker stepping every 20 ms, so streams last for seconds), each with
 * requests in flight through the client library (8) and through
 * baton-http (2 streaming, 2 not):
 *   - kill -9 of the router, restarted on the same port at once (its old
 *     requests are gone all the same): every client-library request ends
 *     with ERROR_ROUTER_LOST, every HTTP request with 502 router_lost (or
 *     an SSE error event once its stream began), all within 5 s; /health
 *     then answers 503 at once while the link is down;
 *   - SIGSTOP of the router (TCP stays up, nothing answers): the same,
 *     by the client heartbeat timeout (2 s).
 * Without the heartbeats and the socket monitor every wait below runs
 * into its own deadline and the test fails.
 */
#include "gateway/http_util.h"

#define N_LIB 8
#define N_HTTP 4
#define LOST_BOUND_MS 5000

typedef struct {
    char listen[64];
    char control[64];
    pid_t router;
    int http;
    client_t *c;
    uint64_t rids[N_LIB];
    int fds[N_HTTP];
} cluster_t;

static void cluster_start(cluster_t *cl)
{
    cu_router_addrs(cl->listen, cl->control);
    cl->router = cu_spawn("baton-router", "--listen", cl->listen, "--control",
                          cl->control, "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", cl->control, "--null-model",
             "--name", "p0", NULL);
    cu_spawn("baton-decode", "--router", cl->control, "--null-model",
             "--name", "d0", "--step-delay-ms", "20", "--kv-blocks", "2048",
             NULL);
    cl->http = ht_start_gateway(cl->listen, NULL);
    BT_ASSERT_OK(client_create(cl->listen, &cl->c));
    cu_wait_workers(cl->c, 1, 1, 20000);
    ht_wait_healthy(cl->http, 10000);
}

/* Puts N_LIB library requests and N_HTTP HTTP requests in flight, and
 * waits until every library request streams. */
static void cluster_load(cluster_t *cl)
{
    static const int prompt[] = { 1, 5, 9, 13 };
    bool started[N_LIB] = { false };
    int n_started = 0;
    uint64_t t_end;

    for (int i = 0; i < N_LIB; i++) {
        client_request_t req;
        client_request_init(&req);
        req.prompt_ids = prompt;
        req.n_prompt_ids = 4;
        req.max_tokens = 1000; /* 20 s at 20 ms a step: outlives the test */
        req.ignore_eos = true;
        req.want_text = false;
        BT_ASSERT_OK(client_submit(cl->c, &req, &cl->rids[i]));
    }
    for (int i = 0; i < N_HTTP; i++) {
        char body[256], req[512];
        int n;
        snprintf(body, sizeof(body),
                 "{\"prompt\":[1,5,9,13],\"max_tokens\":1000,"
                 "\"ignore_eos\":true,\"stream\":%s}",
                 i % 2 ? "true" : "false");
        n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
        cl->fds[i] = ht_connect(cl->http);
        BT_CHECK(ht_send(cl->fds[i], req, (size_t)n));
    }
    t_end = bt_time_ns() + 10000000000ull;
    while (n_started < N_LIB) {
        Baton__ClientMessage *m = NULL;
        uint64_t rid;
        if (bt_time_ns() > t_end)
            BT_TEST_FAIL("only %d of %d requests started", n_started, N_LIB);
        if (client_recv(cl->c, 200, &m) != BT_OK)
            continue;
        rid = client_msg_request_id(m);
        if (m->body_case != BATON__CLIENT_MESSAGE__BODY_CHUNK &&
            m->body_case != BATON__CLIENT_MESSAGE__BODY_STATUS)
            BT_TEST_FAIL("unexpected message %d for %llu", m->body_case,
                         (unsigned long long)rid);
        for (int i = 0; i < N_LIB; i++)
            if (cl->rids[i] == rid && !started[i]) {
                started[i] = true;
                n_started++;
            }
        proto_client_free(&m);
    }
    usleep(300000); /* the HTTP streams begin too */
}

/* Every request in flight must end with a clear error within
 * LOST_BOUND_MS of t0. */
static void expect_lost(cluster_t *cl, uint64_t t0, const char *what)
{
    bool done[N_LIB] = { false };
    int n_done = 0;
    double worst = 0;

    while (n_done < N_LIB) {
        Baton__ClientMessage *m = NULL;
        double ms = (double)(bt_time_ns() - t0) * 1e-6;
        if (ms > LOST_BOUND_MS)
            BT_TEST_FAIL("%s: %d of %d library requests got no error in "
                         "%d ms", what, N_LIB - n_done, N_LIB, LOST_BOUND_MS);
        if (client_recv(cl->c, 100, &m) != BT_OK)
            continue;
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
            uint64_t rid = m->error->client_request_id;
            for (int i = 0; i < N_LIB; i++)
                if (cl->rids[i] == rid && !done[i]) {
                    BT_ASSERT_EQ(m->error->code,
                                 BATON__ERROR_CODE__ERROR_ROUTER_LOST);
                    BT_CHECK(m->error->retry_after_ms > 0);
                    BT_CHECK(strstr(m->error->message, "resubmit") != NULL);
                    done[i] = true;
                    n_done++;
                    worst = ms;
                }
        } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
            BT_TEST_FAIL("%s: a request finished", what);
        }
        proto_client_free(&m);
    }
    fprintf(stderr, "%s: %d library requests failed router_lost, the last "
            "%.0f ms after the fault\n", what, N_LIB, worst);
    BT_CHECK(client_router_losses(cl->c) >= 1);
    for (int i = 0; i < N_HTTP; i++) {
        ht_conn_t *hc = bt_malloc(sizeof(*hc), "test");
        ht_resp_t r;
        struct timeval tv = { 0, 200000 };
        double ms;
        int st;

        /* the whole response must be there by the bound */
        ms = (double)(bt_time_ns() - t0) * 1e-6;
        tv.tv_sec = (time_t)((LOST_BOUND_MS - ms) / 1000) + 1;
        setsockopt(cl->fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ht_conn_init(hc, cl->fds[i]);
        st = ht_read(hc, &r);
        ms = (double)(bt_time_ns() - t0) * 1e-6;
        if (i % 2 == 0) {
            if (st != 502 || strstr(r.body, "\"router_lost\"") == NULL)
                BT_TEST_FAIL("%s: HTTP request %d: %d %s", what, i, st,
                             r.body ? r.body : "(no body)");
        } else {
            if (st != 200 || strstr(r.body, "\"router_lost\"") == NULL ||
                strstr(r.body, "[DONE]") == NULL)
                BT_TEST_FAIL("%s: HTTP stream %d: %d %s", what, i, st,
                             r.body ? r.body : "(no body)");
        }
        BT_CHECK(ms < LOST_BOUND_MS + 200);
        fprintf(stderr, "%s: HTTP %s request: %d router_lost after %.0f ms\n",
                what, i % 2 ? "streaming" : "plain", st, ms);
        ht_resp_free(&r);
        bt_free(hc);
        close(cl->fds[i]);
    }
}

static void expect_health_lost(cluster_t *cl)
{
    ht_resp_t r;
    uint64_t t = bt_time_ns();

    BT_ASSERT_EQ(ht_request(cl->http, "GET", "/health", NULL, &r), 503);
    BT_CHECK(strstr(r.body, "router_lost") != NULL);
    BT_CHECK(bt_time_ns() - t < 500000000ull); /* answered, not waited */
    ht_resp_free(&r);
    /* a new request fails fast too */
    t = bt_time_ns();
    BT_ASSERT_EQ(ht_request(cl->http, "POST", "/v1/completions",
                            "{\"prompt\":[1,2],\"max_tokens\":2}", &r),
                 503);
    BT_CHECK(strstr(r.body, "router_unreachable") != NULL);
    BT_CHECK(bt_time_ns() - t < 500000000ull);
    ht_resp_free(&r);
}

int main(void)
{
    cluster_t a, b;
    uint64_t t0;

    cu_init();

    /* kill -9, restarted at once on the same port */
    cluster_start(&a);
    cluster_load(&a);
    t0 = bt_time_ns();
    cu_kill(a.router, SIGKILL);
    a.router = cu_spawn("baton-router", "--listen", a.listen, "--control",
                        a.control, "--heartbeat-ms", "100", NULL);
    expect_lost(&a, t0, "kill -9 + restart");

    /* SIGSTOP: nothing answers, TCP stays up */
    cluster_start(&b);
    cluster_load(&b);
    t0 = bt_time_ns();
    cu_kill(b.router, SIGSTOP);
    expect_lost(&b, t0, "SIGSTOP");
    expect_health_lost(&b);
    cu_kill(b.router, SIGKILL);

    client_destroy(&a.c);
    client_destroy(&b.c);
    cu_kill_all();
    bt_alloc_report();
    return 0;
}
