/*
 * test_curve_fuzz.c - garbage from peers CURVE lets in (issue 42: "the
 * fuzzers run with CURVE on").  CURVE decides who may talk to the router;
 * it says nothing about what an admitted peer says, and a buggy or
 * compromised worker or client holds a valid key.  So, with real
 * processes on loopback:
 *
 *   A CURVE cluster (router, one prefill and one decode worker running
 *   aidreams260K) serves golden requests while
 *     - a client with an allowed key sends FUZZ_N mutated ClientMessages
 *       on the client port, and
 *     - a worker with an allowed key sends FUZZ_N mutated ControlMessages
 *       on the control port (under several routing ids),
 *   both seeded from tests/fuzz/corpus and from messages of every body
 *   type packed here (including Shutdown/Drain naming the real workers and
 *   Registers taking their names), mutated by bit flips, byte overwrites,
 *   truncation, insertion, splicing, extra frames and random bytes.
 *
 * Every golden request finishes with exactly golden.jsonl's ids (never a
 * wrong token, whatever the noise); afterwards the router is alive, the
 * two real workers are still its only workers (the fuzzer's registrations
 * are dropped as silent, its Shutdown/Drain for names it does not own did
 * nothing), a second golden batch is exact and every KV block is free.
 *
 * BT_FUZZ_SEED=N reproduces a run (the seed is printed).
 */
#include <sys/stat.h>

#include "bt_curve.h"
#include "bt_proto.h"
#include "bt_zmq.h"
#include "cluster/cluster_util.h"

#define FUZZ_N 20000
#define N_GOLDEN 16
#define MAX_SEEDS 64
#define MAX_MSG 2048

static char g_dir[256];

typedef struct {
    uint8_t bytes[MAX_MSG];
    size_t len;
} seed_t;

typedef struct {
    seed_t s[MAX_SEEDS];
    int n;
} seeds_t;

static uint64_t g_rng;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static size_t rnd_below(size_t n)
{
    return n == 0 ? 0 : (size_t)(rnd() % n);
}

static void keygen(const char *name)
{
    char prefix[320];

    snprintf(prefix, sizeof(prefix), "%s/%s", g_dir, name);
    BT_ASSERT_OK(bt_curve_keygen(prefix, NULL));
}

static void key_path(char *out, size_t n, const char *name, const char *ext)
{
    snprintf(out, n, "%s/%s.%s", g_dir, name, ext);
}

static bt_curve_client_t curve_of(const char *name)
{
    char sec[320], pub[320];
    bt_curve_client_t c;

    key_path(sec, sizeof(sec), name, "key");
    key_path(pub, sizeof(pub), "router", "pub");
    BT_ASSERT_OK(bt_curve_client_load(sec, pub, &c));
    return c;
}

static void *dealer(void *ctx, const char *ep, const char *rid,
                    const bt_curve_client_t *curve)
{
    bt_zmq_socket_config_t cfg;
    void *s = NULL;
    int ms = 2000; /* a send waits for the CURVE handshake, not forever */

    bt_zmq_socket_config_init(&cfg);
    cfg.type = ZMQ_DEALER;
    cfg.endpoint = ep;
    cfg.identity = rid;
    cfg.curve_client = curve;
    BT_ASSERT_OK(bt_zmq_socket_create(ctx, &cfg, &s));
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &ms, sizeof(ms));
    return s;
}

// ---------------------------------------------------------------------------
// Seeds

static void seeds_add(seeds_t *ss, const uint8_t *b, size_t len)
{
    if (ss->n < MAX_SEEDS && len <= MAX_MSG) {
        memcpy(ss->s[ss->n].bytes, b, len);
        ss->s[ss->n++].len = len;
    }
}

static void seeds_from_dir(seeds_t *ss, const char *corpus)
{
    char cmd[600], path[512];
    FILE *ls;

    snprintf(cmd, sizeof(cmd), "ls %s/tests/fuzz/corpus/%s", BT_SOURCE_DIR,
             corpus);
    ls = popen(cmd, "r");
    BT_CHECK(ls != NULL);
    while (fgets(path, sizeof(path), ls) != NULL) {
        char full[1200];
        char *data = NULL;
        size_t len = 0;
        path[strcspn(path, "\n")] = 0;
        snprintf(full, sizeof(full), "%s/tests/fuzz/corpus/%s/%s",
                 BT_SOURCE_DIR, corpus, path);
        if (bt_read_file(full, MAX_MSG, &data, &len) == BT_OK)
            seeds_add(ss, (const uint8_t *)data, len);
        bt_free(data);
    }
    pclose(ls);
}

static void seed_control(seeds_t *ss, Baton__ControlMessage *m)
{
    uint8_t buf[MAX_MSG];
    size_t len;

    m->version = BT_PROTO_VERSION;
    len = baton__control_message__get_packed_size(m);
    BT_CHECK(len <= sizeof(buf));
    baton__control_message__pack(m, buf);
    seeds_add(ss, buf, len);
}

/* One well-formed message of every body a worker may send, naming the
 * real workers where a name matters: the mutations start from messages
 * that get past the decoder. */
static void control_seeds(seeds_t *ss)
{
    Baton__Register reg = BATON__REGISTER__INIT;
    Baton__Heartbeat hb = BATON__HEARTBEAT__INIT;
    Baton__KvGrant grant = BATON__KV_GRANT__INIT;
    Baton__PrefillDone pd = BATON__PREFILL_DONE__INIT;
    Baton__KvReady kr = BATON__KV_READY__INIT;
    Baton__TokenOut to = BATON__TOKEN_OUT__INIT;
    Baton__TaskError te = BATON__TASK_ERROR__INIT;
    Baton__Drain dr = BATON__DRAIN__INIT;
    Baton__Shutdown sd = BATON__SHUTDOWN__INIT;
    int32_t ids[4] = { 1, 2, 3, 4 };
    const char *names[] = { "d0", "p0", "fz" };

    seeds_from_dir(ss, "fuzz_proto_control");
    for (int i = 0; i < 3; i++) {
        Baton__ControlMessage m = BATON__CONTROL_MESSAGE__INIT;
        reg.name = (char *)names[i];
        reg.role = i == 1 ? BATON__ROLE__ROLE_PREFILL : BATON__ROLE__ROLE_DECODE;
        reg.has_role = 1;
        reg.has_session = 1;
        reg.session = 7;
        m.body_case = BATON__CONTROL_MESSAGE__BODY_REGISTER;
        m.register_ = &reg;
        seed_control(ss, &m);
    }
#define SEED(body_enum, field, value)                                   \
    do {                                                                \
        Baton__ControlMessage m = BATON__CONTROL_MESSAGE__INIT;         \
        m.body_case = BATON__CONTROL_MESSAGE__BODY_##body_enum;         \
        m.field = value;                                                \
        seed_control(ss, &m);                                           \
    } while (0)
    hb.has_session = 1;
    hb.session = 7;
    hb.has_free_kv_blocks = 1;
    hb.free_kv_blocks = 1 << 30;
    SEED(HEARTBEAT, heartbeat, &hb);
    grant.has_request_id = 1;
    grant.request_id = 1;
    grant.n_block_ids = 4;
    grant.block_ids = ids;
    SEED(KV_GRANT, kv_grant, &grant);
    pd.has_request_id = 1;
    pd.request_id = 1;
    SEED(PREFILL_DONE, prefill_done, &pd);
    kr.has_request_id = 1;
    kr.request_id = 1;
    kr.n_tokens = 4;
    kr.tokens = ids;
    SEED(KV_READY, kv_ready, &kr);
    to.has_request_id = 1;
    to.request_id = 1;
    SEED(TOKEN_OUT, token_out, &to);
    te.has_request_id = 1;
    te.request_id = 1;
    SEED(TASK_ERROR, task_error, &te);
    dr.name = "d0";
    SEED(DRAIN, drain, &dr);
    sd.name = "p0";
    SEED(SHUTDOWN, shutdown, &sd);
#undef SEED
}

static void client_seeds(seeds_t *ss)
{
    Baton__ClientMessage m = BATON__CLIENT_MESSAGE__INIT;
    Baton__StatusRequest sr = BATON__STATUS_REQUEST__INIT;
    Baton__Cancel cn = BATON__CANCEL__INIT;
    uint8_t buf[MAX_MSG];
    size_t len;

    seeds_from_dir(ss, "fuzz_proto_client");
    m.version = BT_PROTO_VERSION;
    m.body_case = BATON__CLIENT_MESSAGE__BODY_STATUS_REQUEST;
    sr.has_client_request_id = 1;
    sr.client_request_id = 9;
    m.status_request = &sr;
    len = baton__client_message__get_packed_size(&m);
    baton__client_message__pack(&m, buf);
    seeds_add(ss, buf, len);
    m.body_case = BATON__CLIENT_MESSAGE__BODY_CANCEL;
    m.cancel = &cn;
    len = baton__client_message__get_packed_size(&m);
    baton__client_message__pack(&m, buf);
    seeds_add(ss, buf, len);
}


// ---------------------------------------------------------------------------
// Structure-aware messages: byte mutations mostly die in the decoder, so
// half the noise is built from the protobuf-c descriptors instead (every
// field randomly set or not, values drawn from the edges of their types
// and from names and ids the cluster really uses), which decodes and then
// reaches the router's handlers.

static uint8_t g_arena[1 << 16];
static size_t g_arena_used;

static void *arena_alloc(size_t n)
{
    void *p;

    n = (n + 15) & ~(size_t)15;
    if (g_arena_used + n > sizeof(g_arena))
        return NULL;
    p = g_arena + g_arena_used;
    g_arena_used += n;
    memset(p, 0, n);
    return p;
}

static uint64_t edge_int(void)
{
    static const uint64_t v[] = { 0, 1, 2, 3, 4, 7, 16, 255, 256, 65535,
                                  0x7fffffff, 0x80000000u, 0xffffffffu,
                                  0x7fffffffffffffffull, ~0ull };
    return rnd_below(3) == 0 ? rnd() : v[rnd_below(sizeof(v) / sizeof(v[0]))];
}

static char *edge_string(void)
{
    static const char *v[] = { "", "d0", "p0", "fz", "d0#0", "../../etc",
                               "\xff\xfe", "%s%s%n" };
    char *out;
    size_t n;

    if (rnd_below(4) != 0)
        return (char *)v[rnd_below(sizeof(v) / sizeof(v[0]))];
    n = rnd_below(3) == 0 ? 300 + rnd_below(700) : rnd_below(24);
    out = arena_alloc(n + 1);
    if (out == NULL)
        return (char *)"";
    for (size_t i = 0; i < n; i++)
        out[i] = (char)(32 + rnd_below(95));
    return out;
}

static bool fill_value(const ProtobufCFieldDescriptor *f, void *at, int depth);

static ProtobufCMessage *random_message(const ProtobufCMessageDescriptor *d,
                                        int depth)
{
    ProtobufCMessage *m = arena_alloc(d->sizeof_message);
    const char *oneof_done = NULL;

    if (m == NULL)
        return NULL;
    protobuf_c_message_init(d, m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        uint8_t *base = (uint8_t *)m;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            /* one member of a oneof, picked with probability 1/n each */
            uint32_t *which = (uint32_t *)(base + f->quantifier_offset);
            if (oneof_done == (const char *)which || rnd_below(3) != 0)
                continue;
            if (fill_value(f, base + f->offset, depth)) {
                *which = f->id;
                oneof_done = (const char *)which;
            }
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = rnd_below(2) == 0 ? 0 : rnd_below(6);
            size_t elem = f->type == PROTOBUF_C_TYPE_MESSAGE ||
                                  f->type == PROTOBUF_C_TYPE_STRING
                              ? sizeof(void *)
                          : f->type == PROTOBUF_C_TYPE_BYTES
                              ? sizeof(ProtobufCBinaryData)
                          : f->type == PROTOBUF_C_TYPE_INT64 ||
                                    f->type == PROTOBUF_C_TYPE_UINT64 ||
                                    f->type == PROTOBUF_C_TYPE_SINT64 ||
                                    f->type == PROTOBUF_C_TYPE_FIXED64 ||
                                    f->type == PROTOBUF_C_TYPE_SFIXED64 ||
                                    f->type == PROTOBUF_C_TYPE_DOUBLE
                              ? 8 : 4;
            uint8_t *arr = n > 0 ? arena_alloc(n * elem) : NULL;
            size_t k = 0;
            if (arr == NULL)
                continue;
            for (; k < n; k++)
                if (!fill_value(f, arr + k * elem, depth))
                    break;
            *(size_t *)(base + f->quantifier_offset) = k;
            *(void **)(base + f->offset) = arr;
            continue;
        }
        if (f->label != PROTOBUF_C_LABEL_REQUIRED && rnd_below(2) == 0)
            continue;
        if (fill_value(f, base + f->offset, depth) &&
            f->label == PROTOBUF_C_LABEL_OPTIONAL &&
            f->type != PROTOBUF_C_TYPE_MESSAGE &&
            f->type != PROTOBUF_C_TYPE_STRING)
            *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
    }
    return m;
}

static bool fill_value(const ProtobufCFieldDescriptor *f, void *at, int depth)
{
    uint64_t v = edge_int();

    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: {
        uint32_t x = (uint32_t)v;
        memcpy(at, &x, 4);
        return true;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        int32_t x = rnd_below(4) == 0 || e->n_values == 0
                        ? (int32_t)v
                        : e->values[rnd_below(e->n_values)].value;
        memcpy(at, &x, 4);
        return true;
    }
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        memcpy(at, &v, 8);
        return true;
    case PROTOBUF_C_TYPE_BOOL: {
        protobuf_c_boolean b = (protobuf_c_boolean)(v & 1);
        memcpy(at, &b, sizeof(b));
        return true;
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        static const float fv[] = { 0.0f, -1.0f, 1e30f, 0.5f, 2.0f };
        float x = fv[rnd_below(5)];
        memcpy(at, &x, 4);
        return true;
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double x = (double)(int64_t)v;
        memcpy(at, &x, 8);
        return true;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *str = edge_string();
        memcpy(at, &str, sizeof(str));
        return true;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData b;
        b.len = rnd_below(3) == 0 ? rnd_below(4096) : rnd_below(40);
        b.data = b.len > 0 ? arena_alloc(b.len) : NULL;
        if (b.len > 0 && b.data == NULL)
            return false;
        for (size_t i = 0; i < b.len; i++)
            b.data[i] = (uint8_t)rnd();
        memcpy(at, &b, sizeof(b));
        return true;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *sub;
        if (depth >= 3)
            return false;
        sub = random_message(f->descriptor, depth + 1);
        if (sub == NULL)
            return false;
        memcpy(at, &sub, sizeof(sub));
        return true;
    }
    default:
        return false;
    }
}

/* Packs a random, decodable message of type d (with the current
 * protocol version) into out; returns its length (0: too big). */
static size_t random_packed(const ProtobufCMessageDescriptor *d,
                            uint8_t *out)
{
    ProtobufCMessage *m;
    size_t len;

    g_arena_used = 0;
    m = random_message(d, 0);
    if (m == NULL)
        return 0;
    /* field 1 is the version in both envelopes; keep it right */
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == 1) {
            uint32_t ver = BT_PROTO_VERSION;
            memcpy((uint8_t *)m + d->fields[i].offset, &ver, 4);
            if (d->fields[i].label == PROTOBUF_C_LABEL_OPTIONAL)
                *(protobuf_c_boolean *)((uint8_t *)m +
                                        d->fields[i].quantifier_offset) = 1;
        }
    len = protobuf_c_message_get_packed_size(m);
    if (len > MAX_MSG)
        return 0;
    return protobuf_c_message_pack(m, out);
}

// ---------------------------------------------------------------------------
// Mutation

/* Writes a mutation of a random seed into out; returns its length. */
static size_t mutate(const seeds_t *ss, uint8_t *out)
{
    const seed_t *s = &ss->s[rnd_below((size_t)ss->n)];
    size_t len = s->len;
    int rounds = 1 + (int)rnd_below(4);

    memcpy(out, s->bytes, len);
    if (rnd_below(16) == 0) { /* pure noise */
        len = rnd_below(600);
        for (size_t i = 0; i < len; i++)
            out[i] = (uint8_t)rnd();
        return len;
    }
    for (int r = 0; r < rounds; r++) {
        switch (rnd_below(6)) {
        case 0: /* bit flips */
            for (int k = 0; k < 1 + (int)rnd_below(8) && len > 0; k++)
                out[rnd_below(len)] ^= (uint8_t)(1u << rnd_below(8));
            break;
        case 1: /* overwrite with an interesting byte */
            if (len > 0) {
                static const uint8_t v[] = { 0, 0x7f, 0x80, 0xff, 0x01 };
                out[rnd_below(len)] = v[rnd_below(sizeof(v))];
            }
            break;
        case 2: /* truncate */
            len = rnd_below(len + 1);
            break;
        case 3: /* insert random bytes */
            for (int k = 0; k < 1 + (int)rnd_below(16) && len < MAX_MSG; k++) {
                size_t at = rnd_below(len + 1);
                memmove(out + at + 1, out + at, len - at);
                out[at] = (uint8_t)rnd();
                len++;
            }
            break;
        case 4: { /* splice the tail of another seed */
            const seed_t *o = &ss->s[rnd_below((size_t)ss->n)];
            size_t at = rnd_below(len + 1), from = rnd_below(o->len + 1);
            size_t n = o->len - from;
            if (at + n > MAX_MSG)
                n = MAX_MSG - at;
            memcpy(out + at, o->bytes + from, n);
            len = at + n;
            break;
        }
        default: /* a huge varint where a field value was */
            if (len > 2 && len + 9 < MAX_MSG) {
                size_t at = 1 + rnd_below(len - 1);
                memmove(out + at + 9, out + at, len - at);
                memset(out + at, 0xff, 9);
                len += 9;
            }
            break;
        }
    }
    return len;
}

/* Sends one mutated message, sometimes as several frames; drains
 * whatever the router answered and returns how many messages that was
 * (proof that the noise reached it past CURVE). */
static int fuzz_one(void *s, const seeds_t *ss,
                    const ProtobufCMessageDescriptor *d)
{
    uint8_t buf[MAX_MSG];
    int frames = rnd_below(8) == 0 ? 2 + (int)rnd_below(2) : 1;
    int replies = 0;

    for (int f = 0; f < frames; f++) {
        size_t len = rnd_below(2) == 0 ? random_packed(d, buf)
                                       : mutate(ss, buf);
        if (zmq_send(s, buf, len, f + 1 < frames ? ZMQ_SNDMORE : 0) < 0)
            BT_TEST_FAIL("send to the router: %s", zmq_strerror(zmq_errno()));
    }
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            break;
        }
        zmq_msg_close(&msg);
        replies++;
    }
    return replies;
}

// ---------------------------------------------------------------------------

static void submit_golden(client_t *c, cu_result_t *res, const cu_golden_t *g,
                          int n_golden)
{
    memset(res, 0, sizeof(*res) * N_GOLDEN);
    for (int i = 0; i < N_GOLDEN; i++)
        res[i].rid = cu_submit_golden(c, &g[i % n_golden]);
}

static void check_golden(const cu_result_t *res, const cu_golden_t *g,
                         int n_golden)
{
    for (int i = 0; i < N_GOLDEN; i++)
        cu_check_golden(&res[i], &g[i % n_golden], i);
}

int main(void)
{
    static cu_golden_t golden[32];
    static cu_result_t res[N_GOLDEN];
    static seeds_t cseeds, wseeds;
    char listen[64], control[64], model[512], tok[512], wdir[320];
    char rlog[320], rkey[320], rpub[320], cpub[320], sec[320], cmd[4096];
    bt_curve_client_t ck, fk, wk;
    client_config_t cc;
    client_t *c = NULL;
    void *ctx = zmq_ctx_new(), *cs, *ws[4];
    const char *seed_env = getenv("BT_FUZZ_SEED");
    pid_t router;
    int n_golden, wstatus, c_replies = 0, w_replies = 0, w_dropped;

    cu_init();
    unsetenv("BATON_CURVE_SECRET_KEY");
    unsetenv("BATON_ROUTER_PUBLIC_KEY");
    g_rng = seed_env != NULL ? strtoull(seed_env, NULL, 10)
                             : (bt_time_ns() | 1);
    fprintf(stderr, "BT_FUZZ_SEED=%llu\n", (unsigned long long)g_rng);
    n_golden = cu_golden_load("aidreams260K.bin", golden, 32);
    BT_CHECK(n_golden > 0);
    control_seeds(&wseeds);
    client_seeds(&cseeds);
    BT_CHECK(wseeds.n >= 10 && cseeds.n >= 4);

    snprintf(g_dir, sizeof(g_dir), "/tmp/bt_curvefuzz_%d_XXXXXX", (int)getpid());
    BT_CHECK(mkdtemp(g_dir) != NULL);
    keygen("router");
    keygen("pre");
    keygen("dec");
    keygen("fzw");
    keygen("client");
    keygen("fzc");
    snprintf(wdir, sizeof(wdir), "%s/workers", g_dir);
    snprintf(cmd, sizeof(cmd),
             "mkdir %s && cp %s/pre.pub %s/dec.pub %s/fzw.pub %s/ && "
             "mkdir %s/clients && cp %s/client.pub %s/fzc.pub %s/clients/",
             wdir, g_dir, g_dir, g_dir, wdir, g_dir, g_dir, g_dir, g_dir);
    BT_ASSERT_OK(system(cmd));
    key_path(rkey, sizeof(rkey), "router", "key");
    key_path(rpub, sizeof(rpub), "router", "pub");
    snprintf(cpub, sizeof(cpub), "%s/clients", g_dir);

    cu_router_addrs(listen, control);
    snprintf(model, sizeof(model), "%s/models/aidreams260K.bin", BT_SHARED_DIR);
    snprintf(tok, sizeof(tok), "%s/models/aidreams-tok512.bin", BT_SHARED_DIR);
    /* Short phase deadlines: a request the router hands to a worker the
     * fuzzer registered comes back after 1.5 s, not 10. */
    snprintf(rlog, sizeof(rlog), "%s/router.log", g_dir);
    router = cu_spawn_log(rlog, "baton-router", "--listen", listen,
                          "--control",
                      control, "--heartbeat-ms", "100", "--phase-ms", "1500",
                      "--max-retries", "20", "--curve-secret-key", rkey,
                      "--allow-workers", wdir, "--allow-clients", cpub, NULL);
    key_path(sec, sizeof(sec), "pre", "key");
    cu_spawn("baton-prefill", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "p0",
             "--curve-secret-key", sec, "--router-public-key", rpub, NULL);
    key_path(sec, sizeof(sec), "dec", "key");
    cu_spawn("baton-decode", "--router", control, "--model", model,
             "--tokenizer", tok, "--threads", "1", "--name", "d0",
             "--kv-blocks", "400", "--block-size", "16",
             "--curve-secret-key", sec, "--router-public-key", rpub, NULL);
    ck = curve_of("client");
    fk = curve_of("fzc");
    wk = curve_of("fzw");
    client_config_init(&cc);
    cc.curve = &ck;
    BT_ASSERT_OK(client_create_cfg(listen, &cc, &c));
    cu_wait_workers(c, 1, 1, 20000);

    fprintf(stderr, "1. golden requests while admitted peers send %d "
                    "mutated messages each\n", FUZZ_N);
    submit_golden(c, res, golden, n_golden);
    cs = dealer(ctx, listen, NULL, &fk);
    for (int i = 0; i < 4; i++) {
        char rid[32];
        snprintf(rid, sizeof(rid), "fz#%d", i);
        ws[i] = dealer(ctx, control, rid, &wk);
    }
    for (int i = 0; i < FUZZ_N; i++) {
        c_replies += fuzz_one(cs, &cseeds, &baton__client_message__descriptor);
        w_replies += fuzz_one(ws[rnd_below(4)], &wseeds,
                              &baton__control_message__descriptor);
        if (i % 200 == 0)
            usleep(2000);
        /* keep the golden stream drained so the client's queue stays
         * small (chunks are applied, nothing is lost) */
        for (;;) {
            Baton__ClientMessage *m = NULL;
            if (client_recv(c, 0, &m) != BT_OK)
                break;
            cu_apply(res, N_GOLDEN, m);
            proto_client_free(&m);
        }
    }
    usleep(300000);
    c_replies += fuzz_one(cs, &cseeds, &baton__client_message__descriptor);
    for (int i = 0; i < 4; i++)
        w_replies += fuzz_one(ws[i], &wseeds,
                              &baton__control_message__descriptor);
    BT_CHECK(access(rlog, R_OK) == 0);
    w_dropped = cu_count_lines(rlog, "control message");
    fprintf(stderr, "   the router answered %d client and %d control "
                    "messages, and logged %d control messages dropped\n",
            c_replies, w_replies, w_dropped);
    BT_CHECK(c_replies > FUZZ_N / 4);
    BT_CHECK(w_replies + w_dropped > FUZZ_N / 4);
    zmq_close(cs);
    for (int i = 0; i < 4; i++)
        zmq_close(ws[i]);
    cu_collect(c, res, N_GOLDEN, 120000);
    check_golden(res, golden, n_golden);

    fprintf(stderr, "2. the router lives; its workers are the real two\n");
    BT_ASSERT_EQ(waitpid(router, &wstatus, WNOHANG), 0);
    cu_wait_workers(c, 1, 1, 20000);

    fprintf(stderr, "3. a second golden batch is exact; KV all free\n");
    submit_golden(c, res, golden, n_golden);
    cu_collect(c, res, N_GOLDEN, 60000);
    check_golden(res, golden, n_golden);
    cu_wait_kv_idle(c, 10000);
    BT_ASSERT_EQ(waitpid(router, &wstatus, WNOHANG), 0);

    client_destroy(&c);
    zmq_ctx_term(ctx);
    cu_kill_all();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", g_dir);
    BT_TEST_PASS("cluster/curve_fuzz: admitted peers' garbage changes no "
                 "token");
    return 0;
}
