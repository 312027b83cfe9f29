// qlayout.cpp — GGUF blocks <-> the CUDA tiles of qlayout.h, on the host (plain C++, built with or
// without CUDA: the loader repacks on the CPU before the upload, and tests round-trip here).
// Every byte is moved, none computed: a tile's fields are the blocks' fields in a new order, the
// padding of a last partial tile (32-value types, K % 256 != 0) is zero, and unpack is the exact
// inverse, so dequantized values never change.
#include "cuda/qlayout.h"

#include <cstring>

#include "common.h"
#include "cpu/quant.h"

namespace brrr {
namespace qlayout {

namespace {

// Where one 32-value block's fields go inside its tile (j = block index in the tile, 0..7).
struct Fields32 {
    int block_bytes;  // in the file
    int d, m, qh, qs;  // offsets in the file's block (-1: the type has no such field)
    int t_d, t_m, t_qh, t_qs;  // offsets of the field arrays in the tile
    int qs_bytes;
};

Fields32 fields32(int type) {
    switch (type) {
        case 8: return {34, 0, -1, -1, 2, 0, -1, -1, 16, 32};    // Q8_0
        case 2: return {18, 0, -1, -1, 2, 0, -1, -1, 16, 16};    // Q4_0
        case 3: return {20, 0, 2, -1, 4, 0, 16, -1, 32, 16};     // Q4_1
        case 6: return {22, 0, -1, 2, 6, 0, -1, 16, 48, 16};     // Q5_0
        case 7: return {24, 0, 2, 4, 8, 0, 16, 32, 64, 16};      // Q5_1
        default: return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    }
}

// The Q6_K block's fields in the file (quant.h) and in the tile (qlayout.h).
constexpr int kQ6FileQl = 0, kQ6FileQh = 128, kQ6FileScales = 192, kQ6FileD = 208;
constexpr int kQ6TileScales = 0, kQ6TileQl = 16, kQ6TileQh = 144;

// to_tile: file -> tile (repack), else tile -> file (unpack). One row of the matrix: `file` the
// row's blocks, `tile` its first tile, `tail` its T fp16 d values (Q6_K only).
void move_row(int type, int64_t K, uint8_t* file, uint8_t* tile, uint8_t* tail, bool to_tile) {
    const int tb = tile_bytes(type);
    const int64_t T = tiles_per_row(K);
    auto move = [to_tile](uint8_t* f, uint8_t* t, size_t n) {
        if (to_tile) std::memcpy(t, f, n);
        else std::memcpy(f, t, n);
    };
    if (type == 12 || type == 13) {  // Q4_K, Q5_K: the block as stored
        for (int64_t t = 0; t < T; ++t) move(file + t * tb, tile + t * tb, (size_t)tb);
        return;
    }
    if (type == 14) {
        for (int64_t t = 0; t < T; ++t) {
            uint8_t* f = file + t * 210;
            uint8_t* p = tile + t * tb;
            move(f + kQ6FileScales, p + kQ6TileScales, 16);
            move(f + kQ6FileQl, p + kQ6TileQl, 128);
            move(f + kQ6FileQh, p + kQ6TileQh, 64);
            move(f + kQ6FileD, tail + 2 * t, 2);
        }
        return;
    }
    const Fields32 F = fields32(type);
    const int64_t nb = K / 32;
    if (to_tile) std::memset(tile, 0, (size_t)(T * tb));  // the last tile's missing blocks
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* f = file + b * F.block_bytes;
        uint8_t* p = tile + (b / kBlocksPerTile) * tb;
        const int j = (int)(b % kBlocksPerTile);
        move(f + F.d, p + F.t_d + 2 * j, 2);
        if (F.m >= 0) move(f + F.m, p + F.t_m + 2 * j, 2);
        if (F.qh >= 0) move(f + F.qh, p + F.t_qh + 4 * j, 4);
        move(f + F.qs, p + F.t_qs + F.qs_bytes * j, (size_t)F.qs_bytes);
    }
}

void check(const char* op, int type, int64_t first_row, int64_t n_rows, int64_t N, int64_t K, const void* a,
           const void* b) {
    BRRR_CHECK(has_layout(type), op << ": GGML type id " << type << " has no GPU layout "
               "(q4_0=2, q4_1=3, q5_0=6, q5_1=7, q8_0=8, q4_k=12, q5_k=13, q6_k=14)");
    const quant::QType t = static_cast<quant::QType>(type);
    const int be = quant::block_elems(t);
    BRRR_CHECK(K > 0 && K % be == 0, op << ": K = " << K << " is not a positive multiple of "
               << quant::type_name(t) << "'s block of " << be << " values");
    BRRR_CHECK(N > 0 && first_row >= 0 && n_rows >= 0 && first_row + n_rows <= N,
               op << ": rows [" << first_row << ", " << first_row + n_rows << ") are not inside a matrix of "
                  << N << " rows");
    BRRR_CHECK(n_rows == 0 || (a != nullptr && b != nullptr), op << ": null buffer");
}

}  // namespace

void repack_rows(int type, const void* blocks, int64_t first_row, int64_t n_rows, int64_t N, int64_t K, void* dst) {
    check("qlayout::repack_rows", type, first_row, n_rows, N, K, blocks, dst);
    const size_t rb = quant::row_bytes(static_cast<quant::QType>(type), K), stride = row_stride(type, K);
    auto* file = static_cast<uint8_t*>(const_cast<void*>(blocks));  // only read: to_tile = true
    auto* out = static_cast<uint8_t*>(dst);
    uint8_t* tail = out + tail_offset(type, N, K);
    for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t n = first_row + r;
        move_row(type, K, file + r * rb, out + n * stride, tail + (size_t)n * tiles_per_row(K) * 2, true);
    }
}

void unpack_rows(int type, const void* src, int64_t first_row, int64_t n_rows, int64_t N, int64_t K, void* blocks) {
    check("qlayout::unpack_rows", type, first_row, n_rows, N, K, src, blocks);
    const size_t rb = quant::row_bytes(static_cast<quant::QType>(type), K), stride = row_stride(type, K);
    auto* in = static_cast<uint8_t*>(const_cast<void*>(src));  // only read: to_tile = false
    auto* file = static_cast<uint8_t*>(blocks);
    uint8_t* tail = in + tail_offset(type, N, K);
    for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t n = first_row + r;
        move_row(type, K, file + r * rb, in + n * stride, tail + (size_t)n * tiles_per_row(K) * 2, false);
    }
}

}  // namespace qlayout
}  // namespace brrr
