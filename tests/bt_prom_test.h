/*
 * bt_prom_test.h - reading Prometheus text in tests: the value of one
 * sample line, and the sum of a family's samples.
 */
#ifndef BT_TESTS_BT_PROM_TEST_H
#define BT_TESTS_BT_PROM_TEST_H

#include <stdlib.h>
#include <string.h>

/* The value of the sample line `sample` ("name" or "name{labels}"), -1
 * when there is none. */
__attribute__((unused)) static double metric(const char *body,
                                             const char *sample)
{
    size_t n = strlen(sample);

    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, sample, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return -1;
}

/* The sum of every sample of family `name` (all label values). */
__attribute__((unused)) static double metric_sum(const char *body,
                                                 const char *name)
{
    size_t n = strlen(name);
    double sum = 0;

    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, name, n) == 0 && (p[n] == '{' || p[n] == ' ')) {
            const char *sp = strchr(p, ' ');
            if (sp != NULL)
                sum += atof(sp + 1);
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return sum;
}

#endif /* BT_TESTS_BT_PROM_TEST_H */
