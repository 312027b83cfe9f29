"""The CUDA engine's layout of quantized weights (csrc/cuda/qlayout.h, qlayout.cpp) on the CPU,
through _C.quant_ops.gpu_repack / gpu_unpack, and the activation quantizer the GPU must match
(_C.quant_ops.quantize_activations).

Repacking moves bytes and computes none, so every check is exact: the round trip gives the file's
blocks back byte for byte (every type, K a multiple of 256 and, for the 32-value types, not), rows
repacked in chunks (first_row) give the same matrix as one call, and each tile holds the fields
qlayout.h names at the offsets it names (checked against the file blocks field by field, so a
round trip through two wrong-but-inverse permutations cannot pass)."""

import numpy as np
import pytest

f32 = np.float32

# name: (GGML id, block values, block bytes, tile bytes)
TYPES = {"q8_0": (8, 32, 34, 272), "q4_0": (2, 32, 18, 144), "q4_1": (3, 32, 20, 160),
         "q5_0": (6, 32, 22, 176), "q5_1": (7, 32, 24, 192), "q4_k": (12, 256, 144, 144),
         "q5_k": (13, 256, 176, 176), "q6_k": (14, 256, 210, 208)}
# 32-value types: (file offset, bytes, tile offset of the field array) of d, m, qh, qs.
FIELDS32 = {"q8_0": [(0, 2, 0), (2, 32, 16)], "q4_0": [(0, 2, 0), (2, 16, 16)],
            "q4_1": [(0, 2, 0), (2, 2, 16), (4, 16, 32)], "q5_0": [(0, 2, 0), (2, 4, 16), (6, 16, 48)],
            "q5_1": [(0, 2, 0), (2, 2, 16), (4, 4, 32), (8, 16, 64)]}


@pytest.fixture(scope="module")
def Q(C):
    return C.quant_ops


def blocks_of(Q, name, N, K, rng):
    """Random bytes would make NaN scales; real blocks from our quantizer instead, with a
    per-row scale so rows differ."""
    w = rng.standard_normal((N, K)).astype(f32) * rng.uniform(0.01, 2.0, size=(N, 1)).astype(f32)
    return Q.quantize(name, w)


def shapes(block):
    if block == 256:
        return [(1, 256), (5, 512), (3, 4096 + 256)]
    return [(1, 32), (4, 256), (7, 576), (3, 4096 + 96), (2, 4096 + 256)]


def matrix_bytes(name, N, K):
    _, _, _, tile = TYPES[name]
    T = (K + 255) // 256
    tail = N * T * 2 if name == "q6_k" else 0
    return (N * T * tile + tail + 15) // 16 * 16


@pytest.mark.parametrize("name", list(TYPES))
def test_round_trip_is_exact(Q, rng, name):
    _, block, _, _ = TYPES[name]
    for N, K in shapes(block):
        blocks = blocks_of(Q, name, N, K, rng)
        packed = Q.gpu_repack(name, blocks, K)
        assert packed.dtype == np.uint8 and packed.shape == (matrix_bytes(name, N, K),), (name, N, K)
        back = Q.gpu_unpack(name, packed, N, K)
        assert np.array_equal(back, blocks), f"{name} N={N} K={K}: unpack(repack(blocks)) != blocks"
        # rows 1.. alone come back as well
        if N > 1:
            assert np.array_equal(Q.gpu_unpack(name, packed, N, K, first_row=1), blocks[1:])


@pytest.mark.parametrize("name", list(TYPES))
def test_rows_repacked_in_chunks_give_the_same_matrix(Q, rng, name):
    _, block, _, _ = TYPES[name]
    N, K = 7, (576 if block == 32 else 512)
    blocks = blocks_of(Q, name, N, K, rng)
    whole = Q.gpu_repack(name, blocks, K)
    out = np.zeros(whole.shape, dtype=np.uint8)  # the alignment padding is the caller's to zero
    for first, last in [(0, 3), (3, 4), (4, 7)]:
        r = Q.gpu_repack(name, blocks[first:last], K, N=N, first_row=first, out=out)
        assert r is out or np.shares_memory(r, out)
    assert np.array_equal(out, whole), f"{name}: chunked repack differs from one call"


@pytest.mark.parametrize("name", list(TYPES))
def test_tiles_hold_the_fields_where_qlayout_h_says(Q, rng, name):
    _, block, bb, tile = TYPES[name]
    N, K = 3, (576 if block == 32 else 512)
    blocks = blocks_of(Q, name, N, K, rng)
    packed = Q.gpu_repack(name, blocks, K)
    T = (K + 255) // 256
    rows = packed[:N * T * tile].reshape(N, T, tile)
    for n in range(N):
        fb = blocks[n].reshape(K // block, bb)
        if block == 32:
            for b in range(K // 32):
                t, j = divmod(b, 8)
                for off, size, toff in FIELDS32[name]:
                    got = rows[n, t, toff + size * j: toff + size * (j + 1)]
                    assert np.array_equal(got, fb[b, off:off + size]), (name, n, b, off)
            used = K // 32 - 8 * (T - 1)  # blocks in the last tile
            if used < 8:
                for off, size, toff in FIELDS32[name]:
                    assert not rows[n, T - 1, toff + size * used: toff + size * 8].any(), "padding not zero"
        elif name in ("q4_k", "q5_k"):
            assert np.array_equal(rows[n], fb), name
        else:  # q6_k: scales @0, ql @16, qh @144; d in the tail
            tail = packed[N * T * tile: N * T * tile + 2 * N * T].reshape(N, T, 2)
            for t in range(T):
                assert np.array_equal(rows[n, t, 0:16], fb[t, 192:208])
                assert np.array_equal(rows[n, t, 16:144], fb[t, 0:128])
                assert np.array_equal(rows[n, t, 144:208], fb[t, 128:192])
                assert np.array_equal(tail[n, t], fb[t, 208:210])


def test_repack_bad_arguments_raise(Q, rng):
    blocks = blocks_of(Q, "q4_k", 2, 256, rng)
    with pytest.raises(ValueError, match="K"):
        Q.gpu_repack("q4_k", blocks, 288)
    with pytest.raises(ValueError, match="bytes per row"):
        Q.gpu_repack("q4_k", blocks, 512)
    with pytest.raises(ValueError, match="rows"):
        Q.gpu_repack("q4_k", blocks, 256, N=2, first_row=1)
    with pytest.raises(ValueError, match="type"):
        Q.gpu_repack("q2_k", blocks, 256)
    packed = Q.gpu_repack("q4_k", blocks, 256)
    with pytest.raises(ValueError, match="bytes"):
        Q.gpu_unpack("q4_k", packed[:-16], 2, 256)
    with pytest.raises(ValueError, match="rows"):
        Q.gpu_unpack("q4_k", packed, 2, 256, first_row=1, n_rows=2)


def reference_act_blocks(x):
    """quant_gemv.cpp's rule in numpy float32: d = amax / 127, q = round-half-away(x * (1 / d))."""
    M, K = x.shape
    b = x.reshape(M, K // 32, 32)
    amax = np.abs(b).max(axis=2)
    d = (amax / f32(127)).astype(f32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
    v = (b * inv[:, :, None]).astype(f32)
    q = (np.sign(v) * np.floor(np.abs(v) + f32(0.5))).astype(np.int32)
    s0, s1 = q[:, :, :16].sum(axis=2), q[:, :, 16:].sum(axis=2)
    head = np.stack([d, d, (d * s0.astype(f32)).astype(f32), (d * s1.astype(f32)).astype(f32)], axis=2)
    return head.astype(f32), q.astype(np.int8)


def test_quantize_activations_is_the_cpu_rule(Q, rng):
    M, K = 5, 576
    x = (rng.standard_normal((M, K)) * rng.uniform(0.01, 10, size=(M, 1))).astype(f32)
    x[0, :32] = 0.0
    x[1, 32:64] = 0.5  # ties: 0.5 / (0.5 / 127) lands on 127 exactly
    raw = Q.quantize_activations(x)
    assert raw.dtype == np.uint8 and raw.shape == (M, K // 32 * 48)
    blocks = raw.reshape(M, K // 32, 48)
    head = blocks[:, :, :16].copy().view(f32)
    qs = blocks[:, :, 16:].copy().view(np.int8)
    ref_head, ref_q = reference_act_blocks(x)
    assert np.array_equal(qs, ref_q)
    assert np.array_equal(head, ref_head)
    with pytest.raises(ValueError, match="32"):
        Q.quantize_activations(np.zeros((1, 40), f32))
