#!/bin/bash
# run_gpu_round18g.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: (1) test_attn with the decode attention's O rescale
# skipped when no row's max moved (attn_decode_tc.cuh tc_attend16: a warp
# vote, bit-identical); (2) A/B against the landing binary (bench_cuda_b,
# AB_FROM=build-r18c), three interleaved rounds at b1 / 8 / 64 @2k and
# b64 @8k; (3) power / SM-clock sampling (smi_phase) over test_attn --bench
# and back-to-back 2048-token prefills.  Carry: gpu/{bench_cuda,
# bench_cuda_b,test_attn}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18g "${1:-build-r18g}"
report() {
  {
    echo "## round 18g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail test_attn 2>/dev/null
    for v in new old; do
      echo "### $v: b1@2k b8@2k b64@2k / b64@8k step ms"
      for i in 1 2 3; do
        bc_steps "$v$i" "${v}8k$i"
      done
    done
    cat "$tmp/summary" 2>/dev/null
    grep -E "^prefill attn fa2pp" "$tmp/attn" 2>/dev/null
    grep -E "^\| prefill " "$tmp/prefill" 2>/dev/null
  } > "$table"
}
run test_attn 150 "$c/gpu/test_attn"
report
for i in 1 2 3; do
  bc new$i BT_X=1 -- --batch 1,8,64 --ctx 2048 --prefill 0
  bcb old$i --batch 1,8,64 --ctx 2048 --prefill 0
  bc new8k$i BT_X=1 -- --batch 64 --ctx 8192 --prefill 0
  bcb old8k$i --batch 64 --ctx 8192 --prefill 0
  report
done
smi_phase attn "$c/gpu/test_attn" --bench
smi_phase prefill env BT_X=1 "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1 --ctx 512 --steps 5 --prefill 2048,2048,2048,2048,8192
report
cat "$table"
