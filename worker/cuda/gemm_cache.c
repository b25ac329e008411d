/*
 * gemm_cache.c - parse and format the GEMM tuner's cache file (see
 * gemm_cache.h for the format).  Every field is checked; a file that is
 * not exactly what gemm_cache_format writes is rejected as a whole, so
 * a truncated or hand-edited file can only cost a re-tune.
 */
#include "gemm_cache.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

#define GC_MAX_FIELDS 16 /* 6 + 8 algo words, and room to see extras */
#define GC_FIELD_MAX GEMM_CACHE_KEY_MAX /* longest field kept (the key) */
#define GC_HEADER "baton-gemm-cache"
#define GC_MAX_DIM (1 << 24)
#define GC_MAX_BUCKET 65536

/* One line split at blanks: up to GC_MAX_FIELDS fields of at most
 * GC_FIELD_MAX - 1 bytes (longer: *too_long). */
typedef struct {
    char f[GC_MAX_FIELDS][GC_FIELD_MAX];
    int n;
    bool too_long;
} gc_fields_t;

static void gc_split(const char *s, size_t len, gc_fields_t *fl)
{
    size_t i = 0;

    fl->n = 0;
    fl->too_long = false;
    while (i < len) {
        size_t start, k;

        while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
            i++;
        if (i == len)
            break;
        start = i;
        while (i < len && s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            i++;
        if (fl->n == GC_MAX_FIELDS || i - start >= GC_FIELD_MAX) {
            fl->too_long = true;
            return;
        }
        k = i - start;
        memcpy(fl->f[fl->n], s + start, k);
        fl->f[fl->n][k] = '\0';
        fl->n++;
    }
}

/* A decimal integer in [lo, hi], nothing else in the field. */
static bool gc_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v;

    if (!isdigit((unsigned char)s[0]))
        return false;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool gc_hex64(const char *s, uint64_t *out)
{
    char *end;
    size_t n = strlen(s);

    if (n == 0 || n > 16)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]))
            return false;
    errno = 0;
    *out = (uint64_t)strtoull(s, &end, 16);
    return errno == 0 && *end == '\0';
}

/* A choice name: lower-case letters, digits and '_', a letter first. */
static bool gc_choice_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n >= GEMM_CACHE_CHOICE_MAX || !islower((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) &&
            s[i] != '_')
            return false;
    return true;
}

/* A choice with an algorithm: "lt" (cuBLASLt) or "pt" (cuBLASLt's plain
 * FP8 plan) followed by a candidate index. */
static bool gc_choice_is_lt(const char *s)
{
    int idx;

    return (s[0] == 'l' || s[0] == 'p') && s[1] == 't' &&
           gc_int(s + 2, 0, 999, &idx);
}

/* A key: printable ASCII without blanks, 1 .. GEMM_CACHE_KEY_MAX - 1. */
static bool gc_key_ok(const char *s, size_t n)
{
    if (n == 0 || n >= GEMM_CACHE_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return false;
    return true;
}

/* The OUT field's spellings (gemm_cache.h), indexed by kind, accumulate
 * (FP8_VEC only) and out_f32. */
static const char *const gc_outs[2][2][2] = {
    { { "bf16", "f32" }, { NULL, NULL } },
    { { "fp8v-bf16", "fp8v-f32" }, { "fp8v-bf16+", "fp8v-f32+" } },
};

static const char *gc_out_name(const gemm_cache_entry_t *e)
{
    if (e->kind < 0 || e->kind > 1 || e->accumulate < 0 ||
        e->accumulate > 1 || e->out_f32 < 0 || e->out_f32 > 1)
        return NULL;
    return gc_outs[e->kind][e->accumulate][e->out_f32];
}

static bool gc_out_parse(const char *s, gemm_cache_entry_t *e)
{
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 2; a++)
            for (int f = 0; f < 2; f++)
                if (gc_outs[k][a][f] != NULL &&
                    strcmp(s, gc_outs[k][a][f]) == 0) {
                    e->kind = k;
                    e->accumulate = a;
                    e->out_f32 = f;
                    return true;
                }
    return false;
}

static bool gc_entry(const gc_fields_t *fl, gemm_cache_entry_t *e)
{
    char *end;
    double us;

    memset(e, 0, sizeof(*e));
    if (fl->n != 6 && fl->n != 6 + GEMM_CACHE_ALGO_WORDS)
        return false;
    if (!gc_int(fl->f[0], 1, GC_MAX_BUCKET, &e->bucket) ||
        !gc_int(fl->f[1], 1, GC_MAX_DIM, &e->n_out) ||
        !gc_int(fl->f[2], 1, GC_MAX_DIM, &e->n_in))
        return false;
    if (!gc_out_parse(fl->f[3], e))
        return false;
    if (!gc_choice_ok(fl->f[4]))
        return false;
    memcpy(e->choice, fl->f[4], strlen(fl->f[4]) + 1);
    e->lt = gc_choice_is_lt(e->choice);
    if (fl->n != (e->lt ? 6 + GEMM_CACHE_ALGO_WORDS : 6))
        return false;
    errno = 0;
    us = strtod(fl->f[5], &end);
    if (errno != 0 || end == fl->f[5] || *end != '\0' || !isfinite(us) ||
        us < -1.0 || us > 1e9)
        return false;
    e->us = (float)us;
    for (int w = 0; e->lt && w < GEMM_CACHE_ALGO_WORDS; w++)
        if (!gc_hex64(fl->f[6 + w], &e->algo[w]))
            return false;
    return true;
}

static bool gc_same_shape(const gemm_cache_entry_t *a,
                          const gemm_cache_entry_t *b)
{
    return a->bucket == b->bucket && a->n_out == b->n_out &&
           a->n_in == b->n_in && a->out_f32 == b->out_f32 &&
           a->kind == b->kind && a->accumulate == b->accumulate;
}

bt_status_t gemm_cache_parse(const char *text, size_t len, const char *key,
                             gemm_cache_entry_t *out, int max, int *n_p)
{
    gc_fields_t fl;
    size_t pos = 0;
    bool header = false, key_match = false;
    int n = 0, line_no = 0;

    *n_p = 0;
    if (text == NULL && len > 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA", "gemm cache: no text");
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        const char *line = text + pos;
        size_t line_len = end - pos;

        pos = end + 1;
        line_no++;
        if (memchr(line, '\0', line_len) != NULL)
            return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                            "gemm cache line %d: NUL byte", line_no);
        gc_split(line, line_len, &fl);
        if (fl.too_long)
            return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                            "gemm cache line %d: field too long", line_no);
        if (fl.n == 0 || fl.f[0][0] == '#')
            continue;
        if (!header) {
            int ver;
            if (fl.n != 3 || strcmp(fl.f[0], GC_HEADER) != 0 ||
                !gc_int(fl.f[1], 0, 1000000, &ver))
                return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                                "gemm cache line %d: not a header", line_no);
            if (ver != GEMM_CACHE_VERSION)
                return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                                "gemm cache: unknown version %d", ver);
            if (!gc_key_ok(fl.f[2], strlen(fl.f[2])))
                return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                                "gemm cache line %d: bad key", line_no);
            header = true;
            key_match = strcmp(key, fl.f[2]) == 0;
            continue;
        }
        {
            gemm_cache_entry_t e;

            if (!gc_entry(&fl, &e))
                return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                                "gemm cache line %d: bad entry", line_no);
            for (int i = 0; key_match && i < n; i++)
                if (gc_same_shape(&out[i], &e))
                    return BT_ERROR(BT_ERR_FORMAT, "CUDA",
                                    "gemm cache line %d: duplicate entry",
                                    line_no);
            if (key_match && n < max)
                out[n++] = e;
        }
    }
    if (!header)
        return BT_ERROR(BT_ERR_FORMAT, "CUDA", "gemm cache: no header");
    *n_p = n;
    return BT_OK;
}

bt_status_t gemm_cache_format(const char *key, const gemm_cache_entry_t *e,
                              int n, char **text_p, size_t *len_p)
{
    /* per line: 3 ints, out (<= 10), choice, us, 8 x 16 hex + blanks
     * < 256 */
    const size_t cap = 512 + GEMM_CACHE_KEY_MAX + (size_t)(n > 0 ? n : 0) * 256;
    char *buf;
    size_t len = 0;

    *text_p = NULL;
    *len_p = 0;
    if (key == NULL || !gc_key_ok(key, strlen(key)) || n < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA", "gemm cache: bad key");
    buf = bt_malloc(cap, "gemm_cache_text");
    if (buf == NULL)
        return BT_ERR_NO_MEMORY;
    len += (size_t)snprintf(buf + len, cap - len,
                            "# baton GEMM tuner picks (worker/cuda/"
                            "gemm_cache.h); delete to re-tune\n"
                            "%s %d %s\n", GC_HEADER, GEMM_CACHE_VERSION, key);
    for (int i = 0; i < n; i++) {
        const gemm_cache_entry_t *x = &e[i];

        if (x->bucket < 1 || x->bucket > GC_MAX_BUCKET || x->n_out < 1 ||
            x->n_out > GC_MAX_DIM || x->n_in < 1 || x->n_in > GC_MAX_DIM ||
            !gc_choice_ok(x->choice) || x->lt != gc_choice_is_lt(x->choice) ||
            gc_out_name(x) == NULL ||
            !isfinite(x->us) || x->us < -1.0f || x->us > 1e9f) {
            bt_free(buf);
            return BT_ERROR(BT_ERR_INVALID_ARG, "CUDA",
                            "gemm cache: entry %d not representable", i);
        }
        len += (size_t)snprintf(buf + len, cap - len, "%d %d %d %s %s %.3f",
                                x->bucket, x->n_out, x->n_in,
                                gc_out_name(x), x->choice,
                                (double)x->us);
        for (int w = 0; x->lt && w < GEMM_CACHE_ALGO_WORDS; w++)
            len += (size_t)snprintf(buf + len, cap - len, " %" PRIx64,
                                    x->algo[w]);
        len += (size_t)snprintf(buf + len, cap - len, "\n");
    }
    *text_p = buf;
    *len_p = len;
    return BT_OK;
}
