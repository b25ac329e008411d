/*
 * test_golden.c - 64 concurrent greedy requests through a real cluster
 * (router + 2 prefill + 2 decode on 127.0.0.1, decode block sizes 16 and
 * 8 so both the UCX and the inline KV paths run) give exactly the ids of
 * golden.jsonl, i.e. what `baton run` gives; afterwards every KV block is
 * free again.
 */
#include "cluster_util.h"

#define N_REQ 64

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512], tok[512];
    client_t *c = NULL;
    int n_golden;
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
             "--tokenizer", tok, "--threads", "1", "--name", "p0",
             "--chunk-tokens", "4", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p1", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0",
             "--kv-blocks", "300", "--block-size", "16", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d1",
             "--kv-blocks", "600", "--block-size", "8", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 2, 2, 20000);

    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);
    BT_ASSERT_OK(cu_status(c, &st));
    for (int i = 0; i < st.n_workers && i < 16; i++) {
        fprintf(stderr, "worker %s served %llu\n", st.names[i],
                (unsigned long long)st.served[i]);
        BT_CHECK(st.served[i] > 0); /* the policy spreads the load */
    }
    cu_wait_kv_idle(c, 5000);
    client_destroy(&c);
    BT_TEST_PASS("cluster/golden: 64 concurrent requests exact");
    return 0;
}
