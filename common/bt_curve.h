/*
 * bt_curve.h - CurveZMQ keys for baton's ZeroMQ sockets (docs/SECURITY.md).
 *
 * Files (written by `baton keygen --out PREFIX`):
 *   PREFIX.key  the secret key, 40 Z85 characters and a newline, mode 0600
 *   PREFIX.pub  the public key, 40 Z85 characters and a newline
 * An allow list (--allow-workers, --allow-clients) is a file of public
 * keys, one per line (a line starting with '#' is a comment; '#' inside a
 * key is Z85), or a directory whose *.pub files each hold one.
 *
 * The process identity is the key pair a worker, client or CLI process
 * connects with, plus the router's public key: --curve-secret-key and
 * --router-public-key, else the environment (BATON_CURVE_SECRET_KEY,
 * BATON_ROUTER_PUBLIC_KEY).  Without either, connections use no
 * encryption (the router then only listens on loopback).  Every
 * connecting socket made by bt_zmq_socket_create() and client_create()
 * uses it unless told otherwise.
 */
#ifndef BT_COMMON_CURVE_H
#define BT_COMMON_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_CURVE_Z85_LEN 40 /* characters of a Z85 key */
#define BT_CURVE_KEY_BYTES 32

/* ZAP domains the router's sockets announce, so its handler knows which
 * allow list applies. */
#define BT_CURVE_DOMAIN_CLIENT "baton-client"
#define BT_CURVE_DOMAIN_CONTROL "baton-control"

/* A connecting side's keys. */
typedef struct {
    bool on;                              /* CURVE in use */
    char secret[BT_CURVE_Z85_LEN + 1];    /* own secret key, Z85 */
    char public_[BT_CURVE_Z85_LEN + 1];   /* own public key, Z85 */
    char server[BT_CURVE_Z85_LEN + 1];    /* the router's public key, Z85 */
} bt_curve_client_t;

/* Writes a new key pair: PREFIX.key (mode 0600, created exclusively, so
 * an existing key is never overwritten) and PREFIX.pub.  The public key
 * goes to *public_p when not NULL (41 bytes). */
bt_status_t bt_curve_keygen(const char *prefix, char *public_p);

/* Reads a secret key file; derives its public key.  BT_ERR_INVALID_ARG
 * with a message naming the file when it is missing, unreadable or not a
 * key.  Warns when the file is readable by others. */
bt_status_t bt_curve_load_secret(const char *path, char *secret_p,
                                 char *public_p);

/* Reads a public key file (40 Z85 characters). */
bt_status_t bt_curve_load_public(const char *path, char *public_p);

/* Loads a client identity from the two files; both NULL (or empty) leaves
 * CURVE off; one without the other is an error. */
bt_status_t bt_curve_client_load(const char *secret_file,
                                 const char *server_public_file,
                                 bt_curve_client_t *client_p);

/* Sets the process identity from the files, or from the environment for
 * a NULL argument (BATON_CURVE_SECRET_KEY, BATON_ROUTER_PUBLIC_KEY).
 * Call once at start-up, before threads; an error (a missing key file)
 * should stop the process.  Later calls replace it. */
bt_status_t bt_curve_identity_init(const char *secret_file,
                                   const char *server_public_file);

/* The process identity, initialised from the environment on first use
 * when bt_curve_identity_init() was not called.  Errors as there. */
bt_status_t bt_curve_identity(const bt_curve_client_t **client_p);

/* Makes `sock` (not yet connected) a CURVE client of `c` (no-op when
 * c->on is false). */
bt_status_t bt_curve_client_apply(void *sock, const bt_curve_client_t *c);

/* Makes `sock` (not yet bound) a CURVE server with secret key `secret`
 * (Z85) announcing ZAP domain `domain`. */
bt_status_t bt_curve_server_apply(void *sock, const char *secret,
                                  const char *domain);

// ---------------------------------------------------------------------------
// Allow lists

typedef struct bt_curve_allow_s bt_curve_allow_t;

/* Loads the public keys of a file or a directory of *.pub files.  An
 * unreadable path or a malformed key is an error naming it; an empty list
 * is allowed (it admits nobody). */
bt_status_t bt_curve_allow_load(const char *path, bt_curve_allow_t **allow_p);
void bt_curve_allow_destroy(bt_curve_allow_t **allow_p);

/* Whether the 32-byte key `key` is on the list. */
bool bt_curve_allow_has(const bt_curve_allow_t *allow, const uint8_t *key);
size_t bt_curve_allow_count(const bt_curve_allow_t *allow);

// ---------------------------------------------------------------------------
// Endpoints

/* Whether a bind endpoint only listens on this host: tcp:// on a
 * loopback address (127.0.0.0/8, ::1, localhost), ipc:// or inproc://. */
bool bt_endpoint_is_local(const char *endpoint);

#ifdef __cplusplus
}
#endif
#endif /* BT_COMMON_CURVE_H */
