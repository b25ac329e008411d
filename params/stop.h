/*
 * stop.h - when a generation ends, and which text is safe to stream.
 *
 * A stop checker watches each generated token and its text.  It ends the
 * request on a stop token id (the token itself is not emitted), on a stop
 * string (text up to the match is emitted, the match is not), or after
 * max_tokens.  Text that might be the start of a stop string is held back
 * until it is known not to be, so a client never sees half of a stop
 * string that later matched.
 *
 * It lives with the parameter contract (params/), below the engine: it
 * needs strings, not the tokenizer, and the router runs it on the
 * prefill-sampled first token.  It keeps the stop_ prefix it had in
 * worker/ (docs/ARCHITECTURE.md, module prefixes).
 */
#ifndef BT_PARAMS_STOP_H
#define BT_PARAMS_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "bt_status.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The contract's limits (params.h). */
#define STOP_MAX_IDS PARAMS_MAX_STOP_IDS
#define STOP_MAX_STRINGS PARAMS_MAX_STOP_STRINGS
#define STOP_MAX_STRING_LEN PARAMS_MAX_STOP_LEN

typedef enum {
    STOP_NONE = 0,   /* keep generating */
    STOP_EOS,        /* a stop token id was generated */
    STOP_STRING,     /* a stop string matched */
    STOP_LENGTH      /* max_tokens reached (or the context is full) */
} stop_reason_t;

typedef struct {
    int ids[STOP_MAX_IDS]; /* stop token ids */
    int n_ids;
    const char *strings[STOP_MAX_STRINGS]; /* not owned; copied at create */
    int n_strings;
    int max_tokens; /* > 0 */
} stop_config_t;

void stop_config_init(stop_config_t *cfg);

typedef struct stop_s stop_t;

/* Validates (non-empty strings no longer than STOP_MAX_STRING_LEN,
 * max_tokens > 0) and copies the config. */
bt_status_t stop_create(const stop_config_t *cfg, stop_t **stop_p);
void stop_destroy(stop_t **stop_p);

/* Feeds one generated token id and its decoded text.  Appends the text
 * that may be shown now to `out` (capacity cap, NUL-terminated; text is
 * never longer than what was fed plus the held-back tail) and returns the
 * reason to stop, STOP_NONE to continue. */
stop_reason_t stop_feed(stop_t *stop, int token, const char *text,
                        size_t len, char *out, size_t cap, size_t *out_len);

/* At the end (any reason but STOP_STRING), the held-back text. */
void stop_flush(stop_t *stop, char *out, size_t cap, size_t *out_len);

/* The text held back now (a possible start of a stop string; fewer than
 * STOP_MAX_STRING_LEN bytes after a feed that returned STOP_NONE), not
 * NUL-terminated; valid until the next call on `stop`.  It is the
 * matcher's whole text state: a matcher in another process primed with
 * it (stop_prime) continues exactly where this one is, which is how the
 * router hands the prefill-sampled first token's state to the decode
 * worker and a failed decode worker's state to its successor. */
const char *stop_held(const stop_t *stop, size_t *len_p);

/* Replaces the held-back text with text[0..len) as if earlier feeds had
 * held it (nothing is emitted, no token is counted).  BT_ERR_INVALID_ARG
 * when len >= STOP_MAX_STRING_LEN (no feed holds that much). */
bt_status_t stop_prime(stop_t *stop, const char *text, size_t len);

/* Name for finish reasons: "stop" (EOS and strings), "length". */
const char *stop_reason_str(stop_reason_t reason);

#ifdef __cplusplus
}
#endif
#endif /* BT_PARAMS_STOP_H */
