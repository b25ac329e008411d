#!/bin/bash
# run_gpu_spec.sh [CARRY_DIR] - speculative decoding (issue 6) ON THE
# DEVICE MACHINE, from a folder packed here by tests/gpu/pack_gpu_spec.sh
# (default build-specgpu2-carry: bin/baton, gpu/test_*, lib/ for the
# libraries the device lacks, shared/models + shared/heads with heads
# trained here by `baton eagle train`).  Nothing is rebuilt.
#   1. checks: test_kv_copy (slot-copy kernel vs CPU reference) and
#      test_spec_cuda (device draft head vs host head, hidden rows vs
#      what bf16 weights alone give, tree-verification graphs vs none,
#      greedy spec = golden (f32) / vs plain of the same batch
#      composition against plain's own alone-vs-batched baseline (bf16));
#   2. tiny models, trained heads: `baton eagle bench --device cuda`
#      plain vs speculative tokens/s and accepted length, batch 1/8/32
#      (adaptive controller; batch 1 also with the fixed full tree, a
#      fixed chain of 4, speculation off inside the spec loop (must be
#      ~1.00x), A/B rows without tree graphs / draft graphs, and rows
#      `fixed 16, device loop` etc. with BT_DRAFT_LOOP=device: the whole
#      draft tree grown on the device, one graph per tree); the default
#      (BT_DRAFT_DEVICE=auto) drafts these tiny heads on the host, the
#      `device draft` rows (BT_DRAFT_DEVICE=device) on the GPU;
#   3. synth:llama3-8b (bf16): `baton bench-engine --spec-accept-rate`
#      (synthetic confident head, FORCED acceptance 0.8 per level) at
#      batch 1/8/32/64 and trees of 4/8/16 tokens: verification cost per
#      tree size.
# Budget: about 3 minutes (4 at most).  Writes spec_gpu.log and spec_gpu_table.md
# under $OUT (else /tmp/baton-gpu-spec); prints the table last.
set -u
carry=${1:-build-specgpu2-carry}
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
step test_spec_cuda 210 "$carry/gpu/test_spec_cuda"

# 2. tiny models with trained heads
eb() { # name [env...] -- bench args
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  step "$name" 60 env "${envs[@]}" "$B" eagle bench --device cuda "$@" \
    --rounds 20
}
for m in aidreams260K stories260K; do
  T=(--target "$M/$m.bin" --head "$H/$m.bin.head.safetensors")
  for b in 1 8 32; do
    eb "eagle_${m}_b$b" -- "${T[@]}" --batch $b
  done
  eb "eagle_${m}_b1_fixed" -- "${T[@]}" --batch 1 --spec-fixed
done
T=(--target "$M/aidreams260K.bin" --head "$H/aidreams260K.bin.head.safetensors")
eb eagle_aidreams260K_b1_chain4 -- "${T[@]}" --batch 1 --spec-fixed \
  --spec-tokens 4 --spec-depth 4 --spec-topk 1
eb eagle_aidreams260K_b1_off -- "${T[@]}" --batch 1 --spec-plain
eb eagle_aidreams260K_b8_fixed -- "${T[@]}" --batch 8 --spec-fixed
# A/B: verification without tree graphs; the draft head without graphs
eb eagle_aidreams260K_b1_fixed_notreegraphs BT_TREE_GRAPHS=0 BT_DRAFT_DEVICE=device -- "${T[@]}" \
  --batch 1 --spec-fixed
eb eagle_aidreams260K_b1_fixed_nodraftgraphs BT_DRAFT_GRAPHS=0 BT_DRAFT_DEVICE=device -- \
  "${T[@]}" --batch 1 --spec-fixed
# the device draft loop (whole trees on the device, one graph per tree)
eb eagle_aidreams260K_b1_fixed_deviceloop BT_DRAFT_LOOP=device BT_DRAFT_DEVICE=device -- \
  "${T[@]}" --batch 1 --spec-fixed
eb eagle_aidreams260K_b1_deviceloop BT_DRAFT_LOOP=device BT_DRAFT_DEVICE=device -- "${T[@]}" \
  --batch 1
eb eagle_aidreams260K_b8_fixed_deviceloop BT_DRAFT_LOOP=device BT_DRAFT_DEVICE=device -- \
  "${T[@]}" --batch 8 --spec-fixed
# the draft head on the GPU (BT_DRAFT_DEVICE=device; the rows above use
# the default, auto, which keeps heads this small on the host)
for m in aidreams260K stories260K; do
  T=(--target "$M/$m.bin" --head "$H/$m.bin.head.safetensors")
  for b in 1 8 32; do
    eb "eagle_${m}_b${b}_devdraft" BT_DRAFT_DEVICE=device -- "${T[@]}" --batch $b
  done
  eb "eagle_${m}_b1_fixed_devdraft" BT_DRAFT_DEVICE=device -- "${T[@]}" \
    --batch 1 --spec-fixed
done
T=(--target "$M/aidreams260K.bin" --head "$H/aidreams260K.bin.head.safetensors")
eb eagle_stories260K_b1_fixed_deviceloop BT_DRAFT_LOOP=device BT_DRAFT_DEVICE=device -- \
  --target "$M/stories260K.bin" \
  --head "$H/stories260K.bin.head.safetensors" --batch 1 --spec-fixed

# 3. llama3-8b shape, forced acceptance
step llama3_8b_spec 180 "$B" bench-engine --model synth:llama3-8b \
  --device cuda --batch 1,8,32,64 --ctx 256 --steps 16 \
  --spec-accept-rate 0.8 --spec-tokens 4,8,16

# the table
{
  echo "## checks"
  echo
  grep -E '^(PASS|FAIL) ' "$log" | grep -v '^PASS kv_copy' | sed 's/^/    /'
  echo "    ($(grep -c '^PASS kv_copy' "$log") kv_copy checks passed)"
  grep -E '^=== [A-Za-z_0-9]+: rc ' "$log" | sed 's/^=== /    /'
  echo
  echo "## tiny models on cuda (bf16), trained heads: baton eagle bench"
  echo
  echo "| model | batch | tree | plain tok/s | spec tok/s | speedup | accept length | tree steps | plain steps | draft ms | verify ms | head passes replayed/captured/eager |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  awk '
    /^=== eagle_/ && !/: rc [0-9]/ { split($2, a, "_"); model = a[2];
                              tree = "adaptive";
                              if ($0 ~ /--spec-fixed/) tree = "fixed 16";
                              if ($0 ~ /--spec-tokens 4/) tree = "chain 4";
                              if ($0 ~ /--spec-plain/) tree = "off (spec loop)";
                              if ($0 ~ /BT_TREE_GRAPHS=0/) tree = tree ", no tree graphs";
                              if ($0 ~ /BT_DRAFT_GRAPHS=0/) tree = tree ", no draft graphs"
                              if ($0 ~ /BT_DRAFT_LOOP=device/) tree = tree ", device loop"
                              if ($0 ~ /BT_DRAFT_DEVICE=device/ && $0 !~ /BT_DRAFT_LOOP=device/) tree = tree ", device draft" }
    /^batch:/ { for (i = 1; i <= NF; i++) { split($i, kv, ":"); v[kv[1]] = kv[2] }
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s/%s |\n", model, v["batch"],
                       tree, v["plain_tok_s"], v["spec_tok_s"], v["speedup"],
                       v["accept-length"], v["tree_steps"], v["plain_steps"],
                       v["draft_ms"], v["verify_ms"], v["head_replays"],
                       v["head_captures"], v["head_eager"] }' "$log"
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
