// matmul.cu — the entry points of every matmul: which kernel a call runs, chosen by shape.
//
//   matmul_bf16: M <= kGemvMaxRows rows go to the GEMV (gemv.cu, memory-bound: each weight byte
//                streamed once), more to gemm_bf16 (compute-bound tiles on tensor cores).
//   gemm_bf16:   the wgmma GEMM (gemm_sm90.cu) on a Hopper device with an sm_90a image when TMA can
//                describe x and W (K % 8 == 0, 16-byte aligned), else the mma.sync GEMM
//                (gemm_sm80.cu). RopeKV is fused on Hopper for head_dim 64 / 128 with 4-byte
//                aligned destinations; otherwise q|k|v is staged in args.out_f32 and
//                rope_kv_append (rope.cu) finishes.
//   gemm_quant:  the same wgmma GEMM on quantized weights, dequantized tile by tile by its
//                consumer warpgroups (gemm_sm90_dequant.cuh); Hopper only (the engine dequantizes
//                into bf16 scratch for gemm_bf16 elsewhere).
//
// Split-K (Hopper only, and only with the scratch the caller lends in EpilogueArgs::split): when
// even 128-column tiles leave more than half of the SMs idle (M up to ~128 on the Llama
// projections: short prompts, the last chunk of a long one, batches of 17-64 sequences), K is
// split, at most as far as one wave of work items. Then one SM's bytes bound the time: a split
// streams its k slices (slice_bytes of x and W each) and writes its partials, and the last one
// also reads every split's partials back (128 x 4 bytes a tile row, rows past M skipped by whole
// 8-row groups). The split count with the fewest such bytes wins (e.g. 4 for the 1B wo at
// M = 128, K = 2048; 8 for its w2, K = 8192).
// Invariants: gemm_split_scratch_* size the scratch so that any split this model picks fits;
// the split counters are left zero by every call.
#include <algorithm>
#include <string>

#include "cuda/check.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/ops.h"
#include "cuda/qlayout.h"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

// Bytes of x and W one k slice of a tile_rows x 128 split-K tile streams: (tile_rows + 128) rows
// x 64 bf16.
long long slice_bytes(int tile_rows) { return (long long)(tile_rows + sm90::kSplitTileCols) * sm90::kBK * 2; }

// The fused RopeKV epilogue: head_dim 64 or 128 (tiles of whole heads), and destinations that
// take 4-byte bf16 pairs. Anything else stages q|k|v in fp32 and runs rope_kv_append.
bool rope_fusable(const GemmArgs& p) {
    const RopeKVArgs& r = p.out.rope;
    return (r.head_dim == 64 || r.head_dim == 128) && util::aligned_to(r.q_out, 4) &&
           util::aligned_to(r.kv.k, 4) && util::aligned_to(r.kv.v, 4);
}

// The split count of p for tiles of tile_rows rows by the byte model above; 1 (no split) without
// scratch.
int split_count(const GemmArgs& p, int sm_count, int tile_rows = sm90::kBM) {
    const SplitKScratch& sc = p.out.split;
    if (sc.partials == nullptr || sc.counters == nullptr) return 1;
    const int out_per_col = p.ep == Epilogue::SwiGLU ? 2 : 1;
    const long long tiles = (long long)CEIL_DIV(p.M, tile_rows) * CEIL_DIV(p.width, sm90::kSplitTileCols / out_per_col);
    const int k_tiles = CEIL_DIV(p.K, sm90::kBK);
    if (2 * tiles > sm_count || tiles > sc.n_counters) return 1;
    const long long rows = std::min<long long>(tile_rows, CEIL_DIV(p.M, 8) * 8);  // of the fullest tile
    auto bytes = [&](long long splits) {
        const long long partials = splits > 1 ? (splits + 1) * rows * sm90::kSplitTileCols * 4 : 0;
        return CEIL_DIV(k_tiles, splits) * slice_bytes(tile_rows) + partials;
    };
    int best = 1;
    for (int splits = 2; splits <= k_tiles && tiles * splits <= sm_count; ++splits) {
        if ((size_t)(tiles * splits) * tile_rows * sm90::kSplitTileCols > sc.floats) break;
        if (bytes(splits) < bytes(best)) best = splits;
    }
    return best;
}

// RopeKV without the fused epilogue: q|k|v staged in args.out_f32 by `store_f32` (the same GEMM
// with StoreF32), then rope_kv_append.
template <typename StoreF32>
void rope_staged(const char* op, const EpilogueArgs& args, int M, cudaStream_t stream, StoreF32 store_f32) {
    BRRR_CHECK(args.out_f32 != nullptr, op << ": RopeKV here (no fused epilogue for head_dim " << args.rope.head_dim
                                           << " on this device) stages q|k|v in args.out_f32 [M, N]; got null");
    EpilogueArgs staged;
    staged.out_f32 = args.out_f32;
    staged.split = args.split;
    store_f32(staged);
    rope_kv_append(args.out_f32, args.rope, M, stream);
}

}  // namespace

void gemm_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args,
               cudaStream_t stream) {
    const GemmArgs p = gemm_args(x, W, M, N, K, ep, args);
    if (M == 0) return;
    int sm_count = 0;
    const bool hopper = tma_compatible(p) && gemm_sm90_available(&sm_count);
    if (ep == Epilogue::RopeKV && !(hopper && rope_fusable(p))) {
        rope_staged("gemm_bf16", args, M, stream, [&](const EpilogueArgs& staged) {
            gemm_bf16(x, W, M, N, K, Epilogue::StoreF32, staged, stream);
        });
        return;
    }
    if (hopper) {
        gemm_sm90(p, split_count(p, sm_count), sm_count, stream);
    } else {
        gemm_sm80(p, stream);
    }
}

bool gemm_quant_available() {
    int sm_count = 0;
    return gemm_sm90_available(&sm_count);
}

void gemm_quant(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep,
                const EpilogueArgs& args, cudaStream_t stream) {
    BRRR_CHECK(parts != nullptr && n_parts >= 1 && n_parts <= kMaxWeightParts,
               "gemm_quant: W must come as 1 to " << kMaxWeightParts << " parts, got " << n_parts);
    BRRR_CHECK(parts[0].data != nullptr, "gemm_quant: part 0 has no data (null)");
    // gemm_args checks x, M, N, K and the epilogue; part 0's pointer stands in for W there (each
    // part is checked below), and W itself is replaced by the parts.
    GemmArgs p = gemm_args(x, static_cast<const bf16*>(parts[0].data), M, N, K, ep, args, "gemm_quant");
    p.W = nullptr;
    QuantB& q = p.qb;
    q.n = n_parts;
    int next_row = 0;
    for (int i = 0; i < n_parts; ++i) {
        const GemmWeightPart& w = parts[i];
        if (w.type != 0) {  // 0: a bf16 part
            const std::string op = "gemm_quant (part " + std::to_string(i) + ")";
            check_quant_weight(op.c_str(), w.type, K, "K");
        }
        BRRR_CHECK(w.row0 == next_row && w.rows >= 1, "gemm_quant: part " << i << " holds rows [" << w.row0 << ", "
                                                                          << w.row0 + w.rows << "); the parts must "
                                                                          << "cover [0, N) in order, from row "
                                                                          << next_row);
        BRRR_CHECK(w.data != nullptr && util::aligned_to(w.data, 16),
                   "gemm_quant: part " << i << "'s data must be a 16-byte aligned device pointer");
        q.data[i] = static_cast<const unsigned char*>(w.data);
        q.type[i] = w.type;
        q.row0[i] = w.row0;
        q.rows[i] = w.rows;
        const size_t row_bytes = w.type == 0 ? (size_t)K * sizeof(bf16) : qlayout::row_stride(w.type, K);
        q.row_bytes[i] = (int)row_bytes;
        q.tail[i] = qlayout::has_tail(w.type) ? q.data[i] + qlayout::tail_offset(w.type, w.rows, K) : nullptr;
        next_row += w.rows;
    }
    BRRR_CHECK(next_row == N, "gemm_quant: the parts hold " << next_row << " rows, N=" << N);
    BRRR_CHECK(K % 8 == 0 && util::aligned_to(x, 16),
               "gemm_quant: x must be 16-byte aligned and K a multiple of 8 (TMA), got K=" << K);
    int sm_count = 0;
    BRRR_CHECK(gemm_sm90_available(&sm_count), "gemm_quant: needs a Hopper GPU (sm_90) and a build with sm_90a; "
                                               "elsewhere dequantize_bf16 the parts and run gemm_bf16");
    if (M == 0) return;
    if (ep == Epilogue::RopeKV && !rope_fusable(p)) {
        rope_staged("gemm_quant", args, M, stream, [&](const EpilogueArgs& staged) {
            gemm_quant(parts, n_parts, x, M, N, K, Epilogue::StoreF32, staged, stream);
        });
        return;
    }
    gemm_sm90_quant(p, split_count(p, sm_count, sm90::quant_tile_rows(M)), sm_count, stream);
}

// split_count keeps tiles x splits <= sm_count and tiles <= sm_count / 2; tiles of gemm_quant's
// 256 rows (sm90::quant_tile_rows) take twice the floats of a 128-row one.
size_t gemm_split_scratch_floats(int sm_count) { return (size_t)sm_count * 2 * sm90::kBM * sm90::kSplitTileCols; }
int gemm_split_scratch_counters(int sm_count) { return std::max(1, sm_count / 2); }

void matmul_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
                 const EpilogueArgs& args, cudaStream_t stream) {
    if (M <= tuning::kGemvMaxRows) {
        gemv_bf16(x, W, M, N, K, ep, args, stream);
    } else {
        gemm_bf16(x, W, M, N, K, ep, args, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
