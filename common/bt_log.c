/*
 * bt_log.c - one-line logs to stderr with level and subsystem filters.
 *
 * The configuration is read once from the environment; writes are a
 * single fprintf of a fully formatted line so that lines from several
 * threads or processes never interleave mid-line.
 */
#include "bt_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* Process-wide logging configuration: set in main (bt_log_init) before
 * threads start, read-only afterwards. */
static struct {
    bt_log_level_t level;
    char role[32];
    char subsys[256]; /* ",SCHED,KV," or "" for all */
} bt_log_cfg = { BT_LOG_LEVEL_WARN, "baton", "" };

static const char *bt_log_level_names[] = {
    "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"
};

void bt_log_init(const char *role)
{
    const char *env;

    if (role != NULL)
        snprintf(bt_log_cfg.role, sizeof(bt_log_cfg.role), "%s", role);
    env = getenv("BT_LOG");
    if (env != NULL) {
        for (int i = 0; i <= BT_LOG_LEVEL_TRACE; i++) {
            if (strcasecmp(env, bt_log_level_names[i]) == 0)
                bt_log_cfg.level = (bt_log_level_t)i;
        }
    }
    env = getenv("BT_LOG_SUBSYS");
    if (env != NULL && env[0] != '\0')
        snprintf(bt_log_cfg.subsys, sizeof(bt_log_cfg.subsys), ",%s,", env);
}

void bt_log_set_level(bt_log_level_t level)
{
    bt_log_cfg.level = level;
}

bool bt_log_is_enabled(bt_log_level_t level, const char *subsys)
{
    char key[64];

    if (level > bt_log_cfg.level)
        return false;
    if (level <= BT_LOG_LEVEL_WARN || bt_log_cfg.subsys[0] == '\0' ||
        subsys == NULL)
        return true;
    snprintf(key, sizeof(key), ",%s,", subsys);
    return strcasestr(bt_log_cfg.subsys, key) != NULL;
}

void bt_log_write(bt_log_level_t level, const char *subsys, const char *file,
                  int line, const char *func, const char *fmt, ...)
{
    char msg[1024];
    char where[160] = "";
    struct timespec ts;
    struct tm tm;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    if (level <= BT_LOG_LEVEL_WARN) {
        const char *base = strrchr(file, '/');
        snprintf(where, sizeof(where), " %s:%d:%s",
                 base ? base + 1 : file, line, func);
    }
    fprintf(stderr, "%02d:%02d:%02d.%06ld %s[%d] %s %s%s: %s\n", tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, bt_log_cfg.role,
            (int)getpid(), bt_log_level_names[level], subsys ? subsys : "-",
            where, msg);
}
