/*
 * grammar_test_util.h - helpers shared by the grammar tests: full-match a
 * string against a grammar at the byte level.
 */
#ifndef BT_TESTS_GRAMMAR_TEST_UTIL_H
#define BT_TESTS_GRAMMAR_TEST_UTIL_H

#include <string.h>

#include "bt_error.h"
#include "bt_util.h"
#include "bt_test.h"
#include "grammar/grammar.h"

/* Whether the grammar accepts exactly `s`. */
static inline bool gt_matches(grammar_t *g, const char *s)
{
    grammar_state_t st = grammar_start(g);

    return grammar_advance_bytes(g, &st, s, strlen(s)) &&
           grammar_is_accepting(g, st);
}

/* Whether `s` is a prefix of something the grammar accepts. */
static inline bool gt_prefix_ok(grammar_t *g, const char *s)
{
    grammar_state_t st = grammar_start(g);

    return grammar_advance_bytes(g, &st, s, strlen(s));
}

static inline grammar_t *gt_grammar(grammar_kind_t kind, const char *text)
{
    grammar_t *g = NULL;
    bt_status_t status = grammar_create(kind, text, NULL, &g);

    if (status != BT_OK)
        BT_TEST_FAIL("grammar_create(%s, %s): %s", grammar_kind_name(kind),
                     text, bt_error_last());
    return g;
}

/* Expects creation to fail with `status` and a message containing `what`. */
static inline void gt_refused(grammar_kind_t kind, const char *text,
                              bt_status_t want, const char *what)
{
    grammar_t *g = NULL;
    bt_status_t status = grammar_create(kind, text, NULL, &g);

    if (status == BT_OK)
        BT_TEST_FAIL("%s '%s' was accepted", grammar_kind_name(kind), text);
    if (status != want)
        BT_TEST_FAIL("%s '%s': status %d, want %d (%s)",
                     grammar_kind_name(kind), text, status, want,
                     bt_error_last());
    if (strstr(bt_error_last(), what) == NULL)
        BT_TEST_FAIL("%s '%s': error '%s' does not mention '%s'",
                     grammar_kind_name(kind), text, bt_error_last(), what);
}

#endif /* BT_TESTS_GRAMMAR_TEST_UTIL_H */
