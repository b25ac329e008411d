/*
 * bt_prom.c - shared Prometheus text exposition pieces (see bt_prom.h).
 */
#include "bt_prom.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bt_error.h"

/* Formats one piece of exposition text and hands it to `write`.  The
 * names and help texts are the processes' constants, so a piece that
 * does not fit is a programming error, reported as such. */
static bt_status_t prom_printf(bt_prom_write_fn write, void *out,
                               const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bt_status_t prom_printf(bt_prom_write_fn write, void *out,
                               const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(text))
        return BT_ERROR(BT_ERR_INTERNAL, "PROM", "metric text too long");
    return write(out, text, (size_t)n);
}

void bt_prom_hist_init(bt_prom_hist_t *h, const double *bounds, int n_bounds)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_bounds = n_bounds;
}

void bt_prom_hist_observe(bt_prom_hist_t *h, double v)
{
    int b = 0;

    while (b < h->n_bounds && v > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

bt_status_t bt_prom_header(const char *name, const char *type,
                           const char *help, bt_prom_write_fn write,
                           void *out)
{
    return prom_printf(write, out, "# HELP %s %s\n# TYPE %s %s\n", name, help,
                       name, type);
}

bt_status_t bt_prom_hist_render(const bt_prom_hist_t *h, const char *name,
                                const char *help, bt_prom_write_fn write,
                                void *out)
{
    uint64_t cum = 0;
    bt_status_t status;

    status = bt_prom_header(name, "histogram", help, write, out);
    for (int b = 0; status == BT_OK && b <= h->n_bounds; b++) {
        cum += h->counts[b];
        if (b < h->n_bounds)
            status = prom_printf(write, out, "%s_bucket{le=\"%g\"} %llu\n",
                                 name, h->bounds[b], (unsigned long long)cum);
        else
            status = prom_printf(write, out, "%s_bucket{le=\"+Inf\"} %llu\n",
                                 name, (unsigned long long)cum);
    }
    if (status == BT_OK)
        status = prom_printf(write, out, "%s_sum %.9g\n%s_count %llu\n", name,
                             h->sum, name, (unsigned long long)h->count);
    return status;
}

void bt_prom_label_escape(const char *in, char *out, size_t cap)
{
    size_t o = 0;

    for (; in != NULL && *in != '\0' && o + 3 < cap; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    out[o] = '\0';
}
