/* test_spec_force.c - the benchmark hooks and helpers of speculative
 * decoding on the cpu backend:
 *   - spec_test_force_accept: rate 1 accepts every level of a chain tree
 *     (tokens + 1 per verified step), rate 0 none (1 per step), rate 0.5
 *     near sum_j 0.5^j; the KV of forced paths is compacted like real
 *     ones (decoding keeps going without errors);
 *   - sampler_is_argmax: greedy without penalties only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bt_test.h"
#include "engine.h"
#include "sampler.h"
#include "spec/spec.h"
#include "spec_test_util.h"

/* Mean tokens per verified step of n sequences decoded for `steps` steps
 * with a fixed tree and a forced rate. */
static double forced(engine_t *engine, spec_head_t *head, int tokens,
                     int depth, int topk, double rate, int n, int steps)
{
    spec_config_t scfg;
    spec_t *spec = NULL;
    sampler_params_t sp;
    engine_seq_t *seqs[4];
    spec_seq_t *ss[4];
    int out[4 * (SPEC_MAX_DEPTH + 2)], n_out[4];
    int prompt[3] = { 1, 300, 301 };
    double len;

    spec_config_init(&scfg);
    scfg.adaptive = false;
    scfg.tokens = tokens;
    scfg.depth = depth;
    scfg.topk = topk;
    BT_ASSERT_OK(spec_create(engine, head, &scfg, &spec));
    spec_test_force_accept(spec, rate, 42);
    sampler_params_init(&sp);
    for (int i = 0; i < n; i++) {
        prompt[2] = 301 + 17 * i;
        BT_ASSERT_OK(engine_seq_create(engine, prompt, 3, &sp, &seqs[i]));
        BT_ASSERT_OK(spec_seq_create(spec, seqs[i], &ss[i]));
    }
    for (int s = 0; s < steps; s++)
        BT_ASSERT_OK(spec_step(spec, ss, n, n_out, out));
    len = spec_accept_length(spec);
    for (int i = 0; i < n; i++) {
        BT_CHECK(engine_seq_cached(seqs[i]) == engine_seq_len(seqs[i]) - 1);
        spec_seq_destroy(&ss[i]);
        engine_seq_destroy(engine, &seqs[i]);
    }
    spec_destroy(&spec);
    return len;
}

int main(void)
{
    engine_t *engine = spec_test_cpu_engine(512);
    spec_head_t *head = NULL;
    sampler_params_t sp;
    sampler_t *smp = NULL;
    double len, want;

    BT_ASSERT_OK(spec_head_create(engine_model(engine), 0, 3, &head));

    len = forced(engine, head, 4, 4, 1, 1.0, 3, 12);
    BT_ASSERT_NEAR(len, 5.0, 1e-9); /* chain of 4, all accepted */
    len = forced(engine, head, 4, 4, 1, 0.0, 3, 12);
    BT_ASSERT_NEAR(len, 1.0, 1e-9); /* only the bonus */
    len = forced(engine, head, 6, 6, 1, 0.5, 4, 40);
    want = 0.0;
    for (int j = 0; j <= 6; j++)
        want += pow(0.5, j);
    BT_ASSERT_NEAR(len, want, 0.25);
    /* a bushy tree: the best-scored child chain is at most depth deep */
    len = forced(engine, head, 16, 5, 4, 1.0, 2, 8);
    BT_CHECK(len >= 2.0 && len <= 6.0);

    sampler_params_init(&sp);
    BT_ASSERT_OK(sampler_create(&sp, 512, &smp));
    BT_CHECK(sampler_is_argmax(smp));
    sampler_destroy(&smp);
    sp.repetition_penalty = 1.1f;
    BT_ASSERT_OK(sampler_create(&sp, 512, &smp));
    BT_CHECK(!sampler_is_argmax(smp));
    sampler_destroy(&smp);
    sampler_params_init(&sp);
    sp.temperature = 0.7f;
    BT_ASSERT_OK(sampler_create(&sp, 512, &smp));
    BT_CHECK(!sampler_is_argmax(smp));
    sampler_destroy(&smp);

    spec_head_destroy(&head);
    engine_destroy(&engine);
    BT_TEST_PASS("spec force/argmax");
    return 0;
}
