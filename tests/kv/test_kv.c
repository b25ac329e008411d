/* test_kv.c - worker/kv: layout arithmetic and the block allocator
 * (lowest ids first, all-or-nothing, refcounts, reuse after release). */
#include <stdlib.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "kv/kv.h"

static void test_layout(void)
{
    kv_layout_t l = { .n_layers = 3, .n_blocks = 10, .block_size = 16,
                      .n_kv_heads = 4, .head_dim = 8, .elem_size = 4 };

    BT_ASSERT_EQ(kv_layout_block_bytes(&l), 16 * 4 * 8 * 4);
    BT_ASSERT_EQ(kv_layout_layer_bytes(&l), 10 * 16 * 4 * 8 * 4);
    BT_ASSERT_EQ(kv_layout_offset(&l, 0, 0, 0), 0);
    BT_ASSERT_EQ(kv_layout_offset(&l, 0, 0, 1), 32);
    BT_ASSERT_EQ(kv_layout_offset(&l, 0, 1, 0), 16 * 32);
    BT_ASSERT_EQ(kv_layout_offset(&l, 2, 3, 5),
                 ((2 * 10 + 3) * 16 + 5) * 32);
    /* A layer's blocks are one region: layer bytes = offset of next layer. */
    BT_ASSERT_EQ(kv_layout_offset(&l, 1, 0, 0) * l.elem_size,
                 kv_layout_layer_bytes(&l));
    BT_TEST_PASS("layout");
}

static void test_alloc(void)
{
    kv_allocator_t *a = NULL;
    int ids[16], more[16];

    BT_ASSERT_EQ(kv_allocator_create(0, &a), BT_ERR_INVALID_ARG);
    BT_ASSERT_OK(kv_allocator_create(10, &a));
    BT_ASSERT_EQ(kv_allocator_total(a), 10);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 10);

    /* Fresh pool: adjacent runs, lowest first. */
    BT_ASSERT_OK(kv_allocator_alloc(a, 4, ids));
    for (int i = 0; i < 4; i++) {
        BT_ASSERT_EQ(ids[i], i);
        BT_ASSERT_EQ(kv_allocator_refcount(a, i), 1);
    }
    BT_ASSERT_OK(kv_allocator_alloc(a, 3, more));
    BT_ASSERT_EQ(more[0], 4);
    BT_ASSERT_EQ(more[2], 6);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 3);

    /* All or nothing. */
    BT_ASSERT_EQ(kv_allocator_alloc(a, 4, ids + 4), BT_ERR_NO_RESOURCE);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 3);
    BT_ASSERT_OK(kv_allocator_alloc(a, 0, ids + 4));

    /* Refcounts: a shared block survives one release. */
    kv_allocator_ref(a, 2);
    BT_ASSERT_EQ(kv_allocator_refcount(a, 2), 2);
    kv_allocator_release(a, 4, ids); /* frees 0, 1, 3; 2 stays */
    BT_ASSERT_EQ(kv_allocator_refcount(a, 2), 1);
    BT_ASSERT_EQ(kv_allocator_refcount(a, 0), 0);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 6);

    /* Released ids come back lowest first. */
    BT_ASSERT_OK(kv_allocator_alloc(a, 5, ids));
    BT_ASSERT_EQ(ids[0], 0);
    BT_ASSERT_EQ(ids[1], 1);
    BT_ASSERT_EQ(ids[2], 3);
    BT_ASSERT_EQ(ids[3], 7);
    BT_ASSERT_EQ(ids[4], 8);
    BT_ASSERT_EQ(kv_allocator_free_count(a), 1);
    kv_allocator_destroy(&a);
    BT_CHECK(a == NULL);
    kv_allocator_destroy(&a); /* NULL-safe */
    BT_TEST_PASS("alloc");
}

/* Random alloc/release against a shadow model: the heap must always hand
 * out the smallest free ids. */
static void test_alloc_random(void)
{
    enum { N = 257 };
    kv_allocator_t *a = NULL;
    int held[N], n_held = 0, ids[N];
    int shadow[N] = { 0 };

    srand(1234);
    BT_ASSERT_OK(kv_allocator_create(N, &a));
    for (int iter = 0; iter < 20000; iter++) {
        if (rand() % 2 == 0) {
            int n = rand() % 9;
            int expect = 0, got = 0;

            if (kv_allocator_alloc(a, n, ids) != BT_OK) {
                BT_CHECK(n > kv_allocator_free_count(a));
                continue;
            }
            for (int i = 0; i < n; i++) {
                while (shadow[expect] != 0)
                    expect++;
                BT_ASSERT_EQ(ids[i], expect);
                shadow[expect] = 1;
                held[n_held++] = ids[i];
                got++;
            }
            BT_ASSERT_EQ(got, n);
        } else if (n_held > 0) {
            int k = rand() % n_held;
            int id = held[k];

            held[k] = held[--n_held];
            kv_allocator_release(a, 1, &id);
            shadow[id] = 0;
        }
        BT_ASSERT_EQ(kv_allocator_free_count(a), N - n_held);
    }
    kv_allocator_release(a, n_held, held);
    BT_ASSERT_EQ(kv_allocator_free_count(a), N);
    kv_allocator_destroy(&a);
    BT_TEST_PASS("alloc_random");
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    test_layout();
    test_alloc();
    test_alloc_random();
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    return 0;
}
