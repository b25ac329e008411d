/*
 * test_bench_http.c - the HTTP/1.1 + SSE client of `baton bench --http`
 * (client/cli_bench_http.c) against a scripted server: a forked child
 * that accepts one connection and answers each request with canned
 * bytes.  Covers chunked and Content-Length SSE, events split across
 * reads and chunks, CRLF lines, multi-line data, comments, 100 Continue,
 * keep-alive reuse, a non-200 JSON body, Connection: close bodies, and
 * the strict failures (bad status line, bad chunk size, oversized
 * headers and events, a close mid-response, a refused connect), plus URL
 * parsing.  Every wait is bounded: the client loop by a deadline, the
 * child by alarm().
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bt_test.h"
#include "bt_util.h"

#include "../../client/cli_bench_http.c"

typedef struct {
    char data[4][256]; /* events seen */
    size_t len[4];
    int n;
} events_t;

static void on_event(void *arg, const char *data, size_t len)
{
    events_t *e = arg;

    BT_CHECK(data[len] == '\0');
    if (e->n < 4) {
        snprintf(e->data[e->n], sizeof(e->data[0]), "%.*s", (int)len, data);
        e->len[e->n] = len;
    }
    e->n++;
}

static int listen_port(int *port_p)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    BT_CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    BT_CHECK(listen(fd, 4) == 0);
    BT_CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

/* Reads one request (headers + Content-Length body); false at EOF. */
static bool read_request(int fd)
{
    char buf[65536];
    size_t n = 0;

    for (;;) {
        char *end;
        ssize_t k = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
        if (k <= 0)
            return false;
        n += (size_t)k;
        buf[n] = '\0';
        end = strstr(buf, "\r\n\r\n");
        if (end != NULL) {
            char *cl = strcasestr(buf, "Content-Length:");
            size_t want = (size_t)(end + 4 - buf) + (cl ? atoi(cl + 15) : 0);
            if (strncmp(buf, "POST /v1/completions HTTP/1.1\r\n", 31) != 0)
                _exit(3);
            if (n >= want)
                return true;
        }
    }
}

/* Child: per request, writes the next response of resp[] (split in two
 * writes at its middle, to cut lines and chunks); then closes. */
static pid_t serve(int lfd, const char *const *resp, const size_t *lens,
                   int n_resp)
{
    pid_t pid = fork();

    BT_CHECK(pid >= 0);
    if (pid == 0) {
        int fd;
        alarm(10);
        fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            _exit(2);
        for (int i = 0; i < n_resp; i++) {
            size_t half = lens[i] / 2;
            if (!read_request(fd))
                _exit(4);
            if (send(fd, resp[i], half, MSG_NOSIGNAL) < 0)
                _exit(5);
            usleep(20000);
            if (send(fd, resp[i] + half, lens[i] - half, MSG_NOSIGNAL) < 0)
                _exit(5);
        }
        usleep(100000);
        close(fd);
        _exit(0);
    }
    return pid;
}

/* Runs the client's io until the response ends; bounded to 5 s. */
static bt_status_t run_io(cli_http_t *h, events_t *ev)
{
    uint64_t t_end = bt_time_ns() + 5000000000ull;

    for (;;) {
        struct pollfd p = { cli_http_fd(h), cli_http_poll_events(h), 0 };
        bt_status_t status;
        if (bt_time_ns() > t_end)
            BT_TEST_FAIL("client io did not finish in 5 s");
        poll(&p, 1, 50);
        status = cli_http_io(h, on_event, ev);
        if (status != BT_IN_PROGRESS)
            return status;
    }
}

static bt_status_t one(const char *resp, size_t len, events_t *ev,
                       cli_http_t **h_keep)
{
    const char *rs[1] = { resp };
    size_t ls[1] = { len };
    cli_http_url_t url;
    cli_http_t *h = NULL;
    int port, lfd = listen_port(&port), st;
    char u[64];
    pid_t pid;
    bt_status_t status;

    snprintf(u, sizeof(u), "http://127.0.0.1:%d", port);
    BT_ASSERT_OK(cli_http_url_parse(u, "/v1/completions", &url));
    pid = serve(lfd, rs, ls, 1);
    memset(ev, 0, sizeof(*ev));
    BT_ASSERT_OK(cli_http_create(&url, &h));
    BT_ASSERT_OK(cli_http_post(h, "{}", 2));
    status = run_io(h, ev);
    if (h_keep != NULL)
        *h_keep = NULL;
    cli_http_destroy(&h);
    waitpid(pid, &st, 0);
    close(lfd);
    return status;
}

#define S(lit) lit, sizeof(lit) - 1

static void test_keepalive_sse(void)
{
    const char *resp[3] = {
        "HTTP/1.1 100 Continue\r\n\r\n"
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
        "12\r\ndata: {\"a\":1}\r\n\r\n\r\n"   /* 18 bytes, CRLF lines */
        "1a\r\n: comment\ndata: x\ndata:y\n\n\r\n"
        "e\r\ndata: [DONE]\n\n\r\n"
        "0\r\n\r\n",
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
        "Content-Length: 22\r\n\r\n{\"error\":{\"code\":\"x\"}}",
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        "Connection: close\r\n\r\ndata: last\n\n",
    };
    size_t lens[3];
    cli_http_url_t url;
    cli_http_t *h = NULL;
    events_t ev;
    int port, lfd = listen_port(&port), st;
    char u[64];
    pid_t pid;

    for (int i = 0; i < 3; i++)
        lens[i] = strlen(resp[i]);
    snprintf(u, sizeof(u), "127.0.0.1:%d/", port);
    BT_ASSERT_OK(cli_http_url_parse(u, "/v1/completions", &url));
    pid = serve(lfd, resp, lens, 3);
    BT_ASSERT_OK(cli_http_create(&url, &h));
    BT_ASSERT_OK(cli_http_post(h, "{\"p\":1}", 7));

    memset(&ev, 0, sizeof(ev));
    BT_ASSERT_EQ(run_io(h, &ev), BT_OK);
    BT_ASSERT_EQ(cli_http_status(h), 200);
    BT_ASSERT_EQ(ev.n, 3);
    BT_ASSERT_STREQ(ev.data[0], "{\"a\":1}");
    BT_ASSERT_STREQ(ev.data[1], "x\ny");
    BT_ASSERT_STREQ(ev.data[2], "[DONE]");
    BT_CHECK(cli_http_is_reusable(h));

    /* the same connection again: a 400 with a JSON body */
    BT_ASSERT_OK(cli_http_post(h, "{}", 2));
    memset(&ev, 0, sizeof(ev));
    BT_ASSERT_EQ(run_io(h, &ev), BT_OK);
    BT_ASSERT_EQ(cli_http_status(h), 400);
    BT_ASSERT_EQ(ev.n, 0);
    BT_ASSERT_STREQ(cli_http_body(h), "{\"error\":{\"code\":\"x\"}}");
    BT_CHECK(cli_http_is_reusable(h));

    /* and a third: no framing, the close ends it */
    BT_ASSERT_OK(cli_http_post(h, "{}", 2));
    memset(&ev, 0, sizeof(ev));
    BT_ASSERT_EQ(run_io(h, &ev), BT_OK);
    BT_ASSERT_EQ(ev.n, 1);
    BT_ASSERT_STREQ(ev.data[0], "last");
    BT_CHECK(!cli_http_is_reusable(h));
    BT_ASSERT_EQ(cli_http_post(h, "{}", 2), BT_ERR_INVALID_ARG);
    cli_http_destroy(&h);
    BT_CHECK(h == NULL);
    waitpid(pid, &st, 0);
    BT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(lfd);
}

static void test_failures(void)
{
    events_t ev;
    char *big;
    size_t n;

    /* Content-Length SSE */
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"
                       "\r\nContent-Length: 18\r\n\r\ndata: a\n\ndata: b\n\n"),
                     &ev, NULL), BT_OK);
    BT_ASSERT_EQ(ev.n, 2);
    /* not HTTP */
    BT_ASSERT_EQ(one(S("HTTX/1.1 200 OK\r\n\r\n"), &ev, NULL), BT_ERR_FORMAT);
    /* bad chunk size */
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "zz\r\n"), &ev, NULL), BT_ERR_FORMAT);
    /* a chunk not followed by CRLF */
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "2\r\nabXY\r\n0\r\n\r\n"), &ev, NULL), BT_ERR_FORMAT);
    /* unsupported transfer coding, bad Content-Length */
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
                     &ev, NULL), BT_ERR_FORMAT);
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n"),
                     &ev, NULL), BT_ERR_FORMAT);
    /* the server closes mid-response: an event was delivered, then IO */
    BT_ASSERT_EQ(one(S("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"
                       "\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "9\r\ndata: a\n\n\r\n"), &ev, NULL), BT_ERR_IO);
    BT_ASSERT_EQ(ev.n, 1);
    /* headers over the bound */
    n = CLI_HTTP_MAX_HEAD + 4096;
    big = bt_malloc(n + 64, "test");
    n = (size_t)snprintf(big, 64, "HTTP/1.1 200 OK\r\n");
    while (n < CLI_HTTP_MAX_HEAD + 1024)
        n += (size_t)sprintf(big + n, "X-Pad: %060d\r\n", 0);
    n += (size_t)sprintf(big + n, "\r\n");
    BT_ASSERT_EQ(one(big, n, &ev, NULL), BT_ERR_FORMAT);
    bt_free(big);
    /* one SSE event over the bound (no blank line for 1 MiB + ) */
    n = CLI_HTTP_MAX_EVENT + CLI_HTTP_MAX_EVENT / 4; /* 58/64 of it data */
    big = bt_malloc(n + 256, "test");
    {
        size_t k = (size_t)snprintf(big, 256, "HTTP/1.1 200 OK\r\n"
                                    "Content-Type: text/event-stream\r\n"
                                    "Content-Length: %zu\r\n\r\n", n);
        for (size_t i = 0; i < n; i += 64) {
            memcpy(big + k, "data: ", 6);
            memset(big + k + 6, 'x', 57);
            big[k + 63] = '\n';
            k += 64;
        }
        BT_ASSERT_EQ(one(big, k, &ev, NULL), BT_ERR_FORMAT);
    }
    bt_free(big);
    /* nothing listens */
    {
        cli_http_url_t url;
        cli_http_t *h = NULL;
        int port, lfd = listen_port(&port);
        char u[64];
        close(lfd);
        snprintf(u, sizeof(u), "http://127.0.0.1:%d/v1/completions", port);
        BT_ASSERT_OK(cli_http_url_parse(u, "/x", &url));
        BT_ASSERT_STREQ(url.path, "/v1/completions");
        BT_ASSERT_OK(cli_http_create(&url, &h));
        cli_http_post(h, "{}", 2);
        memset(&ev, 0, sizeof(ev));
        BT_ASSERT_EQ(run_io(h, &ev), BT_ERR_IO);
        BT_CHECK(!cli_http_got_bytes(h));
        BT_CHECK(strstr(cli_http_error(h), "connect") != NULL);
        cli_http_destroy(&h);
    }
}

static void test_url(void)
{
    cli_http_url_t u;

    BT_ASSERT_OK(cli_http_url_parse("http://127.0.0.1:8000", "/d", &u));
    BT_ASSERT_STREQ(u.host, "127.0.0.1");
    BT_ASSERT_STREQ(u.port, "8000");
    BT_ASSERT_STREQ(u.path, "/d");
    BT_ASSERT_OK(cli_http_url_parse("localhost/v1/x", "/d", &u));
    BT_ASSERT_STREQ(u.port, "80");
    BT_ASSERT_STREQ(u.path, "/v1/x");
    BT_ASSERT_OK(cli_http_url_parse("http://[::1]:9/", "/d", &u));
    BT_ASSERT_STREQ(u.host, "::1");
    BT_ASSERT_STREQ(u.port, "9");
    BT_ASSERT_EQ(cli_http_url_parse("https://h:1", "/d", &u),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(cli_http_url_parse("http://:80", "/d", &u),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(cli_http_url_parse("http://h:8x0", "/d", &u),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(cli_http_url_parse("http://h:80/a b", "/d", &u),
                 BT_ERR_INVALID_ARG);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_url();
    test_keepalive_sse();
    test_failures();
    BT_TEST_PASS("cli/bench_http");
    return 0;
}
