/*
 * bt_alloc.c - tracked allocation.
 *
 * Each block carries a 64-byte header (size, name, magic) in front of the
 * user pointer, which keeps the user pointer 64-byte aligned when the
 * underlying allocation is, and lets bt_free find the name to uncount.
 * Per-name totals live in a small fixed table guarded by a mutex; names
 * are string literals compared by pointer first, then by content.
 */
#include "bt_alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bt_log.h"
#include "bt_util.h"

#define BT_ALLOC_MAGIC 0xba70a110c8ed5eedULL
#define BT_ALLOC_HDR 64
#define BT_ALLOC_MAX_NAMES 256

typedef struct {
    uint64_t magic;
    size_t size;
    const char *name;
    int slot; /* index in the name table */
} bt_alloc_hdr_t;

typedef struct {
    const char *name;
    size_t bytes;
    size_t count;
} bt_alloc_name_t;

/* Process-wide allocation counters (tracking only; they do not own memory). */
static pthread_mutex_t bt_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static bt_alloc_name_t bt_alloc_names[BT_ALLOC_MAX_NAMES];
static int bt_alloc_n_names;
static size_t bt_alloc_bytes;
static size_t bt_alloc_count;

static int bt_alloc_slot(const char *name)
{
    for (int i = 0; i < bt_alloc_n_names; i++) {
        if (bt_alloc_names[i].name == name ||
            strcmp(bt_alloc_names[i].name, name) == 0)
            return i;
    }
    if (bt_alloc_n_names < BT_ALLOC_MAX_NAMES) {
        bt_alloc_names[bt_alloc_n_names].name = name;
        return bt_alloc_n_names++;
    }
    return BT_ALLOC_MAX_NAMES - 1; /* overflow bucket */
}

static void *bt_alloc_track(void *raw, size_t size, const char *name)
{
    bt_alloc_hdr_t *hdr = raw;

    if (raw == NULL)
        return NULL;
    if (name == NULL)
        name = "unnamed";
    hdr->magic = BT_ALLOC_MAGIC;
    hdr->size = size;
    hdr->name = name;
    pthread_mutex_lock(&bt_alloc_lock);
    hdr->slot = bt_alloc_slot(name);
    bt_alloc_names[hdr->slot].bytes += size;
    bt_alloc_names[hdr->slot].count++;
    bt_alloc_bytes += size;
    bt_alloc_count++;
    pthread_mutex_unlock(&bt_alloc_lock);
    return (char *)raw + BT_ALLOC_HDR;
}

static bt_alloc_hdr_t *bt_alloc_untrack(void *ptr)
{
    bt_alloc_hdr_t *hdr = (bt_alloc_hdr_t *)((char *)ptr - BT_ALLOC_HDR);

    BT_ASSERT(hdr->magic == BT_ALLOC_MAGIC);
    pthread_mutex_lock(&bt_alloc_lock);
    bt_alloc_names[hdr->slot].bytes -= hdr->size;
    bt_alloc_names[hdr->slot].count--;
    bt_alloc_bytes -= hdr->size;
    bt_alloc_count--;
    pthread_mutex_unlock(&bt_alloc_lock);
    hdr->magic = 0;
    return hdr;
}

void *bt_malloc(size_t size, const char *name)
{
    size_t total;

    if (bt_add_overflow_size(size, BT_ALLOC_HDR, &total))
        return NULL;
    return bt_alloc_track(aligned_alloc(BT_ALLOC_HDR,
                                        BT_DIV_UP(total, 64) * 64),
                          size, name);
}

void *bt_malloc_aligned(size_t size, const char *name)
{
    return bt_malloc(size, name);
}

void *bt_calloc(size_t n, size_t size, const char *name)
{
    size_t total;
    void *p;

    if (bt_mul_overflow_size(n, size, &total))
        return NULL;
    p = bt_malloc(total, name);
    if (p != NULL)
        memset(p, 0, total);
    return p;
}

void *bt_realloc(void *ptr, size_t size, const char *name)
{
    bt_alloc_hdr_t *hdr;
    void *p;

    if (ptr == NULL)
        return bt_malloc(size, name);
    hdr = (bt_alloc_hdr_t *)((char *)ptr - BT_ALLOC_HDR);
    BT_ASSERT(hdr->magic == BT_ALLOC_MAGIC);
    p = bt_malloc(size, hdr->name);
    if (p == NULL)
        return NULL;
    memcpy(p, ptr, BT_MIN(size, hdr->size));
    bt_free(ptr);
    return p;
}

char *bt_strndup(const char *s, size_t n, const char *name)
{
    size_t len = strnlen(s, n);
    char *p = bt_malloc(len + 1, name);

    if (p != NULL) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

char *bt_strdup(const char *s, const char *name)
{
    return bt_strndup(s, SIZE_MAX, name);
}

void bt_free(void *ptr)
{
    if (ptr != NULL)
        free(bt_alloc_untrack(ptr));
}

size_t bt_alloc_live_bytes(void)
{
    size_t v;

    pthread_mutex_lock(&bt_alloc_lock);
    v = bt_alloc_bytes;
    pthread_mutex_unlock(&bt_alloc_lock);
    return v;
}

size_t bt_alloc_live_count(void)
{
    size_t v;

    pthread_mutex_lock(&bt_alloc_lock);
    v = bt_alloc_count;
    pthread_mutex_unlock(&bt_alloc_lock);
    return v;
}

size_t bt_alloc_report(void)
{
    size_t count;

    pthread_mutex_lock(&bt_alloc_lock);
    count = bt_alloc_count;
    for (int i = 0; i < bt_alloc_n_names; i++) {
        if (bt_alloc_names[i].count != 0)
            BT_LOG_WARN("ALLOC", "leak: %s holds %zu bytes in %zu blocks",
                        bt_alloc_names[i].name, bt_alloc_names[i].bytes,
                        bt_alloc_names[i].count);
    }
    pthread_mutex_unlock(&bt_alloc_lock);
    return count;
}
