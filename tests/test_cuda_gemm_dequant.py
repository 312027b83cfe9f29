"""The long-prompt path on quantized weights (gemm_dequant_slices, csrc/cuda/matmul.cu) through
_C.testing: W's parts dequantized into a bf16 scratch a slice of output columns at a time, each
slice through gemm_bf16, so that no whole bf16 copy of W exists.

The oracle is gemm_bf16 on the whole dequantized W (bf16 of the CPU's fp32 weights: the
dequantizer is exact, test_cuda_gemv_quant checks it), bit for bit without split-K, because each
output's k sum is the same in a narrower call; and float64 of the same product within the bf16
GEMM's fp32 summation bound, so that two equally wrong results cannot pass. The scratch is made
small so that every call runs in several slices (the engine's is about the L2, which a test model
never fills): slices ending inside a part, a last narrow slice, SwiGLU slices (gate rows, then up
rows), RopeKV staged in fp32, split-K inside a slice. Outputs NaN-poisoned with a row past M that
must stay NaN; inputs random per run (seed printed by the rng fixture). Any GPU: off Hopper
gemm_bf16 is the mma.sync GEMM."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cuda_gemm_quant import BF16Part, check_bound, check_equal, parts_arg  # noqa: E402
from test_cuda_gemv_quant import ROPE_KV, TYPES, Weights, check_epilogues, check_rope_kv, random_x, rope_problem  # noqa: E402
from test_cuda_gemv_quant_mma import x_rows  # noqa: E402
from test_cuda_kernels import STORE_F32, SWIGLU, SplitScratch, gen, nan_full, ops  # noqa: E402
from test_cuda_ops_misc import C  # noqa: E402

pytestmark = pytest.mark.cuda

__all__ = ["C", "gen", "ops"]  # fixtures used by name

SLICE = 128  # tuning::kDequantSliceCols


def whole_bf16(ops, parts, K):
    """W [N, K] bf16 as the slices hold it: each quantized part through dequantize_bf16 (a
    poisoned buffer), bf16 parts as stored; (W, zero slack) float64 for check_bound."""
    rows = []
    for W in parts:
        if W.type_id == 0:
            rows.append(W.packed)
            continue
        out = nan_full((W.N, K), torch.bfloat16)
        ops.dequantize_bf16(W.type_id, W.packed.data_ptr(), out.data_ptr(), W.N, K)
        rows.append(out)
    torch.cuda.synchronize()
    Wb = torch.cat(rows)
    assert not torch.isnan(Wb.float()).any()
    return Wb, (Wb.double(), torch.zeros_like(Wb, dtype=torch.float64))


def scratch_for(cols, K, per_col=1):
    """A NaN-poisoned scratch holding `cols` output columns' rows of W, plus a few values that
    are not a whole column more."""
    elems = cols * per_col * K + 7
    return nan_full((elems,), torch.bfloat16), elems


def run(ops, parts, x, scratch, epilogue=STORE_F32, split=None, **dest):
    M, K = x.shape
    N = sum(W.N for W in parts)
    buf, elems = scratch
    kw = {"split": split.arg} if split else {}
    ops.gemm_dequant_slices(parts_arg(parts), x.data_ptr(), M, N, K, epilogue, scratch=buf.data_ptr(),
                            scratch_elems=elems, **kw, **dest)


def run_pair(ops, parts, x, scratch, split=None):
    """(gemm_dequant_slices, gemm_bf16 on the whole dequantized W) StoreF32 results [M, N], each
    with a poisoned row past M that must stay NaN, and the float64 reference."""
    M, K = x.shape
    N = sum(W.N for W in parts)
    Wb, ref = whole_bf16(ops, parts, K)
    kw = {"split": split.arg} if split else {}
    got, want = nan_full((M + 1, N), torch.float32), nan_full((M + 1, N), torch.float32)
    run(ops, parts, x, scratch, split=split, out_f32=got.data_ptr())
    ops.gemm_bf16(x.data_ptr(), Wb.data_ptr(), M, N, K, STORE_F32, out_f32=want.data_ptr(), **kw)
    torch.cuda.synchronize()
    assert torch.isnan(got[M]).all(), "gemm_dequant_slices wrote past its M rows"
    return got[:M], want[:M], ref


def k_for(name):
    return 576 if TYPES[name][1] == 32 else 512


def test_slice_width_rule(ops):
    """The whole width where the scratch holds it; else a multiple of 128 columns that fits; a
    scratch of fewer than 128 columns refused with the sizes named."""
    K = 512
    assert ops.gemm_dequant_slice_cols(300, 300, K, STORE_F32, 300 * K) == 300
    assert ops.gemm_dequant_slice_cols(300, 600, K, SWIGLU, 600 * K) == 300
    for M, N, ep, cols_fit in [(300, 1000, STORE_F32, 700), (2048, 4096, STORE_F32, 872), (2048, 2 * 3000, SWIGLU, 500),
                               (513, 777, STORE_F32, 128)]:
        per_col = 2 if ep == SWIGLU else 1
        c = ops.gemm_dequant_slice_cols(M, N, K, ep, cols_fit * per_col * K + 5)
        assert c % SLICE == 0 and SLICE <= c <= cols_fit, (M, N, ep, c)
    with pytest.raises(Exception, match=r"fewer than 128 output columns of W \(256 rows of K=512\)"):
        ops.gemm_dequant_slice_cols(300, 600, K, SWIGLU, 127 * 2 * K)


@pytest.mark.parametrize("name", list(TYPES))
def test_slices_are_gemm_bf16_on_the_whole_dequantized_weights(C, ops, rng, name):
    """Three slices of 128, 128 and 44 columns (or the model's narrower choice), at one and at
    three 128-row tiles; and a scratch holding all of W (one slice)."""
    K = k_for(name)
    for M, N, cols in [(65, 300, SLICE), (300, 300, SLICE), (300, 300, 300), (129, 1, 1)]:
        W = Weights(C, name, N, K, rng)
        x = x_rows(random_x(rng, M, K))
        got, want, ref = run_pair(ops, [W], x, scratch_for(cols, K))
        check_equal(f"{name} M={M} N={N} scratch of {cols} columns", got, want, ref, x)


@pytest.mark.parametrize("types", [("q4_k", "q4_k", "q6_k"), ("q8_0", "bf16", "q5_0"), ("q6_k", "q5_k")])
def test_slices_across_parts_of_several_types(C, ops, rng, gen, types):
    """wq | wk | wv of 77, 45 and 20 rows in slices of 128 columns: the first slice ends inside
    the last part, a bf16 part copied as stored."""
    K = 512
    sizes = [77, 45, 20][:len(types)]
    parts = [BF16Part(n, K, gen) if t == "bf16" else Weights(C, t, n, K, rng) for t, n in zip(types, sizes)]
    for M in (65, 300):
        x = x_rows(random_x(rng, M, K))
        got, want, ref = run_pair(ops, parts, x, scratch_for(SLICE, K))
        check_equal(f"{'|'.join(types)} M={M}", got, want, ref, x)


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q8_0"])
def test_slices_with_split_k(C, ops, rng, name):
    """Few tiles a slice and a long K: gemm_bf16 splits K inside each slice (the tile counters
    left zero after every slice); against the float64 product within the fp32 bound."""
    split = SplitScratch(ops)
    W = Weights(C, name, 400, 4096, rng)
    x = x_rows(random_x(rng, 70, 4096))
    got, _, ref = run_pair(ops, [W], x, scratch_for(SLICE, 4096), split=split)
    check_bound(f"{name} split-K in slices", got, ref, x)
    assert int(split.counters.abs().sum()) == 0, "split-K left a tile counter non-zero"


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "q4_1"])
def test_slice_epilogues(C, ops, rng, gen, name):
    """StoreBf16, AddResidual (ld_out wider than N: each slice's columns at their offset) and
    SwiGLU (200 outputs in slices of 128 and 72: gate rows then up rows in the scratch) against the
    StoreF32 result of the same call."""
    N, K, M = 2 * 200, k_for(name), 193
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    y, want, ref = run_pair(ops, [W], x, scratch_for(SLICE, K))
    check_equal(f"{name} StoreF32", y, want, ref, x)
    scratch = scratch_for(SLICE, K, per_col=2)  # SwiGLU: 128 outputs take 256 rows
    check_epilogues(lambda ep, **dest: run(ops, [W], x, scratch, ep, **dest), y, gen)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_slices_rope_kv(C, ops, rng, head_dim):
    """RopeKV over several slices: q|k|v staged in out_f32, then rope_kv_append, against
    rope_oracle of the StoreF32 q|k|v; one slice keeps gemm_bf16's own RopeKV."""
    heads = dict(n_heads=4, n_kv_heads=2, head_dim=head_dim, max_seq=305, max_batch=3)
    K, M = 512, 300
    inv_freq, N = rope_problem(C, heads["n_heads"], heads["n_kv_heads"], head_dim, K, heads["max_seq"],
                               heads["max_batch"])
    W = Weights(C, "q4_k", N, K, rng)
    x = x_rows(random_x(rng, M, K))
    qkv, want, ref = run_pair(ops, [W], x, scratch_for(SLICE, K))
    check_equal(f"hd={head_dim} StoreF32", qkv, want, ref, x)
    for cols in (SLICE, N):
        scratch = scratch_for(cols, K)
        staging = nan_full((M, N), torch.float32)
        check_rope_kv(rng, lambda **rope: run(ops, [W], x, scratch, ROPE_KV, out_f32=staging.data_ptr(), **rope),
                      qkv, inv_freq, what=f"hd={head_dim} scratch of {cols} columns", **heads)


def test_bad_arguments_raise(C, ops, rng):
    """Refused before any launch, with the problem named; the next good call still runs."""
    K = 256
    W = Weights(C, "q4_k", 300, K, rng)
    x = x_rows(random_x(rng, 65, K))
    y = nan_full((65, 300), torch.float32)
    good = scratch_for(SLICE, K)
    with pytest.raises(Exception, match=r"fewer than 128 output columns"):
        run(ops, [W], x, scratch_for(SLICE - 1, K), out_f32=y.data_ptr())
    with pytest.raises(Exception, match=r"gemm_dequant_slices \(part 0\): GGML type id 1 is not"):
        ops.gemm_dequant_slices([(1, W.packed.data_ptr(), 300)], x.data_ptr(), 65, 300, K, STORE_F32,
                                out_f32=y.data_ptr(), scratch=good[0].data_ptr(), scratch_elems=good[1])
    with pytest.raises(Exception, match="the parts hold 300 rows, N=301"):
        ops.gemm_dequant_slices(parts_arg([W]), x.data_ptr(), 65, 301, K, STORE_F32, out_f32=y.data_ptr(),
                                scratch=good[0].data_ptr(), scratch_elems=good[1])
    with pytest.raises(Exception, match="scratch"):
        ops.gemm_dequant_slices(parts_arg([W]), x.data_ptr(), 65, 300, K, STORE_F32, out_f32=y.data_ptr(),
                                scratch=0, scratch_elems=good[1])
    with pytest.raises(Exception, match=r"rows \[250, 350\) must lie in \[0, N=300\)"):
        ops.dequantize_bf16(W.type_id, W.packed.data_ptr(), good[0].data_ptr(), 300, K, row0=250, rows=100)
    got, want, ref = run_pair(ops, [W], x, good)
    check_equal("after the refusals", got, want, ref, x)
    assert np.isfinite(got.cpu().numpy()).all()
