/*
 * kv_transport_stage_ops.c - the copy/event tables of kv_transport_stage.h:
 * host memory standing in for device memory (CI, tests) and the CUDA
 * runtime (compiled only with BATON_HAVE_CUDA; without it the table's
 * stream_create fails with BT_ERR_UNSUPPORTED), plus the UCX CUDA-support
 * probe.
 *
 * Host stand-in: a stream is a helper thread draining a ring of copies;
 * every copy gets a sequence number, an event records the stream's last
 * submitted number and is complete when the thread has finished that one.
 * That models DMA engines: copies run while the caller does other work,
 * in order per stream.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "kv/kv_transport_stage.h"

#ifdef BATON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define KV_STAGE_SUBSYS "KV"

// ----------------------------------------------------------------------------
// Host stand-in: threaded streams

typedef struct {
    void *dst;        /* destination */
    const void *src;  /* source */
    size_t bytes;     /* length */
} kv_host_copy_t;

typedef struct {
    bool threaded;            /* helper thread (else synchronous) */
    pthread_t thread;         /* the "DMA engine" */
    pthread_mutex_t lock;     /* guards everything below */
    pthread_cond_t cond;      /* work queued / stop */
    kv_host_copy_t *ring;     /* (cap) queued copies */
    size_t cap;               /* ring capacity (power of two) */
    size_t head;              /* next to run (monotonic) */
    size_t tail;              /* next free (monotonic) */
    uint64_t submitted;       /* copies submitted */
    _Atomic uint64_t done;    /* copies finished */
    bool stop;                /* thread must exit */
} kv_host_stream_t;

typedef struct {
    kv_host_stream_t *stream; /* stream of the last record, NULL: none */
    uint64_t seq;             /* complete when stream->done >= seq */
} kv_host_event_t;

static void *kv_host_stream_main(void *arg)
{
    kv_host_stream_t *s = arg;

    pthread_mutex_lock(&s->lock);
    for (;;) {
        kv_host_copy_t c;
        while (s->head == s->tail && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->head == s->tail)
            break; /* stop, and drained */
        c = s->ring[s->head & (s->cap - 1)];
        pthread_mutex_unlock(&s->lock);
        memcpy(c.dst, c.src, c.bytes);
        pthread_mutex_lock(&s->lock);
        s->head++;
        atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static bt_status_t kv_host_stream_create_common(bool threaded,
                                                void **stream_p)
{
    kv_host_stream_t *s = bt_calloc(1, sizeof(*s), "kv_stage_stream");
    int ret;

    if (s == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "stream");
    s->threaded = threaded;
    atomic_init(&s->done, 0);
    if (threaded) {
        s->cap = 64;
        s->ring = bt_malloc(s->cap * sizeof(*s->ring), "kv_stage_stream");
        if (s->ring == NULL) {
            bt_free(s);
            return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "stream");
        }
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->cond, NULL);
        ret = pthread_create(&s->thread, NULL, kv_host_stream_main, s);
        if (ret != 0) {
            pthread_cond_destroy(&s->cond);
            pthread_mutex_destroy(&s->lock);
            bt_free(s->ring);
            bt_free(s);
            return BT_ERROR(BT_ERR_INTERNAL, KV_STAGE_SUBSYS,
                            "pthread_create: %s", strerror(ret));
        }
    }
    *stream_p = s;
    return BT_OK;
}

static bt_status_t kv_host_stream_create_threaded(void **stream_p)
{
    return kv_host_stream_create_common(true, stream_p);
}

static bt_status_t kv_host_stream_create_sync(void **stream_p)
{
    return kv_host_stream_create_common(false, stream_p);
}

static void kv_host_stream_destroy(void *stream)
{
    kv_host_stream_t *s = stream;

    if (s == NULL)
        return;
    if (s->threaded) {
        pthread_mutex_lock(&s->lock);
        s->stop = true;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        bt_free(s->ring);
    }
    bt_free(s);
}

static bt_status_t kv_host_copy_async(void *stream, void *dst,
                                      const void *src, size_t bytes)
{
    kv_host_stream_t *s = stream;

    if (!s->threaded) {
        memcpy(dst, src, bytes);
        s->submitted++;
        atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
        return BT_OK;
    }
    pthread_mutex_lock(&s->lock);
    if (s->tail - s->head == s->cap) {
        /* Grow: copy the live entries to the same positions mod 2cap. */
        size_t ncap = s->cap * 2;
        kv_host_copy_t *nr = bt_malloc(ncap * sizeof(*nr), "kv_stage_stream");
        if (nr == NULL) {
            pthread_mutex_unlock(&s->lock);
            return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "copy queue");
        }
        for (size_t i = s->head; i != s->tail; i++)
            nr[i & (ncap - 1)] = s->ring[i & (s->cap - 1)];
        bt_free(s->ring);
        s->ring = nr;
        s->cap = ncap;
    }
    s->ring[s->tail & (s->cap - 1)] =
        (kv_host_copy_t){ .dst = dst, .src = src, .bytes = bytes };
    s->tail++;
    s->submitted++;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return BT_OK;
}

static bt_status_t kv_host_event_create(void **event_p)
{
    kv_host_event_t *e = bt_calloc(1, sizeof(*e), "kv_stage_event");
    if (e == NULL)
        return BT_ERROR(BT_ERR_NO_MEMORY, KV_STAGE_SUBSYS, "event");
    *event_p = e;
    return BT_OK;
}

static void kv_host_event_destroy(void *event)
{
    bt_free(event);
}

static bt_status_t kv_host_event_record(void *event, void *stream)
{
    kv_host_event_t *e = event;
    kv_host_stream_t *s = stream;

    e->stream = s;
    e->seq = s->submitted; /* only the owner thread writes submitted */
    return BT_OK;
}

static bt_status_t kv_host_event_query(void *event)
{
    kv_host_event_t *e = event;

    if (e->stream == NULL ||
        atomic_load_explicit(&e->stream->done, memory_order_acquire) >=
            e->seq)
        return BT_OK;
    return BT_IN_PROGRESS;
}

static bt_status_t kv_host_register(void *ptr, size_t bytes)
{
    (void)ptr;
    (void)bytes;
    return BT_OK;
}

static void kv_host_unregister(void *ptr)
{
    (void)ptr;
}

static const kv_stage_ops_t kv_stage_host_threaded = {
    .name = "host",
    .mem_type = KV_UCX_MEM_HOST,
    .stream_create = kv_host_stream_create_threaded,
    .stream_destroy = kv_host_stream_destroy,
    .copy_async = kv_host_copy_async,
    .event_create = kv_host_event_create,
    .event_destroy = kv_host_event_destroy,
    .event_record = kv_host_event_record,
    .event_query = kv_host_event_query,
    .host_register = kv_host_register,
    .host_unregister = kv_host_unregister,
};

static const kv_stage_ops_t kv_stage_host_sync = {
    .name = "host-sync",
    .mem_type = KV_UCX_MEM_HOST,
    .stream_create = kv_host_stream_create_sync,
    .stream_destroy = kv_host_stream_destroy,
    .copy_async = kv_host_copy_async,
    .event_create = kv_host_event_create,
    .event_destroy = kv_host_event_destroy,
    .event_record = kv_host_event_record,
    .event_query = kv_host_event_query,
    .host_register = kv_host_register,
    .host_unregister = kv_host_unregister,
};

const kv_stage_ops_t *kv_stage_ops_host(bool threaded)
{
    return threaded ? &kv_stage_host_threaded : &kv_stage_host_sync;
}

// ----------------------------------------------------------------------------
// CUDA runtime

#ifdef BATON_HAVE_CUDA

/* Converts a CUDA result at the boundary; logs once. */
#define KV_STAGE_CUDA(_expr) kv_stage_cuda_check((_expr), #_expr, __func__)

static bt_status_t kv_stage_cuda_check(cudaError_t err, const char *expr,
                                       const char *func)
{
    if (err == cudaSuccess)
        return BT_OK;
    (void)cudaGetLastError();
    return BT_ERROR(BT_ERR_CUDA, KV_STAGE_SUBSYS, "%s: %s failed: %s", func,
                    expr, cudaGetErrorString(err));
}

static bt_status_t kv_cuda_stream_create(void **stream_p)
{
    cudaStream_t s = NULL;
    int n = 0;
    bt_status_t status;

    status = KV_STAGE_CUDA(cudaGetDeviceCount(&n));
    if (status != BT_OK)
        return status;
    if (n == 0)
        return BT_ERROR(BT_ERR_CUDA, KV_STAGE_SUBSYS, "no CUDA device");
    status = KV_STAGE_CUDA(cudaStreamCreateWithFlags(&s,
                                                     cudaStreamNonBlocking));
    if (status != BT_OK)
        return status;
    *stream_p = s;
    return BT_OK;
}

static void kv_cuda_stream_destroy(void *stream)
{
    if (stream == NULL)
        return;
    (void)KV_STAGE_CUDA(cudaStreamSynchronize((cudaStream_t)stream));
    (void)KV_STAGE_CUDA(cudaStreamDestroy((cudaStream_t)stream));
}

static bt_status_t kv_cuda_copy_async(void *stream, void *dst,
                                      const void *src, size_t bytes)
{
    return KV_STAGE_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                         (cudaStream_t)stream));
}

static bt_status_t kv_cuda_event_create(void **event_p)
{
    cudaEvent_t e = NULL;
    bt_status_t status;

    status = KV_STAGE_CUDA(cudaEventCreateWithFlags(&e,
                                                    cudaEventDisableTiming));
    if (status != BT_OK)
        return status;
    *event_p = e;
    return BT_OK;
}

static void kv_cuda_event_destroy(void *event)
{
    if (event != NULL)
        (void)KV_STAGE_CUDA(cudaEventDestroy((cudaEvent_t)event));
}

static bt_status_t kv_cuda_event_record(void *event, void *stream)
{
    return KV_STAGE_CUDA(cudaEventRecord((cudaEvent_t)event,
                                         (cudaStream_t)stream));
}

static bt_status_t kv_cuda_event_query(void *event)
{
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);

    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return BT_IN_PROGRESS;
    }
    return KV_STAGE_CUDA(err);
}

static bt_status_t kv_cuda_host_register(void *ptr, size_t bytes)
{
    return KV_STAGE_CUDA(cudaHostRegister(ptr, bytes,
                                          cudaHostRegisterPortable));
}

static void kv_cuda_host_unregister(void *ptr)
{
    (void)KV_STAGE_CUDA(cudaHostUnregister(ptr));
}

#else /* !BATON_HAVE_CUDA */

static bt_status_t kv_cuda_unsupported(void)
{
    return BT_ERROR(BT_ERR_UNSUPPORTED, KV_STAGE_SUBSYS,
                    "built without CUDA: no device copies");
}

static bt_status_t kv_cuda_stream_create(void **stream_p)
{
    (void)stream_p;
    return kv_cuda_unsupported();
}

static void kv_cuda_stream_destroy(void *stream)
{
    (void)stream;
}

static bt_status_t kv_cuda_copy_async(void *stream, void *dst,
                                      const void *src, size_t bytes)
{
    (void)stream;
    (void)dst;
    (void)src;
    (void)bytes;
    return kv_cuda_unsupported();
}

static bt_status_t kv_cuda_event_create(void **event_p)
{
    (void)event_p;
    return kv_cuda_unsupported();
}

static void kv_cuda_event_destroy(void *event)
{
    (void)event;
}

static bt_status_t kv_cuda_event_record(void *event, void *stream)
{
    (void)event;
    (void)stream;
    return kv_cuda_unsupported();
}

static bt_status_t kv_cuda_event_query(void *event)
{
    (void)event;
    return kv_cuda_unsupported();
}

static bt_status_t kv_cuda_host_register(void *ptr, size_t bytes)
{
    (void)ptr;
    (void)bytes;
    return kv_cuda_unsupported();
}

static void kv_cuda_host_unregister(void *ptr)
{
    (void)ptr;
}

#endif /* BATON_HAVE_CUDA */

static const kv_stage_ops_t kv_stage_cuda_ops = {
    .name = "cuda",
    .mem_type = KV_UCX_MEM_CUDA,
    .stream_create = kv_cuda_stream_create,
    .stream_destroy = kv_cuda_stream_destroy,
    .copy_async = kv_cuda_copy_async,
    .event_create = kv_cuda_event_create,
    .event_destroy = kv_cuda_event_destroy,
    .event_record = kv_cuda_event_record,
    .event_query = kv_cuda_event_query,
    .host_register = kv_cuda_host_register,
    .host_unregister = kv_cuda_host_unregister,
};

const kv_stage_ops_t *kv_stage_ops_cuda(void)
{
    return &kv_stage_cuda_ops;
}

// ----------------------------------------------------------------------------
// UCX CUDA support probe

bool kv_stage_ucx_has_cuda(void)
{
    static int cached = -1; /* -1 unknown, 0 no, 1 yes */
    ucp_config_t *config = NULL;
    ucp_context_h context = NULL;
    ucp_params_t params;
    ucp_context_attr_t attr;

    if (cached >= 0)
        return cached == 1;
    cached = 0;
    if (ucp_config_read(NULL, NULL, &config) != UCS_OK)
        return false;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    if (ucp_init(&params, config, &context) == UCS_OK) {
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
        if (ucp_context_query(context, &attr) == UCS_OK &&
            (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
            cached = 1;
        ucp_cleanup(context);
    }
    ucp_config_release(config);
    BT_LOG_DEBUG(KV_STAGE_SUBSYS, "UCX CUDA memory support: %s",
                 cached ? "yes" : "no");
    return cached == 1;
}
