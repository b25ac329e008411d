#!/usr/bin/env python3
"""kv8t_frag_sim.py - host model of one warp of the FP8-KV decode
attention's step with the keys as the MMA's rows (tc_attend16_kv8t of
worker/cuda/kernels/attn_decode_tc.cuh, the engine's step for groups of
<= 8 heads), lane by lane
and register by register with PTX's mma.m16n8k16 A / B / C fragment
layouts and movmatrix.trans, on integer "codes" (exact):

  - S^T = K Q^T from K's A fragments (the engine's loads through
    tc_kv8_at) and Q^T's B fragments equals the plain product, every
    accumulator at its (key, head);
  - P^T moved into B fragments by two 8x8 transposes, and V^T's A
    fragments (the engine's V loads and byte pairs), give O^T = V^T P^T
    with every accumulator at the dims the merge writes it to
    ((HD / 8) gr + mt, (HD / 8) gr + HD / 16 + mt), at head sizes 128
    and 64.
The shared-memory loads are the engine's, whose bank conflicts
kv8_frag_sim.py counts.

Run: python3 tests/gpu/kv8t_frag_sim.py   (exit status 1 on any mismatch)
"""
import random
import sys

rnd = random.Random(1)
bad = 0


def check(ok, what):
    global bad
    if not ok:
        bad += 1
        if bad <= 10:
            print("MISMATCH", what)


def mma(A, B):
    """c = a . b over a warp: A[lane] 4 pairs, B[lane] 2 pairs (PTX)."""
    Am = [[None] * 16 for _ in range(16)]
    Bm = [[None] * 8 for _ in range(16)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a, b = A[lane], B[lane]
        for j in range(2):
            Am[g][2 * t + j] = a[0][j]
            Am[g + 8][2 * t + j] = a[1][j]
            Am[g][2 * t + 8 + j] = a[2][j]
            Am[g + 8][2 * t + 8 + j] = a[3][j]
            Bm[2 * t + j][g] = b[0][j]
            Bm[2 * t + 8 + j][g] = b[1][j]
    C = [[sum(Am[i][k] * Bm[k][n] for k in range(16)) for n in range(8)]
         for i in range(16)]
    return [[C[l >> 2][2 * (l & 3)], C[l >> 2][2 * (l & 3) + 1],
             C[(l >> 2) + 8][2 * (l & 3)], C[(l >> 2) + 8][2 * (l & 3) + 1]]
            for l in range(32)]


def trans(X):
    """movmatrix.m8n8.trans.b16: X[lane] = (row lane / 4, cols 2t, 2t+1)."""
    M = [[None] * 8 for _ in range(8)]
    for l in range(32):
        M[l >> 2][2 * (l & 3)], M[l >> 2][2 * (l & 3) + 1] = X[l]
    return [(M[2 * (l & 3)][l >> 2], M[2 * (l & 3) + 1][l >> 2])
            for l in range(32)]


def warp_step(HD):
    """One step of 16 keys at head size HD (64 or 128)."""
    MT = HD // 16
    K = [[rnd.randint(-99, 99) for _ in range(HD)] for _ in range(16)]
    V = [[rnd.randint(-99, 99) for _ in range(HD)] for _ in range(16)]
    Q = [[rnd.randint(-99, 99) for _ in range(HD)] for _ in range(8)]

    def kv8_at(r, byte):
        """tc_kv8_at<HD>: byte `byte` of row r in a warp's 16 rows."""
        x = ((r & 1) << 2) ^ (r & 6) if HD == 128 else (r >> 1) & 2
        return r * HD + 16 * ((byte >> 4) ^ x) + (byte & 15)

    smK, smV = {}, {}
    for r in range(16):
        for d in range(HD):
            smK[kv8_at(r, d)] = K[r][d]
            smV[kv8_at(r, d)] = V[r][d]

    def ld(sm, at, n):
        return [sm[at + i] for i in range(n)]

    # S^T = K Q^T: HD / 16 k-steps
    S = [[0] * 4 for _ in range(32)]
    for ks in range(HD // 16):
        A, B = [], []
        ci, m = ks // 4, ks % 4
        for lane in range(32):
            gr, tq = lane >> 2, lane & 3
            kw = [[ld(smK, kv8_at(8 * h + gr, 16 * (tq + 4 * c)), 16)
                   for c in range(HD // 64)] for h in range(2)]
            w0, w1 = kw[0][ci][4 * m:4 * m + 4], kw[1][ci][4 * m:4 * m + 4]
            A.append([w0[0:2], w1[0:2], w0[2:4], w1[2:4]])
            d = 64 * ci + 16 * tq + 4 * m
            B.append([Q[gr][d:d + 2], Q[gr][d + 2:d + 4]])
        C = mma(A, B)
        S = [[S[l][i] + C[l][i] for i in range(4)] for l in range(32)]
    ST = [[sum(K[k][d] * Q[h][d] for d in range(HD)) for h in range(8)]
          for k in range(16)]
    for l in range(32):
        gr, tq = l >> 2, l & 3
        want = [ST[gr][2 * tq], ST[gr][2 * tq + 1], ST[gr + 8][2 * tq],
                ST[gr + 8][2 * tq + 1]]
        check(S[l] == want, f"HD {HD} S^T lane {l}: {S[l]} != {want}")

    # O^T = V^T P^T, P an arbitrary (key, head) matrix: S^T itself
    P = ST
    pb0 = trans([(P[l >> 2][2 * (l & 3)], P[l >> 2][2 * (l & 3) + 1])
                 for l in range(32)])
    pb1 = trans([(P[(l >> 2) + 8][2 * (l & 3)],
                  P[(l >> 2) + 8][2 * (l & 3) + 1]) for l in range(32)])
    OT = [[sum(V[k][d] * P[k][h] for k in range(16)) for h in range(8)]
          for d in range(HD)]
    vbs = []
    for lane in range(32):
        gr, tq = lane >> 2, lane & 3
        ka = 2 * tq + (tq & 1)  # the key loaded first
        vb = [[None] * (HD // 8) for _ in range(2)]
        for h in range(2):
            va = ld(smV, kv8_at(ka + 8 * h, (HD // 8) * gr), HD // 8)
            vc = ld(smV, kv8_at((ka ^ 1) + 8 * h, (HD // 8) * gr), HD // 8)
            first, second = (va, vc) if ka == 2 * tq else (vc, va)
            for j in range(HD // 8):  # the byte permutes' pairs
                vb[h][j] = (first[j], second[j])
        vbs.append(vb)
    for mt in range(MT):
        A = [[vbs[l][0][mt], vbs[l][0][MT + mt], vbs[l][1][mt],
              vbs[l][1][MT + mt]] for l in range(32)]
        B = [[pb0[l], pb1[l]] for l in range(32)]
        O = mma(A, B)
        for l in range(32):
            gr, tq = l >> 2, l & 3
            d0 = (HD // 8) * gr + mt
            d1 = d0 + MT
            want = [OT[d0][2 * tq], OT[d0][2 * tq + 1], OT[d1][2 * tq],
                    OT[d1][2 * tq + 1]]
            check(O[l] == want, f"HD {HD} O^T m-tile {mt} lane {l}")


warp_step(128)
warp_step(64)


print("kv8t_frag_sim:", "FAIL" if bad else "S^T and O^T exact")
sys.exit(1 if bad else 0)
