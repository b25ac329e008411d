#!/usr/bin/env python3
"""kv8_frag_sim.py - host model of one warp of the FP8-KV tensor-core decode
attention (worker/cuda/kernels/attn_decode_tc.cuh: tc_kv8_at,
tc_copy_rows16_kv8, tc_load_q8, tc_attend16_kv8; the merge layout tc_o8_at
of attn_decode_tc.cu), lane by lane and register by register with PTX's
mma.m16n8k16 A / B / C fragment layouts, on integer "codes" (exact):

  - the copy writes each 16-byte chunk where the readers look for it
    (tc_kv8_at, the one swizzle);
  - S = Q K^T from the permuted Q (A) and K (B) fragments equals the plain
    product, every accumulator at its (head, key);
  - O = P V from P packed out of the S accumulators and V's fragments
    (keys paired by byte permutes) equals the plain product, and the
    merge layout returns every accumulator at its true output dim;
  - bank conflicts of every shared-memory access: 32 banks of 4 bytes;
    16-byte accesses in 4 phases of 8 lanes, 8-byte ones in 2 phases of
    16, 4-byte ones in one; a phase costs as many wavefronts as the most
    distinct 4-byte words any bank serves in it.

Run: python3 tests/gpu/kv8_frag_sim.py   (exit status 1 on any mismatch)
"""
import random
import sys

TK = 16  # keys of a warp's tile


def chunk(hd, r, c):
    """tc_kv8_at's swizzle: physical 16-byte chunk of chunk c of row r."""
    if hd == 128:
        return c ^ (((r & 1) << 2) ^ (r & 6))
    return c ^ ((r >> 1) & 2)


def at(hd, r, byte):
    """tc_kv8_at: byte offset of byte `byte` of row r in a warp's rows."""
    return r * hd + 16 * chunk(hd, r, byte // 16) + byte % 16


def o8_at(hd, row, dim):
    """tc_o8_at: float index of (row, true dim) in a warp's merge rows."""
    p = hd // 8
    cs = p + 4
    rs = 8 * cs + 1
    return row * rs + (dim // p) * cs + dim % p


def wavefronts(accesses, size):
    """accesses: per lane byte address (None: lane idle) of one
    instruction of `size` bytes a lane.  Returns the wavefront count."""
    per_phase = {16: 8, 8: 16, 4: 32}[size]
    total = 0
    for p0 in range(0, 32, per_phase):
        banks = {}
        for lane in range(p0, p0 + per_phase):
            a = accesses[lane]
            if a is None:
                continue
            for w in range(a // 4, (a + size) // 4):
                banks.setdefault(w % 32, set()).add(w)
        total += max((len(s) for s in banks.values()), default=0)
    return total


def mma(a_regs, b_regs):
    """mma.m16n8k16 with f32 accumulators, per lane: a_regs[lane] =
    4 pairs, b_regs[lane] = 2 pairs.  Returns c[lane] = 4 values."""
    A = [[None] * 16 for _ in range(16)]
    B = [[None] * 8 for _ in range(16)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a = a_regs[lane]
        for j in range(2):
            A[g][2 * t + j] = a[0][j]
            A[g + 8][2 * t + j] = a[1][j]
            A[g][2 * t + 8 + j] = a[2][j]
            A[g + 8][2 * t + 8 + j] = a[3][j]
            B[2 * t + j][g] = b_regs[lane][0][j]
            B[2 * t + 8 + j][g] = b_regs[lane][1][j]
    c = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        row = []
        for r in (g, g + 8):
            for j in range(2):
                row.append(sum(A[r][k] * B[k][2 * t + j] for k in range(16)))
        c.append(row)
    return c


def byte_perm(x, y, s):
    """__byte_perm(x, y, s) (no sign replication: selectors < 8)."""
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + \
        [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(b[(s >> (4 * i)) & 7] << (8 * i) for i in range(4))


def word(mem, addr):
    return sum(mem[addr + i] << (8 * i) for i in range(4))


def pair(w):
    """kv8_f16x2 of the low 16 bits: (first code, second code)."""
    return (w & 0xFF, (w >> 8) & 0xFF)


def run(hd, G, seed, report):
    rnd = random.Random(seed)
    ok = True
    K = [[rnd.randrange(256) for _ in range(hd)] for _ in range(TK)]
    V = [[rnd.randrange(256) for _ in range(hd)] for _ in range(TK)]
    Q = [[rnd.randrange(-50, 50) if h < G else 0 for _ in range(hd)]
         for h in range(16)]
    conf = {}

    def note(name, accesses, size):
        wf = wavefronts(accesses, size)
        ideal = wavefronts([i * size for i in range(32)], size)
        n, w0, w1 = conf.get(name, (0, 0, 0))
        conf[name] = (n + 1, w0 + wf, w1 + ideal)

    # copy (tc_copy_rows16_kv8): lane -> (row, chunk) per instruction
    smk = [None] * (TK * hd)
    smv = [None] * (TK * hd)
    cpr = hd // 16
    rpi = 32 // cpr
    for i in range(TK // rpi):
        acc = []
        for lane in range(32):
            r, c = i * rpi + lane // cpr, lane % cpr
            a = at(hd, r, 16 * c)
            acc.append(a)
            for b in range(16):
                smk[a + b] = K[r][16 * c + b]
                smv[a + b] = V[r][16 * c + b]
        note("copy (16 B cp.async)", acc, 16)
    if None in smk or None in smv:
        print("FAIL hd=%d: the copy leaves bytes unwritten" % hd)
        return False

    # Q (tc_load_q8): k-step 4 ci + m, dims 64 ci + 16 tq + 4 m + 0..3
    ks_n = hd // 16
    qa = [[None] * ks_n for _ in range(32)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for ks in range(ks_n):
            d = 64 * (ks // 4) + 16 * t + 4 * (ks % 4)
            qa[lane][ks] = [(Q[g][d], Q[g][d + 1]),
                            (Q[g + 8][d], Q[g + 8][d + 1]),
                            (Q[g][d + 2], Q[g][d + 3]),
                            (Q[g + 8][d + 2], Q[g + 8][d + 3])]

    # S = Q K^T (tc_attend16_kv8): key row nt*8 + gr, chunks tq + 4 ci
    s = [[[0] * 4 for _ in range(2)] for _ in range(32)]
    for nt in range(2):
        kw = [dict() for _ in range(32)]
        for ci in range(hd // 64):
            acc = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                r = nt * 8 + g
                a = at(hd, r, 16 * (t + 4 * ci))
                acc.append(a)
                for m in range(4):
                    kw[lane][4 * ci + m] = word(smk, a + 4 * m)
            note("K fragments (16 B)", acc, 16)
        for ks in range(ks_n):
            b = [(pair(kw[l][ks]), pair(kw[l][ks] >> 16)) for l in range(32)]
            c = mma([qa[l][ks] for l in range(32)], b)
            for lane in range(32):
                for e in range(4):
                    s[lane][nt][e] += c[lane][e]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for nt in range(2):
            for e in range(4):
                h, key = g + 8 * (e >> 1), nt * 8 + 2 * t + (e & 1)
                ref = sum(Q[h][d] * K[key][d] for d in range(hd))
                if s[lane][nt][e] != ref:
                    ok = False
    if not ok:
        print("FAIL hd=%d G=%d: S" % (hd, G))
        return False

    # P: stand-in values in the S accumulators' places
    P = [[rnd.randrange(-20, 20) if h < G else 0 for _ in range(TK)]
         for h in range(16)]
    pa = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        sv = [[P[g + 8 * (e >> 1)][nt * 8 + 2 * t + (e & 1)]
               for e in range(4)] for nt in range(2)]
        pa.append([(sv[0][0], sv[0][1]), (sv[0][2], sv[0][3]),
                   (sv[1][0], sv[1][1]), (sv[1][2], sv[1][3])])

    # V: keys ka = 2tq + (tq & 1), ka ^ 1 (+ 8), HD/8 bytes from gr HD/8;
    # byte permutes pair keys 2tq, 2tq+1 per n-tile (dim HD/8 gr + nt)
    piece = hd // 8
    vb = [[None] * piece for _ in range(32)]  # [lane][nt] = 2 pairs
    loads = {}
    for half in range(2):
        for which in range(2):
            acc = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                ka = 2 * t + (t & 1)
                key = (ka if which == 0 else ka ^ 1) + 8 * half
                a = at(hd, key, g * piece)
                acc.append(a)
                loads[(lane, half, which)] = [word(smv, a + 4 * w)
                                              for w in range(piece // 4)]
            note("V fragments (%d B)" % piece, acc, piece)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        odd = t & 1
        sel_lo = 0x1504 if odd else 0x5140
        sel_hi = 0x3726 if odd else 0x7362
        for nt in range(piece):
            vb[lane][nt] = [None, None]
        for half in range(2):
            A = loads[(lane, half, 0)]
            B = loads[(lane, half, 1)]
            for w in range(piece // 4):
                lo = byte_perm(A[w], B[w], sel_lo)
                hi = byte_perm(A[w], B[w], sel_hi)
                vb[lane][4 * w + 0][half] = pair(lo)
                vb[lane][4 * w + 1][half] = pair(lo >> 16)
                vb[lane][4 * w + 2][half] = pair(hi)
                vb[lane][4 * w + 3][half] = pair(hi >> 16)
    nt_n = hd // 8
    om = {}  # merge rows: float index -> value
    for nt in range(nt_n):
        c = mma(pa, [vb[l][nt] for l in range(32)])
        acc = {e: [] for e in range(4)}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for e in range(4):
                h = g + 8 * (e >> 1)
                dim = piece * (2 * t + (e & 1)) + nt
                i = o8_at(hd, h, dim)
                acc[e].append(4 * i)
                om[i] = c[lane][e]
        for e in range(4):
            note("merge stores (4 B)", acc[e], 4)
    for h in range(16):
        for dim in range(hd):
            ref = sum(P[h][k] * V[k][dim] for k in range(TK))
            if om.get(o8_at(hd, h, dim)) != ref:
                ok = False
    if len(om) != 16 * hd:
        ok = False
    if not ok:
        print("FAIL hd=%d G=%d: O" % (hd, G))
        return False
    # the merge's reads: 32 consecutive dims of one row per warp
    for base in range(0, 16 * hd, 32):
        note("merge reads (4 B)",
             [4 * o8_at(hd, (base + i) // hd, (base + i) % hd)
              for i in range(32)], 4)

    if report:
        for name, (n, wf, ideal) in conf.items():
            print("  hd=%3d %-22s %3d instr: %4d wavefronts (ideal %4d)"
                  % (hd, name, n, wf, ideal))
    return True


def main():
    ok = True
    for hd in (64, 128):
        for G in (1, 4, 7, 8, 16):
            for seed in range(3):
                ok &= run(hd, G, 1000 * hd + 10 * G + seed,
                          G == 8 and seed == 0)
    print("%s kv8 fragment model (S, O, swizzle, merge layout)"
          % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
