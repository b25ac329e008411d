/*
 * test_grammar_json.c - the json_object pushdown recognizer: valid and
 * invalid documents, the whitespace policy, the depth limit, state values
 * (equal parser states are equal values), and random walks whose every
 * finished output parses with cJSON as an object.
 */
#include <cJSON.h>
#include <stdint.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "grammar_test_util.h"

static const char *const valid[] = {
    "{}",
    "{\"a\":1}",
    "{\"a\": 1, \"b\": [true, false, null]}",
    "{\"s\":\"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD7FF\"}",
    "{\"n\":[0,-0,1.5,-2e10,3E+2,4.0e-1,123]}",
    "{\"o\":{\"p\":{\"q\":[[],[{}]]}}}",
    "{\"u\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}",
    "{\"\":\"\"}",
};

static const char *const invalid[] = {
    "[]", "1", "\"s\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}",
    "{a:1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":-}",
    "{\"a\":tru}", "{\"a\":True}", "{\"a\":[1,]}", "{\"a\":[,1]}",
    "{\"a\":1}}", "{\"a\":1} ", " {}", "{ }", "{\"a\" :1}", "{\"a\":  1}",
    "{\"a\":1 ,\"b\":2}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}",
    "{\"a\":\"\\u12\"}", "{\"a\":\"\\uD800\"}", "{\"a\":\"\xc0\xaf\"}",
    "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}",
    "{\"a\":\"\xe2\x82\"}", "{\"a\":[}", "{\"a\":{]}",
};

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void test_depth(void)
{
    grammar_t *g = gt_grammar(GRAMMAR_JSON_OBJECT, "");
    char doc[256];
    int n = 0;

    /* GRAMMAR_JSON_MAX_DEPTH levels in all are fine, one more is not */
    doc[n++] = '{';
    doc[n++] = '"';
    doc[n++] = 'a';
    doc[n++] = '"';
    doc[n++] = ':';
    for (int i = 1; i < GRAMMAR_JSON_MAX_DEPTH; i++)
        doc[n++] = '[';
    for (int i = 1; i < GRAMMAR_JSON_MAX_DEPTH; i++)
        doc[n++] = ']';
    doc[n++] = '}';
    doc[n] = '\0';
    BT_CHECK(gt_matches(g, doc));
    n = 5;
    for (int i = 0; i < GRAMMAR_JSON_MAX_DEPTH; i++)
        doc[n++] = '[';
    doc[n] = '\0';
    BT_CHECK(!gt_prefix_ok(g, doc));
    doc[n - 1] = '\0';
    BT_CHECK(gt_prefix_ok(g, doc));
    grammar_destroy(&g);
}

/* The same parser state reached by different bytes is the same value
 * (the mask cache's key). */
static void test_state_values(void)
{
    grammar_t *g = gt_grammar(GRAMMAR_JSON_OBJECT, "");
    grammar_state_t a = grammar_start(g), b = grammar_start(g);
    const char *x = "{\"k\":[{\"z\":[1]}],\"q\":", *y = "{\"a\":\"b\",\"c\":";

    BT_CHECK(grammar_advance_bytes(g, &a, x, strlen(x)));
    BT_CHECK(grammar_advance_bytes(g, &b, y, strlen(y)));
    BT_CHECK(grammar_state_eq(a, b));
    BT_CHECK(grammar_advance_bytes(g, &a, "1}", 2));
    BT_CHECK(grammar_is_accepting(g, a));
    BT_CHECK(grammar_is_final(g, a));
    BT_CHECK(!grammar_is_accepting(g, b));
    grammar_destroy(&g);
}

static void test_random_walks(void)
{
    grammar_t *g = gt_grammar(GRAMMAR_JSON_OBJECT, "");
    char out[4096];
    int done = 0;

    for (int w = 0; w < 300; w++) {
        grammar_state_t st = grammar_start(g);
        size_t len = 0;

        while (len + 1 < sizeof(out) && !grammar_is_accepting(g, st)) {
            uint8_t ok[256];
            int n_ok = 0;
            for (int b = 0; b < 256; b++) {
                grammar_state_t s = st;
                uint8_t c = (uint8_t)b;
                if (grammar_advance_bytes(g, &s, &c, 1))
                    ok[n_ok++] = c;
            }
            BT_CHECK(n_ok > 0);
            /* favour closing brackets so walks end */
            out[len] = (char)ok[rnd() % (uint32_t)n_ok];
            for (int k = 0; k < n_ok; k++)
                if ((ok[k] == '}' || ok[k] == ']' || ok[k] == '"') &&
                    rnd() % 3 == 0)
                    out[len] = (char)ok[k];
            BT_CHECK(grammar_advance_bytes(g, &st, &out[len], 1));
            len++;
        }
        out[len] = '\0';
        if (!grammar_is_accepting(g, st))
            continue;
        {
            cJSON *doc = cJSON_ParseWithLength(out, len);
            if (doc == NULL || !cJSON_IsObject(doc))
                BT_TEST_FAIL("walk produced '%s', not a JSON object", out);
            cJSON_Delete(doc);
        }
        done++;
    }
    BT_CHECK(done >= 200);
    printf("random walks: %d of 300 finished, all parse\n", done);
    grammar_destroy(&g);
}

int main(void)
{
    grammar_t *g;

    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    g = gt_grammar(GRAMMAR_JSON_OBJECT, "");
    BT_CHECK(grammar_regex(g) == NULL);
    for (size_t i = 0; i < BT_ARRAY_SIZE(valid); i++) {
        cJSON *doc = cJSON_Parse(valid[i]);
        if (!gt_matches(g, valid[i]))
            BT_TEST_FAIL("should accept '%s'", valid[i]);
        BT_CHECK(doc != NULL); /* the test's own data is JSON */
        cJSON_Delete(doc);
    }
    for (size_t i = 0; i < BT_ARRAY_SIZE(invalid); i++)
        if (gt_matches(g, invalid[i]))
            BT_TEST_FAIL("should refuse '%s'", invalid[i]);
    grammar_destroy(&g);
    test_depth();
    test_state_values();
    test_random_walks();
    BT_ASSERT_EQ(bt_alloc_live_bytes(), 0);
    printf("ok\n");
    return 0;
}
