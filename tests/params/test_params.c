/*
 * test_params.c - the parameter contract (params/params.h): every row of
 * the bounds table is accepted at its edges and refused just outside with
 * a message naming the parameter and quoting the row; the defaults are
 * the table's; the stop lists are bounded; the protobuf conversions keep
 * every field; sampler_params_validate is the same validator.
 */
#include <math.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "params_proto.h"
#include "sampler.h"

/* Sets the field of `p` that the table row `name` bounds. */
static void set_value(params_t *p, const char *name, double v)
{
    params_sampling_t *s = &p->sampling;

    if (strcmp(name, "temperature") == 0)
        s->temperature = (float)v;
    else if (strcmp(name, "top_k") == 0)
        s->top_k = (int)v;
    else if (strcmp(name, "top_p") == 0)
        s->top_p = (float)v;
    else if (strcmp(name, "min_p") == 0)
        s->min_p = (float)v;
    else if (strcmp(name, "repetition_penalty") == 0)
        s->repetition_penalty = (float)v;
    else if (strcmp(name, "presence_penalty") == 0)
        s->presence_penalty = (float)v;
    else if (strcmp(name, "frequency_penalty") == 0)
        s->frequency_penalty = (float)v;
    else if (strcmp(name, "max_tokens") == 0)
        p->max_tokens = (int)v;
    else if (strcmp(name, "top_logprobs") == 0)
        s->top_logprobs = (int)v;
    else if (strcmp(name, "prompt_logprobs") == 0)
        s->prompt_top_logprobs = (int)v;
    else
        BT_TEST_FAIL("table row %s has no field in params_t", name);
}

/* A value just outside a bound (integers step by 1). */
static double outside(const params_bound_t *b, double edge, int dir)
{
    bool integer = strcmp(b->name, "top_k") == 0 ||
                   strcmp(b->name, "max_tokens") == 0 ||
                   strstr(b->name, "logprobs") != NULL;
    return integer ? edge + dir : edge + dir * 0.01;
}

static void expect_refused(const params_t *p, const params_bound_t *b,
                           double v)
{
    char err[160], want[160];
    const char *param = NULL;

    BT_ASSERT_EQ(params_validate(p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(param, b->name);
    snprintf(want, sizeof(want), "%s is %g, must be in %c%.10g, %.10g]",
             b->name, v, b->min_open ? '(' : '[', b->min, b->max);
    BT_ASSERT_STREQ(err, want);
    BT_ASSERT_EQ(params_check(b->name, v, err, sizeof(err)),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(err, want);
}

static void test_table(void)
{
    int n;
    const params_bound_t *t = params_bounds(&n);
    params_t p;

    BT_CHECK(n >= 8);
    params_init(&p);
    BT_ASSERT_OK(params_validate(&p, NULL, 0, NULL));
    for (int i = 0; i < n; i++) {
        const params_bound_t *b = &t[i];
        char err[160];

        BT_CHECK(params_bound(b->name) == b);
        BT_CHECK(b->min < b->max && b->def >= b->min && b->def <= b->max);
        /* the defaults are the table's */
        params_init(&p);
        set_value(&p, b->name, b->def);
        BT_ASSERT_OK(params_validate(&p, err, sizeof(err), NULL));
        /* both edges (an open one just inside), then just outside */
        params_init(&p);
        set_value(&p, b->name, b->max);
        BT_ASSERT_OK(params_validate(&p, err, sizeof(err), NULL));
        params_init(&p);
        set_value(&p, b->name, b->min_open ? b->min + 1e-3 : b->min);
        BT_ASSERT_OK(params_validate(&p, err, sizeof(err), NULL));
        params_init(&p);
        set_value(&p, b->name, outside(b, b->max, +1));
        expect_refused(&p, b, outside(b, b->max, +1));
        params_init(&p);
        set_value(&p, b->name, b->min_open ? b->min : outside(b, b->min, -1));
        expect_refused(&p, b, b->min_open ? b->min : outside(b, b->min, -1));
        printf("%-20s %c%.10g, %.10g] default %g (%s): ok\n", b->name,
               b->min_open ? '(' : '[', b->min, b->max, b->def, b->off);
    }
    /* NaN and infinities never pass */
    params_init(&p);
    p.sampling.top_p = NAN;
    BT_ASSERT_EQ(params_validate(&p, NULL, 0, NULL), BT_ERR_INVALID_ARG);
    p.sampling.top_p = 1;
    p.sampling.temperature = INFINITY;
    BT_ASSERT_EQ(params_validate(&p, NULL, 0, NULL), BT_ERR_INVALID_ARG);
    BT_CHECK(params_bound("no_such") == NULL);
}

/* Issue 41's case: the one message every front end shows. */
static void test_repetition_penalty_20(void)
{
    params_sampling_t s;
    char err[160];
    const char *param;

    params_sampling_init(&s);
    s.repetition_penalty = 20;
    BT_ASSERT_EQ(params_sampling_validate(&s, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(param, "repetition_penalty");
    BT_ASSERT_STREQ(err, "repetition_penalty is 20, must be in (0, 10]");
    /* the engine's validator is this one (and logs it) */
    BT_ASSERT_EQ(sampler_params_validate(&s), BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(bt_error_last(), err) != NULL);
}

static void test_stop_lists(void)
{
    params_t p;
    char err[160];
    const char *param;

    params_init(&p);
    p.n_stop_strings = PARAMS_MAX_STOP_STRINGS;
    for (int i = 0; i < p.n_stop_strings; i++) {
        p.stop_strings[i].data = "END";
        p.stop_strings[i].len = 3;
    }
    p.n_stop_ids = PARAMS_MAX_STOP_IDS;
    BT_ASSERT_OK(params_validate(&p, err, sizeof(err), &param));
    p.n_stop_strings++;
    BT_ASSERT_EQ(params_validate(&p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(param, "stop");
    p.n_stop_strings--;
    p.stop_strings[3].len = 0;
    BT_ASSERT_EQ(params_validate(&p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    p.stop_strings[3].len = PARAMS_MAX_STOP_LEN + 1;
    BT_ASSERT_EQ(params_validate(&p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    p.stop_strings[3].len = PARAMS_MAX_STOP_LEN;
    BT_ASSERT_OK(params_validate(&p, err, sizeof(err), &param));
    p.n_stop_ids++;
    BT_ASSERT_EQ(params_validate(&p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(param, "stop_token_ids");
    p.n_stop_ids = 1;
    p.stop_ids[0] = -3;
    BT_ASSERT_EQ(params_validate(&p, err, sizeof(err), &param),
                 BT_ERR_INVALID_ARG);
}

/* to_proto then from_proto keeps every field; a GenerateRequest's stop
 * lists come through, and more than the contract holds is refused. */
static void test_proto(void)
{
    params_sampling_t a, b;
    Baton__SamplingParams sp;
    Baton__SamplingParams absent = BATON__SAMPLING_PARAMS__INIT;
    Baton__GenerateRequest g = BATON__GENERATE_REQUEST__INIT;
    ProtobufCBinaryData strs[PARAMS_MAX_STOP_STRINGS + 1];
    int32_t ids[2] = {7, 9};
    params_t p;
    char err[160];

    params_sampling_init(&a);
    a.temperature = 0.7f;
    a.top_k = 40;
    a.top_p = 0.9f;
    a.min_p = 0.05f;
    a.repetition_penalty = 1.3f;
    a.presence_penalty = -0.5f;
    a.frequency_penalty = 1.5f;
    a.seed = 0xfeedfacecafebeefull;
    a.skip_special_tokens = false;
    a.logprobs = true;
    a.top_logprobs = 5;
    a.prompt_logprobs = true;
    a.prompt_top_logprobs = 20;
    params_sampling_to_proto(&a, &sp);
    params_sampling_from_proto(&sp, &b);
    BT_CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    BT_CHECK(b.logprobs && b.top_logprobs == 5 && b.prompt_logprobs &&
             b.prompt_top_logprobs == 20);
    /* an absent message and absent fields are the defaults */
    params_sampling_init(&a);
    params_sampling_from_proto(NULL, &b);
    BT_CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    params_sampling_from_proto(&absent, &b);
    BT_CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    BT_CHECK(b.skip_special_tokens);

    for (int i = 0; i <= PARAMS_MAX_STOP_STRINGS; i++) {
        strs[i].data = (uint8_t *)"xy";
        strs[i].len = 2;
    }
    g.sampling = &sp;
    g.max_tokens = 12;
    g.n_stop_ids = 2;
    g.stop_ids = ids;
    g.n_stop_strings = 2;
    g.stop_strings = strs;
    g.ignore_eos = 1;
    params_sampling_init(&a);
    params_sampling_to_proto(&a, &sp);
    BT_ASSERT_OK(params_from_generate(&g, &p, err, sizeof(err), NULL));
    BT_ASSERT_EQ(p.max_tokens, 12);
    BT_ASSERT_EQ(p.n_stop_ids, 2);
    BT_ASSERT_EQ(p.stop_ids[1], 9);
    BT_ASSERT_EQ(p.n_stop_strings, 2);
    BT_ASSERT_EQ(p.stop_strings[1].len, 2);
    BT_CHECK(p.ignore_eos);
    g.n_stop_strings = PARAMS_MAX_STOP_STRINGS + 1;
    BT_ASSERT_EQ(params_from_generate(&g, &p, err, sizeof(err), NULL),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "stop") != NULL);
    g.n_stop_strings = 0;
    g.max_tokens = -1;
    BT_ASSERT_EQ(params_from_generate(&g, &p, err, sizeof(err), NULL),
                 BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "max_tokens") != NULL);
}

int main(void)
{
    bt_log_init("test");
    test_table();
    test_repetition_penalty_20();
    test_stop_lists();
    test_proto();
    BT_ASSERT_EQ(bt_alloc_report(), 0);
    BT_TEST_PASS("params/params");
    return 0;
}
