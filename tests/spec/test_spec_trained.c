/* test_spec_trained.c - trains an EAGLE head for each shared model the
 * way `baton eagle train` does (self-distillation, ~10 s each), then
 * decodes every golden prompt greedily with the full tree: the output
 * equals golden.jsonl exactly, and the mean accepted length (tokens per
 * target forward, bonus included) on these prompts, which the head never
 * saw, is at least 2.5 for aidreams260K and 1.5 for stories260K.
 * BT_TEST_SLOW (about 30 s). */
#include "spec/spec_train.h"
#include "spec_test_util.h"

int main(void)
{
    static golden_t g[GOLDEN_MAX];
    static const char *models[] = { "aidreams260K.bin", "stories260K.bin" };
    static const double min_accept[] = { 2.5, 1.5 };
    int n_g = golden_read(g, GOLDEN_MAX);
    size_t before = bt_alloc_live_count();

    for (int m = 0; m < 2; m++) {
        char path[512];
        engine_config_t ecfg;
        engine_t *engine = NULL;
        spec_train_config_t tcfg;
        spec_train_data_t *data = NULL;
        spec_head_t *head = NULL;
        spec_train_report_t rep;
        spec_config_t scfg;
        spec_t *spec = NULL;
        double acc;

        snprintf(path, sizeof(path), "%s/models/%s", BT_SHARED_DIR,
                 models[m]);
        engine_config_init(&ecfg);
        ecfg.model_path = path;
        ecfg.device = "cpu";
        ecfg.backend.n_threads = 2;
        ecfg.backend.n_kv_blocks = 1024;
        BT_ASSERT_OK(engine_create(&ecfg, &engine));
        spec_train_config_init(&tcfg);
        tcfg.temperature = 0.5f;
        BT_ASSERT_OK(spec_train_data_create(engine, &tcfg, &data));
        BT_ASSERT_OK(spec_head_create(engine_model(engine), 0, 1, &head));
        BT_ASSERT_OK(spec_train(head, data, &tcfg, &rep));
        spec_train_data_destroy(&data);
        fprintf(stderr, "%s: trained in %.1f s, loss %.4f -> %.4f, top1 "
                "%.3f\n", models[m], rep.seconds, rep.first_loss,
                rep.last_loss, rep.last_top1);
        BT_CHECK(rep.last_loss < rep.first_loss);

        spec_config_init(&scfg);
        scfg.adaptive = false;
        BT_ASSERT_OK(spec_create(engine, head, &scfg, &spec));
        for (int i = 0; i < n_g; i++) {
            int got[600], n_got;

            if (strcmp(g[i].model, models[m]) != 0)
                continue;
            n_got = spec_generate(spec, engine, &g[i], got);
            golden_check(&g[i], got, n_got, path);
        }
        acc = spec_accept_length(spec);
        fprintf(stderr, "%s: accept length %.3f on the golden prompts\n",
                models[m], acc);
        BT_CHECK(acc >= min_accept[m]);
        spec_destroy(&spec);
        spec_head_destroy(&head);
        engine_destroy(&engine);
    }
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("spec trained");
    return 0;
}
