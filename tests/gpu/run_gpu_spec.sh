#!/bin/bash
# run_gpu_spec.sh [CARRY_DIR] - speculative decoding (issue 6) ON THE
# DEVICE MACHINE, from a folder packed here by tests/gpu/pack_gpu_spec.sh
# (default build-specgpu-carry: bin/baton, gpu/test_*, lib/ for the
# libraries the device lacks, shared/models + shared/heads with heads
# trained here by `baton eagle train`).  Nothing is rebuilt.
#   1. checks: test_kv_copy (slot-copy kernel vs CPU reference) and
#      test_spec_cuda (device draft head vs host head, hidden rows and
#      device verification, greedy spec = golden (f32) / = plain (bf16));
#   2. tiny models, trained heads: `baton eagle bench --device cuda`
#      plain vs speculative tokens/s and accepted length, batch 1/8/32
#      (adaptive controller; batch 1 also with the fixed full tree);
#   3. synth:llama3-8b (bf16): `baton bench-engine --spec-accept-rate`
#      (synthetic confident head, FORCED acceptance 0.8 per level) at
#      batch 1/8/32/64 and trees of 4/8/16 tokens: verification cost per
#      tree size.
# Budget: about 3-4 minutes.  Writes spec_gpu.log and spec_gpu_table.md
# under $OUT (else /tmp/baton-gpu-spec); prints the table last.
set -u
carry=${1:-build-specgpu-carry}
out=${OUT:-/tmp/baton-gpu-spec}
mkdir -p "$out"
log=$out/spec_gpu.log
table=$out/spec_gpu_table.md
: > "$log"
export LD_LIBRARY_PATH=$PWD/$carry/lib:${LD_LIBRARY_PATH:-}
[ -d "$carry/lib/ucx" ] && export UCX_MODULE_DIR=$PWD/$carry/lib/ucx
export BT_SHARED_DIR=$PWD/$carry/shared
export BT_SPEC_HEADS=$PWD/$carry/shared/heads
B=$carry/bin/baton
M=$BT_SHARED_DIR/models
H=$BT_SPEC_HEADS
t_start=$(date +%s)
fails=0
rows=""

step() { # name timeout cmd...
  local name=$1 tmo=$2; shift 2
  local s=$(date +%s%N) rc
  echo "=== $name: $*" >> "$log"
  timeout "$tmo" "$@" >> "$log" 2>&1
  rc=$?
  local ms=$(( ($(date +%s%N) - s) / 1000000 ))
  echo "=== $name: rc $rc, $((ms / 1000)).$(( (ms % 1000) / 100 )) s" >> "$log"
  [ $rc -eq 0 ] || fails=$((fails + 1))
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  >> "$log" 2>&1

# 1. checks
step test_kv_copy 60 "$carry/gpu/test_kv_copy"
step test_spec_cuda 150 "$carry/gpu/test_spec_cuda"

# 2. tiny models with trained heads
for m in aidreams260K stories260K; do
  for b in 1 8 32; do
    step "eagle_${m}_b$b" 60 "$B" eagle bench --device cuda --target \
      "$M/$m.bin" --head "$H/$m.bin.head.safetensors" --batch $b \
      --rounds 20
  done
  step "eagle_${m}_b1_fixed" 60 "$B" eagle bench --device cuda --target \
    "$M/$m.bin" --head "$H/$m.bin.head.safetensors" --batch 1 --rounds 20 \
    --spec-fixed
done
# A/B: the draft head without CUDA graphs (eager launches)
step "eagle_aidreams260K_b1_fixed_nographs" 60 env BT_DRAFT_GRAPHS=0 "$B" \
  eagle bench --device cuda --target "$M/aidreams260K.bin" \
  --head "$H/aidreams260K.bin.head.safetensors" --batch 1 --rounds 20 \
  --spec-fixed

# 3. llama3-8b shape, forced acceptance
step llama3_8b_spec 180 "$B" bench-engine --model synth:llama3-8b \
  --device cuda --batch 1,8,32,64 --ctx 256 --steps 16 \
  --spec-accept-rate 0.8 --spec-tokens 4,8,16

# the table
{
  echo "## checks"
  echo
  grep -E '^(PASS|FAIL) ' "$log" | sed 's/^/    /'
  grep -E '^=== [A-Za-z_0-9]+: rc ' "$log" | sed 's/^=== /    /'
  echo
  echo "## tiny models on cuda (bf16), trained heads: baton eagle bench"
  echo
  echo "| model | batch | tree | plain tok/s | spec tok/s | speedup | accept length |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: |"
  awk '
    /^=== eagle_/ && !/: rc [0-9]/ { split($2, a, "_"); model = a[2];
                              tree = ($0 ~ /--spec-fixed/) ? "fixed 16" : "adaptive";
                              if ($0 ~ /BT_DRAFT_GRAPHS=0/) tree = tree ", no graphs" }
    /^batch:/ { for (i = 1; i <= NF; i++) { split($i, kv, ":"); v[kv[1]] = kv[2] }
                printf "| %s | %s | %s | %s | %s | %s | %s |\n", model, v["batch"],
                       tree, v["plain_tok_s"], v["spec_tok_s"], v["speedup"],
                       v["accept-length"] }' "$log"
  echo
  echo "## synth:llama3-8b (bf16), synthetic head, forced acceptance 0.8"
  echo
  echo '```'
  sed -n '/^=== llama3_8b_spec: /,/^=== llama3_8b_spec: rc/p' "$log" |
    grep -E '^ *(batch|[0-9]+ )' 
  echo '```'
  echo
  echo "total $(( $(date +%s) - t_start )) s, $fails failed step(s)"
} > "$table"
echo
cat "$table"
[ $fails -eq 0 ]
