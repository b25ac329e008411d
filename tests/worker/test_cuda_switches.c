/*
 * test_cuda_switches.c - the CUDA backend's switch table
 * (worker/cuda/cuda_switches.h), which runs without a GPU:
 *   - every line names a distinct BT_* variable;
 *   - unset variables read as NULL (the documented default applies);
 *   - set ones are copied at the read: changing the environment later
 *     changes nothing until cuda_switches_reload (read once, never per
 *     launch), and cuda_switches() returns the same values;
 *   - a value too long for the table's pool is ignored (NULL) without
 *     losing the other switches.
 * Exits non-zero on the first failed check.  CPU-only builds have no table: the test passes after saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_test.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/cuda_switches.h"

/* The table's variables, in order. */
static const char *const sw_vars[] = {
#define SW_VAR(field, var, doc) var,
    CUDA_SWITCH_TABLE(SW_VAR)
#undef SW_VAR
};
#define SW_N (sizeof(sw_vars) / sizeof(sw_vars[0]))

/* The table's fields of s, in the same order. */
static void sw_fields(const cuda_switches_t *s, const char *out[SW_N])
{
    size_t i = 0;

#define SW_FIELD(field, var, doc) out[i++] = s->field;
    CUDA_SWITCH_TABLE(SW_FIELD)
#undef SW_FIELD
}

static void test_names(void)
{
    for (size_t i = 0; i < SW_N; i++) {
        BT_CHECK(strncmp(sw_vars[i], "BT_", 3) == 0);
        for (size_t j = i + 1; j < SW_N; j++)
            BT_CHECK(strcmp(sw_vars[i], sw_vars[j]) != 0);
    }
}

static void test_read_once(void)
{
    const char *f[SW_N];

    for (size_t i = 0; i < SW_N; i++)
        unsetenv(sw_vars[i]);
    cuda_switches_reload();
    sw_fields(cuda_switches(), f);
    for (size_t i = 0; i < SW_N; i++)
        BT_CHECK(f[i] == NULL);

    /* each variable its own value, so a field read from the wrong
     * variable shows */
    for (size_t i = 0; i < SW_N; i++) {
        char v[32];
        snprintf(v, sizeof(v), "v%zu", i);
        setenv(sw_vars[i], v, 1);
    }
    cuda_switches_reload();
    sw_fields(cuda_switches(), f);
    for (size_t i = 0; i < SW_N; i++) /* copies, not the environment's */
        BT_CHECK(f[i] != NULL && f[i] != getenv(sw_vars[i]));
    for (size_t i = 0; i < SW_N; i++)
        setenv(sw_vars[i], "changed", 1); /* not re-read */
    sw_fields(cuda_switches(), f);
    for (size_t i = 0; i < SW_N; i++) {
        char v[32];
        snprintf(v, sizeof(v), "v%zu", i);
        BT_CHECK(f[i] != NULL);
        BT_ASSERT_STREQ(f[i], v);
    }
    BT_ASSERT_STREQ(cuda_switches()->gemv_force, "v2");

    /* an empty value is set, not unset (BT_HOST_SAMPLE= means on) */
    setenv("BT_HOST_SAMPLE", "", 1);
    unsetenv("BT_GEMV");
    cuda_switches_reload();
    BT_CHECK(cuda_switches()->host_sample != NULL &&
             cuda_switches()->host_sample[0] == '\0');
    BT_CHECK(cuda_switches()->gemv == NULL);
    BT_ASSERT_STREQ(cuda_switches()->attn_tc, "changed");
}

static void test_too_long(void)
{
    const size_t n = 9000; /* more than the whole pool */
    char *big = malloc(n + 1);

    BT_CHECK(big != NULL);
    memset(big, 'x', n);
    big[n] = '\0';
    setenv("BT_GEMV_DISABLE", big, 1);
    setenv("BT_GEMV_FORCE", "rows", 1);
    setenv("BT_ATTN_TC", "0", 1);
    cuda_switches_reload();
    BT_CHECK(cuda_switches()->gemv_disable == NULL);
    BT_CHECK(cuda_switches()->gemv_force != NULL);
    BT_ASSERT_STREQ(cuda_switches()->gemv_force, "rows");
    BT_CHECK(cuda_switches()->attn_tc != NULL);
    BT_ASSERT_STREQ(cuda_switches()->attn_tc, "0");
    free(big);
    for (size_t i = 0; i < SW_N; i++)
        unsetenv(sw_vars[i]);
    cuda_switches_reload();
}
#endif /* BATON_HAVE_CUDA */

int main(void)
{
#ifdef BATON_HAVE_CUDA
    test_names();
    test_read_once();
    test_too_long();
#else
    printf("test_cuda_switches: CPU-only build, no CUDA switch table\n");
#endif
    BT_TEST_PASS("test_cuda_switches");
    return 0;
}
