// quant_gemv.cpp — dot products, GEMV and GEMM on GGUF weight blocks against int8 activations.
//
// Activations: each row of x is quantized once per call into ActBlocks of 32 (quantize_activations):
// amax = max |x_i| over the block, d = amax / 127, q_i = roundf(x_i * (1/d)) in [-127, 127]
// (d = 0, q = 0 for an all-zero block). Every ISA path uses these same int8 values, so the paths
// differ only in float summation order. Error of one product against the float64 dot of the
// same weight blocks with the fp32 x: |x_i - d q_i| <= d / 2, hence
//   |err| <= sum_blocks (amax_b / 254) * sum_{i in b} |w_i|  (+ fp32 rounding of the sums),
// which the tests assert.
//
// The trick: every weight type is cut into chunks of 32 values that line up with one ActBlock,
// and each chunk is (32 unsigned codes c_i, a weight scale per 16-value half, a bias per half)
// with w_i = s_half * c_i + b_half. Then
//   dot = sum_chunks d_x * sum_halves s_half * sum_i c_i q_i  +  b_half * (d_x * sum_i q_i),
// where sum_i c_i q_i is an unsigned x signed int8 dot (vpdpbusd on ymm with AVX512-VNNI, or
// vpmaddubsw + vpmaddwd on AVX2) summed exactly in int32 lanes, converted to float once per chunk
// and FMA'd with the lane scales. One 4-float product {d, d, dsum_lo, dsum_hi} x {s_lo, s_hi,
// b_lo, b_hi} gives both lane scales and both bias terms. Q8_0's signed weights use |w| as codes
// and sign(w) moved onto q (vpsignb), so they need no bias. Q6_K has a scale per 16 values, which
// is why scales come per half (int32 lanes 0-3 and 4-7). 32-blocks convert their fp16 fields with
// one vcvtph2ps; K-quants decode their 8 sub-scales once per block. Two accumulator chains (even
// and odd chunks) keep the loop off the FMA latency. Variants that lost (two chunks per zmm,
// four W rows per call) are in docs/kernels/quant_cpu.md.
//
// Decode streams W from memory: each thread walks its own contiguous rows and prefetches the row
// kPrefetchBytes ahead (the decode-batch GEMM, the next tile), since rows of a few hundred bytes
// give the hardware prefetcher too little run-up.
//
// Invariants: K % 32 == 0 (K % 256 for K-quants, checked by row_bytes); codes fit the vpmaddubsw
// pair sum in int16 (|c| <= 128, |q| <= 127: 2 * 128 * 127 < 32768); W rows are row_bytes apart.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "cpu/quant.h"

namespace brrr {
namespace quant {
namespace {

// ---- chunk descriptions, shared by every path -----------------------------------------------

struct ChunkScales {  // w_i = s[h] * c_i + b[h] for i in half h (0: values 0-15, 1: 16-31)
    float s[2], b[2];  // as a vector {s_lo, s_hi, b_lo, b_hi} it pairs with ActBlock's {d, d, dsum}
};
static_assert(sizeof(ChunkScales) == 16, "ChunkScales is one 16-byte vector");

// Each Traits: Block, kChunks per block, block_scales(block, out[kChunks]) and
// codes(block, chunk, out[32]) with sum_i codes_i * q_i = the chunk's integer dot (the scalar
// path; signed codes allowed there). Scales are decoded once per block, not per chunk.
struct Q8_0T {
    using Block = BlockQ8_0;
    static constexpr int kChunks = 1;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d);
        s[0] = {{d, d}, {0.f, 0.f}};
    }
    static void codes(const Block& b, int, int* c) {
        for (int i = 0; i < 32; ++i) c[i] = b.qs[i];
    }
};
inline void nibble_codes(const uint8_t* qs, int* c) {  // 16 bytes: values j and j + 16
    for (int i = 0; i < 16; ++i) c[i] = qs[i] & 0xF, c[i + 16] = qs[i] >> 4;
}
struct Q4_0T {
    using Block = BlockQ4_0;
    static constexpr int kChunks = 1;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d);
        s[0] = {{d, d}, {-8.f * d, -8.f * d}};
    }
    static void codes(const Block& b, int, int* c) { nibble_codes(b.qs, c); }
};
struct Q4_1T {
    using Block = BlockQ4_1;
    static constexpr int kChunks = 1;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        s[0] = {{d, d}, {m, m}};
    }
    static void codes(const Block& b, int, int* c) { nibble_codes(b.qs, c); }
};
// Q5_0 / Q5_1: nibble codes plus the fifth bit, bit j of qh (little-endian uint32) for value j.
inline void q5_codes(const uint8_t* qs, const uint8_t* qh, int* c) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    nibble_codes(qs, c);
    for (int i = 0; i < 32; ++i) c[i] |= (int)((bits >> i) & 1) << 4;
}
struct Q5_0T {
    using Block = BlockQ5_0;
    static constexpr int kChunks = 1;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d);
        s[0] = {{d, d}, {-16.f * d, -16.f * d}};
    }
    static void codes(const Block& b, int, int* c) { q5_codes(b.qs, b.qh, c); }
};
struct Q5_1T {
    using Block = BlockQ5_1;
    static constexpr int kChunks = 1;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        s[0] = {{d, d}, {m, m}};
    }
    static void codes(const Block& b, int, int* c) { q5_codes(b.qs, b.qh, c); }
};
template <class B>
void k4_block_scales(const B& b, ChunkScales* s) {  // Q4_K, Q5_K: d * sc[c] * q - dmin * m[c]
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int c = 0; c < 8; ++c) {
        uint8_t sc, m;
        scale_min_k4(c, b.scales, &sc, &m);
        const float scale = d * sc, bias = -(dmin * m);
        s[c] = {{scale, scale}, {bias, bias}};
    }
}
struct Q4_KT {
    using Block = BlockQ4_K;
    static constexpr int kChunks = 8;
    static void block_scales(const Block& b, ChunkScales* s) { k4_block_scales(b, s); }
    static void codes(const Block& b, int c, int* out) {
        const uint8_t* q = b.qs + 32 * (c / 2);
        for (int i = 0; i < 32; ++i) out[i] = (c & 1) ? q[i] >> 4 : q[i] & 0xF;
    }
};
struct Q5_KT {
    using Block = BlockQ5_K;
    static constexpr int kChunks = 8;
    static void block_scales(const Block& b, ChunkScales* s) { k4_block_scales(b, s); }
    static void codes(const Block& b, int c, int* out) {
        const uint8_t* q = b.qs + 32 * (c / 2);
        for (int i = 0; i < 32; ++i)
            out[i] = ((c & 1) ? q[i] >> 4 : q[i] & 0xF) | (((b.qh[i] >> c) & 1) << 4);
    }
};
struct Q6_KT {
    using Block = BlockQ6_K;
    static constexpr int kChunks = 8;
    static void block_scales(const Block& b, ChunkScales* s) {
        const float d = f16_to_f32(b.d);
        for (int c = 0; c < 8; ++c) {
            const int8_t* sc = b.scales + 8 * (c / 4) + 2 * (c % 4);
            const float s0 = d * sc[0], s1 = d * sc[1];
            s[c] = {{s0, s1}, {-32.f * s0, -32.f * s1}};
        }
    }
    // chunk c = 4 h + k of half h: low nibbles of ql[32 (k & 1) ..] (shifted by 4 for k >= 2),
    // high two bits from qh[..] >> 2 k.
    static void codes(const Block& b, int c, int* out) {
        const int h = c / 4, k = c % 4;
        const uint8_t* ql = b.ql + 64 * h + 32 * (k & 1);
        const uint8_t* qh = b.qh + 32 * h;
        for (int i = 0; i < 32; ++i) out[i] = ((ql[i] >> (4 * (k >> 1))) & 0xF) | (((qh[i] >> (2 * k)) & 3) << 4);
    }
};

template <class T> constexpr QType type_of();
template <> constexpr QType type_of<Q8_0T>() { return QType::Q8_0; }
template <> constexpr QType type_of<Q4_0T>() { return QType::Q4_0; }
template <> constexpr QType type_of<Q4_1T>() { return QType::Q4_1; }
template <> constexpr QType type_of<Q5_0T>() { return QType::Q5_0; }
template <> constexpr QType type_of<Q5_1T>() { return QType::Q5_1; }
template <> constexpr QType type_of<Q4_KT>() { return QType::Q4_K; }
template <> constexpr QType type_of<Q5_KT>() { return QType::Q5_K; }
template <> constexpr QType type_of<Q6_KT>() { return QType::Q6_K; }

// ---- scalar path ------------------------------------------------------------------------------

template <class T>
float dot_scalar(const void* w_row, const ActBlock* x, int64_t K) {
    const auto* w = (const typename T::Block*)w_row;
    const int64_t nb = K / (32 * T::kChunks);
    float sum = 0.f;
    int c[32];
    ChunkScales scales[T::kChunks];
    for (int64_t ib = 0; ib < nb; ++ib) {
        T::block_scales(w[ib], scales);
        for (int ci = 0; ci < T::kChunks; ++ci) {
            const ActBlock& a = x[ib * T::kChunks + ci];
            const ChunkScales& s = scales[ci];
            T::codes(w[ib], ci, c);
            int lo = 0, hi = 0;
            for (int i = 0; i < 16; ++i) lo += c[i] * a.qs[i];
            for (int i = 16; i < 32; ++i) hi += c[i] * a.qs[i];
            sum += a.d[0] * (s.s[0] * lo + s.s[1] * hi) + (s.b[0] * a.dsum[0] + s.b[1] * a.dsum[1]);
        }
    }
    return sum;
}

// ---- AVX2 path: one chunk per ymm ---------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// The chunk's 32 codes as unsigned bytes, and q as the signed bytes to multiply them with.
template <class T> struct SimdChunk;
// 32-blocks also give their ChunkScales {s, s, b, b} straight from the fp16 fields (one vcvtph2ps
// instead of a scalar conversion per field).
inline __m128 f16x2(const uint16_t* p) {  // {f16 p[0], f16 p[1], 0, 0}
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits));
}
template <> struct SimdChunk<Q8_0T> {
    static inline __m128 scales(const BlockQ8_0& b) {  // {d, d, 0, 0}
        const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(b.d));
        return _mm_movelh_ps(_mm_unpacklo_ps(d, d), _mm_setzero_ps());
    }
    static inline __m256i codes(const BlockQ8_0& b, int) {
        return _mm256_abs_epi8(_mm256_loadu_si256((const __m256i*)b.qs));
    }
    static inline __m256i act(const BlockQ8_0& b, int, __m256i q) {
        return _mm256_sign_epi8(q, _mm256_loadu_si256((const __m256i*)b.qs));
    }
};
inline __m256i nibbles16(const uint8_t* qs) {  // 16 bytes -> 16 low nibbles, then 16 high
    const __m128i v = _mm_loadu_si128((const __m128i*)qs), mask = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
}
inline __m256i nibbles32(const uint8_t* qs, int high) {  // 32 bytes -> their low or high nibbles
    const __m256i v = _mm256_loadu_si256((const __m256i*)qs);
    return _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
}
template <> struct SimdChunk<Q4_0T> {
    static inline __m128 scales(const BlockQ4_0& b) {  // {d, d, -8 d, -8 d}
        const __m128 d = _mm_cvtph_ps(_mm_set1_epi16((short)b.d));
        return _mm_mul_ps(d, _mm_setr_ps(1.f, 1.f, -8.f, -8.f));
    }
    static inline __m256i codes(const BlockQ4_0& b, int) { return nibbles16(b.qs); }
    static inline __m256i act(const BlockQ4_0&, int, __m256i q) { return q; }
};
template <> struct SimdChunk<Q4_1T> {
    static inline __m128 scales(const BlockQ4_1& b) {  // {d, d, m, m}
        const __m128 dm = f16x2(&b.d);
        return _mm_unpacklo_ps(dm, dm);
    }
    static inline __m256i codes(const BlockQ4_1& b, int) { return nibbles16(b.qs); }
    static inline __m256i act(const BlockQ4_1&, int, __m256i q) { return q; }
};
// The fifth bits of a Q5 block as bytes 0x10 / 0: byte i takes qh byte i / 8 (vpshufb), tests its
// bit i % 8 and keeps 0x10 where it is set.
inline __m256i q5_high16(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                  0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}
template <> struct SimdChunk<Q5_0T> {
    static inline __m128 scales(const BlockQ5_0& b) {  // {d, d, -16 d, -16 d}
        const __m128 d = _mm_cvtph_ps(_mm_set1_epi16((short)b.d));
        return _mm_mul_ps(d, _mm_setr_ps(1.f, 1.f, -16.f, -16.f));
    }
    static inline __m256i codes(const BlockQ5_0& b, int) { return _mm256_or_si256(nibbles16(b.qs), q5_high16(b.qh)); }
    static inline __m256i act(const BlockQ5_0&, int, __m256i q) { return q; }
};
template <> struct SimdChunk<Q5_1T> {
    static inline __m128 scales(const BlockQ5_1& b) {  // {d, d, m, m}
        const __m128 dm = f16x2(&b.d);
        return _mm_unpacklo_ps(dm, dm);
    }
    static inline __m256i codes(const BlockQ5_1& b, int) { return _mm256_or_si256(nibbles16(b.qs), q5_high16(b.qh)); }
    static inline __m256i act(const BlockQ5_1&, int, __m256i q) { return q; }
};
// K-quants: the block's 8 chunk scale vectors at once. Q4_K / Q5_K unpack the 12 packed bytes
// into sc[0..7] and m[0..7] with 32-bit masks (the same bits as scale_min_k4), widen and scale
// them 8 at a time. Values equal block_scales' (d * sc, -(dmin * m); products commute).
inline void k4_scales_v(uint16_t d, uint16_t dmin, const uint8_t* packed, __m128* out) {
    uint32_t u0, u1, u2;
    std::memcpy(&u0, packed, 4);
    std::memcpy(&u1, packed + 4, 4);
    std::memcpy(&u2, packed + 8, 4);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
    const uint32_t sc_lo = u0 & low6;                                     // sc[0..3]
    const uint32_t sc_hi = (u2 & low4) | (((u0 >> 6) & low2) << 4);       // sc[4..7]
    const uint32_t m_lo = u1 & low6;                                      // m[0..3]
    const uint32_t m_hi = ((u2 >> 4) & low4) | (((u1 >> 6) & low2) << 4); // m[4..7]
    const __m128i bytes = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
    alignas(32) float s[8], b[8];
    _mm256_store_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), _mm256_set1_ps(_cvtsh_ss(d))));
    _mm256_store_ps(b, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))),
                                     _mm256_set1_ps(-_cvtsh_ss(dmin))));
    for (int c = 0; c < 8; ++c) out[c] = _mm_setr_ps(s[c], s[c], b[c], b[c]);
}
template <> struct SimdChunk<Q4_KT> {
    static inline void scales(const BlockQ4_K& b, __m128* out) { k4_scales_v(b.d, b.dmin, b.scales, out); }
    static inline __m256i codes(const BlockQ4_K& b, int c) { return nibbles32(b.qs + 32 * (c / 2), c & 1); }
    static inline __m256i act(const BlockQ4_K&, int, __m256i q) { return q; }
};
template <> struct SimdChunk<Q5_KT> {
    static inline void scales(const BlockQ5_K& b, __m128* out) { k4_scales_v(b.d, b.dmin, b.scales, out); }
    static inline __m256i codes(const BlockQ5_K& b, int c) {
        const __m256i hb = _mm256_loadu_si256((const __m256i*)b.qh);
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hb, c), _mm256_set1_epi8(1));
        return _mm256_or_si256(nibbles32(b.qs + 32 * (c / 2), c & 1), _mm256_slli_epi16(bit, 4));
    }
    static inline __m256i act(const BlockQ5_K&, int, __m256i q) { return q; }
};
template <> struct SimdChunk<Q6_KT> {
    static inline void scales(const BlockQ6_K& b, __m128* out) {  // chunk c: sub-scales 2c, 2c + 1
        const __m128i sc = _mm_loadu_si128((const __m128i*)b.scales);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
        alignas(32) float s[16];
        _mm256_store_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_store_ps(s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
        for (int c = 0; c < 8; ++c) out[c] = _mm_setr_ps(s[2 * c], s[2 * c + 1], -32.f * s[2 * c], -32.f * s[2 * c + 1]);
    }
    static inline __m256i codes(const BlockQ6_K& b, int c) {
        const int h = c / 4, k = c % 4;
        const __m256i lo = nibbles32(b.ql + 64 * h + 32 * (k & 1), k >> 1);
        const __m256i hb = _mm256_loadu_si256((const __m256i*)(b.qh + 32 * h));
        const __m256i two = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(two, 4));
    }
    static inline __m256i act(const BlockQ6_K&, int, __m256i q) { return q; }
};

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// One chunk on ymm. p = {d s_lo, d s_hi, b_lo dsum_lo, b_hi dsum_hi}: lanes 0-1 scale the int32
// lanes of the products (0-3 by lane 0, 4-7 by lane 1), lanes 2-3 are the bias terms, summed
// into bias (whose lanes 0-1 are ignored at the end).
template <class T>
inline void chunk_avx2(const typename T::Block& blk, int ci, const ActBlock& a, __m128 s,
                       __m256& acc, __m128& bias) {
    const __m256i q = SimdChunk<T>::act(blk, ci, _mm256_loadu_si256((const __m256i*)a.qs));
    const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(SimdChunk<T>::codes(blk, ci), q),
                                           _mm256_set1_epi16(1));
    const __m128 p = _mm_mul_ps(_mm_loadu_ps(a.d), s);
    const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), scale, acc);
    bias = _mm_add_ps(bias, p);
}

inline float bias_lanes(__m128 bias) {  // lanes 2 + 3
    return _mm_cvtss_f32(_mm_add_ss(_mm_movehl_ps(bias, bias), _mm_shuffle_ps(bias, bias, 3)));
}

template <class T>
float dot_avx2(const void* w_row, const ActBlock* x, int64_t K) {
    const auto* w = (const typename T::Block*)w_row;
    const int64_t nb = K / (32 * T::kChunks);
    // two accumulator chains (even / odd chunks), so the loop is not bound by the FMA latency
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 bias0 = _mm_setzero_ps(), bias1 = _mm_setzero_ps();
    if constexpr (T::kChunks == 1) {
        int64_t ib = 0;
        for (; ib + 2 <= nb; ib += 2) {
            chunk_avx2<T>(w[ib], 0, x[ib], SimdChunk<T>::scales(w[ib]), acc0, bias0);
            chunk_avx2<T>(w[ib + 1], 0, x[ib + 1], SimdChunk<T>::scales(w[ib + 1]), acc1, bias1);
        }
        if (ib < nb) chunk_avx2<T>(w[ib], 0, x[ib], SimdChunk<T>::scales(w[ib]), acc0, bias0);
    } else {
        __m128 sv[T::kChunks];
        for (int64_t ib = 0; ib < nb; ++ib) {
            SimdChunk<T>::scales(w[ib], sv);
            const ActBlock* a = x + ib * T::kChunks;
            for (int ci = 0; ci < T::kChunks; ci += 2) {
                chunk_avx2<T>(w[ib], ci, a[ci], sv[ci], acc0, bias0);
                chunk_avx2<T>(w[ib], ci + 1, a[ci + 1], sv[ci + 1], acc1, bias1);
            }
        }
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + bias_lanes(_mm_add_ps(bias0, bias1));
}

// GEMM micro-kernel: one W row against MR activation rows (act_stride blocks apart), so the
// row's codes and scales are unpacked once for MR rows of X.
template <class T, int MR>
void dot_mr_avx2(const void* w_row, const ActBlock* x, int64_t act_stride, int64_t K, float* y, int64_t y_stride) {
    const auto* w = (const typename T::Block*)w_row;
    const int64_t nb = K / (32 * T::kChunks);
    // accumulators by chunk parity, as in the single-row dot, so each output is bit-identical to
    // the GEMV of its row
    __m256 acc[2][MR];
    __m128 bias[2][MR];
    for (int m = 0; m < MR; ++m)
        for (int e = 0; e < 2; ++e) acc[e][m] = _mm256_setzero_ps(), bias[e][m] = _mm_setzero_ps();
    __m128 sv[T::kChunks];
    for (int64_t ib = 0; ib < nb; ++ib) {
        if constexpr (T::kChunks == 1) {
            sv[0] = SimdChunk<T>::scales(w[ib]);
        } else {
            SimdChunk<T>::scales(w[ib], sv);
        }
        for (int ci = 0; ci < T::kChunks; ++ci) {
            const int e = (int)((ib * T::kChunks + ci) & 1);
            const __m256i codes = SimdChunk<T>::codes(w[ib], ci);
            for (int m = 0; m < MR; ++m) {
                const ActBlock& a = x[m * act_stride + ib * T::kChunks + ci];
                const __m256i q = SimdChunk<T>::act(w[ib], ci, _mm256_loadu_si256((const __m256i*)a.qs));
                const __m128 p = _mm_mul_ps(_mm_loadu_ps(a.d), sv[ci]);
                const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p),
                                                              _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
                acc[e][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), _mm256_set1_epi16(1))), scale, acc[e][m]);
                bias[e][m] = _mm_add_ps(bias[e][m], p);
            }
        }
    }
    for (int m = 0; m < MR; ++m)
        y[m * y_stride] = hsum(_mm256_add_ps(acc[0][m], acc[1][m])) + bias_lanes(_mm_add_ps(bias[0][m], bias[1][m]));
}

#pragma GCC pop_options

// ---- AVX-512 VNNI path: vpdpbusd on ymm --------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

// One chunk on ymm as chunk_avx2, with the int8 products summed by one vpdpbusd (AVX512-VNNI on
// 256-bit registers) instead of vpmaddubsw + vpmaddwd.
template <class T>
inline void chunk_vnni(const typename T::Block& blk, int ci, const ActBlock& a, __m128 s,
                       __m256& acc, __m128& bias) {
    const __m256i q = SimdChunk<T>::act(blk, ci, _mm256_loadu_si256((const __m256i*)a.qs));
    const __m256i prod = _mm256_dpbusd_epi32(_mm256_setzero_si256(), SimdChunk<T>::codes(blk, ci), q);
    const __m128 p = _mm_mul_ps(_mm_loadu_ps(a.d), s);
    const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), scale, acc);
    bias = _mm_add_ps(bias, p);
}

template <class T>
float dot_avx512vnni(const void* w_row, const ActBlock* x, int64_t K) {
    const auto* w = (const typename T::Block*)w_row;
    const int64_t nb = K / (32 * T::kChunks);
    // two accumulator chains (even / odd chunks), so the loop is not bound by the FMA latency
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 bias0 = _mm_setzero_ps(), bias1 = _mm_setzero_ps();
    if constexpr (T::kChunks == 1) {
        int64_t ib = 0;
        for (; ib + 2 <= nb; ib += 2) {
            chunk_vnni<T>(w[ib], 0, x[ib], SimdChunk<T>::scales(w[ib]), acc0, bias0);
            chunk_vnni<T>(w[ib + 1], 0, x[ib + 1], SimdChunk<T>::scales(w[ib + 1]), acc1, bias1);
        }
        if (ib < nb) chunk_vnni<T>(w[ib], 0, x[ib], SimdChunk<T>::scales(w[ib]), acc0, bias0);
    } else {
        __m128 sv[T::kChunks];
        for (int64_t ib = 0; ib < nb; ++ib) {
            SimdChunk<T>::scales(w[ib], sv);
            const ActBlock* a = x + ib * T::kChunks;
            for (int ci = 0; ci < T::kChunks; ci += 2) {
                chunk_vnni<T>(w[ib], ci, a[ci], sv[ci], acc0, bias0);
                chunk_vnni<T>(w[ib], ci + 1, a[ci + 1], sv[ci + 1], acc1, bias1);
            }
        }
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + bias_lanes(_mm_add_ps(bias0, bias1));
}

// GEMM micro-kernel: one W row against MR activation rows (act_stride blocks apart), so the
// row's codes and scales are unpacked once for MR rows of X.
template <class T, int MR>
void dot_mr_avx512vnni(const void* w_row, const ActBlock* x, int64_t act_stride, int64_t K, float* y, int64_t y_stride) {
    const auto* w = (const typename T::Block*)w_row;
    const int64_t nb = K / (32 * T::kChunks);
    // accumulators by chunk parity, as in the single-row dot, so each output is bit-identical to
    // the GEMV of its row
    __m256 acc[2][MR];
    __m128 bias[2][MR];
    for (int m = 0; m < MR; ++m)
        for (int e = 0; e < 2; ++e) acc[e][m] = _mm256_setzero_ps(), bias[e][m] = _mm_setzero_ps();
    __m128 sv[T::kChunks];
    for (int64_t ib = 0; ib < nb; ++ib) {
        if constexpr (T::kChunks == 1) {
            sv[0] = SimdChunk<T>::scales(w[ib]);
        } else {
            SimdChunk<T>::scales(w[ib], sv);
        }
        for (int ci = 0; ci < T::kChunks; ++ci) {
            const int e = (int)((ib * T::kChunks + ci) & 1);
            const __m256i codes = SimdChunk<T>::codes(w[ib], ci);
            for (int m = 0; m < MR; ++m) {
                const ActBlock& a = x[m * act_stride + ib * T::kChunks + ci];
                const __m256i q = SimdChunk<T>::act(w[ib], ci, _mm256_loadu_si256((const __m256i*)a.qs));
                const __m128 p = _mm_mul_ps(_mm_loadu_ps(a.d), sv[ci]);
                const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p),
                                                              _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
                acc[e][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, q)), scale, acc[e][m]);
                bias[e][m] = _mm_add_ps(bias[e][m], p);
            }
        }
    }
    for (int m = 0; m < MR; ++m)
        y[m * y_stride] = hsum(_mm256_add_ps(acc[0][m], acc[1][m])) + bias_lanes(_mm_add_ps(bias[0][m], bias[1][m]));
}

#pragma GCC pop_options


// ---- AMX path: prefill GEMM on int8 tiles ------------------------------------------------------
// Y[m, n] = sum_chunks d_m * s_n * (sum_i q_mi c_ni) + b_n * dsum_m, one tile product per 32-value
// chunk. A = 16 activation rows x 32 int8 (loaded straight from the ActBlocks, stride one row of
// blocks), B = 16 W rows x 32 codes in the VNNI layout (dword r of W row n at B[r][n]), C = 16 x 16
// int32. Codes are signed where the type has no min (Q8_0 raw, Q4_0 c - 8, Q5_0 c - 16, Q6_K
// c - 32: tdpbssd, no bias term) and unsigned with a bias b_n otherwise (Q4_1, Q5_1, Q4_K, Q5_K:
// tdpbsud). Q6_K's two scales per chunk take two tile products, each on half the codes (the other
// half zeroed). After each product the C tile goes to a 1 KB buffer and 16 zmm rows of fp32
// accumulators take cvt(C) * (s_n d_m) + b_n dsum_m. W is unpacked once per 16-row tile into an
// L1/L2-resident buffer and reused for every 16-row tile of X.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")

struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// tmm0, tmm1: C (16 x 16 int32); tmm2: A (16 x 32 int8); tmm3, tmm4: B (8 x 64 int8).
inline void amx_configure() {
    TileConfig cfg;
    cfg.rows[0] = cfg.rows[1] = 16, cfg.colsb[0] = cfg.colsb[1] = 64;
    cfg.rows[2] = 16, cfg.colsb[2] = 32;
    cfg.rows[3] = cfg.rows[4] = 8, cfg.colsb[3] = cfg.colsb[4] = 64;
    // not _tile_loadconfig: GCC 12's version tells the compiler it reads only 8 bytes, so the
    // stores of colsb / rows above may be dropped; this operand is the whole 64-byte config.
    asm volatile("ldtilecfg %0" ::"m"(cfg));
}

// Per type: kParts tile products per chunk, kSigned codes (no bias) or unsigned with a bias.
template <class T> struct AmxChunk {
    static constexpr int kParts = 1;
    static constexpr bool kSigned = false;
    static inline __m256i codes(const typename T::Block& b, int c) { return SimdChunk<T>::codes(b, c); }
};
template <> struct AmxChunk<Q8_0T> {
    static constexpr int kParts = 1;
    static constexpr bool kSigned = true;
    static inline __m256i codes(const BlockQ8_0& b, int) { return _mm256_loadu_si256((const __m256i*)b.qs); }
};
template <int kOffset, class T> struct AmxSignedChunk {
    static constexpr int kParts = 1;
    static constexpr bool kSigned = true;
    static inline __m256i codes(const typename T::Block& b, int c) {
        return _mm256_sub_epi8(SimdChunk<T>::codes(b, c), _mm256_set1_epi8(kOffset));
    }
};
template <> struct AmxChunk<Q4_0T> : AmxSignedChunk<8, Q4_0T> {};
template <> struct AmxChunk<Q5_0T> : AmxSignedChunk<16, Q5_0T> {};
template <> struct AmxChunk<Q6_KT> : AmxSignedChunk<32, Q6_KT> {
    static constexpr int kParts = 2;
};

constexpr int kAmxTile = 16;

// One 16-row tile of W, unpacked: for chunk c and part p, B[c][p] (8 x 64 bytes, VNNI layout)
// and the 16 scales s (and biases b) of that part.
struct AmxPanel {
    std::vector<int8_t> codes;  // [chunks][parts][8][64]
    std::vector<float> s, b;    // [chunks][parts][16]
};

template <class T>
void amx_unpack(const char* w, size_t rb, int64_t n0, int64_t n_rows, int64_t nchunks, AmxPanel& P) {
    using A = AmxChunk<T>;
    constexpr int kP = A::kParts;
    P.codes.assign((size_t)nchunks * kP * 512, 0);
    P.s.assign((size_t)nchunks * kP * 16, 0.f);
    P.b.assign((size_t)nchunks * kP * 16, 0.f);
    alignas(32) int8_t tmp[32];
    ChunkScales cs[T::kChunks];
    for (int64_t j = 0; j < n_rows; ++j) {
        const auto* blk = (const typename T::Block*)(w + (size_t)(n0 + j) * rb);
        for (int64_t ib = 0; ib < nchunks / T::kChunks; ++ib) {
            T::block_scales(blk[ib], cs);
            for (int ci = 0; ci < T::kChunks; ++ci) {
                const int64_t c = ib * T::kChunks + ci;
                _mm256_store_si256((__m256i*)tmp, A::codes(blk[ib], ci));
                for (int p = 0; p < kP; ++p) {
                    int8_t* B = P.codes.data() + ((size_t)c * kP + p) * 512;
                    const int r0 = kP == 1 ? 0 : 4 * p, r1 = kP == 1 ? 8 : 4 * p + 4;
                    for (int r = r0; r < r1; ++r) std::memcpy(B + r * 64 + j * 4, tmp + 4 * r, 4);
                    P.s[((size_t)c * kP + p) * 16 + j] = cs[ci].s[kP == 1 ? 0 : p];
                    P.b[((size_t)c * kP + p) * 16 + j] = A::kSigned ? 0.f : cs[ci].b[0];
                }
            }
        }
    }
}

// Y[16 rows from m0 (rows_valid of them), 16 columns from n0 (cols_valid)] for one unpacked W tile.
template <class T>
void amx_tile(const AmxPanel& P, const ActBlock* xq, int64_t nb, int64_t nchunks, const float* ad,
              const float* as, float* Y, int64_t ldy, int rows_valid, int cols_valid, bool accumulate) {
    using A = AmxChunk<T>;
    constexpr int kP = A::kParts;
    alignas(64) int32_t cbuf[16 * 16];
    __m512 acc[16];
    for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
    const size_t astride = (size_t)nb * sizeof(ActBlock);
    for (int64_t c = 0; c < nchunks; ++c) {
        _tile_loadd(2, xq[c].qs, astride);
        for (int p = 0; p < kP; ++p) {
            _tile_zero(0);
            _tile_loadd(3, P.codes.data() + ((size_t)c * kP + p) * 512, 64);
            if constexpr (A::kSigned) {
                _tile_dpbssd(0, 2, 3);
            } else {
                _tile_dpbsud(0, 2, 3);
            }
            _tile_stored(0, cbuf, 64);
            const __m512 s = _mm512_loadu_ps(P.s.data() + ((size_t)c * kP + p) * 16);
            if constexpr (A::kSigned) {
                for (int m = 0; m < 16; ++m)
                    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m)),
                                             _mm512_mul_ps(s, _mm512_set1_ps(ad[m * nchunks + c])), acc[m]);
            } else {
                const __m512 b = _mm512_loadu_ps(P.b.data() + ((size_t)c * kP + p) * 16);
                for (int m = 0; m < 16; ++m) {
                    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m)),
                                             _mm512_mul_ps(s, _mm512_set1_ps(ad[m * nchunks + c])), acc[m]);
                    acc[m] = _mm512_fmadd_ps(b, _mm512_set1_ps(as[m * nchunks + c]), acc[m]);
                }
            }
        }
    }
    const __mmask16 mask = (__mmask16)((1u << cols_valid) - 1);
    for (int m = 0; m < rows_valid; ++m) {
        float* y = Y + m * ldy;
        const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), acc[m]) : acc[m];
        _mm512_mask_storeu_ps(y, mask, v);
    }
}

template <class T>
void matmul_amx_t(const void* W, const ActBlock* Xq, float* Y, int64_t M, int64_t N, int64_t K, int64_t ldy,
                  bool accumulate, int nt) {
    const size_t rb = row_bytes(type_of<T>(), K);
    const int64_t nchunks = K / 32;
    const int64_t m_tiles = CEIL_DIV(M, kAmxTile), n_tiles = CEIL_DIV(N, kAmxTile);
    // activation-side scales, [M_pad][nchunks]: d, and dsum of the whole chunk (both halves)
    std::vector<float> ad((size_t)m_tiles * kAmxTile * nchunks, 0.f), as(ad.size(), 0.f);
    // the last partial tile of X, padded with zero blocks to 16 rows
    std::vector<ActBlock> tail((size_t)kAmxTile * nchunks);
    const int64_t m_full = M / kAmxTile * kAmxTile;
    std::memset((void*)tail.data(), 0, tail.size() * sizeof(ActBlock));
    if (m_full < M) std::memcpy((void*)tail.data(), Xq + m_full * nchunks, (size_t)(M - m_full) * nchunks * sizeof(ActBlock));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < nchunks; ++c) {
            const ActBlock& a = Xq[m * nchunks + c];
            ad[m * nchunks + c] = a.d[0];
            as[m * nchunks + c] = a.dsum[0] + a.dsum[1];
        }
    const char* w = (const char*)W;
#pragma omp parallel num_threads(nt)
    {
        amx_configure();
        AmxPanel P;
#pragma omp for schedule(dynamic, 1)
        for (int64_t tn = 0; tn < n_tiles; ++tn) {
            const int64_t n0 = tn * kAmxTile;
            const int cols = (int)std::min<int64_t>(kAmxTile, N - n0);
            amx_unpack<T>(w, rb, n0, cols, nchunks, P);
            for (int64_t tm = 0; tm < m_tiles; ++tm) {
                const int64_t m0 = tm * kAmxTile;
                const ActBlock* x = m0 < m_full ? Xq + m0 * nchunks : tail.data();
                amx_tile<T>(P, x, nchunks, nchunks, ad.data() + m0 * nchunks, as.data() + m0 * nchunks,
                            Y + m0 * ldy + n0, ldy, (int)std::min<int64_t>(kAmxTile, M - m0), cols, accumulate);
            }
        }
        _tile_release();
    }
}

#pragma GCC pop_options

// ---- dispatch ------------------------------------------------------------------------------------

using DotFn = float (*)(const void*, const ActBlock*, int64_t);

template <class T>
DotFn pick(Isa isa) {
    switch (isa) {
        case Isa::Avx512Vnni: return dot_avx512vnni<T>;
        case Isa::Avx2: return dot_avx2<T>;
        default: return dot_scalar<T>;
    }
}

// kGemmRows activation rows against one W row; y[m * y_stride] for m < kGemmRows.
constexpr int kGemmRows = 4;
using DotRowsFn = void (*)(const void*, const ActBlock*, int64_t, int64_t, float*, int64_t);

template <class T>
void dot_mr_scalar(const void* w_row, const ActBlock* x, int64_t act_stride, int64_t K, float* y, int64_t y_stride) {
    for (int m = 0; m < kGemmRows; ++m) y[m * y_stride] = dot_scalar<T>(w_row, x + m * act_stride, K);
}

template <class T>
DotRowsFn pick_rows(Isa isa) {
    switch (isa) {
        case Isa::Avx512Vnni: return dot_mr_avx512vnni<T, kGemmRows>;
        case Isa::Avx2: return dot_mr_avx2<T, kGemmRows>;
        default: return dot_mr_scalar<T>;
    }
}

DotRowsFn dot_rows_fn(QType t, Isa isa) {
    if (isa == Isa::Auto) isa = best_isa();
    if (isa == Isa::Amx) isa = Isa::Avx512Vnni;
    switch (t) {
        case QType::Q8_0: return pick_rows<Q8_0T>(isa);
        case QType::Q4_0: return pick_rows<Q4_0T>(isa);
        case QType::Q4_1: return pick_rows<Q4_1T>(isa);
        case QType::Q5_0: return pick_rows<Q5_0T>(isa);
        case QType::Q5_1: return pick_rows<Q5_1T>(isa);
        case QType::Q4_K: return pick_rows<Q4_KT>(isa);
        case QType::Q5_K: return pick_rows<Q5_KT>(isa);
        case QType::Q6_K: return pick_rows<Q6_KT>(isa);
    }
    BRRR_FAIL("unknown quantized type " << (int)t);
}

DotFn dot_fn(QType t, Isa isa) {
    if (isa == Isa::Auto) isa = best_isa();
    BRRR_CHECK(isa_supported(isa), "this CPU cannot run the " << isa_name(isa) << " path (it has: "
               << cpu_features() << ")");
    if (isa == Isa::Amx) isa = Isa::Avx512Vnni;
    switch (t) {
        case QType::Q8_0: return pick<Q8_0T>(isa);
        case QType::Q4_0: return pick<Q4_0T>(isa);
        case QType::Q4_1: return pick<Q4_1T>(isa);
        case QType::Q5_0: return pick<Q5_0T>(isa);
        case QType::Q5_1: return pick<Q5_1T>(isa);
        case QType::Q4_K: return pick<Q4_KT>(isa);
        case QType::Q5_K: return pick<Q5_KT>(isa);
        case QType::Q6_K: return pick<Q6_KT>(isa);
    }
    BRRR_FAIL("unknown quantized type " << (int)t);
}

void matmul_amx(QType t, const void* W, const ActBlock* Xq, float* Y, int64_t M, int64_t N, int64_t K, int64_t ldy,
                bool accumulate, int nt) {
    switch (t) {
        case QType::Q8_0: return matmul_amx_t<Q8_0T>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q4_0: return matmul_amx_t<Q4_0T>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q4_1: return matmul_amx_t<Q4_1T>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q5_0: return matmul_amx_t<Q5_0T>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q5_1: return matmul_amx_t<Q5_1T>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q4_K: return matmul_amx_t<Q4_KT>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q5_K: return matmul_amx_t<Q5_KT>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
        case QType::Q6_K: return matmul_amx_t<Q6_KT>(W, Xq, Y, M, N, K, ldy, accumulate, nt);
    }
    BRRR_FAIL("unknown quantized type " << (int)t);
}

// AMX-TILE and AMX-INT8 in CPUID leaf 7 (EDX bits 24, 25), then the Linux permission to use the
// tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once per process.
bool amx_ready() {
    static const bool ready = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;
        constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
    }();
    return ready;
}

int threads_for(int n_threads) { return n_threads > 0 ? n_threads : omp_get_max_threads(); }

// Per-thread activation scratch, grown on demand and then reused (no allocation per call).
std::vector<ActBlock>& act_scratch(size_t blocks) {
    thread_local std::vector<ActBlock> scratch;
    if (scratch.size() < blocks) scratch.resize(blocks);
    return scratch;
}

// W rows per tile of the GEMM: 16 rows of a 4096-wide Q4_K matrix are 36 KB, so a tile stays in
// L2 while every row of X passes over it.
constexpr int64_t kGemmTileN = 16;

// How far ahead of the row being dotted the GEMV prefetches (about DRAM latency x stream rate;
// 1, 2, 4, 8 and 16 KB measured, docs/kernels/quant_cpu.md).
constexpr int64_t kPrefetchBytes = 2048;

// Asks for rows [r0, r1) of W (rows of rb bytes) to be brought into L1.
inline void prefetch_rows(const char* W, size_t rb, int64_t r0, int64_t r1) {
    const char* end = W + (size_t)r1 * rb;
    for (const char* p = W + (size_t)r0 * rb; p < end; p += 64) _mm_prefetch(p, _MM_HINT_T0);
}

}  // namespace

// ---- ISA detection ------------------------------------------------------------------------------

bool isa_supported(Isa isa) {
    __builtin_cpu_init();
    switch (isa) {
        case Isa::Auto:
        case Isa::Scalar: return true;
        case Isa::Avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        case Isa::Avx512Vnni:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
                   __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        case Isa::Amx: return isa_supported(Isa::Avx512Vnni) && amx_ready();
    }
    return false;
}

Isa best_isa() {
    static const Isa best = isa_supported(Isa::Amx)          ? Isa::Amx
                            : isa_supported(Isa::Avx512Vnni) ? Isa::Avx512Vnni
                            : isa_supported(Isa::Avx2)     ? Isa::Avx2
                                                           : Isa::Scalar;
    return best;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Auto: return isa_name(best_isa());
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx512Vnni: return "avx512vnni";
        case Isa::Amx: return "amx";
    }
    return "?";
}

std::string cpu_features() {
    __builtin_cpu_init();
    std::string out;
    auto add = [&](const char* name, bool has) {
        if (has) out += (out.empty() ? "" : " ") + std::string(name);
    };
    add("avx2", __builtin_cpu_supports("avx2"));
    add("fma", __builtin_cpu_supports("fma"));
    add("f16c", __builtin_cpu_supports("f16c"));
    add("avx512f", __builtin_cpu_supports("avx512f"));
    add("avx512bw", __builtin_cpu_supports("avx512bw"));
    add("avx512vl", __builtin_cpu_supports("avx512vl"));
    add("avx512vnni", __builtin_cpu_supports("avx512vnni"));
    add("avx512bf16", __builtin_cpu_supports("avx512bf16"));
    add("amx-int8", amx_ready());  // and the OS lets this process use the tiles
    return out;
}

// ---- kernels ------------------------------------------------------------------------------------

void quantize_activations(const float* x, ActBlock* out, int64_t K) {
    BRRR_CHECK(K > 0 && K % 32 == 0, "activation rows hold whole blocks of 32; K = " << K);
    for (int64_t b = 0; b < K / 32; ++b, x += 32) {
        float amax = 0.f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
        ActBlock& a = out[b];
        a.d[0] = a.d[1] = d;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 32; ++i) {
            const int q = (int)std::roundf(x[i] * id);
            a.qs[i] = (int8_t)q;
            (i < 16 ? s0 : s1) += q;
        }
        a.dsum[0] = d * (float)s0;
        a.dsum[1] = d * (float)s1;
    }
}

float vec_dot(QType t, const void* w_row, const ActBlock* x, int64_t K, Isa isa) {
    row_bytes(t, K);
    return dot_fn(t, isa)(w_row, x, K);
}

void quantize_activation_rows(const float* X, ActBlock* Xq, int64_t M, int64_t K, int n_threads) {
    BRRR_CHECK(K > 0 && K % 32 == 0, "activation rows hold whole blocks of 32; K = " << K);
    const int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(threads_for(n_threads)) if (M > 1)
    for (int64_t m = 0; m < M; ++m) quantize_activations(X + m * K, Xq + m * nb, K);
}

void matmul(QType t, const void* W, const ActBlock* Xq, float* Y, int64_t M, int64_t N, int64_t K,
            int64_t ldy, bool accumulate, Isa isa, int n_threads) {
    const size_t rb = row_bytes(t, K);
    BRRR_CHECK(M >= 0 && N >= 0 && ldy >= N, "quant matmul: M=" << M << " N=" << N << " ldy=" << ldy);
    if (M == 0 || N == 0) return;
    const DotFn dot = dot_fn(t, isa);
    const int64_t nb = K / 32;
    const char* w = (const char*)W;
    auto store = [accumulate](float& y, float v) { y = accumulate ? y + v : v; };
    const int nt = threads_for(n_threads);
    if (M == 1) {
        // Each thread streams its own contiguous rows; the row kPrefetchBytes ahead is requested
        // while this one is dotted, since rows of a few hundred bytes leave the hardware
        // prefetcher too little run-up once the matrix no longer sits in the last-level cache.
        const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / (int64_t)rb);
#pragma omp parallel num_threads(nt)
        {
            const int n_thr = omp_get_num_threads(), id = omp_get_thread_num();
            const int64_t n0 = N * id / n_thr, n1 = N * (id + 1) / n_thr;
            for (int64_t n = n0; n < n1; ++n) {
                if (n + ahead < n1) prefetch_rows(w, rb, n + ahead, n + ahead + 1);
                store(Y[n], dot(w + (size_t)n * rb, Xq, K));
            }
        }
        return;
    }
    if ((isa == Isa::Amx || (isa == Isa::Auto && best_isa() == Isa::Amx)) && M >= kAmxMinRows)
        return matmul_amx(t, W, Xq, Y, M, N, K, ldy, accumulate, nt);
    const DotRowsFn dot_rows = dot_rows_fn(t, isa);
    const int64_t n_tiles = CEIL_DIV(N, kGemmTileN);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int64_t n0 = tile * kGemmTileN, n1 = std::min(N, n0 + kGemmTileN);
        prefetch_rows(w, rb, n1, std::min(N, n1 + kGemmTileN));  // the next tile, as in the GEMV
        int64_t m0 = 0;
        for (; m0 + kGemmRows <= M; m0 += kGemmRows)
            for (int64_t n = n0; n < n1; ++n) {
                float v[kGemmRows];
                dot_rows(w + (size_t)n * rb, Xq + m0 * nb, nb, K, v, 1);
                for (int r = 0; r < kGemmRows; ++r) store(Y[(m0 + r) * ldy + n], v[r]);
            }
        for (; m0 < M; ++m0)
            for (int64_t n = n0; n < n1; ++n) store(Y[m0 * ldy + n], dot(w + (size_t)n * rb, Xq + m0 * nb, K));
    }
}

void gemv(QType t, const void* W, const float* x, float* y, int64_t N, int64_t K, Isa isa, int n_threads) {
    gemm(t, W, x, y, 1, N, K, isa, n_threads);
}

void gemm(QType t, const void* W, const float* X, float* Y, int64_t M, int64_t N, int64_t K, Isa isa,
          int n_threads) {
    row_bytes(t, K);
    std::vector<ActBlock>& act = act_scratch((size_t)(M * (K / 32)));
    quantize_activation_rows(X, act.data(), M, K, n_threads);
    matmul(t, W, act.data(), Y, M, N, K, N, false, isa, n_threads);
}

}  // namespace quant
}  // namespace brrr
