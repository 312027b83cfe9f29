// qlayout.h — how the CUDA engine stores a quantized matrix: GGUF blocks regrouped once at load
// into 16-byte-aligned tiles of 256 values, so that a warp streams a row with 16-byte loads and
// every quant byte sits at a fixed offset inside its tile. Plain C++ (host and device).
//
// A matrix W[N, K] of GGML type t is N rows of T = ceil(K / 256) tiles, tile_bytes(t) each,
// rows row_stride(t, K) = T * tile_bytes(t) apart, followed (Q6_K only) by the tail: the N x T
// fp16 super-block scales d, row-major, at tail_offset(t, N, K). matrix_bytes covers both.
// The 32-value types put 8 consecutive blocks in a tile, their fp16 fields first; the K-quants
// keep their super-block, Q6_K's fields reordered. Offsets inside a tile (bytes):
//   Q8_0  d[8] fp16 @0,               qs[8][32] int8 @16                       = 272
//   Q4_0  d[8] @0,                    qs[8][16] (nibbles, as the file) @16     = 144
//   Q4_1  d[8] @0,  m[8] @16,         qs[8][16] @32                            = 160
//   Q5_0  d[8] @0,  qh[8] uint32 @16, qs[8][16] @48                            = 176
//   Q5_1  d[8] @0,  m[8] @16,  qh[8] @32, qs[8][16] @64                        = 192
//   Q4_K  the block as stored: d, dmin, scales[12] @0, qs[128] @16            = 144
//   Q5_K  the block as stored: d, dmin, scales[12] @0, qh[32] @16, qs[128] @48 = 176
//   Q6_K  scales[16] int8 @0, ql[128] @16, qh[64] @144 (d in the tail)        = 208
// Where K is not a multiple of 256 (32-value types only: K-quant rows are whole super-blocks),
// the last tile's missing blocks are zero bytes and kernels never read the values past K.
// Invariant: every byte of every block is copied, none computed, so the dequantized value of
// every weight is the file's bit for bit (repack / unpack round-trip exactly; tests say so).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"
#include "cpu/quant.h"

namespace brrr {
namespace qlayout {

constexpr int kTileElems = 256;
constexpr int kBlocksPerTile = 8;  // 32-value blocks in a tile

// GGML type ids (cpu/quant.h's QType) -> tile size; 0 for a type without a GPU layout.
constexpr int tile_bytes(int type) {
    switch (type) {
        case 8: return 272;   // Q8_0
        case 2: return 144;   // Q4_0
        case 3: return 160;   // Q4_1
        case 6: return 176;   // Q5_0
        case 7: return 192;   // Q5_1
        case 12: return 144;  // Q4_K
        case 13: return 176;  // Q5_K
        case 14: return 208;  // Q6_K
        default: return 0;
    }
}
// Whether a GGML type id has a GPU layout: the kept quantized types, the only ones the CUDA kernels run.
constexpr bool has_layout(int type) { return tile_bytes(type) > 0; }
constexpr bool has_tail(int type) { return type == 14; }
// Fn<T>::run(args...) for the QType T of a type with a GPU layout (has_layout(type)): the one
// switch from a runtime type id to a kernel instance; a launcher checks the type before it.
template <template <quant::QType> class Fn, typename... Args>
void by_type(int type, Args&&... args) {
    using quant::QType;
    switch (static_cast<QType>(type)) {
        case QType::Q8_0: return Fn<QType::Q8_0>::run(args...);
        case QType::Q4_0: return Fn<QType::Q4_0>::run(args...);
        case QType::Q4_1: return Fn<QType::Q4_1>::run(args...);
        case QType::Q5_0: return Fn<QType::Q5_0>::run(args...);
        case QType::Q5_1: return Fn<QType::Q5_1>::run(args...);
        case QType::Q4_K: return Fn<QType::Q4_K>::run(args...);
        case QType::Q5_K: return Fn<QType::Q5_K>::run(args...);
        case QType::Q6_K: return Fn<QType::Q6_K>::run(args...);
        default: return;
    }
}
constexpr int64_t tiles_per_row(int64_t K) { return (K + kTileElems - 1) / kTileElems; }
constexpr size_t row_stride(int type, int64_t K) { return (size_t)tiles_per_row(K) * tile_bytes(type); }
constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }
constexpr size_t tail_offset(int type, int64_t N, int64_t K) { return (size_t)N * row_stride(type, K); }
constexpr size_t matrix_bytes(int type, int64_t N, int64_t K) {
    return align16(tail_offset(type, N, K) + (has_tail(type) ? (size_t)N * tiles_per_row(K) * 2 : 0));
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K tile (ggml's get_scale_min_k4),
// from its 12 packed scale bytes read as little-endian words S0 = bytes 0-3, S1 = 4-7, S2 = 8-11.
BRRR_HOST_DEVICE inline void scale_min_k4(int j, uint32_t S0, uint32_t S1, uint32_t S2, int& sc, int& m) {
    if (j < 4) {
        sc = (S0 >> (8 * j)) & 63;
        m = (S1 >> (8 * j)) & 63;
    } else {
        const int s = 8 * (j - 4);
        sc = ((S2 >> s) & 0xF) | (((S0 >> s) >> 6 & 3) << 4);
        m = ((S2 >> s) >> 4 & 0xF) | (((S1 >> s) >> 6 & 3) << 4);
    }
}

// Host: rows [first_row, first_row + n_rows) of a matrix of N rows from GGUF blocks (row-major,
// quant::row_bytes(t, K) per row) into their place in `dst` (matrix_bytes(t, N, K) bytes, the
// whole matrix). Throws brrr::Error for an unknown type or K that is not whole blocks.
void repack_rows(int type, const void* blocks, int64_t first_row, int64_t n_rows, int64_t N, int64_t K, void* dst);
// Host: the inverse, back to the file's blocks (for get_weight and the round-trip test).
void unpack_rows(int type, const void* src, int64_t first_row, int64_t n_rows, int64_t N, int64_t K, void* blocks);

}  // namespace qlayout
}  // namespace brrr
