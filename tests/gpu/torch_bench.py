#!/usr/bin/env python3
"""torch_bench.py - the PyTorch + transformers baseline for `make gpu-bench`.

Builds a Llama-3-8B-shaped LlamaForCausalLM with random bf16 weights on the
GPU (same shapes as baton's synth:llama3-8b; the values differ, which does
not change the speed), sdpa attention, and measures with a static KV cache:
  TPOT: (time to generate 1+N tokens - time to generate 1) / N, batch B at
        prompt length ctx;
  TTFT: time to generate 1 token from a P-token prompt (batch 1).
Eager mode (disable_compile=True): transformers would otherwise compile
the forward for every new shape, which costs minutes per shape.
Writes a markdown table to --table and prints it.
"""
import argparse
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def timed_generate(model, batch, ctx, n_new):
    ids = torch.randint(0, 128000, (batch, ctx), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids),
                   max_new_tokens=n_new, min_new_tokens=n_new,
                   do_sample=False, cache_implementation="static",
                   disable_compile=True, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default=None)
    ap.add_argument("--new", type=int, default=16)
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

    rows = ["| torch | batch | ctx | TPOT ms | TTFT ms |",
            "| --- | ---: | ---: | ---: | ---: |"]
    with torch.inference_mode():
        timed_generate(model, 1, 64, 2)  # warm-up
        for b, ctx in [(1, 512), (1, 2048), (1, 8192), (8, 2048),
                       (64, 2048)]:
            try:
                timed_generate(model, b, ctx, 1)
                t1 = timed_generate(model, b, ctx, 1)
                tn = timed_generate(model, b, ctx, 1 + args.new)
                tpot = (tn - t1) / args.new * 1e3
                rows.append(f"| decode | {b} | {ctx} | {tpot:.2f} | |")
            except Exception as e:  # noqa: BLE001 - report and go on
                rows.append(f"| decode | {b} | {ctx} | error: {type(e).__name__} | |")
                torch.cuda.empty_cache()
            print(rows[-1], flush=True)
        for p in [512, 2048, 8192]:
            try:
                timed_generate(model, 1, p, 1)
                t = min(timed_generate(model, 1, p, 1) for _ in range(3))
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
