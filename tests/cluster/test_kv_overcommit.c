/*
 * test_kv_overcommit.c - --kv-overcommit in a real cluster (router + an
 * aggregated --role both decode worker, aidreams260K, cpu).
 *
 * A worker of 64 blocks of 8 tokens; N_REQ requests of the golden
 * prompts with 122 new tokens each (16 blocks apiece, 8 x 16 = 128 at
 * the end: twice the pool), sent at once.  Without overcommit four run
 * at a time, each admitted with its whole growth promised.  With it
 * every request is admitted on its prompt's block and grows from the
 * pool, so the pool runs short mid-stream: the worker gives its newest
 * streams back to the router (TaskError.retry), which re-queues them;
 * their next attempt recomputes the prompt and the tokens streamed so
 * far and goes on.  Checked:
 *   - every request finishes equal to golden.jsonl (greedy): a stream
 *     given back and recomputed, perhaps several times, loses no token
 *     and repeats none;
 *   - the worker did give streams back (its stop line's kv_preempted);
 *   - it exits 0 with every KV block back (no "leak" in its log).
 */
#include "bt_error.h"
#include "cluster_util.h"

#define N_REQ 8

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

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    char listen[64], control[64], model[512], log[256];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0;
    long preempted;
    uint64_t t0;
    int n_golden;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(log, sizeof(log), "/tmp/bt_test_kv_overcommit_%d.log",
             (int)getpid());
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5", NULL);
    setenv("BT_LOG", "info", 1);
    d0 = cu_spawn_log(log, "baton-decode", "--router", control, "--model",
                      model, "--threads", "1", "--name", "over", "--role",
                      "both", "--block-size", "8", "--kv-blocks", "64",
                      "--kv-overcommit", NULL);
    unsetenv("BT_LOG");
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 0, 1, 20000);

    t0 = bt_time_ns();
    for (int i = 0; i < N_REQ; i++) {
        BT_CHECK(golden[i % n_golden].n_prompt + golden[i % n_golden].max_tokens
                 > 64);
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    }
    cu_collect(c, res, N_REQ, 120000);
    fprintf(stderr, "%d requests, twice the pool at their end, took %.0f "
            "ms\n", N_REQ, (double)(bt_time_ns() - t0) * 1e-6);
    for (int i = 0; i < N_REQ; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);

    client_destroy(&c);
    client_destroy(&ctl);
    cu_kill(d0, SIGTERM);
    BT_ASSERT_EQ(cu_wait_exit(d0, 10000), 0);
    preempted = stop_count(log, "kv_preempted:");
    fprintf(stderr, "the worker gave back %ld streams\n", preempted);
    if (preempted < 1)
        BT_TEST_FAIL("no stream was given back (kv_preempted %ld): the "
                     "pool never ran short, nothing was tested", preempted);
    if (cu_file_has(log, "leak"))
        BT_TEST_FAIL("the worker reports a leak (see %s)", log);
    remove(log);
    BT_TEST_PASS("cluster/kv_overcommit: streams past the pool given back, "
                 "recomputed and exact");
    return 0;
}
