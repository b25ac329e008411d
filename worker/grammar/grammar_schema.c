/*
 * grammar_schema.c - JSON schema -> regex (as outlines and vLLM do), and
 * guided_choice lists -> alternations.
 *
 * Supported: type (a name or a list), string (minLength, maxLength,
 * pattern, format date / time / date-time / uuid), integer, number,
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum on integers (as
 * digit-range regexes), boolean, null, enum, const, array (items,
 * minItems, maxItems), object
 * (properties in the schema's order, required, additionalProperties
 * false or true: only the listed properties are produced), anyOf / oneOf
 * (both as alternation: oneOf's exclusivity is not enforced), allOf with
 * one member, $ref to #/$defs/.. or #/definitions/.. (recursion refused),
 * and the annotations title, description, examples, default, $schema,
 * $id, $comment, deprecated, readOnly, writeOnly.  Anything else is
 * refused with BT_ERR_UNSUPPORTED naming the keyword.
 *
 * Whitespace: none, except one optional space after ',' and ':'.
 * Integers have at most 16 digits and fractions and exponents are
 * bounded too, so a number always ends.  A schema with no type allows
 * any JSON value with at most one level of nesting, an object without
 * properties (an array without items) any object (array) of those: a
 * regex cannot count brackets.
 */
#include "grammar.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_buf.h"
#include "bt_error.h"
#include "bt_util.h"
#include "grammar_int.h"

#define SCH_MAX_DEPTH 32 /* nesting of subschemas and $refs */
#define SCH_SEP ",[ ]?"
#define SCH_COLON ":[ ]?"
/* a string character: no surrogate escapes (cJSON refuses lone ones) */
#define SCH_CHAR                                                            \
    "([^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|"                                \
    "\\\\u([0-9a-cA-CeEfF][0-9a-fA-F]|[dD][0-7])[0-9a-fA-F]{2})"
#define SCH_STR "\"" SCH_CHAR "*\""
#define SCH_INT "-?(0|[1-9][0-9]{0,15})"
#define SCH_NUM SCH_INT "(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?"
#define SCH_V0 "(" SCH_STR "|" SCH_NUM "|true|false|null)"
#define SCH_V1                                                              \
    "(" SCH_V0 "|\\[(" SCH_V0 "(" SCH_SEP SCH_V0 ")*)?\\]|\\{(" SCH_STR      \
    SCH_COLON SCH_V0 "(" SCH_SEP SCH_STR SCH_COLON SCH_V0 ")*)?\\})"
#define SCH_ANY_OBJECT                                                      \
    "\\{(" SCH_STR SCH_COLON SCH_V1 "(" SCH_SEP SCH_STR SCH_COLON SCH_V1    \
    ")*)?\\}"
#define SCH_ANY_ARRAY "\\[(" SCH_V1 "(" SCH_SEP SCH_V1 ")*)?\\]"

typedef struct {
    const cJSON *root;
    const char *refs[SCH_MAX_DEPTH]; /* $refs being expanded */
    int n_refs;
    bt_status_t status;              /* first error */
} sch_t;

/* Keywords and the types they belong to (0: any type). */
enum {
    T_STRING = 1 << 0,
    T_INTEGER = 1 << 1,
    T_NUMBER = 1 << 2,
    T_BOOLEAN = 1 << 3,
    T_NULL = 1 << 4,
    T_ARRAY = 1 << 5,
    T_OBJECT = 1 << 6
};

static const struct {
    const char *name;
    int types;
} sch_keywords[] = {
    { "type", 0 }, { "enum", 0 }, { "const", 0 }, { "anyOf", 0 },
    { "oneOf", 0 }, { "allOf", 0 }, { "$ref", 0 }, { "$defs", 0 },
    { "definitions", 0 }, { "title", 0 }, { "description", 0 },
    { "examples", 0 }, { "default", 0 }, { "$schema", 0 }, { "$id", 0 },
    { "$comment", 0 }, { "deprecated", 0 }, { "readOnly", 0 },
    { "writeOnly", 0 },
    { "minLength", T_STRING }, { "maxLength", T_STRING },
    { "pattern", T_STRING }, { "format", T_STRING },
    { "items", T_ARRAY }, { "minItems", T_ARRAY }, { "maxItems", T_ARRAY },
    { "minimum", T_INTEGER | T_NUMBER }, { "maximum", T_INTEGER | T_NUMBER },
    { "exclusiveMinimum", T_INTEGER | T_NUMBER },
    { "exclusiveMaximum", T_INTEGER | T_NUMBER },
    { "properties", T_OBJECT }, { "required", T_OBJECT },
    { "additionalProperties", T_OBJECT },
};

static const struct {
    const char *name;
    int bit;
} sch_types[] = {
    { "string", T_STRING }, { "integer", T_INTEGER }, { "number", T_NUMBER },
    { "boolean", T_BOOLEAN }, { "null", T_NULL }, { "array", T_ARRAY },
    { "object", T_OBJECT },
};

static char *sch_fail(sch_t *s, bt_status_t status, const char *fmt,
                      const char *arg)
{
    if (s->status == BT_OK)
        s->status = BT_ERROR(status, "GRAMMAR", fmt, arg);
    return NULL;
}

static char *sch_dup(sch_t *s, const char *text)
{
    char *r = bt_strdup(text, "grammar_schema");

    if (r == NULL && s->status == BT_OK)
        s->status = BT_ERR_NO_MEMORY;
    return r;
}

/* Appends text as a literal (every regex metacharacter escaped). */
static bt_status_t sch_put_literal(bt_buf_t *b, const char *text, size_t n)
{
    bt_status_t status = BT_OK;

    for (size_t i = 0; i < n && status == BT_OK; i++) {
        uint8_t c = (uint8_t)text[i];
        if (c < 0x20 || c == 0x7F)
            status = bt_buf_printf(b, "\\x%02x", c);
        else if (c >= 0x80 || (c >= '0' && c <= '9') ||
                 ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == ' ' ||
                 c == '_')
            status = bt_buf_append(b, &text[i], 1);
        else
            status = bt_buf_printf(b, "\\%c", c);
    }
    return status;
}

/* The regex of one JSON value exactly as written (enum, const). */
static char *sch_json_literal(sch_t *s, const cJSON *v)
{
    char *text = cJSON_PrintUnformatted(v);
    bt_buf_t b;

    if (text == NULL) {
        s->status = BT_ERR_NO_MEMORY;
        return NULL;
    }
    bt_buf_init(&b);
    if (sch_put_literal(&b, text, strlen(text)) != BT_OK ||
        bt_buf_append(&b, "", 0) != BT_OK) {
        cJSON_free(text);
        bt_buf_cleanup(&b);
        s->status = BT_ERR_NO_MEMORY;
        return NULL;
    }
    cJSON_free(text);
    return b.data;
}

static char *sch_value(sch_t *s, const cJSON *node, int depth);

/* "(a|b|...)" of the translations of an array of subschemas (or of JSON
 * literals when literal). */
static char *sch_alternation(sch_t *s, const cJSON *list, bool literal,
                             int depth, const char *what)
{
    bt_buf_t b;
    const cJSON *it;
    int i = 0;

    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return sch_fail(s, BT_ERR_INVALID_ARG,
                        "schema: %s must be a non-empty array", what);
    bt_buf_init(&b);
    if (bt_buf_append(&b, "(", 1) != BT_OK)
        goto oom;
    cJSON_ArrayForEach(it, list) {
        char *r = literal ? sch_json_literal(s, it)
                          : sch_value(s, it, depth + 1);
        if (r == NULL) {
            bt_buf_cleanup(&b);
            return NULL;
        }
        if ((i++ > 0 && bt_buf_append(&b, "|", 1) != BT_OK) ||
            bt_buf_append(&b, r, strlen(r)) != BT_OK) {
            bt_free(r);
            goto oom;
        }
        bt_free(r);
    }
    if (bt_buf_append(&b, ")", 1) != BT_OK)
        goto oom;
    return b.data;

oom:
    bt_buf_cleanup(&b);
    s->status = BT_ERR_NO_MEMORY;
    return NULL;
}

/* A non-negative integer keyword, -1 when absent; -2 on error. */
static int sch_count(sch_t *s, const cJSON *node, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, name);

    if (v == NULL)
        return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
        v->valuedouble != (double)(int)v->valuedouble) {
        sch_fail(s, BT_ERR_INVALID_ARG,
                 "schema: %s must be a non-negative integer", name);
        return -2;
    }
    if (v->valuedouble > GRAMMAR_MAX_REPEAT) {
        sch_fail(s, BT_ERR_UNSUPPORTED,
                 "schema: %s above 1000 is not supported", name);
        return -2;
    }
    return v->valueint;
}

static char *sch_string(sch_t *s, const cJSON *node)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(node, "format");
    int lo = sch_count(s, node, "minLength");
    int hi = sch_count(s, node, "maxLength");
    char buf[160];

    if (lo == -2 || hi == -2)
        return NULL;
    if ((pattern != NULL) + (format != NULL) + (lo >= 0 || hi >= 0) > 1)
        return sch_fail(s, BT_ERR_UNSUPPORTED,
                        "schema: %s together with another string "
                        "constraint is not supported",
                        pattern != NULL ? "pattern" : "format");
    if (pattern != NULL) {
        bt_buf_t b;
        const char *p;
        size_t n;

        if (!cJSON_IsString(pattern))
            return sch_fail(s, BT_ERR_INVALID_ARG,
                            "schema: %s must be a string", "pattern");
        p = pattern->valuestring;
        n = strlen(p);
        if (n > 0 && p[0] == '^') {
            p++;
            n--;
        }
        if (n > 0 && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\'))
            n--;
        bt_buf_init(&b);
        if (bt_buf_printf(&b, "\"(%.*s)\"", (int)n, p) != BT_OK) {
            s->status = BT_ERR_NO_MEMORY;
            return NULL;
        }
        return b.data;
    }
    if (format != NULL) {
        const char *f = cJSON_IsString(format) ? format->valuestring : "";
        static const char date[] =
            "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
        static const char time[] =
            "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?"
            "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?";
        if (strcmp(f, "date") == 0)
            snprintf(buf, sizeof(buf), "\"%s\"", date);
        else if (strcmp(f, "time") == 0)
            snprintf(buf, sizeof(buf), "\"%s\"", time);
        else if (strcmp(f, "date-time") == 0)
            snprintf(buf, sizeof(buf), "\"%sT%s\"", date, time);
        else if (strcmp(f, "uuid") == 0)
            snprintf(buf, sizeof(buf),
                     "\"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     "[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\"");
        else
            return sch_fail(s, BT_ERR_UNSUPPORTED,
                            "schema: string format '%s' is not supported "
                            "(date, time, date-time, uuid are)", f);
        return sch_dup(s, buf);
    }
    if (lo < 0 && hi < 0)
        return sch_dup(s, SCH_STR);
    if (hi >= 0 && lo > hi)
        return sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s",
                        "minLength > maxLength");
    if (hi >= 0)
        snprintf(buf, sizeof(buf), "\"%s{%d,%d}\"", SCH_CHAR,
                 lo < 0 ? 0 : lo, hi);
    else
        snprintf(buf, sizeof(buf), "\"%s{%d,}\"", SCH_CHAR, lo);
    return sch_dup(s, buf);
}

static char *sch_array(sch_t *s, const cJSON *node, int depth)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    int lo = sch_count(s, node, "minItems");
    int hi = sch_count(s, node, "maxItems");
    char *item;
    bt_buf_t b;
    bt_status_t status;

    if (lo == -2 || hi == -2)
        return NULL;
    if (lo < 0)
        lo = 0;
    if (hi >= 0 && lo > hi)
        return sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s",
                        "minItems > maxItems");
    if (items != NULL && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s other than one "
                        "schema (tuple form) is not supported", "items");
    if (hi == 0)
        return sch_dup(s, "\\[\\]");
    item = items != NULL ? sch_value(s, items, depth + 1)
                         : sch_dup(s, SCH_V1);
    if (item == NULL)
        return NULL;
    bt_buf_init(&b);
    if (lo == 0) {
        status = bt_buf_printf(&b, "\\[(%s(" SCH_SEP "%s)", item, item);
        if (status == BT_OK)
            status = hi < 0 ? bt_buf_printf(&b, "*)?\\]")
                            : bt_buf_printf(&b, "{0,%d})?\\]", hi - 1);
    } else {
        status = bt_buf_printf(&b, "\\[%s(" SCH_SEP "%s)", item, item);
        if (status == BT_OK)
            status = hi < 0 ? bt_buf_printf(&b, "{%d,}\\]", lo - 1)
                            : bt_buf_printf(&b, "{%d,%d}\\]", lo - 1,
                                            hi - 1);
    }
    bt_free(item);
    if (status != BT_OK) {
        bt_buf_cleanup(&b);
        s->status = BT_ERR_NO_MEMORY;
        return NULL;
    }
    return b.data;
}

static bool sch_is_required(const cJSON *required, const char *name)
{
    const cJSON *it;

    cJSON_ArrayForEach(it, required) {
        if (cJSON_IsString(it) && strcmp(it->valuestring, name) == 0)
            return true;
    }
    return false;
}

/* Properties in order; optional ones may be left out.  With "after" the
 * text after property i once one was written (each is ", P" or optional
 * "(, P)?"), and "first" the text from i while none was written (P then
 * after(i+1), or for an optional property also first(i+1)), the object
 * is {first(0)}: O(n^2) regex text for n properties, not 2^n. */
static char *sch_object(sch_t *s, const cJSON *node, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(
        node, "additionalProperties");
    const cJSON *it;
    char **pv = NULL;  /* (n) "key": value regex of each property */
    bool *req = NULL;  /* (n) */
    int n = 0, i;
    bt_buf_t b, first;
    char *result = NULL;

    if (addl != NULL && !cJSON_IsBool(addl))
        return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s as a schema is "
                        "not supported (true or false are)",
                        "additionalProperties");
    if (required != NULL && !cJSON_IsArray(required))
        return sch_fail(s, BT_ERR_INVALID_ARG,
                        "schema: %s must be an array", "required");
    if (props == NULL || cJSON_GetArraySize(props) == 0) {
        if (required != NULL && cJSON_GetArraySize(required) > 0)
            return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s names a "
                            "property that is not in properties",
                            "required");
        if (props != NULL || cJSON_IsFalse(addl))
            return sch_dup(s, "\\{\\}");
        return sch_dup(s, SCH_ANY_OBJECT);
    }
    if (!cJSON_IsObject(props))
        return sch_fail(s, BT_ERR_INVALID_ARG,
                        "schema: %s must be an object", "properties");
    cJSON_ArrayForEach(it, required) {
        if (!cJSON_IsString(it) ||
            !cJSON_HasObjectItem(props, it->valuestring))
            return sch_fail(s, BT_ERR_UNSUPPORTED,
                            "schema: required property '%s' is not in "
                            "properties",
                            cJSON_IsString(it) ? it->valuestring : "?");
    }
    n = cJSON_GetArraySize(props);
    pv = bt_calloc((size_t)n, sizeof(*pv), "grammar_schema");
    req = bt_calloc((size_t)n, sizeof(*req), "grammar_schema");
    if (pv == NULL || req == NULL) {
        s->status = BT_ERR_NO_MEMORY;
        goto out;
    }
    i = 0;
    cJSON_ArrayForEach(it, props) {
        cJSON *key = cJSON_CreateString(it->string);
        char *ktext = key != NULL ? cJSON_PrintUnformatted(key) : NULL;
        char *v = sch_value(s, it, depth + 1);
        bt_buf_t pb;

        cJSON_Delete(key);
        if (v == NULL || ktext == NULL) {
            if (v != NULL || s->status == BT_OK)
                s->status = BT_ERR_NO_MEMORY;
            cJSON_free(ktext);
            bt_free(v);
            goto out;
        }
        bt_buf_init(&pb);
        if (sch_put_literal(&pb, ktext, strlen(ktext)) != BT_OK ||
            bt_buf_printf(&pb, SCH_COLON "%s", v) != BT_OK) {
            s->status = BT_ERR_NO_MEMORY;
            bt_buf_cleanup(&pb);
        }
        cJSON_free(ktext);
        bt_free(v);
        if (s->status != BT_OK)
            goto out;
        pv[i] = pb.data;
        req[i] = sch_is_required(required, it->string);
        i++;
    }

    /* first(i) = req: P_i after(i+1); opt: (P_i after(i+1)|first(i+1)),
     * written from the last property back */
    bt_buf_init(&first);
    for (i = n - 1; i >= 0; i--) {
        bt_buf_t nb;
        bt_status_t status;

        bt_buf_init(&nb);
        status = bt_buf_printf(&nb, req[i] ? "%s" : "(%s", pv[i]);
        for (int j = i + 1; j < n && status == BT_OK; j++)
            status = bt_buf_printf(&nb, req[j] ? SCH_SEP "%s"
                                               : "(" SCH_SEP "%s)?",
                                   pv[j]);
        if (status == BT_OK && !req[i])
            status = bt_buf_printf(&nb, "|%s)",
                                   first.data != NULL ? first.data : "");
        bt_buf_cleanup(&first);
        first = nb;
        if (status != BT_OK) {
            s->status = BT_ERR_NO_MEMORY;
            bt_buf_cleanup(&first);
            goto out;
        }
    }
    bt_buf_init(&b);
    if (bt_buf_printf(&b, "\\{%s\\}", first.data) != BT_OK)
        s->status = BT_ERR_NO_MEMORY;
    else
        result = b.data;
    bt_buf_cleanup(&first);

out:
    for (i = 0; pv != NULL && i < n; i++)
        bt_free(pv[i]);
    bt_free(pv);
    bt_free(req);
    return result;
}

static char *sch_ref(sch_t *s, const char *ref, int depth)
{
    const cJSON *defs = NULL, *target;
    const char *name = NULL;
    char *r;

    if (strncmp(ref, "#/$defs/", 8) == 0) {
        defs = cJSON_GetObjectItemCaseSensitive(s->root, "$defs");
        name = ref + 8;
    } else if (strncmp(ref, "#/definitions/", 14) == 0) {
        defs = cJSON_GetObjectItemCaseSensitive(s->root, "definitions");
        name = ref + 14;
    } else {
        return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: $ref '%s' is not "
                        "supported (only #/$defs/NAME and "
                        "#/definitions/NAME are)", ref);
    }
    target = defs != NULL ? cJSON_GetObjectItemCaseSensitive(defs, name)
                          : NULL;
    if (target == NULL)
        return sch_fail(s, BT_ERR_INVALID_ARG,
                        "schema: $ref '%s' names no definition", ref);
    for (int i = 0; i < s->n_refs; i++)
        if (strcmp(s->refs[i], ref) == 0)
            return sch_fail(s, BT_ERR_UNSUPPORTED,
                            "schema: recursive $ref '%s' is not supported "
                            "(a regex cannot nest without bound)", ref);
    if (s->n_refs >= SCH_MAX_DEPTH)
        return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s",
                        "$refs nested too deeply");
    s->refs[s->n_refs++] = ref;
    r = sch_value(s, target, depth + 1);
    s->n_refs--;
    return r;
}

/* The types a node allows (bits), from "type" or implied by keywords. */
static int sch_node_types(sch_t *s, const cJSON *node)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    const cJSON *it;
    int bits = 0;

    if (type == NULL)
        return 0;
    if (cJSON_IsString(type)) {
        for (size_t k = 0; k < BT_ARRAY_SIZE(sch_types); k++)
            if (strcmp(type->valuestring, sch_types[k].name) == 0)
                return sch_types[k].bit;
        sch_fail(s, BT_ERR_INVALID_ARG, "schema: unknown type '%s'",
                 type->valuestring);
        return -1;
    }
    if (!cJSON_IsArray(type) || cJSON_GetArraySize(type) == 0) {
        sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s must be a name or a "
                 "non-empty list of names", "type");
        return -1;
    }
    cJSON_ArrayForEach(it, type) {
        int bit = 0;
        for (size_t k = 0; it->valuestring && k < BT_ARRAY_SIZE(sch_types);
             k++)
            if (strcmp(it->valuestring, sch_types[k].name) == 0)
                bit = sch_types[k].bit;
        if (!cJSON_IsString(it) || bit == 0) {
            sch_fail(s, BT_ERR_INVALID_ARG, "schema: unknown type '%s'",
                     cJSON_IsString(it) ? it->valuestring : "?");
            return -1;
        }
        bits |= bit;
    }
    return bits;
}

// ----------------------------------------------------------------------------
// integer ranges

#define SCH_INT_MAX 9999999999999999LL /* 16 digits, as SCH_INT */

static bool sch_has_bounds(const cJSON *node)
{
    return cJSON_HasObjectItem(node, "minimum") ||
           cJSON_HasObjectItem(node, "maximum") ||
           cJSON_HasObjectItem(node, "exclusiveMinimum") ||
           cJSON_HasObjectItem(node, "exclusiveMaximum");
}

/* Appends the regex of the same-length digit strings x..y (x <= y). */
static bt_status_t sch_digits(bt_buf_t *b, const char *x, const char *y,
                              int n)
{
    bt_status_t status;
    bool x_low = true, y_high = true; /* x[1..] all 0, y[1..] all 9 */

    if (n <= 0 || n > 20)
        return n == 0 ? BT_OK : BT_ERR_INTERNAL;
    if (x[0] == y[0]) {
        status = bt_buf_append(b, x, 1);
        return status != BT_OK ? status : sch_digits(b, x + 1, y + 1, n - 1);
    }
    for (int i = 1; i < n; i++) {
        x_low = x_low && x[i] == '0';
        y_high = y_high && y[i] == '9';
    }
    if (n == 1)
        return bt_buf_printf(b, "[%c-%c]", x[0], y[0]);
    /* x0 x[1..]..99, (x0+1)..(y0-1) then anything, y0 00..y[1..]; the
     * ends fold into the middle when they span their whole decade */
    {
        char lo = x_low ? x[0] : (char)(x[0] + 1);
        char hi = y_high ? y[0] : (char)(y[0] - 1);
        char nines[24], zeros[24];
        int alts = 0;

        memset(nines, '9', (size_t)n);
        memset(zeros, '0', (size_t)n);
        status = bt_buf_append(b, "(", 1);
        if (status == BT_OK && !x_low) {
            status = bt_buf_append(b, x, 1);
            if (status == BT_OK)
                status = sch_digits(b, x + 1, nines, n - 1);
            alts++;
        }
        if (status == BT_OK && lo <= hi) {
            status = bt_buf_printf(b, "%s[%c-%c][0-9]{%d}", alts ? "|" : "",
                                   lo, hi, n - 1);
            alts++;
        }
        if (status == BT_OK && !y_high) {
            status = bt_buf_printf(b, "%s%c", alts ? "|" : "", y[0]);
            if (status == BT_OK)
                status = sch_digits(b, zeros, y + 1, n - 1);
        }
        return status != BT_OK ? status : bt_buf_append(b, ")", 1);
    }
}

/* Appends the regex of the integers a..b (0 <= a <= b), no leading zeros:
 * one alternative per digit count. */
static bt_status_t sch_range(bt_buf_t *b, long long a, long long b_hi)
{
    bt_status_t status = bt_buf_append(b, "(", 1);
    long long lo_len = 1;
    int alts = 0;

    for (int n = 1; n <= 16 && status == BT_OK; n++, lo_len *= 10) {
        long long lo = n == 1 ? 0 : lo_len, hi = lo_len * 10 - 1;
        char x[24], y[24];

        if (lo < a)
            lo = a;
        if (hi > b_hi)
            hi = b_hi;
        if (lo > hi)
            continue;
        snprintf(x, sizeof(x), "%lld", lo);
        snprintf(y, sizeof(y), "%lld", hi);
        if (alts++ > 0)
            status = bt_buf_append(b, "|", 1);
        if (status == BT_OK)
            status = sch_digits(b, x, y, n);
    }
    return status != BT_OK ? status : bt_buf_append(b, ")", 1);
}

/* An integer bound: *v_p the inclusive value; false (with the error set)
 * when it is not an integer or beyond 16 digits; true and *v_p untouched
 * when absent. */
static bool sch_bound(sch_t *s, const cJSON *node, const char *name,
                      int adjust, long long *v_p)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, name);
    double d;

    if (v == NULL)
        return true;
    d = cJSON_IsNumber(v) ? v->valuedouble : 0.5;
    if (d != (double)(long long)d || d > (double)SCH_INT_MAX ||
        d < -(double)SCH_INT_MAX) {
        sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s must be an integer of at "
                 "most 16 digits for type integer", name);
        return false;
    }
    *v_p = (long long)d + adjust;
    return true;
}

/* -?(0|[1-9][0-9]{0,15}), or the integers between the bounds. */
static char *sch_integer(sch_t *s, const cJSON *node)
{
    long long lo = -SCH_INT_MAX, hi = SCH_INT_MAX, m = lo, x = hi;
    bt_buf_t b;
    bt_status_t status = BT_OK;

    if (!sch_has_bounds(node))
        return sch_dup(s, SCH_INT);
    if (!sch_bound(s, node, "minimum", 0, &lo) ||
        !sch_bound(s, node, "exclusiveMinimum", 1, &m) ||
        !sch_bound(s, node, "maximum", 0, &hi) ||
        !sch_bound(s, node, "exclusiveMaximum", -1, &x))
        return NULL;
    lo = BT_MAX(lo, m);
    hi = BT_MIN(hi, x);
    if (lo > hi)
        return sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s",
                        "no integer lies between the bounds");
    bt_buf_init(&b);
    if (lo >= 0) {
        status = sch_range(&b, lo, hi);
    } else if (hi < 0) {
        status = bt_buf_append(&b, "-", 1);
        if (status == BT_OK)
            status = sch_range(&b, -hi, -lo);
    } else {
        status = bt_buf_append(&b, "(-", 2);
        if (status == BT_OK)
            status = sch_range(&b, 1, -lo);
        if (status == BT_OK)
            status = bt_buf_append(&b, "|", 1);
        if (status == BT_OK)
            status = sch_range(&b, 0, hi);
        if (status == BT_OK)
            status = bt_buf_append(&b, ")", 1);
    }
    if (status != BT_OK) {
        bt_buf_cleanup(&b);
        s->status = BT_ERR_NO_MEMORY;
        return NULL;
    }
    return b.data;
}

static char *sch_type(sch_t *s, const cJSON *node, int bit, int depth)
{
    switch (bit) {
    case T_STRING: return sch_string(s, node);
    case T_INTEGER: return sch_integer(s, node);
    case T_NUMBER:
        if (sch_has_bounds(node))
            return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s on a number "
                            "is not supported (on an integer it is)",
                            "minimum/maximum");
        return sch_dup(s, SCH_NUM);
    case T_BOOLEAN: return sch_dup(s, "(true|false)");
    case T_NULL: return sch_dup(s, "null");
    case T_ARRAY: return sch_array(s, node, depth);
    default: return sch_object(s, node, depth);
    }
}

static char *sch_value(sch_t *s, const cJSON *node, int depth)
{
    const cJSON *kw, *v;
    int types, used = 0;
    bt_buf_t b;

    if (depth > SCH_MAX_DEPTH)
        return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s",
                        "nested deeper than 32 levels");
    if (cJSON_IsTrue(node))
        return sch_dup(s, SCH_V1);
    if (!cJSON_IsObject(node))
        return sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s",
                        "a schema must be an object or true");
    types = sch_node_types(s, node);
    if (types < 0)
        return NULL;
    /* every keyword known, and meant for one of the node's types */
    cJSON_ArrayForEach(kw, node) {
        size_t k;
        for (k = 0; k < BT_ARRAY_SIZE(sch_keywords); k++)
            if (strcmp(kw->string, sch_keywords[k].name) == 0)
                break;
        if (k == BT_ARRAY_SIZE(sch_keywords))
            return sch_fail(s, BT_ERR_UNSUPPORTED,
                            "schema: keyword '%s' is not supported",
                            kw->string);
        if (sch_keywords[k].types != 0 && types != 0 &&
            !(sch_keywords[k].types & types))
            return sch_fail(s, BT_ERR_UNSUPPORTED,
                            "schema: keyword '%s' does not apply to the "
                            "node's type", kw->string);
        used |= sch_keywords[k].types;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "$ref")) != NULL) {
        if (!cJSON_IsString(v))
            return sch_fail(s, BT_ERR_INVALID_ARG, "schema: %s",
                            "$ref must be a string");
        if (used != 0 || cJSON_HasObjectItem(node, "type") ||
            cJSON_HasObjectItem(node, "enum") ||
            cJSON_HasObjectItem(node, "const") ||
            cJSON_HasObjectItem(node, "anyOf") ||
            cJSON_HasObjectItem(node, "oneOf") ||
            cJSON_HasObjectItem(node, "allOf"))
            return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: $ref '%s' with "
                            "other constraints beside it is not supported",
                            v->valuestring);
        return sch_ref(s, v->valuestring, depth);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "const")) != NULL)
        return sch_json_literal(s, v);
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "enum")) != NULL)
        return sch_alternation(s, v, true, depth, "enum");
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "anyOf")) != NULL ||
        (v = cJSON_GetObjectItemCaseSensitive(node, "oneOf")) != NULL) {
        if (types != 0 || used != 0)
            return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s with type "
                            "keywords beside it is not supported",
                            v->string);
        return sch_alternation(s, v, false, depth, v->string);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "allOf")) != NULL) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1 || types != 0 ||
            used != 0)
            return sch_fail(s, BT_ERR_UNSUPPORTED, "schema: %s is supported "
                            "only with one member and nothing beside it",
                            "allOf");
        return sch_value(s, cJSON_GetArrayItem(v, 0), depth + 1);
    }
    if (types == 0) {
        types = used; /* implied by its keywords */
        if (types == 0)
            return sch_dup(s, SCH_V1);
    }
    if ((types & (types - 1)) == 0)
        return sch_type(s, node, types, depth);
    /* several types: (a|b|...) */
    bt_buf_init(&b);
    for (size_t k = 0; k < BT_ARRAY_SIZE(sch_types); k++) {
        char *r;
        if (!(types & sch_types[k].bit))
            continue;
        r = sch_type(s, node, sch_types[k].bit, depth);
        if (r == NULL ||
            bt_buf_printf(&b, "%s%s", b.len == 0 ? "(" : "|", r) != BT_OK) {
            if (r != NULL)
                s->status = BT_ERR_NO_MEMORY;
            bt_free(r);
            bt_buf_cleanup(&b);
            return NULL;
        }
        bt_free(r);
    }
    if (bt_buf_append(&b, ")", 1) != BT_OK) {
        bt_buf_cleanup(&b);
        s->status = BT_ERR_NO_MEMORY;
        return NULL;
    }
    return b.data;
}

bt_status_t grammar_schema_to_regex(const char *schema, char **regex_p)
{
    sch_t s;
    cJSON *root;
    char *r;

    if (schema == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR", "no schema");
    root = cJSON_Parse(schema);
    if (root == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "schema is not valid JSON");
    memset(&s, 0, sizeof(s));
    s.root = root;
    r = sch_value(&s, root, 0);
    cJSON_Delete(root);
    if (r == NULL)
        return s.status != BT_OK ? s.status : BT_ERR_NO_MEMORY;
    *regex_p = r;
    return BT_OK;
}

bt_status_t grammar_choice_to_regex(const char *choices, char **regex_p)
{
    cJSON *root = cJSON_Parse(choices != NULL ? choices : "");
    const cJSON *it;
    bt_buf_t b;
    bt_status_t status = BT_OK;
    int idx = 0;

    if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0) {
        cJSON_Delete(root);
        return BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                        "choices must be a non-empty JSON array of strings");
    }
    bt_buf_init(&b);
    cJSON_ArrayForEach(it, root) {
        if (!cJSON_IsString(it)) {
            status = BT_ERROR(BT_ERR_INVALID_ARG, "GRAMMAR",
                              "choice %d is not a string", idx);
            break;
        }
        if ((idx++ > 0 && (status = bt_buf_append(&b, "|", 1)) != BT_OK) ||
            (status = sch_put_literal(&b, it->valuestring,
                                      strlen(it->valuestring))) != BT_OK)
            break;
    }
    cJSON_Delete(root);
    if (status != BT_OK) {
        bt_buf_cleanup(&b);
        return status;
    }
    if (b.data == NULL && bt_buf_append(&b, "", 0) != BT_OK)
        return BT_ERR_NO_MEMORY;
    *regex_p = b.data;
    return BT_OK;
}
