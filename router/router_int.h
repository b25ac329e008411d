/*
 * router_int.h - the router's private state (workers, requests, policy)
 * and the functions its files share (router.c lists the files).
 */
#ifndef BT_ROUTER_ROUTER_INT_H
#define BT_ROUTER_ROUTER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "bt_curve.h"
#include "bt_buf.h"
#include "bt_prom.h"
#include "bt_zmq.h"
#include "model/tokenizer.h"
#include "proto_batch.h"
#include "proto_msg.h"
#include "router.h"
#include "router_kvindex.h"

#define ROUTER_MAX_WORKERS 256
#define ROUTER_NAME_MAX 64
#define ROUTER_RID_MAX 128 /* a worker's ZeroMQ routing id */
#define ROUTER_MAX_EOS 8
/* A request a decode worker gave back (TaskError.retry: its KV pool ran
 * short past the request's promise) is re-queued this many times, then
 * fails */
#define ROUTER_MAX_PREEMPTIONS 16
#define ROUTER_HASH_BUCKETS 4096
#define ROUTER_MAX_TOKENS (1 << 30) /* max_tokens 0: until the context */
#define ROUTER_MAX_TENANTS 256 /* tenants with live requests tracked apart;
                                  beyond, they share the default's share */
#define ROUTER_TENANT_OUTPUT_COST 4096 /* output tokens a request of
                                  max_tokens 0 is charged in fair queueing */
/* What a registration may declare (router__on_register refuses more). */
#define ROUTER_MAX_CONTEXT (1u << 26)
#define ROUTER_MAX_VOCAB (1u << 24)
#define ROUTER_MAX_BLOCK_SIZE 4096u
#define ROUTER_MAX_KV_BLOCKS (1u << 30)
#define ROUTER_MAX_DESC_BYTES (1u << 20) /* a decode's KV endpoint */
#define ROUTER_MAX_ENDPOINTS 8 /* KV endpoints kept per decode worker */
#define ROUTER_HOST_MAX 128
#define ROUTER_KV_DTYPE_MAX 8 /* "bf16", "fp8", "f32" */
#define ROUTER_QUEUE_WAIT_MAX 10 /* queue timeouts a queued request may
                                   wait in all while capacity keeps
                                   coming free (router_request.c) */
#define ROUTER_KV_RETRY_NS (20 * 1000000ull) /* a request refused KV
                                 (pool full) asks again after this */
#define ROUTER_RECV_FULL_WAIT_NS (50 * 1000000ull) /* a decode worker whose
                                 receive area was full is probed again
                                 after this without news of room freed
                                 (Heartbeat.recv_frees) */
#define ROUTER_PHASE_EXTENSIONS 3 /* re-estimates of a phase deadline
                                     while its worker makes progress */
#define ROUTER_STOP_HELD_MAX 256 /* held-back stop text (STOP_MAX_STRING_LEN) */

/* One KV endpoint of a decode worker (proto KvEndpoint), owned. */
typedef struct {
    int transport;            /* KV_LINK_* (kv_link_choose.h) */
    uint8_t *desc;            /* (len) opaque: the prefill worker's link
                                 parses and validates it */
    size_t len;
} router_endpoint_t;

typedef struct {
    bool used;                /* slot holds a registered worker */
    bool batches;             /* Register.batches: takes ControlBatch */
    proto_batch_t outbox;     /* with batches: what this loop turn sends
                                 it, sent at the turn's end (issue 42) */
    uint64_t uid;             /* registration number, never reused */
    char name[ROUTER_NAME_MAX]; /* the name operators see (Register.name) */
    uint8_t rid[ROUTER_RID_MAX]; /* (rid_len) ZeroMQ routing id: the name
                                  plus the process's random suffix */
    size_t rid_len;
    uint64_t session;         /* Register.session of this registration */
    uint64_t registered_ns;   /* when it registered */
    /* Liveness off the compute thread (heartbeats from the worker's
     * heartbeat thread): */
    uint64_t progress;        /* main-loop turns the worker completed */
    uint32_t busy_ms;         /* age of its turn running now */
    uint32_t step_ms;         /* its longest recent turn */
    double prefill_tps;       /* prefill: measured tokens/s (0 unknown) */
    Baton__Role role;
    uint64_t last_seen_ns;    /* last message from it */
    bool draining;            /* takes no new work */
    bool silent;              /* missed 2+ heartbeats: picked for no new
                                 work until it speaks again (it may be
                                 dead; it is dropped after heartbeat_miss) */
    uint32_t vocab_size;
    uint32_t max_context;
    int64_t unbounded_promise; /* decode: growth promised to a request
                                 without max_tokens (-1: its context) */
    bool admits_on_promise;   /* decode: admits only with the request's
                                 promise free (router__blocks_to_admit) */
    uint32_t block_size;      /* decode: KV block size */
    uint32_t total_kv;        /* decode: pool blocks */
    int64_t est_free_kv;      /* decode: free blocks, heartbeat minus
                                 reservations sent since */
    int64_t pending_reserve;  /* decode: blocks asked, grant not back */
    /* decode: a grant refused for a full receive area closes the worker
     * to hand-offs until recv_full_until (ns) or until its heartbeat's
     * recv_frees moves; then one reservation at a time probes it
     * (recv_probing), each sent on the last's answer, until an ok grant
     * comes ROUTER_RECV_FULL_WAIT_NS after the last refusal, so an
     * opening does not send every queued request to be refused in turn. */
    uint64_t recv_full_until;
    uint64_t recv_refused_ns; /* the last such refusal */
    uint64_t recv_frees;      /* Heartbeat.recv_frees last heard */
    bool recv_probing;        /* one at a time: refused lately */
    bool recv_probe_out;      /* the probe's reservation is in flight */
    uint32_t hb_free_kv;      /* decode: last heartbeat's free blocks */
    uint32_t hb_running;      /* last heartbeat's running count */
    uint64_t outstanding;     /* tokens assigned and not done */
    uint32_t assigned;        /* requests currently assigned */
    uint64_t served;          /* requests assigned so far */
    int eos_ids[ROUTER_MAX_EOS];
    int n_eos;
    router_endpoint_t eps[ROUTER_MAX_ENDPOINTS]; /* decode: (n_eps) KV
                                 endpoints from Register, opaque here */
    int n_eps;
    bool can_prefill;         /* decode --role both */
    uint32_t transports;      /* bit (1 << KvTransport) per one offered */
    char host_id[ROUTER_HOST_MAX]; /* "hostname/boot-id", "" = unknown */
    char kv_dtype[ROUTER_KV_DTYPE_MAX]; /* Register.kv_dtype, "" = none */
    char precision[ROUTER_KV_DTYPE_MAX]; /* Register.precision ("f32",
                                 "bf16", "fp8"), "" = none (null model) */
    uint64_t tokenizer_id;    /* Register.tokenizer_id, 0 = none */
    bool has_gpu;             /* KV pool in GPU memory */
    bool gpu_ipc;             /* CUDA IPC usable on its side */
    int gpu_device;           /* CUDA ordinal */
    char gpu_bus[32];         /* PCI bus id */
    char key[BT_CURVE_Z85_LEN + 1]; /* CURVE public key (Z85) that made
                                       the registration; "" without CURVE.
                                       Only messages from it count. */
    uint64_t kv_resync_ns;    /* last KvResyncRequest sent (rate limit) */
    bool has_prefix;          /* heartbeat: it keeps a prefix cache */
    uint32_t prefix_cached;   /* heartbeat: blocks its prefix cache holds */
    bool has_prefix_host;     /* heartbeat: it keeps a host tier */
    uint32_t prefix_host_cached; /* heartbeat: blocks the host tier holds */
    double prefix_hit_rate;   /* heartbeat: prompt tokens found cached /
                                 looked up, since start */
} router_worker_t;

/* How the router chooses KV transports (router_config_t.kv_transport). */
typedef enum {
    ROUTER_KV_AUTO = 0,
    ROUTER_KV_UCX,
    ROUTER_KV_CUDA_IPC,
    ROUTER_KV_INLINE,
    ROUTER_KV_UCX_STAGE,
} router_kv_mode_t;

/* Parses "auto", "ucx", "cuda-ipc", "ucx-stage", "inline"; false for
 * anything else. */
bool router__kv_mode_parse(const char *s, router_kv_mode_t *mode_p);

/* The transport KV takes from prefill worker p to decode worker d: the
 * KV link interface decides (kv_link_choose.h: pure logic over what both
 * registered), the router only hands it the facts and --kv-transport.
 * A forced mode is used when the pair supports it, else the automatic
 * choice. */
Baton__KvTransport router__choose_transport(const router_worker_t *p,
                                            const router_worker_t *d,
                                            router_kv_mode_t mode);

/* The same, once the decode worker answered: `stage_granted` false (the
 * grant carries no receive-area ids) rules UCX_STAGE out, and the choice
 * falls to what the pair can do without it. */
Baton__KvTransport router__choose_transport_ex(const router_worker_t *p,
                                               const router_worker_t *d,
                                               router_kv_mode_t mode,
                                               bool stage_granted);

/* "cuda-ipc", "ucx-stage", "ucx-shm", "ucx", "inline", "local",
 * "none". */
const char *router__transport_name(Baton__KvTransport t);

/* Decode worker w's endpoint for `transport` (ucx-shm: ucx's), NULL when
 * it registered none. */
const router_endpoint_t *router__worker_endpoint(const router_worker_t *w,
                                                 Baton__KvTransport
                                                     transport);

typedef enum {
    ROUTER_REQ_QUEUED = 0,  /* waiting for workers / KV */
    ROUTER_REQ_RESERVING,   /* KvReserve sent to the decode worker */
    ROUTER_REQ_PREFILLING,  /* PrefillTask sent */
    ROUTER_REQ_DECODING,    /* KvReady sent; tokens streaming */
} router_req_state_t;

/* A tenant with live requests (slot 0: the default tenant, "", never
 * freed).  Its virtual finish tag is where its next request starts in the
 * fair queue: tokens it was charged over its weight. */
typedef struct {
    char name[PROTO_MAX_TENANT + 1];
    int live;                  /* live requests of it (0: slot free) */
    double finish;             /* virtual finish of its last admission */
} router_tenant_t;

typedef struct router_req_s router_req_t;
struct router_req_s {
    uint64_t id;               /* router-wide request id */
    router_req_state_t state;
    uint8_t client_id[256]; /* client routing id */
    size_t client_id_len;
    uint64_t client_rid;       /* the client's request id */
    /* what was asked */
    int *prompt_ids;           /* (n_prompt) known ids, or NULL (text) */
    int n_prompt;
    uint8_t *prompt_text;      /* (text_len) when given as text */
    size_t text_len;
    bool ids_from_text;        /* prompt_ids are the router's --tokenizer
                                  encoding of prompt_text, not yet
                                  confirmed by a worker (PrefillDone) */
    bool reserved_by_ids;      /* ... and the KV reservation was sized by
                                  them (its prefill worker takes ids) */
    bool recv_probe;           /* this reservation probes its decode
                                  worker's receive room (recv_probing) */
    bool add_bos;
    Baton__SamplingParams sampling;
    int max_tokens;
    int *stop_ids;             /* (n_stop) from the request */
    int n_stop;
    ProtobufCBinaryData *stop_strings; /* (n_stop_strings), owned */
    int n_stop_strings;
    bool ignore_eos;
    bool want_text;
    int priority;
    uint64_t deadline_ns;      /* 0 = none */
    /* Tenants (issue 42): weighted-fair order within a priority. */
    int tenant;                /* index in r->tenants (0: default) */
    uint32_t weight;           /* its share (GenerateRequest.tenant_weight) */
    double vtag;               /* virtual start tag (start-time fair
                                  queueing): queued by it within a priority */
    bool front;                /* re-queued: ahead of its priority, as before
                                  tenants (its tag kept) */
    uint8_t cache_salt[PROTO_MAX_CACHE_SALT]; /* (cache_salt_len) the
                                  tenant's salt: KV prefix reuse keys on
                                  it (PrefillTask, KvReady, the kv-aware
                                  policy's chain) */
    size_t cache_salt_len;
    char *grammar;             /* owned: structured output spec relayed to
                                  both workers (NULL: none) */
    const char *precision;     /* the class asked (static, from
                                  proto_precision_find): "" = any */
    router_kv_chain_t kv_chain; /* the prompt's block hashes, a memo of
                                  the kv-aware pick (owned) */
    /* progress */
    int *generated;            /* (cap_generated) ids sent to the client */
    int n_generated;
    int cap_generated;
    uint64_t prefill_uid;      /* assigned workers (0 = none) */
    uint64_t decode_uid;
    int reserved_blocks;       /* blocks asked of the decode worker */
    uint64_t task_tokens;      /* tokens counted in workers' outstanding */
    uint8_t *grant;            /* packed KvGrant, owned */
    size_t grant_len;
    uint64_t epoch;            /* of the current grant */
    Baton__KvTransport transport; /* of the current prefill -> decode */
    Baton__KvTransport announced; /* the link KvReserve.kv_transport named:
                                     the only one the decode worker armed */
    int retries;
    int preemptions;           /* given back by decode workers (retry) */
    uint64_t failed_uid;       /* the worker the last counted failure was
                                  put on (0 = none): its death, noticed
                                  later, is the same failure */
    uint64_t retry_at_ns;      /* queued: not before this time */
    uint32_t attempt;          /* dispatches so far: KvReserve.attempt,
                                  echoed by the grant (a stale grant of an
                                  earlier attempt is released) */
    uint64_t t_queued;         /* entered the queue last (arrival or
                                  re-queue): the queue timeout counts
                                  from here or router.t_capacity_ns,
                                  whichever is later */
    uint64_t phase_deadline_ns; /* reserving/prefilling/decoding: the
                                  current phase must move by then, or the
                                  attempt is abandoned and re-queued */
    uint64_t phase_progress;   /* the worker's progress counter when the
                                  deadline was set */
    int phase_extensions;      /* deadlines re-estimated in this phase */
    char stop_held[ROUTER_STOP_HELD_MAX]; /* (n_stop_held) text the stop
                                  matcher holds back: after the first
                                  token, then as the decode worker last
                                  reported it (continues a failover) */
    size_t n_stop_held;
    bool batch_ok;          /* GenerateRequest.accept_batch: its replies
                               go through the client outbox */
    bool plp_sent;          /* the prompt's logprobs went to the client
                               (SamplingParams.prompt_logprobs; once) */
    /* timings (ns, bt_time_ns) */
    uint64_t t_arrival;
    uint64_t t_granted;
    uint64_t t_prefill_sent;
    uint64_t t_prefill_done;
    uint64_t t_first;
    uint64_t transfer_us;
    /* links */
    router_req_t *all_prev;    /* list of every live request */
    router_req_t *all_next;
    router_req_t *id_next;     /* hash chain by id */
    router_req_t *cl_next;     /* hash chain by (client, client_rid) */
    bool queued;               /* in the admission queue */
};

// ---------------------------------------------------------------------------
// router_metrics.c: counters, histograms, the Prometheus text

#define ROUTER_METRICS_CODES 16     /* ErrorCode values counted */
#define ROUTER_METRICS_FINISH 4     /* FinishReason values counted */
#define ROUTER_METRICS_TRANSPORTS 8 /* KvTransport values counted */

/* What the router counts (gauges are read from its state at render). */
typedef struct {
    uint64_t finished[ROUTER_METRICS_FINISH]; /* ended with Finished, by
                                                 FinishReason */
    uint64_t failed[ROUTER_METRICS_CODES];    /* admitted, ended with an
                                                 error, by ErrorCode */
    uint64_t rejected[ROUTER_METRICS_CODES];  /* refused at admission, by
                                                 ErrorCode */
    uint64_t admitted;                        /* into the queue */
    uint64_t retries;                         /* re-queued after a worker
                                                 failure */
    uint64_t preemptions;                     /* re-queued: a decode worker
                                                 gave them back (retry) */
    uint64_t kv_refusals;                     /* KvGrant not ok: asked
                                                 again 20 ms later */
    uint64_t handoffs[ROUTER_METRICS_TRANSPORTS]; /* KvReady sent, by
                                                     KvTransport */
    uint64_t worker_drops;                    /* workers dropped (dead,
                                                 silent, left) */
    bt_prom_hist_t ttft;       /* arrival -> first token to the client */
    bt_prom_hist_t tpot;       /* per request: (last - first token) /
                                  (tokens - 1) */
    bt_prom_hist_t queue_wait; /* arrival -> first KV grant */
    uint64_t prompt_tokens;    /* of requests that finished */
    uint64_t generated_tokens; /* streamed to clients, every request */
} router_metrics_t;

void router__metrics_init(router_metrics_t *m);

struct router_s;

/* Appends every metric (the counters and the router's and each worker's
 * state now) in the Prometheus text format 0.0.4. */
bt_status_t router__metrics_render(struct router_s *r, uint64_t now,
                                   bt_buf_t *out);

// ---------------------------------------------------------------------------
// router_http.c: the metrics HTTP listener

#define ROUTER_HTTP_MAX_CONNS 16     /* open connections at most */
#define ROUTER_HTTP_MAX_REQUEST 8192 /* request line + headers */

/* A parsed request (pure function of the bytes: unit tests and the fuzz
 * target drive it directly). */
typedef struct {
    int status;   /* the status to answer: 200 (GET/HEAD /metrics),
                     400, 404, 405, 431, 505 */
    bool head;    /* HEAD: headers only */
    size_t len;   /* bytes of the request head (through the blank
                     line) */
} router_http_req_t;

/* Parses the request head at buf[0..len).  BT_IN_PROGRESS: the blank
 * line is not there yet (and len is under ROUTER_HTTP_MAX_REQUEST);
 * BT_OK: *req says how to answer (status 400 for anything malformed:
 * bad request line, bad header, bare CR, a folded line, no Host in
 * HTTP/1.1, Transfer-Encoding, a bad Content-Length; 431 when the head
 * exceeds ROUTER_HTTP_MAX_REQUEST).  Never reads past buf[len-1]. */
bt_status_t router__http_parse(const char *buf, size_t len,
                               router_http_req_t *req);

typedef struct router_http_s router_http_t;

/* Listens on host:port (0: any free port), non-blocking. */
bt_status_t router__http_create(const char *host, int port,
                                router_http_t **http_p);
void router__http_destroy(router_http_t **http_p);
int router__http_port(const router_http_t *http);

/* Fills items[] (room for 1 + ROUTER_HTTP_MAX_CONNS) with the fds to
 * poll; returns how many. */
int router__http_poll_items(router_http_t *http, zmq_pollitem_t *items);
/* After zmq_poll: accepts, reads, answers (rendering the metrics of r),
 * writes and closes; connections idle for 5 s are closed. */
void router__http_process(router_http_t *http, struct router_s *r,
                          const zmq_pollitem_t *items, int n_items,
                          uint64_t now);

// ---------------------------------------------------------------------------
// router_pool.c: precision routing (issue 37)

#define ROUTER_MAX_POOLS 16 /* (precision, KV dtype) classes told apart */

/* Which workers a pick may take (router__worker_in_class): "" = any.  A
 * request's class names only a precision; a prefill worker's pair class
 * (router__worker_class) names its precision and KV dtype. */
typedef struct {
    const char *precision;    /* equal to the worker's, or "" */
    const char *kv_dtype;     /* equal to the worker's, "" here or there
                                 (the null model moves no KV) */
} router_class_t;

/* The usable (registered, not draining) workers of one precision and KV
 * dtype: a prefill worker hands off only inside its pool. */
typedef struct {
    char precision[ROUTER_KV_DTYPE_MAX];
    char kv_dtype[ROUTER_KV_DTYPE_MAX];
    int n_prefill;            /* --role prefill */
    int n_decode;             /* --role decode */
    int n_both;               /* --role both (aggregated) */
} router_pool_t;

bool router__worker_in_class(const router_worker_t *w,
                             const router_class_t *cls);
/* The class of the workers w may pair with (its own precision and KV
 * dtype); the strings are w's. */
router_class_t router__worker_class(const router_worker_t *w);
/* True when prefill worker p may hand its KV to decode worker d: the
 * same worker (aggregated), or the same precision and KV dtype. */
bool router__pair_matches(const router_worker_t *p, const router_worker_t *d);
/* Fills pools[ROUTER_MAX_POOLS] with the usable workers' pools; returns
 * how many (workers of a pool past the table's end are not counted). */
int router__pools(const struct router_s *r, router_pool_t *pools);
/* True when a request of `precision` ("" any) can never be served by the
 * workers registered now, so it fails at once (ERROR_NO_WORKERS) instead
 * of waiting out the queue timeout: workers are registered but none of
 * that class, or the class has workers of both sides but no pool pairs
 * them (a bf16 prefill worker beside an fp8 decode worker only).  While
 * a class has workers of one side only, it waits for the other (as a
 * cluster starting).  Writes the reason (for the client) to `why`. */
bool router__class_unservable(const struct router_s *r,
                              const router_pool_t *pools, int n_pools,
                              const char *precision, char *why,
                              size_t why_size);

/* A policy picks workers for a request; NULL when none can take it.  Both
 * picks consider only workers in `cls` (router__worker_in_class). */
typedef struct {
    const char *name;
    /* *cached_p (both picks): the prompt tokens the policy expects
     * cached on the worker picked (0 for a policy that does not know);
     * its prefill work is counted without them. */
    router_worker_t *(*pick_prefill)(struct router_s *router,
                                     const router_req_t *req,
                                     const router_class_t *cls,
                                     int *cached_p);
    /* need_prefill: only --role both workers (aggregated). */
    router_worker_t *(*pick_decode)(struct router_s *router,
                                    const router_req_t *req, int n_tokens,
                                    bool need_prefill,
                                    const router_class_t *cls,
                                    int *cached_p);
} router_policy_t;

const router_policy_t *router__policy_find(const char *name);

/* The KV blocks decode worker w promises req (n_tokens of prompt) at
 * admission, as decode_resv.c counts them: the prompt and its growth
 * (max_tokens), or, asking past the context, the prompt and w's
 * unbounded promise; at most the context.  *unbounded_p (NULL: not
 * wanted): it asked past the context and w promises less. */
int64_t router__promise_blocks(const router_worker_t *w,
                               const router_req_t *req, int n_tokens,
                               bool *unbounded_p);
/* The free blocks w must have to admit req: its promise, or its prompt
 * when w admits on the prompt alone (--kv-overcommit, or a worker that
 * does not say). */
int64_t router__blocks_to_admit(const router_worker_t *w,
                                const router_req_t *req, int n_tokens);

/* True when w may take new work of its role. */
bool router__worker_is_usable(const router_worker_t *w);

/* Admission that never times out silently (issue 36): true when at
 * least one decode worker is registered (not draining) and none of them
 * could ever hold the request, even with its whole KV pool free: its
 * prompt of n_tokens is not shorter than the worker's context, or its
 * whole growth (prompt + the tokens still to generate, capped at the
 * context, as the decode worker reserves it) needs more blocks than the
 * pool has.  Writes the reason (for the client) to `why`.  False while
 * no decode worker is registered: the request waits for one. */
bool router__req_never_fits(const router_t *r, const router_req_t *req,
                            int n_tokens, char *why, size_t why_size);

/* The replies one loop turn made for one client connection (issue 42):
 * sent as one ClientBatch when the turn ends (router__client_flush), so
 * CURVE boxes one message per connection and turn, not one per token. */
#define ROUTER_OUTBOX_CONNS 64
typedef struct {
    uint8_t id[256];           /* (id_len) the connection's routing id */
    size_t id_len;
    proto_batch_t batch;       /* its replies, in order */
} router_outbox_t;

struct router_s {
    router_config_t cfg;
    const router_policy_t *policy;
    /* Prefix caches (issue 38): which worker holds which KV blocks, from
     * their KvEvents (slot = index in workers[]); the kv-aware policy
     * scores by it. */
    router_kvindex_t *kvindex;
    /* --tokenizer (issue 38): text prompts tokenized at admission, for
     * the kv-aware pick and the decode worker's prefix match; NULL: none */
    tok_t *tok;
    uint64_t tok_id;            /* tok_identity(tok), 0 without one */
    router_kv_weights_t kv_weights; /* cfg.kv_weights parsed */
    uint64_t kv_event_batches;  /* KvEvents applied */
    uint64_t kv_resyncs;        /* KvResyncRequests sent */
    router_kv_mode_t kv_mode;  /* cfg.kv_transport parsed */
    int aggregate;             /* 0 never, 1 fallback, 2 always, 3 ttft
                                  (router_flow.c pick_pair) */
    void *ctx;                 /* ZeroMQ context */
    void *client_sock;         /* ROUTER, clients */
    void *control_sock;        /* ROUTER, workers */
    volatile sig_atomic_t stop; /* set by router_stop() */
    bool draining;
    uint64_t drain_deadline_ns;
    router_worker_t workers[ROUTER_MAX_WORKERS];
    uint64_t instance;         /* random per process: request ids carry it
                                  and workers see a restart by it */
    uint64_t next_worker_uid;
    uint64_t next_req_id;      /* instance tag in bits 40..62 */
    uint64_t stale_msgs;       /* worker messages of a superseded attempt
                                  or registration, dropped */
    unsigned rr_prefill;       /* round-robin cursors */
    unsigned rr_decode;
    router_req_t *all_head;    /* every live request */
    int n_live;
    router_req_t **queue;      /* (queue_cap) admission queue, by priority */
    int n_queued;
    int queue_cap;
    router_req_t *by_id[ROUTER_HASH_BUCKETS];
    router_req_t *by_client[ROUTER_HASH_BUCKETS];
    router_tenant_t tenants[ROUTER_MAX_TENANTS]; /* fair queueing */
    double vclock;             /* virtual time: the largest start tag
                                  dispatched so far */
    uint64_t completed;
    uint64_t failed;
    uint64_t t_capacity_ns;    /* capacity last came free: a dispatched
                                  request ended or let go of its workers,
                                  or a worker registered (the queue
                                  timeout of a request waiting for
                                  capacity counts from here too) */
    uint64_t last_liveness_ns;
    router_metrics_t metrics;  /* for GET /metrics */
    router_http_t *http;       /* metrics listener, NULL without one */
    /* CURVE (router_zap.c) */
    bool curve;                /* sockets are CURVE servers */
    void *zap_sock;            /* REP on inproc://zeromq.zap.01, or NULL */
    bt_curve_allow_t *allow_workers; /* control socket's allow list */
    bt_curve_allow_t *allow_clients; /* client socket's allow list */
    uint64_t zap_allowed;      /* handshakes admitted */
    uint64_t zap_denied[2];    /* refused: [0] clients, [1] workers */
    uint64_t foreign_msgs;     /* worker messages from a key that is not
                                  the registration's, dropped */
    router_outbox_t outbox[ROUTER_OUTBOX_CONNS]; /* (n_outbox) used this
                                  turn; memory kept across turns */
    int n_outbox;
};

// ---------------------------------------------------------------------------
// router_zap.c: CURVE authentication (ZAP handler)

/* Loads the keys and allow lists and binds the ZAP handler (before the
 * sockets bind, so no connection is ever admitted unauthenticated); a
 * no-op without cfg.curve_secret_key, where it checks instead that both
 * endpoints are loopback unless cfg.insecure.  Writes the server secret
 * key to secret_p (41 bytes) when CURVE is on. */
bt_status_t router__zap_create(router_t *r, char *secret_p);
void router__zap_destroy(router_t *r);
/* Answers every ZAP request waiting (non-blocking). */
void router__zap_process(router_t *r);

// ---------------------------------------------------------------------------
// router_registry.c: the worker table

/* The registered worker with ZeroMQ routing id rid[0..len), or NULL. */
router_worker_t *router__worker_by_rid(router_t *r, const void *rid,
                                       size_t len);
/* The registered worker with registration number uid, or NULL (uid 0:
 * none). */
router_worker_t *router__worker_by_uid(router_t *r, uint64_t uid);
/* Forgets a worker's registration (the slot becomes free). */
void router__worker_clear(router_worker_t *w);
/* A KvEvents batch from w (router_kvindex.h; asks for a resync). */
void router__on_kv_events(router_t *r, router_worker_t *w,
                          const Baton__KvEvents *ev);
/* Removes a worker that died, left or went silent; its requests are
 * re-queued. */
void router__worker_drop(router_t *r, router_worker_t *w, const char *why);
/* Marks silent workers, drops those past heartbeat_miss intervals. */
void router__check_liveness(router_t *r, uint64_t now);
/* True when a usable prefill-capable and a usable decode worker exist. */
bool router__can_serve(router_t *r);
/* The largest decode context and the smallest vocabulary registered (0:
 * none known): limits checked at admission. */
uint32_t router__cluster_max_context(router_t *r);
uint32_t router__cluster_min_vocab(router_t *r);
/* key: the CURVE public key (Z85) the Register came from, "" without
 * CURVE. */
void router__on_register(router_t *r, const uint8_t *id, size_t id_len,
                         const char *key, const Baton__Register *reg);
void router__on_heartbeat(router_t *r, router_worker_t *w,
                          const Baton__Heartbeat *hb);
/* How long a worker's running turn may last before it counts as stuck:
 * the longer of cfg.stall_ms and 20 of its longest recent turns. */
uint64_t router__worker_stall_ns(const router_t *r, const router_worker_t *w);

// ---------------------------------------------------------------------------
// router_request.c: request objects, the admission queue, endings

router_req_t *router__req_find(router_t *r, uint64_t id);
router_req_t *router__req_find_client(router_t *r, const uint8_t *cid,
                                      size_t cid_len, uint64_t rid);
/* Links a new request (takes ownership) into the live list and hashes
 * and queues it by priority. */
void router__req_admit(router_t *r, router_req_t *req);
/* The tenant slot for `name` (NULL or "": the default, 0), taking a free
 * slot for a new one; every slot taken: the default's.  The caller
 * counts the request in tenants[i].live. */
int router__tenant_slot(router_t *r, const char *name);
/* A request leaves the queue for a worker: the virtual clock moves to its
 * tag. */
void router__queue_dispatched(router_t *r, router_req_t *req);
/* Takes a request out of the admission queue (no-op when not queued). */
void router__queue_remove(router_t *r, router_req_t *req);
/* Gives back the prefill worker's share of a request's load. */
void router__req_unassign_prefill(router_t *r, router_req_t *req);
/* Unlinks and frees a request (req is invalid after the call). */
void router__req_destroy(router_t *r, router_req_t *req);
/* Tells the workers holding a request to forget it, by its state. */
void router__req_release_workers(router_t *r, router_req_t *req);
/* Ends a request with an error reply, releasing what workers hold. */
void router__req_fail(router_t *r, router_req_t *req, Baton__ErrorCode code,
                      const char *text);
/* Puts a request back in the queue (worker failure counts against
 * max_retries; over it the request fails). */
void router__req_requeue(router_t *r, router_req_t *req, bool failure,
                         uint64_t delay_ns);
/* Ends a request with Finished(reason). */
void router__req_complete(router_t *r, router_req_t *req,
                          Baton__FinishReason reason);
/* Appends ids sent to the client; false when out of memory. */
bool router__req_append_generated(router_req_t *req, const int *ids, int n);
/* Tokens the request's next prefill covers (an upper bound for text). */
int router__req_prefill_tokens(const router_req_t *req);
/* The upper bound of a text prompt's tokens (a worker tokenizes it). */
int router__req_text_tokens(const router_req_t *req);
/* The stop ids a request's decode obeys (its own + the model's EOS);
 * buf holds PROTO_MAX_STOP + ROUTER_MAX_EOS. */
int router__req_stop_ids(const router_req_t *req, const router_worker_t *d,
                         int *buf);
/* Fails requests past their deadline or the queue timeout; abandons
 * (re-queues) attempts whose phase deadline passed. */
void router__check_deadlines(router_t *r, uint64_t now);
/* Sets req's phase deadline for the phase it just entered, from the
 * measured step cost of the worker doing it (router_request.c). */
void router__req_phase_deadline(router_t *r, router_req_t *req);

// ---------------------------------------------------------------------------
// router_flow.c: the request state machine

/* Starts queued requests the policy finds workers for (KvReserve). */
void router__dispatch(router_t *r);
void router__on_kv_grant(router_t *r, router_worker_t *w, Baton__KvGrant *g);
void router__on_prefill_done(router_t *r, router_worker_t *w,
                             Baton__PrefillDone *done);
void router__on_token_out(router_t *r, router_worker_t *w,
                          const Baton__TokenOut *out);
void router__on_task_error(router_t *r, router_worker_t *w,
                           const Baton__TaskError *te);

// ---------------------------------------------------------------------------
// router_control.c: the worker socket

/* Handles one message from the control socket (routing id + body). */
void router__handle_control(router_t *r, bt_zmq_msg_t *zm);
/* Sends msg to worker w (NULL: nothing): at once, or with the rest of
 * the loop turn's when w takes batches (router__control_flush); a failure
 * is logged. */
void router__send_control(router_t *r, router_worker_t *w,
                          Baton__ControlMessage *msg);
/* Sends what the loop turn queued for each worker (router__send_control
 * to a worker that takes batches), one message per worker. */
void router__control_flush(router_t *r);
/* The same for one worker (before it is dropped). */
void router__worker_flush(router_t *r, router_worker_t *w);
void router__send_kv_release(router_t *r, router_worker_t *d, uint64_t id,
                             uint64_t epoch);
void router__send_cancel_task(router_t *r, router_worker_t *w, uint64_t id);

// ---------------------------------------------------------------------------
// router_client.c: the client socket

/* Handles one message from the client socket (routing id + body). */
void router__handle_client(router_t *r, bt_zmq_msg_t *zm);
/* A TokenChunk of n ids (may be 0) from index, with optional text. */
void router__send_chunk(router_t *r, router_req_t *req, int index,
                        const int *ids, int n, const uint8_t *text,
                        size_t text_len);

/* Logprobs relayed with a chunk (SamplingParams.logprobs): one logprob
 * per id and k alternatives per id (top_ids/top_logprobs hold n * k). */
typedef struct {
    const float *logprobs;     /* (n) */
    const int32_t *top_ids;    /* (n, k) */
    const float *top_logprobs; /* (n, k) */
    int k;
    /* the prompt's (first chunk only; n_prompt 0: none) */
    const int *prompt_ids;     /* (n_prompt) */
    int n_prompt;
    const float *prompt_logprobs;     /* (n_prompt - 1) positions 1.. */
    const int32_t *prompt_top_ids;    /* (n_prompt - 1, pk) */
    const float *prompt_top_logprobs; /* (n_prompt - 1, pk) */
    int pk;
} router_chunk_lp_t;

/* router__send_chunk with logprobs (lp NULL: none; lp->logprobs NULL:
 * only the prompt's). */
void router__send_chunk_lp(router_t *r, router_req_t *req, int index,
                           const int *ids, int n, const uint8_t *text,
                           size_t text_len, const router_chunk_lp_t *lp);
/* Finished with usage and per-phase timings. */
void router__send_finished(router_t *r, router_req_t *req,
                           Baton__FinishReason reason);
void router__send_req_error(router_t *r, router_req_t *req,
                            Baton__ErrorCode code, const char *text);
/* Sends every reply the outbox holds (end of a loop turn). */
void router__client_flush(router_t *r);
/* Frees the outbox's memory (router_destroy). */
void router__client_outbox_cleanup(router_t *r);

#endif /* BT_ROUTER_ROUTER_INT_H */
