#!/usr/bin/env python3
"""sass_check.py FILE... | --self-test - reads `cuobjdump -sass` listings and fails
(exit 1) when a kernel reads a uniform register (URn) that no
instruction of the kernel writes, or takes a 64-bit memory descriptor
(desc[URn]) from an odd register.

Why: CUDA 13.0's ptxas (V13.0.88) compiled the FP8-KV decode attention
(attn_decode_tc_kernel<HD, false, true>) with six of its main loop's
cp.async copies addressing shared memory through UR0 and taking their
memory descriptor from UR1, neither ever written: the H100 raised "an
illegal instruction" there (compute-sanitizer named the copy) under
serving shapes, and nothing on the CPU can see it (no disassembler in
CI).  The device scripts run this over every kernel object so a
compiler that does it again fails a test instead of a server.

Heuristic, not a full dataflow: a register counts as written when it is
the first operand of any instruction (UR pairs of .64 and .WIDE ops, quads of .128
ops), so it catches registers that are never defined anywhere in the
kernel, the failure seen, not every read before a write."""
import re
import sys

INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")
UREG = re.compile(r"\bUR(\d+)\b")
DESC = re.compile(r"desc\[UR(\d+)\]")


def check(text):
    bad = []
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        name = block.split("\n", 1)[0].strip()
        written, read, descs = set(), {}, set()
        for m in INSN.finditer(block):
            op, args = m.group(2), m.group(3)
            ops = [a.strip() for a in args.split(",")] if args else []
            # a predicate written first (R2UR P0, URn, ...): then URn
            if len(ops) > 1 and re.fullmatch(r"U?P[T0-6]", ops[0]):
                ops = ops[1:]
            first = ops[0] if ops else ""
            fm = re.fullmatch(r"UR(\d+)", first)
            if fm:  # a destination (sources are never first)
                n = int(fm.group(1))
                width = (4 if ".128" in op else
                         2 if ".64" in op or ".WIDE" in op else 1)
                written.update(range(n, n + width))
                ops = ops[1:]
            for o in ops:
                for r in UREG.findall(o):
                    read.setdefault(int(r), op)
            descs.update(int(d) for d in DESC.findall(args))
        for n in sorted(read):
            if n not in written:
                bad.append(f"{name}: UR{n} read ({read[n]}) but never written")
        for n in sorted(descs):
            if n % 2:
                bad.append(f"{name}: memory descriptor from odd register UR{n}")
    return bad


# --self-test: the failing copy as ptxas 13.0 wrote it (UR0 / UR1 never
# written) must be found; the same copy after its registers are loaded,
# and the forms that write pairs or a predicate first, must not
BAD = """
        Function : kv8_like
        /*6d10*/                   IADD3 R8, P5, R10, R9, RZ ;
        /*6d20*/                   LDGSTS.E.BYPASS.128.ZFILL [R65+UR0], desc[UR1][R8.64], P3 ;
        /*6d30*/                   EXIT ;
"""
GOOD = """
        Function : good
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   S2UR UR11, SR_CgaCtaId ;
        /*0030*/                   UIMAD.WIDE.U32 UR40, UR11, UR5, URZ ;
        /*0040*/              @P1 R2UR P0, UR16, R2 ;
        /*0050*/                   IADD3 R6, R16, UR41, RZ ;
        /*0060*/                   LDGSTS.E.BYPASS.128.ZFILL [R65+UR11], desc[UR4][R8.64], P3 ;
        /*0070*/                   IMAD.U32 R7, RZ, RZ, UR16 ;
        /*0080*/                   EXIT ;
"""


def self_test():
    bad, good = check(BAD), check(GOOD)
    ok = len(bad) == 3 and not good
    for b in bad + good:
        print("  finding:", b)
    print(f"{'PASS' if ok else 'FAIL'} sass_check self-test: the bad copy "
          f"gives {len(bad)} findings (3 expected), the good one {len(good)}")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    bad, n = [], 0
    for path in sys.argv[1:]:
        with open(path, errors="replace") as f:
            text = f.read()
        n += text.count("Function : ")
        bad += check(text)
    for b in bad:
        print("FAIL sass_check:", b)
    print(f"{'FAIL' if bad else 'PASS'} sass_check: {n} kernels, "
          f"{len(bad)} findings")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
