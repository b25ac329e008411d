/*
 * test_aggregated.c - aggregated mode: no prefill worker, decode workers
 * started with --role both prefill their own requests (chunked inside
 * the step's token budget, written in place into the reserved blocks).
 *   1. 24 concurrent greedy requests through one aggregated worker with a
 *      small step budget (prompts span several chunks while other
 *      requests decode) give exactly golden.jsonl's ids; the cluster
 *      status reports the pair's transport as "local"; every KV block is
 *      free afterwards.
 *   2. kill -9 of the aggregated worker mid-stream: a second aggregated
 *      worker re-prefills prompt + streamed tokens and every stream
 *      continues exactly, without duplicates or gaps.
 */
#include "cluster_util.h"

#define N_REQ 24
#define N_KILL 6

/* The transport the status reports for (prefill, decode), or "". */
static void pair_transport(client_t *c, const char *p, const char *d,
                           char *out, size_t len)
{
    uint64_t rid;

    snprintf(out, len, "%s", "");
    BT_ASSERT_OK(client_status_request(c, &rid));
    for (;;) {
        Baton__ClientMessage *m = NULL;
        BT_ASSERT_OK(client_recv(c, 2000, &m));
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
            m->status->client_request_id == rid) {
            for (size_t i = 0; i < m->status->n_transports; i++) {
                Baton__PairTransport *t = m->status->transports[i];
                if (strcmp(t->prefill, p) == 0 && strcmp(t->decode, d) == 0)
                    snprintf(out, len, "%s", t->name);
            }
            proto_client_free(&m);
            return;
        }
        proto_client_free(&m);
    }
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ], kres[N_KILL];
    char listen[64], control[64], model[512], tok[512], name[32];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0, d1;
    int n_golden;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--tokenizer", tok, "--threads", "1", "--name", "agg0",
                  "--role", "both", "--step-tokens", "24", "--chunk-tokens",
                  "8", "--kv-blocks", "400", "--block-size", "8", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 0, 1, 20000);
    pair_transport(ctl, "agg0", "agg0", name, sizeof(name));
    BT_CHECK(strcmp(name, "local") == 0);

    /* 1: golden exactness through the aggregated worker. */
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);
    cu_wait_kv_idle(ctl, 5000);

    /* 2: kill -9 mid-stream; a second aggregated worker takes over. */
    cu_kill(d0, SIGKILL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "agg1", "--role", "both",
                  "--step-delay-ms", "8", NULL);
    for (int t = 0; t < 100; t++) { /* the router drops agg0 */
        cu_status_t st;
        if (cu_status(ctl, &st) == 0 && st.n_decode == 1 &&
            strcmp(st.names[0], "agg1") == 0)
            break;
        usleep(50000);
    }
    for (int i = 0; i < N_KILL; i++)
        kres[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_stream_until(c, kres, N_KILL, 5, N_KILL,
                    "no tokens from the aggregated worker");
    /* Freeze agg1 while agg2 starts, so it cannot finish a stream first
     * on a loaded machine (start-up takes seconds there). */
    kill(d0, SIGSTOP);
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "agg2", "--role", "both", NULL);
    for (int i = 0; i < N_KILL; i++)
        BT_CHECK(kres[i].n_ids < golden[i % n_golden].n_expect);
    cu_kill(d0, SIGKILL);
    cu_wait_workers(ctl, 0, 1, 20000);
    cu_collect(c, kres, N_KILL, 50000);
    for (int i = 0; i < N_KILL; i++) {
        cu_check_golden(&kres[i], &golden[i % n_golden], i);
        fprintf(stderr, "request %d: %d retries\n", i, kres[i].retries);
        BT_ASSERT_EQ(kres[i].retries, 1);
    }
    client_destroy(&c);
    client_destroy(&ctl);
    (void)d1;
    BT_TEST_PASS("cluster/aggregated: --role both golden exact, kill -9 "
                 "taken over exactly");
    return 0;
}
