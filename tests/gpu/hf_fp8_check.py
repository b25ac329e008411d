#!/usr/bin/env python3
"""hf_fp8_check.py - the transformers side of the FP8 round trip (issue 37),
driven by tests/gpu/run_gpu_hf_fp8.sh on the device machine:

  write DIR TOKENS REFS   transformers makes an 8B-shaped Llama (Llama-3-8B
                          shapes, vocab 32000 for the llama2 tokenizer, bf16,
                          seeded init on the GPU), saves it with
                          save_pretrained (safetensors, 5 GB shards), and
                          records the teacher-forced top-1 and margin of
                          every position of TOKENS in bf16 and, the same
                          weights upcast, in f32 (the ceiling: what bf16
                          rounding alone moves).
  load DIR TOKENS OUT     transformers loads the FP8 checkpoint that
                          `baton model quantize --fp8` wrote: first its real
                          compressed-tensors loader (from_pretrained) when
                          `import compressed_tensors` works, else (or when
                          it raises) the fallback below; records which ran,
                          the exceptions, a weight check and the top-1.
  summary WORK OUT.md     the agreement table from WORK's files.

Why a ceiling and a margin split rather than a "peaked" init: top-1
agreement under a perturbation does not change when the logits are
scaled (a larger classifier init scales the perturbation by the same
factor), and a random 32-layer model has small top-1 margins.  So each
agreement is reported raw, on the half of the positions where the
reference's margin is largest, next to bf16-vs-f32 of the same weights.

The fallback does what compressed-tensors' "float-quantized" path does:
reads config.json's quantization_config, loads the safetensors,
dequantizes weight * weight_scale (per channel or per tensor) into a
transformers LlamaForCausalLM built from the config, and fake-quantizes
each Linear input to E4M3 as the scheme says (dynamic: a scale per token,
absmax / 448; static: the checkpoint's input_scale), like
compressed-tensors' forward.
"""
import json
import os
import statistics
import sys
import time
import traceback

E4M3_MAX = 448.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
           "down_proj")


def read_tokens(path):
    with open(path) as f:
        return [int(t) for t in f.read().replace(",", " ").split()]


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def llama3_8b_config(layers):
    """Llama-3-8B shapes with the llama2 vocabulary.  transformers 5.x
    takes the RoPE base in rope_parameters (a plain rope_theta argument
    would be kept as an unused attribute: base 10000), 4.x as
    rope_theta."""
    import inspect
    from transformers import LlamaConfig
    kw = dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, initializer_range=0.02)
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default",
                                 "rope_theta": 500000.0}
    else:
        kw["rope_theta"] = 500000.0
    cfg = LlamaConfig(**kw)
    set_theta(cfg, 500000.0)
    return cfg


def set_theta(tcfg, theta):
    """Makes a transformers config hold RoPE base theta wherever this
    version reads it; raises when it still does not."""
    if config_theta(tcfg) != theta:
        if isinstance(getattr(tcfg, "rope_parameters", None), dict):
            tcfg.rope_parameters["rope_theta"] = theta
        else:
            tcfg.rope_theta = theta
    if config_theta(tcfg) != theta:
        raise ValueError("cannot set rope_theta %r (config holds %r)" % (
            theta, config_theta(tcfg)))


def make_model(cfg):
    """A LlamaForCausalLM initialized on the GPU in bf16 (what
    from_config(dtype=...) does, without its version-dependent keyword:
    the RoPE inverse frequencies are f32 whatever the default dtype)."""
    import torch
    from transformers import LlamaForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def config_theta(tcfg):
    """The RoPE base a transformers config object holds."""
    rp = getattr(tcfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return rp["rope_theta"]
    return getattr(tcfg, "rope_theta", None)


def rope_theta_of(cfg_json):
    rp = cfg_json.get("rope_parameters") or {}
    return rp.get("rope_theta", cfg_json.get("rope_theta"))


def top1(model, ids):
    """Teacher-forced top-1 and margin (largest - second logit) of every
    position.  The classifier runs in f32 on the final normed hidden
    states: bf16 logits would tie often and break ties by index."""
    import torch
    with torch.no_grad():
        x = torch.tensor([ids], device="cuda")
        h = model.model(input_ids=x, use_cache=False).last_hidden_state[0]
        w = model.lm_head.weight
        logits = h.float() @ w.float().t()
        v, i = torch.topk(logits, 2, dim=-1)
        torch.cuda.synchronize()
    return {"top1": i[:, 0].tolist(),
            "margin": (v[:, 0] - v[:, 1]).tolist()}


def cmd_write(out_dir, tokens_path, refs_path):
    import torch
    layers = int(os.environ.get("HF8_LAYERS", "32"))
    seed = int(os.environ.get("HF8_SEED", "0"))
    ids = read_tokens(tokens_path)
    res = {"layers": layers, "seed": seed, "n_tokens": len(ids),
           "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    import transformers
    res["transformers"] = transformers.__version__
    t0 = time.time()
    torch.manual_seed(seed)
    model = make_model(llama3_8b_config(layers))
    torch.cuda.synchronize()
    res["init_s"] = time.time() - t0
    res["params"] = sum(p.numel() for p in model.parameters())
    t0 = time.time()
    res["bf16"] = top1(model, ids)
    res["bf16_s"] = time.time() - t0
    t0 = time.time()
    # (no sync: the next steps read it from the page cache)
    model.save_pretrained(out_dir, max_shard_size="5GB")
    res["save_s"] = time.time() - t0
    res["bytes"] = dir_bytes(out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        res["rope_theta"] = rope_theta_of(json.load(f))
    with open(refs_path, "w") as f:  # the rest still runs if f32 fails
        json.dump(res, f)
    t0 = time.time()
    model.float()  # the same weights, f32 compute: the ceiling
    res["f32"] = top1(model, ids)
    res["f32_s"] = time.time() - t0
    with open(refs_path, "w") as f:
        json.dump(res, f)
    print("write: %d params, init %.1f s, save %.1f s (%.2f GB)" % (
        res["params"], res["init_s"], res["save_s"], res["bytes"] / 1e9))


def quant_scheme(cfg):
    """(weights strategy, input activations dict or None) of the one
    config group baton writes."""
    qc = cfg["quantization_config"]
    if qc.get("quant_method") != "compressed-tensors" or \
            qc.get("format") != "float-quantized":
        raise ValueError("not a compressed-tensors float-quantized "
                         "checkpoint: %r" % (qc.get("quant_method"),))
    groups = list(qc["config_groups"].values())
    if len(groups) != 1 or groups[0]["weights"]["num_bits"] != 8:
        raise ValueError("expected one 8-bit config group")
    return groups[0]["weights"]["strategy"], groups[0].get(
        "input_activations")


def fake_quant_hook(static_scale):
    """A forward pre-hook that rounds a Linear's input to E4M3, as
    compressed-tensors' fake quantization does: x = fp8(x / s) * s, with
    s = absmax / 448 per token (dynamic) or the checkpoint's input_scale."""
    import torch

    def hook(mod, args):
        x = args[0]
        xf = x.float()
        if static_scale is not None:
            s = static_scale
        else:
            s = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / \
                E4M3_MAX
        q = (xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return (q.float() * s).to(x.dtype),
    return hook


def load_fallback(d):
    """The compressed-tensors float-quantized path, by hand."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    wstrategy, inact = quant_scheme(cfg)
    # the config read as from_pretrained reads it, without the quantizer
    tcfg = AutoConfig.from_pretrained(d)
    try:
        del tcfg.quantization_config
    except AttributeError:
        pass
    theta, note = rope_theta_of(cfg), ""
    if config_theta(tcfg) != theta:
        # a finding for the summary, then the file's value (else the
        # agreement below would measure the RoPE base, not FP8)
        note = "; transformers read rope_theta %r, file %r: set" % (
            config_theta(tcfg), theta)
        set_theta(tcfg, theta)
    model = make_model(tcfg)
    # tensor by tensor into the model's parameters (a whole state dict
    # would hold a second copy of the weights on the GPU)
    params = dict(model.named_parameters())
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    seen, unexpected, in_scales = set(), [], {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt",
                       device="cuda") as st:
            for k in st.keys():
                if k.endswith(".weight_scale") or k.endswith(".k_scale") \
                        or k.endswith(".v_scale"):
                    continue
                t = st.get_tensor(k)
                if k.endswith(".input_scale"):
                    in_scales[k[:-len(".input_scale")]] = t.float()
                    continue
                if t.dtype == torch.float8_e4m3fn:
                    s = st.get_tensor(k[:-len("weight")] + "weight_scale")
                    t = t.float() * s.float()
                if k not in params or params[k].shape != t.shape:
                    unexpected.append(k)
                    continue
                with torch.no_grad():
                    params[k].copy_(t.to(params[k].dtype))
                seen.add(k)
                del t
    missing = [k for k in params if k not in seen]
    if missing or unexpected:
        raise ValueError("fallback: missing %s, unexpected %s" % (
            missing[:4], unexpected[:4]))
    n_hooks = 0
    if inact is not None and inact.get("num_bits") == 8:
        for name, mod in model.named_modules():
            if name.split(".")[-1] in LINEARS:
                s = None if inact.get("dynamic") else in_scales[name]
                mod.register_forward_pre_hook(fake_quant_hook(s))
                n_hooks += 1
    model.eval()
    return model, "fallback (weights %s, %d Linear inputs fake-quantized " \
        "%s%s)" % (wstrategy, n_hooks,
                   "dynamic per token" if inact and inact.get("dynamic")
                   else "static", note)


def weight_check(model, fp8_dir, bf16_dir):
    """Layer 0's q_proj as the loaded model holds it against the codes *
    scales in the file (what transformers read) and the original bf16
    weight (what FP8 lost): relative L2 errors."""
    import torch
    from safetensors import safe_open
    name = "model.layers.0.self_attn.q_proj"
    mod = model.get_submodule(name)
    w = mod.weight
    if w.dtype == torch.float8_e4m3fn:
        w = w.float() * mod.weight_scale.float()
    w = w.float()

    def find(d, key):
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(d, fn), framework="pt",
                               device="cuda") as st:
                    if key in st.keys():
                        return st.get_tensor(key)
        raise KeyError(key)
    deq = find(fp8_dir, name + ".weight").float() * \
        find(fp8_dir, name + ".weight_scale").float()
    orig = find(bf16_dir, name + ".weight").float()
    rel = lambda a, b: float((a - b).norm() / b.norm())
    return {"module": type(mod).__name__, "held_dtype": str(mod.weight.dtype),
            "vs_file": rel(w, deq), "vs_bf16": rel(w, orig)}


def cmd_load(d, tokens_path, out_path):
    import torch
    ids = read_tokens(tokens_path)
    res = {"dir": d, "bytes": dir_bytes(d), "errors": []}
    model = None
    if os.environ.get("HF8_FALLBACK_ONLY") == "1":
        # a second step after transformers' loader failed or ran out of
        # time: keep what the first one found
        try:
            with open(out_path) as f:
                res["errors"] = json.load(f)["errors"]
        except (OSError, ValueError, KeyError):
            res["errors"].append("transformers' loader: no result (killed "
                                 "at its step's time limit?)")
    else:
        try:
            import compressed_tensors
            res["compressed_tensors"] = getattr(compressed_tensors,
                                                "__version__", "?")
        except Exception as e:  # the device may lack pydantic
            res["errors"].append("import compressed_tensors: %s: %s" % (
                type(e).__name__, e))
    if "compressed_tensors" in res:
        from transformers import AutoModelForCausalLM
        tries = [("from_pretrained", {}),
                 ("from_pretrained run_compressed=False", {"rc": False})]
        for what, kw in tries:
            try:
                extra = {}
                if "rc" in kw:
                    from transformers import CompressedTensorsConfig
                    extra["quantization_config"] = CompressedTensorsConfig(
                        run_compressed=kw["rc"])
                t0 = time.time()
                model = AutoModelForCausalLM.from_pretrained(
                    d, dtype=torch.bfloat16, device_map="cuda", **extra)
                model.eval()
                res["load_s"] = time.time() - t0
                t0 = time.time()
                res.update(top1(model, ids))
                res["fwd_s"] = time.time() - t0
                res["loader"] = "transformers %s (compressed-tensors %s; " \
                    "rope_theta read %r)" % (what, res["compressed_tensors"],
                                             config_theta(model.config))
                break
            except Exception as e:
                res["errors"].append("%s: %s: %s" % (
                    what, type(e).__name__,
                    str(e).replace("\n", " ")[:300]))
                with open(out_path, "w") as f:  # for a fallback step
                    json.dump(res, f)
                traceback.print_exc()
                model = None
                res.pop("top1", None)
                torch.cuda.empty_cache()
    if model is None:
        try:
            t0 = time.time()
            model, res["loader"] = load_fallback(d)
            res["load_s"] = time.time() - t0
            t0 = time.time()
            res.update(top1(model, ids))
            res["fwd_s"] = time.time() - t0
        except Exception as e:
            res["errors"].append("fallback: %s: %s" % (
                type(e).__name__, str(e).replace("\n", " ")[:300]))
            traceback.print_exc()
            model = None
    if model is not None and os.environ.get("HF8_BF16_DIR"):
        try:
            res["weights"] = weight_check(model, d,
                                          os.environ["HF8_BF16_DIR"])
        except Exception as e:
            res["errors"].append("weight check: %s: %s" % (
                type(e).__name__, e))
    with open(out_path, "w") as f:
        json.dump(res, f)
    print("load %s: %s; errors: %s" % (d, res.get("loader", "FAILED"),
                                       res["errors"]))
    return 0 if "top1" in res else 1


# ---------------------------------------------------------------------
# summary (plain Python: also runs where torch is absent)

def read_baton(path):
    """test_teacher_top1's output: '# header', then 'i top1 margin logit'."""
    top, margin = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            i, t, m, _ = line.split()
            if int(i) != len(top):
                raise ValueError("%s: position %s out of order" % (path, i))
            top.append(int(t))
            margin.append(float(m))
    return {"top1": top, "margin": margin}


def agreement(a, ref):
    """(raw, confident-half, n): top-1 agreement of a with ref, over all
    positions and over the half where ref's margin is largest."""
    n = min(len(a["top1"]), len(ref["top1"]))
    if n == 0:
        return None
    same = [a["top1"][i] == ref["top1"][i] for i in range(n)]
    med = statistics.median(ref["margin"][:n])
    conf = [same[i] for i in range(n) if ref["margin"][i] >= med]
    return (sum(same) / n, sum(conf) / max(len(conf), 1), n)


def cmd_summary(work, out_md):
    def load(name):
        p = os.path.join(work, name)
        if not os.path.exists(p):
            return None
        if name.endswith(".json"):
            with open(p) as f:
                return json.load(f)
        return read_baton(p)

    refs = load("refs.json") or {}
    series = {
        "hf bf16": refs.get("bf16"), "hf f32": refs.get("f32"),
        "hf fp8 dyn": load("hf_dyn.json"), "hf fp8 cal": load("hf_cal.json"),
        "baton bf16": load("b_bf16.txt"), "baton f32": load("b_f32.txt"),
        "baton fp8 (own quant)": load("b_fp8.txt"),
        "baton fp8 dyn": load("b_fp8dyn.txt"),
        "baton fp8 cal": load("b_fp8cal.txt"),
    }
    rows = [
        ("ceiling", "hf bf16", "hf f32",
         "bf16 rounding alone, same weights (transformers)"),
        ("ceiling", "baton bf16", "baton f32",
         "bf16 rounding alone, same weights (baton)"),
        ("(i)", "hf fp8 dyn", "hf bf16",
         "transformers on the dynamic FP8 checkpoint vs bf16"),
        ("(i)", "hf fp8 cal", "hf bf16",
         "transformers on the calibrated FP8 checkpoint vs bf16"),
        ("(ii)", "baton fp8 dyn", "baton bf16",
         "baton fp8 on the dynamic checkpoint vs bf16"),
        ("(ii)", "baton fp8 cal", "baton bf16",
         "baton fp8 on the calibrated checkpoint vs bf16"),
        ("(ii)", "baton fp8 (own quant)", "baton bf16",
         "baton fp8 quantizing the bf16 dir itself vs bf16"),
        ("(iii)", "baton bf16", "hf bf16",
         "loader fidelity: baton bf16 vs transformers bf16"),
        ("(iii)", "baton f32", "hf f32",
         "loader fidelity in f32"),
        ("cross", "baton fp8 dyn", "hf fp8 dyn",
         "same FP8 checkpoint, baton vs transformers"),
        ("cross", "baton fp8 cal", "hf fp8 cal",
         "same FP8 checkpoint, baton vs transformers"),
    ]
    out = ["# FP8 checkpoint round trip (issue 37)", ""]
    if refs:
        out.append("transformers %s, torch %s, %s; %d-layer Llama-3-8B "
                   "shape (vocab 32000, rope_theta %s as saved), %d params, "
                   "seed %d; %d tokens teacher-forced." % (
                       refs.get("transformers"), refs.get("torch"),
                       refs.get("device"), refs.get("layers"),
                       refs.get("rope_theta"), refs.get("params", 0),
                       refs.get("seed", 0), refs.get("n_tokens", 0)))
        b = refs.get("bf16") or {}
        if b.get("margin"):
            out.append("bf16 reference: %d distinct top-1 ids; margin "
                       "(top - second logit) median %.3f, p10 %.3f." % (
                           len(set(b["top1"])),
                           statistics.median(b["margin"]),
                           sorted(b["margin"])[len(b["margin"]) // 10]))
    out += ["", "| | comparison | top-1 agreement | on the confident half "
            "| positions | what |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for tag, a, r, what in rows:
        if series.get(a) is None or series.get(r) is None or \
                "top1" not in series[a] or "top1" not in series[r]:
            out.append("| %s | %s vs %s | not run | | | %s |" % (
                tag, a, r, what))
            continue
        ag = agreement(series[a], series[r])
        out.append("| %s | %s vs %s | %.2f%% | %.2f%% | %d | %s |" % (
            tag, a, r, 100 * ag[0], 100 * ag[1], ag[2], what))
    out += ["", "Reading: random weights leave small margins, so no row "
            "reaches 100%; the ceiling is what bf16 rounding alone moves.  "
            "(ii) close to (i): baton's FP8 loses no more than transformers' "
            "on the same checkpoint; cross close to (iii): both read the FP8 "
            "checkpoint alike."]
    out += ["", "| checkpoint / load | result |", "| --- | --- |"]
    if refs:
        out.append("| bf16 (transformers save_pretrained) | %.2f GB, init "
                   "%.1f s, save %.1f s |" % (refs.get("bytes", 0) / 1e9,
                                               refs.get("init_s", 0),
                                               refs.get("save_s", 0)))
    for name in ("hf_dyn.json", "hf_cal.json"):
        r = load(name)
        if r is None:
            out.append("| %s | not run |" % name)
            continue
        cell = "%.2f GB; loaded by %s in %.1f s" % (
            r.get("bytes", 0) / 1e9, r.get("loader", "NOTHING (failed)"),
            r.get("load_s", 0))
        if r.get("weights"):
            w = r["weights"]
            cell += "; q_proj.0 held as %s %s, rel. L2 vs file codes*scales " \
                "%.2e, vs bf16 original %.2e" % (
                    w["module"], w["held_dtype"], w["vs_file"], w["vs_bf16"])
        if r.get("errors"):
            cell += "; errors: " + " / ".join(
                e.replace("|", "/") for e in r["errors"])
        out.append("| %s | %s |" % (name, cell))
    with open(out_md, "a") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


def main(argv):
    if len(argv) == 5 and argv[1] == "write":
        cmd_write(argv[2], argv[3], argv[4])
        return 0
    if len(argv) == 5 and argv[1] == "load":
        return cmd_load(argv[2], argv[3], argv[4])
    if len(argv) == 4 and argv[1] == "summary":
        cmd_summary(argv[2], argv[3])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
