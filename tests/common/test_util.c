/* test_util.c - common/: parsing, allocation tracking, errors, whole-file
 * writes and reads. */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_error.h"
#include "bt_test.h"
#include "bt_util.h"

int main(void)
{
    int v, *list, n;
    int64_t v64;
    float f;
    size_t before = bt_alloc_live_count();
    char *s;

    BT_ASSERT_OK(bt_parse_int("42", &v));
    BT_ASSERT_EQ(v, 42);
    BT_ASSERT_EQ(bt_parse_int("42x", &v), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(bt_parse_int("", &v), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(bt_parse_int("99999999999", &v), BT_ERR_INVALID_ARG);
    BT_ASSERT_OK(bt_parse_i64("-9000000000", &v64));
    BT_ASSERT_EQ(v64, -9000000000LL);
    BT_ASSERT_OK(bt_parse_float("0.25", &f));
    BT_ASSERT_NEAR(f, 0.25, 0);
    BT_ASSERT_EQ(bt_parse_float("nan", &f), BT_ERR_INVALID_ARG);
    BT_ASSERT_OK(bt_parse_int_list(" 1, 2 3,4 ", &list, &n));
    BT_ASSERT_EQ(n, 4);
    BT_ASSERT_EQ(list[3], 4);
    bt_free(list);
    BT_ASSERT_EQ(bt_parse_int_list(" , ", &list, &n), BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(bt_parse_int_list("1 a", &list, &n), BT_ERR_INVALID_ARG);

    s = bt_strdup("hello", "test");
    BT_ASSERT_EQ(bt_alloc_live_count(), before + 1);
    s = bt_realloc(s, 1000, NULL);
    BT_ASSERT_STREQ(s, "hello");
    BT_ASSERT_EQ(((uintptr_t)s) % 64, 0);
    bt_free(s);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_CHECK(bt_malloc(SIZE_MAX - 8, "huge") == NULL);

    {
        /* bt_write_file replaces a file whole and leaves no temporary */
        char path[64], *data;
        size_t len;
        snprintf(path, sizeof(path), "/tmp/bt_test_util.%d", (int)getpid());
        BT_ASSERT_OK(bt_write_file(path, "first version", 13));
        BT_ASSERT_OK(bt_write_file(path, "second", 6));
        BT_ASSERT_OK(bt_read_file(path, 100, &data, &len));
        BT_ASSERT_EQ(len, 6);
        BT_ASSERT_STREQ(data, "second");
        bt_free(data);
        BT_ASSERT_OK(bt_write_file(path, "", 0));
        BT_ASSERT_OK(bt_read_file(path, 100, &data, &len));
        BT_ASSERT_EQ(len, 0);
        bt_free(data);
        BT_ASSERT_EQ(bt_write_file("/nonexistent-dir/x", "a", 1), BT_ERR_IO);
        BT_ASSERT_OK(unlink(path));
        bt_error_clear();
    }

    BT_ASSERT_EQ(BT_ERROR(BT_ERR_FORMAT, "TEST", "tensor %s bad", "wq"),
                 BT_ERR_FORMAT);
    BT_ASSERT_STREQ(bt_error_last(), "tensor wq bad");
    BT_TEST_PASS("common/util");
    return 0;
}
