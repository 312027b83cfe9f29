// gemm_sm90.cu — which configuration of the Hopper GEMM (gemm_sm90.cuh) a call runs.
//
//   gemm_sm90(p, splits, sm_count): tile width BN in {256, 192, 128} (gemm_sm90_width) with its
//   ring depth, a persistent grid of at most sm_count CTAs, tiles walked in groups of
//   kGemmSm90GroupM tile rows.
//
// Tile width by a wave model: time ~ waves x tile width (a tile's work grows with its width, and a
// partly filled last wave costs a full one). The cheapest of 256 / 192 / 128 columns wins; 256
// also wins near-ties (within kGemmWideTieNum / kGemmWideTieDen), because its tiles re-read x
// half as often. RopeKV leaves out 192, which does not hold whole heads of 128.
// With splits > 1 (chosen by matmul.cu's split-K model) the call runs 128-column tiles, the width
// the split-K scratch is sized for. Ring depth per width is the deepest that fits shared memory
// beside the epilogue's staging boxes (tuning.h).
//   gemm_sm90_quant(p, splits, sm_count): quantized W (p.qb) always takes 128-column tiles: a
//   producer thread copies one W row of a k tile and a consumer thread decodes half of one
//   (gemm_sm90_dequant.cuh), 128 rows for the 128 and 256 threads. Past 128 rows of x the tiles
//   are 256 rows (sm90::quant_tile_rows: each consumer multiplies two 64-row blocks by every W
//   tile it decodes, so the decode per MMA halves) on a ring one slot shallower.
//
// Invariants: the instances compiled here are exactly those a call can pick (per width: SwiGLU,
// plain, RopeKV with head_dim 64 and, where BN holds whole heads of 128, 128; the same four for
// quantized W at 128 columns, per tile height); the sm_90a image is checked once per device
// (gemm_sm90_available) before any of them is launched.
#include "cuda/gemm_sm90.cuh"

#include <algorithm>

#include "cuda/launch.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

bool gemm_sm90_available(int* sm_count) {
    *sm_count = device_facts().sm_count;
    return runs_sm90a(sm90::gemm_sm90_kernel<256, tuning::kGemmSm90Stages256, false, 0, false>);
}

int gemm_sm90_width(int M, int width, Epilogue ep, int sm_count, long long* cost) {
    const long long tiles_m = CEIL_DIV(M, sm90::kBM);
    const int out_per_col = ep == Epilogue::SwiGLU ? 2 : 1;  // a SwiGLU tile yields BN / 2 outputs
    auto cost_of = [&](int bn) {
        const long long tiles = tiles_m * CEIL_DIV(width, bn / out_per_col);
        return CEIL_DIV(tiles, (long long)sm_count) * bn;
    };
    const long long c256 = cost_of(256), c128 = cost_of(128);
    const long long c192 = ep == Epilogue::RopeKV ? c128 + 1 : cost_of(192);
    const long long best_narrow = std::min(c192, c128);
    int bn = 128;
    if (tuning::kGemmWideTieDen * c256 <= tuning::kGemmWideTieNum * best_narrow) bn = 256;
    else if (c192 <= c128) bn = 192;
    if (cost) *cost = bn == 256 ? c256 : bn == 192 ? c192 : c128;
    return bn;
}

void gemm_sm90(const GemmArgs& p, int splits, int sm_count, cudaStream_t stream) {
    constexpr int kGroupM = tuning::kGemmSm90GroupM;
    if (splits > 1) {
        static_assert(sm90::kSplitTileCols == 128, "split-K runs the 128-column instance");
        sm90::launch<128, tuning::kGemmSm90Stages128>(p, sm_count, kGroupM, stream, splits);
        return;
    }
    switch (gemm_sm90_width(p.M, p.width, p.ep, sm_count, nullptr)) {
        case 256: sm90::launch<256, tuning::kGemmSm90Stages256>(p, sm_count, kGroupM, stream); break;
        case 192: sm90::launch<192, tuning::kGemmSm90Stages192>(p, sm_count, kGroupM, stream); break;
        default: sm90::launch<128, tuning::kGemmSm90Stages128>(p, sm_count, kGroupM, stream);
    }
}

void gemm_sm90_quant(const GemmArgs& p, int splits, int sm_count, cudaStream_t stream) {
    if (sm90::quant_tile_rows(p.M) > sm90::kBM) {
        sm90::launch<128, tuning::kGemmSm90QuantStages256, true, 2>(p, sm_count, tuning::kGemmSm90GroupM, stream,
                                                                     splits);
    } else {
        sm90::launch<128, tuning::kGemmSm90QuantStages, true>(p, sm_count, tuning::kGemmSm90GroupM, stream, splits);
    }
}

}  // namespace cuda
}  // namespace brrr
