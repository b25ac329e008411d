/*
 * test_control.c - the control plane under bad input, cancellation,
 * scale out/in and overload, on a real cluster:
 *   - malformed frames, garbage, a wrong version, empty / oversized /
 *     out-of-vocabulary prompts, invalid sampling: each gets an error
 *     reply and the router keeps serving (garbage on the worker port
 *     too);
 *   - cancelling streaming requests frees their KV (heartbeat counts
 *     return to the idle value);
 *   - a decode worker started while serving gets work; one drained with
 *     SIGTERM finishes its requests (exact outputs), then leaves;
 *   - a full admission queue answers OVERLOADED at once.
 */
#include <zmq.h>

#include "cluster_util.h"

static int expect_error(client_t *c, uint64_t rid)
{
    for (;;) {
        Baton__ClientMessage *m = NULL;
        int code;
        if (client_recv(c, 5000, &m) != BT_OK)
            BT_TEST_FAIL("no reply to a bad request");
        if (m->body_case != BATON__CLIENT_MESSAGE__BODY_ERROR ||
            m->error->client_request_id != rid) {
            proto_client_free(&m);
            continue;
        }
        code = m->error->code;
        fprintf(stderr, "  -> %s: %s\n", client_error_name(m->error->code),
                m->error->message);
        proto_client_free(&m);
        return code;
    }
}

static void bad_inputs(client_t *c, const cu_golden_t *g)
{
    client_request_t req;
    uint64_t rid;
    int ids[300];
    uint8_t buf[256];
    size_t len;
    Baton__ClientMessage msg = BATON__CLIENT_MESSAGE__INIT;
    Baton__GenerateRequest gen = BATON__GENERATE_REQUEST__INIT;

    /* garbage bytes */
    BT_ASSERT_OK(client_send_raw(c, "\xff\xfe garbage \x01\x02", 14));
    BT_ASSERT_EQ(expect_error(c, 0), BATON__ERROR_CODE__ERROR_MALFORMED);
    /* an empty frame */
    BT_ASSERT_OK(client_send_raw(c, "", 0));
    BT_ASSERT_EQ(expect_error(c, 0), BATON__ERROR_CODE__ERROR_MALFORMED);
    /* wrong version */
    gen.has_client_request_id = 1;
    gen.client_request_id = 777;
    gen.n_prompt_ids = 2;
    gen.prompt_ids = ids;
    ids[0] = 1;
    ids[1] = 5;
    msg.version = 99;
    msg.body_case = BATON__CLIENT_MESSAGE__BODY_GENERATE;
    msg.generate = &gen;
    len = baton__client_message__pack(&msg, buf);
    BT_ASSERT_OK(client_send_raw(c, buf, len));
    BT_ASSERT_EQ(expect_error(c, 777), BATON__ERROR_CODE__ERROR_VERSION);
    /* empty prompt */
    client_request_init(&req);
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_INVALID);
    /* invalid sampling */
    client_request_init(&req);
    req.prompt_ids = g->prompt;
    req.n_prompt_ids = g->n_prompt;
    req.top_p = 2.0f;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_INVALID);
    req.top_p = 1.0f;
    req.temperature = -1.0f;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_INVALID);
    req.temperature = 0;
    req.max_tokens = -5;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_INVALID);
    /* oversized prompt (context is 128) */
    for (int i = 0; i < 300; i++)
        ids[i] = 3 + i % 500;
    client_request_init(&req);
    req.prompt_ids = ids;
    req.n_prompt_ids = 300;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_TOO_LONG);
    /* oversized text prompt: tokenized by the prefill worker */
    {
        char text[2000];
        memset(text, 'a', sizeof(text) - 1);
        text[sizeof(text) - 1] = '\0';
        for (int i = 0; i < 1999; i += 2)
            text[i] = ' ';
        client_request_init(&req);
        req.prompt = text;
        BT_ASSERT_OK(client_submit(c, &req, &rid));
        BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_TOO_LONG);
    }
    /* id outside the vocabulary */
    ids[0] = 1;
    ids[1] = 99999;
    req.prompt = NULL;
    req.prompt_ids = ids;
    req.n_prompt_ids = 2;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    BT_ASSERT_EQ(expect_error(c, rid), BATON__ERROR_CODE__ERROR_INVALID);
}

static void garbage_to_control(const char *control)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 200;
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__KvGrant g = BATON__KV_GRANT__INIT;
    uint8_t buf[64];
    size_t len;

    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    BT_ASSERT_OK(zmq_connect(s, control));
    zmq_send(s, "\x12\x34garbage", 9, 0);
    zmq_send(s, "a", 1, ZMQ_SNDMORE);
    zmq_send(s, "b", 1, 0);
    /* a well-formed message from a worker the router does not know */
    msg.version = 1;
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_KV_GRANT;
    msg.kv_grant = &g;
    len = baton__control_message__pack(&msg, buf);
    zmq_send(s, buf, len, 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[8];
    char listen[64], control[64], model[512], tok[512];
    char listen2[64], control2[64];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0;
    int n_golden, n_over = 0;
    cu_status_t st;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--tokenizer", tok, "--threads", "1", "--name", "d0",
                  "--step-delay-ms", "5", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 1, 1, 20000);

    fprintf(stderr, "bad inputs:\n");
    bad_inputs(c, &golden[0]);
    garbage_to_control(control);
    res[0].rid = cu_submit_golden(c, &golden[0]);
    cu_collect(c, res, 1, 20000);
    cu_check_golden(&res[0], &golden[0], 0);

    fprintf(stderr, "cancel:\n");
    memset(res, 0, sizeof(res));
    for (int i = 0; i < 4; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    usleep(200000);
    for (int i = 0; i < 4; i++)
        BT_ASSERT_OK(client_cancel(c, res[i].rid));
    cu_collect(c, res, 4, 10000);
    for (int i = 0; i < 4; i++) {
        BT_ASSERT_EQ(res[i].finished, 1);
        BT_ASSERT_EQ(res[i].finish_reason,
                     BATON__FINISH_REASON__FINISH_CANCELLED);
        BT_CHECK(res[i].n_ids < golden[i % n_golden].n_expect);
    }
    cu_wait_kv_idle(ctl, 5000);

    fprintf(stderr, "scale out / in:\n");
    memset(res, 0, sizeof(res));
    for (int i = 0; i < 4; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d2", NULL);
    cu_wait_workers(ctl, 1, 2, 10000);
    usleep(100000);
    BT_ASSERT_OK(cu_status(ctl, &st));
    kill(d0, SIGTERM); /* drain: finishes its 4 streams, takes no more */
    /* the new requests must find d0 draining (or gone), or some may go
     * to it */
    cu_wait_draining(ctl, 1, st.n_workers, 5000);
    for (int i = 4; i < 8; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, 8, 30000);
    for (int i = 0; i < 8; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);
    BT_ASSERT_EQ(cu_wait_exit(d0, 10000), 0);
    BT_ASSERT_OK(cu_status(ctl, &st));
    BT_ASSERT_EQ(st.n_decode, 1);
    BT_ASSERT_STREQ(st.names[0][0] == 'd' ? st.names[0] : st.names[1], "d2");
    for (int i = 0; i < st.n_workers; i++)
        if (strcmp(st.names[i], "d2") == 0)
            BT_CHECK(st.served[i] >= 4);

    fprintf(stderr, "overload:\n");
    {
        client_t *c2 = NULL;
        int p2 = cu_free_port();
        client_request_t req;
        snprintf(listen2, sizeof(listen2), "tcp://127.0.0.1:%d", p2);
        snprintf(control2, sizeof(control2), "tcp://127.0.0.1:%d", p2 + 1);
        cu_spawn("baton-router", "--listen", listen2, "--control", control2,
                 "--max-queue", "2", "--queue-timeout-ms", "1000", NULL);
        BT_ASSERT_OK(client_create(listen2, &c2));
        memset(res, 0, sizeof(res));
        client_request_init(&req);
        req.prompt_ids = golden[0].prompt;
        req.n_prompt_ids = golden[0].n_prompt;
        for (int i = 0; i < 6; i++)
            BT_ASSERT_OK(client_submit(c2, &req, &res[i].rid));
        cu_collect(c2, res, 6, 5000);
        for (int i = 0; i < 6; i++) {
            BT_ASSERT_EQ(res[i].finished, 2);
            n_over += res[i].error_code == BATON__ERROR_CODE__ERROR_OVERLOADED;
        }
        BT_ASSERT_EQ(n_over, 4); /* the 2 queued time out: no workers */
        client_destroy(&c2);
    }
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/control: bad input, cancel, scale, overload");
    return 0;
}
