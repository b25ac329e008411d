/*
 * gateway_auth.c - baton-http's API keys and tenants (issue 42): the key
 * file, the constant-time Bearer check, and each tenant's concurrency
 * and token-rate limits, decided here before the router sees a request.
 *
 * Key file (docs/SECURITY.md): one key per line,
 *
 *     KEY TENANT [priority=N] [weight=N] [max_concurrency=N]
 *                [tokens_per_min=N] [cache_salt=S] [precision=P]
 *
 * '#' starts a comment; blank lines are skipped.  KEY is 16..255
 * printable ASCII characters without spaces; TENANT is 1..64 of
 * [A-Za-z0-9._-].  Several keys may name one tenant: they share its
 * limits and state, and options repeated on its lines must agree.
 *
 * Keys are credentials: no message here or in the callers prints one
 * (errors name the line number).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <strings.h>
#include <string.h>
#include <sys/stat.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_util.h"
#include "gateway_int.h"
#include "proto_msg.h"

#define AUTH_MAX_FILE (16u << 20)
#define AUTH_MAX_WEIGHT 1000

typedef struct {
    uint8_t key[GATEWAY_AUTH_MAX_KEY]; /* zero-padded */
    size_t len;
    int tenant;                        /* index in tenants */
} auth_key_t;

struct gateway_auth_s {
    auth_key_t *keys;          /* (n_keys) */
    int n_keys;
    gateway_tenant_t *tenants; /* (n_tenants) */
    int n_tenants;
};

// ---------------------------------------------------------------------------
// Loading

/* Set by the option parser per tenant line: which options were given. */
typedef struct {
    bool priority, weight, max_concurrency, tokens_per_min, cache_salt;
    bool precision;
} auth_given_t;

static bool tenant_name_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' &&
            s[i] != '-')
            return false;
    return true;
}

static bool key_ok(const char *s)
{
    size_t n = strlen(s);

    if (n < GATEWAY_AUTH_MIN_KEY || n >= GATEWAY_AUTH_MAX_KEY)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            return false;
    return true;
}

static gateway_tenant_t *tenant_get(gateway_auth_t *a, const char *name,
                                    int *idx_p)
{
    for (int i = 0; i < a->n_tenants; i++)
        if (strcmp(a->tenants[i].name, name) == 0) {
            *idx_p = i;
            return &a->tenants[i];
        }
    return NULL;
}

/* Applies "name=value" to tenant t (fresh: `fresh`, else it must agree
 * with what an earlier line set).  Returns an error text or NULL. */
static const char *apply_option(gateway_tenant_t *t, auth_given_t *given,
                                const char *opt)
{
    const char *eq = strchr(opt, '=');
    const char *v;
    int64_t n;
    size_t name_len;

    if (eq == NULL)
        return "an option is not name=value";
    name_len = (size_t)(eq - opt);
    v = eq + 1;
#define OPT_IS(_s) (name_len == sizeof(_s) - 1 && memcmp(opt, _s, name_len) == 0)
    if (OPT_IS("precision")) {
        /* the default precision class of the tenant's requests (a body's
         * own "precision" wins; issue 42 item 5) */
        const char *cls = proto_precision_find(v);

        if (cls == NULL)
            return "precision must be one of " PROTO_PRECISIONS;
        if (given->precision && t->precision != cls)
            return "precision differs from an earlier line of the tenant";
        t->precision = cls;
        given->precision = true;
        return NULL;
    }
    if (OPT_IS("cache_salt")) {
        if (strlen(v) == 0 || strlen(v) > 64)
            return "cache_salt must be 1..64 bytes";
        if (given->cache_salt && strcmp(t->cache_salt, v) != 0)
            return "cache_salt differs from an earlier line of the tenant";
        snprintf(t->cache_salt, sizeof(t->cache_salt), "%s", v);
        given->cache_salt = true;
        return NULL;
    }
    if (bt_parse_i64(v, &n) != BT_OK)
        return "an option value is not an integer";
    bt_error_clear();
    if (OPT_IS("priority")) {
        if (n < -1000000 || n > 1000000)
            return "priority out of range";
        if (given->priority && t->priority != (int)n)
            return "priority differs from an earlier line of the tenant";
        t->priority = (int)n;
        given->priority = true;
    } else if (OPT_IS("weight")) {
        if (n < 1 || n > AUTH_MAX_WEIGHT)
            return "weight must be 1..1000";
        if (given->weight && t->weight != (uint32_t)n)
            return "weight differs from an earlier line of the tenant";
        t->weight = (uint32_t)n;
        given->weight = true;
    } else if (OPT_IS("max_concurrency")) {
        if (n < 0 || n > 1000000)
            return "max_concurrency out of range";
        if (given->max_concurrency && t->max_concurrency != (int)n)
            return "max_concurrency differs from an earlier line of the "
                   "tenant";
        t->max_concurrency = (int)n;
        given->max_concurrency = true;
    } else if (OPT_IS("tokens_per_min")) {
        if (n < 0 || n > (int64_t)1 << 40)
            return "tokens_per_min out of range";
        if (given->tokens_per_min && t->tokens_per_min != (uint64_t)n)
            return "tokens_per_min differs from an earlier line of the "
                   "tenant";
        t->tokens_per_min = (uint64_t)n;
        given->tokens_per_min = true;
    } else {
        return "unknown option (priority, weight, max_concurrency, "
               "tokens_per_min, cache_salt, precision)";
    }
#undef OPT_IS
    return NULL;
}

bt_status_t gateway__auth_load(const char *path, gateway_auth_t **auth_p)
{
    gateway_auth_t *a;
    auth_given_t *given = NULL;
    char *data = NULL, *line, *save = NULL;
    size_t len;
    int lineno = 0, n_lines = 1;
    bt_status_t status;
    struct stat st;

    status = bt_read_file(path, AUTH_MAX_FILE, &data, &len);
    if (status != BT_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", bt_error_last());
        bt_error_clear();
        return BT_ERROR(BT_ERR_IO, "HTTP", "cannot read the API key file "
                        "'%s' (%s)", path, why);
    }
    if (stat(path, &st) == 0 && (st.st_mode & 0077) != 0)
        BT_LOG_WARN("HTTP", "API key file '%s' is readable by group or "
                    "others (mode %03o): chmod 600 it", path,
                    (unsigned)(st.st_mode & 0777));
    for (size_t i = 0; i < len; i++)
        n_lines += data[i] == '\n';
    a = bt_calloc(1, sizeof(*a), "gateway_auth");
    if (a != NULL) {
        a->keys = bt_calloc((size_t)n_lines, sizeof(*a->keys), "gateway_auth");
        a->tenants = bt_calloc((size_t)n_lines, sizeof(*a->tenants),
                               "gateway_auth");
        given = bt_calloc((size_t)n_lines, sizeof(*given), "gateway_auth");
    }
    if (a == NULL || a->keys == NULL || a->tenants == NULL || given == NULL) {
        status = BT_ERR_NO_MEMORY;
        goto err_free;
    }
    /* strtok_r skips empty lines; count them by hand for the messages */
    for (line = data; line != NULL;) {
        char *nl = strchr(line, '\n');
        char *tok, *key, *name, *hash;
        gateway_tenant_t *t;
        int idx;
        const char *why;

        if (nl != NULL)
            *nl = '\0';
        lineno++;
        hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        key = strtok_r(line, " \t\r", &save);
        if (key == NULL)
            goto next;
        name = strtok_r(NULL, " \t\r", &save);
        if (!key_ok(key)) {
            status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "API key file "
                              "'%s' line %d: a key must be %d..%d printable "
                              "characters without spaces", path, lineno,
                              GATEWAY_AUTH_MIN_KEY, GATEWAY_AUTH_MAX_KEY - 1);
            goto err_free;
        }
        if (name == NULL || !tenant_name_ok(name)) {
            status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "API key file "
                              "'%s' line %d: the key needs a tenant name "
                              "(1..64 of A-Z a-z 0-9 . _ -)", path, lineno);
            goto err_free;
        }
        for (int i = 0; i < a->n_keys; i++) {
            if (a->keys[i].len == strlen(key) &&
                memcmp(a->keys[i].key, key, a->keys[i].len) == 0) {
                status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "API key file "
                                  "'%s' line %d: the key is listed twice",
                                  path, lineno);
                goto err_free;
            }
        }
        t = tenant_get(a, name, &idx);
        if (t == NULL) {
            idx = a->n_tenants++;
            t = &a->tenants[idx];
            snprintf(t->name, sizeof(t->name), "%s", name);
            snprintf(t->cache_salt, sizeof(t->cache_salt), "%s", name);
            t->weight = 1;
        }
        while ((tok = strtok_r(NULL, " \t\r", &save)) != NULL) {
            why = apply_option(t, &given[idx], tok);
            if (why != NULL) {
                status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "API key file "
                                  "'%s' line %d: %s", path, lineno, why);
                goto err_free;
            }
        }
        memcpy(a->keys[a->n_keys].key, key, strlen(key));
        a->keys[a->n_keys].len = strlen(key);
        a->keys[a->n_keys].tenant = idx;
        a->n_keys++;
        /* the key's bytes in the file buffer are wiped below */
    next:
        line = nl != NULL ? nl + 1 : NULL;
    }
    if (a->n_keys == 0) {
        status = BT_ERROR(BT_ERR_INVALID_ARG, "HTTP", "API key file '%s' "
                          "holds no key", path);
        goto err_free;
    }
    for (int i = 0; i < a->n_tenants; i++)
        a->tenants[i].bucket = (double)a->tenants[i].tokens_per_min;
    memset(data, 0, len);
    bt_free(data);
    bt_free(given);
    *auth_p = a;
    return BT_OK;

err_free:
    memset(data, 0, len);
    bt_free(data);
    bt_free(given);
    gateway__auth_destroy(&a);
    return status;
}

void gateway__auth_destroy(gateway_auth_t **auth_p)
{
    gateway_auth_t *a = *auth_p;

    if (a == NULL)
        return;
    if (a->keys != NULL)
        memset(a->keys, 0, sizeof(*a->keys) * (size_t)a->n_keys);
    bt_free(a->keys);
    bt_free(a->tenants);
    bt_free(a);
    *auth_p = NULL;
}

int gateway__auth_n_keys(const gateway_auth_t *auth)
{
    return auth != NULL ? auth->n_keys : 0;
}

int gateway__auth_n_tenants(const gateway_auth_t *auth)
{
    return auth != NULL ? auth->n_tenants : 0;
}

// ---------------------------------------------------------------------------
// Checking

gateway_tenant_t *gateway__auth_check(gateway_auth_t *auth,
                                      const char *value, size_t len)
{
    uint8_t presented[GATEWAY_AUTH_MAX_KEY];
    size_t n;
    int found = -1;

    /* "Bearer" (any case, RFC 9110 11.1) then one or more spaces */
    if (value == NULL || len < 7 || strncasecmp(value, "Bearer ", 7) != 0)
        return NULL;
    value += 7;
    len -= 7;
    while (len > 0 && *value == ' ') {
        value++;
        len--;
    }
    if (len == 0 || len >= GATEWAY_AUTH_MAX_KEY)
        return NULL; /* the length is no secret: the key's is not told */
    memset(presented, 0, sizeof(presented));
    memcpy(presented, value, len);
    n = len;
    /* Every key, every byte of the padded buffers, no early exit: the
     * time depends on the number of keys only. */
    for (int i = 0; i < auth->n_keys; i++) {
        const auth_key_t *k = &auth->keys[i];
        bool eq = bt_ct_equal(presented, k->key, sizeof(presented)) &
                  (k->len == n);
        int mask = -(int)eq;
        found = (found & ~mask) | (i & mask);
    }
    memset(presented, 0, sizeof(presented));
    return found >= 0 ? &auth->tenants[auth->keys[found].tenant] : NULL;
}

// ---------------------------------------------------------------------------
// Limits

static void bucket_refill(gateway_tenant_t *t, uint64_t now)
{
    double cap = (double)t->tokens_per_min;

    if (t->t_bucket != 0 && now > t->t_bucket)
        t->bucket = fmin(cap, t->bucket + cap / 60.0 *
                                 (double)(now - t->t_bucket) * 1e-9);
    t->t_bucket = now;
}

bt_status_t gateway__tenant_admit(gateway_tenant_t *t, uint64_t now,
                                  uint64_t tokens, int n_requests,
                                  uint32_t *retry_ms, const char **why)
{
    if (t->max_concurrency > 0 && n_requests > t->max_concurrency) {
        *retry_ms = 0;
        *why = "the request has more choices (prompts times n) than this "
               "API key's tenant may run at once (max_concurrency)";
        t->limited++;
        return BT_ERR_INVALID_ARG;
    }
    if (t->max_concurrency > 0 &&
        t->in_flight + n_requests > t->max_concurrency) {
        *retry_ms = 1000;
        *why = "too many concurrent requests for this API key's tenant";
        t->limited++;
        return BT_ERR_NO_RESOURCE;
    }
    if (t->tokens_per_min > 0) {
        bucket_refill(t, now);
        /* A request starts while the bucket holds anything; it may take
         * the bucket below zero (its tokens are only estimated), and the
         * next waits until the rate has paid the overdraft back. */
        if (t->bucket <= 0) {
            double secs = (1.0 - t->bucket) /
                          ((double)t->tokens_per_min / 60.0);
            *retry_ms = (uint32_t)fmin(ceil(secs * 1000.0), 3600e3);
            *why = "token rate limit of this API key's tenant exceeded";
            t->limited++;
            return BT_ERR_NO_RESOURCE;
        }
        t->bucket -= (double)tokens;
    }
    t->in_flight += n_requests;
    return BT_OK;
}

void gateway__tenant_release(gateway_tenant_t *t, uint64_t charged,
                             uint64_t used, int n_requests)
{
    t->in_flight = BT_MAX(t->in_flight - n_requests, 0);
    if (t->tokens_per_min > 0)
        t->bucket = fmin((double)t->tokens_per_min,
                         t->bucket + (double)charged - (double)used);
}
