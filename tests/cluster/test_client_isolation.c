/*
 * test_client_isolation.c - a client cannot cancel or read another
 * client's request (issue 42).  Requests are keyed by the client's
 * connection (its ZeroMQ routing id, which the router assigns) and the
 * client's own request id, so the same request id from another client
 * names that client's request, never someone else's.
 *
 * Client A streams a long request (null model, slowed decode); client B
 * submits one of its own, then cancels every request id from 0 to 63
 * (A's number among them).  B's own request ends cancelled; A's
 * finishes with every token; B never receives a chunk of A's request.
 */
#include "cluster_util.h"

#define LONG_TOKENS 60

static uint64_t submit(client_t *c, int max_tokens)
{
    static const int prompt[] = { 1, 5, 9, 13 };
    client_request_t req;
    uint64_t rid;

    client_request_init(&req);
    req.prompt_ids = prompt;
    req.n_prompt_ids = 4;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    req.want_text = false;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

int main(void)
{
    char listen[64], control[64];
    client_t *a = NULL, *b = NULL;
    cu_result_t ra, rb;
    int b_foreign = 0;

    cu_init();
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control, NULL);
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", "--step-delay-ms", "20", NULL);
    BT_ASSERT_OK(client_create(listen, &a));
    BT_ASSERT_OK(client_create(listen, &b));
    cu_wait_workers(a, 1, 1, 20000);

    memset(&ra, 0, sizeof(ra));
    memset(&rb, 0, sizeof(rb));
    ra.rid = submit(a, LONG_TOKENS);
    rb.rid = submit(b, LONG_TOKENS);
    BT_CHECK(ra.rid < 64); /* B's cancels below name A's number too */
    cu_stream_until(a, &ra, 1, 3, 1, "no tokens for client A");

    /* B cancels its own id and every other small one, A's included. */
    for (uint64_t id = 0; id < 64; id++)
        BT_ASSERT_OK(client_cancel(b, id));
    /* B's stream: its own request ends cancelled; nothing of A's. */
    for (uint64_t until = bt_time_ns() + 10000000000ull; rb.finished == 0;) {
        Baton__ClientMessage *m = NULL;
        if (bt_time_ns() > until)
            BT_TEST_FAIL("client B's own request did not end");
        if (client_recv(b, 100, &m) != BT_OK)
            continue;
        if (client_msg_request_id(m) != rb.rid)
            b_foreign++;
        cu_apply(&rb, 1, m);
        proto_client_free(&m);
    }
    BT_ASSERT_EQ(rb.finished, 1);
    BT_ASSERT_EQ(rb.finish_reason, BATON__FINISH_REASON__FINISH_CANCELLED);

    /* A's request is untouched: every token, finished by length. */
    cu_collect(a, &ra, 1, 20000);
    BT_ASSERT_EQ(ra.finished, 1);
    BT_ASSERT_EQ(ra.finish_reason, BATON__FINISH_REASON__FINISH_LENGTH);
    BT_ASSERT_EQ(ra.n_ids, LONG_TOKENS);

    /* B heard nothing of A's request meanwhile either. */
    for (int t = 0; t < 5; t++) {
        Baton__ClientMessage *m = NULL;
        if (client_recv(b, 100, &m) != BT_OK)
            continue;
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK)
            b_foreign++;
        proto_client_free(&m);
    }
    BT_ASSERT_EQ(b_foreign, 0);
    client_destroy(&a);
    client_destroy(&b);
    BT_TEST_PASS("cluster/client_isolation: another client's cancel and "
                 "stream never touch a request");
    return 0;
}
