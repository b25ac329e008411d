/*
 * test_stop_first.c - stop strings and the prefill-sampled first token,
 * through a real router, prefill and decode worker.  The first token is
 * sampled by the prefill worker and relayed by the router, the rest come
 * from the decode worker; the stop-string matcher (worker/stop.h) must see
 * all of them as one text, as `baton run` does:
 *   1. a stop string inside the first token's text ends the request
 *      after that token with the text before the match;
 *   2. one that starts in the first token and ends in the second is
 *      found, and the first token's part of it is never shown;
 *   3. the first token's text alone matching the whole stop string, and
 *      a match in the first token with max_tokens 1 (stop, not length);
 *   4. text held back (a possible stop string) and then ended by a stop
 *      id goes out (a TokenOut with no ids, only text);
 *   5. kill -9 of the decode worker while the matcher holds text back:
 *      the held text is carried to the next decode worker through the
 *      router (TokenOut.stop_held -> KvReady.stop_held), so the client
 *      still gets every byte exactly once.
 * Every expected text and finish comes from `baton run` on the same
 * model and prompt.
 */
#include "cluster_util.h"

#define TEXT_MAX 4096

static char g_model[512], g_tok[512];

typedef struct {
    char text[TEXT_MAX];
    int n_ids;
    int ids[CU_MAX_IDS];
    char finish[16];    /* "stop", "length" */
    int retries;
} run_out_t;

/* Runs `baton run` (the reference) and parses its text (stdout) and its
 * --stats line (stderr: "generated:N finish:R"). */
static void ref_run(const char *prompt, int max_tokens, const char *stop,
                    int stop_id, run_out_t *out)
{
    char path[600], maxs[16], sid[16], err[4096];
    char *args[24];
    int n = 0, po[2], pe[2], st;
    size_t len = 0, elen = 0;
    ssize_t k;
    pid_t pid;
    const char *g, *f;

    memset(out, 0, sizeof(*out));
    snprintf(path, sizeof(path), "%s/baton", BT_BIN_DIR);
    snprintf(maxs, sizeof(maxs), "%d", max_tokens);
    snprintf(sid, sizeof(sid), "%d", stop_id);
    args[n++] = path;
    args[n++] = "run";
    args[n++] = "--model";
    args[n++] = g_model;
    args[n++] = "--tokenizer";
    args[n++] = g_tok;
    args[n++] = "--prompt";
    args[n++] = (char *)prompt;
    args[n++] = "--max-tokens";
    args[n++] = maxs;
    args[n++] = "--stats";
    if (stop != NULL) {
        args[n++] = "--stop";
        args[n++] = (char *)stop;
    }
    if (stop_id >= 0) {
        args[n++] = "--stop-id";
        args[n++] = sid;
    }
    args[n] = NULL;
    BT_CHECK(pipe(po) == 0 && pipe(pe) == 0);
    pid = fork();
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        execv(path, args);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    while ((k = read(po[0], out->text + len, TEXT_MAX - 1 - len)) > 0)
        len += (size_t)k;
    while ((k = read(pe[0], err + elen, sizeof(err) - 1 - elen)) > 0)
        elen += (size_t)k;
    close(po[0]);
    close(pe[0]);
    BT_CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
             WEXITSTATUS(st) == 0);
    if (len > 0 && out->text[len - 1] == '\n')
        len--; /* baton run ends the text's line */
    out->text[len] = '\0';
    err[elen] = '\0';
    g = strstr(err, "generated:");
    f = strstr(err, "finish:");
    BT_CHECK(g != NULL && f != NULL);
    out->n_ids = atoi(g + strlen("generated:"));
    sscanf(f + strlen("finish:"), "%15s", out->finish);
}

/* The ids `baton run` generates (greedy, no stop strings). */
static void ref_ids(const char *prompt, int max_tokens, int *ids, int *n)
{
    char cmd[2048], buf[4096];
    FILE *f;

    snprintf(cmd, sizeof(cmd), "'%s/baton' run --model '%s' --tokenizer '%s' "
             "--prompt '%s' --max-tokens %d --ids", BT_BIN_DIR, g_model,
             g_tok, prompt, max_tokens);
    f = popen(cmd, "r");
    BT_CHECK(f != NULL);
    *n = 0;
    if (fgets(buf, sizeof(buf), f) != NULL)
        for (char *p = strtok(buf, " \n"); p && *n < CU_MAX_IDS;
             p = strtok(NULL, " \n"))
            ids[(*n)++] = atoi(p);
    pclose(f);
}

static uint64_t submit(client_t *c, const char *prompt, int max_tokens,
                       const char *stop, int stop_id)
{
    client_request_t req;
    uint64_t rid;
    const char *stops[1] = { stop };

    client_request_init(&req);
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.want_text = true;
    if (stop != NULL) {
        req.stop_strings = stops;
        req.n_stop_strings = 1;
    }
    if (stop_id >= 0) {
        req.stop_ids = &stop_id;
        req.n_stop_ids = 1;
    }
    BT_ASSERT_OK(client_submit(c, &req, &rid));
    return rid;
}

/* Takes one message of request rid into out; returns 1 when it ended. */
static int take(const Baton__ClientMessage *m, uint64_t rid, run_out_t *out)
{
    if (client_msg_request_id(m) != rid)
        return 0;
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_CHUNK) {
        const Baton__TokenChunk *c = m->chunk;
        size_t len = strlen(out->text);
        BT_ASSERT_EQ((int)c->index, out->n_ids); /* no gap, no duplicate */
        for (size_t k = 0; k < c->n_ids && out->n_ids < CU_MAX_IDS; k++)
            out->ids[out->n_ids++] = c->ids[k];
        if (c->has_text) {
            BT_CHECK(len + c->text.len < TEXT_MAX);
            memcpy(out->text + len, c->text.data, c->text.len);
            out->text[len + c->text.len] = '\0';
        }
        return 0;
    }
    if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED) {
        snprintf(out->finish, sizeof(out->finish), "%s",
                 client_finish_name(m->finished->reason));
        if (m->finished->timings != NULL)
            out->retries = (int)m->finished->timings->retries;
        return 1;
    }
    BT_TEST_FAIL("request %llu failed: %s", (unsigned long long)rid,
                 m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR &&
                         m->error->message
                     ? m->error->message
                     : "?");
    return 1;
}

static void collect(client_t *c, uint64_t rid, run_out_t *out)
{
    for (;;) {
        Baton__ClientMessage *m = NULL;
        int end;
        if (client_recv(c, 20000, &m) != BT_OK)
            BT_TEST_FAIL("request %llu: no reply", (unsigned long long)rid);
        end = take(m, rid, out);
        proto_client_free(&m);
        if (end)
            return;
    }
}

/* One request through the cluster must equal `baton run` (whose
 * "generated" counts a stop id; the cluster does not stream it, so
 * `id_at`, when >= 0, is the number of ids expected instead). */
static void check_case(client_t *c, const char *what, const char *prompt,
                       int max_tokens, const char *stop, int stop_id,
                       int id_at)
{
    run_out_t want, got;

    ref_run(prompt, max_tokens, stop, stop_id, &want);
    if (id_at >= 0)
        want.n_ids = id_at;
    memset(&got, 0, sizeof(got));
    collect(c, submit(c, prompt, max_tokens, stop, stop_id), &got);
    fprintf(stderr, "%s: stop \"%s\": cluster \"%s\" %d ids %s, baton run "
            "\"%s\" %d ids %s\n", what, stop ? stop : "", got.text,
            got.n_ids, got.finish, want.text, want.n_ids, want.finish);
    BT_ASSERT_STREQ(got.text, want.text);
    BT_ASSERT_EQ(got.n_ids, want.n_ids);
    BT_ASSERT_STREQ(got.finish, want.finish);
}

int main(void)
{
    static const char *prompt = "The robot";
    static const char *long_prompt = "Once upon a time";
    char listen[64], control[64], stop[TEXT_MAX + 2];
    run_out_t one, two, all, want, got;
    int ids[CU_MAX_IDS], n_ids;
    size_t l1;
    client_t *c = NULL, *ctl = NULL;
    pid_t d0;

    cu_init();
    snprintf(g_model, sizeof(g_model), "%s/models/aidreams260K.bin",
             BT_SHARED_DIR);
    snprintf(g_tok, sizeof(g_tok), "%s/models/aidreams-tok512.bin",
             BT_SHARED_DIR);
    /* The reference: the first token's text (at least 2 bytes for this
     * prompt), the first two tokens' text, the ids. */
    ref_run(prompt, 1, NULL, -1, &one);
    ref_run(prompt, 2, NULL, -1, &two);
    ref_ids(prompt, 10, ids, &n_ids);
    l1 = strlen(one.text);
    fprintf(stderr, "first token \"%s\", first two \"%s\"\n", one.text,
            two.text);
    BT_CHECK(l1 >= 2 && strlen(two.text) >= l1 + 2 && n_ids >= 3);

    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "3", NULL);
    cu_spawn("baton-prefill", "--router", control, "--model", g_model,
             "--tokenizer", g_tok, "--threads", "1", "--name", "p0", NULL);
    d0 = cu_spawn("baton-decode", "--router", control, "--model", g_model,
                  "--tokenizer", g_tok, "--threads", "1", "--name", "d0",
                  "--step-delay-ms", "40", NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    cu_wait_workers(ctl, 1, 1, 20000);

    /* 1: inside the first token (its text from byte 1 on). */
    check_case(c, "inside", prompt, 10, one.text + 1, -1, -1);
    /* 2: spanning tokens 1 and 2: the first token's last byte and the
     * second's first two. */
    snprintf(stop, sizeof(stop), "%.3s", two.text + l1 - 1);
    check_case(c, "spanning", prompt, 10, stop, -1, -1);
    /* 3: exactly the first token; a match in it with max_tokens 1. */
    check_case(c, "whole", prompt, 10, one.text, -1, -1);
    check_case(c, "max1", prompt, 1, one.text + 1, -1, -1);
    check_case(c, "max1-miss", prompt, 1, "\x01", -1, -1);
    /* 4: the first two tokens' text held back (a longer stop string
     * starts with it), then the third token is a stop id. */
    snprintf(stop, sizeof(stop), "%s\x01", two.text);
    {
        int at = 0;
        while (ids[at] != ids[2])
            at++;
        check_case(c, "held-then-id", prompt, 10, stop, ids[2], at);
    }

    /* 5: a stop string that the whole output is a prefix of (so the
     * matcher holds everything back until the end), and the decode
     * worker killed mid-stream. */
    ref_run(long_prompt, 40, NULL, -1, &all);
    BT_CHECK(strlen(all.text) > 20 && strlen(all.text) + 2 < 256);
    snprintf(stop, sizeof(stop), "%s\x01", all.text);
    ref_run(long_prompt, 40, stop, -1, &want);
    BT_ASSERT_STREQ(want.text, all.text);
    memset(&got, 0, sizeof(got));
    {
        uint64_t rid = submit(c, long_prompt, 40, stop, -1);
        int ended = 0;
        while (got.n_ids < 5) {
            Baton__ClientMessage *m = NULL;
            if (client_recv(c, 20000, &m) != BT_OK)
                BT_TEST_FAIL("no tokens from d0");
            ended = take(m, rid, &got);
            proto_client_free(&m);
            BT_CHECK(!ended);
        }
        /* Freeze d0 while d1 starts (start-up may take seconds on a
         * loaded machine), then kill it. */
        kill(d0, SIGSTOP);
        cu_spawn("baton-decode", "--router", control, "--model", g_model,
                 "--tokenizer", g_tok, "--threads", "1", "--name", "d1",
                 NULL);
        BT_CHECK(got.n_ids < want.n_ids);
        BT_ASSERT_STREQ(got.text, ""); /* all held back so far */
        cu_kill(d0, SIGKILL);
        collect(c, rid, &got);
    }
    fprintf(stderr, "failover: %d ids, %d retries, \"%s\"\n", got.n_ids,
            got.retries, got.text);
    BT_ASSERT_EQ(got.retries, 1);
    BT_ASSERT_STREQ(got.text, want.text);
    BT_ASSERT_EQ(got.n_ids, want.n_ids);
    BT_ASSERT_STREQ(got.finish, want.finish);
    cu_wait_workers(ctl, 1, 1, 20000);
    cu_wait_kv_idle(ctl, 5000);
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/stop_first: stop strings in and across the "
                 "prefill-sampled first token, held text across failover");
    return 0;
}
