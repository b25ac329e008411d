/*
 * kv_fd_channel.c - file descriptors by token over an abstract Unix
 * socket (kv_fd_channel.h).  The serving thread answers one request per
 * connection; the offers live in a small table under a mutex.
 */
#include "kv/kv_fd_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"

#define FDCH_MAGIC "BKFD"
#define FDCH_VERSION 1u
#define FDCH_MSG_BYTES 24

typedef struct {
    uint8_t token[KV_FDCH_TOKEN_BYTES];
    int fd;              /* our dup; -1: free entry */
    pid_t pid;           /* 0: any process of our uid */
} fdch_offer_t;

struct kv_fdch_s {
    int listen_fd;
    int wake[2];         /* a pipe: destroy wakes the thread */
    pthread_t thread;
    pthread_mutex_t lock;
    fdch_offer_t *offers; /* (n_offers) guarded by lock */
    int n_offers;
    uid_t uid;
    uint64_t refused;    /* guarded by lock */
    uint64_t handed;
    char name[KV_FDCH_NAME_MAX];
};

static socklen_t abstract_addr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    /* sun_path[0] = '\0': the abstract namespace, no file to clean up */
    memcpy(sa->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

bool kv_fdch__peer_allowed(uid_t uid, pid_t pid, uid_t my_uid,
                           pid_t want_pid)
{
    if (uid != my_uid)
        return false;
    return want_pid == 0 || pid == want_pid;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* Sends the reply, with `fd` attached when it is >= 0. */
static void send_reply(int conn, int32_t status, const uint8_t *token,
                       int fd)
{
    uint8_t msg[FDCH_MSG_BYTES];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { msg, sizeof(msg) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

    memcpy(msg, FDCH_MAGIC, 4);
    put_u32(msg + 4, (uint32_t)status);
    memcpy(msg + 8, token, KV_FDCH_TOKEN_BYTES);
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    /* SO_SNDTIMEO bounds it; a peer that went away is its own loss */
    (void)sendmsg(conn, &mh, MSG_NOSIGNAL);
}

/* Reads exactly `len` bytes by `deadline` (ns); false otherwise. */
static bool read_full(int fd, uint8_t *buf, size_t len, uint64_t deadline)
{
    size_t got = 0;

    while (got < len) {
        uint64_t now = bt_time_ns();
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int ms, ret;
        ssize_t n;

        if (now >= deadline)
            return false;
        ms = (int)((deadline - now + 999999) / 1000000);
        ret = poll(&p, 1, ms);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret <= 0)
            return false;
        n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

static fdch_offer_t *find_offer(kv_fdch_t *ch, const uint8_t *token)
{
    for (int i = 0; i < ch->n_offers; i++)
        if (ch->offers[i].fd >= 0 &&
            bt_ct_equal(ch->offers[i].token, token, KV_FDCH_TOKEN_BYTES))
            return &ch->offers[i];
    return NULL;
}

/* One connection: check the peer, read its request, answer. */
static void serve_conn(kv_fdch_t *ch, int conn)
{
    uint64_t deadline = bt_time_ns() +
                        (uint64_t)KV_FDCH_PEER_DEADLINE_MS * 1000000ull;
    struct timeval tv = { 0, KV_FDCH_PEER_DEADLINE_MS * 1000 };
    uint8_t req[FDCH_MSG_BYTES];
    uint8_t none[KV_FDCH_TOKEN_BYTES] = { 0 };
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    int32_t status = KV_FDCH_OK;
    int fd = -1;

    (void)setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        !kv_fdch__peer_allowed(cred.uid, cred.pid, ch->uid, 0)) {
        /* another uid: refused before reading anything it sends */
        pthread_mutex_lock(&ch->lock);
        ch->refused++;
        pthread_mutex_unlock(&ch->lock);
        send_reply(conn, KV_FDCH_PEER, none, -1);
        return;
    }
    if (!read_full(conn, req, sizeof(req), deadline)) {
        pthread_mutex_lock(&ch->lock);
        ch->refused++; /* short, slow or nothing: dropped */
        pthread_mutex_unlock(&ch->lock);
        return;
    }
    if (memcmp(req, FDCH_MAGIC, 4) != 0 || get_u32(req + 4) != FDCH_VERSION) {
        pthread_mutex_lock(&ch->lock);
        ch->refused++;
        pthread_mutex_unlock(&ch->lock);
        send_reply(conn, KV_FDCH_MALFORMED, none, -1);
        return;
    }
    pthread_mutex_lock(&ch->lock);
    fdch_offer_t *o = find_offer(ch, req + 8);
    if (o == NULL) {
        status = KV_FDCH_UNKNOWN;
    } else if (!kv_fdch__peer_allowed(cred.uid, cred.pid, ch->uid, o->pid)) {
        status = KV_FDCH_PEER; /* the offer stays for its own peer */
    } else {
        fd = o->fd; /* handed once: the entry goes with it */
        o->fd = -1;
        ch->handed++;
    }
    if (status != KV_FDCH_OK)
        ch->refused++;
    pthread_mutex_unlock(&ch->lock);
    send_reply(conn, status, req + 8, fd);
    if (fd >= 0)
        close(fd); /* the peer holds its own copy now (or lost it) */
}

static void *serve_thread(void *arg)
{
    kv_fdch_t *ch = arg;

    for (;;) {
        struct pollfd p[2] = { { .fd = ch->listen_fd, .events = POLLIN },
                               { .fd = ch->wake[0], .events = POLLIN } };
        int ret = poll(p, 2, -1);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret < 0 || p[1].revents != 0)
            break;
        if (p[0].revents & POLLIN) {
            int conn = accept4(ch->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (conn >= 0) {
                serve_conn(ch, conn);
                close(conn);
            }
        }
    }
    return NULL;
}

bt_status_t kv_fdch_create(kv_fdch_t **ch_p)
{
    struct sockaddr_un sa;
    uint64_t rnd = 0;
    kv_fdch_t *ch;
    bt_status_t status;

    ch = bt_calloc(1, sizeof(*ch), "kv_fdch");
    if (ch == NULL)
        return BT_ERR_NO_MEMORY;
    ch->offers = bt_calloc(KV_FDCH_MAX_TOKENS, sizeof(*ch->offers),
                           "kv_fdch");
    if (ch->offers == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_free;
    }
    ch->uid = geteuid();
    ch->wake[0] = ch->wake[1] = -1;
    status = bt_random_secret(&rnd, sizeof(rnd));
    if (status != BT_OK)
        goto err_free;
    snprintf(ch->name, sizeof(ch->name), "baton-kvfd-%d-%016llx",
             (int)getpid(), (unsigned long long)rnd);
    ch->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ch->listen_fd < 0) {
        status = BT_ERROR(BT_ERR_IO, "KV", "fd channel socket: %s",
                          strerror(errno));
        goto err_free;
    }
    if (bind(ch->listen_fd, (struct sockaddr *)&sa,
             abstract_addr(ch->name, &sa)) != 0 ||
        listen(ch->listen_fd, 64) != 0) {
        status = BT_ERROR(BT_ERR_IO, "KV", "fd channel %s: %s", ch->name,
                          strerror(errno));
        goto err_close;
    }
    if (pipe2(ch->wake, O_CLOEXEC) != 0) {
        status = BT_ERROR(BT_ERR_IO, "KV", "fd channel pipe: %s",
                          strerror(errno));
        goto err_close;
    }
    pthread_mutex_init(&ch->lock, NULL);
    if (pthread_create(&ch->thread, NULL, serve_thread, ch) != 0) {
        status = BT_ERROR(BT_ERR_IO, "KV", "fd channel thread");
        goto err_mutex;
    }
    *ch_p = ch;
    return BT_OK;

err_mutex:
    pthread_mutex_destroy(&ch->lock);
    close(ch->wake[0]);
    close(ch->wake[1]);
err_close:
    close(ch->listen_fd);
err_free:
    bt_free(ch->offers);
    bt_free(ch);
    return status;
}

void kv_fdch_destroy(kv_fdch_t **ch_p)
{
    kv_fdch_t *ch = *ch_p;

    if (ch == NULL)
        return;
    (void)!write(ch->wake[1], "x", 1);
    pthread_join(ch->thread, NULL);
    for (int i = 0; i < ch->n_offers; i++)
        if (ch->offers[i].fd >= 0)
            close(ch->offers[i].fd);
    pthread_mutex_destroy(&ch->lock);
    close(ch->wake[0]);
    close(ch->wake[1]);
    close(ch->listen_fd);
    bt_free(ch->offers);
    bt_free(ch);
    *ch_p = NULL;
}

const char *kv_fdch_name(const kv_fdch_t *ch)
{
    return ch->name;
}

bt_status_t kv_fdch_offer(kv_fdch_t *ch, const uint8_t *token, int fd,
                          pid_t pid)
{
    fdch_offer_t *slot = NULL;
    bt_status_t status = BT_OK;
    int dup_fd;

    dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0)
        return BT_ERROR(BT_ERR_IO, "KV", "fd channel dup: %s",
                        strerror(errno));
    pthread_mutex_lock(&ch->lock);
    if (find_offer(ch, token) != NULL) {
        status = BT_ERR_INVALID_ARG;
        goto out;
    }
    for (int i = 0; i < ch->n_offers && slot == NULL; i++)
        if (ch->offers[i].fd < 0)
            slot = &ch->offers[i];
    if (slot == NULL && ch->n_offers < KV_FDCH_MAX_TOKENS)
        slot = &ch->offers[ch->n_offers++];
    if (slot == NULL) {
        status = BT_ERR_NO_RESOURCE;
        goto out;
    }
    memcpy(slot->token, token, KV_FDCH_TOKEN_BYTES);
    slot->pid = pid;
    slot->fd = dup_fd;
    dup_fd = -1;
out:
    pthread_mutex_unlock(&ch->lock);
    if (dup_fd >= 0)
        close(dup_fd);
    if (status == BT_ERR_INVALID_ARG)
        return BT_ERROR(status, "KV", "fd channel: token offered twice");
    if (status == BT_ERR_NO_RESOURCE)
        return BT_ERROR(status, "KV", "fd channel: %d offers live",
                        KV_FDCH_MAX_TOKENS);
    return status;
}

bool kv_fdch_revoke(kv_fdch_t *ch, const uint8_t *token)
{
    int fd = -1;

    pthread_mutex_lock(&ch->lock);
    fdch_offer_t *o = find_offer(ch, token);
    if (o != NULL) {
        fd = o->fd;
        o->fd = -1;
    }
    pthread_mutex_unlock(&ch->lock);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* One of the channel's counters, read under its lock (its thread adds). */
static uint64_t fdch_counter(const kv_fdch_t *ch, const uint64_t *counter)
{
    kv_fdch_t *c = (kv_fdch_t *)ch;
    uint64_t n;

    pthread_mutex_lock(&c->lock);
    n = *counter;
    pthread_mutex_unlock(&c->lock);
    return n;
}

uint64_t kv_fdch_refused(const kv_fdch_t *ch)
{
    return fdch_counter(ch, &ch->refused);
}

uint64_t kv_fdch_handed(const kv_fdch_t *ch)
{
    return fdch_counter(ch, &ch->handed);
}

// ---------------------------------------------------------------------------
// Client

/* Waits for `events` on fd until `deadline`; false on timeout. */
static bool wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = bt_time_ns();
        struct pollfd p = { .fd = fd, .events = events };
        int ret;
        if (now >= deadline)
            return false;
        ret = poll(&p, 1, (int)((deadline - now + 999999) / 1000000));
        if (ret < 0 && errno == EINTR)
            continue;
        return ret > 0;
    }
}

/* Receives the reply and at most one FD by `deadline`. */
static bt_status_t recv_reply(int s, uint8_t *msg, int *fd_p,
                              uint64_t deadline)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    size_t got = 0;

    *fd_p = -1;
    while (got < FDCH_MSG_BYTES) {
        struct iovec iov = { msg + got, FDCH_MSG_BYTES - got };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                             .msg_control = ctl.buf,
                             .msg_controllen = sizeof(ctl.buf) };
        ssize_t n;

        if (!wait_fd(s, POLLIN, deadline))
            return BT_ERR_TIMEOUT;
        n = recvmsg(s, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return BT_ERR_IO;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL;
             c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int f;
                memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (*fd_p < 0)
                    *fd_p = f;
                else
                    close(f); /* more than one: keep the first only */
            }
        }
        if (mh.msg_flags & MSG_CTRUNC)
            return BT_ERR_FORMAT;
        got += (size_t)n;
    }
    return BT_OK;
}

bt_status_t kv_fdch_fetch(const char *name, const uint8_t *token,
                          int timeout_ms, int *fd_p, int *refusal_p)
{
    uint64_t deadline = bt_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    struct sockaddr_un sa;
    uint8_t req[FDCH_MSG_BYTES], rep[FDCH_MSG_BYTES];
    size_t sent = 0;
    int s, fd = -1;
    int32_t code;
    bt_status_t status;

    if (name == NULL || strlen(name) == 0 ||
        strlen(name) >= KV_FDCH_NAME_MAX || timeout_ms <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "KV", "fd channel fetch: bad "
                        "name or timeout");
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return BT_ERROR(BT_ERR_IO, "KV", "fd channel socket: %s",
                        strerror(errno));
    /* a Unix connect completes or fails at once (EAGAIN: backlog full) */
    if (connect(s, (struct sockaddr *)&sa, abstract_addr(name, &sa)) != 0) {
        status = BT_ERROR(errno == EAGAIN ? BT_ERR_NO_RESOURCE : BT_ERR_IO,
                          "KV", "fd channel %s: connect: %s", name,
                          strerror(errno));
        goto out;
    }
    memcpy(req, FDCH_MAGIC, 4);
    put_u32(req + 4, FDCH_VERSION);
    memcpy(req + 8, token, KV_FDCH_TOKEN_BYTES);
    while (sent < sizeof(req)) {
        ssize_t n;
        if (!wait_fd(s, POLLOUT, deadline)) {
            status = BT_ERROR(BT_ERR_TIMEOUT, "KV", "fd channel %s: send "
                              "timed out", name);
            goto out;
        }
        n = send(s, req + sent, sizeof(req) - sent,
                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            break; /* refused before it read us: its answer is queued */
        if (n < 0) {
            status = BT_ERROR(BT_ERR_IO, "KV", "fd channel %s: send: %s",
                              name, strerror(errno));
            goto out;
        }
        sent += (size_t)n;
    }
    status = recv_reply(s, rep, &fd, deadline);
    if (status == BT_ERR_TIMEOUT) {
        status = BT_ERROR(status, "KV", "fd channel %s: no answer in %d ms",
                          name, timeout_ms);
        goto out;
    }
    if (status != BT_OK) {
        status = BT_ERROR(status, "KV", "fd channel %s: bad reply", name);
        goto out;
    }
    code = (int32_t)get_u32(rep + 4);
    if (memcmp(rep, FDCH_MAGIC, 4) != 0 ||
        (code == KV_FDCH_OK &&
         (fd < 0 || memcmp(rep + 8, token, KV_FDCH_TOKEN_BYTES) != 0))) {
        status = BT_ERROR(BT_ERR_FORMAT, "KV", "fd channel %s: malformed "
                          "reply", name);
        goto out;
    }
    if (code != KV_FDCH_OK) {
        if (refusal_p != NULL)
            *refusal_p = code;
        status = BT_ERROR(BT_ERR_NOT_FOUND, "KV", "fd channel %s: refused "
                          "(%d)", name, code);
        goto out;
    }
    *fd_p = fd;
    fd = -1;
    status = BT_OK;
out:
    if (fd >= 0)
        close(fd);
    close(s);
    return status;
}
