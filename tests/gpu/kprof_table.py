#!/usr/bin/env python3
"""kprof_table.py LOG - the per-block phase profile of a -DBT_KPROF=1
bench_cuda run (kernels/kern_common.cuh) as one table per batch: for each
kernel of the last layer and each mark, min / p10 / median / p90 / max in
us from the qkv GEMV's first block entry."""
import sys

NAMES = {("gemv", 0): "qkv (norm)", ("attn", 0): "attention",
         ("combine", 0): "combine", ("gemv", 2): "o", ("gemv", 1):
         "gate/up (norm, SwiGLU)", ("gemv", 3): "down",
         ("gemv", 4): "classifier"}
ORDER = [("gemv", 0), ("attn", 0), ("combine", 0), ("gemv", 2),
         ("gemv", 1), ("gemv", 3), ("gemv", 4)]
MARKS = ["entry", "wait returned", "staged", "last product", "end"]


def table(head, rows):
    if not rows:
        return
    print(f"\n### {head}\n")
    print("| kernel | mark | blocks | min | p10 | median | p90 | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    t0 = min(v[2] for k, v in rows.items() if k[:2] == ("gemv", 0)) \
        if any(k[:2] == ("gemv", 0) for k in rows) else \
        min(v[2] for v in rows.values())
    for kern in ORDER:
        for m in range(len(MARKS)):
            v = rows.get((kern[0], kern[1], m))
            if v is None:
                continue
            rel = " | ".join(f"{(x - t0) / 1e3:.2f}" for x in v[2:])
            print(f"| {NAMES[kern]} | {MARKS[m]} | {v[1]} | {rel} |")


def main():
    head, rows = None, {}
    for line in open(sys.argv[1]):
        f = line.split()
        if len(f) >= 2 and f[0] == "KPROF" and f[1] == "batch":
            table(head, rows)
            head, rows = " ".join(f[1:]), {}
        elif len(f) == 10 and f[0] == "KPROF":
            rows[(f[1], int(f[2]), int(f[3]))] = [int(f[3]), int(f[4])] + \
                [int(x) for x in f[5:]]
    table(head, rows)


main()
