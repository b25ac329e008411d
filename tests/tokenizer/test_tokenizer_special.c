/*
 * test_tokenizer_special.c - special tokens are not text unless asked
 * (issue 39), for llama2.c tokenizers: a stream with
 * tok_stream_set_skip_special prints nothing for BOS, EOS ("\n</s>\n") and
 * <unk>, and everything else as before (a piece after BOS loses its
 * leading space, as in run.c); without the switch
 * (and in tok_decode) every piece prints, as llama2.c's run.c does.
 */
#include <string.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "model/tokenizer.h"

/* The text of ids streamed after prev_id, bt_malloc'ed. */
static char *stream_text(const tok_t *tok, int prev_id, const int *ids,
                         int n, bool skip)
{
    char chunk[256], *text = bt_calloc(1, (size_t)n * 256 + 8, "test");
    tok_stream_t *st = NULL;
    size_t got, len = 0;

    BT_ASSERT_OK(tok_stream_create(tok, prev_id, &st));
    tok_stream_set_skip_special(st, skip);
    for (int i = 0; i <= n; i++) {
        if (i < n)
            BT_ASSERT_OK(tok_stream_push(st, ids[i], chunk, sizeof(chunk),
                                         &got));
        else
            BT_ASSERT_OK(tok_stream_flush(st, chunk, sizeof(chunk), &got));
        BT_ASSERT_EQ(strlen(chunk), got);
        memcpy(text + len, chunk, got);
        len += got;
    }
    tok_stream_destroy(&st);
    return text;
}

int main(void)
{
    tok_t *tok = NULL;
    int *ids = NULL, n = 0, *with = NULL;
    char *a, *b, *dec;

    bt_log_init("test");
    BT_ASSERT_OK(tok_load(BT_SHARED_DIR "/models/aidreams-tok512.bin", 512,
                          &tok));
    BT_ASSERT_EQ(tok_bos_id(tok), 1);
    BT_ASSERT_EQ(tok_eos_id(tok), 2);
    BT_ASSERT_STREQ(tok_piece(tok, 2), "\n</s>\n");
    BT_CHECK(tok_is_special(tok, 0) && tok_is_special(tok, 1) &&
             tok_is_special(tok, 2) && !tok_is_special(tok, 3));

    /* "The river flows" with EOS after "river" and BOS at the start */
    BT_ASSERT_OK(tok_encode(tok, "The river flows", 15, true, &ids, &n));
    BT_ASSERT_EQ(ids[0], 1);
    with = bt_malloc(sizeof(int) * (size_t)(n + 2), "test");
    memcpy(with, ids, sizeof(int) * (size_t)n);
    with[n] = 2;          /* EOS */
    with[n + 1] = ids[1]; /* "The" (with its leading space) again */

    /* without the switch: every piece, as tok_decode and run.c */
    a = stream_text(tok, -1, with, n + 2, false);
    BT_ASSERT_OK(tok_decode(tok, -1, with, n + 2, &dec));
    BT_ASSERT_STREQ(a, dec);
    BT_CHECK(strstr(a, "\n</s>\n") != NULL);
    bt_free(a);
    bt_free(dec);

    /* with it: the text of the ids without BOS and EOS */
    a = stream_text(tok, -1, with, n + 2, true);
    with[n] = ids[1];
    BT_ASSERT_OK(tok_decode(tok, 1, with + 1, n, &dec));
    BT_ASSERT_STREQ(a, dec);
    BT_CHECK(strncmp(a, "The river flows ", 16) == 0);
    with[n] = 2;
    bt_free(a);
    bt_free(dec);
    /* after a skipped BOS the first piece still loses its space (the
     * stream's prev_id is BOS, as in a generation's first token) */
    a = stream_text(tok, 1, with + 1, n - 1, true);
    b = stream_text(tok, 1, with + 1, n - 1, false);
    BT_ASSERT_STREQ(a, "The river flows");
    BT_ASSERT_STREQ(a, b);
    bt_free(a);
    bt_free(b);
    /* a lone EOS: nothing, or its piece */
    a = stream_text(tok, ids[n - 1], with + n, 1, true);
    b = stream_text(tok, ids[n - 1], with + n, 1, false);
    BT_ASSERT_STREQ(a, "");
    BT_ASSERT_STREQ(b, "\n</s>\n");
    bt_free(a);
    bt_free(b);

    bt_free(with);
    bt_free(ids);
    tok_destroy(&tok);
    BT_ASSERT_EQ(bt_alloc_report(), 0);
    BT_TEST_PASS("tokenizer/special");
    return 0;
}
