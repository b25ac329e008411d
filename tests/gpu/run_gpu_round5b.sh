#!/bin/bash
# run_gpu_round5b.sh [CARRY] - second device call of 2026-12-01 (issues
# 4, 6 and device sampling), ON THE DEVICE MACHINE from a carried build:
#   checks: test_attn (fa2 default, staged split combine), test_sample_dist
#   (+ --bench: the device whole-row sampler), test_cuda_sample (exact
#   paths), test_spec_cuda;
#   bench_cuda synth:llama3-8b defaults (decode 1/8/64 x 512/2048, b1 @8k,
#   prefill 2048), A/B at batch 1 @2k: BT_ATTN_COMBINE=0 (old combine),
#   BT_ATTN_SPLIT=256 / 2048, BT_PDL=0;
#   EAGLE on the 8B shape (forced acceptance 0.8) and the tiny models.
# CARRY: gpu/ test binaries, bin/baton, lib/, shared/{models,heads}.
# Writes $OUT/r5b.log and $OUT/r5b_table.md (printed last).  ~5 minutes.
set -u
c=${1:-build-c3}
out=${OUT:-/tmp/baton-r5b}
mkdir -p "$out"
log=$out/r5b.log
table=$out/r5b_table.md
: > "$log"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_LOG=${BT_LOG:-WARN} BT_SHARED_DIR=$PWD/$c/shared BT_SPEC_HEADS=$PWD/$c/shared/heads
t0=$(date +%s)
tmp=$(mktemp -d)
run() { # name timeout cmd...
  local name=$1 tmo=$2; shift 2
  echo "=== $name: $*  (t=$(( $(date +%s) - t0 )) s)" >> "$log"
  timeout -k 5 "$tmo" "$@" > "$tmp/$name" 2>&1
  local rc=$?
  cat "$tmp/$name" >> "$log"
  echo "=== $name rc=$rc" >> "$log"
  echo "$name rc=$rc" >> "$tmp/rcs"
}
run test_attn 120 "$c/gpu/test_attn"
run test_sample_dist 90 "$c/gpu/test_sample_dist"
run sample_dist_bench 60 "$c/gpu/test_sample_dist" --bench
run test_cuda_sample 120 "$c/gpu/test_cuda_sample" 150
run test_spec_cuda 150 "$c/gpu/test_spec_cuda"
bc() { # name env... -- args
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run "bc_$name" 90 env "${envs[@]}" "$c/gpu/bench_cuda" --model synth:llama3-8b \
    --steps 20 --table "$tmp/t_$name" "$@"
}
bc default BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 2048
bc ctx8k BT_X=1 -- --batch 1,8 --ctx 8192 --prefill 0
bc comb0 BT_ATTN_COMBINE=0 -- --batch 1 --ctx 2048 --prefill 0
bc split256 BT_ATTN_SPLIT=256 -- --batch 1 --ctx 2048 --prefill 0
bc split2048 BT_ATTN_SPLIT=2048 -- --batch 1 --ctx 2048 --prefill 0
bc pdl0 BT_PDL=0 -- --batch 1,64 --ctx 2048 --prefill 0
run spec8b 100 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,8,32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8,16
M=$c/shared/models H=$c/shared/heads
for m in aidreams260K stories260K; do
  run "eagle_${m}_b1" 60 "$c/bin/baton" eagle bench --device cuda --target "$M/$m.bin" \
    --head "$H/$m.bin.head.safetensors" --batch 1 --rounds 20
  run "eagle_${m}_b1_fixed" 60 "$c/bin/baton" eagle bench --device cuda --target "$M/$m.bin" \
    --head "$H/$m.bin.head.safetensors" --batch 1 --rounds 20 --spec-fixed
done
{
  echo "## round 5b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for t in test_attn test_sample_dist test_cuda_sample test_spec_cuda; do
    echo "$t: $(grep -c '^PASS' "$tmp/$t") PASS, $(grep -c '^FAIL' "$tmp/$t") FAIL"
    grep '^FAIL' "$tmp/$t" | head -5
  done
  echo '```'; grep -iE "us|ms|bench" "$tmp/sample_dist_bench" | tail -8; echo '```'
  for f in default ctx8k comb0 split256 split2048 pdl0; do echo "### $f"; grep -E "^\| (decode|prefill) " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f2-6,9-10; done
  echo '```'; grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec8b"
  for m in aidreams260K stories260K; do for v in b1 b1_fixed; do echo "$m $v: $(grep '^batch:' "$tmp/eagle_${m}_$v")"; done; done
  echo '```'
} > "$table"
cat "$table"
