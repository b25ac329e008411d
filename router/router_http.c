/*
 * router_http.c - the router's metrics listener: GET /metrics served by
 * the shared strict HTTP server (common/bt_http.c), polled by the
 * router's own zmq_poll loop (no thread).  The parser and the
 * connection handling moved to common/ so the workers' metrics and
 * health endpoints use the same code; what stays here adapts it to the
 * router's declarations in router_int.h.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_http.h"
#include "router_int.h"

_Static_assert(ROUTER_HTTP_MAX_CONNS == BT_HTTP_MAX_CONNS,
               "the router polls room for every connection");
_Static_assert(ROUTER_HTTP_MAX_REQUEST == BT_HTTP_MAX_REQUEST,
               "one request size limit");

struct router_http_s {
    bt_http_server_t *srv;   /* the listener and its connections */
};

/* The one path the router serves. */
static const char *const router_paths[] = { "/metrics" };

bt_status_t router__http_parse(const char *buf, size_t len,
                               router_http_req_t *req)
{
    bt_http_req_t r;
    bt_status_t status = bt_http_parse(buf, len, router_paths, 1, &r);

    memset(req, 0, sizeof(*req));
    req->status = r.status;
    req->head = r.head;
    req->len = r.len;
    return status;
}

/* Context of one router__http_process call, for the handler. */
typedef struct {
    router_t *r;
    uint64_t now;
} http_ctx_t;

/* bt_http_handler_fn: the router's metrics, rendered on the spot (the
 * router's loop is the caller, so its state is consistent). */
static int metrics_handler(void *arg, int route, bt_buf_t *body,
                           const char **content_type)
{
    http_ctx_t *ctx = arg;
    bt_buf_t text = { 0 };
    bt_status_t status;

    (void)route;
    status = router__metrics_render(ctx->r, ctx->now, &text);
    if (status == BT_OK && text.len > 0)
        status = bt_buf_append(body, text.data, text.len);
    bt_buf_cleanup(&text);
    if (status != BT_OK)
        return 500;
    *content_type = "text/plain; version=0.0.4; charset=utf-8";
    return 200;
}

bt_status_t router__http_create(const char *host, int port,
                                router_http_t **http_p)
{
    router_http_t *http = bt_calloc(1, sizeof(*http), "router_http");
    bt_status_t status;

    if (http == NULL)
        return BT_ERR_NO_MEMORY;
    status = bt_http_server_create(host, port, router_paths, 1,
                                   metrics_handler, "metrics", &http->srv);
    if (status != BT_OK) {
        bt_free(http);
        return status;
    }
    *http_p = http;
    return BT_OK;
}

void router__http_destroy(router_http_t **http_p)
{
    router_http_t *http = *http_p;

    if (http == NULL)
        return;
    bt_http_server_destroy(&http->srv);
    bt_free(http);
    *http_p = NULL;
}

int router__http_port(const router_http_t *http)
{
    return bt_http_server_port(http->srv);
}

int router__http_poll_items(router_http_t *http, zmq_pollitem_t *items)
{
    return bt_http_server_poll_items(http->srv, items);
}

void router__http_process(router_http_t *http, router_t *r,
                          const zmq_pollitem_t *items, int n_items,
                          uint64_t now)
{
    http_ctx_t ctx = { r, now };

    bt_http_server_process(http->srv, &ctx, items, n_items, now);
}
