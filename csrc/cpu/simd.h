// simd.h — the handful of vector operations the CPU kernels are written in, for one ISA picked at
// compile time: AVX-512 (16 floats), AVX2+FMA (8 floats) or plain scalar code (1 "lane").
//
// Kernels loop `for (k = 0; k + kLanes <= n; k += kLanes)` over whole vectors and finish the tail
// with scalar code, so the scalar build runs exactly the same loops and is always correct.
// bf16 weights are widened to fp32 in registers: a bf16 is the top half of an fp32, so
// zero-extending 16 -> 32 bits and shifting left by 16 is the exact conversion.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// GCC 12 flags the deliberately undefined lanes inside _mm512_reduce_add_ps as uninitialized
// (GCC bug 105593); the warning points into the header, so it is silenced there only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace brrr {
namespace cpu {

inline float load_scalar(const float* p) { return *p; }
inline float load_scalar(const uint16_t* p) { return bf16_to_f32(*p); }

#if defined(__AVX512F__)

constexpr int kLanes = 16;
constexpr const char* kSimdName = "avx512";
using vfloat = __m512;
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vset1(float a) { return _mm512_set1_ps(a); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline vfloat vload(const uint16_t* p) {
    __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline void vstore(float* p, vfloat v) { _mm512_storeu_ps(p, v); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vfloat v) { return _mm512_reduce_add_ps(v); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm512_min_ps(a, b); }
inline float vmax_lane(vfloat v) { return _mm512_reduce_max_ps(v); }
// out[0..3] = the lane sums of a, b, c, d: one shuffle tree for all four.
inline void vsum4(vfloat a, vfloat b, vfloat c, vfloat d, float* out) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1)));
}
inline vfloat vdiv(vfloat a, vfloat b) { return _mm512_div_ps(a, b); }
inline vfloat vround(vfloat a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vfloat vscale2(vfloat a, vfloat n) { return _mm512_scalef_ps(a, n); }  // a * 2^n

#elif defined(__AVX2__) && defined(__FMA__)

constexpr int kLanes = 8;
constexpr const char* kSimdName = "avx2";
using vfloat = __m256;
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vset1(float a) { return _mm256_set1_ps(a); }
inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline vfloat vload(const uint16_t* p) {
    __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline void vstore(float* p, vfloat v) { _mm256_storeu_ps(p, v); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vfloat v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline vfloat vsub(vfloat a, vfloat b) { return _mm256_sub_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm256_min_ps(a, b); }
inline void vsum4(vfloat a, vfloat b, vfloat c, vfloat d, float* out) {
    const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const __m256 abcd = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
inline float vmax_lane(vfloat v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
inline vfloat vdiv(vfloat a, vfloat b) { return _mm256_div_ps(a, b); }
inline vfloat vround(vfloat a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vfloat vscale2(vfloat a, vfloat n) {  // a * 2^n for integral n in [-126, 127]
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(a, _mm256_castsi256_ps(bits));
}

#else

constexpr int kLanes = 1;
constexpr const char* kSimdName = "scalar";
using vfloat = float;
inline vfloat vzero() { return 0.f; }
inline vfloat vset1(float a) { return a; }
inline vfloat vload(const float* p) { return *p; }
inline vfloat vload(const uint16_t* p) { return bf16_to_f32(*p); }
inline void vstore(float* p, vfloat v) { *p = v; }
inline vfloat vadd(vfloat a, vfloat b) { return a + b; }
inline vfloat vmul(vfloat a, vfloat b) { return a * b; }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return a * b + c; }
inline float vsum(vfloat v) { return v; }
inline vfloat vsub(vfloat a, vfloat b) { return a - b; }
inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }
inline vfloat vmin(vfloat a, vfloat b) { return a < b ? a : b; }
inline float vmax_lane(vfloat v) { return v; }
inline void vsum4(vfloat a, vfloat b, vfloat c, vfloat d, float* out) {
    out[0] = a, out[1] = b, out[2] = c, out[3] = d;
}
inline vfloat vdiv(vfloat a, vfloat b) { return a / b; }
inline vfloat vround(vfloat a) { return std::nearbyint(a); }
inline vfloat vscale2(vfloat a, vfloat n) { return std::ldexp(a, (int)n); }

#endif

// exp(x) to ~2 ulp, with x clamped to [-87, 88] (so tiny results come out as ~1e-38 rather than
// denormal or 0, and huge ones as 1.6e38 rather than inf). exp(x) = 2^n * exp(r) with
// n = round(x / ln 2), |r| <= ln(2)/2, and exp(r) by its degree-7 Taylor polynomial (error
// < 1e-8 relative). NaN stays NaN.
inline vfloat vexp(vfloat x) {
    const vfloat log2e = vset1(1.44269504088896341f);
    const vfloat ln2_hi = vset1(0.693145751953125f), ln2_lo = vset1(1.42860682030941723e-6f);
    x = vmin(vset1(88.0f), vmax(vset1(-87.0f), x));  // this operand order lets a NaN x through
    const vfloat n = vround(vmul(x, log2e));
    const vfloat minus_n = vmul(n, vset1(-1.f));
    vfloat r = vfma(minus_n, ln2_hi, x);  // x - n ln2 in two parts: exact for |n| <= 127
    r = vfma(minus_n, ln2_lo, r);
    vfloat p = vset1(1.f / 5040);
    p = vfma(p, r, vset1(1.f / 720));
    p = vfma(p, r, vset1(1.f / 120));
    p = vfma(p, r, vset1(1.f / 24));
    p = vfma(p, r, vset1(1.f / 6));
    p = vfma(p, r, vset1(0.5f));
    p = vfma(p, r, vset1(1.f));
    p = vfma(p, r, vset1(1.f));
    return vscale2(p, n);
}

// The largest of x[0, n), n >= 1 (NaNs are skipped unless all are NaN).
inline float max_value(const float* x, int n) {
    vfloat m = vset1(x[0]);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) m = vmax(vload(x + i), m);
    float best = vmax_lane(m);
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    return best;
}

// Asks for the cache line holding p in L2 (prefetcht1); never faults, any address is fine.
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

// dot(a, b) over n floats with two accumulators (hides the FMA latency on short rows).
inline float dot(const float* a, const float* b, int n) {
    vfloat acc0 = vzero(), acc1 = vzero();
    int k = 0;
    for (; k + 2 * kLanes <= n; k += 2 * kLanes) {
        acc0 = vfma(vload(a + k), vload(b + k), acc0);
        acc1 = vfma(vload(a + k + kLanes), vload(b + k + kLanes), acc1);
    }
    for (; k + kLanes <= n; k += kLanes) acc0 = vfma(vload(a + k), vload(b + k), acc0);
    float s = vsum(vadd(acc0, acc1));
    for (; k < n; ++k) s += a[k] * b[k];
    return s;
}

// y = a * y + b * x over n floats.
inline void scale_add(float* y, float a, float b, const float* x, int n) {
    const vfloat va = vset1(a), vb = vset1(b);
    int k = 0;
    for (; k + kLanes <= n; k += kLanes) vstore(y + k, vfma(vb, vload(x + k), vmul(va, vload(y + k))));
    for (; k < n; ++k) y[k] = a * y[k] + b * x[k];
}

}  // namespace cpu
}  // namespace brrr
