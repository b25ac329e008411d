/*
 * spec_tree_impl.h - the EAGLE-2 draft tree's expansion and selection
 * steps as pure functions, compiled twice from this one text: by
 * spec_tree.c for the host path (SPEC_TREE_FN = static inline) and by
 * worker/cuda/kernels/draft.cu for the device draft loop
 * (SPEC_TREE_FN = static __device__ inline), so the device tree is the
 * host tree by construction (same float additions, same comparisons,
 * same order).  Include spec_tree.h (host) or define SPEC_TREE_FN and
 * spec_node_t first (device).
 *
 * Deterministic order ("before"): a node sorts before another when its
 * cumulative log-probability is larger, or equal with a lower node
 * index.  Node indices grow in creation order (level by level, frontier
 * order within a level, candidate order within a row), so ties go to the
 * older node: parents before their children, and within one row of
 * candidates (best first, ties to the lower token id) the better one.
 * Insertion sort: stable, no allocation; n is at most a few thousand.
 */
#ifndef SPEC_TREE_FN
#error "define SPEC_TREE_FN (and spec_node_t) before including spec_tree_impl.h"
#endif

/* True when node v sorts before node u (see the header comment). */
SPEC_TREE_FN int spec_tree_before(const spec_node_t *nodes, int v, int u)
{
    return nodes[v].score > nodes[u].score ||
           (nodes[v].score == nodes[u].score && v < u);
}

/* Orders node ids by spec_tree_before, best first. */
SPEC_TREE_FN void spec_tree_sort(const spec_node_t *nodes, int *ids, int n)
{
    for (int i = 1; i < n; i++) {
        int v = ids[i], j = i;

        while (j > 0) {
            int u = ids[j - 1];

            if (!spec_tree_before(nodes, v, u))
                break;
            ids[j] = u;
            j--;
        }
        ids[j] = v;
    }
}

/* Appends n_c candidates (ids best first, log-probs vals) as children of
 * `parent` (-1: the root) at `depth`, scores base + vals[j]. */
SPEC_TREE_FN void spec_tree_add(spec_node_t *nodes, int *n_nodes_p,
                                int parent, float base, int depth,
                                const int *ids, const float *vals, int n_c)
{
    for (int j = 0; j < n_c; j++) {
        spec_node_t *nd = &nodes[(*n_nodes_p)++];

        nd->token = ids[j];
        nd->parent = parent;
        nd->depth = depth;
        nd->score = base + vals[j];
        nd->feat = -1;
        nd->vidx = 0;
    }
}

/* Level 1: the root's n_c candidates become nodes 0..n_c-1 and the
 * whole first frontier (in that order).  Returns the frontier size. */
SPEC_TREE_FN int spec_tree_level1(spec_node_t *nodes, int *n_nodes_p,
                                  const int *ids, const float *vals, int n_c,
                                  int *front)
{
    *n_nodes_p = 0;
    spec_tree_add(nodes, n_nodes_p, -1, 0.0f, 1, ids, vals, n_c);
    for (int r = 0; r < n_c; r++)
        front[r] = r;
    return n_c;
}

/* Level d (d >= 1, children at depth d + 1): frontier node r (of
 * n_front) was run through the head as expanded node n_exp + r (its
 * `feat`) and got top_n[r] (NULL: k) candidates at ids/vals + r * k.
 * Appends every child, then the next frontier is the `width` best new
 * nodes (spec_tree_before), written to front.  cand: scratch of
 * n_front * k ints.  Returns the next frontier's size; the caller's
 * n_exp grows by n_front. */
SPEC_TREE_FN int spec_tree_expand(spec_node_t *nodes, int *n_nodes_p,
                                  int *front, int n_front, int n_exp,
                                  const int *ids, const float *vals,
                                  const int *top_n, int k, int d, int width,
                                  int *cand)
{
    int first_new = *n_nodes_p, n_cand, n_next;

    for (int r = 0; r < n_front; r++) {
        spec_node_t *nd = &nodes[front[r]];

        nd->feat = n_exp + r;
        spec_tree_add(nodes, n_nodes_p, front[r], nd->score, d + 1,
                      ids + (size_t)r * k, vals + (size_t)r * k,
                      top_n ? top_n[r] : k);
    }
    n_cand = *n_nodes_p - first_new;
    for (int c = 0; c < n_cand; c++)
        cand[c] = first_new + c;
    spec_tree_sort(nodes, cand, n_cand);
    n_next = n_cand < width ? n_cand : width;
    for (int r = 0; r < n_next; r++)
        front[r] = cand[r];
    return n_next;
}

/* Final selection: the `tokens` best nodes (a node whose parent is not
 * selected is skipped; with log-probs <= 0 a parent always sorts before
 * its children, so this never happens); order (n_nodes) gets the
 * selected ids best first in its first n_sel entries.  Selected nodes
 * get vidx 1..n_sel in node index order (the verification chunk's
 * order, parents first), the others 0.  Returns n_sel. */
SPEC_TREE_FN int spec_tree_select(spec_node_t *nodes, int n_nodes,
                                  int tokens, int *order)
{
    int n_sel = 0, t1 = 1;

    for (int i = 0; i < n_nodes; i++) {
        order[i] = i;
        nodes[i].vidx = 0;
    }
    spec_tree_sort(nodes, order, n_nodes);
    for (int i = 0; i < n_nodes && n_sel < tokens; i++) {
        spec_node_t *nd = &nodes[order[i]];

        if (nd->parent >= 0 && nodes[nd->parent].vidx == 0)
            continue;
        nd->vidx = -1; /* selected; numbered below */
        order[n_sel++] = order[i];
    }
    for (int i = 0; i < n_nodes; i++)
        if (nodes[i].vidx == -1)
            nodes[i].vidx = t1++;
    return n_sel;
}
