# A numpy model of kernels/cuda_moe_grouped.cu's index arithmetic, run on the CPU: ldmatrix (x4, and
# .trans) and mma.m16n8k16 with the fragment layouts of the PTX ISA (as kernels/cuda_mma.cuh
# describes them), load_block's zero fill, the K slabs, the 8 warps' 32 x 64 pieces, the row tiles
# of backend/moe_tiles.h and the epilogue, in the three modes (forward, dinp, dW), against numpy
# products. It checks the arithmetic the kernel copies, not the compiled kernel (tests/gpu/
# test_gpu_ops does that on a GPU): a change to the kernel's indexing belongs here too.
#   /usr/bin/python3 tests/gpu/grouped_kernel_model.py     (prints PASS, exit 0; FAIL, exit 1)
import numpy as np
GM, GN, GK, GPAD = 128, 128, 32, 8
FWD, DINP, DW = 0, 1, 2

def ldsm_x4(smem, addrs, trans):
    # addrs[lane] = flat element index of the row start for matrix lane//8, row lane%8
    r = np.zeros((32, 4, 2))
    for l in range(32):
        for i in range(4):
            if not trans:
                row = smem[addrs[8 * i + l // 4]: addrs[8 * i + l // 4] + 8]
                r[l, i] = row[2 * (l % 4): 2 * (l % 4) + 2]
            else:
                rows = [smem[addrs[8 * i + 2 * (l % 4) + j]: addrs[8 * i + 2 * (l % 4) + j] + 8] for j in range(2)]
                r[l, i] = [rows[0][l // 4], rows[1][l // 4]]
    return r

def mma(d, a, b0, b1):
    # d: (32, 4); a: (32, 4, 2); b0, b1: (32, 2). Rebuild A 16x16, B 16x8 from fragments, D += A B
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); D = np.zeros((16, 8))
    for l in range(32):
        g, c = l // 4, l % 4
        A[g, 2*c:2*c+2] = a[l, 0]; A[g+8, 2*c:2*c+2] = a[l, 1]
        A[g, 2*c+8:2*c+10] = a[l, 2]; A[g+8, 2*c+8:2*c+10] = a[l, 3]
        B[2*c:2*c+2, g] = b0[l]; B[2*c+8:2*c+10, g] = b1[l]
        D[g, 2*c:2*c+2] = d[l, 0:2]; D[g+8, 2*c:2*c+2] = d[l, 2:4]
    D = D + A @ B
    for l in range(32):
        g, c = l // 4, l % 4
        d[l, 0:2] = D[g, 2*c:2*c+2]; d[l, 2:4] = D[g+8, 2*c:2*c+2]

def addr_a(base, ld, row0, col0, lane):
    return base + (row0 + (lane & 15)) * ld + col0 + ((lane >> 4) << 3)
def addr_bt(base, ld, row0, col0, lane):
    return base + (row0 + (lane & 7) + ((lane >> 4) << 3)) * ld + col0 + (((lane >> 3) & 1) << 3)

def load_block(dst, dst_ld, src, src_off, ld, ROWS, COLS, rows_valid, cols_valid):
    for r in range(ROWS):
        for c in range(0, COLS, 8):
            inn = r < rows_valid and c < cols_valid
            dst[r * dst_ld + c: r * dst_ld + c + 8] = src[src_off + r * ld + c: src_off + r * ld + c + 8] if inn else 0

def tile_product(mode, A, a_off, lda, B, b_off, ldb, m, n, k):
    acc = np.zeros((8, 2, 8, 32, 4))   # warp, mi, j, lane, 4
    nk = (k + GK - 1) // GK
    E = max(GM * (GK + GPAD), GK * (GM + GPAD))
    for kt in range(nk):
        As = np.zeros(E); Bs = np.zeros(E)
        k0 = kt * GK; kv = k - k0
        if mode == DW: load_block(As, GM + GPAD, A, a_off + k0 * lda, lda, GK, GM, kv, m)
        else: load_block(As, GK + GPAD, A, a_off + k0, lda, GM, GK, m, kv)
        if mode == FWD: load_block(Bs, GK + GPAD, B, b_off + k0, ldb, GN, GK, n, kv)
        else: load_block(Bs, GN + GPAD, B, b_off + k0 * ldb, ldb, GK, GN, kv, n)
        for warp in range(8):
            wm, wn = warp & 3, warp >> 2
            for kk in range(GK // 16):
                fa = []
                for mi in range(2):
                    m0 = wm * 32 + mi * 16
                    if mode == DW: fa.append(ldsm_x4(As, [addr_bt(0, GM + GPAD, kk * 16, m0, l) for l in range(32)], True))
                    else: fa.append(ldsm_x4(As, [addr_a(0, GK + GPAD, m0, kk * 16, l) for l in range(32)], False))
                for nj in range(4):
                    n0 = wn * 64 + nj * 16
                    if mode == FWD: fb = ldsm_x4(Bs, [addr_bt(0, GK + GPAD, n0, kk * 16, l) for l in range(32)], False)
                    else: fb = ldsm_x4(Bs, [addr_a(0, GN + GPAD, kk * 16, n0, l) for l in range(32)], True)
                    for mi in range(2):
                        mma(acc[warp, mi, 2 * nj], fa[mi], fb[:, 0], fb[:, 1])
                        mma(acc[warp, mi, 2 * nj + 1], fa[mi], fb[:, 2], fb[:, 3])
    return acc

def for_each_pair(acc, f):
    for warp in range(8):
        wm, wn = warp & 3, warp >> 2
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            for mi in range(2):
                for j in range(8):
                    for h in range(2):
                        f(wm * 32 + mi * 16 + g + 8 * h, wn * 64 + 8 * j + 2 * c, acc[warp, mi, j, lane, 2 * h], acc[warp, mi, j, lane, 2 * h + 1])

def row_tile(off, E, rows, t):
    for e in range(E):
        ne = off[e + 1] - off[e]; tiles = (ne + rows - 1) // rows
        if t < tiles:
            r0 = off[e] + t * rows
            return e, r0, min(off[e + 1] - r0, rows)
        t -= tiles
    return None

def run(E, C, OC, counts, tail, seed=0):
    rng = np.random.default_rng(seed)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(int); R = off[E] + tail
    inp = rng.standard_normal(R * C); W = [rng.standard_normal(OC * C) for _ in range(E)]
    dout = rng.standard_normal(R * OC); dinp0 = rng.standard_normal(R * C); dW0 = [rng.standard_normal(OC * C) for _ in range(E)]
    out = rng.standard_normal(R * OC); dinp = dinp0.copy(); dW = [w.copy() for w in dW0]
    nt = (R + GM - 1) // GM + E
    for bx in range(nt):
        rt = row_tile(off, E, GM, bx)
        if rt is None: continue
        e, r0, rows = rt
        for by in range((OC + GN - 1) // GN):     # forward
            n0 = by * GN
            acc = tile_product(FWD, inp, r0 * C, C, W[e], n0 * C, C, rows, OC - n0, C)
            def st(r, col, x0, x1):
                if r >= rows or n0 + col >= OC: return
                out[(r0 + r) * OC + n0 + col: (r0 + r) * OC + n0 + col + 2] = [x0, x1]
            for_each_pair(acc, st)
        for by in range((C + GN - 1) // GN):      # dinp
            n0 = by * GN
            acc = tile_product(DINP, dout, r0 * OC, OC, W[e], n0, C, rows, C - n0, OC)
            def st2(r, col, x0, x1):
                if r >= rows or n0 + col >= C: return
                dinp[(r0 + r) * C + n0 + col: (r0 + r) * C + n0 + col + 2] += [x0, x1]
            for_each_pair(acc, st2)
    out[off[E] * OC:] = 0
    mt = (OC + GM - 1) // GM
    for bx in range(E * mt):
        e, m0 = bx // mt, (bx % mt) * GM
        r0, rows = off[e], off[e + 1] - off[e]
        if rows <= 0: continue
        for by in range((C + GN - 1) // GN):
            n0 = by * GN
            acc = tile_product(DW, dout, r0 * OC + m0, OC, inp, r0 * C + n0, C, OC - m0, C - n0, rows)
            def st3(r, col, x0, x1):
                if m0 + r >= OC or n0 + col >= C: return
                dW[e][(m0 + r) * C + n0 + col: (m0 + r) * C + n0 + col + 2] += [x0, x1]
            for_each_pair(acc, st3)
    # references
    worst = 0.0
    X = inp.reshape(R, C); DO = dout.reshape(R, OC)
    ref_out = np.zeros((R, OC)); ref_dinp = dinp0.reshape(R, C).copy()
    for e in range(E):
        We = W[e].reshape(OC, C); s = slice(off[e], off[e + 1])
        ref_out[s] = X[s] @ We.T
        ref_dinp[s] += DO[s] @ We
        ref_dw = dW0[e].reshape(OC, C) + DO[s].T @ X[s]
        worst = max(worst, np.abs(dW[e].reshape(OC, C) - ref_dw).max())
    worst = max(worst, np.abs(out.reshape(R, OC) - ref_out).max(), np.abs(dinp.reshape(R, C) - ref_dinp).max())
    print(f"E={E} C={C} OC={OC} counts={counts} tail={tail}: max abs error {worst:.2e}")
    return worst < 1e-9

ok = run(3, 16, 24, [5, 0, 40], 3) and run(2, 136, 144, [130, 33], 2) and run(4, 40, 56, [7, 0, 33, 1], 0)
print("PASS" if ok else "FAIL")
raise SystemExit(0 if ok else 1)
