/*
 * cli_bench.c - `baton bench`: a load generator for a baton cluster, in
 * the manner of `vllm bench serve`.
 *
 * Sends --requests synthetic requests (random prompt ids; prompt and
 * output lengths fixed, uniform in a range, or from a file of pairs; EOS
 * ignored) either to the router over ZeroMQ (--router) or to baton-http
 * (--http URL: POST /v1/completions, stream: true, prompt as token ids).
 * Arrivals are open loop (--rate R: Poisson, or gamma with --burstiness;
 * --rate inf: all at once), closed loop (--concurrency C in flight), or
 * both (arrivals at R, at most C in flight).  --rates R1,R2,... sweeps.
 * Shared-prefix traffic (prefix caching, issue 38): --shared-prefix-len
 * N starts every prompt with the same N tokens (a system prompt or a
 * shared document); --sessions K makes it multi-turn chat, request i
 * being turn i / K of session i % K, whose prompt is the previous turn's
 * plus --prompt-len more tokens.
 *
 * Per run it reports request and token throughput, goodput, and the
 * mean/p50/p90/p99 of TTFT, TPOT, ITL and E2E (percentiles interpolate
 * linearly, as numpy's do), plus every failed request by error code.
 * --json writes all of it (one object per rate, with one record per
 * request), --plot an SVG of latency against output tokens/s.  The
 * metric definitions are in bench_usage() and docs/BENCH.md.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "cli_bench_http.h"
#include "client.h"

#define BENCH_BUCKET_NS 10000000ull /* token-arrival histogram: 10 ms */
#define BENCH_MAX_CODES 32          /* distinct error codes counted */
#define BENCH_FIRST_ERRORS 5        /* error messages kept */
#define BENCH_MAX_LEN (1 << 20)     /* a prompt or output length bound */
#define BENCH_WORD_MAX 4            /* --text: bytes a prompt id becomes */
#define BENCH_MAX_RATES 64          /* --rates entries */

enum { BR_IDLE, BR_FLIGHT, BR_DONE, BR_FAILED };

typedef struct {
    uint64_t t_sched;   /* arrival time the process drew (ns, absolute) */
    uint64_t t_sent;    /* when it was sent */
    uint64_t t_first;   /* first token (0: none yet) */
    uint64_t t_last;    /* latest token */
    uint64_t t_done;    /* finished or failed */
    int plen;           /* prompt tokens sent */
    int olen;           /* max_tokens asked */
    int n_counted;      /* tokens counted from chunks (ZMQ ids, HTTP events) */
    int n_out;          /* output tokens: the server's usage, else counted */
    int n_prompt_usage; /* prompt tokens the server reported (-1: none) */
    int retries;        /* ZeroMQ: re-prefills after worker failures */
    int preemptions;    /* ZeroMQ: times a decode worker gave it back
                           (KV short past its promise); -1: not told */
    int state;          /* BR_* */
    int code;           /* index into the error codes when failed */
    uint64_t rid;       /* ZeroMQ request id */
    int slot;           /* HTTP connection slot (-1: none) */
    bool retried;       /* HTTP: re-sent once after a stale keep-alive */
    uint64_t prompt_fnv; /* bt_fnv1a64 of the prompt ids (the JSON's
                            prompt_fnv: which runs repeated a prompt) */
} bench_req_t;

typedef struct {
    cli_http_t *h;      /* the connection (NULL: none) */
    int req;            /* the request on it (-1: idle) */
    bool reused;        /* it carried an earlier request */
} bench_slot_t;

typedef struct {
    char code[64];      /* e.g. "timeout", "overloaded", "http_503:no_workers" */
    int count;          /* failed requests with it */
} bench_code_t;

typedef struct {
    int req;            /* request index */
    int code;           /* index into codes */
    char msg[200];      /* what the server or the transport said */
} bench_first_t;

/* One number's summary. */
typedef struct {
    double mean, p50, p90, p99, min, max;
    int n;
} bench_dist_t;

/* A finished run at one rate (what the report, JSON and plot need). */
typedef struct {
    double rate;        /* 0: closed loop; INFINITY: all at once */
    int n;              /* requests */
    int completed;
    int failed;
    int good;
    double duration_s;
    long in_tokens;     /* prompt tokens of completed requests */
    long out_tokens;    /* output tokens of completed requests */
    long out_asked;     /* max_tokens of completed requests */
    long retries;       /* over completed requests (-1: not told, HTTP) */
    long preemptions;
    int preempted;      /* completed requests given back at least once */
    double tok_s_mid;
    bench_dist_t ttft, tpot, itl, e2e;
} bench_result_t;

/* The stream state of one HTTP connection slot. */
typedef struct {
    struct bench_s *b;  /* the bench */
    int req;            /* the request */
    int usage_out;      /* usage.completion_tokens (-1: none) */
    int usage_prompt;   /* usage.prompt_tokens (-1: none) */
    bool error;         /* an error event came in the stream */
    char code[64];      /* its code */
    char msg[200];      /* its message */
} sse_ctx_t;

typedef struct bench_s {
    /* configuration */
    const char *router;     /* ZeroMQ endpoint, or NULL */
    const char *http;       /* baton-http URL, or NULL */
    const char *model;      /* "model" field over HTTP (NULL: none) */
    int n_req;
    int conc;               /* 0: no cap */
    double rates[BENCH_MAX_RATES]; /* 0 = closed loop */
    int n_rates;
    bool sweep;             /* --rates: JSON is an array */
    double burstiness;      /* gamma shape; 1 = Poisson */
    int plen_min, plen_max, olen_min, olen_max;
    int *file_len;          /* (n_file, 2) prompt, output pairs */
    int n_file;
    double slo_ttft, slo_tpot;
    int vocab, seed, warmup, timeout_ms;
    int shared_len;         /* --shared-prefix-len: tokens every prompt
                               starts with (0: none) */
    int sessions;           /* --sessions: multi-turn sessions (0: none) */
    bool ignore_eos, progress;
    const char *precision;  /* --precision: the class asked (NULL: any) */
    /* transports */
    client_t *client;
    cli_http_url_t url;
    bench_slot_t *slots;
    int n_slots;
    sse_ctx_t *sse;         /* (n_slots) stream state per slot */
    struct pollfd *pfds;
    int *pfd_slot;
    uint64_t *rid_keys;     /* (rid_cap) open-addressing map rid -> req */
    int *rid_vals;
    int rid_cap;
    /* the run under way */
    bench_req_t *reqs;
    int n;
    int sent, done, in_flight, n_failed;
    const char *phase;      /* progress-line label */
    double rate;
    uint64_t t0, t_end;
    double *itl;
    int n_itl, cap_itl;
    int *bucket, cap_bucket;
    bench_code_t codes[BENCH_MAX_CODES];
    int n_codes;
    bench_first_t first[BENCH_FIRST_ERRORS];
    int n_first;
    int *prompt;            /* scratch ids */
    bool text;              /* --text: prompts go as text */
    char *text_buf;         /* (max prompt len * BENCH_WORD_MAX) scratch */
    char *body;             /* scratch HTTP body */
    size_t body_cap;
    uint64_t rng_len, rng_arrival, rng_prompt;
    /* runs begun (the warm-up, then each rate): a run's prompts are its
     * own, or a later run would find an earlier one's in the workers'
     * prefix caches and skip their prefill (a sweep read TTFT 17 ms for
     * 2048-token prompts that take 48 ms to prefill) */
    uint64_t run;
    uint64_t t_progress;
    bool oom;
} bench_t;

// ---------------------------------------------------------------------------
// Random numbers (xorshift64; per-purpose streams so that a sweep's rates
// see the same lengths and arrival pattern; prompts are each run's own)

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in (0, 1]. */
static double rng_u01(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 1.0) / 9007199254740992.0;
}

static double rng_normal(uint64_t *s)
{
    return sqrt(-2.0 * log(rng_u01(s))) * cos(2.0 * M_PI * rng_u01(s));
}

/* Gamma(k, 1) (Marsaglia-Tsang; k < 1 by the boost k+1, U^(1/k)). */
static double rng_gamma(uint64_t *s, double k)
{
    double d, c;

    if (k < 1.0)
        return rng_gamma(s, k + 1.0) * pow(rng_u01(s), 1.0 / k);
    d = k - 1.0 / 3.0;
    c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(s), v = 1.0 + c * x, u;
        if (v <= 0)
            continue;
        v = v * v * v;
        u = rng_u01(s);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v;
    }
}

/* The next inter-arrival gap in ns: exponential with mean 1/rate when
 * burstiness is 1 (Poisson), else gamma with shape burstiness and the
 * same mean (lower = burstier, as in vLLM). */
static uint64_t next_gap_ns(bench_t *b)
{
    double g;

    if (isinf(b->rate))
        return 0;
    if (b->burstiness == 1.0)
        g = -log(rng_u01(&b->rng_arrival)) / b->rate;
    else
        g = rng_gamma(&b->rng_arrival, b->burstiness) /
            (b->rate * b->burstiness);
    return (uint64_t)(g * 1e9);
}

// ---------------------------------------------------------------------------
// Statistics

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and summarises it; percentiles interpolate linearly between
 * order statistics (numpy's default, what vllm bench serve reports). */
static bench_dist_t dist_of(double *v, int n)
{
    bench_dist_t d;
    double sum = 0;
    double ps[3] = { 50, 90, 99 }, out[3];

    memset(&d, 0, sizeof(d));
    d.n = n;
    if (n == 0)
        return d;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    for (int i = 0; i < n; i++)
        sum += v[i];
    for (int k = 0; k < 3; k++) {
        double pos = ps[k] / 100.0 * (n - 1);
        int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
        out[k] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    d.mean = sum / n;
    d.p50 = out[0];
    d.p90 = out[1];
    d.p99 = out[2];
    d.min = v[0];
    d.max = v[n - 1];
    return d;
}

static double ms(uint64_t a, uint64_t b)
{
    return ((double)b - (double)a) / 1e6;
}

/* TPOT of a completed request: (e2e - ttft) / (output tokens - 1), as
 * vLLM defines it; -1 when it has fewer than 2 tokens. */
static double req_tpot(const bench_req_t *r)
{
    if (r->n_out < 2 || r->t_first == 0)
        return -1;
    return ms(r->t_first, r->t_done) / (r->n_out - 1);
}

// ---------------------------------------------------------------------------
// Request bookkeeping

static int code_index(bench_t *b, const char *code)
{
    for (int i = 0; i < b->n_codes; i++)
        if (strcmp(b->codes[i].code, code) == 0)
            return i;
    if (b->n_codes == BENCH_MAX_CODES)
        code = "other";
    for (int i = 0; i < b->n_codes; i++)
        if (strcmp(b->codes[i].code, code) == 0)
            return i;
    if (b->n_codes == BENCH_MAX_CODES)
        return BENCH_MAX_CODES - 1;
    snprintf(b->codes[b->n_codes].code, sizeof(b->codes[0].code), "%s", code);
    return b->n_codes++;
}

static void req_fail(bench_t *b, int i, const char *code, const char *msg)
{
    bench_req_t *r = &b->reqs[i];
    int c = code_index(b, code);

    if (r->state != BR_FLIGHT)
        return;
    r->state = BR_FAILED;
    r->code = c;
    r->t_done = bt_time_ns();
    b->codes[c].count++;
    if (b->n_first < BENCH_FIRST_ERRORS) {
        bench_first_t *f = &b->first[b->n_first++];
        f->req = i;
        f->code = c;
        snprintf(f->msg, sizeof(f->msg), "%s", msg ? msg : "");
    }
    b->done++;
    b->in_flight--;
    b->n_failed++;
}

/* Counts n output tokens that arrived at t in the 10 ms histogram. */
static void bucket_add(bench_t *b, uint64_t t, int n)
{
    uint64_t k = (t - b->t0) / BENCH_BUCKET_NS;

    if (k >= (uint64_t)b->cap_bucket) {
        int cap = (int)BT_MAX(k + 1, 2 * (uint64_t)b->cap_bucket);
        int *nb = bt_realloc(b->bucket, (size_t)cap * sizeof(int), "bench");
        if (nb == NULL) {
            b->oom = true;
            return;
        }
        memset(nb + b->cap_bucket, 0,
               (size_t)(cap - b->cap_bucket) * sizeof(int));
        b->bucket = nb;
        b->cap_bucket = cap;
    }
    b->bucket[k] += n;
}

static void req_token(bench_t *b, int i, int n_ids, uint64_t t)
{
    bench_req_t *r = &b->reqs[i];

    if (r->t_first == 0) {
        r->t_first = t;
    } else {
        if (b->n_itl == b->cap_itl) {
            int cap = b->cap_itl ? b->cap_itl * 2 : 4096;
            double *n = bt_realloc(b->itl, (size_t)cap * sizeof(double),
                                   "bench");
            if (n == NULL) {
                b->oom = true;
                return;
            }
            b->itl = n;
            b->cap_itl = cap;
        }
        b->itl[b->n_itl++] = ms(r->t_last, t);
    }
    r->t_last = t;
    r->n_counted += n_ids;
    bucket_add(b, t, n_ids);
}

/* usage_out/usage_prompt: the server's counts, -1 when it sent none. */
static void req_done(bench_t *b, int i, int usage_out, int usage_prompt)
{
    bench_req_t *r = &b->reqs[i];

    if (r->state != BR_FLIGHT)
        return;
    r->t_done = bt_time_ns();
    if (r->t_first == 0) /* no token event before the end (null text) */
        r->t_first = r->t_last = r->t_done;
    r->n_out = usage_out >= 0 ? usage_out : r->n_counted;
    if (r->n_out > r->n_counted) /* tokens without an event of their own
                                  * (HTTP: empty text): count them at the
                                  * end for tok_s_mid */
        bucket_add(b, r->t_done, r->n_out - r->n_counted);
    r->n_prompt_usage = usage_prompt;
    r->state = BR_DONE;
    b->done++;
    b->in_flight--;
}

/* The lengths of request i (deterministic in the seed and i). */
static void req_lengths(bench_t *b, int i, int *plen_p, int *olen_p)
{
    if (b->n_file > 0) {
        *plen_p = b->file_len[2 * (i % b->n_file)];
        *olen_p = b->file_len[2 * (i % b->n_file) + 1];
        return;
    }
    *plen_p = b->plen_min + (int)(rng_next(&b->rng_len) %
                                  (uint64_t)(b->plen_max - b->plen_min + 1));
    *olen_p = b->olen_min + (int)(rng_next(&b->rng_len) %
                                  (uint64_t)(b->olen_max - b->olen_min + 1));
}

/* A prompt id that depends only on the seed, the stream (a session of a
 * run, or the shared prefix) and the position: so one session's prompts
 * are prefixes of each other's, and every prompt's first shared_len ids
 * are equal (in every run: one system prompt or document for the whole
 * bench; sessions are new each run). */
static int prompt_id_at(const bench_t *b, uint64_t stream, int k)
{
    uint64_t x = (uint64_t)b->seed * 0x9e3779b97f4a7c15ull ^
                 (stream + 1) * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)k * 0x94d049bb133111ebull;

    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return 3 + (int)(x % (uint64_t)(b->vocab - 3));
}

/* Request i's prompt of plen ids into b->prompt: token 1, the shared
 * prefix, then its session's history or random ids. */
static void make_prompt(bench_t *b, int i, int plen)
{
    b->prompt[0] = 1;
    for (int k = 1; k < plen; k++) {
        if (k < b->shared_len)
            b->prompt[k] = prompt_id_at(b, UINT64_MAX - 1, k);
        else if (b->sessions > 0)
            b->prompt[k] = prompt_id_at(
                b, (uint64_t)(i % b->sessions) + (b->run << 32), k);
        else
            b->prompt[k] = 3 + (int)(rng_next(&b->rng_prompt) %
                                     (uint64_t)(b->vocab - 3));
    }
    b->reqs[i].prompt_fnv = bt_fnv1a64(b->prompt, sizeof(int) * (size_t)plen);
}

/* The prompt length of request i whose own part is plen tokens: the
 * shared prefix plus one part per turn of its session so far. */
static int workload_plen(const bench_t *b, int i, int plen)
{
    int turns = b->sessions > 0 ? i / b->sessions + 1 : 1;

    return (int)BT_MIN((int64_t)b->shared_len + (int64_t)plen * turns,
                       (int64_t)BENCH_MAX_LEN);
}

// ---------------------------------------------------------------------------
// ZeroMQ transport

static void rid_put(bench_t *b, uint64_t rid, int i)
{
    int k = (int)(rid * 0x9e3779b97f4a7c15ull >> 40) & (b->rid_cap - 1);

    while (b->rid_keys[k] != 0 && b->rid_keys[k] != rid)
        k = (k + 1) & (b->rid_cap - 1);
    b->rid_keys[k] = rid;
    b->rid_vals[k] = i;
}

static int rid_get(const bench_t *b, uint64_t rid)
{
    int k = (int)(rid * 0x9e3779b97f4a7c15ull >> 40) & (b->rid_cap - 1);

    if (rid == 0)
        return -1;
    while (b->rid_keys[k] != 0) {
        if (b->rid_keys[k] == rid)
            return b->rid_vals[k];
        k = (k + 1) & (b->rid_cap - 1);
    }
    return -1;
}

/* --text: ids[1..n) as text, each a space and two letters (26 * 26
 * words; the leading 1 is the BOS the worker adds), so prompts that
 * share ids share a text prefix.  The worker's tokens are not the ids. */
static const char *prompt_text(bench_t *b, const int *ids, int n)
{
    char *p = b->text_buf;

    for (int k = 1; k < n; k++) {
        *p++ = ' ';
        *p++ = (char)('a' + ids[k] % 26);
        *p++ = (char)('a' + ids[k] / 26 % 26);
    }
    *p = '\0';
    return b->text_buf;
}

static void zmq_submit(bench_t *b, int i)
{
    bench_req_t *r = &b->reqs[i];
    client_request_t req;

    client_request_init(&req);
    make_prompt(b, i, r->plen);
    if (b->text) {
        req.prompt = prompt_text(b, b->prompt, r->plen);
    } else {
        req.prompt_ids = b->prompt;
        req.n_prompt_ids = r->plen;
    }
    req.max_tokens = r->olen;
    req.ignore_eos = b->ignore_eos;
    req.want_text = false;
    req.precision = b->precision;
    if (client_submit(b->client, &req, &r->rid) != BT_OK) {
        req_fail(b, i, "submit", bt_error_last());
        return;
    }
    rid_put(b, r->rid, i);
}

static void zmq_handle(bench_t *b, Baton__ClientMessage *m)
{
    int i = rid_get(b, client_msg_request_id(m));
    bench_req_t *r;

    if (i < 0)
        return; /* a late message of an earlier run, or a status reply */
    r = &b->reqs[i];
    if (r->state != BR_FLIGHT)
        return;
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
        if (m->chunk->n_ids > 0)
            req_token(b, i, (int)m->chunk->n_ids, bt_time_ns());
    } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
        const Baton__Usage *u = m->finished->usage;
        if (m->finished->reason == BATON__FINISH_REASON__FINISH_CANCELLED) {
            req_fail(b, i, "cancelled", "the server cancelled it");
            return;
        }
        const Baton__Timings *t = m->finished->timings;
        if (t != NULL && t->has_preemptions) {
            r->preemptions = (int)t->preemptions;
            r->retries = t->has_retries ? (int)t->retries : 0;
        }
        req_done(b, i,
                 u && u->has_completion_tokens ? (int)u->completion_tokens
                                               : -1,
                 u && u->has_prompt_tokens ? (int)u->prompt_tokens : -1);
    } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
        req_fail(b, i, client_error_name(m->error->code),
                 m->error->message ? m->error->message : "");
    }
}

static void zmq_poll(bench_t *b, int wait_ms)
{
    Baton__ClientMessage *m = NULL;

    /* one wait, then drain what is queued (bounded, to keep sending) */
    for (int k = 0; k < 4096; k++) {
        if (client_recv(b->client, k == 0 ? wait_ms : 0, &m) != BT_OK)
            break;
        zmq_handle(b, m);
        proto_client_free(&m);
    }
}

// ---------------------------------------------------------------------------
// HTTP transport (baton-http, OpenAI /v1/completions with SSE)


/* One SSE event of a completion stream. */
static void on_sse(void *arg, const char *data, size_t len)
{
    sse_ctx_t *c = arg;
    cJSON *j, *ch, *u, *e;

    if (len == 6 && memcmp(data, "[DONE]", 6) == 0)
        return;
    j = cJSON_ParseWithLength(data, len);
    if (j == NULL) {
        if (!c->error) {
            c->error = true;
            snprintf(c->code, sizeof(c->code), "bad_event");
            snprintf(c->msg, sizeof(c->msg), "SSE event is not JSON: %.120s",
                     data);
        }
        return;
    }
    e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e) && !c->error) {
        cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
        c->error = true;
        snprintf(c->code, sizeof(c->code), "stream:%s",
                 cJSON_IsString(code) ? code->valuestring : "error");
        snprintf(c->msg, sizeof(c->msg), "%s",
                 cJSON_IsString(msg) ? msg->valuestring : "");
    }
    ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    if (cJSON_IsArray(ch) && cJSON_GetArraySize(ch) > 0) {
        cJSON *c0 = cJSON_GetArrayItem(ch, 0);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(c0, "text");
        cJSON *d = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        if (cJSON_IsObject(d))
            t = cJSON_GetObjectItemCaseSensitive(d, "content");
        /* an event with text is a token event (the last, finish_reason
         * event carries none) */
        if (cJSON_IsString(t) && t->valuestring[0] != '\0')
            req_token(c->b, c->req, 1, bt_time_ns());
    }
    u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        if (cJSON_IsNumber(ct))
            c->usage_out = ct->valueint;
        if (cJSON_IsNumber(pt))
            c->usage_prompt = pt->valueint;
    }
    cJSON_Delete(j);
}

/* The request body for request i into b->body. */
static bool http_body(bench_t *b, int i, size_t *len_p)
{
    bench_req_t *r = &b->reqs[i];
    size_t need = (size_t)r->plen * 12 + 512, n = 0;
    client_request_t defaults;
    int w;

    client_request_init(&defaults);
    if (need > b->body_cap) {
        char *nb = bt_realloc(b->body, need, "bench");
        if (nb == NULL)
            return false;
        b->body = nb;
        b->body_cap = need;
    }
    make_prompt(b, i, r->plen);
    w = snprintf(b->body, b->body_cap, "{");
    n += (size_t)w;
    if (b->model != NULL) {
        cJSON *s = cJSON_CreateString(b->model);
        char *q = s ? cJSON_PrintUnformatted(s) : NULL;
        if (q == NULL || strlen(q) > 300) {
            cJSON_Delete(s);
            cJSON_free(q);
            return false;
        }
        n += (size_t)snprintf(b->body + n, b->body_cap - n, "\"model\":%s,",
                              q);
        cJSON_free(q);
        cJSON_Delete(s);
    }
    if (b->precision != NULL) /* a class name: nothing to escape */
        n += (size_t)snprintf(b->body + n, b->body_cap - n,
                              "\"precision\":\"%s\",", b->precision);
    n += (size_t)snprintf(b->body + n, b->body_cap - n, "\"prompt\":[");
    for (int k = 0; k < r->plen; k++)
        n += (size_t)snprintf(b->body + n, b->body_cap - n, "%s%d",
                              k ? "," : "", b->prompt[k]);
    n += (size_t)snprintf(b->body + n, b->body_cap - n,
                          "],\"max_tokens\":%d,\"ignore_eos\":%s,"
                          "\"temperature\":%g,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}",
                          r->olen, b->ignore_eos ? "true" : "false",
                          (double)defaults.temperature);
    *len_p = n;
    return n < b->body_cap;
}

static sse_ctx_t *sse_ctx_of(bench_t *b, int slot)
{
    return &b->sse[slot];
}

/* A slot for a new request: an idle reusable connection, else a new
 * one.  -1 when no socket can be made. */
static int http_slot(bench_t *b, bool fresh)
{
    int free_slot = -1;
    cli_http_t *h = NULL;

    for (int s = 0; s < b->n_slots; s++) {
        if (b->slots[s].req >= 0)
            continue;
        if (!fresh && b->slots[s].h != NULL &&
            cli_http_is_reusable(b->slots[s].h)) {
            b->slots[s].reused = true;
            return s;
        }
        if (free_slot < 0 && b->slots[s].h == NULL)
            free_slot = s;
    }
    if (free_slot < 0) {
        /* close an idle connection or grow */
        for (int s = 0; s < b->n_slots && free_slot < 0; s++)
            if (b->slots[s].req < 0) {
                cli_http_destroy(&b->slots[s].h);
                free_slot = s;
            }
    }
    if (free_slot < 0) {
        int cap = b->n_slots ? b->n_slots * 2 : 64;
        bench_slot_t *ns = bt_realloc(b->slots, (size_t)cap * sizeof(*ns),
                                      "bench");
        struct pollfd *np;
        int *nps;
        sse_ctx_t *nc;
        if (ns == NULL)
            return -1;
        b->slots = ns;
        np = bt_realloc(b->pfds, (size_t)cap * sizeof(*np), "bench");
        if (np == NULL)
            return -1;
        b->pfds = np;
        nps = bt_realloc(b->pfd_slot, (size_t)cap * sizeof(*nps), "bench");
        if (nps == NULL)
            return -1;
        b->pfd_slot = nps;
        nc = bt_realloc(b->sse, (size_t)cap * sizeof(*nc), "bench");
        if (nc == NULL)
            return -1;
        b->sse = nc;
        for (int s = b->n_slots; s < cap; s++) {
            b->slots[s].h = NULL;
            b->slots[s].req = -1;
            b->slots[s].reused = false;
        }
        free_slot = b->n_slots;
        b->n_slots = cap;
    }
    if (cli_http_create(&b->url, &h) != BT_OK)
        return -1;
    b->slots[free_slot].h = h;
    b->slots[free_slot].reused = false;
    return free_slot;
}

static void http_submit(bench_t *b, int i, bool fresh)
{
    bench_req_t *r = &b->reqs[i];
    size_t len;
    int s;
    sse_ctx_t *c;

    if (!http_body(b, i, &len)) {
        req_fail(b, i, "client", "cannot build the request body");
        return;
    }
    s = http_slot(b, fresh);
    if (s < 0) {
        req_fail(b, i, "connect", bt_error_last());
        return;
    }
    if (cli_http_post(b->slots[s].h, b->body, len) != BT_OK) {
        req_fail(b, i, "connect", cli_http_error(b->slots[s].h));
        cli_http_destroy(&b->slots[s].h);
        return;
    }
    b->slots[s].req = i;
    r->slot = s;
    c = sse_ctx_of(b, s);
    memset(c, 0, sizeof(*c));
    c->b = b;
    c->req = i;
    c->usage_out = c->usage_prompt = -1;
}

/* A response finished (status BT_OK) or its connection failed. */
static void http_end(bench_t *b, int s, bt_status_t status)
{
    bench_slot_t *sl = &b->slots[s];
    sse_ctx_t *c = sse_ctx_of(b, s);
    int i = sl->req, code = cli_http_status(sl->h);
    char cbuf[96];

    sl->req = -1;
    b->reqs[i].slot = -1;
    if (status != BT_OK) {
        if (sl->reused && !cli_http_got_bytes(sl->h) && !b->reqs[i].retried) {
            /* a keep-alive the server had closed: once more, fresh */
            cli_http_destroy(&sl->h);
            b->reqs[i].retried = true;
            http_submit(b, i, true);
            return;
        }
        req_fail(b, i, status == BT_ERR_FORMAT ? "http_protocol"
                       : cli_http_got_bytes(sl->h) ? "http_closed"
                                                   : "http_connect",
                 cli_http_error(sl->h));
        cli_http_destroy(&sl->h);
        return;
    }
    if (code != 200) {
        cJSON *j = cJSON_Parse(cli_http_body(sl->h));
        cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
        cJSON *ec = e ? cJSON_GetObjectItemCaseSensitive(e, "code") : NULL;
        cJSON *em = e ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
        snprintf(cbuf, sizeof(cbuf), "http_%d%s%s", code,
                 cJSON_IsString(ec) ? ":" : "",
                 cJSON_IsString(ec) ? ec->valuestring : "");
        req_fail(b, i, cbuf, cJSON_IsString(em) ? em->valuestring
                                                : cli_http_body(sl->h));
        cJSON_Delete(j);
    } else if (c->error) {
        req_fail(b, i, c->code, c->msg);
    } else {
        req_done(b, i, c->usage_out, c->usage_prompt);
    }
    if (!cli_http_is_reusable(sl->h))
        cli_http_destroy(&sl->h);
}

static void http_poll(bench_t *b, int wait_ms)
{
    int n = 0;

    for (int s = 0; s < b->n_slots; s++) {
        if (b->slots[s].req < 0)
            continue;
        b->pfds[n].fd = cli_http_fd(b->slots[s].h);
        b->pfds[n].events = cli_http_poll_events(b->slots[s].h);
        b->pfds[n].revents = 0;
        b->pfd_slot[n++] = s;
    }
    if (n == 0) {
        if (wait_ms > 0)
            usleep((useconds_t)wait_ms * 1000);
        return;
    }
    if (poll(b->pfds, (nfds_t)n, wait_ms) <= 0)
        return;
    for (int k = 0; k < n; k++) {
        int s = b->pfd_slot[k];
        bt_status_t status;
        if (b->pfds[k].revents == 0 || b->slots[s].req < 0)
            continue;
        status = cli_http_io(b->slots[s].h, on_sse, sse_ctx_of(b, s));
        if (status != BT_IN_PROGRESS)
            http_end(b, s, status);
    }
}

/* Gives up on request i (timeout): the server sees a cancel or a close. */
static void transport_cancel(bench_t *b, int i)
{
    bench_req_t *r = &b->reqs[i];

    if (b->client != NULL) {
        client_cancel(b->client, r->rid);
    } else if (r->slot >= 0) {
        b->slots[r->slot].req = -1;
        cli_http_destroy(&b->slots[r->slot].h);
        r->slot = -1;
    }
}

// ---------------------------------------------------------------------------
// One run

static void progress(bench_t *b, bool final)
{
    uint64_t now = bt_time_ns();

    if (!b->progress)
        return;
    if (final) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
        return;
    }
    if (now - b->t_progress < 200000000ull)
        return;
    b->t_progress = now;
    fprintf(stderr, "\r\033[K%s: sent %d/%d  done %d  failed %d  "
            "in flight %d  %.1f s", b->phase, b->sent, b->n, b->done,
            b->n_failed, b->in_flight, (double)(now - b->t0) / 1e9);
    fflush(stderr);
}

/* Runs n requests at rate (0: closed loop) with at most conc in flight
 * (0: no cap) into b->reqs.  Every request ends completed or failed:
 * one still in flight timeout_ms after it was sent is cancelled and
 * counted as failed ("timeout").  false when memory ran out. */
static bool bench_run(bench_t *b, int n, double rate, int conc)
{
    uint64_t next_arrival, t_scan = 0;
    uint64_t timeout_ns = (uint64_t)b->timeout_ms * 1000000ull;

    memset(b->reqs, 0, (size_t)n * sizeof(*b->reqs));
    if (b->rid_keys)
        memset(b->rid_keys, 0, (size_t)b->rid_cap * sizeof(uint64_t));
    b->n = n;
    b->rate = rate;
    b->sent = b->done = b->in_flight = b->n_failed = 0;
    b->n_itl = 0;
    if (b->bucket)
        memset(b->bucket, 0, (size_t)b->cap_bucket * sizeof(int));
    b->n_codes = b->n_first = 0;
    memset(b->codes, 0, sizeof(b->codes));
    b->rng_len = (uint64_t)b->seed * 0x9e3779b97f4a7c15ull + 1;
    b->rng_prompt = (uint64_t)b->seed * 0xbf58476d1ce4e5b9ull + 7 +
                    b->run * 0x2545f4914f6cdd1dull;
    b->run++;
    b->rng_arrival = (uint64_t)b->seed * 0x94d049bb133111ebull + 13;
    for (int i = 0; i < n; i++) {
        req_lengths(b, i, &b->reqs[i].plen, &b->reqs[i].olen);
        b->reqs[i].plen = workload_plen(b, i, b->reqs[i].plen);
        b->reqs[i].slot = -1;
        b->reqs[i].n_prompt_usage = -1;
        b->reqs[i].preemptions = -1;
    }
    b->t0 = bt_time_ns();
    b->t_progress = 0;
    next_arrival = b->t0;
    while (b->done < n && !b->oom) {
        uint64_t now = bt_time_ns();
        int wait_ms = 100;

        while (b->sent < n && (conc <= 0 || b->in_flight < conc) &&
               (rate <= 0 || now >= next_arrival)) {
            int i = b->sent++;
            bench_req_t *r = &b->reqs[i];
            r->t_sched = rate > 0 ? next_arrival : now;
            r->t_sent = bt_time_ns();
            r->state = BR_FLIGHT;
            b->in_flight++;
            if (b->client != NULL)
                zmq_submit(b, i);
            else
                http_submit(b, i, false);
            if (rate > 0)
                next_arrival += next_gap_ns(b);
            now = bt_time_ns();
        }
        if (rate > 0 && b->sent < n &&
            (conc <= 0 || b->in_flight < conc)) {
            int64_t ahead = (int64_t)next_arrival - (int64_t)bt_time_ns();
            wait_ms = ahead <= 0 ? 0 : (int)BT_MIN(ahead / 1000000, 100);
        }
        if (b->progress && wait_ms > 50)
            wait_ms = 50;
        if (b->client != NULL)
            zmq_poll(b, wait_ms);
        else
            http_poll(b, wait_ms);
        now = bt_time_ns();
        if (now - t_scan > 20000000ull) { /* time-outs, every 20 ms */
            t_scan = now;
            for (int i = 0; i < b->sent; i++) {
                bench_req_t *r = &b->reqs[i];
                if (r->state == BR_FLIGHT && now - r->t_sent > timeout_ns) {
                    char msg[96];
                    transport_cancel(b, i);
                    snprintf(msg, sizeof(msg), "no end within --timeout-ms "
                             "%d (%d tokens received)", b->timeout_ms,
                             r->n_counted);
                    req_fail(b, i, "timeout", msg);
                }
            }
        }
        progress(b, false);
    }
    progress(b, true);
    return !b->oom;
}

/* Summarises b's last run. */
static bool bench_summarise(bench_t *b, bench_result_t *res)
{
    double *ttft = bt_malloc((size_t)b->n * sizeof(double), "bench");
    double *tpot = bt_malloc((size_t)b->n * sizeof(double), "bench");
    double *e2e = bt_malloc((size_t)b->n * sizeof(double), "bench");
    int n_ok = 0, n_tpot = 0;
    uint64_t t_end = b->t0;

    memset(res, 0, sizeof(*res));
    if (!ttft || !tpot || !e2e) {
        bt_free(ttft);
        bt_free(tpot);
        bt_free(e2e);
        return false;
    }
    res->rate = b->rate;
    res->n = b->n;
    res->retries = res->preemptions = -1;
    for (int i = 0; i < b->n; i++) {
        bench_req_t *r = &b->reqs[i];
        double tp;
        t_end = BT_MAX(t_end, r->t_done);
        if (r->state != BR_DONE) {
            res->failed++;
            continue;
        }
        res->completed++;
        ttft[n_ok] = ms(r->t_sent, r->t_first);
        e2e[n_ok] = ms(r->t_sent, r->t_done);
        tp = req_tpot(r);
        if (tp >= 0)
            tpot[n_tpot++] = tp;
        res->good += (b->slo_ttft <= 0 || ttft[n_ok] <= b->slo_ttft) &&
                     (b->slo_tpot <= 0 || tp <= b->slo_tpot);
        res->in_tokens += r->plen;
        res->out_tokens += r->n_out;
        res->out_asked += r->olen;
        if (r->preemptions >= 0) {
            res->retries = BT_MAX(res->retries, 0) + r->retries;
            res->preemptions = BT_MAX(res->preemptions, 0) + r->preemptions;
            res->preempted += r->preemptions > 0;
        }
        n_ok++;
    }
    b->t_end = t_end;
    res->duration_s = (double)(t_end - b->t0) / 1e9;
    if (res->duration_s <= 0)
        res->duration_s = 1e-9;
    {
        uint64_t span = t_end - b->t0;
        uint64_t b0 = span / 4 / BENCH_BUCKET_NS;
        uint64_t b1 = 3 * span / 4 / BENCH_BUCKET_NS;
        double mid_s = (double)(b1 - b0) * BENCH_BUCKET_NS / 1e9;
        long mid = 0;
        for (uint64_t k = b0; k < b1 && k < (uint64_t)b->cap_bucket; k++)
            mid += b->bucket[k];
        res->tok_s_mid = mid_s > 0 ? mid / mid_s : 0.0;
    }
    res->ttft = dist_of(ttft, n_ok);
    res->tpot = dist_of(tpot, n_tpot);
    res->e2e = dist_of(e2e, n_ok);
    res->itl = dist_of(b->itl, b->n_itl);
    bt_free(ttft);
    bt_free(tpot);
    bt_free(e2e);
    return true;
}

// ---------------------------------------------------------------------------
// Reports: text, JSON, SVG

static void rate_str(double rate, char *out, size_t cap)
{
    if (rate <= 0)
        snprintf(out, cap, "closed");
    else if (isinf(rate))
        snprintf(out, cap, "inf");
    else
        snprintf(out, cap, "%g", rate);
}

static void print_text(const bench_t *b, const bench_result_t *r)
{
    const bench_dist_t *d[4] = { &r->ttft, &r->tpot, &r->itl, &r->e2e };
    const char *names[4] = { "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms" };
    char rs[32];

    rate_str(r->rate, rs, sizeof(rs));
    printf("rate:%s concurrency:%d burstiness:%g\n", rs, b->conc,
           b->burstiness);
    printf("requests:%d ok:%d errors:%d duration_s:%.3f req_s:%.2f "
           "tok_s:%.1f tok_s_mid:%.1f in_tok_s:%.1f goodput_req_s:%.2f\n",
           r->n, r->completed, r->failed, r->duration_s,
           r->completed / r->duration_s, r->out_tokens / r->duration_s,
           r->tok_s_mid, r->in_tokens / r->duration_s,
           r->good / r->duration_s);
    printf("prompt_tokens:%ld output_tokens:%ld output_tokens_asked:%ld\n",
           r->in_tokens, r->out_tokens, r->out_asked);
    if (r->preemptions > 0 || r->retries > 0)
        printf("given_back:%ld (%d requests) retries:%ld\n",
               r->preemptions, r->preempted, r->retries);
    for (int k = 0; k < 4; k++)
        printf("%s mean:%.3f p50:%.3f p90:%.3f p99:%.3f\n", names[k],
               d[k]->mean, d[k]->p50, d[k]->p90, d[k]->p99);
    if (r->failed > 0) {
        printf("failed:%d by code:", r->failed);
        for (int c = 0; c < b->n_codes; c++)
            printf(" %s=%d", b->codes[c].code, b->codes[c].count);
        printf("\n");
        for (int k = 0; k < b->n_first; k++) {
            const char *code = b->codes[b->first[k].code].code;
            const char *msg = b->first[k].msg;
            size_t n = strlen(code);

            if (strncmp(msg, code, n) == 0 && strncmp(msg + n, ": ", 2) == 0)
                msg += n + 2; /* the router's text names its code too */
            printf("  request %d: %s: %s\n", b->first[k].req, code, msg);
        }
        for (int c = 0; c < b->n_codes; c++)
            if (strcmp(b->codes[c].code, "overloaded") == 0 ||
                strncmp(b->codes[c].code, "http_429", 8) == 0) {
                printf("  note: the router refused or shed these as "
                       "overloaded (its --max-queue, --max-inflight or "
                       "--max-queue-wait-ms bound): more in flight than "
                       "the cluster holds; lower --concurrency or --rate, "
                       "or see docs/BENCH.md\n");
                break;
            }
    }
    fflush(stdout);
}

static void json_dist(FILE *f, const char *name, const bench_dist_t *d)
{
    fprintf(f, ",\"%s\":{\"mean\":%.4f,\"p50\":%.4f,\"p90\":%.4f,"
            "\"p99\":%.4f,\"min\":%.4f,\"max\":%.4f,\"n\":%d}", name,
            d->mean, d->p50, d->p90, d->p99, d->min, d->max, d->n);
}

static void json_str(FILE *f, const char *s)
{
    cJSON *j = cJSON_CreateString(s ? s : "");
    char *q = j ? cJSON_PrintUnformatted(j) : NULL;

    fputs(q ? q : "\"\"", f);
    cJSON_free(q);
    cJSON_Delete(j);
}

/* One run as a JSON object (fields documented in docs/BENCH.md). */
static void print_json(FILE *f, const bench_t *b, const bench_result_t *r)
{
    double sum_plen = 0, sum_olen = 0;

    for (int i = 0; i < b->n; i++) {
        sum_plen += b->reqs[i].plen;
        sum_olen += b->reqs[i].olen;
    }
    fprintf(f, "{\"schema\":\"baton-bench-2\",\"transport\":\"%s\","
            "\"target\":", b->client ? "zmq" : "http");
    json_str(f, b->client ? b->router : b->http);
    if (r->rate <= 0 || isinf(r->rate))
        fprintf(f, ",\"rate\":%s,\"rate_label\":\"%s\"",
                r->rate <= 0 ? "0" : "null",
                r->rate <= 0 ? "closed" : "inf");
    else
        fprintf(f, ",\"rate\":%.6g,\"rate_label\":\"%g\"", r->rate, r->rate);
    fprintf(f, ",\"burstiness\":%g,\"concurrency\":%d,\"requests\":%d,"
            "\"warmup\":%d,\"completed\":%d,\"failed\":%d,\"ok\":%d,"
            "\"errors\":%d,\"duration_s\":%.6f,\"req_per_s\":%.4f,"
            "\"tok_per_s\":%.3f,\"tok_per_s_mid\":%.3f,"
            "\"input_tok_per_s\":%.3f,\"total_tok_per_s\":%.3f,"
            "\"goodput_req_per_s\":%.4f,\"good\":%d,"
            "\"slo_ttft_ms\":%.3f,\"slo_tpot_ms\":%.3f,"
            "\"prompt_tokens\":%ld,\"output_tokens\":%ld,"
            "\"output_tokens_asked\":%ld,\"ignore_eos\":%s,"
            "\"shared_prefix_len\":%d,\"sessions\":%d,\"precision\":\"%s\",",
            b->burstiness, b->conc, r->n, b->warmup, r->completed, r->failed,
            r->completed, r->failed, r->duration_s,
            r->completed / r->duration_s, r->out_tokens / r->duration_s,
            r->tok_s_mid, r->in_tokens / r->duration_s,
            (r->in_tokens + r->out_tokens) / r->duration_s,
            r->good / r->duration_s, r->good, b->slo_ttft, b->slo_tpot,
            r->in_tokens, r->out_tokens, r->out_asked,
            b->ignore_eos ? "true" : "false", b->shared_len, b->sessions,
            b->precision != NULL ? b->precision : "");
    /* ZeroMQ: what Finished.timings says; HTTP does not tell: null */
    if (r->preemptions >= 0)
        fprintf(f, "\"retries\":%ld,\"preemptions\":%ld,"
                "\"preempted_requests\":%d,", r->retries, r->preemptions,
                r->preempted);
    else
        fprintf(f, "\"retries\":null,\"preemptions\":null,"
                "\"preempted_requests\":null,");
    if (b->n_file > 0)
        fprintf(f, "\"lengths\":\"file\",");
    else if (b->plen_min == b->plen_max && b->olen_min == b->olen_max)
        fprintf(f, "\"lengths\":\"fixed\",");
    else
        fprintf(f, "\"lengths\":\"uniform\",");
    /* prompt_len/output_len: the mean asked (the fixed value when fixed) */
    fprintf(f, "\"prompt_len\":%.6g,\"output_len\":%.6g,"
            "\"prompt_len_min\":%d,\"prompt_len_max\":%d,"
            "\"output_len_min\":%d,\"output_len_max\":%d",
            b->n ? sum_plen / b->n : 0, b->n ? sum_olen / b->n : 0,
            b->plen_min, b->plen_max, b->olen_min, b->olen_max);
    json_dist(f, "ttft_ms", &r->ttft);
    json_dist(f, "tpot_ms", &r->tpot);
    json_dist(f, "itl_ms", &r->itl);
    json_dist(f, "e2e_ms", &r->e2e);
    fprintf(f, ",\"errors_by_code\":{");
    for (int c = 0, first = 1; c < b->n_codes; c++) {
        if (b->codes[c].count == 0)
            continue;
        fprintf(f, "%s", first ? "" : ",");
        json_str(f, b->codes[c].code);
        fprintf(f, ":%d", b->codes[c].count);
        first = 0;
    }
    fprintf(f, "},\"first_errors\":[");
    for (int k = 0; k < b->n_first; k++) {
        fprintf(f, "%s{\"request\":%d,\"code\":", k ? "," : "",
                b->first[k].req);
        json_str(f, b->codes[b->first[k].code].code);
        fprintf(f, ",\"message\":");
        json_str(f, b->first[k].msg);
        fprintf(f, "}");
    }
    fprintf(f, "],\"per_request\":[");
    for (int i = 0; i < b->n; i++) {
        const bench_req_t *q = &b->reqs[i];
        bool ok = q->state == BR_DONE;
        double tp = ok ? req_tpot(q) : -1;
        fprintf(f, "%s\n{\"i\":%d,\"sched_ms\":%.4f,\"send_ms\":%.4f,"
                "\"prompt_tokens\":%d,\"prompt_fnv\":\"%016llx\","
                "\"max_tokens\":%d,\"ok\":%s",
                i ? "," : "", i, ms(b->t0, q->t_sched), ms(b->t0, q->t_sent),
                q->plen, (unsigned long long)q->prompt_fnv, q->olen,
                ok ? "true" : "false");
        if (ok) {
            fprintf(f, ",\"output_tokens\":%d,\"ttft_ms\":%.4f,"
                    "\"e2e_ms\":%.4f", q->n_out, ms(q->t_sent, q->t_first),
                    ms(q->t_sent, q->t_done));
            if (tp >= 0)
                fprintf(f, ",\"tpot_ms\":%.4f", tp);
            if (q->n_prompt_usage >= 0)
                fprintf(f, ",\"prompt_tokens_usage\":%d", q->n_prompt_usage);
            if (q->preemptions >= 0)
                fprintf(f, ",\"retries\":%d,\"preemptions\":%d",
                        q->retries, q->preemptions);
        } else if (q->state == BR_FAILED) {
            fprintf(f, ",\"error\":");
            json_str(f, b->codes[q->code].code);
        }
        fprintf(f, "}");
    }
    fprintf(f, "]}");
}

/* Latency (log scale) against output tokens/s: TPOT p50, TPOT p99 and
 * TTFT p99, one point per run, hand-written SVG. */
static bool write_plot(const char *path, const bench_result_t *res, int n,
                       const char *title)
{
    const double W = 720, H = 440, L = 80, R = 170, T = 40, B = 60;
    const char *names[3] = { "TPOT p50", "TPOT p99", "TTFT p99" };
    const char *colors[3] = { "#1f77b4", "#ff7f0e", "#d62728" };
    double xmax = 0, ymin = INFINITY, ymax = 0, lo, hi, xstep;
    int order[BENCH_MAX_RATES];
    FILE *f = fopen(path, "w");

    if (f == NULL)
        return false;
    for (int i = 0; i < n; i++) {
        double v[3] = { res[i].tpot.p50, res[i].tpot.p99, res[i].ttft.p99 };
        order[i] = i;
        xmax = BT_MAX(xmax, res[i].out_tokens / res[i].duration_s);
        for (int k = 0; k < 3; k++)
            if (v[k] > 0) {
                ymin = BT_MIN(ymin, v[k]);
                ymax = BT_MAX(ymax, v[k]);
            }
    }
    /* x order: by throughput */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            const bench_result_t *a = &res[order[j - 1]], *c = &res[order[j]];
            if (a->out_tokens / a->duration_s <= c->out_tokens / c->duration_s)
                break;
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    if (!(ymax > 0)) {
        ymin = 0.1;
        ymax = 1;
    }
    lo = floor(log10(ymin));
    hi = ceil(log10(ymax));
    if (hi <= lo)
        hi = lo + 1;
    if (xmax > 0) { /* a 1-2-5 tick step, 4 to 10 ticks */
        double raw = xmax * 1.05 / 5, mag = pow(10, floor(log10(raw)));
        xstep = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag
                                 : raw <= 5 * mag ? 5 * mag : 10 * mag;
        xmax = ceil(xmax * 1.05 / xstep) * xstep;
    } else {
        xmax = 1;
        xstep = 0.2;
    }
#define PX(x) (L + (x) / xmax * (W - L - R))
#define PY(y) (T + (hi - log10(y)) / (hi - lo) * (H - T - B))
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" "
            "height=\"%g\" viewBox=\"0 0 %g %g\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
            "fill=\"white\"/>\n<text x=\"%g\" y=\"22\" text-anchor=\"middle\" "
            "font-size=\"14\">", W, H, W, H, (W - R + L) / 2);
    for (const char *p = title; *p; p++) {
        if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '&')
            fputs("&amp;", f);
        else if ((unsigned char)*p >= 0x20)
            fputc(*p, f);
    }
    fprintf(f, "</text>\n");
    /* axes, grid, ticks */
    fprintf(f, "<g stroke=\"black\" fill=\"none\"><line x1=\"%g\" y1=\"%g\" "
            "x2=\"%g\" y2=\"%g\"/><line x1=\"%g\" y1=\"%g\" x2=\"%g\" "
            "y2=\"%g\"/></g>\n", L, T, L, H - B, L, H - B, W - R, H - B);
    for (double e = lo; e <= hi + 1e-9; e += 1) {
        double y = PY(pow(10, e));
        fprintf(f, "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" "
                "stroke=\"#ddd\"/><text x=\"%g\" y=\"%.1f\" "
                "text-anchor=\"end\">%g</text>\n", L, y, W - R, y, L - 6,
                y + 4, pow(10, e));
    }
    for (int k = 0; k * xstep <= xmax * 1.0001; k++) {
        double xv = k * xstep, x = PX(xv);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" "
                "stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%g\" "
                "text-anchor=\"middle\">%g</text>\n", x, T, x, H - B, x,
                H - B + 16, xv);
    }
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">output "
            "tokens/s</text>\n<text x=\"18\" y=\"%g\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 18 %g)\">latency, ms (log)</text>\n",
            (W - R + L) / 2, H - 18, (H - B + T) / 2, (H - B + T) / 2);
    for (int k = 0; k < 3; k++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" "
                "stroke-width=\"2\" points=\"", colors[k]);
        for (int j = 0, first = 1; j < n; j++) {
            const bench_result_t *r = &res[order[j]];
            double v = k == 0 ? r->tpot.p50 : k == 1 ? r->tpot.p99
                                                     : r->ttft.p99;
            if (v <= 0)
                continue;
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ",
                    PX(r->out_tokens / r->duration_s), PY(v));
            first = 0;
        }
        fprintf(f, "\"/>\n");
        for (int j = 0; j < n; j++) {
            const bench_result_t *r = &res[order[j]];
            double v = k == 0 ? r->tpot.p50 : k == 1 ? r->tpot.p99
                                                     : r->ttft.p99;
            char rs[32];
            if (v <= 0)
                continue;
            rate_str(r->rate, rs, sizeof(rs));
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" "
                    "fill=\"%s\"><title>%s rate %s: %.2f ms at %.0f tok/s"
                    "</title></circle>\n", PX(r->out_tokens / r->duration_s),
                    PY(v), colors[k], names[k], rs, v,
                    r->out_tokens / r->duration_s);
            if (k == 2) /* the rate next to its TTFT point */
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
                        "fill=\"#555\">%s%s</text>\n",
                        PX(r->out_tokens / r->duration_s) + 5, PY(v) - 6,
                        rs, r->rate > 0 ? "/s" : "");
        }
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" "
                "stroke=\"%s\" stroke-width=\"2\"/><text x=\"%g\" y=\"%g\">"
                "%s</text>\n", W - R + 14, T + 10 + 20.0 * k, W - R + 38,
                T + 10 + 20.0 * k, colors[k], W - R + 44, T + 14 + 20.0 * k,
                names[k]);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    return fclose(f) == 0;
}

// ---------------------------------------------------------------------------
// Options

static void bench_usage(FILE *out)
{
    fprintf(out,
"usage: baton bench (--router EP | --http URL) [--requests N]\n"
"                   [--concurrency C] [--rate R | --rates R1,R2,...]\n"
"                   [--prompt-len L|A:B] [--output-len O|A:B]\n"
"                   [--lengths-file FILE] [options]\n"
"\n"
"Load generator for a baton cluster, in the manner of vllm bench serve.\n"
"\n"
"Target (one):\n"
"  --router EP          router client endpoint tcp://HOST:PORT (ZeroMQ;\n"
"                       env BATON_ROUTER)\n"
"  --http URL           baton-http, e.g. http://127.0.0.1:8000: POST\n"
"                       /v1/completions (or the URL's path) with stream:\n"
"                       true, usage included, prompt as token ids\n"
"  --model NAME         \"model\" field of HTTP requests (default: none)\n"
"Load:\n"
"  --requests N         measured requests per run (default 100; with\n"
"                       --lengths-file and no --requests: its pair count)\n"
"  --rate R             open loop: arrivals at R requests/s, Poisson\n"
"                       (exponential gaps); inf = all at once (a burst)\n"
"  --rates R1,R2,...    a sweep: one run per rate (inf allowed), same\n"
"                       requests each; --json writes an array\n"
"  --burstiness B       gamma-distributed gaps of shape B, mean 1/R\n"
"                       (1 = Poisson, <1 burstier, >1 steadier)\n"
"  --concurrency C      at most C in flight; alone: a closed loop\n"
"  --warmup N           N requests first (closed loop, C or 8 in\n"
"                       flight), not counted\n"
"  --timeout-ms MS      a request not finished MS after it was sent is\n"
"                       cancelled and counted as failed (default 600000)\n"
"Lengths (uniform A:B is inclusive; the same every run for a seed):\n"
"  --prompt-len L|A:B   prompt tokens (default 32)\n"
"  --output-len O|A:B   max_tokens (default 32)\n"
"  --lengths-file FILE  lines \"PROMPT OUTPUT\" (# comments), used in\n"
"                       order, cycling\n"
"  --vocab V            prompt ids are 1 then uniform in [3, V)\n"
"                       (default 256)\n"
"  --text               (--router) prompts as text: each id after the\n"
"                       first a space and two letters (the worker, or\n"
"                       a router with --tokenizer, tokenizes them)\n"
"  --no-ignore-eos      stop at EOS (default: EOS ignored, exact lengths)\n"
"Shared-prefix traffic (prefix caching):\n"
"  --shared-prefix-len N  every prompt starts with the same N tokens (a\n"
"                       system prompt, a shared document); the prompt\n"
"                       length adds N\n"
"  --sessions K         multi-turn: request i is turn i/K of session i%%K,\n"
"                       its prompt the previous turn's plus --prompt-len\n"
"                       tokens (histories grow; a turn's prompt is a\n"
"                       prefix of the next)\n"
"  --seed S             lengths, prompts and arrivals (default 1); each\n"
"                       run (the warm-up, every rate) sends prompts of\n"
"                       its own (a prefix cache would serve repeats),\n"
"                       the same lengths\n"
"  --precision CLASS    every request asks for workers of f32, bf16 or\n"
"                       fp8 (the \"precision\" field over HTTP; default:\n"
"                       any)\n"
"Output:\n"
"  --slo-ttft MS, --slo-tpot MS\n"
"                       goodput = completed requests meeting both per s\n"
"  --json FILE          every number, one object per run (docs/BENCH.md)\n"
"  --plot FILE.svg      TPOT p50/p99 and TTFT p99 vs output tok/s\n"
"  --no-progress        no progress line (shown only on a terminal)\n"
"\n"
"Metrics: TTFT = send -> first token; E2E = send -> end; TPOT = (E2E -\n"
"TTFT) / (output tokens - 1), per request; ITL = every gap between\n"
"consecutive token messages of a request (ZeroMQ chunks; HTTP events\n"
"with text); percentiles interpolate linearly (numpy).  Throughput is\n"
"over the run: first send to last end; tok_s_mid is the output rate of\n"
"the middle half.  Exit status 1 when any measured request failed.\n");
}

/* "L" or "A:B" into [*lo, *hi]. */
static bool parse_range(const char *s, int *lo, int *hi)
{
    const char *c = strchr(s, ':');
    char a[32];

    if (c == NULL) {
        if (bt_parse_int(s, lo) != BT_OK)
            return false;
        *hi = *lo;
    } else {
        if ((size_t)(c - s) >= sizeof(a))
            return false;
        snprintf(a, sizeof(a), "%.*s", (int)(c - s), s);
        if (bt_parse_int(a, lo) != BT_OK || bt_parse_int(c + 1, hi) != BT_OK)
            return false;
    }
    return *lo > 0 && *hi >= *lo && *hi <= BENCH_MAX_LEN;
}

static bool parse_rate(const char *s, double *r)
{
    if (strcasecmp(s, "inf") == 0) {
        *r = INFINITY;
        return true;
    }
    return bt_parse_double(s, r) == BT_OK && *r > 0 && isfinite(*r);
}

static bool parse_rates(bench_t *b, const char *s)
{
    char buf[1024], *save = NULL, *tok;

    if (strlen(s) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", s);
    b->n_rates = 0;
    for (tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (b->n_rates == BENCH_MAX_RATES ||
            !parse_rate(tok, &b->rates[b->n_rates]))
            return false;
        b->n_rates++;
    }
    return b->n_rates > 0;
}

static bool load_lengths(bench_t *b, const char *path)
{
    char *data = NULL, *save = NULL, *line;
    size_t len;
    int cap = 0, lineno = 0;

    if (bt_read_file(path, 64u << 20, &data, &len) != BT_OK) {
        fprintf(stderr, "baton bench: cannot read %s\n", path);
        return false;
    }
    for (line = strtok_r(data, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *p = line, *e;
        long v[2];
        lineno++;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        for (int k = 0; k < 2; k++) {
            errno = 0;
            v[k] = strtol(p, &e, 10);
            if (e == p || errno || v[k] <= 0 || v[k] > BENCH_MAX_LEN)
                goto bad;
            p = e;
        }
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '\0')
            goto bad;
        if (b->n_file == cap) {
            int *n;
            cap = cap ? cap * 2 : 256;
            n = bt_realloc(b->file_len, (size_t)cap * 2 * sizeof(int),
                           "bench");
            if (n == NULL)
                goto err;
            b->file_len = n;
        }
        b->file_len[2 * b->n_file] = (int)v[0];
        b->file_len[2 * b->n_file + 1] = (int)v[1];
        b->n_file++;
    }
    bt_free(data);
    if (b->n_file == 0) {
        fprintf(stderr, "baton bench: %s has no length pairs\n", path);
        return false;
    }
    b->plen_min = b->olen_min = BENCH_MAX_LEN;
    b->plen_max = b->olen_max = 0;
    for (int i = 0; i < b->n_file; i++) {
        b->plen_min = BT_MIN(b->plen_min, b->file_len[2 * i]);
        b->plen_max = BT_MAX(b->plen_max, b->file_len[2 * i]);
        b->olen_min = BT_MIN(b->olen_min, b->file_len[2 * i + 1]);
        b->olen_max = BT_MAX(b->olen_max, b->file_len[2 * i + 1]);
    }
    return true;
bad:
    fprintf(stderr, "baton bench: %s:%d: want \"PROMPT OUTPUT\" (positive "
            "token counts up to %d)\n", path, lineno, BENCH_MAX_LEN);
err:
    bt_free(data);
    return false;
}

static void bench_cleanup(bench_t *b)
{
    client_destroy(&b->client);
    for (int s = 0; s < b->n_slots; s++)
        cli_http_destroy(&b->slots[s].h);
    BT_FREE(b->slots);
    BT_FREE(b->pfds);
    BT_FREE(b->pfd_slot);
    BT_FREE(b->sse);
    BT_FREE(b->rid_keys);
    BT_FREE(b->rid_vals);
    BT_FREE(b->reqs);
    BT_FREE(b->itl);
    BT_FREE(b->bucket);
    BT_FREE(b->prompt);
    BT_FREE(b->text_buf);
    BT_FREE(b->body);
    BT_FREE(b->file_len);
}

int cli_bench_main(int argc, char **argv)
{
    enum {
        O_ROUTER = 'r', O_REQUESTS = 'n', O_CONC = 'c', O_RATE = 'R',
        O_PLEN = 'L', O_OLEN = 'O', O_SLO_TTFT = 't', O_SLO_TPOT = 'p',
        O_JSON = 'j', O_VOCAB = 'V', O_SEED = 's', O_HELP = 'h',
        O_RATES = 1000, O_BURST, O_HTTP, O_MODEL, O_LFILE, O_WARMUP,
        O_TIMEOUT, O_PLOT, O_NO_PROGRESS, O_NO_IGNORE_EOS, O_SHARED,
        O_SESSIONS, O_PRECISION, O_TEXT
    };
    static const struct option opts[] = {
        { "router", required_argument, NULL, O_ROUTER },
        { "http", required_argument, NULL, O_HTTP },
        { "model", required_argument, NULL, O_MODEL },
        { "requests", required_argument, NULL, O_REQUESTS },
        { "concurrency", required_argument, NULL, O_CONC },
        { "rate", required_argument, NULL, O_RATE },
        { "rates", required_argument, NULL, O_RATES },
        { "burstiness", required_argument, NULL, O_BURST },
        { "prompt-len", required_argument, NULL, O_PLEN },
        { "output-len", required_argument, NULL, O_OLEN },
        { "lengths-file", required_argument, NULL, O_LFILE },
        { "slo-ttft", required_argument, NULL, O_SLO_TTFT },
        { "slo-tpot", required_argument, NULL, O_SLO_TPOT },
        { "json", required_argument, NULL, O_JSON },
        { "plot", required_argument, NULL, O_PLOT },
        { "vocab", required_argument, NULL, O_VOCAB },
        { "seed", required_argument, NULL, O_SEED },
        { "warmup", required_argument, NULL, O_WARMUP },
        { "timeout-ms", required_argument, NULL, O_TIMEOUT },
        { "no-progress", no_argument, NULL, O_NO_PROGRESS },
        { "no-ignore-eos", no_argument, NULL, O_NO_IGNORE_EOS },
        { "shared-prefix-len", required_argument, NULL, O_SHARED },
        { "sessions", required_argument, NULL, O_SESSIONS },
        { "precision", required_argument, NULL, O_PRECISION },
        { "text", no_argument, NULL, O_TEXT },
        { "help", no_argument, NULL, O_HELP },
        { NULL, 0, NULL, 0 }
    };
    bench_t b;
    const char *json = NULL, *plot = NULL, *lfile = NULL;
    bool have_rate = false, have_n = false, quiet = false;
    bool router_flag = false;
    bench_result_t *res = NULL;
    FILE *jf = NULL;
    int ret = 1, n_max, max_plen;

    memset(&b, 0, sizeof(b));
    b.router = getenv("BATON_ROUTER");
    b.n_req = 100;
    b.plen_min = b.plen_max = 32;
    b.olen_min = b.olen_max = 32;
    b.vocab = 256;
    b.seed = 1;
    b.burstiness = 1.0;
    b.timeout_ms = 600000;
    b.ignore_eos = true;
    b.progress = isatty(2);
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL), bad = 0;
        if (c == -1)
            break;
        switch (c) {
        case O_ROUTER: b.router = optarg; router_flag = true; break;
        case O_HTTP: b.http = optarg; break;
        case O_MODEL: b.model = optarg; break;
        case O_REQUESTS:
            bad = bt_parse_int(optarg, &b.n_req) != BT_OK || b.n_req <= 0;
            have_n = true;
            break;
        case O_CONC:
            bad = bt_parse_int(optarg, &b.conc) != BT_OK || b.conc <= 0;
            break;
        case O_RATE:
            bad = have_rate || !parse_rate(optarg, &b.rates[0]);
            b.n_rates = 1;
            have_rate = true;
            break;
        case O_RATES:
            bad = have_rate || !parse_rates(&b, optarg);
            b.sweep = have_rate = true;
            break;
        case O_BURST:
            bad = bt_parse_double(optarg, &b.burstiness) != BT_OK ||
                  !(b.burstiness > 0) || b.burstiness > 1e6;
            break;
        case O_PLEN: bad = !parse_range(optarg, &b.plen_min, &b.plen_max);
            break;
        case O_OLEN: bad = !parse_range(optarg, &b.olen_min, &b.olen_max);
            break;
        case O_LFILE: lfile = optarg; break;
        case O_SLO_TTFT:
            bad = bt_parse_double(optarg, &b.slo_ttft) != BT_OK;
            break;
        case O_SLO_TPOT:
            bad = bt_parse_double(optarg, &b.slo_tpot) != BT_OK;
            break;
        case O_JSON: json = optarg; break;
        case O_PLOT: plot = optarg; break;
        case O_VOCAB:
            bad = bt_parse_int(optarg, &b.vocab) != BT_OK || b.vocab <= 3;
            break;
        case O_SEED: bad = bt_parse_int(optarg, &b.seed) != BT_OK; break;
        case O_WARMUP:
            bad = bt_parse_int(optarg, &b.warmup) != BT_OK || b.warmup < 0;
            break;
        case O_TIMEOUT:
            bad = bt_parse_int(optarg, &b.timeout_ms) != BT_OK ||
                  b.timeout_ms <= 0;
            break;
        case O_NO_PROGRESS: b.progress = false; break;
        case O_NO_IGNORE_EOS: b.ignore_eos = false; break;
        case O_SHARED:
            bad = bt_parse_int(optarg, &b.shared_len) != BT_OK ||
                  b.shared_len < 0 || b.shared_len > BENCH_MAX_LEN / 2;
            break;
        case O_SESSIONS:
            bad = bt_parse_int(optarg, &b.sessions) != BT_OK ||
                  b.sessions < 0;
            break;
        case O_PRECISION:
            b.precision = proto_precision_find(optarg);
            bad = b.precision == NULL;
            break;
        case O_TEXT: b.text = true; break;
        case O_HELP: bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton bench: bad value '%s' for --%s\n", optarg,
                    argv[optind - 1][0] == '-' ? argv[optind - 1] + 2 : "?");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton bench: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    if (b.http != NULL && !router_flag)
        b.router = NULL; /* --http wins over BATON_ROUTER */
    if ((b.router == NULL) == (b.http == NULL) ||
        (b.conc <= 0 && !have_rate)) {
        fprintf(stderr, "baton bench: need one of --router or --http, and "
                        "--concurrency and/or --rate/--rates\n");
        bench_usage(stderr);
        return 2;
    }
    if (b.text && b.http != NULL) {
        fprintf(stderr, "baton bench: --text is for --router only\n");
        return 2;
    }
    if (!have_rate) {
        b.rates[0] = 0; /* closed loop */
        b.n_rates = 1;
    }
    if (lfile != NULL) {
        if (!load_lengths(&b, lfile))
            goto out;
        if (!have_n)
            b.n_req = b.n_file;
    }
    n_max = BT_MAX(b.n_req, b.warmup);
    max_plen = workload_plen(&b, n_max - 1, b.plen_max);
    b.reqs = bt_calloc((size_t)n_max, sizeof(*b.reqs), "bench");
    b.prompt = bt_malloc((size_t)max_plen * sizeof(int), "bench");
    if (b.text)
        b.text_buf = bt_malloc((size_t)max_plen * BENCH_WORD_MAX + 1,
                               "bench");
    res = bt_calloc((size_t)b.n_rates, sizeof(*res), "bench");
    if (!b.reqs || !b.prompt || !res || (b.text && !b.text_buf))
        goto out;
    if (b.router != NULL) {
        b.rid_cap = 64;
        while (b.rid_cap < 2 * n_max)
            b.rid_cap *= 2;
        b.rid_keys = bt_calloc((size_t)b.rid_cap, sizeof(uint64_t), "bench");
        b.rid_vals = bt_calloc((size_t)b.rid_cap, sizeof(int), "bench");
        if (!b.rid_keys || !b.rid_vals ||
            client_create(b.router, &b.client) != BT_OK)
            goto out;
    } else {
        struct rlimit rl;
        bt_status_t status = cli_http_url_parse(b.http, "/v1/completions",
                                                &b.url);
        if (status != BT_OK) {
            ret = status == BT_ERR_INVALID_ARG ? 2 : 1;
            goto out;
        }
        /* one connection per request in flight: lift the fd limit */
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }
    if (json != NULL && (jf = fopen(json, "w")) == NULL) {
        fprintf(stderr, "baton bench: cannot write %s: %s\n", json,
                strerror(errno));
        goto out;
    }
    if (b.warmup > 0) {
        int wc = b.conc > 0 ? b.conc : BT_MIN(8, b.warmup);
        b.phase = "warmup";
        if (!bench_run(&b, b.warmup, 0, wc))
            goto out;
        if (b.n_failed > 0) {
            fprintf(stderr, "baton bench: warmup: %d of %d failed (first: "
                    "%s: %s)\n", b.n_failed, b.warmup, b.codes[0].code,
                    b.first[0].msg);
        }
    }
    if (jf && b.sweep)
        fprintf(jf, "[");
    ret = 0;
    quiet = true; /* from here a nonzero status means failed requests */
    for (int k = 0; k < b.n_rates; k++) {
        char label[64], rs[32];
        rate_str(b.rates[k], rs, sizeof(rs));
        snprintf(label, sizeof(label), "rate %s", rs);
        b.phase = label;
        if (!bench_run(&b, b.n_req, b.rates[k], b.conc) ||
            !bench_summarise(&b, &res[k])) {
            fprintf(stderr, "baton bench: out of memory\n");
            ret = 1;
            quiet = false;
            goto out;
        }
        print_text(&b, &res[k]);
        if (jf) {
            fprintf(jf, "%s", k ? ",\n" : "");
            print_json(jf, &b, &res[k]);
        }
        if (res[k].failed > 0)
            ret = 1;
    }
    if (jf) {
        fprintf(jf, "%s\n", b.sweep ? "]" : "");
        if (fclose(jf) != 0) {
            fprintf(stderr, "baton bench: writing %s failed\n", json);
            ret = 1;
        }
        jf = NULL;
    }
    if (plot != NULL) {
        char title[400];
        snprintf(title, sizeof(title), "baton bench %s: latency vs output "
                 "tokens/s", b.router ? b.router : b.http);
        if (!write_plot(plot, res, b.n_rates, title)) {
            fprintf(stderr, "baton bench: cannot write %s\n", plot);
            ret = 1;
        }
    }

out:
    if (ret != 0 && !quiet && bt_error_last()[0])
        fprintf(stderr, "baton bench: %s\n", bt_error_last());
    if (jf)
        fclose(jf);
    bt_free(res);
    bench_cleanup(&b);
    return ret;
}
