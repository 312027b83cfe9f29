// quant_quantize.cpp — fp32 rows -> GGUF blocks, with ggml's reference quantizers.
//
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: quantize_row_q*_ref (absmax / min-max scales); the gguf package's numpy
// quantizer computes the same, so the bytes are identical. Q4_K, Q5_K: quantize_row_q4_K_ref /
// q5_K_ref — per 32-value sub-block a weighted least-squares (scale, min) search
// (make_qkx2_quants: 21 / 16 candidate scales), then the sub-scales and mins quantized to 6 bits
// against the block's fp16 d and dmin, then values re-quantized with those. Q6_K:
// quantize_row_q6_K_ref — per 16 values a signed scale search (make_qx_quants, rmse type 1,
// 19 candidates), sub-scales to int8 against fp16 d, values re-quantized.
//
// Bit-identity needs the same float32 operations in the same order: every expression below is
// ggml's, evaluated left to right, with FMA contraction off for this file (setup.py compiles with
// -ffp-contract=fast elsewhere); no reassociation happens without -ffast-math. Rows are
// independent: OpenMP over rows.
#pragma GCC optimize("fp-contract=off")

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common.h"
#include "cpu/quant.h"

namespace brrr {
namespace quant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

inline uint16_t h(float f) { return f32_to_f16_bits(f); }
inline float f(uint16_t b) { return f16_bits_to_f32(b); }

// ggml's nearest_int: round half to even through the float adder (|v| <= 2^22).
inline int nearest_int(float v) {
    const float val = v + 12582912.f;
    int i;
    std::memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

void q8_0_row(const float* x, BlockQ8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = h(d);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = (int8_t)std::roundf(x[j] * id);
    }
}

void q4_0_row(const float* x, BlockQ4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j)
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = h(d);
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)std::min(15, (int)(int8_t)(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)std::min(15, (int)(int8_t)(x1 + 8.5f));
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

void q4_1_row(const float* x, BlockQ4_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = h(d);
        y[i].m = h(min);
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)std::min(15, (int)(int8_t)(x0 + 0.5f));
            const uint8_t xi1 = (uint8_t)std::min(15, (int)(int8_t)(x1 + 0.5f));
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

void q5_0_row(const float* x, BlockQ5_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j)
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = h(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)std::min(31, (int)(int8_t)(x0 + 16.5f));
            const uint8_t xi1 = (uint8_t)std::min(31, (int)(int8_t)(x1 + 16.5f));
            y[i].qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

void q5_1_row(const float* x, BlockQ5_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = h(d);
        y[i].m = h(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)(x0 + 0.5f), xi1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

// ggml's make_qkx2_quants: L[n] in [0, nmax] and (scale, -min) minimizing the weighted error of
// scale * L + min against x, over nstep + 1 candidate scales around nmax / (max - min).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)std::max(0, std::min(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = std::max(0, std::min(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (w = x^2): signed
// L[n] - nmax in [-nmax, nmax - 1] and the scale, over 19 candidate scales.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) amax = ax, max = x[i];
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = std::max(-nmax, std::min(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = std::max(-nmax, std::min(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + std::max(-nmax, std::min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q4_K and Q5_K share everything but nmax (15 / 31), the scale search (rmin, steps) and packing.
// Fills scales[12], d, dmin and L[256] (values in [0, nmax]).
void k4_scales_and_levels(const float* x, int nmax, float rmin, int nstep, uint8_t* scales_out,
                          uint16_t* d_out, uint16_t* dmin_out, uint8_t* L) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    std::memset(scales_out, 0, 12);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = std::min<uint8_t>(63, ls);
        lm = std::min<uint8_t>(63, lm);
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = h(max_scale / 63.f);
    *dmin_out = h(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min_k4(j, scales_out, &sc, &m);
        const float d = f(*d_out) * sc;
        if (!d) continue;
        const float dm = f(*dmin_out) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)std::max(0, std::min(nmax, l));
        }
    }
}

void q4_k_row(const float* x, BlockQ4_K* y, int64_t nb) {
    uint8_t L[kBlockK];
    for (int64_t i = 0; i < nb; ++i, x += kBlockK) {
        k4_scales_and_levels(x, 15, -1.f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t* q = y[i].qs;
        for (int j = 0; j < kBlockK; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void q5_k_row(const float* x, BlockQ5_K* y, int64_t nb) {
    uint8_t L[kBlockK];
    for (int64_t i = 0; i < nb; ++i, x += kBlockK) {
        k4_scales_and_levels(x, 31, -0.5f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t* qh = y[i].qh;
        uint8_t* ql = y[i].qs;
        std::memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < kBlockK; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) l1 -= 16, qh[j] |= m1;
                if (l2 > 15) l2 -= 16, qh[j] |= m2;
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

void q6_k_row(const float* x, BlockQ6_K* y, int64_t nb) {
    int8_t L[kBlockK];
    float scales[16];
    for (int64_t i = 0; i < nb; ++i, x += kBlockK) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ++ib) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = std::fabs(scale);
            if (abs_scale > max_abs_scale) max_abs_scale = abs_scale, max_scale = scale;
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[i], 0, sizeof(BlockQ6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = h(1 / iscale);
        for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < 16; ++j) {
            const float d = f(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = std::max(-32, std::min(31, l));
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t* ql = y[i].ql;
        uint8_t* qh = y[i].qh;
        for (int j = 0; j < kBlockK; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

}  // namespace

void quantize_rows(QType t, const float* x, void* out, int64_t N, int64_t K) {
    const size_t rb = row_bytes(t, K);
    const int64_t nb = K / block_elems(t);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
        const float* xr = x + r * K;
        void* yr = (char*)out + (size_t)r * rb;
        switch (t) {
            case QType::Q8_0: q8_0_row(xr, (BlockQ8_0*)yr, nb); break;
            case QType::Q4_0: q4_0_row(xr, (BlockQ4_0*)yr, nb); break;
            case QType::Q4_1: q4_1_row(xr, (BlockQ4_1*)yr, nb); break;
            case QType::Q5_0: q5_0_row(xr, (BlockQ5_0*)yr, nb); break;
            case QType::Q5_1: q5_1_row(xr, (BlockQ5_1*)yr, nb); break;
            case QType::Q4_K: q4_k_row(xr, (BlockQ4_K*)yr, nb); break;
            case QType::Q5_K: q5_k_row(xr, (BlockQ5_K*)yr, nb); break;
            case QType::Q6_K: q6_k_row(xr, (BlockQ6_K*)yr, nb); break;
        }
    }
}

}  // namespace quant
}  // namespace brrr
