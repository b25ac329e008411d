/*
 * grammar.h - structured output: token masks from a grammar compiled per
 * request (issue 39).
 *
 * A request's output can be held to a grammar: a regex (guided_regex), a
 * list of choices (guided_choice), a JSON schema (response_format
 * json_schema, translated to a regex as outlines and vLLM do) or any JSON
 * object (response_format json_object, a small pushdown recognizer since
 * nested JSON is not regular).  Each kind becomes an automaton over bytes
 * with one interface: advance by bytes, is-accepting, and a dead state.
 *
 * The mask of a state says which vocabulary tokens may come next: a token
 * is allowed iff feeding its bytes keeps the automaton alive, and the EOS
 * tokens iff the state is accepting.  Every live state can still reach
 * an accepting one (dead branches are pruned when the automaton is
 * built), so a sequence that follows its masks never gets stuck.  Masks
 * are cached per state, so a warm step costs a lookup.
 *
 * A grammar_state_t is a small value (a DFA state id, or the recognizer's
 * lexer state plus a bit stack) and is a function of the generated token
 * ids alone: grammar_replay() recomputes it, which is how the state moves
 * with a request across a decode-worker failover.
 *
 * The spec travels as one string, "<kind>:<text>", with kind json_object
 * (text empty or ignored), json_schema (the schema's JSON), regex (the
 * pattern) or choice (a JSON array of strings): it fits one protobuf
 * string field.
 *
 * Threads: a grammar_vocab_t is immutable after creation and may be
 * shared; a grammar_t fills its caches lazily, so it is used by one
 * thread at a time (one per request).
 */
#ifndef BT_WORKER_GRAMMAR_GRAMMAR_H
#define BT_WORKER_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"
#include "model/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nesting limit of the json_object recognizer (objects and arrays). */
#define GRAMMAR_JSON_MAX_DEPTH 32

typedef enum {
    GRAMMAR_JSON_OBJECT = 0, /* any JSON object */
    GRAMMAR_JSON_SCHEMA,     /* text: a JSON schema */
    GRAMMAR_REGEX,           /* text: a regex, matched in full */
    GRAMMAR_CHOICE           /* text: a JSON array of strings */
} grammar_kind_t;

/* The automaton's state after some bytes: a value, copied freely.
 * Fields are the automaton's own; compare states with grammar_state_eq. */
typedef struct {
    uint32_t id;    /* DFA state, or the JSON lexer state */
    uint32_t aux;   /* JSON: nesting depth */
    uint64_t stack; /* JSON: bit d set = level d is an object */
} grammar_state_t;

typedef struct grammar_vocab_s grammar_vocab_t;
typedef struct grammar_s grammar_t;

/* ---- vocabulary ---- */

/* The byte string of every token of `tok` as it appears in the middle of
 * generated text (tok_id_bytes_mid), sorted for the mask walk.  Special
 * tokens, tokens that print nothing and the `eos` ids are never allowed
 * as text; the `n_eos` eos ids are allowed when the grammar accepts.
 * vocab_size: the model's (ids at or above the tokenizer's are never
 * allowed).  Immutable after creation. */
bt_status_t grammar_vocab_create(const tok_t *tok, int vocab_size,
                                 const int *eos, int n_eos,
                                 grammar_vocab_t **vocab_p);

/* The same from explicit byte strings (tests): token i is bytes[i] of
 * lens[i] bytes; lens[i] 0 = never allowed as text. */
bt_status_t grammar_vocab_create_raw(const char *const *bytes,
                                     const size_t *lens, int vocab_size,
                                     const int *eos, int n_eos,
                                     grammar_vocab_t **vocab_p);

void grammar_vocab_destroy(grammar_vocab_t **vocab_p);

int grammar_vocab_size(const grammar_vocab_t *vocab);

/* Words in a mask: (vocab_size + 63) / 64. */
size_t grammar_mask_words(const grammar_vocab_t *vocab);

/* ---- specs ---- */

/* Splits "<kind>:<text>" (kind json_object, json_schema, regex or
 * choice); *text_p points into spec.  BT_ERR_INVALID_ARG naming the kind
 * when it is not one of those. */
bt_status_t grammar_spec_parse(const char *spec, grammar_kind_t *kind_p,
                               const char **text_p);

const char *grammar_kind_name(grammar_kind_t kind);

/* Translates a JSON schema to the regex it is enforced with (exposed for
 * tests and `--explain`-style debugging).  Whitespace policy: none, except
 * one optional space after ',' and ':'.  Object properties come in the
 * schema's order.  BT_ERR_UNSUPPORTED naming the keyword for what is not
 * supported (never silently ignored), BT_ERR_INVALID_ARG for a malformed
 * schema.  The result is bt_malloc'ed; the caller frees it with bt_free. */
bt_status_t grammar_schema_to_regex(const char *schema, char **regex_p);

/* A JSON array of strings as an alternation of their literal texts. */
bt_status_t grammar_choice_to_regex(const char *choices, char **regex_p);

/* ---- grammars ---- */

/* Compiles a grammar of `kind` from `text` for `vocab` (borrowed: it must
 * outlive the grammar; NULL: byte-level use only, no masks).  Errors say
 * what is wrong with the text (position in a regex, keyword in a
 * schema). */
bt_status_t grammar_create(grammar_kind_t kind, const char *text,
                           const grammar_vocab_t *vocab, grammar_t **g_p);

/* The same from a "<kind>:<text>" spec. */
bt_status_t grammar_create_spec(const char *spec,
                                const grammar_vocab_t *vocab,
                                grammar_t **g_p);

void grammar_destroy(grammar_t **g_p);

grammar_kind_t grammar_kind(const grammar_t *g);

/* The regex a regex-based grammar runs (NULL for json_object). */
const char *grammar_regex(const grammar_t *g);

/* The state before any output. */
grammar_state_t grammar_start(const grammar_t *g);

bool grammar_state_eq(grammar_state_t a, grammar_state_t b);

/* Feeds n bytes.  Returns false when they take the automaton to its dead
 * state (then *st is left unchanged). */
bool grammar_advance_bytes(grammar_t *g, grammar_state_t *st,
                           const void *bytes, size_t n);

/* Whether the output so far is a complete match (EOS allowed). */
bool grammar_is_accepting(const grammar_t *g, grammar_state_t st);

/* Whether no byte can follow: the output can only end. */
bool grammar_is_final(grammar_t *g, grammar_state_t st);

/* Feeds one token.  An EOS token is accepted only in an accepting state
 * and leaves the state as it is.  BT_ERR_INVALID_ARG (state unchanged)
 * when the mask would not allow the token. */
bt_status_t grammar_advance_token(grammar_t *g, grammar_state_t *st,
                                  int token);

/* Recomputes the state from the start and n generated tokens (failover:
 * the decode worker that takes a request over replays its tokens).
 * BT_ERR_INVALID_ARG naming the first token the grammar refuses. */
bt_status_t grammar_replay(grammar_t *g, const int *tokens, int n,
                           grammar_state_t *st_p);

/* Writes the allowed-token bitmask of st (bit t of word t / 64 set = token
 * t allowed; grammar_mask_words() words).  Cached per state; the first
 * call for a state walks the vocabulary.  BT_ERR_NO_MEMORY if the cache
 * cannot grow (the mask is still written). */
bt_status_t grammar_mask(grammar_t *g, grammar_state_t st, uint64_t *mask);

/* Counters for measurement: masks computed (cache misses) and served. */
void grammar_mask_stats(const grammar_t *g, uint64_t *computed_p,
                        uint64_t *served_p);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_GRAMMAR_GRAMMAR_H */
