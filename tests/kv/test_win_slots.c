/*
 * test_win_slots.c - the receive windows per reservation slot that the
 * UCX and CUDA IPC receivers share (kv_link__win_slots_*, kv_link_int.h),
 * on fake windows that record every call:
 *   1. arm makes the grant's window; an arrival of another epoch finds
 *      none; the grant's arrival waits, copies the grant's blocks in and
 *      frees the window; asked again it answers at once.
 *   2. arming a slot again frees its old window before making the new
 *      one; reset revokes a live window only with a writer, and forgets
 *      what was copied in.
 *   3. a window that cannot be made: warned for the first grant only,
 *      the grant goes without, the error is cleared; a spent budget
 *      (BT_ERR_NO_RESOURCE) is no warning but the arm's answer, the slot
 *      left empty (the grant is refused and asked again).
 *   4. no window for a slot out of range, no blocks, or a staged-link
 *      grant; a NULL table arms and revokes nothing.
 *   5. a failed wait leaves the window live; a failed copy-in frees it
 *      and leaves nothing copied.
 *   6. destroy frees the live windows; nothing is left allocated.
 */
#include <stdio.h>
#include <string.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_log.h"
#include "bt_test.h"
#include "bt_util.h"
#include "kv/kv_link_int.h"

#define N_SLOTS 4

typedef struct {
    int id;
    int n;
} fake_win_t;

/* What the fake windows saw: one letter a call (c create, d destroy,
 * w wait, i copy-in, W warn), and the last copy-in's blocks. */
typedef struct {
    char calls[64];
    int n_calls;
    int next_id;
    bt_status_t fail_create; /* create's answer when not BT_OK */
    bt_status_t wait_status;
    bt_status_t copy_status;
    int copied_blocks[8];
    int n_copied;
} fake_t;

static void note(fake_t *f, char c)
{
    BT_CHECK(f->n_calls < (int)sizeof(f->calls) - 1);
    f->calls[f->n_calls++] = c;
    f->calls[f->n_calls] = '\0';
}

static void forget(fake_t *f)
{
    f->n_calls = 0;
    f->calls[0] = '\0';
}

static bt_status_t fake_create(void *ctx, const kv_link_grant_t *g,
                               void **win_p)
{
    fake_t *f = ctx;
    fake_win_t *w;

    note(f, 'c');
    if (f->fail_create != BT_OK)
        return BT_ERROR(f->fail_create, "TEST", "window budget spent");
    w = bt_malloc(sizeof(*w), "test_win");
    BT_CHECK(w != NULL);
    w->id = ++f->next_id;
    w->n = g->n;
    *win_p = w;
    return BT_OK;
}

/* kv_link__win_slots_arm's window, its status BT_OK. */
static void *arm(kv_link_win_slots_t *ws, const kv_link_grant_t *g)
{
    void *win = (void *)1;

    BT_ASSERT_OK(kv_link__win_slots_arm(ws, g, &win));
    return win;
}

static fake_t *the_fake; /* destroy has no ctx: its note goes here */

static void fake_destroy(void *win)
{
    note(the_fake, 'd');
    bt_free(win);
}

static bt_status_t fake_wait(void *ctx, void *win, int slot, uint64_t epoch)
{
    fake_t *f = ctx;

    BT_CHECK(win != NULL);
    note(f, 'w');
    return f->wait_status;
}

static bt_status_t fake_copy_in(void *ctx, void *win, const int *blocks,
                                int n)
{
    fake_t *f = ctx;

    note(f, 'i');
    BT_ASSERT_EQ(((fake_win_t *)win)->n, n);
    BT_CHECK(n <= (int)BT_ARRAY_SIZE(f->copied_blocks));
    memcpy(f->copied_blocks, blocks, (size_t)n * sizeof(int));
    f->n_copied = n;
    return f->copy_status;
}

static void fake_warn(void *ctx, const kv_link_grant_t *g)
{
    fake_t *f = ctx;

    note(f, 'W');
    BT_CHECK(strstr(bt_error_last(), "window budget spent") != NULL);
}

static const kv_link_win_ops_t fake_ops = {
    .name = "test_win_slots",
    .create = fake_create,
    .destroy = fake_destroy,
    .wait = fake_wait,
    .copy_in = fake_copy_in,
    .warn = fake_warn,
};

static kv_link_grant_t grant(int slot, uint64_t epoch, const int *blocks,
                             int n)
{
    kv_link_grant_t g;

    memset(&g, 0, sizeof(g));
    g.request_id = epoch;
    g.slot = slot;
    g.epoch = epoch;
    g.blocks = blocks;
    g.n = n;
    return g;
}

int main(void)
{
    static const int blocks_a[3] = {7, 2, 9};
    static const int blocks_b[2] = {4, 5};
    size_t live_before = bt_alloc_live_count();
    kv_link_win_slots_t *ws = NULL;
    fake_t f;
    kv_link_grant_t g;
    void *win;

    bt_log_set_level(BT_LOG_LEVEL_FATAL); /* the fake's BT_ERROR */
    memset(&f, 0, sizeof(f));
    the_fake = &f;
    BT_ASSERT_OK(kv_link__win_slots_create(&fake_ops, &f, N_SLOTS, &ws));
    BT_CHECK(ws != NULL);

    /* 1 */
    g = grant(1, 11, blocks_a, 3);
    win = arm(ws, &g);
    BT_CHECK(win != NULL);
    BT_ASSERT_STREQ(f.calls, "c");
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 1, 12), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 2, 11), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, N_SLOTS, 11),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_STREQ(f.calls, "c");
    BT_ASSERT_OK(kv_link__win_slots_arrived(ws, 1, 11));
    BT_ASSERT_STREQ(f.calls, "cwid");
    BT_ASSERT_EQ(f.n_copied, 3);
    BT_CHECK(memcmp(f.copied_blocks, blocks_a, sizeof(blocks_a)) == 0);
    forget(&f);
    BT_ASSERT_OK(kv_link__win_slots_arrived(ws, 1, 11)); /* asked again */
    BT_ASSERT_STREQ(f.calls, "");
    /* nothing live to revoke once copied in, and copied is forgotten */
    BT_CHECK(!kv_link__win_slots_reset(ws, 1, true));
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 1, 11), BT_ERR_INVALID_ARG);
    BT_TEST_PASS("win_slots: arm, arrival, copy-in, asked again");

    /* 2 */
    forget(&f);
    g = grant(2, 21, blocks_a, 3);
    BT_CHECK(arm(ws, &g) != NULL);
    g = grant(2, 22, blocks_b, 2);
    BT_CHECK(arm(ws, &g) != NULL);
    BT_ASSERT_STREQ(f.calls, "cdc"); /* the old one goes first */
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 2, 21), BT_ERR_INVALID_ARG);
    BT_CHECK(!kv_link__win_slots_reset(ws, 2, false)); /* no writer */
    BT_CHECK(!kv_link__win_slots_reset(ws, 2, true)); /* none live */
    g = grant(2, 23, blocks_b, 2);
    BT_CHECK(arm(ws, &g) != NULL);
    forget(&f);
    BT_CHECK(kv_link__win_slots_reset(ws, 2, true)); /* revoked */
    BT_ASSERT_STREQ(f.calls, "d");
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 2, 23), BT_ERR_INVALID_ARG);
    BT_TEST_PASS("win_slots: re-arm frees first; reset revokes");

    /* 3 */
    forget(&f);
    f.fail_create = BT_ERR_CUDA;
    g = grant(0, 31, blocks_a, 3);
    BT_CHECK(arm(ws, &g) == NULL);
    BT_ASSERT_STREQ(bt_error_last(), "");
    g = grant(3, 32, blocks_b, 2);
    BT_CHECK(arm(ws, &g) == NULL);
    BT_ASSERT_STREQ(f.calls, "cWc"); /* warned once */
    BT_ASSERT_STREQ(bt_error_last(), "");
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 0, 31), BT_ERR_INVALID_ARG);
    BT_CHECK(!kv_link__win_slots_reset(ws, 0, true));
    {   /* the budget spent for now: refused, not warned */
        void *win = (void *)1;

        forget(&f);
        f.fail_create = BT_ERR_NO_RESOURCE;
        g = grant(1, 33, blocks_a, 3);
        BT_ASSERT_EQ(kv_link__win_slots_arm(ws, &g, &win),
                     BT_ERR_NO_RESOURCE);
        BT_CHECK(win == NULL);
        BT_ASSERT_STREQ(f.calls, "c");
        BT_ASSERT_STREQ(bt_error_last(), "");
        BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 1, 33),
                     BT_ERR_INVALID_ARG);
        BT_CHECK(!kv_link__win_slots_reset(ws, 1, true)); /* none live */
        f.fail_create = BT_OK;
        BT_CHECK(arm(ws, &g) != NULL); /* asked again: made */
        BT_CHECK(kv_link__win_slots_reset(ws, 1, true));
    }
    f.fail_create = BT_OK;
    BT_TEST_PASS("win_slots: no window, warned once; a spent budget "
                 "refuses");

    /* 4 */
    forget(&f);
    g = grant(-1, 41, blocks_a, 3);
    BT_CHECK(arm(ws, &g) == NULL);
    g = grant(N_SLOTS, 42, blocks_a, 3);
    BT_CHECK(arm(ws, &g) == NULL);
    g = grant(0, 43, blocks_a, 0);
    BT_CHECK(arm(ws, &g) == NULL);
    g = grant(0, 44, blocks_a, 3);
    g.want_recv_area = true;
    BT_CHECK(arm(ws, &g) == NULL);
    BT_CHECK(arm(NULL, &g) == NULL);
    BT_CHECK(!kv_link__win_slots_reset(NULL, 0, true));
    BT_CHECK(!kv_link__win_slots_reset(ws, -1, true));
    BT_ASSERT_STREQ(f.calls, "");
    BT_TEST_PASS("win_slots: grants without a window");

    /* 5 */
    f.wait_status = BT_ERR_TIMEOUT;
    g = grant(3, 51, blocks_a, 3);
    BT_CHECK(arm(ws, &g) != NULL);
    forget(&f);
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 3, 51), BT_ERR_TIMEOUT);
    BT_ASSERT_STREQ(f.calls, "w"); /* still live: a later ask may see it */
    f.wait_status = BT_OK;
    f.copy_status = BT_ERR_CUDA;
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 3, 51), BT_ERR_CUDA);
    BT_ASSERT_STREQ(f.calls, "wwid");
    BT_ASSERT_EQ(kv_link__win_slots_arrived(ws, 3, 51), BT_ERR_INVALID_ARG);
    f.copy_status = BT_OK;
    BT_TEST_PASS("win_slots: failed wait, failed copy-in");

    /* 6 */
    g = grant(0, 61, blocks_a, 3);
    BT_CHECK(arm(ws, &g) != NULL);
    g = grant(3, 62, blocks_b, 2);
    BT_CHECK(arm(ws, &g) != NULL);
    forget(&f);
    kv_link__win_slots_destroy(&ws);
    BT_CHECK(ws == NULL);
    BT_ASSERT_STREQ(f.calls, "dd");
    kv_link__win_slots_destroy(&ws); /* NULL-safe */
    BT_ASSERT_EQ(bt_alloc_live_count(), live_before);
    BT_TEST_PASS("win_slots: destroy frees the live windows");
    return 0;
}
