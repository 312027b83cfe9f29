// attention_decode.cu — flash_decode: causal attention of one new token per sequence over its
// KV cache (bf16, or e4m3 bytes: half the bytes), fp32 softmax statistics. Memory-bound: the KV
// bytes are the cost.
//
//   q [B, Hq, hd] bf16; one layer's paged cache kv (ops.h KvCache: k, v [n_blocks * block_size]
//   [Hkv][hd] bf16 or e4m3, position p of slot s at row kv.pages.row(s, p)); out [B, Hq * hd] bf16.
//   Sequence b sees cache positions [0, positions[b]] of slot slots[b].
//   GQA: query head h reads KV head h / (Hq / Hkv). Scores are scaled by log2(e) / sqrt(hd).
//
// Grid (split, KV head x head block, sequence), one launch. A CTA owns one chunk of ONE KV head's
// positions and serves every query head of that group from it, so each K/V byte is read once per
// token, not once per query head. Inside a CTA each warp owns its own rows: it loads them straight
// into registers (8 elements a lane, hd / 8 lanes to a row; e4m3 widened to bf16 there, exactly),
// scores them for every head of the group, sums each dot product over the row's lanes with a
// transposing butterfly and keeps its own online softmax; the warps are combined once, at the
// end, through shared memory. No shared-memory tile and no CTA barrier per step.
// Splits: positions live on the device (CUDA-graph replay), so the grid is fixed from the shapes
// (tuning::kDecodeCtasPerSm CTAs per SM, one wave) and each CTA decides on the device how many
// splits its sequence needs: chunks of at least tuning::kDecodeMinChunk positions, so a short
// context runs as one chunk per KV head and writes its output directly; CTAs past the last chunk
// exit at once. With several chunks each writes (max, sum, unnormalized acc[hd]) to scratch,
// counts itself in with one acq_rel atomic on its (sequence, head block) counter, and the last to
// arrive merges them (merge_splits: the first splits' acc values load while a warp per head
// computes the split weights, one L2 round trip) and re-arms the counter.
// Two kernels, one grid and one end (finish_cta), picked by the launcher from the shapes:
//   - registers (small batches, flash_decode_kernel): as above; each lane loads its next step's
//     rows straight into registers, the first rows before the PDL wait, so a short context's loads
//     overlap the kernel before;
//   - tensor cores (serving batches, flash_decode_mma_kernel; from tuning::kDecodeMmaMinCtas
//     one-split CTAs on, kDecodeMmaMinCtasFp8 with an e4m3 cache): a warp takes 16 positions a
//     step through a cp.async ring of K/V tiles in shared memory (4 tiles where the grid still
//     fits the same waves, else 2), S = Q K^T and P V on mma.sync with the group's heads as the
//     A rows (an e4m3 cache stays bytes in shared memory; ldmatrix reads them and each lane
//     widens its fragments to fp16 in registers, one instruction a pair, for fp16 MMAs). At serving batches the CUDA-core kernel's per-position work (dot products,
//     butterflies, shuffles) binds beside the copy rate already in bf16, and an e4m3 cache halves
//     only the bytes.
// Invariants: scratch per sequence is [counters Hq int32 | (max, sum) Hq x max_splits x 2 | acc Hq
// x max_splits x hd]; the counters are zero before the first call and every call leaves them zero.
// Launched with PDL: before its wait a CTA reads positions and slots and loads its first rows, all
// written two or more kernels back; q and this token's K/V row come after the wait. The next
// kernel (wo) may launch once past the wait, except from tuning::kDecodeLateTriggerHeadDim on,
// where it launches only as the CTAs exit unless the caller asks for early_trigger: the early
// launch costs a bf16 wo GEMV at hd 128 and pays before a quantized one (tuning.h).
// Kernel and launch: attention_decode.cuh. Measured alternatives: docs/kernels/attention.md.
#include "cuda/attention_decode.cuh"

namespace brrr {
namespace cuda {

size_t flash_decode_scratch_floats(int B, int n_heads, int head_dim, int max_splits) {
    BRRR_CHECK(B >= 0 && n_heads >= 0 && head_dim >= 0 && max_splits >= 1,
               "flash_decode_scratch_floats: bad sizes B=" << B << " n_heads=" << n_heads
                                                           << " head_dim=" << head_dim
                                                           << " max_splits=" << max_splits);
    return (size_t)B * decode_seq_floats(n_heads, head_dim, max_splits);
}

void flash_decode(const bf16* q, const KvCache& kv, const int* slots, const int* positions, bf16* out,
                  float* scratch, int B, int n_heads, int n_kv_heads, int head_dim, int max_splits,
                  bool early_trigger, cudaStream_t stream) {
    check_attention_shapes("flash_decode", n_heads, n_kv_heads, head_dim, kv.max_seq);
    check_kv_cache("flash_decode", kv);
    BRRR_CHECK(B >= 0 && B <= 65535, "flash_decode: batch B=" << B << " must be in [0, 65535]");
    BRRR_CHECK(max_splits >= 1, "flash_decode: max_splits must be >= 1, got " << max_splits);
    BRRR_CHECK(q && slots && positions && out, "flash_decode: q, slots, positions and out must be device pointers");
    BRRR_CHECK(util::aligned_to(q, 16), "flash_decode: q must be 16-byte aligned (rows are read 16 bytes a lane)");
    BRRR_CHECK(util::aligned_to(out, 2) && util::aligned_to(slots, 4) && util::aligned_to(positions, 4),
               "flash_decode: out (bf16) or slots/positions (int32) are misaligned");
    BRRR_CHECK(max_splits == 1 || scratch != nullptr,
               "flash_decode: max_splits=" << max_splits << " needs the scratch of "
                                           << "flash_decode_scratch_floats(); got null");
    if (B == 0) return;

    launch_flash_decode(decode_args(q, kv, slots, positions, out, scratch, B, n_heads, n_kv_heads, head_dim,
                                    max_splits, early_trigger),
                        B, head_dim, stream);
}

}  // namespace cuda
}  // namespace brrr
