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
// Fewest positions a flash_decode split takes: smaller splits spread a short context over more
// CTAs but add merge work and scratch round trips.
constexpr int kDecodeMinChunk = 64;
// Threads per flash_decode CTA: more warps per chunk shorten it, at the price of a larger
// cross-warp combine (and the kernel's register cap, set for 2 CTAs of 256 per SM).
constexpr int kDecodeThreads = 256;
// flash_decode CTAs per SM the grid is sized for (one wave): more splits a sequence, against
// more merging and a second wave once the registers no longer fit.
constexpr int kDecodeCtasPerSm = 2;
// Head dim from which the kernel after flash_decode (wo) may launch only as its CTAs exit, not
// once their first rows are asked for: the late launch measured faster at hd 128 (Llama-3-8B) and
// slower at hd 64 (Llama-3.2-1B); why is open (docs/kernels/attention.md).
constexpr int kDecodeLateTriggerHeadDim = 128;

// ---- prefill attention (attention_prefill_sm80.cu, attention_prefill_sm90.cu) -----------------

// ---- GEMM (gemm_sm80.cu, gemm_sm90.cu) and the matmul dispatch (matmul.cu) --------------------

}  // namespace tuning
}  // namespace cuda
}  // namespace brrr
