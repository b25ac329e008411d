/* bt_status.c - names of status codes. */
#include "bt_status.h"

const char *bt_status_str(bt_status_t status)
{
    switch (status) {
    case BT_OK: return "ok";
    case BT_IN_PROGRESS: return "in progress";
    case BT_ERR_INVALID_ARG: return "invalid argument";
    case BT_ERR_NO_MEMORY: return "out of memory";
    case BT_ERR_IO: return "I/O error";
    case BT_ERR_FORMAT: return "bad format";
    case BT_ERR_UNSUPPORTED: return "unsupported";
    case BT_ERR_INTERNAL: return "internal error";
    case BT_ERR_REMOTE: return "remote error";
    case BT_ERR_CUDA: return "CUDA error";
    case BT_ERR_TIMEOUT: return "timed out";
    case BT_ERR_OVERLOADED: return "overloaded";
    case BT_ERR_NOT_FOUND: return "not found";
    case BT_ERR_CANCELLED: return "cancelled";
    case BT_ERR_NO_RESOURCE: return "no resource";
    case BT_ERR_NET: return "network error";
    default: return "unknown status";
    }
}
