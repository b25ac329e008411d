/*
 * kv_raw_writer.h - a raw UCX writer outside this project's library, for
 * the stale-writer tests over tcp (kv_stale_writer.h, both links): what
 * a compromised prefill worker holds.
 */
#ifndef BT_TESTS_CLUSTER_KV_RAW_WRITER_H
#define BT_TESTS_CLUSTER_KV_RAW_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <ucp/api/ucp.h>

/* A raw UCX endpoint to the decode worker of pool descriptor `desc`,
 * outside this project's library: what a compromised prefill worker
 * holds.  Its key is the pool's arrival-slot key (every prefill worker
 * has it); software RMA over tcp checks none. */
typedef struct {
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
} raw_writer_t;

static bool raw_open(raw_writer_t *w, const uint8_t *desc, size_t len)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_ep_params_t ep_params;
    ucp_config_t *config;
    uint32_t addr_len;

    if (len < 100)
        return false;
    addr_len = (uint32_t)desc[68] | (uint32_t)desc[69] << 8 |
               (uint32_t)desc[70] << 16 | (uint32_t)desc[71] << 24;
    if (addr_len + 8 > len || ucp_config_read(NULL, NULL, &config) != UCS_OK)
        return false;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    if (ucp_init(&params, config, &w->context) != UCS_OK)
        return false;
    ucp_config_release(config);
    memset(&wparams, 0, sizeof(wparams));
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = (const ucp_address_t *)(desc + len - 8 - addr_len);
    return ucp_worker_create(w->context, &wparams, &w->worker) == UCS_OK &&
           ucp_ep_create(w->worker, &ep_params, &w->ep) == UCS_OK &&
           ucp_ep_rkey_unpack(w->ep, desc + 92, &w->rkey) == UCS_OK;
}

/* Fire and forget: a target without RMA never completes it. */
static void raw_put(raw_writer_t *w, const void *src, size_t len,
                    uint64_t addr)
{
    ucp_request_param_t prm;
    void *req;

    memset(&prm, 0, sizeof(prm));
    req = ucp_put_nbx(w->ep, src, len, addr, w->rkey, &prm);
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    for (int i = 0; i < 16; i++)
        ucp_worker_progress(w->worker);
}

/* The base address a receive window descriptor names (its bytes 32..39,
 * kv_transport_ucx.c), 0 for a short one. */
static uint64_t raw_window_addr(const uint8_t *window, size_t len)
{
    uint64_t a = 0;

    if (len < 40)
        return 0;
    for (int i = 7; i >= 0; i--)
        a = a << 8 | window[32 + i];
    return a;
}

#endif /* BT_TESTS_CLUSTER_KV_RAW_WRITER_H */
