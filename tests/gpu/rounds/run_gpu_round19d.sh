#!/bin/bash
# run_gpu_round19d.sh [CARRY] - round 19 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4: the whole-row sampler (cuda_sample_dist) as one
# thread-block cluster a row (16 blocks at a 128K vocabulary; round 13:
# one block, 557 us a row).  (1) test_sample_dist at the default cluster
# size and capped at 8, 2 and 1 (BT_SAMPLE_DIST_CLUSTER),
# test_cuda_sample, test_sample, and test_attn / test_cuda_model on the
# landing code; (2) test_sample_dist --bench at 16 / 8 / 1; (3)
# bench_cuda b1 / b8 / b64 @2k, every column (+top-p is the step with
# top-p sampling), cluster default vs 1, two interleaved rounds.
# Carry: gpu/{test_sample_dist, test_cuda_sample, test_sample,
# test_attn, test_cuda_model, bench_cuda}, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r19d "${1:-build-r19d}"
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 19d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail sd_def sd_c8 sd_c1 cuda_sample cuda_model sd_c2 test_attn 2>/dev/null
    for v in def c1; do
      echo "### bench $v"; grep -E "^bench sample_dist" "$tmp/sdb_$v" 2>/dev/null
    done
    bc_cols cl1 one1
  } > "$table"
}
run sd_def 60 "$c/gpu/test_sample_dist"
run sdb_def 40 "$c/gpu/test_sample_dist" --bench
run sdb_c1 40 env BT_SAMPLE_DIST_CLUSTER=1 "$c/gpu/test_sample_dist" --bench
report
run sd_c8 60 env BT_SAMPLE_DIST_CLUSTER=8 "$c/gpu/test_sample_dist"
run sd_c1 60 env BT_SAMPLE_DIST_CLUSTER=1 "$c/gpu/test_sample_dist"
run cuda_sample 60 "$c/gpu/test_cuda_sample"
run cuda_model 60 "$c/gpu/test_cuda_model"
report
bc cl1 BT_LOG=WARN -- --batch 1,64 --ctx 2048 --prefill 0
bc one1 BT_SAMPLE_DIST_CLUSTER=1 -- --batch 1,64 --ctx 2048 --prefill 0
report
run sd_c2 60 env BT_SAMPLE_DIST_CLUSTER=2 "$c/gpu/test_sample_dist"
run test_attn 120 "$c/gpu/test_attn"
report
cat "$table"
