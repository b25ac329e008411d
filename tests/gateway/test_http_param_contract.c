/*
 * test_http_param_contract.c - one parameter contract (issue 41 item 2):
 * a value outside params/params.h's bounds table is refused with the same
 * message by every entry point, quoted from the table:
 *   - baton-http: 400 invalid_request_error, "param" naming it;
 *   - the router (a client-library request, which the client does not
 *     check): an ERROR_INVALID reply;
 *   - `baton run` and `baton generate`: exit 2, the message on stderr.
 * The case of the issue is a repetition penalty of 20 (it passed
 * baton-http and the router and was refused by the prefill worker); a few
 * other rows follow.  A null-model cluster: no weights needed.
 */
#include "gateway/http_util.h"
#include "params.h"

/* The refusal message baton-http gives for `field` = `value` (JSON). */
static void http_refusal(int port, const char *field, const char *value,
                         char *msg, size_t cap)
{
    char body[256];
    ht_resp_t r;
    cJSON *j, *e;

    snprintf(body, sizeof(body), "{\"prompt\":[1,5,9],\"max_tokens\":4,"
             "\"%s\":%s}", field, value);
    BT_ASSERT_EQ(ht_request(port, "POST", "/v1/completions", body, &r), 400);
    j = cJSON_Parse(r.body);
    e = cJSON_GetObjectItem(j, "error");
    BT_CHECK(e != NULL);
    BT_ASSERT_STREQ(cJSON_GetObjectItem(e, "type")->valuestring,
                    "invalid_request_error");
    BT_ASSERT_STREQ(cJSON_GetObjectItem(e, "param")->valuestring, field);
    snprintf(msg, cap, "%s", cJSON_GetObjectItem(e, "message")->valuestring);
    cJSON_Delete(j);
    ht_resp_free(&r);
}

/* The router's answer to a library request carrying the bad value. */
static void router_refusal(client_t *c, const client_request_t *req,
                           char *msg, size_t cap)
{
    Baton__ClientMessage *m = NULL;
    uint64_t rid, t_end = bt_time_ns() + 10000000000ull;

    BT_ASSERT_OK(client_submit(c, req, &rid));
    for (;;) {
        BT_CHECK(bt_time_ns() < t_end);
        if (client_recv(c, 200, &m) != BT_OK)
            continue;
        if (client_msg_request_id(m) == rid)
            break;
        proto_client_free(&m);
    }
    BT_ASSERT_EQ(m->body_case, BATON__CLIENT_MESSAGE__BODY_ERROR);
    BT_ASSERT_EQ(m->error->code, BATON__ERROR_CODE__ERROR_INVALID);
    snprintf(msg, cap, "%s", m->error->message);
    proto_client_free(&m);
}

/* stderr of a CLI command that must exit 2: its last line. */
static void cli_refusal(const char *cmd, const char *prog, char *msg,
                        size_t cap)
{
    char full[2048], line[512] = "", prefix[64];
    FILE *f;
    int rc;

    snprintf(full, sizeof(full), "%s 2>&1 >/dev/null", cmd);
    f = popen(full, "r");
    BT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        snprintf(msg, cap, "%s", line);
    rc = pclose(f);
    BT_CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
    msg[strcspn(msg, "\n")] = '\0';
    snprintf(prefix, sizeof(prefix), "%s: ", prog);
    BT_CHECK(strncmp(msg, prefix, strlen(prefix)) == 0);
    memmove(msg, msg + strlen(prefix), strlen(msg) - strlen(prefix) + 1);
}

typedef struct {
    const char *field;   /* JSON and table name */
    const char *option;  /* CLI option */
    const char *value;
    double v;
} bad_t;

static const bad_t bad[] = {
    {"repetition_penalty", "--repetition-penalty", "20", 20},
    {"temperature", "--temperature", "3", 3},
    {"top_p", "--top-p", "0", 0},
    {"min_p", "--min-p", "1.5", 1.5},
    {"presence_penalty", "--presence-penalty", "-2.5", -2.5},
};

int main(void)
{
    char listen[64], control[64], cmd[1024];
    char want[200], http[400], router[400], run[400], gen[400];
    client_t *c = NULL;
    int hport;

    cu_init();
    cu_router_addrs(listen, control);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--heartbeat-ms", "100", NULL);
    cu_spawn("baton-prefill", "--router", control, "--null-model", "--name",
             "p0", NULL);
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", NULL);
    hport = ht_start_gateway(listen, NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    cu_wait_workers(c, 1, 1, 20000);
    ht_wait_healthy(hport, 10000);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const bad_t *b = &bad[i];
        client_request_t req;
        static const int prompt[] = {1, 5, 9};

        /* the table's message, through the validator */
        BT_ASSERT_EQ(params_check(b->field, b->v, want, sizeof(want)),
                     BT_ERR_INVALID_ARG);

        http_refusal(hport, b->field, b->value, http, sizeof(http));

        client_request_init(&req);
        req.prompt_ids = prompt;
        req.n_prompt_ids = 3;
        req.max_tokens = 4;
        if (strcmp(b->field, "repetition_penalty") == 0)
            req.repetition_penalty = (float)b->v;
        else if (strcmp(b->field, "temperature") == 0)
            req.temperature = (float)b->v;
        else if (strcmp(b->field, "top_p") == 0)
            req.top_p = (float)b->v;
        else if (strcmp(b->field, "min_p") == 0)
            req.min_p = (float)b->v;
        else
            req.presence_penalty = (float)b->v;
        router_refusal(c, &req, router, sizeof(router));

        snprintf(cmd, sizeof(cmd), "%s/baton run --model %s/models/"
                 "aidreams260K.bin --prompt-ids '1 5 9' --max-tokens 4 "
                 "%s %s", BT_BIN_DIR, BT_SHARED_DIR, b->option, b->value);
        cli_refusal(cmd, "baton run", run, sizeof(run));
        snprintf(cmd, sizeof(cmd), "%s/baton generate --router %s "
                 "--prompt-ids '1 5 9' --max-tokens 4 %s %s", BT_BIN_DIR,
                 listen, b->option, b->value);
        cli_refusal(cmd, "baton generate", gen, sizeof(gen));

        printf("%s=%s\n  table:    %s\n  http:     %s\n  router:   %s\n"
               "  run:      %s\n  generate: %s\n", b->field, b->value, want,
               http, router, run, gen);
        BT_ASSERT_STREQ(http, want);
        BT_ASSERT_STREQ(router, want);
        BT_ASSERT_STREQ(run, want);
        BT_ASSERT_STREQ(gen, want);
        if (i == 0) /* issue 41's case */
            BT_ASSERT_STREQ(want,
                            "repetition_penalty is 20, must be in (0, 10]");
    }
    BT_ASSERT_STREQ(want, "presence_penalty is -2.5, must be in [-2, 2]");

    client_destroy(&c);
    cu_kill_all();
    BT_TEST_PASS("gateway/http_param_contract");
    return 0;
}
