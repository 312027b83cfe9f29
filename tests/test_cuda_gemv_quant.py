"""The quantized decode kernels (csrc/cuda/gemv_quant.cu) through _C.testing, on weights in the
CUDA tiles (quant_ops.gpu_repack of blocks from our quantizers) and int8 ActBlock activations.

References, all from the CPU engine: quant_ops.dequantize (ggml's exact values) for W,
quant_ops.quantize_activations for the ActBlocks. Exact where the arithmetic is the same:
quantize_act_bf16 and dequantize_f32 bit for bit, dequantize_bf16 = their bf16 rounding,
embed_quant = dequantized rows, batched GEMV rows = the same rows alone, StoreBf16 / AddResidual =
the StoreF32 result rounded / added.

GEMV tolerance: ref = float64 sum_k W[n, k] * (d q)[m, k] over the CPU's dequantized W and the
kernel's own ActBlocks (checked equal to the CPU's), so what is left is fp32 rounding: each half
term s * d_x * isum + b * dsum and the dequantized W (d * c + m rounded twice) carry a few units
of 2^-24 of |s c| + |b| per weight, and a lane's running sum over its pieces plus the 5-level
butterfly add at most ~30 more. |s c| + |b| <= 4 max |W| over the weight's 16-value half for
blocks our quantizers make (the extreme codes hold the extreme weights), hence
  |y - ref| <= 64 * 2^-24 * sum_k A_k |x_k|,  A_k = 4 max_{half(k)} |W|,
about 3e-5 sum |W||x|, while one wrong code moves an output by ~sum |W||x| / K (2.4e-4 at
K = 4096) and a wrong scale by 16-32x that. Outputs NaN-poisoned (with a row past M that must
stay NaN); inputs random per run (seed printed by the rng fixture)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cuda_kernels import STORE_BF16, STORE_F32, ADD_RESIDUAL, SWIGLU, gen, nan_full, ops  # noqa: E402
from test_cuda_ops_misc import C, rope_oracle, rope_slack  # noqa: E402
from paged_kv import PagedCaches  # noqa: E402

pytestmark = pytest.mark.cuda
ROPE_KV = 4
EPS = 1e-5

__all__ = ["C", "gen", "ops"]  # fixtures used by name

TYPES = {"q8_0": (8, 32), "q4_0": (2, 32), "q4_1": (3, 32), "q5_0": (6, 32), "q5_1": (7, 32),
         "q4_k": (12, 256), "q5_k": (13, 256), "q6_k": (14, 256)}
U32 = 2.0 ** -24


def shapes_for(block):
    """(N, K): one tile; a partial last tile (32-value types); 4096 + 256; rows not a multiple of
    the CTA's 4 warps."""
    if block == 32:
        return [(1, 256), (5, 576), (77, 4096 + 256), (130, 32 * 3)]
    return [(1, 256), (5, 512), (77, 4096 + 256), (130, 256)]


class Weights:
    """Random rows (differing scales, an offset so mins matter) quantized by our quantizers."""

    def __init__(self, C, name, N, K, rng):
        w = rng.standard_normal((N, K)).astype(np.float32)
        w *= rng.uniform(0.005, 0.05, size=(N, 1)).astype(np.float32)
        w += rng.uniform(-0.01, 0.01, size=(N, 1)).astype(np.float32)
        self.name, self.type_id, self.N, self.K = name, TYPES[name][0], N, K
        self.blocks = C.quant_ops.quantize(name, w)
        self.deq = C.quant_ops.dequantize(name, self.blocks, K)  # f32 [N, K], exact
        self.packed = torch.from_numpy(C.quant_ops.gpu_repack(name, self.blocks, K)).cuda()
        halves = np.abs(self.deq).reshape(N, K // 16, 16).max(axis=2)
        self.A = torch.from_numpy(4.0 * np.repeat(halves, 16, axis=1).astype(np.float64)).cuda()


def act_blocks(C, x32):
    """CPU ActBlocks of x [M, K] f32 (numpy): bytes [M, K / 32 * 48] and the dequantized d * q."""
    raw = C.quant_ops.quantize_activations(np.ascontiguousarray(x32))
    return raw, dequant_act(raw)


def dequant_act(raw):
    M = raw.shape[0]
    b = raw.reshape(M, -1, 48)
    d = b[:, :, :4].copy().view(np.float32)[:, :, 0].astype(np.float64)
    q = b[:, :, 16:].copy().view(np.int8).astype(np.float64)
    return (d[:, :, None] * q).reshape(M, -1)


def random_x(rng, M, K):
    return torch.from_numpy((rng.standard_normal((M, K)) * 2.0).astype(np.float32)).cuda().to(torch.bfloat16)


def poisoned_act_blocks(M, K):
    """A device buffer for M rows of K / 32 ActBlocks (48 bytes each), every byte 0xFF: a block the
    kernel under test fails to write reads as a NaN scale."""
    return torch.full((M, K // 32 * 48), 0xFF, dtype=torch.uint8, device="cuda")


def random_norm_input(ops, gen, M, K, scale=2.0):
    """fp32 rows [M, K] to RMS-normalize, a bf16 norm weight near 1, and the ActBlocks
    rmsnorm_quantize_act makes of them (poisoned first): what a fused-input GEMV must match."""
    xf = torch.randn((M, K), generator=gen, device="cuda") * scale
    w = (1.0 + 0.1 * torch.randn((K,), generator=gen, device="cuda")).to(torch.bfloat16)
    xq = poisoned_act_blocks(M, K)
    ops.rmsnorm_quantize_act(xf.data_ptr(), w.data_ptr(), EPS, xq.data_ptr(), M, K)
    return xf, w, xq


def gpu_act(ops, x_bf16):
    M, K = x_bf16.shape
    xq = poisoned_act_blocks(M, K)
    ops.quantize_act_bf16(x_bf16.data_ptr(), xq.data_ptr(), M, K)
    torch.cuda.synchronize()
    return xq


def gemv(ops, W, xq, M, epilogue=STORE_F32, **kw):
    """The kernel's fp32 result [M, N] (StoreF32) with a poisoned row past M that must stay NaN."""
    y = nan_full((M + 1, W.N), torch.float32)
    ops.gemv_quant(W.type_id, W.packed.data_ptr(), xq.data_ptr(), M, W.N, W.K, epilogue, out_f32=y.data_ptr(), **kw)
    torch.cuda.synchronize()
    assert torch.isnan(y[M]).all(), "the kernel wrote past its M rows"
    return y[:M]


def check_gemv(name, y, W, xdeq):
    xd = torch.from_numpy(xdeq).cuda()
    ref = xd @ torch.from_numpy(W.deq.astype(np.float64)).cuda().T
    bound = 64 * U32 * (xd.abs() @ W.A.T)
    err = (y.double() - ref).abs()
    assert not torch.isnan(y).any(), f"{name}: NaN in the output"
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{name}: error {worst:.2f}x the fp32 bound (max err {err.max().item():.3g})"


@pytest.mark.parametrize("name", list(TYPES))
def test_quantize_act_bf16_is_the_cpu_rule(C, ops, rng, name):
    del name  # one activation rule for every type; run per type only for the seeds
    for M, K in [(1, 32), (3, 576), (16, 4096 + 256)]:
        x = random_x(rng, M, K)
        x[0, :32] = 0  # an all-zero block: d = 0, q = 0
        xq = gpu_act(ops, x)
        ref, _ = act_blocks(C, x.float().cpu().numpy())
        assert np.array_equal(xq.cpu().numpy(), ref), f"M={M} K={K}: ActBlocks differ from the CPU's"


def test_rmsnorm_quantize_act_matches_the_fp32_rule(C, ops, rng, gen):
    """rstd's fp32 sum order is the kernel's own, so against torch's rstd the values agree to a few
    ulps: d within 1e-5 relative, codes within 1 (a value on a rounding boundary), and no more
    than 1% of codes off by one."""
    for M, K in [(1, 576), (5, 4096), (16, 14336)]:
        x, w, xq = random_norm_input(ops, gen, M, K, scale=3.0)
        torch.cuda.synchronize()
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        xn = (x * rstd * w.float()).cpu().numpy()
        ref, _ = act_blocks(C, xn)
        got = xq.cpu().numpy().reshape(M, -1, 48)
        ref = ref.reshape(M, -1, 48)
        d_got, d_ref = got[:, :, :4].copy().view(np.float32), ref[:, :, :4].copy().view(np.float32)
        assert np.allclose(d_got, d_ref, rtol=1e-5, atol=0), f"M={M} K={K}: scales differ"
        q_got = got[:, :, 16:].copy().view(np.int8).astype(int)
        q_ref = ref[:, :, 16:].copy().view(np.int8).astype(int)
        diff = np.abs(q_got - q_ref)
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.01, f"M={M} K={K}: codes differ"


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_is_the_cpu_dequantizer(C, ops, rng, name):
    for N, K in shapes_for(TYPES[name][1])[:3]:
        W = Weights(C, name, N, K, rng)
        out = nan_full((N, K), torch.float32)
        ops.dequantize_f32(W.type_id, W.packed.data_ptr(), out.data_ptr(), N, K)
        torch.cuda.synchronize()
        assert np.array_equal(out.cpu().numpy().view(np.uint32), W.deq.view(np.uint32)), f"{name} {N}x{K}: f32"
        ld = K + 24
        out16 = nan_full((N, ld), torch.bfloat16)
        ops.dequantize_bf16(W.type_id, W.packed.data_ptr(), out16.data_ptr(), N, K, ld)
        torch.cuda.synchronize()
        assert torch.equal(out16[:, :K], torch.from_numpy(W.deq).cuda().to(torch.bfloat16)), f"{name}: bf16"
        assert torch.isnan(out16[:, K:].float()).all(), f"{name}: wrote past K in a row of ld_out"
        if N > 2:  # a range of rows (a slice of gemm_dequant_slices), into a buffer of just those rows
            row0, rows = 1, N - 2
            part = nan_full((rows + 1, K), torch.bfloat16)
            ops.dequantize_bf16(W.type_id, W.packed.data_ptr(), part.data_ptr(), N, K, row0=row0, rows=rows)
            torch.cuda.synchronize()
            assert torch.equal(part[:rows], out16[row0:row0 + rows, :K]), f"{name}: rows {row0}.. of {N}"
            assert torch.isnan(part[rows].float()).all(), f"{name}: wrote past the rows asked for"


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_against_the_dequantized_reference(C, ops, rng, name):
    for N, K in shapes_for(TYPES[name][1]):
        W = Weights(C, name, N, K, rng)
        for M in (1, 2, 3, 5, 8, 13, 16):
            x = random_x(rng, M, K)
            xq = gpu_act(ops, x)
            raw, xdeq = act_blocks(C, x.float().cpu().numpy())
            assert np.array_equal(xq.cpu().numpy(), raw)
            check_gemv(f"{name} M={M} N={N} K={K}", gemv(ops, W, xq, M), W, xdeq)


@pytest.mark.parametrize("name", list(TYPES))
def test_gemv_quant_rows_do_not_depend_on_the_batch(C, ops, rng, name):
    """Every row of a batch of 16 (and of 3) bit for bit equal to the same row alone."""
    W = Weights(C, name, 37, 4096 + (96 if TYPES[name][1] == 32 else 256), rng)
    x = random_x(rng, 16, W.K)
    xq = gpu_act(ops, x)
    all16 = gemv(ops, W, xq, 16)
    three = gemv(ops, W, xq[5:8].contiguous(), 3)
    for m in range(16):
        alone = gemv(ops, W, xq[m:m + 1].contiguous(), 1)
        assert torch.equal(alone[0], all16[m]), f"{name}: row {m} of a batch of 16 differs from the row alone"
    assert torch.equal(three, all16[5:8]), f"{name}: rows of a batch of 3 differ from the batch of 16"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k", "q5_0"])
@pytest.mark.parametrize("M", [1, 4, 16])
def test_gemv_quant_epilogues(C, ops, rng, gen, name, M):
    """StoreBf16 = the StoreF32 result rounded; AddResidual = it added (ld_out wider than N, the
    columns between untouched); SwiGLU = silu(gate) * up of the two halves' results, each row
    bit-equal to the StoreF32 row (same sums), the product within 1 bf16 rounding + the fast exp."""
    N, K = 2 * 69, 512
    W = Weights(C, name, N, K, rng)
    xq = gpu_act(ops, random_x(rng, M, K))
    y = gemv(ops, W, xq, M)
    check_epilogues(lambda ep, **dest: ops.gemv_quant(W.type_id, W.packed.data_ptr(), xq.data_ptr(), M, N, K, ep,
                                                      **dest), y, gen)


def check_epilogues(run, y, gen):
    """StoreBf16, AddResidual and SwiGLU of one quantized GEMV against its StoreF32 result y [M, N]:
    run(epilogue, **destinations) launches the kernel under test on the inputs that gave y."""
    M, N = y.shape
    out = nan_full((M, N), torch.bfloat16)
    run(STORE_BF16, out=out.data_ptr())
    torch.cuda.synchronize()
    assert torch.equal(out, y.to(torch.bfloat16)), "StoreBf16 is not the fp32 result rounded"
    ld = N + 7
    residual = torch.randn((M, ld), generator=gen, device="cuda")
    before = residual.clone()
    run(ADD_RESIDUAL, residual=residual.data_ptr(), ld_out=ld)
    torch.cuda.synchronize()
    assert torch.equal(residual[:, :N], before[:, :N] + y), "AddResidual is not residual + y"
    assert torch.equal(residual[:, N:], before[:, N:]), "AddResidual wrote past N in a row of ld_out"
    H = N // 2
    sw = nan_full((M, H), torch.bfloat16)
    run(SWIGLU, out=sw.data_ptr())
    torch.cuda.synchronize()
    ref = torch.nn.functional.silu(y[:, :H].double()) * y[:, H:].double()
    tol = 2.0 ** -8 * ref.abs() + 1e-6 * (y[:, :H].double().abs() * y[:, H:].double().abs()) + 1e-30
    assert ((sw.double() - ref).abs() <= tol).all(), "SwiGLU differs from silu(gate) * up"

def rope_problem(C, n_heads, n_kv_heads, head_dim, K, max_seq, max_batch):
    """The RoPE tables of a one-layer model of these heads on K inputs, and the q|k|v width N."""
    from llama_brrr.config import ModelConfig
    config = ModelConfig(dim=K, hidden_dim=64, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads,
                         head_dim=head_dim, vocab_size=16, rope_theta=500000.0)
    inv_freq = torch.from_numpy(C.rope_inv_freq(config.engine_dict(max_seq, max_batch))).cuda()
    return inv_freq, (n_heads + 2 * n_kv_heads) * head_dim


def check_rope_kv(rng, run, qkv, inv_freq, n_heads, n_kv_heads, head_dim, max_seq, max_batch, what):
    """run(**rope destinations) against rope_oracle of qkv [M, N], the same rows' StoreF32 q|k|v
    (bit-equal sums): bf16 rounding of the rotated value plus the fp32 cos / sin slack; other cache
    entries untouched."""
    M = qkv.shape[0]
    slots = torch.from_numpy(rng.integers(0, max_batch, size=M).astype(np.int32)).cuda()
    positions = torch.from_numpy(np.concatenate([[max_seq - 1], rng.choice(max_seq - 1, M - 1, replace=False)])
                                 .astype(np.int32)).cuda()
    q_out = nan_full((M, n_heads, head_dim), torch.bfloat16)
    shape = (max_batch, max_seq, n_kv_heads, head_dim)
    paged = PagedCaches(nan_full(shape, torch.bfloat16), nan_full(shape, torch.bfloat16))
    run(positions=positions.data_ptr(), slots=slots.data_ptr(), inv_freq=inv_freq.data_ptr(), q_out=q_out.data_ptr(),
        k_cache=paged.k.data_ptr(), v_cache=paged.v.data_ptr(), n_heads=n_heads, n_kv_heads=n_kv_heads,
        head_dim=head_dim, max_seq=max_seq, **paged.kwargs())
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
            assert ((got.double().cpu() - ref).abs() <= tol).all(), f"{what} row {m}: RopeKV differs"
    for cache in (k_cache, v_cache):
        assert torch.isnan(cache[~written]).all(), "wrote a cache entry of another token"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k"])
@pytest.mark.parametrize("M", [1, 5])
def test_gemv_quant_rope_kv(C, ops, rng, name, M):
    heads = dict(n_heads=4, n_kv_heads=2, head_dim=64, max_seq=40, max_batch=3)
    K = 512
    inv_freq, N = rope_problem(C, heads["n_heads"], heads["n_kv_heads"], heads["head_dim"], K, heads["max_seq"],
                               heads["max_batch"])
    W = Weights(C, name, N, K, rng)
    xq = gpu_act(ops, random_x(rng, M, K))
    qkv = gemv(ops, W, xq, M)
    run = lambda **rope: ops.gemv_quant(W.type_id, W.packed.data_ptr(), xq.data_ptr(), M, N, K, ROPE_KV,  # noqa: E731
                                        **rope)
    check_rope_kv(rng, run, qkv, inv_freq, what=f"{name} M={M}", **heads)


PAIRS = [("q4_k", "q6_k"), ("q5_k", "q6_k")]


def pair_call(ops, W0, W1, M, epilogue, **kw):
    """testing.gemv_quant on the matrix W0 | W1 (two types, one launch)."""
    return ops.gemv_quant(W0.type_id, W0.packed.data_ptr(), kw.pop("xq", 0), M, W0.N + W1.N, W0.K, epilogue,
                          type1=W1.type_id, W1=W1.packed.data_ptr(), rows0=W0.N, **kw)


def parts_alone(ops, W0, W1, M, given):
    """[M, W0.N + W1.N]: gemv_quant on each part alone (StoreF32) from the input `given` (xq, or
    the x / x_f32 keywords), what a pair launch on the same input must equal bit for bit."""
    want = []
    for W in (W0, W1):
        y = nan_full((M, W.N), torch.float32)
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), given.get("xq", 0), M, W.N, W.K, STORE_F32,
                       out_f32=y.data_ptr(), **{k: v for k, v in given.items() if k != "xq"})
        want.append(y)
    return torch.cat(want, dim=1)


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("M", [1, 2])
def test_gemv_quant_pair_rows_are_each_part_alone(C, ops, rng, gen, pair, M):
    """A matrix of two types in one launch (gemv_quant_pair): every output bit for bit what
    gemv_quant_in gives on its own part, on ActBlocks, on bf16 rows and on fp32 rows to normalize
    (the fused prologues); odd part sizes, either part the larger, a 2048-value row (4 lanes a
    block in the prologue), a 4096-value row (2 lanes a block) and w2's K = 14336 among them."""
    for (N0, N1), K in [((77, 45), 4096 + 256), ((33, 70), 2048), ((21, 40), 4096), ((5, 131), 14336)]:
        W0, W1 = Weights(C, pair[0], N0, K, rng), Weights(C, pair[1], N1, K, rng)
        x = random_x(rng, M, K)
        xf = torch.randn((M, K), generator=gen, device="cuda") * 2.0
        w = (1.0 + 0.1 * torch.randn((K,), generator=gen, device="cuda")).to(torch.bfloat16)
        xq = gpu_act(ops, x)  # held: a freed tensor's memory would be reused by the outputs below
        inputs = {"ActBlocks": dict(xq=xq.data_ptr()), "bf16 rows": dict(x=x.data_ptr()),
                  "normalized fp32 rows": dict(x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS)}
        for what, given in inputs.items():
            want = parts_alone(ops, W0, W1, M, given)
            y = nan_full((M + 1, N0 + N1), torch.float32)
            pair_call(ops, W0, W1, M, STORE_F32, out_f32=y.data_ptr(), **given)
            torch.cuda.synchronize()
            assert torch.isnan(y[M]).all(), "the kernel wrote past its M rows"
            assert torch.equal(y[:M], want), f"{pair} M={M} N={N0}+{N1} K={K}: {what}"


def walk_then_fed(launch, counters, what):
    """launch(counters) runs a kernel once (counters: a device pointer, or 0 for the fixed walk),
    checks what it wrote past its rows and returns its output rows. The fixed walk, then three fed
    launches in a row: each fed result equal to the walk's bit for bit, the counters back at zero
    after every launch (else the next launch would skip units). Returns the walk's rows."""
    got = []
    for fed in (False, True, True, True):
        got.append(launch(counters.data_ptr() if fed else 0))
        assert int(counters.abs().sum()) == 0, f"{what}: counters left non-zero"
    for i, y in enumerate(got[1:]):
        assert torch.equal(y, got[0]), f"{what}: fed launch {i + 1} differs from the fixed walk"
    return got[0]


@pytest.mark.parametrize("pair", PAIRS)
def test_gemv_quant_pair_long_walks_give_each_parts_bits(C, ops, rng, gen, pair):
    """A two-type matrix of 40,000 units (at least 5 rounds of the resident warps on GPUs of up to
    132 SMs), so that the warps of both parts walk several rounds: every output bit for bit what
    gemv_quant_in gives on its own part. Counters given are left alone (a two-type grid walks its
    parts apart and is never fed), so they are still zero after each launch."""
    (N0, N1), K = (30001, 9999), 256
    W0, W1 = Weights(C, pair[0], N0, K, rng), Weights(C, pair[1], N1, K, rng)
    counters = torch.zeros(ops.gemv_quant_counter_words(), dtype=torch.int32, device="cuda")
    for M in (1, 2):
        xf, w, _ = random_norm_input(ops, gen, M, K)
        given = dict(x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS)
        want = parts_alone(ops, W0, W1, M, given)
        for counters_ptr in (0, counters.data_ptr()):
            y = nan_full((M + 1, N0 + N1), torch.float32)
            pair_call(ops, W0, W1, M, STORE_F32, out_f32=y.data_ptr(), counters=counters_ptr, **given)
            torch.cuda.synchronize()
            what = f"{pair} M={M} counters={'given' if counters_ptr else 'none'}"
            assert torch.isnan(y[M]).all(), f"{what}: the kernel wrote past its M rows"
            assert torch.equal(y[:M], want), f"{what}: differs from the parts alone"
            assert int(counters.abs().sum()) == 0, f"{what}: counters touched"


@pytest.mark.parametrize("pair", PAIRS)
def test_gemv_quant_pair_rope_kv(C, ops, rng, gen, pair):
    """RopeKV over q | k of one type and v of another (Q4_K_M's wqkv), normalized fp32 input: the
    rotated q, k and the v cache rows against rope_oracle of the parts' own StoreF32 sums."""
    heads = dict(n_heads=4, n_kv_heads=2, head_dim=64, max_seq=40, max_batch=3)
    K, hd = 512, heads["head_dim"]
    inv_freq, N = rope_problem(C, heads["n_heads"], heads["n_kv_heads"], hd, K, heads["max_seq"], heads["max_batch"])
    N1 = heads["n_kv_heads"] * hd
    W0, W1 = Weights(C, pair[0], N - N1, K, rng), Weights(C, pair[1], N1, K, rng)
    xf = torch.randn((1, K), generator=gen, device="cuda") * 2.0
    w = (1.0 + 0.1 * torch.randn((K,), generator=gen, device="cuda")).to(torch.bfloat16)
    given = dict(x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS)
    qkv = nan_full((1, N), torch.float32)
    pair_call(ops, W0, W1, 1, STORE_F32, out_f32=qkv.data_ptr(), **given)
    run = lambda **rope: pair_call(ops, W0, W1, 1, ROPE_KV, **given, **rope)  # noqa: E731
    check_rope_kv(rng, run, qkv, inv_freq, what=str(pair), **heads)


def test_gemv_quant_pair_bad_arguments_raise(C, ops, rng):
    W0, W1 = Weights(C, "q4_k", 128, 256, rng), Weights(C, "q6_k", 64, 256, rng)
    Wq4 = Weights(C, "q4_0", 64, 256, rng)
    xq = gpu_act(ops, random_x(rng, 3, 256))
    y = nan_full((3, 192), torch.float32)
    bad = (ValueError, RuntimeError)
    with pytest.raises(bad, match="do not run as one launch"):
        pair_call(ops, W0, Wq4, 1, STORE_F32, xq=xq.data_ptr(), out_f32=y.data_ptr())
    with pytest.raises(bad, match="M=3"):
        pair_call(ops, W0, W1, 3, STORE_F32, xq=xq.data_ptr(), out_f32=y.data_ptr())
    with pytest.raises(bad, match="SwiGLU"):
        pair_call(ops, W0, W1, 1, SWIGLU, xq=xq.data_ptr(), out=y.data_ptr())
    # RopeKV on 1 q, 1 k and 1 v head of 64 (192 rows) with the parts split inside the k head
    inv_freq, _ = rope_problem(C, 1, 1, 64, 256, 16, 1)
    cache = nan_full((1, 16, 1, 64), torch.bfloat16)
    q_out = nan_full((1, 1, 64), torch.bfloat16)
    zero = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(bad, match="not whole heads"):
        ops.gemv_quant(12, W0.packed.data_ptr(), xq.data_ptr(), 1, 192, 256, ROPE_KV, type1=14,
                       W1=W1.packed.data_ptr(), rows0=96, positions=zero.data_ptr(), slots=zero.data_ptr(),
                       inv_freq=inv_freq.data_ptr(), q_out=q_out.data_ptr(), k_cache=cache.data_ptr(),
                       v_cache=cache.data_ptr(), n_heads=1, n_kv_heads=1, head_dim=64, max_seq=16)
    assert torch.isnan(y).all() and torch.isnan(cache.float()).all() and torch.isnan(q_out.float()).all(), \
        "a rejected call must not touch the output"
    assert ops.gemv_quant_fuses_pair(12, 14, STORE_F32) and ops.gemv_quant_fuses_pair(13, 14, ROPE_KV)
    assert not ops.gemv_quant_fuses_pair(8, 14, STORE_F32), "Q8_0 maps 16 pieces to a tile"
    assert not ops.gemv_quant_fuses_pair(14, 12, STORE_F32) and not ops.gemv_quant_fuses_pair(12, 14, SWIGLU)


@pytest.mark.parametrize("name", list(TYPES))
def test_embed_quant_rows_are_the_dequantized_rows(C, ops, rng, name):
    V, D = 53, 576 if TYPES[name][1] == 32 else 512
    W = Weights(C, name, V, D, rng)
    tokens_np = rng.integers(0, V, size=6).astype(np.int32)
    tokens_np[3] = V  # a bad id: a NaN row
    tokens = torch.from_numpy(tokens_np).cuda()
    x = nan_full((7, D), torch.float32)
    history = torch.full((2, 9), -1, dtype=torch.int32, device="cuda")
    slots = torch.tensor([0, 1, 0, 1, 0, 1], dtype=torch.int32, device="cuda")
    positions = torch.tensor([0, 0, 1, 1, 2, 8], dtype=torch.int32, device="cuda")
    ops.embed_quant(tokens.data_ptr(), W.type_id, W.packed.data_ptr(), x.data_ptr(), 6, D, V,
                    history=history.data_ptr(), slots=slots.data_ptr(), positions=positions.data_ptr(),
                    max_batch=2, max_seq=9)
    torch.cuda.synchronize()
    got = x.cpu().numpy()
    for m, t in enumerate(tokens_np):
        if t == V:
            assert np.isnan(got[m]).all(), "a bad token id must give a NaN row"
        else:
            assert np.array_equal(got[m].view(np.uint32), W.deq[t].view(np.uint32)), f"{name}: row {m}"
    assert np.isnan(got[6]).all(), "wrote past M rows"
    h = history.cpu().numpy()
    for m in range(6):
        assert h[int(slots[m]), int(positions[m])] == tokens_np[m]


def test_gemv_quant_bad_arguments_raise(C, ops, rng):
    W = Weights(C, "q4_k", 8, 256, rng)
    xq = gpu_act(ops, random_x(rng, 2, 256))
    y = nan_full((2, 8), torch.float32)
    bad = (ValueError, RuntimeError)
    call = lambda t=12, w=W.packed.data_ptr(), x=xq.data_ptr(), M=2, K=256: ops.gemv_quant(  # noqa: E731
        t, w, x, M, 8, K, STORE_F32, out_f32=y.data_ptr())
    with pytest.raises(bad, match="type id 9"):
        call(t=9)
    with pytest.raises(bad, match="K=288"):
        call(K=288)
    with pytest.raises(bad, match="M=17"):
        call(M=17)
    with pytest.raises(bad, match="M=0"):
        call(M=0)
    with pytest.raises(bad, match="16-byte aligned"):
        call(w=W.packed.data_ptr() + 8)
    with pytest.raises(bad, match="device pointer"):
        call(x=0)
    with pytest.raises(bad, match="out_f32"):
        ops.gemv_quant(12, W.packed.data_ptr(), xq.data_ptr(), 2, 8, 256, STORE_F32)
    with pytest.raises(bad, match="SwiGLU needs an even N"):
        ops.gemv_quant(12, W.packed.data_ptr(), xq.data_ptr(), 2, 7, 256, SWIGLU, out=y.data_ptr())
    assert torch.isnan(y).all(), "a rejected call must not touch the output"
    with pytest.raises(bad, match="multiple of 32"):
        ops.quantize_act_bf16(xq.data_ptr(), xq.data_ptr(), 1, 40)
    with pytest.raises(bad, match="K=100"):
        ops.dequantize_f32(12, W.packed.data_ptr(), y.data_ptr(), 8, 100)
    with pytest.raises(bad, match="D=300"):
        ops.embed_quant(xq.data_ptr(), 12, W.packed.data_ptr(), y.data_ptr(), 1, 300, 8)
    assert math.isnan(float(y[0, 0]))


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q8_0", "q5_0", "q4_1"])
@pytest.mark.parametrize("rows", ["short", "two", "mid", "long"])
def test_gemv_quant_in_quantizes_its_input_as_the_standalone_quantizers_do(C, ops, rng, gen, name, rows):
    """gemv_quant_in on bf16 rows or on fp32 rows to RMS-normalize: at M <= 2 the kernel quantizes
    them itself (prologue), above that through the scratch; either way the result equals, bit for
    bit, gemv_quant on the ActBlocks quantize_act_bf16 / rmsnorm_quantize_act make. Every epilogue
    path is shared, so StoreF32 stands for all; K includes a partial last tile for 32-blocks, rows
    of at most 64 blocks ("short": the prologue's 4 lanes a block), of 65-128 ("two": 2 lanes) and
    longer (one lane: "mid", and w2's 14336, 3.5 blocks a prologue thread)."""
    tail = 96 if TYPES[name][1] == 32 else 256
    K = {"short": 1792 + tail, "two": 3840 + tail, "mid": 4096 + tail, "long": 14336}[rows]
    W = Weights(C, name, 45, K, rng)
    for M in (1, 2, 3, 16):
        x = random_x(rng, M, K)
        want = gemv(ops, W, gpu_act(ops, x), M)
        scratch = torch.empty((M, K // 32 * 48), dtype=torch.uint8, device="cuda")
        y = nan_full((M + 1, W.N), torch.float32)
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, M, W.N, K, STORE_F32, out_f32=y.data_ptr(),
                       x=x.data_ptr(), scratch=scratch.data_ptr())
        torch.cuda.synchronize()
        assert torch.isnan(y[M]).all() and torch.equal(y[:M], want), f"{name} M={M}: bf16 rows"

        xf, w, xq = random_norm_input(ops, gen, M, K)
        want = gemv(ops, W, xq, M)
        y = nan_full((M + 1, W.N), torch.float32)
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, M, W.N, K, STORE_F32, out_f32=y.data_ptr(),
                       x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS, scratch=scratch.data_ptr())
        torch.cuda.synchronize()
        assert torch.isnan(y[M]).all() and torch.equal(y[:M], want), f"{name} M={M}: normalized fp32 rows"
    with pytest.raises(ValueError, match="need the ActBlock scratch"):
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, 3, W.N, K, STORE_F32, out_f32=y.data_ptr(), x=x.data_ptr())


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_gemv_quant_in_half_size_chunks_give_the_deep_chunks_bits(C, ops, rng, gen, name):
    """At one row a 32-value type's fused-input grid takes chunks of half the pieces where that
    walks at most half the rounds (launch_gemv): on the 132-SM H100 / H200 the Llama-3-8B's w2
    (4096 x 14336, bf16 rows) and, for Q4_0 / Q4_1, its wo (4096 x 4096). A lane sums the same
    pieces in the same order either way, so the result equals, bit for bit, gemv_quant on the
    standalone quantizers' ActBlocks (the ActBlock grid's deep chunks): bf16 rows and fp32 rows to
    normalize at StoreF32 (every epilogue shares its sums), and a SwiGLU pair of 4096 units (one
    piece a lane a chunk where the rounds halve)."""
    for K in (4096, 14336):
        W = Weights(C, name, 4096, K, rng)
        x = random_x(rng, 1, K)
        want = gemv(ops, W, gpu_act(ops, x), 1)
        y = nan_full((2, W.N), torch.float32)
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, 1, W.N, K, STORE_F32, out_f32=y.data_ptr(), x=x.data_ptr())
        torch.cuda.synchronize()
        assert torch.isnan(y[1]).all() and torch.equal(y[:1], want), f"{name} K={K}: bf16 rows"

        xf, w, xq = random_norm_input(ops, gen, 1, K)
        norm_in = dict(x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS)
        want = gemv(ops, W, xq, 1)
        y = nan_full((2, W.N), torch.float32)
        ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, 1, W.N, K, STORE_F32, out_f32=y.data_ptr(), **norm_in)
        torch.cuda.synchronize()
        assert torch.isnan(y[1]).all() and torch.equal(y[:1], want), f"{name} K={K}: normalized fp32 rows"
        if K == 4096:
            want = nan_full((2, W.N // 2), torch.bfloat16)
            ops.gemv_quant(W.type_id, W.packed.data_ptr(), xq.data_ptr(), 1, W.N, K, SWIGLU, out=want.data_ptr())
            y = nan_full((2, W.N // 2), torch.bfloat16)
            ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, 1, W.N, K, SWIGLU, out=y.data_ptr(), **norm_in)
            torch.cuda.synchronize()
            assert not torch.isnan(want[0].float()).any(), f"{name}: the ActBlock SwiGLU left a NaN"
            assert torch.isnan(y[1].float()).all() and torch.equal(y[:1], want[:1]), f"{name}: normalized SwiGLU"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q6_k"])
def test_gemv_quant_in_fed_by_counters_gives_the_fixed_walks_bits(C, ops, rng, gen, name):
    """A one-row fused-input grid of many rounds (tuning::kGemvQuantFedMinRounds) with counters
    takes its units from them; each unit is still summed by one warp in a fixed order, so every
    epilogue equals, bit for bit, the fixed walk without counters (and StoreF32 equals gemv_quant on
    the standalone quantizer's ActBlocks). 68,002 rows of K = 256 are at least 5 rounds of the
    resident warps (at most 64 an SM) on GPUs of up to 132 SMs for SwiGLU's 34,001 units too (5 on
    the H100's 132: ceil(34,001 / 8,448)). Three fed launches in a row (walk_then_fed)."""
    N, K = 68002, 256
    W = Weights(C, name, N, K, rng)
    counters = torch.zeros(ops.gemv_quant_counter_words(), dtype=torch.int32, device="cuda")
    for M in (1, 2):
        xf, w, xq = random_norm_input(ops, gen, M, K)
        xb = random_x(rng, M, K)
        want = gemv(ops, W, xq, M)
        norm_in = dict(x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS)
        runs = {  # epilogue: (input, destination dtype and columns, destination keyword)
            "store_f32": (STORE_F32, norm_in, torch.float32, N, "out_f32"),
            "swiglu": (SWIGLU, norm_in, torch.bfloat16, N // 2, "out"),
            "add_residual": (ADD_RESIDUAL, dict(x=xb.data_ptr()), torch.float32, N, "residual"),
        }
        residual0 = torch.randn((M + 1, N), generator=gen, device="cuda")
        for label, (ep, inputs, dtype, cols, key) in runs.items():
            what = f"{name} M={M} {label}"

            def launch(counters_ptr):
                y = residual0.clone() if ep == ADD_RESIDUAL else nan_full((M + 1, cols), dtype)
                ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, M, N, K, ep, **{key: y.data_ptr()}, **inputs,
                               counters=counters_ptr)
                torch.cuda.synchronize()
                if ep == ADD_RESIDUAL:
                    assert torch.equal(y[M], residual0[M]), f"{what}: wrote past its M rows"
                else:
                    assert torch.isnan(y[M].float()).all(), f"{what}: wrote past its M rows"
                return y[:M]
            walked = walk_then_fed(launch, counters, what)
            if ep == STORE_F32:
                assert torch.equal(walked, want), f"{name} M={M}: not gemv_quant on the standalone blocks"


@pytest.mark.parametrize("name", ["q6_k", "q4_k", "q8_0"])
def test_gemv_quant_in_on_a_vocabulary_sized_matrix_takes_either_path_to_the_same_bits(C, ops, rng, gen, name):
    """At M <= 2 a matrix of more than tuning::kGemvQuantFusedMaxUnits rows (an LM head: here
    Llama-3's vocabulary plus one row) goes through the scratch when one is given and its type has
    32-value blocks (q8_0: the standalone quantizer and the ActBlock grid), else through the
    kernel's own prologue (the K-quants always); either way it equals, bit for bit, gemv_quant on
    the standalone quantizers' ActBlocks, and the result is checked against the float64 reference
    on a sample of rows (the whole matrix would take minutes on the host)."""
    K = 256
    W = Weights(C, name, 128257, K, rng)
    for M in (1, 2):
        xf, w, xq = random_norm_input(ops, gen, M, K)
        want = gemv(ops, W, xq, M)
        for scratch in (poisoned_act_blocks(M, K), None):
            y = nan_full((M + 1, W.N), torch.float32)
            ops.gemv_quant(W.type_id, W.packed.data_ptr(), 0, M, W.N, K, STORE_F32, out_f32=y.data_ptr(),
                           x_f32=xf.data_ptr(), norm_w=w.data_ptr(), eps=EPS,
                           scratch=0 if scratch is None else scratch.data_ptr())
            torch.cuda.synchronize()
            path = "fused prologue" if scratch is None else "scratch"
            assert torch.isnan(y[M]).all() and torch.equal(y[:M], want), f"{name} M={M}: {path}"
        rows_np = np.unique(rng.integers(0, W.N, size=512))
        rows = torch.from_numpy(rows_np).cuda()
        xd = dequant_act(xq.cpu().numpy())
        ref = torch.from_numpy(xd).cuda() @ torch.from_numpy(W.deq[rows_np].astype(np.float64)).cuda().T
        bound = 64 * U32 * (torch.from_numpy(np.abs(xd)).cuda() @ W.A[rows].T)
        assert ((want[:, rows].double() - ref).abs() <= bound).all(), f"{name} M={M}: against float64"
