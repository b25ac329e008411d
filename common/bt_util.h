/*
 * bt_util.h - small helpers used everywhere: assertions that never compile
 * out, monotonic time, checked integer parsing, overflow-safe size math.
 */
#ifndef BT_COMMON_UTIL_H
#define BT_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_ARRAY_SIZE(_a) (sizeof(_a) / sizeof((_a)[0]))
#define BT_MIN(_a, _b) ((_a) < (_b) ? (_a) : (_b))
#define BT_MAX(_a, _b) ((_a) > (_b) ? (_a) : (_b))
#define BT_DIV_UP(_a, _b) (((_a) + (_b) - 1) / (_b))

void bt_assert_fail(const char *expr, const char *file, int line,
                    const char *func) __attribute__((noreturn));

/* Checks an invariant; never compiled out.  Not for validating input. */
#define BT_ASSERT(_expr)                                                    \
    do {                                                                    \
        if (!(_expr))                                                       \
            bt_assert_fail(#_expr, __FILE__, __LINE__, __func__);           \
    } while (0)

/* Monotonic clock. */
uint64_t bt_time_ns(void);
double bt_time_s(void);

/* 64 random bits from the kernel (getrandom), never 0; falls back to a
 * mix of the clocks and the pid when getrandom fails.  For identities
 * that must differ across processes and restarts (router instances,
 * worker routing ids, KV epochs), not for secrets. */
uint64_t bt_random_u64(void);

/* len bytes from the kernel's CSPRNG (getrandom), for secrets (KV
 * capabilities).  BT_ERR_IO when the kernel gives none: there is no
 * fallback, a predictable secret is worse than a refused request. */
bt_status_t bt_random_secret(void *buf, size_t len);

/* FNV-1a (64 bits) of p[0..n): the checksum that ends every KV pool and
 * window descriptor.  It catches corruption and authenticates nothing
 * (the capability and CURVE do that: docs/SECURITY.md). */
uint64_t bt_fnv1a64(const void *p, size_t n);

/* Writes bt_fnv1a64 of buf[0..len - 8) into buf's last 8 bytes, little
 * endian: a descriptor's trailer (the tests and fuzzers that forge one
 * reseal it so the parser's checks behind the checksum are reached). */
void bt_fnv1a64_seal(uint8_t *buf, size_t len);

/* Whether a[0..len) equals b[0..len), in time that depends on len only
 * (for comparing secrets: API keys, capabilities). */
bool bt_ct_equal(const void *a, const void *b, size_t len);

/* Whole-string parses; return BT_ERR_INVALID_ARG on junk or overflow. */
bt_status_t bt_parse_i64(const char *s, int64_t *out_p);
bt_status_t bt_parse_int(const char *s, int *out_p);
bt_status_t bt_parse_u64(const char *s, uint64_t *out_p);
bt_status_t bt_parse_double(const char *s, double *out_p);
bt_status_t bt_parse_float(const char *s, float *out_p);

/* Parses "1 2 3" or "1,2,3" into a newly bt_malloc'ed array (caller frees).
 * An empty list is an error. */
bt_status_t bt_parse_int_list(const char *s, int **vals_p, int *n_p);

/* a*b and a+b with overflow detection (false on overflow). */
bool bt_mul_overflow_size(size_t a, size_t b, size_t *out_p);
bool bt_add_overflow_size(size_t a, size_t b, size_t *out_p);

/* Reads a whole file into a bt_malloc'ed, NUL-terminated buffer. */
bt_status_t bt_read_file(const char *path, size_t max_bytes, char **data_p,
                         size_t *len_p);

/* Writes len bytes to path whole or not at all: into a temporary file
 * beside it (unique per process and call), then renamed over it, so a
 * reader never sees a partial file and concurrent writers each leave a
 * whole one (the last rename wins). */
bt_status_t bt_write_file(const char *path, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_UTIL_H */
