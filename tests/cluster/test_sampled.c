/*
 * test_sampled.c - seeded sampling is the same in the cluster as in
 * `baton run`: the first token is sampled by the prefill worker, the rest
 * by a decode worker, and after kill -9 of that decode worker mid-stream
 * by another one after a re-prefill.  Each continues the request's random
 * stream (sampler_skip), so every request's ids equal
 * `baton run --temperature T --top-p P --seed S` exactly.
 */
#include "cluster_util.h"

#define N_REQ 8

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    static int want[N_REQ][CU_MAX_IDS];
    int n_want[N_REQ];
    char listen[64], control[64], model[512];
    client_t *c = NULL, *ctl = NULL;
    pid_t d0;
    int n_golden, retried = 0;
    const int max_tokens = 80;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    for (int i = 0; i < N_REQ; i++)
        n_want[i] = cu_baton_run_sampled(&golden[i % n_golden],
                                         1000 + (uint64_t)i, max_tokens,
                                         want[i]);
    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d0", "--step-delay-ms", "8",
                  NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 1, 1, 20000);

    for (int i = 0; i < N_REQ; i++) {
        client_request_t req;
        client_request_init(&req);
        req.prompt_ids = golden[i % n_golden].prompt;
        req.n_prompt_ids = golden[i % n_golden].n_prompt;
        req.temperature = 0.9f;
        req.top_p = 0.95f;
        req.seed = 1000 + (uint64_t)i;
        req.max_tokens = max_tokens;
        req.want_text = false;
        BT_ASSERT_OK(client_submit(c, &req, &res[i].rid));
    }
    /* Once every stream has some tokens, add d1 and kill d0 mid-stream. */
    cu_stream_until(c, res, N_REQ, 5, N_REQ,
                    "no tokens from the decode worker");
    kill(d0, SIGSTOP); /* d0 must not finish a stream while d1 starts */
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--threads", "1", "--name", "d1", NULL);
    cu_kill(d0, SIGKILL);
    cu_wait_workers(ctl, 1, 1, 20000);
    cu_collect(c, res, N_REQ, 50000);
    for (int i = 0; i < N_REQ; i++) {
        BT_ASSERT_EQ(res[i].finished, 1);
        retried += res[i].retries > 0;
        if (res[i].n_ids != n_want[i] ||
            memcmp(res[i].ids, want[i], sizeof(int) * (size_t)n_want[i]))
            BT_TEST_FAIL("request %d (seed %d): %d ids differ from baton "
                         "run's %d", i, 1000 + i, res[i].n_ids, n_want[i]);
    }
    BT_CHECK(retried > 0); /* the kill landed mid-stream */
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/sampled: seeded streams equal baton run, "
                 "across a decode failover");
    return 0;
}
