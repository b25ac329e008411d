/*
 * fuzz_router_http.c - libFuzzer target for the metrics and health HTTP
 * request parser that the router and the workers share
 * (common/bt_http.c: bt_http_parse, the router's /metrics and a
 * worker's /metrics and /health), and the router's wrapper of it
 * (router__http_parse), which must agree with it.
 *
 * For every input: the parse never reads past the input (ASan), answers
 * only with a status it is documented to give, and a complete answer's
 * head length lies inside the input.  A request that parses completely
 * must have parsed as "incomplete" at every prefix shorter than its
 * first line end (nothing is decided before a line is whole, except a
 * bare CR or an oversized head, which are left out).  Anything else aborts (a crash).
 *
 * Run: build-fuzz/fuzz/fuzz_router_http tests/fuzz/corpus/fuzz_router_http
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_http.h"
#include "router_int.h"

static const char *const paths[] = { "/metrics", "/health" };

static void fz_check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_router_http: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf;
    bt_http_req_t req;
    router_http_req_t rreq;
    bt_status_t status, rstatus;
    const uint8_t *nl;

    /* An exact-size copy, so ASan sees any read past the end. */
    buf = bt_malloc(size > 0 ? size : 1, "fuzz_input");
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    status = bt_http_parse(buf, size, paths, 2, &req);
    fz_check(status == BT_OK || status == BT_IN_PROGRESS, "bad return");
    rstatus = router__http_parse(buf, size, &rreq);
    fz_check(rstatus == status, "the router's wrapper disagrees");
    if (status == BT_OK) {
        /* The router serves /metrics only: the same answer, except that
         * /health is a 404 there. */
        fz_check(rreq.len == req.len && rreq.head == req.head, "wrapper");
        fz_check(rreq.status == (req.status == 200 && req.route == 1
                                     ? 404 : req.status),
                 "the router's status differs");
        fz_check(req.status != 200 || req.route == 0 || req.route == 1,
                 "bad route");
    }
    if (status == BT_OK) {
        fz_check(req.status == 200 || req.status == 400 ||
                     req.status == 404 || req.status == 405 ||
                     req.status == 431 || req.status == 505,
                 "unexpected status");
        fz_check(req.len > 0 && req.len <= size, "head length outside");
        fz_check(req.status != 200 || req.len >= 16, "short 200");
        /* Prefixes without a whole line (and no CR, small) are pending. */
        nl = memchr(buf, '\n', size);
        if (nl != NULL && memchr(buf, '\r', (size_t)(nl - (uint8_t *)buf)) ==
                              NULL) {
            size_t first = (size_t)(nl - (uint8_t *)buf);
            for (size_t k = 0; k < first && k < BT_HTTP_MAX_REQUEST; k++)
                fz_check(bt_http_parse(buf, k, paths, 2, &req) ==
                             BT_IN_PROGRESS,
                         "decided before the first line ended");
        }
    } else {
        fz_check(size < BT_HTTP_MAX_REQUEST, "oversized yet pending");
    }
    bt_free(buf);
    return 0;
}
