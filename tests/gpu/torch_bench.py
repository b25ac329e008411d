#!/usr/bin/env python3
"""torch_bench.py - the PyTorch + transformers baseline for `make gpu-bench`.

Builds a Llama-3-8B-shaped LlamaForCausalLM with random bf16 weights on the
GPU (same shapes as baton's synth:llama3-8b; the values differ, which does
not change the speed), sdpa attention, and measures with a static KV cache:
  TPOT: (time to generate 1+N tokens - time to generate 1) / N, batch B at
        prompt length ctx;
  TTFT: time to generate 1 token from a P-token prompt (batch 1).
Eager mode (disable_compile=True) by default: transformers would
otherwise compile the forward for every new shape, which costs minutes
per shape.  --compile lets generate() compile its decode step (the
brief's "static cache, torch.compile" peer) on fewer shapes (b1 and b64
at 2k, the 2048-token prompt), each warmed up with a full untimed run
first so the compile is not timed; minutes of device time, so a call
of its own (`python3 tests/gpu/torch_bench.py --compile --table
$OUT/torch_compiled.md`), not part of `make gpu-bench`.
Writes a markdown table to --table and prints it.
"""
import argparse
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def timed_generate(model, batch, ctx, n_new, compiled=False):
    ids = torch.randint(0, 128000, (batch, ctx), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids),
                   max_new_tokens=n_new, min_new_tokens=n_new,
                   do_sample=False, cache_implementation="static",
                   disable_compile=not compiled, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default=None)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192 + 64,
                      rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.eval()
    torch.set_default_dtype(torch.float32)
    print(f"torch {torch.__version__}, transformers {transformers.__version__},"
          f" {torch.cuda.get_device_name()}, init {time.perf_counter()-t0:.1f} s",
          flush=True)

    cm = args.compile
    mode = "compiled" if cm else "eager"
    rows = [f"| torch ({mode}) | batch | ctx | TPOT ms | TTFT ms |",
            "| --- | ---: | ---: | ---: | ---: |"]
    shapes = ([(1, 2048), (64, 2048)] if cm else
              [(1, 512), (1, 2048), (1, 8192), (8, 2048), (64, 2048)])
    prompts = [2048] if cm else [512, 2048, 8192]
    with torch.inference_mode():
        timed_generate(model, 1, 64, 2, cm)  # warm-up
        for b, ctx in shapes:
            try:
                # untimed (compiled: builds the decode step of this shape)
                timed_generate(model, b, ctx, 1 + args.new if cm else 1, cm)
                t1 = timed_generate(model, b, ctx, 1, cm)
                tn = timed_generate(model, b, ctx, 1 + args.new, cm)
                tpot = (tn - t1) / args.new * 1e3
                rows.append(f"| decode | {b} | {ctx} | {tpot:.2f} | |")
            except Exception as e:  # noqa: BLE001 - report and go on
                rows.append(f"| decode | {b} | {ctx} | error: {type(e).__name__} | |")
                torch.cuda.empty_cache()
            print(rows[-1], flush=True)
        for p in prompts:
            try:
                timed_generate(model, 1, p, 1, cm)
                t = min(timed_generate(model, 1, p, 1, cm) for _ in range(3))
                rows.append(f"| prefill | 1 | {p} | | {t*1e3:.2f} |")
            except Exception as e:  # noqa: BLE001
                rows.append(f"| prefill | 1 | {p} | | error: {type(e).__name__} |")
                torch.cuda.empty_cache()
            print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
