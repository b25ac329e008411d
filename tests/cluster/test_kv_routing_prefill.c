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

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define N_WORKERS 3 /* prefill workers */
#define N_FOLLOW 6
#define RESP_MAX (1 << 20)

/* The router's per-worker sample `family` of worker `name`. */
static double worker_metric(int port, const char *family, const char *name)
{
    char sample[256];

    snprintf(sample, sizeof(sample), "%s{worker=\"%s\",role=\"prefill\"}",
             family, name);
    return prom_scrape(port, sample);
}

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
    memcpy(prompt, golden[1].prompt, sizeof(int) * (size_t)golden[1].n_prompt);
    memcpy(prompt + golden[1].n_prompt, golden[1].expect,
           sizeof(int) * (size_t)(n_shared - golden[1].n_prompt));
    memcpy(prompt + n_shared, golden[2].expect, sizeof(int) * 7);
    /* A busy worker first: an unrelated prompt occupies the worker that
     * least-loaded (and kv-aware, with nothing cached) picks among idle
     * ones, for its 300 ms step delay; the prefix goes to another. */
    served(c, names, before);
    submit(c, golden[0].prompt, golden[0].n_prompt, NULL, &two[0]);
    usleep(100000);
    served(c, names, after);
    for (int i = 0; i < N_WORKERS; i++)
        if (after[i] > before[i])
            first = i;
    BT_CHECK(first >= 0);
    submit(c, prompt, n_shared + 7, NULL, &two[1]);
    cu_collect(c, two, 2, 30000);
    BT_ASSERT_EQ(two[0].finished + two[1].finished, 2);
    served(c, names, before);
    for (int i = 0; i < N_WORKERS; i++)
        if (before[i] > after[i]) {
            BT_CHECK(home < 0); /* one worker took it */
            home = i;
        }
    BT_CHECK(home >= 0 && home != first);
    memcpy(after, before, sizeof(after));
    /* its events reached the router */
    for (int t = 0; t < 250; t++) {
        if (worker_metric(rport, "baton_router_worker_kv_index_blocks",
                          names[home]) >= n_shared / 4)
            break;
        BT_CHECK(t < 249);
        usleep(20000);
    }
    for (int i = 0; i < N_WORKERS; i++) /* the busy one: its 1 block */
        if (i != home)
            BT_ASSERT_EQ(worker_metric(rport,
                                       "baton_router_worker_kv_index_blocks",
                                       names[i]),
                         i == first ? golden[0].n_prompt / 4 : 0);

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
