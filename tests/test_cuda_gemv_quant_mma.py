"""The quantized GEMV on the tensor cores (csrc/cuda/gemv_quant_mma.cu) through _C.testing, on
weights in the CUDA tiles (quant_ops.gpu_repack of blocks from our quantizers) and bf16 rows of x.

The kernel decodes each weight to bf16 and multiplies on the tensor cores. For Q8_0, Q4_0 and Q5_0
the decoded weight is bf16 of the CPU-dequantized W exactly, so their reference is float64 of
Wb = bf16(W) times the bf16 x. The other types decode in bf16x2 arithmetic (the kernel's banner)
to within S = 2^-8 (2.01 |w| + 2.05 |a|) of the CPU's fp32 w, a being its block's min
(mma_decode_ref.py); their reference is that W with the slack S per weight (bf16(w) alone would be
within 2^-8 |w|):
  * Weights: with one-hot rows of x every output is one weight times 1 plus exact zeros, so
    y[m, n] = Wb[n, k_m] bit for bit, or within S of W; 16 rows a call (2 n8 tiles) and 64 (8,
    the most), enough calls to cover every column, check that every weight of every type decodes
    to its value and lands in the right x row's output.
  * Random x: bf16 x bf16 products are exact in fp32, so what is left is the fp32 summation. Per
    output a warp adds K / 128 mma steps into its accumulator (each step's additions aligned to
    the largest term and possibly truncated: at most 2^-22 of the magnitudes summed so far), then
    8 warp partials are added in fp32, hence
      |y - ref| <= (K / 128 + 16) * 2^-22 * sum_k |Wb[n, k] x[m, k]|,
    about 1.2e-5 of sum |W x| at K = 4352 and 4e-6 at K = 256, where one weight off by one bf16
    unit already moves an output by ~1.5e-5 of it (and a wrong code or scale by far more); for
    Q4_K / Q5_K plus sum_k |x[m, k]| S[n, k].
Outputs are NaN-poisoned with a row past M that must stay NaN; x is followed by a NaN row that a
read past K of the last row would pull into a result. Batched rows are bit-identical to the same
rows in other batches (M >= 2), across every n8 tile count (M = 1..8, 9..16, 17..32, 33..64); on
the short grids, which split K another way up to 16 rows, within 1-16 and within 17-64; on the
wide grids, which do so up to 32, within 1-32 and within 33-64.
Inputs random per run (seed printed by the rng fixture)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cuda_gemv_quant import (ROPE_KV, TYPES, Weights, check_epilogues, check_rope_kv, random_x,  # noqa: E402
                                  rope_problem)
from test_cuda_kernels import ADD_RESIDUAL, STORE_F32, SWIGLU, gen, nan_full, ops  # noqa: E402
from test_cuda_ops_misc import C, rope_oracle, rope_slack  # noqa: E402
from paged_kv import PagedCaches  # noqa: E402
from mma_decode_ref import decode_slack  # noqa: E402

pytestmark = pytest.mark.cuda

__all__ = ["C", "gen", "ops"]  # fixtures used by name


def shapes_for(block):
    """(N, K): one tile; a partial last tile (32-value types); 4096 + 256; rows not a multiple of
    the CTA's 16 and a K of three blocks."""
    if block == 32:
        return [(1, 256), (37, 576), (77, 4096 + 256), (130, 32 * 3)]
    return [(1, 256), (37, 512), (77, 4096 + 256), (130, 256)]


def mma_weights(W):
    """(Wb, S): the weights the kernel's decode is held to, float64 on the device, and the slack
    per weight (zero where the decode is bf16(W) exactly)."""
    S = decode_slack(W.name, W.blocks, W.deq)
    if S is None:
        Wb = torch.from_numpy(W.deq).cuda().to(torch.bfloat16).double()
        return Wb, torch.zeros_like(Wb)
    return torch.from_numpy(W.deq.astype(np.float64)).cuda(), torch.from_numpy(S).cuda()


def x_rows(x):
    """x [M, K] bf16 copied into a buffer with a NaN row after it; returns the view of the M rows."""
    M, K = x.shape
    buf = torch.full((M + 1, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    buf[:M] = x
    return buf[:M]


def gemv(ops, W, x, epilogue=STORE_F32, **kw):
    """The kernel's fp32 result [M, N] (StoreF32) with a poisoned row past M that must stay NaN."""
    M = x.shape[0]
    y = nan_full((M + 1, W.N), torch.float32)
    ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x.data_ptr(), M, W.N, W.K, epilogue, out_f32=y.data_ptr(),
                       **kw)
    torch.cuda.synchronize()
    assert torch.isnan(y[M]).all(), "the kernel wrote past its M rows"
    return y[:M]


def swiglu_rows(ops, W, x, rows):
    """The SwiGLU epilogue's bf16 output [len(rows), N / 2] for rows `rows` of x, poisoned first."""
    out = nan_full((len(rows), W.N // 2), torch.bfloat16)
    ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x_rows(x[rows]).data_ptr(), len(rows), W.N, W.K, SWIGLU,
                       out=out.data_ptr())
    torch.cuda.synchronize()
    return out


def check_gemv(name, y, Wb, x, S):
    xd = x.double()
    ref = xd @ Wb.T
    K = Wb.shape[1]
    bound = (K / 128 + 16) * 2.0 ** -22 * (xd.abs() @ (Wb.abs() + S).T) + xd.abs() @ S.T
    err = (y.double() - ref).abs()
    assert not torch.isnan(y).any(), f"{name}: NaN in the output"
    worst = (err / (bound + 1e-300)).max().item()
    assert worst <= 1.0, f"{name}: error {worst:.2f}x the fp32 bound (max err {err.max().item():.3g})"


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_mma_weights_are_the_cpu_values_in_bf16(C, ops, rng, name):
    """One-hot x: every output is exactly one weight, which must be bf16 of the CPU's value (Q8_0,
    Q4_0, Q5_0) or within the slack S of it."""
    for N, K in shapes_for(TYPES[name][1])[:2]:
        W = Weights(C, name, N, K, rng)
        Wb, S = mma_weights(W)
        for M in (16, 64):  # every K here is a multiple of 64: M columns a call
            assert K % M == 0
            for k0 in range(0, K, M):
                x = torch.zeros((M, K), dtype=torch.bfloat16, device="cuda")
                x[torch.arange(M), k0 + torch.arange(M)] = 1.0
                y = gemv(ops, W, x_rows(x), STORE_F32)
                ref = Wb[:, k0:k0 + M].T
                bad = (y.double() - ref).abs() > S[:, k0:k0 + M].T
                assert not bad.any(), (f"{name} {N}x{K} M={M}: weights of columns {k0}..{k0 + M - 1} differ from the "
                                       f"CPU's, e.g. (x row, W row) {bad.nonzero()[0].tolist()}: got "
                                       f"{y[bad][0].item()!r}, want {ref[bad][0].item()!r}")


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_mma_against_the_reference(C, ops, rng, name):
    for i, (N, K) in enumerate(shapes_for(TYPES[name][1])):
        W = Weights(C, name, N, K, rng)
        Wb, S = mma_weights(W)
        rows = list(range(2, 17)) + [17, 24, 33, 64] if i == 1 else (2, 3, 8, 9, 16, 17, 24, 33, 64)
        for M in rows:
            x = x_rows(random_x(rng, M, K))
            check_gemv(f"{name} M={M} N={N} K={K}", gemv(ops, W, x), Wb, x, S)


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_mma_rows_do_not_depend_on_the_batch(C, ops, rng, name):
    """Every row of a batch of 64 (8 n8 tiles) bit for bit equal to the same row in a batch of 2
    (paired with another row, first: one n8 tile); and slices of it run as batches of 3 (1 tile),
    16 (2), 24 (4) and 33 (8), each starting at another row, so a row changes n8 tile and lane."""
    W = Weights(C, name, 37, 4096 + (96 if TYPES[name][1] == 32 else 256), rng)
    x = random_x(rng, 64, W.K)
    all64 = gemv(ops, W, x_rows(x))
    for lo, hi in ((5, 8), (0, 16), (40, 64), (31, 64)):
        part = gemv(ops, W, x_rows(x[lo:hi]))
        assert torch.equal(part, all64[lo:hi]), f"{name}: rows {lo}..{hi - 1} as a batch of {hi - lo} differ from " \
                                                f"the batch of 64"
    for m in range(64):
        pair = gemv(ops, W, x_rows(x[[m, 63 - m]]))
        assert torch.equal(pair[0], all64[m]), f"{name}: row {m} of a batch of 64 differs from it in a batch of 2"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k"])
def test_gemv_quant_mma_epilogue_rows_do_not_depend_on_the_batch(C, ops, rng, gen, name):
    """The batch invariance above through AddResidual and SwiGLU (the wo/w2 and w13 epilogues of a
    decode): every row of a batch of 64 bit for bit equal to the same row in a batch of 2."""
    N, K = 96, 4096 + 256
    W = Weights(C, name, N, K, rng)
    x = random_x(rng, 64, K)
    residual = torch.randn((64, N), generator=gen, device="cuda")

    def add(rows):
        out = residual[rows].clone()
        ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x_rows(x[rows]).data_ptr(), len(rows), N, K,
                           ADD_RESIDUAL, residual=out.data_ptr())
        torch.cuda.synchronize()
        return out

    def swiglu(rows):
        return swiglu_rows(ops, W, x, rows)

    every = list(range(64))
    for run in (add, swiglu):
        all64 = run(every)
        for m in range(64):
            assert torch.equal(run([m, 63 - m])[0], all64[m]), f"{name} {run.__name__}: row {m} differs"
        # the engine's 16-row passes (2 n8 tiles) and the 4-tile form, starting at other rows
        for lo, hi in ((32, 48), (5, 29)):
            assert torch.equal(run(list(range(lo, hi))), all64[lo:hi]), \
                f"{name} {run.__name__}: rows {lo}..{hi - 1} as a batch of {hi - lo} differ from the batch of 64"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k", "q5_0", "q4_1"])
@pytest.mark.parametrize("M", [2, 5, 16, 17, 24, 33, 64])
def test_gemv_quant_mma_epilogues(C, ops, rng, gen, name, M):
    """StoreBf16 = the StoreF32 result rounded; AddResidual = it added (ld_out wider than N, the
    columns between untouched); SwiGLU = silu(gate) * up of the two halves' results (gate and up
    rows share a tile there, the sums are the same), within 1 bf16 rounding + the fast exp."""
    N, K = 2 * 69, 576 if TYPES[name][1] == 32 else 512
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    y = gemv(ops, W, x)
    check_epilogues(lambda ep, **dest: ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x.data_ptr(), M, N, K, ep,
                                                          **dest), y, gen)


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k", "q4_0"])
@pytest.mark.parametrize("M", [2, 11, 17, 24, 33, 64])
def test_gemv_quant_mma_rope_kv(C, ops, rng, name, M):
    """RopeKV against rope_oracle of the kernel's own StoreF32 q|k|v (the pair's sums are the
    same): bf16 rounding of the rotated value plus the fp32 cos / sin slack; other cache entries
    untouched."""
    n_heads, n_kv_heads, head_dim, K, max_seq, max_batch = 4, 2, 64, 512, 40, 3
    inv_freq, N = rope_problem(C, n_heads, n_kv_heads, head_dim, K, max_seq, max_batch)
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    qkv = gemv(ops, W, x)
    # distinct (slot, position) cells, the first at the last position
    last = int(rng.integers(0, max_batch)) * max_seq + max_seq - 1
    cells = np.concatenate([[last], rng.choice(np.setdiff1d(np.arange(max_batch * max_seq), [last]), M - 1,
                                               replace=False)])
    slots = torch.from_numpy((cells // max_seq).astype(np.int32)).cuda()
    positions = torch.from_numpy((cells % max_seq).astype(np.int32)).cuda()
    q_out = nan_full((M, n_heads, head_dim), torch.bfloat16)
    shape = (max_batch, max_seq, n_kv_heads, head_dim)
    paged = PagedCaches(nan_full(shape, torch.bfloat16), nan_full(shape, torch.bfloat16))
    ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x.data_ptr(), M, N, K, ROPE_KV,
                       positions=positions.data_ptr(), slots=slots.data_ptr(), inv_freq=inv_freq.data_ptr(),
                       q_out=q_out.data_ptr(), k_cache=paged.k.data_ptr(), v_cache=paged.v.data_ptr(),
                       n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, max_seq=max_seq, **paged.kwargs())
    torch.cuda.synchronize()
    k_cache, v_cache = paged.gather()
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    written = torch.zeros(shape[:2], dtype=torch.bool, device="cuda")
    for m in range(M):
        s, p = int(slots[m]), int(positions[m])
        written[s, p] = True
        heads = lambda lo, n: qkv[m, lo:lo + n * head_dim].view(n, head_dim)  # noqa: E731
        for got, v, rotate in [(q_out[m], heads(0, n_heads), True), (k_cache[s, p], heads(q_dim, n_kv_heads), True),
                               (v_cache[s, p], heads(q_dim + kv_dim, n_kv_heads), False)]:
            ref = rope_oracle(v, p, inv_freq) if rotate else v.double().cpu()
            slack = rope_slack(v) if rotate else 0.0
            tol = 2.0 ** -8 * ref.abs() + slack + 1e-30
            assert ((got.double().cpu() - ref).abs() <= tol).all(), f"{name} M={M} row {m}: RopeKV differs"
    for cache in (k_cache, v_cache):
        assert torch.isnan(cache[~written]).all(), "wrote a cache entry of another token"


@pytest.mark.parametrize("name", ["q4_k", "q8_0"])
def test_gemv_quant_mma_rope_kv_rows_do_not_depend_on_the_batch(C, ops, rng, name):
    """RopeKV (the fused wqkv epilogue of a decode) batch-invariant bit for bit: every row's q and
    its K / V cache entries from a batch of 64 equal those of the same row in a batch of 2."""
    n_heads, n_kv_heads, head_dim, K, max_seq, max_batch = 4, 2, 64, 512, 40, 66
    inv_freq, N = rope_problem(C, n_heads, n_kv_heads, head_dim, K, max_seq, max_batch)
    W = Weights(C, name, N, K, rng)
    x = random_x(rng, 64, K)
    slots_all = rng.permutation(64).astype(np.int32)
    positions_all = rng.integers(0, max_seq, 64).astype(np.int32)
    shape = (max_batch, max_seq, n_kv_heads, head_dim)

    def run(rows, slots, positions):
        q_out = nan_full((len(rows), n_heads, head_dim), torch.bfloat16)
        paged = PagedCaches(nan_full(shape, torch.bfloat16), nan_full(shape, torch.bfloat16))
        s = torch.from_numpy(slots).cuda()
        p = torch.from_numpy(positions).cuda()
        xr = x_rows(x[rows])
        ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), xr.data_ptr(), len(rows), N, K, ROPE_KV,
                           positions=p.data_ptr(), slots=s.data_ptr(), inv_freq=inv_freq.data_ptr(),
                           q_out=q_out.data_ptr(), k_cache=paged.k.data_ptr(), v_cache=paged.v.data_ptr(),
                           n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, max_seq=max_seq,
                           **paged.kwargs())
        torch.cuda.synchronize()
        return q_out, *paged.gather()

    q64, k64, v64 = run(list(range(64)), slots_all, positions_all)
    for lo, hi in ((32, 48), (5, 29)):  # 16-row passes (2 n8 tiles) and 4 tiles
        q, k, v = run(list(range(lo, hi)), slots_all[lo:hi], positions_all[lo:hi])
        cells = (torch.from_numpy(slots_all[lo:hi]).long().cuda(),
                 torch.from_numpy(positions_all[lo:hi]).long().cuda())
        assert torch.equal(q, q64[lo:hi]) and torch.equal(k[cells], k64[cells]) and torch.equal(v[cells], v64[cells]), \
            f"{name}: rows {lo}..{hi - 1} as a batch of {hi - lo} differ from the batch of 64"
    for m in range(64):
        other = 63 - m if m != 63 - m else 0
        # the partner writes into slot 65, a slot no row of the batch of 64 uses
        q2, k2, v2 = run([m, other], np.array([slots_all[m], 65], np.int32),
                         np.array([positions_all[m], 0], np.int32))
        s, p = int(slots_all[m]), int(positions_all[m])
        assert torch.equal(q2[0], q64[m]), f"{name}: q of row {m} differs from the batch of 64"
        assert torch.equal(k2[s, p], k64[s, p]) and torch.equal(v2[s, p], v64[s, p]), \
            f"{name}: the K / V entry of row {m} differs from the batch of 64"


# A matrix on which 9..16-row calls of the 4- and 5-bit types take CTAs of two W tiles, of 8 warps
# (a wide grid's are of 4): at least tuning::kGemvQuantMmaTwoTileMinCtas (512) CTAs of 32 rows (16
# pairs), the last one partly empty, and rows of at least kGemvQuantMmaTwoTileMinK (4096) values.
TWO_TILE_N = 32 * 512 + 18  # 8,201 SwiGLU pairs: 513 CTAs either way
TWO_TILE_K = 4096


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_1", "q4_k", "q5_k"])
@pytest.mark.parametrize("wide", [False, True], ids=["8_warps", "wide_grid"])
def test_gemv_quant_mma_two_w_tiles(C, ops, rng, name, wide):
    """The CTAs of two 16-row W tiles (16 rows of x), of 8 warps (TWO_TILE_N rows) or of 4 (a wide
    grid): against the reference at 9 and 16 rows, and bit for bit equal to the one-tile form of
    the same warps (the same rows in batches of 8 and 2, and inside a batch of 24, whose 3 n8
    tiles run one W tile a CTA), plain and through SwiGLU."""
    N = wide_grid_rows() if wide else TWO_TILE_N
    assert wide or N < wide_grid_rows(), "on a GPU of fewer than 86 SMs this is a wide grid; the test needs 8 warps"
    K = TWO_TILE_K + (96 if TYPES[name][1] == 32 else 0)
    W = Weights(C, name, N, K, rng)
    Wb, S = mma_weights(W)
    x = random_x(rng, 24, K)
    check_gemv(f"{name} M=9 N={N}", gemv(ops, W, x_rows(x[:9])), Wb, x[:9], S)
    all16 = gemv(ops, W, x_rows(x[:16]))
    check_gemv(f"{name} M=16 N={N}", all16, Wb, x[:16], S)
    del Wb, S
    assert torch.equal(gemv(ops, W, x_rows(x[4:12])), all16[4:12]), f"{name}: 8 rows differ from the batch of 16"
    assert torch.equal(gemv(ops, W, x_rows(x[[6, 1]]))[0], all16[6]), f"{name}: row 6 differs in a batch of 2"
    assert torch.equal(gemv(ops, W, x_rows(x))[:16], all16), f"{name}: 16 rows differ from the batch of 24"
    glu16 = swiglu_rows(ops, W, x, list(range(16)))
    assert not torch.isnan(glu16).any(), f"{name} SwiGLU: an output was not written"
    assert torch.equal(swiglu_rows(ops, W, x, list(range(3, 11))), glu16[3:11]), \
        f"{name} SwiGLU: 8 rows differ from the batch of 16"
    assert torch.equal(swiglu_rows(ops, W, x, list(range(24)))[:16], glu16), \
        f"{name} SwiGLU: 16 rows differ from the batch of 24"


def check_mma_rope_kv(C, ops, rng, name, M, n_heads, K, what, n_kv_heads=2, head_dim=64, max_seq=24, max_batch=3):
    """RopeKV of M random rows through W of type `name` for a one-layer model of these heads on K
    inputs, against rope_oracle of the same rows' StoreF32 q|k|v. Returns W's rows (q|k|v width)."""
    inv_freq, N = rope_problem(C, n_heads, n_kv_heads, head_dim, K, max_seq, max_batch)
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    qkv = gemv(ops, W, x)

    def run(**rope):
        ops.gemv_quant_mma(W.type_id, W.packed.data_ptr(), x.data_ptr(), M, N, K, ROPE_KV, **rope)

    check_rope_kv(rng, run, qkv, inv_freq, n_heads, n_kv_heads, head_dim, max_seq, max_batch, f"{name} {what}")
    return N


@pytest.mark.parametrize("name", ["q4_k", "q4_1"])
def test_gemv_quant_mma_two_w_tiles_rope_kv(C, ops, rng, name):
    """RopeKV on CTAs of two W tiles (258 heads of 64 dims: 8,256 rotation pairs, 516 CTAs at 16
    rows) against rope_oracle of the same rows' StoreF32 q|k|v."""
    N = check_mma_rope_kv(C, ops, rng, name, 16, 254, TWO_TILE_K, "two W tiles")
    assert N // 2 >= 16 * 512, "the matrix must take CTAs of two W tiles"


# Rows of the short grids where the 4- and 5-bit types run CTAs of 16 warps and two W tiles at
# 1-16 rows (short_grid in the kernel): at K of 16 k tiles or more, 16-row CTAs (8 pairs) that fit
# 2 an SM while CTAs of 32 rows (16 pairs) number tuning::kGemvQuantMmaShortGridMinFillPct (90) %
# of the SMs or more.
def sm_count():
    return torch.cuda.get_device_properties(0).multi_processor_count


def is_short_grid(rows, K, sms):
    return K >= 16 * 256 and -(-rows // 16) <= 2 * sms and 100 * -(-rows // 32) >= 90 * sms


def check_own_k_split(C, ops, rng, name, N, K, own_rows):
    """A grid that splits K its own way up to own_rows rows (short grids 16, wide grids 32; 8 warps
    past them): against the reference at 2, 12, own_rows, own_rows + 8 and 64 rows (and 24 on wide
    grids), and the rows bit for bit equal across batches of 1-own_rows (n8 tiles 1, 2 and, on wide
    grids, 4) and of own_rows + 1 to 64, plain and through SwiGLU."""
    W = Weights(C, name, N, K, rng)
    Wb, S = mma_weights(W)
    x = random_x(rng, 64, K)
    own, all64 = gemv(ops, W, x_rows(x[:own_rows])), gemv(ops, W, x_rows(x))
    check_gemv(f"{name} M={own_rows} N={N} K={K}", own, Wb, x[:own_rows], S)
    check_gemv(f"{name} M=64 N={N} K={K}", all64, Wb, x, S)
    within = [(5, 2), (3, 12)] + ([(6, 24)] if own_rows >= 32 else [])
    past = own_rows + 8
    for lo, M, batch in [(lo, M, own) for lo, M in within] + [(64 - past - 6, past, all64)]:
        rows = slice(lo, lo + M)
        y = gemv(ops, W, x_rows(x[rows]))
        check_gemv(f"{name} M={M} N={N} K={K}", y, Wb, x[rows], S)
        assert torch.equal(y, batch[rows]), f"{name}: {M} rows differ from the same rows in a batch of {len(batch)}"
    del Wb, S
    glu_own = swiglu_rows(ops, W, x, list(range(own_rows)))
    assert not torch.isnan(glu_own).any(), f"{name} SwiGLU: an output was not written"
    for lo, M in within:
        assert torch.equal(swiglu_rows(ops, W, x, list(range(lo, lo + M))), glu_own[lo:lo + M]), \
            f"{name} SwiGLU: {M} rows differ from the same rows in a batch of {own_rows}"


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k"])
def test_gemv_quant_mma_short_grid(C, ops, rng, name):
    """CTAs of 16 warps on a short grid (2 x SMs 16-row CTAs, the last partly empty; 17 or 18 k
    tiles, so warps 0 and 1 take two and the 32-value types' last is partial), 8 warps past 16
    rows: check_own_k_split."""
    sms = sm_count()
    N, K = 32 * sms - 6, 17 * 256 + (96 if TYPES[name][1] == 32 else 0)
    assert is_short_grid(N, K, sms), "the matrix must take CTAs of 16 warps"
    check_own_k_split(C, ops, rng, name, N, K, own_rows=16)


@pytest.mark.parametrize("name", ["q4_k", "q5_0"])
def test_gemv_quant_mma_short_grid_rope_kv(C, ops, rng, name):
    """RopeKV on CTAs of 16 warps (a short grid of rotation pairs) at 2 and 16 rows against
    rope_oracle of the same rows' StoreF32 q|k|v."""
    sms = sm_count()
    n_heads, K = 2 * ((sms // 2 - 4) // 2), 17 * 256
    assert is_short_grid((n_heads + 4) * 64, K, sms), "the matrix must take CTAs of 16 warps"
    for M in (2, 16):
        check_mma_rope_kv(C, ops, rng, name, M, n_heads, K, f"short grid M={M}")


# Rows of the wide grids where gemv_quant_mma runs CTAs of 4 warps at 1-32 rows (wide_grid in the
# kernel): 16-row CTAs (8 pairs) numbering tuning::kGemvQuantMmaWideGridMinCtasPerSm (12) an SM or
# more, the last partly empty here.
def wide_grid_rows():
    return 16 * 12 * sm_count() + 40


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_mma_wide_grid(C, ops, rng, name):
    """CTAs of 4 warps on a wide grid (5 k tiles, so warp 0 takes two; the 32-value types' last is
    partial), 8 warps past 32 rows: check_own_k_split."""
    check_own_k_split(C, ops, rng, name, wide_grid_rows(), 4 * 256 + (96 if TYPES[name][1] == 32 else 256),
                      own_rows=32)


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q8_0"])
def test_gemv_quant_mma_wide_grid_rope_kv(C, ops, rng, name):
    """RopeKV on CTAs of 4 warps (a wide grid of rotation pairs) at 2, 12 and 24 rows against
    rope_oracle of the same rows' StoreF32 q|k|v."""
    n_heads = -(-wide_grid_rows() // 128) * 2  # whole groups of the helper's 2 kv heads of 64 dims
    for M in (2, 12, 24):
        check_mma_rope_kv(C, ops, rng, name, M, n_heads, 5 * 256, f"wide grid M={M}")


def cap_grid_rows():
    """W rows whose 16-row CTAs (8 SwiGLU or RoPE pairs a CTA: rows / 16 CTAs either way) number
    more than 2 an SM: the grids that take the 80-register instances (CtasPerSm in the kernel),
    where every small matrix above takes the 128-register ones."""
    return 16 * (2 * sm_count() + 1) + 32


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_mma_register_cap_by_grid(C, ops, rng, name):
    """A grid of more than 2 CTAs an SM at 2 and 12 rows (the 80-register instances where they fit;
    the others the 128-register ones): against the reference, and bit for bit equal to the same
    rows inside a batch of 24 (3 n8 tiles, always 128 registers), plain and through SwiGLU."""
    K = 256 + (96 if TYPES[name][1] == 32 else 0)
    W = Weights(C, name, cap_grid_rows(), K, rng)
    Wb, S = mma_weights(W)
    x = random_x(rng, 24, K)
    all24 = gemv(ops, W, x_rows(x))
    glu24 = swiglu_rows(ops, W, x, list(range(24)))
    for lo, M in ((5, 2), (7, 12)):
        rows = slice(lo, lo + M)
        y = gemv(ops, W, x_rows(x[rows]))
        check_gemv(f"{name} M={M} N={W.N} K={K}", y, Wb, x[rows], S)
        assert torch.equal(y, all24[rows]), f"{name}: {M} rows differ from the same rows in a batch of 24"
        assert torch.equal(swiglu_rows(ops, W, x, list(range(lo, lo + M))), glu24[rows]), \
            f"{name} SwiGLU: {M} rows differ from the same rows in a batch of 24"


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q8_0"])
def test_gemv_quant_mma_register_cap_by_grid_rope_kv(C, ops, rng, name):
    """RopeKV on a grid of more than 2 CTAs an SM at 2 rows (80 registers) against rope_oracle of
    the same rows' StoreF32 q|k|v."""
    n_heads = -(-cap_grid_rows() // 128) * 2  # whole groups of the helper's 2 kv heads of 64 dims
    check_mma_rope_kv(C, ops, rng, name, 2, n_heads, 256, "80 registers")


def test_gemv_quant_mma_bad_arguments_raise(C, ops, rng):
    W = Weights(C, "q4_k", 8, 256, rng)
    x = x_rows(random_x(rng, 2, 256))
    y = nan_full((2, 8), torch.float32)
    bad = (ValueError, RuntimeError)
    call = lambda t=12, w=W.packed.data_ptr(), xp=x.data_ptr(), M=2, K=256: ops.gemv_quant_mma(  # noqa: E731
        t, w, xp, M, 8, K, STORE_F32, out_f32=y.data_ptr())
    with pytest.raises(bad, match="type id 9"):
        call(t=9)
    with pytest.raises(bad, match="K=288"):
        call(K=288)
    with pytest.raises(bad, match="M=65"):
        call(M=65)
    with pytest.raises(bad, match="M=0"):
        call(M=0)
    with pytest.raises(bad, match="16-byte aligned"):
        call(w=W.packed.data_ptr() + 8)
    with pytest.raises(bad, match="16-byte aligned"):
        call(xp=x.data_ptr() + 2)
    with pytest.raises(bad, match="device pointer"):
        call(xp=0)
    with pytest.raises(bad, match="32-bit x offsets"):  # 64 x K > 2^31 - 1, refused before x is read
        call(M=64, K=256 * 131_073)
    with pytest.raises(bad, match="out_f32"):
        ops.gemv_quant_mma(12, W.packed.data_ptr(), x.data_ptr(), 2, 8, 256, STORE_F32)
    with pytest.raises(bad, match="SwiGLU needs an even N"):
        ops.gemv_quant_mma(12, W.packed.data_ptr(), x.data_ptr(), 2, 7, 256, SWIGLU, out=y.data_ptr())
    with pytest.raises(bad, match="epilogue"):
        ops.gemv_quant_mma(12, W.packed.data_ptr(), x.data_ptr(), 2, 8, 256, 5, out_f32=y.data_ptr())
    assert torch.isnan(y).all(), "a rejected call must not touch the output"
