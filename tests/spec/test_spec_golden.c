/* test_spec_golden.c - greedy speculative decoding reproduces every
 * golden.jsonl line exactly, whatever the draft head: with an untrained
 * (random) head and with a head whose weights are scaled to make it
 * accept often, for several fixed tree shapes and the adaptive mode, on
 * the llama2.c files and their -hf conversions, one sequence at a time
 * and all prompts of a model in one mixed batch. */
#include "spec_test_util.h"

typedef struct {
    int tokens, depth, topk; /* tokens 0 with depth 0 = adaptive */
} shape_t;

static const shape_t shapes[] = {
    { 16, 5, 4 }, { 4, 4, 1 }, { 10, 3, 3 }, { 0, 0, 0 }, { 1, 1, 1 },
};

/* All golden lines of `model` decoded together in one batch, joining at
 * different steps (continuous batching). */
static void batch_check(spec_t *spec, engine_t *engine, golden_t *g, int n_g,
                        const char *model)
{
    sampler_params_t sp;
    engine_seq_t *seqs[GOLDEN_MAX];
    spec_seq_t *ss[GOLDEN_MAX], *live[GOLDEN_MAX];
    int idx[GOLDEN_MAX], got[GOLDEN_MAX][600], n_got[GOLDEN_MAX];
    bool done[GOLDEN_MAX];
    int n = 0, max_step = spec_max_step_tokens(spec);
    int *out = malloc(sizeof(int) * GOLDEN_MAX * (size_t)max_step);
    int n_out[GOLDEN_MAX];

    sampler_params_init(&sp);
    for (int i = 0; i < n_g; i++) {
        if (strcmp(g[i].model, model) != 0)
            continue;
        BT_ASSERT_OK(engine_seq_create(engine, g[i].prompt, g[i].n_prompt,
                                       &sp, &seqs[n]));
        BT_ASSERT_OK(spec_seq_create(spec, seqs[n], &ss[n]));
        idx[n] = i;
        n_got[n] = 0;
        done[n] = false;
        n++;
    }
    for (int step = 0;; step++) {
        int n_live = 0, map[GOLDEN_MAX];
        bool waiting = false;

        /* sequence i joins at step 3 i: prompts are prefilled in the same
         * forward as other sequences' draft trees */
        for (int i = 0; i < n; i++) {
            if (step < 3 * i) {
                waiting = true;
                continue;
            }
            if (!done[i]) {
                map[n_live] = i;
                live[n_live++] = ss[i];
            }
        }
        if (n_live == 0 && !waiting)
            break;
        if (n_live == 0)
            continue;
        BT_ASSERT_OK(spec_step(spec, live, n_live, n_out, out));
        for (int b = 0; b < n_live; b++) {
            int i = map[b];

            for (int j = 0; j < n_out[b] && !done[i]; j++) {
                int tok = out[b * max_step + j];

                if (tok == 1) {
                    done[i] = true;
                    break;
                }
                got[i][n_got[i]++] = tok;
                if (n_got[i] >= golden_limit(&g[idx[i]]))
                    done[i] = true;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        golden_check(&g[idx[i]], got[i], n_got[i], "batch");
        spec_seq_destroy(&ss[i]);
        engine_seq_destroy(engine, &seqs[i]);
    }
    free(out);
}

int main(void)
{
    static golden_t g[GOLDEN_MAX];
    static const char *models[] = { "aidreams260K.bin", "stories260K.bin" };
    int n_g = golden_read(g, GOLDEN_MAX), runs = 0;
    size_t before = bt_alloc_live_count();

    for (int m = 0; m < 2; m++) {
        for (int variant = 0; variant < 2; variant++) {
            char path[512];
            engine_config_t ecfg;
            engine_t *engine = NULL;
            spec_head_t *head = NULL;
            spec_config_t scfg;
            spec_t *spec = NULL;

            snprintf(path, sizeof(path), "%s/models/%.*s%s", BT_SHARED_DIR,
                     (int)strlen(models[m]) - (variant ? 4 : 0), models[m],
                     variant ? "-hf" : "");
            engine_config_init(&ecfg);
            ecfg.model_path = path;
            ecfg.device = "cpu";
            ecfg.backend.block_size = 8;
            ecfg.backend.n_kv_blocks = 512;
            ecfg.backend.n_threads = 1 + variant;
            BT_ASSERT_OK(engine_create(&ecfg, &engine));
            /* the -hf conversions: one head, two shapes (time) */
            for (int h = 0; h < 2 - variant; h++) {
                BT_ASSERT_OK(spec_head_create(engine_model(engine), 0,
                                              7 + h, &head));
                if (h == 1) { /* a sharper head: bigger random weights */
                    size_t np;
                    float *p = spec_head_params(head, &np);

                    for (size_t i = 0; i < np; i++)
                        p[i] *= 3.0f;
                }
                spec_config_init(&scfg);
                BT_ASSERT_OK(spec_create(engine, head, &scfg, &spec));
                for (size_t s = 0; s < BT_ARRAY_SIZE(shapes); s++) {
                    if (variant == 1 && s != 0 && s != 3)
                        continue;
                    if (shapes[s].depth > 0)
                        spec_set_fixed(spec, shapes[s].tokens,
                                       shapes[s].depth, shapes[s].topk);
                    for (int i = 0; i < n_g; i++) {
                        int got[600], n_got;

                        if (strcmp(g[i].model, models[m]) != 0)
                            continue;
                        n_got = spec_generate(spec, engine, &g[i], got);
                        golden_check(&g[i], got, n_got, path);
                        runs++;
                    }
                }
                spec_set_fixed(spec, 16, 5, 4);
                batch_check(spec, engine, g, n_g, models[m]);
                fprintf(stderr, "%s head %d: accept length %.3f\n", path, h,
                        spec_accept_length(spec));
                spec_destroy(&spec);
                spec_head_destroy(&head);
            }
            engine_destroy(&engine);
        }
    }
    fprintf(stderr, "spec golden: %d runs\n", runs);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("spec golden");
    return 0;
}
