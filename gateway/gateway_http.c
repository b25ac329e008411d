/*
 * gateway_http.c - what baton-http adds on top of libmicrohttpd's HTTP/1.1:
 * header counts (MHD keeps repeated fields; some are refused as
 * ambiguous), reason phrases for the few answers written outside MHD,
 * and the CORS origin list.
 */
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"
#include "gateway_int.h"

// ---------------------------------------------------------------------------
// Headers

typedef struct {
    const char *name;
    int n;
} count_ctx_t;

static enum MHD_Result count_one(void *cls, enum MHD_ValueKind kind,
                                 const char *key, const char *value)
{
    count_ctx_t *c = cls;

    (void)kind;
    (void)value;
    if (key != NULL && strcasecmp(key, c->name) == 0)
        c->n++;
    return MHD_YES;
}

int gateway__http_header_count(struct MHD_Connection *conn, const char *name)
{
    count_ctx_t c = { name, 0 };

    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_one, &c);
    return c.n;
}

const char *gateway__http_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

// ---------------------------------------------------------------------------
// CORS

#define CORS_MAX_ORIGINS 64
#define CORS_MAX_ORIGIN 200

struct gateway_cors_s {
    bool any;                                 /* "*" given */
    int n;                                    /* origins listed */
    char origins[CORS_MAX_ORIGINS][CORS_MAX_ORIGIN + 1];
};

/* Whether s[0..len) is an origin: http(s)://host[:port], no path. */
static bool is_origin(const char *s, size_t len)
{
    size_t i;

    if (len > 7 && strncasecmp(s, "http://", 7) == 0)
        i = 7;
    else if (len > 8 && strncasecmp(s, "https://", 8) == 0)
        i = 8;
    else
        return false;
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || c == '/' || c == '?' || c == '#' ||
            c == ',')
            return false;
    }
    return true;
}

bt_status_t gateway__cors_create(const char *spec, gateway_cors_t **cors_p)
{
    gateway_cors_t *cors = bt_calloc(1, sizeof(*cors), "gateway_cors");
    const char *p = spec;

    if (cors == NULL)
        return BT_ERR_NO_MEMORY;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *s = p;

        p = end ? end + 1 : p + len;
        while (len > 0 && (*s == ' ' || *s == '\t')) {
            s++;
            len--;
        }
        while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
            len--;
        if (len == 0)
            continue;
        if (len == 1 && s[0] == '*') {
            cors->any = true;
            continue;
        }
        if (!is_origin(s, len) || len > CORS_MAX_ORIGIN ||
            cors->n == CORS_MAX_ORIGINS) {
            bt_free(cors);
            return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                            "--cors-origins: '%.*s' is not an origin "
                            "(http[s]://host[:port], or *; at most %d)",
                            (int)BT_MIN(len, (size_t)200), s,
                            CORS_MAX_ORIGINS);
        }
        memcpy(cors->origins[cors->n], s, len);
        cors->origins[cors->n][len] = '\0';
        cors->n++;
    }
    if (!cors->any && cors->n == 0) {
        bt_free(cors);
        return BT_ERROR(BT_ERR_INVALID_ARG, "HTTP",
                        "--cors-origins: no origin given");
    }
    *cors_p = cors;
    return BT_OK;
}

void gateway__cors_destroy(gateway_cors_t **cors_p)
{
    bt_free(*cors_p);
    *cors_p = NULL;
}

const char *gateway__cors_match(const gateway_cors_t *cors, const char *origin)
{
    if (cors == NULL || origin == NULL || origin[0] == '\0')
        return NULL;
    if (cors->any)
        return "*";
    for (int i = 0; i < cors->n; i++)
        if (strcasecmp(cors->origins[i], origin) == 0)
            return origin;
    return NULL;
}
