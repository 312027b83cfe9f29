// gemv_quant_wgmma.cuh — the device pieces of gemv_quant_wgmma.cu (W decoded into the A registers
// of a register-sourced wgmma, x staged in shared memory as its B), shared with the kernel lab
// (benchmarks/lab/cuda_gemv_quant_wgmma_lab.cu): a lane's chunk decode, the x staging in the
// lanes' chunk order, the m64nNRk16 wgmma (NR = 16, 32 or 64 staged x rows) and the stream of W
// tiles a lane walks.
//
//   A lane (g, t) of warp w decodes rows 16 w + g and + 8 of a 64-row block, chunk c of piece j
//   (quant_pieces.cuh; q = kChunks j + c, 0..7, the chunk's place in the lane's tile): 8 values
//   consecutive in k that fill mma slots 2t.. of k16 steps 2q and 2q + 1 of the tile, so x is
//   staged with its k permuted to match (stage_x); a dot product does not care which k meets
//   which. Every kept type reads its tile this way (kPieces x kChunks = 8).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cpu/quant.h"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/quant_decode.cuh"
#include "cuda/quant_pieces.cuh"

namespace brrr {
namespace cuda {
namespace qwgmma {

using qdec::Coef;
using qdec::chunk_bf16_q8;
using qdec::chunk_bf16x2;
using qdec::scale_x2;
using qpieces::chunk_of;
using qpieces::QM;
using quant::QType;

// Chunk c of piece j of a lane's tile as 4 bf16x2: 8 values consecutive in k.
template <QType T>
__device__ __forceinline__ void decode_chunk(const typename QM<T>::Raw& r, int t, int j, int c, uint32_t out[4]) {
    uint32_t u0, u1;
    if constexpr (T == QType::Q8_0) {
        QM<T>::words(r, j, c, u0, u1);
        chunk_bf16_q8(u0, u1, QM<T>::coef(r, j), out);
    } else {
        Coef k;
        chunk_of<T>(r, t, j, c, k, u0, u1);
        chunk_bf16x2<T>(u0, u1, scale_x2<T>(k), out);
    }
}

// The lane t and chunk c whose chunk of piece 0 starts 8 r values into the tile (r < 32 /
// kPieces: piece j of every lane spans k [j, j + 1) 256 / kPieces of the tile).
template <QType T>
__device__ __forceinline__ void lane_chunk(int r, int& t, int& c) {
    using F = QM<T>;
    t = c = 0;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int cc = 0; cc < F::kChunks; ++cc)
            if (F::lane_k(tt) + F::chunk_k(0, cc) == 8 * r) t = tt, c = cc;
}

// d += A B for one 64 x 64 x 16 step: A (the warpgroup's 64 W rows) from registers, B (64 x rows
// of 16 k) through a K-major 128-byte-swizzle descriptor. d[4 i + e] = D[16 warp + g][8 i + 2 t + e],
// d[4 i + 2 + e] the row 8 below.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p_acc, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// d += A B for one 64 x 16 x 16 step: A (the warpgroup's 64 W rows) from registers, B (16 x rows of
// 16 k) through a K-major 128-byte-swizzle descriptor.
__device__ __forceinline__ void wgmma_m64n16k16_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p_acc, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// d += A B for one 64 x 32 x 16 step (32 x rows), as above.
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p_acc, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// The wgmma of NR staged x rows (16, 32 or 64).
template <int NR>
__device__ __forceinline__ void wgmma_rs(float (&d)[NR / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    static_assert(NR == 16 || NR == 32 || NR == 64, "the staged x rows are 16, 32 or 64");
    if constexpr (NR == 16) wgmma_m64n16k16_rs(d, a, desc_b);
    else if constexpr (NR == 32) wgmma_m64n32k16_rs(d, a, desc_b);
    else wgmma_m64n64k16_rs(d, a, desc_b);
}

// One chunk step of a lane: chunk c of piece j of its two rows' tiles (lo: row, hi: row + 8)
// decoded into the A fragments of x's steps s and s + 1 of the tile (s = 2 (kChunks j + c),
// stage_x's order), multiplied into acc against the tile's boxes at desc_tile as one wgmma group;
// WAIT groups are left in flight (with 1, the group before has read its A registers before they
// are written again).
template <QType T, int NR, int WAIT>
__device__ __forceinline__ void chunk_mma(float (&acc)[NR / 2], const typename QM<T>::Raw& lo,
                                          const typename QM<T>::Raw& hi, int t, int j, int c, uint64_t desc_tile) {
    constexpr int kBoxBytes = NR * 128;
    uint32_t rl[4], rh[4];
    decode_chunk<T>(lo, t, j, c, rl);
    decode_chunk<T>(hi, t, j, c, rh);
    const uint32_t a0[4] = {rl[0], rh[0], rl[1], rh[1]};
    const uint32_t a1[4] = {rl[2], rh[2], rl[3], rh[3]};
    const int s = 2 * (QM<T>::kChunks * j + c);
    const uint64_t d0 = hopper::descriptor_add(desc_tile, (uint32_t)((s >> 2) * (kBoxBytes / 16) + 2 * (s & 3)));
    hopper::wgmma_fence();
    wgmma_rs<NR>(acc, a0, d0);
    wgmma_rs<NR>(acc, a1, hopper::descriptor_add(d0, 2));
    hopper::wgmma_commit();
    hopper::wgmma_wait<WAIT>();
}

// The descriptor units between consecutive tiles' boxes in stage_x's layout: 4 boxes of NR rows.
template <int NR>
constexpr uint32_t kTileDescUnits = 4 * (NR * 128 / 16);

// A warpgroup's accumulators of one 64-row block out: lane (g, t) of warp w holds d[4 i + e] =
// D[16 w + g][8 i + 2 t + e] and d[4 i + 2 + e] the row 8 below, W row n = the block's 16 w + g
// (+ 8) and x row m = 8 i + 2 t + e; out[m ld + n] for the rows m < M.
template <int NR>
__device__ __forceinline__ void store_rows(float* out, const float (&acc)[NR / 2], int M, int ld, int n, int t) {
#pragma unroll
    for (int i = 0; i < NR / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int m = 8 * i + 2 * t + e;
            if (m < M) {
                out[(size_t)m * ld + n] = acc[4 * i + e];
                out[(size_t)m * ld + n + 8] = acc[4 * i + 2 + e];
            }
        }
}

// Stages x rows [0, NR) of k [k0, k0 + ks) (ks a multiple of 256) into xs, ks / 64 boxes of NR
// rows x 128 bytes in the 128-byte swizzle, in step order: step s = 16 tile + 2 (kChunks j + c)
// + h holds, at slot 2t + e, x[k] for k = tile 256 + j 256 / kPieces + 8 r + 4 h + e where
// lane_chunk(r) = (t, c), and at slot 8 + 2t + e the same k + 2. Rows past M are zero. Each thread asks for
// kStageLoads 16-byte pieces before it stores any, so the staging waits on L2 a few times.
template <QType T, int NR, int KSLICE>
__device__ __forceinline__ void stage_x(uint8_t* xs, const bf16* x, int M, int K, int k0) {
    constexpr int kStageLoads = 4, kBoxBytes = NR * 128;
    constexpr int kPerRow = KSLICE / 8, kGroups = NR * kPerRow;  // 8-value groups
    for (int i0 = threadIdx.x; i0 < kGroups; i0 += kStageLoads * blockDim.x) {
        uint4 v[kStageLoads];
#pragma unroll
        for (int u = 0; u < kStageLoads; ++u) {
            const int i = i0 + u * blockDim.x, n = i / kPerRow;
            v[u] = make_uint4(0u, 0u, 0u, 0u);
            if (i < kGroups && n < M) v[u] = __ldg(reinterpret_cast<const uint4*>(x + (size_t)n * K + k0 + 8 * (i % kPerRow)));
        }
#pragma unroll
        for (int u = 0; u < kStageLoads; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i >= kGroups) break;
            const int n = i / kPerRow, k = 8 * (i % kPerRow);
            constexpr int kPieceK = 256 / QM<T>::kPieces;
            const int tile = k / 256, o = k % 256, j = o / kPieceK;
            int t, c;
            lane_chunk<T>((o % kPieceK) >> 3, t, c);
            const uint32_t pair[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const int h = p >> 1, slot = (p & 1) * 8 + 2 * t;
                const int s = 16 * tile + 2 * (QM<T>::kChunks * j + c) + h;
                const int byte = 32 * (s & 3) + 2 * slot;
                const int chunk = (byte >> 4) ^ (n & 7);
                *reinterpret_cast<uint32_t*>(xs + (s >> 2) * kBoxBytes + n * 128 + (chunk << 4) + (byte & 15)) = pair[p];
            }
        }
    }
}


// The W tiles a lane streams: rows row and row + 8 (row = 16 warp + g of a 64-row block) of
// blocks b0, b0 + step, .. below `blocks`, tiles tile0 .. tile0 + tiles - 1 of each; next() loads
// the current tile's pieces of both rows (nothing past the last block) and moves on. The pointers
// move a tile at a time and are rebuilt only at a new block.
template <QType T>
struct TileStream {
    using F = QM<T>;
    const uint8_t* W;
    const unsigned short* tail;  // Q6_K's fp16 d [rows, row_tiles] after the tiles; read by Q6_K only
    size_t row_stride;
    int row_tiles, tile0, tiles, blocks, step, row, t;
    int pb, pt = 0;
    const uint8_t* pp;
    const unsigned short* pd;

    __device__ __forceinline__ TileStream(const uint8_t* W_, int rows, int K, int tile0_, int tiles_, int b0,
                                          int step_, int row_, int t_)
        : W(W_), row_stride((size_t)(K / 256) * F::kTileBytes), row_tiles(K / 256), tile0(tile0_), tiles(tiles_),
          blocks(rows / 64), step(step_), row(row_), t(t_), pb(b0) {
        tail = reinterpret_cast<const unsigned short*>(W + (size_t)rows * row_stride);
        seek();
    }
    __device__ __forceinline__ void seek() {
        pp = W + (size_t)(64 * pb + row) * row_stride + (size_t)tile0 * F::kTileBytes;
        pd = tail + (size_t)(64 * pb + row) * row_tiles + tile0;
    }
    __device__ __forceinline__ void next(typename F::Raw& lo, typename F::Raw& hi) {
        if (pb < blocks) {
            lo = F::load(pp, pd, t, 256);
            hi = F::load(pp + 8 * row_stride, pd + 8 * row_tiles, t, 256);
        }
        pp += F::kTileBytes;
        ++pd;
        if (++pt == tiles) {
            pt = 0;
            pb += step;
            seek();
        }
    }
};

}  // namespace qwgmma
}  // namespace cuda
}  // namespace brrr
