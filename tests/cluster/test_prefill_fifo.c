/*
 * test_prefill_fifo.c - an aggregated worker (`baton-decode --role both`)
 * prefills its waiting prompts oldest first (issue 36), with real
 * processes on 127.0.0.1.  The H200's 2048/128 run at 256 streams had
 * TTFT p50 1.2 s and p99 31.6 s: prompts were taken in reservation-slot
 * order, so a new request that took a freed low slot passed one waiting
 * in a higher slot, again and again.
 *
 * The worker takes 16 prompt tokens a step (--max-batch-tokens and
 * --chunk-tokens 16, no TPOT bound) and each step lasts >= 20 ms
 * (--step-delay-ms).  S (8 tokens) takes slot 0 and L1 (400 tokens, ~25
 * steps) slot 1; S finishes and frees slot 0; L2 (400 tokens) arrives
 * while L1 has most of its prompt left and takes slot 0.  Oldest first,
 * L1's first token comes before L2's; slot order would give L2 the
 * whole budget until it finished.
 */
#include "cluster_util.h"

#define MODEL BT_SHARED_DIR "/models/stories260K.bin" /* context 512 */
#define LONG 400

/* Receives until result `last` finished (30 s), noting the order of the
 * n results' finishes: order[k] = index of the k-th to finish. */
static void collect_order(client_t *c, cu_result_t *res, int n, int last,
                          int *order, int *n_done)
{
    uint64_t until = bt_time_ns() + 30000ull * 1000000ull;

    while (!res[last].finished) {
        Baton__ClientMessage *m = NULL;

        if (bt_time_ns() > until)
            BT_TEST_FAIL("request %d unfinished after 30 s", last);
        if (client_recv(c, 100, &m) != BT_OK)
            continue;
        if (cu_apply(res, n, m))
            for (int i = 0; i < n; i++)
                if (res[i].rid == client_msg_request_id(m))
                    order[(*n_done)++] = i;
        proto_client_free(&m);
    }
}

int main(void)
{
    static int s_ids[8], l1_ids[LONG], l2_ids[LONG];
    char listen[64], control[64];
    client_request_t req;
    cu_result_t res[3];
    client_t *c = NULL;
    int order[3], n_done = 0;

    cu_init();
    for (int i = 0; i < 8; i++)
        s_ids[i] = 3 + i;
    for (int i = 0; i < LONG; i++) {
        l1_ids[i] = 3 + (i * 7) % 500;
        l2_ids[i] = 3 + (i * 11) % 500;
    }
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "both", "--role", "both",
             "--kv-blocks", "400", "--max-batch-tokens", "16",
             "--chunk-tokens", "16", "--tpot-target-ms", "0",
             "--step-delay-ms", "20", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, 1, 20000);

    memset(res, 0, sizeof(res));
    cu_ids_request(&req, s_ids, 8, 1);
    BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
    cu_ids_request(&req, l1_ids, LONG, 1);
    BT_ASSERT_OK(client_submit(c, &req, &res[1].rid));
    /* S done: its slot is free; L1 has most of its ~25 steps left */
    collect_order(c, res, 3, 0, order, &n_done);
    BT_ASSERT_EQ(res[0].finished, 1);
    BT_CHECK(res[1].finished == 0);
    cu_ids_request(&req, l2_ids, LONG, 1);
    BT_ASSERT_OK(client_submit(c, &req, &res[2].rid));
    collect_order(c, res, 3, 1, order, &n_done);
    collect_order(c, res, 3, 2, order, &n_done);
    for (int i = 0; i < 3; i++)
        BT_ASSERT_EQ(res[i].finished, 1);
    fprintf(stderr, "finish order: %d %d %d; TTFT L1 %.0f ms, L2 %.0f ms\n",
            order[0], order[1], order[2], res[1].ttft_us * 1e-3,
            res[2].ttft_us * 1e-3);
    BT_ASSERT_EQ(order[1], 1); /* L1, then L2 */
    BT_ASSERT_EQ(order[2], 2);
    client_destroy(&c);
    cu_kill_all();
    BT_TEST_PASS("cluster/prefill_fifo: an aggregated worker prefills its "
                 "waiting prompts oldest first, not by reservation slot");
    return 0;
}
