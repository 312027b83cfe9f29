"""Decode batches of up to 64 rows on quantized weights of every kept type (gemv_quant_wgmma: csrc/cuda/gemv_quant_wgmma.cu,
W decoded into wgmma's A registers against 16, 32 or 64 staged x rows, K in 1024-value slices whose fp32 planes a
second kernel adds)
through _C.testing, on weights in the CUDA tiles and bf16 rows of x.

The oracle is the CPU's fp32 weights: the StoreF32 result against float64 x . W^T within the fp32
summation bound plus the decode's slack (the same bf16 per weight as gemv_quant_mma and gemm_quant:
test_cuda_gemm_quant.decoded reads gemm_quant's back and holds it to the CPU's values first); the
other epilogues against the same call's StoreF32 (bit for bit, or SwiGLU / RoPE within their
rounding). Odd shapes: 3 and 5 blocks of 64 rows, 1, 3 and 5 slices of K, M from 5 to 64 (each staged width), parts of
two types; Q4_K and Q6_K (the 4- and the 3-warpgroup forms of the K-quant mixes) on every shape, the
other types on fewer; the planes and outputs NaN-poisoned, with a row past M that must stay NaN; each row
bit-identical to the same row in a batch of another size. Hopper only."""

import pytest

from llama_brrr import quant

torch = pytest.importorskip("torch")

from test_cuda_gemm_quant import C, check_bound, decoded, gen, hopper, ops, parts_arg  # noqa: E402
from test_cuda_gemv_quant import ROPE_KV, Weights, check_epilogues, check_rope_kv, random_x, rope_problem  # noqa: E402
from test_cuda_gemv_quant_mma import x_rows  # noqa: E402
from test_cuda_kernels import STORE_F32, nan_full  # noqa: E402

pytestmark = pytest.mark.cuda

__all__ = ["C", "gen", "hopper", "ops"]  # fixtures used by name (hopper: autouse, skips off Hopper)


def run(ops, parts, x, epilogue=STORE_F32, **dest):
    """One call with freshly poisoned planes; dest the epilogue's destinations."""
    M, K = x.shape
    N = sum(W.N for W in parts)
    floats = ops.gemv_quant_wgmma_plane_floats(M, N, K)
    planes = torch.full((floats,), float("nan"), device="cuda")
    ops.gemv_quant_wgmma(parts_arg(parts), x.data_ptr(), M, N, K, epilogue, planes=planes.data_ptr(),
                         plane_floats=floats, **dest)


def store_f32(ops, parts, x):
    """The StoreF32 result [M, N], with a poisoned row past M that must stay NaN."""
    M = x.shape[0]
    N = sum(W.N for W in parts)
    y = nan_full((M + 1, N), torch.float32)
    run(ops, parts, x, out_f32=y.data_ptr())
    torch.cuda.synchronize()
    assert torch.isnan(y[M]).all(), "gemv_quant_wgmma wrote past its M rows"
    return y[:M]


# The kept types past the K-quant mixes' two: 32-value blocks (Q8_0 at 3 warpgroups, the nibble
# types at 4) and Q5_K (3).
OTHER_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q5_k"]


@pytest.mark.parametrize("M", [5, 16, 17, 30, 33, 47, 64])
@pytest.mark.parametrize("N, K", [(192, 1024), (320, 3072), (64, 5120)])
@pytest.mark.parametrize("name", ["q4_k", "q6_k"])
def test_gemv_quant_wgmma_against_float64(C, ops, rng, name, N, K, M):
    W = Weights(C, name, N, K, rng)
    _, ref = decoded(ops, [W], K)
    x = x_rows(random_x(rng, M, K))
    check_bound(f"{name} M={M} N={N} K={K}", store_f32(ops, [W], x), ref, x)


@pytest.mark.parametrize("M", [9, 17, 47])
@pytest.mark.parametrize("N, K", [(192, 1024), (320, 3072)])
@pytest.mark.parametrize("name", OTHER_TYPES)
def test_every_kept_type_against_float64(C, ops, rng, name, N, K, M):
    W = Weights(C, name, N, K, rng)
    _, ref = decoded(ops, [W], K)
    x = x_rows(random_x(rng, M, K))
    check_bound(f"{name} M={M} N={N} K={K}", store_f32(ops, [W], x), ref, x)


@pytest.mark.parametrize("name", ["q4_k", "q6_k"] + OTHER_TYPES)
def test_gemv_quant_wgmma_rows_are_batch_invariant(C, ops, rng, name):
    """A row's sum runs in one order whatever M is and however many x rows are staged (16, 32 or
    64): the first 5, 16, 17 or 33 rows of a 64-row batch equal the same rows alone, bit for bit."""
    N, K = 320, 2048
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, 64, K))
    y64 = store_f32(ops, [W], x)
    for M in (5, 16, 17, 33):
        y = store_f32(ops, [W], x_rows(x[:M].clone()))
        assert torch.equal(y64[:M], y), f"{name}: a row differs between batches of 64 and {M}"


def test_gemv_quant_wgmma_takes_what_the_lab_says_it_wins(C):
    """The engine's rule (tuning.h): 17-64 rows; enough 64-row blocks times 1024-k slices (the
    8B's wqkv yes, its wo no) of every kept type; K a multiple of 1024; planes that fit; not bf16
    parts."""
    ids = quant.kept_types()
    q4, q6, roomy = ids["q4_k"], ids["q6_k"], 1 << 30
    takes = C.testing.gemv_quant_wgmma_takes
    assert takes([(q4, 28672)], 17, 4096, roomy) and takes([(q4, 28672)], 64, 4096, roomy)
    assert not takes([(q4, 28672)], 16, 4096, roomy) and not takes([(q4, 28672)], 65, 4096, roomy)
    assert takes([(q6, 128256)], 17, 4096, roomy)  # a Q6_K LM head beside the GEMV
    wqkv = [(q4, 4096), (q4, 1024), (q6, 1024)]  # a Q4_K_M layer whose wv is Q6_K: 384 units
    assert takes(wqkv, 24, 4096, roomy) and takes(wqkv, 33, 4096, roomy)
    assert not takes([(q4, 4096)], 24, 4096, roomy)  # wo: 256 units
    assert not takes([(q4, 28672)], 24, 4352, roomy)  # K not a multiple of 1024
    assert not takes([(q4, 28672)], 24, 4096, C.testing.gemv_quant_wgmma_plane_floats(24, 28672, 4096) - 1)
    for name in OTHER_TYPES:
        assert takes([(ids[name], 6144)], 24, 4096, roomy), name  # wqkv
        assert takes([(ids[name], 4096)], 40, 14336, roomy), name  # w2: 896 units
    assert not takes([(q4, 64), (ids["q8_0"], 1024)], 24, 4096, roomy)  # 272 units
    assert not takes([(0, 28672)], 40, 4096, roomy)  # a bf16 part


@pytest.mark.parametrize("names", [("q4_k", "q6_k"), ("q5_k", "q8_0", "q4_1")])
def test_gemv_quant_wgmma_parts_of_two_types(C, ops, rng, names):
    """wq | wk | wv of a Q4_K_M file: Q4_K rows, then Q6_K rows (or three parts of three types),
    each part its own launch into its columns of the planes."""
    K = 2048
    parts = [Weights(C, name, 192 if i == 0 else 64, K, rng) for i, name in enumerate(names)]
    _, ref = decoded(ops, parts, K)
    x = x_rows(random_x(rng, 40, K))
    check_bound("|".join(names), store_f32(ops, parts, x), ref, x)


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q8_0", "q5_0"])
def test_gemv_quant_wgmma_epilogues(C, ops, rng, gen, name):
    """StoreBf16, AddResidual (ld_out wider than N) and SwiGLU (summed in plane 0, then swiglu_f32)
    against the StoreF32 result of the same inputs."""
    N, K, M = 2 * 192, 2048, 40
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    y = store_f32(ops, [W], x)
    check_epilogues(lambda ep, **dest: run(ops, [W], x, ep, **dest), y, gen)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["q4_k", "q6_k"])
def test_gemv_quant_wgmma_rope_kv(C, ops, rng, name, head_dim):
    """RopeKV: q|k|v summed into args.out_f32, then rope_kv_append, against rope_oracle of the
    StoreF32 result."""
    heads = dict(n_heads=4, n_kv_heads=2, head_dim=head_dim, max_seq=80, max_batch=3)
    K, M = 1024, 48
    inv_freq, N = rope_problem(C, heads["n_heads"], heads["n_kv_heads"], head_dim, K, heads["max_seq"],
                               heads["max_batch"])
    W = Weights(C, name, N, K, rng)
    x = x_rows(random_x(rng, M, K))
    qkv = store_f32(ops, [W], x)
    staging = nan_full((M, N), torch.float32)
    rope = lambda **dest: run(ops, [W], x, ROPE_KV, out_f32=staging.data_ptr(), **dest)  # noqa: E731
    check_rope_kv(rng, rope, qkv, inv_freq, what=f"{name} hd={head_dim}", **heads)


def test_gemv_quant_wgmma_bad_arguments_raise(C, ops, rng):
    """Refused before any launch, with the problem named; the next good call still runs."""
    K = 1024
    W = Weights(C, "q4_k", 64, K, rng)
    x = x_rows(random_x(rng, 40, K))
    y = nan_full((40, 64), torch.float32)
    planes = torch.empty(ops.gemv_quant_wgmma_plane_floats(40, 64, K), device="cuda")

    def call(parts, N=64, K=K, M=40, floats=planes.numel(), at=planes.data_ptr()):
        ops.gemv_quant_wgmma(parts, x.data_ptr(), M, N, K, STORE_F32, out_f32=y.data_ptr(), planes=at,
                             plane_floats=floats)
    with pytest.raises(Exception, match="must be tiles of a kept quantized type"):
        call([(10, W.packed.data_ptr(), 64)])  # Q2_K
    with pytest.raises(Exception, match="a multiple of 64 rows"):
        call([(12, W.packed.data_ptr(), 32)], N=32)
    with pytest.raises(Exception, match="K a positive multiple of 1024"):
        call([(12, W.packed.data_ptr(), 64)], K=512)
    with pytest.raises(Exception, match=r"M in \[1, 64\]"):
        call([(12, W.packed.data_ptr(), 64)], M=65)
    with pytest.raises(Exception, match="the planes need"):
        call([(12, W.packed.data_ptr(), 64)], floats=100)
    with pytest.raises(Exception, match="16-byte aligned"):
        call([(12, W.packed.data_ptr(), 64)], floats=planes.numel() - 1, at=planes.data_ptr() + 4)
    _, ref = decoded(ops, [W], K)
    check_bound("after the refusals", store_f32(ops, [W], x), ref, x)
