/*
 * test_prefix_host.c - the prefix cache's host tier in an aggregated
 * cluster (issue 38 item 4): a real router and baton-decode --role both
 * (aidreams260K, block size 4, cpu backend) serve one sequence of
 * requests, first with --prefix-cache off, then on with a pool of 36
 * blocks (so other traffic evicts) and --kv-host-gb 0.001 (~130 blocks).
 *   1. A shared 40-token prefix S pushed out of the pool by three other
 *      requests comes back as a host-tier hit: the worker's
 *      baton_worker_prefix_host_loads_total grows by S's 10 blocks at
 *      least, its prompt tokens are counted as hits and not prefilled.
 *   2. Every output equals the cache-off output token for token (greedy,
 *      seeded sampling, and golden.jsonl's for the golden prompt, whose
 *      first block also comes back from the host).
 *   3. Another salt never hits, in either tier: S+A under "tenant-b"
 *      hits 0 tokens and loads nothing from the host.
 *   4. The router's index keeps the spilled blocks (tier 1 events) and
 *      /metrics shows baton_worker_prefix_cached_blocks{tier="1"} > 0.
 *   5. The worker exits cleanly on SIGTERM, logging no leak.
 */
#include <errno.h>
#include <sys/time.h>

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define N_REQ 12
#define GEN_TOKENS 24

typedef struct {
    int prompt[CU_MAX_IDS];
    int n_prompt;
    const char *salt;
    bool sampled;
    int max_tokens;
    bool host_hit;  /* S comes back from the host tier */
    bool no_hit;    /* another salt: nothing hits */
    const cu_golden_t *golden; /* NULL: not a golden prompt */
} ph_req_t;

static void submit_one(client_t *c, const ph_req_t *q, cu_result_t *res)
{
    client_request_t req;

    cu_ids_request(&req, q->prompt, q->n_prompt, q->max_tokens);
    req.cache_salt = q->salt;
    if (q->sampled)
        cu_request_sampled(&req, 4321);
    cu_run_request(c, &req, res);
}

static void append(ph_req_t *q, const int *ids, int n)
{
    for (int i = 0; i < n && q->n_prompt < CU_MAX_IDS; i++)
        q->prompt[q->n_prompt++] = ids[i];
}

static pid_t start_worker(const char *control, int mport, bool cache,
                          const char *log, const char *blocks)
{
    char model[512], mport_s[16];

    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    return cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                        model, "--threads", "1", "--name", "ph", "--role",
                        "both", "--kv-blocks", blocks, "--block-size", "4",
                        "--chunk-tokens", "16", "--metrics-port", mport_s,
                        "--prefix-cache", cache ? "on" : "off",
                        "--kv-host-gb", cache ? "0.001" : "0", NULL);
}

static void same_ids(const cu_result_t *a, const cu_result_t *b, int i)
{
    if (a->n_ids != b->n_ids)
        BT_TEST_FAIL("request %d: %d ids with the host tier, %d without "
                     "the cache", i, a->n_ids, b->n_ids);
    for (int k = 0; k < a->n_ids; k++)
        if (a->ids[k] != b->ids[k])
            BT_TEST_FAIL("request %d: id %d is %d with the host tier, %d "
                         "without the cache", i, k, a->ids[k], b->ids[k]);
}

int main(void)
{
    static cu_golden_t golden[8];
    static ph_req_t reqs[N_REQ];
    static cu_result_t off[N_REQ], on[N_REQ];
    ph_req_t s, traffic[3];
    char listen[64], control[64], rport_s[16], gauge[128], log[128];
    int n_golden, rport, mport_off, mport_on, n = 0;
    client_t *c = NULL;
    pid_t w;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 8);
    BT_CHECK(n_golden >= 4);
    cu_router_addrs(listen, control);
    rport = cu_free_port();
    mport_off = cu_free_port();
    mport_on = cu_free_port();
    BT_CHECK(rport != mport_off && mport_off != mport_on &&
             rport != mport_on);
    snprintf(rport_s, sizeof(rport_s), "%d", rport);

    /* S: 40 tokens (10 blocks); three 18-block requests that share
     * nothing with S fill the 36-block pool after it. */
    memset(&s, 0, sizeof(s));
    append(&s, golden[1].prompt, golden[1].n_prompt);
    append(&s, golden[1].expect, 40 - golden[1].n_prompt);
    memset(traffic, 0, sizeof(traffic));
    for (int t = 0; t < 3; t++) {
        const cu_golden_t *g = &golden[t == 2 ? 0 : t + 2];

        append(&traffic[t], g->prompt, g->n_prompt);
        append(&traffic[t], g->expect, 44 - g->n_prompt - 3 * t);
        traffic[t].max_tokens = GEN_TOKENS;
    }
    /* 0: golden, cold */
    reqs[n].golden = &golden[0];
    append(&reqs[n], golden[0].prompt, golden[0].n_prompt);
    reqs[n++].max_tokens = golden[0].max_tokens;
    /* 1: S+A, cold */
    append(&reqs[n], s.prompt, s.n_prompt);
    append(&reqs[n], golden[2].expect, 7);
    reqs[n++].max_tokens = GEN_TOKENS;
    for (int t = 0; t < 3; t++)
        reqs[n++] = traffic[t];
    /* 5: S+B greedy: S from the host */
    append(&reqs[n], s.prompt, s.n_prompt);
    append(&reqs[n], golden[3].expect, 9);
    reqs[n].host_hit = true;
    reqs[n++].max_tokens = GEN_TOKENS;
    for (int t = 0; t < 3; t++)
        reqs[n++] = traffic[t];
    /* 9: S+B seeded: S from the host again */
    reqs[n] = reqs[5];
    reqs[n++].sampled = true;
    /* 10: S+A under another salt: no hit in either tier */
    reqs[n] = reqs[1];
    reqs[n].salt = "tenant-b";
    reqs[n++].no_hit = true;
    /* 11: golden again (its first block pushed out long ago) */
    reqs[n++] = reqs[0];
    BT_ASSERT_EQ(n, N_REQ);

    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3",
             "--metrics-port", rport_s, NULL);
    BT_ASSERT_OK(client_create(listen, &c));

    /* cache off: the reference outputs */
    w = start_worker(control, mport_off, false, NULL, "600");
    cu_wait_workers(c, 0, 1, 20000);
    for (int i = 0; i < N_REQ; i++)
        submit_one(c, &reqs[i], &off[i]);
    cu_kill(w, SIGTERM);
    BT_CHECK(cu_wait_exit(w, 10000) == 0);
    for (int t = 0; t < 100; t++) {
        cu_status_t st;

        if (cu_status(c, &st) == 0 && st.n_decode == 0)
            break;
        usleep(50000);
    }

    /* cache on, 36-block pool, host tier */
    snprintf(log, sizeof(log), "/tmp/bt_prefix_host_%d.log", (int)getpid());
    w = start_worker(control, mport_on, true, log, "36");
    cu_wait_workers(c, 0, 1, 20000);
    prom_wait(mport_on, "baton_worker_registered", 1, 1, 10000);
    for (int i = 0; i < N_REQ; i++) {
        double look = prom_scrape(mport_on, "baton_worker_prefix_lookups_total");
        double hit0 = prom_scrape(mport_on, "baton_worker_prefix_hit_tokens_total");
        double pre0 = prom_scrape(mport_on, "baton_worker_prefill_tokens_total");
        double ld0 = prom_scrape(mport_on, "baton_worker_prefix_host_loads_total");
        double hit, pre, ld;

        BT_CHECK(look >= 0 && hit0 >= 0 && pre0 >= 0 && ld0 >= 0);
        submit_one(c, &reqs[i], &on[i]);
        prom_wait(mport_on, "baton_worker_prefix_lookups_total", look + 1,
                    look + 1, 5000);
        hit = prom_scrape(mport_on, "baton_worker_prefix_hit_tokens_total") - hit0;
        pre = prom_scrape(mport_on, "baton_worker_prefill_tokens_total") - pre0;
        ld = prom_scrape(mport_on, "baton_worker_prefix_host_loads_total") - ld0;
        fprintf(stderr, "request %d: prompt %d, hit %g, prefilled %g, "
                "host loads %g, host cached %g\n", i, reqs[i].n_prompt, hit,
                pre, ld, prom_scrape(mport_on, "baton_worker_prefix_cached_blocks"
                                          "{tier=\"1\"}"));
        BT_ASSERT_EQ((int)pre, reqs[i].n_prompt - (int)hit);
        if (reqs[i].host_hit && (hit < 40 || ld < 10))
            BT_TEST_FAIL("request %d: S not back from the host tier (hit "
                         "%g tokens, %g host loads)", i, hit, ld);
        if (reqs[i].no_hit && (hit != 0 || ld != 0))
            BT_TEST_FAIL("request %d (salt %s): hit %g tokens, %g host "
                         "loads across salts", i, reqs[i].salt, hit, ld);
        same_ids(&on[i], &off[i], i);
        if (reqs[i].golden != NULL) {
            cu_check_golden(&off[i], reqs[i].golden, i);
            cu_check_golden(&on[i], reqs[i].golden, i);
        }
    }
    BT_CHECK(prom_scrape(mport_on, "baton_worker_prefix_host_saves_total") > 0);
    BT_CHECK(prom_scrape(mport_on, "baton_worker_prefix_cached_blocks{tier=\"1\"}")
             > 0);
    /* the router counts blocks of both tiers (more than the pool holds) */
    snprintf(gauge, sizeof(gauge), "baton_router_worker_kv_index_blocks"
             "{worker=\"ph\",role=\"decode+prefill\"}");
    prom_wait(rport, gauge, 37, 1e9, 5000);
    /* baton status shows both tiers (pool+host/hit%), from heartbeats */
    {
        char cmd[512];
        bool shown = false;

        snprintf(cmd, sizeof(cmd), "%s/baton status --router %s --json | "
                 "grep -q '\"prefix_host_cached_blocks\":[1-9]' && %s/baton "
                 "status --router %s | grep -Eq ' ph .* [0-9]+\\+[1-9][0-9]*/'",
                 BT_BIN_DIR, listen, BT_BIN_DIR, listen);
        for (int t = 0; t < 50 && !shown; t++) {
            shown = system(cmd) == 0;
            if (!shown)
                usleep(100000);
        }
        if (!shown)
            BT_TEST_FAIL("baton status does not show the host tier's blocks");
    }
    cu_wait_kv_idle(c, 5000);
    cu_stop_no_leak(w, log, "worker");
    client_destroy(&c);
    BT_TEST_PASS("cluster/prefix_host: a shared prefix pushed out of the "
                 "pool comes back from the host tier; output = cache off "
                 "(greedy, seeded, golden); salts apart; router keeps both "
                 "tiers; no leak");
    return 0;
}
