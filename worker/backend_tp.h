/*
 * backend_tp.h - the thread crew of a tensor-parallel backend: one host
 * thread per rank (GPU), rank 0 being the caller's own thread.
 *
 * backend_tp_crew_run(crew, fn, arg) runs fn(arg, r) for every rank r at
 * once and returns when all have returned: the backend builds a step's
 * plan once on the caller's thread, and each rank enqueues the same
 * forward on its own device.  A run allocates nothing.  Idle rank threads
 * spin for a short while (a decode loop calls back within microseconds)
 * and then sleep on a condition variable.  Errors: the lowest failing
 * rank's status is returned and its message (recorded on its own thread)
 * is recorded again on the caller's thread, so bt_error_last() works as
 * for any other backend call.  Not thread-safe: one caller at a time.
 */
#ifndef BT_WORKER_BACKEND_TP_H
#define BT_WORKER_BACKEND_TP_H

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct backend_tp_crew_s backend_tp_crew_t;

/* The work of one rank. */
typedef bt_status_t (*backend_tp_fn)(void *arg, int rank);

/* Starts n_ranks - 1 threads (1 <= n_ranks <= 64). */
bt_status_t backend_tp_crew_create(int n_ranks, backend_tp_crew_t **crew_p);

/* Stops and joins the threads; NULL-safe; sets *crew_p to NULL. */
void backend_tp_crew_destroy(backend_tp_crew_t **crew_p);

int backend_tp_crew_size(const backend_tp_crew_t *crew);

/* Runs fn(arg, r) for r = 0..n-1 concurrently (rank 0 on this thread) and
 * waits for all of them. */
bt_status_t backend_tp_crew_run(backend_tp_crew_t *crew, backend_tp_fn fn,
                                void *arg);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_BACKEND_TP_H */
