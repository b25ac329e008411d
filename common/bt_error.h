/*
 * bt_error.h - the message behind a failed status.
 *
 * A function that detects an error records it once with BT_ERROR(), which
 * logs it at ERROR level and keeps the text in a per-thread slot; callers
 * just propagate the status and a top level (a CLI, a request handler) can
 * fetch the text with bt_error_last() to put it in a reply.  The macro
 * evaluates to the status, so `return BT_ERROR(BT_ERR_FORMAT, "MODEL",
 * "tensor %s truncated", name);` is the usual form.
 */
#ifndef BT_COMMON_ERROR_H
#define BT_COMMON_ERROR_H

#include "bt_log.h"
#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

bt_status_t bt_error_record(bt_status_t status, const char *subsys,
                            const char *file, int line, const char *func,
                            const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The message of the last error recorded on this thread ("" if none). */
const char *bt_error_last(void);

/* Forgets the last error (start of a new request or test case). */
void bt_error_clear(void);

#define BT_ERROR(_status, _sub, ...)                                        \
    bt_error_record(_status, _sub, __FILE__, __LINE__, __func__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_ERROR_H */
