/*
 * cuda_switches.c - reads the table of cuda_switches.h.
 *
 * Values are copied into a fixed pool (the environment's strings may move
 * when a test calls setenv); a value that does not fit is logged and
 * treated as unset, so a switch is never half-read.
 */
#include "cuda_switches.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bt_log.h"

#define CUDA_SWITCH_POOL 8192 /* bytes for every value together */

static cuda_switches_t cuda_sw;
static char cuda_sw_pool[CUDA_SWITCH_POOL];
static pthread_once_t cuda_sw_once = PTHREAD_ONCE_INIT;

/* Copies the value of `var` into the pool at *used; NULL when unset or
 * when the pool is full. */
static const char *cuda_switch_read(const char *var, size_t *used)
{
    const char *v = getenv(var);
    size_t n;

    if (v == NULL)
        return NULL;
    n = strlen(v) + 1;
    if (n > CUDA_SWITCH_POOL - *used) {
        BT_LOG_WARN("CUDA", "%s: value too long (%zu bytes), ignored", var,
                    n - 1);
        return NULL;
    }
    memcpy(cuda_sw_pool + *used, v, n);
    *used += n;
    return cuda_sw_pool + *used - n;
}

void cuda_switches_reload(void)
{
    size_t used = 0;

#define CUDA_SWITCH_LOAD(field, var, doc)                                   \
    cuda_sw.field = cuda_switch_read(var, &used);
    CUDA_SWITCH_TABLE(CUDA_SWITCH_LOAD)
#undef CUDA_SWITCH_LOAD
}

const cuda_switches_t *cuda_switches(void)
{
    (void)pthread_once(&cuda_sw_once, cuda_switches_reload);
    return &cuda_sw;
}
