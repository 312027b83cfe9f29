// gemv_quant.cu — decode matmuls on GGUF blocks: y[m, n] = sum_k x[m, k] * dequant(W)[n, k] for
// M <= 16 rows, W kept as the file stores it.
//
//   W: N rows of K / block_elems ggml blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K;
//      byte layouts in cpu/quant.h), row_bytes = K / block_elems * block_bytes, no padding;
//   x [M, K] bf16 row-major; y [M, N] fp32; fp32 accumulation.
//
// At batch 1 every weight byte is used once, so the kernel is a stream of blocks. Block sizes
// (18 .. 210 bytes) leave rows and blocks at any even address, so lanes cannot load blocks with
// wide loads in place. Instead:
//   * One warp per output row, kWarps rows per CTA. The CTA walks K in chunks of kChunk values;
//     per chunk each warp copies its row's bytes of the chunk into its own shared-memory buffer
//     with 16-byte loads that bypass L1 (only the unaligned head and tail go byte by byte), and
//     the CTA stages the chunk of all M rows of x as bf16.
//   * A lane then takes "pieces" of 8 consecutive weights (lane, lane + 32, ...): decode8 turns a
//     piece into 8 fp32 weights in registers (never a bf16 copy of W), each a sub-block's scale
//     times its integer value exactly as the CPU dequantizer computes it (explicit _rn products,
//     no contraction), and the piece feeds all M rows of x, read as one 16-byte shared load per row.
//   * Lanes' partial sums meet in a butterfly shuffle; lane 0 writes the M outputs.
// Invariants: a row's sum order (per lane: pieces in order with explicit FMAs; then the
// butterfly) never depends on M or on the other rows, so every row of a batch is bit-identical to
// the same row at M = 1. Unknown types, K not a multiple of the block, M outside [1, 16] are
// refused by the launcher before any launch.
// This is the first step: the blocks as stored. A layout repacked once at load (blocks split
// into 16-byte-aligned quant and scale streams, interleaved so a lane's 16-byte load holds whole
// pieces) would drop the shared-memory bounce and the byte-wise head/tail, and is what a
// tensor-core path for larger M consumes; see docs/kernels/gemv.md, "Quantized GEMV".
#include <cuda_fp16.h>

#include <algorithm>

#include "cpu/quant.h"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

using quant::QType;

constexpr int kMaxRows = 16;            // largest M (the contract in ops.h)
constexpr int kWarps = 8;               // output rows per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 1024;            // K values per step: whole K-quant super-blocks and 32-blocks
constexpr int kPiece = 8;               // weights a lane decodes at once
constexpr int kMaxChunkBytes = kChunk / 32 * 34;          // the widest type per value: Q8_0
constexpr int kWBufBytes = (kMaxChunkBytes + 15 + 15) / 16 * 16;  // + the unaligned head
static_assert(kChunk % 256 == 0, "a chunk must hold whole super-blocks");
static_assert(kChunk / 256 * 210 <= kMaxChunkBytes && kChunk / 256 * 176 <= kMaxChunkBytes &&
              kChunk / 32 * 24 <= kMaxChunkBytes, "Q8_0 must be the widest type per value");

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Per type: elements and bytes of a block, and decode8(block, e, w): w[j] = the dequantized value
// of element e + j of the block (e a multiple of 8), computed as quant_formats.cpp computes it.
template <QType T> struct Format;

template <> struct Format<QType::Q8_0> {
    static constexpr int kElems = 32, kBytes = 34;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const float d = f16_at(b);
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = __fmul_rn((float)(int8_t)b[2 + e + j], d);
    }
};
template <> struct Format<QType::Q4_0> {
    static constexpr int kElems = 32, kBytes = 18;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const float d = f16_at(b);
        const uint8_t* qs = b + 2 + (e & 15);
        const int shift = e >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = __fmul_rn((float)(((qs[j] >> shift) & 15) - 8), d);
    }
};
template <> struct Format<QType::Q4_1> {
    static constexpr int kElems = 32, kBytes = 20;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const float d = f16_at(b), m = f16_at(b + 2);
        const uint8_t* qs = b + 4 + (e & 15);
        const int shift = e >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = __fadd_rn(__fmul_rn((float)((qs[j] >> shift) & 15), d), m);
    }
};
// Q5: the fifth bit of element i is bit i of qh read as a little-endian uint32.
__device__ __forceinline__ uint32_t q5_high_bits(const uint8_t* qh) {
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
}
template <> struct Format<QType::Q5_0> {
    static constexpr int kElems = 32, kBytes = 22;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const float d = f16_at(b);
        const uint32_t qh = q5_high_bits(b + 2);
        const uint8_t* qs = b + 6 + (e & 15);
        const int shift = e >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = ((qs[j] >> shift) & 15) | (((qh >> (e + j)) & 1) << 4);
            w[j] = __fmul_rn((float)(q - 16), d);
        }
    }
};
template <> struct Format<QType::Q5_1> {
    static constexpr int kElems = 32, kBytes = 24;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const float d = f16_at(b), m = f16_at(b + 2);
        const uint32_t qh = q5_high_bits(b + 4);
        const uint8_t* qs = b + 8 + (e & 15);
        const int shift = e >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = ((qs[j] >> shift) & 15) | (((qh >> (e + j)) & 1) << 4);
            w[j] = __fadd_rn(__fmul_rn((float)q, d), m);
        }
    }
};
// Q4_K / Q5_K: element e lies in sub-block s = e / 32, whose values are nibble s % 2 of the
// bytes qs[32 (s / 2) + l]; Q5_K's fifth bit is bit s of qh[l].
template <> struct Format<QType::Q4_K> {
    static constexpr int kElems = 256, kBytes = 144;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const int s = e >> 5, l = e & 31;
        int sc, mn;
        scale_min_k4(s, b + 4, sc, mn);
        const float d = __fmul_rn(f16_at(b), (float)sc), m = __fmul_rn(f16_at(b + 2), (float)mn);
        const uint8_t* qs = b + 16 + 32 * (s >> 1) + l;
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = __fsub_rn(__fmul_rn(d, (float)((qs[j] >> shift) & 15)), m);
    }
};
template <> struct Format<QType::Q5_K> {
    static constexpr int kElems = 256, kBytes = 176;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const int s = e >> 5, l = e & 31;
        int sc, mn;
        scale_min_k4(s, b + 4, sc, mn);
        const float d = __fmul_rn(f16_at(b), (float)sc), m = __fmul_rn(f16_at(b + 2), (float)mn);
        const uint8_t* qh = b + 16 + l;
        const uint8_t* qs = b + 48 + 32 * (s >> 1) + l;
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = ((qs[j] >> shift) & 15) | (((qh[j] >> s) & 1) << 4);
            w[j] = __fsub_rn(__fmul_rn(d, (float)q), m);
        }
    }
};
// Q6_K: element e = 128 h + 32 g + l takes the low nibble (g < 2) or high nibble (g >= 2) of
// ql[64 h + 32 (g % 2) + l], bits 2 g, 2 g + 1 of qh[32 h + l], and scale sc[8 h + 2 g + l / 16].
template <> struct Format<QType::Q6_K> {
    static constexpr int kElems = 256, kBytes = 210;
    __device__ static void decode8(const uint8_t* b, int e, float* w) {
        const int h = e >> 7, g = (e >> 5) & 3, l = e & 31;
        const uint8_t* ql = b + 64 * h + 32 * (g & 1) + l;
        const uint8_t* qh = b + 128 + 32 * h + l;
        const int sc = (int8_t)b[192 + 8 * h + 2 * g + (l >> 4)];
        const float d = __fmul_rn(f16_at(b + 208), (float)sc);
        const int lo_shift = (g >> 1) * 4, hi_shift = 2 * g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = (((ql[j] >> lo_shift) & 15) | (((qh[j] >> hi_shift) & 3) << 4)) - 32;
            w[j] = __fmul_rn(d, (float)q);
        }
    }
};

// This lane's share of copying `bytes` bytes from `src` (any even address) into `dst` (16-byte
// aligned), placed at dst + (src % 16) so that the aligned body moves in 16-byte loads and stores.
// Returns the offset of the first byte in dst.
__device__ __forceinline__ int stage_bytes(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
    const int lead = (int)(reinterpret_cast<uintptr_t>(src) & 15);
    const uint8_t* base = src - lead;  // never read below src
    const int span = lead + bytes;
    for (int i = lane; i < (span + 15) / 16; i += 32) {
        const int lo = 16 * i, hi = lo + 16;
        if (lo >= lead && hi <= span) {
            *reinterpret_cast<uint4*>(dst + lo) = ptx::ld_stream_16(base + lo);
        } else {
            for (int t = max(lo, lead); t < min(hi, span); ++t) dst[t] = base[t];
        }
    }
    return lead;
}

// MR: rows of x the accumulators hold (1, 2, 4, 8 or 16); M <= MR of them are real. The
// arithmetic of a row does not depend on MR or M.
template <QType T, int MR>
__global__ void __launch_bounds__(kThreads) gemv_quant_kernel(const uint8_t* __restrict__ W, const bf16* __restrict__ x,
                                                              float* __restrict__ y, int M, int N, int K, bool x_vec) {
    using F = Format<T>;
    __shared__ __align__(16) bf16 xs[MR * kChunk];  // sized per instance: M = 1 leaves room for more CTAs
    __shared__ __align__(16) uint8_t wbuf[kWarps][kWBufBytes];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x * kWarps + warp;
    const bool active = n < N;
    const size_t row_bytes = (size_t)(K / F::kElems) * F::kBytes;
    const uint8_t* row = W + (size_t)(active ? n : 0) * row_bytes;

    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.f;

    for (int k0 = 0; k0 < K; k0 += kChunk) {
        const int kc = min(kChunk, K - k0);  // a multiple of kElems: K and kChunk are
        __syncthreads();                     // the previous chunk is consumed
        int lead = 0;
        if (active)
            lead = stage_bytes(wbuf[warp], row + (size_t)(k0 / F::kElems) * F::kBytes, kc / F::kElems * F::kBytes, lane);
        if (x_vec) {
            const int per_row = kc / 8;
            for (int i = threadIdx.x; i < M * per_row; i += kThreads) {
                const int m = i / per_row, c = i - m * per_row;
                *reinterpret_cast<uint4*>(xs + m * kChunk + 8 * c) =
                    *reinterpret_cast<const uint4*>(x + (size_t)m * K + k0 + 8 * c);
            }
        } else {
            for (int i = threadIdx.x; i < M * kc; i += kThreads) {
                const int m = i / kc, c = i - m * kc;
                xs[m * kChunk + c] = x[(size_t)m * K + k0 + c];
            }
        }
        __syncthreads();
        if (!active) continue;

        const uint8_t* blocks = wbuf[warp] + lead;
        for (int p = lane; p < kc / kPiece; p += 32) {
            const int k = p * kPiece;
            const int blk = k / F::kElems;
            float w[kPiece];
            F::decode8(blocks + blk * F::kBytes, k - blk * F::kElems, w);
#pragma unroll
            for (int m = 0; m < MR; ++m) {
                if (m < M) {
                    const uint4 xv = *reinterpret_cast<const uint4*>(xs + m * kChunk + k);
                    float a = acc[m];
                    a = __fmaf_rn(w[0], util::bf16_lo(xv.x), a);
                    a = __fmaf_rn(w[1], util::bf16_hi(xv.x), a);
                    a = __fmaf_rn(w[2], util::bf16_lo(xv.y), a);
                    a = __fmaf_rn(w[3], util::bf16_hi(xv.y), a);
                    a = __fmaf_rn(w[4], util::bf16_lo(xv.z), a);
                    a = __fmaf_rn(w[5], util::bf16_hi(xv.z), a);
                    a = __fmaf_rn(w[6], util::bf16_lo(xv.w), a);
                    a = __fmaf_rn(w[7], util::bf16_hi(xv.w), a);
                    acc[m] = a;
                }
            }
        }
    }
    if (!active) return;
#pragma unroll
    for (int m = 0; m < MR; ++m) {
        if (m < M) {
            const float s = util::warp_sum(acc[m]);
            if (lane == 0) y[(size_t)m * N + n] = s;
        }
    }
}

template <QType T>
void launch_type(const void* W, const bf16* x, float* y, int M, int N, int K, cudaStream_t stream) {
    const dim3 grid((unsigned)((N + kWarps - 1) / kWarps));
    const auto* w = static_cast<const uint8_t*>(W);
    const bool x_vec = util::aligned_to(x, 16);
    if (M == 1) gemv_quant_kernel<T, 1><<<grid, kThreads, 0, stream>>>(w, x, y, M, N, K, x_vec);
    else if (M == 2) gemv_quant_kernel<T, 2><<<grid, kThreads, 0, stream>>>(w, x, y, M, N, K, x_vec);
    else if (M <= 4) gemv_quant_kernel<T, 4><<<grid, kThreads, 0, stream>>>(w, x, y, M, N, K, x_vec);
    else if (M <= 8) gemv_quant_kernel<T, 8><<<grid, kThreads, 0, stream>>>(w, x, y, M, N, K, x_vec);
    else gemv_quant_kernel<T, 16><<<grid, kThreads, 0, stream>>>(w, x, y, M, N, K, x_vec);
    CUDA_CHECK_LAUNCH("gemv_quant_kernel");
}

}  // namespace

void gemv_quant(int type, const void* W, const bf16* x, float* y, int M, int N, int K, cudaStream_t stream) {
    BRRR_CHECK_ARG(quant::known_type(type),
                   "gemv_quant: GGML type id " << type << " is not a quantized type this kernel runs "
                   "(q4_0=2, q4_1=3, q5_0=6, q5_1=7, q8_0=8, q4_k=12, q5_k=13, q6_k=14)");
    const QType t = static_cast<QType>(type);
    const int elems = quant::block_elems(t);
    BRRR_CHECK_ARG(M >= 1 && M <= kMaxRows, "gemv_quant: M=" << M << " rows; the kernel takes 1 to " << kMaxRows);
    BRRR_CHECK_ARG(N >= 1, "gemv_quant: N must be >= 1, got " << N);
    BRRR_CHECK_ARG(K >= 1 && K % elems == 0,
                   "gemv_quant: K=" << K << " is not a positive multiple of " << quant::type_name(t) << "'s block of "
                                    << elems << " values; a row must be whole blocks");
    BRRR_CHECK_ARG(W != nullptr && x != nullptr && y != nullptr, "gemv_quant: W, x and y must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(W, 2) && util::aligned_to(x, 2),
                   "gemv_quant: W and x must be 2-byte aligned (fp16 scales, bf16 activations)");
    switch (t) {
        case QType::Q8_0: return launch_type<QType::Q8_0>(W, x, y, M, N, K, stream);
        case QType::Q4_0: return launch_type<QType::Q4_0>(W, x, y, M, N, K, stream);
        case QType::Q4_1: return launch_type<QType::Q4_1>(W, x, y, M, N, K, stream);
        case QType::Q5_0: return launch_type<QType::Q5_0>(W, x, y, M, N, K, stream);
        case QType::Q5_1: return launch_type<QType::Q5_1>(W, x, y, M, N, K, stream);
        case QType::Q4_K: return launch_type<QType::Q4_K>(W, x, y, M, N, K, stream);
        case QType::Q5_K: return launch_type<QType::Q5_K>(W, x, y, M, N, K, stream);
        case QType::Q6_K: return launch_type<QType::Q6_K>(W, x, y, M, N, K, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
