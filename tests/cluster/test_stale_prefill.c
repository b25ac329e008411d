/*
 * test_stale_prefill.c - a prefill failure that belongs to an earlier
 * attempt of a request must not count against the attempt in flight.
 *
 * When a decode worker dies, the router re-queues the requests it held
 * and may send one straight back to the same prefill worker; that
 * worker's failure report for the old attempt (its hand-off to the dead
 * worker failed) can arrive after the new grant.  Every PrefillDone
 * carries the grant's epoch, and the router ignores one whose epoch is
 * not the request's.  (Round 22: test_stage_cluster lost a request after
 * a single kill -9 in one CI run; a stale failure counted against the new
 * attempt is one way one death can cost a request several retries.)
 *
 * This process plays the prefill worker (workerproc's helpers over a
 * real DEALER) beside real null-model decode workers.
 *
 * With --max-retries 0 (any failure the router accepts fails the
 * request):
 *   1. A failure stamped with another epoch: the request stays in flight.
 *   2. A failure with the task's own epoch: the client gets the error.
 * With --max-retries 1, one decode worker's death counts once:
 *   3. The hand-off to d0 fails (retry 1, put on d0); the request comes
 *      back to d0; d0 is killed -9 and dropped: the same failure, not a
 *      second one, so the request waits for d1 and reaches the fake
 *      again.  A further failure then exceeds the limit.
 */
#include <zmq.h>

#include "bt_error.h"
#include "cluster_util.h"
#include "workerproc.h"
#include "fake_prefill.h"

/* Pumps the fake until it holds a task whose grant epoch is not `old`;
 * returns that epoch (0 after `ms` without one). */
static uint64_t wait_task(fake_prefill_t *f, uint64_t old, int ms)
{
    for (int t = 0; t < ms; t += 20) {
        if (f->task_id != 0 && f->task_epoch != old)
            return f->task_epoch;
        fake_pump(f, 20);
    }
    return 0;
}

/* The fake reports the prefill of its task failed, stamped `epoch`. */
static void fake_fail(fake_prefill_t *f, uint64_t epoch, const char *why)
{
    workerproc_send_prefill_failure(f->sock, f->task_id, epoch,
                                    BATON__ERROR_CODE__ERROR_WORKER, why);
}

/* One scenario's cluster: a router, one null-model decode worker (d0),
 * the fake prefill worker, a client with one request in flight and a
 * client for status polls. */
typedef struct {
    fake_prefill_t f;
    client_t *c;
    client_t *ctl;
    char control[64];
    pid_t d0;
} cluster_t;

/* Starts the cluster with `max_retries` and submits the request; returns
 * the grant epoch of the first task it reaches the fake with. */
static uint64_t cluster_start(cluster_t *cl, const char *max_retries)
{
    static client_request_t req;
    char listen[64];
    uint64_t rid, epoch;
    int port = cu_free_port();

    memset(cl, 0, sizeof(*cl));
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    snprintf(cl->control, sizeof(cl->control), "tcp://127.0.0.1:%d",
             port + 1);
    /* a worker silent for 0.5 s is dropped */
    cu_spawn("baton-router", "--listen", listen, "--control", cl->control,
             "--heartbeat-ms", "100", "--heartbeat-miss", "5",
             "--max-retries", max_retries, NULL);
    cl->d0 = cu_spawn("baton-decode", "--router", cl->control,
                      "--null-model", "--name", "d0", NULL);
    BT_ASSERT_OK(client_create(listen, &cl->c));
    BT_ASSERT_OK(client_create(listen, &cl->ctl));
    fake_start(&cl->f, cl->control, cl->ctl, 10000);
    client_request_init(&req);
    req.prompt = "hello";
    req.max_tokens = 4;
    BT_ASSERT_OK(client_submit(cl->c, &req, &rid));
    epoch = wait_task(&cl->f, 0, 10000);
    BT_CHECK(epoch != 0);
    return epoch;
}

static void cluster_stop(cluster_t *cl)
{
    workerproc_send_shutdown(cl->f.sock, "fake-prefill");
    workerproc_close(&cl->f.ctx, &cl->f.sock);
    client_destroy(&cl->c);
    client_destroy(&cl->ctl);
}

/* Pumps the fake while waiting up to `ms` for the client's error reply;
 * returns its code, or -1 when none came (other messages are dropped). */
static int wait_error(fake_prefill_t *f, client_t *c, int ms)
{
    for (int t = 0; t < ms; t += 20) {
        Baton__ClientMessage *m = NULL;
        fake_pump(f, 10);
        if (client_recv(c, 10, &m) != BT_OK) {
            bt_error_clear();
            continue;
        }
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
            int code = m->error->code;
            fprintf(stderr, "  -> %s: %s\n", client_error_name(code),
                    m->error->message);
            proto_client_free(&m);
            return code;
        }
        proto_client_free(&m);
    }
    return -1;
}

int main(void)
{
    cluster_t cl;
    uint64_t e1, e2, e3;

    cu_init();

    /* 1, 2: --max-retries 0 */
    e1 = cluster_start(&cl, "0");
    fprintf(stderr, "task %llu, grant epoch %llu\n",
            (unsigned long long)cl.f.task_id, (unsigned long long)e1);
    fake_fail(&cl.f, e1 + 1, "stale: an earlier attempt's hand-off");
    BT_ASSERT_EQ(wait_error(&cl.f, cl.c, 500), -1);
    fake_fail(&cl.f, e1, "this attempt's hand-off failed");
    BT_ASSERT_EQ(wait_error(&cl.f, cl.c, 5000),
                 (int)BATON__ERROR_CODE__ERROR_WORKER);
    cluster_stop(&cl);

    /* 3: --max-retries 1, the decode worker's death after its failed
     * hand-off */
    e1 = cluster_start(&cl, "1");
    fake_fail(&cl.f, e1, "KV transfer to the decode worker failed");
    e2 = wait_task(&cl.f, e1, 5000); /* retry 1: back to d0, the only one */
    BT_CHECK(e2 != 0);
    cu_kill(cl.d0, SIGKILL);
    /* dropped after 0.5 s of silence: no second retry, no error */
    BT_ASSERT_EQ(wait_error(&cl.f, cl.c, 1500), -1);
    cu_spawn("baton-decode", "--router", cl.control, "--null-model",
             "--name", "d1", NULL);
    e3 = wait_task(&cl.f, e2, 20000);
    BT_CHECK(e3 != 0);
    fprintf(stderr, "the request survived d0's death: grants %llu, %llu "
            "(d0), %llu (d1)\n", (unsigned long long)e1,
            (unsigned long long)e2, (unsigned long long)e3);
    fake_fail(&cl.f, e3, "KV transfer to the decode worker failed");
    BT_ASSERT_EQ(wait_error(&cl.f, cl.c, 5000),
                 (int)BATON__ERROR_CODE__ERROR_WORKER);
    cluster_stop(&cl);
    BT_TEST_PASS("cluster/stale_prefill: a failure of another epoch is "
                 "ignored, the attempt's own counts, a decode worker's "
                 "death after its failed hand-off counts once");
    return 0;
}
