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
//     8 values 4 (ct % 2) .., one 32-value block or sub-block) by quant_decode.cuh, the decode of
//     gemv_quant_mma (the same bf16 of each weight, 1.5-2 instructions a weight in bf16x2 arithmetic;
//     the half's coefficients once, its codes as 16-byte words), into one of the kDeqTiles bf16
//     W tiles (used in turn), 16 bytes a chunk at its swizzled place (chunk c of row r at
//     c ^ (r % 8)), then the tile's wgmma are issued. The decode of k tile kt + 1 runs while the
//     tensor cores multiply k tile kt: two warps a scheduler share it, in the issue slots the
//     asynchronous wgmma leaves idle.
// Invariants: rows past N and chunks past K are stored as zeros (TMA's zero fill); a W tile is
// rewritten only after the wgmma that read it retired, and read only after every consumer's
// stores and fence.proxy.async (one named barrier a k tile). The output equals gemm_bf16 on the
// decoded W bit for bit (the same wgmma order); that W is bf16 of quant_formats.cpp's fp32 values
// for Q8_0, Q4_0 and Q5_0, within quant_decode.cuh's bound of them for the others.
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
#include "cuda/quant_decode.cuh"

namespace brrr {
namespace cuda {
namespace sm90 {

constexpr int kRawRowBytes = 144;  // one row's bytes of a slice (Q6_K 116 at most); 9 x 16: LDS.128 conflict-free

namespace dq {

using quant::QType;
using util::f16_bits;
using util::spread4;

__device__ __forceinline__ uint4 lds16(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
// The 32 bytes at p (16-byte aligned) as 8 words.
__device__ __forceinline__ void words8(const unsigned char* p, uint32_t (&w)[8]) {
    const uint4 a = lds16(p), b = lds16(p + 16);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
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

// Half h of the slice in raw (its values 32 h .. 32 h + 31: chunks 4 h .. 4 h + 3, one 32-value
// block or sub-block), as 4 x 8 bf16. The half's coefficients are computed once and its codes
// read as 16-byte words; codes and coefficients as gemv_quant_mma.cu's QM<T> computes them.
template <QType T>
__device__ __forceinline__ void decode(const unsigned char* raw, int j, int h, int d_half, uint4 (&v)[4]) {
    uint32_t r[4][4];
    [[maybe_unused]] const uint32_t e = qdec::exponent_bytes_in_register();
    if constexpr (T == QType::Q8_0) {
        const qdec::AffineQ8 k = qdec::affine_q8(f16_bits(lds_u16(raw, 2 * j + h)));
        const uint4 q0 = lds16(raw + 16 + 32 * h), q1 = lds16(raw + 32 + 32 * h);
        qdec::chunk_bf16_q8(q0.x, q0.y, k, r[0]);
        qdec::chunk_bf16_q8(q0.z, q0.w, k, r[1]);
        qdec::chunk_bf16_q8(q1.x, q1.y, k, r[2]);
        qdec::chunk_bf16_q8(q1.z, q1.w, k, r[3]);
    } else if constexpr (T == QType::Q4_K || T == QType::Q5_K) {
        // Sub-block s = 2 j + h: the low (h = 0) or high nibbles of the slice's 32 code bytes.
        const int s = 2 * j + h;
        const qdec::Coef coef = qdec::coef_k4(s, lds_u32(raw, 0), lds_u32(raw, 1), lds_u32(raw, 2), lds_u32(raw, 3));
        const qdec::ScaleX2 k = qdec::scale_x2<T>(coef);
        uint32_t w[8];
        words8(raw + Fields<T>::kHead, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (w[i] >> (4 * h)) & 0x0F0F0F0Fu;
        if constexpr (T == QType::Q5_K) {
            uint32_t qh[8];
            words8(raw + 16, qh);
#pragma unroll
            for (int i = 0; i < 8; ++i) w[i] |= ((qh[i] >> s) & 0x01010101u) << 4;
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) qdec::chunk_bf16x2<T>(w[2 * c], w[2 * c + 1], k, r[c], e);
    } else if constexpr (T == QType::Q6_K) {
        // Sub-block g = 2 (j % 2) + h of the 128-value half j / 2: ql nibble j % 2, qh bits 2 g;
        // a scale per 16 values (chunks 0, 1 and 2, 3).
        const int g = 2 * (j & 1) + h;
        const float d = f16_bits(lds_u16(raw, 56 + d_half));
        const int sc = 8 * (j >> 1) + 2 * g;
        const qdec::ScaleX2 k0 = qdec::scale_x2<T>(qdec::coef_q6k(d, (int8_t)raw[sc]));
        const qdec::ScaleX2 k1 = qdec::scale_x2<T>(qdec::coef_q6k(d, (int8_t)raw[sc + 1]));
        uint32_t w[8], qh[8];
        words8(raw + 16 + 32 * h, w);
        words8(raw + 80, qh);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = ((w[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * g)) & 0x03030303u) << 4);
        qdec::chunk_bf16x2<T>(w[0], w[1], k0, r[0], e);
        qdec::chunk_bf16x2<T>(w[2], w[3], k0, r[1], e);
        qdec::chunk_bf16x2<T>(w[4], w[5], k1, r[2], e);
        qdec::chunk_bf16x2<T>(w[6], w[7], k1, r[3], e);
    } else {  // Q4_0, Q4_1, Q5_0, Q5_1: block 2 j + h of the tile; its values l.. are nibble l / 16 of bytes l % 16..
        constexpr bool has_m = T == QType::Q4_1 || T == QType::Q5_1;
        constexpr bool has_h = T == QType::Q5_0 || T == QType::Q5_1;
        const int blk = 2 * j + h;
        const qdec::Coef coef{f16_bits(lds_u16(raw, blk)), has_m ? f16_bits(lds_u16(raw, 8 + blk)) : 0.f};
        const qdec::ScaleX2 k = qdec::scale_x2<T>(coef);
        const uint4 q = lds16(raw + Fields<T>::kHead + 16 * h);
        const uint32_t qh = has_h ? lds_u32(raw, (T == QType::Q5_0 ? 4 : 8) + blk) : 0u;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int l = 8 * c;
            uint32_t lo = ((c & 1 ? q.z : q.x) >> (l & 16 ? 4 : 0)) & 0x0F0F0F0Fu;
            uint32_t hi = ((c & 1 ? q.w : q.y) >> (l & 16 ? 4 : 0)) & 0x0F0F0F0Fu;
            if constexpr (has_h) {
                lo |= spread4((qh >> l) & 0xF);
                hi |= spread4((qh >> (l + 4)) & 0xF);
            }
            qdec::chunk_bf16x2<T>(lo, hi, k, r[c], e);
        }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = make_uint4(r[c][0], r[c][1], r[c][2], r[c][3]);
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

// Half h (chunks 4 h .. 4 h + 3) of a tile row: type T (0: bf16) decoded from raw, chunks from
// `valid` on zero (only a row's last k tile can have them). All loads come before the stores.
template <int T>
__device__ __forceinline__ void store_half(const unsigned char* raw, int j, int h, int d_half, int valid,
                                           unsigned char* dst, int r) {
    uint4 v[4];
    if constexpr (T == 0) {
#pragma unroll
        for (int c = 0; c < 4; ++c) v[c] = dq::lds16(raw + 16 * (4 * h + c));
    } else {
        dq::decode<(quant::QType)T>(raw, j, h, d_half, v);
    }
    const int c0 = 4 * h;
    if (c0 + 4 <= valid) {
#pragma unroll
        for (int c = 0; c < 4; ++c) *reinterpret_cast<uint4*>(dst + (((c0 + c) ^ (r & 7)) << 4)) = v[c];
    } else {
#pragma unroll
        for (int c = 0; c < 4; ++c)
            *reinterpret_cast<uint4*>(dst + (((c0 + c) ^ (r & 7)) << 4)) =
                c0 + c < valid ? v[c] : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Consumer: half h of tile row r (of the W tile at b_tile), k tile kt, from raw.
__device__ __forceinline__ void decode_half(const WRow& w, int K, int kt, const unsigned char* raw,
                                            unsigned char* b_tile, int r, int h) {
    const int j = kt & 3;
    const int d_half = (int)(((size_t)w.row * qlayout::tiles_per_row(K) + (kt >> 2)) & 1);
    const int valid = min(8, (K - kBK * kt) / 8);  // chunks before K
    unsigned char* dst = b_tile + r * 128;
    with_row_type(
        w.type, [&](auto type) { store_half<decltype(type)::value>(raw, j, h, d_half, valid, dst, r); },
        [&] {  // past N or the parts: zeros, as TMA fills them
#pragma unroll
            for (int c = 0; c < 4; ++c) *reinterpret_cast<uint4*>(dst + 16 * (4 * h + c)) = make_uint4(0u, 0u, 0u, 0u);
        });
}

}  // namespace sm90
}  // namespace cuda
}  // namespace brrr
