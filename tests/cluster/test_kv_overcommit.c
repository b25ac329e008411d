/*
 * test_kv_overcommit.c - --kv-overcommit and --kv-unbounded-promise in a
 * real cluster (router + decode worker, aidreams260K, cpu).
 *
 * A worker of 64 blocks of 8 tokens; N_REQ requests of the golden
 * prompts with 122 new tokens each (16 blocks apiece, 8 x 16 = 128 at
 * the end: twice the pool), sent at once.  Without overcommit four run
 * at a time, each admitted with its whole growth promised.  With it
 * every request is admitted on its prompt's block and grows from the
 * pool, so the pool runs short mid-stream: the worker gives its newest
 * streams back to the router (TaskError.retry), which re-queues them;
 * their next attempt recomputes the prompt and the tokens streamed so
 * far and goes on.  Checked, with the worker prefilling itself
 * (--role both), again with a prefill worker beside it (the
 * recomputation of prompt + streamed tokens is then a hand-off), with
 * seeded sampling, drafting with an EAGLE head (trained here in
 * seconds; a drafting stream's blocks are its engine sequence's), and
 * with a host tier (--kv-host-gb: the given-back blocks the pool
 * reclaims go there, and the next attempt loads them back, a swap
 * instead of a recomputation: its prefix hits must show it):
 *   - every request finishes equal to golden.jsonl (greedy), or to
 *     `baton run --seed` (sampled: each attempt continues the request's
 *     random stream): a stream given back and recomputed, perhaps
 *     several times, loses no token and repeats none;
 *   - the worker did give streams back (its stop line's kv_preempted);
 *   - it exits 0 with every KV block back (no "leak" in its log).
 * Then without --kv-overcommit: with --kv-unbounded-promise 16, four
 * requests without max_tokens (a chat client's default: until the
 * context), each admitted on its prompt and 16 tokens of growth, then
 * four whose max_tokens ends at the context, each promised all of it:
 * the pool runs short as the first four grow past their promise, and
 * only they are given back (Finished.timings.preemptions), though the
 * other four arrived later; with `--kv-unbounded-promise all` eight
 * requests without max_tokens are each promised the whole context, four
 * run at a time and none is given back.  Last, a pool smaller than the
 * context (8 blocks of 8): a request without max_tokens is admitted on
 * its promise and, outgrowing the whole pool alone, fails with
 * ERROR_TOO_LONG after streaming golden's ids (no give-back loop); with
 * `all` the router fails it at once (it could never be admitted).
 */
#include "bt_error.h"
#include "bt_prom_test.h"
#include "spec_cluster_util.h"

#define N_REQ 8
#define CONTEXT 128 /* aidreams260K's */
#define SAMPLED_MAX 122 /* 128 tokens at most: 16 blocks of 8 */

static int g_rport; /* the router's metrics port */

/* The reservations decode workers refused so far (router metric). */
static double kv_refusals(void)
{
    return prom_scrape(g_rport, "baton_router_kv_refusals_total");
}

/* The count after `key` on the worker's stop line, or -1. */
static long stop_count(const char *path, const char *key)
{
    char *text = NULL, *at;
    size_t len;
    long n = -1;

    if (bt_read_file(path, 1 << 24, &text, &len) != BT_OK)
        return -1;
    at = strstr(text, key);
    if (at != NULL)
        n = strtol(at + strlen(key), NULL, 10);
    bt_free(text);
    return n;
}

/* What a round's requests ask for. */
enum { ASK_GOLDEN, ASK_UNBOUNDED, ASK_HALF };

/* How a round's worker admits and what its requests ask. */
typedef struct {
    const char *admit;     /* "--kv-overcommit", or "--kv-unbounded-promise"
                              with promise as its value */
    const char *promise;
    int ask;               /* ASK_GOLDEN: golden.jsonl's max_tokens (one
                              past the context); ASK_UNBOUNDED: none;
                              ASK_HALF: none for the first half, to the
                              context's end for the rest (promised all) */
    bool preempts;         /* streams must be given back (else: none may) */
} admit_t;

static const admit_t OVERCOMMIT = { "--kv-overcommit", NULL, ASK_GOLDEN,
                                    true };

/* One round against a fresh decode worker (role both, or decode beside
 * the prefill worker already up): N_REQ golden requests at once, greedy
 * (want NULL) or sampled with seed 1000 + i (want[i], n_want[i]: the
 * reference), exact, the worker admitting as `ad` says and given option
 * opt (with its value val) unless NULL; then the worker stopped: streams
 * given back (or none, as ad says), no leak. */
static void round_of(const char *listen, const char *control,
                     const char *model, const char *role, const admit_t *ad,
                     const char *opt, const char *val,
                     const cu_golden_t *golden, int n_golden,
                     int (*want)[CU_MAX_IDS], const int *n_want)
{
    static cu_result_t res[N_REQ];
    client_t *c = NULL;
    char log[256];
    long preempted;
    uint64_t t0;
    double refused;
    /* admitting on promises: 70 blocks, so that beside four promises of
     * 16 six stay free, room for any prompt but never for a promise */
    const bool promises = strcmp(ad->admit, "--kv-overcommit") != 0;
    pid_t d0;

    snprintf(log, sizeof(log), "/tmp/bt_test_kv_overcommit_%d_%s.log",
             (int)getpid(), role);
    setenv("BT_LOG", "info", 1);
    d0 = cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                      model, "--threads", "1", "--name", role, "--role",
                      role, "--block-size", "8", "--kv-blocks",
                      promises ? "70" : "64", ad->admit, ad->promise != NULL ? ad->promise : opt,
                      ad->promise != NULL ? opt : val,
                      ad->promise != NULL ? val : NULL, NULL);
    unsetenv("BT_LOG");
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, strcmp(role, "both") != 0, 1, 20000);

    memset(res, 0, sizeof(res));
    refused = kv_refusals();
    BT_CHECK(refused >= 0);
    t0 = bt_time_ns();
    for (int i = 0; i < N_REQ; i++) {
        const cu_golden_t *g = &golden[i % n_golden];

        /* more than the pool's share of each, so it must run short */
        BT_CHECK((g->n_prompt + g->max_tokens + 7) / 8 > 64 / (N_REQ / 2));
        if (want == NULL) {
            client_request_t req;

            cu_golden_request(&req, g);
            if (ad->ask == ASK_UNBOUNDED ||
                (ad->ask == ASK_HALF && i < N_REQ / 2))
                req.max_tokens = 0; /* until the context */
            else if (ad->ask == ASK_HALF)
                req.max_tokens = CONTEXT - g->n_prompt;
            BT_ASSERT_OK(client_submit(c, &req, &res[i].rid));
        } else {
            client_request_t req;

            client_request_init(&req);
            req.prompt_ids = g->prompt;
            req.n_prompt_ids = g->n_prompt;
            req.temperature = 0.9f;
            req.top_p = 0.95f;
            req.seed = 1000 + (uint64_t)i;
            req.max_tokens = SAMPLED_MAX;
            req.want_text = false;
            BT_ASSERT_OK(client_submit(c, &req, &res[i].rid));
        }
    }
    cu_collect(c, res, N_REQ, 120000);
    refused = kv_refusals() - refused;
    fprintf(stderr, "%s: %d requests, twice the pool at their end, took "
            "%.0f ms; %.0f reservations refused\n", role, N_REQ,
            (double)(bt_time_ns() - t0) * 1e-6, refused);
    /* A worker admitting on promises says so at registration, and the
     * router holds a request until one has room for its promise: the
     * requests that wait, wait in the router's queue, not in a loop of
     * reservations refused every 20 ms while six free blocks fit their
     * prompts (dozens a round).  A heartbeat overtaken by a grant may
     * still let one through. */
    if (promises && refused > 2)
        BT_TEST_FAIL("%s: the worker refused %.0f reservations: the router "
                     "sent requests it had no room to promise", role,
                     refused);
    for (int i = 0; i < N_REQ; i++) {
        const cu_golden_t *g = &golden[i % n_golden];

        if (want == NULL && ad->ask == ASK_HALF && i >= N_REQ / 2) {
            /* golden's ids up to the context's end, never given back */
            const int n = BT_MIN(g->n_expect, CONTEXT - g->n_prompt);

            BT_ASSERT_EQ(res[i].finished, 1);
            if (res[i].n_ids != n ||
                memcmp(res[i].ids, g->expect, sizeof(int) * (size_t)n))
                BT_TEST_FAIL("%s: request %d: %d ids, not golden's first "
                             "%d", role, i, res[i].n_ids, n);
            if (res[i].preemptions != 0)
                BT_TEST_FAIL("%s: request %d, promised its whole growth, "
                             "was given back %d times", role, i,
                             res[i].preemptions);
            continue;
        }
        if (want == NULL) {
            cu_check_golden(&res[i], g, i);
            continue;
        }
        BT_ASSERT_EQ(res[i].finished, 1);
        if (res[i].n_ids != n_want[i] ||
            memcmp(res[i].ids, want[i], sizeof(int) * (size_t)n_want[i]))
            BT_TEST_FAIL("%s: request %d (seed %d): %d ids differ from "
                         "baton run's %d", role, i, 1000 + i, res[i].n_ids,
                         n_want[i]);
    }
    client_destroy(&c);

    cu_kill(d0, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(d0, 10000), 0);
    preempted = stop_count(log, "kv_preempted:");
    fprintf(stderr, "%s: the worker gave back %ld streams\n", role,
            preempted);
    if (ad->preempts && preempted < 1)
        BT_TEST_FAIL("%s: no stream was given back (kv_preempted %ld): the "
                     "pool never ran short, nothing was tested", role,
                     preempted);
    if (!ad->preempts && preempted != 0)
        BT_TEST_FAIL("%s: %ld streams given back, though every stream's "
                     "growth was promised", role, preempted);
    if (opt != NULL && strcmp(opt, "--kv-host-gb") == 0 &&
        stop_count(log, " hit_tokens:") < 1)
        BT_TEST_FAIL("%s: no given-back stream found its blocks again in "
                     "the host tier (hit_tokens %ld)", role,
                     stop_count(log, " hit_tokens:"));
    if (cu_file_has(log, "leak"))
        BT_TEST_FAIL("%s: the worker reports a leak (see %s)", role, log);
    remove(log);
}

/* One request without max_tokens against a fresh worker of 8 blocks of
 * 8 (64 tokens, half the context) promising `promise`: it fails with
 * ERROR_TOO_LONG, having streamed golden's first ids (promise "16": it
 * ran until it held the whole pool) or none ("all": never admitted). */
static void lone_round(const char *listen, const char *control,
                       const char *model, const char *promise,
                       const cu_golden_t *g)
{
    cu_result_t res[1];
    client_request_t req;
    client_t *c = NULL;
    char log[256];
    pid_t d0;

    snprintf(log, sizeof(log), "/tmp/bt_test_kv_overcommit_%d_lone.log",
             (int)getpid());
    setenv("BT_LOG", "info", 1);
    d0 = cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                      model, "--threads", "1", "--name", "lone", "--role",
                      "both", "--block-size", "8", "--kv-blocks", "8",
                      "--kv-unbounded-promise", promise, NULL);
    unsetenv("BT_LOG");
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, false, 1, 20000);
    memset(res, 0, sizeof(res));
    cu_golden_request(&req, g);
    req.max_tokens = 0; /* until the context, which the pool cannot hold */
    BT_ASSERT_OK(client_submit(c, &req, &res[0].rid));
    cu_collect(c, res, 1, 30000);
    BT_ASSERT_EQ(res[0].finished, 2);
    BT_ASSERT_EQ(res[0].error_code, BATON__ERROR_CODE__ERROR_TOO_LONG);
    if (strcmp(promise, "all") == 0) {
        BT_ASSERT_EQ(res[0].n_ids, 0);
    } else {
        /* every token the pool held but the last block's first */
        if (res[0].n_ids < 64 - 8 - g->n_prompt ||
            res[0].n_ids > 64 - g->n_prompt + 1 ||
            memcmp(res[0].ids, g->expect, sizeof(int) * (size_t)res[0].n_ids))
            BT_TEST_FAIL("lone %s: %d ids streamed, not golden's first "
                         "~%d", promise, res[0].n_ids, 64 - g->n_prompt);
    }
    fprintf(stderr, "lone, promise %s: ERROR_TOO_LONG after %d ids\n",
            promise, res[0].n_ids);
    client_destroy(&c);
    cu_kill(d0, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(d0, 10000), 0);
    if (stop_count(log, "kv_preempted:") != 0)
        BT_TEST_FAIL("lone %s: given back %ld times: giving back a request "
                     "that holds the whole pool cannot help", promise,
                     stop_count(log, "kv_preempted:"));
    if (cu_file_has(log, "leak"))
        BT_TEST_FAIL("lone %s: the worker reports a leak (see %s)", promise,
                     log);
    remove(log);
}

int main(void)
{
    static cu_golden_t golden[32];
    static int want[N_REQ][CU_MAX_IDS];
    int n_want[N_REQ];
    char listen[64], control[64], model[512], head[256], rport_s[16];
    int n_golden;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    for (int i = 0; i < N_REQ; i++)
        n_want[i] = cu_baton_run_sampled(&golden[i % n_golden],
                                         1000 + (uint64_t)i, SAMPLED_MAX,
                                         want[i]);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    g_rport = cu_free_port();
    snprintf(rport_s, sizeof(rport_s), "%d", g_rport);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--metrics-port", rport_s, NULL);
    snprintf(head, sizeof(head), "/tmp/bt_test_kv_overcommit_%d.head",
             (int)getpid());
    scu_train_head(model, head);
    round_of(listen, control, model, "both", &OVERCOMMIT, NULL, NULL,
             golden, n_golden, NULL, NULL);
    round_of(listen, control, model, "both", &OVERCOMMIT, NULL, NULL,
             golden, n_golden, want, n_want);
    round_of(listen, control, model, "both", &OVERCOMMIT, "--spec-head",
             head, golden, n_golden, NULL, NULL);
    round_of(listen, control, model, "both", &OVERCOMMIT, "--kv-host-gb",
             "0.05", golden, n_golden, NULL, NULL);
    {
        static const admit_t bounded = { "--kv-unbounded-promise", "16",
                                         ASK_HALF, true };
        static const admit_t whole = { "--kv-unbounded-promise", "all",
                                       ASK_UNBOUNDED, false };

        round_of(listen, control, model, "both", &bounded, NULL, NULL,
                 golden, n_golden, NULL, NULL);
        round_of(listen, control, model, "both", &whole, NULL, NULL,
                 golden, n_golden, NULL, NULL);
    }
    lone_round(listen, control, model, "16", &golden[0]);
    lone_round(listen, control, model, "all", &golden[0]);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--threads", "1", "--name", "p0", "--block-size", "8", NULL);
    round_of(listen, control, model, "decode", &OVERCOMMIT, NULL, NULL,
             golden, n_golden, NULL, NULL);
    remove(head);
    BT_TEST_PASS("cluster/kv_overcommit: streams past the pool given back, "
                 "recomputed (aggregated and by a prefill worker) or "
                 "loaded back from the host tier; greedy, seeded sampling "
                 "and drafting exact; requests without max_tokens promised "
                 "16 tokens given back past it, those promised their "
                 "whole growth never; one outgrowing the pool alone fails "
                 "with ERROR_TOO_LONG, at once when never admissible");
    return 0;
}
