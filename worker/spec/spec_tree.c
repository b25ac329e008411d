/*
 * spec_tree.c - host entry points of the draft tree's pure steps
 * (spec_tree.h); the text is spec_tree_impl.h, which the device draft
 * loop compiles too.
 */
#include "spec_tree.h"

#define SPEC_TREE_FN static inline
#include "spec_tree_impl.h"

void spec_tree_sort_ids(const spec_node_t *nodes, int *ids, int n)
{
    spec_tree_sort(nodes, ids, n);
}

int spec_tree_first_level(spec_node_t *nodes, int *n_nodes_p,
                          const int *ids, const float *vals, int n_c,
                          int *front)
{
    return spec_tree_level1(nodes, n_nodes_p, ids, vals, n_c, front);
}

int spec_tree_next_level(spec_node_t *nodes, int *n_nodes_p, int *front,
                         int n_front, int n_exp, const int *ids,
                         const float *vals, const int *top_n, int k, int d,
                         int width, int *cand)
{
    return spec_tree_expand(nodes, n_nodes_p, front, n_front, n_exp, ids,
                            vals, top_n, k, d, width, cand);
}

int spec_tree_pick(spec_node_t *nodes, int n_nodes, int tokens, int *order)
{
    return spec_tree_select(nodes, n_nodes, tokens, order);
}
