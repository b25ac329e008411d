/*
 * test_grammar_schema.c - JSON schema -> regex: a set of schemas with
 * documents they must and must not accept, random walks through each
 * grammar whose every finished output must parse with cJSON, guided
 * choices, and refusals that name the unsupported keyword.
 */
#include <cJSON.h>
#include <stdint.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "grammar_test_util.h"

typedef struct {
    const char *schema;
    const char *yes[5];
    const char *no[5];
} case_t;

static const case_t cases[] = {
    { "{\"type\":\"integer\"}", { "0", "-12", "1234567890123456" },
      { "01", "1.5", "", "+1", "12345678901234567" } },
    { "{\"type\":\"number\"}", { "0", "-1.25", "3e10", "2.5E-3" },
      { ".5", "1.", "1e", "--1" } },
    { "{\"type\":\"boolean\"}", { "true", "false" }, { "True", "1" } },
    { "{\"type\":\"null\"}", { "null" }, { "nil", "" } },
    { "{\"type\":\"string\"}",
      { "\"\"", "\"hi \\\"x\\\" \\u00e9\"", "\"caf\xc3\xa9\"" },
      { "\"a", "\"\\q\"", "\"a\nb\"", "'a'" } },
    { "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
      { "\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"" },
      { "\"a\"", "\"abcd\"" } },
    { "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}",
      { "\"AB-123\"" }, { "\"ab-123\"", "\"AB-12\"" } },
    { "{\"type\":\"string\",\"format\":\"date\"}", { "\"2024-02-29\"" },
      { "\"2024-13-01\"", "\"24-01-01\"" } },
    { "{\"type\":\"string\",\"format\":\"uuid\"}",
      { "\"123e4567-e89b-12d3-a456-426614174000\"" }, { "\"123\"" } },
    { "{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1]}]}",
      { "\"red\"", "\"green\"", "1", "null", "{\"a\":[1]}" },
      { "\"blue\"", "red", "2" } },
    { "{\"const\":\"x.y\"}", { "\"x.y\"" }, { "\"xzy\"" } },
    { "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,"
      "\"maxItems\":3}",
      { "[1]", "[1,2]", "[1, 2,3]" }, { "[]", "[1,2,3,4]", "[1 ,2]" } },
    { "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}",
      { "[]", "[true]", "[false, true, true]" }, { "[,]", "[true,]" } },
    { "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
      "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
      "{\"type\":\"string\"}}},\"required\":[\"name\"]}",
      { "{\"name\":\"a\"}", "{\"name\":\"a\",\"age\":3}",
        "{\"name\": \"a\", \"tags\": [\"x\"]}",
        "{\"name\":\"a\",\"age\":3,\"tags\":[]}" },
      { "{}", "{\"age\":3}", "{\"age\":3,\"name\":\"a\"}",
        "{\"name\":\"a\",}", "{ \"name\":\"a\"}" } },
    { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
      "\"b\":{\"type\":\"integer\"}}}",
      { "{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}" },
      { "{,\"b\":2}", "{\"b\":2,\"a\":1}" } },
    { "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\","
      "\"maxLength\":1}]}", { "5", "\"x\"" }, { "\"xy\"", "true" } },
    { "{\"type\":[\"string\",\"null\"]}", { "\"s\"", "null" }, { "1" } },
    { "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":"
      "{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},\"required\":"
      "[\"x\",\"y\"],\"additionalProperties\":false}},\"type\":\"object\","
      "\"properties\":{\"from\":{\"$ref\":\"#/$defs/pt\"},\"to\":{\"$ref\":"
      "\"#/$defs/pt\"}},\"required\":[\"from\",\"to\"]}",
      { "{\"from\":{\"x\":1,\"y\":2},\"to\":{\"x\":-1.5,\"y\":0}}" },
      { "{\"from\":{\"x\":1},\"to\":{\"x\":1,\"y\":2}}" } },
    { "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\","
      "\"properties\":{\"id\":{\"type\":\"integer\"},\"ok\":{\"type\":"
      "\"boolean\"}},\"required\":[\"id\",\"ok\"]}},\"required\":[\"user\"],"
      "\"title\":\"t\",\"description\":\"d\"}",
      { "{\"user\":{\"id\":7,\"ok\":true}}" },
      { "{\"user\":{\"ok\":true,\"id\":7}}" } },
    { "{}", { "1", "\"s\"", "[1,\"a\"]", "{\"k\":1}", "null" },
      { "[[1]]", "{\"a\":{\"b\":1}}" } },
    { "{\"type\":\"object\"}", { "{}", "{\"a\":{\"b\":1}}" },
      { "[]", "{\"a\":{\"b\":[1]}}" } },
};

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Walks random bytes the grammar allows until it accepts and a coin
 * says stop; every finished output must be valid JSON.  Returns how many
 * of `n` walks finished within the length bound. */
static int random_walks(grammar_t *g, const char *schema, int n)
{
    char out[8192];
    int done = 0;

    for (int w = 0; w < n; w++) {
        grammar_state_t st = grammar_start(g);
        size_t len = 0;

        while (len + 1 < sizeof(out)) {
            uint8_t ok[256];
            int n_ok = 0;

            if (grammar_is_accepting(g, st) &&
                (grammar_is_final(g, st) || rnd() % 4 == 0))
                break;
            for (int b = 0; b < 256; b++) {
                grammar_state_t s = st;
                uint8_t c = (uint8_t)b;
                if (grammar_advance_bytes(g, &s, &c, 1))
                    ok[n_ok++] = c;
            }
            if (n_ok == 0)
                BT_TEST_FAIL("%s: live state with no byte after '%.*s'",
                             schema, (int)len, out);
            out[len] = (char)ok[rnd() % (uint32_t)n_ok];
            BT_CHECK(grammar_advance_bytes(g, &st, &out[len], 1));
            len++;
        }
        out[len] = '\0';
        if (!grammar_is_accepting(g, st))
            continue;
        {
            cJSON *doc = cJSON_ParseWithLength(out, len);
            if (doc == NULL)
                BT_TEST_FAIL("%s: walk produced invalid JSON '%s'", schema,
                             out);
            cJSON_Delete(doc);
        }
        done++;
    }
    return done;
}

static void test_refusals(void)
{
    static const struct {
        const char *schema;
        bt_status_t status;
        const char *what;
    } bad[] = {
        { "{\"type\":\"integer\",\"multipleOf\":2}", BT_ERR_UNSUPPORTED,
          "'multipleOf'" },
        { "{\"type\":\"number\",\"minimum\":0}", BT_ERR_UNSUPPORTED,
          "on a number" },
        { "{\"type\":\"integer\",\"minimum\":0.5}", BT_ERR_UNSUPPORTED,
          "must be an integer" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}",
          BT_ERR_INVALID_ARG, "no integer lies between" },
        { "{\"type\":\"string\",\"contentEncoding\":\"base64\"}",
          BT_ERR_UNSUPPORTED, "'contentEncoding'" },
        { "{\"type\":\"array\",\"uniqueItems\":true}", BT_ERR_UNSUPPORTED,
          "'uniqueItems'" },
        { "{\"type\":\"object\",\"patternProperties\":{}}",
          BT_ERR_UNSUPPORTED, "'patternProperties'" },
        { "{\"type\":\"integer\",\"maxLength\":3}", BT_ERR_UNSUPPORTED,
          "'maxLength' does not apply" },
        { "{\"type\":\"string\",\"format\":\"email\"}", BT_ERR_UNSUPPORTED,
          "'email'" },
        { "{\"type\":\"object\",\"additionalProperties\":{\"type\":"
          "\"integer\"}}", BT_ERR_UNSUPPORTED, "additionalProperties" },
        { "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":"
          "{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
          BT_ERR_UNSUPPORTED, "recursive $ref '#/$defs/n'" },
        { "{\"$ref\":\"#/$defs/missing\"}", BT_ERR_INVALID_ARG,
          "names no definition" },
        { "{\"$ref\":\"http://x/y\"}", BT_ERR_UNSUPPORTED, "http://x/y" },
        { "{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":2}]}",
          BT_ERR_UNSUPPORTED, "allOf" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":"
          "[\"b\"]}", BT_ERR_UNSUPPORTED, "'b' is not in properties" },
        { "{\"type\":\"strng\"}", BT_ERR_INVALID_ARG, "unknown type 'strng'" },
        { "{\"type\":\"array\",\"items\":[{\"type\":\"integer\"}]}",
          BT_ERR_UNSUPPORTED, "tuple form" },
        { "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}",
          BT_ERR_INVALID_ARG, "minLength > maxLength" },
        { "{\"type\": \"string\"", BT_ERR_INVALID_ARG, "not valid JSON" },
        { "{\"type\":\"string\",\"pattern\":\"(?=x)\"}", BT_ERR_UNSUPPORTED,
          "lookaround" },
        { "false", BT_ERR_INVALID_ARG, "must be an object or true" },
    };

    for (size_t i = 0; i < BT_ARRAY_SIZE(bad); i++)
        gt_refused(GRAMMAR_JSON_SCHEMA, bad[i].schema, bad[i].status,
                   bad[i].what);
}

/* Integer bounds against every value near them. */
static void test_integer_ranges(void)
{
    static const struct {
        const char *bounds;
        long long lo, hi;
    } r[] = {
        { "\"minimum\":0,\"maximum\":100", 0, 100 },
        { "\"minimum\":1,\"maximum\":12", 1, 12 },
        { "\"minimum\":-40,\"maximum\":125", -40, 125 },
        { "\"minimum\":-999,\"maximum\":-17", -999, -17 },
        { "\"exclusiveMinimum\":7,\"exclusiveMaximum\":1000", 8, 999 },
        { "\"minimum\":37,\"maximum\":4321", 37, 4321 },
        { "\"minimum\":100,\"maximum\":199", 100, 199 },
        { "\"minimum\":5,\"maximum\":5", 5, 5 },
        { "\"minimum\":-3,\"maximum\":0", -3, 0 },
        { "\"minimum\":1990,\"maximum\":2030", 1990, 2030 },
    };
    char schema[256], num[32];

    for (size_t i = 0; i < BT_ARRAY_SIZE(r); i++) {
        grammar_t *g;
        snprintf(schema, sizeof(schema), "{\"type\":\"integer\",%s}",
                 r[i].bounds);
        g = gt_grammar(GRAMMAR_JSON_SCHEMA, schema);
        for (long long v = r[i].lo - 1100; v <= r[i].hi + 1100; v++) {
            snprintf(num, sizeof(num), "%lld", v);
            if (gt_matches(g, num) != (v >= r[i].lo && v <= r[i].hi))
                BT_TEST_FAIL("%s: %lld %s (regex %s)", schema, v,
                             gt_matches(g, num) ? "accepted" : "refused",
                             grammar_regex(g));
        }
        BT_CHECK(!gt_matches(g, "-0"));
        BT_CHECK(!gt_matches(g, "05"));
        BT_CHECK(!gt_matches(g, "+5"));
        grammar_destroy(&g);
    }
    /* one-sided bounds reach the 16-digit limit */
    {
        grammar_t *g = gt_grammar(GRAMMAR_JSON_SCHEMA,
                                  "{\"type\":\"integer\",\"minimum\":100}");
        BT_CHECK(!gt_matches(g, "99"));
        BT_CHECK(gt_matches(g, "100"));
        BT_CHECK(gt_matches(g, "9999999999999999"));
        BT_CHECK(!gt_matches(g, "10000000000000000"));
        BT_CHECK(!gt_matches(g, "-100"));
        grammar_destroy(&g);
        g = gt_grammar(GRAMMAR_JSON_SCHEMA,
                       "{\"type\":\"integer\",\"maximum\":-2}");
        BT_CHECK(gt_matches(g, "-2"));
        BT_CHECK(gt_matches(g, "-9999999999999999"));
        BT_CHECK(!gt_matches(g, "-1"));
        BT_CHECK(!gt_matches(g, "0"));
        grammar_destroy(&g);
    }
}

static void test_choice(void)
{
    grammar_t *g = gt_grammar(GRAMMAR_CHOICE,
                              "[\"yes\",\"no\",\"a.b (c)\",\"\"]");

    BT_CHECK(gt_matches(g, "yes"));
    BT_CHECK(gt_matches(g, "no"));
    BT_CHECK(gt_matches(g, "a.b (c)"));
    BT_CHECK(gt_matches(g, ""));
    BT_CHECK(!gt_matches(g, "ye"));
    BT_CHECK(!gt_matches(g, "axb (c)"));
    grammar_destroy(&g);
    gt_refused(GRAMMAR_CHOICE, "[]", BT_ERR_INVALID_ARG, "non-empty");
    gt_refused(GRAMMAR_CHOICE, "[\"a\",2]", BT_ERR_INVALID_ARG,
               "choice 1 is not a string");
}

static void test_spec(void)
{
    grammar_kind_t kind;
    const char *text;
    grammar_t *g = NULL;

    BT_ASSERT_OK(grammar_spec_parse("json_schema:{\"type\":\"null\"}", &kind,
                                    &text));
    BT_ASSERT_EQ(kind, GRAMMAR_JSON_SCHEMA);
    BT_ASSERT_STREQ(text, "{\"type\":\"null\"}");
    BT_ASSERT_OK(grammar_spec_parse("json_object", &kind, &text));
    BT_ASSERT_EQ(kind, GRAMMAR_JSON_OBJECT);
    BT_ASSERT_OK(grammar_spec_parse("regex:a:b", &kind, &text));
    BT_ASSERT_STREQ(text, "a:b");
    BT_ASSERT_EQ(grammar_spec_parse("yaml:x", &kind, &text),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_OK(grammar_create_spec("choice:[\"x\"]", NULL, &g));
    BT_CHECK(gt_matches(g, "x"));
    grammar_destroy(&g);
}

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* refusals are asserted below */
    for (size_t i = 0; i < BT_ARRAY_SIZE(cases); i++) {
        grammar_t *g = gt_grammar(GRAMMAR_JSON_SCHEMA, cases[i].schema);
        int done;

        for (int k = 0; k < 5 && cases[i].yes[k] != NULL; k++)
            if (!gt_matches(g, cases[i].yes[k]))
                BT_TEST_FAIL("%s should accept '%s' (regex %s)",
                             cases[i].schema, cases[i].yes[k],
                             grammar_regex(g));
        for (int k = 0; k < 5 && cases[i].no[k] != NULL; k++)
            if (gt_matches(g, cases[i].no[k]))
                BT_TEST_FAIL("%s should refuse '%s'", cases[i].schema,
                             cases[i].no[k]);
        done = random_walks(g, cases[i].schema, 40);
        if (done < 20)
            BT_TEST_FAIL("%s: only %d of 40 random walks finished",
                         cases[i].schema, done);
        grammar_destroy(&g);
    }
    test_refusals();
    test_integer_ranges();
    test_choice();
    test_spec();
    BT_ASSERT_EQ(bt_alloc_live_bytes(), 0);
    printf("ok: %zu schemas\n", BT_ARRAY_SIZE(cases));
    return 0;
}
