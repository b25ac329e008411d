/*
 * nccl_dl.c - NCCL through dlopen (see nccl_dl.h).
 *
 * The declarations below mirror nccl.h (NCCL 2.x; these signatures and
 * enum values have not changed since 2.0): ncclResult_t is an int enum
 * (0 = success), ncclComm_t an opaque pointer, ncclFloat32 = 7,
 * ncclSum = 0, cudaStream_t a pointer.
 */
#include "nccl_dl.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"

#define NCCL_SUCCESS 0
#define NCCL_FLOAT32 7
#define NCCL_SUM 0

typedef int (*nccl_get_version_fn)(int *version);
typedef int (*nccl_get_unique_id_fn)(cuda_nccl_id_t *id);
typedef int (*nccl_comm_init_rank_fn)(void **comm, int n_ranks,
                                      cuda_nccl_id_t id, int rank);
typedef int (*nccl_comm_destroy_fn)(void *comm);
typedef int (*nccl_all_reduce_fn)(const void *send, void *recv, size_t count,
                                  int dtype, int op, void *comm,
                                  void *stream);
typedef const char *(*nccl_get_error_string_fn)(int result);

struct cuda_nccl_s {
    void *lib;                          /* dlopen handle */
    int version;
    nccl_get_unique_id_fn get_unique_id;
    nccl_comm_init_rank_fn comm_init_rank;
    nccl_comm_destroy_fn comm_destroy;
    nccl_all_reduce_fn all_reduce;
    nccl_get_error_string_fn error_string;
};

static bt_status_t nccl_fail(cuda_nccl_t *nccl, int res, const char *what)
{
    return BT_ERROR(BT_ERR_CUDA, "NCCL", "%s failed: %s (%d)", what,
                    nccl->error_string ? nccl->error_string(res) : "?",
                    res);
}

bt_status_t cuda_nccl_open(cuda_nccl_t **nccl_p)
{
    const char *path = getenv("BT_NCCL_LIB");
    cuda_nccl_t *nccl;
    nccl_get_version_fn get_version;
    bt_status_t status;

    if (path == NULL || path[0] == '\0')
        path = "libnccl.so.2";
    /* NVLink multicast (NVLS) stays off: the device machines require it,
     * and it must be set before the first communicator. */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    /* connect at init (NCCL >= 2.22 connects lazily at the first
     * collective of each kind, which may fall inside a graph capture);
     * a value set by the user wins */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    nccl = bt_calloc(1, sizeof(*nccl), "nccl");
    if (nccl == NULL)
        return BT_ERR_NO_MEMORY;
    nccl->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (nccl->lib == NULL) {
        status = BT_ERROR(BT_ERR_UNSUPPORTED, "NCCL",
                          "tensor parallelism needs NCCL, and %s could not "
                          "be loaded (%s); put the directory holding "
                          "libnccl.so.2 on LD_LIBRARY_PATH (pip: "
                          "site-packages/nvidia/nccl/lib), set BT_NCCL_LIB "
                          "to the file, or use BT_TP_ALLREDUCE=custom",
                          path, dlerror());
        bt_free(nccl);
        return status;
    }
#define NCCL_SYM(_field, _type, _name)                                       \
    do {                                                                    \
        *(void **)&nccl->_field = dlsym(nccl->lib, _name);                  \
        if (nccl->_field == NULL) {                                         \
            status = BT_ERROR(BT_ERR_UNSUPPORTED, "NCCL",                   \
                              "%s has no symbol %s", path, _name);          \
            goto fail;                                                      \
        }                                                                   \
    } while (0)
    NCCL_SYM(get_unique_id, nccl_get_unique_id_fn, "ncclGetUniqueId");
    NCCL_SYM(comm_init_rank, nccl_comm_init_rank_fn, "ncclCommInitRank");
    NCCL_SYM(comm_destroy, nccl_comm_destroy_fn, "ncclCommDestroy");
    NCCL_SYM(all_reduce, nccl_all_reduce_fn, "ncclAllReduce");
    NCCL_SYM(error_string, nccl_get_error_string_fn, "ncclGetErrorString");
#undef NCCL_SYM
    *(void **)&get_version = dlsym(nccl->lib, "ncclGetVersion");
    if (get_version != NULL && get_version(&nccl->version) != NCCL_SUCCESS)
        nccl->version = 0;
    BT_LOG_INFO("NCCL", "loaded %s (version %d), NCCL_NVLS_ENABLE=0", path,
                nccl->version);
    *nccl_p = nccl;
    return BT_OK;

fail:
    dlclose(nccl->lib);
    bt_free(nccl);
    return status;
}

void cuda_nccl_close(cuda_nccl_t **nccl_p)
{
    cuda_nccl_t *nccl = *nccl_p;

    if (nccl == NULL)
        return;
    /* NCCL keeps helper threads and CUDA state for the process lifetime;
     * unloading it under them is unsafe, so the library stays mapped. */
    bt_free(nccl);
    *nccl_p = NULL;
}

int cuda_nccl_version(const cuda_nccl_t *nccl)
{
    return nccl->version;
}

bt_status_t cuda_nccl_unique_id(cuda_nccl_t *nccl, cuda_nccl_id_t *id)
{
    int res = nccl->get_unique_id(id);

    return res == NCCL_SUCCESS ? BT_OK : nccl_fail(nccl, res,
                                                   "ncclGetUniqueId");
}

bt_status_t cuda_nccl_comm_init(cuda_nccl_t *nccl, void **comm_p,
                                int n_ranks, const cuda_nccl_id_t *id,
                                int rank)
{
    int res = nccl->comm_init_rank(comm_p, n_ranks, *id, rank);

    return res == NCCL_SUCCESS ? BT_OK : nccl_fail(nccl, res,
                                                   "ncclCommInitRank");
}

void cuda_nccl_comm_destroy(cuda_nccl_t *nccl, void **comm_p)
{
    if (*comm_p == NULL)
        return;
    (void)nccl->comm_destroy(*comm_p);
    *comm_p = NULL;
}

bt_status_t cuda_nccl_allreduce_f32(cuda_nccl_t *nccl, void *comm,
                                    float *d_buf, size_t count, void *stream)
{
    int res = nccl->all_reduce(d_buf, d_buf, count, NCCL_FLOAT32, NCCL_SUM,
                               comm, stream);

    return res == NCCL_SUCCESS ? BT_OK : nccl_fail(nccl, res,
                                                   "ncclAllReduce");
}
