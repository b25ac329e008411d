/*
 * test_grammar_regex.c - the regex subset and its lazy DFA: matches and
 * non-matches for each construct, UTF-8 characters, pruning of dead
 * branches, and clear refusals of unsupported syntax.
 */
#include "bt_alloc.h"
#include "bt_log.h"
#include "grammar_test_util.h"

typedef struct {
    const char *re;
    const char *yes[6];
    const char *no[6];
} case_t;

static const case_t cases[] = {
    { "abc", { "abc" }, { "", "ab", "abcd", "abd" } },
    { "a|bc|", { "a", "bc", "" }, { "b", "abc" } },
    { "(ab)*", { "", "ab", "abab" }, { "a", "aba" } },
    { "(?:ab)+c?", { "ab", "abc", "ababc" }, { "", "c", "abcc" } },
    { "x{3}", { "xxx" }, { "xx", "xxxx" } },
    { "x{2,4}", { "xx", "xxx", "xxxx" }, { "x", "xxxxx" } },
    { "x{2,}", { "xx", "xxxxxxxx" }, { "x", "" } },
    { "x{0,2}y", { "y", "xy", "xxy" }, { "xxxy" } },
    { "(a|b){0}c", { "c" }, { "ac" } },
    { "[a-c]+", { "a", "cab" }, { "", "d", "A" } },
    { "[^a-c]", { "d", "Z", "\xc3\xa9", "\xe2\x82\xac" },
      { "a", "dd", "\xc3" } },
    { "[-a]", { "-", "a" }, { "b" } },
    { "[a-]", { "-", "a" }, { "b" } },
    { "[]a]", { "]", "a" }, { "b" } },
    { "\\d+\\.\\d", { "12.5", "0.0" }, { "12.", ".5", "1x5" } },
    { "\\w\\s\\W", { "a !", "Z\t-" }, { "a bc", "ab!" } },
    { "[\\d\\s]+", { "1 2", "\n" }, { "a" } },
    { "[^\\d]", { "a", "\xf0\x9f\x98\x80" }, { "5" } },
    { ".", { "a", "\xc3\xa9", "\xf0\x9f\x98\x80" }, { "\n", "ab", "\xff" } },
    { ".{2}", { "ab", "\xc3\xa9\xc3\xa9" }, { "\xc3\xa9" } },
    { "caf\xc3\xa9", { "caf\xc3\xa9" }, { "cafe" } },
    { "\\u00e9\\x41", { "\xc3\xa9" "A" }, { "eA" } },
    { "\\{\"a\"\\}", { "{\"a\"}" }, { "{a}" } },
    { "^ab$", { "ab" }, { "^ab$" } },
    { "a\\$", { "a$" }, { "a" } },
    { "a+?b*?", { "a", "aab" }, { "b" } },
    { "(a|ab)(c|bcd)", { "abcd", "ac", "abc" }, { "ab", "abcdd" } },
    { "[a-z]*q[^\\x00-\\x7f]", { "q\xc3\xa9" }, { "qa" } },
};

/* Every live state can still reach a match: a prefix that cannot be
 * completed is refused at once. */
static void test_pruning(void)
{
    grammar_t *g = gt_grammar(GRAMMAR_REGEX, "a(b[^\\x00-\\x7f\\D]|c)");
    grammar_state_t st = grammar_start(g);

    BT_CHECK(grammar_advance_bytes(g, &st, "a", 1));
    BT_CHECK(!grammar_advance_bytes(g, &st, "b", 1)); /* b leads nowhere */
    BT_CHECK(grammar_advance_bytes(g, &st, "c", 1));
    BT_CHECK(grammar_is_accepting(g, st));
    BT_CHECK(grammar_is_final(g, st));
    grammar_destroy(&g);
}

static void test_refusals(void)
{
    static const struct {
        const char *re;
        bt_status_t status;
        const char *what;
    } bad[] = {
        { "(a", BT_ERR_INVALID_ARG, "missing ')'" },
        { "a)", BT_ERR_INVALID_ARG, "unbalanced ')'" },
        { "*a", BT_ERR_INVALID_ARG, "nothing to repeat" },
        { "a**", BT_ERR_INVALID_ARG, "multiple repeat" },
        { "a{2", BT_ERR_INVALID_ARG, "unterminated {m,n}" },
        { "a{x}", BT_ERR_INVALID_ARG, "'{' must start" },
        { "a{3,2}", BT_ERR_INVALID_ARG, "n < m" },
        { "a{1001}", BT_ERR_UNSUPPORTED, "above 1000" },
        { "[abc", BT_ERR_INVALID_ARG, "unterminated [...]" },
        { "[z-a]", BT_ERR_INVALID_ARG, "bad range" },
        { "(a)\\1", BT_ERR_UNSUPPORTED, "backreferences" },
        { "(?=a)", BT_ERR_UNSUPPORTED, "lookaround" },
        { "(?<n>a)", BT_ERR_UNSUPPORTED, "named groups" },
        { "\\bword", BT_ERR_UNSUPPORTED, "word boundaries" },
        { "\\p{L}", BT_ERR_UNSUPPORTED, "Unicode properties" },
        { "a*+", BT_ERR_UNSUPPORTED, "possessive" },
        { "a^b", BT_ERR_UNSUPPORTED, "anchors" },
        { "[[:alpha:]]", BT_ERR_UNSUPPORTED, "POSIX" },
        { "[\xc3\xa9]", BT_ERR_UNSUPPORTED, "non-ASCII" },
        { "\\q", BT_ERR_UNSUPPORTED, "unknown escape" },
        { "a\\", BT_ERR_INVALID_ARG, "backslash" },
        { "(a{1000}){1000}", BT_ERR_UNSUPPORTED, "too large" },
        { "[^\\x00-\\x7f\\D]", BT_ERR_INVALID_ARG, "matches nothing" },
    };

    char deep[256];

    for (size_t i = 0; i < BT_ARRAY_SIZE(bad); i++)
        gt_refused(GRAMMAR_REGEX, bad[i].re, bad[i].status, bad[i].what);
    memset(deep, '(', 210);
    strcpy(deep + 210, "a");
    gt_refused(GRAMMAR_REGEX, deep, BT_ERR_UNSUPPORTED, "nested deeper");
}

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* refusals are asserted below */
    for (size_t i = 0; i < BT_ARRAY_SIZE(cases); i++) {
        grammar_t *g = gt_grammar(GRAMMAR_REGEX, cases[i].re);
        for (int k = 0; k < 6 && cases[i].yes[k] != NULL; k++)
            if (!gt_matches(g, cases[i].yes[k]))
                BT_TEST_FAIL("/%s/ should match '%s'", cases[i].re,
                             cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k] != NULL; k++)
            if (gt_matches(g, cases[i].no[k]))
                BT_TEST_FAIL("/%s/ should not match '%s'", cases[i].re,
                             cases[i].no[k]);
        grammar_destroy(&g);
    }
    test_pruning();
    test_refusals();
    BT_ASSERT_EQ(bt_alloc_live_bytes(), 0);
    printf("ok: %zu regexes\n", BT_ARRAY_SIZE(cases));
    return 0;
}
