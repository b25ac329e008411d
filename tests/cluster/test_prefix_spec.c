/*
 * test_prefix_spec.c - the prefix cache under speculative decoding (issue
 * 38): an aggregated worker (baton-decode --role both, aidreams260K,
 * block size 4) with an EAGLE head, whose engine sequences own their
 * block tables, serves golden prompts twice and a set of requests
 * sharing a 40-token prefix, first with --prefix-cache off, then on, then
 * disaggregated (baton-prefill + the worker as --role decode: the decode
 * worker holds the cached prefix at the grant): the outputs are
 * identical token for token (and golden's for the golden prompts), and
 * the cache hit.
 */
#include "cluster/spec_cluster_util.h"

#define N_REQ 8
#define MAX_TOKENS 24

typedef struct {
    int prompt[CU_MAX_IDS];
    int n_prompt;
    int max_tokens;
    const cu_golden_t *golden;
} ps_req_t;

static void submit_one(client_t *c, const ps_req_t *q, cu_result_t *res)
{
    client_request_t req;

    cu_ids_request(&req, q->prompt, q->n_prompt, q->max_tokens);
    cu_run_request(c, &req, res);
}

static pid_t start_worker(const char *control, const char *model,
                          const char *head, const char *log, bool cache,
                          const char *role)
{
    return scu_spawn_logged(log, "baton-decode", "--router", control,
                            "--model", model, "--threads", "1", "--name",
                            "ps", "--role", role, "--block-size", "4",
                            "--kv-blocks", "400", "--chunk-tokens", "16",
                            "--spec-head", head, "--spec", "fixed",
                            "--spec-tokens", "8", "--spec-depth", "4",
                            "--prefix-cache", cache ? "on" : "off", NULL);
}

int main(void)
{
    static cu_golden_t golden[8];
    static ps_req_t reqs[N_REQ];
    static cu_result_t off[N_REQ], on[N_REQ];
    char listen[64], control[64], model[512], head[128], log[128];
    client_t *c = NULL;
    pid_t w;
    int n_golden, hits = 0;

    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 8);
    BT_CHECK(n_golden >= 5);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(head, sizeof(head), "/tmp/bt_prefix_spec_%d.safetensors",
             (int)getpid());
    snprintf(log, sizeof(log), "/tmp/bt_prefix_spec_%d.log", (int)getpid());
    scu_train_head(model, head);

    /* golden prompts, each twice; then S + five tails (S: a golden prompt
     * and 40 - its length of its greedy continuation) */
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            ps_req_t *q = &reqs[2 * i + k];
            memcpy(q->prompt, golden[i].prompt,
                   sizeof(int) * (size_t)golden[i].n_prompt);
            q->n_prompt = golden[i].n_prompt;
            q->max_tokens = golden[i].max_tokens;
            q->golden = &golden[i];
        }
    }
    for (int i = 4; i < N_REQ; i++) {
        ps_req_t *q = &reqs[i];
        memcpy(q->prompt, golden[2].prompt,
               sizeof(int) * (size_t)golden[2].n_prompt);
        memcpy(q->prompt + golden[2].n_prompt, golden[2].expect,
               sizeof(int) * (size_t)(40 - golden[2].n_prompt));
        memcpy(q->prompt + 40, golden[3 + i % 2].expect + i,
               sizeof(int) * 7);
        q->n_prompt = 47;
        q->max_tokens = MAX_TOKENS;
    }

    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    /* pass 0: cache off; 1: on; 2: disaggregated (a baton-prefill with
     * its own cache ships the hidden state; the decode worker holds the
     * cached prefix at each grant, its engine sequence adopts it) */
    for (int pass = 0; pass < 3; pass++) {
        cu_result_t *res = pass == 0 ? off : on;
        pid_t pf = -1;

        unlink(log);
        w = start_worker(control, model, head, log, pass >= 1,
                         pass == 2 ? "decode" : "both");
        if (pass == 2)
            pf = cu_spawn("baton-prefill", "--router", control, "--model",
                          model, "--threads", "1", "--name", "psp",
                          "--block-size", "4", "--kv-blocks", "200",
                          "--chunk-tokens", "16", "--spec-features", NULL);
        cu_wait_workers(c, pass == 2 ? 1 : 0, 1, 30000);
        for (int i = 0; i < N_REQ; i++) {
            submit_one(c, &reqs[i], &res[i]);
            if (reqs[i].golden != NULL)
                cu_check_golden(&res[i], reqs[i].golden, i);
        }
        cu_wait_kv_idle(c, 5000);
        cu_kill(w, SIGTERM);
        BT_ASSERT_EQ(cu_wait_exit(w, 10000), 0);
        if (pf > 0) {
            cu_kill(pf, SIGTERM);
            BT_ASSERT_EQ(cu_wait_exit(pf, 10000), 0);
        }
        BT_CHECK(cu_count_lines(log, "leak") == 0);
        if (pass >= 1) { /* the cache was on, and hit */
            char *text = NULL;
            const char *p;
            size_t len;

            BT_ASSERT_OK(bt_read_file(log, 1 << 24, &text, &len));
            p = strstr(text, "prefix cache: lookups:");
            BT_CHECK(p != NULL && (p = strstr(p, "hit_tokens:")) != NULL);
            hits = atoi(p + strlen("hit_tokens:"));
            fprintf(stderr, "speculation with the cache%s: %d prompt "
                    "tokens hit\n", pass == 2 ? " (disaggregated, held at "
                    "the grant)" : "", hits);
            /* 2 golden repeats (1 block each) + 4 shared 40-token
             * prefixes after the first */
            BT_CHECK(hits >= 2 * 4 + 3 * 40);
            bt_free(text);
        } else {
            BT_CHECK(cu_count_lines(log, "prefix cache: lookups:") == 0);
        }
        for (int t = 0; t < 100; t++) {
            cu_status_t st;
            if (cu_status(c, &st) == 0 && st.n_decode == 0 &&
                st.n_prefill == 0)
                break;
            usleep(50000);
        }
        for (int i = 0; pass >= 1 && i < N_REQ; i++) {
            if (off[i].n_ids != on[i].n_ids)
                BT_TEST_FAIL("pass %d, request %d: %d ids, %d without the "
                             "cache", pass, i, on[i].n_ids, off[i].n_ids);
            for (int k = 0; k < off[i].n_ids; k++)
                if (on[i].ids[k] != off[i].ids[k])
                    BT_TEST_FAIL("pass %d, request %d: id %d is %d, %d "
                                 "without the cache", pass, i, k,
                                 on[i].ids[k], off[i].ids[k]);
        }
    }
    for (int i = 0; i < N_REQ; i++) {
        if (off[i].n_ids != on[i].n_ids)
            BT_TEST_FAIL("request %d: %d ids with the cache, %d without", i,
                         on[i].n_ids, off[i].n_ids);
        for (int k = 0; k < off[i].n_ids; k++)
            if (on[i].ids[k] != off[i].ids[k])
                BT_TEST_FAIL("request %d: id %d is %d with the cache, %d "
                             "without", i, k, on[i].ids[k], off[i].ids[k]);
    }
    unlink(head);
    unlink(log);
    client_destroy(&c);
    BT_TEST_PASS("cluster/prefix_spec: speculative decoding with the prefix "
                 "cache on = off (aggregated and disaggregated), golden "
                 "exact");
    return 0;
}
