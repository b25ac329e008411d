#!/usr/bin/env python3
"""serve_steps.py CSV [FIRST] - a serving worker's steps from
tests/gpu/trace/kernel_trace.c's CSV of a whole run: each step from one
kernel named like FIRST (default 'embed_kernel') to the next, binned by
its wall time (start to the next step's start); per bin the mean wall,
the time some kernel ran (busy; the rest is the device idle: host work,
copies, waits), and the kernels by mean time a step (names without
template arguments, every grid together).  Compare a bin with
step_timeline.py's table of bench_cuda --mixed's step of the same
tokens: what serving adds is in the idle column and the kernels the
bench has not."""
import collections, csv, re, signal, sys

# piped into head: stop quietly when it closes the pipe
signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def short(name):
    m = re.match(r'_ZN?L?(\d+)', name)
    if m:
        return name[m.end():m.end() + int(m.group(1))][:40]
    return name.split('(')[0].split('<')[0][:40]


rows = []
with open(sys.argv[1]) as f:
    for r in csv.DictReader(f):
        try:
            rows.append((int(r['Start (ns)']), int(r['Duration (ns)']),
                         short(r['Name'])))
        except (KeyError, TypeError, ValueError):
            continue
rows.sort()
first = sys.argv[2] if len(sys.argv) > 2 else 'embed_kernel'
idx = [i for i, r in enumerate(rows) if first in r[2]]
bins = [(0, 10), (10, 25), (25, 50), (50, 100), (100, 1e9)]
acc = {b: [0, 0.0, 0.0, collections.Counter(), collections.Counter()]
       for b in bins}
for a, b in zip(idx, idx[1:]):
    step = rows[a:b]
    wall = (rows[b][0] - step[0][0]) / 1e6
    busy, end = 0, step[0][0]
    for s, d, _ in step:  # union of the kernels' intervals
        if s + d > end:
            busy += s + d - max(s, end)
            end = s + d
    for lo, hi in bins:
        if lo <= wall < hi:
            g = acc[(lo, hi)]
            g[0] += 1
            g[1] += wall
            g[2] += busy / 1e6
            for s, d, n in step:
                g[3][n] += d / 1e6
                g[4][n] += 1
print(f'{len(idx) - 1} steps, {len(rows)} kernels')
for (lo, hi), (n, wall, busy, t, c) in acc.items():
    if n == 0:
        continue
    print(f'\n### steps of {lo}-{hi:g} ms: {n}, wall {wall / n:.2f} ms, '
          f'busy {busy / n:.2f}, idle {(wall - busy) / n:.2f}')
    print('| kernel | launches a step | ms a step |')
    print('| --- | ---: | ---: |')
    for name, ms in t.most_common(16):
        print(f'| {name} | {c[name] / n:.1f} | {ms / n:.3f} |')
