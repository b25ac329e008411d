/*
 * kv_fd_channel.h - hands file descriptors to processes of this host, one
 * per 128-bit token, over a Unix-domain socket (SCM_RIGHTS).
 *
 * The CUDA IPC link's per-reservation windows (kv_transport_cuda_ipc.h)
 * are exported by the decode worker as POSIX file descriptors
 * (cuMemExportToShareableHandle); a descriptor cannot travel in a control
 * message, so the decode worker offers each window's FD here under the
 * grant's random window token (KvGrant.cipc_window, field 15), which
 * travels only in the grant over the authenticated control plane.  The
 * prefill worker that got the grant connects, names the token and
 * receives the FD.  Nothing here knows about CUDA: the test hands memfds.
 *
 * Who gets an FD (fail closed):
 *   - the socket is in the abstract namespace under an unguessable name
 *     ("baton-kvfd-<pid>-<64 random bits>"), published in the pool
 *     descriptor; abstract names have no file permissions, so
 *   - every peer is checked with SO_PEERCRED: its uid must be this
 *     process's effective uid, and when the token was offered for a pid,
 *     that pid (kv_fdch__peer_allowed);
 *   - the token must be offered and not revoked, and is handed ONCE: the
 *     entry is gone after the FD was sent (a second request is refused);
 *   - a malformed, short or slow request is refused or dropped after its
 *     deadline and changes nothing.
 * Refusals are counted (kv_fdch_refused) and answered with a status
 * word, never with an FD.
 *
 * Wire format (little endian, one request per connection):
 *   request  "BKFD" u32 version(1) token[16]                    24 bytes
 *   reply    "BKFD" i32 status     token[16] (+ SCM_RIGHTS fd)   24 bytes
 *
 * Threading: the serving side runs one thread of its own that accepts
 * and answers (the decode worker's loop never waits for a prefill
 * worker); offer/revoke/destroy may be called from any one thread.
 * Each connection is bounded by KV_FDCH_PEER_DEADLINE_MS.
 */
#ifndef BT_WORKER_KV_KV_FD_CHANNEL_H
#define BT_WORKER_KV_KV_FD_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_FDCH_TOKEN_BYTES 16
#define KV_FDCH_NAME_MAX 48          /* abstract socket name and NUL */
#define KV_FDCH_MAX_TOKENS 4096      /* offers live at once */
#define KV_FDCH_PEER_DEADLINE_MS 200 /* one connection's request and reply */

/* Reply statuses (the wire's i32). */
enum {
    KV_FDCH_OK = 0,
    KV_FDCH_UNKNOWN = 1,    /* no live offer for that token */
    KV_FDCH_PEER = 2,       /* the peer's uid or pid is not allowed */
    KV_FDCH_MALFORMED = 3,  /* bad magic or version */
};

typedef struct kv_fdch_s kv_fdch_t;

/* Binds a fresh abstract socket and starts its thread.  BT_ERR_IO. */
bt_status_t kv_fdch_create(kv_fdch_t **ch_p);

/* Stops the thread, closes the socket and every offered FD.  NULL-safe. */
void kv_fdch_destroy(kv_fdch_t **ch_p);

/* The socket's name (without the leading NUL of the abstract namespace),
 * for the pool descriptor. */
const char *kv_fdch_name(const kv_fdch_t *ch);

/* Offers `fd` (dup'ed: the caller keeps and closes its own) under
 * `token` to a process of this uid, and only to pid `pid` when it is
 * non-zero.  BT_ERR_INVALID_ARG for a token already offered,
 * BT_ERR_NO_RESOURCE past KV_FDCH_MAX_TOKENS, BT_ERR_IO. */
bt_status_t kv_fdch_offer(kv_fdch_t *ch, const uint8_t *token, int fd,
                          pid_t pid);

/* Withdraws `token`'s offer (the reservation ended): later requests are
 * refused.  True when it was still offered (not yet handed). */
bool kv_fdch_revoke(kv_fdch_t *ch, const uint8_t *token);

/* Requests refused (any reason) and FDs handed, since create. */
uint64_t kv_fdch_refused(const kv_fdch_t *ch);
uint64_t kv_fdch_handed(const kv_fdch_t *ch);

/* Client: asks the channel `name` for `token`'s FD, all of it within
 * `timeout_ms`.  BT_OK and *fd_p (close-on-exec, the caller's);
 * BT_ERR_NOT_FOUND when refused (*refusal_p, when not NULL, gets the
 * KV_FDCH_* status); BT_ERR_TIMEOUT; BT_ERR_IO / BT_ERR_FORMAT. */
bt_status_t kv_fdch_fetch(const char *name, const uint8_t *token,
                          int timeout_ms, int *fd_p, int *refusal_p);

/* The peer check (exported for its unit test): a peer of uid `uid` and
 * pid `pid` may have an FD offered for `want_pid` (0: any) by a process
 * of effective uid `my_uid`. */
bool kv_fdch__peer_allowed(uid_t uid, pid_t pid, uid_t my_uid,
                           pid_t want_pid);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_KV_KV_FD_CHANNEL_H */
