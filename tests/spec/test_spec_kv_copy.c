/* test_spec_kv_copy.c - backend_kv_copy_slots on the cpu backend: every
 * read before every write (chains, rotations, swaps), src == dst, K and V
 * of every layer, and the argument checks (slot range, repeated dst, n). */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_test.h"
#include "model/model.h"

/* Fills K and V with a value unique to (array, layer, slot, column). */
static void fill(backend_t *be, const kv_layout_t *lay)
{
    int slots = lay->n_blocks * lay->block_size;
    int row = lay->n_kv_heads * lay->head_dim;

    for (int a = 0; a < 2; a++)
        for (int l = 0; l < lay->n_layers; l++) {
            float *p = backend_kv_data(be, l, a);

            for (int s = 0; s < slots; s++)
                for (int c = 0; c < row; c++)
                    p[(size_t)s * row + c] =
                        (float)(((a * 64 + l) * 100000 + s) * 7 + c % 7);
        }
}

/* Checks the pool against a fill followed by the copies, applied with
 * all reads first. */
static void check(backend_t *be, const kv_layout_t *lay, int n,
                  const int *src, const int *dst)
{
    int slots = lay->n_blocks * lay->block_size;
    int row = lay->n_kv_heads * lay->head_dim;
    int *from = malloc(sizeof(int) * (size_t)slots);

    for (int s = 0; s < slots; s++)
        from[s] = s;
    for (int i = 0; i < n; i++)
        from[dst[i]] = src[i];
    for (int a = 0; a < 2; a++)
        for (int l = 0; l < lay->n_layers; l++) {
            const float *p = backend_kv_data(be, l, a);

            for (int s = 0; s < slots; s++)
                for (int c = 0; c < row; c++) {
                    float want = (float)(((a * 64 + l) * 100000 + from[s]) *
                                             7 + c % 7);
                    if (p[(size_t)s * row + c] != want)
                        BT_TEST_FAIL("kv %d layer %d slot %d col %d: %g, "
                                     "want %g (from slot %d)", a, l, s, c,
                                     p[(size_t)s * row + c], want, from[s]);
                }
        }
    free(from);
}

int main(void)
{
    model_t *model = NULL;
    backend_t *be = NULL;
    backend_config_t cfg;
    const kv_layout_t *lay;
    int src[8], dst[8];

    BT_ASSERT_OK(model_load(BT_SHARED_DIR "/models/stories260K.bin",
                            &model));
    backend_config_init(&cfg);
    cfg.n_kv_blocks = 8;
    cfg.block_size = 4;
    cfg.n_threads = 1;
    BT_ASSERT_OK(backend_create("cpu", model, &cfg, &be));
    lay = backend_kv_layout(be);

    /* chain 3 -> 5 -> 9 -> 30: 9 gets the old 5, 30 the old 9 */
    fill(be, lay);
    src[0] = 3, dst[0] = 5;
    src[1] = 5, dst[1] = 9;
    src[2] = 9, dst[2] = 30;
    BT_ASSERT_OK(backend_kv_copy_slots(be, 3, src, dst));
    check(be, lay, 3, src, dst);
    /* the same chain listed backwards gives the same result */
    fill(be, lay);
    src[0] = 9, dst[0] = 30;
    src[1] = 5, dst[1] = 9;
    src[2] = 3, dst[2] = 5;
    BT_ASSERT_OK(backend_kv_copy_slots(be, 3, src, dst));
    check(be, lay, 3, src, dst);
    /* rotation 1 -> 2 -> 3 -> 1, a swap 10 <-> 20, an identity 7 -> 7 */
    fill(be, lay);
    src[0] = 1, dst[0] = 2;
    src[1] = 2, dst[1] = 3;
    src[2] = 3, dst[2] = 1;
    src[3] = 10, dst[3] = 20;
    src[4] = 20, dst[4] = 10;
    src[5] = 7, dst[5] = 7;
    BT_ASSERT_OK(backend_kv_copy_slots(be, 6, src, dst));
    check(be, lay, 6, src, dst);
    /* one source to two destinations */
    fill(be, lay);
    src[0] = 4, dst[0] = 0;
    src[1] = 4, dst[1] = 31;
    BT_ASSERT_OK(backend_kv_copy_slots(be, 2, src, dst));
    check(be, lay, 2, src, dst);
    /* n = 0 is a no-op */
    BT_ASSERT_OK(backend_kv_copy_slots(be, 0, NULL, NULL));

    /* refused, nothing copied */
    fill(be, lay);
    src[0] = 1, dst[0] = 2;
    src[1] = 3, dst[1] = 2;
    BT_ASSERT_EQ(backend_kv_copy_slots(be, 2, src, dst),
                 BT_ERR_INVALID_ARG);
    src[1] = 32, dst[1] = 4; /* pool has 8 * 4 = 32 slots */
    BT_ASSERT_EQ(backend_kv_copy_slots(be, 2, src, dst),
                 BT_ERR_INVALID_ARG);
    src[1] = 3, dst[1] = -1;
    BT_ASSERT_EQ(backend_kv_copy_slots(be, 2, src, dst),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(backend_kv_copy_slots(be, -1, src, dst),
                 BT_ERR_INVALID_ARG);
    BT_ASSERT_EQ(backend_kv_copy_slots(be, BACKEND_KV_COPY_MAX_SLOTS + 1,
                                       src, dst),
                 BT_ERR_INVALID_ARG);
    check(be, lay, 0, src, dst);

    backend_destroy(&be);
    model_destroy(&model);
    BT_TEST_PASS("spec kv_copy_slots");
    return 0;
}
