// attention_prefill_sm80.cu — causal prefill attention on mma.sync (FlashAttention-2 form), the
// path of every GPU from sm_80, and of Hopper builds without sm_90a.
//
//   T new tokens of one sequence (slot), their K/V already in the cache at start_pos..; q [T, Hq,
//   hd] bf16, the layer's paged cache (ops.h KvCache), out [T, Hq * hd] bf16. Query t sees cache
//   positions [0, start_pos + t]; GQA as in decode; fp32 online softmax on exp2. K/V rows are
//   fetched one by one (cp.async), so each goes through the block table.
//
// Grid: a CTA owns 128 queries of one head (prefill_grid, attention_common.cuh); the longest query
// tiles go first, heads fastest while the K/V the first wave reads fits in L2. A batched launch
// (attention_prefill_segments) adds z = segment, each CTA reading its segment's rows, slot and
// positions from a device table: the short prompt tails of a serving step (a cached prefix, then
// ~100 new tokens) fill the GPU in one launch instead of one launch of n_heads CTAs each.
// Trick: 4 warps x 32 rows, two 16-row m-tiles per warp, so each K or V fragment read from shared
// memory (ldmatrix) feeds four mma.sync m16n8k16 instead of two: with one m-tile per warp shared
// memory, not the tensor cores, binds. K/V tiles of 64 positions (32 at hd 128 where a CTA may not
// have 104 KB) are double-buffered in shared memory by cp.async; P goes from the S accumulators
// to the A operand of the second mma in registers (the two layouts coincide). An e4m3 cache
// (kv.fp8) is copied as bytes into a staging area and widened into the same bf16 tiles by the
// threads that copied them, so the MMAs are the same; attention_prefill sends such caches here.
// Invariants: T x T scores never exist. Tiles above the diagonal are never loaded, a warp skips the
// tiles wholly above its own rows, and the softmax scale is applied in the exponent's FFMA.
// Kernel: attention_prefill_sm80.cuh. Measured alternatives: docs/kernels/attention.md.
#include "cuda/attention_prefill_sm80.cuh"

namespace brrr {
namespace cuda {

namespace {

template <bool FP8>
void launch_for_cache(const PrefillArgs& a, dim3 grid, int head_dim, cudaStream_t stream) {
    const bool kv64_fits = prefill_smem_bytes<128, 64, FP8>() <= (size_t)device_facts().smem_optin;
    if (head_dim == 64) launch_prefill<64, 64, FP8>(a, grid, stream);
    else if (kv64_fits) launch_prefill<128, 64, FP8>(a, grid, stream);
    else launch_prefill<128, 32, FP8>(a, grid, stream);
}

}  // namespace

void launch_prefill_mma_sync(const PrefillArgs& a, dim3 grid, int head_dim, cudaStream_t stream) {
    if (a.kv.fp8) launch_for_cache<true>(a, grid, head_dim, stream);
    else launch_for_cache<false>(a, grid, head_dim, stream);
}

void attention_prefill_mma_sync(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot,
                                int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                                cudaStream_t stream) {
    if (!check_prefill("attention_prefill_mma_sync", q, kv, slot_blocks, slot, start_pos, T, out, n_heads,
                       n_kv_heads, head_dim))
        return;
    const PrefillArgs a = prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    launch_prefill_mma_sync(a, prefill_grid(a), head_dim, stream);
}

void attention_prefill_segments(const bf16* q, const KvCache& kv, const PrefillSegment* segments,
                                const PrefillSegment* host_segments, const int32_t* host_tables, int n_segments,
                                bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    const char* op = "attention_prefill_segments";
    check_attention_shapes(op, n_heads, n_kv_heads, head_dim, kv.max_seq);
    check_kv_cache(op, kv);
    BRRR_CHECK_ARG(n_segments >= 0 && n_segments <= 65535, op << ": " << n_segments << " segments (at most 65535)");
    if (n_segments == 0) return;
    BRRR_CHECK(q && out && segments && host_segments && host_tables,
               op << ": q, out, segments, host_segments and host_tables must be non-null");
    BRRR_CHECK(util::aligned_to(q, 16) && util::aligned_to(out, 4), op << ": q must be 16-byte, out 4-byte aligned");
    int max_rows = 0;
    for (int i = 0; i < n_segments; ++i) {
        const PrefillSegment& s = host_segments[i];
        BRRR_CHECK_ARG(s.rows >= 1 && s.row0 >= 0 && s.slot >= 0 && s.start_pos >= 0 &&
                           (int64_t)s.start_pos + s.rows <= kv.max_seq,
                       op << ": segment " << i << " (rows " << s.rows << " from row " << s.row0 << ", slot "
                          << s.slot << ", positions from " << s.start_pos
                          << ") must have rows >= 1 inside the cache of max_seq=" << kv.max_seq);
        check_slot_blocks(op, kv, host_tables + (size_t)s.slot * kv.pages.blocks_per_seq, s.slot,
                          s.start_pos + s.rows);
        max_rows = std::max(max_rows, s.rows);
    }
    PrefillArgs a = prefill_args(q, kv, 0, 0, max_rows, out, n_heads, n_kv_heads, head_dim);
    a.segments = segments;
    a.heads_fast = true;
    launch_prefill_mma_sync(a, dim3(n_heads, CEIL_DIV(max_rows, kPreRows), n_segments), head_dim, stream);
}

}  // namespace cuda
}  // namespace brrr
