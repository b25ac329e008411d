/*
 * cli_status.c - `baton status`: print a router's cluster status
 * (workers, roles, precision pools, free KV blocks, KV transport of each
 * pair), and with --wait-workers P,D wait until the cluster can serve: at
 * least P
 * prefill-capable workers (prefill workers, or decode workers running
 * --role both) and D decode workers registered, draining ones not
 * counted.  The readiness check of deploy scripts (deploy/slurm).
 *
 * Exit codes: 0 status printed (and, with --wait-workers, the counts
 * reached), 1 no answer from the router or the counts not reached
 * within --timeout, 2 usage error.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bt_alloc.h"
#include "bt_util.h"
#include "cli.h"
#include "client.h"

/* Poll interval while waiting for workers, and the longest wait for one
 * status reply before the request is sent again. */
#define STATUS_POLL_MS 200
#define STATUS_REPLY_MS 1000

static void status_usage(FILE *out)
{
    fprintf(out,
"usage: baton status --router tcp://HOST:PORT [--wait-workers P,D]\n"
"                    [--timeout S] [--json]\n"
"\n"
"Prints the router's cluster status: workers (role, precision class and\n"
"KV dtype, free/total KV blocks, running requests, host, GPU), queue, the\n"
"precision pools, and the KV transport of every prefill/decode pair.\n"
"\n"
"  --router EP            the router's client endpoint (env BATON_ROUTER)\n"
"  --wait-workers P,D     wait until at least P prefill-capable workers\n"
"                         (prefill, or decode --role both) and D decode\n"
"                         workers are registered and not draining; then\n"
"                         print the status and exit 0\n"
"  --timeout S            give up after S seconds (default 30): exit 1\n"
"  --json                 one JSON object instead of the table\n"
"\n"
"Exit: 0 ok, 1 no answer / counts not reached in time, 2 usage error.\n");
}

typedef struct {
    int prefill_capable; /* prefill workers + decode --role both */
    int prefill;
    int decode;
    int aggregated;      /* decode workers with --role both */
} status_counts_t;

static void status_count(const Baton__ClusterStatus *st, status_counts_t *n)
{
    memset(n, 0, sizeof(*n));
    for (size_t i = 0; i < st->n_workers; i++) {
        const Baton__WorkerStatus *w = st->workers[i];
        if (w->draining)
            continue;
        if (w->role == BATON__ROLE__ROLE_PREFILL)
            n->prefill++;
        if (w->role == BATON__ROLE__ROLE_DECODE) {
            n->decode++;
            n->aggregated += w->can_prefill;
        }
    }
    n->prefill_capable = n->prefill + n->aggregated;
}

static const char *status_role(const Baton__WorkerStatus *w)
{
    if (w->role == BATON__ROLE__ROLE_PREFILL)
        return "prefill";
    if (w->role == BATON__ROLE__ROLE_DECODE)
        return w->can_prefill ? "both" : "decode";
    return "unknown";
}

static const char *str_or(const char *s, const char *dflt)
{
    return s != NULL && s[0] != '\0' ? s : dflt;
}

/* "f32", "fp8/kv bf16" (precision and KV dtype differ), "-" (none): the
 * class a worker serves requests of and pairs within (issue 37). */
static void status_class(const Baton__WorkerStatus *w, char *buf,
                         size_t size)
{
    const char *p = str_or(w->precision, "-");
    const char *kv = str_or(w->kv_dtype, "-");

    if (strcmp(p, kv) == 0 || strcmp(kv, "-") == 0)
        snprintf(buf, size, "%s", p);
    else
        snprintf(buf, size, "%s/kv %s", p, kv);
}

/* "pools: bf16 (1P+2D), fp8 (0P+1D, 1 both)": the workers (not draining)
 * of each class, which the router pairs only among themselves. */
static void status_print_pools(const Baton__ClusterStatus *st)
{
    char names[16][32];
    int counts[16][3]; /* prefill, decode, of those decode --role both */
    int n = 0;

    for (size_t i = 0; i < st->n_workers; i++) {
        const Baton__WorkerStatus *w = st->workers[i];
        char name[32];
        int k = 0;

        if (w->draining)
            continue;
        status_class(w, name, sizeof(name));
        while (k < n && strcmp(names[k], name) != 0)
            k++;
        if (k == n) {
            if (n == 16)
                continue;
            snprintf(names[n], sizeof(names[n]), "%s", name);
            memset(counts[n], 0, sizeof(counts[n]));
            n++;
        }
        if (w->role == BATON__ROLE__ROLE_PREFILL) {
            counts[k][0]++;
        } else if (w->role == BATON__ROLE__ROLE_DECODE) {
            counts[k][1]++;
            counts[k][2] += w->can_prefill;
        }
    }
    printf("pools:");
    for (int k = 0; k < n; k++) {
        printf("%s %s (%dP+%dD", k ? "," : "", names[k], counts[k][0],
               counts[k][1]);
        if (counts[k][2] > 0)
            printf(", %d both", counts[k][2]);
        printf(")");
    }
    printf("%s\n", n == 0 ? " none" : "");
}

static void status_print_text(const char *router,
                              const Baton__ClusterStatus *st,
                              const status_counts_t *n)
{
    printf("router %s: %zu workers (%d prefill, %d decode, %d of them "
           "--role both), queued %u, in flight %u, completed %llu, "
           "failed %llu\n",
           router, st->n_workers, n->prefill, n->decode, n->aggregated,
           st->queued, st->in_flight, (unsigned long long)st->completed,
           (unsigned long long)st->failed);
    printf("workers:\n");
    printf("  %-28s %-8s %-12s %13s %7s %15s  %s\n", "NAME", "ROLE",
           "PRECISION", "FREE/TOTAL KV", "RUNNING", "CACHED/HIT", "HOST");
    for (size_t i = 0; i < st->n_workers; i++) {
        const Baton__WorkerStatus *w = st->workers[i];
        char kv[32] = "-", pc[32] = "-", cls[32];
        status_class(w, cls, sizeof(cls));
        if (w->role == BATON__ROLE__ROLE_DECODE)
            snprintf(kv, sizeof(kv), "%u/%u", w->free_kv_blocks,
                     w->total_kv_blocks);
        /* prefix cache: blocks cached (pool+host tier), prompt-token
         * hit rate */
        if (w->has_prefix_cached_blocks && w->has_prefix_host_cached_blocks)
            snprintf(pc, sizeof(pc), "%u+%u/%.1f%%", w->prefix_cached_blocks,
                     w->prefix_host_cached_blocks,
                     100.0 * w->prefix_hit_rate);
        else if (w->has_prefix_cached_blocks)
            snprintf(pc, sizeof(pc), "%u/%.1f%%", w->prefix_cached_blocks,
                     100.0 * w->prefix_hit_rate);
        printf("  %-28s %-8s %-12s %13s %7u %15s  %s%s%s%s\n",
               str_or(w->name, "?"), status_role(w), cls, kv, w->running, pc,
               str_or(w->host_id, "?"),
               w->gpu != NULL && w->gpu[0] != '\0' ? " gpu " : "",
               w->gpu != NULL ? w->gpu : "",
               w->draining ? " (draining)" : "");
    }
    status_print_pools(st);
    if (st->security != NULL)
        printf("security: %s\n",
               strcmp(st->security, "insecure") == 0
                   ? "INSECURE (router started with --insecure: no CURVE, "
                     "anyone who reaches its ports is trusted)"
                   : strcmp(st->security, "curve") == 0
                         ? "curve (authenticated, encrypted)"
                         : "loopback (no CURVE; loopback endpoints only)");
    printf("kv transports (--kv-transport %s):\n",
           str_or(st->kv_transport_mode, "?"));
    for (size_t i = 0; i < st->n_transports; i++)
        printf("  %s -> %s: %s\n", str_or(st->transports[i]->prefill, "?"),
               str_or(st->transports[i]->decode, "?"),
               str_or(st->transports[i]->name, "?"));
}

/* The status as one JSON object; `ready` is -1 without --wait-workers. */
static int status_print_json(const char *router,
                             const Baton__ClusterStatus *st,
                             const status_counts_t *n, int ready)
{
    cJSON *j = cJSON_CreateObject(), *ws, *ts;
    char *text;

    if (j == NULL)
        return -1;
    cJSON_AddStringToObject(j, "router", router);
    if (ready >= 0)
        cJSON_AddBoolToObject(j, "ready", ready);
    cJSON_AddNumberToObject(j, "prefill_capable", n->prefill_capable);
    cJSON_AddNumberToObject(j, "prefill_workers", n->prefill);
    cJSON_AddNumberToObject(j, "decode_workers", n->decode);
    cJSON_AddNumberToObject(j, "aggregated_workers", n->aggregated);
    cJSON_AddNumberToObject(j, "queued", st->queued);
    cJSON_AddNumberToObject(j, "in_flight", st->in_flight);
    cJSON_AddNumberToObject(j, "completed", (double)st->completed);
    cJSON_AddNumberToObject(j, "failed", (double)st->failed);
    cJSON_AddStringToObject(j, "kv_transport_mode",
                            str_or(st->kv_transport_mode, ""));
    cJSON_AddStringToObject(j, "security", str_or(st->security, ""));
    ws = cJSON_AddArrayToObject(j, "workers");
    for (size_t i = 0; ws != NULL && i < st->n_workers; i++) {
        const Baton__WorkerStatus *w = st->workers[i];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL)
            break;
        cJSON_AddStringToObject(o, "name", str_or(w->name, ""));
        cJSON_AddStringToObject(o, "role", status_role(w));
        cJSON_AddBoolToObject(o, "can_prefill",
                              w->role == BATON__ROLE__ROLE_PREFILL ||
                                  w->can_prefill);
        cJSON_AddNumberToObject(o, "free_kv_blocks", w->free_kv_blocks);
        cJSON_AddNumberToObject(o, "total_kv_blocks", w->total_kv_blocks);
        cJSON_AddNumberToObject(o, "running", w->running);
        cJSON_AddNumberToObject(o, "outstanding_tokens",
                                (double)w->outstanding_tokens);
        cJSON_AddBoolToObject(o, "draining", w->draining);
        cJSON_AddNumberToObject(o, "served", (double)w->served);
        if (w->has_prefix_cached_blocks) {
            cJSON_AddNumberToObject(o, "prefix_cached_blocks",
                                    w->prefix_cached_blocks);
            cJSON_AddNumberToObject(o, "prefix_hit_rate",
                                    w->prefix_hit_rate);
        }
        if (w->has_prefix_host_cached_blocks)
            cJSON_AddNumberToObject(o, "prefix_host_cached_blocks",
                                    w->prefix_host_cached_blocks);
        cJSON_AddStringToObject(o, "precision", str_or(w->precision, ""));
        cJSON_AddStringToObject(o, "kv_dtype", str_or(w->kv_dtype, ""));
        cJSON_AddStringToObject(o, "host_id", str_or(w->host_id, ""));
        cJSON_AddStringToObject(o, "gpu", str_or(w->gpu, ""));
        cJSON_AddItemToArray(ws, o);
    }
    ts = cJSON_AddArrayToObject(j, "transports");
    for (size_t i = 0; ts != NULL && i < st->n_transports; i++) {
        const Baton__PairTransport *t = st->transports[i];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL)
            break;
        cJSON_AddStringToObject(o, "prefill", str_or(t->prefill, ""));
        cJSON_AddStringToObject(o, "decode", str_or(t->decode, ""));
        cJSON_AddStringToObject(o, "transport", str_or(t->name, ""));
        cJSON_AddItemToArray(ts, o);
    }
    text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (text == NULL)
        return -1;
    printf("%s\n", text);
    cJSON_free(text);
    return 0;
}

/* Asks for the status and waits for a reply until `deadline` (bt_time_ns
 * clock), sending the request again every STATUS_REPLY_MS: a router that
 * is not up yet answers once it is.  NULL on timeout. */
static Baton__ClientMessage *status_fetch(client_t *c, uint64_t deadline)
{
    for (;;) {
        uint64_t rid, now = bt_time_ns(), resend;
        if (now >= deadline || client_status_request(c, &rid) != BT_OK)
            return NULL;
        resend = now + (uint64_t)STATUS_REPLY_MS * 1000000ull;
        if (resend > deadline)
            resend = deadline;
        for (;;) {
            Baton__ClientMessage *m = NULL;
            int ms;
            now = bt_time_ns();
            if (now >= resend)
                break;
            ms = (int)((resend - now + 999999) / 1000000);
            if (client_recv(c, ms, &m) != BT_OK)
                break;
            /* Any status reply will do: an older request's is as fresh. */
            if (m->body_case == BATON__CLIENT_MESSAGE__BODY_STATUS)
                return m;
            proto_client_free(&m);
        }
    }
}

static int parse_pair(const char *s, int *a, int *b)
{
    char buf[64], *comma;

    if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
        return -1;
    comma = strchr(buf, ',');
    if (comma == NULL)
        return -1;
    *comma = '\0';
    if (bt_parse_int(buf, a) != BT_OK || bt_parse_int(comma + 1, b) != BT_OK ||
        *a < 0 || *b < 0)
        return -1;
    return 0;
}

int cli_status_main(int argc, char **argv)
{
    static const struct option long_opts[] = {
        { "router", required_argument, NULL, 'r' },
        { "wait-workers", required_argument, NULL, 'w' },
        { "timeout", required_argument, NULL, 't' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *router = getenv("BATON_ROUTER");
    bool wait = false, json = false;
    int want_p = 0, want_d = 0, ret = 1;
    double timeout_s = 30.0;
    uint64_t deadline;
    client_t *c = NULL;
    Baton__ClientMessage *m = NULL;
    status_counts_t n;
    struct timespec poll = { 0, STATUS_POLL_MS * 1000000L };

    optind = 1;
    for (;;) {
        int opt = getopt_long(argc, argv, "", long_opts, NULL);
        if (opt == -1)
            break;
        switch (opt) {
        case 'r': router = optarg; break;
        case 'w':
            if (parse_pair(optarg, &want_p, &want_d) != 0) {
                fprintf(stderr, "baton status: --wait-workers wants P,D "
                                "(two counts >= 0), not '%s'\n", optarg);
                return 2;
            }
            wait = true;
            break;
        case 't':
            if (bt_parse_double(optarg, &timeout_s) != BT_OK ||
                !(timeout_s > 0 && timeout_s <= 1e6)) {
                fprintf(stderr, "baton status: bad --timeout '%s'\n", optarg);
                return 2;
            }
            break;
        case 'j': json = true; break;
        case 'h': status_usage(stdout); return 0;
        default: status_usage(stderr); return 2;
        }
    }
    if (optind < argc || router == NULL || router[0] == '\0') {
        fprintf(stderr, "baton status: need --router (or BATON_ROUTER)\n");
        status_usage(stderr);
        return 2;
    }
    deadline = bt_time_ns() + (uint64_t)(timeout_s * 1e9);
    if (client_create(router, &c) != BT_OK) {
        fprintf(stderr, "baton status: cannot connect to %s\n", router);
        return 1;
    }
    for (;;) {
        Baton__ClientMessage *next = status_fetch(c, deadline);
        bool ready;
        if (next != NULL) {
            proto_client_free(&m);
            m = next;
        } else if (m == NULL) {
            fprintf(stderr, "baton status: no answer from the router at %s "
                            "in %g s\n", router, timeout_s);
            goto out;
        }
        status_count(m->status, &n);
        ready = !wait ||
                (n.prefill_capable >= want_p && n.decode >= want_d);
        if (ready || next == NULL || bt_time_ns() >= deadline) {
            if (json)
                status_print_json(router, m->status, &n,
                                  wait ? (int)ready : -1);
            else
                status_print_text(router, m->status, &n);
            fflush(stdout);
            if (!ready)
                fprintf(stderr, "baton status: %d/%d prefill-capable and "
                                "%d/%d decode workers after %g s\n",
                        n.prefill_capable, want_p, n.decode, want_d,
                        timeout_s);
            ret = ready ? 0 : 1;
            goto out;
        }
        nanosleep(&poll, NULL);
    }
out:
    proto_client_free(&m);
    client_destroy(&c);
    return ret;
}
