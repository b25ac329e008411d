/*
 * grammar_dfa.c - a regex's NFA (grammar_regex.c) -> a lazily built DFA
 * over bytes, matched in full (anchored at both ends).
 *
 * Why our own: masks need the automaton's state after every byte of every
 * token, and a subset DFA gives that as one table lookup; PCRE2 matches
 * strings, not states.  Why lazy: a schema's DFA can be large in theory,
 * but one generation visits few of its states.
 *
 * The subset: literals (UTF-8 in the pattern matches as its bytes);
 * escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH \uHHHH and a backslash
 * before any punctuation; classes [...] with ranges, negation and the
 * shorthand escapes (ASCII members only); '.' (any character but '\n');
 * groups ( ) and (?: ); alternation |; quantifiers ? * + {m} {m,} {m,n}
 * (a trailing lazy '?' is accepted: it does not change a full match); ^
 * at the start and $ at the end (the match is anchored anyway).  Refused
 * with an error naming the position: backreferences, lookaround, \b \B,
 * \p{..}, possessive quantifiers, named groups, POSIX classes, anchors
 * elsewhere.
 *
 * Characters: '.', negated classes and \D \W \S match one whole UTF-8
 * character (well-formed UTF-8 per RFC 3629), so {m,n} counts
 * characters and the output stays valid UTF-8.
 *
 * Dead branches are pruned: NFA states that cannot reach the match state
 * are dropped from every subset, so every live DFA state can still
 * accept.
 */
#include "grammar_int.h"

#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

typedef grammar_nfa_state_t nfa_state_t;

struct grammar_dfa_s {
    nfa_state_t *nfa;   /* (n_nfa) */
    int n_nfa;
    int match;          /* the match state */
    uint8_t *alive;     /* (n_nfa) can reach the match state */
    /* lazily built DFA */
    uint32_t *trans;    /* (cap * 256) next state, GRAMMAR_DEAD, or
                         * DFA_UNKNOWN */
    bool *accepting;    /* (cap) */
    int *set_off;       /* (cap) offset of the state's subset in sets */
    int *set_len;       /* (cap) its length */
    int n_states;
    int cap;
    int *sets;          /* (sets_cap) sorted NFA state subsets */
    size_t sets_n;
    size_t sets_cap;
    int32_t *hash;      /* (hash_cap) DFA ids by subset hash, -1 empty */
    int hash_cap;
    /* scratch */
    uint32_t *mark;     /* (n_nfa) generation stamps for closures */
    uint32_t gen;
    int *stack;         /* (n_nfa) */
    int *list;          /* (n_nfa) the subset being built */
    bool overflowed;    /* GRAMMAR_MAX_DFA_STATES reached */
};

#define DFA_UNKNOWN (UINT32_MAX - 1)

// ----------------------------------------------------------------------------
// pruning: which NFA states can reach the match

static bool nfa_takes_nothing(const nfa_state_t *x)
{
    return x->type == NFA_CHAR &&
           !(x->set[0] | x->set[1] | x->set[2] | x->set[3]);
}

static bt_status_t dfa_prune(grammar_dfa_t *d)
{
    int n = d->n_nfa;
    int *cnt = bt_calloc((size_t)n + 1, sizeof(int), "grammar_prune");
    int *edges = NULL, *queue = NULL, head = 0, tail = 0;

    if (cnt == NULL)
        return BT_ERR_NO_MEMORY;
    /* reverse edges in CSR form: cnt[v+1] counts predecessors of v; a
     * CHAR state that takes no byte leads nowhere and has no edge */
    for (int s = 0; s < n; s++) {
        const nfa_state_t *x = &d->nfa[s];
        if (nfa_takes_nothing(x))
            continue;
        if (x->out1 >= 0)
            cnt[x->out1 + 1]++;
        if (x->type == NFA_SPLIT && x->out2 >= 0)
            cnt[x->out2 + 1]++;
    }
    for (int v = 0; v < n; v++)
        cnt[v + 1] += cnt[v];
    edges = bt_malloc(sizeof(int) * ((size_t)cnt[n] + 1), "grammar_prune");
    queue = bt_malloc(sizeof(int) * (size_t)n, "grammar_prune");
    if (edges == NULL || queue == NULL) {
        bt_free(cnt);
        bt_free(edges);
        bt_free(queue);
        return BT_ERR_NO_MEMORY;
    }
    {
        int *fill = d->stack; /* scratch of n ints */
        memcpy(fill, cnt, sizeof(int) * (size_t)n);
        for (int s = 0; s < n; s++) {
            const nfa_state_t *x = &d->nfa[s];
            if (nfa_takes_nothing(x))
                continue;
            if (x->out1 >= 0)
                edges[fill[x->out1]++] = s;
            if (x->type == NFA_SPLIT && x->out2 >= 0)
                edges[fill[x->out2]++] = s;
        }
    }
    d->alive[d->match] = 1;
    queue[tail++] = d->match;
    while (head < tail) {
        int v = queue[head++];
        for (int e = cnt[v]; e < cnt[v + 1]; e++) {
            int u = edges[e];
            if (!d->alive[u]) {
                d->alive[u] = 1;
                queue[tail++] = u;
            }
        }
    }
    bt_free(cnt);
    bt_free(edges);
    bt_free(queue);
    return BT_OK;
}

// ----------------------------------------------------------------------------
// lazy DFA

static uint32_t set_hash(const int *s, int n)
{
    uint32_t h = 2166136261u;

    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)s[i];
        h *= 16777619u;
    }
    return h;
}

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Adds the epsilon closure of s to d->list[*n] (CHAR and MATCH states
 * that can still reach the match). */
static void dfa_closure(grammar_dfa_t *d, int s, int *n)
{
    int sp = 0;

    if (d->mark[s] == d->gen)
        return;
    d->mark[s] = d->gen;
    d->stack[sp++] = s;
    while (sp > 0) {
        const nfa_state_t *x = &d->nfa[d->stack[--sp]];
        int v = (int)(x - d->nfa);

        if (!d->alive[v])
            continue;
        switch (x->type) {
        case NFA_CHAR:
        case NFA_MATCH:
            d->list[(*n)++] = v;
            break;
        case NFA_SPLIT:
            if (x->out2 >= 0 && d->mark[x->out2] != d->gen) {
                d->mark[x->out2] = d->gen;
                d->stack[sp++] = x->out2;
            }
            /* fall through */
        default:
            if (x->out1 >= 0 && d->mark[x->out1] != d->gen) {
                d->mark[x->out1] = d->gen;
                d->stack[sp++] = x->out1;
            }
            break;
        }
    }
}

static bt_status_t dfa_grow(grammar_dfa_t *d)
{
    int cap = d->cap ? d->cap * 2 : 64;
    uint32_t *trans;
    bool *acc;
    int *off, *len;

    trans = bt_realloc(d->trans, sizeof(*trans) * 256 * (size_t)cap,
                       "grammar_dfa");
    if (trans == NULL)
        return BT_ERR_NO_MEMORY;
    d->trans = trans;
    acc = bt_realloc(d->accepting, sizeof(*acc) * (size_t)cap, "grammar_dfa");
    if (acc == NULL)
        return BT_ERR_NO_MEMORY;
    d->accepting = acc;
    off = bt_realloc(d->set_off, sizeof(*off) * (size_t)cap, "grammar_dfa");
    if (off == NULL)
        return BT_ERR_NO_MEMORY;
    d->set_off = off;
    len = bt_realloc(d->set_len, sizeof(*len) * (size_t)cap, "grammar_dfa");
    if (len == NULL)
        return BT_ERR_NO_MEMORY;
    d->set_len = len;
    d->cap = cap;
    return BT_OK;
}

static bt_status_t dfa_rehash(grammar_dfa_t *d)
{
    int cap = d->hash_cap ? d->hash_cap * 2 : 256;
    int32_t *h = bt_malloc(sizeof(*h) * (size_t)cap, "grammar_dfa");

    if (h == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < cap; i++)
        h[i] = -1;
    for (int id = 0; id < d->n_states; id++) {
        uint32_t k = set_hash(d->sets + d->set_off[id], d->set_len[id]) &
                     (uint32_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        h[k] = id;
    }
    bt_free(d->hash);
    d->hash = h;
    d->hash_cap = cap;
    return BT_OK;
}

/* The DFA state of the subset d->list[0..n) (sorted here), created when
 * new.  GRAMMAR_DEAD for an empty subset or when out of room. */
static uint32_t dfa_intern(grammar_dfa_t *d, int n)
{
    uint32_t k;
    int id;

    if (n == 0)
        return GRAMMAR_DEAD;
    qsort(d->list, (size_t)n, sizeof(int), int_cmp);
    k = set_hash(d->list, n) & (uint32_t)(d->hash_cap - 1);
    while ((id = d->hash[k]) >= 0) {
        if (d->set_len[id] == n &&
            memcmp(d->sets + d->set_off[id], d->list,
                   sizeof(int) * (size_t)n) == 0)
            return (uint32_t)id;
        k = (k + 1) & (uint32_t)(d->hash_cap - 1);
    }
    if (d->n_states >= GRAMMAR_MAX_DFA_STATES) {
        if (!d->overflowed)
            BT_ERROR(BT_ERR_NO_RESOURCE, "GRAMMAR",
                     "grammar needs more than %d DFA states; its output "
                     "is cut short", GRAMMAR_MAX_DFA_STATES);
        d->overflowed = true;
        return GRAMMAR_DEAD;
    }
    if (d->n_states == d->cap && dfa_grow(d) != BT_OK)
        goto oom;
    if (d->sets_n + (size_t)n > d->sets_cap) {
        size_t cap = BT_MAX(d->sets_cap * 2, d->sets_n + (size_t)n + 1024);
        int *grown = bt_realloc(d->sets, sizeof(int) * cap, "grammar_dfa");
        if (grown == NULL)
            goto oom;
        d->sets = grown;
        d->sets_cap = cap;
    }
    id = d->n_states++;
    memcpy(d->sets + d->sets_n, d->list, sizeof(int) * (size_t)n);
    d->set_off[id] = (int)d->sets_n;
    d->set_len[id] = n;
    d->sets_n += (size_t)n;
    d->accepting[id] = false;
    for (int i = 0; i < n; i++)
        if (d->nfa[d->list[i]].type == NFA_MATCH)
            d->accepting[id] = true;
    for (int b = 0; b < 256; b++)
        d->trans[(size_t)id * 256 + (size_t)b] = DFA_UNKNOWN;
    if (d->n_states * 2 > d->hash_cap) {
        if (dfa_rehash(d) != BT_OK) /* places every state, id included */
            goto oom;
    } else {
        d->hash[k] = id; /* the empty slot the lookup ended on */
    }
    return (uint32_t)id;

oom:
    if (!d->overflowed)
        BT_ERROR(BT_ERR_NO_MEMORY, "GRAMMAR", "out of memory building the "
                                              "grammar's DFA");
    d->overflowed = true;
    return GRAMMAR_DEAD;
}

uint32_t grammar__dfa_step(grammar_dfa_t *d, uint32_t state, uint8_t b)
{
    uint32_t *t;
    const int *set;
    int n = 0, len;

    if (state == GRAMMAR_DEAD)
        return GRAMMAR_DEAD;
    t = &d->trans[(size_t)state * 256 + b];
    if (*t != DFA_UNKNOWN)
        return *t;
    set = d->sets + d->set_off[state];
    len = d->set_len[state];
    d->gen++;
    for (int i = 0; i < len; i++) {
        const nfa_state_t *x = &d->nfa[set[i]];
        if (x->type == NFA_CHAR && (x->set[b >> 6] >> (b & 63) & 1))
            dfa_closure(d, x->out1, &n);
    }
    {
        uint32_t next = dfa_intern(d, n);
        /* trans may have moved when the table grew */
        if (!(next == GRAMMAR_DEAD && d->overflowed))
            d->trans[(size_t)state * 256 + b] = next;
        return next;
    }
}

uint32_t grammar__dfa_start(const grammar_dfa_t *d)
{
    (void)d;
    return 0; /* interned first by grammar__dfa_create */
}

bool grammar__dfa_accepting(const grammar_dfa_t *d, uint32_t state)
{
    return state != GRAMMAR_DEAD && d->accepting[state];
}

bool grammar__dfa_overflowed(const grammar_dfa_t *d)
{
    return d->overflowed;
}

int grammar__dfa_n_states(const grammar_dfa_t *d)
{
    return d->n_states;
}

bt_status_t grammar__dfa_create(const char *regex, grammar_dfa_t **dfa_p)
{
    grammar_nfa_t nfa;
    grammar_dfa_t *d;
    bt_status_t status;
    int n = 0;

    status = grammar__nfa_compile(regex, &nfa);
    if (status != BT_OK)
        return status;
    d = bt_calloc(1, sizeof(*d), "grammar_dfa");
    if (d == NULL) {
        bt_free(nfa.st);
        return BT_ERR_NO_MEMORY;
    }
    d->nfa = nfa.st;
    d->n_nfa = nfa.n;
    d->match = nfa.match;
    d->alive = bt_calloc((size_t)nfa.n, 1, "grammar_dfa");
    d->mark = bt_calloc((size_t)nfa.n, sizeof(*d->mark), "grammar_dfa");
    d->stack = bt_malloc(sizeof(int) * (size_t)nfa.n, "grammar_dfa");
    d->list = bt_malloc(sizeof(int) * (size_t)nfa.n, "grammar_dfa");
    if (d->alive == NULL || d->mark == NULL || d->stack == NULL ||
        d->list == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    status = dfa_prune(d);
    if (status != BT_OK)
        goto err_destroy;
    status = dfa_rehash(d);
    if (status != BT_OK)
        goto err_destroy;
    d->gen = 1;
    dfa_closure(d, nfa.start, &n);
    if (dfa_intern(d, n) != 0) {
        status = d->overflowed ? BT_ERR_NO_MEMORY
                               : BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                                          "regex matches nothing");
        goto err_destroy;
    }
    *dfa_p = d;
    return BT_OK;

err_destroy:
    grammar__dfa_destroy(&d);
    return status;
}

void grammar__dfa_destroy(grammar_dfa_t **dfa_p)
{
    grammar_dfa_t *d = *dfa_p;

    if (d == NULL)
        return;
    bt_free(d->nfa);
    bt_free(d->alive);
    bt_free(d->trans);
    bt_free(d->accepting);
    bt_free(d->set_off);
    bt_free(d->set_len);
    bt_free(d->sets);
    bt_free(d->hash);
    bt_free(d->mark);
    bt_free(d->stack);
    bt_free(d->list);
    bt_free(d);
    *dfa_p = NULL;
}
