/* test_cpu_golden.c - greedy decoding with the cpu backend reproduces
 * every greedy_ids line of shared/models/golden.jsonl (made by llama2.c's
 * run.c), on the llama2.c .bin files and on their -hf conversions.
 *
 * llama2.c semantics: positions 0..steps-1; prompt tokens are forced, the
 * argmax is taken from the last prompt position on; generation stops when
 * the next token is 1 (BOS).  The prompt goes in as one prefill chunk,
 * then one decode step per token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bt_alloc.h"
#include "bt_golden.h"
#include "bt_test.h"
#include "bt_util.h"

int main(void)
{
    bt_golden_t *g;
    int lines, checked = 0;
    size_t before = bt_alloc_live_count();

    lines = bt_golden_read(&g);
    for (int l = 0; l < lines; l++) {
        const char *name = g[l].model;

        for (int variant = 0; variant < 2; variant++) {
            char path[512];
            model_t *m = NULL;
            backend_t *be = NULL;
            backend_config_t cfg;
            int *got = malloc(sizeof(int) * (size_t)(g[l].steps + 1));
            int table[64], n_got;

            /* "x.bin" or its Hugging Face conversion "x-hf" */
            snprintf(path, sizeof(path), "%s/models/%.*s%s",
                     bt_golden_shared_dir(),
                     (int)strlen(name) - (variant ? 4 : 0), name,
                     variant ? "-hf" : "");
            BT_ASSERT_OK(model_load(path, &m));
            backend_config_init(&cfg);
            cfg.n_kv_blocks = 64;
            cfg.block_size = 8;
            cfg.max_batch_tokens = 512;
            cfg.n_threads = 1 + (l + variant) % 2;
            BT_ASSERT_OK(backend_create("cpu", m, &cfg, &be));
            bt_golden_reversed(table, 64);
            BT_CHECK(g[l].steps <= 64 * cfg.block_size);
            n_got = bt_golden_greedy(be, model_config(m)->vocab_size,
                                     g[l].prompt, g[l].n_prompt, 0,
                                     g[l].steps, table, got, NULL);
            for (int i = 0; i < g[l].n_want && i < n_got; i++)
                if (got[i] != g[l].want[i])
                    BT_TEST_FAIL("%s line %d: id %d is %d, golden %d", path,
                                 l, i, got[i], g[l].want[i]);
            BT_ASSERT_EQ(n_got, g[l].n_want);
            checked++;
            backend_destroy(&be);
            model_destroy(&m);
            free(got);
        }
    }
    bt_golden_free(g, lines);
    BT_CHECK(lines >= 2);
    fprintf(stderr, "golden: %d lines, %d model runs\n", lines, checked);
    BT_ASSERT_EQ(bt_alloc_live_count(), before);
    BT_TEST_PASS("golden");
    return 0;
}
