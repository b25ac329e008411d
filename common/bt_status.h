/*
 * bt_status.h - the one status enum every baton function returns.
 *
 * 0 is success, positive values mean "in progress", negative values are
 * errors whose names say whose fault it is: the caller's (INVALID_ARG,
 * FORMAT), the machine's (NO_MEMORY, IO, CUDA), a peer's (REMOTE) or ours
 * (INTERNAL).  Modelled on UCX's ucs_status_t.
 */
#ifndef BT_COMMON_STATUS_H
#define BT_COMMON_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BT_OK = 0,
    BT_IN_PROGRESS = 1,      /* started, completion reported later */

    BT_ERR_INVALID_ARG = -1, /* the caller passed a bad value */
    BT_ERR_NO_MEMORY = -2,   /* host allocation failed */
    BT_ERR_IO = -3,          /* open/read/mmap/socket failed (errno) */
    BT_ERR_FORMAT = -4,      /* input data is corrupt or inconsistent */
    BT_ERR_UNSUPPORTED = -5, /* valid but not implemented by baton */
    BT_ERR_INTERNAL = -6,    /* a baton bug or broken invariant */
    BT_ERR_REMOTE = -7,      /* a peer process reported a failure */
    BT_ERR_CUDA = -8,        /* CUDA, cuBLASLt or NCCL failed */
    BT_ERR_TIMEOUT = -9,     /* a deadline passed */
    BT_ERR_OVERLOADED = -10, /* admission refused: queue bound reached */
    BT_ERR_NOT_FOUND = -11,  /* named thing (model, request, tensor) absent */
    BT_ERR_CANCELLED = -12,  /* the client or an operator cancelled it */
    BT_ERR_NO_RESOURCE = -13,/* KV blocks, slots or handles exhausted */
    BT_ERR_NET = -14,        /* ZeroMQ or UCX transport failure */
    BT_ERR_LAST = -15
} bt_status_t;

/* Returns a constant, human-readable name such as "invalid argument". */
const char *bt_status_str(bt_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_STATUS_H */
