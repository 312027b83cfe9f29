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
//                consumer warpgroups (gemm_sm90_dequant.cuh); Hopper only.
//   gemm_dequant_slices: quantized weights for gemm_bf16 on any GPU, dequantized into a bf16
//                scratch a slice of output columns at a time (no whole bf16 copy of W). The
//                engine's scratch is about the L2 (the slice's write and read-back stay mostly on
//                chip); the slice width is the cheapest by gemm_sm90's wave model, since each
//                slice is its own GEMM with its own partly filled last wave (by that model, on 132
//                SMs, the 8B's w2 at 2,048 rows costs in four slices of 1,024 columns what it costs
//                whole, in six of 768 1.5x as much).
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

// Throws unless parts (1 to kMaxWeightParts) cover rows [0, N) of a W of K columns in order, each
// bf16 (type 0) or qlayout tiles of a type whose blocks K holds, on 16-byte aligned device memory.
void check_parts(const char* op, const GemmWeightPart* parts, int n_parts, int N, int K) {
    BRRR_CHECK(parts != nullptr && n_parts >= 1 && n_parts <= kMaxWeightParts,
               op << ": W must come as 1 to " << kMaxWeightParts << " parts, got " << n_parts);
    int next_row = 0;
    for (int i = 0; i < n_parts; ++i) {
        const GemmWeightPart& w = parts[i];
        if (w.type != 0) {  // 0: a bf16 part
            const std::string what = std::string(op) + " (part " + std::to_string(i) + ")";
            check_quant_weight(what.c_str(), w.type, K, "K");
        }
        BRRR_CHECK(w.row0 == next_row && w.rows >= 1, op << ": part " << i << " holds rows [" << w.row0 << ", "
                                                         << w.row0 + w.rows << "); the parts must cover [0, N) in "
                                                         << "order, from row " << next_row);
        BRRR_CHECK(w.data != nullptr && util::aligned_to(w.data, 16),
                   op << ": part " << i << "'s data must be a 16-byte aligned device pointer");
        next_row += w.rows;
    }
    BRRR_CHECK(next_row == N, op << ": the parts hold " << next_row << " rows, N=" << N);
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
    check_parts("gemm_quant", parts, n_parts, N, K);
    // gemm_args checks x, M, N, K and the epilogue; part 0's pointer stands in for W there, and W
    // itself is replaced by the parts.
    GemmArgs p = gemm_args(x, static_cast<const bf16*>(parts[0].data), M, N, K, ep, args, "gemm_quant");
    p.W = nullptr;
    QuantB& q = p.qb;
    q.n = n_parts;
    for (int i = 0; i < n_parts; ++i) {
        const GemmWeightPart& w = parts[i];
        q.data[i] = static_cast<const unsigned char*>(w.data);
        q.type[i] = w.type;
        q.row0[i] = w.row0;
        q.rows[i] = w.rows;
        const size_t row_bytes = w.type == 0 ? (size_t)K * sizeof(bf16) : qlayout::row_stride(w.type, K);
        q.row_bytes[i] = (int)row_bytes;
        q.tail[i] = qlayout::has_tail(w.type) ? q.data[i] + qlayout::tail_offset(w.type, w.rows, K) : nullptr;
    }
    BRRR_CHECK(K % 8 == 0 && util::aligned_to(x, 16),
               "gemm_quant: x must be 16-byte aligned and K a multiple of 8 (TMA), got K=" << K);
    int sm_count = 0;
    BRRR_CHECK(gemm_sm90_available(&sm_count), "gemm_quant: needs a Hopper GPU (sm_90) and a build with sm_90a; "
                                               "elsewhere run gemm_dequant_slices");
    if (M == 0) return;
    if (ep == Epilogue::RopeKV && !rope_fusable(p)) {
        rope_staged("gemm_quant", args, M, stream, [&](const EpilogueArgs& staged) {
            gemm_quant(parts, n_parts, x, M, N, K, Epilogue::StoreF32, staged, stream);
        });
        return;
    }
    gemm_sm90_quant(p, split_count(p, sm_count, sm90::quant_tile_rows(M)), sm_count, stream);
}

int gemm_dequant_slice_cols(int M, int N, int K, Epilogue ep, size_t scratch_elems) {
    BRRR_CHECK_ARG(M >= 0 && N >= 1 && K >= 1, "gemm_dequant_slices: M=" << M << ", N=" << N << ", K=" << K
                                                  << " (M >= 0, N and K >= 1)");
    const int per_col = ep == Epilogue::SwiGLU ? 2 : 1;  // W rows an output column takes
    const int cols = N / per_col;
    const size_t fit = scratch_elems / ((size_t)per_col * K);  // columns whose rows the scratch holds
    if (fit >= (size_t)cols) return cols;
    constexpr int step = tuning::kDequantSliceCols;
    const int widest = (int)std::min<size_t>(fit / step, cols / step) * step;
    BRRR_CHECK(widest >= step, "gemm_dequant_slices: the scratch holds " << scratch_elems << " bf16 values, fewer than "
                                   << step << " output columns of W (" << per_col * step << " rows of K=" << K << ")");
    int sm_count = 0;
    if (!gemm_sm90_available(&sm_count)) return widest;
    // Several slices run as separate GEMMs, each with its own partly filled last wave: the wave
    // model's time of the whole call in slices of c columns picks c (the widest of the cheapest:
    // fewer launches). Sliced RopeKV runs StoreF32.
    const Epilogue slice_ep = ep == Epilogue::RopeKV ? Epilogue::StoreF32 : ep;
    auto time_in_slices = [&](int c) {
        long long whole = 0, rest = 0;
        gemm_sm90_width(M, c, slice_ep, sm_count, &whole);
        if (cols % c) gemm_sm90_width(M, cols % c, slice_ep, sm_count, &rest);
        return (cols / c) * whole + rest;
    };
    int best = widest;
    long long best_time = time_in_slices(widest);
    for (int c = widest - step; c >= step; c -= step) {
        const long long t = time_in_slices(c);
        if (t < best_time) best = c, best_time = t;
    }
    return best;
}

void gemm_dequant_slices(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep,
                         const EpilogueArgs& args, bf16* scratch, size_t scratch_elems, cudaStream_t stream) {
    check_parts("gemm_dequant_slices", parts, n_parts, N, K);
    BRRR_CHECK(scratch != nullptr && util::aligned_to(scratch, 16),
               "gemm_dequant_slices: scratch must be a 16-byte aligned device pointer");
    gemm_args(x, scratch, M, N, K, ep, args, "gemm_dequant_slices");  // x, M, N, K and the destinations
    if (M == 0) return;
    const int per_col = ep == Epilogue::SwiGLU ? 2 : 1;
    const int cols = N / per_col;
    const int slice = gemm_dequant_slice_cols(M, N, K, ep, scratch_elems);
    // Rows [r0, r0 + n) of W as bf16 into dst, part by part.
    auto dequantize_rows = [&](int r0, int n, bf16* dst) {
        for (int i = 0; i < n_parts; ++i) {
            const GemmWeightPart& p = parts[i];
            const int lo = std::max(r0, p.row0), hi = std::min(r0 + n, p.row0 + p.rows);
            if (lo >= hi) continue;
            bf16* d = dst + (size_t)(lo - r0) * K;
            if (p.type == 0)
                CUDA_CHECK(cudaMemcpyAsync(d, static_cast<const bf16*>(p.data) + (size_t)(lo - p.row0) * K,
                                           (size_t)(hi - lo) * K * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
            else
                dequantize_bf16(p.type, p.data, p.rows, K, lo - p.row0, hi - lo, d, K, stream);
        }
    };
    // Slice by slice: its rows of W (a SwiGLU slice of columns [c0, c0 + n): gate rows [c0, c0 + n),
    // then up rows [cols + c0, cols + c0 + n), which the GEMM pairs as j, n + j) and the call's
    // destinations from column c0 on.
    auto run_slices = [&](Epilogue e, const EpilogueArgs& dest) {
        const int ld = dest.ld_out ? dest.ld_out : cols;
        for (int c0 = 0; c0 < cols; c0 += slice) {
            const int n = std::min(slice, cols - c0);
            for (int h = 0; h < per_col; ++h) dequantize_rows(h * cols + c0, n, scratch + (size_t)h * n * K);
            EpilogueArgs a = dest;
            a.ld_out = ld;
            if (a.out_f32) a.out_f32 += c0;
            if (a.out_bf16) a.out_bf16 += c0;
            if (a.residual) a.residual += c0;
            gemm_bf16(x, scratch, M, per_col * n, K, e, a, stream);
        }
    };
    if (ep == Epilogue::RopeKV && slice < cols) {  // the fused RopeKV needs every q|k|v column in one call
        rope_staged("gemm_dequant_slices", args, M, stream,
                    [&](const EpilogueArgs& staged) { run_slices(Epilogue::StoreF32, staged); });
        return;
    }
    run_slices(ep, args);
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
