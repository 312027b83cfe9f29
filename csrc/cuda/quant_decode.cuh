// quant_decode.cuh — GGML codes to bf16 weights, two at a time: the decode that the tensor-core
// kernels on quantized W share (gemv_quant_mma.cu feeds its mma.sync fragments with it,
// gemm_sm90_dequant.cuh the bf16 W tiles of the wgmma GEMM), so a weight decodes to the same bf16
// in decode and in prefill.
//
//   A chunk is 8 codes in two words (byte b of u0 = value b, of u1 = value 4 + b) and its block's
//   coefficients: w = D (c - off) + a (Coef; Q8_0: AffineQ8). Out come 4 bf16x2 words, r[i] =
//   values 2i, 2i + 1.
//   * Codes < 128 (every type but Q8_0): one PRMT puts two code bytes under the bf16 exponent of
//     128, where the ulp is 1 (128 + c, exactly); HSUB2 takes 128 + off off (c - off, exactly);
//     then per kSplitScale<T>:
//     - Q4_0 / Q5_0 (no min, the scale an fp16 d): two HFMA2 give (c - off) D_hi + (c - off) D_lo,
//       the fp16 d split exactly into two bf16: bf16 of the fp32 w exactly (the tests check it bit
//       for bit), 2 instructions a weight.
//     - the others: one HFMA2 gives (c - off) bf16(D) + bf16(a), rounded once: 1.5 instructions a
//       weight. Three roundings (D, a, the result): within 2^-8 (2.01 |w| + 2.05 |a|) of the fp32 w
//       (tests/mma_decode_ref.py). What D's rounding adds, at most 2^-8 |c - off| D (0.06 D for
//       4-bit codes, up to 0.125 D for 5- and 6-bit ones), is small beside the quantization's own
//       rms error of D / sqrt(12) = 0.29 D; the second HFMA2 that would remove it was 3-15% of the
//       tensor-core GEMV's instructions (docs/kernels/gemv.md, row "scale rounded once").
//   * Q8_0's signed 8-bit codes do not fit a bf16 binade: PRMT puts each under 2^0 after
//     flipping its sign bit (f = 1 + (q + 128) / 2^15), d q = f * 2^15 d - (2^15 + 128) d is one
//     exact FFMA, and F2FP rounds two to bf16: bf16 of the fp32 w exactly.
//   The K-quants' sub-block coefficients (coef_k4, coef_q6k) are here too, so both kernels' D and a
//   agree. coef_k4 takes a Q4_K / Q5_K tile's 12 bytes of packed 6-bit scales and mins apart four
//   bytes at a time (k4_bytes: masks and shifts on whole words, as gemv_quant.cu's scale_min_pair
//   does for one pair) and scales a byte exactly with one FFMA (scaled_byte), where the
//   field-by-field unpack, an I2F and an FMUL took some 13 instructions a coefficient.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cpu/quant.h"
#include "cuda/kernel_util.cuh"
#include "cuda/qlayout.h"

namespace brrr {
namespace cuda {
namespace qdec {

// A chunk's weights w = D (c - off) + a: the (sub-)block's fp32 scale and min (0 without one).
struct Coef {
    float D, a;
};
// Q4_K / Q5_K: the 12 packed 6-bit scales and mins of a tile (header words S0..S2) as bytes, all
// 8 sub-blocks at once: byte j of sc03 / m03 is sub-block j's scale / min, of sc47 / m47 sub-block
// 4 + j's (qlayout::scale_min_k4's bits).
struct K4Bytes {
    uint32_t sc03, m03, sc47, m47;
};
__device__ __forceinline__ K4Bytes k4_bytes(uint32_t S0, uint32_t S1, uint32_t S2) {
    return K4Bytes{S0 & 0x3F3F3F3Fu, S1 & 0x3F3F3F3Fu, (S2 & 0x0F0F0F0Fu) | ((S0 >> 2) & 0x30303030u),
                   ((S2 >> 4) & 0x0F0F0F0Fu) | ((S1 >> 2) & 0x30303030u)};
}
// d times byte b of w (b < 4, the byte < 64) exactly, d an fp16 value (11 significant bits, so
// the product has at most 17): the byte under the exponent of 2^23 (the float 2^23 + byte), and
// one FFMA takes 2^23 d (minus_d_2p23 = -2^23 d) off the exact product before its one rounding,
// which then has nothing to round. A zero byte gives +0 whatever d's sign (a product d * 0 would
// carry it: the min -dmin * 0 of a sub-block whose m is 0 was -0), so a decoded zero weight can
// differ from the fp32 one in its sign, never in value.
__device__ __forceinline__ float scaled_byte(uint32_t w, int b, float d, float minus_d_2p23) {
    return fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | b)), d, minus_d_2p23);
}
// Q4_K / Q5_K sub-block 4h + b of a tile (scales and mins from k4_bytes; dm = fp16 d | fp16 dmin
// << 16): w = d sc c - dmin m.
__device__ __forceinline__ Coef coef_k4(const K4Bytes& k, int h, int b, uint32_t dm) {
    const float d = util::f16_bits(dm & 0xFFFFu), dmin = util::f16_bits(dm >> 16);
    return Coef{scaled_byte(h ? k.sc47 : k.sc03, b, d, -8388608.f * d),
                scaled_byte(h ? k.m47 : k.m03, b, -dmin, 8388608.f * dmin)};
}
// The same for sub-block s (0..7) from the header words.
__device__ __forceinline__ Coef coef_k4(int s, uint32_t dm, uint32_t S0, uint32_t S1, uint32_t S2) {
    return coef_k4(k4_bytes(S0, S1, S2), s >> 2, s & 3, dm);
}
// Q6_K sub-block coefficient from the tile's fp16 d and the sub-block's int8 scale: w = d sc (c - 32).
__device__ __forceinline__ Coef coef_q6k(float d, int sc) { return Coef{__fmul_rn(d, (float)sc), 0.f}; }
// Whether type T's decode splits D into two bf16 (Q4_0, Q5_0: their weights then come out as bf16 of
// the fp32 w exactly) or rounds it once (the others, whose bound has a min term anyway, and Q6_K).
template <quant::QType T>
constexpr bool kSplitScale = T == quant::QType::Q4_0 || T == quant::QType::Q5_0;
// Type T's off: the code of w = 0 in the types without a min (Q4_0, Q5_0, Q6_K), 0 in the others.
template <quant::QType T>
constexpr int kCodeOffset = T == quant::QType::Q4_0   ? 8
                            : T == quant::QType::Q5_0 ? 16
                            : T == quant::QType::Q6_K ? 32
                                                      : 0;
// Coef as bf16x2 broadcasts: D = hi + lo (two bf16) where kSplitScale<T>, else hi = bf16(D) and lo
// unused; a rounded.
struct ScaleX2 {
    uint32_t hi, lo, a;
};
using util::as_bf16x2;
using util::bf16x2_bits;
template <quant::QType T>
__device__ __forceinline__ ScaleX2 scale_x2(const Coef& k) {
    const __nv_bfloat162 hi = __float2bfloat162_rn(k.D);
    const uint32_t a = bf16x2_bits(__float2bfloat162_rn(k.a));
    if constexpr (!kSplitScale<T>) return ScaleX2{bf16x2_bits(hi), 0u, a};
    const float rest = k.D - __low2float(hi);  // exact: D has at most 19 significant bits
    return ScaleX2{bf16x2_bits(hi), bf16x2_bits(__float2bfloat162_rn(rest)), a};
}
// The bf16 exponent bytes of 128 (0x43434343), which each PRMT below merges with two codes.
constexpr uint32_t kExponentBytes = 0x43434343u;
// kExponentBytes in a register that ptxas cannot see through. A PRMT takes one immediate: with
// both operands known, ptxas makes this one the immediate and moves the selector into a register
// before almost every PRMT; with it opaque, the selector is the immediate and the moves go.
__device__ __forceinline__ uint32_t exponent_bytes_in_register() {
    uint32_t e;
    asm("prmt.b32 %0, %1, 0x43434343, 0x4444;" : "=r"(e) : "r"((uint32_t)threadIdx.x));
    return e;
}
// The bytes `sel` picks of `codes` (two codes < 128) -> the bf16x2 of their two weights.
template <int kOff, bool kSplit>
__device__ __forceinline__ uint32_t pair_bf16x2(uint32_t codes, uint32_t sel, const ScaleX2& s, uint32_t exponent) {
    constexpr uint32_t kBias = (0x4300u | kOff) * 0x00010001u;  // bf16x2 of 128 + off
    const __nv_bfloat162 c = __hsub2(as_bf16x2(__byte_perm(codes, exponent, sel)), as_bf16x2(kBias));
    const __nv_bfloat162 low = kSplit ? __hfma2(c, as_bf16x2(s.lo), as_bf16x2(s.a)) : as_bf16x2(s.a);
    return bf16x2_bits(__hfma2(c, as_bf16x2(s.hi), low));
}
// 8 codes < 128 -> 4 bf16x2 words of the weights. `exponent`: kExponentBytes, as the constant
// (gemv_quant_mma, where the register moved ptxas's allocation and spills) or from
// exponent_bytes_in_register (gemm_quant: 96 fewer instructions in the 256-row instance).
// T: any type but Q8_0, whose off and scale form it takes; s from scale_x2<T>.
template <quant::QType T>
__device__ __forceinline__ void chunk_bf16x2(uint32_t u0, uint32_t u1, const ScaleX2& s, uint32_t r[4],
                                             uint32_t exponent = kExponentBytes) {
    static_assert(T != quant::QType::Q8_0, "Q8_0's codes are signed: chunk_bf16_q8");
    constexpr int kOff = kCodeOffset<T>;
    constexpr bool kSplit = kSplitScale<T>;
    static_assert(kOff >= 0 && kOff < 128, "128 + off is a bf16 of the binade [128, 256)");
    r[0] = pair_bf16x2<kOff, kSplit>(u0, 0x5140u, s, exponent);
    r[1] = pair_bf16x2<kOff, kSplit>(u0, 0x5342u, s, exponent);
    r[2] = pair_bf16x2<kOff, kSplit>(u1, 0x5140u, s, exponent);
    r[3] = pair_bf16x2<kOff, kSplit>(u1, 0x5342u, s, exponent);
}

// Q8_0: w = f * S + C, f = 1 + (q + 128) / 2^15 (the code under 2^0 after flipping its sign bit).
struct AffineQ8 {
    float S, C;
};
__device__ __forceinline__ AffineQ8 affine_q8(float d) {
    return AffineQ8{__fmul_rn(32768.f, d), __fmul_rn(-32896.f, d)};
}
// 8 int8 codes -> 4 bf16x2 words, each the exact fp32 weight rounded.
__device__ __forceinline__ void chunk_bf16_q8(uint32_t u0, uint32_t u1, const AffineQ8& a, uint32_t r[4]) {
    float v[8];
    u0 ^= 0x80808080u;
    u1 ^= 0x80808080u;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const uint32_t sel = 0x7604u | (b << 4);
        v[b] = __uint_as_float(__byte_perm(u0, 0x3F800000u, sel));
        v[4 + b] = __uint_as_float(__byte_perm(u1, 0x3F800000u, sel));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = util::pack_bf16x2(fmaf(v[2 * i], a.S, a.C), fmaf(v[2 * i + 1], a.S, a.C));
}

}  // namespace qdec
}  // namespace cuda
}  // namespace brrr
