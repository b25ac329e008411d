#!/bin/bash
# run_gpu_hf_fp8.sh [CARRY] - ON THE DEVICE MACHINE, one call of <= ~8
# minutes: the FP8 checkpoint round trip with transformers (issue 37) on
# an 8B-shaped model, into ONE file ($OUT/summary.md; a device call
# returns at most 8 files).  Pack here (build-cuda first; .pylib/ in the
# repository root holds compressed-tensors and loguru as source, see
# below):
#   cmake --build build-cuda -j2 --target baton worker_test_teacher_top1
#   bash tests/gpu/pack_carry.sh hf8 tests/gpu/run_gpu_hf_fp8.sh \
#     bin/baton tests/worker_test_teacher_top1 shared pylib
#   run(carry=[".carry"], command="bash .carry/call.sh")
# Steps (tests/gpu/hf_fp8_check.py does the transformers side):
# 1. 512 tokens of docs/ARCHITECTURE.md (llama2 tokenizer, BOS first);
# 2. transformers makes a Llama-3-8B-shaped model (vocab 32000, bf16,
#    seeded init on the GPU), records its teacher-forced top-1 in bf16
#    and in f32 (the ceiling), save_pretrained (5 GB shards);
# 3. `baton model quantize --fp8` on it: per channel with dynamic
#    inputs, and with --calib docs/OPERATIONS.md --calib-tokens 128 in
#    the background (measured on the 2-core CI VM with two Llama-3-8B
#    layers, vocab 32000: dynamic 9.1 s, calibrated 17.4 s + 22 ms a
#    token, one cpu thread; for 32 layers ~95 s and ~180 s + 0.36 s a
#    token there, i.e. ~230 s at 128 tokens; the device's cores are
#    faster);
# 4. while the cpu quantizes: test_teacher_top1 (tests/worker) on the
#    bf16 dir, cuda bf16 and fp8 (quantized on the device);
# 5. transformers loads each FP8 dir (its compressed-tensors loader when
#    `import compressed_tensors` works from .pylib: it needs pydantic 2
#    and psutil on the device; else, or when it raises or runs out of
#    time, hf_fp8_check.py's fallback loader; the summary says which ran
#    and why), and baton cuda fp8 on each;
#    then baton f32 on the bf16 dir if time is left;
# 6. summary.md: the agreement table (raw, on the half of the positions
#    with the largest reference margin, bf16-vs-f32 ceiling), checkpoint
#    sizes and loaders, every step's exit code and time, the last lines
#    of failed steps.
# Every step has its own limit under one deadline (HF8_DEADLINE_S, 480);
# the work dir is $CARRY/work on the repository's disk (~34 GB: 16 bf16
# + 2 x 8.5 FP8), not /tmp (possibly memory).
# Dry run without torch (the baton half and the summary; the CI VM):
#   HF8_MODEL=DIR HF8_DEVICE=cpu HF8_TOKENS=64 OUT=/tmp/hf8 \
#     bash tests/gpu/run_gpu_hf_fp8.sh build-dev
# .pylib/ (git-ignored; copied into the carry by pack_carry.sh's `pylib`):
# src/compressed_tensors of github:vllm-project/compressed-tensors (plus
# a version.py, which setuptools_scm writes on install) and loguru/ of
# github:Delgan/loguru; both pure Python, 2.6 MB; a compressed_tensors-
# 0.18.0.dist-info/METADATA so importlib.metadata finds its version.
set -u
c=${1:-build-hf8}
out=${OUT:-/tmp/baton-hf8}
mkdir -p "$out"
S=$out/summary.md
: > "$S"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
[ -d "$PWD/$c/shared" ] && export BT_SHARED_DIR=$PWD/$c/shared
export BT_SHARED_DIR=${BT_SHARED_DIR:-$PWD/../shared}
export BT_LOG=WARN
[ -d "$c/pylib" ] && export PYTHONPATH=$PWD/$c/pylib${PYTHONPATH:+:$PYTHONPATH}
W=${HF8_WORK:-$PWD/$c/work}
dev=${HF8_DEVICE:-cuda}
ntok=${HF8_TOKENS:-512}
deadline=${HF8_DEADLINE_S:-480}
B=$c/bin/baton
T1=$c/tests/worker_test_teacher_top1
TOK=$BT_SHARED_DIR/models/llama2-tokenizer.bin
PY="python3 tests/gpu/hf_fp8_check.py"
T0=$(date +%s)
rm -rf "$W"
mkdir -p "$W/log"
echo "| step | rc | took | done at |" > "$W/steps.md"
echo "| --- | ---: | ---: | ---: |" >> "$W/steps.md"

# step NAME LIMIT_S CMD...: runs CMD under min(LIMIT_S, what the
# deadline leaves less 20 s for the summary); logs its rc and time.
step() {
  local name=$1 lim=$2 t now rc
  shift 2
  t=$(date +%s)
  now=$(( deadline - 20 - (t - T0) ))
  [ "$now" -lt "$lim" ] && lim=$now
  if [ "$lim" -lt 10 ]; then
    echo "| $name | skipped (time) | | $(( t - T0 )) s |" >> "$W/steps.md"
    return 124
  fi
  timeout -k 10 "$lim" "$@" > "$W/log/$name.log" 2>&1
  rc=$?
  now=$(date +%s)
  echo "| $name | $rc | $(( now - t )) s | $(( now - T0 )) s |" >> "$W/steps.md"
  if [ $rc -ne 0 ]; then
    { echo "### $name: rc $rc (124: its limit of $lim s)"; echo '```'
      tail -12 "$W/log/$name.log" | cut -c1-300; echo '```'
    } > "$W/log/$name.fail"  # one file a step: steps run in parallel
  fi
  return $rc
}

top1() { # NAME MODEL_DIR PRECISION
  step "$1" 150 "$T1" --model "$2" --tokens "$W/tokens.txt" \
    --out "$W/$1.txt" --device "$dev" --precision "$3" --threads 0
}

# transformers loads $W/fp8$1: its own loader (the fallback follows in
# the same process when it raises); if that step fails or times out,
# the fallback alone in a second step.
hf_load() {
  step "hf_$1" 120 env HF8_BF16_DIR="$bf" \
      $PY load "$W/fp8$1" "$W/tokens.txt" "$W/hf_$1.json" ||
    step "hf_$1_fallback" 100 env HF8_BF16_DIR="$bf" HF8_FALLBACK_ONLY=1 \
      $PY load "$W/fp8$1" "$W/tokens.txt" "$W/hf_$1.json"
}

echo "- start $(date -u +%H:%M:%S) UTC; $(nproc) cores; disk free at" \
  "$W: $(df -h --output=avail "$W" | tail -1 | tr -d ' ');" \
  "$(free -g | awk '/Mem:/ {print $2 " GB memory"}')" >> "$S"
"$B" tokenize --tokenizer "$TOK" --file docs/ARCHITECTURE.md --ids |
  tr ' ' '\n' | grep . | head -"$ntok" | tr '\n' ' ' > "$W/tokens.txt"
echo "- tokens: $(wc -w < "$W/tokens.txt") of docs/ARCHITECTURE.md" >> "$S"

hf=1
if ! python3 -c "import torch, transformers" > "$W/log/import.log" 2>&1; then
  hf=0
  echo "- transformers: not importable here ($(tail -1 "$W/log/import.log"))" \
    >> "$S"
fi
if [ -n "${HF8_MODEL:-}" ]; then
  bf=$HF8_MODEL   # dry run: an existing HF dir instead of transformers'
  echo "- model: $bf (HF8_MODEL; transformers did not write it)" >> "$S"
else
  bf=$W/bf16
  if [ $hf -eq 0 ]; then
    bf=
  elif ! step hf_write 240 $PY write "$bf" "$W/tokens.txt" "$W/refs.json"
  then
    # saved but failed after (the f32 ceiling): the rest can still run
    [ -f "$W/refs.json" ] || bf=
  fi
fi

if [ -n "$bf" ]; then
  # the calibrated quantization is the slower (cpu calibration, one
  # thread): in the background from the start
  step quant_cal 330 "$B" model quantize --fp8 --calib docs/OPERATIONS.md \
    --calib-tokens "${HF8_CALIB_TOKENS:-128}" --tokenizer "$TOK" \
    --out "$W/fp8cal" "$bf" &
  pcal=$!
  # the GPU is free while the cpu quantizes
  ( top1 b_bf16 "$bf" bf16; top1 b_fp8 "$bf" fp8 ) &
  pgpu=$!
  if step quant_dyn 240 "$B" model quantize --fp8 --out "$W/fp8dyn" "$bf"
  then
    [ $hf -eq 1 ] && hf_load dyn
    wait $pgpu
    top1 b_fp8dyn "$W/fp8dyn" fp8
  fi
  wait $pgpu 2>/dev/null
  if wait $pcal; then
    [ $hf -eq 1 ] && hf_load cal
    top1 b_fp8cal "$W/fp8cal" fp8
  fi
  top1 b_f32 "$bf" f32
  for d in "$bf" "$W/fp8dyn" "$W/fp8cal"; do
    [ -d "$d" ] && echo "- $(du -sh "$d" | cut -f1) $(basename "$d")" \
      "($(ls "$d" | tr '\n' ' '))" >> "$S"
  done
  grep -h "calibrated on\|^wrote" "$W/log/quant_"*.log 2>/dev/null |
    sed 's/^/- /' >> "$S"
  grep -h "^teacher_top1:" "$W/log/b_"*.log 2>/dev/null |
    sed "s|$W/||g; s/^/- /" >> "$S"
fi

echo >> "$S"
python3 tests/gpu/hf_fp8_check.py summary "$W" "$S" > /dev/null 2>&1 ||
  echo "summary failed: $(python3 tests/gpu/hf_fp8_check.py summary "$W" \
    /dev/null 2>&1 | tail -2)" >> "$S"
{ echo; echo "## Steps (took $(( $(date +%s) - T0 )) s)"; echo
  cat "$W/steps.md"; echo; cat "$W/log/"*.fail 2>/dev/null; } >> "$S"
cat "$S"
