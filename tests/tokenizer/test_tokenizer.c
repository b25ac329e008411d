/*
 * test_tokenizer.c - the llama2.c-format tokenizer against golden.jsonl,
 * round trips with the 32000 vocabulary, streaming detokenization, corrupt
 * files, and encoding speed.
 *
 * Run: build-tok/tests/tokenizer_test_tokenizer
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "tok_test_util.h"
#include "model/tokenizer.h"

#define AID_FILE BT_SHARED_DIR "/models/aidreams-tok512.bin"
#define L2_FILE BT_SHARED_DIR "/models/llama2-tokenizer.bin"

static const char FFFD[] = "\xef\xbf\xbd";

// ----------------------------------------------------------------------------
// helpers

/* Streams ids one by one (plus a flush) into a bt_malloc'ed string, checks
 * every chunk is strict UTF-8 and NUL-free, and returns the whole. */
static char *stream_all(const tok_t *tok, int prev_id, const int *ids, int n)
{
    size_t cap = 3 * ((size_t)tok_max_piece_len(tok) + 3) + 1;
    size_t total_cap = 16 + (size_t)n * cap, len = 0, got;
    char *all = bt_malloc(total_cap, "test");
    char *chunk = bt_malloc(BT_MAX(cap, 64), "test");
    tok_stream_t *st = NULL;

    BT_ASSERT_OK(tok_stream_create(tok, prev_id, &st));
    for (int i = 0; i <= n; i++) {
        if (i < n)
            BT_ASSERT_OK(tok_stream_push(st, ids[i], chunk, BT_MAX(cap, 64),
                                         &got));
        else
            BT_ASSERT_OK(tok_stream_flush(st, chunk, BT_MAX(cap, 64), &got));
        BT_ASSERT_EQ(strlen(chunk), got);
        if (!tt_utf8_valid(chunk, got))
            BT_TEST_FAIL("stream chunk %d is not valid UTF-8", i);
        memcpy(all + len, chunk, got);
        len += got;
    }
    all[len] = '\0';
    tok_stream_destroy(&st);
    BT_CHECK(st == NULL);
    bt_free(chunk);
    return all;
}

/* Independent model of decoding: run.c's per-id bytes, then invalid UTF-8
 * replaced by one U+FFFD per maximal invalid subpart, NUL dropped. */
static char *ref_decode(const tok_t *tok, int prev_id, const int *ids, int n)
{
    size_t cap = 16, len = 0, olen = 0;
    uint8_t *raw = malloc(cap);
    char *out;

    for (int i = 0; i < n; i++) {
        const char *p = tok_piece(tok, ids[i]);
        size_t pl = strlen(p);
        unsigned int byte;
        char tail;

        if (ids[i] == 1) { /* BOS prints nothing */
            prev_id = ids[i];
            continue;
        }
        if (prev_id == 1 && p[0] == ' ') {
            p++;
            pl--;
        }
        if (pl == 6 && sscanf(p, "<0x%2x%c", &byte, &tail) == 2 &&
            tail == '>' && strspn(p + 3, "0123456789abcdefABCDEF") == 2) {
            static uint8_t b;
            b = (uint8_t)byte;
            p = (const char *)&b;
            pl = 1;
        }
        if (len + pl > cap) {
            cap = 2 * (len + pl);
            raw = realloc(raw, cap);
        }
        memcpy(raw + len, p, pl);
        len += pl;
        prev_id = ids[i];
    }
    out = malloc(3 * len + 1);
    for (size_t i = 0; i < len;) {
        size_t cl = tt_utf8_char_len(raw + i, len - i);
        if (raw[i] == 0) {
            i++;
        } else if (cl > 0) {
            memcpy(out + olen, raw + i, cl);
            olen += cl;
            i += cl;
        } else {
            /* The maximal subpart: the lead byte plus the continuation
             * bytes that could still have completed a character. */
            size_t sub = 1;
            uint8_t lo = 0x80, hi = 0xBF;
            int need = 0;
            uint8_t b0 = raw[i];
            if (b0 >= 0xC2 && b0 <= 0xDF)
                need = 1;
            else if (b0 >= 0xE0 && b0 <= 0xEF)
                need = 2;
            else if (b0 >= 0xF0 && b0 <= 0xF4)
                need = 3;
            if (b0 == 0xE0)
                lo = 0xA0;
            if (b0 == 0xED)
                hi = 0x9F;
            if (b0 == 0xF0)
                lo = 0x90;
            if (b0 == 0xF4)
                hi = 0x8F;
            while (need > 0 && i + sub < len && raw[i + sub] >= lo &&
                   raw[i + sub] <= hi) {
                sub++;
                need--;
                lo = 0x80;
                hi = 0xBF;
            }
            memcpy(out + olen, FFFD, 3);
            olen += 3;
            i += sub;
        }
    }
    out[olen] = '\0';
    free(raw);
    return out;
}

static void check_decode_paths(const tok_t *tok, int prev_id, const int *ids,
                               int n)
{
    char *whole = NULL;
    char *streamed = stream_all(tok, prev_id, ids, n);
    char *ref = ref_decode(tok, prev_id, ids, n);

    BT_ASSERT_OK(tok_decode(tok, prev_id, ids, n, &whole));
    BT_CHECK(tt_utf8_valid(whole, strlen(whole)));
    BT_ASSERT_STREQ(whole, streamed);
    BT_ASSERT_STREQ(whole, ref);
    bt_free(whole);
    bt_free(streamed);
    free(ref);
}

// ----------------------------------------------------------------------------
// golden.jsonl

static int *json_ids(const cJSON *arr, int *n_p)
{
    int n = cJSON_GetArraySize(arr), i = 0;
    int *ids = malloc(((size_t)n + 1) * sizeof(int));
    const cJSON *it;

    cJSON_ArrayForEach(it, arr)
    {
        BT_CHECK(cJSON_IsNumber(it));
        ids[i++] = it->valueint;
    }
    *n_p = n;
    return ids;
}

static void test_golden(void)
{
    char *data = NULL;
    size_t len = 0;
    tok_t *tok = NULL;
    int lines = 0;
    char *line, *save = NULL;

    BT_ASSERT_OK(bt_read_file(BT_SHARED_DIR "/models/golden.jsonl", 1 << 24,
                              &data, &len));
    BT_ASSERT_OK(tok_load_llama2c(AID_FILE, 512, &tok));
    BT_ASSERT_EQ(tok_vocab_size(tok), 512);
    BT_ASSERT_EQ(tok_bos_id(tok), 1);
    BT_ASSERT_EQ(tok_eos_id(tok), 2);
    for (line = strtok_r(data, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *tk, *prompt, *text;
        int *pids, *gids, *all, *ids = NULL;
        int np, ng, n;
        char *dec = NULL, *dec_bos = NULL;
        size_t tl, dl;

        BT_CHECK(j != NULL);
        tk = cJSON_GetObjectItem(j, "tokenizer");
        if (!cJSON_IsString(tk) ||
            strcmp(tk->valuestring, "aidreams-tok512.bin") != 0) {
            cJSON_Delete(j);
            continue;
        }
        prompt = cJSON_GetObjectItem(j, "prompt");
        text = cJSON_GetObjectItem(j, "text");
        BT_CHECK(cJSON_IsString(prompt) && cJSON_IsString(text));
        pids = json_ids(cJSON_GetObjectItem(j, "prompt_ids"), &np);
        gids = json_ids(cJSON_GetObjectItem(j, "greedy_ids"), &ng);

        /* Encoding the prompt gives exactly prompt_ids. */
        BT_ASSERT_OK(tok_encode(tok, prompt->valuestring,
                                strlen(prompt->valuestring), true, &ids, &n));
        BT_ASSERT_EQ(n, np);
        for (int i = 0; i < n; i++)
            BT_ASSERT_EQ(ids[i], pids[i]);

        /* llama2.c printed prompt_ids[1:] then greedy_ids, each after its
         * predecessor, and a final "\n"; the text field is that output
         * with trailing whitespace stripped (one line ends in EOS, whose
         * piece "\n</s>\n" it prints). */
        all = malloc(((size_t)np + (size_t)ng) * sizeof(int));
        memcpy(all, pids, (size_t)np * sizeof(int));
        memcpy(all + np, gids, (size_t)ng * sizeof(int));
        BT_ASSERT_OK(tok_decode(tok, pids[0], all + 1, np + ng - 1, &dec));
        BT_ASSERT_OK(tok_decode(tok, -1, all, np + ng, &dec_bos));
        BT_ASSERT_STREQ(dec, dec_bos); /* BOS itself prints nothing */
        tl = strlen(text->valuestring);
        dl = strlen(dec);
        while (dl > 0 && (dec[dl - 1] == '\n' || dec[dl - 1] == ' '))
            dl--;
        BT_ASSERT_EQ(dl, tl);
        BT_CHECK(memcmp(dec, text->valuestring, tl) == 0);
        check_decode_paths(tok, pids[0], all + 1, np + ng - 1);

        bt_free(ids);
        bt_free(dec);
        bt_free(dec_bos);
        free(all);
        free(pids);
        free(gids);
        cJSON_Delete(j);
        lines++;
    }
    BT_ASSERT_EQ(lines, 5);
    printf("golden: %d aidreams lines: prompt_ids and text reproduced\n",
           lines);
    tok_destroy(&tok);
    bt_free(data);
}

// ----------------------------------------------------------------------------
// round trips and streaming with the 32000 vocabulary

static void roundtrip_one(const tok_t *tok, const char *text, size_t len)
{
    int *ids = NULL;
    int n = 0;
    char *dec = NULL;

    BT_ASSERT_OK(tok_encode(tok, text, len, true, &ids, &n));
    BT_ASSERT_EQ(ids[0], 1);
    for (int i = 0; i < n; i++)
        BT_CHECK(ids[i] >= 0 && ids[i] < tok_vocab_size(tok));
    /* The dummy-prefix space is dropped again after BOS. */
    BT_ASSERT_OK(tok_decode(tok, -1, ids, n, &dec));
    if (strlen(dec) != len || memcmp(dec, text, len) != 0)
        BT_TEST_FAIL("round trip of \"%s\" gave \"%s\"", text, dec);
    bt_free(dec);
    BT_ASSERT_OK(tok_decode(tok, 1, ids + 1, n - 1, &dec));
    BT_ASSERT_EQ(strlen(dec), len);
    bt_free(dec);
    check_decode_paths(tok, -1, ids, n);
    check_decode_paths(tok, 1, ids + 1, n - 1);
    bt_free(ids);
}

static void test_roundtrip(const tok_t *tok)
{
    static const char *const texts[] = {
        "Hello world",
        "Once upon a time, there was a little girl named Lily.",
        " leading space",
        "  two leading spaces and trailing  ",
        "tabs\tand\nnewlines\n\n",
        "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x9f \xc3\xb1",
        "\xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95 "
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xed\x95\x9c\xea\xb5\xad\xec"
        "\x96\xb4",
        "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd "
        "\xf0\x9f\x87\xba\xf0\x9f\x87\xb8",
        "\xf0\x90\x8d\x88 gothic, \xe2\x88\x91 math, \xe2\x82\xac money",
        "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xce\xba\xcf\x8c"
        "\xcf\x83\xce\xbc\xce\xb5",
        "<s> </s> <0x41> <unk>",
        "x",
        " ",
    };
    char buf[4096];
    int n_random = 400;

    for (size_t i = 0; i < TT_COUNT(texts); i++)
        roundtrip_one(tok, texts[i], strlen(texts[i]));
    for (int i = 0; i < n_random; i++) {
        size_t len = tt_random_text(buf, sizeof(buf), tt_rand() % 400, false);
        roundtrip_one(tok, buf, len);
    }
    printf("roundtrip: %zu fixed + %d random valid UTF-8 texts, 32000 "
           "vocab\n", TT_COUNT(texts), n_random);
}

/* Random id sequences, heavy in byte pieces that split characters. */
static void test_stream_random(const tok_t *tok)
{
    int ids[64];
    int n_seq = 3000;

    for (int s = 0; s < n_seq; s++) {
        int n = (int)(tt_rand() % 40);
        int prev = (int)(tt_rand() % 4) == 0 ? 1 : -1;
        for (int i = 0; i < n; i++) {
            uint32_t r = tt_rand() % 10;
            if (r < 5) /* bytes 0x80-0xFF: lead and continuation bytes */
                ids[i] = 3 + 0x80 + (int)(tt_rand() % 128);
            else if (r < 6)
                ids[i] = 3 + (int)(tt_rand() % 128);
            else if (r < 7)
                ids[i] = (int)(tt_rand() % 3);
            else
                ids[i] = (int)(tt_rand() % (uint32_t)tok_vocab_size(tok));
        }
        check_decode_paths(tok, prev, ids, n);
    }
    printf("stream: %d random id sequences: chunks valid UTF-8, stream == "
           "decode == reference\n", n_seq);
}

static void push_expect(tok_stream_t *st, int id, const char *want)
{
    char out[64];
    size_t len = 99;

    BT_ASSERT_OK(tok_stream_push(st, id, out, sizeof(out), &len));
    BT_ASSERT_EQ(len, strlen(want));
    BT_ASSERT_STREQ(out, want);
}

static void flush_expect(tok_stream_t *st, const char *want)
{
    char out[64];
    size_t len = 99;

    BT_ASSERT_OK(tok_stream_flush(st, out, sizeof(out), &len));
    BT_ASSERT_EQ(len, strlen(want));
    BT_ASSERT_STREQ(out, want);
}

#define B(_x) (3 + (_x)) /* byte-fallback id */

static void test_stream_cases(const tok_t *tok)
{
    tok_stream_t *st = NULL;
    int hello;
    char small[4];
    size_t len;

    hello = tok_piece(tok, 15043) != NULL ? 15043 : 300; /* " Hello" */
    BT_ASSERT_STREQ(tok_piece(tok, hello), " Hello");

    BT_ASSERT_OK(tok_stream_create(tok, 1, &st));
    push_expect(st, hello, "Hello");  /* after BOS: leading space dropped */
    push_expect(st, hello, " Hello"); /* not after BOS: kept */
    /* 中 = E4 B8 AD arrives byte by byte: held, then complete. */
    push_expect(st, B(0xE4), "");
    push_expect(st, B(0xB8), "");
    push_expect(st, B(0xAD), "\xe4\xb8\xad");
    /* A lone continuation byte is replaced at once. */
    push_expect(st, B(0x80), FFFD);
    /* A lead byte then a non-continuation: U+FFFD plus the piece, now. */
    push_expect(st, B(0xE4), "");
    push_expect(st, hello, "\xef\xbf\xbd Hello");
    /* Overlong and surrogate leads are invalid at their second byte. */
    push_expect(st, B(0xE0), "");
    push_expect(st, B(0x80), "\xef\xbf\xbd\xef\xbf\xbd");
    push_expect(st, B(0xED), "");
    push_expect(st, B(0xA0), "\xef\xbf\xbd\xef\xbf\xbd");
    push_expect(st, B(0xC0), FFFD);
    push_expect(st, B(0xFF), FFFD);
    /* 😀 F0 9F 98 80 split, broken by a new lead after three bytes. */
    push_expect(st, B(0xF0), "");
    push_expect(st, B(0x9F), "");
    push_expect(st, B(0x98), "");
    push_expect(st, B(0xC3), FFFD);
    push_expect(st, B(0xA9), "\xc3\xa9");
    /* NUL bytes vanish; BOS prints nothing and strips the next space. */
    push_expect(st, B(0x00), "");
    push_expect(st, 1, "");
    push_expect(st, hello, "Hello");
    /* Leftovers flush as one U+FFFD, then nothing. */
    push_expect(st, B(0xF0), "");
    push_expect(st, B(0x9F), "");
    flush_expect(st, FFFD);
    flush_expect(st, "");
    /* Bad ids and a too-small buffer are refused without state change. */
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    BT_ASSERT_EQ(tok_stream_push(st, -1, small, sizeof(small), &len),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(tok_stream_push(st, tok_vocab_size(tok), small,
                                 sizeof(small), &len), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(tok_stream_push(st, hello, small, sizeof(small), &len),
                 BT_ERR_INVALID_ARG);
    bt_log_set_level(BT_LOG_LEVEL_INFO);
    push_expect(st, hello, " Hello");
    tok_stream_destroy(&st);
    tok_stream_destroy(&st); /* NULL-safe */
    printf("stream: hand-written cases (holding, prompt U+FFFD, flush)\n");
}

// ----------------------------------------------------------------------------
// corrupt files

static int32_t get_i32(const char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void put_i32(uint8_t *p, int32_t v)
{
    memcpy(p, &v, 4);
}

static void expect_bad(const void *data, size_t len, int vocab_size,
                       const char *msg_part)
{
    tok_t *tok = NULL;
    bt_status_t status;

    bt_error_clear();
    status = tok_load_llama2c_mem(data, len, vocab_size, &tok);
    BT_ASSERT_EQ(status, BT_ERR_FORMAT);
    BT_CHECK(tok == NULL);
    if (msg_part != NULL && strstr(bt_error_last(), msg_part) == NULL)
        BT_TEST_FAIL("error \"%s\" lacks \"%s\"", bt_error_last(), msg_part);
}

static void test_bad_files(void)
{
    char *data = NULL, *big = NULL;
    uint8_t *copy;
    size_t len = 0, big_len = 0;
    tok_t *tok = NULL;
    int n_cases = 0;
    char want[128];

    BT_ASSERT_OK(bt_read_file(AID_FILE, 1 << 20, &data, &len));
    BT_ASSERT_OK(bt_read_file(L2_FILE, 1 << 24, &big, &big_len));
    copy = malloc(len + 16);
    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* expected errors, asserted */

    /* The intact files load; a missing file is an IO error. */
    BT_ASSERT_OK(tok_load_llama2c_mem(data, len, 512, &tok));
    tok_destroy(&tok);
    BT_ASSERT_EQ(tok_load_llama2c(BT_SHARED_DIR "/models/nope.bin", 512,
                                  &tok), BT_ERR_IO);

    /* Truncated at every byte. */
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(copy, data, cut);
        expect_bad(copy, cut, 512, "truncated at byte");
        n_cases++;
    }
    /* Piece 17 (<0x0E>) starts at 4 + 17 * 8 + 3 * 5 + 9 + 10 + 14 * 6. */
    {
        size_t off = 4;
        for (int i = 0; i < 17; i++)
            off += 8 + (size_t)get_i32(data + off + 4);
        snprintf(want, sizeof(want), "piece 17 truncated at byte %zu",
                 off + 8);
        expect_bad(data, off + 8 + 3, 512, want);
        snprintf(want, sizeof(want), "piece 17 truncated at byte %zu", off);
        expect_bad(data, off + 5, 512, want);
    }
    for (size_t cut = 0; cut < big_len; cut += 997) {
        expect_bad(big, cut, 32000, "truncated at byte");
        n_cases++;
    }
    /* Trailing garbage names the offset. */
    memcpy(copy, data, len);
    memcpy(copy + len, "junk", 4);
    snprintf(want, sizeof(want), "4 trailing bytes at byte offset %zu", len);
    expect_bad(copy, len + 4, 512, want);
    /* Wrong vocab sizes. */
    expect_bad(data, len, 511, "trailing bytes");
    expect_bad(data, len, 513, "piece 512 truncated");
    expect_bad(data, len, 32000, "truncated");
    expect_bad(big, big_len, 512, "trailing bytes");
    expect_bad(data, len, 100, "vocab_size 100 out of range");
    expect_bad(data, len, -5, "vocab_size -5 out of range");
    expect_bad(data, len, 0x7fffffff, "out of range");
    /* Header: zero, negative, huge max_token_length. */
    memcpy(copy, data, len);
    put_i32(copy, 0);
    expect_bad(copy, len, 512, "max_token_length 0 out of range");
    put_i32(copy, -1);
    expect_bad(copy, len, 512, "max_token_length -1 out of range");
    put_i32(copy, 0x7fffffff);
    expect_bad(copy, len, 512, "max_token_length 2147483647 out of range");
    put_i32(copy, 5); /* smaller than the real pieces */
    expect_bad(copy, len, 512, "exceeds max_token_length 5");
    /* Negative and huge lengths of piece 0. */
    memcpy(copy, data, len);
    put_i32(copy + 8, -7);
    expect_bad(copy, len, 512, "piece 0 has negative length -7 at byte 8");
    put_i32(copy + 8, (int32_t)0x80000000);
    expect_bad(copy, len, 512, "negative length");
    put_i32(copy + 8, 0x7fffffff);
    expect_bad(copy, len, 512, "piece 0 length 2147483647 exceeds");
    /* A byte-fallback piece that is not <0xXX>. */
    memcpy(copy, data, len);
    {
        size_t off = 4;
        for (int i = 0; i < 3 + 0x41; i++)
            off += 8 + (size_t)get_i32(data + off + 4);
        BT_CHECK(memcmp(copy + off + 8, "<0x41>", 6) == 0);
        copy[off + 8 + 4] = '2';
        expect_bad(copy, len, 512, "piece 68 at byte");
    }
    /* Random corruption never crashes (any status is fine). */
    for (int it = 0; it < 2000; it++) {
        memcpy(copy, data, len);
        for (int k = 0; k < 1 + (int)(tt_rand() % 4); k++)
            copy[tt_rand() % len] = (uint8_t)tt_rand();
        if (tok_load_llama2c_mem(copy, len, 512, &tok) == BT_OK) {
            int *ids = NULL, n = 0;
            char *dec = NULL;
            BT_ASSERT_OK(tok_encode(tok, "The river of probability", 24,
                                    true, &ids, &n));
            BT_ASSERT_OK(tok_decode(tok, -1, ids, n, &dec));
            bt_free(dec);
            bt_free(ids);
            tok_destroy(&tok);
        }
        n_cases++;
    }
    /* NULL arguments. */
    BT_ASSERT_EQ(tok_load_llama2c_mem(NULL, 10, 512, &tok),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(tok_load_llama2c_mem(data, len, 512, NULL),
                 BT_ERR_INVALID_ARG);
    bt_log_set_level(BT_LOG_LEVEL_INFO);
    printf("bad files: %d corrupt inputs refused or survived, messages "
           "checked\n", n_cases);
    free(copy);
    bt_free(data);
    bt_free(big);
}

// ----------------------------------------------------------------------------
// encode edge cases and speed

static void test_encode_edges(const tok_t *tok)
{
    int *ids = NULL;
    int n = -1;
    char nul_text[3] = {'a', '\0', 'b'};

    BT_ASSERT_OK(tok_encode(tok, "", 0, false, &ids, &n));
    BT_ASSERT_EQ(n, 0);
    bt_free(ids);
    BT_ASSERT_OK(tok_encode(tok, NULL, 0, true, &ids, &n));
    BT_ASSERT_EQ(n, 1);
    BT_ASSERT_EQ(ids[0], 1);
    bt_free(ids);
    /* Text is length-delimited: an inner NUL is byte piece <0x00>. */
    BT_ASSERT_OK(tok_encode(tok, nul_text, 3, false, &ids, &n));
    BT_CHECK(n >= 3);
    {
        bool has_nul = false;
        for (int i = 0; i < n; i++)
            has_nul |= ids[i] == 3;
        BT_CHECK(has_nul);
    }
    bt_free(ids);
    bt_log_set_level(BT_LOG_LEVEL_FATAL);
    BT_ASSERT_EQ(tok_encode(tok, NULL, 3, true, &ids, &n),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(tok_decode(tok, -1, &n, 1, NULL), BT_ERR_INVALID_ARG);
    {
        int bad = 32000;
        char *dec = NULL;
        BT_ASSERT_EQ(tok_decode(tok, -1, &bad, 1, &dec), BT_ERR_INVALID_ARG);
        BT_CHECK(dec == NULL);
    }
    bt_log_set_level(BT_LOG_LEVEL_INFO);
    BT_CHECK(tok_piece(tok, -1) == NULL);
    BT_CHECK(tok_piece(tok, 32000) == NULL);
    BT_ASSERT_STREQ(tok_piece(tok, 3 + 0x41), "<0x41>");
    BT_ASSERT_EQ(tok_max_piece_len(tok), 27);
}

static void test_speed(const tok_t *tok)
{
    size_t cap = 100 * 1024 + 1, len;
    char *text = malloc(cap);
    int *ids = NULL;
    int n = 0;
    char *dec = NULL;
    double t0, t_enc, t_dec;

    len = tt_random_text(text, cap, cap - 64, false);
    t0 = bt_time_s();
    BT_ASSERT_OK(tok_encode(tok, text, len, true, &ids, &n));
    t_enc = bt_time_s() - t0;
    t0 = bt_time_s();
    BT_ASSERT_OK(tok_decode(tok, -1, ids, n, &dec));
    t_dec = bt_time_s() - t0;
    BT_ASSERT_EQ(strlen(dec), len);
    BT_CHECK(memcmp(dec, text, len) == 0);
    printf("speed: encode %zu bytes -> %d ids in %.1f ms (%.1f MB/s), "
           "decode in %.1f ms, 32000 vocab\n", len, n, t_enc * 1e3,
           (double)len / t_enc / 1e6, t_dec * 1e3);
    BT_CHECK(t_enc < 2.0); /* typically ~50 ms; slack for sanitizers */
    bt_free(dec);
    bt_free(ids);

    /* Degenerate inputs: one long run of a merging character, and random
     * bytes (mostly byte fallback). */
    for (int kind = 0; kind < 3; kind++) {
        static const char *const names[] = {"spaces", "'a'", "random bytes"};
        len = 100 * 1024;
        for (size_t i = 0; i < len; i++)
            text[i] = kind == 0 ? ' ' : kind == 1 ? 'a'
                                                  : (char)(1 + tt_rand() % 255);
        t0 = bt_time_s();
        BT_ASSERT_OK(tok_encode(tok, text, len, true, &ids, &n));
        t_enc = bt_time_s() - t0;
        printf("speed: encode %zu bytes of %s -> %d ids in %.1f ms\n", len,
               names[kind], n, t_enc * 1e3);
        BT_CHECK(t_enc < 2.0);
        bt_free(ids);
    }
    free(text);
}

int main(void)
{
    tok_t *l2 = NULL;

    bt_log_init("test");
    test_golden();
    BT_ASSERT_OK(tok_load_llama2c(L2_FILE, 32000, &l2));
    test_encode_edges(l2);
    test_roundtrip(l2);
    test_stream_cases(l2);
    test_stream_random(l2);
    test_speed(l2);
    tok_destroy(&l2);
    tok_destroy(&l2); /* NULL-safe */
    test_bad_files();
    BT_ASSERT_EQ(bt_alloc_live_count(), 0);
    BT_TEST_PASS("tokenizer");
    return 0;
}
