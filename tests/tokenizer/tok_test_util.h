/*
 * tok_test_util.h - shared helpers of the tokenizer tests: a seeded RNG, a
 * generator of mixed text (words that merge a lot, multi-byte characters,
 * invalid UTF-8) and a strict UTF-8 checker written independently of
 * worker/model/tokenizer.c.  Header-only; each test includes it once.
 */
#ifndef BT_TESTS_TOKENIZER_TOK_TEST_UTIL_H
#define BT_TESTS_TOKENIZER_TOK_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint64_t tt_rng = 0x2545f4914f6cdd1dull;

static inline uint32_t tt_rand(void)
{
    tt_rng ^= tt_rng >> 12;
    tt_rng ^= tt_rng << 25;
    tt_rng ^= tt_rng >> 27;
    return (uint32_t)((tt_rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* Fragments that merge a lot with both vocabularies. */
static const char *const tt_words[] = {
    "the", "river", " whispers", "probability", " unfold", "0.0000000",
    "Classification", " tapestry", " of", " a", " I", ",", ".", "\n", "\t",
    "ing", "in", "es", "er", " ", "  ", "   ", "Once upon a time", " there",
    " was", " little", " girl", "Lily", "!", "?", "\"", "'s", "123",
    "Contrast", " boundaries", " blur", "Neurons", " flutter", "Echoes",
    "http://x.y/z?q=1", "<s>", "</s>", "<0x41>", "\n\n", "eses", "ininin",
};
/* Valid multi-byte characters and strings. */
static const char *const tt_multi[] = {
    "\xc3\xa9",                 /* é */
    "\xc3\xbc",                 /* ü */
    "\xc3\xb1",                 /* ñ */
    "\xc3\x9f",                 /* ß */
    "\xe4\xb8\xad\xe6\x96\x87", /* 中文 */
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", /* 日本語 */
    "\xea\xb0\x80",             /* 가 */
    "\xe2\x82\xac",             /* € */
    "\xe2\x88\x91",             /* ∑ */
    "\xf0\x9f\x98\x80",         /* 😀 */
    "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", /* 👍🏽 */
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", /* Привет */
    "\xf0\x90\x8d\x88",         /* 𐍈 (rare: byte fallback) */
    "\xe1\xbf\xbc",             /* ῼ */
};
/* Invalid UTF-8 fragments. */
static const char *const tt_invalid[] = {
    "\x80", "\xbf", "\xc3", "\xe2\x82", "\xf0\x9f", "\xf0\x9f\x98", "\xff",
    "\xfe", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe0\x80\x80",
    "\x80\x80\x80\x80\x80\x80", "a\x80\x80\x80\x80",
};

#define TT_COUNT(_a) (sizeof(_a) / sizeof((_a)[0]))

/* Fills buf (capacity cap > 0) with a random NUL-free mix of about
 * `target` bytes; `invalid` allows invalid UTF-8.  Returns the length. */
static inline size_t tt_random_text(char *buf, size_t cap, size_t target,
                             bool invalid)
{
    size_t n = 0;

    while (n < target) {
        uint32_t r = tt_rand() % 100;
        const char *frag;
        char one[2];
        size_t fl;

        if (r < 60) {
            frag = tt_words[tt_rand() % TT_COUNT(tt_words)];
        } else if (r < 80) {
            frag = tt_multi[tt_rand() % TT_COUNT(tt_multi)];
        } else if (r < 90 || !invalid) {
            one[0] = (char)(32 + tt_rand() % 95); /* printable ASCII */
            one[1] = '\0';
            frag = one;
        } else if (r < 96) {
            frag = tt_invalid[tt_rand() % TT_COUNT(tt_invalid)];
        } else {
            one[0] = (char)(1 + tt_rand() % 255);
            one[1] = '\0';
            frag = one;
        }
        fl = strlen(frag);
        if (n + fl + 1 > cap)
            break;
        memcpy(buf + n, frag, fl);
        n += fl;
    }
    buf[n] = '\0';
    return n;
}

/* Length of the valid character at s (n bytes left), 0 when invalid. */
static inline size_t tt_utf8_char_len(const uint8_t *s, size_t n)
{
    uint32_t cp;
    size_t len;

    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xE0) == 0xC0) {
        len = 2;
        cp = s[0] & 0x1F;
    } else if ((s[0] & 0xF0) == 0xE0) {
        len = 3;
        cp = s[0] & 0x0F;
    } else if ((s[0] & 0xF8) == 0xF0) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* True when s[0..n) is strict UTF-8 without NUL bytes. */
static inline bool tt_utf8_valid(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;

    while (i < n) {
        size_t l = tt_utf8_char_len(u + i, n - i);
        if (l == 0 || u[i] == 0)
            return false;
        i += l;
    }
    return true;
}

#endif /* BT_TESTS_TOKENIZER_TOK_TEST_UTIL_H */
