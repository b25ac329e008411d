/*
 * grammar_dfa.c - a regex subset -> Thompson NFA -> lazily built DFA over
 * bytes, matched in full (anchored at both ends).
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

// ----------------------------------------------------------------------------
// NFA

typedef enum {
    NFA_EPS = 0, /* out1 */
    NFA_SPLIT,   /* out1, out2 */
    NFA_CHAR,    /* out1 on a byte in set */
    NFA_MATCH
} nfa_type_t;

typedef struct {
    uint8_t type;    /* nfa_type_t */
    int out1;        /* next state, -1 unpatched */
    int out2;        /* SPLIT's second branch */
    uint64_t set[4]; /* NFA_CHAR: the bytes taken (bit b of word b/64) */
} nfa_state_t;

/* A fragment: start state and an EPS end state whose out1 is open. */
typedef struct {
    int start;
    int end;
} frag_t;

/* A class: ASCII members plus whether every non-ASCII character is in. */
typedef struct {
    uint64_t ascii[2];
    bool nonascii;
} cls_t;

typedef struct {
    const char *re;     /* the pattern */
    size_t pos;         /* parse position */
    size_t len;         /* end of the pattern (a trailing '$' excluded) */
    nfa_state_t *st;    /* (cap) states */
    int n;
    int cap;
    bt_status_t status; /* first error */
} parser_t;

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

static bt_status_t re_error(parser_t *p, bt_status_t status, const char *what)
{
    if (p->status == BT_OK)
        p->status = BT_ERROR(status, "GRAMMAR", "regex at offset %zu: %s",
                             p->pos, what);
    return p->status;
}

static int nfa_new(parser_t *p, nfa_type_t type)
{
    nfa_state_t *s;

    if (p->status != BT_OK)
        return -1;
    if (p->n >= GRAMMAR_MAX_NFA_STATES) {
        re_error(p, BT_ERR_UNSUPPORTED,
                 "pattern too large after expanding repeats (over 200000 "
                 "NFA states)");
        return -1;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        nfa_state_t *grown = bt_realloc(p->st, sizeof(*grown) * (size_t)cap,
                                        "grammar_nfa");
        if (grown == NULL) {
            p->status = BT_ERR_NO_MEMORY;
            return -1;
        }
        p->st = grown;
        p->cap = cap;
    }
    s = &p->st[p->n];
    memset(s, 0, sizeof(*s));
    s->type = (uint8_t)type;
    s->out1 = -1;
    s->out2 = -1;
    return p->n++;
}

static frag_t frag_eps(parser_t *p)
{
    int e = nfa_new(p, NFA_EPS);
    return (frag_t){ e, e };
}

/* One byte from `set` (4 words). */
static frag_t frag_set(parser_t *p, const uint64_t set[4])
{
    int c = nfa_new(p, NFA_CHAR), e = nfa_new(p, NFA_EPS);

    if (c < 0 || e < 0)
        return (frag_t){ -1, -1 };
    memcpy(p->st[c].set, set, sizeof(p->st[c].set));
    p->st[c].out1 = e;
    return (frag_t){ c, e };
}

static frag_t frag_range(parser_t *p, int lo, int hi)
{
    uint64_t set[4] = { 0 };

    for (int b = lo; b <= hi; b++)
        set[b >> 6] |= 1ull << (b & 63);
    return frag_set(p, set);
}

static frag_t frag_cat(parser_t *p, frag_t a, frag_t b)
{
    if (p->status != BT_OK)
        return (frag_t){ -1, -1 };
    p->st[a.end].out1 = b.start;
    return (frag_t){ a.start, b.end };
}

static frag_t frag_alt(parser_t *p, frag_t a, frag_t b)
{
    int s = nfa_new(p, NFA_SPLIT), e = nfa_new(p, NFA_EPS);

    if (s < 0 || e < 0)
        return (frag_t){ -1, -1 };
    p->st[s].out1 = a.start;
    p->st[s].out2 = b.start;
    p->st[a.end].out1 = e;
    p->st[b.end].out1 = e;
    return (frag_t){ s, e };
}

/* kind '?', '*' or '+'. */
static frag_t frag_quant(parser_t *p, frag_t a, char kind)
{
    int s = nfa_new(p, NFA_SPLIT), e = nfa_new(p, NFA_EPS);

    if (s < 0 || e < 0)
        return (frag_t){ -1, -1 };
    p->st[s].out1 = a.start;
    p->st[s].out2 = e;
    p->st[a.end].out1 = kind == '?' ? e : s;
    return (frag_t){ kind == '+' ? a.start : s, e };
}

static frag_t frag_seq(parser_t *p, const uint8_t (*r)[2], int n)
{
    frag_t f = frag_range(p, r[0][0], r[0][1]);

    for (int i = 1; i < n; i++)
        f = frag_cat(p, f, frag_range(p, r[i][0], r[i][1]));
    return f;
}

/* One character of a class: the ASCII part as one byte, plus, when
 * nonascii, every well-formed multi-byte UTF-8 character (RFC 3629:
 * no overlong forms, no surrogates, nothing above U+10FFFF). */
static frag_t frag_class(parser_t *p, const cls_t *c)
{
    static const uint8_t utf8[][4][2] = {
        { { 0xC2, 0xDF }, { 0x80, 0xBF } },
        { { 0xE0, 0xE0 }, { 0xA0, 0xBF }, { 0x80, 0xBF } },
        { { 0xE1, 0xEC }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xED, 0xED }, { 0x80, 0x9F }, { 0x80, 0xBF } },
        { { 0xEE, 0xEF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF0, 0xF0 }, { 0x90, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF1, 0xF3 }, { 0x80, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
        { { 0xF4, 0xF4 }, { 0x80, 0x8F }, { 0x80, 0xBF }, { 0x80, 0xBF } },
    };
    static const int utf8_len[] = { 2, 3, 3, 3, 3, 4, 4, 4 };
    uint64_t set[4] = { c->ascii[0], c->ascii[1], 0, 0 };
    frag_t f = frag_set(p, set);

    if (!c->nonascii)
        return f;
    for (size_t i = 0; i < BT_ARRAY_SIZE(utf8) && p->status == BT_OK; i++)
        f = frag_alt(p, f, frag_seq(p, utf8[i], utf8_len[i]));
    return f;
}

// ----------------------------------------------------------------------------
// parser

static void cls_add(cls_t *c, int lo, int hi)
{
    for (int b = lo; b <= hi; b++)
        c->ascii[b >> 6] |= 1ull << (b & 63);
}

static void cls_negate(cls_t *c)
{
    c->ascii[0] = ~c->ascii[0];
    c->ascii[1] = ~c->ascii[1];
    c->nonascii = !c->nonascii;
}

static void cls_union(cls_t *a, const cls_t *b)
{
    a->ascii[0] |= b->ascii[0];
    a->ascii[1] |= b->ascii[1];
    a->nonascii = a->nonascii || b->nonascii;
}

/* \d \w \s and their negations; false when e is not one of them. */
static bool cls_shorthand(char e, cls_t *c)
{
    memset(c, 0, sizeof(*c));
    switch (e | 0x20) {
    case 'd':
        cls_add(c, '0', '9');
        break;
    case 'w':
        cls_add(c, '0', '9');
        cls_add(c, 'a', 'z');
        cls_add(c, 'A', 'Z');
        cls_add(c, '_', '_');
        break;
    case 's':
        cls_add(c, ' ', ' ');
        cls_add(c, '\t', '\r'); /* \t \n \v \f \r */
        break;
    default:
        return false;
    }
    if (e >= 'A' && e <= 'Z')
        cls_negate(c);
    return true;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

static int re_hex(parser_t *p, int digits)
{
    int v = 0;

    for (int i = 0; i < digits; i++) {
        int h = p->pos < p->len ? hex_val(p->re[p->pos]) : -1;
        if (h < 0) {
            re_error(p, BT_ERR_INVALID_ARG, "bad hex digit in an escape");
            return -1;
        }
        v = v * 16 + h;
        p->pos++;
    }
    return v;
}

/* After a backslash: a single code point (returned, -1 on error) or a
 * shorthand class (returns -2 with *c filled). */
static int re_escape(parser_t *p, cls_t *c)
{
    char e;

    if (p->pos >= p->len) {
        re_error(p, BT_ERR_INVALID_ARG, "pattern ends with a backslash");
        return -1;
    }
    e = p->re[p->pos++];
    if (cls_shorthand(e, c))
        return -2;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': return re_hex(p, 2);
    case 'u': return re_hex(p, 4);
    case 'b':
    case 'B':
        p->pos--;
        re_error(p, BT_ERR_UNSUPPORTED, "word boundaries (\\b, \\B) are "
                                        "not supported");
        return -1;
    case 'p':
    case 'P':
        p->pos--;
        re_error(p, BT_ERR_UNSUPPORTED, "Unicode properties (\\p{..}) are "
                                        "not supported");
        return -1;
    default:
        break;
    }
    if (e >= '1' && e <= '9') {
        p->pos--;
        re_error(p, BT_ERR_UNSUPPORTED, "backreferences are not supported");
        return -1;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') ||
        (uint8_t)e >= 0x80) {
        p->pos--;
        re_error(p, BT_ERR_UNSUPPORTED, "unknown escape");
        return -1;
    }
    return (uint8_t)e;
}

/* A class member's code point, which must be ASCII; -2 for a shorthand. */
static int re_class_char(parser_t *p, cls_t *sh)
{
    int v;

    if (p->re[p->pos] == '\\') {
        p->pos++;
        v = re_escape(p, sh);
    } else {
        v = (uint8_t)p->re[p->pos++];
    }
    if (v >= 0x80) {
        p->pos--;
        re_error(p, BT_ERR_UNSUPPORTED, "non-ASCII characters inside [...] "
                                        "are not supported");
        return -1;
    }
    return v;
}

static frag_t re_class(parser_t *p)
{
    cls_t c, sh;
    bool neg = false, first = true;

    memset(&c, 0, sizeof(c));
    if (p->pos < p->len && p->re[p->pos] == '^') {
        neg = true;
        p->pos++;
    }
    for (;;) {
        int lo, hi;

        if (p->pos >= p->len) {
            re_error(p, BT_ERR_INVALID_ARG, "unterminated [...]");
            return (frag_t){ -1, -1 };
        }
        if (p->re[p->pos] == ']' && !first)
            break;
        if (p->re[p->pos] == '[' && p->pos + 1 < p->len &&
            p->re[p->pos + 1] == ':') {
            re_error(p, BT_ERR_UNSUPPORTED, "POSIX classes [:name:] are not "
                                            "supported");
            return (frag_t){ -1, -1 };
        }
        first = false;
        lo = re_class_char(p, &sh);
        if (lo == -1)
            return (frag_t){ -1, -1 };
        if (lo == -2) {
            cls_union(&c, &sh);
            continue;
        }
        if (p->pos + 1 < p->len && p->re[p->pos] == '-' &&
            p->re[p->pos + 1] != ']') {
            p->pos++;
            hi = re_class_char(p, &sh);
            if (hi == -1)
                return (frag_t){ -1, -1 };
            if (hi == -2 || hi < lo) {
                re_error(p, BT_ERR_INVALID_ARG, "bad range in [...]");
                return (frag_t){ -1, -1 };
            }
            cls_add(&c, lo, hi);
        } else {
            cls_add(&c, lo, lo);
        }
    }
    p->pos++; /* ] */
    if (neg)
        cls_negate(&c);
    return frag_class(p, &c);
}

/* A code point as its UTF-8 bytes in sequence. */
static frag_t frag_codepoint(parser_t *p, int cp)
{
    uint8_t b[4];
    int n;
    frag_t f;

    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else {
        b[0] = (uint8_t)(0xE0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    }
    f = frag_range(p, b[0], b[0]);
    for (int i = 1; i < n; i++)
        f = frag_cat(p, f, frag_range(p, b[i], b[i]));
    return f;
}

static frag_t re_alt(parser_t *p, int depth);

static frag_t re_atom(parser_t *p, int depth)
{
    char ch = p->re[p->pos];
    cls_t c;
    frag_t f;
    int v;

    switch (ch) {
    case '(':
        p->pos++;
        if (p->pos < p->len && p->re[p->pos] == '?') {
            if (p->pos + 1 < p->len && p->re[p->pos + 1] == ':') {
                p->pos += 2;
            } else {
                re_error(p, BT_ERR_UNSUPPORTED,
                         "only (?:...) groups are supported (no lookaround, "
                         "named groups or flags)");
                return (frag_t){ -1, -1 };
            }
        }
        f = re_alt(p, depth + 1);
        if (p->status != BT_OK)
            return f;
        if (p->pos >= p->len || p->re[p->pos] != ')') {
            re_error(p, BT_ERR_INVALID_ARG, "missing ')'");
            return (frag_t){ -1, -1 };
        }
        p->pos++;
        return f;
    case '[':
        p->pos++;
        return re_class(p);
    case '.':
        p->pos++;
        memset(&c, 0, sizeof(c));
        cls_add(&c, '\n', '\n');
        cls_negate(&c);
        return frag_class(p, &c);
    case '\\':
        p->pos++;
        v = re_escape(p, &c);
        if (v == -1)
            return (frag_t){ -1, -1 };
        if (v == -2)
            return frag_class(p, &c);
        return frag_codepoint(p, v);
    case '*':
    case '+':
    case '?':
        re_error(p, BT_ERR_INVALID_ARG, "nothing to repeat");
        return (frag_t){ -1, -1 };
    case '{':
        re_error(p, BT_ERR_INVALID_ARG, "nothing to repeat (escape a literal "
                                        "'{' as \\{)");
        return (frag_t){ -1, -1 };
    case '^':
    case '$':
        re_error(p, BT_ERR_UNSUPPORTED, "anchors are supported only at the "
                                        "start (^) and end ($)");
        return (frag_t){ -1, -1 };
    case ')':
        re_error(p, BT_ERR_INVALID_ARG, "unbalanced ')'");
        return (frag_t){ -1, -1 };
    default:
        p->pos++;
        return frag_range(p, (uint8_t)ch, (uint8_t)ch);
    }
}

static bool re_number(parser_t *p, int *v_p)
{
    int v = 0;
    size_t start = p->pos;

    while (p->pos < p->len && p->re[p->pos] >= '0' && p->re[p->pos] <= '9') {
        v = v * 10 + (p->re[p->pos++] - '0');
        if (v > GRAMMAR_MAX_REPEAT) {
            re_error(p, BT_ERR_UNSUPPORTED, "repeat count above 1000");
            return false;
        }
    }
    *v_p = v;
    return p->pos > start;
}

/* An atom and its quantifier.  {m,n} copies the atom by parsing its text
 * again (no syntax tree is kept). */
static frag_t re_piece(parser_t *p, int depth)
{
    size_t atom_start = p->pos, after;
    frag_t f = re_atom(p, depth), r, tail;
    int m, n;

    if (p->status != BT_OK || p->pos >= p->len)
        return f;
    switch (p->re[p->pos]) {
    case '?':
    case '*':
    case '+':
        f = frag_quant(p, f, p->re[p->pos]);
        p->pos++;
        break;
    case '{':
        p->pos++;
        if (!re_number(p, &m)) {
            re_error(p, BT_ERR_INVALID_ARG, "'{' must start {m}, {m,} or "
                                            "{m,n} (escape a literal '{' as "
                                            "\\{)");
            return f;
        }
        n = m;
        if (p->pos < p->len && p->re[p->pos] == ',') {
            p->pos++;
            if (!re_number(p, &n))
                n = p->status == BT_OK ? -1 : 0; /* {m,}: unbounded */
        }
        if (p->status != BT_OK)
            return f;
        if (p->pos >= p->len || p->re[p->pos] != '}') {
            re_error(p, BT_ERR_INVALID_ARG, "unterminated {m,n}");
            return f;
        }
        if (n >= 0 && n < m) {
            re_error(p, BT_ERR_INVALID_ARG, "{m,n} with n < m");
            return f;
        }
        p->pos++;
        after = p->pos;
        /* f is the first copy; parse the atom again for the others */
        r = m > 0 ? f : frag_eps(p);
        for (int i = 1; i < m; i++) {
            p->pos = atom_start;
            r = frag_cat(p, r, re_atom(p, depth));
        }
        if (n < 0) {
            p->pos = atom_start;
            r = frag_cat(p, r, frag_quant(p, re_atom(p, depth), '*'));
        } else if (n > m) {
            bool have_tail = false;
            tail = (frag_t){ -1, -1 };
            for (int i = 0; i < n - m; i++) {
                frag_t x;
                if (i == 0 && m == 0) {
                    x = f; /* reuse the first parse */
                } else {
                    p->pos = atom_start;
                    x = re_atom(p, depth);
                }
                if (have_tail)
                    x = frag_cat(p, x, tail);
                tail = frag_quant(p, x, '?');
                have_tail = true;
                if (p->status != BT_OK)
                    return tail;
            }
            r = frag_cat(p, r, tail);
        }
        p->pos = after;
        f = r;
        break;
    default:
        return f;
    }
    if (p->status != BT_OK || p->pos >= p->len)
        return f;
    if (p->re[p->pos] == '?') {
        p->pos++; /* lazy: the same full match */
    } else if (p->re[p->pos] == '+') {
        re_error(p, BT_ERR_UNSUPPORTED, "possessive quantifiers are not "
                                        "supported");
    }
    if (p->status == BT_OK && p->pos < p->len &&
        (p->re[p->pos] == '?' || p->re[p->pos] == '*' ||
         p->re[p->pos] == '+' || p->re[p->pos] == '{'))
        re_error(p, BT_ERR_INVALID_ARG, "multiple repeat");
    return f;
}

static frag_t re_concat(parser_t *p, int depth)
{
    frag_t f = frag_eps(p);

    while (p->status == BT_OK && p->pos < p->len && p->re[p->pos] != '|' &&
           p->re[p->pos] != ')')
        f = frag_cat(p, f, re_piece(p, depth));
    return f;
}

static frag_t re_alt(parser_t *p, int depth)
{
    frag_t f;

    if (depth > 200) {
        re_error(p, BT_ERR_UNSUPPORTED, "groups nested deeper than 200");
        return (frag_t){ -1, -1 };
    }
    f = re_concat(p, depth);
    while (p->status == BT_OK && p->pos < p->len && p->re[p->pos] == '|') {
        p->pos++;
        f = frag_alt(p, f, re_concat(p, depth));
    }
    return f;
}

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
    parser_t p;
    grammar_dfa_t *d;
    frag_t f;
    bt_status_t status;
    int n = 0;

    memset(&p, 0, sizeof(p));
    p.re = regex;
    p.len = strlen(regex);
    if (p.len > 0 && regex[0] == '^')
        p.pos = 1;
    if (p.len > p.pos && regex[p.len - 1] == '$') {
        size_t bs = 0; /* an escaped '$' is a literal */
        while (bs + 1 < p.len && regex[p.len - 2 - bs] == '\\')
            bs++;
        if (bs % 2 == 0)
            p.len--;
    }
    f = re_alt(&p, 0);
    if (p.status == BT_OK && p.pos < p.len)
        re_error(&p, BT_ERR_INVALID_ARG, "unbalanced ')'");
    if (p.status == BT_OK) {
        int m = nfa_new(&p, NFA_MATCH);
        if (m >= 0)
            p.st[f.end].out1 = m;
    }
    if (p.status != BT_OK) {
        bt_free(p.st);
        return p.status;
    }
    d = bt_calloc(1, sizeof(*d), "grammar_dfa");
    if (d == NULL) {
        bt_free(p.st);
        return BT_ERR_NO_MEMORY;
    }
    d->nfa = p.st;
    d->n_nfa = p.n;
    d->match = p.n - 1;
    d->alive = bt_calloc((size_t)p.n, 1, "grammar_dfa");
    d->mark = bt_calloc((size_t)p.n, sizeof(*d->mark), "grammar_dfa");
    d->stack = bt_malloc(sizeof(int) * (size_t)p.n, "grammar_dfa");
    d->list = bt_malloc(sizeof(int) * (size_t)p.n, "grammar_dfa");
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
    dfa_closure(d, f.start, &n);
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
