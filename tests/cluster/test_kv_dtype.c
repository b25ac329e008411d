/*
 * test_kv_dtype.c - the KV cache's element type across the hand-off
 * (issue 37 item 4), with real processes on 127.0.0.1 and the CPU
 * backend's FP8 reference:
 *   1. a prefill worker with an FP8 KV cache and a decode worker with a
 *      float one are never paired: with no other pool the request fails
 *      at once (within a second), NO_WORKERS, naming the pools and
 *      --kv-dtype (it does not move FP8 bytes into a float pool, nor
 *      time out; test_precision_routing covers routing around them);
 *   2. a pair that both run --kv-dtype fp8 serves greedy requests whose
 *      ids equal `baton run --kv-dtype fp8` (the FP8 blocks cross the
 *      hand-off byte for byte), for every golden prompt;
 *   3. --gpu takes a GPU or MIG UUID (refused with --tp > 1, as are
 *      malformed values), so an operator can pin a worker to a MIG slice.
 */
#include "cluster_util.h"

#define MODEL BT_SHARED_DIR "/models/aidreams260K.bin"
#define N_REQ 6

/* `baton run --kv-dtype fp8` greedy ids of golden prompt g. */
static int run_fp8(const cu_golden_t *g, int *out, int cap)
{
    return cu_baton_run_golden(MODEL, "--kv-dtype fp8", g, out, cap);
}

static void test_mismatch(void)
{
    char listen[64], control[64];
    client_t *c = NULL;
    client_request_t req;
    Baton__ClientMessage *m = NULL;
    uint64_t rid, until, t0;
    int ids[3] = { 1, 50, 60 };

    fprintf(stderr, "1. fp8 prefill + float decode: refused at pairing\n");
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "p8", "--kv-dtype", "fp8", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "d32", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    client_request_init(&req);
    req.prompt_ids = ids;
    req.n_prompt_ids = 3;
    req.max_tokens = 4;
    t0 = bt_time_ns();
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    until = t0 + 10000000000ull;
    for (;;) {
        BT_CHECK(bt_time_ns() < until);
        if (client_recv(c, 500, &m) != BT_OK)
            continue;
        if (client_msg_request_id(m) == rid &&
            m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR)
            break;
        BT_CHECK(m->body_case != BATON__CLIENT_MESSAGE__BODY_CHUNK);
        proto_client_free(&m);
    }
    BT_CHECK(bt_time_ns() - t0 < 1000000000ull);
    BT_ASSERT_EQ(m->error->code, BATON__ERROR_CODE__ERROR_NO_WORKERS);
    fprintf(stderr, "   %s\n", m->error->message);
    BT_CHECK(strstr(m->error->message, "--kv-dtype") != NULL &&
             strstr(m->error->message, "f32/kv fp8 1P") != NULL &&
             strstr(m->error->message, "f32/kv f32 0P+1D") != NULL);
    proto_client_free(&m);
    client_destroy(&c);
    cu_kill_all();
}

static void test_fp8_pair(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_REQ];
    static int want[N_REQ][CU_MAX_IDS];
    int n_want[N_REQ];
    char listen[64], control[64];
    client_t *c = NULL;
    int n_golden;

    fprintf(stderr, "2. fp8 prefill + fp8 decode: baton run's ids\n");
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    for (int i = 0; i < N_REQ; i++)
        n_want[i] = run_fp8(&golden[i % n_golden], want[i], CU_MAX_IDS);
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "p8", "--kv-dtype", "fp8", NULL);
    cu_spawn("baton-decode", "--router", control, "--model", MODEL,
             "--threads", "1", "--name", "d8", "--kv-dtype", "fp8",
             "--kv-blocks", "400", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    for (int i = 0; i < N_REQ; i++)
        res[i].rid = cu_submit_golden(c, &golden[i % n_golden]);
    cu_collect(c, res, N_REQ, 60000);
    cu_check_baton_run(res, N_REQ, want, n_want, "fp8");
    cu_wait_kv_idle(c, 5000);
    client_destroy(&c);
    cu_kill_all();
}

/* A worker started with `gpu` (and `tp`) exits by itself with a message
 * containing `want` (NULL: it must not exit within a second). */
static void gpu_case(const char *gpu, const char *tp, const char *want)
{
    char log[] = "/tmp/bt_kvdtype_gpu_XXXXXX", line[512];
    int fd = mkstemp(log), rc, found = 0;
    pid_t pid;
    FILE *f;

    BT_CHECK(fd >= 0);
    close(fd);
    pid = cu_spawn_log(log, "baton-decode", "--router",
                       "tcp://127.0.0.1:1", "--null-model", "--name", "g",
                       "--device", "cpu", "--gpu", gpu, "--tp", tp, NULL);
    rc = cu_wait_exit(pid, want != NULL ? 10000 : 1000);
    if (want == NULL) {
        BT_ASSERT_EQ(rc, -1); /* still running: accepted */
        cu_kill(pid, SIGKILL);
    } else {
        BT_CHECK(rc > 0);
    }
    f = fopen(log, "r");
    BT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        found |= strstr(line, want != NULL ? want
                                           : "CUDA_VISIBLE_DEVICES") != NULL;
    fclose(f);
    unlink(log);
    if (!found)
        BT_TEST_FAIL("--gpu %s --tp %s: no '%s' in its log", gpu, tp,
                     want != NULL ? want : "CUDA_VISIBLE_DEVICES");
}

int main(void)
{
    cu_init();
    test_mismatch();
    test_fp8_pair();
    fprintf(stderr, "3. --gpu by UUID\n");
    gpu_case("MIG-4f2c1a9e-0b7d-5e55-9c1b-2f0d7a6b1c3e", "1", NULL);
    gpu_case("GPU-4f2c1a9e-0b7d-5e55-9c1b-2f0d7a6b1c3e", "1", NULL);
    gpu_case("MIG-4f2c1a9e-0b7d-5e55-9c1b-2f0d7a6b1c3e", "2",
             "names one device");
    gpu_case("GPU-$(rm)", "1", "--gpu");
    BT_TEST_PASS("cluster/kv_dtype: fp8 pairs refused or served exactly; "
                 "--gpu UUIDs");
    return 0;
}
