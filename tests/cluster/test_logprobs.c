/*
 * test_logprobs.c - logprobs end to end (issue 39) on aidreams260K.
 *
 * The reference is computed here, in-process: the CPU engine generates
 * greedily with logprobs and prompt logprobs on, and one teacher-forced
 * forward over prompt + output (every position a logits row) must give
 * the same numbers.  `baton run --logprobs K --prompt-logprobs K` must
 * print them too.  Then real clusters must return them through the
 * client library: disaggregated (router + prefill + decode), aggregated
 * (decode --role both), and across a decode worker killed mid-stream
 * (the replacement recomputes from the same state: equal values).
 * Checks on every stream: logprobs <= 0, the greedy token is the top-1
 * alternative, alternatives sorted with exp-sum <= 1, the prompt's first
 * token has no logprob, all within 1e-4 of the reference.
 */
#include <math.h>

#include "cluster_util.h"
#include "engine.h"

#define K 5          /* alternatives asked */
#define G 16         /* tokens generated */
#define TOL 1e-4

/* 90 tokens: BOS, a real phrase, then arbitrary ids; longer than the
 * 64-position chunks of prompt logprobs, and the prefill below runs
 * 24-token chunks, so both splits are crossed */
#define NP 90
static int prompt[NP];
static const int phrase[] = {1, 368, 430, 429, 302, 450, 437, 434,
                             281, 269, 435, 447, 431, 275};

static void make_prompt(void)
{
    for (int i = 0; i < NP; i++)
        prompt[i] = i < (int)BT_ARRAY_SIZE(phrase)
                        ? phrase[i] : 3 + (i * 37 + 11) % 500;
}

/* One token's numbers. */
typedef struct {
    int id;
    float lp;
    int top_ids[K];
    float top_lps[K];
} tok_lp_t;

/* A generation with its logprobs: gen[G], and the prompt's positions
 * 1..NP-1 in plp[1..] (plp[0] unused). */
typedef struct {
    tok_lp_t gen[G];
    int n_gen;
    tok_lp_t plp[NP];
    int n_plp;          /* NP when the prompt's came */
    int retries;
} run_t;

static void copy_lp(tok_lp_t *t, int id, const sampler_logprobs_t *lp)
{
    BT_ASSERT_EQ(lp->n_top, K);
    t->id = id;
    t->lp = lp->logprob;
    memcpy(t->top_ids, lp->top_ids, sizeof(t->top_ids));
    memcpy(t->top_lps, lp->top_logprobs, sizeof(t->top_lps));
}

/* The engine with logprobs on, then one teacher-forced forward over the
 * whole sequence that must agree with it. */
static void reference(const char *model, run_t *ref)
{
    engine_config_t ecfg;
    engine_t *eng = NULL;
    engine_seq_t *seq = NULL;
    sampler_params_t sp;
    const sampler_prompt_lp_t *plp;
    int seqv[NP + G], n_blocks, *blocks, vocab;
    float *logits;
    backend_seq_t bs;
    backend_batch_t batch;

    memset(ref, 0, sizeof(*ref));
    engine_config_init(&ecfg);
    ecfg.model_path = model;
    ecfg.device = "cpu";
    ecfg.backend.n_threads = 1;
    BT_ASSERT_OK(engine_create(&ecfg, &eng));
    vocab = model_config(engine_model(eng))->vocab_size;
    sampler_params_init(&sp);
    sp.logprobs = true;
    sp.top_logprobs = K;
    sp.prompt_logprobs = true;
    sp.prompt_top_logprobs = K;
    BT_ASSERT_OK(engine_seq_create(eng, prompt, NP, &sp, &seq));
    while (ref->n_gen < G) {
        int tok;
        BT_ASSERT_OK(engine_step(eng, &seq, 1, 0, &tok));
        if (tok < 0)
            continue;
        copy_lp(&ref->gen[ref->n_gen++], tok,
                sampler_last_logprobs(engine_seq_sampler(seq)));
    }
    plp = engine_seq_prompt_logprobs(seq);
    BT_CHECK(plp != NULL && plp->n == NP && plp->k == K);
    for (int p = 1; p < NP; p++) {
        tok_lp_t *t = &ref->plp[p];
        t->id = prompt[p];
        t->lp = plp->lps[p - 1];
        for (int j = 0; j < K; j++) {
            t->top_ids[j] = plp->top_ids[(p - 1) * K + j];
            t->top_lps[j] = plp->top_lps[(p - 1) * K + j];
        }
    }
    ref->n_plp = NP;
    engine_seq_destroy(eng, &seq);

    /* teacher forcing: prompt + output in one forward, a row each */
    memcpy(seqv, prompt, sizeof(prompt));
    for (int i = 0; i < G; i++)
        seqv[NP + i] = ref->gen[i].id;
    n_blocks = (int)BT_DIV_UP(NP + G, engine_block_size(eng));
    blocks = bt_malloc(sizeof(int) * (size_t)n_blocks, "test");
    logits = bt_malloc(sizeof(float) * (size_t)vocab * (NP + G), "test");
    BT_ASSERT_OK(kv_allocator_alloc(engine_kv(eng), n_blocks, blocks));
    memset(&bs, 0, sizeof(bs));
    bs.n_tokens = NP + G;
    bs.tokens = seqv;
    bs.block_table = blocks;
    bs.n_logits = NP + G;
    memset(&batch, 0, sizeof(batch));
    batch.n_seqs = 1;
    batch.seqs = &bs;
    BT_ASSERT_OK(backend_forward(engine_backend(eng), &batch, logits, NULL));
    for (int p = 1; p < NP + G; p++) {
        const tok_lp_t *want = p < NP ? &ref->plp[p] : &ref->gen[p - NP];
        sampler_logprobs_t lp;
        const float *x = logits + (size_t)(p - 1) * vocab;
        double m = -INFINITY, sum = 0, lse;
        int best = 0;

        /* log_softmax here, not the sampler's function: the numbers the
         * product computes are checked against an independent sum */
        for (int v = 0; v < vocab; v++)
            m = x[v] > m ? x[v] : m;
        for (int v = 0; v < vocab; v++) {
            sum += exp((double)x[v] - m);
            best = x[v] > x[best] ? v : best;
        }
        lse = m + log(sum);
        if (fabs((x[seqv[p]] - lse) - want->lp) > TOL ||
            want->top_ids[0] != best ||
            fabs((x[best] - lse) - want->top_lps[0]) > TOL)
            BT_TEST_FAIL("position %d: log_softmax %.6f (best %d), engine "
                         "%.6f (best %d)", p, x[seqv[p]] - lse, best,
                         want->lp, want->top_ids[0]);
        sampler_logprobs_row(x, vocab, seqv[p], K, &lp);
        if (fabs(lp.logprob - want->lp) > TOL)
            BT_TEST_FAIL("teacher forcing, position %d: %.6f, engine %.6f",
                         p, lp.logprob, want->lp);
        for (int j = 0; j < K; j++) {
            BT_ASSERT_EQ(lp.top_ids[j], want->top_ids[j]);
            BT_CHECK(fabs(lp.top_logprobs[j] - want->top_lps[j]) <= TOL);
        }
    }
    kv_allocator_release(engine_kv(eng), n_blocks, blocks);
    bt_free(blocks);
    bt_free(logits);
    engine_destroy(&eng);
}

/* The sanity rules of any stream of logprobs (greedy). */
static void check_rules(const tok_lp_t *t, const char *what, int i,
                        bool greedy)
{
    double sum = 0;

    if (!(t->lp <= 0.0f))
        BT_TEST_FAIL("%s %d: logprob %.6f > 0", what, i, t->lp);
    if (greedy && t->top_ids[0] != t->id)
        BT_TEST_FAIL("%s %d: greedy token %d is not the top-1 (%d)", what,
                     i, t->id, t->top_ids[0]);
    for (int j = 0; j < K; j++) {
        BT_CHECK(t->top_lps[j] <= 0.0f);
        if (j > 0 && t->top_lps[j] > t->top_lps[j - 1])
            BT_TEST_FAIL("%s %d: alternatives not sorted", what, i);
        sum += exp(t->top_lps[j]);
    }
    BT_CHECK(sum <= 1.0 + 1e-5);
}

static void check_equal(const tok_lp_t *got, const tok_lp_t *want,
                        const char *what, int i)
{
    BT_ASSERT_EQ(got->id, want->id);
    if (fabs(got->lp - want->lp) > TOL)
        BT_TEST_FAIL("%s %d: logprob %.6f, reference %.6f", what, i,
                     got->lp, want->lp);
    for (int j = 0; j < K; j++) {
        BT_ASSERT_EQ(got->top_ids[j], want->top_ids[j]);
        if (fabs(got->top_lps[j] - want->top_lps[j]) > TOL)
            BT_TEST_FAIL("%s %d: alternative %d %.6f, reference %.6f", what,
                         i, j, got->top_lps[j], want->top_lps[j]);
    }
}

static void check_run(const run_t *got, const run_t *ref, const char *what)
{
    BT_ASSERT_EQ(got->n_gen, G);
    BT_ASSERT_EQ(got->n_plp, NP);
    for (int i = 0; i < G; i++) {
        check_rules(&got->gen[i], what, i, true);
        check_equal(&got->gen[i], &ref->gen[i], what, i);
    }
    for (int p = 1; p < NP; p++) {
        check_rules(&got->plp[p], what, p, false);
        check_equal(&got->plp[p], &ref->plp[p], what, p);
    }
    fprintf(stderr, "%s: %d tokens and %d prompt positions equal the "
            "reference (first logprob %.6f)\n", what, G, NP - 1,
            got->gen[0].lp);
}

// ---------------------------------------------------------------------------
// `baton run --logprobs K --prompt-logprobs K`

/* Reads "...pos:P id:T logprob:L top:ID=LP,..." (or index:I) into t. */
static void parse_line(const char *line, tok_lp_t *t)
{
    const char *s = strstr(line, " id:");
    char *end;

    BT_CHECK(s != NULL);
    t->id = (int)strtol(s + 4, &end, 10);
    s = strstr(end, "logprob:");
    BT_CHECK(s != NULL);
    t->lp = strtof(s + 8, &end);
    s = strstr(end, "top:");
    BT_CHECK(s != NULL);
    s += 4;
    for (int j = 0; j < K; j++) {
        t->top_ids[j] = (int)strtol(s, &end, 10);
        BT_CHECK(*end == '=');
        t->top_lps[j] = strtof(end + 1, &end);
        s = end + (*end == ',');
    }
}

static char run_log[] = "/tmp/bt_test_logprobs_XXXXXX";

static void run_log_unlink(void)
{
    unlink(run_log);
}

static void baton_run(const char *model, run_t *out)
{
    char *log = run_log, ids[1024], line[1024];
    char k[8];
    size_t len = 0;
    FILE *f;
    int fd = mkstemp(log);
    pid_t pid;

    BT_CHECK(fd >= 0);
    close(fd);
    atexit(run_log_unlink); /* a failed check exits */
    for (int i = 0; i < NP; i++)
        len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%d",
                                i ? " " : "", prompt[i]);
    snprintf(k, sizeof(k), "%d", K);
    memset(out, 0, sizeof(*out));
    pid = cu_spawn_log(log, "baton", "run", "--model", model, "--device",
                       "cpu", "--threads", "1", "--prompt-ids", ids,
                       "--max-tokens", "16", "--ignore-eos", "--ids",
                       "--logprobs", k, "--prompt-logprobs", k, NULL);
    BT_ASSERT_EQ(cu_wait_exit(pid, 60000), 0);
    f = fopen(log, "r");
    BT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "logprob index:", 14) == 0 && out->n_gen < G) {
            parse_line(line, &out->gen[out->n_gen++]);
        } else if (strncmp(line, "prompt_logprob pos:", 19) == 0) {
            int p = atoi(line + 19);
            BT_CHECK(p >= 1 && p < NP);
            parse_line(line, &out->plp[p]);
            out->n_plp = NP;
        }
    }
    fclose(f);
}

// ---------------------------------------------------------------------------
// Clusters

static uint64_t submit(client_t *c)
{
    client_request_t req;
    uint64_t rid;

    client_request_init(&req);
    req.prompt_ids = prompt;
    req.n_prompt_ids = NP;
    req.temperature = 0;
    req.max_tokens = G;
    req.ignore_eos = true;
    req.want_text = false;
    req.logprobs = true;
    req.top_logprobs = K;
    req.prompt_logprobs = true;
    req.prompt_top_logprobs = K;
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

/* Applies one message of request rid to out; true when it ended. */
static bool apply(run_t *out, uint64_t rid, const Baton__ClientMessage *m)
{
    const Baton__TokenChunk *c = m->chunk;

    if (client_msg_request_id(m) != rid)
        return false;
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR)
        BT_TEST_FAIL("request failed: %s", m->error->message);
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
        if (m->finished->timings != NULL)
            out->retries = (int)m->finished->timings->retries;
        return true;
    }
    if (m->body_case != BATON__CLIENT_MESSAGE__BODY_CHUNK)
        return false;
    BT_ASSERT_EQ((int)c->index, out->n_gen);
    if (c->n_prompt_ids > 0) {
        /* once, on the first chunk, ids and positions 1.. */
        BT_ASSERT_EQ(out->n_plp, 0);
        BT_ASSERT_EQ((int)c->n_prompt_ids, NP);
        BT_ASSERT_EQ((int)c->n_prompt_logprobs, NP - 1);
        BT_ASSERT_EQ((int)c->n_prompt_top_ids, (NP - 1) * K);
        BT_ASSERT_EQ((int)c->n_prompt_top_logprobs, (NP - 1) * K);
        for (int p = 1; p < NP; p++) {
            tok_lp_t *t = &out->plp[p];
            BT_ASSERT_EQ(c->prompt_ids[p], prompt[p]);
            t->id = c->prompt_ids[p];
            t->lp = c->prompt_logprobs[p - 1];
            for (int j = 0; j < K; j++) {
                t->top_ids[j] = c->prompt_top_ids[(p - 1) * K + j];
                t->top_lps[j] = c->prompt_top_logprobs[(p - 1) * K + j];
            }
        }
        out->n_plp = NP;
    }
    BT_ASSERT_EQ(c->n_logprobs, c->n_ids);
    BT_ASSERT_EQ(c->n_top_ids, c->n_ids * K);
    BT_ASSERT_EQ(c->n_top_logprobs, c->n_ids * K);
    for (size_t i = 0; i < c->n_ids && out->n_gen < G; i++) {
        tok_lp_t *t = &out->gen[out->n_gen++];
        t->id = c->ids[i];
        t->lp = c->logprobs[i];
        for (int j = 0; j < K; j++) {
            t->top_ids[j] = c->top_ids[i * K + j];
            t->top_lps[j] = c->top_logprobs[i * K + j];
        }
    }
    return false;
}

/* Receives request rid until it ends, or until it holds `until` tokens
 * (0: the end). */
static void collect(client_t *c, uint64_t rid, run_t *out, int until)
{
    uint64_t deadline = bt_time_ns() + 60000000000ull;

    while (until == 0 || out->n_gen < until) {
        Baton__ClientMessage *m = NULL;
        bool done;
        if (bt_time_ns() > deadline)
            BT_TEST_FAIL("request %llu: %d tokens after 60 s",
                         (unsigned long long)rid, out->n_gen);
        if (client_recv(c, 200, &m) != BT_OK)
            continue;
        done = apply(out, rid, m);
        proto_client_free(&m);
        if (done)
            return;
    }
}

static void run_once(client_t *c, run_t *out)
{
    memset(out, 0, sizeof(*out));
    collect(c, submit(c), out, 0);
}

int main(void)
{
    static run_t ref, cli, dis, agg, fo;
    char listen[64], control[64], listen2[64], control2[64], model[512];
    client_t *c = NULL, *c2 = NULL;
    pid_t d0, d1;
    uint64_t rid;

    cu_init();
    make_prompt();
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    reference(model, &ref);
    for (int i = 0; i < G; i++)
        check_rules(&ref.gen[i], "reference", i, true);

    baton_run(model, &cli);
    check_run(&cli, &ref, "baton run --logprobs");

    /* disaggregated: router + prefill + decode */
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--threads", "1", "--name", "p0", "--chunk-tokens", "24", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d0", "--step-delay-ms", "30",
                  NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 30000);
    run_once(c, &dis);
    check_run(&dis, &ref, "disaggregated");

    /* aggregated: decode --role both prefills locally */
    cu_router_addrs(listen2, control2);
    cu_spawn("baton-router", "--listen", listen2, "--control", control2,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-decode", "--router", control2, "--model", model,
             "--threads", "1", "--name", "a0", "--role", "both",
             "--chunk-tokens", "40", NULL);
    BT_ASSERT_OK(client_create(listen2, &c2));
    cu_wait_workers(c2, 0, 1, 30000);
    run_once(c2, &agg);
    check_run(&agg, &ref, "aggregated");
    for (int i = 0; i < G; i++)
        check_equal(&agg.gen[i], &dis.gen[i], "aggregated vs disaggregated",
                    i);

    /* failover: d0 dies mid-stream; d1 recomputes from prompt + output */
    memset(&fo, 0, sizeof(fo));
    rid = submit(c);
    collect(c, rid, &fo, 4);
    kill(d0, SIGSTOP);
    d1 = cu_spawn("baton-decode", "--router", control, "--model", model,
                  "--threads", "1", "--name", "d1", NULL);
    BT_CHECK(fo.n_gen < G);
    cu_kill(d0, SIGKILL);
    collect(c, rid, &fo, 0);
    BT_CHECK(fo.retries >= 1);
    check_run(&fo, &ref, "decode failover");

    client_destroy(&c);
    client_destroy(&c2);
    (void)d1;
    BT_TEST_PASS("cluster/logprobs: reference, baton run, disaggregated, "
                 "aggregated and failover agree within 1e-4");
    return 0;
}
