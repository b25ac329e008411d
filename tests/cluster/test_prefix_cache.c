/*
 * test_prefix_cache.c - the prefix cache in an aggregated cluster (issue
 * 38): a real router and baton-decode --role both (aidreams260K, block
 * size 4) serve one sequence of requests with shared prefixes, greedy
 * and seeded sampling, first with --prefix-cache off, then on.
 *   1. Output with the cache on equals output with it off, token for
 *      token (and golden.jsonl's for the golden prompts).
 *   2. The cache hits: a repeated or shared prefix's prompt tokens are
 *      counted as hits on the worker's /metrics and are not prefilled
 *      again (baton_worker_prefill_tokens_total grows by the suffix only).
 *   3. Two salts never hit: the first request under a new salt hits
 *      nothing, the second under it hits its own blocks.
 *   4. Events: the router's index of the worker (its /metrics gauge
 *      baton_router_worker_kv_index_blocks) fills; after kill -9 and a
 *      new process under the same name it is empty, and fills again
 *      after the new process serves a request.
 *   4b. Under eviction (the new process has a pool 3 blocks larger than
 *      the largest request) two more rounds give the cache-off outputs.
 *   5. Every KV block is free once the requests are done (cached blocks
 *      count as free: evictable), and the worker exits cleanly on
 *      SIGTERM with no leak of KV blocks or host memory in its log.
 */
#include <errno.h>
#include <sys/time.h>

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define N_REQ 10
#define LONG_TOKENS 24

typedef struct {
    int prompt[CU_MAX_IDS];
    int n_prompt;
    const char *salt;
    bool sampled;
    bool prompt_logprobs; /* every prompt position computed: no hit */
    int max_tokens;
    int min_hit;    /* hit tokens expected at least (exactly when exact) */
    bool exact;
    const cu_golden_t *golden; /* NULL: not a golden prompt */
} pc_req_t;

static void submit_one(client_t *c, const pc_req_t *q, cu_result_t *res)
{
    client_request_t req;

    cu_ids_request(&req, q->prompt, q->n_prompt, q->max_tokens);
    req.cache_salt = q->salt;
    req.prompt_logprobs = q->prompt_logprobs;
    if (q->sampled)
        cu_request_sampled(&req, 1234);
    cu_run_request(c, &req, res);
}

/* `baton status`'s source: the router's ClusterStatus shows the worker's
 * cached blocks and hit rate from its heartbeats (bounded wait). */
static void status_prefix(client_t *c, const char *name, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 50) {
        uint64_t rid;
        bool ok = false;

        BT_ASSERT_OK(client_status_request(c, &rid));
        for (;;) {
            Baton__ClientMessage *m = NULL;
            BT_ASSERT_OK(client_recv(c, 2000, &m));
            if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS &&
                m->status->client_request_id == rid) {
                for (size_t i = 0; i < m->status->n_workers; i++) {
                    Baton__WorkerStatus *w = m->status->workers[i];
                    if (strcmp(w->name, name) == 0 &&
                        w->has_prefix_cached_blocks &&
                        w->prefix_cached_blocks > 0 &&
                        w->prefix_hit_rate > 0.3 &&
                        w->prefix_hit_rate < 1)
                        ok = true;
                }
                proto_client_free(&m);
                break;
            }
            proto_client_free(&m);
        }
        if (ok)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("status shows no prefix cache figures for %s", name);
}

static void append(pc_req_t *q, const int *ids, int n)
{
    for (int i = 0; i < n && q->n_prompt < CU_MAX_IDS; i++)
        q->prompt[q->n_prompt++] = ids[i];
}

/* Starts an aggregated worker named `name` reporting metrics on mport. */
static pid_t start_worker(const char *control, const char *name, int mport,
                          bool cache, const char *log, const char *blocks)
{
    char model[512], mport_s[16];

    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    return cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                    model,
                    "--threads", "1", "--name", name, "--role", "both",
                    "--kv-blocks", blocks, "--block-size", "4",
                    "--chunk-tokens", "16", "--metrics-port", mport_s,
                    "--prefix-cache", cache ? "on" : "off", NULL);
}

int main(void)
{
    static cu_golden_t golden[8];
    static pc_req_t reqs[N_REQ];
    static cu_result_t off[N_REQ], on[N_REQ], after;
    char listen[64], control[64], rport_s[16];
    char gauge[128], log[128];
    int n_golden, rport, mport_off, mport_on, shared;
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

    /* The requests.  S: a 40-token shared prefix (a golden prompt and its
     * greedy continuation), A and B: two different tails. */
    for (int i = 0; i < N_REQ; i++)
        reqs[i].max_tokens = LONG_TOKENS;
    reqs[0].golden = &golden[0];             /* cold */
    reqs[1].golden = &golden[0];             /* repeated: hits */
    reqs[1].min_hit = 4;
    for (int i = 0; i < 2; i++) {
        append(&reqs[i], golden[0].prompt, golden[0].n_prompt);
        reqs[i].max_tokens = golden[0].max_tokens;
    }
    {
        pc_req_t s;
        memset(&s, 0, sizeof(s));
        append(&s, golden[1].prompt, golden[1].n_prompt);
        append(&s, golden[1].expect, 40 - golden[1].n_prompt);
        shared = s.n_prompt; /* 40: 10 blocks of 4 */
        for (int i = 2; i < N_REQ; i++)
            append(&reqs[i], s.prompt, s.n_prompt);
    }
    append(&reqs[2], golden[2].expect, 7);   /* S+A: cold */
    append(&reqs[3], golden[3].expect, 9);   /* S+B: S hits */
    reqs[3].min_hit = shared;
    append(&reqs[4], golden[2].expect, 7);   /* S+A, salt b: no hit */
    reqs[4].salt = "tenant-b";
    reqs[4].exact = true;
    append(&reqs[5], golden[2].expect, 7);   /* S+A, salt b: its own */
    reqs[5].salt = "tenant-b";
    reqs[5].min_hit = (reqs[5].n_prompt - 1) / 4 * 4;
    reqs[5].exact = true;
    append(&reqs[6], golden[2].expect, 7);   /* S+A, no salt again */
    reqs[6].min_hit = (reqs[6].n_prompt - 1) / 4 * 4;
    reqs[6].exact = true;
    append(&reqs[7], golden[3].expect, 9);   /* S+B seeded sampling */
    reqs[7].sampled = true;
    reqs[7].min_hit = (reqs[7].n_prompt - 1) / 4 * 4;
    reqs[7].exact = true;
    append(&reqs[8], golden[3].expect, 9);   /* S+B + S+B's output: hits
                                                the blocks of generated ids */
    reqs[8].exact = true;
    append(&reqs[9], golden[3].expect, 9);   /* S+B with prompt logprobs:
                                                computed whole, no hit */
    reqs[9].prompt_logprobs = true;
    reqs[9].exact = true;

    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3",
             "--metrics-port", rport_s, NULL);
    BT_ASSERT_OK(client_create(listen, &c));

    /* 1. cache off: the reference outputs. */
    w = start_worker(control, "pc", mport_off, false, NULL, "600");
    cu_wait_workers(c, 0, 1, 20000);
    for (int i = 0; i < N_REQ; i++) {
        if (i == 8) /* a follow-up turn: S+B, its greedy output, more */
            append(&reqs[8], off[3].ids, 12);
        submit_one(c, &reqs[i], &off[i]);
    }
    reqs[8].min_hit = (reqs[8].n_prompt - 1) / 4 * 4;
    BT_CHECK(prom_scrape(mport_off, "baton_worker_prefix_lookups_total") < 0);
    cu_kill(w, SIGTERM);
    BT_CHECK(cu_wait_exit(w, 10000) == 0);
    for (int t = 0; t < 100; t++) {
        cu_status_t st;
        if (cu_status(c, &st) == 0 && st.n_decode == 0)
            break;
        usleep(50000);
    }

    /* 2. cache on: the same outputs, and the hits. */
    w = start_worker(control, "pc", mport_on, true, NULL, "600");
    cu_wait_workers(c, 0, 1, 20000);
    prom_wait(mport_on, "baton_worker_registered", 1, 1, 10000);
    for (int i = 0; i < N_REQ; i++) {
        double hit0 = prom_scrape(mport_on, "baton_worker_prefix_hit_tokens_total");
        double pre0 = prom_scrape(mport_on, "baton_worker_prefill_tokens_total");
        double look = prom_scrape(mport_on, "baton_worker_prefix_lookups_total");
        double hit, pre;

        BT_CHECK(hit0 >= 0 && pre0 >= 0 && look >= 0);
        submit_one(c, &reqs[i], &on[i]);
        /* the heartbeat's snapshot trails the step by a turn */
        if (reqs[i].prompt_logprobs) /* not looked up at all */
            usleep(200000);
        else
            prom_wait(mport_on, "baton_worker_prefix_lookups_total",
                        look + 1, look + 1, 5000);
        hit = prom_scrape(mport_on, "baton_worker_prefix_hit_tokens_total") - hit0;
        pre = prom_scrape(mport_on, "baton_worker_prefill_tokens_total") - pre0;
        fprintf(stderr, "request %d: prompt %d, hit %g, prefilled %g%s%s\n",
                i, reqs[i].n_prompt, hit, pre,
                reqs[i].salt ? ", salt " : "",
                reqs[i].salt ? reqs[i].salt : "");
        if (hit < reqs[i].min_hit || (reqs[i].exact && hit != reqs[i].min_hit))
            BT_TEST_FAIL("request %d: %g prompt tokens hit, want %s%d", i,
                         hit, reqs[i].exact ? "" : ">= ", reqs[i].min_hit);
        /* the hit is never the last token's block, and is not computed */
        BT_CHECK(hit <= reqs[i].n_prompt - 1);
        BT_ASSERT_EQ((int)pre, reqs[i].n_prompt - (int)hit);
        if (off[i].n_ids != on[i].n_ids)
            BT_TEST_FAIL("request %d: %d ids with the cache, %d without", i,
                         on[i].n_ids, off[i].n_ids);
        for (int k = 0; k < off[i].n_ids; k++)
            if (on[i].ids[k] != off[i].ids[k])
                BT_TEST_FAIL("request %d: id %d is %d with the cache, %d "
                             "without", i, k, on[i].ids[k], off[i].ids[k]);
        if (reqs[i].golden != NULL) {
            cu_check_golden(&off[i], reqs[i].golden, i);
            cu_check_golden(&on[i], reqs[i].golden, i);
        }
    }
    /* the follow-up turn hit blocks holding S+B's generated ids */
    BT_CHECK(reqs[8].min_hit > reqs[3].n_prompt);
    cu_wait_kv_idle(c, 5000);
    BT_CHECK(prom_scrape(mport_on, "baton_worker_prefix_cached_blocks{tier=\"0\"}")
             > 0);
    status_prefix(c, "pc", 1000);

    /* 3. events: the router's index of pc fills, empties with a new
     * process, fills again. */
    snprintf(gauge, sizeof(gauge), "baton_router_worker_kv_index_blocks"
             "{worker=\"pc\",role=\"decode+prefill\"}");
    prom_wait(rport, gauge, 1, 1e9, 5000);
    cu_kill(w, SIGKILL);
    snprintf(log, sizeof(log), "/tmp/bt_prefix_cache_%d.log", (int)getpid());
    /* a pool 3 blocks larger than the largest request (33 blocks: a
     * golden prompt and its 123 tokens), so caching evicts */
    w = start_worker(control, "pc", mport_off, true, log, "36");
    prom_wait(mport_off, "baton_worker_registered", 1, 1, 20000);
    prom_wait(rport, gauge, 0, 0, 5000);
    submit_one(c, &reqs[3], &after);
    BT_ASSERT_EQ(after.n_ids, off[3].n_ids);
    BT_CHECK(memcmp(after.ids, off[3].ids, sizeof(int) * (size_t)after.n_ids)
             == 0);
    prom_wait(mport_off, "baton_worker_prefix_lookups_total", 1, 1, 5000);
    BT_ASSERT_EQ(prom_scrape(mport_off, "baton_worker_prefix_hit_tokens_total"),
                 0);
    prom_wait(rport, gauge, (reqs[3].n_prompt - 1) / 4, 1e9, 5000);
    cu_wait_kv_idle(c, 5000);
    /* 4. under eviction the outputs stay the cache-off ones */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N_REQ; i++) {
            submit_one(c, &reqs[i], &after);
            BT_ASSERT_EQ(after.n_ids, off[i].n_ids);
            for (int k = 0; k < off[i].n_ids; k++)
                if (after.ids[k] != off[i].ids[k])
                    BT_TEST_FAIL("tight pool, request %d: id %d is %d, "
                                 "%d without the cache", i, k, after.ids[k],
                                 off[i].ids[k]);
        }
    }
    prom_wait(mport_off, "baton_worker_prefix_evictions_total", 1, 1e9,
                5000);
    BT_CHECK(prom_scrape(mport_off, "baton_worker_prefix_hit_tokens_total") > 0);
    fprintf(stderr, "tight pool (36 blocks): evictions %g, hit tokens %g\n",
            prom_scrape(mport_off, "baton_worker_prefix_evictions_total"),
            prom_scrape(mport_off, "baton_worker_prefix_hit_tokens_total"));
    cu_wait_kv_idle(c, 5000);
    /* 5. a clean exit: every KV block and host allocation accounted for
     * (the worker logs "leak:" otherwise) */
    cu_stop_no_leak(w, log, "worker");
    client_destroy(&c);
    BT_TEST_PASS("cluster/prefix_cache: on = off token for token (greedy, "
                 "seeded, golden), hits counted and not prefilled, salts "
                 "apart, router index reset and refilled after kill -9");
    return 0;
}
