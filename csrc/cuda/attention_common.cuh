// attention_common.cuh — what the decode and prefill attention files share: the softmax scale,
// the shape checks, and the prefill kernels' arguments, tile size and grid order (the sm80 and
// sm90 prefill kernels run the same grid: a CTA owns 128 queries of one head).
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

// Scores are scaled by log2(e) / sqrt(hd) so the softmax runs on exp2.
inline constexpr float kLog2e = 1.4426950408889634f;

inline void check_attention_shapes(const char* op, int n_heads, int n_kv_heads, int head_dim, int max_seq) {
    BRRR_CHECK(head_dim == 64 || head_dim == 128,
               op << ": head_dim must be 64 or 128 on the GPU, got " << head_dim);
    BRRR_CHECK(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0,
               op << ": n_heads (" << n_heads << ") must be a positive multiple of n_kv_heads ("
                  << n_kv_heads << ")");
    BRRR_CHECK(n_heads <= 65535, op << ": n_heads=" << n_heads << " exceeds the grid limit 65535");
    BRRR_CHECK(max_seq >= 1, op << ": max_seq must be >= 1, got " << max_seq);
}

// ---- prefill: one grid for both kernels ------------------------------------------------------

constexpr int kPreWarps = 4;
constexpr int kPreTiles = 2;                          // 16-row m-tiles per warp (sm80 kernel)
constexpr int kPreRows = 16 * kPreTiles * kPreWarps;  // queries per CTA: 128
constexpr int kPreThreads = 32 * kPreWarps;

struct PrefillArgs {
    const bf16* q;
    KvCache kv;
    bf16* out;
    int slot, start_pos, T, n_heads, n_kv_heads, group;
    float scale_log2;
    bool heads_fast;  // grid x = head, y = query tile (else x = query tile, y = head)
    // A batched launch (sm80 kernel only): grid z = segment; each CTA takes q, out, slot,
    // start_pos and T from its segment, and the query tiles past its T exit. Else null.
    const PrefillSegment* segments;
};

// The kernel's arguments, with the grid order the launcher picks (see heads_fast).
inline PrefillArgs prefill_args(const bf16* q, const KvCache& kv, int slot, int start_pos, int T, bf16* out,
                                int n_heads, int n_kv_heads, int head_dim) {
    PrefillArgs a{};
    a.q = q;
    a.kv = kv;
    a.out = out;
    a.slot = slot;
    a.start_pos = start_pos;
    a.T = T;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.group = n_heads / n_kv_heads;
    a.scale_log2 = kLog2e / std::sqrt((float)head_dim);
    // Heads fastest puts every head's longest query tiles in the first wave (the short ones fill
    // the tail), unless the K/V the first wave reads, every KV head's whole sequence, would not
    // fit in L2; then one head's tiles run together, sharing their K/V (docs/kernels/attention.md).
    const size_t kv_bytes = (size_t)n_kv_heads * (start_pos + T) * head_dim * 2 * sizeof(uint16_t);
    const int q_tiles = CEIL_DIV(T, kPreRows);
    a.heads_fast = kv_bytes <= (size_t)device_facts().l2_bytes && q_tiles <= 65535;  // grid y limit
    return a;
}

inline dim3 prefill_grid(const PrefillArgs& a) {
    const int q_tiles = CEIL_DIV(a.T, kPreRows);
    return a.heads_fast ? dim3(a.n_heads, q_tiles) : dim3(q_tiles, a.n_heads);
}

// The checks both entry points make; false when there is nothing to do (T = 0).
// The block table, on both sides: the kernels read it on the device; positions must be covered.
inline void check_kv_cache(const char* op, const KvCache& kv) {
    BRRR_CHECK(kv.k && kv.v && kv.pages.table, op << ": the k and v caches and their block table must be device pointers");
    BRRR_CHECK(kv.n_blocks >= 1, op << ": the KV pool has no blocks (n_blocks=" << kv.n_blocks << ")");
    BRRR_CHECK(util::aligned_to(kv.k, 16) && util::aligned_to(kv.v, 16),
               op << ": the k and v caches must be 16-byte aligned (rows are read 16 bytes at a time)");
    BRRR_CHECK(kv.pages.block_size >= 16 && kv.pages.block_size <= 128 &&
                   (kv.pages.block_size & (kv.pages.block_size - 1)) == 0 &&
                   (int64_t)kv.pages.blocks_per_seq * kv.pages.block_size >= kv.max_seq,
               op << ": the block table must cover max_seq=" << kv.max_seq << " positions in blocks of 16, 32, 64 "
                     "or 128; got " << kv.pages.blocks_per_seq << " blocks of " << kv.pages.block_size);
}

// Every position in [0, end) of `slot` has a block of the pool (slot_blocks: its row, on the host).
inline void check_slot_blocks(const char* op, const KvCache& kv, const int32_t* slot_blocks, int slot, int end) {
    BRRR_CHECK(slot_blocks, op << ": slot_blocks (the slot's table row, on the host) is null");
    const int B = kv.pages.block_size;
    for (int b = 0; b < CEIL_DIV(end, B); ++b)
        BRRR_CHECK(slot_blocks[b] >= 0 && slot_blocks[b] < kv.n_blocks,
                   op << ": slot " << slot << " has no KV block for positions [" << b * B << ", " << (b + 1) * B
                      << ") (table entry " << slot_blocks[b] << ", pool of " << kv.n_blocks << ")");
}

inline bool check_prefill(const char* op, const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot,
                          int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim) {
    const int max_seq = kv.max_seq;
    check_attention_shapes(op, n_heads, n_kv_heads, head_dim, max_seq);
    check_kv_cache(op, kv);
    BRRR_CHECK(T >= 0 && start_pos >= 0 && (int64_t)start_pos + T <= max_seq,
               op << ": tokens [start_pos, start_pos + T) = [" << start_pos << ", " << (int64_t)start_pos + T
                  << ") must lie in the cache of max_seq=" << max_seq);
    BRRR_CHECK(slot >= 0, op << ": slot must be >= 0, got " << slot);
    BRRR_CHECK(q && out, op << ": q and out must be device pointers");
    BRRR_CHECK(util::aligned_to(q, 16), op << ": q must be 16-byte aligned");
    BRRR_CHECK(util::aligned_to(out, 4), op << ": out must be 4-byte aligned");
    if (T == 0) return false;
    check_slot_blocks(op, kv, slot_blocks, slot, start_pos + T);
    return true;
}

// The mma.sync prefill on any GPU from sm_80 (attention_prefill_sm80.cu); attention_prefill falls
// back to it where the sm90 kernel does not run.
void launch_prefill_mma_sync(const PrefillArgs& a, dim3 grid, int head_dim, cudaStream_t stream);

}  // namespace cuda
}  // namespace brrr
