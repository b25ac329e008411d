/*
 * cli_bench_http.c - the non-blocking HTTP/1.1 + SSE client of
 * `baton bench --http` (see cli_bench_http.h for the contract).
 *
 * Bytes arrive into a fixed read buffer and a small state machine eats
 * them: status line, headers, then the body framed by chunked encoding,
 * Content-Length or the close.  Body bytes of a 200 text/event-stream go
 * to the SSE reader (lines; "data:" fields joined; a blank line ends an
 * event), others to a bounded kept body.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "cli_bench_http.h"

typedef enum {
    HS_IDLE,        /* nothing to do: fresh, or a response completed */
    HS_CONNECTING,  /* non-blocking connect under way */
    HS_SENDING,     /* writing the request */
    HS_STATUS,      /* waiting for the status line */
    HS_HEADERS,     /* reading header lines */
    HS_CHUNK_SIZE,  /* chunked: size line */
    HS_CHUNK_DATA,  /* chunked: chunk_left bytes of data */
    HS_CHUNK_CRLF,  /* chunked: the CRLF after a chunk */
    HS_TRAILERS,    /* chunked: trailer lines up to the blank one */
    HS_LENGTH,      /* Content-Length: body_left bytes */
    HS_UNTIL_CLOSE, /* no framing: the body ends at EOF */
    HS_DEAD         /* failed; only destroy is left */
} http_state_t;

struct cli_http_s {
    const cli_http_url_t *url;  /* not owned */
    int fd;                     /* the socket */
    http_state_t state;         /* where the parser is */
    bool connected;             /* the connect completed */
    bool pending_send;          /* a request waits for the connect */
    char *wbuf;                 /* (wlen) the request being sent */
    size_t wlen;                /* its length */
    size_t woff;                /* bytes sent */
    char rbuf[CLI_HTTP_MAX_HEAD]; /* received, not yet parsed bytes */
    size_t rlen;                /* bytes in rbuf */
    size_t roff;                /* parsed prefix of rbuf */
    size_t head_bytes;          /* status line + headers so far */
    int status;                 /* HTTP status */
    bool http11;                /* the response is HTTP/1.1 */
    bool close_after;           /* "Connection: close" */
    bool chunked;               /* Transfer-Encoding: chunked */
    long long content_length;   /* -1 when absent */
    bool sse;                   /* 200 + text/event-stream */
    bool got_bytes;             /* a response byte arrived */
    bool eof;                   /* the peer closed */
    unsigned long long chunk_left; /* bytes left in the chunk */
    unsigned long long body_left;  /* bytes left (Content-Length) */
    char *line;                 /* (line_cap) SSE: the current line */
    size_t line_len;            /* its length */
    size_t line_cap;            /* allocated */
    char *data;                 /* (data_cap) SSE: the event's data */
    size_t data_len;            /* its length */
    size_t data_cap;            /* allocated */
    bool data_seen;             /* a data field is in this event */
    char body[CLI_HTTP_MAX_BODY + 1]; /* a kept non-SSE body */
    size_t body_len;            /* its length */
    char err[256];              /* why the last call failed */
};

// ---------------------------------------------------------------------------
// URL

bt_status_t cli_http_url_parse(const char *url, const char *default_path,
                               cli_http_url_t *url_p)
{
    cli_http_url_t u;
    const char *p = url, *hs, *he, *slash, *colon;
    struct addrinfo hints, *res = NULL;
    int ret;

    memset(&u, 0, sizeof(u));
    if (strncasecmp(p, "https://", 8) == 0) {
        BT_ERROR(BT_ERR_INVALID_ARG, "CLI", "https is not supported: %s", url);
        return BT_ERR_INVALID_ARG;
    }
    if (strncasecmp(p, "http://", 7) == 0)
        p += 7;
    slash = strchr(p, '/');
    he = slash ? slash : p + strlen(p);
    hs = p;
    if (*hs == '[') { /* [v6]:port */
        const char *rb = memchr(hs, ']', (size_t)(he - hs));
        if (rb == NULL)
            goto bad;
        snprintf(u.host, sizeof(u.host), "%.*s", (int)(rb - hs - 1), hs + 1);
        colon = rb + 1 < he && rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(hs, ':', (size_t)(he - hs));
        if ((size_t)((colon ? colon : he) - hs) >= sizeof(u.host))
            goto bad;
        snprintf(u.host, sizeof(u.host), "%.*s",
                 (int)((colon ? colon : he) - hs), hs);
    }
    if (u.host[0] == '\0')
        goto bad;
    if (colon != NULL) {
        size_t n = (size_t)(he - colon - 1);
        if (n == 0 || n >= sizeof(u.port) ||
            strspn(colon + 1, "0123456789") < n)
            goto bad;
        snprintf(u.port, sizeof(u.port), "%.*s", (int)n, colon + 1);
    } else {
        snprintf(u.port, sizeof(u.port), "80");
    }
    if (slash == NULL || strcmp(slash, "/") == 0)
        snprintf(u.path, sizeof(u.path), "%s", default_path);
    else if (strlen(slash) >= sizeof(u.path) || strpbrk(slash, " \r\n"))
        goto bad;
    else
        snprintf(u.path, sizeof(u.path), "%s", slash);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    ret = getaddrinfo(u.host, u.port, &hints, &res);
    if (ret != 0 || res == NULL || res->ai_addrlen > sizeof(u.addr)) {
        BT_ERROR(BT_ERR_NOT_FOUND, "CLI", "cannot resolve %s: %s", u.host,
                     ret ? gai_strerror(ret) : "no address");
        if (res)
            freeaddrinfo(res);
        return BT_ERR_NOT_FOUND;
    }
    memcpy(&u.addr, res->ai_addr, res->ai_addrlen);
    u.addr_len = res->ai_addrlen;
    freeaddrinfo(res);
    *url_p = u;
    return BT_OK;
bad:
    BT_ERROR(BT_ERR_INVALID_ARG, "CLI",
             "bad URL '%s' (want http://HOST:PORT[/PATH])", url);
    return BT_ERR_INVALID_ARG;
}

// ---------------------------------------------------------------------------
// Connection

static bt_status_t fail(cli_http_t *h, bt_status_t status, const char *fmt,
                        ...) __attribute__((format(printf, 3, 4)));

static bt_status_t fail(cli_http_t *h, bt_status_t status, const char *fmt,
                        ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(h->err, sizeof(h->err), fmt, ap);
    va_end(ap);
    h->state = HS_DEAD;
    return status;
}

bt_status_t cli_http_create(const cli_http_url_t *url, cli_http_t **http_p)
{
    cli_http_t *h = bt_calloc(1, sizeof(*h), "bench_http");
    int one = 1;

    if (h == NULL)
        return BT_ERR_NO_MEMORY;
    h->url = url;
    h->fd = socket(url->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK |
                   SOCK_CLOEXEC, 0);
    if (h->fd < 0) {
        BT_ERROR(BT_ERR_IO, "CLI", "socket: %s", strerror(errno));
        bt_free(h);
        return BT_ERR_IO;
    }
    setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(h->fd, (const struct sockaddr *)&url->addr,
                url->addr_len) == 0) {
        h->connected = true;
        h->state = HS_IDLE;
    } else if (errno == EINPROGRESS) {
        h->state = HS_CONNECTING;
    } else { /* reported by the first cli_http_io */
        fail(h, BT_ERR_IO, "connect to %s:%s: %s", url->host, url->port,
             strerror(errno));
    }
    h->content_length = -1;
    *http_p = h;
    return BT_OK;
}

void cli_http_destroy(cli_http_t **http_p)
{
    cli_http_t *h = *http_p;

    if (h == NULL)
        return;
    if (h->fd >= 0)
        close(h->fd);
    bt_free(h->wbuf);
    bt_free(h->line);
    bt_free(h->data);
    bt_free(h);
    *http_p = NULL;
}

bt_status_t cli_http_post(cli_http_t *h, const char *body, size_t len)
{
    const cli_http_url_t *u = h->url;
    bool idle = h->state == HS_IDLE ||
                (h->state == HS_CONNECTING && !h->pending_send);
    char head[1024];
    int n;

    if (!idle || (h->status != 0 && !cli_http_is_reusable(h))) {
        BT_ERROR(BT_ERR_INVALID_ARG, "CLI", "HTTP connection not idle");
        return BT_ERR_INVALID_ARG;
    }
    n = snprintf(head, sizeof(head),
                 "POST %s HTTP/1.1\r\nHost: %s:%s\r\n"
                 "User-Agent: baton-bench\r\n"
                 "Accept: text/event-stream, application/json\r\n"
                 "Content-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n", u->path, u->host, u->port,
                 len);
    bt_free(h->wbuf);
    h->wbuf = bt_malloc((size_t)n + len, "bench_http");
    if (h->wbuf == NULL)
        return BT_ERR_NO_MEMORY;
    memcpy(h->wbuf, head, (size_t)n);
    memcpy(h->wbuf + n, body, len);
    h->wlen = (size_t)n + len;
    h->woff = 0;
    /* a new response: reset the parser (rbuf is empty: a reusable
     * connection had no extra bytes) */
    h->rlen = h->roff = 0;
    h->head_bytes = 0;
    h->status = 0;
    h->http11 = h->close_after = h->chunked = h->sse = false;
    h->content_length = -1;
    h->got_bytes = false;
    h->line_len = h->data_len = 0;
    h->data_seen = false;
    h->body_len = 0;
    h->body[0] = '\0';
    h->err[0] = '\0';
    if (h->connected)
        h->state = HS_SENDING;
    else
        h->pending_send = true;
    return BT_OK;
}

int cli_http_fd(const cli_http_t *h)
{
    return h->fd;
}

short cli_http_poll_events(const cli_http_t *h)
{
    return h->state == HS_CONNECTING || h->state == HS_SENDING ? POLLOUT
                                                               : POLLIN;
}

int cli_http_status(const cli_http_t *h)
{
    return h->status;
}

const char *cli_http_body(const cli_http_t *h)
{
    return h->body;
}

bool cli_http_is_reusable(const cli_http_t *h)
{
    return h->state == HS_IDLE && h->http11 && !h->close_after && !h->eof &&
           h->rlen == h->roff;
}

bool cli_http_got_bytes(const cli_http_t *h)
{
    return h->got_bytes;
}

const char *cli_http_error(const cli_http_t *h)
{
    return h->err;
}

// ---------------------------------------------------------------------------
// Body sinks

static bool grow(char **buf, size_t *cap, size_t need)
{
    size_t c = *cap ? *cap : 256;
    char *nb;

    if (need <= *cap)
        return true;
    while (c < need)
        c *= 2;
    nb = bt_realloc(*buf, c, "bench_http");
    if (nb == NULL)
        return false;
    *buf = nb;
    *cap = c;
    return true;
}

/* One complete SSE line (no EOL). */
static bt_status_t sse_line(cli_http_t *h, cli_http_event_cb_t cb, void *arg)
{
    const char *l = h->line;
    size_t n = h->line_len;

    if (n == 0) { /* blank line: dispatch */
        if (h->data_seen) {
            h->data[h->data_len] = '\0';
            cb(arg, h->data, h->data_len);
        }
        h->data_len = 0;
        h->data_seen = false;
        return BT_OK;
    }
    if (n >= 5 && memcmp(l, "data:", 5) == 0) {
        size_t off = n > 5 && l[5] == ' ' ? 6 : 5;
        size_t add = n - off + (h->data_seen ? 1 : 0);
        if (h->data_len + add > CLI_HTTP_MAX_EVENT)
            return fail(h, BT_ERR_FORMAT, "SSE event over %d bytes",
                        CLI_HTTP_MAX_EVENT);
        if (!grow(&h->data, &h->data_cap, h->data_len + add + 1))
            return fail(h, BT_ERR_NO_MEMORY, "out of memory");
        if (h->data_seen)
            h->data[h->data_len++] = '\n';
        memcpy(h->data + h->data_len, l + off, n - off);
        h->data_len += n - off;
        h->data_seen = true;
    }
    /* comments (':') and other fields (event, id, retry): ignored */
    return BT_OK;
}

static bt_status_t body_bytes(cli_http_t *h, const char *p, size_t n,
                              cli_http_event_cb_t cb, void *arg)
{
    if (!h->sse) {
        size_t k = n;
        if (h->body_len + k > CLI_HTTP_MAX_BODY)
            k = CLI_HTTP_MAX_BODY - h->body_len; /* the rest is dropped */
        memcpy(h->body + h->body_len, p, k);
        h->body_len += k;
        h->body[h->body_len] = '\0';
        return BT_OK;
    }
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n') {
            bt_status_t status;
            if (h->line_len > 0 && h->line[h->line_len - 1] == '\r')
                h->line_len--;
            status = sse_line(h, cb, arg);
            h->line_len = 0;
            if (status != BT_OK)
                return status;
            continue;
        }
        if (h->line_len + 2 > CLI_HTTP_MAX_EVENT)
            return fail(h, BT_ERR_FORMAT, "SSE line over %d bytes",
                        CLI_HTTP_MAX_EVENT);
        if (!grow(&h->line, &h->line_cap, h->line_len + 2))
            return fail(h, BT_ERR_NO_MEMORY, "out of memory");
        h->line[h->line_len++] = c;
    }
    return BT_OK;
}

// ---------------------------------------------------------------------------
// Parser

/* The next CRLF- (or LF-) terminated line in rbuf; NULL when incomplete. */
static char *next_line(cli_http_t *h, size_t *len_p)
{
    char *s = h->rbuf + h->roff;
    char *nl = memchr(s, '\n', h->rlen - h->roff);
    size_t n;

    if (nl == NULL)
        return NULL;
    n = (size_t)(nl - s);
    h->roff += n + 1;
    if (n > 0 && s[n - 1] == '\r')
        n--;
    s[n] = '\0';
    *len_p = n;
    return s;
}

static bt_status_t header_line(cli_http_t *h, char *l)
{
    char *colon = strchr(l, ':'), *v;

    if (colon == NULL || colon == l)
        return fail(h, BT_ERR_FORMAT, "bad header line '%.60s'", l);
    *colon = '\0';
    v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strcasecmp(l, "Content-Length") == 0) {
        char *e;
        long long n = strtoll(v, &e, 10);
        if (e == v || n < 0 || (*e != '\0' && *e != ' '))
            return fail(h, BT_ERR_FORMAT, "bad Content-Length '%.40s'", v);
        h->content_length = n;
    } else if (strcasecmp(l, "Transfer-Encoding") == 0) {
        if (strcasecmp(v, "chunked") != 0)
            return fail(h, BT_ERR_FORMAT, "unsupported Transfer-Encoding "
                        "'%.40s'", v);
        h->chunked = true;
    } else if (strcasecmp(l, "Connection") == 0) {
        if (strcasestr(v, "close") != NULL)
            h->close_after = true;
    } else if (strcasecmp(l, "Content-Type") == 0) {
        h->sse = strncasecmp(v, "text/event-stream", 17) == 0;
    }
    return BT_OK;
}

/* Ends the response. */
static bt_status_t complete(cli_http_t *h)
{
    h->state = HS_IDLE;
    if (h->sse && h->line_len > 0) /* an unterminated last line: drop */
        h->line_len = 0;
    return BT_OK;
}

/* Parses rbuf as far as it goes.  BT_IN_PROGRESS: needs more bytes. */
static bt_status_t parse(cli_http_t *h, cli_http_event_cb_t cb, void *arg)
{
    bt_status_t status;

    for (;;) {
        size_t avail = h->rlen - h->roff, n;
        char *l;

        switch (h->state) {
        case HS_STATUS:
        case HS_HEADERS:
        case HS_CHUNK_SIZE:
        case HS_CHUNK_CRLF:
        case HS_TRAILERS:
            l = next_line(h, &n);
            if (l == NULL) {
                if (h->rlen == sizeof(h->rbuf) && h->roff == 0)
                    return fail(h, BT_ERR_FORMAT, "line over %zu bytes",
                                sizeof(h->rbuf));
                return BT_IN_PROGRESS;
            }
            if (h->state == HS_STATUS || h->state == HS_HEADERS) {
                h->head_bytes += n + 2;
                if (h->head_bytes > CLI_HTTP_MAX_HEAD)
                    return fail(h, BT_ERR_FORMAT, "headers over %d bytes",
                                CLI_HTTP_MAX_HEAD);
            }
            if (h->state == HS_STATUS) {
                if (n == 0)
                    continue; /* tolerate a stray CRLF */
                if (n < 12 || strncmp(l, "HTTP/1.", 7) != 0 || l[8] != ' ' ||
                    strspn(l + 9, "0123456789") != 3)
                    return fail(h, BT_ERR_FORMAT, "not an HTTP/1.x status "
                                "line: '%.60s'", l);
                h->http11 = l[7] == '1';
                h->status = atoi(l + 9);
                h->state = HS_HEADERS;
            } else if (h->state == HS_HEADERS) {
                if (n > 0) {
                    if ((status = header_line(h, l)) != BT_OK)
                        return status;
                    continue;
                }
                if (h->status >= 100 && h->status < 200) { /* 100 Continue */
                    h->state = HS_STATUS;
                    h->chunked = h->sse = h->close_after = false;
                    h->content_length = -1;
                    continue;
                }
                if (h->status != 200)
                    h->sse = false;
                if (h->chunked) {
                    h->state = HS_CHUNK_SIZE;
                } else if (h->content_length >= 0) {
                    h->body_left = (unsigned long long)h->content_length;
                    h->state = HS_LENGTH;
                    if (h->body_left == 0)
                        return complete(h);
                } else {
                    h->state = HS_UNTIL_CLOSE;
                }
            } else if (h->state == HS_CHUNK_SIZE) {
                char *e;
                unsigned long long sz = strtoull(l, &e, 16);
                if (e == l || (*e != '\0' && *e != ';') ||
                    sz > (1ull << 30))
                    return fail(h, BT_ERR_FORMAT, "bad chunk size '%.20s'", l);
                h->chunk_left = sz;
                h->state = sz == 0 ? HS_TRAILERS : HS_CHUNK_DATA;
            } else if (h->state == HS_CHUNK_CRLF) {
                if (n != 0)
                    return fail(h, BT_ERR_FORMAT, "chunk not followed by "
                                "CRLF");
                h->state = HS_CHUNK_SIZE;
            } else { /* trailers */
                if (n == 0)
                    return complete(h);
            }
            break;
        case HS_CHUNK_DATA:
        case HS_LENGTH:
        case HS_UNTIL_CLOSE: {
            unsigned long long *left = h->state == HS_CHUNK_DATA
                                           ? &h->chunk_left
                                           : &h->body_left;
            size_t k = avail;
            if (h->state != HS_UNTIL_CLOSE && k > *left)
                k = (size_t)*left;
            if (k == 0) {
                if (h->state == HS_UNTIL_CLOSE && h->eof)
                    return complete(h);
                return BT_IN_PROGRESS;
            }
            status = body_bytes(h, h->rbuf + h->roff, k, cb, arg);
            if (status != BT_OK)
                return status;
            h->roff += k;
            if (h->state != HS_UNTIL_CLOSE) {
                *left -= k;
                if (*left == 0) {
                    if (h->state == HS_LENGTH)
                        return complete(h);
                    h->state = HS_CHUNK_CRLF;
                }
            }
            break;
        }
        default:
            return fail(h, BT_ERR_INTERNAL, "parse in state %d", h->state);
        }
    }
}

bt_status_t cli_http_io(cli_http_t *h, cli_http_event_cb_t cb, void *arg)
{
    bt_status_t status;

    if (h->state == HS_DEAD)
        return BT_ERR_IO;
    if (h->state == HS_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof(err);
        struct pollfd pfd = { h->fd, POLLOUT, 0 };
        if (poll(&pfd, 1, 0) <= 0)
            return BT_IN_PROGRESS;
        if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 ||
            err != 0)
            return fail(h, BT_ERR_IO, "connect to %s:%s: %s", h->url->host,
                        h->url->port, strerror(err ? err : errno));
        h->connected = true;
        h->state = HS_IDLE;
        if (!h->pending_send)
            return BT_IN_PROGRESS;
        h->pending_send = false;
        h->state = HS_SENDING;
    }
    if (h->state == HS_IDLE)
        return BT_OK;
    while (h->state == HS_SENDING) {
        ssize_t n = send(h->fd, h->wbuf + h->woff, h->wlen - h->woff,
                         MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return BT_IN_PROGRESS;
            if (errno == EINTR)
                continue;
            return fail(h, BT_ERR_IO, "send: %s", strerror(errno));
        }
        h->woff += (size_t)n;
        if (h->woff == h->wlen)
            h->state = HS_STATUS;
    }
    for (;;) {
        ssize_t n;
        if (h->roff > 0) { /* compact */
            memmove(h->rbuf, h->rbuf + h->roff, h->rlen - h->roff);
            h->rlen -= h->roff;
            h->roff = 0;
        }
        if (h->rlen == sizeof(h->rbuf)) {
            status = parse(h, cb, arg);
            if (status != BT_IN_PROGRESS)
                return status;
            if (h->roff == 0) /* parse could not make room */
                return fail(h, BT_ERR_FORMAT, "line over %zu bytes",
                            sizeof(h->rbuf));
            continue;
        }
        n = recv(h->fd, h->rbuf + h->rlen, sizeof(h->rbuf) - h->rlen, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return parse(h, cb, arg);
            return fail(h, BT_ERR_IO, "recv: %s", strerror(errno));
        }
        if (n == 0) {
            h->eof = true;
            status = parse(h, cb, arg);
            if (status == BT_IN_PROGRESS)
                return fail(h, BT_ERR_IO, h->got_bytes
                                              ? "server closed the "
                                                "connection mid-response"
                                              : "server closed the "
                                                "connection");
            return status;
        }
        h->got_bytes = true;
        h->rlen += (size_t)n;
        status = parse(h, cb, arg);
        if (status != BT_IN_PROGRESS)
            return status;
    }
}
