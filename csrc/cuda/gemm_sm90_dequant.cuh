// gemm_sm90_dequant.cuh — the quantized W of the Hopper GEMM (gemm_quant): each ring slot carries a
// k tile's raw bytes of BN W rows, and the consumers turn them into the bf16 W tile that wgmma
// reads (64 k in the 128-byte swizzle, exactly what TMA writes for a bf16 W), so the wgmma loop
// and every epilogue of gemm_sm90.cuh stay those of the bf16 GEMM and no bf16 copy of W exists.
//
//   W: up to kMaxWeightParts row ranges (QuantB), each bf16 [rows, K] or qlayout tiles of one
//   GGML type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; Q6_K's fp16 d in its tail).
//
//   * Producer (warpgroup 0): thread t copies tile row t's bytes of the slice (64 values, a
//     quarter of a qlayout tile) with 16-byte cp.async into its kRawRowBytes of the slot: the
//     tile's fields before its codes (scales, mins, Q5's high bits), then the slice's code bytes
//     (Q6_K: its 64 ql bytes, 32 qh bytes and the 4-byte word holding its tail d). Its arrival on
//     the slot's full barrier fires when its copies land (cp.async.mbarrier.arrive.noinc), so the
//     producer never waits on memory and runs as far ahead as the ring.
//   * Consumers (both warpgroups, 256 threads): thread ct decodes half a row (row ct / 2, chunks of
//     8 values 4 (ct % 2) ..) exactly as quant_formats.cpp computes the values (the same fp32
//     roundings as dequantize_bf16, then bf16 round to nearest) into one of the kDeqTiles bf16 W
//     tiles (used in turn), 16 bytes a chunk at its swizzled place (chunk c of row r at
//     c ^ (r % 8)), then the tile's wgmma are issued. The decode of k tile kt + 1 runs while the
//     tensor cores multiply k tile kt: two warps a scheduler share it, in the issue slots the
//     asynchronous wgmma leaves idle.
//   Codes become floats without I2F (a quarter of the FP32 rate on sm_90): PRMT puts a code byte
//   under the bits of 1.5 * 2^23, where the ulp is 1, and one FSUB takes 1.5 * 2^23 + offset off
//   (exact: the result is a small integer). A value then costs about 5 instructions.
// Invariants: rows past N and chunks past K are stored as zeros (TMA's zero fill); a W tile is
// rewritten only after the wgmma that read it retired, and read only after every consumer's
// stores and fence.proxy.async (one named barrier a k tile). The output equals dequantize_bf16 +
// gemm_bf16 bit for bit (the same bf16 W, the same wgmma order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cpu/quant.h"
#include "cuda/gemm_common.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ptx.cuh"
#include "cuda/qlayout.h"

namespace brrr {
namespace cuda {
namespace sm90 {

constexpr int kRawRowBytes = 144;  // one row's bytes of a slice (Q6_K 116 at most); 9 x 16: LDS.128 conflict-free

namespace dq {

using quant::QType;

constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: floats in [2^23, 2^24) step by 1

using util::f16_bits;
using util::spread4;

// Byte k of `codes` as kMagic + byte, a float.
__device__ __forceinline__ float magic(uint32_t codes, int k) {
    return __uint_as_float(__byte_perm(codes, 0x4B400000u, 0x7650u | (uint32_t)k));
}

// Values of 8 codes (bytes of lo, then hi): v = f(kMagic + code - bias) with bias = kMagic + offset.
template <typename F>
__device__ __forceinline__ uint4 eight(uint32_t lo, uint32_t hi, float bias, F f) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = f(__fsub_rn(magic(lo, k), bias));
        v[k + 4] = f(__fsub_rn(magic(hi, k), bias));
    }
    return make_uint4(util::pack_bf16x2(v[0], v[1]), util::pack_bf16x2(v[2], v[3]), util::pack_bf16x2(v[4], v[5]),
                      util::pack_bf16x2(v[6], v[7]));
}

__device__ __forceinline__ uint2 lds8(const unsigned char* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint32_t lds_u16(const unsigned char* p, int i) {
    return reinterpret_cast<const unsigned short*>(p)[i];
}
__device__ __forceinline__ uint32_t lds_u32(const unsigned char* p, int i) { return reinterpret_cast<const uint32_t*>(p)[i]; }

// Bytes of the tile before its codes (copied whole for every slice) and code bytes per slice.
template <QType T>
struct Fields {
    static constexpr int kHead = T == QType::Q4_1 ? 32 : T == QType::Q5_0 || T == QType::Q5_K ? 48 : T == QType::Q5_1 ? 64 : 16;
    static constexpr int kBody = T == QType::Q8_0 ? 64 : 32;
};

// cp.async of row `row` of a part (qlayout tiles at `tile_row`, T_row tiles a row) for k tile kt.
template <QType T>
__device__ __forceinline__ void fetch(unsigned char* raw, const unsigned char* tile_row, const unsigned char* tail,
                                      int row, int T_row, int kt) {
    const int j = kt & 3;
    const unsigned char* tile = tile_row + (size_t)(kt >> 2) * qlayout::tile_bytes((int)T);
    if constexpr (T == QType::Q6_K) {
        // e = 64 j + v: ql bytes 64 (j / 2) .., qh bytes 32 (j / 2) .., scales all 16.
        ptx::cp_async_16(raw, tile, true);
#pragma unroll
        for (int i = 0; i < 4; ++i) ptx::cp_async_16(raw + 16 + 16 * i, tile + 16 + 64 * (j >> 1) + 16 * i, true);
#pragma unroll
        for (int i = 0; i < 2; ++i) ptx::cp_async_16(raw + 80 + 16 * i, tile + 144 + 32 * (j >> 1) + 16 * i, true);
        const size_t d_at = ((size_t)row * T_row + (kt >> 2)) * 2;
        ptx::cp_async_4(raw + 112, tail + (d_at & ~(size_t)3));
    } else {
        using Fd = Fields<T>;
#pragma unroll
        for (int i = 0; i < Fd::kHead / 16; ++i) ptx::cp_async_16(raw + 16 * i, tile + 16 * i, true);
#pragma unroll
        for (int i = 0; i < Fd::kBody / 16; ++i)
            ptx::cp_async_16(raw + Fd::kHead + 16 * i, tile + Fd::kHead + Fd::kBody * j + 16 * i, true);
    }
}

// Chunk c (values 64 kt + 8 c ..) of the slice in raw, as 8 bf16.
template <QType T>
__device__ __forceinline__ uint4 decode(const unsigned char* raw, int j, int c, int d_half) {
    const int b = c >> 2, l = 8 * (c & 3);  // 32-value block / sub-block b of the slice, value l of it
    if constexpr (T == QType::Q8_0) {
        const float d = f16_bits(lds_u16(raw, 2 * j + b));
        const uint2 q = lds8(raw + 16 + 32 * b + l);
        return eight(q.x ^ 0x80808080u, q.y ^ 0x80808080u, kMagic + 128.f, [&](float v) { return __fmul_rn(v, d); });
    } else if constexpr (T == QType::Q4_K || T == QType::Q5_K) {
        const int s = 2 * j + b;
        int sc, mn;
        qlayout::scale_min_k4(s, lds_u32(raw, 1), lds_u32(raw, 2), lds_u32(raw, 3), sc, mn);
        const uint32_t h = lds_u32(raw, 0);
        const float d = __fmul_rn(f16_bits(h & 0xFFFF), (float)sc), m = __fmul_rn(f16_bits(h >> 16), (float)mn);
        const uint2 q = lds8(raw + Fields<T>::kHead + l);
        uint32_t lo = (q.x >> (4 * b)) & 0x0F0F0F0Fu, hi = (q.y >> (4 * b)) & 0x0F0F0F0Fu;
        if constexpr (T == QType::Q5_K) {
            const uint2 qh = lds8(raw + 16 + l);
            lo |= ((qh.x >> s) & 0x01010101u) << 4;
            hi |= ((qh.y >> s) & 0x01010101u) << 4;
        }
        return eight(lo, hi, kMagic, [&](float v) { return __fsub_rn(__fmul_rn(d, v), m); });
    } else if constexpr (T == QType::Q6_K) {
        // Sub-block g = 2 (j % 2) + b of the 128-value half j / 2: ql nibble j % 2, qh bits 2 g.
        const int g = 2 * (j & 1) + b;
        const float d = __fmul_rn(f16_bits(lds_u16(raw, 56 + d_half)),
                                  (float)(int8_t)raw[8 * (j >> 1) + 2 * g + (l >> 4)]);
        const uint2 ql = lds8(raw + 16 + 32 * b + l), qh = lds8(raw + 80 + l);
        const uint32_t lo = ((ql.x >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((qh.x >> (2 * g)) & 0x03030303u) << 4);
        const uint32_t hi = ((ql.y >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((qh.y >> (2 * g)) & 0x03030303u) << 4);
        return eight(lo, hi, kMagic + 32.f, [&](float v) { return __fmul_rn(d, v); });
    } else {  // Q4_0, Q4_1, Q5_0, Q5_1: block 2 j + b of the tile; values l.. are nibble l / 16 of bytes l % 16..
        constexpr bool has_m = T == QType::Q4_1 || T == QType::Q5_1;
        constexpr bool has_h = T == QType::Q5_0 || T == QType::Q5_1;
        const int blk = 2 * j + b;
        const float d = f16_bits(lds_u16(raw, blk));
        const float m = has_m ? f16_bits(lds_u16(raw, 8 + blk)) : 0.f;
        const uint2 q = lds8(raw + Fields<T>::kHead + 16 * b + (l & 15));
        uint32_t lo = (q.x >> (l & 16 ? 4 : 0)) & 0x0F0F0F0Fu, hi = (q.y >> (l & 16 ? 4 : 0)) & 0x0F0F0F0Fu;
        if constexpr (has_h) {
            const uint32_t qh = lds_u32(raw, (T == QType::Q5_0 ? 4 : 8) + blk);
            lo |= spread4((qh >> l) & 0xF);
            hi |= spread4((qh >> (l + 4)) & 0xF);
        }
        constexpr float bias = kMagic + (T == QType::Q4_0 ? 8.f : T == QType::Q5_0 ? 16.f : 0.f);
        if constexpr (has_m) return eight(lo, hi, bias, [&](float v) { return __fadd_rn(__fmul_rn(v, d), m); });
        else return eight(lo, hi, bias, [&](float v) { return __fmul_rn(v, d); });
    }
}

// Where row n of the matrix lives: its part (-1: past the parts) and its row inside it.
__device__ __forceinline__ int part_of(const QuantB& q, int n, int& row) {
#pragma unroll
    for (int i = 0; i < kMaxWeightParts; ++i) {
        if (i < q.n && n >= q.row0[i] && n < q.row0[i] + q.rows[i]) {
            row = n - q.row0[i];
            return i;
        }
    }
    return -1;
}

}  // namespace dq

// Where one W row of a tile lives, resolved once per tile: base null for rows past N or the
// parts (stored as zeros).
struct WRow {
    const unsigned char* base;  // the part's row: its first qlayout tile, or its bf16 values
    const unsigned char* tail;  // Q6_K: the part's fp16 d [rows, tiles a row]
    int type, row;              // row: inside the part
};

__device__ __forceinline__ WRow locate(const QuantB& q, int K, int n) {
    int row = 0;
    const int i = dq::part_of(q, n, row);
    if (i < 0) return WRow{nullptr, nullptr, -1, 0};
    return WRow{q.data[i] + (size_t)row * q.row_bytes[i], q.tail[i], q.type[i], row};
}

// Calls f(std::integral_constant<int, T>()) for a row of type T (0: bf16, else a GGML type id with
// a GPU layout), none() for a row past the parts (type -1; the host checked every part's type).
template <typename F, typename G>
__device__ __forceinline__ void with_row_type(int type, F f, G none) {
    using quant::QType;
    switch (type) {
        case 0: return f(std::integral_constant<int, 0>());
        case (int)QType::Q8_0: return f(std::integral_constant<int, (int)QType::Q8_0>());
        case (int)QType::Q4_0: return f(std::integral_constant<int, (int)QType::Q4_0>());
        case (int)QType::Q4_1: return f(std::integral_constant<int, (int)QType::Q4_1>());
        case (int)QType::Q5_0: return f(std::integral_constant<int, (int)QType::Q5_0>());
        case (int)QType::Q5_1: return f(std::integral_constant<int, (int)QType::Q5_1>());
        case (int)QType::Q4_K: return f(std::integral_constant<int, (int)QType::Q4_K>());
        case (int)QType::Q5_K: return f(std::integral_constant<int, (int)QType::Q5_K>());
        case (int)QType::Q6_K: return f(std::integral_constant<int, (int)QType::Q6_K>());
        default: return none();
    }
}

// Producer: the row's bytes of k tile kt into raw (nothing for a row past the parts).
__device__ __forceinline__ void fetch_row(const WRow& w, int K, int kt, unsigned char* raw) {
    const int T_row = (int)qlayout::tiles_per_row(K);
    with_row_type(
        w.type,
        [&](auto type) {
            constexpr int T = decltype(type)::value;
            if constexpr (T == 0) {  // bf16: the slice's 16-byte chunks up to K (K % 8 == 0)
                const int chunks = min(8, (K - kBK * kt) / 8);
                for (int c = 0; c < chunks; ++c)
                    ptx::cp_async_16(raw + 16 * c, w.base + (size_t)kBK * kt * 2 + 16 * c, true);
            } else {
                dq::fetch<(quant::QType)T>(raw, w.base, w.tail, w.row, T_row, kt);
            }
        },
        [] {});
}

// Chunks c0 .. c0 + 3 of a tile row: type T (0: bf16) decoded from raw, chunks from `valid` on
// zero. All loads come before the stores (raw and the tile are both shared memory: a store
// between them would keep the compiler from sharing the scale loads of the chunks).
template <int T>
__device__ __forceinline__ void store_half(const unsigned char* raw, int j, int d_half, int valid, unsigned char* dst,
                                           int r, int c0) {
    uint4 v[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        if constexpr (T == 0) v[c] = *reinterpret_cast<const uint4*>(raw + 16 * (c0 + c));
        else v[c] = dq::decode<(quant::QType)T>(raw, j, c0 + c, d_half);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c)
        *reinterpret_cast<uint4*>(dst + (((c0 + c) ^ (r & 7)) << 4)) = c0 + c < valid ? v[c] : make_uint4(0u, 0u, 0u, 0u);
}

// Consumer: half h (chunks 4 h ..) of tile row r (of the W tile at b_tile), k tile kt, from raw.
__device__ __forceinline__ void decode_half(const WRow& w, int K, int kt, const unsigned char* raw,
                                            unsigned char* b_tile, int r, int h) {
    const int j = kt & 3, c0 = 4 * h;
    const int d_half = (int)(((size_t)w.row * qlayout::tiles_per_row(K) + (kt >> 2)) & 1);
    const int valid = min(8, (K - kBK * kt) / 8);  // chunks before K
    unsigned char* dst = b_tile + r * 128;
    with_row_type(
        w.type, [&](auto type) { store_half<decltype(type)::value>(raw, j, d_half, valid, dst, r, c0); },
        [&] {  // past N or the parts: zeros, as TMA fills them
#pragma unroll
            for (int c = 0; c < 4; ++c) *reinterpret_cast<uint4*>(dst + 16 * (c0 + c)) = make_uint4(0u, 0u, 0u, 0u);
        });
}

}  // namespace sm90
}  // namespace cuda
}  // namespace brrr
