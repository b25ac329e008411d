/*
 * test_http_parse.c - the router's metrics HTTP request parser
 * (router__http_parse), byte by byte: every prefix of a valid request is
 * "incomplete", the whole one routes; each malformed kind gets its
 * status; an oversized head gets 431 without the blank line.
 */
#include <stdio.h>
#include <string.h>

#include "bt_test.h"
#include "router_int.h"

static int status_of(const char *s)
{
    router_http_req_t req;
    bt_status_t st = router__http_parse(s, strlen(s), &req);

    return st == BT_IN_PROGRESS ? 0 : req.status;
}

int main(void)
{
    static const char ok[] = "GET /metrics HTTP/1.1\r\nHost: h\r\n"
                             "Accept: */*\r\n\r\nTRAILING";
    static const struct {
        const char *req;
        int status;
    } cases[] = {
        { "GET /metrics HTTP/1.0\r\n\r\n", 200 },
        { "HEAD /metrics HTTP/1.1\nHost: h\n\n", 200 },
        { "\r\n\r\nGET /metrics#frag HTTP/1.0\r\n\r\n", 200 },
        { "GET /metrics/ HTTP/1.0\r\n\r\n", 404 },
        { "GET / HTTP/1.0\r\n\r\n", 404 },
        { "DELETE /metrics HTTP/1.0\r\n\r\n", 405 },
        { "GET /metrics HTTP/1.2\r\n\r\n", 505 },
        { "GET /metrics HTTP/3.0\r\n\r\n", 505 },
        { "GET /metrics HTTP/1.10\r\n\r\n", 400 },
        { "GET /metrics http/1.1\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.1\r\n\r\n", 400 },     /* no Host */
        { "GET /metrics HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\n: v\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\nA b: v\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\n\tx: v\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\nX: a\x7f\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\nContent-Length: -1\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\nContent-Length: 99999999999999999\r\n"
          "\r\n", 400 },
        { "GET /metrics HTTP/1.0\r\nContent-Length: 7\r\n"
          "content-length:  7 \r\n\r\n", 200 },
        { "GET /metrics HTTP/1.0\r\ntransfer-encoding: identity\r\n\r\n",
          400 },
        { "GET /me\x01trics HTTP/1.0\r\n\r\n", 400 },
        { "GET\t/metrics HTTP/1.0\r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0 \r\n\r\n", 400 },
        { "GET /metrics HTTP/1.0\rX", 400 },           /* bare CR, early */
        { "GET /metrics HTTP/1.0\r", 0 },             /* may be CRLF */
        { "GET /metrics HTTP/1.0\r\nHost: h\r\n", 0 }, /* no blank line */
    };
    router_http_req_t req;
    char big[ROUTER_HTTP_MAX_REQUEST + 64];
    size_t head = strstr(ok, "\r\n\r\n") + 4 - ok;

    for (size_t k = 0; k < head; k++)
        BT_ASSERT_EQ(router__http_parse(ok, k, &req), BT_IN_PROGRESS);
    BT_ASSERT_OK(router__http_parse(ok, strlen(ok), &req));
    BT_ASSERT_EQ(req.status, 200);
    BT_ASSERT_EQ(req.len, head);
    BT_CHECK(!req.head);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int st = status_of(cases[i].req);
        if (st != cases[i].status)
            BT_TEST_FAIL("case %zu: status %d, want %d", i, st,
                         cases[i].status);
    }
    BT_ASSERT_OK(router__http_parse("HEAD /metrics HTTP/1.0\r\n\r\n", 26,
                                    &req));
    BT_CHECK(req.head);
    /* An endless header block: pending until the limit, then 431. */
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET /metrics HTTP/1.0\r\nX: ", 26);
    BT_ASSERT_EQ(router__http_parse(big, ROUTER_HTTP_MAX_REQUEST - 1, &req),
                 BT_IN_PROGRESS);
    BT_ASSERT_OK(router__http_parse(big, ROUTER_HTTP_MAX_REQUEST, &req));
    BT_ASSERT_EQ(req.status, 431);
    BT_TEST_PASS("router/http_parse");
    return 0;
}
