// quant_pieces.cuh — how a lane reads one 256-value qlayout tile of a W row for the tensor-core
// decode (gemv_quant_mma.cu, and benchmarks/lab/cuda_gemv_quant_wgmma_lab.cu): per type, which
// 16-byte "pieces" lane t of a row's 4 lanes loads, how each piece splits into "chunks" of 8
// values consecutive in k, and each chunk's coefficient (scale and min) and code words, which
// quant_decode.cuh turns into bf16.
//
//   QM<T>::load(tile, tail d, t, kleft) -> Raw;  chunk_of<T>(raw, t, j, c, coef, u0, u1) (Q8_0:
//   QM<Q8_0>::coef / words, decoded by chunk_bf16_q8); chunk c of piece j starts at k
//   lane_k(t) + chunk_k(j, c) of the tile.
// Invariants: the four lanes of a row together read each piece once and every k of the tile
// once; pieces at or past kleft values into the tile stay zero (the 32-value types' partial
// last tile).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cpu/quant.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ptx.cuh"
#include "cuda/quant_decode.cuh"

namespace brrr {
namespace cuda {
namespace qpieces {

using quant::QType;
using qdec::AffineQ8;
using qdec::Coef;
using util::f16_bits;
using util::spread4;

// Chunk c of a 16-byte nibble piece: c = 0 the low nibbles of words x, y (8 consecutive values),
// 1 their high nibbles, 2 / 3 the same of words z, w.
__device__ __forceinline__ void nibble_words(const uint4& q, int c, uint32_t& u0, uint32_t& u1) {
    const uint32_t a = c < 2 ? q.x : q.z, b = c < 2 ? q.y : q.w;
    const int s = (c & 1) * 4;
    u0 = (a >> s) & 0x0F0F0F0Fu;
    u1 = (b >> s) & 0x0F0F0F0Fu;
}

// Per type: kTileBytes; kPieces per lane and tile, kChunks per piece (kPieces * kChunks = 8);
// load(tile, tail d, t, kleft) -> Raw (pieces at or past kleft values into the tile stay zero);
// coef(raw, j, hi) -> Coef of piece j's low / high chunks (Q8_0: AffineQ8);
// words(raw, j, c, u0, u1);
// The tile-relative k of chunk c of piece j is lane_k(t) + chunk_k(j, c) (multiples of 8): the
// lane's part once per tile, the rest a constant of the unrolled chunk loop, so that the x loads
// take it as an immediate offset of one pointer.
template <QType T> struct QM;

// The 32-value nibble types: piece j = block t + 4j of the tile (chunks 0, 2: values 0..15 of
// the block, low nibbles; 1, 3: values 16..31). Q5: bit v of the block's qh is value v's bit 4.
template <int kTB, int kQs, int kM, int kQh>
struct Nibble32 {
    static constexpr int kTileBytes = kTB, kPieces = 2, kChunks = 4;
    struct Raw {
        uint4 q[2];
        uint32_t d[2], m[2], qh[2];
    };
    __device__ static Raw load(const uint8_t* t, const unsigned short*, int lt, int kleft) {
        Raw r;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int pi = lt + 4 * j;
            r.q[j] = make_uint4(0u, 0u, 0u, 0u);
            r.d[j] = r.m[j] = r.qh[j] = 0u;
            if (32 * pi < kleft) {
                r.q[j] = ptx::ld_stream_16(t + kQs + 16 * pi);
                r.d[j] = __ldg(reinterpret_cast<const unsigned short*>(t) + pi);
                if (kM >= 0) r.m[j] = __ldg(reinterpret_cast<const unsigned short*>(t + kM) + pi);
                if (kQh >= 0) r.qh[j] = __ldg(reinterpret_cast<const uint32_t*>(t + kQh) + pi);
            }
        }
        return r;
    }
    __device__ static Coef coef(const Raw& r, int j, bool) {
        return Coef{f16_bits(r.d[j]), kM >= 0 ? f16_bits(r.m[j]) : 0.f};
    }
    __device__ static void words(const Raw& r, int j, int c, uint32_t& u0, uint32_t& u1) {
        nibble_words(r.q[j], c, u0, u1);
        if (kQh >= 0) {
            const int v0 = (c & 1) * 16 + (c >> 1) * 8;
            u0 |= spread4((r.qh[j] >> v0) & 15u);
            u1 |= spread4((r.qh[j] >> (v0 + 4)) & 15u);
        }
    }
    __device__ static int lane_k(int lt) { return 32 * lt; }
    __device__ static int chunk_k(int j, int c) { return 128 * j + (c & 1) * 16 + (c >> 1) * 8; }
};
template <> struct QM<QType::Q4_0> : Nibble32<144, 16, -1, -1> {};
template <> struct QM<QType::Q4_1> : Nibble32<160, 32, 16, -1> {};
template <> struct QM<QType::Q5_0> : Nibble32<176, 48, -1, 16> {};
template <> struct QM<QType::Q5_1> : Nibble32<192, 64, 16, 32> {};

// Q8_0: piece j = 16 bytes t + 4j of qs (half (t + 4j) % 2 of block (t + 4j) / 2, whose d is
// half t / 2 of the header's word j, picked at load); chunk c = words 2c, 2c + 1.
template <> struct QM<QType::Q8_0> {
    static constexpr int kTileBytes = 272, kPieces = 4, kChunks = 2;
    struct Raw {
        uint4 q[4];
        uint2 d;  // the fp16 d of pieces 0, 1 (x) and 2, 3 (y): this lane's halves of the header
    };
    __device__ static Raw load(const uint8_t* t, const unsigned short*, int lt, int kleft) {
        Raw r;
        const uint4 h = kleft > 0 ? __ldg(reinterpret_cast<const uint4*>(t)) : make_uint4(0u, 0u, 0u, 0u);
        const uint32_t sel = lt >> 1 ? 0x7632u : 0x5410u;  // half t / 2 of each header word
        r.d = make_uint2(__byte_perm(h.x, h.y, sel), __byte_perm(h.z, h.w, sel));
#pragma unroll
        for (int j = 0; j < 4; ++j)
            r.q[j] = 16 * (lt + 4 * j) < kleft ? ptx::ld_stream_16(t + 16 + 16 * (lt + 4 * j)) : make_uint4(0u, 0u, 0u, 0u);
        return r;
    }
    __device__ static AffineQ8 coef(const Raw& r, int j) {
        const uint32_t w = j < 2 ? r.d.x : r.d.y;
        const float d = f16_bits(j & 1 ? w >> 16 : w & 0xFFFFu);
        return qdec::affine_q8(d);
    }
    // j and c may be runtime values (the kernel's loops over them need not unroll): selects,
    // not an indexed register array, which would go to local memory.
    __device__ static void words(const Raw& r, int j, int c, uint32_t& u0, uint32_t& u1) {
        const uint4 q = j == 0 ? r.q[0] : j == 1 ? r.q[1] : j == 2 ? r.q[2] : r.q[3];
        u0 = c ? q.z : q.x;
        u1 = c ? q.w : q.y;
    }
    __device__ static int lane_k(int lt) { return 16 * lt; }
    __device__ static int chunk_k(int j, int c) { return 64 * j + 8 * c; }
};

// Q4_K / Q5_K: piece j = bytes 16 pi.. of qs, pi = t + 4j, i.e. g = pi / 2, h = pi % 2: its low
// nibbles are values 16h.. of sub-block 2g, its high nibbles those of sub-block 2g + 1 (Q5_K:
// bits 2g, 2g + 1 of qh bytes 16h.., the same 16 bytes for both pieces of a lane).
template <bool kQ5>
struct QK45 {
    static constexpr int kTileBytes = kQ5 ? 176 : 144, kPieces = 2, kChunks = 4, kQs = kQ5 ? 48 : 16;
    struct Raw {
        uint4 q[2];
        uint4 hdr;
        uint4 qh;
    };
    __device__ static Raw load(const uint8_t* t, const unsigned short*, int lt, int) {
        Raw r;
        r.q[0] = ptx::ld_stream_16(t + kQs + 16 * lt);
        r.q[1] = ptx::ld_stream_16(t + kQs + 16 * (lt + 4));
        r.hdr = __ldg(reinterpret_cast<const uint4*>(t));
        r.qh = kQ5 ? __ldg(reinterpret_cast<const uint4*>(t + 16) + (lt & 1)) : make_uint4(0u, 0u, 0u, 0u);
        return r;
    }
    // sub-block 4h + b's scale and min
    __device__ static Coef coef_sub(const Raw& r, int h, int b) {
        return qdec::coef_k4(qdec::k4_bytes(r.hdr.y, r.hdr.z, r.hdr.w), h, b, r.hdr.x);
    }
    __device__ static void words(const Raw& r, int j, int c, uint32_t& u0, uint32_t& u1, int g) {
        nibble_words(r.q[j], c, u0, u1);
        if (kQ5) {
            const int s = 2 * g + (c & 1);
            const uint32_t a = c < 2 ? r.qh.x : r.qh.z, b = c < 2 ? r.qh.y : r.qh.w;
            u0 |= ((a >> s) & 0x01010101u) << 4;
            u1 |= ((b >> s) & 0x01010101u) << 4;
        }
    }
    // pi = t + 4j: g = t / 2 + 2j, h = t % 2
    __device__ static int lane_k(int lt) { return 64 * (lt >> 1) + 16 * (lt & 1); }
    __device__ static int chunk_k(int j, int c) { return 128 * j + 32 * (c & 1) + 8 * (c >> 1); }
};
template <> struct QM<QType::Q4_K> : QK45<false> {};
template <> struct QM<QType::Q5_K> : QK45<true> {};

// Q6_K: piece j = ql bytes 16 pi.., pi = t + 4j: h = j, g1 = t / 2, l0 = 16 (t % 2); its low
// nibbles are values l0.. of group g1 of half h (bits 2 g1 of qh[32h + l0 ..] on top), its high
// nibbles those of group g1 + 2 (bits 2 g1 + 4); scales[8h + 2g + t % 2]; d from the tail.
template <> struct QM<QType::Q6_K> {
    static constexpr int kTileBytes = 208, kPieces = 2, kChunks = 4;
    struct Raw {
        uint4 ql[2], qh[2];
        uint4 sc;
        uint32_t d;
    };
    __device__ static Raw load(const uint8_t* t, const unsigned short* tail_d, int lt, int) {
        Raw r;
        const int l0 = 16 * (lt & 1);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            r.ql[j] = ptx::ld_stream_16(t + 16 + 16 * (lt + 4 * j));
            r.qh[j] = ptx::ld_stream_16(t + 144 + 32 * j + l0);
        }
        r.sc = __ldg(reinterpret_cast<const uint4*>(t));
        r.d = __ldg(tail_d);
        return r;
    }
    __device__ static Coef coef(const Raw& r, int j, bool hi, int lt) {
        const int idx = 8 * j + 2 * ((lt >> 1) + (hi ? 2 : 0)) + (lt & 1);  // < 16
        const uint32_t w = idx < 4 ? r.sc.x : idx < 8 ? r.sc.y : idx < 12 ? r.sc.z : r.sc.w;
        const int sc = (int)(int8_t)(w >> (8 * (idx & 3)));
        return qdec::coef_q6k(f16_bits(r.d), sc);
    }
    __device__ static void words(const Raw& r, int j, int c, uint32_t& u0, uint32_t& u1, int lt) {
        nibble_words(r.ql[j], c, u0, u1);
        const int s = 2 * (lt >> 1) + 4 * (c & 1);
        const uint32_t a = c < 2 ? r.qh[j].x : r.qh[j].z, b = c < 2 ? r.qh[j].y : r.qh[j].w;
        u0 |= ((a >> s) & 0x03030303u) << 4;
        u1 |= ((b >> s) & 0x03030303u) << 4;
    }
    __device__ static int lane_k(int lt) { return 32 * (lt >> 1) + 16 * (lt & 1); }
    __device__ static int chunk_k(int j, int c) { return 128 * j + 64 * (c & 1) + 8 * (c >> 1); }
};

// The Coef and code words of chunk c of piece j, per type but Q8_0 (the K-quants and Q6_K need the
// lane's t).
template <QType T>
__device__ __forceinline__ void chunk_of(const typename QM<T>::Raw& r, int lt, int j, int c, Coef& a, uint32_t& u0,
                                         uint32_t& u1) {
    using F = QM<T>;
    if constexpr (T == QType::Q4_K || T == QType::Q5_K) {
        const int g = (lt + 4 * j) >> 1;  // sub-blocks 2g, 2g + 1: 4j + 2 (t / 2) + (c & 1)
        a = F::coef_sub(r, j, 2 * (lt >> 1) + (c & 1));
        F::words(r, j, c, u0, u1, g);
    } else if constexpr (T == QType::Q6_K) {
        a = F::coef(r, j, c & 1, lt);
        F::words(r, j, c, u0, u1, lt);
    } else {
        static_assert(T != QType::Q8_0, "Q8_0 decodes by chunk_bf16_q8");
        a = F::coef(r, j, c & 1);
        F::words(r, j, c, u0, u1);
    }
}

}  // namespace qpieces
}  // namespace cuda
}  // namespace brrr
