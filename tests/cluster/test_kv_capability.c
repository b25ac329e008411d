/*
 * test_kv_capability.c - the decode worker commits KV only for a live
 * reservation whose 128-bit capability matches (issue 42, item 3).
 *
 * This process plays the prefill worker (workerproc's helpers over a
 * real DEALER, as test_stale_prefill) beside a real null-model decode
 * worker with --metrics-port.  Each request's PrefillTask carries the
 * decode worker's grant with its capability; the fake answers with a
 * PrefillDone presenting:
 *   1. a wrong capability (the right one with one bit flipped),
 *   2. a stale one (request 1's, a grant that is gone),
 *   3. none at all,
 *   4. the right one.
 * 1-3 change nothing: the decode worker drops the KvReady, counts it
 * (baton_worker_kv_capability_rejected_total), frees the reservation
 * (the pool is idle again) and the client gets a clean ERROR_WORKER, no
 * token.  4 streams its tokens to the end.
 *
 * Run: ctest -R cluster/test_kv_capability (about 5 s).
 */
#include <zmq.h>

#include "bt_error.h"
#include "bt_prom_test.h"
#include "cluster_util.h"
#include "proto_msg.h"
#include "workerproc.h"
#include "fake_prefill.h"

/* The fake's PrefillDone for its task: prompt `ids`, first token 7, the
 * capability `cap` (NULL: none). */
static void fake_done(fake_prefill_t *f, const int *ids, int n,
                      const uint8_t *cap)
{
    Baton__ControlMessage msg = BATON__CONTROL_MESSAGE__INIT;
    Baton__PrefillDone done = BATON__PREFILL_DONE__INIT;

    done.has_request_id = 1;
    done.request_id = f->task_id;
    done.has_ok = 1;
    done.ok = 1;
    done.n_prompt_ids = (size_t)n;
    done.prompt_ids = (int32_t *)ids;
    done.has_first_token = 1;
    done.first_token = 7;
    done.has_epoch = 1;
    done.epoch = f->task_epoch;
    if (cap != NULL) {
        done.has_capability = 1;
        done.capability.data = (uint8_t *)cap;
        done.capability.len = PROTO_CAPABILITY_BYTES;
    }
    msg.body_case = BATON__CONTROL_MESSAGE__BODY_PREFILL_DONE;
    msg.prefill_done = &done;
    BT_ASSERT_OK(proto_control_send(f->sock, NULL, 0, &msg));
}

/* Pumps the fake until the client's request ends; returns 1 finished,
 * 2 error; *n_ids the tokens it streamed. */
static int wait_end(fake_prefill_t *f, client_t *c, int *n_ids, int *code)
{
    *n_ids = 0;
    for (int t = 0; t < 10000; t += 20) {
        Baton__ClientMessage *m = NULL;
        fake_pump(f, 10);
        if (client_recv(c, 10, &m) != BT_OK) {
            bt_error_clear();
            continue;
        }
        switch (m->body_case) {
        case BATON__CLIENT_MESSAGE__BODY_CHUNK:
            *n_ids += (int)m->chunk->n_ids;
            break;
        case BATON__CLIENT_MESSAGE__BODY_FINISHED:
            proto_client_free(&m);
            return 1;
        case BATON__CLIENT_MESSAGE__BODY_ERROR:
            *code = m->error->code;
            fprintf(stderr, "  -> %s: %s\n", client_error_name(*code),
                    m->error->message);
            proto_client_free(&m);
            return 2;
        default:
            break;
        }
        proto_client_free(&m);
    }
    BT_TEST_FAIL("the request did not end");
    return 0;
}

/* The decode worker's count of refused KV commits (-1: no answer). */
static double rejected_count(int port)
{
    return prom_scrape(port, "baton_worker_kv_capability_rejected_total");
}

int main(void)
{
    static const int prompt[4] = {11, 12, 13, 14};
    char listen[64], control[64], mport_s[16];
    fake_prefill_t f;
    client_t *c, *ctl;
    uint8_t stale[PROTO_CAPABILITY_BYTES], wrong[PROTO_CAPABILITY_BYTES];
    int mport, n_ids, code;

    cu_init();
    memset(&f, 0, sizeof(f));
    cu_router_addrs(listen, control);
    mport = cu_free_port();
    snprintf(mport_s, sizeof(mport_s), "%d", mport);
    cu_spawn("baton-router", "--listen", listen, "--control", control,
             "--max-retries", "0", NULL);
    cu_spawn("baton-decode", "--router", control, "--null-model", "--name",
             "d0", "--metrics-port", mport_s, NULL);
    BT_ASSERT_OK(client_create(listen, &c));
    BT_ASSERT_OK(client_create(listen, &ctl));
    fake_start(&f, control, ctl, 10000);
    BT_ASSERT_EQ((long long)rejected_count(mport), 0);

    for (int step = 1; step <= 4; step++) {
        client_request_t req;
        uint64_t rid, old = f.task_id;

        client_request_init(&req);
        req.prompt_ids = prompt;
        req.n_prompt_ids = 4;
        req.max_tokens = 6;
        req.ignore_eos = true;
        BT_ASSERT_OK(client_submit(c, &req, &rid));
        fake_wait_task(&f, old, 10000);
        BT_ASSERT_EQ((long long)f.cap_len, PROTO_CAPABILITY_BYTES);
        if (step == 1) {
            memcpy(stale, f.cap, sizeof(stale));
            memcpy(wrong, f.cap, sizeof(wrong));
            wrong[5] ^= 0x10;
            fake_done(&f, prompt, 4, wrong);
        } else if (step == 2) {
            BT_CHECK(memcmp(stale, f.cap, sizeof(stale)) != 0);
            fake_done(&f, prompt, 4, stale);
        } else if (step == 3) {
            fake_done(&f, prompt, 4, NULL);
        } else {
            fake_done(&f, prompt, 4, f.cap);
        }
        code = 0;
        if (step < 4) {
            BT_ASSERT_EQ(wait_end(&f, c, &n_ids, &code), 2);
            BT_ASSERT_EQ(code, (int)BATON__ERROR_CODE__ERROR_WORKER);
            /* the router streams the prefill's first token itself; no
             * decode token follows it */
            BT_CHECK(n_ids <= 1);
            BT_ASSERT_EQ((long long)rejected_count(mport), step);
            cu_wait_kv_idle(ctl, 5000);
        } else {
            BT_ASSERT_EQ(wait_end(&f, c, &n_ids, &code), 1);
            BT_ASSERT_EQ(n_ids, 6);
            BT_ASSERT_EQ((long long)rejected_count(mport), 3);
        }
        fprintf(stderr, "step %d: %s, %d tokens\n", step,
                step < 4 ? "refused" : "served", n_ids);
    }
    cu_wait_kv_idle(ctl, 5000);
    workerproc_send_shutdown(f.sock, "fake-prefill");
    workerproc_close(&f.ctx, &f.sock);
    client_destroy(&c);
    client_destroy(&ctl);
    BT_TEST_PASS("cluster/kv_capability: wrong, stale and missing "
                 "capabilities change nothing and are counted; the right "
                 "one is served");
    return 0;
}
