/*
 * grammar_regex.c - the regex subset -> a Thompson NFA (grammar_dfa.c
 * turns it into a lazy DFA; the subset is described there).
 *
 * Recursive descent straight to NFA fragments, with no syntax tree: a
 * counted repeat {m,n} parses its atom's text again for each copy.
 */
#include "grammar_int.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

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

typedef grammar_nfa_state_t nfa_state_t;

typedef struct {
    const char *re;     /* the pattern */
    size_t pos;         /* parse position */
    size_t len;         /* end of the pattern (a trailing '$' excluded) */
    nfa_state_t *st;    /* (cap) states */
    int n;
    int cap;
    bt_status_t status; /* first error */
} parser_t;

static bt_status_t re_error(parser_t *p, bt_status_t status, const char *what)
{
    if (p->status == BT_OK)
        p->status = BT_ERROR(status, "GRAMMAR", "regex at offset %zu: %s",
                             p->pos, what);
    return p->status;
}

static int nfa_new(parser_t *p, int type)
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
// entry

bt_status_t grammar__nfa_compile(const char *regex, grammar_nfa_t *nfa)
{
    parser_t p;
    frag_t f;

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
    nfa->st = p.st;
    nfa->n = p.n;
    nfa->start = f.start;
    nfa->match = p.n - 1;
    return BT_OK;
}
