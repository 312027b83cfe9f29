"""The CUDA matmul and attention kernels (gemv.cu, gemm.cu, attention.cu) against PyTorch, through
_C.testing on device pointers.

Tolerance (docs/design.md): the relative error (Frobenius norm) against an fp64 reference computed from
the same bf16 inputs may be at most twice the error of the same computation done by PyTorch in
bf16; outputs kept in fp32 must also be within 1e-4 (fp32 accumulation, any order). Outputs,
padding columns, split scratch and every cache entry a kernel must not read are NaN-poisoned, so
a stray read or a missed write shows up as NaN. Inputs are random each run (seed printed by the
rng fixture; BRRR_TEST_SEED replays it)."""

import math

import pytest

torch = pytest.importorskip("torch")

from paged_kv import PagedCaches  # noqa: E402

pytestmark = pytest.mark.cuda

STORE_BF16, STORE_F32, ADD_RESIDUAL, SWIGLU = 0, 1, 2, 3
EPILOGUES = {"store_bf16": STORE_BF16, "store_f32": STORE_F32, "add_residual": ADD_RESIDUAL,
             "swiglu": SWIGLU}


@pytest.fixture(scope="module")
def ops(cuda_C):
    return cuda_C.testing


@pytest.fixture
def gen(rng):
    """A torch generator seeded from the logged rng, so torch draws replay too."""
    return torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))


def randn(shape, gen, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(dtype)


def nan_full(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def assert_design_tolerance(name, got, ref, torch_bf16):
    """got must be finite and at most 2x as far from ref as PyTorch's bf16 computation is."""
    assert torch.isfinite(got).all(), f"{name}: {(~torch.isfinite(got)).sum().item()} non-finite outputs"
    ours, theirs = rel_err(got, ref), rel_err(torch_bf16, ref)
    # 1e-6 only absorbs norm round-off where both are exact (e.g. attention over one position).
    assert ours <= 2 * theirs + 1e-6, f"{name}: relative error {ours:.3e} > 2 x torch bf16's {theirs:.3e}"


def misaligned_copy(t):
    """The same values at an address 2 bytes past a 16-byte boundary (selects the scalar paths)."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = flat[1:1 + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


# ---- matmuls --------------------------------------------------------------------------------

def run_matmul(ops, fn, x, W, epilogue, gen, ld_extra=0, split=None, path=None):
    """Runs testing.<fn> on x [M, K], W [N, K] (with split-K scratch `split`, a SplitScratch);
    returns (result, reference, torch bf16 result, output tensor including its padding columns,
    padding as it was before the call)."""
    M, K = x.shape
    N = W.shape[0]
    width = N // 2 if epilogue == SWIGLU else N
    ld = width + ld_extra
    ref_y = x.double() @ W.double().T
    bf_y = x @ W.T
    out = out_f32 = residual = None
    if epilogue in (STORE_BF16, SWIGLU):
        out = nan_full((M, ld), torch.bfloat16)
    elif epilogue == STORE_F32:
        out_f32 = nan_full((M, ld), torch.float32)
    else:
        residual = torch.randn((M, ld), generator=gen, device="cuda")
    target = next(t for t in (out, out_f32, residual) if t is not None)
    before = target.clone()
    getattr(ops, fn)(x.data_ptr(), W.data_ptr(), M, N, K, epilogue,
                     out=out.data_ptr() if out is not None else 0,
                     out_f32=out_f32.data_ptr() if out_f32 is not None else 0,
                     residual=residual.data_ptr() if residual is not None else 0,
                     ld_out=ld if ld_extra else 0, **({"split": split.arg} if split else {}),
                     **({"path": path} if path else {}))
    torch.cuda.synchronize()
    if epilogue == SWIGLU:
        ref = torch.nn.functional.silu(ref_y[:, :width]) * ref_y[:, width:]
        bf = torch.nn.functional.silu(bf_y[:, :width]) * bf_y[:, width:]
    elif epilogue == ADD_RESIDUAL:
        ref = before[:, :width].double() + ref_y
        bf = before[:, :width] + bf_y.float()  # the engine's residual stream stays fp32
    else:
        ref, bf = ref_y, bf_y
    return target[:, :width], ref, bf, target, before


class SplitScratch:
    """The split-K scratch the engine gives its GEMMs: partials NaN-poisoned (a merge that read a
    slot no split wrote would show), counters zero."""

    def __init__(self, ops):
        floats, counters = ops.gemm_split_scratch_sizes(torch.cuda.get_device_properties(0).multi_processor_count)
        self.partials = nan_full((floats,), torch.float32)
        self.counters = torch.zeros(counters, dtype=torch.int32, device="cuda")
        self.arg = (self.partials.data_ptr(), floats, self.counters.data_ptr(), counters)


def check_matmul(ops, fn, M, N, K, epilogue, gen, ld_extra=0, misaligned=False, split=None, path=None):
    if epilogue == SWIGLU and N % 2:
        N *= 2
    x = randn((M, K), gen)
    W = randn((N, K), gen, scale=1.0 / math.sqrt(K))
    if misaligned:
        x, W = misaligned_copy(x), misaligned_copy(W)
    got, ref, bf, target, before = run_matmul(ops, fn, x, W, epilogue, gen, ld_extra, split, path)
    name = f"{fn} ({path or 'default'}) M={M} N={N} K={K} epilogue={epilogue}"
    assert_design_tolerance(name, got, ref, bf)
    if epilogue in (STORE_F32, ADD_RESIDUAL):
        assert rel_err(got, ref) <= 1e-4, f"{name}: fp32 output off by {rel_err(got, ref):.2e}"
    if ld_extra:
        width = got.shape[1]
        pad_now, pad_before = target[:, width:], before[:, width:]
        assert torch.equal(pad_now.isnan(), pad_before.isnan()) and torch.equal(
            pad_now.nan_to_num(0.0), pad_before.nan_to_num(0.0)), f"{name}: wrote past its row"


# Tail + scalar path, an 8B-like shape, SmolLM2, and for the tensor cores a partial 16-row tile with
# K ending inside a step (2056 = one 2048-column step + 8) and inside a warp's 32-column slice.
GEMV_SHAPES = [(193, 577), (6144, 4096), (576, 576), (200, 2056), (24, 4136)]
GEMV_PATHS = ["cuda_cores", "tensor_cores"]


@pytest.mark.parametrize("path", GEMV_PATHS)
@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
@pytest.mark.parametrize("N,K", GEMV_SHAPES, ids=[f"{n}x{k}" for n, k in GEMV_SHAPES])
@pytest.mark.parametrize("M", [1, 2, 5, 9, 16])
def test_gemv_matches_torch(ops, gen, M, N, K, epilogue, path):
    check_matmul(ops, "gemv_bf16", M, N, K, epilogue, gen, path=path)


@pytest.mark.parametrize("path", GEMV_PATHS)
@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
def test_gemv_row_stride_and_misaligned_pointers(ops, gen, epilogue, path):
    check_matmul(ops, "gemv_bf16", 3, 264, 1024, epilogue, gen, ld_extra=5, path=path)
    check_matmul(ops, "gemv_bf16", 11, 264, 1024, epilogue, gen, ld_extra=5, path=path)
    check_matmul(ops, "gemv_bf16", 3, 130, 1024, epilogue, gen, misaligned=True, path=path)


@pytest.mark.parametrize("path", GEMV_PATHS)
def test_gemv_rows_do_not_depend_on_the_batch(ops, gen, path):
    """Each path gives row m of a batch bit for bit what it gives that row alone (the tensor
    cores pad x to 8 or 16 rows; row m's dot products must not see the others)."""
    x = randn((16, 2056), gen)
    W = randn((200, 2056), gen, scale=1.0 / math.sqrt(2056))
    rows = {}
    for M in (16, 9, 1):
        out_f32 = nan_full((M, 200), torch.float32)
        ops.gemv_bf16(x.data_ptr(), W.data_ptr(), M, 200, 2056, STORE_F32, out_f32=out_f32.data_ptr(), path=path)
        rows[M] = out_f32
    torch.cuda.synchronize()
    assert torch.equal(rows[16][:9], rows[9]), f"{path}: rows 0-8 of 16 differ from a batch of 9"
    assert torch.equal(rows[16][:1], rows[1]), f"{path}: row 0 of 16 differs from it alone"


def test_gemv_path_must_be_known(ops, gen):
    x, W = randn((2, 64), gen), randn((32, 64), gen)
    out = nan_full((2, 32), torch.bfloat16)
    with pytest.raises(ValueError, match="path"):
        ops.gemv_bf16(x.data_ptr(), W.data_ptr(), 2, 32, 64, STORE_BF16, out=out.data_ptr(), path="simd")
    assert torch.isnan(out.float()).all()


@pytest.mark.parametrize("epilogue", [STORE_F32, ADD_RESIDUAL], ids=["store_f32", "add_residual"])
@pytest.mark.parametrize("K", [14336, 14344], ids=["8b-w2", "uneven-chunks"])
def test_gemv_long_rows_in_one_wave(ops, gen, K, epilogue):
    """Llama-3-8B's w2 at M = 1: the grid fits on the GPU at once, whole 28 KB rows of x would
    not let it, so x is staged in shorter slices (K = 14344 leaves a short last one)."""
    check_matmul(ops, "gemv_bf16", 1, 4096, K, epilogue, gen)


@pytest.mark.parametrize("path", GEMV_PATHS)
def test_gemv_k_chunks_at_sixteen_rows(ops, gen, path):
    """M = 16 stages x in chunks (CUDA cores: 1024 columns, 14 for K = 14336; tensor cores: 2048, 7)."""
    check_matmul(ops, "gemv_bf16", 16, 128, 14336, STORE_F32, gen, path=path)
    check_matmul(ops, "gemv_bf16", 16, 96, 2056, SWIGLU, gen, path=path)


# SmolLM2's qkv/w13/w2 (K = 576, 1536), N = 192 (one k/v projection), K % 64 != 0 (TMA zero-fills
# the last k tile on Hopper), K % 8 != 0 (mma.sync fallback everywhere), N not a tile multiple.
GEMM_SHAPES = [(960, 576), (3072, 576), (576, 1536), (192, 576), (264, 1000), (193, 577), (250, 200)]


@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
@pytest.mark.parametrize("N,K", GEMM_SHAPES, ids=[f"{n}x{k}" for n, k in GEMM_SHAPES])
@pytest.mark.parametrize("M", [17, 64, 129, 1000])
def test_gemm_matches_torch(ops, gen, M, N, K, epilogue):
    check_matmul(ops, "gemm_bf16", M, N, K, epilogue, gen)


@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
def test_gemm_row_stride_and_misaligned_pointers(ops, gen, epilogue):
    check_matmul(ops, "gemm_bf16", 77, 264, 200, epilogue, gen, ld_extra=3)
    check_matmul(ops, "gemm_bf16", 77, 130, 256, epilogue, gen, misaligned=True)


@pytest.mark.parametrize("M", [1, 16, 17, 300])
def test_matmul_dispatch_is_correct_on_both_sides(ops, gen, M):
    check_matmul(ops, "matmul_bf16", M, 640, 576, STORE_F32, gen)
    check_matmul(ops, "matmul_bf16", M, 640, 576, SWIGLU, gen)


@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
def test_gemm_many_tiles_per_cta(ops, gen, epilogue):
    """More tiles than SMs: on Hopper each persistent CTA walks several tiles, its shared-memory
    ring running on from one tile into the next; M and N end mid-tile."""
    check_matmul(ops, "gemm_bf16", 2000, 4104, 576, epilogue, gen)


@pytest.mark.parametrize("epilogue", [STORE_BF16, STORE_F32, ADD_RESIDUAL],
                         ids=["store_bf16", "store_f32", "add_residual"])
@pytest.mark.parametrize("K", [64, 136], ids=["one-k-tile", "three-k-tiles"])
def test_gemm_short_k_many_tiles_per_cta(ops, gen, K, epilogue):
    """Tiles of one to three k tiles, several per CTA, and an N tail (4104 = 16 x 256 + 8) whose
    tiles stage one TMA box per warpgroup, an odd count: on Hopper the next tile's epilogue comes
    while TMA may still be reading that box, so the staging boxes must alternate across tiles
    (H100 added wrong values into the tail boxes when they restarted at each tile)."""
    check_matmul(ops, "gemm_bf16", 2000, 4104, K, epilogue, gen)


@pytest.mark.parametrize("M,N,K", [(300, 4096, 4096), (2048, 6144, 4096), (515, 4096, 14336)],
                         ids=["narrow-tiles", "wide-tiles", "long-k"])
def test_gemm_llama_shapes(ops, gen, M, N, K):
    """Llama-3-8B projections: Hopper picks 128- or 256-wide tiles by the wave count."""
    check_matmul(ops, "gemm_bf16", M, N, K, ADD_RESIDUAL, gen)
    check_matmul(ops, "gemm_bf16", M, N, K, SWIGLU, gen)


# Few tiles, long enough K: on Hopper these split K (1B wo at M = 17 8 ways, w2 at M = 64; K = 1000
# ends mid-k-tile and splits 4 ways; K = 1600 is 25 k tiles in 9 splits, the last one of 1 tile).
SPLIT_SHAPES = [(17, 2048, 2048), (64, 2048, 8192), (100, 264, 1000), (24, 192, 1600)]


@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
@pytest.mark.parametrize("M,N,K", SPLIT_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SPLIT_SHAPES])
def test_gemm_split_k_matches_torch(ops, gen, M, N, K, epilogue):
    split = SplitScratch(ops)
    check_matmul(ops, "gemm_bf16", M, N, K, epilogue, gen, split=split)
    check_matmul(ops, "gemm_bf16", M, N, K, epilogue, gen, ld_extra=3, split=split)
    assert int(split.counters.abs().sum()) == 0, "split-K left a tile counter non-zero"


@pytest.mark.parametrize("M,N,K,ld_extra,splits", [(300, 1000, 576, 0, False), (129, 264, 200, 4, False),
                                                    (2048, 4096, 4096, 0, False), (17, 2048, 2048, 0, True)],
                         ids=["tails", "padded-rows", "8b-wo", "split-k"])
def test_gemm_residual_add_is_one_fp32_add(ops, gen, M, N, K, ld_extra, splits):
    """AddResidual leaves exactly residual + y, y being what StoreF32 writes for the same call (on
    Hopper the boxes are added by TMA in L2: a box added twice, or lost, or a tail written past
    the row shows here bit for bit)."""
    split = SplitScratch(ops) if splits else None
    extra = {"split": split.arg} if split else {}
    x, W = randn((M, K), gen), randn((N, K), gen, scale=1.0 / math.sqrt(K))
    ld = N + ld_extra
    y = nan_full((M, ld), torch.float32)
    ops.gemm_bf16(x.data_ptr(), W.data_ptr(), M, N, K, STORE_F32, out_f32=y.data_ptr(), ld_out=ld, **extra)
    residual = torch.randn((M, ld), generator=gen, device="cuda")
    residual[:, N:] = float("nan")
    before = residual.clone()
    ops.gemm_bf16(x.data_ptr(), W.data_ptr(), M, N, K, ADD_RESIDUAL, residual=residual.data_ptr(), ld_out=ld,
                  **extra)
    torch.cuda.synchronize()
    assert torch.equal(residual[:, :N], before[:, :N] + y[:, :N])
    assert residual[:, N:].isnan().all(), "wrote past its row"


def test_gemm_split_k_is_deterministic(ops, gen):
    """The partial sums are added in split order, whichever split ends last: same bits each run."""
    split = SplitScratch(ops)
    x, W = randn((40, 4096), gen), randn((1024, 4096), gen, scale=1 / 64)
    outs = []
    for _ in range(3):
        out = nan_full((40, 1024), torch.float32)
        ops.gemm_bf16(x.data_ptr(), W.data_ptr(), 40, 1024, 4096, STORE_F32, out_f32=out.data_ptr(), split=split.arg)
        torch.cuda.synchronize()
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = x.double() @ W.double().T
    assert rel_err(outs[0], ref) <= 1e-4


def test_gemm_accepts_small_m(ops, gen):
    check_matmul(ops, "gemm_bf16", 1, 200, 64, STORE_BF16, gen)


def test_matmul_bad_arguments_raise(ops, gen):
    x = randn((4, 64), gen)
    W = randn((33, 64), gen)
    out = nan_full((4, 64), torch.bfloat16)
    with pytest.raises(ValueError, match="even N"):
        ops.gemm_bf16(x.data_ptr(), W.data_ptr(), 4, 33, 64, SWIGLU, out=out.data_ptr())
    with pytest.raises(ValueError, match="at most 16"):
        ops.gemv_bf16(x.data_ptr(), W.data_ptr(), 17, 33, 64, STORE_BF16, out=out.data_ptr())
    with pytest.raises(ValueError, match="epilogue"):
        ops.matmul_bf16(x.data_ptr(), W.data_ptr(), 4, 33, 64, 4, out=out.data_ptr())
    with pytest.raises(ValueError, match="out_f32"):
        ops.matmul_bf16(x.data_ptr(), W.data_ptr(), 4, 33, 64, STORE_F32, out=out.data_ptr())
    with pytest.raises(ValueError, match="ld_out"):
        ops.gemm_bf16(x.data_ptr(), W.data_ptr(), 4, 33, 64, STORE_BF16, out=out.data_ptr(), ld_out=20)
    with pytest.raises(ValueError, match="N and K"):
        ops.gemv_bf16(x.data_ptr(), W.data_ptr(), 4, 33, 0, STORE_BF16, out=out.data_ptr())
    assert torch.isnan(out.float()).all(), "a rejected call must not touch the output"


# ---- attention ------------------------------------------------------------------------------

def reference_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(hd) + mask) v per head in the dtype given; q [Hq, T, hd], k/v
    [Hq, L, hd] (KV heads already repeated for GQA), mask [T, L] bool (True = may attend)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    softmax_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return torch.softmax(scores.to(softmax_dtype), dim=-1).to(q.dtype) @ v


def poisoned_cache(max_batch, max_seq, n_kv_heads, head_dim):
    return (nan_full((max_batch, max_seq, n_kv_heads, head_dim), torch.bfloat16),
            nan_full((max_batch, max_seq, n_kv_heads, head_dim), torch.bfloat16))


def paged_caches(k_cache, v_cache, kv_fp8, **kwargs):
    """PagedCaches of the two caches; kv_fp8: first rounds them in place to e4m3 values (so the
    references see what the kernel reads) and stores the pools as e4m3 bytes."""
    if not kv_fp8:
        return PagedCaches(k_cache, v_cache, **kwargs)
    for cache in (k_cache, v_cache):
        cache.copy_(cache.to(torch.float8_e4m3fn).to(torch.bfloat16))
    return PagedCaches(k_cache, v_cache, **kwargs).to_fp8()


# GQA groups 1, 2, 3, 4 and 16 (four head blocks); 32 / 8 at the 4 sequences below is 32 CTAs a
# split, where an e4m3 cache takes the tensor-core kernel, split (tuning::kDecodeMmaMinCtasFp8)
DECODE_HEADS = [(4, 4), (8, 4), (9, 3), (16, 4), (16, 1), (32, 8)]


# The caches are paged (paged_kv.PagedCaches: shuffled blocks, NaN everywhere the table does not
# send the kernel); max_seq = 1000 is not a multiple of either block size.
# kv_fp8: the caches hold e4m3 (the fp8 KV cache); the references get the same values in bf16.
@pytest.mark.parametrize("kv_fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("max_splits", [1, 16])
@pytest.mark.parametrize("n_heads,n_kv_heads", DECODE_HEADS, ids=[f"{h}q{kv}kv" for h, kv in DECODE_HEADS])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_decode_matches_torch(ops, rng, gen, head_dim, n_heads, n_kv_heads, max_splits, block_size, kv_fp8):
    lengths = [1, 37, 129, 1000]  # one chunk, two (the second one row), several
    B, max_batch, max_seq = len(lengths), 5, 1000
    group = n_heads // n_kv_heads
    k_cache, v_cache = poisoned_cache(max_batch, max_seq, n_kv_heads, head_dim)
    slots = [int(s) for s in rng.permutation(max_batch)[:B]]
    for slot, length in zip(slots, lengths):  # only [0, length) of each used slot is valid
        k_cache[slot, :length] = randn((length, n_kv_heads, head_dim), gen)
        v_cache[slot, :length] = randn((length, n_kv_heads, head_dim), gen)
    paged = paged_caches(k_cache, v_cache, kv_fp8, block_size=block_size, seed=head_dim + n_heads)
    q = randn((B, n_heads, head_dim), gen)
    d_slots = torch.tensor(slots, dtype=torch.int32, device="cuda")
    d_positions = torch.tensor([n - 1 for n in lengths], dtype=torch.int32, device="cuda")
    # Scratch poisoned but for each sequence's arrival counters (its first n_heads words), which
    # the contract asks to be zero before the first call; every call must leave them zero.
    per_sequence = ops.flash_decode_scratch_floats(1, n_heads, head_dim, max_splits)
    scratch = nan_full((B * per_sequence,), torch.float32)
    counters = scratch.view(B, per_sequence)[:, :n_heads]
    counters.zero_()
    # The second call lets the next kernel launch before its CTAs exit at every head dim (what the
    # engine asks before a quantized wo): where the PDL trigger sits must not move a bit.
    outs = []
    for call in range(2):
        out = nan_full((B, n_heads * head_dim), torch.bfloat16)
        ops.flash_decode(q.data_ptr(), paged.k.data_ptr(), paged.v.data_ptr(), d_slots.data_ptr(),
                         d_positions.data_ptr(), out.data_ptr(), scratch.data_ptr(), B, n_heads,
                         n_kv_heads, head_dim, max_seq, max_splits, **paged.kwargs(), early_trigger=call == 1)
        torch.cuda.synchronize()
        assert (counters.view(torch.int32) == 0).all(), f"call {call} left arrival counters armed"
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), "early_trigger changed the output"
    for b, (slot, length) in enumerate(zip(slots, lengths)):
        k = k_cache[slot, :length].transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, L, hd]
        v = v_cache[slot, :length].transpose(0, 1).repeat_interleave(group, dim=0)
        mask = torch.ones((1, length), dtype=torch.bool, device="cuda")
        qb = q[b].unsqueeze(1)  # [Hq, 1, hd]
        ref = reference_attention(qb.double(), k.double(), v.double(), mask).squeeze(1)
        bf = reference_attention(qb, k, v, mask).squeeze(1)
        got = out[b].view(n_heads, head_dim)
        assert_design_tolerance(f"flash_decode b={b} length={length}", got, ref, bf)


# Serving batches: enough sequences that one split per (sequence, head block) fills the GPU several
# times over, where launch_flash_decode takes the tensor-core kernel (from
# tuning::kDecodeMmaMinCtas one-split CTAs on; 8 per SM here clear that with room).
SERVING_HEADS = [(32, 8), (16, 1), (9, 3)]


def decode_head_blocks(n_heads, n_kv_heads):
    """The CTAs of one split a (sequence, KV head) takes in flash_decode: its GQA group over
    decode_gmax heads a CTA."""
    group = n_heads // n_kv_heads
    return -(-group // (1 if group <= 1 else 2 if group <= 2 else 4))


@pytest.mark.parametrize("kv_fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("n_heads,n_kv_heads", SERVING_HEADS, ids=[f"{h}q{kv}kv" for h, kv in SERVING_HEADS])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_decode_serving_batch_matches_torch(ops, rng, gen, head_dim, n_heads, n_kv_heads, kv_fp8):
    group = n_heads // n_kv_heads
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B = -(-8 * sms // (n_kv_heads * decode_head_blocks(n_heads, n_kv_heads))) + 3
    max_seq, block_size, max_splits = 389, 16, 16
    # Lengths of every residue around the steps a warp covers; 1 and max_seq among them.
    lengths = [1, max_seq] + [int(n) for n in rng.integers(1, max_seq + 1, size=B - 2)]
    k_cache, v_cache = poisoned_cache(B + 1, max_seq, n_kv_heads, head_dim)
    slots = [int(s) for s in rng.permutation(B + 1)[:B]]
    for slot, length in zip(slots, lengths):
        k_cache[slot, :length] = randn((length, n_kv_heads, head_dim), gen)
        v_cache[slot, :length] = randn((length, n_kv_heads, head_dim), gen)
    paged = paged_caches(k_cache, v_cache, kv_fp8, block_size=block_size, seed=head_dim + n_heads + B)
    q = randn((B, n_heads, head_dim), gen)
    d_slots = torch.tensor(slots, dtype=torch.int32, device="cuda")
    d_positions = torch.tensor([n - 1 for n in lengths], dtype=torch.int32, device="cuda")
    per_sequence = ops.flash_decode_scratch_floats(1, n_heads, head_dim, max_splits)
    scratch = nan_full((B * per_sequence,), torch.float32)
    scratch.view(B, per_sequence)[:, :n_heads].zero_()
    out = nan_full((B, n_heads * head_dim), torch.bfloat16)
    ops.flash_decode(q.data_ptr(), paged.k.data_ptr(), paged.v.data_ptr(), d_slots.data_ptr(),
                     d_positions.data_ptr(), out.data_ptr(), scratch.data_ptr(), B, n_heads,
                     n_kv_heads, head_dim, max_seq, max_splits, **paged.kwargs())
    torch.cuda.synchronize()
    for b, (slot, length) in enumerate(zip(slots, lengths)):
        k = k_cache[slot, :length].transpose(0, 1).repeat_interleave(group, dim=0)
        v = v_cache[slot, :length].transpose(0, 1).repeat_interleave(group, dim=0)
        mask = torch.ones((1, length), dtype=torch.bool, device="cuda")
        qb = q[b].unsqueeze(1)
        ref = reference_attention(qb.double(), k.double(), v.double(), mask).squeeze(1)
        bf = reference_attention(qb, k, v, mask).squeeze(1)
        assert_design_tolerance(f"flash_decode b={b} of {B} length={length}", out[b].view(n_heads, head_dim),
                                ref, bf)


def check_attention_prefill(ops, gen, n_heads, n_kv_heads, head_dim, T, start_pos, max_seq=None, mma_sync=False,
                            block_size=16, kv_fp8=False):
    """max_seq defaults to room past the filled positions, whose poison the kernel must not read
    (nor that of the rest of their last block: the pool is paged_kv.PagedCaches)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    max_seq = start_pos + T + 37 if max_seq is None else max_seq
    max_batch, slot = 3, 2
    group = n_heads // n_kv_heads
    total = start_pos + T
    k_cache, v_cache = poisoned_cache(max_batch, max_seq, n_kv_heads, head_dim)
    k_cache[slot, :total] = randn((total, n_kv_heads, head_dim), gen)
    v_cache[slot, :total] = randn((total, n_kv_heads, head_dim), gen)
    paged = paged_caches(k_cache, v_cache, kv_fp8, block_size=block_size, seed=T + start_pos)
    q = randn((T, n_heads, head_dim), gen)
    out = nan_full((T, n_heads * head_dim), torch.bfloat16)
    ops.attention_prefill(q.data_ptr(), paged.k.data_ptr(), paged.v.data_ptr(), slot, start_pos, T,
                          out.data_ptr(), n_heads, n_kv_heads, head_dim, max_seq, mma_sync=mma_sync,
                          **paged.kwargs())
    torch.cuda.synchronize()

    qh = q.transpose(0, 1)  # [Hq, T, hd]
    k = k_cache[slot, :total].transpose(0, 1).repeat_interleave(group, dim=0)
    v = v_cache[slot, :total].transpose(0, 1).repeat_interleave(group, dim=0)
    query_pos = torch.arange(start_pos, total, device="cuda")
    mask = torch.arange(total, device="cuda")[None, :] <= query_pos[:, None]  # [T, total]
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(qh.double(), k.double(), v.double(), attn_mask=mask)
    bf = reference_attention(qh, k, v, mask)
    got = out.view(T, n_heads, head_dim).transpose(0, 1)
    assert_design_tolerance(f"attention_prefill T={T} start_pos={start_pos}", got, ref, bf)


# mma_sync=True: the pre-Hopper kernel, which a Hopper GPU runs only here.
@pytest.mark.parametrize("mma_sync", [False, True])
@pytest.mark.parametrize("start_pos", [0, 45, 130])
@pytest.mark.parametrize("T", [1, 17, 128, 300])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 2), (3, 3), (9, 3)])
def test_attention_prefill_matches_sdpa(ops, gen, n_heads, n_kv_heads, head_dim, T, start_pos, mma_sync):
    check_attention_prefill(ops, gen, n_heads, n_kv_heads, head_dim, T, start_pos, mma_sync=mma_sync)


# An e4m3 cache: both entry points (attention_prefill routes it to the mma.sync kernel, which
# widens its tiles in shared memory); every block size, a long sequence among the shapes.
@pytest.mark.parametrize("mma_sync", [False, True])
@pytest.mark.parametrize("T,start_pos,block_size", [(1, 0, 16), (17, 45, 32), (300, 130, 16), (1100, 70, 128)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 2), (9, 3)])
def test_attention_prefill_fp8_cache_matches_sdpa(ops, gen, n_heads, n_kv_heads, head_dim, T, start_pos,
                                                   block_size, mma_sync):
    check_attention_prefill(ops, gen, n_heads, n_kv_heads, head_dim, T, start_pos, mma_sync=mma_sync,
                            block_size=block_size, kv_fp8=True)


@pytest.mark.parametrize("mma_sync", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_prefill_kv_larger_than_l2(ops, gen, head_dim, mma_sync):
    """The launcher orders the grid by whether the sequence's K/V fits in L2; here it does not
    (enough KV heads to overflow this GPU's L2), so the other grid order runs."""
    T, start_pos = 150, 7
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    n_kv_heads = l2 // ((start_pos + T) * head_dim * 2 * 2) + 1
    check_attention_prefill(ops, gen, 2 * n_kv_heads, n_kv_heads, head_dim, T, start_pos, max_seq=start_pos + T,
                            mma_sync=mma_sync)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("mma_sync", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_prefill_long_sequence(ops, gen, head_dim, mma_sync, block_size):
    """Many query tiles and KV tiles per CTA, a prefix that ends inside a tile, T not a tile
    multiple; every block size (a K/V tile is 128 / block_size boxes on Hopper)."""
    check_attention_prefill(ops, gen, 4, 1, head_dim, 1100, 70, max_seq=1200, mma_sync=mma_sync,
                            block_size=block_size)


# Prompt tails after a cached prefix: several short segments of different slots, lengths and start
# positions in one launch (the rows of a prefill pass), against each segment alone in float64.
@pytest.mark.parametrize("kv_fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 2), (9, 3), (4, 4)])
def test_attention_prefill_segments_match_sdpa(ops, rng, gen, n_heads, n_kv_heads, head_dim, kv_fp8):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    max_batch, max_seq = 9, 400
    group = n_heads // n_kv_heads
    # (slot, start_pos, rows): one row, a full tile, an odd tail at 0 and deep in the cache,
    # a segment crossing a block boundary, and the last position of the cache.
    shapes = [(4, 0, 1), (0, 257, 128), (7, 0, 37), (2, 15, 2), (8, 101, 90), (5, 400 - 61, 61),
              (1, int(rng.integers(0, 200)), int(rng.integers(1, 129)))]
    k_cache, v_cache = poisoned_cache(max_batch, max_seq, n_kv_heads, head_dim)
    for slot, start, rows in shapes:
        k_cache[slot, :start + rows] = randn((start + rows, n_kv_heads, head_dim), gen)
        v_cache[slot, :start + rows] = randn((start + rows, n_kv_heads, head_dim), gen)
    paged = paged_caches(k_cache, v_cache, kv_fp8, block_size=16, seed=n_heads + head_dim)
    segments, row0 = [], 0
    for slot, start, rows in shapes:
        segments.append((row0, slot, start, rows))
        row0 += rows + 3  # rows between segments belong to no segment: their poison must stay
    q = randn((row0, n_heads, head_dim), gen)
    out = nan_full((row0, n_heads * head_dim), torch.bfloat16)
    d_segments = torch.tensor(segments, dtype=torch.int32, device="cuda")
    ops.attention_prefill_segments(q.data_ptr(), paged.k.data_ptr(), paged.v.data_ptr(), d_segments.data_ptr(),
                                   len(segments), out.data_ptr(), n_heads, n_kv_heads, head_dim, max_seq,
                                   **paged.kwargs())
    torch.cuda.synchronize()
    for r0, slot, start, rows in segments:
        total = start + rows
        qh = q[r0:r0 + rows].transpose(0, 1)
        k = k_cache[slot, :total].transpose(0, 1).repeat_interleave(group, dim=0)
        v = v_cache[slot, :total].transpose(0, 1).repeat_interleave(group, dim=0)
        query_pos = torch.arange(start, total, device="cuda")
        mask = torch.arange(total, device="cuda")[None, :] <= query_pos[:, None]
        with sdpa_kernel(SDPBackend.MATH):
            ref = torch.nn.functional.scaled_dot_product_attention(qh.double(), k.double(), v.double(),
                                                                   attn_mask=mask)
        bf = reference_attention(qh, k, v, mask)
        got = out[r0:r0 + rows].view(rows, n_heads, head_dim).transpose(0, 1)
        assert_design_tolerance(f"segment slot={slot} start={start} rows={rows}", got, ref, bf)
        assert torch.isnan(out[r0 + rows:r0 + rows + 3].float()).all(), "rows outside every segment were written"


def test_attention_prefill_segments_bad_arguments_raise(ops, gen):
    q = randn((4, 2, 64), gen)
    cache = randn((1, 16, 2, 64), gen)
    out = nan_full((4, 128), torch.bfloat16)
    past_end = torch.tensor([[0, 0, 14, 4]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="inside the cache of max_seq=16"):
        ops.attention_prefill_segments(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), past_end.data_ptr(), 1,
                                       out.data_ptr(), 2, 2, 64, 16)
    empty = torch.tensor([[0, 0, 0, 0]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="rows >= 1"):
        ops.attention_prefill_segments(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), empty.data_ptr(), 1,
                                       out.data_ptr(), 2, 2, 64, 16)
    assert torch.isnan(out.float()).all(), "a rejected call must not touch the output"


def test_attention_bad_arguments_raise(ops, gen):
    q = randn((4, 2, 64), gen)
    cache = randn((1, 16, 2, 64), gen)
    out = nan_full((4, 128), torch.bfloat16)
    with pytest.raises(ValueError, match="exceeds max_seq"):
        ops.attention_prefill(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), 0, 14, 4,
                              out.data_ptr(), 2, 2, 64, 16)
    with pytest.raises(ValueError, match="head_dim"):
        ops.attention_prefill(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), 0, 0, 4,
                              out.data_ptr(), 2, 2, 96, 16)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ops.attention_prefill(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), 0, 0, 4,
                              out.data_ptr(), 3, 2, 64, 16)
    ints = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="scratch"):
        ops.flash_decode(q.data_ptr(), cache.data_ptr(), cache.data_ptr(), ints.data_ptr(),
                         ints.data_ptr(), out.data_ptr(), 0, 1, 2, 2, 64, 16, 4)
    with pytest.raises(ValueError, match="16-byte aligned"):  # q rows are read 16 bytes a lane
        ops.flash_decode(q.data_ptr() + 2, cache.data_ptr(), cache.data_ptr(), ints.data_ptr(),
                         ints.data_ptr(), out.data_ptr(), 0, 1, 2, 2, 64, 16, 1)
    assert torch.isnan(out.float()).all(), "a rejected call must not touch the output"
