#!/usr/bin/env python3
"""torch_bench.py - the PyTorch + transformers peer for `make gpu-bench`.

Builds a Llama-3-8B-shaped LlamaForCausalLM with random bf16 weights on the
GPU (same shapes as baton's synth:llama3-8b; the values differ, which does
not change the speed), sdpa attention, a static KV cache, and times the
model's forward passes themselves, as a careful user measures a peer:

  TPOT: prefill `ctx` tokens into a StaticCache once (untimed), run
        --warm single-token decode steps (untimed: allocator, cuBLAS
        heuristics, and with --compile the CUDA-graph capture), then
        time --new steps between two CUDA events and divide.  One step
        is exactly what baton's decode step does: B new tokens attending
        to ctx + i cached ones, logits for all B rows.
  TTFT: one forward of a P-token prompt into a fresh StaticCache (batch
        1), the minimum of 3 after a warm-up.

Why not `generate()`: the old version of this script timed generate()'s
wall time per token.  In eager mode generate() re-runs its logits
processors, stopping criteria and cache bookkeeping in Python for every
token and synchronizes each step, so it printed 69.82 ms at batch 1 @2k
against the 7.5 ms the forward pass takes (docs/PERFORMANCE.md): a peer
mis-measured by ~10× makes every ratio a lie.

Eager by default.  --compile wraps the decode step in
torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs, the
brief's "static cache, torch.compile" peer) on fewer shapes (b1 and b64
at 2k, the 2048-token prompt) since every shape compiles for minutes;
a device call of its own (`python3 tests/gpu/torch_bench.py --compile
--table $OUT/torch_compiled.md`), not part of `make gpu-bench`.

--tiny runs a 2-layer toy of the same code on the CPU (float32): a check
that the script works where there is no GPU, not a figure to quote.
Writes a markdown table to --table and prints it.
"""
import argparse
import inspect
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache


def make_cache(cfg, batch, max_len, device, dtype):
    """A StaticCache across transformers versions: 5.x sizes its layers
    lazily from the first update, 4.x wants batch, device and dtype."""
    params = inspect.signature(StaticCache.__init__).parameters
    kw = {"config": cfg, "max_cache_len": max_len}
    if "max_batch_size" in params:
        kw["max_batch_size"] = batch
    if "device" in params:
        kw["device"] = device
    if "dtype" in params:
        kw["dtype"] = dtype
    return StaticCache(**kw)


class Timer:
    """Elapsed seconds between start() and stop(): CUDA events on the
    GPU (no host overhead between steps is hidden or added), the wall
    clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e1 = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            self.e0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            self.e1.record()
            torch.cuda.synchronize()
            return self.e0.elapsed_time(self.e1) / 1e3
        return time.perf_counter() - self.t0


def prefill(model, cache, ids):
    pos = torch.arange(ids.shape[1], device=ids.device)
    return model(input_ids=ids, past_key_values=cache, cache_position=pos,
                 use_cache=True).logits


def decode_tpot(model, cfg, batch, ctx, n_new, n_warm, step_fn, device,
                dtype):
    """(seconds per decode step, host seconds per step) at `batch`
    sequences of `ctx` cached tokens (the cache grows by one token per
    step, as in serving).  The host figure is the wall time of issuing
    the timed steps before the final sync: when it is as large as the
    step, the step waits for Python to launch its kernels (eager mode's
    launch bound on this host's CPU), not for the GPU."""
    cache = make_cache(cfg, batch, ctx + n_warm + n_new + 1, device, dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, ctx), device=device)
    prefill(model, cache, ids)
    tok = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)
    pos = torch.empty(1, dtype=torch.long, device=device)
    timer = Timer(device)
    for i in range(n_warm + n_new):
        if i == n_warm:
            timer.start()
            t_host = time.perf_counter()
        pos.fill_(ctx + i)
        step_fn(tok, cache, pos)
    t_host = time.perf_counter() - t_host
    return timer.stop() / n_new, t_host / n_new


def prompt_ttft(model, cfg, p, device, dtype):
    ids = torch.randint(0, cfg.vocab_size, (1, p), device=device)
    timer = Timer(device)
    best = None
    for i in range(4):  # the first is the warm-up
        cache = make_cache(cfg, 1, p + 1, device, dtype)
        timer.start()
        prefill(model, cache, ids)
        t = timer.stop()
        if i > 0:
            best = t if best is None else min(best, t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default=None)
    ap.add_argument("--new", type=int, default=64,
                    help="timed decode steps per shape")
    ap.add_argument("--warm", type=int, default=8,
                    help="untimed decode steps before timing")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tiny", action="store_true",
                    help="2-layer toy on the CPU: checks the script only")
    args = ap.parse_args()

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        cfg = LlamaConfig(vocab_size=512, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=1024)
        shapes, prompts = [(1, 64), (4, 64)], [64]
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096,
                          intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=8192 + 256,
                          rope_theta=500000.0, rms_norm_eps=1e-5,
                          tie_word_embeddings=False)
        shapes = ([(1, 2048), (64, 2048)] if args.compile else
                  [(1, 512), (1, 2048), (1, 8192), (8, 2048), (64, 2048)])
        prompts = [2048] if args.compile else [512, 2048, 8192]
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model.eval()
    torch.set_default_dtype(torch.float32)
    name = (torch.cuda.get_device_name() if device.type == "cuda"
            else "cpu (--tiny)")
    print(f"torch {torch.__version__}, transformers {transformers.__version__},"
          f" {name}, init {time.perf_counter()-t0:.1f} s", flush=True)

    def step(tok, cache, pos):
        return model(input_ids=tok, past_key_values=cache,
                     cache_position=pos, use_cache=True).logits

    step_fn = step
    if args.compile:
        step_fn = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    mode = "compiled" if args.compile else "eager"
    rows = [f"| torch ({mode}) | batch | ctx | TPOT ms | TTFT ms | host ms/step |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    with torch.inference_mode():
        for b, ctx in shapes:
            try:
                t, h = decode_tpot(model, cfg, b, ctx, args.new, args.warm,
                                   step_fn, device, dtype)
                rows.append(f"| decode | {b} | {ctx} | {t*1e3:.2f} | | "
                            f"{h*1e3:.2f} |")
            except Exception as e:  # noqa: BLE001 - report and go on
                rows.append(f"| decode | {b} | {ctx} | error: "
                            f"{type(e).__name__}: {e} | | |")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            print(rows[-1], flush=True)
        for p in prompts:
            try:
                t = prompt_ttft(model, cfg, p, device, dtype)
                rows.append(f"| prefill | 1 | {p} | | {t*1e3:.2f} | |")
            except Exception as e:  # noqa: BLE001
                rows.append(f"| prefill | 1 | {p} | | error: "
                            f"{type(e).__name__}: {e} | |")
                if device.type == "cuda":
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
