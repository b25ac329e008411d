/*
 * chaos_load.c - the fault suite's load driver (tests/chaos/README.md).
 *
 * Sends requests with known prompts to a router through the client
 * library, `concurrency` in flight at a time (closed loop), and judges
 * every one against its reference (the ids `baton run` printed for the
 * same prompt, sampling and max tokens):
 *
 *   identical  Finished, and the streamed ids equal the reference
 *   wrong      Finished without error, but the ids differ (also: cut
 *              short, a chunk index gap or repeat, a Finished after
 *              fewer tokens than asked)
 *   failed     an Error message (code and text are recorded)
 *   hung       no Finished or Error within --hang-ms of its submission
 *
 * Runs for --requests N submissions or --duration-s S seconds, then waits
 * up to --hang-ms for the rest.  SIGUSR1 marks "the fault ended now": the
 * recovery time printed is from the last mark to the end of the first
 * request submitted after it that came back identical (-1: none did);
 * --mark sets one at the start.
 *
 * References (--refs FILE), one per line:
 *   TEMP SEED MAX_TOKENS | PROMPT IDS ... | EXPECTED IDS ...
 * Requests cycle through them.  Per-request results go to --out FILE:
 *   seq ref submit_ms end_ms ttft_ms state n_ids retries code "message"
 * and one summary line to stdout:
 *   sent=N identical=N wrong=N failed=N hung=N recovery_s=X mark_s=X
 *
 * Exits 0 when it ran (judging the counts is the caller's job), 2 on a
 * usage or setup error.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_log.h"
#include "bt_util.h"
#include "client.h"

#define LOAD_MAX_REFS 256
#define LOAD_MAX_IDS 1024
#define LOAD_MAX_CLIENTS 16

typedef struct {
    float temperature;          /* 0 = greedy */
    uint64_t seed;
    int max_tokens;
    int prompt[LOAD_MAX_IDS];   /* (n_prompt) */
    int n_prompt;
    int expect[LOAD_MAX_IDS];   /* (n_expect) */
    int n_expect;
} load_ref_t;

enum { ST_PENDING, ST_IDENTICAL, ST_WRONG, ST_FAILED, ST_HUNG };
static const char *state_name[] = { "pending", "identical", "wrong",
                                    "failed", "hung" };

typedef struct {
    int used;                   /* slot holds a request in flight */
    int seq;                    /* submission number */
    int ref;                    /* index into refs */
    int client;                 /* which client socket */
    uint64_t rid;               /* the client library's request id */
    uint64_t submit_ns;
    uint64_t first_ns;          /* first chunk, 0 = none yet */
    int ids[LOAD_MAX_IDS];      /* (n_ids) streamed so far */
    int n_ids;
    int next_index;
    int bad_index;              /* a chunk came with a gap or a repeat */
} load_slot_t;

static load_ref_t refs[LOAD_MAX_REFS];
static int n_refs;
static volatile sig_atomic_t mark_flag;
static volatile sig_atomic_t stop_flag;

static void on_usr1(int sig)
{
    (void)sig;
    mark_flag = 1;
}

static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int parse_ids(char *s, int *out, int max)
{
    int n = 0;
    char *save = NULL;

    for (char *t = strtok_r(s, " \t\n", &save); t != NULL;
         t = strtok_r(NULL, " \t\n", &save)) {
        if (n == max)
            return -1;
        out[n++] = atoi(t);
    }
    return n;
}

static int load_refs(const char *path)
{
    FILE *f = fopen(path, "r");
    static char line[65536];

    if (f == NULL) {
        fprintf(stderr, "chaos_load: %s: %s\n", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL && n_refs < LOAD_MAX_REFS) {
        char *a = line, *b = strchr(line, '|'), *c;
        load_ref_t *r = &refs[n_refs];
        unsigned long long seed = 0;

        if (b == NULL || (c = strchr(b + 1, '|')) == NULL)
            continue;
        *b++ = '\0';
        *c++ = '\0';
        if (sscanf(a, "%f %llu %d", &r->temperature, &seed,
                   &r->max_tokens) != 3)
            continue;
        r->seed = seed;
        r->n_prompt = parse_ids(b, r->prompt, LOAD_MAX_IDS);
        r->n_expect = parse_ids(c, r->expect, LOAD_MAX_IDS);
        if (r->n_prompt <= 0 || r->n_expect < 0)
            continue;
        n_refs++;
    }
    fclose(f);
    return n_refs > 0 ? 0 : -1;
}

static double ms_since(uint64_t t0, uint64_t t)
{
    return t == 0 ? -1.0 : (double)(t - t0) / 1e6;
}

int main(int argc, char **argv)
{
    const char *router = NULL, *refs_path = NULL, *out_path = NULL;
    int concurrency = 8, n_requests = 0, n_clients = 4, verbose = 0;
    double duration_s = 0, hang_ms = 60000;
    static load_slot_t slots[4096];
    client_t *clients[LOAD_MAX_CLIENTS] = { 0 };
    int counts[5] = { 0 };
    int sent = 0, in_flight = 0;
    uint64_t t0, mark_ns = 0, recovered_ns = 0;
    FILE *out = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-v") == 0) {
            verbose = 1;
            continue;
        }
        if (strcmp(a, "--mark") == 0) {
            mark_flag = 1;
            continue;
        }
        if (v == NULL)
            goto usage;
        i++;
        if (strcmp(a, "--router") == 0)
            router = v;
        else if (strcmp(a, "--refs") == 0)
            refs_path = v;
        else if (strcmp(a, "--out") == 0)
            out_path = v;
        else if (strcmp(a, "--concurrency") == 0)
            concurrency = atoi(v);
        else if (strcmp(a, "--requests") == 0)
            n_requests = atoi(v);
        else if (strcmp(a, "--duration-s") == 0)
            duration_s = atof(v);
        else if (strcmp(a, "--hang-ms") == 0)
            hang_ms = atof(v);
        else if (strcmp(a, "--clients") == 0)
            n_clients = atoi(v);
        else
            goto usage;
    }
    if (router == NULL || refs_path == NULL || concurrency < 1 ||
        concurrency > 4096 || n_clients < 1 ||
        n_clients > LOAD_MAX_CLIENTS || (n_requests <= 0 && duration_s <= 0))
        goto usage;
    bt_log_init("chaos_load");
    signal(SIGPIPE, SIG_IGN);
    signal(SIGUSR1, on_usr1);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (load_refs(refs_path) != 0) {
        fprintf(stderr, "chaos_load: no references in %s\n", refs_path);
        return 2;
    }
    if (out_path != NULL && (out = fopen(out_path, "w")) == NULL) {
        fprintf(stderr, "chaos_load: %s: %s\n", out_path, strerror(errno));
        return 2;
    }
    for (int i = 0; i < n_clients; i++)
        if (client_create(router, &clients[i]) != BT_OK) {
            fprintf(stderr, "chaos_load: cannot connect to %s\n", router);
            return 2;
        }
    t0 = bt_time_ns();

    for (;;) {
        uint64_t now = bt_time_ns();
        int submitting = !stop_flag &&
                         (n_requests > 0 ? sent < n_requests
                                         : now - t0 < duration_s * 1e9);
        struct pollfd pfd[LOAD_MAX_CLIENTS];

        if (mark_flag) {
            mark_flag = 0;
            mark_ns = now;
            recovered_ns = 0;
            if (verbose)
                fprintf(stderr, "chaos_load: mark at %.3f s\n",
                        (now - t0) / 1e9);
        }
        /* Keep `concurrency` in flight. */
        while (submitting && in_flight < concurrency) {
            load_slot_t *s = NULL;
            client_request_t req;
            const load_ref_t *r;

            for (int i = 0; i < concurrency && s == NULL; i++)
                if (!slots[i].used)
                    s = &slots[i];
            memset(s, 0, sizeof(*s));
            s->seq = sent;
            s->ref = sent % n_refs;
            s->client = sent % n_clients;
            r = &refs[s->ref];
            client_request_init(&req);
            req.prompt_ids = r->prompt;
            req.n_prompt_ids = r->n_prompt;
            req.max_tokens = r->max_tokens;
            req.ignore_eos = true;
            req.temperature = r->temperature;
            req.seed = r->seed;
            req.want_text = false;
            s->submit_ns = bt_time_ns();
            if (client_submit(clients[s->client], &req, &s->rid) != BT_OK) {
                /* A client that cannot even queue a send: a clear,
                 * local failure (counted, the loop goes on). */
                counts[ST_FAILED]++;
                if (out)
                    fprintf(out, "%d %d %.1f %.1f -1 failed 0 0 -1 "
                            "\"client_submit failed\"\n", s->seq, s->ref,
                            ms_since(t0, s->submit_ns),
                            ms_since(t0, bt_time_ns()));
                sent++;
                usleep(10000);
                break;
            }
            s->used = 1;
            sent++;
            in_flight++;
        }
        if (!submitting && in_flight == 0)
            break;

        /* Wait for any socket (edge-triggered fds: drain after). */
        for (int i = 0; i < n_clients; i++) {
            int fd = -1;
            client_fd(clients[i], &fd);
            pfd[i].fd = fd;
            pfd[i].events = POLLIN;
        }
        poll(pfd, (nfds_t)n_clients, 10);

        for (int ci = 0; ci < n_clients; ci++) {
            Baton__ClientMessage *m = NULL;
            while (client_recv(clients[ci], 0, &m) == BT_OK) {
                uint64_t rid = client_msg_request_id(m);
                load_slot_t *s = NULL;
                int state = ST_PENDING, code = 0;
                const char *msg = "";
                unsigned retries = 0;

                for (int i = 0; i < concurrency && s == NULL; i++)
                    if (slots[i].used && slots[i].client == ci &&
                        slots[i].rid == rid)
                        s = &slots[i];
                if (s == NULL) {
                    proto_client_free(&m);
                    continue;
                }
                now = bt_time_ns();
                if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
                    if ((int)m->chunk->index != s->next_index)
                        s->bad_index = 1;
                    if (s->first_ns == 0)
                        s->first_ns = now;
                    for (size_t k = 0; k < m->chunk->n_ids; k++)
                        if (s->n_ids < LOAD_MAX_IDS)
                            s->ids[s->n_ids++] = m->chunk->ids[k];
                    s->next_index = (int)m->chunk->index +
                                    (int)m->chunk->n_ids;
                } else if (m->body_case ==
                           BATON__CLIENT_MESSAGE__BODY_FINISHED) {
                    const load_ref_t *r = &refs[s->ref];
                    state = ST_IDENTICAL;
                    if (s->bad_index || s->n_ids != r->n_expect ||
                        memcmp(s->ids, r->expect,
                               sizeof(int) * (size_t)r->n_expect) != 0)
                        state = ST_WRONG;
                    if (m->finished->timings)
                        retries = m->finished->timings->retries;
                    msg = client_finish_name(m->finished->reason);
                } else if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
                    state = ST_FAILED;
                    code = m->error->code;
                    msg = m->error->message ? m->error->message : "";
                }
                if (state != ST_PENDING) {
                    counts[state]++;
                    if (state == ST_IDENTICAL && mark_ns != 0 &&
                        recovered_ns == 0 && s->submit_ns >= mark_ns)
                        recovered_ns = now;
                    if (out) {
                        fprintf(out, "%d %d %.1f %.1f %.1f %s %d %u %d \"",
                                s->seq, s->ref, ms_since(t0, s->submit_ns),
                                ms_since(t0, now),
                                s->first_ns ? ms_since(s->submit_ns,
                                                       s->first_ns)
                                            : -1.0,
                                state_name[state], s->n_ids, retries, code);
                        if (state == ST_FAILED)
                            fprintf(out, "%s: ", client_error_name(code));
                        for (const char *p = msg; *p; p++)
                            fputc(*p == '"' || *p == '\n' ? '\'' : *p, out);
                        fputs("\"\n", out);
                    }
                    if (verbose && state != ST_IDENTICAL)
                        fprintf(stderr, "chaos_load: request %d %s (%d "
                                "ids) %s\n", s->seq, state_name[state],
                                s->n_ids, msg);
                    s->used = 0;
                    in_flight--;
                }
                proto_client_free(&m);
            }
        }

        /* Requests past their deadline are hung: cancel and forget. */
        now = bt_time_ns();
        for (int i = 0; i < concurrency; i++) {
            load_slot_t *s = &slots[i];
            if (!s->used || (double)(now - s->submit_ns) < hang_ms * 1e6)
                continue;
            counts[ST_HUNG]++;
            client_cancel(clients[s->client], s->rid);
            if (out)
                fprintf(out, "%d %d %.1f %.1f %.1f hung %d 0 0 \"no answer "
                        "in %.0f ms\"\n", s->seq, s->ref,
                        ms_since(t0, s->submit_ns), ms_since(t0, now),
                        s->first_ns ? ms_since(s->submit_ns, s->first_ns)
                                    : -1.0, s->n_ids, hang_ms);
            if (verbose)
                fprintf(stderr, "chaos_load: request %d hung (%d ids)\n",
                        s->seq, s->n_ids);
            s->used = 0;
            in_flight--;
        }
    }

    printf("sent=%d identical=%d wrong=%d failed=%d hung=%d recovery_s=%.3f "
           "mark_s=%.3f elapsed_s=%.3f\n", sent, counts[ST_IDENTICAL],
           counts[ST_WRONG], counts[ST_FAILED], counts[ST_HUNG],
           mark_ns == 0 ? 0.0
           : recovered_ns == 0 ? -1.0 : (recovered_ns - mark_ns) / 1e9,
           mark_ns == 0 ? -1.0 : (mark_ns - t0) / 1e9,
           (bt_time_ns() - t0) / 1e9);
    fflush(stdout);
    if (out)
        fclose(out);
    for (int i = 0; i < n_clients; i++)
        client_destroy(&clients[i]);
    return 0;

usage:
    fprintf(stderr,
            "usage: chaos_load --router EP --refs FILE (--requests N | "
            "--duration-s S)\n"
            "       [--concurrency C] [--clients K] [--hang-ms MS] "
            "[--out FILE] [--mark] [-v]\n");
    return 2;
}
