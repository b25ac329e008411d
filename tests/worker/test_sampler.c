/* test_sampler.c - greedy, seeded sampling, truncation and penalties. */
#include <math.h>

#include "bt_alloc.h"
#include "bt_log.h"
#include "bt_test.h"
#include "sampler.h"

#define V 6

static void draw_counts(const sampler_params_t *p, const float *logits,
                        int n, int *counts)
{
    sampler_t *s;
    float row[V];

    BT_ASSERT_OK(sampler_create(p, V, &s));
    for (int i = 0; i < V; i++)
        counts[i] = 0;
    for (int i = 0; i < n; i++) {
        memcpy(row, logits, sizeof(row));
        counts[sampler_sample(s, row)]++;
    }
    sampler_destroy(&s);
}

int main(void)
{
    /* probs of softmax(logits) are 0.5, 0.25, 0.125, 0.0625, 0.0625, 0 */
    const float logits[V] = { logf(8), logf(4), logf(2), logf(1), logf(1),
                              -1e30f };
    sampler_params_t p;
    sampler_t *s, *s2;
    int counts[V];
    float row[V], probs[V];
    size_t live = bt_alloc_live_count();

    bt_log_set_level(BT_LOG_LEVEL_FATAL);

    /* Greedy: argmax, lowest id wins ties. */
    sampler_params_init(&p);
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    memcpy(row, logits, sizeof(row));
    BT_ASSERT_EQ(sampler_sample(s, row), 0);
    {
        float tie[V] = { 1, 3, 3, 0, 0, 0 };
        BT_ASSERT_EQ(sampler_sample(s, tie), 1);
    }
    sampler_probs(s, logits, probs);
    BT_ASSERT_NEAR(probs[0], 1.0, 0);
    sampler_destroy(&s);

    /* Temperature 1: frequencies follow the softmax. */
    p.temperature = 1.0f;
    p.seed = 7;
    draw_counts(&p, logits, 40000, counts);
    BT_ASSERT_NEAR(counts[0] / 40000.0, 0.5, 0.015);
    BT_ASSERT_NEAR(counts[1] / 40000.0, 0.25, 0.015);
    BT_ASSERT_NEAR(counts[3] / 40000.0, 0.0625, 0.01);
    BT_ASSERT_EQ(counts[5], 0);

    /* Same seed, same stream; another seed, another stream. */
    {
        int a[64], b[64], c[64], same = 1, diff = 0;
        sampler_params_t q = p;
        BT_ASSERT_OK(sampler_create(&p, V, &s));
        BT_ASSERT_OK(sampler_create(&p, V, &s2));
        for (int i = 0; i < 64; i++) {
            memcpy(row, logits, sizeof(row));
            a[i] = sampler_sample(s, row);
            memcpy(row, logits, sizeof(row));
            b[i] = sampler_sample(s2, row);
            same &= a[i] == b[i];
        }
        sampler_destroy(&s);
        sampler_destroy(&s2);
        BT_CHECK(same);
        q.seed = 8;
        BT_ASSERT_OK(sampler_create(&q, V, &s));
        for (int i = 0; i < 64; i++) {
            memcpy(row, logits, sizeof(row));
            c[i] = sampler_sample(s, row);
            diff += c[i] != a[i];
        }
        sampler_destroy(&s);
        BT_CHECK(diff > 10);
    }

    /* top-k 2: only the two best appear, renormalised 2:1. */
    p.top_k = 2;
    draw_counts(&p, logits, 30000, counts);
    BT_ASSERT_EQ(counts[2] + counts[3] + counts[4] + counts[5], 0);
    BT_ASSERT_NEAR(counts[0] / 30000.0, 2.0 / 3.0, 0.015);
    p.top_k = 1;
    draw_counts(&p, logits, 1000, counts);
    BT_ASSERT_EQ(counts[0], 1000);
    p.top_k = 0;

    /* top-p 0.7: nucleus is {0, 1} (0.5 + 0.25 >= 0.7). */
    p.top_p = 0.7f;
    draw_counts(&p, logits, 30000, counts);
    BT_ASSERT_EQ(counts[2] + counts[3] + counts[4], 0);
    BT_ASSERT_NEAR(counts[1] / 30000.0, 1.0 / 3.0, 0.015);
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    sampler_probs(s, logits, probs);
    BT_ASSERT_NEAR(probs[0] + probs[1], 1.0, 1e-6);
    BT_ASSERT_NEAR(probs[0], 2.0 / 3.0, 1e-6);
    sampler_destroy(&s);
    p.top_p = 1.0f;

    /* min-p 0.2: keeps p >= 0.1 -> tokens 0, 1, 2. */
    p.min_p = 0.2f;
    draw_counts(&p, logits, 30000, counts);
    BT_ASSERT_EQ(counts[3] + counts[4] + counts[5], 0);
    BT_CHECK(counts[2] > 0);
    p.min_p = 0.0f;

    /* Low temperature sharpens towards argmax. */
    p.temperature = 0.05f;
    draw_counts(&p, logits, 2000, counts);
    BT_CHECK(counts[0] > 1990);
    p.temperature = 0.0f;

    /* Repetition penalty: seen token 0 (positive logit) divided by 10
     * loses the argmax to token 1. */
    p.repetition_penalty = 10.0f;
    BT_ASSERT_OK(sampler_create(&p, V, &s));
    memcpy(row, logits, sizeof(row));
    BT_ASSERT_EQ(sampler_sample(s, row), 0);
    sampler_observe(s, 0);
    memcpy(row, logits, sizeof(row));
    BT_ASSERT_EQ(sampler_sample(s, row), 1);
    sampler_destroy(&s);
    p.repetition_penalty = 1.0f;

    /* Frequency penalty grows with the count; presence is flat.  Observe
     * many distinct tokens to exercise the table growth. */
    p.frequency_penalty = 0.4f;
    BT_ASSERT_OK(sampler_create(&p, 1000, &s));
    {
        float big[1000];
        for (int i = 0; i < 1000; i++)
            big[i] = 0.0f;
        big[10] = 1.0f;
        big[11] = 0.5f;
        for (int i = 100; i < 900; i++)
            sampler_observe(s, i);
        sampler_observe(s, 10);
        BT_ASSERT_EQ(sampler_sample(s, big), 10); /* 1.0 - 0.4 > 0.5 */
        sampler_observe(s, 10);
        big[10] = 1.0f;
        BT_ASSERT_EQ(sampler_sample(s, big), 11); /* 1.0 - 0.8 < 0.5 */
    }
    sampler_destroy(&s);
    p.frequency_penalty = 0.0f;

    /* Invalid parameters are refused with BT_ERR_INVALID_ARG. */
    {
        sampler_params_t bad;
        sampler_params_init(&bad); bad.temperature = -1;
        BT_ASSERT_EQ(sampler_create(&bad, V, &s), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.temperature = NAN;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.top_p = 0;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.top_p = 1.5f;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.top_k = -3;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.min_p = 2;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.repetition_penalty = 0;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
        sampler_params_init(&bad); bad.presence_penalty = 3;
        BT_ASSERT_EQ(sampler_params_validate(&bad), BT_ERR_INVALID_ARG);
    }
    BT_ASSERT_EQ(bt_alloc_live_count(), live);
    BT_TEST_PASS("worker/sampler");
    return 0;
}
