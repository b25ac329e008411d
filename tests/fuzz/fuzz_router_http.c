/*
 * fuzz_router_http.c - libFuzzer target for the router's metrics HTTP
 * request parser (router/router_http.c: router__http_parse).
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
#include "router_int.h"

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
    router_http_req_t req;
    bt_status_t status;
    const uint8_t *nl;

    /* An exact-size copy, so ASan sees any read past the end. */
    buf = bt_malloc(size > 0 ? size : 1, "fuzz_input");
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    status = router__http_parse(buf, size, &req);
    fz_check(status == BT_OK || status == BT_IN_PROGRESS, "bad return");
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
            for (size_t k = 0; k < first && k < ROUTER_HTTP_MAX_REQUEST; k++)
                fz_check(router__http_parse(buf, k, &req) ==
                             BT_IN_PROGRESS,
                         "decided before the first line ended");
        }
    } else {
        fz_check(size < ROUTER_HTTP_MAX_REQUEST, "oversized yet pending");
    }
    bt_free(buf);
    return 0;
}
