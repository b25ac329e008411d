#!/bin/bash
# run_gpu_round21b.sh [CARRY] - round 21 (2026-12-03), ON THE DEVICE
# MACHINE, issue 4.  (1) test_gemm --cache (the BT_GEMM_CACHE rounds,
# fixed expectation) and test_attn under BT_ATTN_PF=2; (2) the decode
# attention's L2 prefetch past its cp.async window (BT_ATTN_PF=D):
# bench_kernels --dec-only 64:2048 and 64:8192 at D = 0..3, interleaved;
# (3) the engine at b1 / b64 @2k, PF 0 / 1 / 2 interleaved, three rounds,
# every run on one BT_GEMM_CACHE file (the same GEMM picks in every run:
# the first A/B this cache makes possible); (4) the tuner with 16
# cuBLASLt candidates (BT_GEMM_LT_CANDS=16, its own cache file) against
# the default 4 at b64.  Carry: gpu/test_gemm gpu/test_attn
# gpu/bench_kernels gpu/bench_cuda, lib/, shared.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r21b "${1:-build-r21b}"
export BT_SHARED_DIR=$PWD/$c/shared
gc=$tmp/gc.txt
report() {
  {
    echo "## round 21b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail gcache attn 2>/dev/null
    echo '```'
    grep -h "^attn decode" "$tmp"/dec_* 2>/dev/null
    echo '```'
    for v in 0 1 2; do echo "PF=$v: $(bc_steps pf${v}_1 pf${v}_2 pf${v}_3)"; done
    echo "cands 4: $(bc_steps c4_1 c4_2)"
    echo "cands 16: $(bc_steps c16_1 c16_2)"
    grep -h "gemm tune t=64 " "$tmp/bc_c16_1" 2>/dev/null | cut -c40-260
  } > "$table"
}
run gcache 120 "$c/gpu/test_gemm" --cache
run attn 200 env BT_ATTN_PF=2 "$c/gpu/test_attn"
report
for r in 1 2; do
  for d in 0 1 2 3; do
    for cx in 2048 8192; do
      run dec_${cx}_${d}_$r 60 env BT_ATTN_PF=$d "$c/gpu/bench_kernels" \
        --dec-only 64:$cx --reps 20
      sed -i "s/^attn decode/attn decode PF=$d r$r/" "$tmp/dec_${cx}_${d}_$r"
    done
  done
done
report
# warm the cache file once (tunes every family), then the A/B on it
bc warm BT_GEMM_CACHE=$gc -- --batch 1 --ctx 512 --prefill 2048
for r in 1 2 3; do
  for v in 0 1 2; do
    bc pf${v}_$r BT_GEMM_CACHE=$gc BT_ATTN_PF=$v -- --batch 1,64 --ctx 2048
  done
done
report
bc c16_1 BT_LOG=INFO BT_GEMM_LT_CANDS=16 BT_GEMM_CACHE=$tmp/gc16.txt -- --batch 64 --ctx 2048
bc c4_1 BT_GEMM_CACHE=$gc -- --batch 64 --ctx 2048
bc c16_2 BT_GEMM_LT_CANDS=16 BT_GEMM_CACHE=$tmp/gc16.txt -- --batch 64 --ctx 2048
bc c4_2 BT_GEMM_CACHE=$gc -- --batch 64 --ctx 2048
report
cat "$table"
