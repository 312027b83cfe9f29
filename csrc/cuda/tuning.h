// tuning.h — every tunable number of the CUDA kernels, and the one runtime switch, in one place.
// Each knob says what it trades; the measurements behind its value are in docs/kernels/.
// Change a value here, rebuild, and run benchmarks/bench_kernels.py and the CUDA tests.
#pragma once

namespace brrr {
namespace cuda {
namespace tuning {

// ---- decode GEMV (gemv.cu) --------------------------------------------------------------------
// Rows from which GemvPath::Auto takes the tensor-core GEMV: below, the CUDA cores stream faster
// (M = 1); from here on their FMAs, not HBM, bind and mma.sync wins.
constexpr int kGemvTensorCoreMinRows = 2;
// 16-byte W loads per lane in flight in the CUDA-core GEMV: more hides more HBM latency but costs
// registers, which can split a grid that fits the GPU at once into two waves.
constexpr int kGemvLoads = 8;
// The same at M = 1, where a warp's two 4 KB rows of the 1B wqkv / w13 fit one round trip; taken
// only where its registers keep the grid in one wave (else kGemvLoads).
constexpr int kGemvM1Loads = 16;

// ---- decode attention (attention_decode.cu) ---------------------------------------------------

// ---- prefill attention (attention_prefill_sm80.cu, attention_prefill_sm90.cu) -----------------

// ---- GEMM (gemm_sm80.cu, gemm_sm90.cu) and the matmul dispatch (matmul.cu) --------------------

}  // namespace tuning
}  // namespace cuda
}  // namespace brrr
