"""The CUDA backend's small kernels (embed with its token history, rmsnorm_residual, rope_kv_append,
fill_normal_bf16, convert_f32_to_bf16, add_bf16_into_f32, sample_tokens) against PyTorch / numpy / the CPU sampler,
through _C.testing on device pointers. Outputs are NaN-poisoned before each run, sizes are odd
where the kernels have a vector path, inputs are random each run (seed printed by the rng fixture)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llama_brrr.sampling import uniform_rows  # noqa: E402

from counter_rng import MASK64, splitmix64  # noqa: E402
from paged_kv import PagedCaches  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def ops(cuda_C):
    return cuda_C.testing


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


@pytest.fixture
def gen(rng):
    """A torch generator seeded from the logged rng, so torch draws replay too."""
    return torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))


def cuda_randn(shape, gen, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(dtype)


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def ptr(t):
    return t.data_ptr()


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    mag = x.abs().clamp_min(1e-30)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


# ---- embed ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,D", [(1, 64), (3, 577), (17, 4096), (5, 8), (2, 1)])
def test_embed_matches_indexing(ops, rng, gen, M, D):
    V = 1001
    table = cuda_randn((V, D), gen, torch.bfloat16)
    ids = rng.integers(0, V, size=M).astype(np.int32)
    ids[0] = V - 1
    tokens = torch.from_numpy(ids).cuda()
    x = nan_like((M, D), torch.float32)
    ops.embed(ptr(tokens), ptr(table), ptr(x), M, D, V)
    assert torch.equal(x, table[tokens.long()].float())


def test_embed_bad_id_poisons_the_row(ops, gen):
    V, D = 50, 64
    table = cuda_randn((V, D), gen, torch.bfloat16)
    tokens = torch.tensor([3, V, -1], dtype=torch.int32, device="cuda")
    x = torch.zeros((3, D), device="cuda")
    ops.embed(ptr(tokens), ptr(table), ptr(x), 3, D, V)
    assert torch.equal(x[0], table[3].float())
    assert torch.isnan(x[1:]).all()


def test_embed_rejects_null_pointer(ops):
    with pytest.raises(ValueError, match="tokens"):
        ops.embed(0, 1, 1, 1, 8, 8)


@pytest.mark.parametrize("D", [64, 577])
def test_embed_records_tokens_only_in_their_cells(ops, rng, gen, D):
    max_batch, max_seq, M, V = 3, 23, 5, 1000
    table = cuda_randn((V, D), gen, torch.bfloat16)
    history = torch.full((max_batch, max_seq), -7, dtype=torch.int32, device="cuda")
    slots = rng.integers(0, max_batch, size=M).astype(np.int32)
    positions = rng.choice(max_seq, size=M, replace=False).astype(np.int32)
    slots[-1], positions[-1] = max_batch, 0  # a row outside the history records nothing
    ids = rng.integers(0, V, size=M).astype(np.int32)
    expected = np.full((max_batch, max_seq), -7, dtype=np.int32)
    expected[slots[:-1], positions[:-1]] = ids[:-1]
    t = [torch.from_numpy(a).cuda() for a in (ids, slots, positions)]
    x = nan_like((M, D), torch.float32)
    ops.embed(ptr(t[0]), ptr(table), ptr(x), M, D, V, ptr(history), ptr(t[1]), ptr(t[2]), max_batch, max_seq)
    np.testing.assert_array_equal(history.cpu().numpy(), expected)
    assert torch.equal(x, table[t[0].long()].float())


def test_embed_history_needs_its_sizes(ops, gen):
    table = cuda_randn((8, 8), gen, torch.bfloat16)
    t = torch.zeros(1, dtype=torch.int32, device="cuda")
    history = torch.zeros((1, 4), dtype=torch.int32, device="cuda")
    x = torch.zeros((1, 8), device="cuda")
    with pytest.raises(ValueError, match="history"):
        ops.embed(ptr(t), ptr(table), ptr(x), 1, 8, 8, ptr(history), ptr(t), ptr(t), 0, 4)


# ---- rmsnorm_residual ---------------------------------------------------------------------------

def rmsnorm_oracle(x, w, eps):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("M,D", [(1, 64), (3, 577), (5, 4096), (2, 8), (4, 3)])
@pytest.mark.parametrize("residual_kind", [None, torch.float32, torch.bfloat16])
def test_rmsnorm_residual(ops, gen, M, D, residual_kind):
    """With a bf16 residual (rmsnorm_add_bf16: a tensor-parallel prefill's summed parts) the add
    widens it exactly and adds in fp32."""
    eps = 1e-5
    x = cuda_randn((M, D), gen, scale=3.0)
    residual = cuda_randn((M, D), gen, dtype=residual_kind) if residual_kind else None
    w = (1 + cuda_randn((D,), gen, scale=0.1)).to(torch.bfloat16)
    x_expected = x + residual.float() if residual_kind else x.clone()
    y = nan_like((M, D), torch.bfloat16)
    ops.rmsnorm_residual(ptr(x), ptr(residual) if residual_kind else 0, ptr(w), ptr(y), M, D, eps,
                         residual_kind == torch.bfloat16)
    assert torch.equal(x, x_expected), "x must become x + residual exactly (and stay put without one)"
    ref = rmsnorm_oracle(x_expected, w, eps)
    # one rounding to bf16 at the end, on top of fp32 statistics
    err = (y.double() - ref).abs()
    assert not torch.isnan(y).any()
    assert (err <= bf16_ulp(ref) * 0.5 + 4e-6 * ref.abs() + 1e-30).all(), float(err.max())


def test_rmsnorm_residual_bf16_needs_a_residual(ops, gen):
    x = cuda_randn((1, 8), gen)
    w = torch.ones(8, dtype=torch.bfloat16, device="cuda")
    y = nan_like((1, 8), torch.bfloat16)
    with pytest.raises(ValueError, match="residual"):
        ops.rmsnorm_residual(ptr(x), 0, ptr(w), ptr(y), 1, 8, 1e-5, True)


def test_rmsnorm_residual_unaligned_rows_take_the_scalar_path(ops, gen):
    """Offsetting x by one float breaks 16-byte alignment although D % 8 == 0."""
    M, D, eps = 3, 64, 1e-6
    storage = cuda_randn((M * D + 4,), gen)
    x = storage[1:1 + M * D].view(M, D)
    x_before = x.clone()
    w = (1 + cuda_randn((D,), gen, scale=0.1)).to(torch.bfloat16)
    y = nan_like((M, D), torch.bfloat16)
    ops.rmsnorm_residual(ptr(x), 0, ptr(w), ptr(y), M, D, eps)
    ref = rmsnorm_oracle(x_before, w, eps)
    assert ((y.double() - ref).abs() <= bf16_ulp(ref) * 0.5 + 4e-6 * ref.abs()).all()


# ---- rope_kv_append -----------------------------------------------------------------------------

def rope_oracle(v, pos, inv_freq):
    """Rotate-half RoPE of v [..., hd] in float64, the angle taken as the fp32 product."""
    angle = (torch.tensor(float(pos), dtype=torch.float32) * inv_freq.cpu()).double()
    cos, sin = angle.cos(), angle.sin()
    half = v.shape[-1] // 2
    x0, x1 = v[..., :half].double().cpu(), v[..., half:].double().cpu()
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)


def rope_slack(v):
    """What the kernel's fp32 cos / sin (|error| < 1e-6 each, kernel_util.cuh rope_angle) may move
    each rotated output of v [..., hd]: 1e-6 (|x0| + |x1|)."""
    half = v.shape[-1] // 2
    pair = v[..., :half].double().abs().cpu() + v[..., half:].double().abs().cpu()
    return 1e-6 * torch.cat((pair, pair), dim=-1)


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_seq,rope_scaling", [
    (4, 2, 64, 37, None),
    (3, 3, 128, 50, None),
    (6, 2, 6, 9, None),
    (2, 1, 64, 131072, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
])
def test_rope_kv_append(C, ops, rng, gen, n_heads, n_kv_heads, head_dim, max_seq, rope_scaling):
    from llama_brrr.config import ModelConfig
    max_batch, M = 3 if max_seq < 1000 else 1, 3
    config = ModelConfig(dim=64, hidden_dim=64, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads,
                         head_dim=head_dim, vocab_size=16, rope_theta=500000.0,
                         rope_scaling=rope_scaling)
    inv_freq = torch.from_numpy(C.rope_inv_freq(config.engine_dict(max_seq, max_batch))).cuda()
    qkv_dim = (n_heads + 2 * n_kv_heads) * head_dim
    qkv = cuda_randn((M, qkv_dim), gen)
    slots = rng.integers(0, max_batch, size=M).astype(np.int32)
    # Distinct positions, row 0 at the largest angle the cache can hold (two rows writing one
    # cache entry would leave only the last one's k and v there).
    positions = rng.choice(max_seq - 1, size=M, replace=False).astype(np.int32)
    positions[0] = max_seq - 1
    if max_batch > 1:
        slots[:2] = [0, max_batch - 1]
    q_out = nan_like((M, n_heads, head_dim), torch.bfloat16)
    paged = PagedCaches(nan_like((max_batch, max_seq, n_kv_heads, head_dim), torch.bfloat16),
                        nan_like((max_batch, max_seq, n_kv_heads, head_dim), torch.bfloat16))
    d_slots, d_pos = torch.from_numpy(slots).cuda(), torch.from_numpy(positions).cuda()
    ops.rope_kv_append(ptr(qkv), ptr(d_pos), ptr(d_slots), ptr(inv_freq), ptr(q_out), ptr(paged.k),
                       ptr(paged.v), M, n_heads, n_kv_heads, head_dim, max_seq, **paged.kwargs())
    k_cache, v_cache = paged.gather()

    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    written = torch.zeros((max_batch, max_seq), dtype=torch.bool)
    for m in range(M):
        s, p = int(slots[m]), int(positions[m])
        written[s, p] = True
        q_in, k_in = qkv[m, :q_dim].view(n_heads, head_dim), qkv[m, q_dim:q_dim + kv_dim].view(n_kv_heads, head_dim)
        for got, ref, slack in ((q_out[m], rope_oracle(q_in, p, inv_freq), rope_slack(q_in)),
                                (k_cache[s, p], rope_oracle(k_in, p, inv_freq), rope_slack(k_in))):
            got = got.double().cpu()
            # Half a bf16 step of the exact value, widened by what the fp32 angle may be off.
            bound = bf16_ulp(ref) * 0.5 + 1e-6 + slack
            assert ((got - ref).abs() <= bound).all(), float((got - ref).abs().max())
        v_ref = qkv[m, q_dim + kv_dim:].view(n_kv_heads, head_dim).to(torch.bfloat16)
        assert torch.equal(v_cache[s, p], v_ref)
    untouched = ~written.cuda()
    assert torch.isnan(k_cache[untouched].float()).all() and torch.isnan(v_cache[untouched].float()).all()


# ---- init: fill_normal_bf16, convert_f32_to_bf16 ------------------------------------------------

def normal_stream(key, n):
    """The CPU engine's Box-Muller stream (csrc/cpu/engine_cpu.cpp normal_pair), in float64."""
    out = np.empty(n + 1)
    for k in range((n + 1) // 2):
        r1, r2 = splitmix64((key + 2 * k) & MASK64), splitmix64((key + 2 * k + 1) & MASK64)
        u1 = ((r1 >> 11) + 1) * 2.0**-53
        u2 = (r2 >> 11) * 2.0**-53
        radius = math.sqrt(-2.0 * math.log(u1))
        out[2 * k], out[2 * k + 1] = radius * math.cos(2 * math.pi * u2), radius * math.sin(2 * math.pi * u2)
    return out[:n]


@pytest.mark.parametrize("n,mean,std", [(1001, 0.0, 1.0), (4096, 1.0, 0.02), (1, 0.0, 0.5)])
def test_fill_normal_bf16_is_the_cpu_stream(ops, rng, n, mean, std):
    key = int(rng.integers(0, 2**63)) * 2 + 1
    out = torch.full((n + 8,), 12345.0, dtype=torch.bfloat16, device="cuda")
    ops.fill_normal_bf16(ptr(out), n, key, mean, std)
    assert torch.equal(out[n:].float(), torch.full((8,), 12345.0, device="cuda").to(torch.bfloat16).float()), \
        "wrote past n"
    z = normal_stream(key, n)
    expected = torch.from_numpy((mean + std * z).astype(np.float32)).to(torch.bfloat16).double()
    got = out[:n].double().cpu()
    exact = (got == expected).double().mean().item()
    assert exact >= 0.995, f"only {exact:.4f} of the values equal the CPU stream's"
    # The angle is fp32 (init.cu): cos / sin off by up to pi * 2^-23, times a radius of at most 8.6;
    # near zero that is more than a bf16 step (seen: 3.37e-6 for 3.31e-6).
    angle_err = std * 8.6 * math.pi * 2.0**-23
    assert ((got - expected).abs() <= bf16_ulp(expected) * 1.01 + angle_err).all()


def test_fill_normal_bf16_tail_is_finite(ops):
    # Pair 0 of this key has u1 < 2^-26 (found by a search over splitmix64): an fp32 log argument
    # rounds to 0 there. Such pairs come once in ~3e7: every large random model has some.
    key = 149030279
    assert (splitmix64(key) >> 11) < 1 << 27
    out = torch.full((2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    ops.fill_normal_bf16(ptr(out), 2, key, 0.0, 1.0)
    got = out.double().cpu()
    assert torch.isfinite(got).all(), got
    expected = torch.from_numpy(normal_stream(key, 2).astype(np.float32)).to(torch.bfloat16).double()
    assert math.hypot(*expected.tolist()) > 5.5  # the far tail, as the CPU stream draws it
    assert ((got - expected).abs() <= bf16_ulp(expected) * 1.01).all(), (got, expected)


def test_random_model_weights_are_finite(C):
    from llama_brrr import Llama

    # 1.2e9 draws: with the fp32 radius, dozens of inf / NaN weights.
    llm = Llama.random("llama3.2-1b", device="cuda", max_seq_len=64, max_batch=1)
    for name in llm.config.tensor_shapes():
        assert np.isfinite(llm.engine.get_weight(name)).all(), name


def test_fill_normal_bf16_statistics(ops, rng):
    n = 1 << 20
    out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    ops.fill_normal_bf16(ptr(out), n, int(rng.integers(0, 2**63)), 0.0, 1.0)
    x = out.double()
    assert abs(x.mean().item()) < 5 / math.sqrt(n)
    assert abs(x.std().item() - 1) < 0.01
    assert abs(((x.abs() < 1).double().mean().item()) - 0.6827) < 0.005


def test_init_random_key_is_the_cpu_rule(ops, rng):
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))
    for index in (0, 1, 77):
        assert ops.init_random_key(seed, index) == splitmix64(seed ^ splitmix64(index + 1))


def test_convert_f32_to_bf16_rounds_like_torch(ops, gen):
    n = 1003
    src = cuda_randn((n,), gen, scale=100.0)
    src[:6] = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.5, -0.0, 3.4e38])
    src[6:12] = torch.tensor([1.00390625, 1.01171875, -1.00390625, 65504.5, 2.0**-126, 1.0 + 2**-8 + 2**-20])
    dst = nan_like((n,), torch.bfloat16)
    ops.convert_f32_to_bf16(ptr(src), ptr(dst), n)
    expected = src.to(torch.bfloat16)
    same = (dst.view(torch.int16) == expected.view(torch.int16)) | (torch.isnan(dst) & torch.isnan(expected))
    assert same.all(), src[~same][:5]


# ---- allreduce.cu: add_bf16_into_f32 ----------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 4 * 1001, 8 * 40961])  # one step, an odd count of steps, a grid-stride loop
def test_add_bf16_into_f32_is_the_fp32_sum(ops, gen, n):
    partial = cuda_randn((n,), gen, dtype=torch.bfloat16, scale=3.0)
    x = cuda_randn((n + 8,), gen, scale=50.0)
    x[n:] = float("nan")  # past count: must stay untouched
    before = x.clone()
    ops.add_bf16_into_f32(ptr(partial), ptr(x), n)
    expected = before[:n] + partial.float()  # fp32 add, round to nearest even, as the kernel's
    assert torch.equal(x[:n], expected)
    assert torch.isnan(x[n:]).all(), "wrote past count"


def test_add_bf16_into_f32_refuses_what_it_cannot_take(ops, gen):
    partial = cuda_randn((16,), gen, dtype=torch.bfloat16)
    x = cuda_randn((16,), gen)
    with pytest.raises(Exception, match="multiple of 4"):
        ops.add_bf16_into_f32(ptr(partial), ptr(x), 6)
    with pytest.raises(Exception, match="16-byte aligned"):
        ops.add_bf16_into_f32(ptr(partial) + 2, ptr(x), 4)
    ops.add_bf16_into_f32(ptr(partial), ptr(x), 16)  # the stream goes on


# ---- sample_tokens ------------------------------------------------------------------------------

class Sampler:
    """Runs ops.sample_tokens on host logits [B, V] with one history row per slot."""

    def __init__(self, ops, logits: np.ndarray, history: np.ndarray | None = None,
                 positions: np.ndarray | None = None):
        self.ops = ops
        self.B, self.V = logits.shape
        self.logits = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)).cuda()
        if history is None:
            history = np.full((self.B, 1), -1, dtype=np.int32)
        self.max_seq = history.shape[1]
        self.history = torch.from_numpy(np.ascontiguousarray(history, dtype=np.int32)).cuda()
        self.slots = torch.arange(self.B, dtype=torch.int32, device="cuda")
        if positions is None:
            positions = np.full(self.B, self.max_seq - 1, dtype=np.int32)
        self.positions = torch.from_numpy(positions.astype(np.int32)).cuda()

    def __call__(self, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, seed=0, step=0):
        params = uniform_rows(self.B, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=penalty, seed=seed)
        steps = np.ascontiguousarray(np.broadcast_to(np.asarray(step, dtype=np.uint64), (self.B,)))
        return self.ops.sample_tokens(ptr(self.logits), ptr(self.history), ptr(self.slots),
                                      ptr(self.positions), params, steps, self.V, self.max_seq)


def log_softmax64(logits):
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("V", [7, 1000, 49152, 128256])
def test_greedy_is_first_argmax_and_logprob_is_log_softmax(ops, rng, V):
    B = 4
    logits = (rng.standard_normal((B, V)) * 4).astype(np.float32)
    logits[1] = np.round(logits[1])  # many ties: the lowest index must win
    logits[2, : V // 2] = logits[2].max()
    tokens, logprobs = Sampler(ops, logits)(temperature=0.0)
    np.testing.assert_array_equal(tokens, logits.argmax(-1))
    expected = log_softmax64(logits)[np.arange(B), tokens]
    np.testing.assert_allclose(logprobs, expected, rtol=1e-5, atol=1e-5)


def test_top_k_1_is_greedy(ops, rng):
    logits = (rng.standard_normal((8, 5003)) * 2).astype(np.float32)
    sample = Sampler(ops, logits)
    greedy, _ = sample(temperature=0.0)
    for step in range(5):
        tokens, _ = sample(temperature=0.8, top_k=1, seed=123, step=step)
        np.testing.assert_array_equal(tokens, greedy)


def test_seeded_sampling_is_reproducible_and_steps_differ(ops, rng):
    logits = rng.standard_normal((16, 3000)).astype(np.float32)
    sample = Sampler(ops, logits)
    a, _ = sample(temperature=1.0, top_p=0.95, seed=42, step=7)
    b, _ = sample(temperature=1.0, top_p=0.95, seed=42, step=7)
    c, _ = sample(temperature=1.0, top_p=0.95, seed=42, step=8)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any(), "a flat distribution drew 16 identical tokens at another step"


def test_sampled_frequencies_follow_the_distribution(ops, rng):
    """The draw itself: T=1 over 5 tokens, 64 rows x 60 steps = 3840 draws vs softmax."""
    V, B = 5, 64
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0], dtype=np.float32)
    sample = Sampler(ops, np.tile(row, (B, 1)))
    seed = int(rng.integers(0, 2**63))
    counts = np.zeros(V)
    for step in range(60):
        tokens, _ = sample(temperature=1.0, seed=seed, step=np.arange(B) + B * step)
        counts += np.bincount(tokens, minlength=V)
    p = np.exp(row - row.max())
    p /= p.sum()
    n = counts.sum()
    z = (counts - n * p) / np.sqrt(n * p * (1 - p))
    assert np.abs(z).max() < 5, (counts / n, p)


def test_repetition_penalty(ops, C):
    """Applied to each distinct history token once, only up to the row's position, HF's rule
    (divide positive logits, multiply negative ones), identically to the CPU sampler."""
    V, S = 100, 12

    def greedy(logits, history, position, penalty):
        sample = Sampler(ops, logits[None], history[None], positions=np.array([position]))
        tokens, logprobs = sample(temperature=0.0, penalty=penalty)
        cpu_token, cpu_lp = C.cpu_ops.sample_row(logits, history[: position + 1], 0.0, 0, 1.0, 0.0,
                                                 penalty, 0, 0)
        assert tokens[0] == cpu_token and abs(logprobs[0] - cpu_lp) < 1e-5
        return tokens[0]

    logits = np.zeros(V, dtype=np.float32)
    logits[[10, 20]] = [5.0, 4.0]
    history = np.full(S, -1, dtype=np.int32)
    history[:6] = [10, 10, 10, 30, 55, 10]
    assert greedy(logits, history, 5, 1.0) == 10
    assert greedy(logits, history, 5, 2.0) == 20   # 5 / 2 < 4
    assert greedy(logits, history, 5, 1.2) == 10   # 5 / 1.2 > 4: once, not 5 / 1.2^4

    history[:6] = [30, 30, 30, 10, 55, 10]
    assert greedy(logits, history, 2, 2.0) == 10   # 10 sits after the row's position
    assert greedy(logits, history, 3, 2.0) == 20

    logits = np.full(V, -5.0, dtype=np.float32)
    logits[[20, 30]] = [-0.5, -1.0]
    assert greedy(logits, history, 5, 1.0) == 20
    assert greedy(logits, history, 5, 0.1) == 30   # -1 * 0.1 > -0.5


def test_greedy_penalty_across_row_slices(ops, C):
    """The greedy pass is split over ~2048-logit slices of the row (5 slices of 2002 here):
    penalized history tokens in several slices, the winner in another, an exact tie across a
    slice boundary (the lower index wins), a NaN row (index 0, as the CPU scan keeps it), all
    against the CPU sampler."""
    V, S = 10_007, 8
    logits = np.zeros((3, V), dtype=np.float32)
    logits[0, [5, 4100, 8001]] = [9.0, 8.0, 7.5]      # 5 and 8001 penalized below 4100
    logits[1, [2001, 2002, 9999]] = [6.0, 6.0, 6.0]   # a tie across the boundary of slices 0 and 1
    logits[2] = np.nan
    history = np.full((3, S), -1, dtype=np.int32)
    history[0, :3] = [5, 8001, 5]
    history[1, :2] = [9999, 3]
    positions = np.array([2, 1, 0], dtype=np.int32)
    tokens, logprobs = Sampler(ops, logits, history, positions)(temperature=0.0, penalty=2.0)
    for b in range(3):
        cpu_token, cpu_lp = C.cpu_ops.sample_row(logits[b], history[b, : positions[b] + 1], 0.0, 0,
                                                 1.0, 0.0, 2.0, 0, 0)
        assert tokens[b] == cpu_token, b
        if b < 2:
            assert abs(logprobs[b] - cpu_lp) <= 1e-5 * max(1.0, abs(cpu_lp)), b
    assert list(tokens) == [4100, 2001, 0]


SAMPLING_CASES = [
    dict(temperature=0.0),
    dict(temperature=0.0, penalty=1.3),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=40),
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=1.3, top_k=200, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02, penalty=1.2),
    dict(temperature=1.0, top_k=3),
    dict(temperature=2.0, top_p=0.3),
]


@pytest.mark.parametrize("V", [1000, 32000, 128256])
def test_gpu_sampler_matches_the_cpu_sampler(ops, C, rng, V):
    """200 draws per vocabulary size over every filter combination: the same (seed, step) must pick
    the same token as _C.cpu_ops.sample_row — always for greedy, in >= 99% of sampled draws (the
    two sum masses in a different order, which may move a boundary by one token in rare cases)."""
    B, S = 10, 40
    greedy_total = sampled_total = sampled_equal = 0
    for round_ in range(2):
        logits = (rng.standard_normal((B, V)) * rng.choice([1.0, 3.0, 8.0])).astype(np.float32)
        logits[B // 2] = np.round(logits[B // 2])  # ties
        history = rng.integers(-1, V, size=(B, S)).astype(np.int32)
        positions = rng.integers(0, S, size=B).astype(np.int32)
        sample = Sampler(ops, logits, history, positions)
        for case in SAMPLING_CASES:
            seed = int(rng.integers(0, 2**63))
            steps = rng.integers(0, 10_000, size=B).astype(np.uint64)
            tokens, logprobs = sample(seed=seed, step=steps, **case)
            for b in range(B):
                cpu_token, cpu_lp = C.cpu_ops.sample_row(
                    logits[b], history[b, : positions[b] + 1], case.get("temperature", 0.0),
                    case.get("top_k", 0), case.get("top_p", 1.0), case.get("min_p", 0.0),
                    case.get("penalty", 1.0), seed, int(steps[b]))
                assert 0 <= tokens[b] < V
                if case["temperature"] == 0.0:
                    greedy_total += 1
                    assert tokens[b] == cpu_token, (case, b)
                else:
                    sampled_total += 1
                    sampled_equal += tokens[b] == cpu_token
                if tokens[b] == cpu_token:
                    assert abs(logprobs[b] - cpu_lp) <= 1e-5 * max(1.0, abs(cpu_lp)), (case, b)
    assert greedy_total == 40 and sampled_total == 160
    assert sampled_equal >= 0.99 * sampled_total, f"{sampled_equal}/{sampled_total} draws agree"


def test_sample_tokens_rejects_bad_parameters(ops):
    sample = Sampler(ops, np.zeros((1, 10), dtype=np.float32))
    with pytest.raises(ValueError, match="top_p"):
        sample(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sample(temperature=-1.0)
