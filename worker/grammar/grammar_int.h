/*
 * grammar_int.h - private interface between the grammar files: the lazy
 * DFA of a regex (grammar_dfa.c) and the JSON pushdown recognizer
 * (grammar_json.c), which grammar.c drives through one step function.
 */
#ifndef BT_WORKER_GRAMMAR_GRAMMAR_INT_H
#define BT_WORKER_GRAMMAR_GRAMMAR_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_status.h"
#include "grammar.h"

/* Bounds that keep a hostile pattern from taking the worker's memory. */
#define GRAMMAR_MAX_NFA_STATES 200000 /* after {m,n} expansion */
#define GRAMMAR_MAX_DFA_STATES 20000  /* lazily built subsets */
#define GRAMMAR_MAX_REPEAT 1000       /* largest m or n in {m,n} */

/* A DFA state id that no byte leaves: the dead state. */
#define GRAMMAR_DEAD UINT32_MAX

/* A Thompson NFA (grammar_regex.c). */
enum {
    NFA_EPS = 0, /* out1 */
    NFA_SPLIT,   /* out1, out2 */
    NFA_CHAR,    /* out1 on a byte in set */
    NFA_MATCH
};

typedef struct {
    uint8_t type;    /* NFA_* */
    int out1;        /* next state, -1 unpatched */
    int out2;        /* SPLIT's second branch */
    uint64_t set[4]; /* NFA_CHAR: the bytes taken (bit b of word b/64) */
} grammar_nfa_state_t;

typedef struct {
    grammar_nfa_state_t *st; /* (n) bt_malloc'ed; the caller frees it */
    int n;
    int start;               /* where matching begins */
    int match;               /* the one NFA_MATCH state */
} grammar_nfa_t;

/* Parses `regex` (the subset in grammar_dfa.c's header) into an NFA.
 * BT_ERR_INVALID_ARG / BT_ERR_UNSUPPORTED naming the offending offset. */
bt_status_t grammar__nfa_compile(const char *regex, grammar_nfa_t *nfa);

typedef struct grammar_dfa_s grammar_dfa_t;

/* Compiles `regex` to an NFA and prepares its lazy DFA.  BT_ERR_INVALID_ARG / BT_ERR_UNSUPPORTED with
 * the offending position. */
bt_status_t grammar__dfa_create(const char *regex, grammar_dfa_t **dfa_p);
void grammar__dfa_destroy(grammar_dfa_t **dfa_p);

uint32_t grammar__dfa_start(const grammar_dfa_t *dfa);

/* The state after byte b, built on first use; GRAMMAR_DEAD when no match
 * can follow (also when the state limit is reached: then
 * grammar__dfa_overflowed() turns true and the error is logged once). */
uint32_t grammar__dfa_step(grammar_dfa_t *dfa, uint32_t state, uint8_t b);

bool grammar__dfa_accepting(const grammar_dfa_t *dfa, uint32_t state);
bool grammar__dfa_overflowed(const grammar_dfa_t *dfa);
int grammar__dfa_n_states(const grammar_dfa_t *dfa);

/* The JSON object recognizer: the start state, one byte (false: dead,
 * *st unchanged), and whether a whole object has been read. */
grammar_state_t grammar__json_start(void);
bool grammar__json_step(grammar_state_t *st, uint8_t b);
bool grammar__json_accepting(grammar_state_t st);

#endif /* BT_WORKER_GRAMMAR_GRAMMAR_INT_H */
