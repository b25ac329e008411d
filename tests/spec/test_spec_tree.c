/*
 * test_spec_tree.c - the draft tree's pure steps (spec_tree.h), which the
 * host drafting path and the device draft loop share, against the code
 * spec.c ran before they were factored out (copied below as the
 * reference: spec_add_children, spec_sort_by_score, the level loop and
 * spec_tree_layout's selection), on random trees with many score ties.
 * Every node (token, parent, depth, score bits, feat, vidx), every
 * frontier and the selection order must be identical.
 */
#include <stdint.h>
#include <string.h>

#include "bt_test.h"
#include "spec/spec_tree.h"

#define MAX_DEPTH 8
#define MAX_K 8
#define MAX_NODES (MAX_K + (MAX_DEPTH - 1) * MAX_K * MAX_K)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* One row of k candidates as a top-k gives them: log-probs descending,
 * ties to the lower token id.  Coarse values make ties common. */
static void rand_row(int k, int vocab, int coarse, int *ids, float *vals)
{
    for (int j = 0; j < k; j++) {
        vals[j] = coarse ? -(float)(rnd() % 4) * 0.5f
                         : -(float)(rnd() % 100000) * 1e-4f;
        ids[j] = (int)(rnd() % (uint32_t)vocab);
    }
    /* sort (value desc, id asc); ids may repeat across rows, not within
     * a row: make them distinct by index */
    for (int j = 0; j < k; j++)
        ids[j] = (ids[j] / k) * k + j;
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0; j--) {
            int sw = vals[j] > vals[j - 1] ||
                     (vals[j] == vals[j - 1] && ids[j] < ids[j - 1]);
            if (!sw)
                break;
            float tv = vals[j];
            int ti = ids[j];
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            vals[j - 1] = tv;
            ids[j - 1] = ti;
        }
}

// --------------------------------------------------------------------
// reference: spec.c before the refactor

typedef struct {
    int token, parent, depth;
    float score;
    int feat, vidx;
} ref_node_t;

static void ref_add_children(ref_node_t *nodes, int *n_nodes, int parent,
                             float base, int depth, const int *ids,
                             const float *vals, int n)
{
    for (int j = 0; j < n; j++) {
        ref_node_t *nd = &nodes[(*n_nodes)++];

        *nd = (ref_node_t){ ids[j], parent, depth, base + vals[j], -1, 0 };
    }
}

static void ref_sort_by_score(const ref_node_t *nodes, int *ids, int n)
{
    for (int i = 1; i < n; i++) {
        int v = ids[i], j = i;

        while (j > 0) {
            int u = ids[j - 1];
            int before = nodes[v].score > nodes[u].score ||
                         (nodes[v].score == nodes[u].score && v < u);
            if (!before)
                break;
            ids[j] = u;
            j--;
        }
        ids[j] = v;
    }
}

static int ref_select(ref_node_t *nodes, int n_nodes, int tokens,
                      int *order)
{
    int n_sel = 0, t1 = 1;

    for (int i = 0; i < n_nodes; i++)
        order[i] = i;
    ref_sort_by_score(nodes, order, n_nodes);
    for (int i = 0; i < n_nodes && n_sel < tokens; i++) {
        ref_node_t *nd = &nodes[order[i]];

        if (nd->parent >= 0 && nodes[nd->parent].vidx == 0)
            continue;
        nd->vidx = -1;
        order[n_sel++] = order[i];
    }
    for (int i = 0; i < n_nodes; i++) {
        if (nodes[i].vidx != -1)
            continue;
        nodes[i].vidx = t1++;
    }
    return n_sel;
}

// --------------------------------------------------------------------

static void check_nodes(const ref_node_t *r, const spec_node_t *s, int n)
{
    for (int i = 0; i < n; i++) {
        BT_ASSERT_EQ(r[i].token, s[i].token);
        BT_ASSERT_EQ(r[i].parent, s[i].parent);
        BT_ASSERT_EQ(r[i].depth, s[i].depth);
        BT_CHECK(memcmp(&r[i].score, &s[i].score, sizeof(float)) == 0);
        BT_ASSERT_EQ(r[i].feat, s[i].feat);
        BT_ASSERT_EQ(r[i].vidx, s[i].vidx);
    }
}

static void one_tree(int depth, int k, int tokens, int coarse)
{
    static ref_node_t rn[MAX_NODES];
    static spec_node_t sn[MAX_NODES];
    static int ids[MAX_K * MAX_K], rorder[MAX_NODES], sorder[MAX_NODES];
    static float vals[MAX_K * MAX_K];
    int rfront[MAX_K], sfront[MAX_K], cand[MAX_K * MAX_K];
    int top_n[MAX_K];
    int rn_n = 0, sn_n = 0, rn_front, sn_front, n_exp = 0;
    int vocab = 50 + (int)(rnd() % 1000);

    /* level 1 */
    rand_row(k, vocab, coarse, ids, vals);
    ref_add_children(rn, &rn_n, -1, 0.0f, 1, ids, vals, k);
    rn_front = rn_n;
    for (int r = 0; r < rn_front; r++)
        rfront[r] = r;
    sn_front = spec_tree_first_level(sn, &sn_n, ids, vals, k, sfront);
    BT_ASSERT_EQ(rn_front, sn_front);
    BT_ASSERT_EQ(rn_n, sn_n);
    for (int d = 1; d < depth; d++) {
        int first_new = rn_n, n_cand, rcand[MAX_K * MAX_K];

        for (int r = 0; r < rn_front; r++) {
            rand_row(k, vocab, coarse, ids + r * k, vals + r * k);
            top_n[r] = k;
        }
        /* reference level */
        for (int r = 0; r < rn_front; r++) {
            ref_node_t *nd = &rn[rfront[r]];

            nd->feat = n_exp + r;
            ref_add_children(rn, &rn_n, rfront[r], nd->score, d + 1,
                             ids + r * k, vals + r * k, k);
        }
        n_cand = rn_n - first_new;
        for (int c = 0; c < n_cand; c++)
            rcand[c] = first_new + c;
        ref_sort_by_score(rn, rcand, n_cand);
        /* shared step (half the time without top_n: same thing) */
        sn_front = spec_tree_next_level(sn, &sn_n, sfront, sn_front, n_exp,
                                        ids, vals, (rnd() & 1) ? top_n
                                                               : NULL,
                                        k, d, k, cand);
        n_exp += rn_front;
        rn_front = n_cand < k ? n_cand : k;
        memcpy(rfront, rcand, sizeof(int) * (size_t)rn_front);
        BT_ASSERT_EQ(rn_front, sn_front);
        BT_ASSERT_EQ(rn_n, sn_n);
        for (int r = 0; r < rn_front; r++)
            BT_ASSERT_EQ(rfront[r], sfront[r]);
    }
    BT_ASSERT_EQ(ref_select(rn, rn_n, tokens, rorder),
                 spec_tree_pick(sn, sn_n, tokens, sorder));
    check_nodes(rn, sn, rn_n);
    for (int i = 0; i < tokens && i < rn_n; i++)
        BT_ASSERT_EQ(rorder[i], sorder[i]);
}

int main(void)
{
    int trees = 0;

    for (int it = 0; it < 3000; it++) {
        int depth = 1 + (int)(rnd() % MAX_DEPTH);
        int k = 1 + (int)(rnd() % MAX_K);
        int tokens = 1 + (int)(rnd() % 64);

        one_tree(depth, k, tokens, (int)(it & 1));
        trees++;
    }
    /* the H200 benchmark's shape: depth 5, top-4, 16 tokens */
    for (int it = 0; it < 500; it++)
        one_tree(5, 4, 16, (int)(it & 1));
    fprintf(stderr, "%d random trees identical\n", trees + 500);
    BT_TEST_PASS("spec_tree");
    return 0;
}
