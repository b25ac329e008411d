#!/usr/bin/env python3
"""plot_bench.py ROWS_JSON OUT_SVG [TITLE] - latency against throughput
for `baton bench` sweeps, as one SVG written with the standard library
only (the device machine and CI need nothing installed).

ROWS_JSON is a list of objects, one per `baton bench` run:
  {"group": "2048x128, one H200", "mode": "1P+1D", "tok_s": 1234.5,
   "ttft_p50": 80.1, "ttft_p99": 140.0, "tpot_p50": 9.1, "tpot_p99": 12.0,
   "label": "r=4"}
(tok_s: achieved output tokens/s; latencies in ms).  One row of two
panels per group: TTFT (log scale) and TPOT against output tokens/s, a
line per mode, p50 solid with dots and p99 dashed; the SLO lines
(--slo-ttft / --slo-tpot of the runs, default 250 / 25 ms) are grey.
Usable as a module: plot(rows, path, title, slo_ttft, slo_tpot).
"""
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
PW, PH = 430, 260          # panel plot area
ML, MR, MT, MB = 70, 20, 40, 50


def _esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;")
            .replace(">", "&gt;"))


def _nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw),
               default=10 * mag)
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + 1e-9 * step:
        if t >= lo - 1e-9 * step:
            out.append(t)
        t += step
    return out, step


def _fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return "%gk" % (v / 1000)
    return "%g" % round(v, 6)


class _Panel:
    def __init__(self, x0, y0, xr, yr, logy):
        self.x0, self.y0 = x0, y0
        self.xlo, self.xhi = xr
        self.logy = logy
        if logy:
            self.ylo = math.log10(max(yr[0], 1e-3))
            self.yhi = math.log10(max(yr[1], yr[0] * 1.01, 1e-3))
        else:
            self.ylo, self.yhi = yr

    def px(self, x):
        return self.x0 + (x - self.xlo) / (self.xhi - self.xlo) * PW

    def py(self, y):
        if self.logy:
            y = math.log10(max(y, 1e-3))
        return self.y0 + PH - (y - self.ylo) / (self.yhi - self.ylo) * PH


def _panel(out, p, title, ylabel, series, slo):
    x0, y0 = p.x0, p.y0
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" '
               'stroke="#444"/>' % (x0, y0, PW, PH))
    out.append('<text x="%d" y="%d" font-size="13" font-weight="bold">%s'
               '</text>' % (x0, y0 - 10, _esc(title)))
    xt, _ = _nice_ticks(p.xlo, p.xhi)
    for t in xt:
        x = p.px(t)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>'
                   % (x, y0, x, y0 + PH))
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">'
                   '%s</text>' % (x, y0 + PH + 14, _fmt(t)))
    if p.logy:
        yt = []
        for e in range(int(math.floor(p.ylo)), int(math.ceil(p.yhi)) + 1):
            for m in (1, 2, 5):
                v = m * 10 ** e
                if p.ylo - 1e-9 <= math.log10(v) <= p.yhi + 1e-9:
                    yt.append(v)
    else:
        yt, _ = _nice_ticks(p.ylo, p.yhi)
    for t in yt:
        y = p.py(t)
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>'
                   % (x0, y, x0 + PW, y))
        out.append('<text x="%d" y="%.1f" font-size="10" text-anchor="end">'
                   '%s</text>' % (x0 - 4, y + 3, _fmt(t)))
    out.append('<text x="%d" y="%d" font-size="11" text-anchor="middle">'
               'output tokens/s</text>' % (x0 + PW // 2, y0 + PH + 32))
    out.append('<text x="%d" y="%d" font-size="11" text-anchor="middle" '
               'transform="rotate(-90 %d %d)">%s</text>' %
               (x0 - 48, y0 + PH // 2, x0 - 48, y0 + PH // 2, _esc(ylabel)))
    if slo:
        y = p.py(slo)
        if y0 <= y <= y0 + PH:
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" '
                       'stroke="#888" stroke-dasharray="2,3"/>' %
                       (x0, y, x0 + PW, y))
            out.append('<text x="%d" y="%.1f" font-size="10" fill="#666" '
                       'text-anchor="end">SLO %g ms</text>' %
                       (x0 + PW - 3, y - 3, slo))
    for color, pts50, pts99 in series:
        for pts, dash in ((pts50, ""), (pts99, ' stroke-dasharray="6,4"')):
            if not pts:
                continue
            d = " ".join("%.1f,%.1f" % (p.px(x), p.py(y)) for x, y in pts)
            out.append('<polyline points="%s" fill="none" stroke="%s" '
                       'stroke-width="1.8"%s/>' % (d, color, dash))
            for x, y in pts:
                out.append('<circle cx="%.1f" cy="%.1f" r="%s" fill="%s"/>' %
                           (p.px(x), p.py(y), "3" if not dash else "2",
                            color))


def plot(rows, path, title="baton bench: latency vs throughput",
         slo_ttft=250.0, slo_tpot=25.0):
    groups = []
    for r in rows:
        if r["group"] not in groups:
            groups.append(r["group"])
    modes = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    color = {m: COLORS[i % len(COLORS)] for i, m in enumerate(modes)}
    width = 2 * (ML + PW + MR) + 10
    height = 40 + max(1, len(groups)) * (MT + PH + MB) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="22" font-size="15" font-weight="bold">%s</text>'
           % _esc(title)]
    lx = width - 10
    for i, m in enumerate(reversed(modes)):  # legend, right-aligned
        out.append('<text x="%d" y="22" font-size="12" fill="%s" '
                   'text-anchor="end">%s</text>' % (lx, color[m], _esc(m)))
        lx -= 12 + 7 * len(m)
    out.append('<text x="10" y="%d" font-size="11" fill="#444">solid: p50, '
               'dashed: p99; each dot one run (open loop at a fixed rate, '
               'or closed loop)</text>' % (height - 10))
    for gi, g in enumerate(groups):
        gr = [r for r in rows if r["group"] == g and r.get("tok_s", 0) > 0]
        if not gr:
            continue
        y0 = 40 + gi * (MT + PH + MB) + MT
        xs = [r["tok_s"] for r in gr]
        xr = (0, max(xs) * 1.08)
        for col, (key, ylabel, logy, slo) in enumerate((
                ("ttft", "TTFT ms (log)", True, slo_ttft),
                ("tpot", "TPOT ms", False, slo_tpot))):
            ys = [r[key + "_p50"] for r in gr] + [r[key + "_p99"] for r in gr]
            ys = [y for y in ys if y > 0] or [1]
            if logy:
                yr = (min(ys + [slo]) / 1.5, max(ys + [slo]) * 1.5)
            else:
                yr = (0, max(ys + [slo]) * 1.1)
            p = _Panel(col * (ML + PW + MR) + ML + 5, y0, xr, yr, logy)
            series = []
            for m in modes:
                mr = sorted((r for r in gr if r["mode"] == m),
                            key=lambda r: r["tok_s"])
                series.append((color[m],
                               [(r["tok_s"], r[key + "_p50"]) for r in mr],
                               [(r["tok_s"], r[key + "_p99"]) for r in mr]))
            _panel(out, p, "%s: %s" % (g, key.upper()), ylabel, series, slo)
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    with open(sys.argv[1]) as f:
        rows = json.load(f)
    plot(rows, sys.argv[2], *(sys.argv[3:4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
