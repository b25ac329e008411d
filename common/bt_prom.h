/*
 * bt_prom.h - the pieces of the Prometheus text exposition (format 0.0.4)
 * that baton-router and baton-http share: latency histograms, family
 * headers and label escaping.  Each process keeps its own buffer type;
 * it hands these functions a write callback into it.
 */
#ifndef BT_COMMON_BT_PROM_H
#define BT_COMMON_BT_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_PROM_HIST_MAX_BUCKETS 20

/* Bucket upper bounds in seconds that both processes use, as array
 * initialisers: time to first token, and time per output token. */
#define BT_PROM_TTFT_BOUNDS                                                 \
    { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, \
      10, 30, 60 }
#define BT_PROM_TPOT_BOUNDS                                                 \
    { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1 }

/* A latency histogram (Prometheus buckets, seconds).  Not thread-safe. */
typedef struct {
    const double *bounds;                      /* (n_bounds) upper bounds,
                                                  ascending; not owned */
    int n_bounds;                              /* < BT_PROM_HIST_MAX_BUCKETS */
    uint64_t counts[BT_PROM_HIST_MAX_BUCKETS]; /* per bucket, not
                                                  cumulative; [n_bounds] is
                                                  +Inf */
    double sum;                                /* of observed values */
    uint64_t count;                            /* observations */
} bt_prom_hist_t;

/* Appends `len` bytes of `text` to the process's buffer `out`. */
typedef bt_status_t (*bt_prom_write_fn)(void *out, const char *text,
                                        size_t len);

/* Empties `h` and sets its bucket bounds (kept by reference). */
void bt_prom_hist_init(bt_prom_hist_t *h, const double *bounds,
                       int n_bounds);

/* Counts one observation `v` (seconds). */
void bt_prom_hist_observe(bt_prom_hist_t *h, double v);

/* Writes the "# HELP" and "# TYPE" lines of the family `name`. */
bt_status_t bt_prom_header(const char *name, const char *type,
                           const char *help, bt_prom_write_fn write,
                           void *out);

/* Writes the histogram family `name`: header, cumulative buckets, _sum
 * and _count.  Returns the first failure of `write`. */
bt_status_t bt_prom_hist_render(const bt_prom_hist_t *h, const char *name,
                                const char *help, bt_prom_write_fn write,
                                void *out);

/* Copies the label value `in` (NULL reads as "") into `out` (`cap`
 * bytes, NUL-terminated, truncated to fit) with \, " and newline
 * escaped. */
void bt_prom_label_escape(const char *in, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_BT_PROM_H */
