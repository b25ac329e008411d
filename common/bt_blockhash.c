/*
 * bt_blockhash.c - SipHash-2-4-128 and the KV block-hash chain.
 *
 * SipHash follows the reference implementation (Aumasson & Bernstein,
 * github.com/veorq/SipHash siphash.c, outlen 16), written as a streaming
 * state so the chain hashes tokens without building a message buffer.
 * Every integer is fed little-endian, so the hashes are the same on any
 * host (docs/KV_EVENTS.md gives the byte format).
 */
#include "bt_blockhash.h"

#include <string.h>

/* The fixed, public key: the chain needs a PRF, not a secret. */
static const uint8_t blockhash_key[16] = {
    'b', 'a', 't', 'o', 'n', '-', 'k', 'v',
    '-', 'b', 'l', 'o', 'c', 'k', '-', '1',
};

typedef struct {
    uint64_t v0, v1, v2, v3; /* SipHash state */
    uint64_t tail;           /* bytes not yet forming a word, LE */
    size_t n_tail;           /* bytes in tail (0..7) */
    size_t len;              /* bytes fed so far */
} sip_state_t;

#define SIP_ROTL(_x, _b) (uint64_t)(((_x) << (_b)) | ((_x) >> (64 - (_b))))

static inline void sip_round(sip_state_t *s)
{
    s->v0 += s->v1;
    s->v1 = SIP_ROTL(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = SIP_ROTL(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = SIP_ROTL(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = SIP_ROTL(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = SIP_ROTL(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = SIP_ROTL(s->v2, 32);
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void sip_init(sip_state_t *s, const uint8_t key[16])
{
    uint64_t k0 = load_le64(key);
    uint64_t k1 = load_le64(key + 8);

    s->v0 = 0x736f6d6570736575ULL ^ k0;
    s->v1 = 0x646f72616e646f6dULL ^ k1 ^ 0xee; /* 0xee: 128-bit output */
    s->v2 = 0x6c7967656e657261ULL ^ k0;
    s->v3 = 0x7465646279746573ULL ^ k1;
    s->tail = 0;
    s->n_tail = 0;
    s->len = 0;
}

static inline void sip_word(sip_state_t *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    sip_round(s);
    s->v0 ^= m;
}

static void sip_update(sip_state_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;

    s->len += len;
    while (len > 0 && s->n_tail != 0) {
        s->tail |= (uint64_t)*p++ << (8 * s->n_tail);
        len--;
        if (++s->n_tail == 8) {
            sip_word(s, s->tail);
            s->tail = 0;
            s->n_tail = 0;
        }
    }
    for (; len >= 8; len -= 8, p += 8)
        sip_word(s, load_le64(p));
    for (; len > 0; len--)
        s->tail |= (uint64_t)*p++ << (8 * s->n_tail++);
}

/* Four bytes of v, little-endian. */
static void sip_u32(sip_state_t *s, uint32_t v)
{
    uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                     (uint8_t)(v >> 24) };

    sip_update(s, b, sizeof(b));
}

static void sip_u64(sip_state_t *s, uint64_t v)
{
    sip_u32(s, (uint32_t)v);
    sip_u32(s, (uint32_t)(v >> 32));
}

static bt_blockhash_t sip_final(sip_state_t *s)
{
    bt_blockhash_t h;

    sip_word(s, s->tail | ((uint64_t)s->len << 56));
    s->v2 ^= 0xee;
    for (int i = 0; i < 4; i++)
        sip_round(s);
    h.lo = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    s->v1 ^= 0xdd;
    for (int i = 0; i < 4; i++)
        sip_round(s);
    h.hi = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    return h;
}

bt_blockhash_t bt_siphash128(const uint8_t key[16], const void *data,
                             size_t len)
{
    sip_state_t s;

    sip_init(&s, key);
    sip_update(&s, data, len);
    return sip_final(&s);
}

// ----------------------------------------------------------------------------
// the chain

/* 0 is "none" on the wire: a real hash never reads as it. */
static bt_blockhash_t chain_final(sip_state_t *s)
{
    bt_blockhash_t h = sip_final(s);

    if (h.lo == 0)
        h.lo = 1;
    return h;
}

bt_blockhash_t bt_blockhash_identity(int block_size, const char *model_id,
                                     const char *kv_dtype)
{
    sip_state_t s;
    size_t n_model = strlen(model_id);
    size_t n_dtype = strlen(kv_dtype);

    sip_init(&s, blockhash_key);
    sip_update(&s, "I", 1);
    sip_u32(&s, (uint32_t)block_size);
    sip_u32(&s, (uint32_t)n_model);
    sip_update(&s, model_id, n_model);
    sip_u32(&s, (uint32_t)n_dtype);
    sip_update(&s, kv_dtype, n_dtype);
    return chain_final(&s);
}

bt_blockhash_t bt_blockhash_root(bt_blockhash_t identity, const void *salt,
                                 size_t salt_len)
{
    sip_state_t s;

    sip_init(&s, blockhash_key);
    sip_update(&s, "R", 1);
    sip_u64(&s, identity.lo);
    sip_u64(&s, identity.hi);
    sip_u32(&s, (uint32_t)salt_len);
    if (salt_len > 0)
        sip_update(&s, salt, salt_len);
    return chain_final(&s);
}

bt_blockhash_t bt_blockhash_next(bt_blockhash_t parent, const int *tokens,
                                 int n)
{
    sip_state_t s;

    sip_init(&s, blockhash_key);
    sip_update(&s, "B", 1);
    sip_u64(&s, parent.lo);
    sip_u64(&s, parent.hi);
    sip_u32(&s, (uint32_t)n);
    for (int i = 0; i < n; i++)
        sip_u32(&s, (uint32_t)tokens[i]);
    return chain_final(&s);
}

int bt_blockhash_chain(bt_blockhash_t root, const int *tokens, int n_tokens,
                       int block_size, bt_blockhash_t *out, int max_out)
{
    int k = block_size > 0 && n_tokens > 0 ? n_tokens / block_size : 0;
    bt_blockhash_t h = root;

    if (k > max_out)
        k = max_out;
    for (int i = 0; i < k; i++) {
        h = bt_blockhash_next(h, tokens + (size_t)i * (size_t)block_size,
                              block_size);
        out[i] = h;
    }
    return k < 0 ? 0 : k;
}

int bt_blockhash_chain64(bt_blockhash_t root, const int *tokens,
                         int n_tokens, int block_size, uint64_t *out,
                         int max_out)
{
    int k = block_size > 0 && n_tokens > 0 ? n_tokens / block_size : 0;
    bt_blockhash_t h = root;

    if (k > max_out)
        k = max_out;
    for (int i = 0; i < k; i++) {
        h = bt_blockhash_next(h, tokens + (size_t)i * (size_t)block_size,
                              block_size);
        out[i] = h.lo;
    }
    return k < 0 ? 0 : k;
}
