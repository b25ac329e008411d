/*
 * bt_prom_test.h - reading Prometheus text in tests: one HTTP exchange
 * with a metrics port on 127.0.0.1, the value of one sample line, and the
 * sum of a family's samples.
 */
#ifndef BT_TESTS_BT_PROM_TEST_H
#define BT_TESTS_BT_PROM_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bt_test.h"

/* Sends req[0..len) to 127.0.0.1:port on a new connection and reads the
 * response until the server closes (a 5 s receive timeout bounds it)
 * into resp (NUL-terminated, at most cap - 1 bytes).  Returns the HTTP
 * status, -1 when there is no connection or no status line.  A server
 * may answer before reading all of req: the send stops there. */
__attribute__((unused)) static int prom_http_raw(int port, const char *req,
                                                 size_t len, char *resp,
                                                 size_t cap)
{
    struct sockaddr_in a;
    struct timeval tv = { 5, 0 };
    size_t got = 0, sent = 0;
    int fd, status = -1;

    resp[0] = '\0';
    fd = socket(AF_INET, SOCK_STREAM, 0);
    BT_CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    while (sent < len) {
        ssize_t n = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        sent += (size_t)n;
    }
    for (;;) {
        ssize_t n = recv(fd, resp + got, cap - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == cap - 1)
            break;
    }
    resp[got] = '\0';
    close(fd);
    if (got > 12 && strncmp(resp, "HTTP/1.1 ", 9) == 0)
        status = atoi(resp + 9);
    return status;
}

/* GET path (prom_http_raw). */
__attribute__((unused)) static int prom_http_get(int port, const char *path,
                                                 char *resp, size_t cap)
{
    char req[512];

    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
    return prom_http_raw(port, req, strlen(req), resp, cap);
}

/* The value of the sample line `sample` ("name" or "name{labels}"), -1
 * when there is none. */
__attribute__((unused)) static double metric(const char *body,
                                             const char *sample)
{
    size_t n = strlen(sample);

    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, sample, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return -1;
}

/* The sum of every sample of family `name` (all label values). */
__attribute__((unused)) static double metric_sum(const char *body,
                                                 const char *name)
{
    size_t n = strlen(name);
    double sum = 0;

    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, name, n) == 0 && (p[n] == '{' || p[n] == ' ')) {
            const char *sp = strchr(p, ' ');
            if (sp != NULL)
                sum += atof(sp + 1);
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return sum;
}

/* GET /metrics on port and the value of its sample line `sample`; -1
 * when there is no connection or no such sample. */
__attribute__((unused)) static double prom_scrape(int port,
                                                  const char *sample)
{
    static char resp[1 << 20];
    const char *body;

    if (prom_http_get(port, "/metrics", resp, sizeof(resp)) != 200)
        return -1;
    body = strstr(resp, "\r\n\r\n");
    return body != NULL ? metric(body + 4, sample) : -1;
}

/* Waits (bounded) until `sample` on port reads within [lo, hi]; fails
 * the test after timeout_ms.  Returns the last value read. */
__attribute__((unused)) static double prom_wait(int port, const char *sample,
                                                double lo, double hi,
                                                int timeout_ms)
{
    double v = -1;

    for (int t = 0; t < timeout_ms; t += 20) {
        v = prom_scrape(port, sample);
        if (v >= lo && v <= hi)
            return v;
        usleep(20000);
    }
    BT_TEST_FAIL("%s on port %d is %g, want %g..%g", sample, port, v, lo,
                 hi);
    return v;
}

#endif /* BT_TESTS_BT_PROM_TEST_H */
