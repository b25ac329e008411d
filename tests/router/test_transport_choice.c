/*
 * test_transport_choice.c - router__choose_transport for the host cases
 * CI can describe without GPUs: aggregated (same worker), same host with
 * host pools (UCX over shared memory), other hosts (UCX), same host with
 * GPU pools (CUDA IPC), GPU pools on other hosts (staged UCX, or inline
 * when a side cannot stage), missing descriptors, the --kv-transport
 * overrides (ucx-stage forced on host pools: the CI test's setup) and a
 * grant without receive-area ids.  Also the CUDA IPC descriptor codec
 * round trip and the clean failure of the CUDA calls without a GPU.
 */
#include <string.h>

#include "bt_log.h"
#include "bt_test.h"
#include "kv/kv_transport_cuda_ipc.h"
#include "router_int.h"

static uint8_t fake_desc[4];

/* Gives (or takes) decode worker w an endpoint of link `t`. */
static void set_ep(router_worker_t *w, int t, bool on)
{
    int k = -1;

    for (int i = 0; i < w->n_eps; i++)
        if (w->eps[i].transport == t)
            k = i;
    if (on && k < 0) {
        w->eps[w->n_eps].transport = t;
        w->eps[w->n_eps].desc = fake_desc;
        w->eps[w->n_eps].len = sizeof(fake_desc);
        w->n_eps++;
    } else if (!on && k >= 0) {
        w->eps[k] = w->eps[--w->n_eps];
    }
}

static void worker(router_worker_t *w, Baton__Role role, const char *host,
                   bool gpu, bool ucx)
{
    memset(w, 0, sizeof(*w));
    w->used = true;
    w->role = role;
    snprintf(w->host_id, sizeof(w->host_id), "%s", host);
    w->transports = 1u << BATON__KV_TRANSPORT__KV_TRANSPORT_INLINE;
    if (ucx && !gpu) {
        w->transports |= 1u << BATON__KV_TRANSPORT__KV_TRANSPORT_UCX;
        if (role == BATON__ROLE__ROLE_DECODE) {
            set_ep(w, BATON__KV_TRANSPORT__KV_TRANSPORT_UCX, true);
        }
    }
    if (gpu) {
        w->has_gpu = true;
        w->gpu_ipc = true;
        w->transports |= 1u << BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC;
        if (role == BATON__ROLE__ROLE_DECODE) {
            set_ep(w, BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC, true);
        }
    }
}

#define CHOOSE(_p, _d, _m) router__transport_name( \
    router__choose_transport((_p), (_d), (_m)))
#define CHOOSE_EX(_p, _d, _m, _g) router__transport_name( \
    router__choose_transport_ex((_p), (_d), (_m), (_g)))

/* The worker offers the staged UCX transport (a decode one has a
 * receiver descriptor). */
static void stage(router_worker_t *w)
{
    w->transports |= 1u << BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE;
    if (w->role == BATON__ROLE__ROLE_DECODE) {
        set_ep(w, BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE, true);
    }
}

static void test_stage_choice(void)
{
    router_worker_t p, d;
    router_kv_mode_t mode;

    BT_CHECK(router__kv_mode_parse("ucx-stage", &mode) &&
             mode == ROUTER_KV_UCX_STAGE);
    /* GPU pools on other hosts, both stage: ucx-stage (was inline). */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", true, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h2/boot", true, true);
    stage(&p);
    stage(&d);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX_STAGE), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_CUDA_IPC), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_INLINE), "inline") == 0);
    /* The grant came without receive-area ids (area full, no receiver):
     * whatever else the pair can do, here inline. */
    BT_CHECK(strcmp(CHOOSE_EX(&p, &d, ROUTER_KV_AUTO, false), "inline") ==
             0);
    BT_CHECK(strcmp(CHOOSE_EX(&p, &d, ROUTER_KV_AUTO, true), "ucx-stage") ==
             0);
    /* Same host: CUDA IPC stays first; forcing ucx-stage wins. */
    snprintf(d.host_id, sizeof(d.host_id), "h1/boot");
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "cuda-ipc") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX_STAGE), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE_EX(&p, &d, ROUTER_KV_UCX_STAGE, false),
                    "cuda-ipc") == 0);
    /* Other hosts, one side cannot stage: inline. */
    snprintf(d.host_id, sizeof(d.host_id), "h2/boot");
    set_ep(&d, BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE, false);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX_STAGE), "inline") == 0);
    stage(&d);
    p.transports &= ~(1u << BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    /* Mixed GPU prefill / host decode never stages automatically. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", true, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h2/boot", false, true);
    stage(&p);
    stage(&d);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);

    /* Host pools with the host stand-in (--kv-stage-host, CI): auto
     * keeps UCX over shared memory; forced ucx-stage takes it. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", false, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", false, true);
    stage(&p);
    stage(&d);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "ucx-shm") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX_STAGE), "ucx-stage") == 0);
    BT_CHECK(strcmp(CHOOSE_EX(&p, &d, ROUTER_KV_UCX_STAGE, false),
                    "ucx-shm") == 0);
    /* Aggregated stays local. */
    BT_CHECK(strcmp(CHOOSE(&d, &d, ROUTER_KV_UCX_STAGE), "local") == 0);
    BT_CHECK(strcmp(router__transport_name(
                        BATON__KV_TRANSPORT__KV_TRANSPORT_UCX_STAGE),
                    "ucx-stage") == 0);
}

static void test_choice(void)
{
    router_worker_t p, d, d2;
    router_kv_mode_t mode;

    BT_CHECK(router__kv_mode_parse("auto", &mode) && mode == ROUTER_KV_AUTO);
    BT_CHECK(router__kv_mode_parse("cuda-ipc", &mode) &&
             mode == ROUTER_KV_CUDA_IPC);
    BT_CHECK(router__kv_mode_parse("ucx", &mode) && mode == ROUTER_KV_UCX);
    BT_CHECK(router__kv_mode_parse("inline", &mode) &&
             mode == ROUTER_KV_INLINE);
    BT_CHECK(!router__kv_mode_parse("nvlink", &mode));
    BT_CHECK(!router__kv_mode_parse(NULL, &mode));

    /* Aggregated: a --role both worker with itself. */
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", false, true);
    d.can_prefill = true;
    BT_CHECK(strcmp(CHOOSE(&d, &d, ROUTER_KV_AUTO), "local") == 0);
    BT_CHECK(strcmp(CHOOSE(&d, &d, ROUTER_KV_INLINE), "local") == 0);

    /* Host pools: same host -> UCX over shared memory; else UCX. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", false, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", false, true);
    worker(&d2, BATON__ROLE__ROLE_DECODE, "h2/boot", false, true);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "ucx-shm") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d2, ROUTER_KV_AUTO), "ucx") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX), "ucx-shm") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_INLINE), "inline") == 0);
    /* cuda-ipc forced on host pools: not possible, automatic choice. */
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_CUDA_IPC), "ucx-shm") == 0);
    /* A boot id differs: another host even with the same hostname. */
    snprintf(d2.host_id, sizeof(d2.host_id), "h1/other");
    BT_CHECK(strcmp(CHOOSE(&p, &d2, ROUTER_KV_AUTO), "ucx") == 0);
    /* Unknown host identity (old worker): never "same host". */
    p.host_id[0] = '\0';
    d.host_id[0] = '\0';
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "ucx") == 0);
    /* Decode without a UCX pool (--no-ucx): inline. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", false, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", false, false);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX), "inline") == 0);

    /* GPU pools on one host: CUDA IPC, also when UCX is asked for. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", true, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", true, true);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "cuda-ipc") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_CUDA_IPC), "cuda-ipc") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_UCX), "cuda-ipc") == 0);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_INLINE), "inline") == 0);
    /* Other host: no IPC, and no CUDA-aware UCX: inline. */
    snprintf(d.host_id, sizeof(d.host_id), "h2/boot");
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    /* Same host but the decode could not export (no descriptor). */
    snprintf(d.host_id, sizeof(d.host_id), "h1/boot");
    set_ep(&d, BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC, false);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    /* Same host, prefill's GPU cannot do IPC. */
    set_ep(&d, BATON__KV_TRANSPORT__KV_TRANSPORT_CUDA_IPC, true);
    p.gpu_ipc = false;
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
    /* Mixed: GPU prefill, host decode pool: inline. */
    worker(&p, BATON__ROLE__ROLE_PREFILL, "h1/boot", true, true);
    worker(&d, BATON__ROLE__ROLE_DECODE, "h1/boot", false, true);
    BT_CHECK(strcmp(CHOOSE(&p, &d, ROUTER_KV_AUTO), "inline") == 0);
}

static void test_cipc_codec(void)
{
    kv_cipc_desc_t d, back;
    uint8_t buf[1024];
    char host[320];
    size_t n = kv_cipc_desc_size();

    memset(&d, 0, sizeof(d));
    d.pool_id = 0x1234567890abcdefull;
    d.pid = 4242;
    d.device = 3;
    snprintf(d.bus_id, sizeof(d.bus_id), "0000:19:00.0");
    d.layout = (kv_layout_t){ 32, 1000, 16, 8, 128, 2 };
    d.n_slots = 1024;
    for (int i = 0; i < KV_CIPC_HANDLE_BYTES; i++) {
        d.k_handle[i] = (uint8_t)i;
        d.v_handle[i] = (uint8_t)(255 - i);
        d.arrival_handle[i] = (uint8_t)(i * 7);
    }
    BT_CHECK(n < sizeof(buf));
    BT_ASSERT_OK(kv_cipc_desc_encode(&d, buf, sizeof(buf)));
    BT_ASSERT_OK(kv_cipc_desc_parse(buf, n, &back));
    BT_CHECK(memcmp(&d, &back, sizeof(d)) == 0);
    BT_CHECK(kv_cipc_desc_parse(buf, n - 1, &back) == BT_ERR_FORMAT);
    buf[20] ^= 1;
    BT_CHECK(kv_cipc_desc_parse(buf, n, &back) == BT_ERR_FORMAT);
    BT_CHECK(kv_cipc_desc_encode(&d, buf, 8) == BT_ERR_INVALID_ARG);

    /* Host identity: "hostname/boot-id", never empty. */
    kv_cipc_host_id(host, sizeof(host));
    BT_CHECK(strchr(host, '/') != NULL && host[0] != '/');

    /* No GPU here (CI): every device call fails cleanly, no crash. */
    if (!kv_cipc_is_available()) {
        kv_cipc_t *ctx = NULL;
        kv_cipc_gpu_info_t gi;
        BT_CHECK(kv_cipc_create(&ctx) != BT_OK && ctx == NULL);
        BT_CHECK(kv_cipc_gpu_info(0, &gi) != BT_OK);
    }
}

int main(void)
{
    bt_log_init("test");
    test_choice();
    test_stage_choice();
    test_cipc_codec();
    BT_TEST_PASS("router/transport_choice: per-pair KV transport "
                 "(ucx-stage too), CUDA IPC "
                 "descriptor codec");
    return 0;
}
