/*
 * cpu_embed.c - token embedding lookup.
 */
#include <string.h>

#include "cpu_int.h"

void cpu__embed(float *out, const float *table, int dim, int token)
{
    memcpy(out, table + (size_t)token * dim, (size_t)dim * sizeof(*out));
}
