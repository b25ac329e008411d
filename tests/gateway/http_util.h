/*
 * http_util.h - a small blocking HTTP/1.1 client for baton-http tests
 * (no curl): raw sends, response reading (Content-Length, chunked, or
 * until close), SSE event parsing, and starting a cluster + baton-http.
 * Every socket has a receive timeout so a hung server fails the test
 * instead of hanging it.
 */
#ifndef BT_TESTS_GATEWAY_HTTP_UTIL_H
#define BT_TESTS_GATEWAY_HTTP_UTIL_H

#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/time.h>

#include "cluster/cluster_util.h"

#define HT_FN __attribute__((unused)) static

/* cluster_util.h helpers a gateway test may not call (-Wunused). */
__attribute__((unused)) static void (*const ht_keep_cu_collect)(
    client_t *, cu_result_t *, int, int) = cu_collect;

typedef struct {
    int status;        /* HTTP status, -1: no response */
    char head[8192];   /* status line + headers */
    char *body;        /* bt_malloc'ed, NUL-terminated (chunked: decoded) */
    size_t body_len;
    bool closed;       /* the server closed the connection after it */
} ht_resp_t;

HT_FN void ht_resp_free(ht_resp_t *r)
{
    BT_FREE(r->body);
}

HT_FN int ht_connect(int port)
{
    struct sockaddr_in a;
    struct timeval tv = { 15, 0 };
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        BT_TEST_FAIL("cannot connect to 127.0.0.1:%d: %s", port,
                     strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Sends all bytes; false when the server closed the connection. */
HT_FN bool ht_send(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Buffered reader over a socket (a response may be followed by the next
 * one in the same buffer when requests are pipelined). */
typedef struct {
    int fd;
    char buf[1 << 16];
    size_t len;
    size_t off;
    bool eof;
} ht_conn_t;

HT_FN void ht_conn_init(ht_conn_t *c, int fd)
{
    c->fd = fd;
    c->len = c->off = 0;
    c->eof = false;
}

HT_FN bool ht_fill(ht_conn_t *c)
{
    ssize_t n;

    if (c->off > 0) {
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->len == sizeof(c->buf) || c->eof)
        return false;
    n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
    if (n <= 0) {
        c->eof = true;
        return false;
    }
    c->len += (size_t)n;
    return true;
}

/* A line (without CRLF) into out; false at EOF. */
HT_FN bool ht_line(ht_conn_t *c, char *out, size_t cap)
{
    for (;;) {
        char *nl = memchr(c->buf + c->off, '\n', c->len - c->off);
        if (nl != NULL) {
            size_t n = (size_t)(nl - (c->buf + c->off));
            size_t k = n > 0 && nl[-1] == '\r' ? n - 1 : n;
            if (k >= cap)
                k = cap - 1;
            memcpy(out, c->buf + c->off, k);
            out[k] = '\0';
            c->off += n + 1;
            return true;
        }
        if (!ht_fill(c))
            return false;
    }
}

HT_FN bool ht_bytes(ht_conn_t *c, char *out, size_t n)
{
    while (c->len - c->off < n)
        if (!ht_fill(c))
            return false;
    memcpy(out, c->buf + c->off, n);
    c->off += n;
    return true;
}

HT_FN bool ht_body_append(ht_resp_t *r, const char *data, size_t n)
{
    char *b = bt_realloc(r->body, r->body_len + n + 1, "ht_body");
    if (b == NULL)
        return false;
    memcpy(b + r->body_len, data, n);
    r->body = b;
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return true;
}

/* The value of header `name` in r->head ("" when absent). */
HT_FN const char *ht_header(const ht_resp_t *r, const char *name, char *out,
                             size_t cap)
{
    const char *p = r->head;
    size_t nl = strlen(name);

    out[0] = '\0';
    while ((p = strchr(p, '\n')) != NULL) {
        p++;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1, *e;
            while (*v == ' ')
                v++;
            e = strpbrk(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)(e ? e - v : (long)strlen(v)), v);
            break;
        }
    }
    return out;
}

/* Reads one response (a 100 Continue before it is skipped). */
HT_FN int ht_read(ht_conn_t *c, ht_resp_t *r)
{
    char line[8192], v[128];
    size_t hl = 0;
    bool chunked;
    long long clen;

    memset(r, 0, sizeof(*r));
    r->status = -1;
    for (;;) {
        if (!ht_line(c, line, sizeof(line)))
            goto closed;
        if (line[0] == '\0')
            continue;
        r->status = atoi(line + 9);
        hl = (size_t)snprintf(r->head, sizeof(r->head), "%s\n", line);
        while (ht_line(c, line, sizeof(line)) && line[0] != '\0')
            hl += (size_t)snprintf(r->head + hl, sizeof(r->head) - hl, "%s\n",
                                   line);
        if (r->status != 100)
            break;
    }
    ht_body_append(r, "", 0);
    chunked = strstr(ht_header(r, "Transfer-Encoding", v, sizeof(v)),
                     "chunked") != NULL;
    ht_header(r, "Content-Length", v, sizeof(v));
    clen = v[0] ? atoll(v) : -1;
    if (chunked) {
        for (;;) {
            long n;
            char *data;
            if (!ht_line(c, line, sizeof(line)))
                goto closed;
            n = strtol(line, NULL, 16);
            if (n == 0) {
                ht_line(c, line, sizeof(line));
                break;
            }
            data = bt_malloc((size_t)n + 2, "ht_chunk");
            if (!ht_bytes(c, data, (size_t)n + 2)) {
                bt_free(data);
                goto closed;
            }
            ht_body_append(r, data, (size_t)n);
            bt_free(data);
        }
    } else if (clen >= 0) {
        char *data = bt_malloc((size_t)clen + 1, "ht_chunk");
        if (!ht_bytes(c, data, (size_t)clen)) {
            bt_free(data);
            goto closed;
        }
        ht_body_append(r, data, (size_t)clen);
        bt_free(data);
    } else {
        while (ht_fill(c) || c->len > c->off) {
            ht_body_append(r, c->buf + c->off, c->len - c->off);
            c->off = c->len;
        }
    }
    ht_header(r, "Connection", v, sizeof(v));
    r->closed = strcasecmp(v, "close") == 0;
    return r->status;
closed:
    r->closed = true;
    return r->status;
}

/* One request on a fresh connection; the connection is closed after. */
HT_FN int ht_raw(int port, const void *req, size_t len, ht_resp_t *r)
{
    ht_conn_t *c = bt_malloc(sizeof(*c), "ht_conn");
    int fd = ht_connect(port);

    ht_conn_init(c, fd);
    ht_send(fd, req, len);
    ht_read(c, r);
    close(fd);
    bt_free(c);
    return r->status;
}

/* METHOD path with an optional JSON body on a fresh connection. */
HT_FN int ht_request(int port, const char *method, const char *path,
                      const char *body, ht_resp_t *r)
{
    size_t blen = body ? strlen(body) : 0;
    char *req = bt_malloc(blen + 512, "ht_req");
    int n = snprintf(req, 512,
                     "%s %s HTTP/1.1\r\nHost: test\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, blen);
    int status;

    memcpy(req + n, body ? body : "", blen);
    status = ht_raw(port, req, (size_t)n + blen, r);
    bt_free(req);
    return status;
}

/* The SSE events of a stream body: concatenates choices[0].text or
 * choices[0].delta.content into text (cap bytes), keeps the last
 * finish_reason and usage.completion_tokens; counts events and checks
 * the stream ends with [DONE]. */
typedef struct {
    char text[8192];
    char finish[32];
    int n_events;
    int usage_completion; /* -1 when no usage chunk */
    int usage_prompt;
    bool done;
    bool role_seen;
    bool error_seen;
} ht_sse_t;

HT_FN void ht_sse_parse(const char *body, ht_sse_t *s)
{
    const char *p = body;
    size_t tl = 0;

    memset(s, 0, sizeof(*s));
    s->usage_completion = s->usage_prompt = -1;
    while ((p = strstr(p, "data: ")) != NULL) {
        const char *e = strstr(p, "\n\n");
        cJSON *j, *ch, *c0, *u;
        if (e == NULL)
            BT_TEST_FAIL("SSE event not terminated by a blank line");
        p += 6;
        if (e - p == 6 && memcmp(p, "[DONE]", 6) == 0) {
            s->done = true;
            if (e[2] != '\0')
                BT_TEST_FAIL("bytes after data: [DONE]");
            break;
        }
        j = cJSON_ParseWithLength(p, (size_t)(e - p));
        if (j == NULL)
            BT_TEST_FAIL("SSE event is not JSON: %.*s", (int)(e - p), p);
        s->n_events++;
        if (cJSON_GetObjectItem(j, "error"))
            s->error_seen = true;
        ch = cJSON_GetObjectItem(j, "choices");
        c0 = ch ? cJSON_GetArrayItem(ch, 0) : NULL;
        if (c0 != NULL) {
            cJSON *t = cJSON_GetObjectItem(c0, "text");
            cJSON *d = cJSON_GetObjectItem(c0, "delta");
            cJSON *f = cJSON_GetObjectItem(c0, "finish_reason");
            if (d != NULL) {
                if (cJSON_GetObjectItem(d, "role"))
                    s->role_seen = true;
                t = cJSON_GetObjectItem(d, "content");
            }
            if (cJSON_IsString(t)) {
                size_t n = strlen(t->valuestring);
                if (tl + n < sizeof(s->text)) {
                    memcpy(s->text + tl, t->valuestring, n + 1);
                    tl += n;
                }
            }
            if (cJSON_IsString(f))
                snprintf(s->finish, sizeof(s->finish), "%s", f->valuestring);
        }
        u = cJSON_GetObjectItem(j, "usage");
        if (cJSON_IsObject(u)) {
            s->usage_completion =
                cJSON_GetObjectItem(u, "completion_tokens")->valueint;
            s->usage_prompt = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
        }
        cJSON_Delete(j);
        p = e + 2;
    }
}

/* Starts baton-http on a free port with extra NULL-terminated args and
 * waits until it answers; returns the port. */
HT_FN int ht_start_gateway(const char *router_ep, ...)
{
    char listen[64], *args[40];
    int port = cu_free_port(), n = 0;
    va_list ap;

    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    args[n++] = "--router";
    args[n++] = (char *)router_ep;
    args[n++] = "--listen";
    args[n++] = listen;
    va_start(ap, router_ep);
    while (n < 38 && (args[n] = va_arg(ap, char *)) != NULL)
        n++;
    va_end(ap);
    args[n] = NULL;
    {
        char path[512];
        pid_t pid;
        snprintf(path, sizeof(path), "%s/baton-http", BT_BIN_DIR);
        pid = fork();
        if (pid == 0) {
            char *argv[42];
            argv[0] = path;
            for (int i = 0; i <= n; i++)
                argv[i + 1] = args[i];
            if (getenv("BT_TEST_LOGS") == NULL) {
                int fd = open("/dev/null", O_WRONLY);
                dup2(fd, 2);
                close(fd);
            }
            execv(path, argv);
            _exit(127);
        }
        BT_CHECK(pid > 0 && cu_n_pids < CU_MAX_PROCS);
        cu_pids[cu_n_pids++] = pid;
    }
    for (int t = 0; t < 200; t++) {
        struct sockaddr_in a;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
            close(fd);
            return port;
        }
        close(fd);
        usleep(25000);
    }
    BT_TEST_FAIL("baton-http did not start on port %d", port);
    return -1;
}

/* Waits until GET /health answers 200 (workers registered). */
HT_FN void ht_wait_healthy(int port, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 50) {
        ht_resp_t r;
        int st = ht_request(port, "GET", "/health", NULL, &r);
        ht_resp_free(&r);
        if (st == 200)
            return;
        usleep(50000);
    }
    BT_TEST_FAIL("baton-http /health never became 200");
}

/* Runs `baton run` greedy on the aidreams model and returns its output
 * without the final newline (bt_malloc'ed).  extra: more arguments. */
HT_FN char *ht_baton_run(const char *extra)
{
    char cmd[4096], *out = NULL;
    size_t len = 0;
    FILE *f;

    snprintf(cmd, sizeof(cmd),
             "%s/baton run --model %s/models/aidreams260K.bin "
             "--tokenizer %s/models/aidreams-tok512.bin --threads 1 "
             "--device cpu %s",
             BT_BIN_DIR, BT_SHARED_DIR, BT_SHARED_DIR, extra);
    f = popen(cmd, "r");
    BT_CHECK(f != NULL);
    for (;;) {
        char buf[4096];
        size_t n = fread(buf, 1, sizeof(buf), f);
        if (n == 0)
            break;
        out = bt_realloc(out, len + n + 1, "ht_run");
        memcpy(out + len, buf, n);
        len += n;
    }
    BT_ASSERT_EQ(pclose(f), 0);
    BT_CHECK(len > 0 && out[len - 1] == '\n');
    out[len - 1] = '\0';
    return out;
}

/* A JSON string literal of s (bt_malloc'ed), via cJSON. */
HT_FN char *ht_json_str(const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    char *p = cJSON_PrintUnformatted(j);
    char *out = bt_strdup(p, "ht_json");
    cJSON_free(p);
    cJSON_Delete(j);
    return out;
}

#endif /* BT_TESTS_GATEWAY_HTTP_UTIL_H */
