#!/bin/bash
# gpu_steps.sh - helpers for a one-off device script (an A/B, a profile),
# sourced by it ON THE DEVICE MACHINE from a build packed by
# tests/gpu/pack_carry.sh (nothing is rebuilt).  The tuning rounds' own
# scripts are in git history (tests/gpu/rounds/, removed in issue 41).
#   gpu_steps_init TAG CARRY   $c, $out ($OUT or /tmp/baton-TAG), $log
#                              ($out/TAG.log), $table ($out/TAG_table.md),
#                              $tmp, $t0; the carry's lib/ on the path
#   run NAME TIMEOUT CMD...    one step: output in $tmp/NAME and the log,
#                              "NAME rc=N" in $tmp/rcs (timeout -k: no
#                              child keeps the GPU after a kill)
#   bc NAME ENV... -- ARGS     $c/gpu/bench_cuda on $BC_MODEL (default
#                              synth:llama3-8b) with
#                              those variables (at least one), 20 steps,
#                              its table in $tmp/t_NAME
#   bc_rows NAME...            the decode / prefill rows of those tables
#   bc_ttft NAME               the prefill rows of that table, one line
#   bc_steps NAME...           the step-ms column of those tables' decode
#                              rows, all on one line
#   pass_fail NAME...          "NAME: P PASS, F FAIL" and the first FAILs
#   smi_start / smi_stop       nvidia-smi power, SM clock and throttle
#                              reasons every 50 ms into $out/smi.csv
#   smi_summary                samples >= 600 W, their mean power / clock
#   smi_phase NAME CMD...      a step under nvidia-smi sampling, then its
#                              mean power / SM clock, minimum clock and
#                              throttle reasons appended to $tmp/summary
#   bcb, bc_cols, trace_step   (below) the A/B binary, every column, a
#                              CUPTI trace of a step
# A/B in one call (round 21): give every run the same BT_GEMM_CACHE
# file (one warm-up run tunes it), or the tuner's per-process picks move
# a b64 step by 0.05-0.15 ms; and alternate the pair's order (A B, B A,
# ...): the second run of a back-to-back pair measured ~0.05 ms faster
# whichever variant it was.
gpu_steps_init() {
  c=$2
  out=${OUT:-/tmp/baton-$1}
  mkdir -p "$out"
  log=$out/$1.log
  table=$out/$1_table.md
  : > "$log"
  export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
  export BT_LOG=${BT_LOG:-WARN}
  t0=$(date +%s)
  tmp=$(mktemp -d)
  # which H200 this is (fast and slow ones differ by ~2%: round 22)
  nvidia-smi --query-gpu=name,clocks.max.memory,power.limit,vbios_version,ecc.mode.current,pci.bus_id \
    --format=csv,noheader >> "$log" 2>&1
}
run() {
  local name=$1 tmo=$2; shift 2
  echo "=== $name: $*  (t=$(( $(date +%s) - t0 )) s)" >> "$log"
  timeout -k 5 "$tmo" "$@" > "$tmp/$name" 2>&1
  local rc=$?
  cat "$tmp/$name" >> "$log"
  echo "=== $name rc=$rc" >> "$log"
  echo "$name rc=$rc" >> "$tmp/rcs"
}
bc() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run "bc_$name" 90 env "${envs[@]}" "$c/gpu/bench_cuda" --model "${BC_MODEL:-synth:llama3-8b}" \
    --steps 20 --table "$tmp/t_$name" "$@"
}
bc_rows() {
  local f
  for f in "$@"; do
    echo "### $f"
    grep -E "^\| (decode|prefill) " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f2-6,9-11,13
  done
}
bc_ttft() {
  grep -E '^\| prefill ' "$tmp/t_$1" 2>/dev/null | cut -d'|' -f3,5 | tr '\n' ' '
}
bc_steps() {
  local f
  for f in "$@"; do
    grep -E "^\| decode " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f5 | tr '\n' ' '
  done
  echo
}
pass_fail() {
  local t
  for t in "$@"; do
    echo "$t: $(grep -c '^PASS' "$tmp/$t") PASS, $(grep -c '^FAIL' "$tmp/$t") FAIL"
    grep '^FAIL' "$tmp/$t" | head -5
  done
}
smi_start() {
  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks_throttle_reasons.active \
    --format=csv,noheader -lms 50 > "$out/smi.csv" 2>&1 &
  smi_pid=$!
}
smi_stop() {
  kill "$smi_pid" 2>/dev/null
}
smi_summary() {
  echo "power samples >= 600 W: $(awk -F, '$2+0 >= 600' "$out/smi.csv" | wc -l) of $(wc -l < "$out/smi.csv")"
  awk -F, '$2+0 >= 600 {p+=$2; c+=$3; n++} END {if (n) printf "mean over those: %.0f W, SM %.0f MHz\n", p/n, c/n}' "$out/smi.csv"
}
smi_phase() {
  local name=$1; shift
  smi_start
  run "$name" 200 "$@"
  smi_stop; sleep 0.2
  mv "$out/smi.csv" "$out/smi_$name.csv"
  {
    echo "### $name: samples, mean W, mean SM MHz, min SM MHz; throttle reasons"
    awk -F, '{p+=$2; c+=$3; n++; if (min==""||$3+0<min) min=$3+0} END {if (n) printf "%d samples, %.0f W, %.0f MHz, min %d MHz\n", n, p/n, c/n, min}' "$out/smi_$name.csv"
    cut -d, -f4 "$out/smi_$name.csv" | sort | uniq -c | sort -rn | head -4
    echo "power >= 650 W: $(awk -F, '$2+0 >= 650' "$out/smi_$name.csv" | wc -l)"
  } >> "$tmp/summary"
}
# bcb NAME ARGS...            as bc, with $c/gpu/bench_cuda_b (the A/B
#                              binary of pack_carry.sh's AB_FROM), no env
bcb() {
  local name=$1; shift
  run "bc_$name" 90 "$c/gpu/bench_cuda_b" --model "${BC_MODEL:-synth:llama3-8b}" \
    --steps 20 --table "$tmp/t_$name" "$@"
}
# bc_cols NAME...             the decode rows of those tables, every
#                              column up to TPOT (+logits, +sample, +top-p)
bc_cols() {
  local f
  for f in "$@"; do
    echo "### $f"
    grep -E "^\| decode " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f3-9
  done
}
# trace_step NAME BIN ENV... -- ARGS   one bench run of $c/gpu/BIN under
#                              the CUPTI tracer (gpu/libbt_kernel_trace.so;
#                              pack_carry.sh adds libcupti), its last
#                              step reduced by step_timeline.py into
#                              $tmp/tl_NAME
trace_step() {
  local name=$1 bin=$2; shift 2
  local envs=(BT_X=1)
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run "trace_$name" 120 env "${envs[@]}" \
    CUDA_INJECTION64_PATH="$PWD/$c/gpu/libbt_kernel_trace.so" \
    BT_TRACE_OUT="$tmp/trace_$name.csv" "$c/gpu/$bin" \
    --model "${BC_MODEL:-synth:llama3-8b}" "$@"
  run "tl_$name" 60 python3 "$(dirname "${BASH_SOURCE[0]}")/step_timeline.py" \
    "$tmp/trace_$name.csv"
}
