// attention_prefill_sm80.cu — causal prefill attention on mma.sync (FlashAttention-2 form), the
// path of every GPU from sm_80, and of Hopper builds without sm_90a.
//
//   T new tokens of one sequence (slot), their K/V already in the cache at start_pos..; q [T, Hq,
//   hd] bf16, the layer's paged cache (ops.h KvCache), out [T, Hq * hd] bf16. Query t sees cache
//   positions [0, start_pos + t]; GQA as in decode; fp32 online softmax on exp2. K/V rows are
//   fetched one by one (cp.async), so each goes through the block table.
//
// Grid: a CTA owns 128 queries of one head (prefill_grid, attention_common.cuh); the longest query
// tiles go first, heads fastest while the K/V the first wave reads fits in L2.
// Trick: 4 warps x 32 rows, two 16-row m-tiles per warp, so each K or V fragment read from shared
// memory (ldmatrix) feeds four mma.sync m16n8k16 instead of two: with one m-tile per warp shared
// memory, not the tensor cores, binds. K/V tiles of 64 positions (32 at hd 128 where a CTA may not
// have 104 KB) are double-buffered in shared memory by cp.async; P goes from the S accumulators
// to the A operand of the second mma in registers (the two layouts coincide).
// Invariants: T x T scores never exist. Tiles above the diagonal are never loaded, a warp skips the
// tiles wholly above its own rows, and the softmax scale is applied in the exponent's FFMA.
// Kernel: attention_prefill_sm80.cuh. Measured alternatives: docs/kernels/attention.md.
#include "cuda/attention_prefill_sm80.cuh"

namespace brrr {
namespace cuda {

void launch_prefill_mma_sync(const PrefillArgs& a, int head_dim, cudaStream_t stream) {
    const dim3 grid = prefill_grid(a);
    const bool kv64_fits = prefill_smem_bytes<128, 64>() <= (size_t)device_facts().smem_optin;
    if (head_dim == 64) launch_prefill<64, 64>(a, grid, stream);
    else if (kv64_fits) launch_prefill<128, 64>(a, grid, stream);
    else launch_prefill<128, 32>(a, grid, stream);
}

void attention_prefill_mma_sync(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot,
                                int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                                cudaStream_t stream) {
    if (!check_prefill("attention_prefill_mma_sync", q, kv, slot_blocks, slot, start_pos, T, out, n_heads,
                       n_kv_heads, head_dim))
        return;
    launch_prefill_mma_sync(prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim), head_dim,
                            stream);
}

}  // namespace cuda
}  // namespace brrr
