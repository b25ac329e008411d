/*
 * tokenizer_json.c - Hugging Face tokenizer.json tokenizers: the BPE
 * model in its two common dresses, byte-level (GPT-2, Llama 3, Qwen) and
 * sentencepiece-style (Llama 2, Mistral, TinyLlama), plus the
 * tokenizer_config.json / generation_config.json facts a server needs
 * (BOS, EOS set, chat template).
 *
 * Encoding follows the `tokenizers` library step by step:
 *  1. added tokens with `normalized: false` are cut out of the raw text
 *     first (leftmost, longest match, honouring lstrip/rstrip) and become
 *     their ids unsplit;
 *  2. each remaining segment goes through the normalizer (NFC, NFD, NFKC,
 *     NFKD, Prepend, Replace, in Sequence order); then added tokens with
 *     `normalized: true` are cut out of the normalized segment, matched by
 *     their content put through the same normalizer (as the library's
 *     AddedVocabulary does: so with a Prepend normalizer such a token's
 *     pattern starts with the prepended text).  A missing `normalized`
 *     field means !special, as in the library's AddedToken::from;
 *  3. then the pre-tokenizer (Split with a PCRE2 regex or a string and any
 *     split behaviour, ByteLevel with its prefix space and GPT-2 regex,
 *     Metaspace with its prepend scheme and split, Sequence) cuts it into
 *     pre-tokens;
 *  4. each pre-token is BPE-merged: its initial symbols are its bytes
 *     (byte-level: the vocabulary keys are mapped back through GPT-2's
 *     bytes_to_unicode at load time, so encoding never builds mapped
 *     strings) or its characters (with byte fallback to <0xXX> pieces, or
 *     unk), then the adjacent pair of lowest merge rank merges, leftmost on
 *     ties, until none does.  Candidate pairs sit in a binary heap over a
 *     linked list of symbols (stale entries are skipped), so a long word is
 *     O(n log n), not quadratic.  Results for short pre-tokens are kept in
 *     a direct-mapped cache (a newer entry replaces an older one in its
 *     slot), guarded by a mutex so one tokenizer can serve many threads.
 *
 * Decoding: every id has its decoded bytes computed at load time (the
 * decoder chain ByteLevel, or Replace/ByteFallback/Fuse, or Metaspace);
 * Strip/Metaspace's leading-space removal is applied at the start of a
 * sequence.  tokenizer.c's UTF-8-safe decode and stream code uses these
 * bytes through tokjson_id_bytes().
 *
 * Not supported (refused with BT_ERR_UNSUPPORTED naming the block): other
 * models (WordPiece, Unigram), continuing_subword_prefix/end_of_word_suffix,
 * Regex normalizer patterns, other normalizers (Lowercase, Strip, BERT's:
 * none of the Llama/Qwen/Mistral families uses them), added tokens'
 * single_word.
 *
 * Unicode normalization uses utf8proc (Debian's libutf8proc, 2.8.0 =
 * Unicode 15.0 on Debian 12) with UTF8PROC_STABLE; the library uses the
 * unicode-normalization-alignments crate, whose tables are older, so a
 * character assigned after them could differ.  Only the regions around
 * characters that a form might change go through utf8proc: text is cut
 * before "inert" characters (ASCII, CJK ideographs, Hangul syllables for
 * NFC/NFKC), which no form changes or composes with what precedes them,
 * so mostly-ASCII text costs a scan.
 * Invalid UTF-8 (which the library can never receive: Rust strings are
 * valid UTF-8) cannot be normalized: utf8proc rejects it, and the segment
 * then keeps its raw bytes for that step, deterministically, and goes on
 * to the later steps and the pre-tokenizer as before.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer_int.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

#define TJ_MAX_FILE_BYTES (512u << 20) /* tokenizer.json size limit */
#define TJ_MAX_CONFIG_BYTES (16u << 20) /* tokenizer_config.json etc. */
#define TJ_MAX_ID (1 << 24)            /* ids must be below this */
#define TJ_MAX_MERGES (1 << 24)
#define TJ_MAX_ADDED 65536
#define TJ_MAX_EOS 16
#define TJ_CACHE_SLOTS 16384     /* pre-token cache slots (power of two) */
#define TJ_CACHE_MAX_KEY 128     /* longest pre-token cached, bytes */
#define TJ_ARENA_BLOCK (1u << 20)

/* The "▁" (U+2581) of sentencepiece vocabularies. */
#define TJ_SPIECE "\xe2\x96\x81"

/* GPT-2's ByteLevel regex (use_regex: true). */
static const char tj_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

// ----------------------------------------------------------------------------
// types

typedef enum {
    TJ_NORM_PREPEND, /* prepend str when the text is not empty */
    TJ_NORM_REPLACE, /* replace every str with to */
    TJ_NORM_UNICODE  /* NFC/NFD/NFKC/NFKD through utf8proc */
} tj_norm_type_t;

typedef struct {
    tj_norm_type_t type; /* what it does */
    int uopts;           /* Unicode form: utf8proc_option_t flags */
    char *str;           /* Prepend text / Replace pattern */
    size_t str_len;
    char *to;            /* Replace content */
    size_t to_len;
} tj_norm_t;

typedef enum {
    TJ_PRE_SPLIT,     /* Split: regex or string pattern, behaviour */
    TJ_PRE_BYTELEVEL, /* ByteLevel: prefix space, optional GPT-2 regex */
    TJ_PRE_METASPACE  /* Metaspace: ' ' -> replacement, prepend, split */
} tj_pre_type_t;

typedef enum {
    TJ_SPLIT_REMOVED,
    TJ_SPLIT_ISOLATED,
    TJ_SPLIT_MERGED_PREV,
    TJ_SPLIT_MERGED_NEXT,
    TJ_SPLIT_CONTIGUOUS
} tj_behavior_t;

typedef enum {
    TJ_PREPEND_NEVER,
    TJ_PREPEND_FIRST,
    TJ_PREPEND_ALWAYS
} tj_prepend_t;

typedef struct {
    tj_pre_type_t type;     /* what it does */
    tj_behavior_t behavior; /* Split behaviour (Metaspace: merged next) */
    bool invert;            /* Split: the pieces between matches split */
    pcre2_code *re;         /* Split regex / ByteLevel GPT-2 regex or NULL */
    char *str;              /* Split string pattern / Metaspace replacement */
    size_t str_len;
    bool add_prefix_space;  /* ByteLevel */
    tj_prepend_t prepend;   /* Metaspace */
    bool split;             /* Metaspace: split on the replacement */
} tj_pre_t;

/* An added token: matched in the raw text before anything else, or, when
 * normalized, in each normalized segment. */
typedef struct {
    int id;           /* its id */
    const char *text; /* content (arena) */
    int len;          /* content bytes */
    const char *pat;  /* what is matched: text, or text normalized */
    int pat_len;      /* pattern bytes (0: never matched) */
    bool normalized;  /* matched in normalized text */
    bool special;     /* skipped on decode when skip_special */
    bool lstrip;      /* swallows whitespace on its left */
    bool rstrip;      /* swallows whitespace on its right */
} tj_added_t;

/* A merge: the pair (a, b) at rank becomes new_id. */
typedef struct {
    uint64_t key; /* (a << 32) | b, UINT64_MAX empty */
    int rank;     /* position in the merges list */
    int new_id;   /* id of a + b */
} tj_merge_t;

typedef struct tj_arena_block_s {
    struct tj_arena_block_s *next; /* older block */
    size_t used;                   /* bytes handed out */
    size_t cap;                    /* bytes in data[] */
    char data[];
} tj_arena_block_t;

/* A cached pre-token: header, then n_ids ints, then len key bytes. */
typedef struct {
    uint32_t hash; /* of the key */
    uint32_t len;  /* key bytes */
    int n_ids;     /* ids that follow */
} tj_cache_ent_t;

struct tokjson_s {
    int vocab_size;         /* max id + 1 */
    int max_piece_len;      /* longest decoded piece, bytes */
    bool byte_level;        /* keys are GPT-2 byte-mapped */
    bool byte_fallback;     /* unknown chars -> <0xXX> pieces */
    bool fuse_unk;          /* consecutive unks become one */
    bool ignore_merges;     /* a pre-token in the vocab is taken whole */
    int unk_id;             /* -1 none */
    int bos_id;             /* -1 none */
    int eos_id;             /* -1 none */
    bool add_bos;           /* tokenizer adds BOS by default */
    bool add_eos;           /* tokenizer adds EOS by default */
    bool skip_special;      /* decode prints nothing for special tokens */
    int strip_start;        /* leading spaces the decoder strips (0/1) */
    int eos_ids[TJ_MAX_EOS];/* EOS set for stopping */
    int n_eos;

    const char **pieces;    /* (vocab_size) token strings as in the file */
    const char **keys;      /* (vocab_size) merge-domain bytes or NULL */
    int *key_lens;          /* (vocab_size) */
    const char **bytes;     /* (vocab_size) decoded bytes */
    int *bytes_lens;        /* (vocab_size) */
    uint8_t *flags;         /* (vocab_size) TJ_F_* */
    int *hash_ids;          /* (hash_mask + 1) key -> id, -1 empty */
    uint32_t hash_mask;
    int byte_ids[256];      /* initial symbol of each byte, -1 none */

    tj_merge_t *merges;     /* (merge_mask + 1) open addressing */
    uint32_t merge_mask;
    int n_merges;

    tj_added_t *added;      /* (n_added) sorted by pattern length desc */
    int n_added;
    int n_raw_added;        /* of them matched in raw text */
    int n_norm_added;       /* of them matched in normalized text */
    int *added_first[256];  /* raw set: per first byte, indices into added,
                               -1 ends */
    int *nadded_first[256]; /* normalized set, the same way */

    tj_norm_t *norms;       /* (n_norms) normalizer steps in order */
    int n_norms;
    tj_pre_t *pres;         /* (n_pres) pre-tokenizer steps in order */
    int n_pres;

    char *chat_template;    /* tokenizer_config chat_template or NULL */
    tj_arena_block_t *arena;/* all strings above */

    pthread_mutex_t cache_lock;     /* guards cache */
    tj_cache_ent_t **cache;         /* (TJ_CACHE_SLOTS) or NULL entries */
};

#define TJ_F_SPECIAL 1u /* special added token */
#define TJ_F_ADDED 2u   /* added token (matched before pre-tokenizing) */
#define TJ_F_PRESENT 4u /* the id exists (vocab or added) */

// ----------------------------------------------------------------------------
// small helpers

static void *tj_arena_alloc(tokjson_t *tj, size_t n)
{
    tj_arena_block_t *b = tj->arena;

    n = (n + 7) & ~(size_t)7;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = BT_MAX(n, (size_t)TJ_ARENA_BLOCK);
        b = bt_malloc(sizeof(*b) + cap, "tok_json");
        if (b == NULL)
            return NULL;
        b->next = tj->arena;
        b->used = 0;
        b->cap = cap;
        tj->arena = b;
    }
    b->used += n;
    return b->data + b->used - n;
}

static char *tj_arena_str(tokjson_t *tj, const char *s, size_t n)
{
    char *p = tj_arena_alloc(tj, n + 1);

    if (p == NULL)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static uint32_t tj_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

/* Length of the valid UTF-8 character at s (n > 0 bytes left), or 0 when
 * the bytes there are not one (the caller takes one byte). */
static int tj_utf8_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < (size_t)need + 1)
        return 0;
    for (int i = 1; i <= need; i++) {
        if (s[i] < lo || s[i] > hi)
            return 0;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves,
 * the other 68 bytes to U+0100.. in byte order.  unicode_to_byte is the
 * inverse over code points below 0x144 (-1: not a mapped character). */
static void tj_byte_map(uint16_t byte_to_cp[256], int16_t cp_to_byte[0x144])
{
    int n = 0;

    for (int i = 0; i < 0x144; i++)
        cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                         (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = (uint16_t)(printable ? b : 256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* Unmaps a byte-level token string into out (at most n bytes).  Returns
 * the byte count, or -1 when some character is not a mapped byte. */
static int tj_unmap(const int16_t cp_to_byte[0x144], const char *s, size_t n,
                    char *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    int w = 0;

    while (i < n) {
        int l = tj_utf8_len(u + i, n - i);
        uint32_t cp;
        if (l == 1) {
            cp = u[i];
        } else if (l == 2) {
            cp = (uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F);
        } else {
            return -1; /* mapped characters are all below U+0800 */
        }
        if (cp >= 0x144 || cp_to_byte[cp] < 0)
            return -1;
        out[w++] = (char)cp_to_byte[cp];
        i += (size_t)l;
    }
    return w;
}

/* Grows *p (elements of size elem, capacity *cap) to hold need. */
static bool tj_grow(void **p, size_t *cap, size_t need, size_t elem,
                    const char *name)
{
    size_t new_cap;
    void *q;

    if (need <= *cap)
        return true;
    new_cap = BT_MAX(need, 2 * *cap);
    new_cap = BT_MAX(new_cap, (size_t)64);
    q = bt_realloc(*p, new_cap * elem, name);
    if (q == NULL)
        return false;
    *p = q;
    *cap = new_cap;
    return true;
}

// ----------------------------------------------------------------------------
// vocabulary and merge tables

static int tj_lookup(const tokjson_t *tj, const char *s, size_t n)
{
    uint32_t slot = tj_hash(s, n) & tj->hash_mask;
    int id;

    while ((id = tj->hash_ids[slot]) >= 0) {
        if ((size_t)tj->key_lens[id] == n && memcmp(tj->keys[id], s, n) == 0)
            return id;
        slot = (slot + 1) & tj->hash_mask;
    }
    return -1;
}

static void tj_hash_insert(tokjson_t *tj, int id)
{
    uint32_t slot = tj_hash(tj->keys[id], (size_t)tj->key_lens[id]) &
                    tj->hash_mask;
    int other;

    while ((other = tj->hash_ids[slot]) >= 0) {
        if (tj->key_lens[other] == tj->key_lens[id] &&
            memcmp(tj->keys[other], tj->keys[id],
                   (size_t)tj->key_lens[id]) == 0)
            return; /* first one wins */
        slot = (slot + 1) & tj->hash_mask;
    }
    tj->hash_ids[slot] = id;
}

static uint32_t tj_mix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static const tj_merge_t *tj_merge_find(const tokjson_t *tj, int a, int b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t slot = tj_mix64(key) & tj->merge_mask;

    while (tj->merges[slot].key != UINT64_MAX) {
        if (tj->merges[slot].key == key)
            return &tj->merges[slot];
        slot = (slot + 1) & tj->merge_mask;
    }
    return NULL;
}

/* Inserts a merge; a repeated pair keeps its first (lowest) rank, as in
 * the `tokenizers` library. */
static void tj_merge_insert(tokjson_t *tj, int a, int b, int rank, int new_id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t slot = tj_mix64(key) & tj->merge_mask;

    while (tj->merges[slot].key != UINT64_MAX) {
        if (tj->merges[slot].key == key)
            return;
        slot = (slot + 1) & tj->merge_mask;
    }
    tj->merges[slot].key = key;
    tj->merges[slot].rank = rank;
    tj->merges[slot].new_id = new_id;
}

// ----------------------------------------------------------------------------
// loading: JSON helpers

static const char *tj_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static bool tj_get_bool(const cJSON *obj, const char *name, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    return dflt;
}

static const char *tj_get_str(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* An integral JSON number in [0, TJ_MAX_ID), else -1. */
static int tj_id_value(const cJSON *v)
{
    double d;

    if (!cJSON_IsNumber(v))
        return -1;
    d = v->valuedouble;
    if (!(d >= 0 && d < TJ_MAX_ID) || d != floor(d))
        return -1;
    return (int)d;
}

static bt_status_t tj_compile_regex(const char *pattern, pcre2_code **re_p)
{
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code *re;

    re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                       &err_off, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: regex /%s/ does not compile at "
                        "offset %zu: %s", pattern, (size_t)err_off,
                        (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* interpreter if not */
    *re_p = re;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// loading: normalizer, pre-tokenizer, decoder, post-processor

static bt_status_t tj_add_norm(tokjson_t *tj, const cJSON *n, int depth)
{
    const char *type = tj_type(n);
    tj_norm_t *norm;

    if (n == NULL || cJSON_IsNull(n))
        return BT_OK;
    if (type == NULL || depth > 8)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: normalizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        const cJSON *it;
        if (!cJSON_IsArray(list))
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: normalizer Sequence without a "
                            "normalizers array");
        cJSON_ArrayForEach(it, list) {
            bt_status_t status = tj_add_norm(tj, it, depth + 1);
            if (status != BT_OK)
                return status;
        }
        return BT_OK;
    }
    if (tj->n_norms >= 32)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: more than 32 normalizers");
    norm = &tj->norms[tj->n_norms];
    memset(norm, 0, sizeof(*norm));
    if (strcmp(type, "Prepend") == 0) {
        const char *s = tj_get_str(n, "prepend");
        if (s == NULL)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: Prepend normalizer without a "
                            "prepend string");
        norm->type = TJ_NORM_PREPEND;
        norm->str_len = strlen(s);
        norm->str = tj_arena_str(tj, s, norm->str_len);
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = tj_get_str(pat, "String");
        const char *to = tj_get_str(n, "content");
        if (from == NULL || to == NULL || from[0] == '\0')
            return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                            "tokenizer.json: Replace normalizer needs a "
                            "non-empty String pattern and a content string "
                            "(Regex patterns are not supported)");
        norm->type = TJ_NORM_REPLACE;
        norm->str_len = strlen(from);
        norm->str = tj_arena_str(tj, from, norm->str_len);
        norm->to_len = strlen(to);
        norm->to = tj_arena_str(tj, to, norm->to_len);
    } else if (strcmp(type, "NFC") == 0 || strcmp(type, "NFKC") == 0 ||
               strcmp(type, "NFD") == 0 || strcmp(type, "NFKD") == 0) {
        norm->type = TJ_NORM_UNICODE;
        norm->uopts = UTF8PROC_STABLE |
                      (type[2] == 'C' || type[3] == 'C' ? UTF8PROC_COMPOSE
                                                        : UTF8PROC_DECOMPOSE) |
                      (type[2] == 'K' ? UTF8PROC_COMPAT : 0);
    } else {
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: normalizer type '%s' is not "
                        "supported", type);
    }
    if ((norm->type == TJ_NORM_PREPEND && norm->str == NULL) ||
        (norm->type == TJ_NORM_REPLACE && (norm->str == NULL ||
                                           norm->to == NULL)))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer strings");
    tj->n_norms++;
    return BT_OK;
}

static bt_status_t tj_parse_behavior(const char *s, tj_behavior_t *b_p)
{
    static const struct {
        const char *name;
        tj_behavior_t b;
    } names[] = {
        {"Removed", TJ_SPLIT_REMOVED},
        {"Isolated", TJ_SPLIT_ISOLATED},
        {"MergedWithPrevious", TJ_SPLIT_MERGED_PREV},
        {"MergedWithNext", TJ_SPLIT_MERGED_NEXT},
        {"Contiguous", TJ_SPLIT_CONTIGUOUS},
    };

    for (size_t i = 0; s != NULL && i < sizeof(names) / sizeof(names[0]);
         i++) {
        if (strcmp(s, names[i].name) == 0) {
            *b_p = names[i].b;
            return BT_OK;
        }
    }
    return BT_ERROR(BT_ERR_FORMAT, "TOK",
                    "tokenizer.json: Split behavior '%s' unknown",
                    s != NULL ? s : "(missing)");
}

/* Metaspace's prepend_scheme, or the older add_prefix_space flag. */
static tj_prepend_t tj_parse_prepend(const cJSON *n)
{
    const char *scheme = tj_get_str(n, "prepend_scheme");

    if (scheme != NULL) {
        if (strcmp(scheme, "never") == 0)
            return TJ_PREPEND_NEVER;
        if (strcmp(scheme, "first") == 0)
            return TJ_PREPEND_FIRST;
        return TJ_PREPEND_ALWAYS;
    }
    return tj_get_bool(n, "add_prefix_space", true) ? TJ_PREPEND_ALWAYS
                                                    : TJ_PREPEND_NEVER;
}

static bt_status_t tj_add_pre(tokjson_t *tj, const cJSON *n, int depth)
{
    const char *type = tj_type(n);
    bt_status_t status = BT_OK;
    tj_pre_t *pre;

    if (n == NULL || cJSON_IsNull(n))
        return BT_OK;
    if (type == NULL || depth > 8)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: pre_tokenizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list =
            cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        const cJSON *it;
        if (!cJSON_IsArray(list))
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: pre_tokenizer Sequence without "
                            "a pretokenizers array");
        cJSON_ArrayForEach(it, list) {
            status = tj_add_pre(tj, it, depth + 1);
            if (status != BT_OK)
                return status;
        }
        return BT_OK;
    }
    if (tj->n_pres >= 16)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: more than 16 pre-tokenizers");
    pre = &tj->pres[tj->n_pres];
    memset(pre, 0, sizeof(*pre));
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *regex = tj_get_str(pat, "Regex");
        const char *str = tj_get_str(pat, "String");
        pre->type = TJ_PRE_SPLIT;
        pre->invert = tj_get_bool(n, "invert", false);
        status = tj_parse_behavior(tj_get_str(n, "behavior"),
                                   &pre->behavior);
        if (status != BT_OK)
            return status;
        if (regex != NULL) {
            status = tj_compile_regex(regex, &pre->re);
        } else if (str != NULL && str[0] != '\0') {
            pre->str_len = strlen(str);
            pre->str = tj_arena_str(tj, str, pre->str_len);
            if (pre->str == NULL)
                status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "split pattern");
        } else {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "tokenizer.json: Split pre_tokenizer needs a "
                              "Regex or a non-empty String pattern");
        }
    } else if (strcmp(type, "ByteLevel") == 0) {
        pre->type = TJ_PRE_BYTELEVEL;
        pre->behavior = TJ_SPLIT_ISOLATED;
        pre->add_prefix_space = tj_get_bool(n, "add_prefix_space", true);
        tj->byte_level = true;
        if (tj_get_bool(n, "use_regex", true))
            status = tj_compile_regex(tj_gpt2_regex, &pre->re);
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *repl = tj_get_str(n, "replacement");
        pre->type = TJ_PRE_METASPACE;
        pre->behavior = TJ_SPLIT_MERGED_NEXT;
        pre->prepend = tj_parse_prepend(n);
        pre->split = tj_get_bool(n, "split", true);
        if (repl == NULL || repl[0] == '\0')
            repl = TJ_SPIECE;
        pre->str_len = strlen(repl);
        pre->str = tj_arena_str(tj, repl, pre->str_len);
        if (pre->str == NULL)
            status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "metaspace");
    } else {
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: pre_tokenizer type '%s' is not "
                        "supported", type);
    }
    if (status == BT_OK)
        tj->n_pres++;
    else if (pre->re != NULL)
        pcre2_code_free(pre->re);
    return status;
}

/* Decoder facts gathered from the chain. */
typedef struct {
    bool byte_level;     /* ByteLevel: keys map back to bytes */
    bool byte_fallback;  /* ByteFallback: <0xXX> -> the byte */
    const char *from[8]; /* Replace patterns, in order */
    const char *to[8];
    int n_repl;
    int strip_start;     /* spaces stripped at the start */
} tj_dec_t;

static bt_status_t tj_parse_decoder(const cJSON *n, tj_dec_t *dec, int depth)
{
    const char *type = tj_type(n);

    if (n == NULL || cJSON_IsNull(n))
        return BT_OK;
    if (type == NULL || depth > 8)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: decoder without a type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "decoders");
        const cJSON *it;
        if (!cJSON_IsArray(list))
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: decoder Sequence without a "
                            "decoders array");
        cJSON_ArrayForEach(it, list) {
            bt_status_t status = tj_parse_decoder(it, dec, depth + 1);
            if (status != BT_OK)
                return status;
        }
    } else if (strcmp(type, "ByteLevel") == 0) {
        dec->byte_level = true;
    } else if (strcmp(type, "ByteFallback") == 0) {
        dec->byte_fallback = true;
    } else if (strcmp(type, "Fuse") == 0) {
        /* joining the pieces is what decoding does anyway */
    } else if (strcmp(type, "Replace") == 0 || strcmp(type, "Metaspace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from, *to;
        if (strcmp(type, "Replace") == 0) {
            from = tj_get_str(pat, "String");
            to = tj_get_str(n, "content");
        } else {
            from = tj_get_str(n, "replacement");
            to = " ";
            if (tj_parse_prepend(n) != TJ_PREPEND_NEVER)
                dec->strip_start = 1;
        }
        if (from == NULL || to == NULL || from[0] == '\0' || dec->n_repl >= 8)
            return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                            "tokenizer.json: decoder %s needs a non-empty "
                            "String pattern (at most 8 replacements)", type);
        dec->from[dec->n_repl] = from;
        dec->to[dec->n_repl++] = to;
    } else if (strcmp(type, "Strip") == 0) {
        const char *content = tj_get_str(n, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(n, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(n, "stop");
        if (content == NULL || strcmp(content, " ") != 0 ||
            !cJSON_IsNumber(start) || start->valuedouble < 0 ||
            start->valuedouble > 1 ||
            (cJSON_IsNumber(stop) && stop->valuedouble != 0))
            return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                            "tokenizer.json: only Strip(' ', start 0-1, stop "
                            "0) decoders are supported");
        dec->strip_start = (int)start->valuedouble;
    } else {
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: decoder type '%s' is not supported",
                        type);
    }
    return BT_OK;
}

/* The id a special-token name stands for: an added token, else a vocab
 * token string.  -1 when none. */
static int tj_name_id(const tokjson_t *tj, const char *name)
{
    for (int i = 0; i < tj->n_added; i++)
        if (strcmp(tj->added[i].text, name) == 0)
            return tj->added[i].id;
    for (int id = 0; id < tj->vocab_size; id++)
        if (tj->pieces[id] != NULL && strcmp(tj->pieces[id], name) == 0)
            return id;
    return -1;
}

/* TemplateProcessing's "single" template: a special token before $A means
 * BOS is added, after it EOS. */
static void tj_parse_post(tokjson_t *tj, const cJSON *n, int depth)
{
    const char *type = tj_type(n);
    const cJSON *single, *specials, *it;
    bool seen_seq = false;

    if (type == NULL || depth > 8)
        return;
    if (strcmp(type, "Sequence") == 0) {
        cJSON_ArrayForEach(it,
                           cJSON_GetObjectItemCaseSensitive(n, "processors"))
            tj_parse_post(tj, it, depth + 1);
        return;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return;
    single = cJSON_GetObjectItemCaseSensitive(n, "single");
    specials = cJSON_GetObjectItemCaseSensitive(n, "special_tokens");
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const char *name;
        const cJSON *ids;
        int id;
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence") != NULL) {
            seen_seq = true;
            continue;
        }
        name = tj_get_str(sp, "id");
        if (name == NULL)
            continue;
        ids = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(specials, name), "ids");
        id = cJSON_IsArray(ids) ? tj_id_value(cJSON_GetArrayItem(ids, 0))
                                : tj_name_id(tj, name);
        if (id < 0 || id >= tj->vocab_size)
            continue;
        if (!seen_seq) {
            tj->add_bos = true;
            tj->bos_id = id;
        } else {
            tj->add_eos = true;
            if (tj->eos_id < 0)
                tj->eos_id = id;
        }
    }
}

// ----------------------------------------------------------------------------
// loading: model

static bt_status_t tj_fill_vocab(tokjson_t *tj, const cJSON *vocab,
                                 const int16_t cp_to_byte[0x144])
{
    const cJSON *it;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    bt_status_t status = BT_OK;

    cJSON_ArrayForEach(it, vocab) {
        const char *s = it->string;
        size_t n = strlen(s);
        int id = tj_id_value(it);
        int kl;

        if (tj->flags[id] & TJ_F_PRESENT) {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "tokenizer.json: vocab id %d is given to both "
                              "'%s' and '%s'", id, tj->pieces[id], s);
            break;
        }
        tj->flags[id] |= TJ_F_PRESENT;
        tj->pieces[id] = tj_arena_str(tj, s, n);
        if (tj->pieces[id] == NULL)
            goto err_no_memory;
        if (!tj->byte_level) {
            tj->keys[id] = tj->pieces[id];
            tj->key_lens[id] = (int)n;
            continue;
        }
        if (!tj_grow((void **)&tmp, &tmp_cap, n + 1, 1, "tok_json_load"))
            goto err_no_memory;
        kl = tj_unmap(cp_to_byte, s, n, tmp);
        if (kl < 0) { /* not a byte-mapped string: keep it as it is */
            tj->keys[id] = tj->pieces[id];
            tj->key_lens[id] = (int)n;
            continue;
        }
        tj->keys[id] = tj_arena_str(tj, tmp, (size_t)kl);
        tj->key_lens[id] = kl;
        if (tj->keys[id] == NULL)
            goto err_no_memory;
    }
    bt_free(tmp);
    return status;

err_no_memory:
    bt_free(tmp);
    return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "vocabulary strings");
}

/* One merge entry in either form: "a b" or ["a", "b"].  Writes the two
 * token strings to a_p/b_p (into scratch when split). */
static bool tj_merge_parts(const cJSON *m, char **scratch, size_t *cap,
                           const char **a_p, const char **b_p)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        size_t n = strlen(s);
        if (sp == NULL || sp == s || sp[1] == '\0' || strchr(sp + 1, ' '))
            return false;
        if (!tj_grow((void **)scratch, cap, n + 1, 1, "tok_json_load"))
            return false;
        memcpy(*scratch, s, n + 1);
        (*scratch)[sp - s] = '\0';
        *a_p = *scratch;
        *b_p = *scratch + (sp - s) + 1;
        return true;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
        cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
        cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        *a_p = cJSON_GetArrayItem(m, 0)->valuestring;
        *b_p = cJSON_GetArrayItem(m, 1)->valuestring;
        return true;
    }
    return false;
}

/* The id of a token string as written in the file. */
static int tj_piece_id(const tokjson_t *tj, const int16_t cp_to_byte[0x144],
                       const char *s, char *buf)
{
    size_t n = strlen(s);
    int kl;

    if (!tj->byte_level)
        return tj_lookup(tj, s, n);
    kl = tj_unmap(cp_to_byte, s, n, buf);
    if (kl < 0)
        return tj_lookup(tj, s, n);
    return tj_lookup(tj, buf, (size_t)kl);
}

static bt_status_t tj_fill_merges(tokjson_t *tj, const cJSON *merges,
                                  const int16_t cp_to_byte[0x144])
{
    char *scratch = NULL, *buf = NULL, *cat = NULL;
    size_t scratch_cap = 0, buf_cap = 0, cat_cap = 0;
    uint32_t size = 1;
    const cJSON *m;
    bt_status_t status = BT_OK;
    int n = cJSON_GetArraySize(merges);
    int rank = 0;

    if (n > TJ_MAX_MERGES)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: %d merges (at most %d)", n,
                        TJ_MAX_MERGES);
    while (size < 2u * (uint32_t)n + 2)
        size <<= 1;
    tj->merge_mask = size - 1;
    tj->merges = bt_malloc(size * sizeof(*tj->merges), "tok_json");
    if (tj->merges == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "merge table of %d", n);
    for (uint32_t i = 0; i < size; i++)
        tj->merges[i].key = UINT64_MAX;

    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        int ia, ib, inew;
        size_t la, lb;

        if (!tj_merge_parts(m, &scratch, &scratch_cap, &a, &b)) {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "tokenizer.json: merge %d is neither \"a b\" "
                              "nor [\"a\", \"b\"]", rank);
            break;
        }
        la = strlen(a);
        lb = strlen(b);
        if (!tj_grow((void **)&buf, &buf_cap, la + lb + 1, 1,
                     "tok_json_load")) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "merge scratch");
            break;
        }
        ia = tj_piece_id(tj, cp_to_byte, a, buf);
        ib = tj_piece_id(tj, cp_to_byte, b, buf);
        if (ia < 0 || ib < 0) {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "tokenizer.json: merge %d names '%s', which is "
                              "not in the vocab", rank, ia < 0 ? a : b);
            break;
        }
        if (!tj_grow((void **)&cat, &cat_cap,
                     (size_t)tj->key_lens[ia] + (size_t)tj->key_lens[ib] + 1,
                     1, "tok_json_load")) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "merge scratch");
            break;
        }
        memcpy(cat, tj->keys[ia], (size_t)tj->key_lens[ia]);
        memcpy(cat + tj->key_lens[ia], tj->keys[ib],
               (size_t)tj->key_lens[ib]);
        inew = tj_lookup(tj, cat,
                         (size_t)tj->key_lens[ia] + (size_t)tj->key_lens[ib]);
        if (inew < 0) {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "tokenizer.json: merge %d ('%s' + '%s') makes "
                              "a token that is not in the vocab", rank, a, b);
            break;
        }
        tj_merge_insert(tj, ia, ib, rank, inew);
        rank++;
    }
    tj->n_merges = rank;
    bt_free(cat);
    bt_free(buf);
    bt_free(scratch);
    return status;
}

/* Reads added_tokens (ids were range-checked by the caller); their match
 * patterns and lookup chains come after, from tj_prepare_added(). */
static bt_status_t tj_fill_added(tokjson_t *tj, const cJSON *list)
{
    const cJSON *it;
    int i = 0;

    cJSON_ArrayForEach(it, list) {
        tj_added_t *a = &tj->added[i];
        const char *content = tj_get_str(it, "content");
        a->id = tj_id_value(cJSON_GetObjectItemCaseSensitive(it, "id"));
        a->len = (int)strlen(content);
        a->text = tj_arena_str(tj, content, (size_t)a->len);
        if (a->text == NULL)
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "added tokens");
        a->special = tj_get_bool(it, "special", false);
        a->lstrip = tj_get_bool(it, "lstrip", false);
        a->rstrip = tj_get_bool(it, "rstrip", false);
        a->normalized = tj_get_bool(it, "normalized", !a->special);
        a->pat = a->text;
        a->pat_len = a->len;
        tj->pieces[a->id] = a->text;
        tj->flags[a->id] |= TJ_F_PRESENT | TJ_F_ADDED |
                            (a->special ? TJ_F_SPECIAL : 0);
        i++;
    }
    tj->n_added = i;
    return BT_OK;
}

/* Checks vocab and added_tokens, returning the vocabulary size. */
static bt_status_t tj_check_ids(const cJSON *vocab, const cJSON *added,
                                int *size_p)
{
    const cJSON *it;
    int max_id = -1, n = 0;

    cJSON_ArrayForEach(it, vocab) {
        int id = tj_id_value(it);
        if (id < 0)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: vocab entry '%.64s' has no "
                            "integer id in [0, %d)", it->string, TJ_MAX_ID);
        max_id = BT_MAX(max_id, id);
        n++;
    }
    if (n == 0)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: model.vocab is empty");
    if (added != NULL && !cJSON_IsArray(added))
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: added_tokens is not an array");
    if (cJSON_GetArraySize(added) > TJ_MAX_ADDED)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: %d added tokens (at most %d)",
                        cJSON_GetArraySize(added), TJ_MAX_ADDED);
    cJSON_ArrayForEach(it, added) {
        int id = tj_id_value(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const char *content = tj_get_str(it, "content");
        if (id < 0 || content == NULL || content[0] == '\0')
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: an added token needs an integer "
                            "id in [0, %d) and a non-empty content",
                            TJ_MAX_ID);
        max_id = BT_MAX(max_id, id);
    }
    /* Ids may leave gaps, but not absurd ones: a huge id with a tiny
     * vocabulary is a corrupt file, not a 16M-entry table to allocate. */
    if (max_id >= 4 * (n + cJSON_GetArraySize(added)) + 1024)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: id %d is far beyond the %d tokens "
                        "listed", max_id, n + cJSON_GetArraySize(added));
    *size_p = max_id + 1;
    return BT_OK;
}

/* Decoded bytes of every id (the decoder applied to one token). */
static bt_status_t tj_fill_bytes(tokjson_t *tj, const tj_dec_t *dec,
                                 const int16_t cp_to_byte[0x144])
{
    char *buf = NULL;
    size_t cap = 0;

    for (int id = 0; id < tj->vocab_size; id++) {
        const char *s = tj->pieces[id];
        size_t n;
        int len;

        if (s == NULL) {
            tj->bytes[id] = "";
            continue;
        }
        n = strlen(s);
        if (!tj_grow((void **)&buf, &cap, 3 * n + 8, 1, "tok_json_load"))
            goto err_no_memory;
        if (tj->flags[id] & TJ_F_ADDED) {
            memcpy(buf, s, n);
            len = (int)n;
        } else if (dec->byte_level &&
                   (len = tj_unmap(cp_to_byte, s, n, buf)) >= 0) {
            /* unmapped */
        } else {
            /* Replace steps in order, then ByteFallback. */
            size_t w = 0;
            for (size_t i = 0; i < n;) {
                bool hit = false;
                for (int r = 0; r < dec->n_repl; r++) {
                    size_t fl = strlen(dec->from[r]);
                    if (n - i >= fl && memcmp(s + i, dec->from[r], fl) == 0) {
                        size_t tl = strlen(dec->to[r]);
                        if (!tj_grow((void **)&buf, &cap, w + tl + n + 8, 1,
                                     "tok_json_load"))
                            goto err_no_memory;
                        memcpy(buf + w, dec->to[r], tl);
                        w += tl;
                        i += fl;
                        hit = true;
                        break;
                    }
                }
                if (!hit)
                    buf[w++] = s[i++];
            }
            len = (int)w;
            if (dec->byte_fallback && n == 6 && memcmp(s, "<0x", 3) == 0 &&
                s[5] == '>') {
                char hex[3] = {s[3], s[4], '\0'};
                char *end;
                long v = strtol(hex, &end, 16);
                if (*end == '\0' && hex[0] != '-' && hex[0] != '+') {
                    buf[0] = (char)v;
                    len = 1;
                }
            }
        }
        if (len > TOKJSON_MAX_PIECE_LEN) {
            bt_free(buf);
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "tokenizer.json: token %d decodes to %d bytes "
                            "(at most %d)", id, len, TOKJSON_MAX_PIECE_LEN);
        }
        tj->bytes[id] = tj_arena_str(tj, buf, (size_t)len);
        if (tj->bytes[id] == NULL)
            goto err_no_memory;
        tj->bytes_lens[id] = len;
        tj->max_piece_len = BT_MAX(tj->max_piece_len, len);
    }
    bt_free(buf);
    return BT_OK;

err_no_memory:
    bt_free(buf);
    return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "decoded pieces");
}

static bt_status_t tj_prepare_added(tokjson_t *tj);

static bt_status_t tj_load_model(tokjson_t *tj, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root,
                                                          "added_tokens");
    const char *type = tj_type(model);
    const char *unk, *s;
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[0x144];
    tj_dec_t dec;
    uint32_t hash_size = 1;
    bt_status_t status;
    int size = 0;

    if (!cJSON_IsObject(model))
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: no \"model\" object");
    if (type != NULL && strcmp(type, "BPE") != 0)
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: model type '%s' is not supported "
                        "(only BPE)", type);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: model needs a vocab object and a "
                        "merges array");
    s = tj_get_str(model, "continuing_subword_prefix");
    if (s != NULL && s[0] != '\0')
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: continuing_subword_prefix is not "
                        "supported");
    s = tj_get_str(model, "end_of_word_suffix");
    if (s != NULL && s[0] != '\0')
        return BT_ERROR(BT_ERR_UNSUPPORTED, "TOK",
                        "tokenizer.json: end_of_word_suffix is not "
                        "supported");
    tj->byte_fallback = tj_get_bool(model, "byte_fallback", false);
    tj->fuse_unk = tj_get_bool(model, "fuse_unk", false);
    tj->ignore_merges = tj_get_bool(model, "ignore_merges", false);

    /* The pre-tokenizer and decoder say whether this is byte-level. */
    tj->norms = bt_calloc(32, sizeof(*tj->norms), "tok_json");
    tj->pres = bt_calloc(16, sizeof(*tj->pres), "tok_json");
    if (tj->norms == NULL || tj->pres == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "pipeline");
    status = tj_add_norm(tj, cJSON_GetObjectItemCaseSensitive(root,
                                                              "normalizer"),
                         0);
    if (status != BT_OK)
        return status;
    status = tj_add_pre(tj, cJSON_GetObjectItemCaseSensitive(root,
                                                             "pre_tokenizer"),
                        0);
    if (status != BT_OK)
        return status;
    memset(&dec, 0, sizeof(dec));
    status = tj_parse_decoder(cJSON_GetObjectItemCaseSensitive(root,
                                                               "decoder"),
                              &dec, 0);
    if (status != BT_OK)
        return status;
    if (dec.byte_level)
        tj->byte_level = true;
    tj->strip_start = dec.strip_start;

    status = tj_check_ids(vocab, added, &size);
    if (status != BT_OK)
        return status;
    tj->vocab_size = size;
    tj->pieces = bt_calloc((size_t)size, sizeof(*tj->pieces), "tok_json");
    tj->keys = bt_calloc((size_t)size, sizeof(*tj->keys), "tok_json");
    tj->key_lens = bt_calloc((size_t)size, sizeof(*tj->key_lens), "tok_json");
    tj->bytes = bt_calloc((size_t)size, sizeof(*tj->bytes), "tok_json");
    tj->bytes_lens = bt_calloc((size_t)size, sizeof(*tj->bytes_lens),
                               "tok_json");
    tj->flags = bt_calloc((size_t)size, sizeof(*tj->flags), "tok_json");
    tj->added = bt_calloc((size_t)cJSON_GetArraySize(added) + 1,
                          sizeof(*tj->added), "tok_json");
    while (hash_size < 2u * (uint32_t)size)
        hash_size <<= 1;
    tj->hash_mask = hash_size - 1;
    tj->hash_ids = bt_malloc(hash_size * sizeof(*tj->hash_ids), "tok_json");
    if (tj->pieces == NULL || tj->keys == NULL || tj->key_lens == NULL ||
        tj->bytes == NULL || tj->bytes_lens == NULL || tj->flags == NULL ||
        tj->added == NULL || tj->hash_ids == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "tables for %d tokens",
                        size);
    memset(tj->hash_ids, 0xff, hash_size * sizeof(*tj->hash_ids));

    tj_byte_map(byte_to_cp, cp_to_byte);
    status = tj_fill_vocab(tj, vocab, cp_to_byte);
    if (status != BT_OK)
        return status;
    for (int id = 0; id < size; id++)
        if (tj->keys[id] != NULL)
            tj_hash_insert(tj, id);
    status = tj_fill_merges(tj, merges, cp_to_byte);
    if (status != BT_OK)
        return status;
    status = tj_fill_added(tj, added);
    if (status != BT_OK)
        return status;
    status = tj_prepare_added(tj);
    if (status != BT_OK)
        return status;

    for (int b = 0; b < 256; b++) {
        char name[8];
        tj->byte_ids[b] = -1;
        if (tj->byte_level) {
            char c = (char)b;
            tj->byte_ids[b] = tj_lookup(tj, &c, 1);
        } else if (tj->byte_fallback) {
            snprintf(name, sizeof(name), "<0x%02X>", b);
            tj->byte_ids[b] = tj_lookup(tj, name, 6);
        }
    }
    unk = tj_get_str(model, "unk_token");
    tj->unk_id = unk != NULL ? tj_name_id(tj, unk) : -1;
    if (unk != NULL && tj->unk_id < 0)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json: unk_token '%s' is not in the vocab",
                        unk);
    (void)byte_to_cp;
    return tj_fill_bytes(tj, &dec, cp_to_byte);
}

// ----------------------------------------------------------------------------
// loading: configs

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static int tj_config_token(const tokjson_t *tj, const cJSON *cfg,
                           const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *name = NULL;

    if (cJSON_IsString(v))
        name = v->valuestring;
    else if (cJSON_IsObject(v))
        name = tj_get_str(v, "content");
    return name != NULL ? tj_name_id(tj, name) : -1;
}

static void tj_add_eos(tokjson_t *tj, int id)
{
    if (id < 0 || id >= tj->vocab_size)
        return;
    for (int i = 0; i < tj->n_eos; i++)
        if (tj->eos_ids[i] == id)
            return;
    if (tj->n_eos < TJ_MAX_EOS)
        tj->eos_ids[tj->n_eos++] = id;
}

static bt_status_t tj_load_config(tokjson_t *tj, const char *text, size_t len)
{
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    const cJSON *v, *tmpl;
    int id;

    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer_config.json is not a JSON object");
    }
    v = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(v))
        tj->add_bos = cJSON_IsTrue(v);
    v = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (cJSON_IsBool(v))
        tj->add_eos = cJSON_IsTrue(v);
    id = tj_config_token(tj, cfg, "bos_token");
    if (id >= 0)
        tj->bos_id = id;
    id = tj_config_token(tj, cfg, "eos_token");
    if (id >= 0) {
        tj->eos_id = id;
        tj_add_eos(tj, id);
    }
    tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(tmpl)) { /* [{name, template}]: take "default" */
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, tmpl) {
            const char *name = tj_get_str(it, "name");
            if (pick == NULL || (name != NULL && strcmp(name, "default") == 0))
                pick = it;
        }
        tmpl = cJSON_GetObjectItemCaseSensitive(pick, "template");
    }
    if (cJSON_IsString(tmpl)) {
        tj->chat_template = bt_strdup(tmpl->valuestring, "tok_json");
        if (tj->chat_template == NULL) {
            cJSON_Delete(cfg);
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "chat template");
        }
    }
    cJSON_Delete(cfg);
    return BT_OK;
}

static bt_status_t tj_load_gen_config(tokjson_t *tj, const char *text,
                                      size_t len)
{
    cJSON *gen = cJSON_ParseWithLength(text, len);
    const cJSON *v, *it;

    if (!cJSON_IsObject(gen)) {
        cJSON_Delete(gen);
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "generation_config.json is not a JSON object");
    }
    v = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
    if (cJSON_IsArray(v)) {
        cJSON_ArrayForEach(it, v)
            tj_add_eos(tj, tj_id_value(it));
    } else {
        tj_add_eos(tj, tj_id_value(v));
    }
    if (tj->eos_id < 0 && tj->n_eos > 0)
        tj->eos_id = tj->eos_ids[0];
    if (tj->bos_id < 0) {
        int id = tj_id_value(cJSON_GetObjectItemCaseSensitive(gen,
                                                              "bos_token_id"));
        if (id < tj->vocab_size)
            tj->bos_id = id;
    }
    cJSON_Delete(gen);
    return BT_OK;
}

bt_status_t tokjson_load_mem(const char *json, size_t len, const char *config,
                             size_t config_len, const char *gen_config,
                             size_t gen_len, tokjson_t **tj_p)
{
    cJSON *root = NULL;
    tokjson_t *tj;
    bt_status_t status;

    if (tj_p == NULL || (json == NULL && len > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    if (len > TJ_MAX_FILE_BYTES)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer.json of %zu bytes is too large", len);
    tj = bt_calloc(1, sizeof(*tj), "tok_json");
    if (tj == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "tokenizer");
    tj->unk_id = tj->bos_id = tj->eos_id = -1;
    pthread_mutex_init(&tj->cache_lock, NULL);
    tj->cache = bt_calloc(TJ_CACHE_SLOTS, sizeof(*tj->cache), "tok_json");
    if (tj->cache == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "tokenizer cache");
        goto err_destroy;
    }
    root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                          "tokenizer.json is not a JSON object (parse "
                          "failed near byte %zu)",
                          root == NULL && cJSON_GetErrorPtr() != NULL &&
                                  cJSON_GetErrorPtr() >= json &&
                                  cJSON_GetErrorPtr() <= json + len
                              ? (size_t)(cJSON_GetErrorPtr() - json)
                              : (size_t)0);
        goto err_destroy;
    }
    status = tj_load_model(tj, root);
    if (status != BT_OK)
        goto err_destroy;
    tj_parse_post(tj, cJSON_GetObjectItemCaseSensitive(root,
                                                       "post_processor"),
                  0);
    if (config != NULL) {
        status = tj_load_config(tj, config, config_len);
        if (status != BT_OK)
            goto err_destroy;
    }
    if (gen_config != NULL) {
        status = tj_load_gen_config(tj, gen_config, gen_len);
        if (status != BT_OK)
            goto err_destroy;
    }
    if (tj->eos_id >= 0)
        tj_add_eos(tj, tj->eos_id);
    if (tj->max_piece_len < 1)
        tj->max_piece_len = 1;
    cJSON_Delete(root);
    *tj_p = tj;
    return BT_OK;

err_destroy:
    cJSON_Delete(root);
    tokjson_destroy(&tj);
    return status;
}

void tokjson_destroy(tokjson_t **tj_p)
{
    tokjson_t *tj;

    if (tj_p == NULL || *tj_p == NULL)
        return;
    tj = *tj_p;
    if (tj->cache != NULL) {
        for (int i = 0; i < TJ_CACHE_SLOTS; i++)
            bt_free(tj->cache[i]);
        bt_free(tj->cache);
    }
    pthread_mutex_destroy(&tj->cache_lock);
    for (int i = 0; tj->pres != NULL && i < tj->n_pres; i++)
        if (tj->pres[i].re != NULL)
            pcre2_code_free(tj->pres[i].re);
    while (tj->arena != NULL) {
        tj_arena_block_t *next = tj->arena->next;
        bt_free(tj->arena);
        tj->arena = next;
    }
    bt_free(tj->chat_template);
    bt_free(tj->pres);
    bt_free(tj->norms);
    bt_free(tj->added);
    bt_free(tj->merges);
    bt_free(tj->hash_ids);
    bt_free(tj->flags);
    bt_free(tj->bytes_lens);
    bt_free(tj->bytes);
    bt_free(tj->key_lens);
    bt_free(tj->keys);
    bt_free(tj->pieces);
    bt_free(tj);
    *tj_p = NULL;
}

// ----------------------------------------------------------------------------
// queries

int tokjson_vocab_size(const tokjson_t *tj)
{
    return tj->vocab_size;
}

int tokjson_max_piece_len(const tokjson_t *tj)
{
    return tj->max_piece_len;
}

int tokjson_bos_id(const tokjson_t *tj)
{
    return tj->bos_id;
}

int tokjson_eos_id(const tokjson_t *tj)
{
    return tj->eos_id;
}

const char *tokjson_piece(const tokjson_t *tj, int id)
{
    if (tj == NULL || id < 0 || id >= tj->vocab_size)
        return NULL;
    return tj->pieces[id] != NULL ? tj->pieces[id] : "";
}

void tokjson_set_skip_special(tokjson_t *tj, bool skip)
{
    tj->skip_special = skip;
}

bool tokjson_adds_bos(const tokjson_t *tj)
{
    return tj->add_bos && tj->bos_id >= 0;
}

bool tokjson_adds_eos(const tokjson_t *tj)
{
    return tj->add_eos && tj->eos_id >= 0;
}

int tokjson_eos_ids(const tokjson_t *tj, int *ids, int cap)
{
    int n = BT_MIN(cap, tj->n_eos);
    for (int i = 0; i < n; i++)
        ids[i] = tj->eos_ids[i];
    return n;
}

int tokjson_token_id(const tokjson_t *tj, const char *piece)
{
    return piece != NULL ? tj_name_id(tj, piece) : -1;
}

bool tokjson_is_special(const tokjson_t *tj, int id)
{
    return id >= 0 && id < tj->vocab_size &&
           (tj->flags[id] & TJ_F_SPECIAL) != 0;
}

const char *tokjson_chat_template(const tokjson_t *tj)
{
    return tj->chat_template;
}

const char *tokjson_kind_name(const tokjson_t *tj)
{
    return tj->byte_level ? "tokenizer.json byte-level BPE"
                          : "tokenizer.json sentencepiece-style BPE";
}

// ----------------------------------------------------------------------------
// encoding: scratch state

typedef struct {
    size_t off; /* into the current text buffer */
    size_t len;
} tj_span_t;

typedef struct {
    size_t start;  /* match or gap, within the span */
    size_t end;
    bool is_match;
} tj_match_t;

typedef struct {
    int id;       /* current token */
    int prev;     /* previous live symbol, -1 at the start */
    int next;     /* next live symbol, -1 at the end */
    uint32_t ver; /* bumped when the symbol changes or dies */
} tj_sym_t;

typedef struct {
    int rank;       /* merge rank: lowest pops first */
    int left;       /* left symbol; lowest pops first on equal ranks */
    int right;
    int new_id;
    uint32_t ver_l; /* versions when queued: stale entries are skipped */
    uint32_t ver_r;
} tj_pair_t;

/* One encode call's growable buffers. */
typedef struct {
    char *text[2];        /* current and next text buffers */
    size_t text_cap[2];
    int cur;              /* which text[] holds the current text */
    size_t text_len;      /* bytes in the current text */
    tj_span_t *spans[2];  /* current and next spans */
    size_t spans_cap[2];
    size_t n_spans;
    tj_match_t *matches;
    size_t matches_cap;
    tj_sym_t *syms;
    size_t syms_cap;
    tj_pair_t *heap;
    size_t heap_cap;
    size_t heap_n;
    int *out;             /* ids so far */
    size_t out_cap;
    size_t n_out;
    pcre2_match_data *md; /* for every regex (sized for one pair) */
    utf8proc_int32_t *ucs;/* code points of a Unicode normalizer step, then
                             its UTF-8 output in the same memory */
    size_t ucs_cap;
    char *norm;           /* a normalized segment while normalized added
                             tokens are cut out of it */
    size_t norm_cap;
} tj_work_t;

static bool tj_out_push(tj_work_t *w, int id)
{
    if (!tj_grow((void **)&w->out, &w->out_cap, w->n_out + 1, sizeof(int),
                 "tok_ids"))
        return false;
    w->out[w->n_out++] = id;
    return true;
}

// ----------------------------------------------------------------------------
// encoding: BPE of one pre-token

static bool tj_pair_before(const tj_pair_t *a, const tj_pair_t *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->left < b->left;
}

static void tj_heap_push(tj_work_t *w, const tj_pair_t *p)
{
    size_t i = w->heap_n++;

    BT_ASSERT(w->heap_n <= w->heap_cap);
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!tj_pair_before(p, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = *p;
}

static tj_pair_t tj_heap_pop(tj_work_t *w)
{
    tj_pair_t top = w->heap[0];
    tj_pair_t last = w->heap[--w->heap_n];
    size_t i = 0;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->heap_n)
            break;
        if (c + 1 < w->heap_n && tj_pair_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!tj_pair_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->heap_n > 0)
        w->heap[i] = last;
    return top;
}

static void tj_queue_pair(const tokjson_t *tj, tj_work_t *w, int l, int r)
{
    const tj_merge_t *m;
    tj_pair_t p;

    if (l < 0 || r < 0)
        return;
    m = tj_merge_find(tj, w->syms[l].id, w->syms[r].id);
    if (m == NULL)
        return;
    p.rank = m->rank;
    p.left = l;
    p.right = r;
    p.new_id = m->new_id;
    p.ver_l = w->syms[l].ver;
    p.ver_r = w->syms[r].ver;
    tj_heap_push(w, &p);
}

/* Appends a symbol, fusing consecutive unks when the model says so. */
static void tj_sym_add(const tokjson_t *tj, tj_work_t *w, int *n, int id)
{
    if (id == tj->unk_id && tj->fuse_unk && *n > 0 &&
        w->syms[*n - 1].id == tj->unk_id)
        return;
    w->syms[*n].id = id;
    (*n)++;
}

static bool tj_cache_get(const tokjson_t *tj, tj_work_t *w, const char *s,
                         size_t n, uint32_t h)
{
    tokjson_t *mtj = (tokjson_t *)tj; /* the cache is interior state */
    tj_cache_ent_t *e;
    bool hit = false;

    pthread_mutex_lock(&mtj->cache_lock);
    e = mtj->cache[h & (TJ_CACHE_SLOTS - 1)];
    if (e != NULL && e->hash == h && e->len == n) {
        const int *ids = (const int *)(e + 1);
        if (memcmp(ids + e->n_ids, s, n) == 0 &&
            tj_grow((void **)&w->out, &w->out_cap, w->n_out + (size_t)e->n_ids,
                    sizeof(int), "tok_ids")) {
            memcpy(w->out + w->n_out, ids, (size_t)e->n_ids * sizeof(int));
            w->n_out += (size_t)e->n_ids;
            hit = true;
        }
    }
    pthread_mutex_unlock(&mtj->cache_lock);
    return hit;
}

static void tj_cache_put(const tokjson_t *tj, const char *s, size_t n,
                         uint32_t h, const int *ids, int n_ids)
{
    tokjson_t *mtj = (tokjson_t *)tj;
    tj_cache_ent_t *e, **slot;

    e = bt_malloc(sizeof(*e) + (size_t)n_ids * sizeof(int) + n, "tok_cache");
    if (e == NULL)
        return; /* a cache miss is harmless */
    e->hash = h;
    e->len = (uint32_t)n;
    e->n_ids = n_ids;
    memcpy(e + 1, ids, (size_t)n_ids * sizeof(int));
    memcpy((int *)(e + 1) + n_ids, s, n);
    pthread_mutex_lock(&mtj->cache_lock);
    slot = &mtj->cache[h & (TJ_CACHE_SLOTS - 1)];
    bt_free(*slot);
    *slot = e;
    pthread_mutex_unlock(&mtj->cache_lock);
}

/* BPE-encodes the pre-token s[0..n) and appends its ids to w->out. */
static bt_status_t tj_bpe(const tokjson_t *tj, tj_work_t *w, const char *s,
                          size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    uint32_t h = 0;
    size_t first_out = w->n_out;
    int nsym = 0;

    if (n == 0)
        return BT_OK;
    if (tj->ignore_merges) {
        int id = tj_lookup(tj, s, n);
        if (id >= 0)
            return tj_out_push(w, id) ? BT_OK
                                      : BT_ERROR(BT_ERR_NO_MEMORY, "TOK",
                                                 "ids");
    }
    if (n <= TJ_CACHE_MAX_KEY) {
        h = tj_hash(s, n);
        if (tj_cache_get(tj, w, s, n, h))
            return BT_OK;
    }
    /* At most one symbol per byte. */
    if (!tj_grow((void **)&w->syms, &w->syms_cap, n, sizeof(*w->syms),
                 "tok_encode") ||
        !tj_grow((void **)&w->heap, &w->heap_cap, 3 * n + 1,
                 sizeof(*w->heap), "tok_encode"))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "merge state");

    for (size_t i = 0; i < n;) {
        int l, id;
        if (tj->byte_level) {
            id = tj->byte_ids[u[i]];
            if (id < 0)
                id = tj->unk_id;
            if (id >= 0)
                tj_sym_add(tj, w, &nsym, id);
            i++;
            continue;
        }
        l = tj_utf8_len(u + i, n - i);
        if (l == 0)
            l = 1; /* an invalid byte is a symbol of its own */
        id = tj_lookup(tj, s + i, (size_t)l);
        if (id >= 0) {
            tj_sym_add(tj, w, &nsym, id);
        } else {
            bool all = tj->byte_fallback;
            for (int k = 0; all && k < l; k++)
                all = tj->byte_ids[u[i + (size_t)k]] >= 0;
            if (all) {
                for (int k = 0; k < l; k++)
                    tj_sym_add(tj, w, &nsym, tj->byte_ids[u[i + (size_t)k]]);
            } else if (tj->unk_id >= 0) {
                tj_sym_add(tj, w, &nsym, tj->unk_id);
            }
            /* else: no way to represent it; dropped, as `tokenizers`
             * would refuse the whole text */
        }
        i += (size_t)l;
    }
    for (int i = 0; i < nsym; i++) {
        w->syms[i].prev = i - 1;
        w->syms[i].next = i + 1 < nsym ? i + 1 : -1;
        w->syms[i].ver = 0;
    }
    w->heap_n = 0;
    for (int i = 0; i + 1 < nsym; i++)
        tj_queue_pair(tj, w, i, i + 1);
    while (w->heap_n > 0) {
        tj_pair_t p = tj_heap_pop(w);
        tj_sym_t *ls = &w->syms[p.left];
        tj_sym_t *rs = &w->syms[p.right];

        if (ls->ver != p.ver_l || rs->ver != p.ver_r)
            continue; /* one side merged since this pair was queued */
        ls->id = p.new_id;
        ls->ver++;
        rs->ver++; /* dead */
        ls->next = rs->next;
        if (rs->next >= 0)
            w->syms[rs->next].prev = p.left;
        tj_queue_pair(tj, w, ls->prev, p.left);
        tj_queue_pair(tj, w, p.left, ls->next);
    }
    if (nsym > 0 &&
        !tj_grow((void **)&w->out, &w->out_cap, w->n_out + (size_t)nsym,
                 sizeof(int), "tok_ids"))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "ids");
    for (int i = nsym > 0 ? 0 : -1; i >= 0; i = w->syms[i].next)
        w->out[w->n_out++] = w->syms[i].id;
    if (n <= TJ_CACHE_MAX_KEY)
        tj_cache_put(tj, s, n, h, w->out + first_out,
                     (int)(w->n_out - first_out));
    return BT_OK;
}

// ----------------------------------------------------------------------------
// encoding: normalizer and pre-tokenizer

/* Makes room for n bytes in the next text buffer. */
static char *tj_next_text(tj_work_t *w, size_t n)
{
    int nx = 1 - w->cur;
    if (!tj_grow((void **)&w->text[nx], &w->text_cap[nx], n + 1, 1,
                 "tok_encode"))
        return NULL;
    return w->text[nx];
}

static size_t tj_count(const char *s, size_t n, const char *pat, size_t pl)
{
    size_t c = 0;
    for (size_t i = 0; i + pl <= n;) {
        if (memcmp(s + i, pat, pl) == 0) {
            c++;
            i += pl;
        } else {
            i++;
        }
    }
    return c;
}

/* Writes s with every pat replaced by to into out; returns bytes. */
static size_t tj_replace(const char *s, size_t n, const char *pat, size_t pl,
                         const char *to, size_t tl, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        if (i + pl <= n && memcmp(s + i, pat, pl) == 0) {
            memcpy(out + w, to, tl);
            w += tl;
            i += pl;
        } else {
            out[w++] = s[i++];
        }
    }
    return w;
}

/* Whether every normalization form f (utf8proc options) leaves cp alone
 * whatever surrounds it, so that text can be cut before cp and each side
 * normalized on its own: cp has canonical combining class 0, no
 * decomposition under f, and is never the second of a canonical
 * composition (Unicode's Quick_Check = Yes with ccc 0).  True of ASCII and
 * of the CJK unified ideographs for every form, and of precomposed Hangul
 * syllables for the composing forms (a syllable may compose with a jamo
 * after it, which is not inert, so it starts that jamo's region).
 * tests/hftok/test_hftok_norm.c checks these ranges against utf8proc. */
static bool tj_norm_inert(int32_t cp, int f)
{
    if (cp < 0x80 || (cp >= 0x3400 && cp <= 0x4DBF) ||
        (cp >= 0x4E00 && cp <= 0x9FFF))
        return true;
    return (f & UTF8PROC_COMPOSE) && cp >= 0xAC00 && cp <= 0xD7A3;
}

/* Normalizes s[0..n) (valid UTF-8) with one form and appends it to the
 * next text buffer at *out_n (utf8proc_map's steps, in w's buffers). */
static bt_status_t tj_norm_append(const tj_norm_t *nm, tj_work_t *w,
                                  const char *s, size_t n, size_t *out_n)
{
    utf8proc_ssize_t cps, bytes;
    char *out;

    for (;;) {
        cps = utf8proc_decompose((const utf8proc_uint8_t *)s,
                                 (utf8proc_ssize_t)n, w->ucs,
                                 (utf8proc_ssize_t)w->ucs_cap,
                                 (utf8proc_option_t)nm->uopts);
        if (cps < 0)
            return BT_ERROR(BT_ERR_INTERNAL, "TOK", "utf8proc: %s",
                            utf8proc_errmsg(cps));
        /* reencode writes UTF-8 in place plus a NUL: cps * 4 + 1 bytes */
        if ((size_t)cps + 1 <= w->ucs_cap)
            break;
        if ((size_t)cps > (size_t)INT_MAX / 4)
            return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                            "text too long after Unicode normalization");
        if (!tj_grow((void **)&w->ucs, &w->ucs_cap, (size_t)cps + 1,
                     sizeof(*w->ucs), "tok_encode"))
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer");
    }
    bytes = utf8proc_reencode(w->ucs, cps, (utf8proc_option_t)nm->uopts);
    if (bytes < 0)
        return BT_ERROR(BT_ERR_INTERNAL, "TOK", "utf8proc: %s",
                        utf8proc_errmsg(bytes));
    out = tj_next_text(w, *out_n + (size_t)bytes);
    if (out == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer");
    memcpy(out + *out_n, w->ucs, (size_t)bytes);
    *out_n += (size_t)bytes;
    return BT_OK;
}

/* Appends s[0..n) unchanged to the next text buffer at *out_n. */
static bt_status_t tj_copy_append(tj_work_t *w, const char *s, size_t n,
                                  size_t *out_n)
{
    char *out = tj_next_text(w, *out_n + n);
    if (out == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer");
    memcpy(out + *out_n, s, n);
    *out_n += n;
    return BT_OK;
}

/* One Unicode normalization form over the current text.  Only the regions
 * around characters that are not inert go through utf8proc (each from the
 * last inert character before it to the next inert one); the rest is
 * copied, and text with nothing to do (pure ASCII, say) stays where it is.
 * Text that is not valid UTF-8 keeps its raw bytes (see the file
 * comment). */
static bt_status_t tj_norm_unicode(const tj_norm_t *nm, tj_work_t *w)
{
    const char *cur = w->text[w->cur];
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)cur;
    size_t n = w->text_len, i = 0, done = 0, out_n = 0;
    size_t last_inert = SIZE_MAX; /* start of the last inert char >= done */
    bool any = false;
    utf8proc_int32_t cp;
    utf8proc_ssize_t l;
    bt_status_t status;

    while (i < n) { /* valid UTF-8, and anything to do? */
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        l = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0)
            return BT_OK; /* invalid UTF-8: the raw bytes stay */
        any = any || !tj_norm_inert(cp, nm->uopts);
        i += (size_t)l;
    }
    if (!any)
        return BT_OK;
    for (i = 0; i < n;) {
        size_t start, j;
        l = u[i] < 0x80 ? 1 : utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i),
                                               &cp);
        if (u[i] < 0x80 || tj_norm_inert(cp, nm->uopts)) {
            last_inert = i;
            i += (size_t)l;
            continue;
        }
        /* a region: from the last inert character (it may compose with
         * what follows) to the next inert one */
        start = last_inert != SIZE_MAX ? last_inert : done;
        for (j = i + (size_t)l; j < n; j += (size_t)l) {
            l = u[j] < 0x80 ? 1
                            : utf8proc_iterate(u + j,
                                               (utf8proc_ssize_t)(n - j), &cp);
            if (u[j] < 0x80 || tj_norm_inert(cp, nm->uopts))
                break;
        }
        status = tj_copy_append(w, cur + done, start - done, &out_n);
        if (status == BT_OK)
            status = tj_norm_append(nm, w, cur + start, j - start, &out_n);
        if (status != BT_OK)
            return status;
        done = i = j;
        last_inert = SIZE_MAX;
    }
    status = tj_copy_append(w, cur + done, n - done, &out_n);
    if (status != BT_OK)
        return status;
    if (out_n > (size_t)INT_MAX / 2) /* ids are counted in an int */
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                        "text of %zu bytes after Unicode normalization is "
                        "too long to encode", out_n);
    w->cur = 1 - w->cur;
    w->text_len = out_n;
    return BT_OK;
}

/* Runs the normalizer steps in order over the current text. */
static bt_status_t tj_normalize(const tokjson_t *tj, tj_work_t *w)
{
    for (int k = 0; k < tj->n_norms; k++) {
        const tj_norm_t *nm = &tj->norms[k];
        const char *cur = w->text[w->cur];
        size_t n = w->text_len, out_n;
        char *out;

        if (n == 0)
            continue;
        if (nm->type == TJ_NORM_UNICODE) {
            bt_status_t status = tj_norm_unicode(nm, w);
            if (status != BT_OK)
                return status;
            continue;
        }
        if (nm->type == TJ_NORM_PREPEND) {
            out = tj_next_text(w, n + nm->str_len);
            if (out == NULL)
                return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer");
            memcpy(out, nm->str, nm->str_len);
            memcpy(out + nm->str_len, cur, n);
            out_n = n + nm->str_len;
        } else {
            size_t c = tj_count(cur, n, nm->str, nm->str_len);
            if (c == 0)
                continue;
            out = tj_next_text(w, n + c * nm->to_len);
            if (out == NULL)
                return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "normalizer");
            out_n = tj_replace(cur, n, nm->str, nm->str_len, nm->to,
                               nm->to_len, out);
        }
        w->cur = 1 - w->cur;
        w->text_len = out_n;
    }
    return BT_OK;
}

/* Rewrites every span (Metaspace replace/prepend, ByteLevel prefix space)
 * into the other buffer.  at_start: the first span begins the text. */
static bt_status_t tj_rewrite_spans(const tj_pre_t *pre, tj_work_t *w,
                                    bool at_start)
{
    const char *cur = w->text[w->cur];
    size_t total = 0, pos = 0;
    tj_span_t *sp = w->spans[0];
    char *out;

    for (size_t i = 0; i < w->n_spans; i++) {
        size_t n = sp[i].len;
        if (pre->type == TJ_PRE_METASPACE)
            n += tj_count(cur + sp[i].off, sp[i].len, " ", 1) *
                     (pre->str_len - 1) +
                 pre->str_len;
        else
            n += 1;
        total += n;
    }
    out = tj_next_text(w, total);
    if (out == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "pre-tokenizer");
    for (size_t i = 0; i < w->n_spans; i++) {
        const char *s = cur + sp[i].off;
        size_t n = sp[i].len, start = pos;
        if (pre->type == TJ_PRE_METASPACE) {
            bool starts = n >= 1 && s[0] == ' ';
            bool want = pre->prepend == TJ_PREPEND_ALWAYS ||
                        (pre->prepend == TJ_PREPEND_FIRST && at_start &&
                         i == 0);
            /* " " becomes the replacement, so a leading space already
             * starts with it. */
            if (want && !starts &&
                !(n >= pre->str_len &&
                  memcmp(s, pre->str, pre->str_len) == 0)) {
                memcpy(out + pos, pre->str, pre->str_len);
                pos += pre->str_len;
            }
            pos += tj_replace(s, n, " ", 1, pre->str, pre->str_len,
                              out + pos);
        } else {
            if (pre->add_prefix_space && !(n >= 1 && s[0] == ' '))
                out[pos++] = ' ';
            memcpy(out + pos, s, n);
            pos += n;
        }
        sp[i].off = start;
        sp[i].len = pos - start;
    }
    w->cur = 1 - w->cur;
    w->text_len = pos;
    return BT_OK;
}

/* Lists matches and gaps of pre's pattern over s[0..n). */
static bt_status_t tj_find_matches(const tj_pre_t *pre, tj_work_t *w,
                                   const char *s, size_t n, size_t *nm_p)
{
    size_t nm = 0, prev = 0, off = 0;

    for (;;) {
        size_t ms, me;
        if (off > n)
            break;
        if (pre->re != NULL) {
            int rc = pcre2_match(pre->re, (PCRE2_SPTR)s, n, off, 0, w->md,
                                 NULL);
            PCRE2_SIZE *ov;
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0)
                return BT_ERROR(BT_ERR_INTERNAL, "TOK",
                                "pre-tokenizer regex failed (%d)", rc);
            ov = pcre2_get_ovector_pointer(w->md);
            ms = ov[0];
            me = ov[1];
        } else {
            const char *p = NULL;
            const char *pat = pre->type == TJ_PRE_METASPACE ? pre->str
                                                            : pre->str;
            for (size_t i = off; i + pre->str_len <= n; i++) {
                if (memcmp(s + i, pat, pre->str_len) == 0) {
                    p = s + i;
                    break;
                }
            }
            if (p == NULL)
                break;
            ms = (size_t)(p - s);
            me = ms + pre->str_len;
        }
        if (me == ms) { /* empty match: step over one character */
            int l = ms < n ? tj_utf8_len((const uint8_t *)s + ms, n - ms) : 1;
            off = ms + (size_t)(l > 0 ? l : 1);
            continue;
        }
        if (!tj_grow((void **)&w->matches, &w->matches_cap, nm + 2,
                     sizeof(*w->matches), "tok_encode"))
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "matches");
        if (ms > prev)
            w->matches[nm++] = (tj_match_t){prev, ms, false};
        w->matches[nm++] = (tj_match_t){ms, me, true};
        prev = me;
        off = me;
    }
    if (!tj_grow((void **)&w->matches, &w->matches_cap, nm + 1,
                 sizeof(*w->matches), "tok_encode"))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "matches");
    if (prev < n)
        w->matches[nm++] = (tj_match_t){prev, n, false};
    if (pre->invert)
        for (size_t i = 0; i < nm; i++)
            w->matches[i].is_match = !w->matches[i].is_match;
    *nm_p = nm;
    return BT_OK;
}

/* Splits every span by pre's pattern and behaviour (the `tokenizers`
 * SplitDelimiterBehavior folds). */
static bt_status_t tj_split_spans(const tj_pre_t *pre, tj_work_t *w)
{
    const char *cur = w->text[w->cur];
    size_t n_new = 0;

    for (size_t i = 0; i < w->n_spans; i++) {
        tj_span_t span = w->spans[0][i];
        tj_match_t *m;
        size_t nm = 0, first = n_new;
        bt_status_t status = tj_find_matches(pre, w, cur + span.off,
                                             span.len, &nm);
        bool prev_match = false;

        if (status != BT_OK)
            return status;
        if (!tj_grow((void **)&w->spans[1], &w->spans_cap[1], n_new + nm + 1,
                     sizeof(tj_span_t), "tok_encode"))
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "spans");
        m = w->matches;
        switch (pre->behavior) {
        case TJ_SPLIT_REMOVED:
            for (size_t k = 0; k < nm; k++)
                if (!m[k].is_match)
                    w->spans[1][n_new++] = (tj_span_t){
                        span.off + m[k].start, m[k].end - m[k].start};
            break;
        case TJ_SPLIT_ISOLATED:
            for (size_t k = 0; k < nm; k++)
                w->spans[1][n_new++] = (tj_span_t){
                    span.off + m[k].start, m[k].end - m[k].start};
            break;
        case TJ_SPLIT_MERGED_PREV:
            for (size_t k = 0; k < nm; k++) {
                if (m[k].is_match && !prev_match && n_new > first)
                    w->spans[1][n_new - 1].len += m[k].end - m[k].start;
                else
                    w->spans[1][n_new++] = (tj_span_t){
                        span.off + m[k].start, m[k].end - m[k].start};
                prev_match = m[k].is_match;
            }
            break;
        case TJ_SPLIT_CONTIGUOUS:
            for (size_t k = 0; k < nm; k++) {
                if (m[k].is_match == prev_match && n_new > first)
                    w->spans[1][n_new - 1].len += m[k].end - m[k].start;
                else
                    w->spans[1][n_new++] = (tj_span_t){
                        span.off + m[k].start, m[k].end - m[k].start};
                prev_match = m[k].is_match;
            }
            break;
        case TJ_SPLIT_MERGED_NEXT:
            /* Right to left: a match joins the piece after it. */
            for (size_t k = nm; k-- > 0;) {
                if (m[k].is_match && !prev_match && n_new > first) {
                    w->spans[1][n_new - 1].off = span.off + m[k].start;
                    w->spans[1][n_new - 1].len += m[k].end - m[k].start;
                } else {
                    w->spans[1][n_new++] = (tj_span_t){
                        span.off + m[k].start, m[k].end - m[k].start};
                }
                prev_match = m[k].is_match;
            }
            for (size_t a = first, b = n_new; a + 1 < b; a++, b--) {
                tj_span_t t = w->spans[1][a];
                w->spans[1][a] = w->spans[1][b - 1];
                w->spans[1][b - 1] = t;
            }
            break;
        }
    }
    /* swap span arrays */
    {
        tj_span_t *t = w->spans[0];
        size_t c = w->spans_cap[0];
        w->spans[0] = w->spans[1];
        w->spans_cap[0] = w->spans_cap[1];
        w->spans[1] = t;
        w->spans_cap[1] = c;
        w->n_spans = n_new;
    }
    return BT_OK;
}

/* Loads s[0..n) as the current text. */
static bt_status_t tj_load_text(tj_work_t *w, const char *s, size_t n)
{
    w->cur = 0;
    if (!tj_grow((void **)&w->text[0], &w->text_cap[0], n + 1, 1,
                 "tok_encode") ||
        !tj_grow((void **)&w->spans[0], &w->spans_cap[0], 1,
                 sizeof(tj_span_t), "tok_encode"))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "encode buffers");
    memcpy(w->text[0], s, n);
    w->text_len = n;
    return BT_OK;
}

/* Pre-tokenizes and BPE-encodes the current (normalized) text.  at_start:
 * it begins the input text. */
static bt_status_t tj_pretok_bpe(const tokjson_t *tj, tj_work_t *w,
                                 bool at_start)
{
    bt_status_t status;

    w->spans[0][0] = (tj_span_t){0, w->text_len};
    w->n_spans = w->text_len > 0 ? 1 : 0;
    if (w->n_spans == 0)
        return BT_OK;
    for (int k = 0; k < tj->n_pres; k++) {
        const tj_pre_t *pre = &tj->pres[k];
        if (pre->type == TJ_PRE_METASPACE ||
            (pre->type == TJ_PRE_BYTELEVEL && pre->add_prefix_space)) {
            status = tj_rewrite_spans(pre, w, at_start);
            if (status != BT_OK)
                return status;
        }
        if (pre->re != NULL || pre->type == TJ_PRE_SPLIT ||
            (pre->type == TJ_PRE_METASPACE && pre->split)) {
            status = tj_split_spans(pre, w);
            if (status != BT_OK)
                return status;
        }
    }
    for (size_t i = 0; i < w->n_spans; i++) {
        tj_span_t sp = w->spans[0][i];
        status = tj_bpe(tj, w, w->text[w->cur] + sp.off, sp.len);
        if (status != BT_OK)
            return status;
    }
    return BT_OK;
}

static bool tj_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
           c == '\v';
}

/* The longest added token of one set (chains: tj->added_first or
 * tj->nadded_first) whose pattern starts at text[i], or NULL. */
static const tj_added_t *tj_added_at(const tokjson_t *tj,
                                     int *const chains[256],
                                     const char *text, size_t len, size_t i)
{
    const int *chain = chains[(uint8_t)text[i]];

    if (chain == NULL)
        return NULL;
    for (; *chain >= 0; chain++) {
        const tj_added_t *a = &tj->added[*chain];
        if ((size_t)a->pat_len <= len - i &&
            memcmp(text + i, a->pat, (size_t)a->pat_len) == 0)
            return a;
    }
    return NULL;
}

/* Normalizes, pre-tokenizes and BPE-encodes one segment between raw added
 * tokens; added tokens marked normalized are cut out of the normalized
 * segment first, like the library's second AddedVocabulary split.
 * at_start: the segment begins the input text. */
static bt_status_t tj_encode_segment(const tokjson_t *tj, tj_work_t *w,
                                     const char *s, size_t n, bool at_start)
{
    bt_status_t status;
    size_t len, seg = 0, i = 0;

    if (n == 0)
        return BT_OK;
    status = tj_load_text(w, s, n);
    if (status != BT_OK)
        return status;
    status = tj_normalize(tj, w);
    if (status != BT_OK || tj->n_norm_added == 0)
        return status != BT_OK ? status : tj_pretok_bpe(tj, w, at_start);

    /* The pre-tokenizer reuses the text buffers: keep the normalized text
     * aside while cutting. */
    len = w->text_len;
    if (!tj_grow((void **)&w->norm, &w->norm_cap, len + 1, 1, "tok_encode"))
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "encode buffers");
    memcpy(w->norm, w->text[w->cur], len);
    while (i < len) {
        const tj_added_t *a = tj_added_at(tj, tj->nadded_first, w->norm,
                                          len, i);
        size_t start = i, end;
        if (a == NULL) {
            i++;
            continue;
        }
        end = i + (size_t)a->pat_len;
        if (a->lstrip)
            while (start > seg && tj_is_space(w->norm[start - 1]))
                start--;
        if (a->rstrip)
            while (end < len && tj_is_space(w->norm[end]))
                end++;
        if (start > seg) {
            status = tj_load_text(w, w->norm + seg, start - seg);
            if (status == BT_OK)
                status = tj_pretok_bpe(tj, w, at_start && seg == 0);
            if (status != BT_OK)
                return status;
        }
        if (!tj_out_push(w, a->id))
            return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "ids");
        seg = i = end;
    }
    if (len == seg)
        return BT_OK;
    status = tj_load_text(w, w->norm + seg, len - seg);
    if (status != BT_OK)
        return status;
    return tj_pretok_bpe(tj, w, at_start && seg == 0);
}

static int tj_added_cmp(const void *a, const void *b)
{
    const tj_added_t *x = a, *y = b;
    if (x->pat_len != y->pat_len)
        return x->pat_len > y->pat_len ? -1 : 1;
    return x->id - y->id;
}

/* Builds one set's chains: per first byte, a -1 terminated list of
 * indices into added (so pattern-length descending), all in one array. */
static bt_status_t tj_chain_added(tokjson_t *tj, bool normalized,
                                  int *chains_p[256])
{
    int counts[256] = {0};
    int total = 0, pos[256];
    int *chains;

    for (int b = 0; b < 256; b++)
        chains_p[b] = NULL;
    for (int k = 0; k < tj->n_added; k++)
        if (tj->added[k].normalized == normalized &&
            tj->added[k].pat_len > 0)
            counts[(uint8_t)tj->added[k].pat[0]]++;
    for (int b = 0; b < 256; b++) {
        pos[b] = total;
        total += counts[b] > 0 ? counts[b] + 1 : 0;
    }
    chains = tj_arena_alloc(tj, ((size_t)total + 1) * sizeof(int));
    if (chains == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "added tokens");
    for (int b = 0; b < 256; b++)
        if (counts[b] > 0)
            chains_p[b] = chains + pos[b];
    for (int k = 0; k < tj->n_added; k++)
        if (tj->added[k].normalized == normalized &&
            tj->added[k].pat_len > 0)
            chains[pos[(uint8_t)tj->added[k].pat[0]]++] = k;
    for (int b = 0; b < 256; b++)
        if (counts[b] > 0)
            chains[pos[b]] = -1;
    total = 0;
    for (int b = 0; b < 256; b++)
        total += counts[b];
    if (normalized)
        tj->n_norm_added = total;
    else
        tj->n_raw_added = total;
    return BT_OK;
}

/* Gives each normalized added token its pattern (its content through the
 * normalizer, as the library's refresh_added_tokens does), sorts the added
 * tokens by pattern length and builds both lookup sets.  Called once the
 * normalizer and added_tokens are loaded. */
static bt_status_t tj_prepare_added(tokjson_t *tj)
{
    tj_work_t w;
    bt_status_t status = BT_OK;

    memset(&w, 0, sizeof(w));
    for (int k = 0; k < tj->n_added && tj->n_norms > 0; k++) {
        tj_added_t *a = &tj->added[k];
        if (!a->normalized)
            continue;
        status = tj_load_text(&w, a->text, (size_t)a->len);
        if (status == BT_OK)
            status = tj_normalize(tj, &w);
        if (status != BT_OK)
            goto out;
        if (w.text_len > (size_t)INT_MAX) {
            status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                              "added token %d is too long", a->id);
            goto out;
        }
        a->pat_len = (int)w.text_len;
        a->pat = tj_arena_str(tj, w.text[w.cur], w.text_len);
        if (a->pat == NULL) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "added tokens");
            goto out;
        }
    }
    qsort(tj->added, (size_t)tj->n_added, sizeof(*tj->added), tj_added_cmp);
    status = tj_chain_added(tj, false, tj->added_first);
    if (status == BT_OK)
        status = tj_chain_added(tj, true, tj->nadded_first);
out:
    bt_free(w.norm);
    bt_free(w.ucs);
    bt_free(w.spans[0]);
    bt_free(w.text[1]);
    bt_free(w.text[0]);
    return status;
}

static void tj_work_free(tj_work_t *w)
{
    if (w->md != NULL)
        pcre2_match_data_free(w->md);
    bt_free(w->norm);
    bt_free(w->ucs);
    bt_free(w->heap);
    bt_free(w->syms);
    bt_free(w->matches);
    bt_free(w->spans[1]);
    bt_free(w->spans[0]);
    bt_free(w->text[1]);
    bt_free(w->text[0]);
}

bt_status_t tokjson_encode(const tokjson_t *tj, const char *text, size_t len,
                           bool add_bos, int **ids_p, int *n_p)
{
    tj_work_t w;
    bt_status_t status = BT_OK;
    size_t seg = 0, i = 0;

    if (tj == NULL || ids_p == NULL || n_p == NULL ||
        (text == NULL && len > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    if (len > (size_t)INT_MAX / 4)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                        "text of %zu bytes is too long to encode", len);
    memset(&w, 0, sizeof(w));
    w.md = pcre2_match_data_create(4, NULL);
    if (w.md == NULL || !tj_grow((void **)&w.out, &w.out_cap, len / 3 + 16,
                                 sizeof(int), "tok_ids")) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "encode state");
        goto out;
    }
    if (add_bos && tj->bos_id >= 0)
        w.out[w.n_out++] = tj->bos_id;

    /* Added tokens marked normalized:false first, in the raw text: the
     * text between them is normalized, then cut at normalized ones. */
    while (i < len) {
        const tj_added_t *a =
            tj->n_raw_added > 0 ? tj_added_at(tj, tj->added_first, text, len,
                                              i)
                                : NULL;
        size_t start = i, end;
        if (a == NULL) {
            i++;
            continue;
        }
        end = i + (size_t)a->len;
        if (a->lstrip)
            while (start > seg && tj_is_space(text[start - 1]))
                start--;
        if (a->rstrip)
            while (end < len && tj_is_space(text[end]))
                end++;
        status = tj_encode_segment(tj, &w, text + seg, start - seg, seg == 0);
        if (status != BT_OK)
            goto out;
        if (!tj_out_push(&w, a->id)) {
            status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "ids");
            goto out;
        }
        seg = i = end;
    }
    status = tj_encode_segment(tj, &w, text + seg, len - seg, seg == 0);

out:
    if (status == BT_OK) {
        *ids_p = w.out;
        *n_p = (int)w.n_out;
        if (w.out == NULL) { /* empty text: still a valid array */
            *ids_p = bt_malloc(sizeof(int), "tok_ids");
            if (*ids_p == NULL)
                status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "ids");
        }
    } else {
        bt_free(w.out);
    }
    tj_work_free(&w);
    return status;
}

// ----------------------------------------------------------------------------
// decoding

void tokjson_id_bytes(const tokjson_t *tj, int prev_id, int id,
                      const char **s_p, size_t *n_p)
{
    const char *s = tj->bytes[id];
    size_t n = (size_t)tj->bytes_lens[id];

    if (tj->skip_special && (tj->flags[id] & TJ_F_SPECIAL)) {
        *s_p = s;
        *n_p = 0;
        return;
    }
    /* Strip/Metaspace remove the space that starts a sequence; after a
     * skipped special token (BOS) the sequence's text starts here too. */
    if (tj->strip_start > 0 && n > 0 && s[0] == ' ' &&
        (prev_id < 0 || (prev_id < tj->vocab_size && tj->skip_special &&
                         (tj->flags[prev_id] & TJ_F_SPECIAL)))) {
        s++;
        n--;
    }
    *s_p = s;
    *n_p = n;
}

// ----------------------------------------------------------------------------
// tok_* extensions (tokenizer.h)

/* Reads `dir/name` when it exists; *data_p stays NULL when it does not. */
static bt_status_t tj_read_beside(const char *dir, const char *name,
                                  size_t max_bytes, char **data_p,
                                  size_t *len_p)
{
    char path[4096];
    FILE *f;

    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >=
        (int)sizeof(path))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "path too long: %s", dir);
    f = fopen(path, "rb");
    if (f == NULL)
        return BT_OK;
    fclose(f);
    return bt_read_file(path, max_bytes, data_p, len_p);
}

/* Counts the pieces of a llama2.c tokenizer file (0: not that format). */
static int tj_count_llama2c(const char *data, size_t len)
{
    size_t off = 4;
    int n = 0;

    while (off < len) {
        uint32_t pl;
        if (len - off < 8 || n >= (1 << 26))
            return 0;
        memcpy(&pl, data + off + 4, 4);
        if (pl > TOKJSON_MAX_PIECE_LEN || len - off - 8 < pl)
            return 0;
        off += 8 + pl;
        n++;
    }
    return n;
}

/* tok_identity of a tokenizer.json tokenizer: every byte read, each
 * file's length first so that bytes cannot move between files unseen. */
static uint64_t tj_identity(const char *json, size_t len, const char *cfg,
                            size_t cfg_len, const char *gen, size_t gen_len)
{
    uint64_t id = tok__digest(0, "tokenizer.json", 14);

    id = tok__digest(id, &len, sizeof(len));
    id = tok__digest(id, json, len);
    id = tok__digest(id, &cfg_len, sizeof(cfg_len));
    id = tok__digest(id, cfg, cfg_len);
    id = tok__digest(id, &gen_len, sizeof(gen_len));
    return tok__digest(id, gen, gen_len);
}

bt_status_t tok_load(const char *path, int vocab_size, tok_t **tok_p)
{
    char dir[4096];
    char *data = NULL, *cfg = NULL, *gen = NULL;
    size_t len = 0, cfg_len = 0, gen_len = 0, i = 0;
    uint64_t id;
    const char *file = path;
    char file_buf[4096];
    bt_status_t status;
    tokjson_t *tj = NULL;
    FILE *f;

    if (path == NULL || tok_p == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    if (strlen(path) + 32 >= sizeof(dir))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "path too long");
    /* A directory holds tokenizer.json; a file is either format. */
    snprintf(file_buf, sizeof(file_buf), "%s/tokenizer.json", path);
    f = fopen(file_buf, "rb");
    if (f != NULL) {
        fclose(f);
        file = file_buf;
        snprintf(dir, sizeof(dir), "%s", path);
    } else {
        const char *slash = strrchr(path, '/');
        if (slash == NULL)
            snprintf(dir, sizeof(dir), ".");
        else
            snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
        if (dir[0] == '\0')
            snprintf(dir, sizeof(dir), "/");
    }
    status = bt_read_file(file, TJ_MAX_FILE_BYTES, &data, &len);
    if (status != BT_OK)
        return status;
    while (i < len && tj_is_space(data[i]))
        i++;
    if (i == len || data[i] != '{') { /* llama2.c format */
        if (vocab_size <= 0)
            vocab_size = tj_count_llama2c(data, len);
        status = tok_load_llama2c_mem(data, len, vocab_size, tok_p);
        bt_free(data);
        return status;
    }
    status = tj_read_beside(dir, "tokenizer_config.json", TJ_MAX_CONFIG_BYTES,
                            &cfg, &cfg_len);
    if (status == BT_OK)
        status = tj_read_beside(dir, "generation_config.json",
                                TJ_MAX_CONFIG_BYTES, &gen, &gen_len);
    if (status == BT_OK)
        status = tokjson_load_mem(data, len, cfg, cfg_len, gen, gen_len, &tj);
    id = tj_identity(data, len, cfg, cfg_len, gen, gen_len);
    bt_free(gen);
    bt_free(cfg);
    bt_free(data);
    if (status != BT_OK)
        return status;
    if (vocab_size > 0 && tj->vocab_size > vocab_size) {
        status = BT_ERROR(BT_ERR_FORMAT, "TOK",
                          "%s has ids up to %d but the model's vocab size "
                          "is %d", file, tj->vocab_size - 1, vocab_size);
        tokjson_destroy(&tj);
        return status;
    }
    BT_LOG_DEBUG("TOK", "loaded %s: %s, %d tokens, %d merges, %d added",
                 file, tokjson_kind_name(tj), tj->vocab_size, tj->n_merges,
                 tj->n_added);
    status = tok__create_json(tj, tok_p);
    if (status == BT_OK)
        tok__set_identity(*tok_p, id);
    return status;
}

bt_status_t tok_load_json_mem(const char *json, size_t len,
                              const char *config, size_t config_len,
                              tok_t **tok_p)
{
    tokjson_t *tj = NULL;
    bt_status_t status = tokjson_load_mem(json, len, config, config_len,
                                          NULL, 0, &tj);
    uint64_t id = tj_identity(json, len, config, config_len, NULL, 0);

    if (status != BT_OK)
        return status;
    status = tok__create_json(tj, tok_p);
    if (status == BT_OK)
        tok__set_identity(*tok_p, id);
    return status;
}

const char *tok_kind_name(const tok_t *tok)
{
    const tokjson_t *tj = tok__json(tok);
    return tj != NULL ? tokjson_kind_name(tj) : "llama2.c";
}

bool tok_adds_bos(const tok_t *tok)
{
    const tokjson_t *tj = tok__json(tok);
    return tj != NULL ? tokjson_adds_bos(tj) : true;
}

bool tok_adds_eos(const tok_t *tok)
{
    const tokjson_t *tj = tok__json(tok);
    return tj != NULL ? tokjson_adds_eos(tj) : false;
}

int tok_eos_ids(const tok_t *tok, int *ids, int cap)
{
    const tokjson_t *tj = tok__json(tok);

    if (tj != NULL)
        return tokjson_eos_ids(tj, ids, cap);
    if (cap < 1)
        return 0;
    ids[0] = tok_eos_id(tok);
    return 1;
}

int tok_token_id(const tok_t *tok, const char *piece)
{
    const tokjson_t *tj = tok__json(tok);

    if (piece == NULL)
        return -1;
    if (tj != NULL)
        return tokjson_token_id(tj, piece);
    for (int id = 0; id < tok_vocab_size(tok); id++)
        if (strcmp(tok_piece(tok, id), piece) == 0)
            return id;
    return -1;
}

bool tok_is_special(const tok_t *tok, int id)
{
    const tokjson_t *tj = tok__json(tok);

    if (tj != NULL)
        return tokjson_is_special(tj, id);
    return id == tok_bos_id(tok) || id == tok_eos_id(tok) || id == 0;
}

void tok_set_skip_special(tok_t *tok, bool skip)
{
    tokjson_t *tj = tok__json(tok);
    if (tj != NULL)
        tokjson_set_skip_special(tj, skip);
}

const char *tok_chat_template(const tok_t *tok)
{
    const tokjson_t *tj = tok__json(tok);
    return tj != NULL ? tokjson_chat_template(tj) : NULL;
}
