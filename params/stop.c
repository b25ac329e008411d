/*
 * stop.c - stop ids, stop strings and max tokens, with hold-back of text
 * that could still become a stop string.
 */
#include "stop.h"

#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_util.h"

struct stop_s {
    int ids[STOP_MAX_IDS];
    int n_ids;
    char *strings[STOP_MAX_STRINGS];
    int n_strings;
    int max_tokens;
    int n_tokens;            /* tokens fed so far */
    char held[2 * STOP_MAX_STRING_LEN + 1024]; /* text not yet shown */
    size_t n_held;
};

void stop_config_init(stop_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_tokens = 256;
}

bt_status_t stop_create(const stop_config_t *cfg, stop_t **stop_p)
{
    stop_t *stop;

    if (cfg->max_tokens <= 0)
        return BT_ERROR(BT_ERR_INVALID_ARG, "STOP",
                        "max_tokens %d must be positive", cfg->max_tokens);
    if (cfg->n_ids < 0 || cfg->n_ids > STOP_MAX_IDS ||
        cfg->n_strings < 0 || cfg->n_strings > STOP_MAX_STRINGS)
        return BT_ERROR(BT_ERR_INVALID_ARG, "STOP",
                        "at most %d stop ids and %d stop strings",
                        STOP_MAX_IDS, STOP_MAX_STRINGS);
    for (int i = 0; i < cfg->n_strings; i++) {
        size_t len = cfg->strings[i] ? strlen(cfg->strings[i]) : 0;
        if (len == 0 || len > STOP_MAX_STRING_LEN)
            return BT_ERROR(BT_ERR_INVALID_ARG, "STOP",
                            "stop string %d must have 1..%d bytes", i,
                            STOP_MAX_STRING_LEN);
    }
    stop = bt_calloc(1, sizeof(*stop), "stop");
    if (stop == NULL)
        return BT_ERR_NO_MEMORY;
    memcpy(stop->ids, cfg->ids, sizeof(int) * (size_t)cfg->n_ids);
    stop->n_ids = cfg->n_ids;
    stop->max_tokens = cfg->max_tokens;
    for (int i = 0; i < cfg->n_strings; i++) {
        stop->strings[i] = bt_strdup(cfg->strings[i], "stop_string");
        if (stop->strings[i] == NULL) {
            stop_destroy(&stop);
            return BT_ERR_NO_MEMORY;
        }
        stop->n_strings++;
    }
    *stop_p = stop;
    return BT_OK;
}

void stop_destroy(stop_t **stop_p)
{
    stop_t *stop = *stop_p;

    if (stop == NULL)
        return;
    for (int i = 0; i < stop->n_strings; i++)
        bt_free(stop->strings[i]);
    bt_free(stop);
    *stop_p = NULL;
}

/* Copies n bytes to out (bounded by cap) and NUL-terminates. */
static void stop_emit(const char *src, size_t n, char *out, size_t cap,
                      size_t *out_len)
{
    size_t room = cap > *out_len + 1 ? cap - *out_len - 1 : 0;

    n = BT_MIN(n, room);
    memcpy(out + *out_len, src, n);
    *out_len += n;
    if (cap > 0)
        out[*out_len] = '\0';
}

/* Length of the longest suffix of held that is a proper prefix of some
 * stop string: those bytes must wait. */
static size_t stop_partial_tail(const stop_t *stop)
{
    size_t best = 0;

    for (int s = 0; s < stop->n_strings; s++) {
        size_t slen = strlen(stop->strings[s]);
        size_t max = BT_MIN(slen - 1, stop->n_held);
        for (size_t k = max; k > best; k--) {
            if (memcmp(stop->held + stop->n_held - k, stop->strings[s], k) ==
                0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

stop_reason_t stop_feed(stop_t *stop, int token, const char *text,
                        size_t len, char *out, size_t cap, size_t *out_len)
{
    size_t keep;

    *out_len = 0;
    if (cap > 0)
        out[0] = '\0';
    stop->n_tokens++;
    for (int i = 0; i < stop->n_ids; i++) {
        if (token == stop->ids[i]) {
            stop_emit(stop->held, stop->n_held, out, cap, out_len);
            stop->n_held = 0;
            return STOP_EOS;
        }
    }
    if (stop->n_strings == 0) {
        stop_emit(text, len, out, cap, out_len);
    } else {
        /* Feed in pieces that fit the hold buffer. */
        while (len > 0) {
            size_t room = sizeof(stop->held) - stop->n_held;
            size_t take = BT_MIN(len, room);
            char *hit = NULL;
            size_t hit_len = 0;

            memcpy(stop->held + stop->n_held, text, take);
            stop->n_held += take;
            text += take;
            len -= take;
            for (int s = 0; s < stop->n_strings; s++) {
                char *m = memmem(stop->held, stop->n_held, stop->strings[s],
                                 strlen(stop->strings[s]));
                if (m != NULL && (hit == NULL || m < hit)) {
                    hit = m;
                    hit_len = strlen(stop->strings[s]);
                }
            }
            if (hit != NULL) {
                (void)hit_len;
                stop_emit(stop->held, (size_t)(hit - stop->held), out, cap,
                          out_len);
                stop->n_held = 0;
                return STOP_STRING;
            }
            keep = stop_partial_tail(stop);
            stop_emit(stop->held, stop->n_held - keep, out, cap, out_len);
            memmove(stop->held, stop->held + stop->n_held - keep, keep);
            stop->n_held = keep;
        }
    }
    if (stop->n_tokens >= stop->max_tokens) {
        stop_emit(stop->held, stop->n_held, out, cap, out_len);
        stop->n_held = 0;
        return STOP_LENGTH;
    }
    return STOP_NONE;
}

void stop_flush(stop_t *stop, char *out, size_t cap, size_t *out_len)
{
    *out_len = 0;
    if (cap > 0)
        out[0] = '\0';
    stop_emit(stop->held, stop->n_held, out, cap, out_len);
    stop->n_held = 0;
}

const char *stop_held(const stop_t *stop, size_t *len_p)
{
    *len_p = stop->n_held;
    return stop->held;
}

bt_status_t stop_prime(stop_t *stop, const char *text, size_t len)
{
    if (len >= STOP_MAX_STRING_LEN)
        return BT_ERROR(BT_ERR_INVALID_ARG, "STOP",
                        "held-back text of %zu bytes (at most %d)", len,
                        STOP_MAX_STRING_LEN - 1);
    if (len > 0)
        memcpy(stop->held, text, len);
    stop->n_held = len;
    return BT_OK;
}

const char *stop_reason_str(stop_reason_t reason)
{
    switch (reason) {
    case STOP_EOS:
    case STOP_STRING:
        return "stop";
    case STOP_LENGTH:
        return "length";
    default:
        return "none";
    }
}
