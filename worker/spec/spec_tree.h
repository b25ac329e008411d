/*
 * spec_tree.h - the EAGLE-2 draft tree's pure steps (level expansion,
 * next frontier, final selection), shared by the host drafting path
 * (spec.c) and the device draft loop (cuda_draft.c, kernels/draft.cu
 * compile the same text, spec_tree_impl.h), so both build the same tree
 * bit for bit.  Deterministic tie-breaking: see spec_tree_impl.h.
 */
#ifndef BT_WORKER_SPEC_SPEC_TREE_H
#define BT_WORKER_SPEC_SPEC_TREE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One draft tree node (also the device loop's layout: plain ints and a
 * float, 24 bytes). */
typedef struct {
    int token;   /* drafted token id */
    int parent;  /* node index, -1 = the root (last committed token) */
    int depth;   /* 1 for the root's children */
    float score; /* cumulative draft log-probability */
    int feat;    /* expanded-node number (head output row), -1 */
    int vidx;    /* index in the verification chunk (1..), 0 = not sent */
} spec_node_t;

/* Host entry points (spec_tree.c): see spec_tree_impl.h. */
void spec_tree_sort_ids(const spec_node_t *nodes, int *ids, int n);
int spec_tree_first_level(spec_node_t *nodes, int *n_nodes_p,
                          const int *ids, const float *vals, int n_c,
                          int *front);
int spec_tree_next_level(spec_node_t *nodes, int *n_nodes_p, int *front,
                         int n_front, int n_exp, const int *ids,
                         const float *vals, const int *top_n, int k, int d,
                         int width, int *cand);
int spec_tree_pick(spec_node_t *nodes, int n_nodes, int tokens, int *order);

#ifdef __cplusplus
}
#endif
#endif /* BT_WORKER_SPEC_SPEC_TREE_H */
