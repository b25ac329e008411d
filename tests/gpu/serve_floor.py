#!/usr/bin/env python3
"""serve_floor.py - the physical floor of a serving run on one GPU: the
output tokens a second the H200 could give if every kernel ran at the
floors bench_cuda.c uses (4.5 TB/s read, 790 TFLOP/s dense bf16, 1,400
dense fp8), so a `baton bench` row reads against its limit the way a
kernel row does (PERFORMANCE.md "Method").

  serve_floor.py [--model synth:llama3-8b] [--precision bf16|fp8]
                 [--kv-dtype bf16|fp8] [--bin DIR] PxO@C ...

One GPU does all of a request's work one piece after another, so the
floor of a request is the sum of its pieces' floors:
  prefill  bench_cuda's prefill floor of P tokens (2 x per-token params
           x P + the classifier once + causal attention FLOPs; fp8: the
           linears at the fp8 rate);
  decode   O - 1 rows (the first token comes from the prefill), each:
           its GEMM share, the larger of its FLOPs (linears + classifier)
           at the rate and the step's weight bytes / BW split over the C
           rows of a step, plus its attention reading the context (P +
           O / 2 tokens on average) of K and V at BW.
floor tok/s = O / (prefill + decode), whatever the concurrency (C only
sets how many rows share a step's weight read).  Not counted: sampling,
the host, the TPOT bound's shape of the schedule -- a floor, not a
prediction.  Model shapes come from `baton model inspect`.
"""
import argparse
import os
import re
import subprocess
import sys

BW_READ = 4.5e12    # bench_cuda.c's floors
BF16_RATE = 790e12
FP8_RATE = 1400e12


def model_config(baton, model):
    """The config `baton model inspect MODEL` prints: {name: int}."""
    out = subprocess.run([baton, "model", "inspect", model],
                         capture_output=True, text=True, timeout=120,
                         check=True).stdout
    cfg = {}
    for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                "head_dim", "vocab_size"):
        m = re.search(r"^\s+%s\b[^\n]*?\s(\d+)\s*$" % key, out, re.M)
        if m is None:
            raise ValueError("baton model inspect %s: no %s" % (model, key))
        cfg[key] = int(m.group(1))
    return cfg


class Floor:
    def __init__(self, cfg, precision="bf16", kv_dtype="bf16"):
        c = cfg
        self.cfg = c
        self.fp8 = precision == "fp8"
        # as bench_cuda.c: every layer matrix, the 2 norms a layer
        self.layer_params = c["n_layers"] * (
            c["dim"] * (c["n_heads"] + 2 * c["n_kv_heads"]) * c["head_dim"] +
            c["n_heads"] * c["head_dim"] * c["dim"] +
            3.0 * c["dim"] * c["hidden_dim"] + 2.0 * c["dim"])
        self.cls_params = float(c["vocab_size"] * c["dim"])
        self.lin_params = self.layer_params - 2.0 * c["n_layers"] * c["dim"]
        self.w_bytes = (self.lin_params + 2.0 * (
            self.layer_params - self.lin_params + self.cls_params)
            if self.fp8 else 2.0 * (self.layer_params + self.cls_params))
        self.kv_tok_bytes = (2.0 * c["n_layers"] * c["n_kv_heads"] *
                             c["head_dim"] * (1 if kv_dtype == "fp8" else 2))

    def linear_s(self, tokens):
        """The linears' FLOPs of `tokens` rows at the rate, in seconds."""
        f = 2.0 * self.lin_params * tokens
        rest = 2.0 * (self.layer_params - self.lin_params) * tokens
        return f / (FP8_RATE if self.fp8 else BF16_RATE) + rest / BF16_RATE

    def prefill_s(self, p):
        c = self.cfg
        attn = (4.0 * c["n_layers"] * c["n_heads"] * c["head_dim"] *
                p * (p + 1) / 2)
        return (self.linear_s(p) +
                (2.0 * self.cls_params + attn) / BF16_RATE)

    def row_s(self, ctx, rows):
        """One decode row at context ctx in a step of `rows` rows."""
        gemm = max(self.linear_s(1) + 2.0 * self.cls_params / BF16_RATE,
                   self.w_bytes / BW_READ / max(rows, 1))
        return gemm + ctx * self.kv_tok_bytes / BW_READ

    def request_s(self, p, o, conc):
        return self.prefill_s(p) + (o - 1) * self.row_s(p + o / 2.0, conc)

    def tok_per_s(self, p, o, conc):
        return o / self.request_s(p, o, conc)


def parse_run(text):
    """'PxO@C' (C optional: 256) -> (P, O, C)."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:@(\d+))?", text)
    if m is None or min(int(v) for v in m.groups() if v) < 1:
        raise ValueError("run %r: want PROMPTxOUTPUT[@CONCURRENCY]" % text)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 256)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synth:llama3-8b")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--bin", default=os.environ.get("BT_BIN", "build/bin"),
                    help="the directory holding `baton` (build/bin)")
    ap.add_argument("runs", nargs="+", help="PROMPTxOUTPUT[@CONCURRENCY]")
    a = ap.parse_args()
    try:
        runs = [parse_run(r) for r in a.runs]
    except ValueError as e:
        ap.error(str(e))
    fl = Floor(model_config(os.path.join(a.bin, "baton"), a.model),
               a.precision, a.kv_dtype)
    print("| in/out | conc | prefill floor ms | decode row floor us | "
          "floor out tok/s |\n| --- | ---: | ---: | ---: | ---: |")
    for p, o, c in runs:
        print("| %d/%d | %d | %.2f | %.1f | %s |" % (
            p, o, c, fl.prefill_s(p) * 1e3,
            fl.row_s(p + o / 2.0, c) * 1e6,
            "{:,.0f}".format(fl.tok_per_s(p, o, c))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
