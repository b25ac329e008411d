/*
 * bt_log.h - leveled, subsystem-filtered, one-line logs to stderr.
 *
 * Levels (what they promise):
 *   FATAL  the process is about to abort
 *   ERROR  an operation failed and the error is returned to the caller
 *   WARN   something is wrong but we continue
 *   INFO   lifecycle events an operator wants to see
 *   DEBUG  detail for developers
 *   TRACE  per-token / per-message detail, compiled out unless
 *          BT_ENABLE_TRACE is defined
 *
 * Runtime control:  BT_LOG=debug  BT_LOG_SUBSYS=SCHED,KV,NET
 * Every line carries time, role, pid and, for WARN and above, file:line:func.
 * The level is checked before any formatting happens.
 */
#ifndef BT_COMMON_LOG_H
#define BT_COMMON_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BT_LOG_LEVEL_FATAL = 0,
    BT_LOG_LEVEL_ERROR,
    BT_LOG_LEVEL_WARN,
    BT_LOG_LEVEL_INFO,
    BT_LOG_LEVEL_DEBUG,
    BT_LOG_LEVEL_TRACE
} bt_log_level_t;

/* Reads BT_LOG / BT_LOG_SUBSYS and sets the role name shown on each line
 * ("router", "prefill", "baton"...).  Safe to call more than once. */
void bt_log_init(const char *role);

/* Overrides the level (tests and CLIs with --verbose / --quiet). */
void bt_log_set_level(bt_log_level_t level);

/* True when a message of this level and subsystem would be printed. */
bool bt_log_is_enabled(bt_log_level_t level, const char *subsys);

void bt_log_write(bt_log_level_t level, const char *subsys, const char *file,
                  int line, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#define BT_LOG_AT(_lvl, _sub, ...)                                          \
    do {                                                                    \
        if (bt_log_is_enabled(_lvl, _sub))                                  \
            bt_log_write(_lvl, _sub, __FILE__, __LINE__, __func__,          \
                         __VA_ARGS__);                                      \
    } while (0)

#define BT_LOG_FATAL(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_FATAL, _sub, __VA_ARGS__)
#define BT_LOG_ERROR(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_ERROR, _sub, __VA_ARGS__)
#define BT_LOG_WARN(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_WARN, _sub, __VA_ARGS__)
#define BT_LOG_INFO(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_INFO, _sub, __VA_ARGS__)
#define BT_LOG_DEBUG(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_DEBUG, _sub, __VA_ARGS__)
#ifdef BT_ENABLE_TRACE
#define BT_LOG_TRACE(_sub, ...) BT_LOG_AT(BT_LOG_LEVEL_TRACE, _sub, __VA_ARGS__)
#else
#define BT_LOG_TRACE(_sub, ...) do { } while (0)
#endif

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_LOG_H */
