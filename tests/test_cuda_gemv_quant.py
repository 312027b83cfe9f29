"""The quantized decode GEMV (csrc/cuda/gemv_quant.cu) through _C.testing.gemv_quant, against a
float64 reference built from the CPU dequantizer (_C.quant_ops.dequantize, ggml's exact values)
and the bf16-rounded x.

Tolerance: W is exact in both (the kernel dequantizes as the CPU does), so the only error is fp32
accumulation: |y - ref| <= 2e-6 * sum_k |x_k| |w_k| per output. One wrong weight (index, nibble,
scale) moves an output by about sum |x||w| / K, 100x that bound even at K = 4096. Outputs are
NaN-poisoned, with one poisoned row past M that must stay NaN; inputs are random on every run (seed
printed by the rng fixture; BRRR_TEST_SEED replays it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

# GGML type id and block elements of every type the kernel runs.
TYPES = {"q8_0": (8, 32), "q4_0": (2, 32), "q4_1": (3, 32), "q5_0": (6, 32), "q5_1": (7, 32),
         "q4_k": (12, 256), "q5_k": (13, 256), "q6_k": (14, 256)}
ACC_BOUND = 2e-6


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


def shapes_for(block):
    """(N, K): one block; several blocks; a K chunk (1024 values) plus a partial one; the model's
    4096 on a few odd rows; the full 4096 x 4096."""
    return [(1, block), (3, 3 * block), (77, 1024 + 5 * block if block == 32 else 1024 + block),
            (77, 4096), (4096, 4096)]


def quantized(C, name, N, K, rng):
    """Random weights (rows of differing scale, an offset so Q4_1/Q5_1/K-quant mins matter)
    quantized by our quantizers: (blocks uint8 [N, row_bytes] on the device, float64 dequantized W)."""
    w = rng.standard_normal((N, K)).astype(np.float32)
    w *= rng.uniform(0.005, 0.05, size=(N, 1)).astype(np.float32)
    w += rng.uniform(-0.01, 0.01, size=(N, 1)).astype(np.float32)
    blocks = C.quant_ops.quantize(name, w)
    deq = C.quant_ops.dequantize(name, blocks, K).astype(np.float64)
    return torch.from_numpy(np.ascontiguousarray(blocks)).cuda(), torch.from_numpy(deq).cuda()


def random_x(rng, M, K):
    return torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).cuda().to(torch.bfloat16)


def run(C, type_id, W_dev, x, N, K, w_ptr=None, x_ptr=None):
    """y [M, N] from the kernel; asserts the poisoned row past M stays NaN."""
    M = x.shape[0]
    y = torch.full((M + 1, N), float("nan"), dtype=torch.float32, device="cuda")
    C.testing.gemv_quant(type_id, w_ptr or W_dev.data_ptr(), x_ptr or x.data_ptr(), y.data_ptr(), M, N, K)
    torch.cuda.synchronize()
    assert torch.isnan(y[M]).all(), "the kernel wrote past its M rows"
    return y[:M]


def check(name, y, x, deq):
    xd = x.double()
    ref = xd @ deq.T
    bound = ACC_BOUND * (xd.abs() @ deq.abs().T)
    assert torch.isfinite(y).all(), f"{name}: {(~torch.isfinite(y)).sum().item()} outputs not finite (unwritten?)"
    excess = ((y.double() - ref).abs() - bound)
    worst = int(excess.argmax())
    m, n = divmod(worst, y.shape[1])
    assert excess.max().item() <= 0, (
        f"{name}: y[{m}, {n}] = {y[m, n].item():.9g}, reference {ref[m, n].item():.9g}, "
        f"allowed error {bound[m, n].item():.3g}")


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_against_dequantized_reference(C, rng, name):
    type_id, block = TYPES[name]
    for N, K in shapes_for(block):
        W_dev, deq = quantized(C, name, N, K, rng)
        for M in (1, 3, 16):
            x = random_x(rng, M, K)
            check(f"{name} M={M} N={N} K={K}", run(C, type_id, W_dev, x, N, K), x, deq)


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_rows_batch_invariant(C, rng, name):
    """Each row of an M = 16 (and M = 3) batch equals, bit for bit, the same row run alone."""
    type_id, block = TYPES[name]
    N, K = 77, 1024 + block
    W_dev, _ = quantized(C, name, N, K, rng)
    x = random_x(rng, 16, K)
    for M in (16, 3):
        batch = run(C, type_id, W_dev, x[:M].contiguous(), N, K)
        for m in range(M):
            alone = run(C, type_id, W_dev, x[m:m + 1].contiguous(), N, K)
            assert torch.equal(batch[m], alone[0]), f"{name}: row {m} of M={M} differs from the row alone"


@pytest.mark.parametrize("name", ["q8_0", "q4_k", "q6_k", "q5_0"])
@pytest.mark.parametrize("w_offset,x_offset", [(2, 0), (6, 2), (14, 2)])
def test_gemv_quant_unaligned_pointers(C, rng, name, w_offset, x_offset):
    """W at any even address (the 16-byte staging's byte-wise head and tail) and x off 16 bytes
    (the element-wise x staging) give the same answer."""
    type_id, block = TYPES[name]
    N, K = 5, 1024 + block
    W_dev, deq = quantized(C, name, N, K, rng)
    w_buf = torch.zeros(W_dev.numel() + w_offset, dtype=torch.uint8, device="cuda")
    w_buf[w_offset:].copy_(W_dev.flatten())
    x = random_x(rng, 3, K)
    x_buf = torch.zeros(x.numel() + x_offset // 2, dtype=torch.bfloat16, device="cuda")
    x_buf[x_offset // 2:].copy_(x.flatten())
    w_ptr, x_ptr = w_buf.data_ptr() + w_offset, x_buf.data_ptr() + x_offset
    assert (w_ptr % 16, x_ptr % 16) == (w_offset, x_offset)
    y = run(C, type_id, W_dev, x, N, K, w_ptr=w_ptr, x_ptr=x_ptr)
    check(f"{name} W+{w_offset} x+{x_offset}", y, x, deq)
    assert torch.equal(y, run(C, type_id, W_dev, x, N, K)), f"{name}: unaligned result differs from aligned"


def test_gemv_quant_bad_arguments(C):
    W = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    x = torch.zeros(4096, dtype=torch.bfloat16, device="cuda")
    y = torch.zeros(64, dtype=torch.float32, device="cuda")
    g = C.testing.gemv_quant
    with pytest.raises(ValueError, match="type id 9 is not a quantized type"):
        g(9, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 32)
    with pytest.raises(ValueError, match="type id 0 is not"):
        g(0, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 32)
    with pytest.raises(ValueError, match="GGML type id"):
        g(2**40 + 8, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 32)
    with pytest.raises(ValueError, match="K=48 is not a positive multiple of q8_0's block of 32"):
        g(8, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 48)
    with pytest.raises(ValueError, match="K=288 is not a positive multiple of q4_k's block of 256"):
        g(12, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 288)
    with pytest.raises(ValueError, match="K=0"):
        g(14, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 1, 0)
    for M in (0, 17):
        with pytest.raises(ValueError, match=f"M={M} rows"):
            g(8, W.data_ptr(), x.data_ptr(), y.data_ptr(), M, 1, 32)
    with pytest.raises(ValueError, match="N must be >= 1"):
        g(8, W.data_ptr(), x.data_ptr(), y.data_ptr(), 1, 0, 32)
    with pytest.raises(ValueError, match="W must be a device pointer"):
        g(8, 0, x.data_ptr(), y.data_ptr(), 1, 1, 32)
    with pytest.raises(ValueError, match="2-byte aligned"):
        g(8, W.data_ptr() + 1, x.data_ptr(), y.data_ptr(), 1, 1, 32)
    assert torch.equal(y, torch.zeros_like(y)), "a refused call wrote its output"
