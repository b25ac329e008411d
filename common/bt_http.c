/*
 * bt_http.c - the minimal strict HTTP/1.1 server of the metrics and
 * health endpoints (see bt_http.h).  Moved here from router/router_http.c
 * so that the router and the workers share one parser and one server.
 */
#include "bt_http.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

#define HTTP_IO_TIMEOUT_NS (5 * 1000000000ull)    /* read / write */
#define HTTP_LINGER_NS (1000000000ull)            /* drain after the reply */

typedef enum {
    CONN_FREE = 0, /* slot unused */
    CONN_READ,     /* reading the request head */
    CONN_WRITE,    /* writing the response */
    CONN_LINGER,   /* write side shut; draining input until EOF */
} conn_state_t;

typedef struct {
    conn_state_t state;
    int fd;                             /* the client socket, non-blocking */
    char in[BT_HTTP_MAX_REQUEST];   /* (n_in) request bytes so far */
    size_t n_in;
    bt_buf_t out;                   /* the response */
    size_t off;                         /* bytes of out already sent */
    uint64_t t_state;                   /* when the state began (ns) */
    int item;                           /* its poll item, -1: none */
} http_conn_t;

struct bt_http_server_s {
    int fd;                                  /* listening socket */
    int port;                                /* bound port */
    const char *const *paths;                /* (n_paths) served, not owned */
    int n_paths;
    bt_http_handler_fn handler;              /* answers them */
    http_conn_t conns[BT_HTTP_MAX_CONNS];
};

// ---------------------------------------------------------------------------
// Parsing

/* RFC 9110 token characters. */
static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
           (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Field value bytes: HTAB, SP, VCHAR, obs-text. */
static bool is_value_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static bool name_is(const char *name, size_t len, const char *want)
{
    return strlen(want) == len && strncasecmp(name, want, len) == 0;
}

/* Parses the request line buf[0..len) (no line end).  Sets req->status
 * for what it cannot serve, req->head for HEAD, *minor_p. */
static void parse_request_line(const char *buf, size_t len,
                               const char *const *paths, int n_paths,
                               bt_http_req_t *req, int *minor_p)
{
    size_t m = 0, t, t_end, p_end;
    const char *v;

    while (m < len && is_tchar((unsigned char)buf[m]))
        m++;
    if (m == 0 || m >= len || buf[m] != ' ') {
        req->status = 400;
        return;
    }
    t = m + 1;
    t_end = t;
    while (t_end < len && buf[t_end] > 0x20 && buf[t_end] < 0x7f)
        t_end++;
    if (t_end == t || t_end >= len || buf[t_end] != ' ' || buf[t] != '/') {
        req->status = 400;
        return;
    }
    v = buf + t_end + 1;
    if (len - t_end - 1 != 8 || memcmp(v, "HTTP/", 5) != 0 ||
        v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' ||
        v[7] > '9') {
        req->status = 400;
        return;
    }
    if (v[5] != '1' || v[7] > '1') {
        req->status = 505;
        return;
    }
    *minor_p = v[7] - '0';
    p_end = t;
    while (p_end < t_end && buf[p_end] != '?' && buf[p_end] != '#')
        p_end++;
    if (m == 3 && memcmp(buf, "GET", 3) == 0) {
        req->head = false;
    } else if (m == 4 && memcmp(buf, "HEAD", 4) == 0) {
        req->head = true;
    } else {
        req->status = 405;
        return;
    }
    req->status = 404;
    for (int i = 0; i < n_paths; i++) {
        size_t plen = strlen(paths[i]);
        if (p_end - t == plen && memcmp(buf + t, paths[i], plen) == 0) {
            req->status = 200;
            req->route = i;
            break;
        }
    }
}

/* Checks one header line buf[0..len).  Counts Host, remembers the
 * Content-Length (-1: none yet); false when malformed. */
static bool parse_header(const char *buf, size_t len, int *n_host,
                         long long *content_length)
{
    size_t n = 0, v;
    long long cl = 0;

    while (n < len && is_tchar((unsigned char)buf[n]))
        n++;
    if (n == 0 || n >= len || buf[n] != ':')
        return false; /* also a folded line (leading SP/HTAB) */
    for (v = n + 1; v < len; v++)
        if (!is_value_char((unsigned char)buf[v]))
            return false;
    if (name_is(buf, n, "Host")) {
        (*n_host)++;
    } else if (name_is(buf, n, "Transfer-Encoding")) {
        return false; /* no request bodies here */
    } else if (name_is(buf, n, "Content-Length")) {
        size_t a = n + 1, b = len;
        while (a < b && (buf[a] == ' ' || buf[a] == '\t'))
            a++;
        while (b > a && (buf[b - 1] == ' ' || buf[b - 1] == '\t'))
            b--;
        if (a == b || b - a > 15)
            return false;
        for (size_t k = a; k < b; k++) {
            if (buf[k] < '0' || buf[k] > '9')
                return false;
            cl = cl * 10 + (buf[k] - '0');
        }
        if (*content_length >= 0 && *content_length != cl)
            return false; /* conflicting values */
        *content_length = cl;
    }
    return true;
}

bt_status_t bt_http_parse(const char *buf, size_t len,
                          const char *const *paths, int n_paths,
                          bt_http_req_t *req)
{
    size_t at = 0;
    int minor = 1, n_host = 0;
    long long content_length = -1;
    bool have_line = false;

    memset(req, 0, sizeof(*req));
    for (;;) {
        size_t end = at, line_len;
        const char *nl;

        nl = memchr(buf + at, '\n', len - at);
        if (nl == NULL) {
            /* A bare CR can be refused before the line ends. */
            const char *cr = memchr(buf + at, '\r', len - at);
            if (cr != NULL && cr + 1 < buf + len) {
                req->status = 400;
                req->len = len;
                return BT_OK;
            }
            if (len >= BT_HTTP_MAX_REQUEST) {
                req->status = 431;
                req->len = len;
                return BT_OK;
            }
            return BT_IN_PROGRESS;
        }
        end = (size_t)(nl - buf);
        line_len = end - at;
        if (line_len > 0 && buf[end - 1] == '\r')
            line_len--;
        if (memchr(buf + at, '\r', line_len) != NULL) {
            req->status = 400; /* bare CR inside a line */
            req->len = end + 1;
            return BT_OK;
        }
        if (end + 1 > BT_HTTP_MAX_REQUEST) {
            req->status = 431;
            req->len = end + 1;
            return BT_OK;
        }
        if (!have_line) {
            if (line_len > 0) { /* empty lines before it are ignored */
                parse_request_line(buf + at, line_len, paths, n_paths, req,
                                   &minor);
                if (req->status == 400 || req->status == 505) {
                    req->len = end + 1;
                    return BT_OK;
                }
                have_line = true;
            }
        } else if (line_len == 0) {
            req->len = end + 1;
            if (minor == 1 && n_host != 1)
                req->status = 400; /* HTTP/1.1 needs exactly one Host */
            else if (minor == 0 && n_host > 1)
                req->status = 400;
            return BT_OK;
        } else if (!parse_header(buf + at, line_len, &n_host,
                                 &content_length)) {
            req->status = 400;
            req->len = end + 1;
            return BT_OK;
        }
        at = end + 1;
    }
}

// ---------------------------------------------------------------------------
// Connections

const char *bt_http_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static void conn_close(http_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    bt_buf_cleanup(&c->out);
    c->fd = -1;
    c->n_in = 0;
    c->off = 0;
    c->state = CONN_FREE;
}

static void conn_set_state(http_conn_t *c, conn_state_t state, uint64_t now)
{
    c->state = state;
    c->t_state = now;
}

/* Builds the response to `req` (the handler's answer for a 200). */
static void conn_answer(http_conn_t *c, bt_http_server_t *srv, void *arg,
                        const bt_http_req_t *req, uint64_t now)
{
    bt_buf_t body = { 0 };
    const char *type = "text/plain; charset=utf-8";
    int status = req->status;
    bt_status_t st = BT_OK;

    if (status == 200)
        status = srv->handler(arg, req->route, &body, &type);
    else
        st = bt_buf_printf(&body, "%d %s\n", status, bt_http_reason(status));
    if (status == 200 && body.data == NULL)
        status = 500; /* the handler could not write its answer */
    if (st != BT_OK || status == 500) {
        status = 500;
        type = "text/plain; charset=utf-8";
        bt_buf_cleanup(&body);
        st = bt_buf_printf(&body, "500 %s\n", bt_http_reason(500));
    }
    c->out.len = 0;
    if (st == BT_OK)
        st = bt_buf_printf(
            &c->out,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "%sConnection: close\r\n\r\n",
            status, bt_http_reason(status), type, body.len,
            status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (st == BT_OK && !req->head && body.len > 0)
        st = bt_buf_append(&c->out, body.data, body.len);
    bt_buf_cleanup(&body);
    if (st != BT_OK) {
        conn_close(c); /* out of memory: nothing sensible to send */
        return;
    }
    if (req->status != 200)
        BT_LOG_DEBUG("NET", "HTTP request answered %d", req->status);
    c->off = 0;
    conn_set_state(c, CONN_WRITE, now);
}

static void conn_read(http_conn_t *c, bt_http_server_t *srv, void *arg,
                      uint64_t now)
{
    bt_http_req_t req;

    for (;;) {
        ssize_t n;
        if (c->n_in == sizeof(c->in))
            break;
        n = recv(c->fd, c->in + c->n_in, sizeof(c->in) - c->n_in, 0);
        if (n > 0) {
            c->n_in += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0 && errno == EINTR)
            continue;
        conn_close(c); /* EOF or an error before a whole request */
        return;
    }
    if (bt_http_parse(c->in, c->n_in, srv->paths, srv->n_paths, &req) ==
        BT_IN_PROGRESS)
        return;
    conn_answer(c, srv, arg, &req, now);
}

static void conn_write(http_conn_t *c, uint64_t now)
{
    while (c->off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->off, c->out.len - c->off,
                         MSG_NOSIGNAL);
        if (n > 0) {
            c->off += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        conn_close(c);
        return;
    }
    shutdown(c->fd, SHUT_WR);
    bt_buf_cleanup(&c->out);
    conn_set_state(c, CONN_LINGER, now);
}

/* Reads and drops input until EOF (then closes). */
static void conn_drain(http_conn_t *c)
{
    char scratch[4096];

    for (;;) {
        ssize_t n = recv(c->fd, scratch, sizeof(scratch), 0);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        conn_close(c);
        return;
    }
}

static void http_accept(bt_http_server_t *http, uint64_t now)
{
    for (;;) {
        int fd = accept4(http->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        http_conn_t *c = NULL;

        if (fd < 0)
            return; /* EAGAIN, or an aborted connection */
        for (int i = 0; i < BT_HTTP_MAX_CONNS && c == NULL; i++)
            if (http->conns[i].state == CONN_FREE)
                c = &http->conns[i];
        if (c == NULL) {
            BT_LOG_WARN("NET", "HTTP: %d connections open; one refused",
                        BT_HTTP_MAX_CONNS);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->n_in = 0;
        c->off = 0;
        c->item = -1;
        conn_set_state(c, CONN_READ, now);
    }
}

// ---------------------------------------------------------------------------
// Listener

bt_status_t bt_http_server_create(const char *host, int port,
                                  const char *const *paths, int n_paths,
                                  bt_http_handler_fn handler,
                                  const char *what,
                                  bt_http_server_t **http_p)
{
    struct addrinfo hints, *res = NULL;
    struct sockaddr_storage sa;
    socklen_t sa_len = sizeof(sa);
    bt_http_server_t *http;
    char port_s[16];
    int one = 1, rc;

    if (port < 0 || port > 65535)
        return BT_ERROR(BT_ERR_INVALID_ARG, "NET", "%s port %d", what, port);
    if (n_paths < 1 || n_paths > BT_HTTP_MAX_ROUTES || handler == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "NET", "%s: %d paths", what,
                        n_paths);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(port_s, sizeof(port_s), "%d", port);
    rc = getaddrinfo(host, port_s, &hints, &res);
    if (rc != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "NET", "%s host '%s': %s", what,
                        host ? host : "", gai_strerror(rc));
    http = bt_calloc(1, sizeof(*http), "bt_http_server");
    if (http == NULL) {
        freeaddrinfo(res);
        return BT_ERR_NO_MEMORY;
    }
    for (int i = 0; i < BT_HTTP_MAX_CONNS; i++)
        http->conns[i].fd = -1;
    http->paths = paths;
    http->n_paths = n_paths;
    http->handler = handler;
    http->fd = socket(res->ai_family,
                      SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (http->fd < 0) {
        int e = errno;
        freeaddrinfo(res);
        bt_free(http);
        return BT_ERROR(BT_ERR_IO, "NET", "socket: %s", strerror(e));
    }
    setsockopt(http->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(http->fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(http->fd, 64) != 0 ||
        getsockname(http->fd, (struct sockaddr *)&sa, &sa_len) != 0) {
        int e = errno;
        freeaddrinfo(res);
        close(http->fd);
        bt_free(http);
        return BT_ERROR(BT_ERR_NET, "NET", "cannot listen on %s:%d for "
                        "%s: %s", host ? host : "*", port, what,
                        strerror(e));
    }
    freeaddrinfo(res);
    http->port = sa.ss_family == AF_INET6
                     ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                     : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    *http_p = http;
    return BT_OK;
}

void bt_http_server_destroy(bt_http_server_t **http_p)
{
    bt_http_server_t *http = *http_p;

    if (http == NULL)
        return;
    for (int i = 0; i < BT_HTTP_MAX_CONNS; i++)
        if (http->conns[i].state != CONN_FREE)
            conn_close(&http->conns[i]);
    close(http->fd);
    bt_free(http);
    *http_p = NULL;
}

int bt_http_server_port(const bt_http_server_t *http)
{
    return http->port;
}

int bt_http_server_poll_items(bt_http_server_t *http,
                              zmq_pollitem_t *items)
{
    int n = 0;

    items[n].socket = NULL;
    items[n].fd = http->fd;
    items[n].events = ZMQ_POLLIN;
    items[n].revents = 0;
    n++;
    for (int i = 0; i < BT_HTTP_MAX_CONNS; i++) {
        http_conn_t *c = &http->conns[i];
        c->item = -1;
        if (c->state == CONN_FREE)
            continue;
        c->item = n;
        items[n].socket = NULL;
        items[n].fd = c->fd;
        items[n].events = c->state == CONN_WRITE ? ZMQ_POLLOUT : ZMQ_POLLIN;
        items[n].revents = 0;
        n++;
    }
    return n;
}

void bt_http_server_process(bt_http_server_t *http, void *arg,
                            const zmq_pollitem_t *items, int n_items,
                            uint64_t now)
{
    for (int i = 0; i < BT_HTTP_MAX_CONNS; i++) {
        http_conn_t *c = &http->conns[i];
        short ev;

        if (c->state == CONN_FREE)
            continue;
        ev = c->item >= 0 && c->item < n_items ? items[c->item].revents : 0;
        if (ev & ZMQ_POLLERR) {
            conn_close(c);
            continue;
        }
        if (c->state == CONN_READ && (ev & ZMQ_POLLIN))
            conn_read(c, http, arg, now);
        if (c->state == CONN_WRITE && ((ev & ZMQ_POLLOUT) || c->off == 0))
            conn_write(c, now); /* a fresh answer is tried at once */
        if (c->state == CONN_LINGER && (ev & ZMQ_POLLIN))
            conn_drain(c);
        if (c->state != CONN_FREE &&
            now - c->t_state > (c->state == CONN_LINGER ? HTTP_LINGER_NS
                                                        : HTTP_IO_TIMEOUT_NS))
            conn_close(c);
    }
    if (n_items > 0 && (items[0].revents & ZMQ_POLLIN))
        http_accept(http, now);
}
