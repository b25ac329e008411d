/* test_spec_plain.c - "never slower than plain": when speculation is off,
 * a spec_step costs what engine_step costs (cpu backend, stories260K):
 *   - fixed plain (spec_set_fixed 0): one backend forward per step, no
 *     hidden rows, no logits rows brought to the host, no draft-head
 *     rows, and the same greedy tokens as engine_step (batch of 3, mixed
 *     prompt lengths);
 *   - the adaptive controller with an untrained head (speculation never
 *     pays): a plain step fetches hidden rows only right before a
 *     speculative try (the root feature of its first tree), feeds the head
 *     nothing, and trees stay a small share of the steps; output = plain. */
#include <stdlib.h>
#include <string.h>

#include "bt_test.h"
#include "engine.h"
#include "sampler.h"
#include "spec/spec.h"
#include "spec_test_util.h"

#define N_SEQ 3
#define GEN 120

static void make_prompt(int i, int *p, int *n)
{
    *n = 2 + 3 * i;
    p[0] = 1;
    for (int j = 1; j < *n; j++)
        p[j] = 300 + 11 * i + 7 * j;
}

/* Greedy ids of sequence i with engine_step (batch of N_SEQ). */
static void plain_run(engine_t *engine, int want[N_SEQ][GEN + 16])
{
    engine_seq_t *seqs[N_SEQ];
    sampler_params_t sp;
    int p[16], np, out[N_SEQ];

    sampler_params_init(&sp);
    for (int i = 0; i < N_SEQ; i++) {
        make_prompt(i, p, &np);
        BT_ASSERT_OK(engine_seq_create(engine, p, np, &sp, &seqs[i]));
    }
    for (;;) {
        bool more = false;

        for (int i = 0; i < N_SEQ; i++)
            more |= engine_seq_n_generated(seqs[i]) < GEN;
        if (!more)
            break;
        BT_ASSERT_OK(engine_step(engine, seqs, N_SEQ, 0, out));
    }
    for (int i = 0; i < N_SEQ; i++) {
        memcpy(want[i], engine_seq_tokens(seqs[i]) +
                            engine_seq_prompt_len(seqs[i]),
               sizeof(int) * GEN);
        engine_seq_destroy(engine, &seqs[i]);
    }
}

/* Decodes with spec; checks the tokens and the per-step work. */
static void spec_run(engine_t *engine, spec_head_t *head, bool fixed_plain,
                     int want[N_SEQ][GEN + 16])
{
    spec_config_t scfg;
    spec_t *spec = NULL;
    engine_seq_t *seqs[N_SEQ];
    spec_seq_t *ss[N_SEQ];
    sampler_params_t sp;
    int p[16], np, n_out[N_SEQ], out[N_SEQ * (SPEC_MAX_DEPTH + 2)];
    spec_stats_t prev, cur;
    int steps = 0, tree_steps = 0, warm_plain = 0, bad = 0;
    bool prev_plain_hidden = false;

    spec_config_init(&scfg);
    BT_ASSERT_OK(spec_create(engine, head, &scfg, &spec));
    if (fixed_plain)
        spec_set_fixed(spec, 0, 1, 1);
    sampler_params_init(&sp);
    for (int i = 0; i < N_SEQ; i++) {
        make_prompt(i, p, &np);
        BT_ASSERT_OK(engine_seq_create(engine, p, np, &sp, &seqs[i]));
        BT_ASSERT_OK(spec_seq_create(spec, seqs[i], &ss[i]));
    }
    spec_get_stats(spec, &prev);
    for (;;) {
        bool more = false, tree;

        for (int i = 0; i < N_SEQ; i++)
            more |= engine_seq_n_generated(seqs[i]) < GEN;
        if (!more)
            break;
        BT_ASSERT_OK(spec_step(spec, ss, N_SEQ, n_out, out));
        spec_get_stats(spec, &cur);
        steps++;
        tree = cur.verify_seqs > prev.verify_seqs;
        BT_CHECK(cur.fwd_calls == prev.fwd_calls + 1);
        if (prev_plain_hidden && !tree)
            bad++; /* hidden rows fetched, and no tree followed */
        prev_plain_hidden = false;
        if (!tree) {
            /* plain work: no head rows, no logits rows to the host */
            BT_CHECK(cur.head_rows == prev.head_rows);
            BT_CHECK(cur.logits_rows == prev.logits_rows);
            if (cur.hidden_rows > prev.hidden_rows) {
                prev_plain_hidden = true;
                warm_plain++;
            }
        } else {
            tree_steps++;
        }
        prev = cur;
    }
    if (fixed_plain) {
        BT_CHECK(cur.hidden_rows == 0 && cur.head_rows == 0 &&
                 cur.logits_rows == 0 && tree_steps == 0 && warm_plain == 0);
    } else {
        printf("adaptive, untrained head: %d steps, %d with trees, %d plain "
               "steps fetching hidden rows, head rows %llu\n", steps,
               tree_steps, warm_plain, (unsigned long long)cur.head_rows);
        BT_CHECK(bad == 0);
        BT_CHECK(tree_steps * 4 <= steps);
    }
    for (int i = 0; i < N_SEQ; i++) {
        const int *got = engine_seq_tokens(seqs[i]) +
                         engine_seq_prompt_len(seqs[i]);

        BT_CHECK(memcmp(got, want[i], sizeof(int) * GEN) == 0);
        spec_seq_destroy(&ss[i]);
        engine_seq_destroy(engine, &seqs[i]);
    }
    spec_destroy(&spec);
}

int main(void)
{
    engine_t *engine = spec_test_cpu_engine(1024);
    spec_head_t *head = NULL;
    static int want[N_SEQ][GEN + 16];

    BT_ASSERT_OK(spec_head_create(engine_model(engine), 0, 5, &head));
    plain_run(engine, want);
    spec_run(engine, head, true, want);
    spec_run(engine, head, false, want);
    spec_head_destroy(&head);
    engine_destroy(&engine);
    printf("test_spec_plain: all passed\n");
    return 0;
}
