/*
 * test_kv_routing.c - KV-aware routing (issue 38): a real router with
 * --policy kv-aware and four aggregated decode workers (aidreams260K,
 * block size 4).  A request with a 40-token prefix goes to one worker;
 * once that worker's KvEvents reached the router (its index gauge on the
 * router's /metrics), every later request sharing the prefix goes to the
 * same worker (the other three stay idle; round robin would spread
 * them over all four).
 */
#include <sys/time.h>

#include "cluster/kv_routing_util.h"

#define N_WORKERS 4
#define N_FOLLOW 6

static void run_one(client_t *c, const int *prompt, int n, const char *salt)
{
    client_request_t req;
    cu_result_t res;

    cu_ids_request(&req, prompt, n, 8);
    req.cache_salt = salt;
    cu_run_request(c, &req, &res);
    BT_ASSERT_EQ(res.n_ids, 8);
}

int main(void)
{
    static cu_golden_t golden[8];
    char listen[64], control[64], rport_s[16], model[512];
    char names[N_WORKERS][16];
    int prompt[64], n_shared = 40, rport, home = -1;
    uint64_t before[N_WORKERS], after[N_WORKERS];
    client_t *c = NULL;

    cu_init();
    BT_CHECK(cu_golden_load("aidreams260K.bin", golden, 8) >= 4);
    cu_router_addrs(listen, control);
    rport = cu_free_port();
    snprintf(rport_s, sizeof(rport_s), "%d", rport);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--metrics-port", rport_s, "--policy", "kv-aware",
             "--kv-weights", "overlap=1,load=1", NULL);
    for (int i = 0; i < N_WORKERS; i++) {
        snprintf(names[i], sizeof(names[i]), "kv%d", i);
        cu_spawn("baton-decode", "--router", control, "--model", model,
                 "--threads", "1", "--name", names[i], "--role", "both",
                 "--kv-blocks", "400", "--block-size", "4", NULL);
    }
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, N_WORKERS, 30000);

    /* The shared prefix: a golden prompt and its greedy continuation. */
    kr_shared_prompt(prompt, golden, n_shared);
    kr_served(c, names, N_WORKERS, before);
    run_one(c, prompt, n_shared + 7, NULL);
    kr_served(c, names, N_WORKERS, after);
    for (int i = 0; i < N_WORKERS; i++)
        if (after[i] > before[i]) {
            BT_CHECK(home < 0); /* one worker took it */
            home = i;
        }
    BT_CHECK(home >= 0);
    /* its events reached the router */
    kr_wait_indexed(rport, names[home], "decode+prefill", n_shared / 4);
    for (int i = 0; i < N_WORKERS; i++)
        if (i != home)
            BT_ASSERT_EQ(kr_worker_metric(rport,
                                          "baton_router_worker_kv_index_blocks",
                                          names[i], "decode+prefill"), 0);

    /* Every request sharing the prefix follows it. */
    for (int r = 0; r < N_FOLLOW; r++) {
        memcpy(prompt + n_shared, golden[3 + r % 2].expect + r,
               sizeof(int) * 9);
        run_one(c, prompt, n_shared + 9, NULL);
    }
    kr_served(c, names, N_WORKERS, before);
    for (int i = 0; i < N_WORKERS; i++)
        fprintf(stderr, "%s: %llu served%s\n", names[i],
                (unsigned long long)before[i], i == home ? " (home)" : "");
    /* served counts an aggregated worker's both roles: 2 a request */
    BT_ASSERT_EQ(before[home], after[home] + 2 * N_FOLLOW);
    for (int i = 0; i < N_WORKERS; i++)
        if (i != home)
            BT_ASSERT_EQ(before[i], after[i]);

    client_destroy(&c);
    BT_TEST_PASS("cluster/kv_routing: a shared prefix follows the worker "
                 "that caches it (router index from KvEvents)");
    return 0;
}
