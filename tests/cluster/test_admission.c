/*
 * test_admission.c - issue 36 in a real cluster (router + aggregated
 * --role both decode workers, aidreams260K, cpu):
 *   1. KV sized from memory: a worker given --kv-memory-gb gets
 *      budget / (2048 bytes a token x block size) blocks, says the
 *      capacity in tokens in its log, and the router's status reports
 *      that pool.
 *   2. Admission that never times out silently: a request whose prompt +
 *      max tokens needs more blocks than the worker's whole pool fails at
 *      once (ERROR_TOO_LONG, well before the 30 s queue timeout) and
 *      holds no reservation (free KV returns to total); requests that
 *      fit the pool but not all at once wait at the router and all
 *      finish equal to golden.jsonl; so do requests that fit only one at
 *      a time (a worker of 4 blocks of 8; prompts of 25-32 tokens, the
 *      golden prompt and the first 20 golden ids, so the router sees no
 *      free block for the next and sends none), the last ones after
 *      waiting longer than the router's --queue-timeout-ms (1500 here):
 *      the timeout counts from the last time capacity came free (a
 *      request ended), so a full cluster that keeps finishing requests
 *      serves its queue in turn instead of failing it (the worker
 *      slowed, --step-delay-ms 150: one request takes ~1 s, the fourth
 *      waits ~3 s).
 *   3. A cold start loses nothing: 64 requests at once against a freshly
 *      started aggregated worker (default, memory-sized pool; warm-up on;
 *      slowed with --step-delay-ms 10 and a 32-token step budget with
 *      4-token prompt chunks, so prompts queue behind the decode tokens
 *      for longer than --kv-timeout-ms 1500) all finish equal to
 *      golden.jsonl.
 */
#include "bt_error.h"
#include "cluster_util.h"

#define N_WAIT 6
#define N_BURST 64
#define SHORT_MAX 16 /* max tokens of the requests that fit */
#define N_SERIAL 4
#define SERIAL_FED 20 /* golden ids appended to a 2c prompt */
#define SERIAL_MAX 32 /* 4 blocks of 8: one request at a time */

/* Submits golden line g greedily with at most max_tokens tokens. */
static uint64_t submit_max(client_t *c, const cu_golden_t *g, int max_tokens)
{
    cu_golden_t s = *g;

    s.max_tokens = max_tokens;
    return cu_submit_golden(c, &s);
}

/* Golden line g with its first `fed` expected ids moved into the prompt
 * (greedy decoding goes on from there with the rest) and max_tokens so
 * that prompt + output is `total` tokens. */
static cu_golden_t golden_fed(const cu_golden_t *g, int fed, int total)
{
    cu_golden_t s = *g;

    BT_CHECK(g->n_prompt + fed < total && total <= g->n_prompt + g->n_expect);
    memcpy(s.prompt + s.n_prompt, g->expect, sizeof(int) * (size_t)fed);
    s.n_prompt += fed;
    memmove(s.expect, g->expect + fed, sizeof(int) * (size_t)(g->n_expect -
                                                              fed));
    s.n_expect -= fed;
    s.max_tokens = total - s.n_prompt;
    return s;
}

/* The first n ids of r equal golden line g's. */
static void check_prefix(const cu_result_t *r, const cu_golden_t *g, int n,
                         int which)
{
    if (r->finished != 1)
        BT_TEST_FAIL("request %d did not finish (state %d, error %d)",
                     which, r->finished, r->error_code);
    BT_ASSERT_EQ(r->n_ids, n);
    for (int k = 0; k < n; k++)
        if (r->ids[k] != g->expect[k])
            BT_TEST_FAIL("request %d: id %d is %d, golden %d", which, k,
                         r->ids[k], g->expect[k]);
}

/* True when the file at `path` holds `needle` (waits up to 10 s). */
static bool log_has(const char *path, const char *needle)
{
    for (int t = 0; t < 200; t++) {
        if (cu_file_has(path, needle))
            return true;
        usleep(50000);
    }
    return false;
}

int main(void)
{
    static cu_golden_t golden[32], fed[N_SERIAL];
    static cu_result_t res[N_BURST];
    char listen[64], control[64], model[512], log[256], line[128];
    client_t *c = NULL, *ctl = NULL;
    cu_status_t st;
    pid_t d0, d1;
    uint64_t t0;
    int n_golden, blocks;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(log, sizeof(log), "/tmp/bt_test_admission_%d.log",
             (int)getpid());
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--queue-timeout-ms", "1500", NULL);

    /* 1. 0.0001 GiB = 107374 bytes / (2048 B x 8 tokens) = 6 blocks. */
    setenv("BT_LOG", "info", 1);
    d0 = cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                      model, "--threads", "1", "--name", "small", "--role",
                      "both", "--block-size", "8", "--kv-memory-gb",
                      "0.0001", NULL);
    unsetenv("BT_LOG");
    blocks = 107374 / (2048 * 8);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 0, 1, 20000);
    BT_ASSERT_OK(cu_status(ctl, &st));
    BT_ASSERT_EQ(st.total_kv, blocks);
    snprintf(line, sizeof(line), "KV capacity: %d blocks of 8 tokens = %d "
             "tokens (sized from memory)", blocks, blocks * 8);
    if (!log_has(log, line))
        BT_TEST_FAIL("the worker's log lacks \"%s\"", line);

    /* 2a. Never fits: 6 + 122 tokens need 16 blocks of the 6 there are. */
    t0 = bt_time_ns();
    res[0].rid = cu_submit_golden(c, &golden[0]);
    cu_collect(c, res, 1, 10000);
    BT_ASSERT_EQ(res[0].finished, 2);
    BT_ASSERT_EQ(res[0].error_code, BATON__ERROR_CODE__ERROR_TOO_LONG);
    fprintf(stderr, "never-fits answered in %.0f ms\n",
            (double)(bt_time_ns() - t0) * 1e-6);
    BT_CHECK(bt_time_ns() - t0 < 3000000000ull); /* queue timeout: 30 s */
    cu_wait_kv_idle(ctl, 5000);

    /* 2b. Fits, but two at a time (3 blocks each): the rest wait at the
     * router and finish, exact. */
    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_WAIT; i++)
        res[i].rid = submit_max(c, &golden[i % n_golden],
                                SHORT_MAX - golden[i % n_golden].n_prompt);
    cu_collect(c, res, N_WAIT, 60000);
    for (int i = 0; i < N_WAIT; i++)
        check_prefix(&res[i], &golden[i % n_golden],
                     SHORT_MAX - golden[i % n_golden].n_prompt, i);
    cu_wait_kv_idle(ctl, 5000);

    /* 2c. One at a time, the queue outliving the queue timeout. */
    cu_kill(d0, SIGKILL);
    cu_wait_workers(ctl, 0, 0, 20000);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "four", "--role", "both",
                  "--block-size", "8", "--kv-blocks", "4",
                  "--step-delay-ms", "150", NULL);
    cu_wait_workers(ctl, 0, 1, 20000);
    memset(res, 0, sizeof(res));
    t0 = bt_time_ns();
    for (int i = 0; i < N_SERIAL; i++) {
        fed[i] = golden_fed(&golden[i % n_golden], SERIAL_FED, SERIAL_MAX);
        res[i].rid = cu_submit_golden(c, &fed[i]);
    }
    cu_collect(c, res, N_SERIAL, 60000);
    fprintf(stderr, "%d one-at-a-time requests took %.0f ms (queue timeout "
            "1500 ms)\n", N_SERIAL, (double)(bt_time_ns() - t0) * 1e-6);
    for (int i = 0; i < N_SERIAL; i++)
        check_prefix(&res[i], &fed[i], fed[i].max_tokens, i);
    /* else the last one never waited past the timeout */
    BT_CHECK(bt_time_ns() - t0 > 2500000000ull);
    cu_wait_kv_idle(ctl, 5000);

    /* 3. A fresh aggregated worker, memory-sized pool, warmed, slowed; a
     * burst the moment it registers. */
    cu_kill(d0, SIGKILL);
    cu_wait_workers(ctl, 0, 0, 20000);
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "cold", "--role", "both",
                  "--warmup", "on", "--step-delay-ms", "10",
                  "--step-tokens", "32", "--chunk-tokens", "4",
                  "--kv-timeout-ms", "1500", NULL);
    cu_wait_workers(ctl, 0, 1, 20000);
    memset(res, 0, sizeof(res));
    t0 = bt_time_ns();
    for (int i = 0; i < N_BURST; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_BURST, 120000);
    /* longer than --kv-timeout-ms: reservations queued behind the local
     * prefills outlived it */
    fprintf(stderr, "cold burst of %d took %.0f ms\n", N_BURST,
            (double)(bt_time_ns() - t0) * 1e-6);
    for (int i = 0; i < N_BURST; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);
    cu_wait_kv_idle(ctl, 5000);

    client_destroy(&c);
    client_destroy(&ctl);
    remove(log);
    (void)d1;
    BT_TEST_PASS("cluster/admission: memory-sized KV, never-fits fails at "
                 "once, waiting requests and a cold burst exact");
    return 0;
}
