#!/usr/bin/env python3
"""test_hf_tokenizers.py - baton's tokenizer.json implementation against the
Hugging Face `tokenizers` library (run where the library is installed: the
device machine; no network needed).

1. Builds a corpus from the repository's own docs and sources plus
   generated corner-case lines (digits, contractions, whitespace runs,
   emoji, CJK and other scripts, special-token strings inside text).
2. Trains tokenizers with `tokenizers` on it and saves their tokenizer.json:
     bl_llama3   byte-level BPE, Llama 3's Split regex + ByteLevel,
                 ignore_merges, special added tokens
     bl_gpt2     the same vocabulary with GPT-2's ByteLevel(use_regex,
                 add_prefix_space)
     bl_qwen2    the same vocabulary with Qwen 2's regex (single digits)
     sp_prepend  sentencepiece-style BPE: Prepend/Replace normalizer, byte
                 fallback, Replace/ByteFallback/Fuse/Strip decoder
     sp_meta     the same vocabulary with the older Metaspace pre-tokenizer
     bl_qwen_nfc bl_qwen2 with Qwen 2.5's NFC normalizer, plus a
                 normalized (non-special) added token "<é>"
     bl_nfkc     bl_llama3 with an NFKC normalizer
     sp_nfc_seq  sp_prepend with Sequence [NFC, Prepend, Replace] and
                 "</s>" marked normalized (the library then matches it as
                 "▁</s>" in the normalized text)
   The corpus has non-normalized lines for these: decomposed accents,
   reordered combining marks, Hangul jamo, kana voicing marks, ligatures,
   full-width and circled digits, singletons (Ω, Å, CJK compatibility).
3. Encodes every line with the library and with `baton tokenize --lines`
   and compares the ids; decodes a sample both ways (skip special tokens).
4. Times single-core encoding of the whole corpus: baton vs the library.

Usage: test_hf_tokenizers.py BATON_BINARY OUT_DIR
Exit status 0 when every id matches.

Result on the H200 machine (2026-11-29, tokenizers 0.23.2, baton built
with -O2 on the dev machine; MB/s of UTF-8 text, one core each):

  tokenizer     lines      ids  mism  dec decbad  hf MB/s  hf best  baton  x3
  bl_llama3     46706   481094     0  144      0     1.38     1.60  15.04 23.59
  bl_gpt2       46706   569903     0  144      0     1.23     1.33  14.76 16.16
  bl_qwen2      46706   495128     0  144      0     1.12     1.32  15.92 21.96
  sp_prepend    46706   617632     0  144      0     1.31     1.75   2.71  2.68
  sp_meta       46706   586860     0  144      0     1.25     1.30  12.55 11.50

(throughput: the whole 1.7 MB corpus as one text; sp_prepend has no
pre-tokenizer, so that text is a single 1.7 MB BPE word for both.)
"""
import json
import os
import random
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # single core, before the import
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import (Regex, Tokenizer, decoders, models,  # noqa: E402
                        normalizers, pre_tokenizers, trainers)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SP = "\u2581"

BATON = sys.argv[1]
OUT = sys.argv[2]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
os.makedirs(OUT, exist_ok=True)
LOG = open(os.path.join(OUT, "hftok_log.txt"), "w")


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def repo_lines():
    exts = (".c", ".h", ".md", ".py", ".sh", ".txt", ".proto", ".cu",
            ".cmake", ".jsonl")
    lines = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not d.startswith("build") and d != "corpus")
        for f in sorted(files):
            if f.endswith(exts) or f == "CMakeLists.txt" or f == "Makefile":
                try:
                    data = open(os.path.join(root, f), "rb").read()
                except OSError:
                    continue
                text = data.decode("utf-8", errors="replace")
                lines.extend(text.split("\n"))
    return [l for l in lines if "\x00" not in l]


CORNER_WORDS = [
    "the", "The", " river", "probability", "Hello", "world", "naïve",
    "café", "Straße", "don't", "I'M", "she'll", "we'VE", "it's", "THEY'RE",
    "you'd", "'s", "'", "''", "1", "12", "123", "1234", "1234567",
    "3.14159", "0x1F", "2026-11-29", "½", "²", "٣", "४२", "中文", "日本語",
    "한국어", "Привет", "Γειά", "مرحبا", "नमस्ते", "สวัสดี", "😀", "👍🏽",
    "👨\u200d👩\u200d👧", "🇫🇷", "e\u0301", "\u00a0", "\u3000", "\u2028",
    "\u200b", "\t", "\r", "\r\n", " ", "  ", "   ", "     ", "\t\t",
    "<|eot_id|>", "<|begin_of_text|>", "<s>", "</s>", "<unk>", "<0x41>",
    SP, SP + "x", "http://x.y/z?q=1&r=2", "a.b", "...", "!!!", "?!",
    "(x)", "[INST]", "{\"k\": [1, 2]}", "#include <stdio.h>", "->", "::",
    "snake_case", "camelCase", "ALLCAPS", "x" * 40, "ab" * 30,
    # not normalized: NFC / NFKC change these
    "cafe\u0301", "A\u030a", "\u212b", "\u2126", "a\u0323\u0302",
    "a\u0302\u0323", "\u00e9\u0323", "\u1112\u1161\u11ab",
    "\uac00\u11a8", "\u304b\u3099", "\ufb01le", "\uff11\uff12\uff13",
    "\u2460", "\u00bd", "\u037e", "\uf900", "\u4e2d\u0301", "<\u00e9>",
    "<e\u0301>", "\u3300", "\u00aa", "\u2075",
]


def norm_lines(n, seed=99):
    """Lines of text that is not in NFC / NFKC: base letters with random
    combining marks (in random order), Hangul jamo sequences, kana with
    voicing marks, compatibility characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice("aeiouAEIOUnNcCsSzZ" + "\u00e9\u00c5")
                             + "".join(chr(rng.randint(0x300, 0x36f))
                                       for _ in range(rng.randint(1, 3))))
            elif r < 0.45:
                parts.append(chr(rng.randint(0x1100, 0x1112)) +
                             chr(rng.randint(0x1161, 0x1175)) +
                             (chr(rng.randint(0x11a8, 0x11c2))
                              if rng.random() < 0.5 else ""))
            elif r < 0.55:
                parts.append(chr(rng.randint(0x3041, 0x3096)) +
                             chr(rng.choice([0x3099, 0x309a])))
            elif r < 0.75:
                parts.append(chr(rng.choice([
                    rng.randint(0xff01, 0xff5e), rng.randint(0xfb00, 0xfb06),
                    rng.randint(0x2460, 0x2473), rng.randint(0x3300, 0x3357),
                    rng.randint(0x2070, 0x2079), rng.randint(0xf900, 0xfa2d),
                    0x212b, 0x2126, 0x00a0, 0x2002, 0x00bd])))
            elif r < 0.9:
                parts.append(rng.choice(CORNER_WORDS))
            else:
                parts.append(" " * rng.randint(1, 3))
        out.append("".join(parts).replace("\n", " "))
    return out


def corner_lines(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 14)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(CORNER_WORDS))
            elif r < 0.85:
                parts.append(" " * rng.randint(1, 6))
            else:
                parts.append(chr(rng.choice([
                    rng.randint(0x21, 0x7e), rng.randint(0xa1, 0x24f),
                    rng.randint(0x370, 0x3ff), rng.randint(0x4e00, 0x9fff),
                    rng.randint(0x1f300, 0x1f64f), rng.randint(0xac00, 0xd7a3),
                ])))
        out.append("".join(parts).replace("\n", " "))
    return out


def bpe_model(**kw):
    try:
        return models.BPE(**kw)
    except TypeError:  # older library without some keyword
        kw.pop("ignore_merges", None)
        return models.BPE(**kw)


def train_bytelevel(lines, vocab):
    tok = Tokenizer(bpe_model(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated",
                             invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, show_progress=False,
        special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=tr)
    return json.loads(tok.to_str())


def train_sp(lines, vocab):
    tok = Tokenizer(bpe_model(unk_token="<unk>", byte_fallback=True,
                              fuse_unk=True))
    try:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SP, prepend_scheme="always", split=True)
    except TypeError:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SP, add_prefix_space=True)
    tr = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=300)
    tok.train_from_iterator(lines, trainer=tr)
    j = json.loads(tok.to_str())
    # The 256 byte pieces as ordinary vocab entries (not added tokens), as
    # in Llama 2's tokenizer.json.
    vocab_map = j["model"]["vocab"]
    next_id = max(list(vocab_map.values()) +
                  [a["id"] for a in j["added_tokens"]]) + 1
    for b in range(256):
        name = "<0x%02X>" % b
        if name not in vocab_map:
            vocab_map[name] = next_id
            next_id += 1
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = True
    j["model"]["unk_token"] = "<unk>"
    return j


def variants(bl, sp):
    out = {}
    out["bl_llama3"] = bl
    g = json.loads(json.dumps(bl))
    g["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True,
                          "trim_offsets": True, "use_regex": True}
    if "ignore_merges" in g["model"]:
        g["model"]["ignore_merges"] = False
    out["bl_gpt2"] = g
    q = json.loads(json.dumps(bl))
    q["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": QWEN2}
    if "ignore_merges" in q["model"]:
        q["model"]["ignore_merges"] = False
    out["bl_qwen2"] = q
    p = json.loads(json.dumps(sp))
    p["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": SP},
        {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
    p["pre_tokenizer"] = None
    p["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    out["sp_prepend"] = p
    m = json.loads(json.dumps(sp))
    m["normalizer"] = None
    m["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP,
                          "prepend_scheme": "first", "split": True}
    m["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first",
         "split": True}]}
    out["sp_meta"] = m
    qn = json.loads(json.dumps(q))
    qn["normalizer"] = {"type": "NFC"}
    next_id = max(list(qn["model"]["vocab"].values()) +
                  [a["id"] for a in qn["added_tokens"]]) + 1
    qn["added_tokens"].append({
        "id": next_id, "content": "<\u00e9>", "single_word": False,
        "lstrip": False, "rstrip": False, "normalized": True,
        "special": False})
    out["bl_qwen_nfc"] = qn
    k = json.loads(json.dumps(bl))
    k["normalizer"] = {"type": "NFKC"}
    out["bl_nfkc"] = k
    ps = json.loads(json.dumps(p))
    ps["normalizer"]["normalizers"].insert(0, {"type": "NFC"})
    for a in ps["added_tokens"]:
        if a["content"] == "</s>":
            a["normalized"] = True
    out["sp_nfc_seq"] = ps
    return out


def baton_encode_lines(path, lines_file):
    r = subprocess.run([BATON, "tokenize", "--tokenizer", path, "--file",
                        lines_file, "--lines", "--no-bos", "--time"],
                       capture_output=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("baton tokenize failed: " +
                           r.stderr.decode(errors="replace")[-2000:])
    out = r.stdout.decode().split("\n")
    if out and out[-1] == "":
        out.pop()
    return [[int(x) for x in l.split()] for l in out], r.stderr.decode()


def baton_time_whole(path, corpus_file, repeat):
    r = subprocess.run([BATON, "tokenize", "--tokenizer", path, "--file",
                        corpus_file, "--no-bos", "--time", "--repeat",
                        str(repeat)], capture_output=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode(errors="replace")[-2000:])
    stat = dict(kv.split(":", 1) for kv in
                r.stderr.decode().strip().split("\n")[-1].split()[1:5])
    return float(stat["MB/s"]), r.stdout.decode().split()


def main():
    t_start = time.time()
    lines = repo_lines() + corner_lines(6000) + norm_lines(3000)
    log("corpus: %d lines, %d bytes" % (
        len(lines), sum(len(l.encode()) for l in lines)))
    lines_file = os.path.join(OUT, "lines.txt")
    with open(lines_file, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines))
    corpus_file = os.path.join(OUT, "corpus.txt")
    text = "\n".join(lines)
    with open(corpus_file, "w", encoding="utf-8", newline="") as f:
        f.write(text)

    t0 = time.time()
    bl = train_bytelevel(lines, 8000)
    sp = train_sp(lines, 8000)
    log("trained in %.1f s" % (time.time() - t0))

    results = []
    all_ok = True
    only = [x for x in os.environ.get("BT_HFTOK_ONLY", "").split(",") if x]
    for name, j in variants(bl, sp).items():
        if only and name not in only:
            continue
        path = os.path.join(OUT, name + ".json")
        s = json.dumps(j, ensure_ascii=False)
        with open(path, "w", encoding="utf-8") as f:
            f.write(s)
        res = {"name": name}
        try:
            hf = Tokenizer.from_str(s)
            want = [e.ids for e in hf.encode_batch(lines,
                                                   add_special_tokens=False)]
            got, _ = baton_encode_lines(path, lines_file)
            mism = []
            if len(got) != len(want):
                mism.append((-1, "line count %d vs %d" % (len(got),
                                                          len(want))))
            for i, (a, b) in enumerate(zip(got, want)):
                if a != b:
                    mism.append((i, a, b))
            res["lines"] = len(want)
            res["ids"] = sum(len(w) for w in want)
            res["mismatches"] = len(mism)
            for m in mism[:8]:
                if m[0] >= 0:
                    log("  %s MISMATCH line %d %r\n    baton %s\n    hf    %s"
                        % (name, m[0], lines[m[0]][:200], m[1][:40],
                           m[2][:40]))
                else:
                    log("  %s MISMATCH %s" % (name, m[1]))
            # decode a sample both ways (no special-token strings: the two
            # strip the sequence-start space differently after one)
            rng = random.Random(7)
            sample = [i for i in rng.sample(range(len(lines)), 150)
                      if not any(t in lines[i] for t in
                                 ("<s>", "</s>", "<unk>", "<|"))]
            dec_bad = 0
            for i in sample:
                ids = want[i]
                if not ids:
                    continue
                r = subprocess.run([BATON, "detokenize", "--tokenizer", path,
                                    "--ids", " ".join(map(str, ids)),
                                    "--skip-special"], capture_output=True,
                                   timeout=60)
                mine = r.stdout.decode("utf-8", errors="replace")[:-1]
                theirs = hf.decode(ids, skip_special_tokens=True)
                if mine != theirs:
                    dec_bad += 1
                    if dec_bad <= 3:
                        log("  %s DECODE differs on line %d: %r vs %r" % (
                            name, i, mine[:120], theirs[:120]))
            res["decoded"] = len(sample)
            res["decode_mismatches"] = dec_bad
            # single-core throughput on the whole corpus
            nbytes = len(text.encode())
            hf_times = []
            for _ in range(3):
                t0 = time.perf_counter()
                hf_ids = hf.encode(text, add_special_tokens=False).ids
                hf_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hf.encode_batch(lines, add_special_tokens=False)
            hf_batch = time.perf_counter() - t0
            b1, whole_ids = baton_time_whole(path, corpus_file, 1)
            b3, _ = baton_time_whole(path, corpus_file, 3)
            res["whole_text_ids_equal"] = [int(x) for x in whole_ids] == hf_ids
            res["hf_MBps_first"] = nbytes / hf_times[0] / 1e6
            res["hf_MBps_best"] = nbytes / min(hf_times) / 1e6
            res["hf_batch_lines_MBps"] = nbytes / hf_batch / 1e6
            res["baton_MBps_first"] = b1
            res["baton_MBps_repeat3"] = b3
            ok = (res["mismatches"] == 0 and res["decode_mismatches"] == 0
                  and res["whole_text_ids_equal"])
        except Exception as e:  # report and go on with the next one
            res["error"] = repr(e)[:500]
            ok = False
        res["ok"] = ok
        all_ok = all_ok and ok
        log(json.dumps(res))
        results.append(res)

    with open(os.path.join(OUT, "hftok_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    log("\n%-11s %7s %8s %5s %6s %6s %9s %9s %9s %9s" % (
        "tokenizer", "lines", "ids", "mism", "dec", "decbad", "hf MB/s",
        "hf best", "baton", "baton x3"))
    for r in results:
        if "error" in r:
            log("%-11s ERROR %s" % (r["name"], r["error"]))
            continue
        log("%-11s %7d %8d %5d %6d %6d %9.2f %9.2f %9.2f %9.2f" % (
            r["name"], r["lines"], r["ids"], r["mismatches"], r["decoded"],
            r["decode_mismatches"], r["hf_MBps_first"], r["hf_MBps_best"],
            r["baton_MBps_first"], r["baton_MBps_repeat3"]))
    log("total %.1f s; %s" % (time.time() - t_start,
                              "PASS" if all_ok else "FAIL"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
