// gemm_common.cuh — what the two prefill GEMMs (gemm_sm80.cu, gemm_sm90.cu) and their dispatch
// (matmul.cu) share: the argument block of one call and the register epilogues.
//
//   y[m, n] = sum_k x[m, k] * W[n, k]; x [M, K] bf16, W [N, K] bf16, fp32 accumulation.
//
// GemmArgs is built once per call on the host (gemm_args: validation, the output's row stride,
// which stores the destination's alignment allows) and passed by value to the kernel, so both
// kernels read the same decisions. The epilogue helpers take one or two fp32 results of an mma
// accumulator row and write them the way the Epilogue asks:
//   - pair stores: two adjacent outputs in one 4- or 8-byte store where the destination allows,
//   - SwiGLU: the gate and the up value of one output sit in the same thread, silu(g) * u there,
//   - AddResidual: all of a row's residual values are loaded before any is written back, so the
//     loads' round trips overlap (the compiler may not move a load past a store to the same array).
// Invariants: rows >= M and columns >= width are never written; every element of the output is
// written by exactly one thread (no atomics), so results do not depend on scheduling.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

// The wgmma GEMM's fixed tile facts, which the dispatch's split-K model needs too.
namespace sm90 {
constexpr int kBM = 128;             // tile rows: two consumer warpgroups of 64
constexpr int kBK = 64;              // k per ring slot: kBK * 2 bytes = one 128-byte swizzle row
constexpr int kSplitTileCols = 128;  // split-K work items are 128-column tiles
// gemm_quant's tile rows: past one 128-row tile, each consumer warpgroup multiplies two 64-row
// blocks by every W tile it decodes (half the decode per MMA).
constexpr int quant_tile_rows(int M) { return M > kBM ? 2 * kBM : kBM; }
}  // namespace sm90

// W as the parts gemm_quant dequantizes tile by tile (gemm_sm90_dequant.cuh); n = 0 for a bf16 W
// loaded by TMA. Part i holds matrix rows [row0[i], row0[i] + rows[i]).
struct QuantB {
    const unsigned char* data[kMaxWeightParts];  // bf16 [rows, K], or qlayout tiles
    const unsigned char* tail[kMaxWeightParts];  // Q6_K: the fp16 d [rows, tiles a row]; else null
    int type[kMaxWeightParts];                   // 0 bf16, else the GGML type id
    int row0[kMaxWeightParts], rows[kMaxWeightParts];
    int row_bytes[kMaxWeightParts];              // from one row of the part to the next
    int n;
};

struct GemmArgs {
    const bf16* x;      // [M, K]
    const bf16* W;      // [N, K] (null where qb.n > 0)
    QuantB qb;
    int M, N, K;
    int width;          // output columns: N, or H = N / 2 for SwiGLU
    int half_n;         // H: first up row of w13 (SwiGLU only)
    bool pair_stores;   // two adjacent outputs may be written as one 4- or 8-byte store
    bool epilogue_tma;  // Hopper AddResidual / StoreF32 / StoreBf16: staged in shared memory, written by TMA
    bool rope_q_tma;    // Hopper RopeKV: q tiles rotated in registers, then stored like StoreBf16
    Epilogue ep;
    EpilogueArgs out;
};

// TMA needs 16-byte aligned bases and row strides (K % 8 == 0).
inline bool tma_compatible(const GemmArgs& p) {
    return p.K % 8 == 0 && util::aligned_to(p.x, 16) && util::aligned_to(p.W, 16);
}

// The argument block of one gemm_bf16 call: validated, ld_out resolved, store forms chosen.
inline GemmArgs gemm_args(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args,
                          const char* op = "gemm_bf16") {
    GemmArgs p;
    p.qb = QuantB{};
    p.out = args;
    p.width = util::check_matmul(op, x, W, M, N, K, ep, p.out, /*allow_rope=*/true);
    if (ep == Epilogue::RopeKV) p.width = N;  // tiles cover all N columns; pairs form inside a tile
    p.x = x;
    p.W = W;
    p.M = M;
    p.N = N;
    p.K = K;
    p.half_n = N / 2;
    p.ep = ep;
    // Only the Hopper kernel reads the flag; the mma.sync kernel always stores from registers. TMA
    // needs 16-byte aligned bases and row strides.
    switch (ep) {
        case Epilogue::AddResidual:
            p.epilogue_tma = p.out.ld_out % 4 == 0 && util::aligned_to(p.out.residual, 16);
            break;
        case Epilogue::StoreF32: p.epilogue_tma = p.out.ld_out % 4 == 0 && util::aligned_to(p.out.out_f32, 16); break;
        case Epilogue::StoreBf16:
            p.epilogue_tma = p.out.ld_out % 8 == 0 && util::aligned_to(p.out.out_bf16, 16);
            break;
        default: p.epilogue_tma = false;
    }
    // RopeKV's q tiles: q_out [M, n_heads x head_dim] is a plain bf16 matrix.
    const RopeKVArgs& r = p.out.rope;
    p.rope_q_tma = ep == Epilogue::RopeKV && util::aligned_to(r.q_out, 16) && (r.n_heads * r.head_dim) % 8 == 0;
    const bool even_ld = p.out.ld_out % 2 == 0;
    switch (ep) {
        case Epilogue::StoreBf16:
        case Epilogue::SwiGLU: p.pair_stores = even_ld && util::aligned_to(p.out.out_bf16, 4); break;
        case Epilogue::StoreF32: p.pair_stores = even_ld && util::aligned_to(p.out.out_f32, 8); break;
        case Epilogue::AddResidual: p.pair_stores = even_ld && util::aligned_to(p.out.residual, 8); break;
        case Epilogue::RopeKV: p.pair_stores = false; break;  // store_rope_row's own stores
    }
    return p;
}

// Two adjacent results (row, col) and (row, col + 1) of a plain epilogue.
__device__ __forceinline__ void store_pair(const GemmArgs& p, int row, int col, float v0, float v1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        if (p.ep == Epilogue::StoreBf16) {
            *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) = util::pack_bf16x2(v0, v1);
        } else if (p.ep == Epilogue::StoreF32) {
            *reinterpret_cast<float2*>(p.out.out_f32 + idx) = make_float2(v0, v1);
        } else {
            float2* r = reinterpret_cast<float2*>(p.out.residual + idx);
            float2 acc = *r;
            acc.x += v0;
            acc.y += v1;
            *r = acc;
        }
        return;
    }
    util::store_result(p.ep, p.out, idx, v0);
    if (col + 1 < p.width) util::store_result(p.ep, p.out, idx + 1, v1);
}

__device__ __forceinline__ void store_swiglu_pair(const GemmArgs& p, int row, int col, float g0,
                                                  float u0, float g1, float u1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) =
            util::pack_bf16x2(util::silu(g0) * u0, util::silu(g1) * u1);
        return;
    }
    util::store_swiglu(p.out, idx, g0, u0);
    if (col + 1 < p.width) util::store_swiglu(p.out, idx + 1, g1, u1);
}

// AddResidual for G column pairs of one row, (col + 8 j, col + 8 j + 1) for j < G: the layout of
// an mma accumulator row. Every residual value is loaded before any is written back, because the
// compiler may not move a load past a store to the same array: added pair by pair, each pair
// waited out a full memory round trip.
template <int G>
__device__ __forceinline__ void add_residual_pairs(const GemmArgs& p, int row, int col, const float2 (&y)[G]) {
    if (row >= p.M) return;
    if (!p.pair_stores) {
#pragma unroll
        for (int j = 0; j < G; ++j) store_pair(p, row, col + 8 * j, y[j].x, y[j].y);
        return;
    }
    float* base = p.out.residual + (size_t)row * p.out.ld_out + col;
    float2 r[G];
#pragma unroll
    for (int j = 0; j < G; ++j)
        r[j] = col + 8 * j + 1 < p.width ? *reinterpret_cast<const float2*>(base + 8 * j) : make_float2(0.f, 0.f);
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int c = col + 8 * j;
        if (c + 1 < p.width) {
            *reinterpret_cast<float2*>(base + 8 * j) = make_float2(r[j].x + y[j].x, r[j].y + y[j].y);
        } else if (c < p.width) {
            base[8 * j] += y[j].x;
        }
    }
}

}  // namespace cuda
}  // namespace brrr
