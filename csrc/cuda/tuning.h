// tuning.h — every tunable number of the CUDA kernels, and the one runtime switch, in one place.
// Each knob says what it trades; the measurements behind its value are in docs/kernels/.
// Change a value here, rebuild, and run benchmarks/bench_kernels.py and the CUDA tests.
#pragma once

namespace brrr {
namespace cuda {
namespace tuning {

// ---- decode GEMV (gemv.cu) --------------------------------------------------------------------

// ---- decode attention (attention_decode.cu) ---------------------------------------------------

// ---- prefill attention (attention_prefill_sm80.cu, attention_prefill_sm90.cu) -----------------

// ---- GEMM (gemm_sm80.cu, gemm_sm90.cu) and the matmul dispatch (matmul.cu) --------------------

}  // namespace tuning
}  // namespace cuda
}  // namespace brrr
