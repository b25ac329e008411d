/* bt_curve.c - CurveZMQ key files, allow lists, identities (bt_curve.h). */
#include "bt_curve.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"

#define CURVE_LINE_MAX 256
#define CURVE_PATH_MAX 4096

struct bt_curve_allow_s {
    uint8_t (*keys)[BT_CURVE_KEY_BYTES]; /* (n, 32) public keys */
    size_t n;
    size_t cap;
};

// ---------------------------------------------------------------------------
// Key files

/* Strips blanks; a line starting with '#' is a comment ("" returned).
 * Only whole lines: '#' is a Z85 character. */
static char *trim_line(char *line)
{
    char *end;

    while (isspace((unsigned char)*line))
        line++;
    if (line[0] == '#')
        line[0] = '\0';
    end = line + strlen(line);
    while (end > line && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return line;
}

/* Whether s is a Z85 key (40 characters that decode to 32 bytes). */
static bool z85_key_decode(const char *s, uint8_t *key)
{
    uint8_t tmp[BT_CURVE_KEY_BYTES];

    if (strlen(s) != BT_CURVE_Z85_LEN)
        return false;
    return zmq_z85_decode(key != NULL ? key : tmp, s) != NULL;
}

/* Reads the first key line of `path` into key_p (41 bytes). */
static bt_status_t read_key_file(const char *path, const char *what,
                                 char *key_p)
{
    char line[CURVE_LINE_MAX];
    FILE *f;

    if (path == NULL || path[0] == '\0')
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "no %s file given",
                        what);
    f = fopen(path, "r");
    if (f == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot read %s file "
                        "%s: %s", what, path, strerror(errno));
    while (fgets(line, sizeof(line), f) != NULL) {
        char *k = trim_line(line);
        if (k[0] == '\0')
            continue;
        fclose(f);
        if (!z85_key_decode(k, NULL))
            return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "%s file %s does "
                            "not hold a Z85 key (40 characters, from "
                            "`baton keygen`)", what, path);
        memcpy(key_p, k, BT_CURVE_Z85_LEN + 1);
        return BT_OK;
    }
    fclose(f);
    return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "%s file %s is empty", what,
                    path);
}

bt_status_t bt_curve_keygen(const char *prefix, char *public_p)
{
    char pub[BT_CURVE_Z85_LEN + 1], sec[BT_CURVE_Z85_LEN + 1];
    char path[CURVE_PATH_MAX];
    bt_status_t status;
    FILE *f;
    int fd;

    if (zmq_curve_keypair(pub, sec) != 0)
        return BT_ERROR(BT_ERR_INTERNAL, "CURVE", "zmq_curve_keypair: %s "
                        "(libzmq built without CURVE?)",
                        zmq_strerror(zmq_errno()));
    snprintf(path, sizeof(path), "%s.key", prefix);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot create %s: %s",
                        path, strerror(errno));
    if (write(fd, sec, BT_CURVE_Z85_LEN) != BT_CURVE_Z85_LEN ||
        write(fd, "\n", 1) != 1 || fsync(fd) != 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot write %s: %s",
                          path, strerror(errno));
        close(fd);
        unlink(path);
        return status;
    }
    close(fd);
    snprintf(path, sizeof(path), "%s.pub", prefix);
    f = fopen(path, "w");
    if (f == NULL || fprintf(f, "%s\n", pub) < 0 || fclose(f) != 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot write %s: %s",
                          path, strerror(errno));
        snprintf(path, sizeof(path), "%s.key", prefix);
        unlink(path);
        return status;
    }
    if (public_p != NULL)
        memcpy(public_p, pub, sizeof(pub));
    memset(sec, 0, sizeof(sec));
    return BT_OK;
}

bt_status_t bt_curve_load_secret(const char *path, char *secret_p,
                                 char *public_p)
{
    char sec[BT_CURVE_Z85_LEN + 1], pub[BT_CURVE_Z85_LEN + 1];
    struct stat st;
    bt_status_t status;

    status = read_key_file(path, "CURVE secret key", sec);
    if (status != BT_OK)
        return status;
    if (zmq_curve_public(pub, sec) != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot derive the "
                        "public key of %s: %s", path,
                        zmq_strerror(zmq_errno()));
    /* Group-readable is how Kubernetes hands a Secret to a non-root
     * user (fsGroup, mode 0440); world-readable is a mistake. */
    if (stat(path, &st) == 0 && (st.st_mode & 007) != 0)
        BT_LOG_WARN("CURVE", "secret key file %s is readable by others "
                    "(mode %03o); chmod 600 it", path,
                    (unsigned)(st.st_mode & 0777));
    memcpy(secret_p, sec, sizeof(sec));
    if (public_p != NULL)
        memcpy(public_p, pub, sizeof(pub));
    memset(sec, 0, sizeof(sec));
    return BT_OK;
}

bt_status_t bt_curve_load_public(const char *path, char *public_p)
{
    return read_key_file(path, "CURVE public key", public_p);
}

bt_status_t bt_curve_client_load(const char *secret_file,
                                 const char *server_public_file,
                                 bt_curve_client_t *client_p)
{
    bt_curve_client_t c;
    bool has_sec = secret_file != NULL && secret_file[0] != '\0';
    bool has_pub = server_public_file != NULL &&
                   server_public_file[0] != '\0';
    bt_status_t status;

    memset(&c, 0, sizeof(c));
    if (!has_sec && !has_pub) {
        *client_p = c;
        return BT_OK;
    }
    if (!has_sec || !has_pub)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "CURVE needs both a "
                        "secret key (--curve-secret-key, "
                        "BATON_CURVE_SECRET_KEY) and the router's public key "
                        "(--router-public-key, BATON_ROUTER_PUBLIC_KEY); "
                        "only the %s was given",
                        has_sec ? "secret key" : "router's public key");
    status = bt_curve_load_secret(secret_file, c.secret, c.public_);
    if (status != BT_OK)
        return status;
    status = bt_curve_load_public(server_public_file, c.server);
    if (status != BT_OK)
        return status;
    c.on = true;
    *client_p = c;
    return BT_OK;
}

// ---------------------------------------------------------------------------
// The process identity

static bt_curve_client_t g_identity;      /* read-only once set */
static bool g_identity_set;               /* init or env load done */
static pthread_mutex_t g_identity_lock = PTHREAD_MUTEX_INITIALIZER;

bt_status_t bt_curve_identity_init(const char *secret_file,
                                   const char *server_public_file)
{
    bt_curve_client_t c;
    bt_status_t status;

    if (secret_file == NULL)
        secret_file = getenv("BATON_CURVE_SECRET_KEY");
    if (server_public_file == NULL)
        server_public_file = getenv("BATON_ROUTER_PUBLIC_KEY");
    status = bt_curve_client_load(secret_file, server_public_file, &c);
    if (status != BT_OK)
        return status;
    pthread_mutex_lock(&g_identity_lock);
    g_identity = c;
    g_identity_set = true;
    pthread_mutex_unlock(&g_identity_lock);
    if (c.on)
        BT_LOG_INFO("CURVE", "CURVE on: public key %s, router %s", c.public_,
                    c.server);
    return BT_OK;
}

bt_status_t bt_curve_identity(const bt_curve_client_t **client_p)
{
    bool set;

    pthread_mutex_lock(&g_identity_lock);
    set = g_identity_set;
    pthread_mutex_unlock(&g_identity_lock);
    if (!set) {
        bt_status_t status = bt_curve_identity_init(NULL, NULL);
        if (status != BT_OK)
            return status;
    }
    *client_p = &g_identity;
    return BT_OK;
}

bt_status_t bt_curve_client_apply(void *sock, const bt_curve_client_t *c)
{
    if (c == NULL || !c->on)
        return BT_OK;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server,
                       BT_CURVE_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_,
                       BT_CURVE_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret,
                       BT_CURVE_Z85_LEN + 1) != 0)
        return BT_ERROR(BT_ERR_NET, "CURVE", "cannot set CURVE client keys: "
                        "%s", zmq_strerror(zmq_errno()));
    return BT_OK;
}

bt_status_t bt_curve_server_apply(void *sock, const char *secret,
                                  const char *domain)
{
    int server = 1;

    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &server, sizeof(server)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret,
                       BT_CURVE_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0)
        return BT_ERROR(BT_ERR_NET, "CURVE", "cannot set CURVE server keys: "
                        "%s", zmq_strerror(zmq_errno()));
    return BT_OK;
}

// ---------------------------------------------------------------------------
// Allow lists

static bt_status_t allow_add(bt_curve_allow_t *a, const char *z85,
                             const char *where)
{
    uint8_t key[BT_CURVE_KEY_BYTES];

    if (!z85_key_decode(z85, key))
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "%s: '%.48s' is not a "
                        "Z85 public key (40 characters)", where, z85);
    if (bt_curve_allow_has(a, key))
        return BT_OK;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        uint8_t (*keys)[BT_CURVE_KEY_BYTES] =
            bt_malloc(cap * sizeof(*keys), "curve_allow");
        if (keys == NULL)
            return BT_ERR_NO_MEMORY;
        if (a->n > 0)
            memcpy(keys, a->keys, a->n * sizeof(*keys));
        bt_free(a->keys);
        a->keys = keys;
        a->cap = cap;
    }
    memcpy(a->keys[a->n++], key, BT_CURVE_KEY_BYTES);
    return BT_OK;
}

static bt_status_t allow_load_file(bt_curve_allow_t *a, const char *path)
{
    char line[CURVE_LINE_MAX], where[CURVE_PATH_MAX + 32];
    bt_status_t status = BT_OK;
    int lineno = 0;
    FILE *f = fopen(path, "r");

    if (f == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot read allow list "
                        "%s: %s", path, strerror(errno));
    while (status == BT_OK && fgets(line, sizeof(line), f) != NULL) {
        char *k = trim_line(line);
        lineno++;
        if (k[0] == '\0')
            continue;
        snprintf(where, sizeof(where), "%s:%d", path, lineno);
        status = allow_add(a, k, where);
    }
    fclose(f);
    return status;
}

static bt_status_t allow_load_dir(bt_curve_allow_t *a, const char *path)
{
    char file[CURVE_PATH_MAX];
    bt_status_t status = BT_OK;
    struct dirent *de;
    DIR *d = opendir(path);

    if (d == NULL)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot read allow "
                        "directory %s: %s", path, strerror(errno));
    while (status == BT_OK && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 4, ".pub") != 0)
            continue;
        snprintf(file, sizeof(file), "%s/%s", path, de->d_name);
        status = allow_load_file(a, file);
    }
    closedir(d);
    return status;
}

bt_status_t bt_curve_allow_load(const char *path, bt_curve_allow_t **allow_p)
{
    bt_curve_allow_t *a;
    struct stat st;
    bt_status_t status;

    if (path == NULL || path[0] == '\0')
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "no allow list given");
    if (stat(path, &st) != 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "CURVE", "cannot read allow list "
                        "%s: %s", path, strerror(errno));
    a = bt_calloc(1, sizeof(*a), "curve_allow");
    if (a == NULL)
        return BT_ERR_NO_MEMORY;
    status = S_ISDIR(st.st_mode) ? allow_load_dir(a, path)
                                 : allow_load_file(a, path);
    if (status != BT_OK) {
        bt_curve_allow_destroy(&a);
        return status;
    }
    *allow_p = a;
    return BT_OK;
}

void bt_curve_allow_destroy(bt_curve_allow_t **allow_p)
{
    bt_curve_allow_t *a = *allow_p;

    if (a == NULL)
        return;
    bt_free(a->keys);
    bt_free(a);
    *allow_p = NULL;
}

bool bt_curve_allow_has(const bt_curve_allow_t *allow, const uint8_t *key)
{
    if (allow == NULL)
        return false;
    for (size_t i = 0; i < allow->n; i++)
        if (memcmp(allow->keys[i], key, BT_CURVE_KEY_BYTES) == 0)
            return true;
    return false;
}

size_t bt_curve_allow_count(const bt_curve_allow_t *allow)
{
    return allow != NULL ? allow->n : 0;
}

// ---------------------------------------------------------------------------
// Endpoints

bool bt_endpoint_is_local(const char *ep)
{
    const char *host, *end;
    char h[256];
    size_t n;

    if (ep == NULL)
        return false;
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return true;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    host = ep + 6;
    if (host[0] == '[') { /* [::1]:5555 */
        end = strchr(host, ']');
        if (end == NULL)
            return false;
        host++;
    } else {
        end = strrchr(host, ':');
        if (end == NULL)
            return false;
    }
    n = (size_t)(end - host);
    if (n == 0 || n >= sizeof(h))
        return false;
    memcpy(h, host, n);
    h[n] = '\0';
    if (strchr(h, ';') != NULL) /* tcp://src;dst forms: be strict */
        return false;
    return strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0 ||
           (strncmp(h, "127.", 4) == 0 &&
            strspn(h, "0123456789.") == strlen(h));
}
