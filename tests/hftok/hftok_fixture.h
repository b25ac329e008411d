/*
 * hftok_fixture.h - pieces of the hand-made tokenizer.json files that the
 * hftok tests build with cJSON: GPT-2's bytes_to_unicode written
 * independently of worker/model/tokenizer_json.c, an added-token entry,
 * the 256 byte tokens, and the Llama 3 pre-tokenizer (the Split regex,
 * then ByteLevel).  Header-only; each test includes it once.
 */
#ifndef BT_TESTS_HFTOK_HFTOK_FIXTURE_H
#define BT_TESTS_HFTOK_HFTOK_FIXTURE_H

#include <cJSON.h>
#include <stdbool.h>
#include <string.h>

#define SP "\xe2\x96\x81" /* ▁, sentencepiece's space */

static const char hf_llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
    "\\s+";

/* GPT-2 bytes_to_unicode: the character (UTF-8) standing for byte b. */
static inline void hf_mapped(int b, char out[4])
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) ||
                         (x >= 174 && x <= 255);
        int c = printable ? x : 256 + n++;
        if (x == b)
            cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

/* Maps a byte string to its byte-level token string (out: 2 x strlen(s)
 * + 1 bytes). */
static inline void hf_map_str(const char *s, char *out)
{
    out[0] = '\0';
    for (; *s; s++) {
        char m[4];
        hf_mapped((unsigned char)*s, m);
        strcat(out, m);
    }
}

/* An "added_tokens" entry. */
static inline cJSON *hf_added_tok(int id, const char *content, bool special,
                                  bool normalized)
{
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", normalized);
    cJSON_AddBoolToObject(a, "special", special);
    return a;
}

/* Ids 0..255: the byte tokens, in mapped form. */
static inline void hf_add_byte_vocab(cJSON *vocab)
{
    for (int x = 0; x < 256; x++) {
        char m[4];
        hf_mapped(x, m);
        cJSON_AddNumberToObject(vocab, m, x);
    }
}

/* root's "pre_tokenizer": Sequence [Split (the Llama 3 regex, isolated),
 * ByteLevel (no prefix space, no regex of its own)]. */
static inline void hf_add_llama3_pre(cJSON *root)
{
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON *pres, *p;

    cJSON_AddStringToObject(pre, "type", "Sequence");
    pres = cJSON_AddArrayToObject(pre, "pretokenizers");
    p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(p, "pattern"), "Regex",
                            hf_llama3_regex);
    cJSON_AddStringToObject(p, "behavior", "Isolated");
    cJSON_AddBoolToObject(p, "invert", 0);
    cJSON_AddItemToArray(pres, p);
    p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "ByteLevel");
    cJSON_AddBoolToObject(p, "add_prefix_space", 0);
    cJSON_AddBoolToObject(p, "trim_offsets", 1);
    cJSON_AddBoolToObject(p, "use_regex", 0);
    cJSON_AddItemToArray(pres, p);
}

#endif /* BT_TESTS_HFTOK_HFTOK_FIXTURE_H */
