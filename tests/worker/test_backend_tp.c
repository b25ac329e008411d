/*
 * test_backend_tp.c - tensor-parallel plumbing that runs without a GPU:
 *   - the rank crew runs every rank once per run (rank 0 on the caller),
 *     concurrently, many times in a row, with sleeps between runs, and
 *     reports the lowest failing rank's status and message;
 *   - backend_create refuses tp on the cpu backend and out-of-range tp,
 *     and a model whose heads do not split, with clear messages;
 *   - CUDA builds: NCCL missing (BT_NCCL_LIB pointing nowhere) is a clear
 *     BT_ERR_UNSUPPORTED naming the library, and NCCL_NVLS_ENABLE=0 is
 *     forced.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "backend_tp.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/model.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/nccl_dl.h"
#endif

typedef struct {
    atomic_int calls[8];
    atomic_int inside;      /* ranks inside fn right now */
    atomic_int max_inside;
    int fail_rank;          /* -1: none */
} crew_probe_t;

static bt_status_t probe_fn(void *arg, int rank)
{
    crew_probe_t *p = arg;
    int in = atomic_fetch_add(&p->inside, 1) + 1;
    int m = atomic_load(&p->max_inside);

    while (in > m && !atomic_compare_exchange_weak(&p->max_inside, &m, in)) {
    }
    atomic_fetch_add(&p->calls[rank], 1);
    usleep(200); /* long enough for the others to come in */
    atomic_fetch_sub(&p->inside, 1);
    if (p->fail_rank >= 0 &&
        (rank == p->fail_rank || rank == p->fail_rank + 1))
        return BT_ERROR(BT_ERR_CUDA, "TEST", "rank %d broke", rank);
    return BT_OK;
}

static bt_status_t count_fn(void *arg, int rank)
{
    atomic_int *calls = arg;

    atomic_fetch_add(&calls[rank], 1);
    return BT_OK;
}

static void test_crew(int n)
{
    backend_tp_crew_t *crew = NULL;
    crew_probe_t p;
    atomic_int calls[8];

    BT_ASSERT_OK(backend_tp_crew_create(n, &crew));
    BT_ASSERT_EQ(backend_tp_crew_size(crew), n);
    memset(&p, 0, sizeof(p));
    p.fail_rank = -1;
    for (int i = 0; i < 20; i++)
        BT_ASSERT_OK(backend_tp_crew_run(crew, probe_fn, &p));
    for (int r = 0; r < n; r++)
        BT_ASSERT_EQ(atomic_load(&p.calls[r]), 20);
    BT_ASSERT_EQ(atomic_load(&p.max_inside), n); /* they ran at once */

    /* many short runs back to back (the spin path) */
    for (int r = 0; r < 8; r++)
        atomic_init(&calls[r], 0);
    for (int i = 0; i < 2000; i++)
        BT_ASSERT_OK(backend_tp_crew_run(crew, count_fn, calls));
    for (int r = 0; r < n; r++)
        BT_ASSERT_EQ(atomic_load(&calls[r]), 2000);
    /* after the threads went to sleep (the condition variable path) */
    usleep(300000);
    BT_ASSERT_OK(backend_tp_crew_run(crew, count_fn, calls));
    for (int r = 0; r < n; r++)
        BT_ASSERT_EQ(atomic_load(&calls[r]), 2001);

    /* errors: the lowest failing rank wins, its text reaches the caller */
    if (n >= 3) {
        p.fail_rank = 1;
        bt_error_clear();
        BT_ASSERT_EQ(backend_tp_crew_run(crew, probe_fn, &p), BT_ERR_CUDA);
        BT_CHECK(strstr(bt_error_last(), "rank 1") != NULL);
        BT_CHECK(strstr(bt_error_last(), "rank 1 broke") != NULL);
        p.fail_rank = 0; /* rank 0 (the caller) and rank 1 fail */
        BT_ASSERT_EQ(backend_tp_crew_run(crew, probe_fn, &p), BT_ERR_CUDA);
        BT_CHECK(strstr(bt_error_last(), "rank 0 broke") != NULL);
        p.fail_rank = -1;
        BT_ASSERT_OK(backend_tp_crew_run(crew, probe_fn, &p));
    }
    backend_tp_crew_destroy(&crew);
    BT_CHECK(crew == NULL);
    backend_tp_crew_destroy(&crew); /* NULL-safe */
    fprintf(stderr, "PASS crew of %d\n", n);
}

static void test_backend_args(void)
{
    char path[512];
    model_t *m = NULL;
    backend_t *be = NULL;
    backend_config_t bc;

    BT_ASSERT_EQ(backend_tp_crew_create(0, NULL), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(backend_tp_crew_create(65, NULL), BT_ERR_INVALID_ARG);
    snprintf(path, sizeof(path), "%s/models/stories260K.bin", BT_SHARED_DIR);
    BT_ASSERT_OK(model_load(path, &m));
    backend_config_init(&bc);
    bc.n_kv_blocks = 4;
    BT_ASSERT_EQ(bc.tp_size, 0);
    bc.tp_size = 2;
    BT_ASSERT_EQ(backend_create("cpu", m, &bc, &be), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "cuda backend") != NULL);
    bc.tp_size = -1;
    BT_ASSERT_EQ(backend_create("cpu", m, &bc, &be), BT_ERR_INVALID_ARG);
    bc.tp_size = 99;
    BT_ASSERT_EQ(backend_create("cpu", m, &bc, &be), BT_ERR_INVALID_ARG);
    bc.tp_size = 1; /* one rank is no TP: fine on the cpu */
    BT_ASSERT_OK(backend_create("cpu", m, &bc, &be));
    BT_ASSERT_EQ(backend_tp_size(be), 1);
    BT_CHECK(backend_kv_data_rank(be, 0, 0, 1) == backend_kv_data(be, 0, 1));
    backend_destroy(&be);
    BT_CHECK(backend_resolve("cpu") != NULL);
    BT_ASSERT_STREQ(backend_resolve("cpu"), "cpu");
    BT_CHECK(backend_resolve("tpu") == NULL);
#ifdef BATON_HAVE_CUDA
    /* where a GPU is present the shard check runs before anything is
     * allocated: stories260K has 4 KV heads */
    if (backend_resolve("cuda") != NULL) {
        bc.tp_size = 8;
        BT_ASSERT_EQ(backend_create("cuda", m, &bc, &be), BT_ERR_UNSUPPORTED);
        BT_CHECK(strstr(bt_error_last(), "KV heads") != NULL);
    }
#endif
    model_destroy(&m);
    BT_TEST_PASS("backend tp arguments");
}

#ifdef BATON_HAVE_CUDA
static void test_nccl_missing(void)
{
    cuda_nccl_t *nccl = NULL;

    setenv("NCCL_NVLS_ENABLE", "1", 1);
    setenv("BT_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    BT_ASSERT_EQ(cuda_nccl_open(&nccl), BT_ERR_UNSUPPORTED);
    BT_CHECK(nccl == NULL);
    BT_CHECK(strstr(bt_error_last(), "/nonexistent/libnccl.so.2") != NULL);
    BT_CHECK(strstr(bt_error_last(), "LD_LIBRARY_PATH") != NULL);
    BT_ASSERT_STREQ(getenv("NCCL_NVLS_ENABLE"), "0");
    /* a library without the NCCL symbols */
    setenv("BT_NCCL_LIB", "libm.so.6", 1);
    BT_ASSERT_EQ(cuda_nccl_open(&nccl), BT_ERR_UNSUPPORTED);
    BT_CHECK(strstr(bt_error_last(), "ncclGetUniqueId") != NULL);
    unsetenv("BT_NCCL_LIB");
    cuda_nccl_close(&nccl); /* NULL-safe */
    BT_TEST_PASS("nccl missing is a clear error");
}
#endif

int main(void)
{
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    test_crew(1);
    test_crew(2);
    test_crew(4);
    test_backend_args();
#ifdef BATON_HAVE_CUDA
    test_nccl_missing();
#endif
    return 0;
}
