"""The weights gemv_quant_mma decodes, as a reference (numpy): which types decode to bf16 of the
CPU-dequantized W bit for bit, and for the others the slack of the bf16x2 decode per weight,
S = 2^-8 (2.01 |w| + 2.05 |a|), a the additive min of the weight's block (Q4_1 / Q5_1: m; Q4_K /
Q5_K: -dmin m_j of its sub-block; Q6_K: none). The derivation is in csrc/cuda/gemv_quant_mma.cu's
banner. Used by tests/test_cuda_gemv_quant_mma.py and benchmarks/lab/gpu_gemv_quant_bench.py."""

import numpy as np

EXACT_TYPES = ("q8_0", "q4_0", "q5_0")  # decoded to bf16(W) bit for bit
BLOCK_BYTES = {"q4_1": 20, "q5_1": 24, "q4_k": 144, "q5_k": 176}  # the types with a min


def block_mins(name, blocks, N, K):
    """|a| per weight [N, K] float64, from GGUF blocks [N, bytes] of a type with a min: Q4_1 /
    Q5_1 the fp16 m after the fp16 d; Q4_K / Q5_K dmin times the 6-bit min of the sub-block,
    unpacked from the 12 scale bytes as quant_formats.cpp does."""
    size = BLOCK_BYTES[name]
    if name in ("q4_1", "q5_1"):
        b = np.asarray(blocks).reshape(N, K // 32, size)
        return np.repeat(np.abs(b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)), 32, axis=1)
    b = np.asarray(blocks).reshape(N, K // 256, size)
    dmin = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    q = b[:, :, 4:16].astype(np.int64)
    m = np.empty(q.shape[:2] + (8,))
    for j in range(4):
        m[..., j] = q[..., j + 4] & 63
        m[..., j + 4] = (q[..., j + 8] >> 4) | ((q[..., j + 4] >> 6) << 4)
    return np.repeat(np.abs(dmin[..., None] * m).reshape(N, -1), 32, axis=1)


def decode_slack(name, blocks, deq):
    """S [N, K] float64 for the CPU-dequantized deq [N, K] of `blocks`; None for EXACT_TYPES."""
    if name in EXACT_TYPES:
        return None
    N, K = deq.shape
    a = block_mins(name, blocks, N, K) if name in BLOCK_BYTES else 0.0
    return 2.0 ** -8 * (2.01 * np.abs(deq.astype(np.float64)) + 2.05 * a)
