/* bt_error.c - per-thread record of the last error message. */
#include "bt_error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char bt_error_msg[512];

bt_status_t bt_error_record(bt_status_t status, const char *subsys,
                            const char *file, int line, const char *func,
                            const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(bt_error_msg, sizeof(bt_error_msg), fmt, ap);
    va_end(ap);
    if (bt_log_is_enabled(BT_LOG_LEVEL_ERROR, subsys))
        bt_log_write(BT_LOG_LEVEL_ERROR, subsys, file, line, func, "%s (%s)",
                     bt_error_msg, bt_status_str(status));
    return status;
}

const char *bt_error_last(void)
{
    return bt_error_msg;
}

void bt_error_clear(void)
{
    bt_error_msg[0] = '\0';
}
