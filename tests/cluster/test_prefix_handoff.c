/*
 * test_prefix_handoff.c - disaggregated prefix-cache hits (issue 38 item
 * 2): a real router, baton-prefill and baton-decode (aidreams260K, block
 * size 4) serve one sequence of requests with shared prefixes, greedy and
 * seeded, first with the caches off, then on.
 *   1. Output with the caches on equals output with them off, token for
 *      token (and golden.jsonl's for the golden prompt), over the UCX link
 *      and inline (--no-ucx).
 *   2. The decode worker holds the cached prefix of a prompt at the grant
 *      and the hand-off moves only the rest: the prefill worker's
 *      baton_worker_kv_blocks_sent_total grows by the missing blocks, both
 *      sides' baton_worker_kv_blocks_held_total by the held ones, the
 *      decode worker's ..._received_total by the missing ones.
 *   3. The prefill worker's own cache: a repeated prefix is not prefilled
 *      again there (baton_worker_prefill_tokens_total grows by the suffix
 *      only, in several chunks for the last request; its
 *      baton_worker_prefix_hit_tokens_total by the prefix).
 *   4. Two salts never hit, on either side.
 *   5. kill -9 of the prefill worker while a hand-off with held blocks
 *      waits: the request is prefilled again elsewhere with the same
 *      tokens, every KV block comes back (cached ones count as free), and
 *      the decode worker exits with no leak in its log.
 *   6. kill -9 of a decode worker streaming a request whose hand-off it
 *      partly held: the seeded request resumes elsewhere with the
 *      cache-off tokens.
 */
#include <errno.h>

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

#define N_REQ 8
#define MAX_TOKENS 16

typedef struct {
    int prompt[CU_MAX_IDS];
    int n_prompt;
    const char *salt;
    bool sampled;
    int held;       /* hand-off blocks the decode worker holds, at least */
    bool exact;     /* ... exactly */
    int pf_hit;     /* prompt tokens the prefill worker finds cached */
    const cu_golden_t *golden;
} ph_req_t;

static uint64_t submit(client_t *c, const ph_req_t *q)
{
    client_request_t req;
    uint64_t rid;

    cu_ids_request(&req, q->prompt, q->n_prompt,
                   q->golden != NULL ? q->golden->max_tokens : MAX_TOKENS);
    req.cache_salt = q->salt;
    if (q->sampled)
        cu_request_sampled(&req, 4321);
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

static void run_one(client_t *c, const ph_req_t *q, cu_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->rid = submit(c, q);
    cu_collect(c, res, 1, 30000);
    BT_ASSERT_EQ(res->finished, 1);
}

static void same_ids(const cu_result_t *a, const cu_result_t *b, int i,
                     const char *what)
{
    if (a->n_ids != b->n_ids)
        BT_TEST_FAIL("%s, request %d: %d ids, %d with the caches off", what,
                     i, a->n_ids, b->n_ids);
    for (int k = 0; k < a->n_ids; k++)
        if (a->ids[k] != b->ids[k])
            BT_TEST_FAIL("%s, request %d: id %d is %d, %d with the caches "
                         "off", what, i, k, a->ids[k], b->ids[k]);
}

static void append(ph_req_t *q, const int *ids, int n)
{
    for (int i = 0; i < n && q->n_prompt < CU_MAX_IDS; i++)
        q->prompt[q->n_prompt++] = ids[i];
}

static pid_t start_prefill(const char *control, const char *name, int mport,
                           bool cache, bool ucx, int delay_ms)
{
    char model[512], mport_s[16], delay_s[16];

    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    snprintf(delay_s, sizeof(delay_s), "%d", delay_ms);
    /* the last option: inline KV, or the block size again (a no-op) */
    return cu_spawn("baton-prefill", "--router", control, "--model", model,
                    "--threads", "1", "--name", name, "--block-size", "4",
                    "--kv-blocks", "200", "--chunk-tokens", "16",
                    "--metrics-port", mport_s, "--step-delay-ms", delay_s,
                    "--prefix-cache", cache ? "on" : "off",
                    ucx ? "--block-size=4" : "--no-ucx", NULL);
}

static pid_t start_decode(const char *control, const char *name, int mport,
                          bool cache, const char *log)
{
    char model[512], mport_s[16];

    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    return cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                        model, "--threads", "1", "--name", name,
                        "--block-size", "4", "--kv-blocks", "400",
                        "--metrics-port", mport_s,
                        "--prefix-cache", cache ? "on" : "off", NULL);
}

/* A decode worker whose steps take 100 ms: a stream lasts long enough
 * to kill it in the middle. */
static pid_t start_decode_slow(const char *control, const char *name,
                               int mport)
{
    char model[512], mport_s[16];

    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    return cu_spawn("baton-decode", "--router", control, "--model", model,
                    "--threads", "1", "--name", name, "--block-size", "4",
                    "--kv-blocks", "400", "--metrics-port", mport_s,
                    "--step-delay-ms", "100", NULL);
}

/* Counter deltas of one request on the prefill (pm) and decode (dm)
 * workers. */
typedef struct {
    double sent, pf_held, received, held, pf_hit, pf_tokens, pf_lookups;
} ph_counts_t;

static void counts(int pm, int dm, ph_counts_t *c)
{
    c->sent = prom_scrape(pm, "baton_worker_kv_blocks_sent_total");
    c->pf_held = prom_scrape(pm, "baton_worker_kv_blocks_held_total");
    c->pf_hit = prom_scrape(pm, "baton_worker_prefix_hit_tokens_total");
    c->pf_lookups = prom_scrape(pm, "baton_worker_prefix_lookups_total");
    c->pf_tokens = prom_scrape(pm, "baton_worker_prefill_tokens_total");
    c->received = prom_scrape(dm, "baton_worker_kv_blocks_received_total");
    c->held = prom_scrape(dm, "baton_worker_kv_blocks_held_total");
    BT_CHECK(c->sent >= 0 && c->pf_held >= 0 && c->pf_tokens >= 0 &&
             c->received >= 0 && c->held >= 0);
}

/* Runs reqs[] on the current pair and checks the counters of each. */
static void run_on(client_t *c, ph_req_t *reqs, cu_result_t *off,
                   cu_result_t *on, int pm, int dm, const char *what)
{
    for (int i = 0; i < N_REQ; i++) {
        const ph_req_t *q = &reqs[i];
        int blocks = (q->n_prompt + 3) / 4;
        ph_counts_t a, b;
        double held;

        counts(pm, dm, &a);
        run_one(c, q, &on[i]);
        /* the decode side counts at KvReady, before the first token */
        prom_wait(dm, "baton_worker_kv_blocks_received_total",
                    a.received + 1, 1e9, 5000);
        prom_wait(pm, "baton_worker_kv_blocks_sent_total", a.sent + 1, 1e9,
                    5000);
        /* the prefix cache's counters come with the worker's published
         * state, not at once as the hand-off's: read them once it shows
         * this prompt's lookup (a loaded machine once read the hits of
         * the request before) */
        if (a.pf_lookups >= 0)
            prom_wait(pm, "baton_worker_prefix_lookups_total",
                      a.pf_lookups + 1, 1e9, 5000);
        counts(pm, dm, &b);
        held = b.held - a.held;
        fprintf(stderr, "%s request %d: prompt %d (%d blocks), decode held "
                "%g, sent %g, received %g; prefill hit %g, prefilled %g%s%s\n",
                what, i, q->n_prompt, blocks, held, b.sent - a.sent,
                b.received - a.received, b.pf_hit - a.pf_hit,
                b.pf_tokens - a.pf_tokens, q->salt ? ", salt " : "",
                q->salt ? q->salt : "");
        if (held < q->held || (q->exact && held != q->held))
            BT_TEST_FAIL("%s request %d: %g blocks held, want %s%d", what, i,
                         held, q->exact ? "" : ">= ", q->held);
        BT_CHECK(held <= (q->n_prompt - 1) / 4);
        BT_ASSERT_EQ((int)(b.sent - a.sent), blocks - (int)held);
        BT_ASSERT_EQ((int)(b.received - a.received), blocks - (int)held);
        BT_ASSERT_EQ((int)(b.pf_held - a.pf_held), (int)held);
        if (b.pf_hit >= 0) { /* the prefill worker's cache is on */
            double hit = b.pf_hit - a.pf_hit;
            if (hit < q->pf_hit || (q->exact && hit != q->pf_hit))
                BT_TEST_FAIL("%s request %d: the prefill worker hit %g "
                             "tokens, want %s%d", what, i, hit,
                             q->exact ? "" : ">= ", q->pf_hit);
            BT_ASSERT_EQ((int)(b.pf_tokens - a.pf_tokens),
                         q->n_prompt - (int)hit);
        }
        same_ids(&on[i], &off[i], i, what);
        if (q->golden != NULL)
            cu_check_golden(&on[i], q->golden, i);
    }
}

int main(void)
{
    static cu_golden_t golden[8];
    static ph_req_t reqs[N_REQ];
    static cu_result_t off[N_REQ], on[N_REQ], again;
    char listen[64], control[64], log[128];
    int shared, pm, dm, pm2, dm2;
    client_t *c = NULL;
    pid_t p, d;

    cu_init();
    BT_CHECK(cu_golden_load("aidreams260K.bin", golden, 8) >= 5);
    cu_router_addrs(listen, control);
    pm = cu_free_port();
    dm = cu_free_port();
    pm2 = cu_free_port();
    dm2 = cu_free_port();
    BT_CHECK(pm != dm && pm2 != pm && pm2 != dm && dm2 != pm && dm2 != dm &&
             dm2 != pm2);

    /* S: a 40-token shared prefix (a golden prompt and its greedy
     * continuation), A and B: two different tails. */
    {
        ph_req_t s;
        memset(&s, 0, sizeof(s));
        append(&s, golden[1].prompt, golden[1].n_prompt);
        append(&s, golden[1].expect, 40 - golden[1].n_prompt);
        shared = s.n_prompt;
        for (int i = 1; i < N_REQ; i++)
            append(&reqs[i], s.prompt, s.n_prompt);
    }
    reqs[0].golden = &golden[0];            /* cold */
    append(&reqs[0], golden[0].prompt, golden[0].n_prompt);
    append(&reqs[1], golden[2].expect, 7);  /* S+A: cold */
    append(&reqs[2], golden[3].expect, 9);  /* S+B: S held, partial */
    reqs[2].held = shared / 4;
    reqs[2].pf_hit = shared;
    append(&reqs[3], golden[3].expect, 9);  /* S+B seeded: all held */
    reqs[3].sampled = true;
    reqs[3].held = (reqs[3].n_prompt - 1) / 4;
    reqs[3].pf_hit = (reqs[3].n_prompt - 1) / 4 * 4;
    reqs[3].exact = true;
    append(&reqs[4], golden[2].expect, 7);  /* S+A, salt b: no hit */
    reqs[4].salt = "tenant-b";
    reqs[4].exact = true;
    append(&reqs[5], golden[2].expect, 7);  /* S+A, salt b: its own */
    reqs[5].salt = "tenant-b";
    reqs[5].held = (reqs[5].n_prompt - 1) / 4;
    reqs[5].pf_hit = (reqs[5].n_prompt - 1) / 4 * 4;
    reqs[5].exact = true;
    append(&reqs[6], golden[2].expect, 7);  /* S+A, no salt: held */
    reqs[6].held = (reqs[6].n_prompt - 1) / 4;
    reqs[6].pf_hit = (reqs[6].n_prompt - 1) / 4 * 4;
    reqs[6].exact = true;
    append(&reqs[7], golden[2].expect, 7);  /* S+A+C: a suffix of chunks */
    BT_CHECK(golden[4].n_expect >= 26);
    append(&reqs[7], golden[4].expect, 26);
    reqs[7].held = (reqs[6].n_prompt - 1) / 4;
    reqs[7].pf_hit = (reqs[6].n_prompt - 1) / 4 * 4;

    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    BT_ASSERT_OK(client_create(listen, &c));

    /* 1. caches off: the reference outputs. */
    p = start_prefill(control, "p0", pm, false, true, 0);
    d = start_decode(control, "d0", dm, false, NULL);
    cu_wait_workers(c, 1, 1, 20000);
    for (int i = 0; i < N_REQ; i++) {
        run_one(c, &reqs[i], &off[i]);
        if (reqs[i].golden != NULL)
            cu_check_golden(&off[i], reqs[i].golden, i);
    }
    BT_ASSERT_EQ(prom_scrape(dm, "baton_worker_kv_blocks_held_total"), 0);
    cu_kill(p, SIGTERM);
    cu_kill(d, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p, 10000), 0);
    BT_ASSERT_EQ(cu_wait_exit(d, 10000), 0);
    cu_wait_workers(c, 0, 0, 10000);

    /* 2. caches on, over UCX: the same outputs, the hits. */
    snprintf(log, sizeof(log), "/tmp/bt_prefix_handoff_%d.log", (int)getpid());
    p = start_prefill(control, "p1", pm, true, true, 0);
    d = start_decode(control, "d1", dm, true, log);
    cu_wait_workers(c, 1, 1, 20000);
    prom_wait(dm, "baton_worker_registered", 1, 1, 10000);
    prom_wait(pm, "baton_worker_registered", 1, 1, 10000);
    run_on(c, reqs, off, on, pm, dm, "ucx");
    cu_kill(p, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p, 10000), 0);

    /* 3. inline (--no-ucx), a fresh prefill worker (its cache empty):
     * the decode worker holds what it cached in round 2 (S+A, S+B: all
     * but the last block of each; salt b's own), so every hand-off but
     * the cold golden prompt's is partial, and the outputs are the same.
     * The prefill worker's own hits follow its cache: cold at first. */
    for (int i = 0; i < N_REQ; i++) {
        reqs[i].pf_hit = 0;
        reqs[i].exact = false;
        reqs[i].held = i == 0 ? reqs[i].held : (reqs[i].n_prompt - 1) / 4;
    }
    reqs[0].held = (reqs[0].n_prompt - 1) / 4; /* golden[0]: cached too */
    p = start_prefill(control, "p2", pm2, true, false, 0);
    cu_wait_workers(c, 1, 1, 20000);
    prom_wait(pm2, "baton_worker_registered", 1, 1, 10000);
    run_on(c, reqs, off, on, pm2, dm, "inline");
    cu_kill(p, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p, 10000), 0);

    /* 4. kill -9 of the prefill worker while a hand-off with held blocks
     * waits (its 600 ms step delay): the router drops it, releases the
     * reservation (the held blocks back to the cache, the rest
     * quarantined), and the request is prefilled again on p4. */
    p = start_prefill(control, "p3", pm, true, true, 600);
    cu_wait_workers(c, 1, 1, 20000);
    prom_wait(pm, "baton_worker_registered", 1, 1, 10000);
    {
        double held0 = prom_scrape(dm, "baton_worker_kv_blocks_held_total");
        memset(&again, 0, sizeof(again));
        again.rid = submit(c, &reqs[2]);
        usleep(200000);
        cu_kill(p, SIGKILL);
        BT_ASSERT_EQ(prom_scrape(dm, "baton_worker_kv_blocks_held_total"), held0);
    }
    p = start_prefill(control, "p4", pm2, true, true, 0);
    cu_collect(c, &again, 1, 30000);
    BT_ASSERT_EQ(again.finished, 1);
    BT_CHECK(again.retries > 0);
    same_ids(&again, &off[2], 2, "after kill -9");
    cu_wait_kv_idle(c, 10000);

    /* 5. a clean exit: every KV block and host allocation accounted for
     * (the worker logs "leak:" otherwise). */
    cu_kill(p, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p, 10000), 0);
    cu_stop_no_leak(d, log, "decode worker");
    /* 6. failover: a decode worker that held the prefix at the grant
     * dies mid-stream (kill -9); the request resumes on a cold one,
     * prompt + streamed tokens prefilled again (the prefill worker's
     * cache holds the prompt), and the seeded stream continues: the
     * cache-off tokens. */
    p = start_prefill(control, "p5", pm, true, true, 0);
    d = start_decode_slow(control, "d2", dm);
    cu_wait_workers(c, 1, 1, 20000);
    prom_wait(dm, "baton_worker_registered", 1, 1, 10000);
    run_one(c, &reqs[3], &again); /* d2 caches S+B */
    same_ids(&again, &off[3], 3, "failover warm-up");
    {
        double held0 = prom_scrape(dm, "baton_worker_kv_blocks_held_total");
        pid_t d3;

        memset(&again, 0, sizeof(again));
        again.rid = submit(c, &reqs[3]);
        cu_stream_until(c, &again, 1, 3, 1, "no tokens before the kill");
        BT_CHECK(prom_scrape(dm, "baton_worker_kv_blocks_held_total") - held0 ==
                 reqs[3].held);
        d3 = start_decode(control, "d3", dm2, true, NULL);
        cu_kill(d, SIGKILL);
        cu_collect(c, &again, 1, 30000);
        BT_ASSERT_EQ(again.finished, 1);
        BT_CHECK(again.retries > 0);
        same_ids(&again, &off[3], 3, "after the decode worker's kill -9");
        cu_kill(d3, SIGTERM);
        BT_ASSERT_EQ(cu_wait_exit(d3, 10000), 0);
    }
    cu_kill(p, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(p, 10000), 0);

    client_destroy(&c);
    BT_TEST_PASS("cluster/prefix_handoff: disaggregated hits on both sides "
                 "(decode holds, hand-off moves the rest; prefill computes "
                 "the suffix), on = off token for token over UCX and "
                 "inline, salts apart, kill -9 of the prefill mid-hand-off "
                 "recovers with no leak, decode failover exact");
    return 0;
}
