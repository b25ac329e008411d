/*
 * test_kv_copy.cu - cuda_kv_copy_slots() against kv_copy_ref() on random
 * pools: disjoint copies, chains (a -> b, b -> c: the old b must land in
 * c), swaps and rotations, src == dst, every copy unit (16/4/2-byte rows)
 * and the largest n.  Bytes must match exactly.
 * cuda_kv_window_to_pool() against a host loop: a window of n blocks
 * into shuffled pool blocks (runs and singles), every layer's K and V,
 * n past one launch's CUDA_KV_WINDOW_LAUNCH_BLOCKS; every other pool
 * byte unchanged; unaligned sizes refused.
 * cuda_kv8_widen_pages() against bt_e4m3_to_f32 rounded to bf16 (exact
 * for every E4M3 value): pages from shuffled pool blocks, NaN codes
 * left out (their bf16 bits are the hardware's), misaligned refused.
 * Run: build-cuda/gpu/test_kv_copy   (make gpu-test runs every kernel test)
 */
#include "bt_fp8.h"
#include "kernels/kv_copy.h"
#include "kernels_ref.h"
#include "kt_common.h"

/* Fills src/dst for one pattern over `slots` pool slots; returns n. */
static int make_pairs(int pattern, int n, int slots, int *src, int *dst)
{
    int *perm = (int *)malloc(sizeof(int) * slots);

    for (int i = 0; i < slots; i++)
        perm[i] = i;
    for (int i = slots - 1; i > 0; i--) { /* shuffle */
        int j = (int)(kt_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    switch (pattern) {
    case 0: /* disjoint: distinct sources, distinct destinations */
        for (int i = 0; i < n; i++) {
            src[i] = perm[i];
            dst[i] = perm[n + i];
        }
        break;
    case 1: /* chain: perm[i] -> perm[i + 1] (every dst but the last is a
               src read before it is overwritten) */
        for (int i = 0; i < n; i++) {
            src[i] = perm[i];
            dst[i] = perm[i + 1];
        }
        break;
    case 2: /* rotation: a permutation of n slots */
        for (int i = 0; i < n; i++) {
            src[i] = perm[i];
            dst[i] = perm[(i + 1) % n];
        }
        break;
    default: /* spec compaction: slot base + v -> base + j, some equal */
        for (int i = 0; i < n; i++) {
            src[i] = 3 + 2 * i - (i % 3 == 0 ? i : 0);
            dst[i] = 3 + i;
        }
        break;
    }
    free(perm);
    return n;
}

/* The device array d (bytes) equals `want`, read through `out`. */
static int dev_equal(unsigned char *out, const void *d,
                     const unsigned char *want, size_t bytes)
{
    KT_CUDA(cudaMemcpy(out, d, bytes, cudaMemcpyDeviceToHost));
    return memcmp(out, want, bytes) == 0;
}

/* A window of n blocks into shuffled blocks of a pool of `slots`. */
static int window_case(int layers, int slots, size_t blk, int n)
{
    size_t layer_bytes = blk * slots, bytes = layer_bytes * layers;
    size_t wbytes = 2 * (size_t)layers * n * blk;
    int *perm = (int *)malloc(sizeof(int) * slots), fails = 0;
    unsigned char *k = (unsigned char *)malloc(bytes);
    unsigned char *v = (unsigned char *)malloc(bytes);
    unsigned char *w = (unsigned char *)malloc(wbytes);
    unsigned char *out = (unsigned char *)malloc(bytes);

    /* a run of four (as a fresh pool hands out), then shuffled singles */
    int base = (int)(kt_u32() % (uint32_t)(slots - 4)), m = 0, r = 0;
    int *rest = (int *)malloc(sizeof(int) * slots);

    for (int id = 0; id < slots; id++)
        if (n <= 4 || id < base || id >= base + 4)
            rest[r++] = id;
    for (int i = r - 1; i > 0; i--) {
        int j = (int)(kt_u32() % (uint32_t)(i + 1)), t = rest[i];
        rest[i] = rest[j];
        rest[j] = t;
    }
    if (n > 4)
        for (; m < 4; m++)
            perm[m] = base + m;
    for (int i = 0; m < n; i++)
        perm[m++] = rest[i];
    free(rest);
    for (size_t i = 0; i < bytes; i++) {
        k[i] = (unsigned char)kt_u32();
        v[i] = (unsigned char)kt_u32();
    }
    for (size_t i = 0; i < wbytes; i++)
        w[i] = (unsigned char)kt_u32();
    void *d_k = kt_upload_raw(k, bytes), *d_v = kt_upload_raw(v, bytes);
    void *d_w = kt_upload_raw(w, wbytes);
    KT_OK(cuda_kv_window_to_pool(d_k, d_v, layers, layer_bytes, blk, d_w,
                                 perm, n, 0));
    for (int l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n; i++)
                memcpy((kv ? v : k) + l * layer_bytes + perm[i] * blk,
                       w + ((2 * (size_t)l + kv) * n + i) * blk, blk);
    KT_CUDA(cudaDeviceSynchronize());
    for (int a = 0; a < 2; a++) {
        int ok = dev_equal(out, a ? d_v : d_k, a ? v : k, bytes);
        printf("%s kv_window_to_pool %s layers=%d slots=%d block=%zuB "
               "n=%d\n", ok ? "PASS" : "FAIL", a ? "V" : "K", layers,
               slots, blk, n);
        fails += !ok;
    }
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_w);
    free(perm);
    free(k);
    free(v);
    free(w);
    free(out);
    return fails;
}

/* n_pages of `elems` codes widened from shuffled blocks of a pool of
 * `blocks`: bf16 bits equal to the host's. */
static int widen_case(int blocks, size_t elems, int n_pages)
{
    size_t bytes = (size_t)blocks * elems;
    unsigned char *k = (unsigned char *)malloc(bytes);
    unsigned char *v = (unsigned char *)malloc(bytes);
    /* K then V pages, bf16 */
    uint16_t *want = (uint16_t *)malloc(4 * (size_t)n_pages * elems);
    uint16_t *out = (uint16_t *)malloc(4 * (size_t)n_pages * elems);
    int *pages = (int *)malloc(sizeof(int) * blocks), fails = 0;

    for (int i = 0; i < blocks; i++)
        pages[i] = i;
    for (int i = blocks - 1; i > 0; i--) {
        int j = (int)(kt_u32() % (uint32_t)(i + 1)), t = pages[i];
        pages[i] = pages[j];
        pages[j] = t;
    }
    for (size_t i = 0; i < bytes; i++) {
        do
            k[i] = (unsigned char)kt_u32();
        while ((k[i] & 0x7f) == 0x7f); /* NaN */
        do
            v[i] = (unsigned char)kt_u32();
        while ((v[i] & 0x7f) == 0x7f);
    }
    for (int a = 0; a < 2; a++)
        for (int p = 0; p < n_pages; p++)
            for (size_t e = 0; e < elems; e++) {
                const unsigned char c =
                    (a ? v : k)[(size_t)pages[p] * elems + e];
                const float f = bt_e4m3_to_f32(c);
                uint32_t u;
                memcpy(&u, &f, 4);
                want[((size_t)a * n_pages + p) * elems + e] =
                    (uint16_t)(u >> 16); /* exact: no rounding */
            }
    void *d_k = kt_upload_raw(k, bytes), *d_v = kt_upload_raw(v, bytes);
    int *d_pages = (int *)kt_upload_raw(pages, sizeof(int) * n_pages);
    void *d_w = NULL;
    KT_CUDA(cudaMalloc(&d_w, 4 * (size_t)n_pages * elems));
    KT_OK(cuda_kv8_widen_pages(d_k, d_v, elems, d_pages, n_pages, d_w,
                               (char *)d_w + 2 * (size_t)n_pages * elems,
                               0));
    KT_CUDA(cudaDeviceSynchronize());
    int ok = dev_equal((unsigned char *)out, d_w,
                       (const unsigned char *)want,
                       4 * (size_t)n_pages * elems);
    printf("%s kv8_widen_pages blocks=%d elems=%zu pages=%d\n",
           ok ? "PASS" : "FAIL", blocks, elems, n_pages);
    fails += !ok;
    if (cuda_kv8_widen_pages(d_k, d_v, elems + 4, d_pages, n_pages, d_w,
                             d_w, 0) == BT_OK) {
        printf("FAIL kv8_widen_pages accepted %zu-element blocks\n",
               elems + 4);
        fails++;
    }
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_pages);
    cudaFree(d_w);
    free(k);
    free(v);
    free(want);
    free(out);
    free(pages);
    return fails;
}

int main(void)
{
    /* layers, slots in pool, row bytes, n */
    const int shapes[][4] = {{2, 64, 256, 5},    {32, 4096, 2048, 16},
                             {3, 100, 12, 7},    {2, 50, 6, 9},
                             {1, 20000, 64, 8192}, {4, 256, 4096, 33}};
    int fails = 0;

    kt_seed(7);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (int pattern = 0; pattern < 4; pattern++) {
            int layers = shapes[s][0], slots = shapes[s][1];
            size_t row = (size_t)shapes[s][2];
            int n = shapes[s][3];
            size_t layer_bytes = row * slots, bytes = layer_bytes * layers;
            int *src, *dst;
            unsigned char *k, *v, *out;
            void *d_k, *d_v;
            int *d_src, *d_dst;

            if (pattern == 0 && 2 * n > slots)
                continue;
            if (pattern == 1 && n + 1 > slots)
                continue;
            if (pattern == 3 && 3 + 2 * n > slots)
                continue;
            src = (int *)malloc(sizeof(int) * n);
            dst = (int *)malloc(sizeof(int) * n);
            make_pairs(pattern, n, slots, src, dst);
            k = (unsigned char *)malloc(bytes);
            v = (unsigned char *)malloc(bytes);
            out = (unsigned char *)malloc(bytes);
            for (size_t i = 0; i < bytes; i++) {
                k[i] = (unsigned char)kt_u32();
                v[i] = (unsigned char)kt_u32();
            }
            d_k = kt_upload_raw(k, bytes);
            d_v = kt_upload_raw(v, bytes);
            d_src = (int *)kt_upload_raw(src, sizeof(int) * n);
            d_dst = (int *)kt_upload_raw(dst, sizeof(int) * n);
            KT_OK(cuda_kv_copy_slots(d_k, d_v, layers, layer_bytes, row,
                                     d_src, d_dst, n, 0));
            kv_copy_ref(k, v, layers, layer_bytes, row, src, dst, n);
            KT_CUDA(cudaDeviceSynchronize());
            for (int a = 0; a < 2; a++) {
                int ok = dev_equal(out, a ? d_v : d_k, a ? v : k, bytes);
                printf("%s kv_copy %s layers=%d slots=%d row=%zuB n=%d "
                       "pattern=%d\n", ok ? "PASS" : "FAIL", a ? "V" : "K",
                       layers, slots, row, n, pattern);
                fails += !ok;
            }
            cudaFree(d_k);
            cudaFree(d_v);
            cudaFree(d_src);
            cudaFree(d_dst);
            free(src);
            free(dst);
            free(k);
            free(v);
            free(out);
        }
    }
    fails += widen_case(40, 16 * 8 * 128, 17);
    fails += widen_case(300, 8 * 2 * 64, 300);
    fails += window_case(2, 64, 256, 1);
    fails += window_case(3, 300, 4096, 37);
    fails += window_case(2, 3000, 1024, 2 * CUDA_KV_WINDOW_LAUNCH_BLOCKS + 5);
    if (cuda_kv_window_to_pool(NULL, NULL, 1, 24, 24, NULL, NULL, 1, 0) ==
        BT_OK) {
        printf("FAIL kv_window_to_pool accepted 24-byte blocks\n");
        fails++;
    }
    /* n above the limit is refused */
    if (cuda_kv_copy_slots(NULL, NULL, 1, 16, 16, NULL, NULL,
                           CUDA_KV_COPY_MAX_SLOTS + 1, 0) == BT_OK) {
        printf("FAIL kv_copy accepted n above the limit\n");
        fails++;
    }
    kt_failures += fails;
    return kt_finish("test_kv_copy");
}
