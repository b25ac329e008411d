/*
 * gateway_bench.c - baton-http-bench: closed-loop load on baton-http or,
 * for comparison, on the router directly over ZeroMQ, to measure what the
 * HTTP gateway adds (requests/s, latency percentiles).
 *
 *   baton-http-bench --http 127.0.0.1:8000 -n 20000 -c 16 --max-tokens 16
 *   baton-http-bench --router tcp://127.0.0.1:5555 -n 20000 -c 16 ...
 *
 * HTTP: c threads, each with one keep-alive connection, sending
 * completions with a fixed token-id prompt (stream or not) and reading
 * whole responses.  ZMQ: one client keeping c requests in flight.
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_util.h"
#include "client.h"

typedef struct {
    const char *host;
    int port;
    int n_requests;      /* this thread's share */
    int max_tokens;
    int stream;
    double *lat;         /* (n_requests) seconds */
    int done;
    int errors;
} bench_thread_t;

static int connect_to(const char *host, int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Reads one response: Content-Length or chunked (until 0\r\n\r\n).
 * Returns the HTTP status, -1 on a broken connection. */
static int read_response(int fd, char *buf, size_t cap)
{
    size_t len = 0, head = 0, need = 0;
    int status = -1;
    bool chunked = false;

    for (;;) {
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        char *end;
        if (n <= 0)
            return -1;
        len += (size_t)n;
        buf[len] = '\0';
        if (head == 0 && (end = strstr(buf, "\r\n\r\n")) != NULL) {
            char *cl = strcasestr(buf, "Content-Length:");
            head = (size_t)(end - buf) + 4;
            status = atoi(buf + 9);
            chunked = strcasestr(buf, "Transfer-Encoding: chunked") != NULL;
            if (!chunked)
                need = head + (cl ? (size_t)atol(cl + 15) : 0);
        }
        if (head > 0 && !chunked && len >= need)
            return status;
        if (head > 0 && chunked && len >= 5 &&
            memcmp(buf + len - 5, "0\r\n\r\n", 5) == 0)
            return status;
        if (len + 1 >= cap)
            return -1;
    }
}

static void *http_thread(void *arg)
{
    bench_thread_t *t = arg;
    char *buf = malloc(1 << 20);
    char req[1024], body[256];
    int fd = connect_to(t->host, t->port);
    int blen, rlen;

    blen = snprintf(body, sizeof(body),
                    "{\"prompt\":[1,2,3,4],\"max_tokens\":%d,"
                    "\"temperature\":0,\"ignore_eos\":true,\"stream\":%s}",
                    t->max_tokens, t->stream ? "true" : "false");
    rlen = snprintf(req, sizeof(req),
                    "POST /v1/completions HTTP/1.1\r\nHost: bench\r\n"
                    "Content-Type: application/json\r\n"
                    "Content-Length: %d\r\n\r\n%s", blen, body);
    for (int i = 0; i < t->n_requests && fd >= 0 && buf; i++) {
        uint64_t t0 = bt_time_ns();
        int status;
        if (send(fd, req, (size_t)rlen, MSG_NOSIGNAL) != rlen)
            break;
        status = read_response(fd, buf, 1 << 20);
        if (status < 0)
            break;
        if (status != 200)
            t->errors++;
        t->lat[t->done++] = (double)(bt_time_ns() - t0) * 1e-9;
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *lat, int n, int errors,
                   double secs, int conc, int max_tokens)
{
    qsort(lat, (size_t)n, sizeof(*lat), cmp_double);
    printf("mode:%s requests:%d errors:%d concurrency:%d max_tokens:%d "
           "secs:%.3f req_per_s:%.1f p50_ms:%.3f p90_ms:%.3f p99_ms:%.3f\n",
           what, n, errors, conc, max_tokens, secs, n / secs,
           n ? lat[n / 2] * 1e3 : 0, n ? lat[(int)(n * 0.9)] * 1e3 : 0,
           n ? lat[(int)(n * 0.99)] * 1e3 : 0);
}

static int run_zmq(const char *router, int n, int conc, int max_tokens)
{
    static const int prompt[] = { 1, 2, 3, 4 };
    client_t *c = NULL;
    uint64_t *rids = calloc((size_t)conc, sizeof(*rids));
    uint64_t *t0 = calloc((size_t)conc, sizeof(*t0));
    double *lat = calloc((size_t)n, sizeof(*lat));
    int sent = 0, done = 0, errors = 0;
    uint64_t start;
    client_request_t req;

    if (rids == NULL || t0 == NULL || lat == NULL ||
        client_create(router, &c) != BT_OK)
        return 1;
    client_request_init(&req);
    req.prompt_ids = prompt;
    req.n_prompt_ids = 4;
    req.max_tokens = max_tokens;
    req.ignore_eos = true;
    start = bt_time_ns();
    for (int k = 0; k < conc && sent < n; k++, sent++) {
        t0[k] = bt_time_ns();
        if (client_submit(c, &req, &rids[k]) != BT_OK)
            return 1;
    }
    while (done < n) {
        Baton__ClientMessage *m = NULL;
        uint64_t rid;
        if (client_recv(c, 10000, &m) != BT_OK) {
            fprintf(stderr, "router timeout\n");
            return 1;
        }
        rid = client_msg_request_id(m);
        if (m->body_case == BATON__CLIENT_MESSAGE__BODY_FINISHED ||
            m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR) {
            errors += m->body_case == BATON__CLIENT_MESSAGE__BODY_ERROR;
            for (int k = 0; k < conc; k++) {
                if (rids[k] != rid)
                    continue;
                lat[done++] = (double)(bt_time_ns() - t0[k]) * 1e-9;
                rids[k] = 0;
                if (sent < n) {
                    t0[k] = bt_time_ns();
                    if (client_submit(c, &req, &rids[k]) != BT_OK)
                        return 1;
                    sent++;
                }
                break;
            }
        }
        proto_client_free(&m);
    }
    report("zmq", lat, done, errors, (double)(bt_time_ns() - start) * 1e-9,
           conc, max_tokens);
    client_destroy(&c);
    free(lat);
    free(t0);
    free(rids);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "http", required_argument, 0, 'H' },
        { "router", required_argument, 0, 'r' },
        { "requests", required_argument, 0, 'n' },
        { "concurrency", required_argument, 0, 'c' },
        { "max-tokens", required_argument, 0, 't' },
        { "stream", no_argument, 0, 's' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *http = NULL, *router = NULL;
    int n = 10000, conc = 8, max_tokens = 16, stream = 0, c;
    char host[64] = "127.0.0.1";
    bench_thread_t *th;
    pthread_t *tid;
    double *all;
    int total = 0, errors = 0, port;
    uint64_t start;

    bt_log_init("bench");
    while ((c = getopt_long(argc, argv, "n:c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'H': http = optarg; break;
        case 'r': router = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 'c': conc = atoi(optarg); break;
        case 't': max_tokens = atoi(optarg); break;
        case 's': stream = 1; break;
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: baton-http-bench (--http HOST:PORT | --router EP)"
                    " [-n N] [-c C] [--max-tokens T] [--stream]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (n <= 0 || conc <= 0 || (http == NULL) == (router == NULL))
        return 2;
    if (router != NULL)
        return run_zmq(router, n, conc, max_tokens);
    if (strchr(http, ':') == NULL)
        return 2;
    snprintf(host, sizeof(host), "%.*s", (int)(strchr(http, ':') - http),
             http);
    port = atoi(strchr(http, ':') + 1);
    th = calloc((size_t)conc, sizeof(*th));
    tid = calloc((size_t)conc, sizeof(*tid));
    all = calloc((size_t)n, sizeof(*all));
    if (th == NULL || tid == NULL || all == NULL)
        return 1;
    start = bt_time_ns();
    for (int i = 0; i < conc; i++) {
        th[i].host = host;
        th[i].port = port;
        th[i].n_requests = n / conc + (i < n % conc);
        th[i].max_tokens = max_tokens;
        th[i].stream = stream;
        th[i].lat = calloc((size_t)th[i].n_requests + 1, sizeof(double));
        pthread_create(&tid[i], NULL, http_thread, &th[i]);
    }
    for (int i = 0; i < conc; i++) {
        pthread_join(tid[i], NULL);
        memcpy(all + total, th[i].lat, (size_t)th[i].done * sizeof(double));
        total += th[i].done;
        errors += th[i].errors + (th[i].n_requests - th[i].done);
        free(th[i].lat);
    }
    report(stream ? "http-stream" : "http", all, total, errors,
           (double)(bt_time_ns() - start) * 1e-9, conc, max_tokens);
    free(all);
    free(tid);
    free(th);
    return errors ? 1 : 0;
}
