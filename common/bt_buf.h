/*
 * bt_buf.h - a growable byte string (HTTP requests and responses, the
 * Prometheus text): the one buffer the router, the workers' metrics
 * server and baton-http share.  data[len] is NUL whenever data != NULL,
 * so a buffer holding text is also a C string.
 */
#ifndef BT_COMMON_BT_BUF_H
#define BT_COMMON_BT_BUF_H

#include <stddef.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *data;  /* (cap) bytes, bt_malloc'ed */
    size_t len;  /* bytes in use */
    size_t cap;  /* bytes allocated */
} bt_buf_t;

void bt_buf_init(bt_buf_t *buf);
void bt_buf_cleanup(bt_buf_t *buf);
/* Makes room for `extra` more bytes (+1 for the NUL). */
bt_status_t bt_buf_reserve(bt_buf_t *buf, size_t extra);
bt_status_t bt_buf_append(bt_buf_t *buf, const void *data, size_t len);
bt_status_t bt_buf_printf(bt_buf_t *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (consumed input, written output). */
void bt_buf_consume(bt_buf_t *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_BT_BUF_H */
