/* bt_util.c - assertions, clocks, checked parsing, file reading. */
#include "bt_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"

void bt_assert_fail(const char *expr, const char *file, int line,
                    const char *func)
{
    bt_log_write(BT_LOG_LEVEL_FATAL, "ASSERT", file, line, func,
                 "assertion failed: %s", expr);
    abort();
}

uint64_t bt_time_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t bt_random_u64(void)
{
    uint64_t v = 0;
    struct timespec ts;

    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
            ((uint64_t)getpid() << 40) ^ bt_time_ns();
        v ^= v >> 33;
        v *= 0xff51afd7ed558ccdull; /* splitmix finalizer */
        v ^= v >> 33;
    }
    return v != 0 ? v : 1;
}

bt_status_t bt_random_secret(void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return BT_ERROR(BT_ERR_IO, "UTIL", "getrandom: %s",
                            n < 0 ? strerror(errno) : "no bytes");
        p += n;
        len -= (size_t)n;
    }
    return BT_OK;
}

bool bt_ct_equal(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a;
    const volatile uint8_t *y = b;
    uint8_t d = 0;

    for (size_t i = 0; i < len; i++)
        d |= (uint8_t)(x[i] ^ y[i]);
    return d == 0;
}

double bt_time_s(void)
{
    return (double)bt_time_ns() * 1e-9;
}

bt_status_t bt_parse_i64(const char *s, int64_t *out_p)
{
    char *end;
    long long v;

    if (s == NULL || *s == '\0')
        return BT_ERR_INVALID_ARG;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return BT_ERR_INVALID_ARG;
    *out_p = v;
    return BT_OK;
}

bt_status_t bt_parse_int(const char *s, int *out_p)
{
    int64_t v;

    if (bt_parse_i64(s, &v) != BT_OK || v < INT_MIN || v > INT_MAX)
        return BT_ERR_INVALID_ARG;
    *out_p = (int)v;
    return BT_OK;
}

bt_status_t bt_parse_u64(const char *s, uint64_t *out_p)
{
    char *end;
    unsigned long long v;

    if (s == NULL || *s == '\0' || *s == '-')
        return BT_ERR_INVALID_ARG;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return BT_ERR_INVALID_ARG;
    *out_p = v;
    return BT_OK;
}

bt_status_t bt_parse_double(const char *s, double *out_p)
{
    char *end;
    double v;

    if (s == NULL || *s == '\0')
        return BT_ERR_INVALID_ARG;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return BT_ERR_INVALID_ARG;
    *out_p = v;
    return BT_OK;
}

bt_status_t bt_parse_float(const char *s, float *out_p)
{
    double v;

    if (bt_parse_double(s, &v) != BT_OK || fabs(v) > 3.4e38)
        return BT_ERR_INVALID_ARG;
    *out_p = (float)v;
    return BT_OK;
}

bt_status_t bt_parse_int_list(const char *s, int **vals_p, int *n_p)
{
    int cap = 16, n = 0;
    int *vals;
    const char *p = s;

    if (s == NULL)
        return BT_ERR_INVALID_ARG;
    vals = bt_malloc(sizeof(*vals) * (size_t)cap, "int_list");
    if (vals == NULL)
        return BT_ERR_NO_MEMORY;
    for (;;) {
        char tok[32];
        size_t len;
        int v;

        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            p++;
        if (*p == '\0')
            break;
        len = strcspn(p, " ,\t\n");
        if (len >= sizeof(tok))
            goto err_free;
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (bt_parse_int(tok, &v) != BT_OK)
            goto err_free;
        if (n == cap) {
            int *grown = bt_realloc(vals, sizeof(*vals) * (size_t)cap * 2,
                                    "int_list");
            if (grown == NULL)
                goto err_free;
            vals = grown;
            cap *= 2;
        }
        vals[n++] = v;
        p += len;
    }
    if (n == 0)
        goto err_free;
    *vals_p = vals;
    *n_p = n;
    return BT_OK;

err_free:
    bt_free(vals);
    return BT_ERR_INVALID_ARG;
}

bool bt_mul_overflow_size(size_t a, size_t b, size_t *out_p)
{
    return __builtin_mul_overflow(a, b, out_p);
}

bool bt_add_overflow_size(size_t a, size_t b, size_t *out_p)
{
    return __builtin_add_overflow(a, b, out_p);
}

bt_status_t bt_read_file(const char *path, size_t max_bytes, char **data_p,
                         size_t *len_p)
{
    struct stat st;
    char *data;
    size_t done = 0;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return BT_ERROR(BT_ERR_IO, "IO", "cannot open %s: %s", path,
                        strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return BT_ERROR(BT_ERR_IO, "IO", "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return BT_ERROR(BT_ERR_FORMAT, "IO", "%s is too large (%lld bytes)",
                        path, (long long)st.st_size);
    }
    data = bt_malloc((size_t)st.st_size + 1, "file_data");
    if (data == NULL) {
        close(fd);
        return BT_ERR_NO_MEMORY;
    }
    while (done < (size_t)st.st_size) {
        ssize_t r = read(fd, data + done, (size_t)st.st_size - done);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            bt_free(data);
            close(fd);
            return BT_ERROR(BT_ERR_IO, "IO", "cannot read %s", path);
        }
        done += (size_t)r;
    }
    close(fd);
    data[done] = '\0';
    *data_p = data;
    *len_p = done;
    return BT_OK;
}

bt_status_t bt_write_file(const char *path, const void *data, size_t len)
{
    static atomic_uint seq;
    char tmp[PATH_MAX];
    size_t done = 0;
    int fd;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%u", path,
                         (int)getpid(), atomic_fetch_add(&seq, 1)) >=
        sizeof(tmp))
        return BT_ERROR(BT_ERR_INVALID_ARG, "IO", "path too long: %s", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return BT_ERROR(BT_ERR_IO, "IO", "cannot create %s: %s", tmp,
                        strerror(errno));
    while (done < len) {
        ssize_t w = write(fd, (const char *)data + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return BT_ERROR(BT_ERR_IO, "IO", "cannot write %s: %s", tmp,
                            strerror(e));
        }
        done += (size_t)w;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return BT_ERROR(BT_ERR_IO, "IO", "cannot write %s: %s", path,
                        strerror(e));
    }
    return BT_OK;
}

uint64_t bt_fnv1a64(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void bt_fnv1a64_seal(uint8_t *buf, size_t len)
{
    uint64_t h;

    BT_ASSERT(len >= 8);
    h = bt_fnv1a64(buf, len - 8);
    for (int i = 0; i < 8; i++)
        buf[len - 8 + i] = (uint8_t)(h >> (8 * i));
}
