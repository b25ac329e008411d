/*
 * kv_link_choose.h - which KV link a prefill/decode pair uses: pure logic
 * over facts the workers registered (what each offers, where it runs), so
 * the router decides without knowing any transport's code.
 *
 * The ids are the values of proto/control.proto's KvTransport (checked
 * where the two meet, router_policy.c); this header needs neither protobuf
 * nor UCX nor CUDA.
 */
#ifndef BT_WORKER_KV_KV_LINK_CHOOSE_H
#define BT_WORKER_KV_KV_LINK_CHOOSE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KV_LINK_INLINE = 0,    /* bytes in the control messages */
    KV_LINK_UCX = 1,       /* ucp RMA put into the decode pool */
    KV_LINK_NONE = 2,      /* null model: nothing to move */
    KV_LINK_CUDA_IPC = 3,  /* device copies into a pool mapped over IPC */
    KV_LINK_UCX_SHM = 4,   /* KV_LINK_UCX where both ends share a host */
    KV_LINK_LOCAL = 5,     /* aggregated: prefilled in place */
    KV_LINK_UCX_STAGE = 6, /* UCX puts through pinned staging buffers */
    KV_LINK_N_IDS = 7
} kv_link_id_t;

/* What the router knows of one worker. */
typedef struct {
    uint32_t offers;     /* bit (1 << id) per link it runs */
    uint32_t endpoints;  /* decode: bit per link it published an endpoint
                            for (Register.endpoints) */
    const char *host_id; /* "hostname/boot-id", "" = unknown */
    bool has_gpu;        /* KV pool in GPU memory */
    bool gpu_ipc;        /* CUDA IPC usable on its side */
} kv_link_facts_t;

/* The link for prefill worker `p` -> decode worker `d`.  `same_worker`:
 * one aggregated worker prefills for itself (KV_LINK_LOCAL).  `forced`:
 * the operator's --kv-transport (a KV_LINK_* id) or -1 for the automatic
 * choice; a forced link the pair cannot run falls back to the automatic
 * one.  `stage_ok`: the staged link may be chosen (the decode worker
 * granted receive-area blocks).  Automatic order: CUDA IPC (same host,
 * both GPUs IPC-capable), staged UCX (GPU pools on different hosts), UCX
 * (host pools; ucx-shm on one host), inline. */
int kv_link_choose(const kv_link_facts_t *p, const kv_link_facts_t *d,
                   bool same_worker, int forced, bool stage_ok);

/* True when link `id` writes through a receive area the decode worker
 * reserves with the blocks (KvReserve.kv_stage, KvGrant.stage_block_ids):
 * the router asks for one only then (they are scarce). */
bool kv_link_wants_recv_area(int id);

/* The link whose endpoint a route of `id` carries (ucx-shm: ucx's). */
int kv_link_endpoint_id(int id);

/* "inline", "ucx", "cuda-ipc", ...; "unknown" out of range. */
const char *kv_link_name(int id);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_LINK_CHOOSE_H */
