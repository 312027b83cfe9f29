// gemv_quant_mma.cu — decode matmuls of a few rows on quantized weights, on the tensor cores:
// y[m, n] = sum_k x[m, k] * Wb[n, k] for M = 2..64 rows (1 works too), every Epilogue, Wb the
// weights decoded to bf16 (Numerics below: bf16 of the dequantized W, or within a stated bound of W).
//
//   W: N rows of qlayout tiles (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; Q6_K's fp16 d in
//      the tail), 16-byte aligned; x [M, K] bf16 (the engine normalizes into bf16 first, as for the
//      bf16 tensor-core GEMV), 16-byte aligned; fp32 accumulation, y handled per Epilogue.
//
// Why: gemv_quant.cu's dp4a kernel spends CUDA-core work per weight *per row of x*, so from a few
// rows on the FMA/dp4a pipes, not HBM, bind. Here every weight is decoded once, whatever M is, and
// the per-row work goes to mma.sync m16n8k16 (W as the A operand, x as B), as in gemv.cu's
// gemv_mma_kernel: the decoded A fragments of a chunk feed NT = 1, 2, 4 or 8 n8 tiles of x rows
// (M up to 8 NT), so one weight pass serves up to 64 rows and the weight bytes per row fall as
// 1 / M (Marlin's point for small batches). Numerics: W carries bf16 rounding on this path, as
// the bf16 engine's stored weights do; the products and sums are the tensor cores' fp32. Each
// weight w = D (c - off) + a (D the block's or sub-block's scale, a its min or 0) comes out within
// 2^-8 (2.01 |w| + 2.05 |a|) of the fp32 value of quant_formats.cpp (bf16(w) is within 2^-8 |w|);
// Q4_0 / Q5_0 give bf16(w) exactly, and so does Q8_0.
//   * One CTA per 16-row W tile (SwiGLU: gate rows j..j+7 over up rows H+j..; RopeKV: 8 dims over
//     their rotation partners, so C rows g and g + 8 of a lane are the pair), or per two (MT = 2,
//     below); its 8 warps (16 on short grids, 4 on wide grids, below) take every 8th (16th, 4th)
//     256-value k tile of the rows, one in flight per lane.
//     Lane (g, t), g = lane / 4, loads rows g and g + 8 of each W tile and, per k tile, the 64
//     values of "pieces" t, t + 4 (.. t + 12 for Q8_0) with 16-byte L1-bypassing loads (lanes
//     t = 0..3 read 64 contiguous bytes of a row).
//   * A piece's 16-byte words give "chunks" of 8 values that are consecutive in k (low nibbles
//     of two words, or their high nibbles, or 8 int8 codes; quant_pieces.cuh), so x is read as
//     16-byte loads of plain bf16 rows, straight from global memory through L1 (every warp of the
//     SM reads the same x; nothing is staged, no barrier until the end). A dot product does not care which k
//     meets which, so a lane's chunk feeds the mma slots 2t.. of two mmas, and lane (n, t) loads
//     x row n at the same 8 k.
//   * The decode is quant_decode.cuh's, two values at a time in bf16x2 arithmetic (1.5 instructions
//     a weight, 2 for Q4_0 / Q5_0; Q8_0 one exact FFMA a weight and F2FP); the bound above is of its
//     roundings.
//   * x reads: a lane loads 16 bytes of x per chunk and n8 tile, 3.6x the Q4_K weight bytes it
//     decodes at 16 rows, and its four lanes of a row touch two 128-byte lines: at NT = 2 those
//     loads, not HBM, fill L1's wavefronts. MT = 2 W tiles a warp (rows g, g + 8, g + 16, g + 24)
//     feed each x fragment to twice the mma and halve that traffic; it costs registers (2 CTAs of
//     8 warps an SM, 4 of 4) and half the CTAs, so it runs only at NT = 2, for the 4- and 5-bit
//     types, on matrices with CTAs to spare and rows of 16+ k tiles
//     (tuning::kGemvQuantMmaTwoTileMin*).
//   * Short grids (16-row CTAs that fit 2 an SM, as the 8B's wo and w2; short_grid below) of those
//     types halve it too at 1-16 rows: CTAs of 16 warps and two W tiles, 1 an SM, as many warps an
//     SM as 2 CTAs of 8. The warps are the K split, which orders a row's sums, so such a matrix
//     takes 16 warps at every M up to 16. The partial tiles are dynamic shared memory, and each
//     launch asks for the least carveout that holds them, leaving the rest to the L1 that caches x.
//   * Wide grids (12+ 16-row CTAs an SM: the LM heads, the 8B's w13; wide_grid below) take CTAs of
//     4 warps at 1-32 rows, twice as many an SM: there the kernel is bound by issue, and a warp
//     that walks twice the k tiles pays its set-up, partial tiles and store half as often.
//   * Registers: 4 fp32 accumulators per n8 tile and W tile (32 at NT = 8) beside the raw tiles.
//     Up to NT = 2 with one W tile (NT = 1 for Q8_0 / Q6_K) a grid of more than 2 CTAs an SM is
//     held to 80 registers for 3 CTAs an SM: more warps, not more tiles in flight per lane, hide
//     the loads. A smaller grid (wo, w2) gains no warps from that cap and runs at 128 registers
//     (CtasPerSm; the choice changes no arithmetic). From NT = 4 on a tile's chunk loop stays
//     rolled (unrolled, ptxas interleaves chunks and spills at the 128 registers of 2 CTAs an SM);
//     x fragments are loaded 2 n8 tiles at a time (1 for Q8_0 / Q6_K at NT = 8).
//     Spills through L1 (check with -Xptxas -v after a change here), a few reloads a tile: on
//     sm_90a 8 bytes a thread in Q8_0's 80-register NT = 1 instances and its NT = 8 SwiGLU and
//     Q6_K's 80-register NT = 1 plain one; Q4_K's RopeKV instances 12-48 (NT = 2 and 8); Q5_K's
//     (its qh words are 4 registers a row more) 8-96, most at NT = 2, RopeKV the most. The
//     unpredicated x loads (ptxas hoists them further) and the byte-wise K-quant scales put them
//     there (docs/kernels/gemv.md, rows "x rows clamped" and "K-quant scales as bytes"). On sm_80:
//     Q8_0 4-12 bytes (80-register SwiGLU, NT = 8), Q4_K 4 (NT = 2) and 28-36 (RopeKV), Q5_K
//     8-92. The two instances that would spill more (RopeKV, NT = 8, Q8_0 / Q6_K) run 1 CTA an SM.
//   * The warps' partial tiles are added in shared memory in warp order (MT x NT x 4 KB for 8), warp
//     mt NT + nt stores W tile mt's n8 tile nt through util::store_mma_gemv_tiles, as
//     gemv_mma_kernel. PDL: the first tile's loads are issued before the wait (weights never
//     depend on the kernel before).
// Invariants: a lane's tiles, pieces and chunks run in a fixed order, the warps (the K split) are a
// function of the matrix alone within each row range below, and columns n of an mma never mix, so a
// row's result does not depend on the other rows: batched rows are bit-identical to the same row in
// any other batch of 1-64 rows, but on a short grid only within 1-16 and within 17-64, on a wide
// grid within 1-32 and within 33-64.
// Pieces past K (32-value types whose last tile is partial) are never read, their W and x are zero.
// x rows past M are never read either: a lane whose row of an n8 tile is past M reads row M - 1,
// into columns the store drops. The launcher refuses unknown types, K that is not whole blocks, M
// outside [1, 64], an x of more than 2^31 - 1 values, null or misaligned pointers before any
// launch.
// Cost past 16 rows: every CTA reads all M x rows (M K 2 bytes, through L1 / L2) against 16 W rows
// (16 K x the type's bytes a weight), 14x the weight bytes at M = 64 on Q4_K; that traffic and
// the mma count (2 NT per chunk) are what bounds NT = 8, not HBM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cpu/quant.h"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/qlayout.h"
#include "cuda/quant_decode.cuh"
#include "cuda/quant_pieces.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

using quant::QType;

constexpr int kMaxRows = 64;  // largest M (the contract in ops.h): 8 n8 tiles of x rows
static_assert(kMaxRows == tuning::kGemvQuantMmaMaxRows, "the engine's per-call rows are this kernel's limit");
// Warps of a CTA, the K split of its W tiles: 8, 16 on short grids up to 16 rows and 4 on wide
// grids up to 32 (short_grid and wide_grid below).
constexpr int kWarps = 8;
constexpr int kShortGridWarps = 16;
constexpr int kWideGridWarps = 4;
// The types whose rows are whole 256-value tiles (the K-quants: K is a multiple of 256), so no
// piece lies past K.
template <QType T>
constexpr bool kWholeTiles = quant::block_elems(T) == quant::kBlockK;
// The types whose raw tile takes 20 registers a row (the others take at most 16): the register
// budgets below give them less room.
template <QType T>
constexpr bool kWideTile = T == QType::Q8_0 || T == QType::Q6_K;
// x fragments (16 bytes of one x row each) per lane loaded together per chunk: the first group is
// issued before the chunk's decode, the rest between its mma. 2 (1 at NT = 1), and 1 for Q8_0 /
// Q6_K at NT = 8, whose raw tiles leave the least room beside 32 accumulators.
template <QType T, int NT>
struct XInFlight {
    static constexpr int value = NT < 2 ? NT : NT >= 8 && kWideTile<T> ? 1 : 2;
};

using util::Pairing;
using util::unit_rows;

struct QMArgs {
    const uint8_t* W;
    const uint8_t* tail;  // Q6_K: the [N, T] fp16 d
    const bf16* x;        // [M, K]
    size_t row_stride;
    int T;                // tiles per row
    int K, M;
    int n_units;          // output columns, or pairs
    int half_n;           // SwiGLU: offset of the up rows (H); Rope: head_dim / 2
    Epilogue ep;
    EpilogueArgs out;
};

using qdec::Coef;
using qdec::chunk_bf16_q8;
using qdec::chunk_bf16x2;
using qdec::scale_x2;

using qpieces::chunk_of;
using qpieces::QM;

// Whether piece j of lane t lies inside the row (kleft values left from the tile's start): a
// constant where rows are whole tiles, so the K-quants' x loads carry no predicate at all.
template <QType T>
__device__ __forceinline__ bool piece_in_k(int lt, int j, int kleft) {
    if constexpr (kWholeTiles<T>) return true;
    else if constexpr (T == QType::Q8_0) return 16 * (lt + 4 * j) < kleft;
    else return 32 * (lt + 4 * j) < kleft;
}

// CTAs per SM the registers are capped for. 3 (80 registers a thread) where the instance fits
// there (one W tile, up to NT = 2 for the 4- and 5-bit types, NT = 1 for Q8_0 / Q6_K; at most the
// few bytes of spill the banner lists) and the grid has more than 2 CTAs an SM to fill: a third
// CTA's warps hide more of the weight loads' latency than anything the registers buy. A grid of
// at most 2 CTAs an SM (the 4096-row wo and w2 of 8B-sized models) gains no warps from the cap
// and loses the registers' freedom to schedule, so it runs the kTwo instance: 2 (128 registers),
// the cap everywhere else, but 1 where ptxas spills at 128 with every other lever pulled (rolled
// chunk loops, one x fragment in flight): the RopeKV pairing at NT = 8 of the two wide types; its
// latency hiding is the weaker, and the engine meets it only with a single-type Q8_0 / Q6_K wqkv
// at decode batches 33..64. The wide types at NT = 2 stay at 128: at 80 the Q6_K LM head and w13
// lost (docs/kernels/gemv.md, row "80 registers at 9-16 rows for Q6_K / Q8_0").
template <QType T, int NT, int MT>
constexpr bool kFitsThreeCtas = MT == 1 && ((NT <= 2 && !kWideTile<T>) || NT == 1);
enum class Cap { kTwo, kThree };
template <QType T, int NT, Pairing P, int MT, Cap C, int WARPS>
struct CtasPerSm {
    static_assert(C == Cap::kTwo || (WARPS != kShortGridWarps && kFitsThreeCtas<T, NT, MT>),
                  "80 registers only where the instance fits them");
    // (16 warps at 128 registers fill the register file; CTAs of 4 warps fit twice those of 8)
    static constexpr int value = WARPS == kShortGridWarps ? 1
                                 : (C == Cap::kThree ? 3 : NT >= 8 && P == Pairing::Rope && kWideTile<T> ? 1 : 2) *
                                       kWarps / WARPS;
};

// MT: 16-row W tiles a CTA (and each of its warps) decodes against every x fragment it loads.
// 2 halves the x reads per weight, at the price of 107-128 registers (2 CTAs of 8 warps an SM, 4
// of 4, 1 of 16) and half the CTAs: taken at NT = 2 for the 4- and 5-bit types on matrices with
// CTAs to spare (the rule in launch_rows), and at NT = 1 and 2 on their short grids (short_grid).
// The wide tiles would spill at 128 registers.
template <QType T, int NT, Pairing P, int MT, Cap C, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, CtasPerSm<T, NT, P, MT, C, WARPS>::value)
    gemv_quant_mma_kernel(QMArgs a) {
    using F = QM<T>;
    using Raw = typename F::Raw;
    static_assert(NT >= 1 && NT <= WARPS, "warp nt stores n8 tile nt: at most one n8 tile per warp");
    static_assert(MT == 1 || (MT == 2 && NT <= 2 && !kWideTile<T>), "two W tiles only where their registers fit");
    constexpr int XG = XInFlight<T, NT>::value;
    // From NT = 4 on the loop over a tile's chunks stays rolled (and at NT = 8 Q8_0's over pieces,
    // whose 80 bytes a row leave the least room): unrolled, ptxas interleaves chunks and spills at
    // 128 registers.
    constexpr int kChunkUnroll = NT >= 4 ? 1 : F::kChunks;
    constexpr int kPieceUnroll = NT >= 8 && T == QType::Q8_0 ? 1 : F::kPieces;
    extern __shared__ float partial[];  // [WARPS][MT NT][4][32]: partial_bytes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, lt = lane & 3;
    const int M = a.M, K = a.K, n_tiles = a.T;

    // This lane's W rows in W tile mt of the CTA: tile rows g (lo) and g + 8 (hi); for pairs, unit
    // u's two rows.
    util::MmaTileRows rows[MT];
    const uint8_t* row_lo[MT];
    const uint8_t* row_hi[MT];
    const unsigned short* tail_lo[MT];
    const unsigned short* tail_hi[MT];
    const unsigned short* tail = reinterpret_cast<const unsigned short*>(a.tail);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        util::MmaTileRows& r = rows[mt];
        r.u = 8 * (MT * blockIdx.x + mt) + g;
        if (P == Pairing::None) {
            r.lo = 16 * (MT * blockIdx.x + mt) + g;
            r.hi = r.lo + 8;
            r.ok_lo = r.lo < a.n_units;
            r.ok_hi = r.hi < a.n_units;
        } else {
            const int2 pr = unit_rows<P>(r.u < a.n_units ? r.u : 0, a.half_n);
            r.lo = pr.x;
            r.hi = pr.y;
            r.ok_lo = r.ok_hi = r.u < a.n_units;
        }
        row_lo[mt] = a.W + (size_t)(r.ok_lo ? r.lo : 0) * a.row_stride;
        row_hi[mt] = a.W + (size_t)(r.ok_hi ? r.hi : 0) * a.row_stride;
        tail_lo[mt] = tail + (size_t)(r.ok_lo ? r.lo : 0) * n_tiles;
        tail_hi[mt] = tail + (size_t)(r.ok_hi ? r.hi : 0) * n_tiles;
    }

    // The warp's i-th tile (warp + WARPS i < n_tiles) of rows lo / hi, zero where the row is missing.
    Raw wl[MT], wh[MT];
    auto load = [&](int i) {
        const int tile = warp + WARPS * i;
        const int kleft = K - 256 * tile;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wl[mt] = Raw{};
            wh[mt] = Raw{};
            if (rows[mt].ok_lo)
                wl[mt] = F::load(row_lo[mt] + (size_t)tile * F::kTileBytes, tail_lo[mt] + tile, lt, kleft);
            if (rows[mt].ok_hi)
                wh[mt] = F::load(row_hi[mt] + (size_t)tile * F::kTileBytes, tail_hi[mt] + tile, lt, kleft);
        }
    };
    // The first tile loads before the wait, in a branch of its own (as gemv.cu: issued
    // unconditionally, ptxas sinks the loads past griddepcontrol.wait to their first use).
    bool preloaded = false;
    if (warp < n_tiles) {
        load(0);
        preloaded = true;
    }
    pdl_wait();
    pdl_launch_dependents();

    // x row of this lane's B fragment in n8 tile nt: 8 nt + g, or the last row where that is
    // past M. A column of the mma never meets another, so a column past M computes on a real row
    // and its C entries, which the store drops, are all it touches; no x load is predicated on M
    // or zeroed (a predicated load costs its zeroing and, at 128 registers, its address rebuilt
    // from the kernel arguments). As an element offset from the lane's row in tile 0 (32 bits:
    // the launcher refuses an M K past 2^31 - 1), and the lane's k of a tile.
    const int x_row0 = min(g, M - 1), x_last = M - 1 - x_row0;
    const bf16* x_lane = a.x + (size_t)x_row0 * K + F::lane_k(lt);
    auto x_row_offset = [&](int nt) { return min(8 * nt, x_last) * K; };

    float acc[MT * NT][4];
#pragma unroll
    for (int ti = 0; ti < MT * NT; ++ti)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[ti][i] = 0.f;

    for (int i = 0; warp + WARPS * i < n_tiles; ++i) {
        if (!preloaded) load(i);
        preloaded = false;
        const int tile = warp + WARPS * i;
        const int kleft = K - 256 * tile;
        const bf16* x_tile = x_lane + (size_t)256 * tile;
#pragma unroll(kPieceUnroll)
        for (int j = 0; j < F::kPieces; ++j) {
            // mma.sync needs the whole warp: a piece past K for lane 0 is past K for every lane
            // (skipped together); otherwise a lane's piece past K has zero W and zero x.
            if (!piece_in_k<T>(0, j, kleft)) continue;
            const bool in_k = piece_in_k<T>(lt, j, kleft);
#pragma unroll(kChunkUnroll)
            for (int c = 0; c < F::kChunks; ++c) {
                const bf16* x_chunk = x_tile + F::chunk_k(j, c);
                // x fragments of n8 tiles n0 .. n0 + XG - 1 (the first group is issued
                // before the decode, whose work hides its latency).
                uint4 xv[XG];
                auto load_x = [&](int n0) {
#pragma unroll
                    for (int q = 0; q < XG; ++q)
                        xv[q] = in_k ? __ldg(reinterpret_cast<const uint4*>(x_chunk + x_row_offset(n0 + q)))
                                     : make_uint4(0u, 0u, 0u, 0u);
                };
                load_x(0);
                // Each W tile's A fragments of this chunk: decoded rows lo / hi, k halves 0 / 1.
                uint32_t a0[MT][4], a1[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    uint32_t l0, l1, h0, h1, rl[4], rh[4];
                    if constexpr (T == QType::Q8_0) {
                        F::words(wl[mt], j, c, l0, l1);
                        F::words(wh[mt], j, c, h0, h1);
                        chunk_bf16_q8(l0, l1, F::coef(wl[mt], j), rl);
                        chunk_bf16_q8(h0, h1, F::coef(wh[mt], j), rh);
                    } else {
                        Coef kl, kh;
                        chunk_of<T>(wl[mt], lt, j, c, kl, l0, l1);
                        chunk_of<T>(wh[mt], lt, j, c, kh, h0, h1);
                        chunk_bf16x2<T>(l0, l1, scale_x2<T>(kl), rl);
                        chunk_bf16x2<T>(h0, h1, scale_x2<T>(kh), rh);
                    }
                    a0[mt][0] = rl[0], a0[mt][1] = rh[0], a0[mt][2] = rl[1], a0[mt][3] = rh[1];
                    a1[mt][0] = rl[2], a1[mt][1] = rh[2], a1[mt][2] = rl[3], a1[mt][3] = rh[3];
                }
#pragma unroll
                for (int n0 = 0; n0 < NT; n0 += XG) {
                    if (n0 > 0) load_x(n0);
#pragma unroll
                    for (int q = 0; q < XG; ++q) {
                        const uint32_t b0[2] = {xv[q].x, xv[q].y}, b1[2] = {xv[q].z, xv[q].w};
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            ptx::mma_bf16_16816(acc[mt * NT + n0 + q], a0[mt], b0);
                            ptx::mma_bf16_16816(acc[mt * NT + n0 + q], a1[mt], b1);
                        }
                    }
                }
            }
        }
    }

    util::store_mma_gemv_tiles<P, MT, NT, WARPS>(acc, partial, warp, lane, M, rows, a.half_n, a.ep, a.out);
}

// W rows a CTA covers: 16 MT (pairs: 8 MT units).
template <Pairing P>
int mma_ctas(int n_units, int w_tiles) {
    return CEIL_DIV(n_units, (P == Pairing::None ? 16 : 8) * w_tiles);
}

// Shared memory of a CTA's partial tiles: [WARPS][MT NT][4][32] floats.
constexpr size_t partial_bytes(int warps, int mt, int nt) { return (size_t)warps * mt * nt * 4 * 32 * sizeof(float); }
// Shared memory the driver reserves beside each CTA's own (sm_80 and later).
constexpr size_t kReservedSmemPerCta = 1024;

// One instance on `ctas` CTAs. Its partial tiles are dynamic shared memory of partial_bytes, and
// the carveout asked for, from the same size, is the least that holds the instance's CTAs an SM:
// left alone the driver gives shared memory 64-100 KB of an H200 SM's 256 KB, which the L1 that
// caches x then lacks, and at 16 rows L1 misses add to the wavefronts that bind.
template <QType T, int NT, Pairing P, int MT, Cap C, int WARPS>
void launch_instance(const QMArgs& a, int ctas, const DeviceFacts& dev, cudaStream_t stream) {
    const auto kernel = gemv_quant_mma_kernel<T, NT, P, MT, C, WARPS>;
    constexpr size_t kSmem = partial_bytes(WARPS, MT, NT);
    static_assert(kSmem <= 48 * 1024, "dynamic shared memory past 48 KB needs an opt-in");
    constexpr size_t kSmemPerSm = CtasPerSm<T, NT, P, MT, C, WARPS>::value * (kSmem + kReservedSmemPerCta);
    const int carveout = (int)std::min<size_t>(100, CEIL_DIV(100 * kSmemPerSm, (size_t)dev.smem_per_sm));
    prefer_carveout(kernel, carveout);
    launch_pdl(kernel, dim3(ctas), dim3(WARPS * 32), kSmem, stream, a);
    CUDA_CHECK_LAUNCH("gemv_quant_mma_kernel");
}

template <QType T, int NT, Pairing P, int MT, int WARPS>
void launch(const QMArgs& a, const DeviceFacts& dev, cudaStream_t stream) {
    const int ctas = mma_ctas<P>(a.n_units, MT);
    // The register cap by grid size (CtasPerSm): the 80-register instance where the grid is more
    // than the 128-register one holds at once. It changes no arithmetic, so a row's result is the
    // same under either instance. A wide grid always is (12+ CTAs an SM against 4), so its 4-warp
    // kernels that fit 80 registers come in that instance alone.
    if constexpr (WARPS == kWideGridWarps && kFitsThreeCtas<T, NT, MT>) {
        static_assert(tuning::kGemvQuantMmaWideGridMinCtasPerSm > CtasPerSm<T, NT, P, MT, Cap::kTwo, WARPS>::value,
                      "a wide grid must be more than the 128-register instance holds");
        launch_instance<T, NT, P, MT, Cap::kThree, WARPS>(a, ctas, dev, stream);
    } else {
        if constexpr (WARPS != kShortGridWarps && kFitsThreeCtas<T, NT, MT>) {
            if (ctas > CtasPerSm<T, NT, P, MT, Cap::kTwo, WARPS>::value * dev.sm_count)
                return launch_instance<T, NT, P, MT, Cap::kThree, WARPS>(a, ctas, dev, stream);
        }
        launch_instance<T, NT, P, MT, Cap::kTwo, WARPS>(a, ctas, dev, stream);
    }
}

// The instance for a.M rows: up to 32 on CTAs of WARPS (8, or 4 on wide grids), past 32 on CTAs
// of 8 (NT = 8 takes a warp per n8 tile to store).
template <QType T, Pairing P, int WARPS>
void launch_rows(const QMArgs& a, const DeviceFacts& dev, cudaStream_t stream) {
    if (a.M <= 8) return launch<T, 1, P, 1, WARPS>(a, dev, stream);
    if (a.M <= 16) {
        if constexpr (!kWideTile<T>) {
            const bool two_tiles = mma_ctas<P>(a.n_units, 2) >= tuning::kGemvQuantMmaTwoTileMinCtas &&
                                   a.K >= tuning::kGemvQuantMmaTwoTileMinK;
            if (two_tiles) return launch<T, 2, P, 2, WARPS>(a, dev, stream);
        }
        return launch<T, 2, P, 1, WARPS>(a, dev, stream);
    }
    if (a.M <= 32) return launch<T, 4, P, 1, WARPS>(a, dev, stream);
    launch<T, 8, P, 1, kWarps>(a, dev, stream);
}

// Whether a matrix runs on CTAs of 16 warps (kShortGridWarps) at 1-16 rows: a short grid of a 4-
// or 5-bit type, 16-row CTAs that fit 2 an SM (the 8B's wo and w2) while CTAs of two W tiles
// still fill the SMs (tuning::kGemvQuantMmaShortGridMinFillPct), on rows of a k tile a warp or
// more. 16 warps of two W tiles are as many warps an SM as 2 CTAs of one, and each x load feeds
// 32 W rows where it fed 16: at 16 rows the x loads' L1 wavefronts bind. The warps are the K
// split, which orders a row's sums, so the choice depends on the matrix and on no row count up to
// 16 (rows stay bit-identical across batches of 1-16). Past 16 rows such a grid takes 8 warps:
// one W tile at NT = 4 or 8 fits 1 CTA of 16 warps an SM, two waves of 256 CTAs (w2 at 32 and 64
// rows 1.21x and 1.25x slower), so its rows there agree with those up to 16 within rounding only,
// as the bf16 GEMV's and GEMM's do. The wide types spill at two W tiles.
template <QType T, Pairing P>
bool short_grid(const QMArgs& a, const DeviceFacts& dev) {
    const int sms = dev.sm_count;
    return !kWideTile<T> && a.M <= 16 && a.K >= kShortGridWarps * 256 && mma_ctas<P>(a.n_units, 1) <= 2 * sms &&
           100 * mma_ctas<P>(a.n_units, 2) >= tuning::kGemvQuantMmaShortGridMinFillPct * sms;
}

// Whether a matrix runs on CTAs of 4 warps (kWideGridWarps) at 1-32 rows: a grid of at least
// tuning::kGemvQuantMmaWideGridMinCtasPerSm 16-row CTAs an SM (the LM heads, the 8B's w13). Up to
// 32 rows the kernel is bound by instruction issue (docs/kernels/gemv.md), and a warp pays its
// row set-up, partial tiles and store once whatever k tiles it walks: 4 warps a CTA walk twice the
// k tiles each and pay those half as often, while twice the CTAs an SM keep the warps an SM. On a
// grid of fewer than two waves of them (6 an SM) the last, partly full wave of CTAs that each take
// twice as long costs more than that saves, and a grid of fewer CTAs than an SM holds loses half
// its warps. The warps are the K split, so the choice depends on the matrix and on no row count
// up to 32; past 32 rows 8 warps (NT = 8 needs a warp per n8 tile to store), so the rows there
// agree with those up to 32 within rounding only, as on short grids past 16.
template <QType T, Pairing P>
bool wide_grid(const QMArgs& a, const DeviceFacts& dev) {
    return a.M <= 32 && mma_ctas<P>(a.n_units, 1) >= tuning::kGemvQuantMmaWideGridMinCtasPerSm * dev.sm_count;
}

template <QType T, Pairing P>
void launch_matrix(const QMArgs& a, const DeviceFacts& dev, cudaStream_t stream) {
    if constexpr (!kWideTile<T>) {
        // two W tiles a CTA, one CTA an SM
        if (short_grid<T, P>(a, dev))
            return a.M <= 8 ? launch<T, 1, P, 2, kShortGridWarps>(a, dev, stream)
                            : launch<T, 2, P, 2, kShortGridWarps>(a, dev, stream);
    }
    if (wide_grid<T, P>(a, dev)) return launch_rows<T, P, kWideGridWarps>(a, dev, stream);
    launch_rows<T, P, kWarps>(a, dev, stream);
}

template <QType T>
struct LaunchType {  // qlayout::by_type's Fn
    static void run(const QMArgs& a, Pairing pairing, cudaStream_t stream) {
        const DeviceFacts dev = device_facts();
        switch (pairing) {
            case Pairing::None: return launch_matrix<T, Pairing::None>(a, dev, stream);
            case Pairing::SwiGLU: return launch_matrix<T, Pairing::SwiGLU>(a, dev, stream);
            case Pairing::Rope: return launch_matrix<T, Pairing::Rope>(a, dev, stream);
        }
    }
};

}  // namespace

void gemv_quant_mma(int type, const void* W, const bf16* x, int M, int N, int K, Epilogue ep,
                    const EpilogueArgs& args_in, cudaStream_t stream) {
    check_quant_weight("gemv_quant_mma", type, K, "K");
    BRRR_CHECK_ARG(M >= 1 && M <= kMaxRows, "gemv_quant_mma: M=" << M << " rows; the kernel takes 1 to " << kMaxRows
                                                                 << " (gemv_quant takes M = 1 faster; split more "
                                                                    "rows into calls of at most "
                                                                 << kMaxRows << ")");
    BRRR_CHECK_ARG(W != nullptr && x != nullptr, "gemv_quant_mma: W and x must be device pointers, got null");
    BRRR_CHECK_ARG(util::aligned_to(W, 16) && util::aligned_to(x, 16),
                   "gemv_quant_mma: W (qlayout tiles) and x (bf16 rows) must be 16-byte aligned");
    BRRR_CHECK_ARG((int64_t)M * K <= INT32_MAX, "gemv_quant_mma: x of M=" << M << " rows of K=" << K
                                                    << " values is past the kernel's 32-bit x offsets (2^31 - 1 "
                                                       "values); split the rows into several calls");
    EpilogueArgs args = args_in;
    const int width = util::check_matmul("gemv_quant_mma", x, reinterpret_cast<const bf16*>(W), M, N, K, ep, args,
                                         /*allow_rope=*/true);
    QMArgs a;
    a.W = static_cast<const uint8_t*>(W);
    a.tail = a.W + qlayout::tail_offset(type, N, K);
    a.x = x;
    a.row_stride = qlayout::row_stride(type, K);
    a.T = (int)qlayout::tiles_per_row(K);
    a.K = K;
    a.M = M;
    a.n_units = width;
    a.half_n = ep == Epilogue::RopeKV ? args.rope.head_dim / 2 : N / 2;
    a.ep = ep;
    a.out = args;
    const Pairing pairing = util::pairing_of(ep);
    qlayout::by_type<LaunchType>(type, a, pairing, stream);
}

}  // namespace cuda
}  // namespace brrr
