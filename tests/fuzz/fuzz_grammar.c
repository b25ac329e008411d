/*
 * fuzz_grammar.c - libFuzzer target for worker/grammar/: the regex parser,
 * the JSON schema translator and the automata.
 *
 * An input is "<spec>\0<bytes>": the spec ("regex:..", "json_schema:..",
 * "choice:..", "json_object:") is compiled; when it compiles, the bytes
 * are fed one at a time and all at once (the states must agree), and the
 * mask of the state reached over a small fixed vocabulary must equal
 * feeding each token's bytes (brute force).  Anything else aborts.
 *
 * Run: build/fuzz/fuzz_grammar tests/fuzz/corpus/fuzz_grammar
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "grammar/grammar.h"

static const char *const fz_tokens[] = {
    "{", "}", "[", "]", "\"", ":", ",", " ", "a", "ab", "1", "-", ".",
    "e", "true", "false", "null", "\\", "u", "\"a\"", "{\"", "\":", ", \"",
    "x", "\xc3\xa9", "\xc3", "\xa9", "0", "12", "\n", "of", " the",
};

static void fz_check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_grammar: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static grammar_vocab_t *vocab;
    const uint8_t *nul = memchr(data, 0, size);
    size_t spec_len = nul != NULL ? (size_t)(nul - data) : size;
    char *spec;
    grammar_t *g = NULL;
    int n_tok = (int)(sizeof(fz_tokens) / sizeof(fz_tokens[0]));

    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    if (vocab == NULL) {
        size_t lens[64];
        int eos = n_tok; /* one past the text tokens */
        for (int t = 0; t < n_tok; t++)
            lens[t] = strlen(fz_tokens[t]);
        lens[n_tok] = 0;
        fz_check(grammar_vocab_create_raw(fz_tokens, lens, n_tok + 1, &eos,
                                          1, &vocab) == BT_OK, "vocab");
    }
    spec = malloc(spec_len + 1);
    if (spec == NULL)
        return 0;
    memcpy(spec, data, spec_len);
    spec[spec_len] = '\0';
    if (grammar_create_spec(spec, vocab, &g) == BT_OK) {
        const uint8_t *bytes = nul != NULL ? nul + 1 : data + size;
        size_t n = (size_t)(data + size - bytes);
        grammar_state_t one = grammar_start(g), all = grammar_start(g);
        bool alive = true;
        uint64_t mask[1];

        for (size_t i = 0; i < n && alive; i++)
            alive = grammar_advance_bytes(g, &one, bytes + i, 1);
        if (alive) {
            fz_check(grammar_advance_bytes(g, &all, bytes, n),
                     "bytewise alive, whole dead");
            fz_check(grammar_state_eq(one, all), "states differ");
            if (grammar_mask(g, one, mask) == BT_OK || mask[0] == 0) {
                for (int t = 0; t < n_tok; t++) {
                    grammar_state_t s = one;
                    bool ok = grammar_advance_bytes(g, &s, fz_tokens[t],
                                                    strlen(fz_tokens[t]));
                    fz_check(ok == (bool)(mask[0] >> t & 1),
                             "mask differs from brute force");
                }
                fz_check(grammar_is_accepting(g, one) ==
                             (bool)(mask[0] >> n_tok & 1),
                         "EOS bit differs from accepting");
            }
        }
        grammar_destroy(&g);
    }
    free(spec);
    return 0;
}
