// gemm.cu — prefill matmuls on tensor cores: y[m, n] = sum_k x[m, k] * W[n, k], epilogue fused.
//
//   x [M, K] bf16 (row-major), W [N, K] bf16 ([out, in]), fp32 accumulation, any M, N, K.
//
// Two kernels behind gemm_bf16, chosen per call by the device:
//
// Hopper (sm_90a; gemm_sm90_kernel). wgmma.mma_async fed by TMA. A CTA of three warpgroups owns
// a 128 x BN tile (BN = 256, or 128 when wide tiles would leave more of the last wave idle):
// warpgroup 0 is the producer, one thread copying each 128 x 64 slice of x and BN x 64 slice of W
// with cp.async.bulk.tensor into a ring of 3-6 shared-memory stages (128-byte swizzle, mbarrier
// full/empty pairs); warpgroups 1 and 2 each multiply 64 rows by BN columns with m64nBNk16 wgmma
// straight from shared memory, keeping one k slice of MMAs in flight, and hand a slot back as
// soon as its MMAs retire. setmaxnreg moves registers from the producer (40) to the consumers
// (232). The grid is persistent: one CTA per SM walks the tiles in L2-friendly groups of 8 tile
// rows, and the producer fills the ring for the next tile while the consumers run the epilogue.
// Where even 128-column tiles would leave most SMs idle (M up to ~128 on the Llama projections),
// a work item is one K range of a tile (split-K): each split parks its partial sums in scratch
// the caller lends (EpilogueArgs::split) and the last split of a tile to finish adds them up in
// split order and runs the epilogue, so the result is the same whichever split ends last.
// TMA zero-fills boxes past M, N and K, so tails cost nothing but predicated stores. Needs
// K % 8 == 0 and 16-byte aligned x and W (TMA's stride and address rules).
//
// Everything else (sm_80/sm_89, or shapes TMA cannot describe): a 128 x 128 tile with 8 warps
// (2 x 4, 64 x 32 each) issuing mma.sync.m16n8k16. W row-major [N, K] is exactly the "col" B
// operand of mma, so neither operand is transposed. K advances 32 at a time through a 3-stage
// cp.async ring; rows are padded to 40 elements (80 bytes) so the eight 16-byte row reads of one
// ldmatrix land in eight different bank groups. Tails in M, N and K are zero-filled loads
// (cp.async with src-size 0) and predicated stores. K % 8 != 0 or x / W not 16-byte aligned:
// shared memory is filled with ordinary element loads instead of cp.async (correct, slower).
//
// SwiGLU: a tile's W rows are gate rows j0.. and the matching up rows H + j0.., so the gate and
// up value of one output sit in the same thread's registers and silu(gate) * up is formed there;
// the [M, 2H] intermediate never exists. mma.sync interleaves them in groups of 8 rows; the
// Hopper kernel loads them as two TMA boxes, gate column c landing BN / 2 accumulator columns
// before its up column.
//
// RopeKV (wqkv): on Hopper, tiles of whole heads put dim d and its rotation partner d + hd/2 in
// one thread's accumulators, so RoPE and the q / K / V stores run in the epilogue and the fp32
// q|k|v never reaches HBM (head_dim 64 and 128). Elsewhere q|k|v is staged in fp32 and
// rope_kv_append (rope.cu) finishes the job.
//
// AddResidual (wo, w2) on Hopper: each consumer warpgroup writes its accumulators box by box
// (64 rows x 32 fp32, 128-byte swizzle) into shared memory and one thread has TMA add the box into
// the residual (cp.reduce.async.bulk.tensor .add), then goes straight on to the next tile: the
// read-add-write runs in L2 under the next tile's MMAs. Loading the residual into registers first
// waited out eight memory round trips per tile; H100, Llama-3-8B wo at M = 2048 / 4096 / 8192:
// 0.86 / 0.85 / 0.85 of cuBLAS that way, 0.88 / 0.90 / 0.90 through TMA (w2 0.95 / 0.94 / 0.94 ->
// 0.96 / 0.95 / 1.02; LLAMA_BRRR_GEMM_RESIDUAL_TMA=0 runs the register epilogue). The mma.sync
// kernel loads a thread's residual values in batches of eight pairs before writing any back, so
// their round trips overlap. Asking L2 for a tile's residual rows ahead of its epilogue measured
// slower, from registers (benchmarks/results/h100-sxm/gemm_residual_prefetch.txt) and by TMA
// prefetch 4-16 k tiles ahead (0.84-0.87 of cuBLAS against 0.88 on the 8B wo at M = 2048), and
// so did a 3-slot ring with 4 staging boxes per warpgroup (0.84): gemm_epilogue_cost.txt, which
// also splits the 8B wo's gap at M = 2048: bf16 store 0.98 of cuBLAS, fp32 store 0.94, fp32
// residual add 0.88. Neither asking L2 for the residual of only each CTA's last tile (the wave
// nothing hides) nor exiting once TMA has read the boxes instead of once the adds have landed
// gained (gemm_residual_last.txt, gemm_exit_read.txt), and adding each thread's accumulators by
// red.global.add.v4 with no staging at all lost (0.84, gemm_residual_red.txt), and so did staging
// a whole tile at once in ring slots (0.85, gemm_ring_epilogue.txt). What pays: the producer asks
// L2 for the tile's residual box by box over the last quarter of its main loop, where tiles
// outnumber CTAs. A wave's epilogues all come at once, so their residual reads met HBM as one
// burst; the asks above were bursts too. 8B wo at M = 2048: 0.873 -> 0.897 of cuBLAS in one run
// (gemm_residual_spread.txt; LLAMA_BRRR_GEMM_RESIDUAL_SPREAD). A single wave (M = 512) still pays
// the round trip at its end, 0.78-0.80 of cuBLAS's bf16 matmul but 0.91 of cuBLAS doing the same
// add (kernels.json's same-job column); 256-column tiles with K split to fill that wave lost
// (gemm_wide_split.txt).
// StoreF32 / StoreBf16 on Hopper go the same way, through TMA stores of the staged boxes (64 bf16
// columns a box), instead of 4-byte pair stores from registers (LLAMA_BRRR_GEMM_STORE_TMA=0 runs
// those): H100, Llama-3-8B wqkv with the bf16 store at M = 2048 / 4096 / 8192: 0.85 / 0.87 / 0.88
// of cuBLAS from registers, 0.99 / 0.99 / 0.99 through TMA (gemm_store_tma.txt). RopeKV rotates a
// tile of q heads in registers and stores it the same way (q_out is a plain [M, q_dim] matrix);
// k / v tiles, whose rows land at each row's cache slot and position, keep the register stores.
//
// matmul_bf16 picks the GEMV (gemv.cu) for M <= kGemvMaxRows, gemm_bf16 above.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

// Largest M that goes to the GEMV: its limit. Measured on H100 (bench_kernels.py's switch
// section, kernels_switch.json, run BZ): up to M = 16 the GEMV (on tensor cores from 2 rows) is
// as fast as this kernel or faster on every decode projection of Llama-3.2-1B and Llama-3-8B, at
// M = 16 8B w13 81.8 against 86.4 us, 1B wqkv 8.0 against 11.2 (1B w13 ties, 27.8).
constexpr int kGemvMaxRows = 16;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3;
constexpr int kThreads = 256;
constexpr int kPitch = kBK + 8;                       // smem row stride in elements (80 bytes)
constexpr int kStageElems = (kBM + kBN) * kPitch;     // A tile then B tile
constexpr size_t kSmemBytes = (size_t)kStages * kStageElems * sizeof(uint16_t);
constexpr int kChunksPerRow = kBK / 8;                // 16-byte chunks per tile row
constexpr int kChunksPerThread = kBM * kChunksPerRow / kThreads;  // per operand per stage
static_assert(kBM == kBN, "one chunk mapping serves both operands");
static_assert(kBM * kChunksPerRow % kThreads == 0, "whole chunks per thread");

struct GemmArgs {
    const bf16* x;
    const bf16* W;
    int M, N, K;
    int width;   // output columns: N, or H = N / 2 for SwiGLU
    int half_n;  // H: first up row of w13 (SwiGLU only)
    bool pair_stores;  // two adjacent outputs may be written as one 4- or 8-byte store
    bool epilogue_tma;  // Hopper AddResidual / StoreF32 / StoreBf16: staged in shared memory, written by TMA
    int residual_spread;  // Hopper AddResidual by TMA: L2 asked for the residual box by box over the
                          // main loop's last 1 / residual_spread (0: not asked)
    bool rope_q_tma;    // Hopper RopeKV: q tiles rotated in registers, then stored like StoreBf16
    bool split_release;  // split-K: count a finished split with one acq_rel atomic (else fences + atomic)
    Epilogue ep;
    EpilogueArgs out;
};

// The W row feeding row i (0..kBN-1) of the CTA's B tile; -1 when past the end.
template <bool SWIGLU>
__device__ __forceinline__ int b_tile_source_row(const GemmArgs& p, int tile_col0, int i) {
    if (!SWIGLU) {
        const int n = tile_col0 + i;
        return n < p.N ? n : -1;
    }
    const int col = tile_col0 + 8 * (i / 16) + (i % 8);  // output column j
    if (col >= p.width) return -1;
    return (i % 16) < 8 ? col : p.half_n + col;
}

// Two adjacent results (row, col) and (row, col + 1) of a plain epilogue.
__device__ __forceinline__ void store_pair(const GemmArgs& p, int row, int col, float v0, float v1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        if (p.ep == Epilogue::StoreBf16) {
            *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) = util::pack_bf16x2(v0, v1);
        } else if (p.ep == Epilogue::StoreF32) {
            *reinterpret_cast<float2*>(p.out.out_f32 + idx) = make_float2(v0, v1);
        } else {
            float2* r = reinterpret_cast<float2*>(p.out.residual + idx);
            float2 acc = *r;
            acc.x += v0;
            acc.y += v1;
            *r = acc;
        }
        return;
    }
    util::store_result(p.ep, p.out, idx, v0);
    if (col + 1 < p.width) util::store_result(p.ep, p.out, idx + 1, v1);
}

__device__ __forceinline__ void store_swiglu_pair(const GemmArgs& p, int row, int col, float g0,
                                                  float u0, float g1, float u1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) =
            util::pack_bf16x2(util::silu(g0) * u0, util::silu(g1) * u1);
        return;
    }
    util::store_swiglu(p.out, idx, g0, u0);
    if (col + 1 < p.width) util::store_swiglu(p.out, idx + 1, g1, u1);
}

// AddResidual for G column pairs of one row, (col + 8 j, col + 8 j + 1) for j < G: the layout of
// an mma accumulator row. Every residual value is loaded before any is written back, because the
// compiler may not move a load past a store to the same array: added pair by pair, each pair
// waited out a full memory round trip (the 1B wo GEMM ran at half of cuBLAS's speed that way).
template <int G>
__device__ __forceinline__ void add_residual_pairs(const GemmArgs& p, int row, int col, const float2 (&y)[G]) {
    if (row >= p.M) return;
    if (!p.pair_stores) {
#pragma unroll
        for (int j = 0; j < G; ++j) store_pair(p, row, col + 8 * j, y[j].x, y[j].y);
        return;
    }
    float* base = p.out.residual + (size_t)row * p.out.ld_out + col;
    float2 r[G];
#pragma unroll
    for (int j = 0; j < G; ++j)
        r[j] = col + 8 * j + 1 < p.width ? *reinterpret_cast<const float2*>(base + 8 * j) : make_float2(0.f, 0.f);
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int c = col + 8 * j;
        if (c + 1 < p.width) {
            *reinterpret_cast<float2*>(base + 8 * j) = make_float2(r[j].x + y[j].x, r[j].y + y[j].y);
        } else if (c < p.width) {
            base[8 * j] += y[j].x;
        }
    }
}

template <bool SWIGLU, bool VEC>
__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmArgs p) {
    uint16_t* smem = ptx::dynamic_smem<uint16_t>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 2, warp_n = warp & 3;  // 2 x 4 warps of 64 x 32
    const int m0 = blockIdx.y * kBM;
    const int tile_col0 = blockIdx.x * (SWIGLU ? kBN / 2 : kBN);  // first output column

    // This thread's 16-byte chunks of each tile: same (row, k offset) at every K step.
    const uint16_t* xbits = reinterpret_cast<const uint16_t*>(p.x);
    const uint16_t* wbits = reinterpret_cast<const uint16_t*>(p.W);
    const uint16_t* a_src[kChunksPerThread];
    const uint16_t* b_src[kChunksPerThread];
    bool a_ok[kChunksPerThread], b_ok[kChunksPerThread];
    int chunk_off[kChunksPerThread], chunk_k[kChunksPerThread];
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = tid + i * kThreads;
        const int row = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
        chunk_off[i] = row * kPitch + kc;
        chunk_k[i] = kc;
        a_ok[i] = m0 + row < p.M;
        a_src[i] = xbits + (size_t)(a_ok[i] ? m0 + row : 0) * p.K + kc;
        const int wrow = b_tile_source_row<SWIGLU>(p, tile_col0, row);
        b_ok[i] = wrow >= 0;
        b_src[i] = wbits + (size_t)(b_ok[i] ? wrow : 0) * p.K + kc;
    }

    auto load_stage = [&](int stage, int k0) {
        uint16_t* As = smem + stage * kStageElems;
        uint16_t* Bs = As + kBM * kPitch;
#pragma unroll
        for (int i = 0; i < kChunksPerThread; ++i) {
            const int k = k0 + chunk_k[i];
            if (VEC) {
                // K % 8 == 0 here, so a chunk is either entirely inside K or entirely past it.
                const bool a_in = a_ok[i] && k < p.K, b_in = b_ok[i] && k < p.K;
                ptx::cp_async_16(As + chunk_off[i], a_in ? a_src[i] + k0 : xbits, a_in);
                ptx::cp_async_16(Bs + chunk_off[i], b_in ? b_src[i] + k0 : wbits, b_in);
            } else {
                uint32_t a_words[4], b_words[4];
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const bool in0 = k + e < p.K, in1 = k + e + 1 < p.K;
                    const uint32_t a0 = a_ok[i] && in0 ? a_src[i][k0 + e] : 0u;
                    const uint32_t a1 = a_ok[i] && in1 ? a_src[i][k0 + e + 1] : 0u;
                    const uint32_t b0 = b_ok[i] && in0 ? b_src[i][k0 + e] : 0u;
                    const uint32_t b1 = b_ok[i] && in1 ? b_src[i][k0 + e + 1] : 0u;
                    a_words[e / 2] = a0 | (a1 << 16);
                    b_words[e / 2] = b0 | (b1 << 16);
                }
                *reinterpret_cast<uint4*>(As + chunk_off[i]) =
                    make_uint4(a_words[0], a_words[1], a_words[2], a_words[3]);
                *reinterpret_cast<uint4*>(Bs + chunk_off[i]) =
                    make_uint4(b_words[0], b_words[1], b_words[2], b_words[3]);
            }
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    const int k_tiles = CEIL_DIV(p.K, kBK);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < k_tiles) load_stage(s, s * kBK);
        ptx::cp_async_commit();  // empty groups keep the wait arithmetic uniform
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
        ptx::cp_async_wait<kStages - 2>();  // this thread's part of tile kt has landed
        __syncthreads();                     // everyone's part has; stage (kt - 1) is free
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_stage(next % kStages, next * kBK);
        ptx::cp_async_commit();

        const uint16_t* As = smem + (kt % kStages) * kStageElems;
        const uint16_t* Bs = As + kBM * kPitch;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const int row = warp_m * 64 + mi * 16 + (lane & 15);
                ptx::ldmatrix_x4(a[mi], As + row * kPitch + kk + (lane >> 4) * 8);
            }
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
                const int row = warp_n * 32 + nj * 16 + (lane >> 4) * 8 + (lane & 7);
                uint32_t r[4];
                ptx::ldmatrix_x4(r, Bs + row * kPitch + kk + ((lane >> 3) & 1) * 8);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) ptx::mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
        }
    }
    ptx::cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + warp_m * 64 + mi * 16 + g + 8 * h;
            if (SWIGLU) {
#pragma unroll
                for (int pr = 0; pr < 2; ++pr) {
                    const int col = tile_col0 + warp_n * 16 + pr * 8 + 2 * t;
                    const float* gate = acc[mi][2 * pr] + 2 * h;
                    const float* up = acc[mi][2 * pr + 1] + 2 * h;
                    store_swiglu_pair(p, row, col, gate[0], up[0], gate[1], up[1]);
                }
            } else if (p.ep == Epilogue::AddResidual) {
                float2 y[4];
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) y[ni] = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                add_residual_pairs(p, row, tile_col0 + warp_n * 32 + 2 * t, y);
            } else {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const int col = tile_col0 + warp_n * 32 + ni * 8 + 2 * t;
                    store_pair(p, row, col, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
            }
        }
    }
}

template <bool SWIGLU, bool VEC>
void launch_mma_sync_kernel(const GemmArgs& p, cudaStream_t stream) {
    auto kernel = gemm_kernel<SWIGLU, VEC>;
    // Over the 48 KB default: opt in (per device and cheap, so simply on every launch).
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
    const dim3 grid(CEIL_DIV(p.width, SWIGLU ? kBN / 2 : kBN), CEIL_DIV(p.M, kBM));
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("gemm_kernel");
}

// The sm_80 path, and every shape or pointer TMA cannot describe.
void launch_mma_sync(const GemmArgs& p, cudaStream_t stream) {
    BRRR_CHECK(CEIL_DIV(p.M, kBM) <= 65535, "gemm_bf16: M=" << p.M << " rows exceed the grid limit of "
                                                              << 65535 * kBM);
    const bool vec = p.K % 8 == 0 && util::aligned_to(p.x, 16) && util::aligned_to(p.W, 16);
    const bool swiglu = p.ep == Epilogue::SwiGLU;
    if (swiglu) {
        if (vec) launch_mma_sync_kernel<true, true>(p, stream);
        else launch_mma_sync_kernel<true, false>(p, stream);
    } else {
        if (vec) launch_mma_sync_kernel<false, true>(p, stream);
        else launch_mma_sync_kernel<false, false>(p, stream);
    }
}

// ---- Hopper: wgmma fed by TMA, warp-specialized, persistent ----------------------------------
namespace sm90 {

constexpr int kBM = 128, kBK = 64;   // kBK * 2 bytes = one 128-byte swizzle row
constexpr int kConsumers = 2;        // warpgroups, 64 tile rows each
constexpr int kThreads = 128 * (1 + kConsumers);

// RopeKV for one row of a tile whose first head is head0: y[4 i + e] is column 8 i + 2 t + e of
// the tile (the wgmma accumulator layout, already offset to the row's half). The angles of the
// thread's dims are the same for every head of the row, so they are computed once per dim.
template <int BN, int HD>
__device__ __forceinline__ void store_rope_row(const GemmArgs& p, int row, int head0, int t, const float* y) {
    const RopeKVArgs& r = p.out.rope;
    if (row >= p.M) return;
    const int pos = r.positions[row], slot = r.slots[row];
    const int heads = r.n_heads + 2 * r.n_kv_heads;
    // v heads come after every q and k head: a tile that starts with a v head rotates nothing.
    const bool rotates = util::rope_rotates(r, head0);
#pragma unroll
    for (int g = 0; g < HD / 16; ++g) {  // the 8-column groups of a head's first half
        const int d = 8 * g + 2 * t;
        util::RopeAngle a[2] = {{0.f, 0.f}, {0.f, 0.f}};
        if (rotates) {
            a[0] = util::rope_angle(r, pos, d);
            a[1] = util::rope_angle(r, pos, d + 1);
        }
#pragma unroll
        for (int hh = 0; hh < BN / HD; ++hh) {
            const int head = head0 + hh;
            if (head >= heads) break;
            const int lo = 4 * (hh * (HD / 8) + g), hi = lo + 4 * (HD / 16);
            const float x0[2] = {y[lo], y[lo + 1]}, x1[2] = {y[hi], y[hi + 1]};
            util::store_rope_kv_dims<2>(r, row, pos, slot, head, d, x0, x1, a);
        }
    }
}

// RopeKV for a tile of q heads, in place: the thread's two rows (first_row, first_row + 8; acc
// as in store_rope_row) rotated as store_rope_kv_dims rotates them (the same rope_pos_ok and
// rope_rotate: NaN where the cache cannot hold the row's position), so that epilogue_tma can
// store the tile like StoreBf16.
template <int BN, int HD>
__device__ __forceinline__ void rope_q_in_place(const GemmArgs& p, int first_row, int t, float (&acc)[BN / 2]) {
    const RopeKVArgs& r = p.out.rope;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = first_row + 8 * h;
        if (row >= p.M) continue;  // clipped by the store
        const int pos = r.positions[row], slot = r.slots[row];
        const bool pos_ok = util::rope_pos_ok(r, pos, slot);
        float* y = acc + 2 * h;
#pragma unroll
        for (int g = 0; g < HD / 16; ++g) {
            const int d = 8 * g + 2 * t;
            const util::RopeAngle a[2] = {util::rope_angle(r, pos, d), util::rope_angle(r, pos, d + 1)};
#pragma unroll
            for (int hh = 0; hh < BN / HD; ++hh) {
                const int lo = 4 * (hh * (HD / 8) + g), hi = lo + 4 * (HD / 16);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    util::rope_rotate(y[lo + e], y[hi + e], a[e], pos_ok, y[lo + e], y[hi + e]);
                }
            }
        }
    }
}

// Shared memory: the ring's STAGES slots, then (RES: instances whose epilogue may run through TMA:
// AddResidual, StoreF32, StoreBf16, RopeKV's q tiles) the staging boxes of epilogue_tma (kResBufs per consumer
// warpgroup, 64 rows x 128 bytes each: two where they fit, so one box fills while TMA reads the
// other), then the full / empty barriers.
template <int BN, int STAGES, bool RES>
struct Layout {
    static constexpr int kABytes = kBM * kBK * 2;
    static constexpr int kBBytes = BN * kBK * 2;
    static constexpr int kStageBytes = kABytes + kBBytes;
    static constexpr int kResBoxBytes = 64 * 32 * 4;
    static constexpr size_t kBarrierBytes = 2 * STAGES * sizeof(uint64_t);
    // + 1024: the dynamic window is only 16-byte aligned and the swizzle atoms need 1024.
    static constexpr size_t kFixedBytes = 1024 + (size_t)STAGES * kStageBytes + kBarrierBytes;
    static constexpr int kResBufs = !RES ? 0 : kFixedBytes + 2 * kConsumers * kResBoxBytes <= 227 * 1024 ? 2 : 1;
    static constexpr size_t kResOffset = (size_t)STAGES * kStageBytes;
    static constexpr size_t kBarrierOffset = kResOffset + (size_t)kResBufs * kConsumers * kResBoxBytes;
    static constexpr size_t kSmemBytes = 1024 + kBarrierOffset + kBarrierBytes;
    static_assert(kSmemBytes <= 227 * 1024, "stages do not fit in shared memory");
};

// The TMA epilogue: consumer warpgroup `consumer` (thread ct of 128, warp `warp`) writes its
// 64 x BN accumulators box by box into shared memory in the 128-byte swizzle (32 fp32 columns a
// box, or BF16: 64 bf16 columns), and one thread has TMA add each box into the residual (`add`:
// AddResidual) or store it (StoreF32 / StoreBf16); parts past M or the width are clipped. The
// warpgroup goes on as soon as a box is issued, so the writes run while the next tile's MMAs do.
// AddResidual: loading the residual into registers waited out several memory round trips per
// tile; one tile touches each residual element once, so the sum is the plain fp32 add of the
// register epilogue. The stores: the register epilogue writes 4-byte pairs, 16 bytes per row and
// warp instruction, which the consumers issue before their next tile's first MMA.
// `boxes` counts the warpgroup's boxes over all its tiles: box n goes to staging box n % kResBufs,
// so the one bulk group that may still be pending when box n is written is box n - 1's, in the
// other staging box. (Counting from 0 again at each tile, as until 2026-11-25, broke this after a
// tile with an odd box count, an N tail: its last box and the next tile's first shared a staging
// box that TMA could still be reading. On H100, M = 2000, N = 4104, K = 64 / 136 added wrong values
// in the tail boxes, tests/test_cuda_kernels.py's short-K test; longer tiles left TMA time enough.)
template <int BN, int STAGES, bool BF16>
__device__ __forceinline__ void epilogue_tma(const CUtensorMap* map, unsigned char* box_smem, int consumer, int ct,
                                             int warp, int lane, int row0, int col0, int width, bool add,
                                             int& boxes, const float (&acc)[BN / 2]) {
    using L = Layout<BN, STAGES, true>;
    constexpr int kBoxCols = BF16 ? 64 : 32;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / kBoxCols; ++j) {
        if (col0 + kBoxCols * j >= width) break;  // the same for the whole warpgroup
        unsigned char* box = box_smem + (consumer * L::kResBufs + boxes % L::kResBufs) * L::kResBoxBytes;
        ++boxes;
        if (ct == 0) hopper::bulk_wait_read<L::kResBufs - 1>();  // TMA is done reading this box
        hopper::named_barrier_sync(2 + consumer, 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + g + 8 * h;
            if constexpr (BF16) {
                // Accumulator group i = 8 j + ii holds columns 8 ii + 2 t, + 1 of the box: 16-byte
                // chunk ii of the row, swizzled; the 32 lanes hit 32 different banks.
#pragma unroll
                for (int ii = 0; ii < 8; ++ii) {
                    const int i = 8 * j + ii;
                    *reinterpret_cast<uint32_t*>(box + r * 128 + (ii ^ (r & 7)) * 16 + 4 * t) =
                        util::pack_bf16x2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
                }
            } else {
#pragma unroll
                for (int ii = 0; ii < 4; ++ii) {
                    const int i = 4 * j + ii;
                    const int chunk = (2 * ii + (t >> 1)) ^ (r & 7);
                    *reinterpret_cast<float2*>(box + r * 128 + chunk * 16 + 8 * (t & 1)) =
                        make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
                }
            }
        }
        hopper::fence_proxy_async_shared();
        hopper::named_barrier_sync(2 + consumer, 128);
        if (ct == 0) {
            if (add) hopper::tma_reduce_add_2d(map, box, col0 + kBoxCols * j, row0);
            else hopper::tma_store_2d(map, box, col0 + kBoxCols * j, row0);
            hopper::bulk_commit();
        }
    }
}

// Tile order: consecutive tiles walk down `group_m` tile rows before moving one tile column
// right, so the CTAs resident at one time share a band of x rows and a band of W rows in L2.
// With splits > 1 a work item is one K range (k_per_split k tiles) of a tile.
struct TileMap {
    int tiles_m, tiles_n, group_m;
    int splits, k_per_split;
};

// Split-K: the work item of split `split` of tile `tile` has its partial sums in registers. Each
// split stores them to its own slot of the scratch; the last split of the tile to arrive (a counter
// per tile, util::arrived_last) adds all slots in split order into acc and returns true: it runs
// the epilogue. The order is fixed, so the result does not depend on which split ends last. A slot
// holds the 256 consumer threads' accumulators, float4-interleaved (thread-fastest), so every
// access is coalesced and each thread reads back only what its twin wrote. A thread whose rows
// (first_row and first_row + 8) are all past M moves nothing: at M = 17 most of the tile.
template <int BN>
__device__ __forceinline__ bool merge_split_partials(const GemmArgs& p, int tile, int split, int splits,
                                                     int first_row, float (&acc)[BN / 2]) {
    const int ct = threadIdx.x - 128;  // consumer thread, 0..255
    const bool has_rows = first_row < p.M;
    constexpr int kSlotFloats = kBM * BN;
    float* slots = p.out.split.partials + (size_t)tile * splits * kSlotFloats;
    float4* mine = reinterpret_cast<float4*>(slots + (size_t)split * kSlotFloats);
    if (has_rows) {
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
            mine[i * 256 + ct] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    }
    const auto consumers_barrier = [] { hopper::named_barrier_sync(1, 256); };
    int* counter = reinterpret_cast<int*>(p.out.split.counters + tile);
    if (!util::arrived_last(counter, splits, ct == 0, p.split_release, consumers_barrier)) return false;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int s = 0; has_rows && s < splits; ++s) {
        const float4* slot = reinterpret_cast<const float4*>(slots + (size_t)s * kSlotFloats);
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
            const float4 v = __ldcg(slot + i * 256 + ct);  // L2: other SMs wrote it
            acc[4 * i] += v.x;
            acc[4 * i + 1] += v.y;
            acc[4 * i + 2] += v.z;
            acc[4 * i + 3] += v.w;
        }
    }
    return true;
}

// One CTA: warpgroup 0 is the producer (one thread issues the TMA copies of each k tile into a
// ring of STAGES slots), warpgroups 1 and 2 consume (each 64 rows x BN columns of wgmma). Slot s
// has two barriers: full[s] completes when its bytes have landed, empty[s] when every consumer
// warp that reads it is done. Both sides walk the same tiles (one work item per CTA, + the grid,
// ...), so the ring simply continues from one tile into the next and the producer runs ahead
// into the next tile while the consumers are in their epilogue.
//
// CLUSTER = 2: two CTAs of a cluster take vertically adjacent tiles with the same W columns;
// each CTA loads its own x box and one of the two W boxes, multicast into both CTAs, halving the
// W traffic out of L2. A slot is then free only when the consumers of both CTAs are done with it
// (empty[s] counts 2 x 8 warps, each consumer warp arrives locally and remotely), and neither CTA
// may exit while its peer can still arrive on its barriers (the final cluster_sync). Its remote
// arrivals once released at cluster scope, which compiled to a MEMBAR.ALL.GPU before each one in
// the consumers' k loop: 0.33-0.62 of the speed of CLUSTER = 1 on the Llama-3-8B projections (run
// AO). Released at CTA scope (hopper::mbarrier_arrive_cluster) it runs at 0.92-1.01 of it at
// M >= 512 (run AS, gemm_epilogue_cost.txt): no gain, so the engine launches single CTAs and only
// the GEMM lab's variants 09 / 10 run clusters.
//
// ROPE_HD > 0 (RopeKV, head_dim ROPE_HD): a tile holds whole heads (BN % hd == 0), and a thread
// holds the same two columns 2t, 2t + 1 of every 8-column accumulator group, so dim d of a head
// and its rotation partner d + hd/2 sit hd/16 groups apart in one thread's registers: RoPE and
// the q / KV-cache stores happen there, and the fp32 q|k|v never leaves the chip.
template <int BN, int STAGES, bool SWIGLU, int ROPE_HD, int CLUSTER>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap out_map, GemmArgs p, TileMap tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of 1 or 2 CTAs");
    static_assert(ROPE_HD == 0 || (!SWIGLU && ROPE_HD % 16 == 0 && BN % (ROPE_HD > 0 ? ROPE_HD : 1) == 0), "tiles of whole heads");
    using L = Layout<BN, STAGES, !SWIGLU>;
    // 64K registers per SM: producer 128 x 40 + consumers 256 x 232 = 64512.
    constexpr int kProducerRegs = 40, kConsumerRegs = 232;
    constexpr int kTileCols = SWIGLU ? BN / 2 : BN;  // output columns per tile
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* smem = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
    uint64_t* empty = full + STAGES;
    const int warpgroup = threadIdx.x / 128;
    const uint32_t rank = CLUSTER == 1 ? 0 : hopper::cluster_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            hopper::mbarrier_init(full + s, 1);
            hopper::mbarrier_init(empty + s, kConsumers * 4 * CLUSTER);
        }
        hopper::fence_barrier_init();
    }
    if (CLUSTER == 1) __syncthreads();
    else hopper::cluster_sync();  // the peer's barriers exist before anything reaches them

    const int k_tiles = CEIL_DIV(p.K, kBK);
    // A work item is CLUSTER vertically adjacent tiles (CTA `rank` of a cluster takes the
    // rank-th), or with split-K one K range of a tile (the split fastest).
    const int units_m = CEIL_DIV(tiles.tiles_m, CLUSTER);
    const int num_work = units_m * tiles.tiles_n * tiles.splits;
    const int first_work = blockIdx.x / CLUSTER, work_stride = gridDim.x / CLUSTER;
    auto k_range = [&](int work, int& k_begin, int& k_end) {
        k_begin = (work % tiles.splits) * tiles.k_per_split;
        k_end = min(k_tiles, k_begin + tiles.k_per_split);
    };
    auto tile_coords = [&](int work, int& tm, int& tn) {
        work /= tiles.splits;
        const int per_group = tiles.group_m * tiles.tiles_n;
        const int first_m = (work / per_group) * tiles.group_m;
        const int rows = min(tiles.group_m, units_m - first_m);
        const int in_group = work % per_group;
        tm = (first_m + in_group % rows) * CLUSTER + rank;
        tn = in_group / rows;
    };

    if (warpgroup == 0) {
        hopper::regs_decrease<kProducerRegs>();
        if (threadIdx.x == 0) {
            hopper::prefetch_tensor_map(&x_map);
            hopper::prefetch_tensor_map(&w_map);
            // AddResidual by TMA, one K range per tile: the tile's residual boxes are asked of L2
            // one at a time, spread over its main loop, so that a wave's epilogues (which all
            // come at once: equal tiles, one CTA per SM) find them there instead of reading HBM
            // in one burst.
            constexpr int kResidualBoxes = kConsumers * BN / 32;
            // Only where tiles outnumber CTAs: in a single wave nothing would come of it but the
            // prefetches' own traffic (the 8B wo / w2 at M = 512 lost 4-5%).
            const int spread = !SWIGLU && ROPE_HD == 0 && p.epilogue_tma && tiles.splits == 1 && num_work > work_stride
                                   ? p.residual_spread : 0;
            int stage = 0;
            uint32_t phase = 0;
            for (int work = first_work; work < num_work; work += work_stride) {
                int tm, tn, k_begin, k_end;
                tile_coords(work, tm, tn);
                k_range(work, k_begin, k_end);
                const int m0 = tm * kBM, col0 = tn * kTileCols;
                // The B tile is two boxes of BN / 2 W rows: the next BN rows, or for SwiGLU the gate
                // rows col0.. and the matching up rows H + col0.. (rows past N arrive as zeros).
                const int b_row0 = col0, b_row1 = SWIGLU ? p.half_n + col0 : col0 + BN / 2;
                // Residual box b goes out at k tile n - n / spread + b * n / (spread * kResidualBoxes)
                // of the tile's n.
                const int n = k_end - k_begin;
                int next_box = 0;
                for (int kt = k_begin; kt < k_end; ++kt) {
                    while (spread > 0 && next_box < kResidualBoxes &&
                           next_box * n <= ((kt - k_begin) * spread - n * (spread - 1)) * kResidualBoxes) {
                        const int row = m0 + 64 * (next_box / (BN / 32)), col = col0 + 32 * (next_box % (BN / 32));
                        if (row < p.M && col < p.width) hopper::tma_prefetch_2d(&out_map, col, row);
                        ++next_box;
                    }
                    hopper::mbarrier_wait(empty + stage, phase ^ 1);
                    unsigned char* a = smem + stage * L::kStageBytes;
                    unsigned char* b = a + L::kABytes;
                    hopper::mbarrier_arrive_expect_tx(full + stage, L::kStageBytes);
                    hopper::tma_load_2d(a, &x_map, kt * kBK, m0, full + stage);
                    if (CLUSTER == 1) {
                        hopper::tma_load_2d(b, &w_map, kt * kBK, b_row0, full + stage);
                        hopper::tma_load_2d(b + L::kBBytes / 2, &w_map, kt * kBK, b_row1, full + stage);
                    } else {
                        hopper::tma_load_2d_multicast(b + rank * (L::kBBytes / 2), &w_map, kt * kBK,
                                                      rank ? b_row1 : b_row0, full + stage, 0x3);
                    }
                    if (++stage == STAGES) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
    } else {
        hopper::regs_increase<kConsumerRegs>();
        const int consumer = warpgroup - 1;
        const int lane = threadIdx.x & 31, warp = (threadIdx.x / 32) & 3;
        auto release = [&](int slot) {
            if (lane != 0) return;
            hopper::mbarrier_arrive(empty + slot);
            if (CLUSTER == 2) hopper::mbarrier_arrive_cluster(empty + slot, rank ^ 1);
        };
        int stage = 0;
        uint32_t phase = 0;
        int staged_boxes = 0;  // epilogue_tma's boxes so far, over every tile of this warpgroup
        float acc[BN / 2];
        for (int work = first_work; work < num_work; work += work_stride) {
            int tm, tn, k_begin, k_end;
            tile_coords(work, tm, tn);
            k_range(work, k_begin, k_end);
            const int m0 = tm * kBM, col0 = tn * kTileCols;
            int prev_stage = 0;
            for (int kt = k_begin; kt < k_end; ++kt) {
                hopper::mbarrier_wait(full + stage, phase);
                const unsigned char* a = smem + stage * L::kStageBytes + consumer * 64 * (kBK * 2);
                const unsigned char* b = smem + stage * L::kStageBytes + L::kABytes;
                hopper::fence_accumulators(acc);
                hopper::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kBK / 16; ++kk) {
                    hopper::wgmma_bf16<BN>(acc, hopper::sw128_descriptor(a + 32 * kk),
                                           hopper::sw128_descriptor(b + 32 * kk), kt > k_begin || kk > 0);
                }
                hopper::wgmma_commit();
                hopper::fence_accumulators(acc);
                // The previous k tile's MMAs have finished reading: hand its slot back.
                hopper::wgmma_wait<1>();
                if (kt > k_begin) release(prev_stage);
                prev_stage = stage;
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
            hopper::wgmma_wait<0>();
            hopper::fence_accumulators(acc);
            release(prev_stage);
            if (tiles.splits > 1 &&
                !merge_split_partials<BN>(p, tm * tiles.tiles_n + tn, work % tiles.splits, tiles.splits,
                                          m0 + consumer * 64 + warp * 16 + (lane >> 2), acc))
                continue;  // another split of this tile finishes it

            const int row0 = m0 + consumer * 64, ct = threadIdx.x & 127;  // this warpgroup's rows
            if constexpr (ROPE_HD > 0) {
                // Tiles of q heads only through TMA (a tile that also holds k heads, as SmolLM2's
                // 576 q columns leave one, takes the register stores below).
                if (p.rope_q_tma && col0 + BN <= p.out.rope.n_heads * ROPE_HD) {
                    if (row0 >= p.M) continue;
                    rope_q_in_place<BN, ROPE_HD>(p, row0 + warp * 16 + (lane >> 2), lane & 3, acc);
                    epilogue_tma<BN, STAGES, true>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0,
                                                   col0, p.out.rope.n_heads * ROPE_HD, false, staged_boxes, acc);
                    continue;
                }
            }
            if (!SWIGLU && ROPE_HD == 0 && p.epilogue_tma) {
                if (row0 >= p.M) continue;
                if (p.ep == Epilogue::StoreBf16) {
                    epilogue_tma<BN, STAGES, true>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0, col0,
                                                   p.width, false, staged_boxes, acc);
                } else {
                    epilogue_tma<BN, STAGES, false>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0,
                                                    col0, p.width, p.ep == Epilogue::AddResidual, staged_boxes, acc);
                }
                continue;
            }
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + consumer * 64 + warp * 16 + g + 8 * h;
                if constexpr (SWIGLU) {
                    // Gate column c sits in accumulator group c / 8, its up column BN / 16 groups later.
#pragma unroll
                    for (int i = 0; i < BN / 16; ++i) {
                        const float* gate = acc + 4 * i + 2 * h;
                        const float* up = acc + 4 * (i + BN / 16) + 2 * h;
                        store_swiglu_pair(p, row, col0 + 8 * i + 2 * t, gate[0], up[0], gate[1], up[1]);
                    }
                } else if constexpr (ROPE_HD > 0) {
                    store_rope_row<BN, ROPE_HD>(p, row, col0 / ROPE_HD, t, acc + 2 * h);
                } else if (p.ep == Epilogue::AddResidual) {
                    // Eight groups per batch: all BN / 8 at once would spill at BN = 256.
#pragma unroll
                    for (int i0 = 0; i0 < BN / 8; i0 += 8) {
                        float2 y[8];
#pragma unroll
                        for (int j = 0; j < 8; ++j) y[j] = make_float2(acc[4 * (i0 + j) + 2 * h], acc[4 * (i0 + j) + 2 * h + 1]);
                        add_residual_pairs(p, row, col0 + 8 * i0 + 2 * t, y);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < BN / 8; ++i) {
                        store_pair(p, row, col0 + 8 * i + 2 * t, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
                    }
                }
            }
        }
        // The residual boxes' adds have landed and no TMA still reads this CTA's shared memory.
        if ((p.epilogue_tma || p.rope_q_tma) && (threadIdx.x & 127) == 0) hopper::bulk_wait_all();
    }
    if (CLUSTER == 2) hopper::cluster_sync();  // no remote arrival may target an exited CTA
#else
    __trap();  // built without sm_90a: the host never launches this (see hopper_device)
#endif
}

// [rows, K] bf16 row-major, boxes of box_rows x kBK (64) in the 128-byte swizzle.
CUtensorMap make_tensor_map(const bf16* base, int rows, int K, int box_rows) {
    static_assert(kBK == 64, "make_tensor_map_sw128 boxes are 64 columns wide");
    return hopper::make_tensor_map_sw128(base, rows, K, box_rows, "gemm_bf16");
}

using KernelFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, GemmArgs, TileMap);

// The instance for p's epilogue. RopeKV has instances for head_dim 64 and 128 where BN holds
// whole heads (the caller checks rope_fusable first).
template <int BN, int STAGES, int CLUSTER>
KernelFn pick_kernel(const GemmArgs& p) {
    if (p.ep == Epilogue::SwiGLU) return gemm_sm90_kernel<BN, STAGES, true, 0, CLUSTER>;
    if (p.ep != Epilogue::RopeKV) return gemm_sm90_kernel<BN, STAGES, false, 0, CLUSTER>;
    if constexpr (BN % 128 == 0) {
        if (p.out.rope.head_dim == 128) return gemm_sm90_kernel<BN, STAGES, false, 128, CLUSTER>;
    }
    if constexpr (BN % 64 == 0) {
        if (p.out.rope.head_dim == 64) return gemm_sm90_kernel<BN, STAGES, false, 64, CLUSTER>;
    }
    BRRR_CHECK(false, "gemm_bf16: no RopeKV instance for head_dim " << p.out.rope.head_dim << " with tiles of "
                                                                   << BN << " columns");
    return nullptr;
}

// A launch of `grid` CTAs in clusters of `cluster` along x; the config points at `attr`.
cudaLaunchConfig_t cluster_config(int grid, int cluster, size_t smem, cudaStream_t stream, cudaLaunchAttribute* attr) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cluster;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    return config;
}

// Clusters of `cluster` CTAs of `kernel` (smem bytes each) that the GPU holds at once. A cluster
// lives inside one GPC, so this can be less than sm_count / cluster (H100 SXM, one CTA per SM: 66
// pairs, but 30 clusters of four where 132 / 4 = 33), and a persistent grid sized past it would
// run its last clusters as a second wave behind the first ones' whole walk.
int resident_clusters(KernelFn kernel, int cluster, size_t smem) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(cluster, cluster, smem, nullptr, &attr);
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
    return std::max(1, n);
}

// One configuration: BN columns of W per tile, STAGES ring slots, CLUSTER CTAs sharing W
// tiles; at most `max_ctas` CTAs walk the tiles (0: one CTA per tile), and with CLUSTER > 1 no
// more clusters than fit at once; K split `splits` ways (p.out.split must then hold splits slots
// per tile and a counter per tile).
template <int BN, int STAGES, int CLUSTER = 1>
void launch(const GemmArgs& p, int max_ctas, int group_m, cudaStream_t stream, int splits = 1) {
    const bool swiglu = p.ep == Epilogue::SwiGLU;
    const CUtensorMap x_map = make_tensor_map(p.x, p.M, p.K, kBM);
    const CUtensorMap w_map = make_tensor_map(p.W, p.N, p.K, BN / 2);
    // The destination's map for epilogue_tma (boxes of 64 rows); other epilogues never touch it.
    CUtensorMap out_map = x_map;
    if (p.rope_q_tma) {
        const int q_dim = p.out.rope.n_heads * p.out.rope.head_dim;
        out_map = hopper::make_tensor_map_2d_sw128(p.out.rope.q_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.M, q_dim,
                                                   q_dim, 64, "gemm_bf16");
    } else if (p.epilogue_tma && p.ep == Epilogue::StoreBf16) {
        out_map = hopper::make_tensor_map_2d_sw128(p.out.out_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.M, p.width,
                                                   p.out.ld_out, 64, "gemm_bf16");
    } else if (p.epilogue_tma) {
        float* dst = p.ep == Epilogue::AddResidual ? p.out.residual : p.out.out_f32;
        out_map = hopper::make_tensor_map_f32_sw128(dst, p.M, p.width, p.out.ld_out, 64, "gemm_bf16");
    }
    const int k_tiles = CEIL_DIV(p.K, kBK);
    const int k_per_split = CEIL_DIV(k_tiles, splits);
    TileMap tiles{CEIL_DIV(p.M, kBM), CEIL_DIV(p.width, swiglu ? BN / 2 : BN), std::max(1, group_m / CLUSTER),
                  CEIL_DIV(k_tiles, k_per_split), k_per_split};  // no split left without k tiles
    BRRR_CHECK(tiles.splits == 1 || (CLUSTER == 1 && (size_t)tiles.tiles_m * tiles.tiles_n * tiles.splits * kBM * BN <=
                                                           p.out.split.floats &&
                                     tiles.tiles_m * tiles.tiles_n <= p.out.split.n_counters),
               "gemm_bf16: split-K scratch too small for " << tiles.splits << " splits");
    const bool res = p.ep != Epilogue::SwiGLU;  // as pick_kernel's instances
    const size_t smem = res ? Layout<BN, STAGES, true>::kSmemBytes : Layout<BN, STAGES, false>::kSmemBytes;
    const KernelFn kernel = pick_kernel<BN, STAGES, CLUSTER>(p);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (CLUSTER > 1 && max_ctas > 0)
        max_ctas = std::min(max_ctas, CLUSTER * resident_clusters(kernel, CLUSTER, smem));
    const int num_work = CEIL_DIV(tiles.tiles_m, CLUSTER) * tiles.tiles_n * tiles.splits;
    const int grid = CLUSTER * (max_ctas > 0 ? std::min(num_work, std::max(1, max_ctas / CLUSTER)) : num_work);
    if (CLUSTER == 1) {
        kernel<<<grid, kThreads, smem, stream>>>(x_map, w_map, out_map, p, tiles);
    } else {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t config = cluster_config(grid, CLUSTER, smem, stream, &attr);
        CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, x_map, w_map, out_map, p, tiles));
    }
    CUDA_CHECK_LAUNCH("gemm_sm90_kernel");
}

}  // namespace sm90

// A Hopper device, and this build holds sm_90 code for the kernel (LLAMA_BRRR_CUDA_ARCHS has 90a).
bool hopper_device(int* sm_count) {
    *sm_count = device_facts().sm_count;
    return runs_sm90a(sm90::gemm_sm90_kernel<256, 4, false, 0, 1>);
}

// TMA needs 16-byte aligned bases and row strides (K % 8 == 0).
bool tma_compatible(const GemmArgs& p) {
    return p.K % 8 == 0 && util::aligned_to(p.x, 16) && util::aligned_to(p.W, 16);
}

// The fused RopeKV epilogue: head_dim 64 or 128 (tiles of whole heads), and destinations that
// take 4-byte bf16 pairs. Anything else stages q|k|v in fp32 and runs rope_kv_append.
bool rope_fusable(const GemmArgs& p) {
    const RopeKVArgs& r = p.out.rope;
    return (r.head_dim == 64 || r.head_dim == 128) && util::aligned_to(r.q_out, 4) &&
           util::aligned_to(r.k_cache, 4) && util::aligned_to(r.v_cache, 4);
}

// Tile width by a wave model: time ~ waves x tile width (a tile's work grows with its width,
// and a partly filled last wave costs a full one). The cheapest of 256 / 192 / 128 columns wins,
// the wider on a tie (fewer re-reads of x). In the lab (benchmarks/lab, H100) this picks the best
// of variants 05 / 11 / 04 on most Llama-3-8B shapes at M = 512 .. 8192. RopeKV leaves out 192,
// which does not hold whole heads of 128.
//
// Split-K: when even 128-column tiles leave more than half of the SMs idle (M <= 128 or so on the
// Llama projections: short prompts, the last chunk of a long one, batches of 17-64 sequences),
// K is split, at most as far as one wave of work items. Then one SM's bytes bound the time: a
// split streams its k tiles (32 KB of x and W each) and writes its partials, and the last one
// also reads every split's partials back (128 x 4 bytes a tile row, rows past M skipped by
// whole 8-row groups). The split count with the fewest such bytes wins: 4 for the 1B wo at
// M = 128 (K = 2048), 8 for its w2 (K = 8192).
int split_count(const GemmArgs& p, int sm_count) {
    const SplitKScratch& sc = p.out.split;
    if (sc.partials == nullptr || sc.counters == nullptr) return 1;
    const int out_per_col = p.ep == Epilogue::SwiGLU ? 2 : 1;
    const long long tiles = (long long)CEIL_DIV(p.M, sm90::kBM) * CEIL_DIV(p.width, 128 / out_per_col);
    const int k_tiles = CEIL_DIV(p.K, sm90::kBK);
    if (2 * tiles > sm_count || tiles > sc.n_counters) return 1;
    const long long rows = std::min(sm90::kBM, CEIL_DIV(p.M, 8) * 8);  // of the fullest tile
    auto bytes = [&](long long splits) {
        const long long partials = splits > 1 ? (splits + 1) * rows * 128 * 4 : 0;
        return CEIL_DIV(k_tiles, splits) * 32768LL + partials;
    };
    int best = 1;
    for (int splits = 2; splits <= k_tiles && tiles * splits <= sm_count; ++splits) {
        if ((size_t)(tiles * splits) * sm90::kBM * 128 > sc.floats) break;
        if (bytes(splits) < bytes(best)) best = splits;
    }
    return best;
}

// LLAMA_BRRR_GEMM_BN=128/192/256 overrides the wave model's tile width (for measuring;
// bench_kernels.py), read once; RopeKV never takes 192.
int forced_tile_width() {
    static const int bn = env_int("LLAMA_BRRR_GEMM_BN", 0);
    return bn == 128 || bn == 192 || bn == 256 ? bn : 0;
}

void launch_sm90_auto(const GemmArgs& p, int sm_count, cudaStream_t stream) {
    const int splits = split_count(p, sm_count);
    if (splits > 1) {
        sm90::launch<128, 6>(p, sm_count, 8, stream, splits);
        return;
    }
    const long long tiles_m = CEIL_DIV(p.M, sm90::kBM);
    const int out_per_col = p.ep == Epilogue::SwiGLU ? 2 : 1;  // a SwiGLU tile yields BN / 2 outputs
    auto cost = [&](int bn) {
        const long long tiles = tiles_m * CEIL_DIV(p.width, bn / out_per_col);
        return CEIL_DIV(tiles, (long long)sm_count) * bn;
    };
    const long long c256 = cost(256), c128 = cost(128);
    const long long c192 = p.ep == Epilogue::RopeKV ? c128 + 1 : cost(192);
    const int forced = forced_tile_width();
    // 256 also wins near-ties (within 5%): its tiles re-read x half as often. Where this changes
    // the pick (w13 at M >= 4096: 192 on 1B, 128 on 8B) H100 measured 256 at 0.94 / 0.92 of
    // cuBLAS on 1B against 0.92 / 0.88 for 192, and alike on 8B (0.96 / 0.94 against 0.93 / 1.01
    // for 128; 0.73-0.81 on another machine of the same session):
    // benchmarks/results/h100-sxm/gemm_tile_width.txt.
    const long long best_narrow = std::min(c192, c128);
    if (forced == 256 || (forced == 0 && 20 * c256 <= 21 * best_narrow)) {
        sm90::launch<256, 4>(p, sm_count, 8, stream);
    } else if (forced == 192 ? p.ep != Epilogue::RopeKV : forced == 0 && c192 <= c128) {
        sm90::launch<192, 5>(p, sm_count, 8, stream);
    } else {
        sm90::launch<128, 6>(p, sm_count, 8, stream);
    }
}

// LLAMA_BRRR_GEMM_RESIDUAL_TMA=0 runs the Hopper AddResidual epilogue from registers,
// LLAMA_BRRR_GEMM_STORE_TMA=0 the StoreF32 / StoreBf16 ones (for measuring), read once.
bool residual_tma_enabled() {
    static const bool on = env_flag("LLAMA_BRRR_GEMM_RESIDUAL_TMA", true);
    return on;
}
// LLAMA_BRRR_GEMM_RESIDUAL_SPREAD=F asks L2 for each tile's residual over the last 1 / F of its
// main loop (0: not asked), read once. H100, two alternations (gemm_residual_spread.txt, run CI):
// the 8B wo at M = 2048 / 4096 / 8192 0.873-0.874 / 0.887 / 0.898-0.901 of cuBLAS not asked,
// 0.896-0.898 / 0.899-0.903 / 0.906-0.910 at F = 4 (F = 2 about half that gain, F = 1 none); the
// 1B wo at M = 4096 / 8192 0.67-0.68 / 0.69 -> 0.74-0.75 / 0.77.
constexpr int kResidualSpread = 4;
int residual_spread() {
    static const int f = env_int("LLAMA_BRRR_GEMM_RESIDUAL_SPREAD", kResidualSpread);
    return f >= 1 && f <= 64 ? f : 0;
}

bool store_tma_enabled() {
    static const bool on = env_flag("LLAMA_BRRR_GEMM_STORE_TMA", true);
    return on;
}
// LLAMA_BRRR_GEMM_RELEASE=0 counts finished K splits with fences and a relaxed atomic (the form
// before 2026-11-25) instead of one acq_rel atomic, read once.
bool split_release_enabled() {
    static const bool on = env_flag("LLAMA_BRRR_GEMM_RELEASE", true);
    return on;
}

GemmArgs prepare_args(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args) {
    GemmArgs p;
    p.out = args;
    p.width = util::check_matmul("gemm_bf16", x, W, M, N, K, ep, p.out, /*allow_rope=*/true);
    if (ep == Epilogue::RopeKV) p.width = N;  // tiles cover all N columns; pairs form inside a tile
    p.x = x;
    p.W = W;
    p.M = M;
    p.N = N;
    p.K = K;
    p.half_n = N / 2;
    p.ep = ep;
    p.split_release = split_release_enabled();
    p.residual_spread = ep == Epilogue::AddResidual ? residual_spread() : 0;
    // Only the Hopper kernel reads the flag; the mma.sync kernel always stores from registers. TMA
    // needs 16-byte aligned bases and row strides.
    switch (ep) {
        case Epilogue::AddResidual:
            p.epilogue_tma = residual_tma_enabled() && p.out.ld_out % 4 == 0 && util::aligned_to(p.out.residual, 16);
            break;
        case Epilogue::StoreF32:
            p.epilogue_tma = store_tma_enabled() && p.out.ld_out % 4 == 0 && util::aligned_to(p.out.out_f32, 16);
            break;
        case Epilogue::StoreBf16:
            p.epilogue_tma = store_tma_enabled() && p.out.ld_out % 8 == 0 && util::aligned_to(p.out.out_bf16, 16);
            break;
        default: p.epilogue_tma = false;
    }
    // RopeKV's q tiles: q_out [M, n_heads x head_dim] is a plain bf16 matrix.
    const RopeKVArgs& r = p.out.rope;
    p.rope_q_tma = ep == Epilogue::RopeKV && store_tma_enabled() && util::aligned_to(r.q_out, 16) &&
                   (r.n_heads * r.head_dim) % 8 == 0;
    const bool even_ld = p.out.ld_out % 2 == 0;
    switch (ep) {
        case Epilogue::StoreBf16:
        case Epilogue::SwiGLU: p.pair_stores = even_ld && util::aligned_to(p.out.out_bf16, 4); break;
        case Epilogue::StoreF32: p.pair_stores = even_ld && util::aligned_to(p.out.out_f32, 8); break;
        case Epilogue::AddResidual: p.pair_stores = even_ld && util::aligned_to(p.out.residual, 8); break;
        case Epilogue::RopeKV: p.pair_stores = false; break;  // store_rope_row's own stores
    }
    return p;
}

}  // namespace

void gemm_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args,
               cudaStream_t stream) {
    const GemmArgs p = prepare_args(x, W, M, N, K, ep, args);
    if (M == 0) return;
    int sm_count = 0;
    const bool hopper = tma_compatible(p) && hopper_device(&sm_count);
    if (ep == Epilogue::RopeKV && !(hopper && rope_fusable(p))) {
        BRRR_CHECK(args.out_f32 != nullptr, "gemm_bf16: RopeKV here (no fused epilogue for head_dim "
                                                << args.rope.head_dim << " on this device) stages q|k|v in "
                                                << "args.out_f32 [M, N]; got null");
        EpilogueArgs staged;
        staged.out_f32 = args.out_f32;
        staged.split = args.split;
        gemm_bf16(x, W, M, N, K, Epilogue::StoreF32, staged, stream);
        rope_kv_append(args.out_f32, args.rope, M, stream);
        return;
    }
    if (hopper) {
        launch_sm90_auto(p, sm_count, stream);
    } else {
        launch_mma_sync(p, stream);
    }
}

// split_count keeps tiles x splits <= sm_count and tiles <= sm_count / 2.
size_t gemm_split_scratch_floats(int sm_count) { return (size_t)sm_count * sm90::kBM * 128; }
int gemm_split_scratch_counters(int sm_count) { return std::max(1, sm_count / 2); }

void matmul_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
                 const EpilogueArgs& args, cudaStream_t stream) {
    if (M <= kGemvMaxRows) {
        gemv_bf16(x, W, M, N, K, ep, args, stream);
    } else {
        gemm_bf16(x, W, M, N, K, ep, args, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
