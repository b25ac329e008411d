/*
 * gateway_http.c - byte buffers and the HTTP/1.1 request parser of
 * baton-http (RFC 9112 subset: request line, header fields,
 * Content-Length bodies; no chunked request bodies).
 *
 * The parser is strict where leniency enables request smuggling
 * (Content-Length together with Transfer-Encoding, conflicting
 * Content-Length values, obsolete line folding, bare CR) and lenient
 * where clients differ harmlessly (a bare LF ends a line).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "bt_alloc.h"
#include "gateway_int.h"

// ---------------------------------------------------------------------------
// Request parsing

/* RFC 9110 tchar: the characters of a token (method, header name). */
static bool is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9'))
        return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bt_status_t fail(gateway_http_req_t *req, int status, const char *why)
{
    req->error_status = status;
    req->error = why;
    return BT_ERR_FORMAT;
}

/* Whether the comma-separated header value contains `token` (any case). */
static bool value_has_token(const char *v, size_t len, const char *token)
{
    size_t tlen = strlen(token);
    size_t i = 0;

    while (i < len) {
        size_t start, end;
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        start = i;
        while (i < len && v[i] != ',')
            i++;
        end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == tlen && strncasecmp(v + start, token, tlen) == 0)
            return true;
    }
    return false;
}

/* Finds the end of the line starting at `pos`: *eol is the index of the
 * CR or LF, *next the index after the line break.  False when the buffer
 * ends first.  A CR not followed by LF is an error (*bad). */
static bool line_end(const char *buf, size_t len, size_t pos, size_t *eol,
                     size_t *next, bool *bad)
{
    const char *lf = memchr(buf + pos, '\n', len - pos);
    const char *cr;
    size_t at;

    cr = memchr(buf + pos, '\r', (lf ? (size_t)(lf - buf) : len) - pos);
    if (cr != NULL) {
        at = (size_t)(cr - buf);
        if (at + 1 < len && buf[at + 1] != '\n') {
            *bad = true;
            return false;
        }
        if (at + 1 >= len)
            return false;
        *eol = at;
        *next = at + 2;
        return true;
    }
    if (lf == NULL)
        return false;
    *eol = (size_t)(lf - buf);
    *next = *eol + 1;
    return true;
}

static bt_status_t parse_request_line(const char *buf, size_t eol,
                                      gateway_http_req_t *req)
{
    size_t i = 0, m_len, t_start, t_len, v_start;

    while (i < eol && is_tchar((unsigned char)buf[i]))
        i++;
    m_len = i;
    if (m_len == 0 || i >= eol || buf[i] != ' ')
        return fail(req, 400, "malformed request line");
    if (m_len == 3 && memcmp(buf, "GET", 3) == 0)
        req->method = GATEWAY_HTTP_GET;
    else if (m_len == 4 && memcmp(buf, "HEAD", 4) == 0)
        req->method = GATEWAY_HTTP_HEAD;
    else if (m_len == 4 && memcmp(buf, "POST", 4) == 0)
        req->method = GATEWAY_HTTP_POST;
    else if (m_len <= 16)
        req->method = GATEWAY_HTTP_OTHER;
    else
        return fail(req, 501, "method not implemented");
    t_start = ++i;
    while (i < eol && buf[i] != ' ') {
        unsigned char c = (unsigned char)buf[i];
        if (c <= 0x20 || c == 0x7f)
            return fail(req, 400, "bad character in the request target");
        i++;
    }
    t_len = i - t_start;
    if (t_len == 0 || i >= eol)
        return fail(req, 400, "malformed request line");
    if (t_len > GATEWAY_HTTP_MAX_TARGET)
        return fail(req, 414, "request target too long");
    if (buf[t_start] != '/' &&
        !(t_len == 1 && buf[t_start] == '*'))
        return fail(req, 400, "request target must be an absolute path");
    req->path = buf + t_start;
    req->path_len = 0;
    while (req->path_len < t_len && req->path[req->path_len] != '?' &&
           req->path[req->path_len] != '#')
        req->path_len++;
    v_start = ++i;
    if (eol - v_start != 8 || memcmp(buf + v_start, "HTTP/", 5) != 0 ||
        buf[v_start + 6] != '.' || buf[v_start + 5] < '0' ||
        buf[v_start + 5] > '9' || buf[v_start + 7] < '0' ||
        buf[v_start + 7] > '9')
        return fail(req, 400, "malformed HTTP version");
    if (buf[v_start + 5] != '1')
        return fail(req, 505, "HTTP version not supported");
    req->minor = buf[v_start + 7] == '0' ? 0 : 1;
    req->keep_alive = req->minor >= 1;
    return BT_OK;
}

/* Parses a Content-Length value: digits only (a list of equal values,
 * which RFC 9112 allows, is refused as well: no client sends one). */
static bt_status_t parse_content_length(const char *v, size_t len,
                                        const gateway_http_limits_t *limits,
                                        gateway_http_req_t *req, bool *seen)
{
    size_t n = 0;

    if (len == 0)
        return fail(req, 400, "empty Content-Length");
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return fail(req, 400, "bad Content-Length");
        if (n > (SIZE_MAX - 9) / 10)
            return fail(req, 413, "request body too large");
        n = n * 10 + (size_t)(v[i] - '0');
    }
    if (*seen && n != req->content_length)
        return fail(req, 400, "conflicting Content-Length headers");
    if (n > limits->max_body_bytes)
        return fail(req, 413, "request body too large");
    req->content_length = n;
    *seen = true;
    return BT_OK;
}

bt_status_t gateway__http_parse(const char *buf, size_t len,
                                const gateway_http_limits_t *limits,
                                gateway_http_req_t *req)
{
    size_t pos = 0, eol = 0, next = 0, scan_len;
    bool bad = false, have_cl = false, have_te = false, chunked = false;
    bool conn_close = false, conn_keep = false;
    int n_headers = 0;
    bt_status_t status;

    memset(req, 0, sizeof(*req));
    /* RFC 9112 2.2: ignore at least one empty line before a request. */
    while (pos < len && pos < 4 && (buf[pos] == '\r' || buf[pos] == '\n'))
        pos++;
    scan_len = len < limits->max_header_bytes ? len
                                              : limits->max_header_bytes;
    if (!line_end(buf, scan_len, pos, &eol, &next, &bad)) {
        if (bad)
            return fail(req, 400, "bare CR in the request line");
        if (len >= limits->max_header_bytes)
            return fail(req, 431, "request header too large");
        /* reject garbage early instead of waiting for a line break */
        for (size_t i = pos; i < len && i < pos + 17; i++) {
            if (buf[i] == ' ')
                break;
            if (!is_tchar((unsigned char)buf[i]))
                return fail(req, 400, "malformed request line");
            if (i == pos + 16)
                return fail(req, 501, "method not implemented");
        }
        return BT_IN_PROGRESS;
    }
    status = parse_request_line(buf + pos, eol - pos, req);
    if (status != BT_OK)
        return status;
    pos = next;
    for (;;) {
        size_t name_end, v_start, v_end;
        const char *line;

        if (!line_end(buf, scan_len, pos, &eol, &next, &bad)) {
            if (bad)
                return fail(req, 400, "bare CR in a header");
            if (len >= limits->max_header_bytes)
                return fail(req, 431, "request header too large");
            return BT_IN_PROGRESS;
        }
        if (eol == pos)
            break; /* the empty line ending the header section */
        if (++n_headers > GATEWAY_HTTP_MAX_HEADERS)
            return fail(req, 431, "too many header fields");
        line = buf + pos;
        if (line[0] == ' ' || line[0] == '\t')
            return fail(req, 400, "obsolete header line folding");
        name_end = 0;
        while (pos + name_end < eol && is_tchar((unsigned char)line[name_end]))
            name_end++;
        if (name_end == 0 || pos + name_end >= eol || line[name_end] != ':')
            return fail(req, 400, "malformed header field");
        v_start = name_end + 1;
        v_end = eol - pos;
        while (v_start < v_end &&
               (line[v_start] == ' ' || line[v_start] == '\t'))
            v_start++;
        while (v_end > v_start &&
               (line[v_end - 1] == ' ' || line[v_end - 1] == '\t'))
            v_end--;
        for (size_t i = v_start; i < v_end; i++) {
            unsigned char c = (unsigned char)line[i];
            if ((c < 0x20 && c != '\t') || c == 0x7f)
                return fail(req, 400, "control character in a header value");
        }
#define NAME_IS(_s)                                                         \
    (name_end == sizeof(_s) - 1 && strncasecmp(line, _s, name_end) == 0)
        if (NAME_IS("Content-Length")) {
            status = parse_content_length(line + v_start, v_end - v_start,
                                          limits, req, &have_cl);
            if (status != BT_OK)
                return status;
        } else if (NAME_IS("Transfer-Encoding")) {
            have_te = true;
            if (value_has_token(line + v_start, v_end - v_start, "chunked"))
                chunked = true;
        } else if (NAME_IS("Connection")) {
            if (value_has_token(line + v_start, v_end - v_start, "close"))
                conn_close = true;
            if (value_has_token(line + v_start, v_end - v_start,
                                "keep-alive"))
                conn_keep = true;
        } else if (NAME_IS("Authorization")) {
            /* the last one wins; never logged (a credential) */
            req->authorization = line + v_start;
            req->authorization_len = v_end - v_start;
            req->n_authorization++;
        } else if (NAME_IS("X-Request-Id")) {
            req->request_id = line + v_start; /* the last one wins */
            req->request_id_len = v_end - v_start;
        } else if (NAME_IS("Expect")) {
            if (v_end - v_start == 12 &&
                strncasecmp(line + v_start, "100-continue", 12) == 0)
                req->expect_continue = true;
            else
                return fail(req, 417, "unsupported Expect value");
        }
#undef NAME_IS
        pos = next;
    }
    req->header_len = next;
    if (have_te && have_cl)
        return fail(req, 400,
                    "both Transfer-Encoding and Content-Length given");
    if (have_te)
        return fail(req, chunked ? 411 : 501,
                    chunked ? "chunked request bodies are not supported: "
                              "send a Content-Length"
                            : "unsupported Transfer-Encoding");
    if (req->method == GATEWAY_HTTP_POST && !have_cl)
        return fail(req, 411, "POST needs a Content-Length");
    if (conn_close)
        req->keep_alive = false;
    else if (conn_keep)
        req->keep_alive = true;
    if (req->minor == 0)
        req->expect_continue = false; /* 1.0 clients do not wait */
    req->total_len = req->header_len + req->content_length;
    if (len < req->total_len)
        return BT_IN_PROGRESS;
    return BT_OK;
}

const char *gateway__http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
