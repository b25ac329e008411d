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

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define N_WORKERS 4
#define N_FOLLOW 6

/* The router's per-worker sample `family` of worker `name`. */
static double worker_metric(int port, const char *family, const char *name)
{
    char sample[256];

    snprintf(sample, sizeof(sample), "%s{worker=\"%s\",role=\"decode+"
             "prefill\"}", family, name);
    return prom_scrape(port, sample);
}

static void run_one(client_t *c, const int *prompt, int n, const char *salt)
{
    client_request_t req;
    cu_result_t res;

    cu_ids_request(&req, prompt, n, 8);
    req.cache_salt = salt;
    cu_run_request(c, &req, &res);
    BT_ASSERT_EQ(res.n_ids, 8);
}

/* Served requests per worker name (order of names[]). */
static void served(client_t *c, const char names[][16], uint64_t *out)
{
    cu_status_t st;

    BT_CHECK(cu_status(c, &st) == 0);
    for (int i = 0; i < N_WORKERS; i++) {
        out[i] = 0;
        for (int k = 0; k < st.n_workers && k < 16; k++)
            if (strcmp(st.names[k], names[i]) == 0)
                out[i] = st.served[k];
    }
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
    memcpy(prompt, golden[1].prompt, sizeof(int) * (size_t)golden[1].n_prompt);
    memcpy(prompt + golden[1].n_prompt, golden[1].expect,
           sizeof(int) * (size_t)(n_shared - golden[1].n_prompt));
    memcpy(prompt + n_shared, golden[2].expect, sizeof(int) * 7);
    served(c, names, before);
    run_one(c, prompt, n_shared + 7, NULL);
    served(c, names, after);
    for (int i = 0; i < N_WORKERS; i++)
        if (after[i] > before[i]) {
            BT_CHECK(home < 0); /* one worker took it */
            home = i;
        }
    BT_CHECK(home >= 0);
    /* its events reached the router */
    for (int t = 0; t < 250; t++) {
        if (worker_metric(rport, "baton_router_worker_kv_index_blocks",
                          names[home]) >= n_shared / 4)
            break;
        BT_CHECK(t < 249);
        usleep(20000);
    }
    for (int i = 0; i < N_WORKERS; i++)
        if (i != home)
            BT_ASSERT_EQ(worker_metric(rport,
                                       "baton_router_worker_kv_index_blocks",
                                       names[i]), 0);

    /* Every request sharing the prefix follows it. */
    for (int r = 0; r < N_FOLLOW; r++) {
        memcpy(prompt + n_shared, golden[3 + r % 2].expect + r,
               sizeof(int) * 9);
        run_one(c, prompt, n_shared + 9, NULL);
    }
    served(c, names, before);
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
