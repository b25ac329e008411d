/*
 * test_kv_routing_prefill.c - KV-aware routing of prefill workers (issue
 * 38 item 2): a real router with --policy kv-aware, three baton-prefill
 * workers and one baton-decode --role decode (aidreams260K, block size
 * 4).  A request with a 40-token prefix is prefilled by one prefill
 * worker (not the one least-loaded picks among idle workers: that one is
 * kept busy then); once its KvEvents reached the router (its index
 * gauge), every later request sharing the prefix is prefilled by the same
 * worker (the other two stay idle; least-loaded would pick the first),
 * and computes only its suffix there
 * (baton_worker_prefix_hit_tokens_total).
 */
#include <sys/time.h>

#include "cluster/kv_routing_util.h"

#define N_WORKERS 3 /* prefill workers */
#define N_FOLLOW 6
#define RESP_MAX (1 << 20)

static void submit(client_t *c, const int *prompt, int n, const char *salt,
                   cu_result_t *res)
{
    client_request_t req;

    memset(res, 0, sizeof(*res));
    cu_ids_request(&req, prompt, n, 8);
    req.cache_salt = salt;
    BT_ASSERT_OK(client_submit(c, &req, &res->rid));
}

static void run_one(client_t *c, const int *prompt, int n, const char *salt)
{
    cu_result_t res;

    submit(c, prompt, n, salt, &res);
    cu_collect(c, &res, 1, 30000);
    BT_ASSERT_EQ(res.finished, 1);
    BT_ASSERT_EQ(res.n_ids, 8);
}

int main(void)
{
    static cu_golden_t golden[8];
    char listen[64], control[64], rport_s[16], model[512];
    char names[N_WORKERS][16], mport_s[N_WORKERS][16];
    int mports[N_WORKERS];
    int prompt[64], n_shared = 40, rport, home = -1, first = -1;
    static cu_result_t two[2]; /* the busy worker's, the prefix's */
    uint64_t before[N_WORKERS], after[N_WORKERS];
    client_t *c = NULL;

    cu_init();
    BT_CHECK(cu_golden_load("aidreams260K.bin", golden, 8) >= 4);
    cu_router_addrs(listen, control);
    rport = cu_free_port();
    for (int i = 0; i < N_WORKERS; i++) {
        mports[i] = cu_free_port();
        BT_CHECK(mports[i] != rport && (i == 0 || mports[i] != mports[0]));
    }
    snprintf(rport_s, sizeof(rport_s), "%d", rport);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--metrics-port", rport_s, "--policy", "kv-aware",
             "--kv-weights", "overlap=1,load=1", NULL);
    for (int i = 0; i < N_WORKERS; i++) {
        snprintf(names[i], sizeof(names[i]), "pf%d", i);
        snprintf(mport_s[i], sizeof(mport_s[i]), "%d", mports[i]);
        cu_spawn("baton-prefill", "--router", control, "--model", model,
                 "--threads", "1", "--name", names[i], "--kv-blocks", "200",
                 "--block-size", "4", "--metrics-port", mport_s[i],
                 "--step-delay-ms", "300", NULL);
    }
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--threads", "1", "--name", "dec", "--kv-blocks", "400",
             "--block-size", "4", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, N_WORKERS, 1, 30000);

    /* The shared prefix: a golden prompt and its greedy continuation. */
    kr_shared_prompt(prompt, golden, n_shared);
    /* A busy worker first: an unrelated prompt occupies the worker that
     * least-loaded (and kv-aware, with nothing cached) picks among idle
     * ones, for its 300 ms step delay; the prefix goes to another. */
    kr_served(c, names, N_WORKERS, before);
    submit(c, golden[0].prompt, golden[0].n_prompt, NULL, &two[0]);
    usleep(100000);
    kr_served(c, names, N_WORKERS, after);
    for (int i = 0; i < N_WORKERS; i++)
        if (after[i] > before[i])
            first = i;
    BT_CHECK(first >= 0);
    submit(c, prompt, n_shared + 7, NULL, &two[1]);
    cu_collect(c, two, 2, 30000);
    BT_ASSERT_EQ(two[0].finished + two[1].finished, 2);
    kr_served(c, names, N_WORKERS, before);
    for (int i = 0; i < N_WORKERS; i++)
        if (before[i] > after[i]) {
            BT_CHECK(home < 0); /* one worker took it */
            home = i;
        }
    BT_CHECK(home >= 0 && home != first);
    memcpy(after, before, sizeof(after));
    /* its events reached the router */
    kr_wait_indexed(rport, names[home], "prefill", n_shared / 4);
    for (int i = 0; i < N_WORKERS; i++) /* the busy one: its 1 block */
        if (i != home)
            BT_ASSERT_EQ(kr_worker_metric(rport,
                                          "baton_router_worker_kv_index_blocks",
                                          names[i], "prefill"),
                         i == first ? golden[0].n_prompt / 4 : 0);

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
    BT_ASSERT_EQ(before[home], after[home] + N_FOLLOW);
    for (int i = 0; i < N_WORKERS; i++)
        if (i != home)
            BT_ASSERT_EQ(before[i], after[i]);
    /* and found the prefix cached: at least the 40 shared tokens each */
    {
        static char resp[RESP_MAX];
        const char *body;
        double hit;
        BT_ASSERT_EQ(prom_http_get(mports[home], "/metrics", resp,
                                   sizeof(resp)), 200);
        body = strstr(resp, "\r\n\r\n");
        BT_CHECK(body != NULL);
        hit = metric(body + 4, "baton_worker_prefix_hit_tokens_total");
        fprintf(stderr, "%s: %g prompt tokens hit\n", names[home], hit);
        BT_CHECK(hit >= N_FOLLOW * n_shared);
    }

    client_destroy(&c);
    BT_TEST_PASS("cluster/kv_routing_prefill: a shared prefix is "
                 "prefilled by the prefill worker that caches it (router "
                 "index from its KvEvents), suffix only");
    return 0;
}
