/*
 * test_prefix_text.c - text prompts' first-try prefix hits (issue 38): a
 * real router with --policy kv-aware and --tokenizer, one baton-prefill
 * and two baton-decode workers (aidreams260K with its tokenizer, block
 * size 4), all of one tokenizer identity.  Text prompts share a long
 * prefix; the same prompts as ids (under another salt, so they start
 * cold too) are the yardstick.
 *   1. Routing: once the first text prompt's blocks reached the router's
 *      index, every later one goes to the decode worker holding them (the
 *      other stays idle), as id prompts do.
 *   2. Decode-side hits on the first try: for each later text prompt the
 *      decode worker holds its cached leading blocks at the grant and the
 *      hand-off moves only the rest (prefill's ..._kv_blocks_sent_total
 *      grows by the missing blocks, decode's ..._held_total by the held
 *      ones), exactly as many as for the same prompt sent as ids.
 *   3. Output equals `baton run` of the text prompt (no cache) token for
 *      token, and equals the id prompt's.
 *   4. A router whose tokenizer is another one sends the workers the
 *      text: the output is still baton run's.
 * Without the router's --tokenizer a text prompt is routed least-loaded
 * and its KvReserve carries no ids: nothing is held, and 1 and 2 fail.
 */
#include "cluster/cluster_util.h"
#include "bt_prom_test.h"
#include "model/tokenizer.h"

#define N_REQ 6
#define MAX_TOKENS 8

static const char *const k_prefix =
    "The river of light runs through the sleeping machine, and every "
    "star it remembers";
static const char *const k_suffix[N_REQ] = {
    " is a dream.", " sings.", " falls into the sea of code.",
    " opens a door.", " is warm and quiet.", " will wake up soon.",
};

typedef struct {
    double sent, received, held;
} pt_counts_t;

/* Prompt tokens found cached, all three workers together, once two
 * scrapes 100 ms apart agree (a worker publishes its counters once a
 * turn: the last request's may be on the way). */
static double hit_tokens(int pm, const int dm[2])
{
    const char *name = "baton_worker_prefix_hit_tokens_total";
    double last = -1;

    for (int t = 0; t < 30; t++) {
        double v = prom_scrape(pm, name) + prom_scrape(dm[0], name) +
                   prom_scrape(dm[1], name);
        if (v == last)
            return v;
        last = v;
        usleep(100000);
    }
    BT_TEST_FAIL("baton_worker_prefix_hit_tokens_total never settled");
    return -1;
}

static void counts(int pm, int dm0, int dm1, pt_counts_t *c)
{
    c->sent = prom_scrape(pm, "baton_worker_kv_blocks_sent_total");
    c->received = prom_scrape(dm0, "baton_worker_kv_blocks_received_total") +
                  prom_scrape(dm1, "baton_worker_kv_blocks_received_total");
    c->held = prom_scrape(dm0, "baton_worker_kv_blocks_held_total") +
              prom_scrape(dm1, "baton_worker_kv_blocks_held_total");
}

/* `baton run` of text prompt `text`: the single-process reference. */
static int baton_run_text(const char *model, const char *tok,
                          const char *text, int *out, int cap)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd), "%s/baton run --model %s --tokenizer %s "
             "--threads 1 --device cpu --ids --ignore-eos --stop-id 1 "
             "--max-tokens %d --prompt '%s'", BT_BIN_DIR, model, tok,
             MAX_TOKENS, text);
    return cu_popen_ids(cmd, out, cap);
}

/* One request (text, or ids when ids != NULL) under `salt`; its output
 * into res and the hand-off's counters' deltas into delta.  Returns the
 * index (0 or 1) of the decode worker that served it. */
static int run_one(client_t *c, const char *text, const int *ids, int n_ids,
                   const char *salt, const char names[2][16], int pm,
                   const int dm[2], cu_result_t *res, pt_counts_t *delta)
{
    client_request_t req;
    pt_counts_t a, b;
    uint64_t s0[2], s1[2];
    int home = -1;

    if (ids != NULL)
        cu_ids_request(&req, ids, n_ids, MAX_TOKENS);
    else
        cu_text_request(&req, text, MAX_TOKENS);
    req.cache_salt = salt;
    for (int i = 0; i < 2; i++)
        s0[i] = cu_served(c, names[i]);
    counts(pm, dm[0], dm[1], &a);
    cu_run_request(c, &req, res);
    prom_wait(pm, "baton_worker_kv_blocks_sent_total", a.sent + 1, 1e9, 5000);
    counts(pm, dm[0], dm[1], &b);
    for (int i = 0; i < 2; i++) {
        s1[i] = cu_served(c, names[i]);
        if (s1[i] > s0[i]) {
            BT_CHECK(home < 0);
            home = i;
        }
    }
    BT_CHECK(home >= 0);
    delta->sent = b.sent - a.sent;
    delta->received = b.received - a.received;
    delta->held = b.held - a.held;
    return home;
}

/* Waits until the router's index holds at least `blocks` of decode
 * worker `name`'s blocks (its KvEvents arrived). */
static void wait_index(int rport, const char *name, int blocks)
{
    char sample[256];

    snprintf(sample, sizeof(sample), "baton_router_worker_kv_index_blocks"
             "{worker=\"%s\",role=\"decode\"}", name);
    for (int t = 0; t < 250; t++) {
        if (prom_scrape(rport, sample) >= blocks)
            return;
        usleep(20000);
    }
    BT_TEST_FAIL("the router's index never held %d blocks of %s", blocks,
                 name);
}

/* 4. A router whose --tokenizer is another (llama2's 32000 pieces, ids
 * past this model's vocabulary): its ids only route, the workers get
 * the text and their own ids are kept, the output is baton run's. */
static void other_tokenizer(const char *model, const char *tokf,
                            const char *text)
{
    char listen[64], control[64], other[512];
    client_request_t req;
    cu_result_t res;
    client_t *c = NULL;
    int ref[CU_MAX_IDS], n_ref;

    snprintf(other, sizeof(other), "%s/models/llama2-tokenizer.bin",
             BT_SHARED_DIR);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5", "--policy",
             "kv-aware", "--tokenizer", other, NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tokf, "--threads", "1", "--name", "otp",
             "--block-size", "4", "--kv-blocks", "200", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tokf, "--threads", "1", "--name", "otd",
             "--block-size", "4", "--kv-blocks", "400", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 30000);
    n_ref = baton_run_text(model, tokf, text, ref, CU_MAX_IDS);
    for (int i = 0; i < 2; i++) { /* the second one is a prefix hit */
        cu_text_request(&req, text, MAX_TOKENS);
        cu_run_request(c, &req, &res);
        BT_ASSERT_EQ(res.n_ids, n_ref);
        for (int k = 0; k < n_ref; k++)
            BT_ASSERT_EQ(res.ids[k], ref[k]);
    }
    client_destroy(&c);
}

int main(void)
{
    char listen[64], control[64], model[512], tokf[512];
    char rport_s[16], pm_s[16], dm_s[2][16];
    char names[2][16] = { "ptd0", "ptd1" };
    char text[N_REQ][256];
    int ids[N_REQ][CU_MAX_IDS], n_ids[N_REQ];
    int rport, pm, dm[2], home = -1, n_prefix_blocks;
    double held_text = 0, held_ids = 0, hits[2];
    client_t *c = NULL;
    tok_t *tok = NULL;

    cu_init();
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(tokf, sizeof(tokf), "%s/models/aidreams-tok512.bin",
             BT_SHARED_DIR);
    BT_ASSERT_OK(tok_load(tokf, 512, &tok));
    for (int i = 0; i < N_REQ; i++) {
        int *v = NULL;

        snprintf(text[i], sizeof(text[i]), "%s%s", k_prefix, k_suffix[i]);
        BT_ASSERT_OK(tok_encode(tok, text[i], strlen(text[i]), true, &v,
                                &n_ids[i]));
        BT_CHECK(n_ids[i] > 8 && n_ids[i] + MAX_TOKENS < 128);
        memcpy(ids[i], v, (size_t)n_ids[i] * sizeof(int));
        bt_free(v);
    }
    {
        int *v = NULL, n = 0;

        BT_ASSERT_OK(tok_encode(tok, k_prefix, strlen(k_prefix), true, &v,
                                &n));
        n_prefix_blocks = (n - 1) / 4; /* safely inside every prompt */
        bt_free(v);
    }
    tok_destroy(&tok);
    fprintf(stderr, "shared prefix: %d full blocks\n", n_prefix_blocks);

    cu_router_addrs(listen, control);
    rport = cu_free_port();
    pm = cu_free_port();
    dm[0] = cu_free_port();
    dm[1] = cu_free_port();
    snprintf(rport_s, sizeof(rport_s), "%d", rport);
    snprintf(pm_s, sizeof(pm_s), "%d", pm);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--metrics-port", rport_s, "--policy", "kv-aware",
             "--kv-weights", "overlap=1,load=1", "--tokenizer", tokf, NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tokf, "--threads", "1", "--name", "ptp",
             "--block-size", "4", "--kv-blocks", "200", "--metrics-port",
             pm_s, NULL);
    for (int i = 0; i < 2; i++) {
        snprintf(dm_s[i], sizeof(dm_s[i]), "%d", dm[i]);
        cu_spawn("baton-decode", "--router", control, "--model", model,
                 "--tokenizer", tokf, "--threads", "1", "--name", names[i],
                 "--block-size", "4", "--kv-blocks", "400",
                 "--metrics-port", dm_s[i], NULL);
    }
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 2, 30000);

    /* The same prompts as text ("t"), then as ids ("i"), each salt cold
     * at its first request. */
    for (int pass = 0; pass < 2; pass++) {
        const char *salt = pass == 0 ? "t" : "i";
        double *held_sum = pass == 0 ? &held_text : &held_ids;

        home = -1;
        hits[pass] = -hit_tokens(pm, dm);
        for (int i = 0; i < N_REQ; i++) {
            cu_result_t res;
            pt_counts_t d;
            int blocks = (n_ids[i] + 3) / 4;
            int ref[CU_MAX_IDS], n_ref;
            int w = run_one(c, text[i], pass == 1 ? ids[i] : NULL, n_ids[i],
                            salt, names, pm, dm, &res, &d);

            fprintf(stderr, "%s request %d: %d tokens (%d blocks) on %s: "
                    "held %g, sent %g, received %g\n",
                    pass == 0 ? "text" : "ids", i, n_ids[i], blocks,
                    names[w], d.held, d.sent, d.received);
            n_ref = baton_run_text(model, tokf, text[i], ref, CU_MAX_IDS);
            BT_ASSERT_EQ(res.n_ids, n_ref);
            for (int k = 0; k < n_ref; k++)
                if (res.ids[k] != ref[k])
                    BT_TEST_FAIL("%s request %d: id %d is %d, baton run "
                                 "gives %d", salt, i, k, res.ids[k],
                                 ref[k]);
            BT_ASSERT_EQ((int)d.sent, blocks - (int)d.held);
            BT_ASSERT_EQ((int)d.received, blocks - (int)d.held);
            if (i == 0) {
                BT_ASSERT_EQ((int)d.held, 0); /* a cold salt */
                home = w;
                /* its blocks reach the router before the next pick */
                wait_index(rport, names[home], n_prefix_blocks);
                continue;
            }
            if (w != home)
                BT_TEST_FAIL("%s request %d went to %s, not to %s that "
                             "holds the prefix", salt, i, names[w],
                             names[home]);
            if ((int)d.held < n_prefix_blocks)
                BT_TEST_FAIL("%s request %d: the decode worker held %g "
                             "blocks at the grant, want >= %d (first-try "
                             "hit)", salt, i, d.held, n_prefix_blocks);
            *held_sum += d.held;
        }
        hits[pass] += hit_tokens(pm, dm);
    }
    fprintf(stderr, "blocks held at the grant: text %g, ids %g; prompt "
            "tokens hit (baton_worker_prefix_hit_tokens_total): text %g, "
            "ids %g\n", held_text, held_ids, hits[0], hits[1]);
    BT_ASSERT_EQ((int)held_text, (int)held_ids);
    BT_ASSERT_EQ((int)hits[0], (int)hits[1]);

    client_destroy(&c);
    other_tokenizer(model, tokf, text[1]);
    BT_TEST_PASS("cluster/prefix_text: text prompts are routed to their "
                 "prefix and hit on the decode worker at the first try, "
                 "as ids do, with baton run's output");
    return 0;
}
