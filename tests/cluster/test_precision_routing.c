/*
 * test_precision_routing.c - precision routing (issue 37 item 6), with
 * real processes on 127.0.0.1 and the CPU backend (aidreams260K, whose
 * fp8 greedy ids part from its f32 ones within the golden lengths):
 *   1. aggregated workers of two classes (f32, fp8): requests asking fp8
 *      give `baton run --precision fp8`'s ids and are served by the fp8
 *      worker only, f32 likewise; a class nobody registered (bf16) fails
 *      within a second, NO_WORKERS, naming the registered classes; an
 *      unknown one (fp4) is INVALID naming the allowed ones; `baton
 *      status` shows the column and the pools line; `baton bench` and
 *      `baton generate --precision` reach the right worker;
 *   2. the "precision" extension field through baton-http: fp8 served
 *      by the fp8 worker, bf16 a 503 with the message, fp9 a 400;
 *   3. prefill/decode: a bf16 prefill worker, an fp8 prefill worker and
 *      an fp8 decode worker.  Requests with no class are all served, by
 *      the fp8 pair only (never a mismatch failure); a bf16 request
 *      waits (its class has a prefill worker, no decode) and is served
 *      as `baton run --precision bf16` once a bf16 decode worker joins.
 */
#include "bt_error.h"
#include "gateway/http_util.h"

#define MODEL BT_SHARED_DIR "/models/aidreams260K.bin"
#define TOK BT_SHARED_DIR "/models/aidreams-tok512.bin"
#define N_REQ 4

static cu_golden_t golden[32];
static int n_golden;

/* `baton run --precision P` greedy ids of golden prompt g. */
static int run_ids(const char *precision, const cu_golden_t *g, int *out,
                   int cap)
{
    char opts[64];

    snprintf(opts, sizeof(opts), "--precision %s", precision);
    return cu_baton_run_golden(MODEL, opts, g, out, cap);
}

/* cu_submit_golden asking for `precision` (NULL: any). */
static uint64_t submit(client_t *c, const cu_golden_t *g,
                       const char *precision)
{
    client_request_t req;
    uint64_t rid;

    cu_golden_request(&req, g);
    if (client_request_set_precision(&req, precision) != BT_OK) {
        bt_error_clear();
        req.precision = precision; /* the router's check, not the setter's */
    }
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

/* Requests asking `precision` for the first N_REQ golden prompts give
 * want[i]'s ids. */
static void serve_and_check(client_t *c, const char *precision,
                            int want[][CU_MAX_IDS], const int *n_want)
{
    static cu_result_t res[N_REQ];

    memset(res, 0, sizeof(res));
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = submit(c, &golden[i % n_golden], precision);
    cu_collect(c, res, N_REQ, 60000);
    cu_check_baton_run(res, N_REQ, want, n_want,
                       precision ? precision : "any");
}

/* A request asking `precision` fails within a second with `code`, its
 * message holding want1 and want2. */
static void expect_refused(client_t *c, const char *precision, int code,
                           const char *want1, const char *want2)
{
    uint64_t t0 = bt_time_ns(), rid;
    Baton__ClientMessage *m = NULL;

    rid = submit(c, &golden[0], precision);
    for (;;) {
        BT_CHECK(bt_time_ns() - t0 < 1000000000ull);
        if (client_recv(c, 100, &m) != BT_OK)
            continue;
        if (client_msg_request_id(m) == rid)
            break;
        proto_client_free(&m);
    }
    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_ERROR);
    fprintf(stderr, "   %s: %s (%.0f ms)\n", precision, m->error->message,
            (double)(bt_time_ns() - t0) * 1e-6);
    BT_ASSERT_EQ((int)m->error->code, code);
    if (strstr(m->error->message, want1) == NULL ||
        strstr(m->error->message, want2) == NULL)
        BT_TEST_FAIL("'%s' lacks '%s' or '%s'", m->error->message, want1,
                     want2);
    proto_client_free(&m);
}

/* Runs a shell command; its exit status. */
__attribute__((format(printf, 1, 2))) static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    int rc;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* `baton status` prints a line containing each of the NULL-ended
 * strings (checked line by line: a column and a pools line). */
static void status_shows(const char *listen, const char *const *want)
{
    char cmd[512], line[1024];
    bool found[8] = { false };
    FILE *f;
    int n = 0;

    while (want[n] != NULL)
        n++;
    snprintf(cmd, sizeof(cmd), "%s/baton status --router %s --timeout 5",
             BT_BIN_DIR, listen);
    f = popen(cmd, "r");
    BT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL) {
        fputs(line, stderr);
        for (int i = 0; i < n; i++)
            found[i] |= strstr(line, want[i]) != NULL;
    }
    BT_ASSERT_EQ(pclose(f), 0);
    for (int i = 0; i < n; i++)
        if (!found[i])
            BT_TEST_FAIL("baton status shows no '%s'", want[i]);
}

/* POST /v1/completions with key `key` and body `body` to baton-http at
 * port; returns the status. */
static int post_key(int port, const char *key, const char *body)
{
    char req[2048];
    ht_resp_t r;
    int n = snprintf(req, sizeof(req),
                     "POST /v1/completions HTTP/1.1\r\nHost: test\r\n"
                     "Authorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     key, strlen(body), body);
    int status = ht_raw(port, req, (size_t)n, &r);

    if (status != 200)
        fprintf(stderr, "   %d: %s\n", status, r.body ? r.body : "");
    ht_resp_free(&r);
    return status;
}

static void test_aggregated(void)
{
    static int want8[N_REQ][CU_MAX_IDS], want32[N_REQ][CU_MAX_IDS];
    int n_want8[N_REQ], n_want32[N_REQ], differ = 0;
    char listen[64], control[64], body[1024];
    client_t *c = NULL;
    uint64_t s8, s32;
    int hport;
    ht_resp_t r;

    fprintf(stderr, "1. aggregated f32 + fp8 workers\n");
    for (int i = 0; i < N_REQ; i++) {
        const cu_golden_t *g = &golden[i % n_golden];
        n_want8[i] = run_ids("fp8", g, want8[i], CU_MAX_IDS);
        n_want32[i] = run_ids("f32", g, want32[i], CU_MAX_IDS);
        differ |= n_want8[i] != n_want32[i] ||
                  memcmp(want8[i], want32[i],
                         (size_t)n_want8[i] * sizeof(int)) != 0;
    }
    BT_CHECK(differ); /* else the ids could not tell the workers apart */
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--tokenizer", TOK, "--threads", "1", "--name", "a32",
             "--role", "both", "--kv-blocks", "400", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--tokenizer", TOK, "--threads", "1", "--name", "a8",
             "--role", "both", "--precision", "fp8", "--kv-blocks", "400",
             NULL);
    hport = ht_start_gateway(listen, "--tokenizer", TOK, "--model-name",
                             "aidreams", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 0, 2, 20000);
    ht_wait_healthy(hport, 10000);

    /* served counts an aggregated worker's both roles: 2 a request */
    serve_and_check(c, "fp8", want8, n_want8);
    BT_ASSERT_EQ(cu_served(c, "a8"), 2 * N_REQ);
    BT_ASSERT_EQ(cu_served(c, "a32"), 0);
    serve_and_check(c, "f32", want32, n_want32);
    BT_ASSERT_EQ(cu_served(c, "a8"), 2 * N_REQ);
    BT_ASSERT_EQ(cu_served(c, "a32"), 2 * N_REQ);
    expect_refused(c, "bf16", BATON__ERROR_CODE__ERROR_NO_WORKERS,
                   "no worker serves precision 'bf16' (registered: ",
                   "fp8 x1");
    expect_refused(c, "fp4", BATON__ERROR_CODE__ERROR_INVALID, "'fp4'",
                   "f32, bf16, fp8");
    {
        static const char *const want[] = {
            " a8 ", " both     fp8/kv f32 ", "pools: ", "f32 (0P+1D, 1 both)",
            "fp8/kv f32 (0P+1D, 1 both)", NULL
        };
        status_shows(listen, want);
    }

    /* the CLI: baton bench and baton generate --precision */
    s8 = cu_served(c, "a8");
    s32 = cu_served(c, "a32");
    BT_ASSERT_EQ(sh("%s/baton bench --router %s --requests 4 --concurrency 2 "
                    "--prompt-len 8 --output-len 4 --precision fp8 "
                    "--no-progress --json /dev/null >&2", BT_BIN_DIR,
                    listen), 0);
    BT_ASSERT_EQ(cu_served(c, "a8"), s8 + 8);
    BT_ASSERT_EQ(sh("%s/baton generate --router %s --prompt-ids '1 50 60' "
                    "--max-tokens 4 --ids --precision f32 >&2", BT_BIN_DIR,
                    listen), 0);
    BT_ASSERT_EQ(cu_served(c, "a32"), s32 + 2);
    BT_CHECK(sh("%s/baton generate --router %s --prompt-ids '1 50 60' "
                "--max-tokens 4 --precision bf16 2>&1 | grep -q \"no worker "
                "serves precision 'bf16'\"", BT_BIN_DIR, listen) == 0);
    BT_CHECK(sh("%s/baton generate --router %s --prompt-ids '1 50 60' "
                "--precision fp16 2>/dev/null", BT_BIN_DIR, listen) != 0);

    fprintf(stderr, "2. the \"precision\" field through baton-http\n");
    s8 = cu_served(c, "a8");
    s32 = cu_served(c, "a32");
    snprintf(body, sizeof(body), "{\"prompt\":\"The river\",\"max_tokens\":"
             "8,\"temperature\":0,\"precision\":\"fp8\"}");
    BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r), 200);
    ht_resp_free(&r);
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\","
             "\"content\":\"The river\"}],\"max_tokens\":8,\"temperature\":"
             "0,\"precision\":\"fp8\"}");
    BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/chat/completions", body, &r),
                 200);
    ht_resp_free(&r);
    BT_ASSERT_EQ(cu_served(c, "a8"), s8 + 4);
    BT_ASSERT_EQ(cu_served(c, "a32"), s32);
    snprintf(body, sizeof(body), "{\"prompt\":\"The river\",\"max_tokens\":"
             "8,\"precision\":\"bf16\"}");
    BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r), 503);
    fprintf(stderr, "   bf16: %s\n", r.body);
    BT_CHECK(strstr(r.body, "no worker serves precision 'bf16'") != NULL);
    ht_resp_free(&r);
    snprintf(body, sizeof(body), "{\"prompt\":\"The river\",\"max_tokens\":"
             "8,\"precision\":\"fp9\"}");
    BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r), 400);
    BT_CHECK(strstr(r.body, "precision") != NULL);
    ht_resp_free(&r);
    snprintf(body, sizeof(body), "{\"prompt\":\"The river\",\"max_tokens\":"
             "8,\"precision\":8}");
    BT_ASSERT_EQ(ht_request(hport, "POST", "/v1/completions", body, &r), 400);
    ht_resp_free(&r);
    BT_ASSERT_EQ(cu_served(c, "a8"), s8 + 4);
    BT_ASSERT_EQ(cu_served(c, "a32"), s32);

    fprintf(stderr, "3. a tenant's default precision (api-key-file)\n");
    {
        char keys[] = "/tmp/bt_prec_keysXXXXXX";
        int fd = mkstemp(keys), kport;
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        const char *plain = "{\"prompt\":\"The river\",\"max_tokens\":4}";
        const char *f32b = "{\"prompt\":\"The river\",\"max_tokens\":4,"
                           "\"precision\":\"f32\"}";

        BT_CHECK(f != NULL);
        fprintf(f, "sk-prec-eight-0123456789 t8 precision=fp8\n"
                   "sk-prec-any-0123456789ab tany\n");
        fclose(f);
        kport = ht_start_gateway(listen, "--api-key-file", keys, NULL);
        ht_wait_healthy(kport, 10000);
        s8 = cu_served(c, "a8");
        s32 = cu_served(c, "a32");
        /* no precision in the body: the tenant's class */
        BT_ASSERT_EQ(post_key(kport, "sk-prec-eight-0123456789", plain), 200);
        BT_ASSERT_EQ(cu_served(c, "a8"), s8 + 2);
        BT_ASSERT_EQ(cu_served(c, "a32"), s32);
        /* the body's own class wins */
        BT_ASSERT_EQ(post_key(kport, "sk-prec-eight-0123456789", f32b), 200);
        BT_ASSERT_EQ(cu_served(c, "a32"), s32 + 2);
        /* a tenant without one: any (the least-loaded pick) */
        BT_ASSERT_EQ(post_key(kport, "sk-prec-any-0123456789ab", plain), 200);
        BT_ASSERT_EQ(cu_served(c, "a8") + cu_served(c, "a32"), s8 + s32 + 6);
        /* an unknown class in the key file stops baton-http at start */
        f = fopen(keys, "w");
        BT_CHECK(f != NULL);
        fprintf(f, "sk-prec-eight-0123456789 t8 precision=fp9\n");
        fclose(f);
        BT_CHECK(sh("%s/baton-http --router %s --listen 127.0.0.1:0 "
                    "--api-key-file %s 2>&1 | grep -q 'precision must be one "
                    "of'", BT_BIN_DIR, listen, keys) == 0);
        unlink(keys);
    }
    client_destroy(&c);
    cu_kill_all();
}

static void test_pairs(void)
{
    static int want8[N_REQ][CU_MAX_IDS], want16[1][CU_MAX_IDS];
    static cu_result_t res[1];
    int n_want8[N_REQ], n_want16[1];
    char listen[64], control[64];
    client_t *c = NULL;
    Baton__ClientMessage *m = NULL;

    fprintf(stderr, "3. bf16 prefill, fp8 prefill, fp8 decode\n");
    for (int i = 0; i < N_REQ; i++)
        n_want8[i] = run_ids("fp8", &golden[i % n_golden], want8[i],
                             CU_MAX_IDS);
    n_want16[0] = run_ids("bf16", &golden[0], want16[0], CU_MAX_IDS);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "pb", "--precision", "bf16", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "p8", "--precision", "fp8", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "d8", "--precision", "fp8",
             "--kv-blocks", "400", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 2, 1, 20000);

    /* twice: least-loaded ties pick the bf16 prefill worker first */
    serve_and_check(c, NULL, want8, n_want8);
    serve_and_check(c, NULL, want8, n_want8);
    BT_ASSERT_EQ(cu_served(c, "pb"), 0);
    BT_ASSERT_EQ(cu_served(c, "p8"), 2 * N_REQ);
    BT_ASSERT_EQ(cu_served(c, "d8"), 2 * N_REQ);

    /* bf16: a prefill worker of the class, no decode worker: it waits */
    memset(res, 0, sizeof(res));
    res[0].rid = submit(c, &golden[0], "bf16");
    BT_CHECK(client_recv(c, 500, &m) == BT_ERR_TIMEOUT);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "db", "--precision", "bf16",
             "--kv-blocks", "400", NULL);
    cu_collect(c, res, 1, 30000);
    BT_ASSERT_EQ(res[0].finished, 1);
    BT_ASSERT_EQ(res[0].n_ids, n_want16[0]);
    for (int k = 0; k < n_want16[0]; k++)
        BT_ASSERT_EQ(res[0].ids[k], want16[0][k]);
    BT_ASSERT_EQ(cu_served(c, "pb"), 1);
    BT_ASSERT_EQ(cu_served(c, "db"), 1);
    cu_wait_kv_idle(c, 5000);
    client_destroy(&c);
    cu_kill_all();
}

int main(void)
{
    cu_init();
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    test_aggregated();
    test_pairs();
    BT_TEST_PASS("cluster/precision_routing: classes routed, pairs kept "
                 "within a pool, absent classes refused at once");
    return 0;
}
