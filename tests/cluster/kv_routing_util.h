/*
 * kv_routing_util.h - what test_kv_routing.c (aggregated workers) and
 * test_kv_routing_prefill.c (prefill workers) share: the shared prefix,
 * who served what, and the router's per-worker KV index gauge.
 */
#ifndef BT_TESTS_CLUSTER_KV_ROUTING_UTIL_H
#define BT_TESTS_CLUSTER_KV_ROUTING_UTIL_H

#include "cluster/cluster_util.h"
#include "bt_prom_test.h"

/* The router's sample `family` of worker `name` in `role` ("prefill",
 * "decode+prefill"). */
static double kr_worker_metric(int port, const char *family,
                               const char *name, const char *role)
{
    char sample[256];

    snprintf(sample, sizeof(sample), "%s{worker=\"%s\",role=\"%s\"}",
             family, name, role);
    return prom_scrape(port, sample);
}

/* Served requests of each of the n workers in names[] (their order). */
static void kr_served(client_t *c, const char names[][16], int n,
                      uint64_t *out)
{
    cu_status_t st;

    BT_CHECK(cu_status(c, &st) == 0);
    for (int i = 0; i < n; i++) {
        out[i] = 0;
        for (int k = 0; k < st.n_workers && k < 16; k++)
            if (strcmp(st.names[k], names[i]) == 0)
                out[i] = st.served[k];
    }
}

/* prompt = a golden prompt and its greedy continuation (n_shared tokens,
 * the shared prefix), then a 7-token tail. */
static void kr_shared_prompt(int *prompt, const cu_golden_t *golden,
                             int n_shared)
{
    memcpy(prompt, golden[1].prompt, sizeof(int) * (size_t)golden[1].n_prompt);
    memcpy(prompt + golden[1].n_prompt, golden[1].expect,
           sizeof(int) * (size_t)(n_shared - golden[1].n_prompt));
    memcpy(prompt + n_shared, golden[2].expect, sizeof(int) * 7);
}

/* Waits (5 s at most) until the router indexes `blocks` blocks of worker
 * `name`: its KvEvents reached the router. */
static void kr_wait_indexed(int rport, const char *name, const char *role,
                            int blocks)
{
    for (int t = 0; t < 250; t++) {
        if (kr_worker_metric(rport, "baton_router_worker_kv_index_blocks",
                             name, role) >= blocks)
            return;
        usleep(20000);
    }
    BT_TEST_FAIL("the router indexes fewer than %d blocks of %s", blocks,
                 name);
}

#endif
