#!/bin/bash
# run_gpu_round26g.sh [CARRY] - round 26 (2026-12-04), ON THE DEVICE
# MACHINE, issue 4: why the landing code's prefill attention is ~5%
# slower than call 5's (26d) with scattered blocks: the landing binary,
# x1 (the runs check compiled out, -DF2_NO_RUNS), x2 (also no
# descriptor prefetch) and 26d's (X_b), fa2pp128 only, in the order
# L X1 X2 D D X2 X1 L; the SASS of the landing and x1 objects.
# Carry: gpu/bench_kernels, _x1, _x2, _b; obj/ of landing and x1; lib/.
set -u
d=$(dirname "$0")
. "$d/../gpu_steps.sh"
gpu_steps_init r26g "${1:-build-r26g}"
export BT_PREFILL_KERNEL=fa2pp128
i=0
for v in "" _x1 _x2 _b _b _x2 _x1 ""; do
  i=$((i + 1))
  run "k$i$v" 60 "$c/gpu/bench_kernels$v" --attn
done
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
for o in "$c"/obj/*.o; do
  "$cuobjdump" -sass "$o" | xz -T4 > "$out/$(basename "$o").sass.xz"
done
{
  echo "## round 26g $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  for f in $(ls "$tmp" | grep '^k[0-9]' | sort -n -k1.2); do
    echo "$f: $(grep -h '^attn prefill' "$tmp/$f" | awk '{print $4, $7}' | tr '\n' ' ')"; done
  head -1 "$log"
} > "$table"
cat "$table"
