#!/bin/bash
# pending_variants.sh [BUILD] - builds the decode-attention A/B binaries
# that run_gpu_pending.sh's `alu`, `l2` and `pf` phases time on an H200
# (each lost or was even on an H100; an H200 streams 1.24x the bytes a
# second an SM, so its limit may be elsewhere).  HERE, in a clean
# checkout: each variant patches the kernel source, builds
# gpu_bench_kernels into BUILD (default build-cuda), copies it to
# BUILD/gpu/bench_kernels_NAME and restores the source (git checkout);
# the plain bench_kernels is rebuilt last.  Then pack them with
# run_gpu_pending.sh's recipe (the carry holds 64 MiB with the tree: at
# most three variants).
#   alu1 / alu2  the keys-as-rows step converting K (alu1), or K and V
#                (alu2), from E4M3 codes to f16 by bits on the integer
#                pipes (dc34c9a's tc_kv8_f16x2_alu: x 2^-8, taken back in
#                Q's and V's scales) instead of cvt
#   l2b256       the K/V copies' L2 prefetch size 256 B (an FP8 row is
#                128 B; the next one is another KV head's)
#   pf           d749c76: each warp asks L2 for its K/V rows
#                BT_ATTN_PREFETCH tiles past its copy ring
set -eu
b=${1:-build-cuda}
cd "$(git rev-parse --show-toplevel)"
git diff --quiet -- worker || { echo "worker/ has changes" >&2; exit 1; }
K=worker/cuda/kernels
build() { # NAME
  cmake --build "$b" -j"$(nproc)" --target gpu_bench_kernels > /dev/null
  cp "$b/gpu/bench_kernels" "$b/gpu/bench_kernels_$1"
  git checkout -q -- worker
  echo "built $b/gpu/bench_kernels_$1"
}
alu() { # LEVEL: 1 K, 2 K and V
  python3 - "$1" <<'PYEOF'
import sys
lvl = int(sys.argv[1])
p = 'worker/cuda/kernels/attn_decode_tc.cuh'
s = open(p).read()
helper = '''static __device__ __forceinline__ uint32_t tc_kv8_f16x2_alu(uint32_t w,
                                                            int hi)
{
    const uint32_t x = __byte_perm(w, 0u, hi ? 0x3424u : 0x1404u);
    return (x & 0x80008000u) | ((x >> 1) & 0x3F803F80u);
}

'''
j = s.rfind('template', 0, s.index('tc_kv8_v_pairs(const uint8_t *tv'))
s = s[:j] + helper + s[j:]
sub = [('''{kv8_f16x2(w0), kv8_f16x2(w1),
                               kv8_f16x2(w0 >> 16), kv8_f16x2(w1 >> 16)}''',
        '''{tc_kv8_f16x2_alu(w0, 0), tc_kv8_f16x2_alu(w1, 0),
                               tc_kv8_f16x2_alu(w0, 1), tc_kv8_f16x2_alu(w1, 1)}''')]
if lvl >= 2:
    for v in ('lo', 'hi'):
        sub += [('kv8_f16x2(%s);' % v, 'tc_kv8_f16x2_alu(%s, 0);' % v),
                ('kv8_f16x2(%s >> 16);' % v, 'tc_kv8_f16x2_alu(%s, 1);' % v)]
for a, c in sub:
    assert a in s, a
    s = s.replace(a, c, 1)
open(p, 'w').write(s)
p = 'worker/cuda/kernels/attn_decode_tc.cu'
s = open(p).read()
a = '1.4426950408889634f;'
assert a in s
s = s.replace(a, '1.4426950408889634f * (KT ? 256.0f : 1.0f);', 1)
if lvl >= 2:
    a = 'as *= a.d_kv_scale[a.n_kv_heads + kvh];'
    assert a in s
    s = s.replace(a, 'as *= a.d_kv_scale[a.n_kv_heads + kvh] * 256.0f;', 1)
open(p, 'w').write(s)
PYEOF
}
alu 1; build alu1
alu 2; build alu2
sed -i 's/L2::cache_hint.L2::128B /L2::cache_hint.L2::256B /' \
  $K/tc_common.cuh
touch $K/attn_decode_tc.cu; build l2b256
git show d749c76 -- worker | git apply; build pf
touch $K/attn_decode_tc.cu
cmake --build "$b" -j"$(nproc)" --target gpu_bench_kernels > /dev/null
git status --short -- worker
