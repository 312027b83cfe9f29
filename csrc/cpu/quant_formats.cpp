// quant_formats.cpp — type table, fp16 conversions and the dequantize-row functions.
//
// Dequantization follows ggml's dequantize_row_* exactly (fp16 scales -> fp32, then the same
// products in the same order); FMA contraction is off in this file so `d * q + m` rounds twice,
// as ggml's reference and the gguf package compute it, and tests can compare bit for bit.
#pragma GCC optimize("fp-contract=off")

#include <cstddef>
#include <cstring>

#include "common.h"
#include "cpu/quant.h"

namespace brrr {
namespace quant {

bool known_type(int id) {
    switch (id) {
        case (int)QType::Q4_0: case (int)QType::Q4_1: case (int)QType::Q5_0: case (int)QType::Q5_1:
        case (int)QType::Q8_0:
        case (int)QType::Q4_K: case (int)QType::Q5_K: case (int)QType::Q6_K: return true;
        default: return false;
    }
}

QType checked_type(int id) {
    BRRR_CHECK(known_type(id), "quantized type id " << id << " is not one the engine keeps "
               "(q4_0=2, q4_1=3, q5_0=6, q5_1=7, q8_0=8, q4_k=12, q5_k=13, q6_k=14)");
    return (QType)id;
}

const char* type_name(QType t) {
    switch (t) {
        case QType::Q4_0: return "q4_0";
        case QType::Q4_1: return "q4_1";
        case QType::Q5_0: return "q5_0";
        case QType::Q5_1: return "q5_1";
        case QType::Q8_0: return "q8_0";
        case QType::Q4_K: return "q4_k";
        case QType::Q5_K: return "q5_k";
        case QType::Q6_K: return "q6_k";
    }
    return "?";
}

QType type_from_name(const std::string& name) {
    for (int id : kTypeIds)
        if (name == type_name((QType)id)) return (QType)id;
    BRRR_FAIL("unknown quantized type \"" << name << "\" (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)");
}

size_t block_bytes(QType t) {
    switch (t) {
        case QType::Q4_0: return sizeof(BlockQ4_0);
        case QType::Q4_1: return sizeof(BlockQ4_1);
        case QType::Q5_0: return sizeof(BlockQ5_0);
        case QType::Q5_1: return sizeof(BlockQ5_1);
        case QType::Q8_0: return sizeof(BlockQ8_0);
        case QType::Q4_K: return sizeof(BlockQ4_K);
        case QType::Q5_K: return sizeof(BlockQ5_K);
        case QType::Q6_K: return sizeof(BlockQ6_K);
    }
    return 0;
}

// ggml falls back to another type when a row is not a whole number of blocks; a file we load is
// what it is, so such a tensor is refused here with the reason.
size_t row_bytes(QType t, int64_t K) {
    const int be = block_elems(t);
    BRRR_CHECK(K > 0 && K % be == 0, type_name(t) << " rows hold whole blocks of " << be
               << " values; K = " << K << " is not a positive multiple of " << be);
    return (size_t)(K / be) * block_bytes(t);
}

float f16_bits_to_f32(uint16_t h) { return f16_to_f32(h); }

uint16_t f32_to_f16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u;       // NaN stays NaN (quiet)
    if (x >= 0x477ff000u) return sign | 0x7c00u;      // >= 65520 rounds to inf
    if (x < 0x38800000u) {                            // below 2^-14: a half subnormal
        // Adding 0.5 (ulp 2^-24, the subnormal step) rounds to nearest even in hardware; the
        // low bits are then the subnormal mantissa (0x400 when it rounds up to the smallest normal).
        float a, half = 0.5f;
        std::memcpy(&a, &x, 4);
        const float s = a + half;
        uint32_t sb, hb;
        std::memcpy(&sb, &s, 4);
        std::memcpy(&hb, &half, 4);
        return sign | (uint16_t)(sb - hb);
    }
    const uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;                           // rebias 127 -> 15, round to nearest even
    return sign | (uint16_t)(x >> 13);
}

namespace {

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 32; ++j) y[j] = b[i].qs[j] * d;
    }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = ((b[i].qs[j] & 0x0F) - 8) * d;
            y[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = (b[i].qs[j] & 0x0F) * d + m;
            y[j + 16] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

inline uint32_t q5_high_bits(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    return bits;
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d);
        const uint32_t qh = q5_high_bits(b[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int x0 = ((b[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = ((b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        const uint32_t qh = q5_high_bits(b[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int x0 = (b[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            const int x1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* q = b[i].qs;
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0, is = 0; j < kBlockK; j += 64, q += 32, is += 2) {
            uint8_t sc, m;
            scale_min_k4(is + 0, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* ql = b[i].qs;
        const uint8_t* qh = b[i].qh;
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < kBlockK; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            scale_min_k4(is + 0, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(is + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int n = 0; n < kBlockK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

}  // namespace

void dequantize_row(QType t, const void* blocks, float* y, int64_t K) {
    const int64_t nb = (int64_t)(row_bytes(t, K) / block_bytes(t));
    switch (t) {
        case QType::Q8_0: return dequant_q8_0((const BlockQ8_0*)blocks, y, nb);
        case QType::Q4_0: return dequant_q4_0((const BlockQ4_0*)blocks, y, nb);
        case QType::Q4_1: return dequant_q4_1((const BlockQ4_1*)blocks, y, nb);
        case QType::Q5_0: return dequant_q5_0((const BlockQ5_0*)blocks, y, nb);
        case QType::Q5_1: return dequant_q5_1((const BlockQ5_1*)blocks, y, nb);
        case QType::Q4_K: return dequant_q4_k((const BlockQ4_K*)blocks, y, nb);
        case QType::Q5_K: return dequant_q5_k((const BlockQ5_K*)blocks, y, nb);
        case QType::Q6_K: return dequant_q6_k((const BlockQ6_K*)blocks, y, nb);
    }
}

int64_t first_bad_scale(QType t, const void* blocks, int64_t n_blocks) {
    // byte offsets of the fp16 fields inside one block
    static const int kD[] = {0}, kDM[] = {0, 2}, kQ6[] = {offsetof(BlockQ6_K, d)};
    const int* fields = kD;
    int n_fields = 1;
    if (t == QType::Q4_1 || t == QType::Q5_1 || t == QType::Q4_K || t == QType::Q5_K) fields = kDM, n_fields = 2;
    if (t == QType::Q6_K) fields = kQ6;
    const size_t bb = block_bytes(t);
    const uint8_t* p = (const uint8_t*)blocks;
    for (int64_t i = 0; i < n_blocks; ++i, p += bb)
        for (int f = 0; f < n_fields; ++f) {
            uint16_t h;
            std::memcpy(&h, p + fields[f], 2);
            if ((h & 0x7c00u) == 0x7c00u) return i;  // exponent all ones: inf or NaN
        }
    return -1;
}

}  // namespace quant
}  // namespace brrr
