/*
 * grammar.c - vocabularies, grammars and their token masks.
 *
 * The mask walk: the vocabulary's byte strings are sorted once, with the
 * length of the prefix each shares with the one before it (lcp).  A walk
 * keeps the automaton's state after every prefix byte of the current
 * token, so a token costs only the bytes after its shared prefix, and
 * when a prefix dies every following token that shares it is skipped
 * without a step: in effect a depth-first walk of the token trie that
 * prunes dead subtrees.  The same walk serves the DFA and the JSON
 * recognizer, whose states are both grammar_state_t values.
 *
 * Masks are cached per state (for the DFA its id; for JSON the whole
 * value, which is exact since the value is the whole parser state), up
 * to GRAMMAR_CACHE_MAX_BYTES per grammar; beyond that they are computed
 * each time.
 */
#include "grammar.h"

#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "grammar_int.h"

#define GRAMMAR_CACHE_MAX_BYTES (64u << 20)

struct grammar_vocab_s {
    int vocab_size;
    char *arena;     /* every token's bytes, back to back */
    size_t *off;     /* (vocab_size) offset of token t in arena */
    uint32_t *len;   /* (vocab_size) its length; 0 = never text */
    int *order;      /* (n_text) text tokens sorted by their bytes */
    uint32_t *lcp;   /* (n_text) prefix shared with the previous in order */
    int n_text;
    uint32_t max_len;
    uint64_t *eos;   /* (words) the EOS tokens as a mask */
    size_t words;    /* (vocab_size + 63) / 64 */
};

typedef struct {
    grammar_state_t key;
    uint64_t *mask;  /* (words); NULL = empty slot */
} cache_entry_t;

struct grammar_s {
    grammar_kind_t kind;
    const grammar_vocab_t *vocab; /* borrowed; NULL: bytes only */
    grammar_dfa_t *dfa;           /* NULL for json_object */
    char *regex;                  /* the regex dfa runs, NULL for json */
    cache_entry_t *cache;         /* (cache_cap) open addressing */
    int cache_cap;                /* power of two */
    int cache_n;
    size_t cache_bytes;
    grammar_state_t *walk;        /* (max_len + 1) states along a token */
    uint64_t computed;            /* masks walked */
    uint64_t served;              /* masks returned */
};

// ----------------------------------------------------------------------------
// vocabulary

/* A sort key that carries its own bytes (qsort has no context). */
typedef struct {
    const char *bytes;
    uint32_t len;
    int id;
} vocab_key_t;

static int vocab_cmp(const void *a, const void *b)
{
    const vocab_key_t *x = a, *y = b;
    int c = memcmp(x->bytes, y->bytes, BT_MIN(x->len, y->len));

    if (c != 0)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Sorts the text tokens and fills lcp and the EOS mask. */
static bt_status_t vocab_finish(grammar_vocab_t *v, const int *eos, int n_eos)
{
    vocab_key_t *keys;
    int n = 0;

    v->words = ((size_t)v->vocab_size + 63) / 64;
    v->eos = bt_calloc(v->words, sizeof(uint64_t), "grammar_vocab");
    v->order = bt_malloc(sizeof(int) * (size_t)v->vocab_size, "grammar_vocab");
    v->lcp = bt_malloc(sizeof(uint32_t) * (size_t)v->vocab_size,
                       "grammar_vocab");
    if (v->eos == NULL || v->order == NULL || v->lcp == NULL)
        return BT_ERR_NO_MEMORY;
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= v->vocab_size)
            return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                            "EOS id %d outside the vocabulary of %d", eos[i],
                            v->vocab_size);
        v->eos[eos[i] / 64] |= 1ull << (eos[i] % 64);
        v->len[eos[i]] = 0; /* EOS is never text */
    }
    keys = bt_malloc(sizeof(*keys) * (size_t)v->vocab_size, "grammar_vocab");
    if (keys == NULL)
        return BT_ERR_NO_MEMORY;
    for (int t = 0; t < v->vocab_size; t++) {
        if (v->len[t] > 0)
            keys[n++] = (vocab_key_t){ v->arena + v->off[t], v->len[t], t };
        v->max_len = BT_MAX(v->max_len, v->len[t]);
    }
    qsort(keys, (size_t)n, sizeof(*keys), vocab_cmp);
    for (int i = 0; i < n; i++)
        v->order[i] = keys[i].id;
    bt_free(keys);
    for (int i = 0; i < n; i++) {
        uint32_t l = 0;
        if (i > 0) {
            int a = v->order[i - 1], b = v->order[i];
            uint32_t m = BT_MIN(v->len[a], v->len[b]);
            while (l < m && v->arena[v->off[a] + l] == v->arena[v->off[b] + l])
                l++;
        }
        v->lcp[i] = l;
    }
    v->n_text = n;
    return BT_OK;
}

bt_status_t grammar_vocab_create_raw(const char *const *bytes,
                                     const size_t *lens, int vocab_size,
                                     const int *eos, int n_eos,
                                     grammar_vocab_t **vocab_p)
{
    grammar_vocab_t *v;
    size_t total = 0, pos = 0;
    bt_status_t status;

    if (vocab_size <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR", "vocab size %d",
                        vocab_size);
    for (int t = 0; t < vocab_size; t++) {
        if (lens[t] > 65536)
            return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                            "token %d is %zu bytes long", t, lens[t]);
        total += lens[t];
    }
    v = bt_calloc(1, sizeof(*v), "grammar_vocab");
    if (v == NULL)
        return BT_ERR_NO_MEMORY;
    v->vocab_size = vocab_size;
    v->arena = bt_malloc(total + 1, "grammar_vocab");
    v->off = bt_malloc(sizeof(size_t) * (size_t)vocab_size, "grammar_vocab");
    v->len = bt_malloc(sizeof(uint32_t) * (size_t)vocab_size,
                       "grammar_vocab");
    if (v->arena == NULL || v->off == NULL || v->len == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_destroy;
    }
    for (int t = 0; t < vocab_size; t++) {
        if (lens[t] > 0)
            memcpy(v->arena + pos, bytes[t], lens[t]);
        v->off[t] = pos;
        v->len[t] = (uint32_t)lens[t];
        pos += lens[t];
    }
    status = vocab_finish(v, eos, n_eos);
    if (status != BT_OK)
        goto err_destroy;
    *vocab_p = v;
    return BT_OK;

err_destroy:
    grammar_vocab_destroy(&v);
    return status;
}

bt_status_t grammar_vocab_create(const tok_t *tok, int vocab_size,
                                 const int *eos, int n_eos,
                                 grammar_vocab_t **vocab_p)
{
    const char **bytes;
    size_t *lens;
    char *bytebuf;
    int n_tok = tok_vocab_size(tok);
    bt_status_t status;

    if (vocab_size <= 0)
        vocab_size = n_tok;
    bytes = bt_calloc((size_t)vocab_size, sizeof(*bytes), "grammar_vocab");
    lens = bt_calloc((size_t)vocab_size, sizeof(*lens), "grammar_vocab");
    bytebuf = bt_malloc((size_t)vocab_size, "grammar_vocab");
    if (bytes == NULL || lens == NULL || bytebuf == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto out;
    }
    for (int t = 0; t < vocab_size && t < n_tok; t++) {
        /* special tokens (BOS, EOS, chat markers, <unk>) are not text */
        if (tok_is_special(tok, t) ||
            !tok_id_bytes_mid(tok, t, &bytes[t], &lens[t], &bytebuf[t]))
            lens[t] = 0;
    }
    status = grammar_vocab_create_raw(bytes, lens, vocab_size, eos, n_eos,
                                      vocab_p);
out:
    bt_free(bytes);
    bt_free(lens);
    bt_free(bytebuf);
    return status;
}

void grammar_vocab_destroy(grammar_vocab_t **vocab_p)
{
    grammar_vocab_t *v = *vocab_p;

    if (v == NULL)
        return;
    bt_free(v->arena);
    bt_free(v->off);
    bt_free(v->len);
    bt_free(v->order);
    bt_free(v->lcp);
    bt_free(v->eos);
    bt_free(v);
    *vocab_p = NULL;
}

int grammar_vocab_size(const grammar_vocab_t *vocab)
{
    return vocab->vocab_size;
}

size_t grammar_mask_words(const grammar_vocab_t *vocab)
{
    return vocab->words;
}

// ----------------------------------------------------------------------------
// specs

static const char *const grammar_kind_names[] = {
    "json_object", "json_schema", "regex", "choice"
};

const char *grammar_kind_name(grammar_kind_t kind)
{
    if ((unsigned)kind >= BT_ARRAY_SIZE(grammar_kind_names))
        return "?";
    return grammar_kind_names[kind];
}

bt_status_t grammar_spec_parse(const char *spec, grammar_kind_t *kind_p,
                               const char **text_p)
{
    const char *colon = spec != NULL ? strchr(spec, ':') : NULL;
    size_t n = colon != NULL ? (size_t)(colon - spec)
                             : (spec != NULL ? strlen(spec) : 0);

    for (size_t k = 0; k < BT_ARRAY_SIZE(grammar_kind_names); k++) {
        if (strlen(grammar_kind_names[k]) == n &&
            strncmp(spec, grammar_kind_names[k], n) == 0) {
            *kind_p = (grammar_kind_t)k;
            *text_p = colon != NULL ? colon + 1 : "";
            return BT_OK;
        }
    }
    return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                    "grammar spec '%.*s' must start with json_object:, "
                    "json_schema:, regex: or choice:", (int)BT_MIN(n, 40),
                    spec != NULL ? spec : "");
}

// ----------------------------------------------------------------------------
// grammars

bt_status_t grammar_create(grammar_kind_t kind, const char *text,
                           const grammar_vocab_t *vocab, grammar_t **g_p)
{
    grammar_t *g;
    bt_status_t status = BT_OK;

    if (text == NULL)
        text = "";
    g = bt_calloc(1, sizeof(*g), "grammar");
    if (g == NULL)
        return BT_ERR_NO_MEMORY;
    g->kind = kind;
    g->vocab = vocab;
    switch (kind) {
    case GRAMMAR_JSON_OBJECT:
        break;
    case GRAMMAR_JSON_SCHEMA:
        status = grammar_schema_to_regex(text, &g->regex);
        break;
    case GRAMMAR_CHOICE:
        status = grammar_choice_to_regex(text, &g->regex);
        break;
    case GRAMMAR_REGEX:
        g->regex = bt_strdup(text, "grammar");
        if (g->regex == NULL)
            status = BT_ERR_NO_MEMORY;
        break;
    default:
        status = BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                          "unknown grammar kind %d", (int)kind);
        break;
    }
    if (status == BT_OK && g->regex != NULL)
        status = grammar__dfa_create(g->regex, &g->dfa);
    if (status == BT_OK && vocab != NULL) {
        g->walk = bt_malloc(sizeof(*g->walk) * (vocab->max_len + 1),
                            "grammar");
        if (g->walk == NULL)
            status = BT_ERR_NO_MEMORY;
    }
    if (status != BT_OK) {
        grammar_destroy(&g);
        return status;
    }
    *g_p = g;
    return BT_OK;
}

bt_status_t grammar_create_spec(const char *spec, const grammar_vocab_t *vocab,
                                grammar_t **g_p)
{
    grammar_kind_t kind;
    const char *text;
    bt_status_t status = grammar_spec_parse(spec, &kind, &text);

    if (status != BT_OK)
        return status;
    return grammar_create(kind, text, vocab, g_p);
}

void grammar_destroy(grammar_t **g_p)
{
    grammar_t *g = *g_p;

    if (g == NULL)
        return;
    for (int i = 0; i < g->cache_cap; i++)
        bt_free(g->cache[i].mask);
    bt_free(g->cache);
    grammar__dfa_destroy(&g->dfa);
    bt_free(g->regex);
    bt_free(g->walk);
    bt_free(g);
    *g_p = NULL;
}

grammar_kind_t grammar_kind(const grammar_t *g)
{
    return g->kind;
}

const char *grammar_regex(const grammar_t *g)
{
    return g->regex;
}

grammar_state_t grammar_start(const grammar_t *g)
{
    grammar_state_t st = { 0, 0, 0 };

    if (g->dfa == NULL)
        return grammar__json_start();
    st.id = grammar__dfa_start(g->dfa);
    return st;
}

bool grammar_state_eq(grammar_state_t a, grammar_state_t b)
{
    return a.id == b.id && a.aux == b.aux && a.stack == b.stack;
}

/* One byte; false (st unchanged) when it kills the automaton. */
static inline bool grammar_step(grammar_t *g, grammar_state_t *st, uint8_t b)
{
    if (g->dfa != NULL) {
        uint32_t next = grammar__dfa_step(g->dfa, st->id, b);
        if (next == GRAMMAR_DEAD)
            return false;
        st->id = next;
        return true;
    }
    return grammar__json_step(st, b);
}

bool grammar_advance_bytes(grammar_t *g, grammar_state_t *st,
                           const void *bytes, size_t n)
{
    grammar_state_t s = *st;
    const uint8_t *p = bytes;

    for (size_t i = 0; i < n; i++)
        if (!grammar_step(g, &s, p[i]))
            return false;
    *st = s;
    return true;
}

bool grammar_is_accepting(const grammar_t *g, grammar_state_t st)
{
    if (g->dfa != NULL)
        return grammar__dfa_accepting(g->dfa, st.id);
    return grammar__json_accepting(st);
}

bool grammar_is_final(grammar_t *g, grammar_state_t st)
{
    for (int b = 0; b < 256; b++) {
        grammar_state_t s = st;
        if (grammar_step(g, &s, (uint8_t)b))
            return false;
    }
    return true;
}

static bool grammar_is_eos(const grammar_vocab_t *v, int token)
{
    return v->eos[token / 64] >> (token % 64) & 1;
}

bt_status_t grammar_advance_token(grammar_t *g, grammar_state_t *st,
                                  int token)
{
    const grammar_vocab_t *v = g->vocab;

    if (v == NULL || token < 0 || token >= v->vocab_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "token %d outside the grammar's vocabulary", token);
    if (grammar_is_eos(v, token)) {
        if (grammar_is_accepting(g, *st))
            return BT_OK;
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "EOS (token %d) before the output is complete",
                        token);
    }
    if (v->len[token] == 0 ||
        !grammar_advance_bytes(g, st, v->arena + v->off[token],
                               v->len[token]))
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "token %d does not fit the grammar", token);
    return BT_OK;
}

bt_status_t grammar_replay(grammar_t *g, const int *tokens, int n,
                           grammar_state_t *st_p)
{
    grammar_state_t st = grammar_start(g);

    for (int i = 0; i < n; i++) {
        bt_status_t status = grammar_advance_token(g, &st, tokens[i]);
        if (status != BT_OK)
            return BT_ERROR(status, "GRAMMAR",
                            "replay: generated token %d (id %d) does not "
                            "fit the grammar", i, tokens[i]);
    }
    *st_p = st;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// masks

/* The trie walk described at the top of the file. */
static void grammar_mask_walk(grammar_t *g, grammar_state_t st,
                              uint64_t *mask)
{
    const grammar_vocab_t *v = g->vocab;
    grammar_state_t *w = g->walk;
    uint32_t valid = 0; /* w[0..valid] hold the current prefix's states */
    int64_t dead_at = -1; /* the prefix of dead_at + 1 bytes is dead */

    memset(mask, 0, sizeof(uint64_t) * v->words);
    w[0] = st;
    for (int i = 0; i < v->n_text; i++) {
        int t = v->order[i];
        const uint8_t *b = (const uint8_t *)v->arena + v->off[t];
        uint32_t len = v->len[t], l = v->lcp[i], d;

        if (dead_at >= 0 && (int64_t)l > dead_at)
            continue; /* shares the dead prefix */
        dead_at = -1;
        if (valid > l)
            valid = l;
        for (d = valid; d < len; d++) {
            w[d + 1] = w[d];
            if (!grammar_step(g, &w[d + 1], b[d]))
                break;
        }
        if (d < len) {
            dead_at = d;
            valid = d;
            continue;
        }
        valid = len;
        mask[t / 64] |= 1ull << (t % 64);
    }
    if (grammar_is_accepting(g, st))
        for (size_t k = 0; k < v->words; k++)
            mask[k] |= v->eos[k];
}

static uint32_t state_hash(grammar_state_t st)
{
    uint64_t h = st.id * 0x9e3779b97f4a7c15ull ^
                 st.aux * 0xc2b2ae3d27d4eb4full ^
                 st.stack * 0x165667b19e3779f9ull;
    return (uint32_t)(h ^ (h >> 29));
}

static cache_entry_t *cache_find(grammar_t *g, grammar_state_t st)
{
    uint32_t k;

    if (g->cache_cap == 0)
        return NULL;
    k = state_hash(st) & (uint32_t)(g->cache_cap - 1);
    while (g->cache[k].mask != NULL) {
        if (grammar_state_eq(g->cache[k].key, st))
            return &g->cache[k];
        k = (k + 1) & (uint32_t)(g->cache_cap - 1);
    }
    return NULL;
}

/* Keeps a copy of mask for st; false when out of room or memory. */
static bool cache_put(grammar_t *g, grammar_state_t st, const uint64_t *mask)
{
    size_t bytes = sizeof(uint64_t) * g->vocab->words;
    uint64_t *copy;
    uint32_t k;

    if (g->cache_bytes + bytes > GRAMMAR_CACHE_MAX_BYTES)
        return true; /* full: served uncached from now on */
    if ((g->cache_n + 1) * 2 > g->cache_cap) {
        int cap = g->cache_cap ? g->cache_cap * 2 : 64;
        cache_entry_t *t = bt_calloc((size_t)cap, sizeof(*t), "grammar_cache");
        if (t == NULL)
            return false;
        for (int i = 0; i < g->cache_cap; i++) {
            if (g->cache[i].mask == NULL)
                continue;
            k = state_hash(g->cache[i].key) & (uint32_t)(cap - 1);
            while (t[k].mask != NULL)
                k = (k + 1) & (uint32_t)(cap - 1);
            t[k] = g->cache[i];
        }
        bt_free(g->cache);
        g->cache = t;
        g->cache_cap = cap;
    }
    copy = bt_malloc(bytes, "grammar_cache");
    if (copy == NULL)
        return false;
    memcpy(copy, mask, bytes);
    k = state_hash(st) & (uint32_t)(g->cache_cap - 1);
    while (g->cache[k].mask != NULL)
        k = (k + 1) & (uint32_t)(g->cache_cap - 1);
    g->cache[k].key = st;
    g->cache[k].mask = copy;
    g->cache_n++;
    g->cache_bytes += bytes;
    return true;
}

bt_status_t grammar_mask(grammar_t *g, grammar_state_t st, uint64_t *mask)
{
    const grammar_vocab_t *v = g->vocab;
    cache_entry_t *e;
    bool any = false;

    if (v == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "grammar has no vocabulary");
    g->served++;
    e = cache_find(g, st);
    if (e != NULL) {
        memcpy(mask, e->mask, sizeof(uint64_t) * v->words);
    } else {
        g->computed++;
        grammar_mask_walk(g, st, mask);
        if (g->dfa != NULL && grammar__dfa_overflowed(g->dfa))
            return BT_ERROR(BT_ERR_NO_RESOURCE, "GRAMMAR",
                            "grammar too large: its DFA passed %d states",
                            GRAMMAR_MAX_DFA_STATES);
        if (!cache_put(g, st, mask))
            return BT_ERR_NO_MEMORY;
    }
    for (size_t k = 0; k < v->words && !any; k++)
        any = mask[k] != 0;
    if (!any)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "no token of the vocabulary can continue the "
                        "output here (a byte the grammar needs has no "
                        "token)");
    return BT_OK;
}

void grammar_mask_stats(const grammar_t *g, uint64_t *computed_p,
                        uint64_t *served_p)
{
    *computed_p = g->computed;
    *served_p = g->served;
}
