/*
 * bt_blockhash.h - the chained hash that names a full KV block by its
 * whole prefix (issue 38, prefix caching).
 *
 * Workers key their prefix cache with it and the router computes the same
 * chain for a prompt to ask "which worker holds how much of this?", so it
 * lives here in common/ (the router links no engine).  The exact byte
 * format is in docs/KV_EVENTS.md, for routers outside baton.
 *
 *   identity = H('I', block_size, model id, KV dtype)   per pool, salt-free
 *   root     = H('R', identity, salt)                    per tenant
 *   h[0]     = H('B', root,   tokens[0 .. bs))
 *   h[k]     = H('B', h[k-1], tokens[k*bs .. (k+1)*bs))
 *
 * H is SipHash-2-4 with 128-bit output under a fixed public key.  Why:
 * SipHash is a keyed PRF with no known structural collisions and is tiny
 * to implement identically anywhere (no dependency); 128 bits because the
 * worker trusts a hit to reuse KV: two different prefixes meet with
 * probability about M^2 / 2^129 over M distinct blocks ever cached
 * (1e12 blocks: 1.5e-15).  The wire (events, router index) carries the low
 * 64 bits: a collision there only misroutes a request, never changes an
 * output (about N / 2^64 per looked-up block against N indexed blocks).
 * The salt and the model identity sit in the root, so two tenants' chains
 * share nothing by construction, only by a 128-bit collision.
 *
 * A hash whose low 64 bits are 0 is bumped to 1: 0 means "none" on the
 * wire.  Pure functions, thread-safe.
 */
#ifndef BT_COMMON_BLOCKHASH_H
#define BT_COMMON_BLOCKHASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t lo; /* first 8 output bytes, little-endian; the wire hash */
    uint64_t hi; /* last 8 output bytes, little-endian */
} bt_blockhash_t;

/* SipHash-2-4, 128-bit output (the reference siphash() with outlen 16),
 * of `len` bytes under the 16-byte `key`.  Exposed for its test vectors. */
bt_blockhash_t bt_siphash128(const uint8_t key[16], const void *data,
                             size_t len);

/* The identity of a KV pool's contents: KV computed by one model at one
 * precision in blocks of one size is interchangeable, nothing else is.
 * `model_id` names the weights (e.g. name plus checksum), `kv_dtype` the
 * KV element type ("f32", "bf16"); both non-NULL. */
bt_blockhash_t bt_blockhash_identity(int block_size, const char *model_id,
                                     const char *kv_dtype);

/* The chain root of one tenant: `salt` (salt_len bytes, may be empty) is
 * the request's cache salt. */
bt_blockhash_t bt_blockhash_root(bt_blockhash_t identity, const void *salt,
                                 size_t salt_len);

/* The hash of the block holding tokens[0..n) after the prefix `parent`. */
bt_blockhash_t bt_blockhash_next(bt_blockhash_t parent, const int *tokens,
                                 int n);

/* Fills out[0..k) with the hashes of the first k full blocks of
 * tokens[0..n_tokens), k = min(n_tokens / block_size, max_out); returns
 * k.  A partial last block has no hash: it is never shared. */
int bt_blockhash_chain(bt_blockhash_t root, const int *tokens, int n_tokens,
                       int block_size, bt_blockhash_t *out, int max_out);

/* The same with only the wire (low 64-bit) hashes, for the router. */
int bt_blockhash_chain64(bt_blockhash_t root, const int *tokens,
                         int n_tokens, int block_size, uint64_t *out,
                         int max_out);

static inline bool bt_blockhash_eq(bt_blockhash_t a, bt_blockhash_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_BLOCKHASH_H */
