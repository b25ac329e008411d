/*
 * tokenizer.c - the llama2.c tokenizer format: loading, BPE encoding with
 * byte fallback, decoding and streaming detokenization.
 *
 * Encoding reproduces llama2.c's run.c `encode` id for id (BOS, dummy
 * prefix, code-point grouping of the raw bytes, byte fallback, then
 * "merge the best-scoring adjacent pair, leftmost on ties, until none
 * merges").  run.c rescans every pair after every merge, which is
 * quadratic; here the candidate pairs sit in a binary heap ordered by
 * (score desc, position asc) over a linked list of symbols, with stale
 * entries skipped lazily, so a 100 KB text encodes in milliseconds.
 * tests/tokenizer/test_tokenizer.c checks the two against each other.
 *
 * Decoding turns every id into bytes (a piece after BOS loses its leading
 * space, `<0xXX>` pieces are that raw byte, BOS itself prints nothing as
 * in run.c, which never prints it) and passes them through a strict UTF-8
 * validator: complete characters come out, an incomplete one is held, and
 * an invalid sequence becomes U+FFFD at once (one U+FFFD per maximal
 * invalid subpart, the WHATWG/Unicode practice).  A NUL byte is dropped,
 * because the outputs are C strings.
 */
#include "tokenizer.h"
#include "tokenizer_int.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_blockhash.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

/* Longest piece we accept (llama2 uses 27); bounds every stack buffer. */
#define TOK_MAX_PIECE_LEN 1024
/* Tokenizer files larger than this are refused by tok_load_llama2c. */
#define TOK_MAX_FILE_BYTES (256u << 20)
/* run.c's starting best_score: pieces scoring at or below it never merge. */
#define TOK_MIN_MERGE_SCORE (-1e10f)
/* Ids the llama2.c format reserves. */
#define TOK_UNK_ID 0
#define TOK_BOS_ID 1
#define TOK_EOS_ID 2
#define TOK_BYTE0_ID 3
#define TOK_N_RESERVED 259 /* unk, BOS, EOS and the 256 byte pieces */

struct tok_s {
    int vocab_size;      /* number of pieces */
    int max_piece_len;   /* max_token_length from the file header */
    char *blob;          /* all pieces, each NUL-terminated */
    const char **pieces; /* (vocab_size) piece bytes, into blob */
    int *piece_lens;     /* (vocab_size) piece byte lengths */
    float *scores;       /* (vocab_size) merge scores */
    int *hash_ids;       /* (hash_mask + 1) open-addressing table, -1 empty */
    uint32_t hash_mask;  /* table size - 1 (a power of two) */
    int space_id;        /* id of the piece " " (dummy prefix), -1 none */
    tokjson_t *json;     /* a tokenizer.json tokenizer: calls forward */
    uint64_t identity;   /* digest of the bytes it was loaded from */
};

/* Strict UTF-8 validator state carried between pushes. */
typedef struct {
    uint8_t held[4]; /* bytes of the unfinished character */
    int n_held;      /* how many are in held[] */
    int need;        /* continuation bytes still expected */
    uint8_t lo;      /* allowed range of the next continuation byte */
    uint8_t hi;
} tok_utf8_t;

struct tok_stream_s {
    const tok_t *tok; /* borrowed; must outlive the stream */
    int prev_id;      /* last id pushed (or the creation prev_id) */
    tok_utf8_t utf8;  /* partial character held across pushes */
    bool skip_special; /* special ids print nothing (as if absent) */
};

// ----------------------------------------------------------------------------
// piece lookup

static uint32_t tok_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

/* The lowest id whose piece is exactly s[0..n), or -1. */
static int tok_lookup(const tok_t *tok, const char *s, size_t n)
{
    uint32_t slot = tok_hash(s, n) & tok->hash_mask;
    int id;

    while ((id = tok->hash_ids[slot]) >= 0) {
        if ((size_t)tok->piece_lens[id] == n &&
            memcmp(tok->pieces[id], s, n) == 0)
            return id;
        slot = (slot + 1) & tok->hash_mask;
    }
    return -1;
}

/* Inserts ids in increasing order; a duplicate piece keeps the lower id,
 * which is what run.c's linear str_lookup would find. */
static void tok_hash_insert(tok_t *tok, int id)
{
    const char *s = tok->pieces[id];
    size_t n = (size_t)tok->piece_lens[id];
    uint32_t slot = tok_hash(s, n) & tok->hash_mask;
    int other;

    while ((other = tok->hash_ids[slot]) >= 0) {
        if ((size_t)tok->piece_lens[other] == n &&
            memcmp(tok->pieces[other], s, n) == 0)
            return;
        slot = (slot + 1) & tok->hash_mask;
    }
    tok->hash_ids[slot] = id;
}

// ----------------------------------------------------------------------------
// loading

static int32_t tok_rd_i32(const uint8_t *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                 (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t out;
    memcpy(&out, &v, sizeof(out));
    return out;
}

static float tok_rd_f32(const uint8_t *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                 (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float out;
    memcpy(&out, &v, sizeof(out));
    return out;
}

static int tok_hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The byte of a "<0xXX>" piece, or -1 for any other piece. */
static int tok_byte_piece(const char *s, size_t n)
{
    int hi, lo;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    hi = tok_hex_val(s[3]);
    lo = tok_hex_val(s[4]);
    if (hi < 0 || lo < 0)
        return -1;
    return hi * 16 + lo;
}

/* Checks the whole layout before allocating anything, so a corrupt header
 * cannot make us allocate a huge vocabulary.  Returns the total piece bytes
 * in *blob_bytes_p. */
static bt_status_t tok_validate(const uint8_t *d, size_t len, int vocab_size,
                                size_t *blob_bytes_p)
{
    size_t off = 4, blob_bytes = 0;
    int32_t max_len;

    if (len < 4)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer truncated at byte %zu: no max_token_length "
                        "header", len);
    max_len = tok_rd_i32(d);
    if (max_len < 1 || max_len > TOK_MAX_PIECE_LEN)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "tokenizer max_token_length %d out of range [1, %d]",
                        (int)max_len, TOK_MAX_PIECE_LEN);
    for (int i = 0; i < vocab_size; i++) {
        int32_t n;
        if (len - off < 8)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "piece %d truncated at byte %zu: score and "
                            "length need 8 bytes, %zu left (vocab_size %d)",
                            i, off, len - off, vocab_size);
        n = tok_rd_i32(d + off + 4);
        if (n < 0)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "piece %d has negative length %d at byte %zu", i,
                            (int)n, off + 4);
        if (n > max_len)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "piece %d length %d exceeds max_token_length %d "
                            "at byte %zu", i, (int)n, (int)max_len, off + 4);
        off += 8;
        if (len - off < (size_t)n)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "piece %d truncated at byte %zu: %d bytes "
                            "expected, %zu left", i, off, (int)n, len - off);
        if (i >= TOK_BYTE0_ID && i < TOK_N_RESERVED &&
            tok_byte_piece((const char *)d + off, (size_t)n) !=
                i - TOK_BYTE0_ID)
            return BT_ERROR(BT_ERR_FORMAT, "TOK",
                            "piece %d at byte %zu is not the byte-fallback "
                            "piece <0x%02X>", i, off, i - TOK_BYTE0_ID);
        off += (size_t)n;
        blob_bytes += (size_t)n + 1;
    }
    if (off != len)
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "%zu trailing bytes at byte offset %zu after piece "
                        "%d (wrong vocab_size %d?)", len - off, off,
                        vocab_size - 1, vocab_size);
    *blob_bytes_p = blob_bytes;
    return BT_OK;
}

bt_status_t tok_load_llama2c_mem(const void *data, size_t len, int vocab_size,
                                 tok_t **tok_p)
{
    const uint8_t *d = data;
    bt_status_t status;
    size_t blob_bytes = 0, off = 4, blob_off = 0;
    uint32_t hash_size = 1;
    tok_t *tok;

    if (tok_p == NULL || (data == NULL && len > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    if (vocab_size < TOK_N_RESERVED || vocab_size > (1 << 26))
        return BT_ERROR(BT_ERR_FORMAT, "TOK",
                        "vocab_size %d out of range [%d, %d] (ids 0-2 are "
                        "unk/BOS/EOS, 3-258 the byte pieces)", vocab_size,
                        TOK_N_RESERVED, 1 << 26);
    status = tok_validate(d, len, vocab_size, &blob_bytes);
    if (status != BT_OK)
        return status;

    tok = bt_calloc(1, sizeof(*tok), "tok");
    if (tok == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "tokenizer allocation");
    tok->vocab_size = vocab_size;
    tok->max_piece_len = tok_rd_i32(d);
    tok->space_id = -1;
    while (hash_size < 2u * (uint32_t)vocab_size)
        hash_size <<= 1;
    tok->hash_mask = hash_size - 1;
    tok->blob = bt_malloc(blob_bytes, "tok_pieces");
    tok->pieces = bt_calloc((size_t)vocab_size, sizeof(*tok->pieces),
                            "tok_pieces");
    tok->piece_lens = bt_calloc((size_t)vocab_size, sizeof(*tok->piece_lens),
                                "tok_pieces");
    tok->scores = bt_calloc((size_t)vocab_size, sizeof(*tok->scores),
                            "tok_pieces");
    tok->hash_ids = bt_malloc(hash_size * sizeof(*tok->hash_ids),
                              "tok_pieces");
    if (tok->blob == NULL || tok->pieces == NULL || tok->piece_lens == NULL ||
        tok->scores == NULL || tok->hash_ids == NULL) {
        status = BT_ERROR(BT_ERR_NO_MEMORY, "TOK",
                          "tokenizer tables for %d pieces", vocab_size);
        goto err_destroy;
    }
    memset(tok->hash_ids, 0xff, hash_size * sizeof(*tok->hash_ids));

    /* tok_validate checked every bound this loop relies on. */
    for (int i = 0; i < vocab_size; i++) {
        int n = tok_rd_i32(d + off + 4);
        tok->scores[i] = tok_rd_f32(d + off);
        off += 8;
        memcpy(tok->blob + blob_off, d + off, (size_t)n);
        tok->blob[blob_off + (size_t)n] = '\0';
        tok->pieces[i] = tok->blob + blob_off;
        tok->piece_lens[i] = n;
        off += (size_t)n;
        blob_off += (size_t)n + 1;
        tok_hash_insert(tok, i);
    }
    tok->space_id = tok_lookup(tok, " ", 1);
    tok->identity = tok__digest(tok__digest(0, "llama2.c", 8), data, len);
    *tok_p = tok;
    return BT_OK;

err_destroy:
    tok_destroy(&tok);
    return status;
}

bt_status_t tok_load_llama2c(const char *path, int vocab_size, tok_t **tok_p)
{
    bt_status_t status;
    char *data = NULL;
    size_t len = 0;

    if (path == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL tokenizer path");
    status = bt_read_file(path, TOK_MAX_FILE_BYTES, &data, &len);
    if (status != BT_OK)
        return status;
    status = tok_load_llama2c_mem(data, len, vocab_size, tok_p);
    if (status == BT_OK)
        BT_LOG_DEBUG("TOK", "loaded %s: %d pieces, max piece %d bytes", path,
                     vocab_size, (*tok_p)->max_piece_len);
    bt_free(data);
    return status;
}

bt_status_t tok__create_json(tokjson_t *tj, tok_t **tok_p)
{
    tok_t *tok = bt_calloc(1, sizeof(*tok), "tok");

    if (tok == NULL) {
        tokjson_destroy(&tj);
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "tokenizer allocation");
    }
    tok->json = tj;
    tok->vocab_size = tokjson_vocab_size(tj);
    tok->max_piece_len = tokjson_max_piece_len(tj);
    tok->space_id = -1;
    *tok_p = tok;
    return BT_OK;
}

uint64_t tok__digest(uint64_t prev, const void *data, size_t len)
{
    uint8_t key[16] = "baton tokenizer";
    bt_blockhash_t h;

    for (int i = 0; i < 8; i++)
        key[i] ^= (uint8_t)(prev >> (8 * i));
    h = bt_siphash128(key, data != NULL ? data : "", len);
    return h.lo != 0 ? h.lo : 1; /* 0 means "none" */
}

void tok__set_identity(tok_t *tok, uint64_t identity)
{
    tok->identity = identity;
}

uint64_t tok_identity(const tok_t *tok)
{
    return tok != NULL ? tok->identity : 0;
}

tokjson_t *tok__json(const tok_t *tok)
{
    return tok != NULL ? tok->json : NULL;
}

void tok_destroy(tok_t **tok_p)
{
    tok_t *tok;

    if (tok_p == NULL || *tok_p == NULL)
        return;
    tok = *tok_p;
    tokjson_destroy(&tok->json);
    bt_free(tok->hash_ids);
    bt_free(tok->scores);
    bt_free(tok->piece_lens);
    bt_free(tok->pieces);
    bt_free(tok->blob);
    bt_free(tok);
    *tok_p = NULL;
}

int tok_vocab_size(const tok_t *tok)
{
    return tok->vocab_size;
}

int tok_bos_id(const tok_t *tok)
{
    if (tok->json != NULL)
        return tokjson_bos_id(tok->json);
    return TOK_BOS_ID;
}

int tok_eos_id(const tok_t *tok)
{
    if (tok->json != NULL)
        return tokjson_eos_id(tok->json);
    return TOK_EOS_ID;
}

int tok_max_piece_len(const tok_t *tok)
{
    return tok->max_piece_len;
}

const char *tok_piece(const tok_t *tok, int id)
{
    if (tok == NULL || id < 0 || id >= tok->vocab_size)
        return NULL;
    if (tok->json != NULL)
        return tokjson_piece(tok->json, id);
    return tok->pieces[id];
}

float tok_score(const tok_t *tok, int id)
{
    if (tok == NULL || id < 0 || id >= tok->vocab_size || tok->json != NULL)
        return 0.0f;
    return tok->scores[id];
}

// ----------------------------------------------------------------------------
// encoding

/* One symbol of the text being merged; symbols form a doubly linked list
 * in text order. */
typedef struct {
    int id;       /* current piece */
    int prev;     /* previous live symbol, -1 at the start */
    int next;     /* next live symbol, -1 at the end */
    uint32_t ver; /* bumped when the symbol changes or dies */
} tok_sym_t;

/* A candidate merge of symbols left and right into piece id. */
typedef struct {
    float score;    /* scores[id] */
    int left;       /* left symbol; its index orders ties (leftmost first) */
    int right;      /* right symbol */
    int id;         /* merged piece */
    uint32_t ver_l; /* versions when queued: stale entries are skipped */
    uint32_t ver_r;
} tok_pair_t;

typedef struct {
    tok_pair_t *items; /* (cap) binary max-heap */
    size_t n;          /* entries in use */
    size_t cap;        /* capacity */
} tok_heap_t;

/* True when a must pop before b: higher score, then leftmost. */
static bool tok_pair_before(const tok_pair_t *a, const tok_pair_t *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    return a->left < b->left;
}

static void tok_heap_push(tok_heap_t *h, const tok_pair_t *p)
{
    size_t i = h->n++;

    BT_ASSERT(h->n <= h->cap);
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!tok_pair_before(p, &h->items[parent]))
            break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = *p;
}

static tok_pair_t tok_heap_pop(tok_heap_t *h)
{
    tok_pair_t top = h->items[0];
    tok_pair_t last = h->items[--h->n];
    size_t i = 0;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && tok_pair_before(&h->items[c + 1], &h->items[c]))
            c++;
        if (!tok_pair_before(&h->items[c], &last))
            break;
        h->items[i] = h->items[c];
        i = c;
    }
    if (h->n > 0)
        h->items[i] = last;
    return top;
}

/* Queues the merge of symbols l and r when their concatenation is a piece
 * that run.c would accept (score above its -1e10 starting best).  buf
 * holds max_piece_len bytes (scratch for the concatenation). */
static void tok_queue_pair(const tok_t *tok, const tok_sym_t *syms, int l,
                           int r, char *buf, tok_heap_t *heap)
{
    size_t nl, nr;
    tok_pair_t p;
    int id;

    if (l < 0 || r < 0)
        return;
    nl = (size_t)tok->piece_lens[syms[l].id];
    nr = (size_t)tok->piece_lens[syms[r].id];
    if (nl + nr > (size_t)tok->max_piece_len)
        return; /* longer than any piece */
    memcpy(buf, tok->pieces[syms[l].id], nl);
    memcpy(buf + nl, tok->pieces[syms[r].id], nr);
    id = tok_lookup(tok, buf, nl + nr);
    if (id < 0 || !(tok->scores[id] > TOK_MIN_MERGE_SCORE))
        return;
    p.score = tok->scores[id];
    p.left = l;
    p.right = r;
    p.id = id;
    p.ver_l = syms[l].ver;
    p.ver_r = syms[r].ver;
    tok_heap_push(heap, &p);
}

/* Appends the initial symbols of text (run.c's code-point grouping: a
 * non-continuation byte plus up to three following continuation bytes),
 * each looked up as a piece or else split into byte-fallback ids. */
static int tok_initial_ids(const tok_t *tok, const char *text, size_t len,
                           int *ids, int n)
{
    char buf[4];
    size_t blen = 0;

    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)text[i];
        int id;

        if ((c & 0xC0) != 0x80)
            blen = 0;
        buf[blen++] = (char)c;
        if (i + 1 < len && ((uint8_t)text[i + 1] & 0xC0) == 0x80 && blen < 4)
            continue;
        id = tok_lookup(tok, buf, blen);
        if (id >= 0) {
            ids[n++] = id;
        } else {
            for (size_t b = 0; b < blen; b++)
                ids[n++] = (uint8_t)buf[b] + TOK_BYTE0_ID;
        }
        blen = 0;
    }
    return n;
}

bt_status_t tok_encode(const tok_t *tok, const char *text, size_t len,
                       bool add_bos, int **ids_p, int *n_p)
{
    tok_heap_t heap = {NULL, 0, 0};
    tok_sym_t *syms = NULL;
    char *buf = NULL;
    int *ids;
    int n = 0;
    int n_out = 0;

    if (tok == NULL || ids_p == NULL || n_p == NULL ||
        (text == NULL && len > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    if (tok->json != NULL)
        return tokjson_encode(tok->json, text, len, add_bos, ids_p, n_p);
    if (len > (size_t)INT_MAX / 4)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                        "text of %zu bytes is too long to encode", len);
    ids = bt_malloc((len + 2) * sizeof(*ids), "tok_ids");
    if (ids == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "ids for %zu bytes", len);

    if (add_bos)
        ids[n++] = TOK_BOS_ID;
    if (len > 0) /* the dummy prefix; run.c assumes " " is a piece */
        ids[n++] = tok->space_id >= 0 ? tok->space_id : ' ' + TOK_BYTE0_ID;
    n = tok_initial_ids(tok, text, len, ids, n);
    if (n < 2)
        goto out;

    /* Each merge queues at most two new pairs: n - 1 + 2 * (n - 1). */
    syms = bt_malloc((size_t)n * sizeof(*syms), "tok_encode");
    heap.cap = 3 * (size_t)n;
    heap.items = bt_malloc(heap.cap * sizeof(*heap.items), "tok_encode");
    buf = bt_malloc((size_t)tok->max_piece_len, "tok_encode");
    if (syms == NULL || heap.items == NULL || buf == NULL) {
        bt_free(buf);
        bt_free(syms);
        bt_free(heap.items);
        bt_free(ids);
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "merge state for %d ids", n);
    }
    for (int i = 0; i < n; i++) {
        syms[i].id = ids[i];
        syms[i].prev = i - 1;
        syms[i].next = i + 1 < n ? i + 1 : -1;
        syms[i].ver = 0;
    }
    for (int i = 0; i + 1 < n; i++)
        tok_queue_pair(tok, syms, i, i + 1, buf, &heap);

    while (heap.n > 0) {
        tok_pair_t p = tok_heap_pop(&heap);
        tok_sym_t *l = &syms[p.left];
        tok_sym_t *r = &syms[p.right];

        if (l->ver != p.ver_l || r->ver != p.ver_r)
            continue; /* one side merged since this pair was queued */
        BT_ASSERT(l->next == p.right);
        l->id = p.id;
        l->ver++;
        r->ver++; /* dead */
        l->next = r->next;
        if (r->next >= 0)
            syms[r->next].prev = p.left;
        tok_queue_pair(tok, syms, l->prev, p.left, buf, &heap);
        tok_queue_pair(tok, syms, p.left, l->next, buf, &heap);
    }
    for (int i = 0; i >= 0; i = syms[i].next)
        ids[n_out++] = syms[i].id;
    n = n_out;
    bt_free(buf);
    bt_free(heap.items);
    bt_free(syms);

out:
    *ids_p = ids;
    *n_p = n;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// decoding

/* The bytes an id prints as, following prev_id (run.c's `decode`). */
static void tok_id_bytes(const tok_t *tok, int prev_id, int id,
                         const char **s_p, size_t *n_p, char *byte_buf)
{
    const char *s;
    size_t n;
    int byte;

    if (tok->json != NULL) {
        tokjson_id_bytes(tok->json, prev_id, id, s_p, n_p);
        return;
    }
    s = tok->pieces[id];
    n = (size_t)tok->piece_lens[id];
    if (id == TOK_BOS_ID) { /* a sequence delimiter, never printed */
        *s_p = s;
        *n_p = 0;
        return;
    }
    if (prev_id == TOK_BOS_ID && n > 0 && s[0] == ' ') {
        s++;
        n--;
    }
    byte = tok_byte_piece(s, n);
    if (byte >= 0) {
        byte_buf[0] = (char)byte;
        s = byte_buf;
        n = 1;
    }
    *s_p = s;
    *n_p = n;
}

bool tok_id_bytes_mid(const tok_t *tok, int id, const char **s_p,
                      size_t *n_p, char *byte_buf)
{
    if (id < 0 || id >= tok_vocab_size(tok))
        return false;
    /* prev_id: for llama2.c any id but BOS; for tokenizer.json one past
     * its ids, which neither starts a sequence nor is special */
    tok_id_bytes(tok, tok->json != NULL ? INT_MAX : -1, id, s_p, n_p,
                 byte_buf);
    return true;
}

static size_t tok_put_fffd(char *out)
{
    out[0] = (char)0xEF;
    out[1] = (char)0xBF;
    out[2] = (char)0xBD;
    return 3;
}

/* Feeds one byte to the validator; writes what becomes complete (at most
 * 6 bytes: U+FFFD for a broken prefix plus the byte itself re-read). */
static size_t tok_utf8_feed(tok_utf8_t *u, uint8_t b, char *out)
{
    size_t w = 0;

    if (u->need > 0) {
        if (b >= u->lo && b <= u->hi) {
            u->held[u->n_held++] = b;
            u->lo = 0x80;
            u->hi = 0xBF;
            if (--u->need == 0) {
                memcpy(out, u->held, (size_t)u->n_held);
                w = (size_t)u->n_held;
                u->n_held = 0;
            }
            return w;
        }
        /* Broken sequence: replace what is held, then re-read b. */
        w += tok_put_fffd(out);
        u->n_held = 0;
        u->need = 0;
    }
    if (b == 0x00)
        return w; /* NUL cannot travel in a C string */
    if (b < 0x80) {
        out[w++] = (char)b;
        return w;
    }
    u->lo = 0x80;
    u->hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        u->need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        u->need = 2;
        if (b == 0xE0)
            u->lo = 0xA0; /* no overlongs */
        else if (b == 0xED)
            u->hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        u->need = 3;
        if (b == 0xF0)
            u->lo = 0x90;
        else if (b == 0xF4)
            u->hi = 0x8F; /* <= U+10FFFF */
    } else {
        return w + tok_put_fffd(out + w); /* C0, C1, F5-FF, continuation */
    }
    u->held[0] = b;
    u->n_held = 1;
    return w;
}

/* Emits the held bytes of an unfinished character as one U+FFFD. */
static size_t tok_utf8_flush(tok_utf8_t *u, char *out)
{
    if (u->n_held == 0)
        return 0;
    u->n_held = 0;
    u->need = 0;
    return tok_put_fffd(out);
}

/* Worst-case output for n input bytes after up to 3 held ones. */
static size_t tok_utf8_bound(size_t n)
{
    return 3 * (n + 3);
}

static bt_status_t tok_check_id(const tok_t *tok, int id)
{
    if (id < 0 || id >= tok->vocab_size)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                        "token id %d out of range [0, %d)", id,
                        tok->vocab_size);
    return BT_OK;
}

bt_status_t tok_decode(const tok_t *tok, int prev_id, const int *ids, int n,
                       char **text_p)
{
    tok_utf8_t u = {{0}, 0, 0, 0x80, 0xBF};
    size_t cap = 64, len = 0;
    char *text;

    if (tok == NULL || text_p == NULL || n < 0 || (ids == NULL && n > 0))
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "bad decode arguments");
    for (int i = 0; i < n; i++) {
        bt_status_t status = tok_check_id(tok, ids[i]);
        if (status != BT_OK)
            return status;
    }
    text = bt_malloc(cap, "tok_text");
    if (text == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "decode buffer");
    for (int i = 0; i <= n; i++) {
        const char *s = NULL;
        char byte_buf[1];
        size_t sn = 0;

        if (i < n)
            tok_id_bytes(tok, prev_id, ids[i], &s, &sn, byte_buf);
        if (len + tok_utf8_bound(sn) + 1 > cap) {
            size_t new_cap = BT_MAX(2 * cap, len + tok_utf8_bound(sn) + 1);
            char *grown = bt_realloc(text, new_cap, "tok_text");
            if (grown == NULL) {
                bt_free(text);
                return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "decode buffer");
            }
            text = grown;
            cap = new_cap;
        }
        if (i == n) {
            len += tok_utf8_flush(&u, text + len);
            break;
        }
        for (size_t k = 0; k < sn; k++)
            len += tok_utf8_feed(&u, (uint8_t)s[k], text + len);
        prev_id = ids[i];
    }
    text[len] = '\0';
    *text_p = text;
    return BT_OK;
}

// ----------------------------------------------------------------------------
// streaming

bt_status_t tok_stream_create(const tok_t *tok, int prev_id,
                              tok_stream_t **stream_p)
{
    tok_stream_t *stream;

    if (tok == NULL || stream_p == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    stream = bt_calloc(1, sizeof(*stream), "tok_stream");
    if (stream == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, "TOK", "stream allocation");
    stream->tok = tok;
    stream->prev_id = prev_id;
    stream->utf8.lo = 0x80;
    stream->utf8.hi = 0xBF;
    *stream_p = stream;
    return BT_OK;
}

void tok_stream_set_skip_special(tok_stream_t *stream, bool skip)
{
    stream->skip_special = skip;
}

void tok_stream_destroy(tok_stream_t **stream_p)
{
    if (stream_p == NULL || *stream_p == NULL)
        return;
    bt_free(*stream_p);
    *stream_p = NULL;
}

bt_status_t tok_stream_push(tok_stream_t *stream, int id, char *out,
                            size_t cap, size_t *len_p)
{
    char tmp[3 * (TOK_MAX_PIECE_LEN + 3) + 1];
    tok_utf8_t u;
    const char *s;
    char byte_buf[1];
    size_t sn, len = 0;
    bt_status_t status;

    if (stream == NULL || out == NULL || len_p == NULL || cap == 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "NULL argument");
    status = tok_check_id(stream->tok, id);
    if (status != BT_OK)
        return status;
    if (stream->skip_special && tok_is_special(stream->tok, id)) {
        /* No text.  tokenizer.json: as if the id were not there (Hugging
         * Face drops special ids before decoding), so the next piece
         * follows the one before it.  llama2.c: the id still precedes
         * the next piece, so a leading space after BOS goes as in run.c
         * (only BOS decides it). */
        if (stream->tok->json == NULL)
            stream->prev_id = id;
        out[0] = '\0';
        *len_p = 0;
        return BT_OK;
    }
    tok_id_bytes(stream->tok, stream->prev_id, id, &s, &sn, byte_buf);
    /* Decode into tmp on a copy of the state and commit only if it fits,
     * so a too-small buffer leaves the stream unchanged. */
    u = stream->utf8;
    for (size_t k = 0; k < sn; k++)
        len += tok_utf8_feed(&u, (uint8_t)s[k], tmp + len);
    if (len + 1 > cap)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK",
                        "stream output of %zu bytes does not fit in %zu",
                        len, cap);
    memcpy(out, tmp, len);
    out[len] = '\0';
    stream->utf8 = u;
    stream->prev_id = id;
    *len_p = len;
    return BT_OK;
}

bt_status_t tok_stream_flush(tok_stream_t *stream, char *out, size_t cap,
                             size_t *len_p)
{
    if (stream == NULL || out == NULL || len_p == NULL || cap < 4)
        return BT_ERROR(BT_ERR_INVALID_ARG, "TOK", "bad flush arguments");
    *len_p = tok_utf8_flush(&stream->utf8, out);
    out[*len_p] = '\0';
    return BT_OK;
}
