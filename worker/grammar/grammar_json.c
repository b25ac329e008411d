/*
 * grammar_json.c - the json_object recognizer: a byte-level JSON lexer and
 * parser whose whole state is a grammar_state_t (lexer state in id, depth
 * in aux, one bit per open container in stack), so it is a small value
 * that masks can be cached by exactly.
 *
 * Accepts one JSON object (RFC 8259 values inside, nesting up to
 * GRAMMAR_JSON_MAX_DEPTH) and nothing after it.  Whitespace policy, the
 * same as the schema regexes: none, except one optional space after ','
 * and ':' (a model cannot pad forever, and masks stay small).  Strings
 * must be well-formed UTF-8 (RFC 3629) with no raw control bytes, and
 * \u escapes of surrogates are refused (cJSON refuses a lone one).
 */
#include "grammar_int.h"

enum {
    J_START = 0,   /* expect the top-level '{' */
    J_OBJ_FIRST,   /* after '{': a key or '}' */
    J_OBJ_KEY_WS,  /* after ',' in an object: ' ' or a key */
    J_OBJ_KEY,     /* a key */
    J_COLON,       /* after a key */
    J_VAL_WS,      /* after ':' or ',' in an array: ' ' or a value */
    J_VAL,         /* a value */
    J_ARR_FIRST,   /* after '[': a value or ']' */
    J_AFTER,       /* after a value in a container: ',' or its close */
    J_DONE,        /* the object is complete */
    J_NUM_MINUS,   /* '-' */
    J_NUM_ZERO,    /* a leading 0 */
    J_NUM_INT,     /* integer digits */
    J_NUM_DOT,     /* '.' */
    J_NUM_FRAC,    /* fraction digits */
    J_NUM_E,       /* 'e' or 'E' */
    J_NUM_ESIGN,   /* exponent sign */
    J_NUM_EXP,     /* exponent digits */
    J_STR = 32,    /* + sub * 2 + is_key (sub: J_S_*) */
    J_LIT = 64     /* + literal * 8 + bytes matched */
};

enum {
    J_S_CHAR = 0, /* in a string */
    J_S_ESC,      /* after '\' */
    J_S_U4,       /* \u: 4 hex digits to go (J_S_U4 + 3: 1 to go) */
    J_S_C1 = 6,   /* UTF-8: 1 continuation byte to go (C2, C3) */
    J_S_E0 = 9,   /* after E0: A0-BF (no overlong form) */
    J_S_ED,       /* after ED: 80-9F (no surrogate) */
    J_S_F0,       /* after F0: 90-BF */
    J_S_F4,       /* after F4: 80-8F (at most U+10FFFF) */
    J_S_UD        /* after \uD: 0-7 (no surrogate escapes, which cJSON
                   * and most parsers refuse alone) */
};

static const char *const j_lits[3] = { "true", "false", "null" };

static uint32_t j_str(int sub, bool key)
{
    return (uint32_t)(J_STR + sub * 2 + (key ? 1 : 0));
}

static bool j_top_is_object(const grammar_state_t *st)
{
    return st->aux > 0 && (st->stack >> (st->aux - 1) & 1);
}

static bool j_push(grammar_state_t *st, bool object)
{
    if (st->aux >= GRAMMAR_JSON_MAX_DEPTH)
        return false;
    if (object)
        st->stack |= 1ull << st->aux;
    else
        st->stack &= ~(1ull << st->aux);
    st->aux++;
    st->id = object ? J_OBJ_FIRST : J_ARR_FIRST;
    return true;
}

/* Closes the innermost container; bits above the depth stay clear, so
 * equal parser states are equal values (the mask cache's key). */
static void j_pop(grammar_state_t *st)
{
    st->aux--;
    st->stack &= ~(1ull << st->aux);
}

/* A value has ended. */
static void j_value_done(grammar_state_t *st)
{
    st->id = st->aux == 0 ? J_DONE : J_AFTER;
}

static bool j_value_start(grammar_state_t *st, uint8_t b)
{
    switch (b) {
    case '{': return j_push(st, true);
    case '[': return j_push(st, false);
    case '"': st->id = j_str(J_S_CHAR, false); return true;
    case '-': st->id = J_NUM_MINUS; return true;
    case '0': st->id = J_NUM_ZERO; return true;
    case 't': st->id = J_LIT + 0 * 8 + 1; return true;
    case 'f': st->id = J_LIT + 1 * 8 + 1; return true;
    case 'n': st->id = J_LIT + 2 * 8 + 1; return true;
    default:
        if (b >= '1' && b <= '9') {
            st->id = J_NUM_INT;
            return true;
        }
        return false;
    }
}

/* In J_AFTER (or right after a number): ',' or the container's close. */
static bool j_after(grammar_state_t *st, uint8_t b)
{
    bool obj = j_top_is_object(st);

    if (b == ',') {
        st->id = obj ? J_OBJ_KEY_WS : J_VAL_WS;
        return true;
    }
    if (b == (obj ? '}' : ']')) {
        j_pop(st);
        j_value_done(st);
        return true;
    }
    return false;
}

static bool j_string(grammar_state_t *st, uint8_t b)
{
    int sub = (int)(st->id - J_STR) / 2;
    bool key = (st->id - J_STR) & 1;

    switch (sub) {
    case J_S_CHAR:
        if (b == '"') {
            if (key)
                st->id = J_COLON;
            else
                j_value_done(st);
            return true;
        }
        if (b == '\\') {
            st->id = j_str(J_S_ESC, key);
            return true;
        }
        if (b < 0x20)
            return false;
        if (b < 0x80)
            return true;
        if (b >= 0xC2 && b <= 0xDF)
            st->id = j_str(J_S_C1, key);
        else if (b == 0xE0)
            st->id = j_str(J_S_E0, key);
        else if (b == 0xED)
            st->id = j_str(J_S_ED, key);
        else if (b >= 0xE1 && b <= 0xEF)
            st->id = j_str(J_S_C1 + 1, key);
        else if (b == 0xF0)
            st->id = j_str(J_S_F0, key);
        else if (b == 0xF4)
            st->id = j_str(J_S_F4, key);
        else if (b >= 0xF1 && b <= 0xF3)
            st->id = j_str(J_S_C1 + 2, key);
        else
            return false;
        return true;
    case J_S_ESC:
        if (b == 'u') {
            st->id = j_str(J_S_U4, key);
            return true;
        }
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' ||
            b == 'n' || b == 'r' || b == 't') {
            st->id = j_str(J_S_CHAR, key);
            return true;
        }
        return false;
    case J_S_U4:
        if ((b | 0x20) == 'd') {
            st->id = j_str(J_S_UD, key);
            return true;
        }
        /* fall through */
    case J_S_U4 + 1:
    case J_S_U4 + 2:
    case J_S_U4 + 3:
        if (!((b >= '0' && b <= '9') || ((b | 0x20) >= 'a' &&
                                         (b | 0x20) <= 'f')))
            return false;
        st->id = j_str(sub == J_S_U4 + 3 ? J_S_CHAR : sub + 1, key);
        return true;
    case J_S_UD:
        if (b < '0' || b > '7')
            return false;
        st->id = j_str(J_S_U4 + 2, key);
        return true;
    case J_S_E0:
    case J_S_ED:
    case J_S_F0:
    case J_S_F4: {
        static const uint8_t lo[] = { 0xA0, 0x80, 0x90, 0x80 };
        static const uint8_t hi[] = { 0xBF, 0x9F, 0xBF, 0x8F };
        int k = sub - J_S_E0;
        if (b < lo[k] || b > hi[k])
            return false;
        st->id = j_str(sub <= J_S_ED ? J_S_C1 : J_S_C1 + 1, key);
        return true;
    }
    default: /* J_S_C1 .. J_S_C1 + 2 */
        if (b < 0x80 || b > 0xBF)
            return false;
        st->id = j_str(sub == J_S_C1 ? J_S_CHAR : sub - 1, key);
        return true;
    }
}

static bool j_step(grammar_state_t *st, uint8_t b)
{
    bool digit = b >= '0' && b <= '9';

    if (st->id >= J_LIT) {
        int lit = (int)(st->id - J_LIT) / 8, pos = (int)(st->id - J_LIT) % 8;
        if ((uint8_t)j_lits[lit][pos] != b)
            return false;
        if (j_lits[lit][pos + 1] == '\0')
            j_value_done(st);
        else
            st->id++;
        return true;
    }
    if (st->id >= J_STR)
        return j_string(st, b);
    switch (st->id) {
    case J_START:
        return b == '{' && j_push(st, true);
    case J_OBJ_FIRST:
        if (b == '}') {
            j_pop(st);
            j_value_done(st);
            return true;
        }
        /* a key: */
        /* fall through */
    case J_OBJ_KEY:
        if (b != '"')
            return false;
        st->id = j_str(J_S_CHAR, true);
        return true;
    case J_OBJ_KEY_WS:
        if (b == ' ') {
            st->id = J_OBJ_KEY;
            return true;
        }
        if (b != '"')
            return false;
        st->id = j_str(J_S_CHAR, true);
        return true;
    case J_COLON:
        if (b != ':')
            return false;
        st->id = J_VAL_WS;
        return true;
    case J_VAL_WS:
        if (b == ' ') {
            st->id = J_VAL;
            return true;
        }
        return j_value_start(st, b);
    case J_VAL:
        return j_value_start(st, b);
    case J_ARR_FIRST:
        if (b == ']') {
            j_pop(st);
            j_value_done(st);
            return true;
        }
        return j_value_start(st, b);
    case J_AFTER:
        return j_after(st, b);
    case J_DONE:
        return false;
    case J_NUM_MINUS:
        if (!digit)
            return false;
        st->id = b == '0' ? J_NUM_ZERO : J_NUM_INT;
        return true;
    case J_NUM_ZERO:
    case J_NUM_INT:
        if (digit && st->id == J_NUM_INT)
            return true;
        if (b == '.') {
            st->id = J_NUM_DOT;
            return true;
        }
        if ((b | 0x20) == 'e') {
            st->id = J_NUM_E;
            return true;
        }
        return j_after(st, b); /* the number ended */
    case J_NUM_DOT:
        if (!digit)
            return false;
        st->id = J_NUM_FRAC;
        return true;
    case J_NUM_FRAC:
        if (digit)
            return true;
        if ((b | 0x20) == 'e') {
            st->id = J_NUM_E;
            return true;
        }
        return j_after(st, b);
    case J_NUM_E:
        if (b == '+' || b == '-') {
            st->id = J_NUM_ESIGN;
            return true;
        }
        /* fall through */
    case J_NUM_ESIGN:
        if (!digit)
            return false;
        st->id = J_NUM_EXP;
        return true;
    case J_NUM_EXP:
        if (digit)
            return true;
        return j_after(st, b);
    default:
        return false;
    }
}

grammar_state_t grammar__json_start(void)
{
    grammar_state_t st = { J_START, 0, 0 };
    return st;
}

bool grammar__json_step(grammar_state_t *st, uint8_t b)
{
    grammar_state_t next = *st;

    if (!j_step(&next, b))
        return false;
    *st = next;
    return true;
}

bool grammar__json_accepting(grammar_state_t st)
{
    return st.id == J_DONE;
}
