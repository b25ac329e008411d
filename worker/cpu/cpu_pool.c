/*
 * cpu_pool.c - a small persistent thread pool for the CPU backend.
 *
 * The forward pass of a tiny model is a few microseconds per op, so a
 * job must start and finish without a system call in the common case:
 * the caller publishes the job and bumps a per-worker "go" counter; each
 * worker spins on its counter for a while after its last job (about
 * CPU_POOL_SPIN_NS) and only then sleeps on a condition variable.  The
 * caller runs share 0 itself, then every share whose worker has not
 * started it yet (a worker claims its share with a compare-and-swap, the
 * caller takes it back the same way), and waits only for the workers
 * that did start: on a box whose cores are busy with other processes a
 * worker that has lost its core costs the step nothing, instead of a
 * scheduler time slice.  Only the workers a job names are woken, so a
 * one-thread job costs a plain function call.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "cpu_int.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() do { } while (0)
#endif

/* How long an idle worker spins before it sleeps: long enough to cover
 * the serial gaps between ops and between decode steps. */
#define CPU_POOL_SPIN_NS 200000ull

/* A worker's claim on its share of job `gen`: (gen << 2) | state. */
#define CPU_CLAIM_PENDING 0u  /* posted, nobody runs it yet */
#define CPU_CLAIM_RUNNING 1u  /* the worker took it */
#define CPU_CLAIM_TAKEN 2u    /* the caller took it back */
#define CPU_CLAIM(gen, state) (((gen) << 2) | (state))

typedef struct {
    _Alignas(64) atomic_uint go; /* bumped by the caller per job */
    atomic_uint claim;           /* CPU_CLAIM of the current job's share */
    cpu_pool_t *pool;            /* back pointer */
    int index;                   /* 1..n_threads-1 */
    pthread_t thread;
} cpu_worker_t;

struct cpu_pool_s {
    int n_threads;              /* caller included */
    cpu_worker_t *workers;      /* (n_threads) entry 0 unused */
    cpu_task_fn_t job_fn;       /* current job */
    void *job_arg;
    int job_nth;                /* threads taking part in the job */
    unsigned gen;               /* jobs posted (caller only) */
    _Alignas(64) atomic_int n_done; /* workers finished with the job */
    atomic_int n_sleeping;      /* workers waiting on cond */
    atomic_bool stop;           /* set once by destroy */
    pthread_mutex_t mutex;      /* guards the sleep/wake hand-off */
    pthread_cond_t cond;
};

static void *cpu_pool_worker_main(void *arg)
{
    cpu_worker_t *w = arg;
    cpu_pool_t *pool = w->pool;
    unsigned seen = 0;

    for (;;) {
        uint64_t deadline = bt_time_ns() + CPU_POOL_SPIN_NS;
        unsigned go;
        int spins = 0;

        while ((go = atomic_load(&w->go)) == seen &&
               !atomic_load(&pool->stop)) {
            CPU_RELAX();
            if (++spins % 1024 == 0)
                sched_yield(); /* let a preempted sibling finish its share */
            if (spins % 256 == 0 && bt_time_ns() > deadline) {
                pthread_mutex_lock(&pool->mutex);
                atomic_fetch_add(&pool->n_sleeping, 1);
                while (atomic_load(&w->go) == seen &&
                       !atomic_load(&pool->stop))
                    pthread_cond_wait(&pool->cond, &pool->mutex);
                atomic_fetch_sub(&pool->n_sleeping, 1);
                pthread_mutex_unlock(&pool->mutex);
                deadline = bt_time_ns() + CPU_POOL_SPIN_NS;
            }
        }
        if (atomic_load(&pool->stop))
            break;
        seen = go;
        /* the newest posted job's share, unless the caller took it back
         * (or this worker already ran it); the job fields are read only
         * after the claim */
        {
            unsigned c = atomic_load(&w->claim);

            if ((c & 3u) == CPU_CLAIM_PENDING &&
                atomic_compare_exchange_strong(&w->claim, &c,
                                               c | CPU_CLAIM_RUNNING)) {
                pool->job_fn(pool->job_arg, w->index, pool->job_nth);
                atomic_fetch_add(&pool->n_done, 1);
            }
        }
    }
    return NULL;
}

bt_status_t cpu__pool_create(int n_threads, cpu_pool_t **pool_p)
{
    cpu_pool_t *pool;
    int started = 0;

    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);

        n_threads = n > 0 ? (int)BT_MIN(n, 256) : 1;
    }
    pool = bt_calloc(1, sizeof(*pool), "cpu_pool");
    if (pool == NULL)
        return BT_ERR_NO_MEMORY;
    pool->n_threads = n_threads;
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->stop, false);
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    pool->workers = bt_malloc_aligned((size_t)n_threads *
                                      sizeof(*pool->workers), "cpu_pool");
    if (pool->workers == NULL)
        goto err_free_pool;
    for (int i = 1; i < n_threads; i++) {
        cpu_worker_t *w = &pool->workers[i];

        atomic_init(&w->go, 0);
        atomic_init(&w->claim, CPU_CLAIM(0u, CPU_CLAIM_TAKEN));
        w->pool = pool;
        w->index = i;
        if (pthread_create(&w->thread, NULL, cpu_pool_worker_main, w) != 0)
            goto err_stop;
        started++;
    }
    *pool_p = pool;
    return BT_OK;

err_stop:
    atomic_store(&pool->stop, true);
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->cond);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i <= started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    bt_free(pool->workers);
err_free_pool:
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->mutex);
    bt_free(pool);
    return BT_ERROR(BT_ERR_NO_MEMORY, "CPU",
                    "could not start %d CPU worker threads", n_threads);
}

void cpu__pool_destroy(cpu_pool_t **pool_p)
{
    cpu_pool_t *pool = *pool_p;

    if (pool == NULL)
        return;
    atomic_store(&pool->stop, true);
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->cond);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->workers[i].thread, NULL);
    bt_free(pool->workers);
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->mutex);
    bt_free(pool);
    *pool_p = NULL;
}

int cpu__pool_size(const cpu_pool_t *pool)
{
    return pool->n_threads;
}

void cpu__pool_run(cpu_pool_t *pool, int nth, cpu_task_fn_t fn, void *arg)
{
    int spins = 0, started;
    unsigned gen;

    if (nth > pool->n_threads)
        nth = pool->n_threads;
    if (nth <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->job_fn = fn;
    pool->job_arg = arg;
    pool->job_nth = nth;
    gen = ++pool->gen;
    for (int i = 1; i < nth; i++)
        atomic_store(&pool->workers[i].claim,
                     CPU_CLAIM(gen, CPU_CLAIM_PENDING));
    /* seq_cst stores then a seq_cst load of n_sleeping: either a worker
     * about to sleep sees its new go value, or we see it sleeping. */
    for (int i = 1; i < nth; i++)
        atomic_fetch_add(&pool->workers[i].go, 1);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(arg, 0, nth);
    /* shares whose workers have not started: run them here */
    started = nth - 1;
    for (int i = 1; i < nth; i++) {
        unsigned c = CPU_CLAIM(gen, CPU_CLAIM_PENDING);

        if (atomic_compare_exchange_strong(&pool->workers[i].claim, &c,
                                           CPU_CLAIM(gen, CPU_CLAIM_TAKEN))) {
            fn(arg, i, nth);
            started--;
        }
    }
    while (atomic_load(&pool->n_done) != started) {
        CPU_RELAX();
        if (++spins % 4096 == 0)
            sched_yield(); /* a worker may have lost its core */
    }
    atomic_store(&pool->n_done, 0);
}
