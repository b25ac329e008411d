/* bt_buf.c - a growable byte string (see bt_buf.h). */
#include "bt_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"

void bt_buf_init(bt_buf_t *buf)
{
    memset(buf, 0, sizeof(*buf));
}

void bt_buf_cleanup(bt_buf_t *buf)
{
    bt_free(buf->data);
    memset(buf, 0, sizeof(*buf));
}

bt_status_t bt_buf_reserve(bt_buf_t *buf, size_t extra)
{
    size_t need = buf->len + extra + 1;
    size_t cap;
    char *data;

    if (need < buf->len)
        return BT_ERR_NO_MEMORY; /* overflow */
    if (need <= buf->cap)
        return BT_OK;
    cap = buf->cap < 256 ? 256 : buf->cap;
    while (cap < need)
        cap *= 2;
    data = bt_realloc(buf->data, cap, "bt_buf");
    if (data == NULL)
        return BT_ERR_NO_MEMORY;
    buf->data = data;
    buf->cap = cap;
    return BT_OK;
}

bt_status_t bt_buf_append(bt_buf_t *buf, const void *data,
                                size_t len)
{
    bt_status_t status = bt_buf_reserve(buf, len);

    if (status != BT_OK)
        return status;
    if (len > 0)
        memcpy(buf->data + buf->len, data, len);
    buf->len += len;
    buf->data[buf->len] = '\0';
    return BT_OK;
}

bt_status_t bt_buf_printf(bt_buf_t *buf, const char *fmt, ...)
{
    va_list ap;
    int n;
    bt_status_t status;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return BT_ERR_INTERNAL;
    status = bt_buf_reserve(buf, (size_t)n);
    if (status != BT_OK)
        return status;
    va_start(ap, fmt);
    vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf->len += (size_t)n;
    return BT_OK;
}

void bt_buf_consume(bt_buf_t *buf, size_t n)
{
    if (n >= buf->len) {
        buf->len = 0;
    } else {
        memmove(buf->data, buf->data + n, buf->len - n);
        buf->len -= n;
    }
    if (buf->data != NULL)
        buf->data[buf->len] = '\0';
}
