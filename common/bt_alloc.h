/*
 * bt_alloc.h - tracked host allocation.
 *
 * Every allocation names what it is for; live bytes are counted per name
 * so that bt_alloc_report() can print what is still held at exit and tests
 * can assert that nothing leaked (UCX memtrack).  Thread-safe.
 */
#ifndef BT_COMMON_ALLOC_H
#define BT_COMMON_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void *bt_malloc(size_t size, const char *name);
void *bt_calloc(size_t n, size_t size, const char *name);
/* Like realloc; `name` is used when ptr is NULL. */
void *bt_realloc(void *ptr, size_t size, const char *name);
/* 64-byte aligned (SIMD rows, cache lines); free with bt_free. */
void *bt_malloc_aligned(size_t size, const char *name);
char *bt_strdup(const char *s, const char *name);
char *bt_strndup(const char *s, size_t n, const char *name);
void bt_free(void *ptr);

/* Frees *ptr_p and sets it to NULL (NULL-safe). */
#define BT_FREE(_ptr) do { bt_free(_ptr); (_ptr) = NULL; } while (0)

/* Bytes and blocks currently allocated through bt_malloc & co. */
size_t bt_alloc_live_bytes(void);
size_t bt_alloc_live_count(void);

/* Logs every name that still holds memory; returns the live block count. */
size_t bt_alloc_report(void);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_ALLOC_H */
