// kernels.cpp — the CPU kernels around the matmuls: RMSNorm, RoPE, attention over the KV cache,
// SwiGLU. Shapes and conventions are in kernels.h; everything is fp32.
//
// Attention uses the online ("flash") softmax in blocks of 64 keys: scores of one block go to a
// small stack buffer, the running max/sum rescale the output accumulated so far. So no scratch
// scales with the context length, and each key and value row is read exactly once per head.
// Within a block, scores are formed four keys at a time (one shared horizontal-sum tree instead
// of four) and the output is accumulated one register-wide slice at a time over all the block's
// values, so it never round-trips through memory per key: together 2x faster than a dot + axpy
// per key. exp is the SIMD vexp of simd.h everywhere (softmax, SwiGLU).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/kernels.h"
#include "cpu/simd.h"

namespace brrr {
namespace cpu {

// Rows are independent; below this many a parallel region costs more than it saves.
constexpr int kParallelRows = 4;

// ---- RMSNorm ----------------------------------------------------------------------------------
void rmsnorm(const float* x, const float* w, float* y, int M, int D, float eps) {
#pragma omp parallel for schedule(static) if (M >= kParallelRows)
    for (int m = 0; m < M; ++m) {
        const float* xr = x + (size_t)m * D;
        float* yr = y + (size_t)m * D;
        const float inv_rms = 1.0f / std::sqrt(dot(xr, xr, D) / (float)D + eps);
        const vfloat vinv = vset1(inv_rms);
        int k = 0;
        for (; k + kLanes <= D; k += kLanes)
            vstore(yr + k, vmul(vmul(vload(xr + k), vinv), vload(w + k)));
        for (; k < D; ++k) yr[k] = xr[k] * inv_rms * w[k];
    }
}

// ---- RoPE (rotate-half) -------------------------------------------------------------------------
void rope_tables(const int32_t* positions, const float* inv_freq, int M, int half, float* cos,
                 float* sin) {
    for (int m = 0; m < M; ++m) {
        for (int i = 0; i < half; ++i) {
            // The angle is rounded to fp32 first, exactly as the oracle forms it.
            const float angle = (float)positions[m] * inv_freq[i];
            cos[(size_t)m * half + i] = (float)std::cos((double)angle);
            sin[(size_t)m * half + i] = (float)std::sin((double)angle);
        }
    }
}

void rope(float* x, int M, int stride, int n_heads, int head_dim, const float* cos,
          const float* sin) {
    const int half = head_dim / 2;
#pragma omp parallel for schedule(static) if (M >= kParallelRows)
    for (int m = 0; m < M; ++m) {
        const float* c = cos + (size_t)m * half;
        const float* s = sin + (size_t)m * half;
        for (int h = 0; h < n_heads; ++h) {
            float* lo = x + (size_t)m * stride + (size_t)h * head_dim;
            float* hi = lo + half;
            int i = 0;
            for (; i + kLanes <= half; i += kLanes) {
                vfloat x0 = vload(lo + i), x1 = vload(hi + i);
                vfloat vc = vload(c + i), vs = vload(s + i);
                vstore(lo + i, vfma(x0, vc, vmul(vset1(-1.f), vmul(x1, vs))));
                vstore(hi + i, vfma(x1, vc, vmul(x0, vs)));
            }
            for (; i < half; ++i) {
                const float x0 = lo[i], x1 = hi[i];
                lo[i] = x0 * c[i] - x1 * s[i];
                hi[i] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

// ---- attention ----------------------------------------------------------------------------------
// 64 keys: the block's K and V rows (64 x head_dim floats each) stay in L1 while they are used.
constexpr int kKeyBlock = 64;

// x[i] = exp(x[i] - shift) for i < n; returns their sum.
static float exp_shifted(float* x, int n, float shift) {
    const vfloat vshift = vset1(shift);
    vfloat acc = vzero();
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const vfloat e = vexp(vsub(vload(x + i), vshift));
        vstore(x + i, e);
        acc = vadd(acc, e);
    }
    float sum = vsum(acc);
    for (; i < n; ++i) sum += x[i] = std::exp(x[i] - shift);
    return sum;
}

// scores[i] = scale * (q · keys[i]) for n keys `stride` floats apart. Four keys per pass share
// the loads of q, and their four dot products are reduced by one shuffle tree.
static void block_scores(const float* q, const float* keys, int stride, int n, int head_dim,
                         float scale, float* scores) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float* k0 = keys + (size_t)i * stride;
        const float *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        vfloat a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
        int d = 0;
        for (; d + kLanes <= head_dim; d += kLanes) {
            const vfloat qv = vload(q + d);
            a0 = vfma(qv, vload(k0 + d), a0);
            a1 = vfma(qv, vload(k1 + d), a1);
            a2 = vfma(qv, vload(k2 + d), a2);
            a3 = vfma(qv, vload(k3 + d), a3);
        }
        float s[4];
        vsum4(a0, a1, a2, a3, s);
        for (; d < head_dim; ++d) {
            s[0] += q[d] * k0[d];
            s[1] += q[d] * k1[d];
            s[2] += q[d] * k2[d];
            s[3] += q[d] * k3[d];
        }
        for (int j = 0; j < 4; ++j) scores[i + j] = scale * s[j];
    }
    for (; i < n; ++i) scores[i] = scale * dot(q, keys + (size_t)i * stride, head_dim);
}

// o += sum_i p[i] * values[i] over n value rows `stride` floats apart, one vector of o at a time
// so it stays in a register across all n rows.
static void block_accumulate(float* o, const float* p, const float* values, int stride, int n,
                             int head_dim) {
    int d = 0;
    for (; d + kLanes <= head_dim; d += kLanes) {
        vfloat acc0 = vload(o + d), acc1 = vzero();
        int i = 0;
        for (; i + 2 <= n; i += 2) {
            acc0 = vfma(vset1(p[i]), vload(values + (size_t)i * stride + d), acc0);
            acc1 = vfma(vset1(p[i + 1]), vload(values + (size_t)(i + 1) * stride + d), acc1);
        }
        if (i < n) acc0 = vfma(vset1(p[i]), vload(values + (size_t)i * stride + d), acc0);
        vstore(o + d, vadd(acc0, acc1));
    }
    for (; d < head_dim; ++d) {
        float sum = o[d];
        for (int i = 0; i < n; ++i) sum += p[i] * values[(size_t)i * stride + d];
        o[d] = sum;
    }
}

void attention(const float* q, int q_stride, const float* k_cache, const float* v_cache,
               const KvPages& pages, int kv_stride, const int32_t* slots,
               const int32_t* positions, float* out, int M, int n_heads, int n_kv_heads,
               int head_dim) {
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / std::sqrt((float)head_dim);
    const float neg_inf = -std::numeric_limits<float>::infinity();

    // Query head h of row m, online softmax over blocks of kKeyBlock keys; a key block spans
    // whole cache blocks or lies inside one (both sizes are powers of two), so it is read as runs
    // of rows contiguous in the pool.
    auto attend = [&](int m, int h) {
        const float* qh = q + (size_t)m * q_stride + (size_t)h * head_dim;
        const size_t head_offset = (size_t)(h / group) * head_dim;
        float* o = out + ((size_t)m * n_heads + h) * head_dim;
        std::fill(o, o + head_dim, 0.f);

        const int n_keys = positions[m] + 1;
        const int run = std::min(kKeyBlock, pages.block_size);
        float running_max = neg_inf, running_sum = 0.f;
        float scores[kKeyBlock];
        for (int p0 = 0; p0 < n_keys; p0 += kKeyBlock) {
            const int n_block = std::min(kKeyBlock, n_keys - p0);
            for (int i = 0; i < n_block; i += run) {
                const size_t at = (size_t)pages.row(slots[m], p0 + i) * kv_stride + head_offset;
                block_scores(qh, k_cache + at, kv_stride, std::min(run, n_block - i), head_dim, scale,
                             scores + i);
            }
            const float new_max = std::max(running_max, max_value(scores, n_block));
            if (new_max > running_max && running_sum > 0.f) {
                const float correction = std::exp(running_max - new_max);
                running_sum *= correction;
                scale_add(o, correction, 0.f, o, head_dim);
            }
            running_sum += exp_shifted(scores, n_block, new_max);
            for (int i = 0; i < n_block; i += run) {
                const size_t at = (size_t)pages.row(slots[m], p0 + i) * kv_stride + head_offset;
                block_accumulate(o, scores + i, v_cache + at, kv_stride, std::min(run, n_block - i),
                                 head_dim);
            }
            running_max = new_max;
        }
        scale_add(o, 1.f / running_sum, 0.f, o, head_dim);
    };

    if (M == 1) {
        // Decode of one sequence: each thread takes a contiguous range of heads, so the query
        // heads sharing a KV head (GQA) mostly run on one core, which reads those K/V rows from
        // memory once and then from its own cache.
#pragma omp parallel for schedule(static)
        for (int h = 0; h < n_heads; ++h) attend(0, h);
    } else {
        // Rows at different positions cost differently: hand out (row, head) pairs on demand.
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
        for (int m = 0; m < M; ++m)
            for (int h = 0; h < n_heads; ++h) attend(m, h);
    }
}

// ---- e4m3 rounding ------------------------------------------------------------------------------
// 3 mantissa bits: a normal value in [2^e, 2^(e+1)) is a multiple of 2^(e-3); below the smallest
// normal, 2^-6, the subnormals are multiples of 2^-9. nearbyint rounds half to even.
void round_to_e4m3(float* x, size_t n) {
    constexpr float kMax = 448.f;
    for (size_t i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (!(a < kMax)) {  // past the largest finite value, or NaN
            if (!std::isnan(a)) x[i] = std::copysign(kMax, x[i]);
            continue;
        }
        int e;
        std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): the quantum is 2^(e - 4)
        const int quantum = std::max(e - 4, -9);
        x[i] = std::copysign(std::min(kMax, std::ldexp(std::nearbyint(std::ldexp(a, -quantum)), quantum)), x[i]);
    }
}

// ---- SwiGLU -------------------------------------------------------------------------------------
void swiglu(const float* h13, float* out, int M, int H) {
#pragma omp parallel for schedule(static) if (M >= kParallelRows)
    for (int m = 0; m < M; ++m) {
        const float* gate = h13 + (size_t)m * 2 * H;
        const float* up = gate + H;
        float* o = out + (size_t)m * H;
        const vfloat one = vset1(1.f), zero = vzero();
        int j = 0;
        for (; j + kLanes <= H; j += kLanes) {
            const vfloat g = vload(gate + j);
            vstore(o + j, vmul(vdiv(g, vadd(one, vexp(vsub(zero, g)))), vload(up + j)));
        }
        for (; j < H; ++j) o[j] = gate[j] / (1.f + std::exp(-gate[j])) * up[j];
    }
}

}  // namespace cpu
}  // namespace brrr
