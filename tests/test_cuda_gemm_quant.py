"""The prefill GEMM on quantized weights (gemm_quant: csrc/cuda/gemm_sm90_dequant.cuh feeding the
wgmma GEMM of gemm_sm90.cuh) through _C.testing, on weights in the CUDA tiles (quant_ops.gpu_repack
of blocks from our quantizers) and bf16 rows of x.

The consumers decode each k tile of W into shared memory by quant_decode.cuh, the decode of
gemv_quant_mma, and the wgmma loop is the bf16 GEMM's. So the oracle is bit equality with
gemm_bf16 on the decoded W: gemm_quant(W) == gemm_bf16(Wd) for every output, where Wd is what
gemm_quant itself makes of W (read back through one-hot rows of x: each output is one weight times
1 plus exact zeros), and Wd is held to the CPU's fp32 values: bf16 of them for Q8_0, Q4_0 and
Q5_0, within the decode's slack S = 2^-8 (2.01 |w| + 2.05 |a|) for the others (mma_decode_ref.py),
and equal to gemv_quant_mma's decode of the same W. On odd M, N and K (partial tiles in every
direction; 32-value types with K % 64 == 32, where a k tile ends half way through; several parts of
different types, bf16 among them), for every epilogue and with split-K. The StoreF32 result is
also checked against float64 of the CPU's weights within the bf16 GEMM's fp32 summation bound plus
the slack, so that the equality cannot hold for two equally wrong results. Outputs are
NaN-poisoned with a row past M that must stay NaN. Inputs random per run (seed printed by the rng
fixture). Hopper only (gemm_quant_available); elsewhere the engine dequantizes into bf16 scratch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cuda_gemv_quant import ROPE_KV, TYPES, Weights, check_epilogues, check_rope_kv, random_x, rope_problem  # noqa: E402
from test_cuda_gemv_quant_mma import gemv, mma_weights, x_rows  # noqa: E402
from test_cuda_kernels import STORE_F32, SWIGLU, SplitScratch, gen, nan_full, ops  # noqa: E402
from test_cuda_ops_misc import C  # noqa: E402

pytestmark = pytest.mark.cuda

__all__ = ["C", "gen", "ops"]  # fixtures used by name


@pytest.fixture(autouse=True)
def hopper(ops):
    if not ops.gemm_quant_available():
        pytest.skip("gemm_quant runs on Hopper (sm_90a) only")


def shapes_for(block):
    """(M, N, K): partial tiles of 128 rows and columns (at 40 rows, a decode batch, consumer 1's
    block holds no row); K ending mid-qlayout-tile and (32-value types) mid-k-tile; a long K."""
    if block == 32:
        return [(65, 77, 96), (40, 200, 576), (300, 200, 576), (130, 384, 4096 + 256 + 32), (129, 1, 32)]
    return [(65, 77, 256), (40, 200, 512), (300, 200, 512), (130, 384, 4096 + 256), (129, 1, 256)]


class BF16Part:
    """A bf16 part of a matrix (type 0), as the engine keeps a tensor it did not quantize."""

    def __init__(self, N, K, gen):
        self.type_id, self.N, self.K = 0, N, K
        self.packed = (torch.randn((N, K), generator=gen, device="cuda") * 0.02).to(torch.bfloat16)


def parts_arg(parts):
    return [(W.type_id, W.packed.data_ptr(), W.N) for W in parts]


def reference(parts):
    """(W, S) float64 [N, K] on the device: the CPU's fp32 weights (bf16 parts as stored) and the
    decode's slack per weight (zero where the decode is bf16 of W exactly)."""
    Ws, Ss = [], []
    for W in parts:
        if W.type_id == 0:
            Ws.append(W.packed.double())
            Ss.append(torch.zeros_like(Ws[-1]))
        else:
            Wd, S = mma_weights(W)
            Ws.append(Wd)
            Ss.append(S)
    return torch.cat(Ws), torch.cat(Ss)


def decoded(ops, parts, K):
    """(the bf16 W [N, K] gemm_quant multiplies by, reference(parts)): one call on the K one-hot
    rows of the identity, y[k, n] = Wd[n, k] (one product with 1, the other K - 1 exact zeros),
    checked against the CPU's weights within the slack."""
    N = sum(W.N for W in parts)
    eye = x_rows(torch.eye(K, dtype=torch.bfloat16, device="cuda"))
    y = nan_full((K, N), torch.float32)
    ops.gemm_quant(parts_arg(parts), eye.data_ptr(), K, N, K, STORE_F32, out_f32=y.data_ptr())
    torch.cuda.synchronize()
    Wd = y.T.contiguous()
    assert not torch.isnan(Wd).any(), "gemm_quant left an output of the one-hot rows unwritten"
    Wb = Wd.to(torch.bfloat16)
    assert torch.equal(Wb.float(), Wd), "a decoded weight is not a bf16"
    ref = W, S = reference(parts)
    bad = (Wd.double() - W).abs() > S
    if bad.any():
        n, k = bad.nonzero()[0].tolist()
        raise AssertionError(f"{len(bad.nonzero())} decoded weights off the CPU's values, e.g. [{n}, {k}]: "
                             f"{Wd[n, k].item()!r} vs {W[n, k].item()!r} (slack {S[n, k].item():.3g})")
    return Wb, ref


def run_pair(ops, parts, x, epilogue=STORE_F32, split=None):
    """(gemm_quant, gemm_bf16 on the decoded parts) StoreF32 results [M, N], each with a poisoned
    row past M that must stay NaN, and reference(parts)."""
    M, K = x.shape
    N = sum(W.N for W in parts)
    Wb, ref = decoded(ops, parts, K)
    kw = {"split": split.arg} if split else {}
    got, want = nan_full((M + 1, N), torch.float32), nan_full((M + 1, N), torch.float32)
    ops.gemm_quant(parts_arg(parts), x.data_ptr(), M, N, K, STORE_F32, out_f32=got.data_ptr(), **kw)
    ops.gemm_bf16(x.data_ptr(), Wb.data_ptr(), M, N, K, STORE_F32, out_f32=want.data_ptr(), **kw)
    torch.cuda.synchronize()
    assert torch.isnan(got[M]).all(), "gemm_quant wrote past its M rows"
    return got[:M], want[:M], ref


def check_bound(what, got, ref, x):
    """No NaN, and every output within the fp32 summation bound (plus the decode's slack S) of
    float64 x . W^T, (W, S) = ref the CPU's weights."""
    assert not torch.isnan(got).any(), f"{what}: NaN in the output"
    W, S = ref
    xd = x.double()
    bound = (W.shape[1] / 16 + 8) * 2.0 ** -22 * (xd.abs() @ (W.abs() + S).T) + xd.abs() @ S.T + 1e-30
    assert ((got.double() - xd @ W.T).abs() <= bound).all(), f"{what}: off the float64 product"


def check_equal(what, got, want, ref, x):
    assert not torch.isnan(got).any(), f"{what}: NaN in the output"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        m, n = bad[0].tolist()
        raise AssertionError(f"{what}: {len(bad)} outputs differ from gemm_bf16 on the decoded W, e.g. "
                             f"[{m}, {n}]: {got[m, n].item()!r} vs {want[m, n].item()!r}")
    check_bound(what, got, ref, x)


@pytest.mark.parametrize("name", list(TYPES))
def test_gemm_quant_decodes_as_gemv_quant_mma(C, ops, rng, name):
    """A weight decodes to the same bf16 in prefill (gemm_quant) as in decode (gemv_quant_mma, read
    back through one-hot rows 64 columns a call)."""
    N, K = 77, 256 if TYPES[name][1] == 256 else 192
    W = Weights(C, name, N, K, rng)
    Wb, _ = decoded(ops, [W], K)
    for k0 in range(0, K, 64):
        x = torch.zeros((64, K), dtype=torch.bfloat16, device="cuda")
        x[torch.arange(64), k0 + torch.arange(64)] = 1.0
        y = gemv(ops, W, x_rows(x), STORE_F32)
        assert torch.equal(y.T, Wb[:, k0:k0 + 64].float()), f"{name}: columns {k0}.. decode differently"


@pytest.mark.parametrize("name", list(TYPES))
def test_gemm_quant_is_gemm_bf16_on_the_dequantized_weights(C, ops, rng, name):
    for M, N, K in shapes_for(TYPES[name][1]):
        W = Weights(C, name, N, K, rng)
        x = x_rows(random_x(rng, M, K))
        got, want, ref = run_pair(ops, [W], x)
        check_equal(f"{name} M={M} N={N} K={K}", got, want, ref, x)


@pytest.mark.parametrize("types", [("q4_k", "q4_k", "q6_k"), ("q8_0", "bf16", "q5_0"), ("q6_k", "q5_k")])
def test_gemm_quant_parts_of_several_types(C, ops, rng, gen, types):
    """wq | wk | wv of a Q4_K_M file (Q6_K v), a bf16 part among quantized ones; part boundaries
    inside a 64-row box and inside a warp's rows."""
    K = 512
    sizes = [77, 45, 20][:len(types)]
    parts = [BF16Part(n, K, gen) if t == "bf16" else Weights(C, t, n, K, rng) for t, n in zip(types, sizes)]
    for M in (65, 257):
        x = x_rows(random_x(rng, M, K))
        got, want, ref = run_pair(ops, parts, x)
        check_equal(f"{'|'.join(types)} M={M}", got, want, ref, x)


@pytest.mark.parametrize("M", [33, 70, 200])
@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k", "q5_1"])
def test_gemm_quant_split_k(C, ops, rng, name, M):
    """Few tiles and a long K: the split-K walk (each split's k range fetched and decoded on its
    own); the tile counters left zero. At 70 rows against gemm_bf16 with the same splits, bit for
    bit; at 200 (one 256-row tile, two 64-row blocks a consumer) the split count is gemm_quant's
    own, so against the float64 product within the fp32 bound. 33 rows: a decode batch (one
    consumer's block empty)."""
    split = SplitScratch(ops)
    W = Weights(C, name, 512, 4096, rng)
    x = x_rows(random_x(rng, M, 4096))
    got, want, ref = run_pair(ops, [W], x, split=split)
    if M <= 128:
        check_equal(f"{name} split-K", got, want, ref, x)
    else:
        check_bound(f"{name} split-K M={M}", got, ref, x)
    assert int(split.counters.abs().sum()) == 0, "split-K left a tile counter non-zero"


@pytest.mark.parametrize("M", [40, 193])
@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k", "q4_0"])
def test_gemm_quant_epilogues(C, ops, rng, gen, name, M):
    """StoreBf16, AddResidual (ld_out wider than N) and SwiGLU (gate rows and up rows in one tile)
    against the StoreF32 result of the same call, at a decode batch's 40 rows and 193."""
    N, K = 2 * 200, 576 if TYPES[name][1] == 32 else 512
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    y, _, _ = run_pair(ops, [W], x)
    check_epilogues(lambda ep, **dest: ops.gemm_quant(parts_arg([W]), x.data_ptr(), M, N, K, ep, **dest), y, gen)


@pytest.mark.parametrize("M", [40, 70, 150])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["q4_k", "q6_k"])
def test_gemm_quant_rope_kv(C, ops, rng, name, head_dim, M):
    """The fused RopeKV epilogue (wqkv of a prefill) against rope_oracle of the StoreF32 q|k|v, in
    128-row tiles (40: a decode batch; 70) and 256-row ones (150)."""
    heads = dict(n_heads=4, n_kv_heads=2, head_dim=head_dim, max_seq=max(80, M + 5), max_batch=3)
    K = 512
    inv_freq, N = rope_problem(C, heads["n_heads"], heads["n_kv_heads"], head_dim, K, heads["max_seq"],
                               heads["max_batch"])
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    qkv, _, _ = run_pair(ops, [W], x)
    run = lambda **rope: ops.gemm_quant(parts_arg([W]), x.data_ptr(), M, N, K, ROPE_KV, **rope)  # noqa: E731
    check_rope_kv(rng, run, qkv, inv_freq, what=f"{name} hd={head_dim}", **heads)


def test_gemm_quant_bad_arguments_raise(C, ops, rng):
    """Refused before any launch, with the problem named; the next good call still runs."""
    W = Weights(C, "q4_k", 64, 256, rng)
    x = x_rows(random_x(rng, 65, 256))
    y = nan_full((65, 64), torch.float32)
    call = lambda parts, N=64, K=256: ops.gemm_quant(parts, x.data_ptr(), 65, N, K, STORE_F32,  # noqa: E731
                                                     out_f32=y.data_ptr())
    with pytest.raises(Exception, match=r"gemm_quant \(part 0\): GGML type id 1 is not"):
        call([(1, W.packed.data_ptr(), 64)])
    with pytest.raises(Exception, match="hold 60 rows"):
        call([(12, W.packed.data_ptr(), 60)])
    with pytest.raises(Exception, match="K=128 is not a positive multiple of q4_k's block"):
        call([(12, W.packed.data_ptr(), 64)], K=128)
    with pytest.raises(Exception, match="1 to 3"):
        call([(12, W.packed.data_ptr(), 16)] * 4)
    with pytest.raises(Exception, match="SwiGLU needs an even N"):
        ops.gemm_quant([(12, W.packed.data_ptr(), 63)], x.data_ptr(), 65, 63, 256, SWIGLU, out=y.data_ptr())
    got, want, ref = run_pair(ops, [W], x)
    check_equal("after the refusals", got, want, ref, x)
