"""Quantized CPU kernels (_C.quant_ops): block formats, dequantization, GEMV and GEMM.

Dequantization is compared bit for bit with the `gguf` package's `gguf.quants.dequantize` on
random block bytes (every code pattern; the fp16 scale fields replaced by finite values).

The GEMV / GEMM reference is float64 arithmetic on the float64 dequantized weights and the fp32
activations. The kernels quantize activations per block of 32 (d = amax / 127, q = round(x / d)),
so |x - d q| <= amax / 254 per value and the error of one output is bounded by
    sum over blocks b of (amax_b / 254) * sum_{i in b} |w_i|
(tighter than sum |w| |x| 2^-7 because it is per block), plus fp32 rounding of the kernel's sums,
bounded generously by 2^-20 (K / 32 + 16) * sum_b 3 max_{i in b} |w_i| * sum_{i in b} |x_i|
(the kernel sums per-chunk terms s * c * q and b * q whose sizes are at most 3 max |w| |x|).
Every ISA path this CPU has is run (isa=), on odd shapes: a single block, N odd, many rows,
K not a multiple of 256 for the 32-blocks, M = 1, 3, 17 and the large-M (prefill) path.
`matmul` is the engine's entry point: it writes a column range of a wider output (ldy > N) and
accumulates (Y += ...), which the tests check against the same reference.
"""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as G  # noqa: E402

TYPES = {"q8_0": G.Q8_0, "q4_0": G.Q4_0, "q4_1": G.Q4_1, "q5_0": G.Q5_0, "q5_1": G.Q5_1, "q4_k": G.Q4_K,
         "q5_k": G.Q5_K, "q6_k": G.Q6_K}
BLOCK = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
         "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
# byte offsets of the fp16 scale fields inside one block
FP16_FIELDS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q4_k": [0, 2],
               "q5_k": [0, 2], "q6_k": [208]}
ISAS = ["scalar", "avx2", "avx512vnni", "amx"]


@pytest.fixture(scope="module")
def Q(C):
    return C.quant_ops


def random_blocks(name, n_rows, K, rng):
    """Random bytes for every code, with finite fp16 scales of size ~0.01 (and some negative)."""
    elems, size = BLOCK[name]
    nb = K // elems
    raw = rng.integers(0, 256, size=(n_rows, nb, size), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        scale = (rng.standard_normal((n_rows, nb)) * 0.01).astype(np.float16)
        raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(n_rows, nb, 2)
    return raw.reshape(n_rows, nb * size)


def shapes_for(name):
    if BLOCK[name][0] == 32:
        return [(1, 32), (7, 96), (33, 544), (130, 64)]  # K = 96, 544: not multiples of 256
    return [(1, 256), (5, 768), (67, 512)]


def isas(Q):
    return [isa for isa in ISAS if Q.isa_supported(isa)]


def reference_and_bound(w_deq, X):
    """float64 Y = X W^T, and the per-output error bound of the module docstring."""
    W = w_deq.astype(np.float64)
    X64 = X.astype(np.float64)
    M, K = X.shape
    nb = K // 32
    amax = np.abs(X64).reshape(M, nb, 32).max(axis=2)                      # [M, nb]
    wabs = np.abs(W).reshape(W.shape[0], nb, 32)                          # [N, nb, 32]
    quant = (amax / 254.0) @ wabs.sum(axis=2).T                           # [M, N]
    xsum = np.abs(X64).reshape(M, nb, 32).sum(axis=2)                     # [M, nb]
    float_terms = xsum @ (3.0 * wabs.max(axis=2)).T
    slack = 2.0 ** -20 * (nb + 16) * float_terms
    return X64 @ W.T, quant * (1 + 1e-6) + slack + 1e-30


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_matches_gguf(Q, rng, name):
    for n_rows, K in shapes_for(name):
        blocks = random_blocks(name, n_rows, K, rng)
        out = np.full((n_rows, K), np.nan, dtype=np.float32)
        got = Q.dequantize(name, blocks, K, out=out)
        want = gguf.quants.dequantize(blocks, TYPES[name]).reshape(n_rows, K)
        assert got is out or np.shares_memory(got, out)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(TYPES))
def test_block_sizes(Q, name):
    elems, size = BLOCK[name]
    assert Q.row_bytes(name, 4 * elems) == 4 * size
    assert Q.row_bytes(int(TYPES[name]), elems) == size


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_against_float64_reference(Q, rng, name):
    for isa in isas(Q):
        for N, K in shapes_for(name):
            blocks = random_blocks(name, N, K, rng)
            x = rng.standard_normal(K).astype(np.float32)
            x[rng.integers(0, K)] *= 20.0  # one outlier: its block gets a coarse activation scale
            ref, bound = reference_and_bound(Q.dequantize(name, blocks, K), x[None, :])
            out = np.full(N, np.nan, dtype=np.float32)
            y = Q.gemv(name, blocks, x, isa=isa, out=out)
            assert np.isfinite(y).all(), (isa, N, K)
            err = np.abs(y.astype(np.float64) - ref[0])
            assert (err <= bound[0]).all(), (isa, N, K, float((err / bound[0]).max()))


@pytest.mark.parametrize("name", list(TYPES))
def test_gemm_against_float64_reference_and_gemv(Q, rng, name):
    N, K = shapes_for(name)[2]
    blocks = random_blocks(name, N, K, rng)
    for isa in isas(Q):
        for M in (1, 3, 15, 17, 48, 67):  # amx: below amx_min_rows, one tile + 1 row, whole tiles, a tail
            X = rng.standard_normal((M, K)).astype(np.float32)
            ref, bound = reference_and_bound(Q.dequantize(name, blocks, K), X)
            out = np.full((M, N), np.nan, dtype=np.float32)
            Y = Q.gemm(name, blocks, X, isa=isa, out=out)
            err = np.abs(Y.astype(np.float64) - ref)
            assert (err <= bound).all(), (isa, M, float((err / bound).max()))
            # the same dot product on the same quantized activations: GEMM row m is GEMV of row m,
            # except on AMX tiles (the bias terms are summed per chunk, not per half)
            if isa != "amx" or M < Q.amx_min_rows:
                for m in (0, M - 1):
                    np.testing.assert_array_equal(Y[m], Q.gemv(name, blocks, X[m], isa=isa))


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_column_range_and_accumulate(Q, rng, name):
    N, K = shapes_for(name)[1]
    blocks = random_blocks(name, N, K, rng)
    ref_w = Q.dequantize(name, blocks, K)
    for isa in isas(Q):
        for M in (1, 5, 40):
            X = rng.standard_normal((M, K)).astype(np.float32)
            ref, bound = reference_and_bound(ref_w, X)
            col, width = 3, N + 7
            out = np.full((M, width), np.nan, dtype=np.float32)
            got = Q.matmul(name, blocks, X, out, col=col, isa=isa)
            assert got is out or np.shares_memory(got, out)
            assert np.isnan(out[:, :col]).all() and np.isnan(out[:, col + N:]).all(), (isa, M)
            err = np.abs(out[:, col:col + N].astype(np.float64) - ref)
            assert (err <= bound).all(), (isa, M, float((err / bound).max()))
            # accumulate: out += X W^T on top of a random base, the other columns untouched
            base = rng.standard_normal((M, width)).astype(np.float32)
            acc = base.copy()
            Q.matmul(name, blocks, X, acc, col=col, accumulate=True, isa=isa)
            np.testing.assert_array_equal(acc[:, :col], base[:, :col])
            np.testing.assert_array_equal(acc[:, col + N:], base[:, col + N:])
            want = base[:, col:col + N].astype(np.float64) + ref
            err = np.abs(acc[:, col:col + N].astype(np.float64) - want)
            assert (err <= bound + 2.0 ** -22 * np.abs(want)).all(), (isa, M)
    with pytest.raises(ValueError, match="out has shape"):
        Q.matmul(name, blocks, np.zeros((2, K), np.float32), np.zeros((2, N + 2), np.float32), col=3)


@pytest.mark.parametrize("name", list(TYPES))
def test_isa_paths_agree(Q, rng, name):
    N, K = shapes_for(name)[1]
    blocks = random_blocks(name, N, K, rng)
    x = rng.standard_normal(K).astype(np.float32)
    ys = {isa: Q.gemv(name, blocks, x, isa=isa).astype(np.float64) for isa in isas(Q)}
    _, bound = reference_and_bound(Q.dequantize(name, blocks, K), x[None, :])
    scalar = ys["scalar"]
    for isa, y in ys.items():
        # the paths share the int8 activations; only fp32 summation order differs
        assert (np.abs(y - scalar) <= bound[0]).all(), isa


def test_auto_decode_batches_are_batch_invariant(Q, rng):
    """M <= 8 (decode batches) on isa="auto": each row bit-equal to its own M = 1 GEMV."""
    N, K = 45, 576
    for name in ("q4_1", "q5_0", "q8_0"):
        blocks = random_blocks(name, N, K, rng)
        X = rng.standard_normal((8, K)).astype(np.float32)
        for M in (2, 5, 8):
            Y = Q.gemm(name, blocks, X[:M], out=np.full((M, N), np.nan, np.float32))
            for m in range(M):
                np.testing.assert_array_equal(Y[m], Q.gemv(name, blocks, X[m]))


def test_zero_activations_give_zero(Q, rng):
    blocks = random_blocks("q4_k", 3, 256, rng)
    y = Q.gemv("q4_k", blocks, np.zeros(256, np.float32), out=np.full(3, np.nan, np.float32))
    np.testing.assert_array_equal(y, np.zeros(3, np.float32))


def test_threads_argument(Q, rng):
    blocks = random_blocks("q4_1", 37, 128, rng)
    x = rng.standard_normal(128).astype(np.float32)
    np.testing.assert_array_equal(Q.gemv("q4_1", blocks, x, n_threads=1), Q.gemv("q4_1", blocks, x, n_threads=2))


def test_cpu_features_and_auto(Q):
    assert Q.best_isa() in ISAS
    assert Q.isa_supported("scalar") and Q.isa_supported(Q.best_isa())
    assert isinstance(Q.cpu_features(), str)


def test_bad_arguments_name_the_parameter(Q, rng):
    blocks = random_blocks("q4_k", 2, 256, rng)
    x = np.zeros(256, np.float32)
    with pytest.raises(ValueError, match="type"):
        Q.gemv("q3_k", blocks, x)
    with pytest.raises(ValueError, match="type"):
        Q.gemv(99, blocks, x)
    with pytest.raises(ValueError, match="isa"):
        Q.gemv("q4_k", blocks, x, isa="neon")
    with pytest.raises(ValueError, match=r"x\.shape\[0\]"):
        Q.gemv("q4_k", blocks, np.zeros(288, np.float32))  # not a multiple of 256
    with pytest.raises(ValueError, match="w has"):
        Q.gemv("q4_k", np.ascontiguousarray(blocks[:, :100]), x)
    with pytest.raises(ValueError, match="x must"):
        Q.gemv("q4_k", blocks, x.astype(np.float64))
    with pytest.raises(ValueError, match="out"):
        Q.gemv("q4_k", blocks, x, out=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="K"):
        Q.dequantize("q4_0", np.zeros((1, 18), np.uint8), 48)
    with pytest.raises(ValueError, match=r"x\.shape\[1\]"):
        Q.quantize("q6_k", np.zeros((1, 32), np.float32))


@pytest.mark.parametrize("name", list(TYPES))
def test_first_bad_scale_finds_nan_and_inf(Q, rng, name):
    blocks = random_blocks(name, 3, 2 * BLOCK[name][0], rng)
    assert Q.first_bad_scale(name, blocks) == -1
    size = BLOCK[name][1]
    for bad_value, block in ((np.inf, 3), (np.nan, 4), (-np.inf, 1)):
        broken = blocks.copy().reshape(-1, size)
        off = FP16_FIELDS[name][-1]
        broken[block, off:off + 2] = np.array([bad_value], np.float16).view(np.uint8)
        assert Q.first_bad_scale(name, broken.reshape(3, -1)) == block
    with pytest.raises(ValueError, match="whole"):
        Q.first_bad_scale(name, blocks.reshape(-1)[:-1].copy())
