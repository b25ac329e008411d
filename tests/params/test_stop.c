/* test_stop.c - stop ids, stop strings with hold-back, max tokens. */
#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "stop.h"

/* Feeds (id, text) pairs; returns the reason; all shown text in `all`. */
static stop_reason_t feed_all(stop_t *stop, const int *ids,
                              const char *const *texts, int n, char *all,
                              int *fed)
{
    char out[1024];
    size_t len;
    stop_reason_t r = STOP_NONE;

    all[0] = '\0';
    for (*fed = 0; *fed < n && r == STOP_NONE; (*fed)++) {
        r = stop_feed(stop, ids[*fed], texts[*fed], strlen(texts[*fed]), out,
                      sizeof(out), &len);
        BT_ASSERT_EQ(strlen(out), len);
        strcat(all, out);
    }
    if (r == STOP_NONE) {
        stop_flush(stop, out, sizeof(out), &len);
        strcat(all, out);
    }
    return r;
}

int main(void)
{
    stop_config_t cfg;
    stop_t *stop;
    char all[4096];
    int fed;
    size_t live = bt_alloc_live_count();
    const int ids[] = { 10, 11, 12, 13, 14 };
    const char *texts[] = { "Hello", " wor", "ld", "!", " more" };

    bt_log_set_level(BT_LOG_LEVEL_FATAL);

    /* No conditions but max_tokens: everything shows, LENGTH at 5. */
    stop_config_init(&cfg);
    cfg.max_tokens = 5;
    BT_ASSERT_OK(stop_create(&cfg, &stop));
    BT_ASSERT_EQ(feed_all(stop, ids, texts, 5, all, &fed), STOP_LENGTH);
    BT_ASSERT_STREQ(all, "Hello world! more");
    stop_destroy(&stop);

    /* Stop id 12: its text is not shown. */
    cfg.max_tokens = 100;
    cfg.ids[0] = 12;
    cfg.n_ids = 1;
    BT_ASSERT_OK(stop_create(&cfg, &stop));
    BT_ASSERT_EQ(feed_all(stop, ids, texts, 5, all, &fed), STOP_EOS);
    BT_ASSERT_STREQ(all, "Hello wor");
    BT_ASSERT_EQ(fed, 3);
    stop_destroy(&stop);

    /* Stop string spanning tokens: "world" -> "Hello " then stop; "wor"
     * must have been held back, never shown. */
    cfg.n_ids = 0;
    cfg.strings[0] = "world";
    cfg.n_strings = 1;
    BT_ASSERT_OK(stop_create(&cfg, &stop));
    {
        char out[256];
        size_t len;
        BT_ASSERT_EQ(stop_feed(stop, 10, "Hello", 5, out, sizeof(out), &len),
                     STOP_NONE);
        BT_ASSERT_STREQ(out, "Hello");
        BT_ASSERT_EQ(stop_feed(stop, 11, " wor", 4, out, sizeof(out), &len),
                     STOP_NONE);
        BT_ASSERT_STREQ(out, " "); /* "wor" held: may become "world" */
        BT_ASSERT_EQ(stop_feed(stop, 12, "ld", 2, out, sizeof(out), &len),
                     STOP_STRING);
        BT_ASSERT_STREQ(out, "");
    }
    stop_destroy(&stop);

    /* A near miss releases the held text. */
    cfg.strings[0] = "word";
    BT_ASSERT_OK(stop_create(&cfg, &stop));
    BT_ASSERT_EQ(feed_all(stop, ids, texts, 5, all, &fed), STOP_NONE);
    BT_ASSERT_STREQ(all, "Hello world! more");
    stop_destroy(&stop);

    /* Two strings, the earliest match wins; match inside one token. */
    cfg.strings[0] = "more";
    cfg.strings[1] = "o w";
    cfg.n_strings = 2;
    BT_ASSERT_OK(stop_create(&cfg, &stop));
    BT_ASSERT_EQ(feed_all(stop, ids, texts, 5, all, &fed), STOP_STRING);
    BT_ASSERT_STREQ(all, "Hell");
    stop_destroy(&stop);

    /* Hand-off: a second matcher primed with the first one's held text
     * continues exactly ("wor" held by A, "ld" completes it in B). */
    cfg.strings[0] = "world";
    cfg.n_strings = 1;
    {
        stop_t *b = NULL;
        char out[256];
        const char *held;
        size_t len, n_held;
        BT_ASSERT_OK(stop_create(&cfg, &stop));
        BT_ASSERT_OK(stop_create(&cfg, &b));
        stop_feed(stop, 10, "Hello wor", 9, out, sizeof(out), &len);
        BT_ASSERT_STREQ(out, "Hello ");
        held = stop_held(stop, &n_held);
        BT_ASSERT_EQ(n_held, 3);
        BT_CHECK(memcmp(held, "wor", 3) == 0);
        BT_ASSERT_OK(stop_prime(b, held, n_held));
        BT_ASSERT_EQ(stop_feed(b, 11, "ld", 2, out, sizeof(out), &len),
                     STOP_STRING);
        BT_ASSERT_STREQ(out, "");
        /* A near miss shows the primed text; too much held is refused. */
        BT_ASSERT_OK(stop_prime(b, "wor", 3));
        BT_ASSERT_EQ(stop_feed(b, 11, "m", 1, out, sizeof(out), &len),
                     STOP_NONE);
        BT_ASSERT_STREQ(out, "worm");
        BT_ASSERT_EQ(stop_prime(b, all, STOP_MAX_STRING_LEN),
                     BT_ERR_INVALID_ARG);
        stop_destroy(&b);
        stop_destroy(&stop);
    }

    /* Bad configs. */
    stop_config_init(&cfg);
    cfg.max_tokens = 0;
    BT_ASSERT_EQ(stop_create(&cfg, &stop), BT_ERR_INVALID_ARG);
    cfg.max_tokens = 4;
    cfg.strings[0] = "";
    cfg.n_strings = 1;
    BT_ASSERT_EQ(stop_create(&cfg, &stop), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(bt_alloc_live_count(), live);
    BT_TEST_PASS("worker/stop");
    return 0;
}
