#!/usr/bin/env python3
"""step_timeline.py CSV [STEP_FIRST_KERNEL [K]] - one decode step's
kernels from tests/gpu/trace/kernel_trace.c's CSV (or an `nsys stats -r
cuda_gpu_trace -f csv` export): the last complete
step (from the last-but-one kernel named like STEP_FIRST_KERNEL, default
'embed_kernel', to the kernel before the last one), grouped by kernel
name: launches, summed duration, summed gap before each launch (start
minus the previous kernel's end; negative = overlap under PDL).  K
(default 2): the step K - 1 steps before the last complete one, e.g. 19
for bench_cuda --mixed's mixed forward (9 forwards each of the mixed
step, the decode rows, the chunks: the mixed ones are 27..19 from the
end)."""
import csv, re, signal, sys, collections

# piped into head: stop quietly when it closes the pipe
signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def short(name, grid):
    """The kernel's own name from its mangled one, with its grid size."""
    m = re.match(r'_ZN?L?(\d+)', name)
    if m:
        name = name[m.end():m.end() + int(m.group(1))]
    else:
        name = name.split('(')[0].split('<')[0]
    return f'{name[:40]} [{grid}]' if grid else name[:48]

rows = []
with open(sys.argv[1]) as f:
    for r in csv.DictReader(f):
        name = r.get('Name') or r.get('name') or ''
        try:
            start = int(r.get('Start (ns)') or r.get('Start'))
            dur = int(r.get('Duration (ns)') or r.get('Duration'))
        except (TypeError, ValueError):
            continue
        if 'memcpy' in name.lower() or 'memset' in name.lower():
            continue
        rows.append((start, dur, short(name, r.get('Grid', ''))))
rows.sort()
first = sys.argv[2] if len(sys.argv) > 2 else 'embed_kernel'
idx = [i for i, r in enumerate(rows) if first in r[2]]
if len(idx) < 3:
    print('fewer than 3 steps found'); sys.exit(1)
k = int(sys.argv[3]) if len(sys.argv) > 3 else 2
if len(idx) < k + 1:
    print('fewer than %d steps found' % (k + 1)); sys.exit(1)
a, b = idx[-k - 1], idx[-k]
step = rows[a:b]
t0, t1 = step[0][0], step[-1][0] + step[-1][1]
agg = collections.OrderedDict()
prev_end = None
for s, d, n in step:
    g = agg.setdefault(n, [0, 0, 0])
    g[0] += 1; g[1] += d
    if prev_end is not None:
        g[2] += s - prev_end
    prev_end = max(prev_end or 0, s + d)
busy = sum(d for _, d, _ in step)
print(f'step: {len(step)} kernels, {(t1 - t0) / 1e3:.1f} us first start to '
      f'last end, kernel time summed {busy / 1e3:.1f} us')
print('| kernel | launches | us summed | us each | gap before, us summed |')
print('| --- | ---: | ---: | ---: | ---: |')
for n, (c, d, g) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f'| {n} | {c} | {d / 1e3:.1f} | {d / c / 1e3:.2f} | {g / 1e3:.1f} |')
# one layer in order (the second layer of the step)
print('\nfirst 24 kernels of the step: name, start offset us, duration '
      'us, gap after the previous end us')
pe = None
for s, d, n in step[:24]:
    gap = '' if pe is None else f'{(s - pe) / 1e3:7.2f}'
    print(f'  {n:50s} {(s - t0) / 1e3:8.2f} {d / 1e3:7.2f} {gap}')
    pe = s + d
