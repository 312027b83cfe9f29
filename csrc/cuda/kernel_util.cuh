// kernel_util.cuh — small pieces gemv.cu, gemm.cu and attention.cu share: bf16 bit unpacking,
// warp reductions, the matmul epilogue as a device function, and the host-side argument check
// every matmul launcher runs before it launches anything.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common.h"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {
namespace util {

// A bf16 is the top half of an fp32, so unpacking a bf16x2 word is a shift and a mask.
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Two floats rounded to bf16 (nearest even), low half first: the layout of an mma A fragment.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
    return l | (h << 16);
}

// acc + dot(w, x) over the eight bf16 pairs of two 16-byte vectors.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const uint4& x, float acc) {
    acc = fmaf(bf16_lo(w.x), bf16_lo(x.x), acc);
    acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
    acc = fmaf(bf16_lo(w.y), bf16_lo(x.y), acc);
    acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
    acc = fmaf(bf16_lo(w.z), bf16_lo(x.z), acc);
    acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
    acc = fmaf(bf16_lo(w.w), bf16_lo(x.w), acc);
    acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
    return acc;
}

// Butterfly reductions: every lane ends with the result. All 32 lanes must call them.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// One fp32 result y[m, n] leaving the chip; `idx` = m * ld + n (ld resolved by check_matmul).
// SwiGLU goes through store_swiglu instead: it needs the gate and the up value.
__device__ __forceinline__ void store_result(Epilogue ep, const EpilogueArgs& a, size_t idx, float y) {
    if (ep == Epilogue::StoreBf16) {
        a.out_bf16[idx] = __float2bfloat16_rn(y);
    } else if (ep == Epilogue::StoreF32) {
        a.out_f32[idx] = y;
    } else {
        a.residual[idx] += y;
    }
}
__device__ __forceinline__ void store_swiglu(const EpilogueArgs& a, size_t idx, float gate, float up) {
    a.out_bf16[idx] = __float2bfloat16_rn(silu(gate) * up);
}

inline bool aligned_to(const void* p, uintptr_t bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Checks one matmul's operands and resolves args.ld_out (0 = packed) to the real row stride.
// Returns the output width: N, or N / 2 for SwiGLU.
inline int check_matmul(const char* op, const bf16* x, const bf16* W, int M, int N, int K,
                        Epilogue ep, EpilogueArgs& args) {
    BRRR_CHECK(M >= 0 && N >= 1 && K >= 1,
               op << ": sizes must be M >= 0, N >= 1, K >= 1; got M=" << M << " N=" << N << " K=" << K);
    BRRR_CHECK(x != nullptr && W != nullptr, op << ": x and W must be device pointers, got null");
    BRRR_CHECK(aligned_to(x, 2) && aligned_to(W, 2), op << ": x and W must be 2-byte aligned (bf16)");
    const int ep_id = static_cast<int>(ep);
    BRRR_CHECK(ep_id >= 0 && ep_id <= 3, op << ": unknown epilogue " << ep_id
                                            << " (0 StoreBf16, 1 StoreF32, 2 AddResidual, 3 SwiGLU)");
    int width = N;
    if (ep == Epilogue::SwiGLU) {
        BRRR_CHECK(N % 2 == 0, op << ": SwiGLU needs an even N (gate rows | up rows), got N=" << N);
        width = N / 2;
    }
    BRRR_CHECK(args.ld_out >= 0, op << ": ld_out must be >= 0 (0 = packed), got " << args.ld_out);
    if (args.ld_out == 0) args.ld_out = width;
    BRRR_CHECK(args.ld_out >= width, op << ": ld_out=" << args.ld_out
                                        << " is shorter than an output row of " << width);
    switch (ep) {
        case Epilogue::StoreBf16:
        case Epilogue::SwiGLU:
            BRRR_CHECK(args.out_bf16 != nullptr && aligned_to(args.out_bf16, 2),
                       op << ": this epilogue writes args.out_bf16, which is null or misaligned");
            break;
        case Epilogue::StoreF32:
            BRRR_CHECK(args.out_f32 != nullptr && aligned_to(args.out_f32, 4),
                       op << ": StoreF32 writes args.out_f32, which is null or not 4-byte aligned");
            break;
        case Epilogue::AddResidual:
            BRRR_CHECK(args.residual != nullptr && aligned_to(args.residual, 4),
                       op << ": AddResidual updates args.residual, which is null or not 4-byte aligned");
            break;
    }
    return width;
}

}  // namespace util
}  // namespace cuda
}  // namespace brrr
