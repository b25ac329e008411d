/*
 * test_spec_cluster.c - speculative decoding in the cluster: 1 prefill +
 * 1 decode worker with --spec-head (a head trained here in seconds).
 *   1. Every aidreams260K golden prompt, twice, concurrently: the greedy
 *      ids equal golden.jsonl (batches of trees, requests joining and
 *      leaving every step, several ids per TokenOut).
 *   2. Stops inside an accepted run: max_tokens cut short and a stop id
 *      taken from the golden stream end exactly where plain decoding
 *      would (nothing after the stop is streamed).
 *   3. The speculation-aware hand-off: with the prefill worker shipping
 *      the prompt's last hidden state (--spec-features), every request's
 *      first decode step drafts (the decode worker logs it); a prefill
 *      worker without it gives plain first steps, and exact output too.
 */
#include "spec_cluster_util.h"

#define N_GOLD 16

static void run_golden(client_t *c, const cu_golden_t *golden, int n_golden,
                       int copies)
{
    static cu_result_t res[2 * N_GOLD];
    int n = n_golden * copies;

    memset(res, 0, sizeof(res));
    for (int i = 0; i < n; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, n, 50000);
    for (int i = 0; i < n; i++)
        cu_check_golden(&res[i], &golden[i % n_golden], i);
}

/* Golden line g cut by max_tokens = cut, or by stop id golden[cut]. */
static void run_cut(client_t *c, const cu_golden_t *g, int cut, bool by_stop)
{
    client_request_t req;
    cu_result_t res;
    int stops[2] = { 1, g->expect[cut] }, want = cut;

    /* a stop id ends the stream at its first occurrence */
    for (int k = 0; by_stop && k < cut; k++)
        if (g->expect[k] == stops[1])
            want = k;
    memset(&res, 0, sizeof(res));
    client_request_init(&req);
    req.prompt_ids = g->prompt;
    req.n_prompt_ids = g->n_prompt;
    req.max_tokens = by_stop ? g->max_tokens : cut;
    req.ignore_eos = true;
    req.stop_ids = stops;
    req.n_stop_ids = by_stop ? 2 : 1;
    BT_ASSERT_OK(client_submit(c, &req, &res.rid));
    cu_collect(c, &res, 1, 20000);
    BT_ASSERT_EQ(res.finished, 1);
    BT_ASSERT_EQ(res.n_ids, want);
    for (int k = 0; k < want; k++)
        BT_ASSERT_EQ(res.ids[k], g->expect[k]);
    BT_ASSERT_EQ(res.finish_reason,
                 by_stop ? BATON__FINISH_REASON__FINISH_STOP
                         : BATON__FINISH_REASON__FINISH_LENGTH);
}

int main(void)
{
    static cu_golden_t golden[N_GOLD];
    char listen[64], control[64], model[512], head[128], log[128];
    client_t *c = NULL;
    pid_t p0, p1;
    int n_golden, drafted, plain;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, N_GOLD);
    BT_CHECK(n_golden > 0);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(head, sizeof(head), "/tmp/bt_spec_cluster_%d.safetensors",
             (int)getpid());
    snprintf(log, sizeof(log), "/tmp/bt_spec_cluster_%d.log", (int)getpid());
    unlink(log);
    scu_train_head(model, head);

    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    p0 = cu_spawn("baton-prefill", "--router", control, "--model", model,
                  "--threads", "1", "--name", "p0", "--spec-features", NULL);
    scu_spawn_logged(log, "baton-decode", "--router", control, "--model",
                     model, "--threads", "1", "--name", "d0", "--spec-head",
                     head, "--spec", "fixed", "--spec-tokens", "8",
                     "--spec-depth", "4", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);

    /* 1 + 3: golden, concurrently; every first step drafted */
    run_golden(c, golden, n_golden, 2);
    drafted = cu_count_lines(log, "first decode step: drafted ") -
              cu_count_lines(log, "first decode step: drafted 0 ");
    plain = cu_count_lines(log, "first decode step: drafted 0 ");
    fprintf(stderr, "with features: %d first steps drafted, %d plain\n",
            drafted, plain);
    BT_ASSERT_EQ(plain, 0);
    BT_ASSERT_EQ(drafted, 2 * n_golden);

    /* 2: stops inside accepted runs */
    for (int i = 0; i < n_golden && i < 4; i++) {
        const cu_golden_t *g = &golden[i];
        if (g->n_expect < 12)
            continue;
        run_cut(c, g, 5 + i, false);
        run_cut(c, g, 7 + i, true);
    }

    /* 3, control: a prefill worker that ships no features */
    cu_kill(p0, SIGKILL);
    p1 = cu_spawn("baton-prefill", "--router", control, "--model", model,
                  "--threads", "1", "--name", "p1", NULL);
    cu_wait_workers(c, 1, 1, 20000);
    run_golden(c, golden, n_golden, 1);
    plain = cu_count_lines(log, "first decode step: drafted 0 ");
    fprintf(stderr, "without features: %d first steps plain\n", plain);
    BT_ASSERT_EQ(plain, n_golden);
    cu_wait_kv_idle(c, 5000);

    client_destroy(&c);
    (void)p1;
    unlink(head);
    unlink(log);
    BT_TEST_PASS("cluster/spec: golden with --spec-head, stops, hand-off "
                 "drafts from the first step");
    return 0;
}
