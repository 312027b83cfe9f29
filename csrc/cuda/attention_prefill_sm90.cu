// attention_prefill_sm90.cu — causal prefill attention on Hopper: FlashAttention-3's layout, TMA
// feeding warpgroup MMA; and attention_prefill(), which takes it where it runs (Hopper and an
// sm_90a build) and the mma.sync kernel (attention_prefill_sm80.cu) elsewhere.
//
//   Shapes, causality and the grid as in attention_prefill_sm80.cu: a CTA owns 128 queries of one
//   head; q [T, Hq, hd], the paged caches (ops.h KvCache), out [T, Hq * hd], all bf16.
//
// 384 threads: warpgroup 0 produces, warpgroups 1 and 2 consume 64 query rows each. One producer
// thread issues the TMA copies of Q (once) and of each 128-position tile's K and V into a ring of
// kSm90Stages slots; slot s has a `full` mbarrier that completes when its bytes have landed and an
// `empty` one that completes when the 8 consumer warps have released it. Tiles live in shared
// memory as TMA's 128-byte swizzle writes them: 64-wide column blocks of 128 rows x 128 bytes.
// Per tile a consumer warpgroup runs
//   S = Q K^T    wgmma m64n128k16 x hd/16 k-steps, Q and K K-major from shared memory
//   softmax      online, fp32, on the S accumulators (a row lives in the 4 threads of a quad)
//   O += P V     wgmma m64n{hd}k16 x 8 k-steps, P from registers (the S accumulators of positions
//                16j..16j+15 are k-step j's A fragment), V MN-major from shared memory
// and the two consumers never wait for each other, so one's softmax overlaps the other's MMAs.
// Paging: a K/V tile is 128 / block_size boxes, one per cache block, each at the row the block
// table names; the block that holds the last filled position (and any past it) comes through a
// tail map made on the host for this launch, which ends at that position.
// Invariants: TMA zero-fills the rows past T and past the filled cache (the Q and tail maps end
// there), so nothing outside is read and masked positions meet zeros, not stale NaNs; a warpgroup releases
// the tiles past its last row unread; no wgmma is issued under a condition (ptxas would
// serialize them all).
// Kernel: attention_prefill_sm90.cuh. Measured alternatives: docs/kernels/attention.md.
#include "cuda/attention_prefill_sm90.cuh"

namespace brrr {
namespace cuda {

void attention_prefill(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos,
                       int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    if (!check_prefill("attention_prefill", q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads,
                       head_dim))
        return;
    const PrefillArgs a = prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    const int pool_rows = kv.n_blocks * kv.pages.block_size;
    // The TMA kernel reads bf16 tiles; an e4m3 cache takes the mma.sync kernel, which widens its tiles.
    if (!prefill_sm90_ready() || kv.fp8) {
        launch_prefill_mma_sync(a, prefill_grid(a), head_dim, stream);
    } else if (head_dim == 64) {
        launch_prefill_sm90<64>(a, slot_blocks, pool_rows, prefill_grid(a), stream);
    } else {
        launch_prefill_sm90<128>(a, slot_blocks, pool_rows, prefill_grid(a), stream);
    }
}

}  // namespace cuda
}  // namespace brrr
