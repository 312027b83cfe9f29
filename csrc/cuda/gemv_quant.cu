// gemv_quant.cu — decode matmuls on quantized weights in the tiles of qlayout.h, against int8
// activations: y[m, n] = sum_k xq[m, k] * dequant(W)[n, k] for M <= 16 rows, every Epilogue; plus
// the activation quantizers that feed it, the dequantizers prefill uses and the quantized embed.
//
//   W: N rows of T = ceil(K / 256) tiles (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; Q6_K's
//      fp16 d in the tail), 16-byte aligned; xq [M, K / 32] quant::ActBlock; fp32 results.
//
// The arithmetic is the CPU engine's (quant_gemv.cpp): every type is cut into chunks of 32 values
// that line up with one ActBlock, each half (16 values) of a chunk has unsigned codes c_i, a weight
// scale s and a bias b with w_i = s * c_i + b, and
//   dot = sum over chunk halves  s * d_x * (sum_i c_i q_i)  +  b * dsum_half,
// the integer sums exact in int32, the rest fp32 (Q8_0: signed codes, no bias); where both halves
// share s and b (the 32-value types) the chunk is one integer sum and one pair of fp32 terms.
// At batch 1 every weight byte is used once, so the kernel is a stream of 16-byte loads:
//   * A warp owns one output row (SwiGLU: gate row j with up row H + j; RopeKV: dim i with dim
//     i + hd/2 of one head, so the pair meets in registers as in gemv.cu). Its lanes take
//     consecutive 16-byte "pieces" of the row's quant bytes (a warp instruction reads 512 bytes of
//     2-4 neighbouring tiles) with L1-bypassing loads. A warp's work is a chain of chunks (U pieces
//     a lane of each of its rows) across its units; two register buffers let it issue the next
//     chunk's loads before this chunk's arithmetic, so its loads stay in flight while it decodes
//     (without that, every warp of a one-wave grid alternates between waiting and computing).
//   * A piece is 16 quant bytes: 32 nibble codes (the two halves of one 32-block, or half h of two
//     K-quant sub-blocks) or 16 int8 codes (Q8_0). Codes are unpacked a 32-bit word at a time with
//     masks and shifts (the Q5 fifth bits spread into bit 4 of each byte by one multiply) and
//     multiplied against the ActBlock's int8 values by __dp4a: four products per instruction, no
//     per-value conversion. A 4-bit type's high nibbles are multiplied in place (masked, read
//     unsigned: 16 times the code) and the exact sum shifted down once. The loop is short of issue
//     slots as much as of bytes, so its instructions count: Q4_K, Q6_K and Q4_1 address x from the
//     chunk's first tile (the pieces' offsets immediates). The tile's header fields the piece needs
//     (fp16 d / m, the packed 6-bit K-quant scales, Q6_K's int8 scales and tail d) are loaded per
//     piece: lanes of one tile read the same bytes, one transaction. A lane's pieces are always the
//     same piece of their tiles (lane % kPieces), so which scale it decodes is a per-lane constant:
//     the K-quant scale pair comes out of the packed bytes without a branch.
//   * x: ActBlocks made by an earlier kernel, read with 16-byte loads that stay in L1 (every warp
//     of the CTA reads the same blocks); or, at M <= 2 (gemv_quant_in), bf16 rows or fp32 rows to
//     RMS-normalize that each CTA quantizes into shared memory first, one thread per 32-value
//     block, with the standalone quantizers' arithmetic (so the same bits). Such a grid is one
//     wave of 8-warp CTAs whose warps walk the same number of output rows each, so the input is
//     quantized a few hundred times, not once per 4 rows, and no warp's last round runs alone;
//     the first rows' weight loads are in flight meanwhile. A walk of many rounds (the 8B's w13)
//     ends with its slowest warps, so there the warps take their units past the first from
//     counters instead (QuantGemvInput::counters: tickets asked for two units ahead, eight
//     counters in lines of their own, reset by the last CTA out): balanced as the hardware
//     balances many short CTAs, without quantizing the input once per CTA. A vocabulary-sized
//     matrix of a 32-value type (past tuning::kGemvQuantFusedMaxUnits units) is the exception: its
//     cheap decode streams faster through the standalone quantizer and the ActBlock grid of many
//     small CTAs; a K-quant one (the Q6_K LM head of K-quant files) is fed like the w13.
//   * A matrix of two types (gemv_quant_pair: a K-quant file's Q6_K wv beside Q4_K / Q5_K wq | wk)
//     runs as one launch. The grid's warps are split between the parts so that the warp with the
//     most bytes to stream has the fewest (split_warps); a warp walks only its part's units, in
//     that type's copy of the walk, so the kernel needs the larger type's registers (128: 8-warp
//     CTAs, 2 an SM, as the one-type fused grids), not those of both types' code in one loop.
//     One prologue and one epilogue serve both parts, where part by part took a quantizer, two
//     GEMVs into fp32 staging and rope_kv_append.
//   * Launched with PDL (launch.cuh): it issues the first pieces' loads before its wait (weights
//     never depend on the kernel before) and lets the next kernel launch once past the wait and
//     the prologue; a 32-value type's bf16-input kernel lets it launch at its first instruction.
//   * A chunk is 4 pieces a lane (2 for a pair of rows) at M <= 2, half that above. A 32-value
//     type at one row takes half-size chunks where their fewer registers let the fused grid walk
//     at most half the rounds (the 8B's w2): its decode is a few instructions a piece, so the
//     extra resident warps pay; elsewhere half-size chunks only halve the bytes in flight.
// Invariants: a lane's pieces and their sums run in a fixed order, whatever the chunk size, and
// the lanes meet in a butterfly, so a row's result never depends on M, on the chunk or on the
// other rows (batched rows are bit-identical to the row alone). Pieces past K (32-value types
// whose last tile is partial) are never read. The launcher refuses unknown types, K that is not
// whole blocks, M outside [1, 16], null or misaligned pointers before any launch.
// Measured alternatives and why they lost: docs/kernels/gemv.md, "Quantized GEMV".
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cpu/quant.h"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/qlayout.h"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

using quant::ActBlock;
using quant::QType;

constexpr int kMaxRows = 16;  // largest M (the contract in ops.h)
constexpr int kWarps = 4;     // units per CTA of an ActBlock-input grid: many small CTAs fill the SMs evenly
// Units per CTA of a fused-input grid (one wave, every CTA quantizing the whole input): larger CTAs
// quantize it fewer times (fewer L2 reads of x) and with fewer blocks a thread.
constexpr int kFusedWarps = 8;
// Warps of gemv_quant_kernel's CTA.
constexpr int cta_warps(bool fused) { return fused ? kFusedWarps : kWarps; }

using util::Pairing;
using util::unit_rows;

// QuantGemvInput::counters of a fed grid: a ticket counter per class of warps (warp w takes the
// units of class w % kTicketClasses), each in a 256-byte line of its own so that the classes' atomics
// go to different L2 slices, then the count of CTAs done.
constexpr int kTicketClasses = 8, kCounterStride = 64;
constexpr int kCtasDoneWord = kTicketClasses * kCounterStride;
static_assert(kCtasDoneWord < kGemvQuantCounterWords, "QuantGemvInput::counters holds the layout");
// Tickets lane 0 of a warp holds: the atomic for a unit goes out this many units before the unit.
constexpr int kTicketsAhead = 2;

using util::f16_bits;
using util::spread4;

// acc + the sum of 16 products of signed bytes.
__device__ __forceinline__ int dot16(uint4 c, uint4 x, int acc = 0) {
    int s = __dp4a((int)c.x, (int)x.x, acc);
    s = __dp4a((int)c.y, (int)x.y, s);
    s = __dp4a((int)c.z, (int)x.z, s);
    return __dp4a((int)c.w, (int)x.w, s);
}
// The sum of the 16 high nibbles of q times x's 16 values: each nibble multiplied in place (16 times
// its value: its byte masked and read unsigned), the exact multiple of 16 shifted out once, where
// bringing the nibbles down took a shift and a mask a word.
__device__ __forceinline__ int dot16_high_nibbles(uint4 q, uint4 x) {
    int s = ptx::dp4a_u8_s8(q.x & 0xF0F0F0F0u, (int)x.x, 0);
    s = ptx::dp4a_u8_s8(q.y & 0xF0F0F0F0u, (int)x.y, s);
    s = ptx::dp4a_u8_s8(q.z & 0xF0F0F0F0u, (int)x.z, s);
    return ptx::dp4a_u8_s8(q.w & 0xF0F0F0F0u, (int)x.w, s) >> 4;
}
__device__ __forceinline__ uint4 and_shift(uint4 v, int shift, uint32_t mask) {
    return make_uint4((v.x >> shift) & mask, (v.y >> shift) & mask, (v.z >> shift) & mask, (v.w >> shift) & mask);
}
__device__ __forceinline__ uint4 shl4(uint4 v) { return make_uint4(v.x << 4, v.y << 4, v.z << 4, v.w << 4); }
__device__ __forceinline__ uint4 or4(uint4 a, uint4 b) { return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w); }
// The fifth bits of 16 values v0 .. v0 + 15 of a Q5 block (bit v of qh), as bit 4 of each byte.
__device__ __forceinline__ uint4 q5_bits(uint32_t qh, int v0) {
    const uint32_t b = qh >> v0;
    return make_uint4(spread4(b & 15), spread4((b >> 4) & 15), spread4((b >> 8) & 15), spread4((b >> 12) & 15));
}
// qlayout::scale_min_k4 of sub-blocks 2g and 2g + 1 at once, without a branch: scales in bytes 0 / 1 of
// `sc`, mins in bytes 0 / 1 of `m`. Both pairs sit at the same 16-bit offset of their words
// (bytes 2g, 2g + 1 of S0 / S1 for g < 2; bytes 2g - 4, 2g - 3 of S2 with the top bits of S0 / S1
// for g >= 2). A lane's g never changes (its pieces are always piece lane % 8 of a tile), so the
// selects are uniform per lane and the shifts loop-invariant. These are the bits of
// quant_decode.cuh's k4_bytes at one 16-bit offset, kept as their own expressions: through
// k4_bytes the one-row kernels came out slower (docs/kernels/gemv.md, "scale pair via k4_bytes").
__device__ __forceinline__ void scale_min_pair(int g, uint32_t S0, uint32_t S1, uint32_t S2, uint32_t& sc, uint32_t& m) {
    const int sh = 16 * (g & 1);
    const uint32_t a = S0 >> sh, b = S1 >> sh, c = S2 >> sh;
    sc = g < 2 ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    m = g < 2 ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
}

// The weight side of one piece as loaded: 16 quant bytes and the header bits it needs (decoded
// after the loads land, so that every load of a step is in flight at once).
struct Raw {
    uint4 q;
    uint4 h;   // header words (per type)
    uint4 qh;  // Q5_K: the 16 high-bit bytes of the piece's values
};
// The activation side of one piece: term A (and B) = (d_x, dsum of the half, 16 int8 values).
struct XPiece {
    float dA, sA, dB, sB;
    uint4 qA, qB;
};
__device__ __forceinline__ void x_half(const ActBlock* b, int half, float& d, float& dsum, uint4& q) {
    const float4 head = *reinterpret_cast<const float4*>(b);
    d = head.x;
    dsum = half ? head.w : head.z;
    q = *reinterpret_cast<const uint4*>(b->qs + 16 * half);
}

// Per type: kTileBytes, kPieces per tile, load(tile, tail_d, pi), x(xrow, t, pi) and dot(raw, x, pi, acc)
// for piece pi of tile t (8 ActBlocks a tile). kPieces divides 32, so a lane's pieces are always
// piece lane % kPieces of their tiles: pi is a per-lane constant and whatever it selects (fields,
// shifts) is loop-invariant.
template <QType T> struct Q;

// Q8_0: piece pi = half pi % 2 of block pi / 2; signed codes, no bias.
template <> struct Q<QType::Q8_0> {
    static constexpr int kTileBytes = 272, kPieces = 16;
    __device__ static Raw load(const uint8_t* t, const uint8_t*, int pi) {
        Raw r;
        r.q = ptx::ld_stream_16(t + 16 + 16 * pi);
        r.h.x = __ldg(reinterpret_cast<const unsigned short*>(t) + (pi >> 1));
        return r;
    }
    __device__ static void x(const ActBlock* xr, int t, int pi, XPiece& v) { x_half(xr + 8 * t + (pi >> 1), pi & 1, v.dA, v.sA, v.qA); }
    __device__ static float dot(const Raw& r, const XPiece& v, int, float acc) {
        return fmaf(f16_bits(r.h.x) * v.dA, (float)dot16(r.q, v.qA), acc);
    }
};

// The 32-value nibble types: piece pi = block pi of the tile, low nibbles values 0-15, high 16-31.
// qA / qB: the block's values 0-15 / 16-31; dA its d_x, sA its whole dsum.
__device__ __forceinline__ void x_block(const ActBlock* b, XPiece& v) {
    const float4 head = *reinterpret_cast<const float4*>(b);
    v.dA = head.x;
    v.sA = head.z + head.w;
    v.qA = *reinterpret_cast<const uint4*>(b->qs);
    v.qB = *reinterpret_cast<const uint4*>(b->qs + 16);
}
// Both halves of a 32-value block share its s, b and d_x: sum is the block's integer sum.
__device__ __forceinline__ float one_block(int sum, float s, float b, const XPiece& v, float acc) {
    acc = fmaf(s * v.dA, (float)sum, acc);
    return fmaf(b, v.sA, acc);
}
template <int kQs, int kM, int kQh>  // field offsets in the tile (-1: none)
struct Nibble32 {
    static constexpr int kPieces = 8;
    __device__ static Raw load(const uint8_t* t, const uint8_t*, int pi) {
        Raw r;
        r.q = ptx::ld_stream_16(t + kQs + 16 * pi);
        r.h.x = __ldg(reinterpret_cast<const unsigned short*>(t) + pi);
        if (kM >= 0) r.h.y = __ldg(reinterpret_cast<const unsigned short*>(t + kM) + pi);
        if (kQh >= 0) r.h.z = __ldg(reinterpret_cast<const uint32_t*>(t + kQh) + pi);
        return r;
    }
    __device__ static void x(const ActBlock* xr, int t, int pi, XPiece& v) { x_block(xr + 8 * t + pi, v); }
    // The block's integer sum of codes times x (Q5: the fifth bits spread into bit 4 of each byte).
    __device__ static int sum(const Raw& r, const XPiece& v) {
        const uint4 lo = and_shift(r.q, 0, 0x0F0F0F0Fu);
        if (kQh < 0) return dot16(lo, v.qA, dot16_high_nibbles(r.q, v.qB));
        const uint4 hi = or4(and_shift(r.q, 4, 0x0F0F0F0Fu), q5_bits(r.h.z, 16));
        return dot16(or4(lo, q5_bits(r.h.z, 0)), v.qA, dot16(hi, v.qB));
    }
};
template <> struct Q<QType::Q4_0> : Nibble32<16, -1, -1> {
    static constexpr int kTileBytes = 144;
    __device__ static float dot(const Raw& r, const XPiece& v, int, float acc) {
        const float d = f16_bits(r.h.x);
        return one_block(sum(r, v), d, -8.f * d, v, acc);
    }
};
template <> struct Q<QType::Q4_1> : Nibble32<32, 16, -1> {
    static constexpr int kTileBytes = 160;
    __device__ static float dot(const Raw& r, const XPiece& v, int, float acc) {
        return one_block(sum(r, v), f16_bits(r.h.x), f16_bits(r.h.y), v, acc);
    }
};
template <> struct Q<QType::Q5_0> : Nibble32<48, -1, 16> {
    static constexpr int kTileBytes = 176;
    __device__ static float dot(const Raw& r, const XPiece& v, int, float acc) {
        const float d = f16_bits(r.h.x);
        return one_block(sum(r, v), d, -16.f * d, v, acc);
    }
};
template <> struct Q<QType::Q5_1> : Nibble32<64, 16, 32> {
    static constexpr int kTileBytes = 192;
    __device__ static float dot(const Raw& r, const XPiece& v, int, float acc) {
        return one_block(sum(r, v), f16_bits(r.h.x), f16_bits(r.h.y), v, acc);
    }
};

// Q4_K / Q5_K: piece pi = bytes 16 pi .. of qs, i.e. g = pi / 2, h = pi % 2: its low nibbles are
// half h of sub-block 2g, its high nibbles half h of sub-block 2g + 1 (Q5_K: bits 2g, 2g + 1 of qh
// bytes 16 h ..).
template <bool kQ5>
struct QK45 {
    static constexpr int kTileBytes = kQ5 ? 176 : 144, kPieces = 8, kQs = kQ5 ? 48 : 16;
    __device__ static Raw load(const uint8_t* t, const uint8_t*, int pi) {
        Raw r;
        r.q = ptx::ld_stream_16(t + kQs + 16 * pi);
        r.h = __ldg(reinterpret_cast<const uint4*>(t));
        if (kQ5) r.qh = __ldg(reinterpret_cast<const uint4*>(t + 16) + (pi & 1));
        return r;
    }
    __device__ static void x(const ActBlock* xr, int t, int pi, XPiece& v) {
        const int g = pi >> 1, h = pi & 1;
        x_half(xr + 8 * t + 2 * g, h, v.dA, v.sA, v.qA);
        x_half(xr + 8 * t + 2 * g + 1, h, v.dB, v.sB, v.qB);
    }
    __device__ static float dot(const Raw& r, const XPiece& v, int pi, float acc) {
        const int g = pi >> 1;
        uint4 lo = and_shift(r.q, 0, 0x0F0F0F0Fu), hi = and_shift(r.q, 4, 0x0F0F0F0Fu);
        int sum_hi = 0;  // Q4_K: the high nibbles multiplied in place (hi unused)
        if (kQ5) {
            lo = or4(lo, shl4(and_shift(r.qh, 2 * g, 0x01010101u)));
            hi = or4(hi, shl4(and_shift(r.qh, 2 * g + 1, 0x01010101u)));
        } else {
            sum_hi = dot16_high_nibbles(r.q, v.qB);
        }
        const float d = f16_bits(r.h.x & 0xFFFF), dmin = f16_bits(r.h.x >> 16);
        uint32_t sc, m;
        scale_min_pair(g, r.h.y, r.h.z, r.h.w, sc, m);
        const float s0 = d * (float)(sc & 0xFF), b0 = -(dmin * (float)(m & 0xFF));
        const float s1 = d * (float)(sc >> 8), b1 = -(dmin * (float)(m >> 8));
        acc = fmaf(s0 * v.dA, (float)dot16(lo, v.qA), acc);
        acc = fmaf(b0, v.sA, acc);
        acc = fmaf(s1 * v.dB, (float)(kQ5 ? dot16(hi, v.qB) : sum_hi), acc);
        return fmaf(b1, v.sB, acc);
    }
};
template <> struct Q<QType::Q4_K> : QK45<false> {};
template <> struct Q<QType::Q5_K> : QK45<true> {};

// Q6_K: piece pi = ql bytes 16 pi .. = 64 h + 32 k + 16 hh: low nibbles are values 128 h + 32 k +
// 16 hh + i (chunk 4 h + k), high nibbles the same + 64 (chunk 4 h + k + 2); their two high bits
// are bits 2k and 2k + 4 of qh bytes 32 h + 16 hh + i; scales sc[8 h + 2 k + hh] and the + 4th.
template <> struct Q<QType::Q6_K> {
    static constexpr int kTileBytes = 208, kPieces = 8;
    __device__ static Raw load(const uint8_t* t, const uint8_t* tail_d, int pi) {
        const int h = pi >> 2, hh = pi & 1;
        Raw r;
        r.q = ptx::ld_stream_16(t + 16 + 16 * pi);
        r.qh = __ldg(reinterpret_cast<const uint4*>(t + 144) + 2 * h + hh);
        r.h.x = __ldg(reinterpret_cast<const unsigned short*>(tail_d));
        const uint2 sc = __ldg(reinterpret_cast<const uint2*>(t) + h);  // scales 8h .. 8h + 7
        r.h.y = sc.x;
        r.h.z = sc.y;
        return r;
    }
    __device__ static void x(const ActBlock* xr, int t, int pi, XPiece& v) {
        const int h = pi >> 2, k = (pi >> 1) & 1, hh = pi & 1;
        x_half(xr + 8 * t + 4 * h + k, hh, v.dA, v.sA, v.qA);
        x_half(xr + 8 * t + 4 * h + k + 2, hh, v.dB, v.sB, v.qB);
    }
    __device__ static float dot(const Raw& r, const XPiece& v, int pi, float acc) {
        const int k = (pi >> 1) & 1;
        const uint4 lo = or4(and_shift(r.q, 0, 0x0F0F0F0Fu), shl4(and_shift(r.qh, 2 * k, 0x03030303u)));
        const uint4 hi = or4(and_shift(r.q, 4, 0x0F0F0F0Fu), shl4(and_shift(r.qh, 2 * k + 4, 0x03030303u)));
        // the piece's two int8 scales: byte 2k + hh of scales 8h .. 8h + 3 and of 8h + 4 .. 8h + 7
        const int at = 8 * (pi & 3);
        const float d = f16_bits(r.h.x);
        const float s0 = d * (float)((int)(r.h.y << (24 - at)) >> 24), s1 = d * (float)((int)(r.h.z << (24 - at)) >> 24);
        acc = fmaf(s0 * v.dA, (float)dot16(lo, v.qA), acc);
        acc = fmaf(-32.f * s0, v.sA, acc);
        acc = fmaf(s1 * v.dB, (float)dot16(hi, v.qB), acc);
        return fmaf(-32.f * s1, v.sB, acc);
    }
};

// ---- activations: quant_gemv.cpp's quantize_activations, bit for bit ---------------------------
// One warp per 32-block, lane i holds value i. --use_fast_math makes '/' approximate, hence the
// explicit IEEE divisions; the half sums are integers (exact in any order).
__device__ __forceinline__ void quantize_block(float v, ActBlock* out, int lane) {
    const float amax = util::warp_max(fabsf(v));  // fmaxf ignores NaN, as std::max(amax, NaN) does
    const float d = __fdiv_rn(amax, 127.f);
    const float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    const int q = (int)roundf(__fmul_rn(v, id));
    out->qs[lane] = (int8_t)q;
    int s = q;
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);  // within each half
    const int s_hi = __shfl_sync(0xffffffffu, s, 16);
    if (lane == 0) *reinterpret_cast<float4*>(out) = make_float4(d, d, __fmul_rn(d, (float)s), __fmul_rn(d, (float)s_hi));
}

constexpr int kActWarps = 8;

__global__ void quantize_act_bf16_kernel(const bf16* __restrict__ x, ActBlock* __restrict__ xq, int n_blocks) {
    pdl_wait();
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * kActWarps + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    quantize_block(__bfloat162float(x[(size_t)b * 32 + lane]), xq + b, lane);
}

// The prologue's lanes a 32-value block (G), a function of the row's length alone, so that every
// kernel quantizing a row (fused prologues of any CTA size, the standalone quantizer) gives it the
// same bits: 4 for rows of at most 64 blocks (the 1B's 2048-value rows: 256 lanes, an 8-warp CTA's
// threads, where a thread a block left 192 of them waiting at the barrier), 2 for rows of at most
// 128 (the 8B's 4096-value rows), else 1 (docs/kernels/gemv.md, "prologue by lanes a block").
constexpr int kFourLaneMaxBlocks = 64, kTwoLaneMaxBlocks = 128;
__host__ __device__ constexpr int prologue_lanes(int n_blocks) {
    return n_blocks <= kFourLaneMaxBlocks ? 4 : n_blocks <= kTwoLaneMaxBlocks ? 2 : 1;
}

// One ActBlock's codes by G neighbouring lanes (G = 1, 2 or 4), lane g of the group holding the
// block's values V g .. V g + V - 1 (V = 32 / G) as v(0) .. v(V - 1): quantize_block's
// arithmetic (the max and the integer sums do not depend on order), so the same bits whatever G.
// Stores this lane's codes to qs (the block's) where `live`; returns d; s0 / s1, the integer sums
// of the block's halves, are right in lane g = 0. Every lane of the warp calls it (the shuffles).
// `v` is called with constant indices (unrolled), so bf16 words need not be widened first.
template <int G, typename Values>
__device__ __forceinline__ float quantize_codes(Values v, int8_t* qs, bool live, int& s0, int& s1) {
    constexpr int V = 32 / G;
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i) amax = fmaxf(amax, fabsf(v(i)));
#pragma unroll
    for (int o = 1; o < G; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.f);
    const float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    uint32_t words[V / 4];
    int s[2] = {0, 0};  // this lane's codes in the block's half 0 / half 1 (G > 1: all in s[0])
#pragma unroll
    for (int w = 0; w < V / 4; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int q = (int)roundf(__fmul_rn(v(4 * w + j), id));
            s[G == 1 ? w >> 2 : 0] += q;
            word |= (uint32_t)(q & 0xFF) << (8 * j);
        }
        words[w] = word;
    }
    if (live) {
        if constexpr (V >= 16) {
#pragma unroll
            for (int w = 0; w < V / 4; w += 4)
                reinterpret_cast<uint4*>(qs)[w / 4] = make_uint4(words[w], words[w + 1], words[w + 2], words[w + 3]);
        } else {
            reinterpret_cast<uint2*>(qs)[0] = make_uint2(words[0], words[1]);  // V = 8
        }
    }
    if constexpr (G == 1) {
        s0 = s[0], s1 = s[1];
    } else {
        int half = s[0];  // G = 4: lanes 2h, 2h + 1 hold half h
        if (G == 4) half += __shfl_xor_sync(0xffffffffu, half, 1);
        s0 = half;
        s1 = __shfl_down_sync(0xffffffffu, half, G / 2);
    }
    return d;
}
// Calls f(b, g, live) for lane g of block b's group, over a row of n_blocks blocks and the CTA's
// threads, G lanes a block. G > 1: the loop is warp-uniform (the group's shuffles), so lanes past
// the row run it too, with live = false.
template <int G, typename F>
__device__ __forceinline__ void for_each_block_lane(int n_blocks, F&& f) {
    const int lane = G > 1 ? threadIdx.x & 31 : 0;
    for (int base = threadIdx.x - lane; base < G * n_blocks; base += blockDim.x) {
        const int i = base + lane;
        f(i / G, i % G, G == 1 || i < G * n_blocks);
    }
}
__device__ __forceinline__ void set_header(ActBlock* out, float d, float s0, float s1) {
    *reinterpret_cast<float4*>(out) = make_float4(d, d, __fmul_rn(d, s0), __fmul_rn(d, s1));
}

// Normalized inputs, rmsnorm(x) * norm_w, in one pass over x. A block's codes do not depend on
// the row's rstd: quantizing v = x * w under the scale amax(v) / 127 gives, in real arithmetic,
// the codes of rstd * v under rstd * amax(v) / 127. So each group of threads quantizes its blocks
// of x * w and keeps each block's sum of x^2 while the row's other blocks load; then one warp per
// row adds the blocks' sums (lane l takes blocks l, l + 32, ..., then a butterfly: a fixed order
// whatever the CTA size, so the fused GEMV prologue and the standalone kernel agree bit for bit)
// and every block's scale is multiplied by the row's rstd. A block's sum of x^2 is each lane's
// values in order, then the lanes of its group by a butterfly; G depends on K alone, so every
// kernel sums a row's blocks alike. Against quantizing rstd * x * w the scales differ by fp32
// roundings and a code on a rounding boundary may move by one. One read of x and of norm_w, where
// a separate sum-of-squares pass read x twice.
// Pass 1: row's blocks -> codes, header {d, d, s0, s1} (integer sums, exact in fp32), ss[b].
template <int G>
__device__ __forceinline__ void quantize_norm_blocks(const float* __restrict__ row, const bf16* __restrict__ norm_w,
                                                     ActBlock* out, float* ss, int K) {
    constexpr int V = 32 / G;
    for_each_block_lane<G>(K / 32, [&](int b, int g, bool live) {
        float v[V], sq = 0.f;
#pragma unroll
        for (int k = 0; k < V / 4; ++k) {
            const float4 q = live ? reinterpret_cast<const float4*>(row + 32 * b + V * g)[k] : float4{};
            const uint2 w = live ? reinterpret_cast<const uint2*>(norm_w + 32 * b + V * g)[k] : uint2{};
            v[4 * k + 0] = __fmul_rn(q.x, util::bf16_lo(w.x));
            v[4 * k + 1] = __fmul_rn(q.y, util::bf16_hi(w.x));
            v[4 * k + 2] = __fmul_rn(q.z, util::bf16_lo(w.y));
            v[4 * k + 3] = __fmul_rn(q.w, util::bf16_hi(w.y));
            sq = __fadd_rn(sq, __fmul_rn(q.x, q.x));
            sq = __fadd_rn(sq, __fmul_rn(q.y, q.y));
            sq = __fadd_rn(sq, __fmul_rn(q.z, q.z));
            sq = __fadd_rn(sq, __fmul_rn(q.w, q.w));
        }
        int s0, s1;
        const float d = quantize_codes<G>([&](int j) { return v[j]; }, out[b].qs + V * g, live, s0, s1);
        // the group's sums by a butterfly: G = 4 gives every lane (l0 + l1) + (l2 + l3) (a sum and
        // its mirror are the same bits)
#pragma unroll
        for (int o = 1; o < G; o <<= 1) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, o));
        if (live && g == 0) {
            *reinterpret_cast<float4*>(out + b) = make_float4(d, d, (float)s0, (float)s1);
            ss[b] = sq;
        }
    });
}
// Pass 2, after a barrier over pass 1 of M rows (x_stride blocks apart): rstd per row, then every
// header scaled. Ends with a barrier.
template <int MR>
__device__ void scale_norm_blocks(ActBlock* xs, const float* ss, int M, int K, float eps, int x_stride) {
    __shared__ float rstd[MR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < M) {
        const float* row_ss = ss + (size_t)warp * x_stride;
        float sum = 0.f;
        for (int b = lane; b < K / 32; b += 32) sum = __fadd_rn(sum, row_ss[b]);
        sum = util::warp_sum(sum);
        if (lane == 0) rstd[warp] = rsqrtf(__fdiv_rn(sum, (float)K) + eps);
    }
    __syncthreads();
    for (int m = 0; m < M; ++m) {
        for (int b = threadIdx.x; b < K / 32; b += blockDim.x) {
            ActBlock* blk = xs + (size_t)m * x_stride + b;
            const float4 h = *reinterpret_cast<const float4*>(blk);
            set_header(blk, __fmul_rn(h.x, rstd[m]), h.z, h.w);
        }
    }
    __syncthreads();
}
// Row's ActBlocks from bf16 values, G lanes a block (prologue_lanes), one block's loads at a
// time: the first weight loads are live across this prologue, so more loads in flight cost the
// GEMV registers (staging the row by cp.async instead lost: docs/kernels/gemv.md).
template <int G>
__device__ __forceinline__ void quantize_bf16_row(const bf16* __restrict__ row, ActBlock* out, int K) {
    constexpr int V = 32 / G;
    for_each_block_lane<G>(K / 32, [&](int b, int g, bool live) {
        uint4 q[V / 8];
#pragma unroll
        for (int k = 0; k < V / 8; ++k) q[k] = live ? reinterpret_cast<const uint4*>(row + 32 * b + V * g)[k] : uint4{};
        const auto value = [&](int j) {  // value j: half j % 2 of word j / 2
            const uint4 r = q[j >> 3];
            const int w = (j >> 1) & 3;
            const uint32_t word = w == 0 ? r.x : w == 1 ? r.y : w == 2 ? r.z : r.w;
            return j & 1 ? util::bf16_hi(word) : util::bf16_lo(word);
        };
        int s0, s1;
        const float d = quantize_codes<G>(value, out[b].qs + V * g, live, s0, s1);
        if (live && g == 0) set_header(out + b, d, (float)s0, (float)s1);
    });
}

// One CTA per row; dynamic shared memory: the row's K / 32 block sums of squares.
constexpr int kNormThreads = 256;
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_quantize_act_kernel(const float* __restrict__ x, const bf16* __restrict__ norm_w, float eps,
                                ActBlock* __restrict__ xq, int K) {
    extern __shared__ float block_ss[];  // [K / 32]
    pdl_wait();
    pdl_launch_dependents();
    ActBlock* out = xq + (size_t)blockIdx.x * (K / 32);
    if (prologue_lanes(K / 32) == 4) quantize_norm_blocks<4>(x + (size_t)blockIdx.x * K, norm_w, out, block_ss, K);
    else if (prologue_lanes(K / 32) == 2) quantize_norm_blocks<2>(x + (size_t)blockIdx.x * K, norm_w, out, block_ss, K);
    else quantize_norm_blocks<1>(x + (size_t)blockIdx.x * K, norm_w, out, block_ss, K);
    __syncthreads();
    scale_norm_blocks<1>(out, block_ss, 1, K, eps, K / 32);
}

// Where the kernel's activations come from: ActBlocks made by an earlier kernel, or rows it
// quantizes into shared memory itself (M <= kFusedRows).
enum class XIn { Blocks, Bf16, Norm };
constexpr int kFusedRows = 2;

// One part of W: rows [row0, ...) of the matrix in one type's tiles.
struct QPart {
    const uint8_t* W;
    const uint8_t* tail;  // Q6_K: the part's [rows, T] fp16 d array
    size_t row_stride;    // bytes
    int row0;
};

// A matrix of 32-value blocks throughout (both parts, in a matrix of two types): the half-size
// chunks and the early trigger below are its kernels' alone.
template <QType T, QType T1>
constexpr bool kBlocks32 = quant::block_elems(T) == quant::kBlock32 && quant::block_elems(T1) == quant::kBlock32;

struct QArgs {
    QPart part[2];        // part[1]: units from unit1 on, in a matrix of two types (else unused)
    int unit1;
    int warps0;           // a matrix of two types: the grid's warps [0, warps0) walk part 0, the rest part 1
    const ActBlock* x;    // [M, K / 32] (XIn::Blocks)
    const bf16* x_bf16;   // [M, K] (XIn::Bf16)
    const float* x_f32;   // [M, K] (XIn::Norm), normalized with norm_w and eps
    const bf16* norm_w;
    float eps;
    int T;                // tiles per row
    int n_pieces;         // pieces per row (Q8_0: K / 16, the others K / 32)
    int n_units, half_n, K;
    unsigned* counters;   // non-null: a fed grid (kCounterStride layout above), else a fixed walk
    Epilogue ep;
    EpilogueArgs out;
};

// CTAs an SM gemv_quant_kernel's registers must allow: a fused grid of two types is held to 2 (128
// registers, what the larger type's one-type instances take); 0 leaves the others to ptxas, whose
// choice a stated minimum of 1 changes (more registers in most instances).
template <QType T, QType T1, XIn IN>
constexpr int kMinCtasPerSm = T1 != T && IN != XIn::Blocks ? 2 : 0;

// One warp per unit at a time: its first unit is its index in the grid; after that, units unit0 +
// grid stride, ... (a fixed walk) or, in a fed grid (a.counters), the next unit of its class that
// no warp has taken (tickets from the class's counter). MR accumulator rows (M <= MR real). A
// warp's work is a sequence of chunks (unit, step): step s of a unit is pieces lane + 32 (U s + u),
// u < U, of each of its R rows. Two register buffers: chunk c + 1's loads are
// issued before chunk c's arithmetic, so the warp's loads stay in flight while it computes (the
// buffers alternate through a loop unrolled by two, so each is named statically). XIn::Bf16 / Norm
// first quantize the M rows into shared memory ActBlocks (the same functions as the standalone
// quantizers, so the same bits). T1 != T: a matrix of two types (part[1], type T1, from unit
// unit1 on); the grid's warps [0, warps0) walk part 0's units, the others part 1's, each warp
// through a copy of the walk for its own type (walk below), so the kernel needs the registers of
// the larger type's walk, not of both types' code in one loop; a unit's sums are those of the
// one-type kernel on its part. Such a grid is never fed (launch_gemv).
// G: the prologue's lanes a 32-value block (fused inputs; prologue_lanes), 1 for ActBlock inputs.
// U: pieces a lane takes of each of its rows in a chunk (launch_gemv).
template <QType T, QType T1, int MR, Pairing P, int U, XIn IN, int G>
__global__ void __launch_bounds__(32 * cta_warps(IN != XIn::Blocks), (kMinCtasPerSm<T, T1, IN>))
    gemv_quant_kernel(QArgs a, int M) {
    constexpr int kCtaWarps = cta_warps(IN != XIn::Blocks);
    static_assert(Q<T>::kPieces == Q<T1>::kPieces, "the parts' pieces map onto the lanes alike");
    constexpr int R = P != Pairing::None ? 2 : 1;  // W rows streamed together
    extern __shared__ __align__(16) unsigned char smem_raw[];
    ActBlock* xs = reinterpret_cast<ActBlock*>(smem_raw);  // [M][K / 32] (fused inputs)
    const int lane = threadIdx.x & 31;
    const int n_pieces = a.n_pieces;
    const int steps = CEIL_DIV(n_pieces, 32 * U);  // chunks per unit
    const int stride = gridDim.x * kCtaWarps;
    const int pi = lane % Q<T>::kPieces;  // every piece this lane takes (p = lane + 32 j)
    // Calls f(type tag, part) for part 1 (in_part1) or part 0.
    auto with_part = [&](bool in_part1, auto&& f) {
        if constexpr (T1 != T) {
            if (in_part1) return f(std::integral_constant<QType, T1>{}, a.part[1]);
        }
        return f(std::integral_constant<QType, T>{}, a.part[0]);
    };

    auto load = [&](Raw(&w)[R][U], int unit, int step, bool in_part1) {
        const int2 rr = unit_rows<P>(unit, a.half_n);
        with_part(in_part1, [&](auto type, const QPart& part) {
            using F = Q<decltype(type)::value>;
            const int row0 = T1 != T ? part.row0 : 0;  // one type: the whole matrix
            const int row_id[2] = {rr.x - row0, rr.y - row0};
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int p = lane + 32 * (U * step + u);
                if (p < n_pieces) {
                    const int t = p / F::kPieces;
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        w[r][u] = F::load(part.W + (size_t)row_id[r] * part.row_stride + (size_t)t * F::kTileBytes,
                                          part.tail + ((size_t)row_id[r] * a.T + t) * 2, pi);
                }
            }
        });
    };
    float acc[MR][R];
    auto clear = [&]() {
#pragma unroll
        for (int m = 0; m < MR; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    };
    auto consume = [&](const Raw(&w)[R][U], int step, const ActBlock* xb, int x_stride, bool in_part1) {
        with_part(in_part1, [&](auto type, const QPart&) {
            using F = Q<decltype(type)::value>;
            // Q4_K, Q6_K and Q4_1 address x from the chunk's first tile, so that piece u's blocks lie
            // at a constant offset (one pointer a chunk, not one a piece). The other types keep the
            // piece's own tile: there the shared pointer moved ptxas's allocation past an occupancy
            // step (Q8_0 64 -> 72-78 registers and its 8B step 2.9% slower; Q5_K's SwiGLU 128 -> 155;
            // Q4_0's and the Q5 types' smaller moves unmeasured) (docs/kernels/gemv.md, "x from the
            // chunk's first tile").
            constexpr QType kType = decltype(type)::value;
            constexpr bool kChunkBase = kType == QType::Q4_K || kType == QType::Q6_K || kType == QType::Q4_1;
            constexpr int kTilesPerU = 32 / F::kPieces;  // tiles between a lane's pieces u and u + 1
            const ActBlock* x0 = kChunkBase ? xb + 8 * (lane / F::kPieces + kTilesPerU * U * step) : xb;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int p = lane + 32 * (U * step + u);
                if (p < n_pieces) {
                    const int t = kChunkBase ? kTilesPerU * u : p / F::kPieces;
#pragma unroll
                    for (int m = 0; m < MR; ++m) {
                        if (m < M) {
                            XPiece v;
                            F::x(x0 + (size_t)m * x_stride, t, pi, v);
#pragma unroll
                            for (int r = 0; r < R; ++r) acc[m][r] = F::dot(w[r][u], v, pi, acc[m][r]);
                        }
                    }
                }
            }
        });
    };
    // The unit's sums meet in a butterfly; every lane then holds every sum and lane m stores row m.
    auto finish = [&](int unit) {
#pragma unroll
        for (int m = 0; m < MR; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] = util::warp_sum(acc[m][r]);
#pragma unroll
        for (int m = 0; m < MR; ++m) {
            if (m < M && lane == m) {
                if (P == Pairing::Rope) {
                    const int head = unit / a.half_n;
                    util::store_rope_kv(a.out.rope, m, head, unit - head * a.half_n, acc[m][0], acc[m][R - 1]);
                } else if (P == Pairing::SwiGLU) {
                    util::store_swiglu(a.out, (size_t)m * a.out.ld_out + unit, acc[m][0], acc[m][R - 1]);
                } else {
                    util::store_result(a.ep, a.out, (size_t)m * a.out.ld_out + unit, acc[m][0]);
                }
            }
        }
        clear();
    };

    // The next kernel launches once every CTA is past the wait and its prologue, as the step's other
    // kernels do, except after a 32-value type's bf16-input kernel (wo, w2), which lets it launch at
    // once: there the early launch made the 1B's Q4_1 / Q8_0 steps 1.3-2% faster, the 8B's Q4_0
    // 0.5% faster and its Q8_0 1% slower; in the K-quant kernels and the norm-input ones it gained
    // nothing or lost up to 3% (docs/kernels/gemv.md, "early trigger by input").
    constexpr bool kEarlyTrigger = IN == XIn::Bf16 && kBlocks32<T, T1>;
    if constexpr (kEarlyTrigger) pdl_launch_dependents();

    Raw wa[R][U], wb[R][U];
    int unit = blockIdx.x * kCtaWarps + (threadIdx.x >> 5), step = 0;
    // A matrix of two types: the grid's warps [0, warps0) walk part 0's units from their index on,
    // the others part 1's from unit1 on (warps0 <= unit1, so a warp's part is that of its units).
    if constexpr (T1 != T) {
        if (unit >= a.warps0) unit += a.unit1 - a.warps0;
    }
    // The first chunk loads before the wait, in a branch of their own (as gemv.cu: issued
    // unconditionally, ptxas sinks them past griddepcontrol.wait to their first use).
    if (unit < a.n_units) load(wa, unit, 0, unit >= a.unit1);
    pdl_wait();

    const int x_stride = a.K / 32;
    const ActBlock* xb = a.x;
    if constexpr (IN != XIn::Blocks) {
        if constexpr (IN == XIn::Norm) {
            float* ss = reinterpret_cast<float*>(xs + M * x_stride);  // [M][K / 32] blocks' sums of x^2
            for (int m = 0; m < M; ++m)
                quantize_norm_blocks<G>(a.x_f32 + (size_t)m * a.K, a.norm_w, xs + m * x_stride, ss + m * x_stride, a.K);
            __syncthreads();
            scale_norm_blocks<MR>(xs, ss, M, a.K, a.eps, x_stride);
        } else {
            for (int m = 0; m < M; ++m) quantize_bf16_row<G>(a.x_bf16 + (size_t)m * a.K, xs + m * x_stride, a.K);
        }
        __syncthreads();
        xb = xs;
    }
    if constexpr (!kEarlyTrigger) pdl_launch_dependents();

    clear();
    // A fed grid: lane 0 holds the tickets of the warp's next kTicketsAhead units past the first
    // (ticket t of class c is unit stride + c + kTicketClasses t), asked for kTicketsAhead units
    // before they start, so that an atomic's round trip under the weight stream stays off the path.
    const int cls = (blockIdx.x * kCtaWarps + (threadIdx.x >> 5)) % kTicketClasses;
    unsigned ticket[kTicketsAhead] = {};
    auto request = [&](unsigned& t) {
        if (lane == 0) t = atomicAdd(a.counters + cls * kCounterStride, 1u);
    };
    if (a.counters) {
#pragma unroll
        for (int i = 0; i < kTicketsAhead; ++i) request(ticket[i]);
    }
    // (unit, step) -> the next chunk, warp-uniform, on a walk of `part_stride` warps to `end`
    auto advance = [&](int& u, int& s, int part_stride, int end) {
        if (++s == steps) {
            s = 0;
            if (a.counters) {
                u = stride + cls + kTicketClasses * (int)__shfl_sync(0xffffffffu, ticket[0], 0);
#pragma unroll
                for (int i = 0; i + 1 < kTicketsAhead; ++i) ticket[i] = ticket[i + 1];
                if (u < end) request(ticket[kTicketsAhead - 1]);
            } else {
                u += part_stride;
            }
        }
    };
    // The walk, a copy per part: in_part1 is a constant in each, so a copy holds one type's loads
    // and arithmetic, and the kernel needs the registers of the larger one, not of both at once.
    auto walk = [&](auto in_part1) {
        constexpr bool kPart1 = decltype(in_part1)::value;
        const int part_stride = T1 == T ? stride : kPart1 ? stride - a.warps0 : a.warps0;
        const int end = T1 == T || kPart1 ? a.n_units : a.unit1;
        while (unit < end) {
            int next_unit = unit, next_step = step;
            advance(next_unit, next_step, part_stride, end);
            if (next_unit < end) load(wb, next_unit, next_step, kPart1);
            consume(wa, step, xb, x_stride, kPart1);
            if (next_step == 0) finish(unit);
            unit = next_unit, step = next_step;
            if (unit >= end) break;

            advance(next_unit, next_step, part_stride, end);
            if (next_unit < end) load(wa, next_unit, next_step, kPart1);
            consume(wb, step, xb, x_stride, kPart1);
            if (next_step == 0) finish(unit);
            unit = next_unit, step = next_step;
        }
    };
    if constexpr (T1 != T) {
        if (unit >= a.unit1) walk(std::true_type{});
        else walk(std::false_type{});
    } else {
        walk(std::false_type{});
    }
    if (a.counters) {
        // The last CTA out puts the counters back to 0 for the next launch, which reads them only
        // after its PDL wait, once this grid has completed. Each lane 0 fences first, so that its
        // tickets still in flight have landed before its CTA is counted. One count a CTA: a count
        // a warp, all arriving at the end on one word, serializes for microseconds.
        if (lane == 0) __threadfence();
        __syncthreads();
        if (threadIdx.x == 0 && atomicAdd(a.counters + kCtasDoneWord, 1u) == gridDim.x - 1) {
            for (int c = 0; c < kTicketClasses; ++c) a.counters[c * kCounterStride] = 0;
            a.counters[kCtasDoneWord] = 0;
        }
    }
}

// The kernel for a row of n_blocks blocks: the prologue's lanes a block are the kernel's own (an
// instance each), so that a row taking one lane a block runs none of the 4-lane code.
template <QType T, QType T1, int MR, Pairing P, int U, XIn IN>
auto kernel_for_row(int n_blocks) {
    auto kernel = gemv_quant_kernel<T, T1, MR, P, U, IN, 1>;
    if constexpr (IN != XIn::Blocks) {
        if (prologue_lanes(n_blocks) == 4) kernel = gemv_quant_kernel<T, T1, MR, P, U, IN, 4>;
        if (prologue_lanes(n_blocks) == 2) kernel = gemv_quant_kernel<T, T1, MR, P, U, IN, 2>;
    }
    return kernel;
}

// A matrix of two types on a one-wave grid of at most `resident_warps` warps: part 0's units
// (bytes0 of weights each) are walked by warps0 warps in rounds, part 1's by warps1, chosen so that
// the warp with the most bytes to stream has the fewest (then the most warps on part 0).
std::pair<int, int> split_warps(int units0, size_t bytes0, int units1, size_t bytes1, int resident_warps) {
    std::pair<int, int> best{units0, units1};
    size_t best_cost = SIZE_MAX;
    for (int r0 = 1; r0 <= units0 && (size_t)r0 * bytes0 < best_cost; ++r0) {
        const int warps0 = CEIL_DIV(units0, r0);
        if (warps0 >= resident_warps) continue;
        const int r1 = CEIL_DIV(units1, resident_warps - warps0);
        const size_t cost = std::max((size_t)r0 * bytes0, (size_t)r1 * bytes1);
        if (cost < best_cost) best = {warps0, CEIL_DIV(units1, r1)}, best_cost = cost;
    }
    return best;
}

template <QType T, QType T1, int MR, Pairing P, XIn IN>
void launch_gemv(const QArgs& a, int M, cudaStream_t stream) {
    // Pieces per lane and row in a chunk (two chunks in registers): at M <= 2 a K = 4096 row is
    // one or two chunks; fewer where the accumulators take the registers. Two buffers of twice
    // this depth cost occupancy and lost (docs/kernels/gemv.md).
    constexpr int U = MR <= 2 ? (P == Pairing::None ? 4 : 2) : (P == Pairing::None ? 2 : 1);
    constexpr int warps = cta_warps(IN != XIn::Blocks);
    auto kernel = kernel_for_row<T, T1, MR, P, U, IN>(a.K / 32);
    int blocks = CEIL_DIV(a.n_units, warps);
    size_t smem = 0;
    QArgs args = a;
    args.counters = nullptr;
    args.warps0 = a.unit1;  // ActBlock input: a warp a unit
    if constexpr (IN != XIn::Blocks) {
        // Every CTA quantizes the whole input once: one wave of CTAs, each walking several units,
        // keeps that to a few hundred copies (L2 reads) instead of one per 4 units. Every warp
        // walks the same number of units (rounds), so the last round is full: capping the grid at
        // the resident CTAs alone left a second, partly empty round wherever the units are a
        // little more than the resident warps (4096-row wo / w2 on 2-4 thousand).
        smem = (size_t)M * (a.K / 32) * (sizeof(ActBlock) + (IN == XIn::Norm ? sizeof(float) : 0));
        // At least a CTA an SM: a grid of none would divide by zero, and the launch reports the misfit.
        const auto walk = [&](auto k) {
            const int resident = std::max(device_facts().sm_count, resident_ctas(k, 32 * warps, smem));
            return std::make_pair(resident, std::max(1, CEIL_DIV(a.n_units, resident * warps)));
        };
        auto [resident, rounds] = walk(kernel);
        // A 32-value type at one row takes chunks of half the pieces where that walks at most half
        // the rounds: its decode is a few instructions a piece, so the half-size register buffers
        // (Q8_0: 64-80 -> 48-64 registers) fit more warps an SM, and a warp's chunks are then no
        // more than before, each half the work. Where the rounds stay, the half-size chunks only
        // halve each warp's bytes in flight (docs/kernels/gemv.md, "half-size chunks").
        if constexpr (MR == 1 && kBlocks32<T, T1>) {
            const auto half = kernel_for_row<T, T1, MR, P, U / 2, IN>(a.K / 32);
            const auto [resident_half, rounds_half] = walk(half);
            if (2 * rounds_half <= rounds) kernel = half, resident = resident_half, rounds = rounds_half;
        }
        if constexpr (T1 != T) {
            // Each part walks its own warps' rounds (split_warps); such a grid is never fed.
            const size_t rows = P != Pairing::None ? 2 : 1;  // W rows a unit
            const std::pair<int, int> split =
                split_warps(a.unit1, rows * qlayout::row_stride((int)T, a.K), a.n_units - a.unit1,
                            rows * qlayout::row_stride((int)T1, a.K), resident * warps);
            args.warps0 = split.first;
            blocks = CEIL_DIV(split.first + split.second, warps);
        } else {
            blocks = CEIL_DIV(CEIL_DIV(a.n_units, rounds), warps);
            // Many rounds: a fixed walk ends with its slowest warps, and each round widens the
            // spread; fed by the counters, every resident warp takes units until none is left.
            if (a.counters && rounds >= tuning::kGemvQuantFedMinRounds) {
                args.counters = a.counters;
                blocks = resident;
            }
        }
    }
    launch_pdl(kernel, dim3(blocks), dim3(32 * warps), smem, stream, args, M);
    CUDA_CHECK_LAUNCH("gemv_quant_kernel");
}

// A matrix of two types runs at M <= kFusedRows (the launcher refuses more) and has no SwiGLU
// pairing (gate and up rows would lie in different parts), so those are not instantiated.
template <QType T, QType T1, Pairing P, XIn IN>
void launch_rows(const QArgs& a, int M, cudaStream_t stream) {
    if (M == 1) launch_gemv<T, T1, 1, P, IN>(a, M, stream);
    else if (M == 2) launch_gemv<T, T1, 2, P, IN>(a, M, stream);
    else if constexpr (IN == XIn::Blocks && T1 == T) {
        if (M <= 4) launch_gemv<T, T1, 4, P, IN>(a, M, stream);
        else if (M <= 8) launch_gemv<T, T1, 8, P, IN>(a, M, stream);
        else launch_gemv<T, T1, 16, P, IN>(a, M, stream);
    }
}

template <QType T, QType T1, XIn IN>
void launch_pairing(const QArgs& a, int M, Pairing pairing, cudaStream_t stream) {
    switch (pairing) {
        case Pairing::None: return launch_rows<T, T1, Pairing::None, IN>(a, M, stream);
        case Pairing::SwiGLU:
            if constexpr (T1 == T) return launch_rows<T, T1, Pairing::SwiGLU, IN>(a, M, stream);
            return;
        case Pairing::Rope: return launch_rows<T, T1, Pairing::Rope, IN>(a, M, stream);
    }
}

template <QType T, QType T1 = T>
void launch_type(const QArgs& a, int M, Pairing pairing, XIn in, cudaStream_t stream) {
    switch (in) {
        case XIn::Blocks: return launch_pairing<T, T1, XIn::Blocks>(a, M, pairing, stream);
        case XIn::Bf16: return launch_pairing<T, T1, XIn::Bf16>(a, M, pairing, stream);
        case XIn::Norm: return launch_pairing<T, T1, XIn::Norm>(a, M, pairing, stream);
    }
}

// ---- dequantization: eight consecutive values of a tile, exactly as quant_formats.cpp computes
// them (two roundings for d * q + m: that file compiles without FMA contraction) --------------

// Byte j of 8 bytes loaded as one 8-byte word (every 8-value run of a tile is 8-byte aligned:
// tiles are 16-byte aligned and runs start at multiples of 8), instead of 8 byte loads.
__device__ __forceinline__ uint2 load8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ int byte_at(uint2 v, int j) { return (int)(((j < 4 ? v.x : v.y) >> (8 * (j & 3))) & 0xFF); }

// w[j] = value e + j of the tile (e % 8 == 0); d6 = Q6_K's tail d.
template <QType T>
__device__ __forceinline__ void dequant8(const uint8_t* t, float d6, int e, float* w) {
    if (T == QType::Q4_K || T == QType::Q5_K) {  // the block as stored
        const int s = e >> 5, l = e & 31;
        const uint4 h = *reinterpret_cast<const uint4*>(t);
        int sc, mn;
        qlayout::scale_min_k4(s, h.y, h.z, h.w, sc, mn);
        const float d = __fmul_rn(f16_bits(h.x & 0xFFFF), (float)sc), m = __fmul_rn(f16_bits(h.x >> 16), (float)mn);
        const int qs_at = T == QType::Q5_K ? 48 : 16;
        const uint2 qs = load8(t + qs_at + 32 * (s >> 1) + l);
        const uint2 qh = T == QType::Q5_K ? load8(t + 16 + l) : make_uint2(0u, 0u);
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int q = (byte_at(qs, j) >> shift) & 15;
            if (T == QType::Q5_K) q |= ((byte_at(qh, j) >> s) & 1) << 4;
            w[j] = __fsub_rn(__fmul_rn(d, (float)q), m);
        }
    } else if (T == QType::Q6_K) {
        // e = 128 h + 32 g + l: nibble g / 2 of ql[64 h + 32 (g % 2) + l], bits 2g of qh[32 h + l].
        const int h = e >> 7, g = (e >> 5) & 3, l = e & 31;
        const uint2 ql = load8(t + 16 + 64 * h + 32 * (g & 1) + l);
        const uint2 qh = load8(t + 144 + 32 * h + l);
        const int sc = (int8_t)t[8 * h + 2 * g + (l >> 4)];
        const float d = __fmul_rn(d6, (float)sc);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = (((byte_at(ql, j) >> ((g >> 1) * 4)) & 15) | (((byte_at(qh, j) >> (2 * g)) & 3) << 4)) - 32;
            w[j] = __fmul_rn(d, (float)q);
        }
    } else {  // 32-value types: block b = e / 32 of the tile, values i .. i + 7 of it
        const int b = e >> 5, i = e & 31;
        const float d = f16_bits(reinterpret_cast<const unsigned short*>(t)[b]);
        if (T == QType::Q8_0) {
            const uint2 qs = load8(t + 16 + 32 * b + i);
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j] = __fmul_rn((float)(int8_t)byte_at(qs, j), d);
            return;
        }
        constexpr bool has_m = T == QType::Q4_1 || T == QType::Q5_1;
        constexpr bool has_h = T == QType::Q5_0 || T == QType::Q5_1;
        constexpr int qs_at = T == QType::Q4_0 ? 16 : T == QType::Q4_1 ? 32 : T == QType::Q5_0 ? 48 : 64;
        constexpr int qh_at = T == QType::Q5_0 ? 16 : 32;
        const float m = has_m ? f16_bits(reinterpret_cast<const unsigned short*>(t + 16)[b]) : 0.f;
        const uint32_t qh = has_h ? reinterpret_cast<const uint32_t*>(t + qh_at)[b] : 0u;
        const uint2 qs = load8(t + qs_at + 16 * b + (i & 15));
        const int shift = i >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int q = ((byte_at(qs, j) >> shift) & 15) | (has_h ? (int)((qh >> (i + j)) & 1) << 4 : 0);
            if (T == QType::Q4_0) w[j] = __fmul_rn((float)(q - 8), d);
            else if (T == QType::Q5_0) w[j] = __fmul_rn((float)(q - 16), d);
            else w[j] = __fadd_rn(__fmul_rn((float)q, d), m);
        }
    }
}

// The eight values k .. k + 7 of row n.
template <QType T>
__device__ __forceinline__ void dequant_row8(const uint8_t* W, size_t row_stride, int T_row, int N, int n, int k, float* w) {
    const int t = k >> 8;
    const uint8_t* tile = W + (size_t)n * row_stride + (size_t)t * Q<T>::kTileBytes;
    float d6 = 0.f;
    if (T == QType::Q6_K)
        d6 = f16_bits(reinterpret_cast<const unsigned short*>(W + (size_t)N * row_stride)[(size_t)n * T_row + t]);
    dequant8<T>(tile, d6, k & 255, w);
}

// OUT float: out[n * ld + k] fp32; bf16: rounded to nearest.
template <QType T, typename OUT>
__global__ void dequantize_kernel(const uint8_t* __restrict__ W, int N, int K, int row0, int rows, size_t row_stride,
                                  OUT* __restrict__ out, int ld, bool vec) {
    pdl_wait();
    pdl_launch_dependents();
    const int groups = K / 8;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * groups) return;
    const int n = (int)(i / groups), k = 8 * (int)(i - (size_t)n * groups);
    float w[8];
    dequant_row8<T>(W, row_stride, (K + 255) / 256, N, row0 + n, k, w);
    OUT* dst = out + (size_t)n * ld + k;
    if (vec) {  // 16-byte stores: out and ld keep every 8-value run 16-byte aligned
        if constexpr (sizeof(OUT) == 4) {
            reinterpret_cast<float4*>(dst)[0] = make_float4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<float4*>(dst)[1] = make_float4(w[4], w[5], w[6], w[7]);
        } else {
            *reinterpret_cast<uint4*>(dst) = make_uint4(util::pack_bf16x2(w[0], w[1]), util::pack_bf16x2(w[2], w[3]),
                                                        util::pack_bf16x2(w[4], w[5]), util::pack_bf16x2(w[6], w[7]));
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if constexpr (sizeof(OUT) == 4) dst[j] = w[j];
        else dst[j] = __float2bfloat16_rn(w[j]);
    }
}

// embed on a quantized table: one CTA per row m (embed.cu's conventions: history, NaN rows).
template <QType T>
__global__ void embed_quant_kernel(const int* __restrict__ tokens, const uint8_t* __restrict__ table, float* __restrict__ x,
                                   int V, int D, int offset, int rows, size_t row_stride, TokenHistory record) {
    pdl_wait();
    pdl_launch_dependents();
    const int m = blockIdx.x;
    const int tok = tokens[m];
    if (record.history && threadIdx.x == 0) {
        const int slot = record.slots[m], pos = record.positions[m];
        if (slot >= 0 && slot < record.max_batch && pos >= 0 && pos < record.max_seq)
            record.history[(size_t)slot * record.max_seq + pos] = tok;
    }
    float* row_out = x + (size_t)m * D;
    const int local = embed_row_of(tok, V, offset, rows);
    if (local < 0) {
        const float fill = local == kEmbedInvalid ? NAN : 0.f;
        for (int i = threadIdx.x; i < D; i += blockDim.x) row_out[i] = fill;
        return;
    }
    for (int g = threadIdx.x; g < D / 8; g += blockDim.x) {
        float w[8];
        dequant_row8<T>(table, row_stride, (D + 255) / 256, rows, local, 8 * g, w);
#pragma unroll
        for (int j = 0; j < 8; ++j) row_out[8 * g + j] = w[j];
    }
}

}  // namespace

void check_quant_weight(const char* op, int type, int K, const char* kname) {
    BRRR_CHECK_ARG(qlayout::has_layout(type),
                   op << ": GGML type id " << type << " is not a quantized type this kernel runs "
                      "(q4_0=2, q4_1=3, q5_0=6, q5_1=7, q8_0=8, q4_k=12, q5_k=13, q6_k=14)");
    const QType t = static_cast<QType>(type);
    const int elems = quant::block_elems(t);
    BRRR_CHECK_ARG(K >= 1 && K % elems == 0, op << ": " << kname << "=" << K << " is not a positive multiple of "
                                                << quant::type_name(t) << "'s block of " << elems
                                                << " values; a row must be whole blocks");
}

namespace {

template <QType T> struct GemvFn {
    static void run(const QArgs& a, int M, Pairing p, XIn in, cudaStream_t s) { launch_type<T>(a, M, p, in, s); }
};
template <QType T> struct DequantFn {
    template <typename OUT>
    static void run(const void* W, int N, int K, int row0, int rows, OUT* out, int ld, cudaStream_t s) {
        const size_t total = (size_t)rows * (K / 8);
        const int threads = 256;
        const bool vec = util::aligned_to(out, 16) && ld % (16 / (int)sizeof(OUT)) == 0;
        launch_pdl(dequantize_kernel<T, OUT>, dim3((unsigned)CEIL_DIV(total, (size_t)threads)), dim3(threads), 0, s,
                   static_cast<const uint8_t*>(W), N, K, row0, rows, qlayout::row_stride((int)T, K), out, ld, vec);
        CUDA_CHECK_LAUNCH("dequantize_kernel");
    }
};
template <QType T> struct EmbedFn {
    static void run(const int* tokens, const void* table, float* x, int M, int D, int V, int offset, int rows,
                    const TokenHistory& record, cudaStream_t s) {
        launch_pdl(embed_quant_kernel<T>, dim3(M), dim3(128), 0, s, tokens, static_cast<const uint8_t*>(table), x, V, D,
                   offset, rows, qlayout::row_stride((int)T, D), record);
        CUDA_CHECK_LAUNCH("embed_quant_kernel");
    }
};

}  // namespace

namespace {

// The matrices of two types that run as one launch: K-quant mixes (llama.cpp's Q4_K_M / Q5_K_M
// give some layers' wv a Q6_K beside Q4_K / Q5_K wq | wk). Both types map 8 pieces of 32 values
// to a tile; other pairs run part by part (the engine asks gemv_quant_fuses_pair).
bool fusable_pair(int type0, int type1) {
    return type1 == (int)QType::Q6_K && (type0 == (int)QType::Q4_K || type0 == (int)QType::Q5_K);
}

// One row of a vocabulary-sized matrix (past tuning::kGemvQuantFusedMaxUnits units) of a 32-value
// type is quantized apart, then streamed by the ActBlock grid of many small CTAs: their decode is a
// few instructions a piece, and the short CTAs outrun the fused grid's walk. A K-quant's decode is
// long enough that the fed walk, which issues a warp's next unit's loads before this unit's
// arithmetic, streams it faster.
bool quantized_apart(int type, int n_units) {
    return n_units > tuning::kGemvQuantFusedMaxUnits && quant::block_elems(static_cast<QType>(type)) == quant::kBlock32;
}

// One part of a launch as the caller gives it: rows of one type.
struct PartIn {
    int type;
    const void* W;
    int rows;
};

// The shared launcher: checks, the argument block, and the kernel for (types, M, pairing, input).
void launch_gemv_quant(const char* op, const PartIn* parts, int n_parts, const QuantGemvInput& in, int M, int N,
                       int K, Epilogue ep, const EpilogueArgs& args_in, cudaStream_t stream) {
    for (int i = 0; i < n_parts; ++i) {
        check_quant_weight(op, parts[i].type, K, "K");
        BRRR_CHECK_ARG(parts[i].W != nullptr, op << ": W must be a device pointer, got null");
        BRRR_CHECK_ARG(util::aligned_to(parts[i].W, 16), op << ": W (qlayout tiles) must be 16-byte aligned");
    }
    BRRR_CHECK_ARG(M >= 1 && M <= kMaxRows, op << ": M=" << M << " rows; the kernel takes 1 to " << kMaxRows);
    const int n_inputs = (in.xq != nullptr) + (in.x != nullptr) + (in.x_f32 != nullptr);
    BRRR_CHECK_ARG(n_inputs == 1, op << ": give exactly one input (xq, x or x_f32), got " << n_inputs);
    BRRR_CHECK_ARG(!in.x_f32 || (in.norm_w != nullptr && in.eps > 0.f),
                   op << ": a normalized input needs norm_w and eps > 0");
    int unit1 = 0;  // the first unit of part 1
    if (n_parts == 2) {
        const int rows0 = parts[0].rows, hd = args_in.rope.head_dim;
        BRRR_CHECK_ARG(fusable_pair(parts[0].type, parts[1].type),
                       op << ": parts of types " << parts[0].type << " and " << parts[1].type
                          << " do not run as one launch (gemv_quant_fuses_pair); run each part alone");
        BRRR_CHECK_ARG(ep != Epilogue::SwiGLU, op << ": a SwiGLU pairs rows of both parts; run each part alone");
        BRRR_CHECK_ARG(M <= kFusedRows, op << ": M=" << M << "; a matrix of two types takes 1 to " << kFusedRows
                                           << " rows");
        BRRR_CHECK_ARG(rows0 >= 1 && rows0 < N && rows0 + parts[1].rows == N,
                       op << ": parts of " << rows0 << " and " << parts[1].rows << " rows do not make N=" << N);
        BRRR_CHECK_ARG(ep != Epilogue::RopeKV || (hd > 0 && rows0 % hd == 0),
                       op << ": the first part's " << rows0 << " rows are not whole heads of " << hd);
        unit1 = ep == Epilogue::RopeKV ? rows0 / 2 : rows0;
    }
    BRRR_CHECK_ARG(util::aligned_to(in.counters, 4), op << ": counters must be 4-byte aligned");
    EpilogueArgs args = args_in;
    const void* any_x = in.xq ? (const void*)in.xq : in.x ? (const void*)in.x : (const void*)in.x_f32;
    const int width = util::check_matmul(op, reinterpret_cast<const bf16*>(any_x),
                                         reinterpret_cast<const bf16*>(parts[0].W), M, N, K, ep, args,
                                         /*allow_rope=*/true);
    QArgs a{};
    a.half_n = ep == Epilogue::RopeKV ? args.rope.head_dim / 2 : N / 2;
    a.unit1 = n_parts == 2 ? unit1 : width;
    for (int i = 0, row0 = 0; i < n_parts; row0 += parts[i].rows, ++i) {
        QPart& p = a.part[i];
        p.W = static_cast<const uint8_t*>(parts[i].W);
        p.tail = p.W + qlayout::tail_offset(parts[i].type, parts[i].rows, K);
        p.row_stride = qlayout::row_stride(parts[i].type, K);
        p.row0 = row0;
    }
    a.T = (int)qlayout::tiles_per_row(K);
    a.n_pieces = parts[0].type == (int)QType::Q8_0 ? K / 16 : K / 32;
    a.n_units = width;
    a.K = K;
    a.counters = in.counters;
    a.ep = ep;
    a.out = args;
    XIn x_in = XIn::Blocks;
    if (in.xq) {
        BRRR_CHECK_ARG(util::aligned_to(in.xq, 16), op << ": xq (ActBlocks) must be 16-byte aligned");
        a.x = in.xq;
    } else if (M <= kFusedRows && (!quantized_apart(parts[0].type, a.n_units) || !in.scratch) &&
               (in.x ? util::aligned_to(in.x, 16) : util::aligned_to(in.x_f32, 16) && util::aligned_to(in.norm_w, 8))) {
        // (the prologue reads whole blocks with vector loads; other alignments take the scratch, and
        // so does a vocabulary-sized matrix of a 32-value type where one is given: quantized_apart)
        x_in = in.x ? XIn::Bf16 : XIn::Norm;
        a.x_bf16 = in.x;
        a.x_f32 = in.x_f32;
        a.norm_w = in.norm_w;
        a.eps = in.eps;
    } else {
        // More rows than the kernel quantizes itself, or a long walk: the standalone quantizer into the scratch.
        BRRR_CHECK_ARG(in.scratch != nullptr, op << ": M=" << M << " rows of unquantized input (more than "
                                                 << kFusedRows << ", or not 16-byte aligned) need the ActBlock scratch");
        if (in.x) quantize_act_bf16(in.x, in.scratch, M, K, stream);
        else rmsnorm_quantize_act(in.x_f32, in.norm_w, in.eps, in.scratch, M, K, stream);
        a.x = in.scratch;
    }
    const Pairing pairing = util::pairing_of(ep);
    if (n_parts == 1) qlayout::by_type<GemvFn>(parts[0].type, a, M, pairing, x_in, stream);
    else if (parts[0].type == (int)QType::Q4_K) launch_type<QType::Q4_K, QType::Q6_K>(a, M, pairing, x_in, stream);
    else launch_type<QType::Q5_K, QType::Q6_K>(a, M, pairing, x_in, stream);
}

}  // namespace

void gemv_quant(int type, const void* W, const ActBlock* xq, int M, int N, int K, Epilogue ep, const EpilogueArgs& args,
                cudaStream_t stream) {
    BRRR_CHECK_ARG(xq != nullptr, "gemv_quant: xq must be a device pointer, got null");
    QuantGemvInput in;
    in.xq = xq;
    const PartIn part{type, W, N};
    launch_gemv_quant("gemv_quant", &part, 1, in, M, N, K, ep, args, stream);
}

void gemv_quant_in(int type, const void* W, const QuantGemvInput& in, int M, int N, int K, Epilogue ep,
                   const EpilogueArgs& args, cudaStream_t stream) {
    const PartIn part{type, W, N};
    launch_gemv_quant("gemv_quant_in", &part, 1, in, M, N, K, ep, args, stream);
}

bool gemv_quant_fuses_pair(int type0, int type1, Epilogue ep) {
    return fusable_pair(type0, type1) && ep != Epilogue::SwiGLU;
}

void gemv_quant_pair(int type0, const void* W0, int rows0, int type1, const void* W1, const QuantGemvInput& in, int M,
                     int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream) {
    const PartIn parts[2] = {{type0, W0, rows0}, {type1, W1, N - rows0}};
    launch_gemv_quant("gemv_quant_pair", parts, 2, in, M, N, K, ep, args, stream);
}

void dequantize_bf16(int type, const void* W, int N, int K, int row0, int rows, bf16* out, int ld_out,
                     cudaStream_t stream) {
    check_quant_weight("dequantize_bf16", type, K, "K");
    BRRR_CHECK_ARG(N >= 1, "dequantize_bf16: N must be >= 1, got " << N);
    BRRR_CHECK_ARG(row0 >= 0 && rows >= 1 && row0 + rows <= N,
                   "dequantize_bf16: rows [" << row0 << ", " << row0 + rows << ") must lie in [0, N=" << N << ")");
    BRRR_CHECK_ARG(W != nullptr && out != nullptr, "dequantize_bf16: W and out must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(W, 16), "dequantize_bf16: W (qlayout tiles) must be 16-byte aligned");
    if (ld_out == 0) ld_out = K;
    BRRR_CHECK_ARG(ld_out >= K, "dequantize_bf16: ld_out=" << ld_out << " is shorter than a row of K=" << K);
    qlayout::by_type<DequantFn>(type, W, N, K, row0, rows, out, ld_out, stream);
}

void dequantize_f32(int type, const void* W, int N, int K, float* out, cudaStream_t stream) {
    check_quant_weight("dequantize_f32", type, K, "K");
    BRRR_CHECK_ARG(N >= 1, "dequantize_f32: N must be >= 1, got " << N);
    BRRR_CHECK_ARG(W != nullptr && out != nullptr, "dequantize_f32: W and out must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(W, 16), "dequantize_f32: W (qlayout tiles) must be 16-byte aligned");
    qlayout::by_type<DequantFn>(type, W, N, K, 0, N, out, K, stream);
}

void embed_quant(const int* tokens, int type, const void* table, float* x, int M, int D, int V, int vocab_offset,
                 int vocab_rows, const TokenHistory& record, cudaStream_t stream) {
    check_quant_weight("embed_quant", type, D, "D");
    BRRR_CHECK_ARG(M >= 0 && V > 0, "embed_quant: bad sizes M=" << M << " D=" << D << " V=" << V);
    check_vocab_shard("embed_quant", V, vocab_offset, vocab_rows);
    BRRR_CHECK_ARG(tokens != nullptr && table != nullptr && x != nullptr,
                   "embed_quant: tokens, table and x must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(table, 16), "embed_quant: the table (qlayout tiles) must be 16-byte aligned");
    BRRR_CHECK_ARG(!record.history || (record.slots && record.positions && record.max_batch > 0 && record.max_seq > 0),
                   "embed_quant: a token history needs slots, positions and sizes max_batch="
                       << record.max_batch << " max_seq=" << record.max_seq);
    if (M == 0) return;
    qlayout::by_type<EmbedFn>(type, tokens, table, x, M, D, V, vocab_offset, vocab_rows, record, stream);
}

void quantize_act_bf16(const bf16* x, ActBlock* xq, int M, int K, cudaStream_t stream) {
    BRRR_CHECK_ARG(M >= 0 && K >= 32 && K % 32 == 0,
                   "quantize_act_bf16: M=" << M << " K=" << K << "; K must be a positive multiple of 32");
    BRRR_CHECK_ARG(x != nullptr && xq != nullptr, "quantize_act_bf16: x and xq must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(xq, 16), "quantize_act_bf16: xq must be 16-byte aligned");
    if (M == 0) return;
    const int n_blocks = (int)((int64_t)M * K / 32);
    launch_pdl(quantize_act_bf16_kernel, dim3(CEIL_DIV(n_blocks, kActWarps)), dim3(kActWarps * 32), 0, stream, x, xq,
               n_blocks);
    CUDA_CHECK_LAUNCH("quantize_act_bf16_kernel");
}

void rmsnorm_quantize_act(const float* x, const bf16* norm_w, float eps, ActBlock* xq, int M, int K, cudaStream_t stream) {
    BRRR_CHECK_ARG(M >= 0 && K >= 32 && K % 32 == 0,
                   "rmsnorm_quantize_act: M=" << M << " K=" << K << "; K must be a positive multiple of 32");
    BRRR_CHECK_ARG(x != nullptr && norm_w != nullptr && xq != nullptr,
                   "rmsnorm_quantize_act: x, norm_w and xq must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(x, 16) && util::aligned_to(xq, 16) && util::aligned_to(norm_w, 8),
                   "rmsnorm_quantize_act: x and xq must be 16-byte aligned, norm_w 8-byte aligned");
    BRRR_CHECK_ARG(eps > 0.f, "rmsnorm_quantize_act: eps must be > 0, got " << eps);
    if (M == 0) return;
    launch_pdl(rmsnorm_quantize_act_kernel, dim3(M), dim3(kNormThreads), (size_t)(K / 32) * sizeof(float), stream, x,
               norm_w, eps, xq, K);
    CUDA_CHECK_LAUNCH("rmsnorm_quantize_act_kernel");
}

}  // namespace cuda
}  // namespace brrr
