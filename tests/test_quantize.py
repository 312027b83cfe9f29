"""Quantizers (_C.quant_ops.quantize): fp32 rows -> GGUF blocks, bit for bit.

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: compared byte for byte with the `gguf` package's own quantizer
(gguf.quants.quantize), which reproduces ggml's quantize_row_q*_ref.
Q4_K, Q5_K, Q6_K: the gguf package has no quantizer for them, so they are compared byte for byte
with a numpy port of llama.cpp's reference (quantize_row_q4_K_ref / q5_K_ref / q6_K_ref with
make_qkx2_quants / make_qx_quants) written below: float32 operations in the C order, vectorized
over blocks only (the loops over values inside a block stay sequential, so every sum rounds as in
C). This is what the C reference computes when compiled without FMA contraction. On top, each
type's round trip (quantize, dequantize) must stay within a sanity error on Gaussian data.
Inputs: Gaussian rows with outliers, all-zero and constant blocks, tiny values (fp16 subnormal
scales) and huge values (scales that overflow fp16 to inf), as ggml then stores them.
"""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as G  # noqa: E402

f32 = np.float32


@pytest.fixture(scope="module")
def Q(C):
    return C.quant_ops


def awkward_rows(rng, n_rows, K):
    """Gaussian rows plus the blocks quantizers get wrong: zeros, constants, outliers, tiny, huge."""
    x = rng.standard_normal((n_rows, K)).astype(f32)
    x[0, :32] = 0.0
    x[0, 32:64] = 0.75
    x[0, 64:96] = -3.0
    if n_rows > 1:
        x[1] *= f32(1e-6)                        # Q8_0 / Q4_0 scales become fp16 subnormals
    if n_rows > 2:
        x[2, rng.integers(0, K, 4)] *= f32(50.0)  # outliers
    if n_rows > 3:
        x[3] = np.abs(x[3])                      # all positive: min clamps to 0 in the K-quants
    return x


# ---- numpy port of llama.cpp's K-quant reference quantizers ---------------------------------

def nearest_int(v):
    val = (np.asarray(v, dtype=f32) + f32(12582912.0)).astype(f32)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def fp16_bits(v):
    with np.errstate(over="ignore"):
        return np.asarray(v, dtype=f32).astype(np.float16).view(np.uint16)


def fp16_value(bits):
    return bits.view(np.float16).astype(f32)


def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep):
    """x, weights: [B, n] float32 -> (scale [B], the_min [B], L [B, n] uint8)."""
    B, n = x.shape
    mn, mx = x[:, 0].copy(), x[:, 0].copy()
    sum_w = weights[:, 0].copy()
    sum_x = sum_w * x[:, 0]
    for i in range(1, n):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = sum_w + weights[:, i]
        sum_x = sum_x + weights[:, i] * x[:, i]
    mn = np.where(mn > 0, f32(0), mn).astype(f32)
    flat = mx == mn
    with np.errstate(all="ignore"):
        iscale = f32(nmax) / (mx - mn)
        scale = f32(1) / iscale
        L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(f32)
        best = np.zeros(B, f32)
        for i in range(n):
            diff = scale * L[:, i] + mn - x[:, i]
            best = best + weights[:, i] * (diff * diff)
        for step in range(nstep + 1):
            iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / (mx - mn)
            Laux = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax).astype(f32)
            sum_l = np.zeros(B, f32)
            sum_l2 = np.zeros(B, f32)
            sum_xl = np.zeros(B, f32)
            for i in range(n):
                w, l = weights[:, i], Laux[:, i]
                sum_l = sum_l + w * l
                sum_l2 = sum_l2 + w * l * l
                sum_xl = sum_xl + w * l * x[:, i]
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            clamp = this_min > 0
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale).astype(f32)
            this_min = np.where(clamp, f32(0), this_min).astype(f32)
            cur = np.zeros(B, f32)
            for i in range(n):
                diff = this_scale * Laux[:, i] + this_min - x[:, i]
                cur = cur + weights[:, i] * (diff * diff)
            take = (D > 0) & (cur < best)
            L = np.where(take[:, None], Laux, L)
            best = np.where(take, cur, best)
            scale = np.where(take, this_scale, scale)
            mn = np.where(take, this_min, mn)
    L = np.where(flat[:, None], f32(0), L)
    scale = np.where(flat, f32(0), scale).astype(f32)
    return scale, (-mn).astype(f32), L.astype(np.uint8)


def k4_common(x, nmax, rmin, nstep):
    """Shared part of Q4_K / Q5_K: x [B, 256] -> (scales bytes [B, 12], d bits, dmin bits, L [B, 256])."""
    B = x.shape[0]
    scales = np.zeros((B, 8), f32)
    mins = np.zeros((B, 8), f32)
    L = np.zeros((B, 256), np.uint8)
    for j in range(8):
        xs = x[:, 32 * j:32 * j + 32]
        sum_x2 = np.zeros(B, f32)
        for l in range(32):
            sum_x2 = sum_x2 + xs[:, l] * xs[:, l]
        av_x = np.sqrt(sum_x2 / f32(32))
        weights = (av_x[:, None] + np.abs(xs)).astype(f32)
        scales[:, j], mins[:, j], L[:, 32 * j:32 * j + 32] = make_qkx2_quants(xs, weights, nmax, rmin, 0.1, nstep)
    # C: `float max = 0; if (v > max) max = v;` stays +0 for a -0 min (np.maximum would keep -0)
    max_scale = np.where(scales.max(axis=1) > 0, scales.max(axis=1), f32(0)).astype(f32)
    max_min = np.where(mins.max(axis=1) > 0, mins.max(axis=1), f32(0)).astype(f32)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0)).astype(f32)
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0)).astype(f32)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales).astype(np.uint8), 63)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins).astype(np.uint8), 63)
    packed = np.zeros((B, 12), np.uint8)
    packed[:, 0:4] = ls[:, :4]
    packed[:, 4:8] = lm[:, :4]
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    packed[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    d_bits = fp16_bits(max_scale / f32(63))
    dmin_bits = fp16_bits(max_min / f32(63))
    d, dmin = fp16_value(d_bits), fp16_value(dmin_bits)
    for j in range(8):
        dj = d * ls[:, j].astype(f32)
        dm = dmin * lm[:, j].astype(f32)
        with np.errstate(all="ignore"):
            l = np.clip(nearest_int((x[:, 32 * j:32 * j + 32] + dm[:, None]) / dj[:, None]), 0, nmax)
        keep = dj == 0
        L[:, 32 * j:32 * j + 32] = np.where(keep[:, None], L[:, 32 * j:32 * j + 32], l)
    return packed, d_bits, dmin_bits, L


def ref_q4_k(x):
    B = x.shape[0]
    packed, d, dmin, L = k4_common(x, 15, -1.0, 20)
    qs = np.concatenate([L[:, j:j + 32] | (L[:, j + 32:j + 64] << 4) for j in range(0, 256, 64)], axis=1)
    return np.concatenate([d.reshape(B, 1).view(np.uint8), dmin.reshape(B, 1).view(np.uint8), packed,
                           qs.astype(np.uint8)], axis=1)


def ref_q5_k(x):
    B = x.shape[0]
    packed, d, dmin, L = k4_common(x, 31, -0.5, 15)
    qh = np.zeros((B, 32), np.uint8)
    ql = []
    for g, n in enumerate(range(0, 256, 64)):
        l1, l2 = L[:, n:n + 32].astype(np.int32), L[:, n + 32:n + 64].astype(np.int32)
        qh |= ((l1 > 15).astype(np.uint8) << (2 * g)) | ((l2 > 15).astype(np.uint8) << (2 * g + 1))
        ql.append(((l1 & 15) | ((l2 & 15) << 4)).astype(np.uint8))
    return np.concatenate([d.reshape(B, 1).view(np.uint8), dmin.reshape(B, 1).view(np.uint8), packed, qh]
                          + ql, axis=1)



def _x2_weighted_sums(x, lf):
    """sum_i w_i x_i l_i and sum_i w_i l_i^2 with w = x^2, accumulated in float32 in index order as
    make_qx_quants does (the order is part of bit-identity)."""
    sumlx = np.zeros(x.shape[0], f32)
    suml2 = np.zeros(x.shape[0], f32)
    for i in range(x.shape[1]):
        w = x[:, i] * x[:, i]
        sumlx = sumlx + w * x[:, i] * lf[:, i]
        suml2 = suml2 + w * lf[:, i] * lf[:, i]
    return sumlx, suml2

def make_qx_quants(x, nmax):
    """rmse_type 1, no importance weights: x [B, n] -> (scale [B], L [B, n] in [0, 2 nmax))."""
    B, n = x.shape
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(B), idx]
    zero = np.abs(mx) < f32(1e-15)
    with np.errstate(all="ignore"):
        iscale = f32(-nmax) / mx
        l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        L = (l + nmax).astype(np.int32)
        sumlx, suml2 = _x2_weighted_sums(x, l.astype(f32))
        scale = np.where(suml2 != 0, sumlx / suml2, f32(0)).astype(f32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(f32(nmax) + f32(0.1) * f32(step)) / mx
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            sumlx, suml2 = _x2_weighted_sums(x, l.astype(f32))
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(take[:, None], l + nmax, L)
            scale = np.where(take, sumlx / suml2, scale).astype(f32)
            best = np.where(take, scale * sumlx, best).astype(f32)
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, f32(0), scale).astype(f32)
    return scale, L


def ref_q6_k(x):
    B = x.shape[0]
    scales = np.zeros((B, 16), f32)
    L = np.zeros((B, 256), np.int32)
    for ib in range(16):
        scales[:, ib], L[:, 16 * ib:16 * ib + 16] = make_qx_quants(x[:, 16 * ib:16 * ib + 16], 32)
    pick = np.abs(scales).argmax(axis=1)
    max_scale = scales[np.arange(B), pick]
    zero = np.abs(max_scale) < f32(1e-15)
    with np.errstate(all="ignore"):
        iscale = f32(-128) / max_scale
        d_bits = fp16_bits(f32(1) / iscale)
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
        d = fp16_value(d_bits)
        for j in range(16):
            dj = d * sc[:, j].astype(f32)
            l = np.clip(nearest_int(x[:, 16 * j:16 * j + 16] / dj[:, None]), -32, 31) + 32
            L[:, 16 * j:16 * j + 16] = np.where((dj == 0)[:, None], L[:, 16 * j:16 * j + 16], l)
    ql, qh = [], []
    for j in range(0, 256, 128):
        q = [L[:, j + 32 * k:j + 32 * k + 32] for k in range(4)]
        ql += [(q[0] & 15) | ((q[2] & 15) << 4), (q[1] & 15) | ((q[3] & 15) << 4)]
        qh.append((q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6))
    out = np.concatenate([a.astype(np.uint8) for a in ql + qh] + [sc.view(np.uint8),
                                                                  d_bits.reshape(B, 1).view(np.uint8)], axis=1)
    out[zero] = 0
    return out


K_REFERENCES = {"q4_k": (ref_q4_k, 144), "q5_k": (ref_q5_k, 176), "q6_k": (ref_q6_k, 210)}


# ---- tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,qtype", [("q8_0", G.Q8_0), ("q4_0", G.Q4_0), ("q4_1", G.Q4_1), ("q5_0", G.Q5_0),
                                        ("q5_1", G.Q5_1)])
def test_32_block_quantizers_match_gguf(Q, rng, name, qtype):
    for n_rows, K in [(1, 32), (5, 96), (41, 320)]:
        x = awkward_rows(rng, n_rows, K)
        out = np.full((n_rows, Q.row_bytes(name, K)), 0xAB, np.uint8)
        got = Q.quantize(name, x, out=out)
        with np.errstate(all="ignore"):
            want = gguf.quants.quantize(x, qtype)
        np.testing.assert_array_equal(got, want)


def test_fp16_scale_overflow_matches_gguf(Q):
    x = np.zeros((1, 32), f32)
    x[0, 3] = 1e7  # d = 1e7 / 127 overflows fp16: stored as inf, as ggml and gguf do
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, G.Q8_0)
    np.testing.assert_array_equal(Q.quantize("q8_0", x), want)


@pytest.mark.parametrize("name", list(K_REFERENCES))
def test_k_quantizers_match_reference_port(Q, rng, name):
    ref, size = K_REFERENCES[name]
    for n_rows, K in [(1, 256), (6, 512)]:
        x = awkward_rows(rng, n_rows, K)
        got = Q.quantize(name, x, out=np.full((n_rows, Q.row_bytes(name, K)), 0xAB, np.uint8))
        want = ref(x.reshape(-1, 256)).reshape(n_rows, -1)
        assert want.shape == got.shape == (n_rows, K // 256 * size)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,qtype,max_rel_rmse", [
    ("q8_0", G.Q8_0, 0.01), ("q4_0", G.Q4_0, 0.15), ("q4_1", G.Q4_1, 0.12), ("q5_0", G.Q5_0, 0.07),
    ("q5_1", G.Q5_1, 0.06),
    ("q4_k", G.Q4_K, 0.12), ("q5_k", G.Q5_K, 0.06), ("q6_k", G.Q6_K, 0.03)])
def test_round_trip_error(Q, rng, name, qtype, max_rel_rmse):
    x = rng.standard_normal((16, 512)).astype(f32)
    blocks = Q.quantize(name, x)
    back = Q.dequantize(name, blocks, 512)
    np.testing.assert_array_equal(back, gguf.quants.dequantize(blocks, qtype).reshape(16, 512))
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x ** 2))
    assert rel < max_rel_rmse, rel


def test_quantize_is_row_parallel_and_deterministic(Q, rng):
    x = rng.standard_normal((67, 256)).astype(f32)
    a = Q.quantize("q4_k", x)
    np.testing.assert_array_equal(a[5:6], Q.quantize("q4_k", x[5:6]))
    np.testing.assert_array_equal(a, Q.quantize("q4_k", x))
