/* test_spec_grad.c - the trainer's hand-written backward pass of the
 * EAGLE head (fusion layer + decoder layer + both losses) matches central
 * finite differences of its forward loss, on an MHA target (aidreams) and
 * a GQA target (stories); the training forward matches the inference
 * forward (spec_head_forward); the safetensors round trip is exact. */
#include "spec/spec_head.h"
#include "spec/spec_train.h"
#include "spec_test_util.h"

#include <unistd.h>

static float urand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((*s * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f;
}

static void check_model(const char *name)
{
    char path[512];
    model_t *m = NULL;
    spec_head_t *head = NULL, *back = NULL;
    enum { N_TOK = 9 };
    int tokens[N_TOK];
    uint64_t rng = 42;
    const model_config_t *c;
    float *feats, *noise, *grad, *params, *out, *ref;
    size_t np;
    double loss, lp, lm, worst = 0.0;
    int checked = 0;

    snprintf(path, sizeof(path), "%s/models/%s", BT_SHARED_DIR, name);
    BT_ASSERT_OK(model_load(path, &m));
    c = model_config(m);
    BT_ASSERT_OK(spec_head_create(m, 0, 3, &head));
    params = spec_head_params(head, &np);
    for (size_t i = 0; i < np; i++) /* leave the identity fc behind */
        params[i] += (urand(&rng) - 0.5f) * 0.3f;
    feats = malloc(sizeof(float) * N_TOK * c->dim);
    noise = malloc(sizeof(float) * N_TOK * c->dim);
    out = malloc(sizeof(float) * N_TOK * c->dim);
    ref = malloc(sizeof(float) * N_TOK * c->dim);
    grad = calloc(np, sizeof(float));
    for (int i = 0; i < N_TOK; i++)
        tokens[i] = (int)(urand(&rng) * c->vocab_size);
    for (int i = 0; i < N_TOK * c->dim; i++) {
        feats[i] = (urand(&rng) - 0.5f) * 3.0f;
        noise[i] = (urand(&rng) - 0.5f) * 0.2f;
    }
    BT_ASSERT_OK(spec_train_loss(head, tokens, feats, N_TOK, noise, 1.0f,
                                 0.5f, grad, &loss, NULL));
    for (size_t i = 0; i < np; i += 1 + (size_t)(urand(&rng) * 97)) {
        float keep = params[i], h = 2e-3f;
        double fd, a = grad[i], err;

        params[i] = keep + h;
        BT_ASSERT_OK(spec_train_loss(head, tokens, feats, N_TOK, noise,
                                     1.0f, 0.5f, NULL, &lp, NULL));
        params[i] = keep - h;
        BT_ASSERT_OK(spec_train_loss(head, tokens, feats, N_TOK, noise,
                                     1.0f, 0.5f, NULL, &lm, NULL));
        params[i] = keep;
        fd = (lp - lm) / (2.0 * h);
        err = fabs(fd - a) / (2e-4 + 0.03 * fabs(fd) + 0.03 * fabs(a));
        if (err > worst)
            worst = err;
        if (err > 1.0)
            BT_TEST_FAIL("%s param %zu: analytic %.6g, finite diff %.6g",
                         name, i, a, fd);
        checked++;
    }
    fprintf(stderr, "%s: %d gradients checked, worst %.3f of tolerance\n",
            name, checked, worst);
    BT_CHECK(checked > 300);

    /* training forward == inference forward (no noise, causal) */
    {
        spec_head_kv_t kv;
        int pos[N_TOK];
        double l0;

        for (int i = 0; i < N_TOK; i++)
            pos[i] = i;
        BT_ASSERT_OK(spec_head_kv_init(head, N_TOK, &kv));
        BT_ASSERT_OK(spec_head_forward(head, &kv, N_TOK - 1, feats,
                                       tokens + 1, pos, 0, 0, NULL, out,
                                       NULL));
        /* feature loss of the inference output == training loss */
        BT_ASSERT_OK(spec_train_loss(head, tokens, feats, N_TOK, NULL, 1.0f,
                                     0.0f, NULL, &l0, NULL));
        {
            double lf = 0.0;

            for (int i = 0; i < (N_TOK - 1) * c->dim; i++) {
                double e = fabs((double)out[i] - feats[i + c->dim]);
                lf += e < 1.0 ? 0.5 * e * e : e - 0.5;
            }
            lf /= (double)(N_TOK - 1) * c->dim;
            BT_ASSERT_NEAR(lf, l0, 1e-5 * (1.0 + fabs(l0)));
        }
        spec_head_kv_cleanup(&kv);
    }

    /* safetensors round trip */
    {
        char file[256];
        size_t nb;
        float *pb;

        snprintf(file, sizeof(file), "/tmp/bt_spec_grad_%d.safetensors",
                 (int)getpid());
        BT_ASSERT_OK(spec_head_save(head, file));
        BT_ASSERT_OK(spec_head_load(m, file, &back));
        pb = spec_head_params(back, &nb);
        BT_ASSERT_EQ(nb, np);
        BT_CHECK(memcmp(pb, params, np * sizeof(float)) == 0);
        unlink(file);
        spec_head_destroy(&back);
    }
    free(feats);
    free(noise);
    free(out);
    free(ref);
    free(grad);
    spec_head_destroy(&head);
    model_destroy(&m);
}

int main(void)
{
    size_t before = bt_alloc_live_count();

    check_model("aidreams260K.bin");
    check_model("stories260K.bin");
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("spec grad");
    return 0;
}
