/* test_spec_handoff.c - a sequence prefilled elsewhere (here: by
 * engine_step, as the prefill worker would) joins speculative decoding:
 * with its prompt's hidden states imported (spec_seq_import, the
 * speculation-aware hand-off) the very first decode step drafts a tree;
 * without them the first step decodes plainly and drafting starts on the
 * next.  Either way the greedy output equals golden.jsonl. */
#include "spec/spec_train.h"
#include "spec_test_util.h"

/* Target hidden states (before the final norm) of ids, computed in
 * spare KV blocks: what a prefill worker would ship. */
static void prompt_hidden(engine_t *engine, const int *ids, int n,
                          float *hidden)
{
    const model_config_t *c = model_config(engine_model(engine));
    float *logits = malloc(sizeof(float) * (size_t)n * c->vocab_size);
    int blocks[64], bs = engine_block_size(engine), nb = (n + bs - 1) / bs;
    backend_seq_t seq = { .n_tokens = n, .ctx_len = 0, .tokens = ids,
                          .block_table = blocks, .n_logits = n };
    backend_batch_t batch = { .n_seqs = 1, .seqs = &seq };

    BT_ASSERT_OK(kv_allocator_alloc(engine_kv(engine), nb, blocks));
    BT_ASSERT_OK(backend_forward(engine_backend(engine), &batch, logits,
                                 hidden));
    kv_allocator_release(engine_kv(engine), nb, blocks);
    free(logits);
}

int main(void)
{
    static golden_t g[GOLDEN_MAX];
    int n_g = golden_read(g, GOLDEN_MAX);
    const golden_t *line = &g[0];
    engine_config_t ecfg;
    engine_t *engine = NULL;
    spec_train_config_t tcfg;
    spec_train_data_t *data = NULL;
    spec_head_t *head = NULL;
    spec_config_t scfg;
    spec_t *spec = NULL;
    size_t before = bt_alloc_live_count();

    BT_CHECK(n_g > 0 && strcmp(line->model, "aidreams260K.bin") == 0);
    engine_config_init(&ecfg);
    ecfg.model_path = BT_SHARED_DIR "/models/aidreams260K.bin";
    ecfg.device = "cpu";
    ecfg.backend.n_threads = 1;
    BT_ASSERT_OK(engine_create(&ecfg, &engine));
    spec_train_config_init(&tcfg);
    tcfg.n_tokens = 8192;
    tcfg.epochs = 3;
    tcfg.temperature = 0.5f;
    BT_ASSERT_OK(spec_train_data_create(engine, &tcfg, &data));
    BT_ASSERT_OK(spec_head_create(engine_model(engine), 0, 1, &head));
    BT_ASSERT_OK(spec_train(head, data, &tcfg, NULL));
    spec_train_data_destroy(&data);
    spec_config_init(&scfg);
    scfg.adaptive = false;
    BT_ASSERT_OK(spec_create(engine, head, &scfg, &spec));

    for (int import = 1; import >= 0; import--) {
        sampler_params_t sp;
        engine_seq_t *seq = NULL;
        spec_seq_t *ss = NULL;
        spec_stats_t st0, st1;
        int got[600], n = 0, first, max_step = spec_max_step_tokens(spec);
        int *out = malloc(sizeof(int) * (size_t)max_step), n_out;
        float *hidden = malloc(sizeof(float) * (size_t)line->n_prompt *
                               model_config(engine_model(engine))->dim);

        sampler_params_init(&sp);
        BT_ASSERT_OK(engine_seq_create(engine, line->prompt,
                                       line->n_prompt, &sp, &seq));
        BT_ASSERT_OK(engine_step(engine, &seq, 1, 0, &first)); /* prefill */
        BT_CHECK(first >= 0);
        got[n++] = first;
        BT_ASSERT_OK(spec_seq_create(spec, seq, &ss));
        if (import) {
            prompt_hidden(engine, line->prompt, line->n_prompt, hidden);
            BT_ASSERT_OK(spec_seq_import(spec, ss, hidden, line->n_prompt));
        }
        spec_get_stats(spec, &st0);
        BT_ASSERT_OK(spec_step(spec, &ss, 1, &n_out, out));
        spec_get_stats(spec, &st1);
        /* with the hand-off the first decode step already drafts */
        BT_ASSERT_EQ(st1.verify_seqs - st0.verify_seqs, import ? 1 : 0);
        BT_ASSERT_EQ(st1.plain_seqs - st0.plain_seqs, import ? 0 : 1);
        fprintf(stderr, "import %d: first step gave %d tokens\n", import,
                n_out);
        for (;;) {
            bool stop = false;

            for (int j = 0; j < n_out && !stop; j++) {
                if (out[j] == 1 || n >= golden_limit(line))
                    stop = true;
                else
                    got[n++] = out[j];
            }
            if (stop || n >= golden_limit(line))
                break;
            BT_ASSERT_OK(spec_step(spec, &ss, 1, &n_out, out));
        }
        golden_check(line, got, n, import ? "hand-off" : "no hand-off");
        spec_seq_destroy(&ss);
        engine_seq_destroy(engine, &seq);
        free(out);
        free(hidden);
    }
    spec_destroy(&spec);
    spec_head_destroy(&head);
    engine_destroy(&engine);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("spec hand-off");
    return 0;
}
