/*
 * backend_tp.c - the rank thread crew (see backend_tp.h).
 *
 * A run publishes (fn, arg), bumps the generation under the mutex and
 * wakes sleepers; each rank thread runs fn once per generation and counts
 * itself done; the caller runs rank 0, then waits for the count.  Both
 * waits spin first (CREW_SPIN_NS) because decode steps follow each other
 * within microseconds and a condition-variable wake-up costs tens.
 */
#include "backend_tp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

#define CREW_MAX 64
#define CREW_SPIN_NS 200000 /* 200 us */

typedef struct {
    backend_tp_crew_t *crew;
    int rank;
    bt_status_t status;       /* of the last run */
    char msg[512];            /* its error text */
    pthread_t thread;
    bool started;
} crew_rank_t;

struct backend_tp_crew_s {
    int n;
    crew_rank_t *ranks;       /* (n) */
    pthread_mutex_t mu;
    pthread_cond_t go;        /* generation bumped or quit */
    pthread_cond_t done;      /* last rank thread finished */
    atomic_ullong gen;        /* runs started */
    atomic_int n_done;        /* rank threads done with this run */
    atomic_bool quit;
    backend_tp_fn fn;         /* this run's work */
    void *arg;
};

static void crew_spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *crew_main(void *p)
{
    crew_rank_t *cr = p;
    backend_tp_crew_t *crew = cr->crew;
    unsigned long long seen = 0;

    for (;;) {
        unsigned long long g = atomic_load(&crew->gen);
        uint64_t t0;

        if (g == seen && !atomic_load(&crew->quit)) {
            t0 = bt_time_ns();
            for (unsigned i = 0;; i++) {
                g = atomic_load(&crew->gen);
                if (g != seen || atomic_load(&crew->quit))
                    break;
                crew_spin_pause();
                if ((i & 1023) == 1023 && bt_time_ns() - t0 > CREW_SPIN_NS)
                    break;
            }
        }
        if (g == seen && !atomic_load(&crew->quit)) {
            pthread_mutex_lock(&crew->mu);
            while (atomic_load(&crew->gen) == seen &&
                   !atomic_load(&crew->quit))
                pthread_cond_wait(&crew->go, &crew->mu);
            pthread_mutex_unlock(&crew->mu);
            g = atomic_load(&crew->gen);
        }
        if (atomic_load(&crew->quit))
            break;
        seen = g;
        bt_error_clear();
        cr->status = crew->fn(crew->arg, cr->rank);
        if (cr->status != BT_OK)
            snprintf(cr->msg, sizeof(cr->msg), "%s", bt_error_last());
        if (atomic_fetch_add(&crew->n_done, 1) + 1 == crew->n - 1) {
            pthread_mutex_lock(&crew->mu);
            pthread_cond_broadcast(&crew->done);
            pthread_mutex_unlock(&crew->mu);
        }
    }
    return NULL;
}

bt_status_t backend_tp_crew_create(int n_ranks, backend_tp_crew_t **crew_p)
{
    backend_tp_crew_t *crew;

    if (n_ranks < 1 || n_ranks > CREW_MAX)
        return BT_ERROR(BT_ERR_INVALID_ARG, "ENGINE",
                        "rank crew of %d threads (1..%d)", n_ranks,
                        CREW_MAX);
    crew = bt_calloc(1, sizeof(*crew), "tp_crew");
    if (crew == NULL)
        return BT_ERR_NO_MEMORY;
    crew->ranks = bt_calloc((size_t)n_ranks, sizeof(*crew->ranks),
                            "tp_crew");
    if (crew->ranks == NULL) {
        bt_free(crew);
        return BT_ERR_NO_MEMORY;
    }
    crew->n = n_ranks;
    pthread_mutex_init(&crew->mu, NULL);
    pthread_cond_init(&crew->go, NULL);
    pthread_cond_init(&crew->done, NULL);
    atomic_init(&crew->gen, 0);
    atomic_init(&crew->n_done, 0);
    atomic_init(&crew->quit, false);
    for (int r = 0; r < n_ranks; r++) {
        crew->ranks[r].crew = crew;
        crew->ranks[r].rank = r;
    }
    for (int r = 1; r < n_ranks; r++) {
        if (pthread_create(&crew->ranks[r].thread, NULL, crew_main,
                           &crew->ranks[r]) != 0) {
            backend_tp_crew_destroy(&crew);
            return BT_ERROR(BT_ERR_NO_RESOURCE, "ENGINE",
                            "cannot start the thread of rank %d", r);
        }
        crew->ranks[r].started = true;
    }
    *crew_p = crew;
    return BT_OK;
}

void backend_tp_crew_destroy(backend_tp_crew_t **crew_p)
{
    backend_tp_crew_t *crew = *crew_p;

    if (crew == NULL)
        return;
    pthread_mutex_lock(&crew->mu);
    atomic_store(&crew->quit, true);
    pthread_cond_broadcast(&crew->go);
    pthread_mutex_unlock(&crew->mu);
    for (int r = 1; r < crew->n; r++)
        if (crew->ranks[r].started)
            pthread_join(crew->ranks[r].thread, NULL);
    pthread_cond_destroy(&crew->done);
    pthread_cond_destroy(&crew->go);
    pthread_mutex_destroy(&crew->mu);
    bt_free(crew->ranks);
    bt_free(crew);
    *crew_p = NULL;
}

int backend_tp_crew_size(const backend_tp_crew_t *crew)
{
    return crew->n;
}

bt_status_t backend_tp_crew_run(backend_tp_crew_t *crew, backend_tp_fn fn,
                                void *arg)
{
    bt_status_t status;
    uint64_t t0;

    if (crew->n == 1)
        return fn(arg, 0);
    crew->fn = fn;
    crew->arg = arg;
    atomic_store(&crew->n_done, 0);
    pthread_mutex_lock(&crew->mu);
    atomic_fetch_add(&crew->gen, 1);
    pthread_cond_broadcast(&crew->go);
    pthread_mutex_unlock(&crew->mu);

    crew->ranks[0].status = fn(arg, 0);

    t0 = bt_time_ns();
    for (unsigned i = 0; atomic_load(&crew->n_done) < crew->n - 1; i++) {
        crew_spin_pause();
        if ((i & 1023) == 1023 && bt_time_ns() - t0 > CREW_SPIN_NS) {
            pthread_mutex_lock(&crew->mu);
            while (atomic_load(&crew->n_done) < crew->n - 1)
                pthread_cond_wait(&crew->done, &crew->mu);
            pthread_mutex_unlock(&crew->mu);
            break;
        }
    }
    status = crew->ranks[0].status;
    if (status != BT_OK)
        return status; /* its message is already this thread's */
    for (int r = 1; r < crew->n; r++) {
        if (crew->ranks[r].status != BT_OK)
            return BT_ERROR(crew->ranks[r].status, "ENGINE", "rank %d: %s", r,
                            crew->ranks[r].msg);
    }
    return BT_OK;
}
