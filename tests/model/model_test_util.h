/*
 * model_test_util.h - helpers shared by the model tests: a scratch
 * directory removed at the end, whole-file reads and comparisons.
 */
#ifndef BT_TESTS_MODEL_TEST_UTIL_H
#define BT_TESTS_MODEL_TEST_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bt_alloc.h"
#include "bt_test.h"
#include "bt_util.h"
#include "model/model.h"

static int mt_rm_fn(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

/* Creates a scratch directory into buf (/tmp/bt_model_XXXXXX). */
static inline void mt_mkdtemp(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/bt_model_XXXXXX");
    if (mkdtemp(buf) == NULL)
        BT_TEST_FAIL("mkdtemp failed");
}

static inline void mt_rmtree(const char *dir)
{
    nftw(dir, mt_rm_fn, 16, FTW_DEPTH | FTW_PHYS);
}

static inline void mt_write(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL || fwrite(data, 1, n, fp) != n)
        BT_TEST_FAIL("cannot write %s", path);
    fclose(fp);
}

static inline char *mt_read(const char *path, size_t *len_p)
{
    char *data;
    if (bt_read_file(path, (size_t)1 << 31, &data, len_p) != BT_OK)
        BT_TEST_FAIL("cannot read %s", path);
    return data;
}

/* Fails unless the two files have identical bytes. */
static inline void mt_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *da = mt_read(a, &na), *db = mt_read(b, &nb);
    if (na != nb)
        BT_TEST_FAIL("%s (%zu bytes) and %s (%zu bytes) differ in size", a,
                     na, b, nb);
    for (size_t i = 0; i < na; i++) {
        if (da[i] != db[i])
            BT_TEST_FAIL("%s and %s differ at byte %zu", a, b, i);
    }
    bt_free(da);
    bt_free(db);
}

/* Fails unless the tensors have the same shape, dtype and bytes. */
static inline void mt_same_tensor(const char *what, const model_tensor_t *a,
                                  const model_tensor_t *b)
{
    if (a->data == NULL || b->data == NULL) {
        if (a->data != b->data)
            BT_TEST_FAIL("%s: present in only one model", what);
        return;
    }
    if (a->rows != b->rows || a->cols != b->cols || a->dtype != b->dtype)
        BT_TEST_FAIL("%s: %lldx%lld %s vs %lldx%lld %s", what,
                     (long long)a->rows, (long long)a->cols,
                     model_dtype_name(a->dtype), (long long)b->rows,
                     (long long)b->cols, model_dtype_name(b->dtype));
    if (memcmp(a->data, b->data,
               (size_t)(a->rows * a->cols) * model_dtype_size(a->dtype)) != 0)
        BT_TEST_FAIL("%s: bytes differ", what);
}

/* Fails unless every tensor (same layout assumed) is identical. */
static inline void mt_same_weights(const model_t *a, const model_t *b)
{
    const model_config_t *c = model_config(a);
    mt_same_tensor("embedding", model_tok_embedding(a), model_tok_embedding(b));
    mt_same_tensor("final_norm", model_final_norm(a), model_final_norm(b));
    mt_same_tensor("classifier", model_classifier(a), model_classifier(b));
    for (int l = 0; l < c->n_layers; l++) {
        const model_layer_t *x = model_layer(a, l), *y = model_layer(b, l);
        mt_same_tensor("attn_norm", &x->attn_norm, &y->attn_norm);
        mt_same_tensor("wq", &x->wq, &y->wq);
        mt_same_tensor("wk", &x->wk, &y->wk);
        mt_same_tensor("wv", &x->wv, &y->wv);
        mt_same_tensor("bq", &x->bq, &y->bq);
        mt_same_tensor("bk", &x->bk, &y->bk);
        mt_same_tensor("bv", &x->bv, &y->bv);
        mt_same_tensor("wo", &x->wo, &y->wo);
        mt_same_tensor("ffn_norm", &x->ffn_norm, &y->ffn_norm);
        mt_same_tensor("w_gate", &x->w_gate, &y->w_gate);
        mt_same_tensor("w_up", &x->w_up, &y->w_up);
        mt_same_tensor("w_down", &x->w_down, &y->w_down);
    }
}

#endif /* BT_TESTS_MODEL_TEST_UTIL_H */
