/*
 * cli_bench.c - `baton bench`: a load generator for a baton cluster.
 *
 * Sends --requests synthetic requests (random prompt ids of --prompt-len,
 * --output-len tokens each, EOS ignored) with a closed loop of
 * --concurrency requests in flight or an open loop at --rate requests/s
 * (Poisson arrivals), over one client connection, and reports TTFT,
 * TPOT (per request: (e2e - ttft) / (tokens - 1)), inter-token latency
 * and end-to-end latency percentiles, request and token throughput,
 * goodput (requests/s meeting --slo-ttft and --slo-tpot) and errors.
 * tok_s_mid is the output token rate over the middle half of the run
 * (tokens that arrived between 25 % and 75 % of the duration): short runs
 * spend their start filling the batch and their end draining it, so this
 * is the closer estimate of the steady-state rate at that load.
 * --json FILE writes the same numbers as JSON, with the load parameters.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cli.h"
#include "client.h"

typedef struct {
    uint64_t rid;
    uint64_t t_sent;
    uint64_t t_first;
    uint64_t t_last;
    uint64_t t_done;
    int n_tokens;
    int state;       /* 0 idle, 1 in flight, 2 done, 3 error */
} bench_req_t;

#define BENCH_BUCKET_NS 10000000ull /* token-arrival histogram: 10 ms */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
    if (n == 0)
        return 0;
    return v[(int)BT_MIN((double)(n - 1), floor(p / 100.0 * n))];
}

static void bench_usage(FILE *out)
{
    fprintf(out,
"usage: baton bench --router EP --requests N (--concurrency C | --rate R)\n"
"                   --prompt-len L --output-len O [--slo-ttft MS]\n"
"                   [--slo-tpot MS] [--json FILE] [--vocab V] [--seed S]\n");
}

int cli_bench_main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "router", required_argument, NULL, 'r' },
        { "requests", required_argument, NULL, 'n' },
        { "concurrency", required_argument, NULL, 'c' },
        { "rate", required_argument, NULL, 'R' },
        { "prompt-len", required_argument, NULL, 'L' },
        { "output-len", required_argument, NULL, 'O' },
        { "slo-ttft", required_argument, NULL, 't' },
        { "slo-tpot", required_argument, NULL, 'p' },
        { "json", required_argument, NULL, 'j' },
        { "vocab", required_argument, NULL, 'V' },
        { "seed", required_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *router = getenv("BATON_ROUTER"), *json = NULL;
    int n_req = 100, conc = 0, plen = 32, olen = 32, vocab = 256;
    double rate = 0, slo_ttft = 0, slo_tpot = 0;
    int seed = 1;
    client_t *client = NULL;
    bench_req_t *reqs = NULL;
    int *prompt = NULL;
    double *ttft = NULL, *tpot = NULL, *e2e = NULL, *itl = NULL;
    int n_itl = 0, cap_itl = 0, sent = 0, done = 0, errors = 0, in_flight = 0;
    int *bucket = NULL, cap_bucket = 0; /* output tokens per 10 ms */
    int n_ok = 0, n_good = 0, ret = 1;
    uint64_t t0, t_end, next_arrival, rng;
    long total_tokens = 0;

    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL), bad = 0;
        if (c == -1)
            break;
        switch (c) {
        case 'r': router = optarg; break;
        case 'n': bad = bt_parse_int(optarg, &n_req) != BT_OK; break;
        case 'c': bad = bt_parse_int(optarg, &conc) != BT_OK; break;
        case 'R': bad = bt_parse_double(optarg, &rate) != BT_OK; break;
        case 'L': bad = bt_parse_int(optarg, &plen) != BT_OK; break;
        case 'O': bad = bt_parse_int(optarg, &olen) != BT_OK; break;
        case 't': bad = bt_parse_double(optarg, &slo_ttft) != BT_OK; break;
        case 'p': bad = bt_parse_double(optarg, &slo_tpot) != BT_OK; break;
        case 'j': json = optarg; break;
        case 'V': bad = bt_parse_int(optarg, &vocab) != BT_OK; break;
        case 's': bad = bt_parse_int(optarg, &seed) != BT_OK; break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "baton bench: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (router == NULL || n_req <= 0 || plen <= 0 || olen <= 0 ||
        vocab <= 3 || (conc <= 0) == (rate <= 0)) {
        fprintf(stderr, "baton bench: need --router, --requests and exactly "
                        "one of --concurrency or --rate\n");
        bench_usage(stderr);
        return 2;
    }
    reqs = bt_calloc((size_t)n_req, sizeof(*reqs), "bench");
    prompt = bt_malloc((size_t)plen * sizeof(int), "bench");
    ttft = bt_malloc((size_t)n_req * sizeof(double), "bench");
    tpot = bt_malloc((size_t)n_req * sizeof(double), "bench");
    e2e = bt_malloc((size_t)n_req * sizeof(double), "bench");
    if (!reqs || !prompt || !ttft || !tpot || !e2e)
        goto out;
    if (client_create(router, &client) != BT_OK)
        goto out;
    rng = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    t0 = bt_time_ns();
    next_arrival = t0;
    while (done < n_req) {
        uint64_t now = bt_time_ns();
        Baton__ClientMessage *m = NULL;
        int wait_ms = 100;

        /* Send what the loop allows. */
        while (sent < n_req &&
               (conc > 0 ? in_flight < conc : now >= next_arrival)) {
            client_request_t req;
            client_request_init(&req);
            prompt[0] = 1;
            for (int i = 1; i < plen; i++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                prompt[i] = 3 + (int)(rng % (uint64_t)(vocab - 3));
            }
            req.prompt_ids = prompt;
            req.n_prompt_ids = plen;
            req.max_tokens = olen;
            req.ignore_eos = true;
            req.want_text = false;
            reqs[sent].t_sent = bt_time_ns();
            if (client_submit(client, &req, &reqs[sent].rid) != BT_OK)
                goto out;
            reqs[sent].state = 1;
            sent++;
            in_flight++;
            if (rate > 0) {
                double u;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                u = ((double)(rng >> 11) + 1.0) / 9007199254740993.0;
                next_arrival += (uint64_t)(-log(u) / rate * 1e9);
            }
        }
        if (rate > 0 && sent < n_req) {
            int64_t ahead = (int64_t)next_arrival - (int64_t)bt_time_ns();
            wait_ms = ahead <= 0 ? 0 : (int)BT_MIN(ahead / 1000000, 100);
        }
        if (client_recv(client, wait_ms, &m) != BT_OK)
            continue;
        {
            uint64_t rid = client_msg_request_id(m), t = bt_time_ns();
            bench_req_t *r = NULL;
            if (rid >= 1 && rid <= (uint64_t)sent)
                r = &reqs[rid - 1]; /* the client numbers requests 1.. */
            if (r != NULL && r->rid == rid && r->state == 1) {
                if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK &&
                    m->chunk->n_ids > 0) {
                    if (r->t_first == 0) {
                        r->t_first = t;
                    } else {
                        if (n_itl == cap_itl) {
                            cap_itl = cap_itl ? cap_itl * 2 : 4096;
                            itl = bt_realloc(itl, (size_t)cap_itl *
                                                      sizeof(double), "bench");
                            if (itl == NULL)
                                goto out;
                        }
                        itl[n_itl++] = (double)(t - r->t_last) / 1e6;
                    }
                    r->t_last = t;
                    r->n_tokens += (int)m->chunk->n_ids;
                    {
                        uint64_t k = (t - t0) / BENCH_BUCKET_NS;
                        if (k >= (uint64_t)cap_bucket) {
                            int cap = (int)BT_MAX(k + 1, 2 * (uint64_t)
                                                             cap_bucket);
                            int *nb = bt_realloc(bucket, (size_t)cap *
                                                             sizeof(int),
                                                 "bench");
                            if (nb == NULL)
                                goto out;
                            memset(nb + cap_bucket, 0,
                                   (size_t)(cap - cap_bucket) * sizeof(int));
                            bucket = nb;
                            cap_bucket = cap;
                        }
                        bucket[k] += (int)m->chunk->n_ids;
                    }
                } else if (m->body_case ==
                           BATON__CLIENT_MESSAGE__BODY_FINISHED) {
                    r->state = 2;
                    r->t_done = t;
                    done++;
                    in_flight--;
                } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
                    r->state = 3;
                    errors++;
                    done++;
                    in_flight--;
                }
            }
        }
        proto_client_free(&m);
    }
    t_end = bt_time_ns();
    for (int i = 0; i < n_req; i++) {
        bench_req_t *r = &reqs[i];
        bool good;
        if (r->state != 2 || r->t_first == 0)
            continue;
        ttft[n_ok] = (double)(r->t_first - r->t_sent) / 1e6;
        e2e[n_ok] = (double)(r->t_done - r->t_sent) / 1e6;
        tpot[n_ok] = r->n_tokens > 1 ? (double)(r->t_last - r->t_first) / 1e6 /
                                           (r->n_tokens - 1)
                                     : 0;
        good = (slo_ttft <= 0 || ttft[n_ok] <= slo_ttft) &&
               (slo_tpot <= 0 || tpot[n_ok] <= slo_tpot);
        n_good += good;
        total_tokens += r->n_tokens;
        n_ok++;
    }
    {
        double secs = (double)(t_end - t0) / 1e9;
        double *sets[4] = { ttft, tpot, itl, e2e };
        int counts[4] = { n_ok, n_ok, n_itl, n_ok };
        const char *names[4] = { "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms" };
        FILE *jf = json ? fopen(json, "w") : NULL;
        uint64_t b0 = (t_end - t0) / 4 / BENCH_BUCKET_NS;
        uint64_t b1 = 3 * (t_end - t0) / 4 / BENCH_BUCKET_NS;
        long mid_tokens = 0;
        double mid_s = (double)(b1 - b0) * BENCH_BUCKET_NS / 1e9;

        for (uint64_t k = b0; k < b1 && k < (uint64_t)cap_bucket; k++)
            mid_tokens += bucket[k];

        if (json && jf == NULL) {
            fprintf(stderr, "baton bench: cannot write %s\n", json);
            goto out;
        }
        printf("requests:%d ok:%d errors:%d duration_s:%.3f req_s:%.2f "
               "tok_s:%.1f tok_s_mid:%.1f goodput_req_s:%.2f\n", n_req, n_ok,
               errors, secs, n_ok / secs, total_tokens / secs,
               mid_s > 0 ? mid_tokens / mid_s : 0.0, n_good / secs);
        if (jf)
            fprintf(jf, "{\"requests\":%d,\"ok\":%d,\"errors\":%d,"
                    "\"duration_s\":%.4f,\"req_per_s\":%.3f,"
                    "\"tok_per_s\":%.2f,\"tok_per_s_mid\":%.2f,"
                    "\"goodput_req_per_s\":%.3f,\"good\":%d,"
                    "\"slo_ttft_ms\":%.3f,\"slo_tpot_ms\":%.3f,"
                    "\"rate\":%.4f,\"concurrency\":%d,"
                    "\"prompt_len\":%d,\"output_len\":%d",
                    n_req, n_ok, errors, secs, n_ok / secs,
                    total_tokens / secs, mid_s > 0 ? mid_tokens / mid_s : 0.0,
                    n_good / secs, n_good, slo_ttft, slo_tpot, rate, conc,
                    plen, olen);
        for (int k = 0; k < 4; k++) {
            qsort(sets[k], (size_t)counts[k], sizeof(double), cmp_double);
            printf("%s p50:%.3f p90:%.3f p99:%.3f\n", names[k],
                   pct(sets[k], counts[k], 50), pct(sets[k], counts[k], 90),
                   pct(sets[k], counts[k], 99));
            if (jf)
                fprintf(jf, ",\"%s\":{\"p50\":%.4f,\"p90\":%.4f,"
                        "\"p99\":%.4f}", names[k], pct(sets[k], counts[k], 50),
                        pct(sets[k], counts[k], 90),
                        pct(sets[k], counts[k], 99));
        }
        if (jf) {
            fprintf(jf, "}\n");
            fclose(jf);
        }
    }
    ret = errors > 0 ? 1 : 0;

out:
    if (ret != 0 && bt_error_last()[0])
        fprintf(stderr, "baton bench: %s\n", bt_error_last());
    client_destroy(&client);
    bt_free(reqs);
    bt_free(prompt);
    bt_free(ttft);
    bt_free(tpot);
    bt_free(e2e);
    bt_free(itl);
    bt_free(bucket);
    return ret;
}
