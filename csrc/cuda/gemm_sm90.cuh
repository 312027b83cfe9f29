// gemm_sm90.cuh — the Hopper prefill GEMM: y[m, n] = sum_k x[m, k] * W[n, k] on wgmma fed by TMA,
// warp-specialized and persistent, epilogue fused (StoreBf16 / StoreF32 / AddResidual / SwiGLU /
// RopeKV). The kernel template and its launch helpers; gemm_sm90.cu picks the configuration, and
// the GEMM lab (benchmarks/lab/cuda_gemm_lab.cu) includes this header to time other ones.
//
//   x [M, K] bf16, W [N, K] bf16, fp32 accumulation; K % 8 == 0, x and W 16-byte aligned (TMA).
//
// A CTA of three warpgroups owns a 128 x BN tile (BN 128 / 192 / 256). Warpgroup 0 is the
// producer: one thread copies each 128 x 64 slice of x and BN x 64 slice of W with
// cp.async.bulk.tensor into a ring of STAGES shared-memory slots (128-byte swizzle; mbarrier
// full / empty pair per slot). Warpgroups 1 and 2 each multiply 64 rows by BN columns with
// m64nBNk16 wgmma straight from shared memory, keep one k slice of MMAs in flight and hand a slot
// back as soon as its MMAs retire. setmaxnreg moves registers from the producer to the consumers.
// The grid is persistent (at most one CTA per SM walks the tiles in L2-friendly groups of tile
// rows), so the producer fills the ring for the next tile while the consumers run the epilogue.
// Split-K (TileMap::splits > 1): a work item is one K range of a tile; each split parks its
// partials in caller-lent scratch and the last to arrive adds them in split order, so the result
// does not depend on which split ends last. TMA zero-fills boxes past M, N and K.
// Epilogues: AddResidual / StoreF32 / StoreBf16 stage accumulators box by box in shared memory
// and TMA reduce-adds or stores them, running under the next tile's MMAs; the producer asks L2
// for a tile's residual over the end of its main loop. SwiGLU loads gate and up rows as two TMA
// boxes, so each thread holds both. RopeKV tiles hold whole heads: d and d + hd/2 sit in one
// thread, RoPE and the cache stores happen in registers (q tiles leave through TMA stores).
// QUANT instances (gemm_quant, 128-column tiles): W is quantized (GemmArgs::qb); a slot carries
// each W row's raw bytes of the k tile instead of its bf16 tile, copied by all producer threads,
// and the consumers decode it into a bf16 W tile before their wgmma (gemm_sm90_dequant.cuh).
// They come in two heights, MB = 1 or 2 blocks of 64 rows a consumer (128- or 256-row tiles of
// x): the decode is paid once per W tile, so the taller tile halves it per MMA, for 128 more
// accumulators a consumer thread and 16 KB more of x a slot.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_sm90_dequant.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {
namespace sm90 {

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
// as in store_rope_row) rotated as store_rope_kv_dims rotates them (the same rope_cache_row and
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
        const bool pos_ok = util::rope_cache_row(r, pos, slot) >= 0;
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
// other), then the full / empty barriers. QUANT (gemm_sm90_dequant.cuh): a slot holds the x tile
// and the raw bytes of BN W rows (kRawRowBytes each), and the bf16 W tiles the consumers decode
// into (kDeqTiles, used in turn) come after the slots.
template <int BN, int STAGES, bool RES, bool QUANT, int MB = 1>
struct Layout {
    static constexpr int kABytes = MB * kBM * kBK * 2;
    static constexpr int kBBytes = BN * kBK * 2;
    static constexpr int kRawBytes = BN * kRawRowBytes;
    static constexpr int kStageBytes = kABytes + (QUANT ? kRawBytes : kBBytes);
    static_assert(kStageBytes % 1024 == 0, "every slot's tiles start on a swizzle atom");
    // Three: the tile a consumer decodes k tile kt into was last read by the wgmma of kt - 3, which
    // the slower warpgroup has waited out before the named barrier of kt - 1 (with two, the other
    // warpgroup's wgmma of kt - 2 could still be reading it).
    static constexpr int kDeqTiles = QUANT ? 3 : 0;
    static constexpr int kResBoxBytes = 64 * 32 * 4;
    static constexpr size_t kBarrierBytes = 2 * STAGES * sizeof(uint64_t);
    // + 1024: the dynamic window is only 16-byte aligned and the swizzle atoms need 1024.
    static constexpr size_t kFixedBytes =
        1024 + (size_t)STAGES * kStageBytes + (size_t)kDeqTiles * kBBytes + kBarrierBytes;
    static constexpr int kResBufs = !RES ? 0 : kFixedBytes + 2 * kConsumers * kResBoxBytes <= 227 * 1024 ? 2 : 1;
    static constexpr size_t kDeqOffset = (size_t)STAGES * kStageBytes;
    static constexpr size_t kResOffset = kDeqOffset + (size_t)kDeqTiles * kBBytes;
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
// other staging box. The count must not restart per tile: after a tile with an odd box count (an
// N tail) the next tile's first box would reuse a staging box TMA may still be reading
// (tests/test_cuda_kernels.py's short-K test catches it).
template <int BN, int STAGES, bool QUANT, int MB, bool BF16>
__device__ __forceinline__ void epilogue_tma(const CUtensorMap* map, unsigned char* box_smem, int consumer, int ct,
                                             int warp, int lane, int row0, int col0, int width, bool add,
                                             int& boxes, const float (&acc)[BN / 2]) {
    using L = Layout<BN, STAGES, true, QUANT, MB>;
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

    __device__ __forceinline__ void k_range(int work, int k_tiles, int& k_begin, int& k_end) const {
        k_begin = (work % splits) * k_per_split;
        k_end = min(k_tiles, k_begin + k_per_split);
    }
    __device__ __forceinline__ void coords(int work, int& tm, int& tn) const {
        work /= splits;
        const int per_group = group_m * tiles_n;
        const int first_m = (work / per_group) * group_m;
        const int rows = min(group_m, tiles_m - first_m);
        const int in_group = work % per_group;
        tm = first_m + in_group % rows;
        tn = in_group / rows;
    }
};

// Split-K: the work item of split `split` of tile `tile` has its partial sums in registers. Each
// split stores them to its own slot of the scratch; the last split of the tile to arrive (a counter
// per tile, util::arrived_last) adds all slots in split order into acc and returns true: it runs
// the epilogue. The order is fixed, so the result does not depend on which split ends last. A slot
// holds the 256 consumer threads' accumulators (MB blocks of 64 rows each), float4-interleaved
// (thread-fastest), so every access is coalesced and each thread reads back only what its twin
// wrote. A thread whose rows in a block (first_row + 64 mb, + 8) are all past M moves nothing for
// that block: at M = 17 most of the tile.
template <int BN, int MB>
__device__ __forceinline__ bool merge_split_partials(const GemmArgs& p, int tile, int split, int splits,
                                                     int first_row, float (&acc)[MB][BN / 2]) {
    const int ct = threadIdx.x - 128;  // consumer thread, 0..255
    constexpr int kSlotFloats = MB * kBM * BN;
    float* slots = p.out.split.partials + (size_t)tile * splits * kSlotFloats;
    float4* mine = reinterpret_cast<float4*>(slots + (size_t)split * kSlotFloats);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        if (first_row + 64 * mb >= p.M) continue;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
            mine[(mb * (BN / 8) + i) * 256 + ct] =
                make_float4(acc[mb][4 * i], acc[mb][4 * i + 1], acc[mb][4 * i + 2], acc[mb][4 * i + 3]);
    }
    const auto consumers_barrier = [] { hopper::named_barrier_sync(1, 256); };
    int* counter = reinterpret_cast<int*>(p.out.split.counters + tile);
    if (!util::arrived_last(counter, splits, ct == 0, /*release=*/true, consumers_barrier)) return false;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mb][i] = 0.f;
        for (int s = 0; first_row + 64 * mb < p.M && s < splits; ++s) {
            const float4* slot = reinterpret_cast<const float4*>(slots + (size_t)s * kSlotFloats);
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) {
                const float4 v = __ldcg(slot + (mb * (BN / 8) + i) * 256 + ct);  // L2: other SMs wrote it
                acc[mb][4 * i] += v.x;
                acc[mb][4 * i + 1] += v.y;
                acc[mb][4 * i + 2] += v.z;
                acc[mb][4 * i + 3] += v.w;
            }
        }
    }
    return true;
}

// The W rows of tile `tn`: tile row r is W row b_row0 + r of the first box (BN / 2 rows) or
// b_row1 + r - BN / 2 of the second (SwiGLU: the gate rows, then the matching up rows).
template <int BN, bool SWIGLU>
__device__ __forceinline__ int tile_w_row(const GemmArgs& p, int tn, int r) {
    const int col0 = tn * (SWIGLU ? BN / 2 : BN);
    const int b_row0 = col0, b_row1 = SWIGLU ? p.half_n + col0 : col0 + BN / 2;
    return r < BN / 2 ? b_row0 + r : b_row1 + r - BN / 2;
}

// The producer of a QUANT instance (gemm_sm90_dequant.cuh): thread tid of warpgroup 0 copies W
// row tid of every k tile, and thread 0 the x tile (MB x 128 rows) by TMA; the slot's full barrier
// expects the TMA's arrival and one per thread, made when the thread's copies land.
template <int BN, int STAGES, bool SWIGLU, int MB>
__device__ __forceinline__ void produce_quant(const GemmArgs& p, const TileMap& tiles, const CUtensorMap* x_map,
                                              unsigned char* smem, uint64_t* full, uint64_t* empty) {
    using L = Layout<BN, STAGES, !SWIGLU, true, MB>;
    const int tid = threadIdx.x;
    const int k_tiles = CEIL_DIV(p.K, kBK);
    const int num_work = tiles.tiles_m * tiles.tiles_n * tiles.splits;
    if (tid == 0) hopper::prefetch_tensor_map(x_map);
    int stage = 0;
    uint32_t phase = 0;
    for (int work = blockIdx.x; work < num_work; work += gridDim.x) {
        int tm, tn, k_begin, k_end;
        tiles.coords(work, tm, tn);
        tiles.k_range(work, k_tiles, k_begin, k_end);
        const int n = tile_w_row<BN, SWIGLU>(p, tn, tid);
        const WRow w = n < p.N ? locate(p.qb, p.K, n) : WRow{nullptr, nullptr, -1, 0};
        for (int kt = k_begin; kt < k_end; ++kt) {
            hopper::mbarrier_wait(empty + stage, phase ^ 1);
            unsigned char* a = smem + stage * L::kStageBytes;
            if (tid == 0) {
                hopper::mbarrier_arrive_expect_tx(full + stage, L::kABytes);
                hopper::tma_load_2d(a, x_map, kt * kBK, tm * MB * kBM, full + stage);
            }
            fetch_row(w, p.K, kt, a + L::kABytes + tid * kRawRowBytes);
            hopper::mbarrier_arrive_cp_async(full + stage);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
    ptx::cp_async_wait<0>();  // no copy may outlive the CTA
}

// One CTA: warpgroup 0 is the producer (one thread issues the TMA copies of each k tile into a
// ring of STAGES slots), warpgroups 1 and 2 consume (each 64 rows x BN columns of wgmma). Slot s
// has two barriers: full[s] completes when its bytes have landed, empty[s] when every consumer
// warp that reads it is done. Both sides walk the same tiles (one work item per CTA, + the grid,
// ...), so the ring simply continues from one tile into the next and the producer runs ahead
// into the next tile while the consumers are in their epilogue.
//
// ROPE_HD > 0 (RopeKV, head_dim ROPE_HD): a tile holds whole heads (BN % hd == 0), and a thread
// holds the same two columns 2t, 2t + 1 of every 8-column accumulator group, so dim d of a head
// and its rotation partner d + hd/2 sit hd/16 groups apart in one thread's registers: RoPE and
// the q / KV-cache stores happen there, and the fp32 q|k|v never leaves the chip.
template <int BN, int STAGES, bool SWIGLU, int ROPE_HD, bool QUANT, int MB = 1>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap out_map, GemmArgs p, TileMap tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(ROPE_HD == 0 || (!SWIGLU && ROPE_HD % 16 == 0 && BN % (ROPE_HD > 0 ? ROPE_HD : 1) == 0), "tiles of whole heads");
    static_assert(!QUANT || BN == 128, "QUANT: one W row per producer thread, half a row per consumer thread");
    static_assert(MB == 1 || (MB == 2 && QUANT), "two 64-row blocks a consumer only where the W decode is shared");
    using L = Layout<BN, STAGES, !SWIGLU, QUANT, MB>;
    constexpr int kTileRows = MB * kBM;
    // The launch gives every thread 168 registers (__launch_bounds__), 64512 in all; setmaxnreg
    // moves them between warpgroups within that sum, and an increase the decreases do not pay
    // for waits forever: producer 128 x 40 + consumers 256 x 232 = 64512; QUANT's producer
    // (cp.async addresses) 128 x 56 + consumers 256 x 224 = 64512.
    constexpr int kProducerRegs = QUANT ? 56 : 40, kConsumerRegs = QUANT ? 224 : 232;
    static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads, "setmaxnreg would never return");
    constexpr int kTileCols = SWIGLU ? BN / 2 : BN;  // output columns per tile
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* smem = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
    uint64_t* empty = full + STAGES;
    const int warpgroup = hopper::warpgroup_index();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            hopper::mbarrier_init(full + s, QUANT ? 1 + 128 : 1);  // the TMA arrival (+ each producer thread's copies)
            hopper::mbarrier_init(empty + s, kConsumers * 4);
        }
        hopper::fence_barrier_init();
    }
    __syncthreads();

    const int k_tiles = CEIL_DIV(p.K, kBK);
    // A work item is a tile, or with split-K one K range of a tile (the split fastest).
    const int num_work = tiles.tiles_m * tiles.tiles_n * tiles.splits;
    const int first_work = blockIdx.x, work_stride = gridDim.x;

    if (warpgroup == 0) {
        hopper::regs_decrease<kProducerRegs>();
        if constexpr (QUANT) {
            produce_quant<BN, STAGES, SWIGLU, MB>(p, tiles, &x_map, smem, full, empty);
        } else if (threadIdx.x == 0) {
            hopper::prefetch_tensor_map(&x_map);
            hopper::prefetch_tensor_map(&w_map);
            // AddResidual by TMA, one K range per tile: the tile's residual boxes are asked of L2
            // one at a time, spread over its main loop, so that a wave's epilogues (which all
            // come at once: equal tiles, one CTA per SM) find them there instead of reading HBM
            // in one burst.
            constexpr int kResidualBoxes = kConsumers * BN / 32;
            // Only where tiles outnumber CTAs: in a single wave nothing would come of it but the
            // prefetches' own traffic.
            const int spread = !SWIGLU && ROPE_HD == 0 && p.ep == Epilogue::AddResidual && p.epilogue_tma &&
                                       tiles.splits == 1 && num_work > work_stride
                                   ? tuning::kGemmResidualSpread
                                   : 0;
            int stage = 0;
            uint32_t phase = 0;
            for (int work = first_work; work < num_work; work += work_stride) {
                int tm, tn, k_begin, k_end;
                tiles.coords(work, tm, tn);
                tiles.k_range(work, k_tiles, k_begin, k_end);
                const int m0 = tm * kTileRows, col0 = tn * kTileCols;
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
                    hopper::tma_load_2d(b, &w_map, kt * kBK, b_row0, full + stage);
                    hopper::tma_load_2d(b + L::kBBytes / 2, &w_map, kt * kBK, b_row1, full + stage);
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
            if (lane == 0) hopper::mbarrier_arrive(empty + slot);
        };
        int stage = 0;
        uint32_t phase = 0;
        int staged_boxes = 0;  // epilogue_tma's boxes so far, over every tile of this warpgroup
        int deq_tile = 0;      // QUANT: the W tile the next k tile is decoded into
        // Block mb holds tile rows (consumer MB + mb) 64 .. + 63: with MB = 2 each decoded W tile
        // feeds twice the MMAs.
        float acc[MB][BN / 2];
        for (int work = first_work; work < num_work; work += work_stride) {
            int tm, tn, k_begin, k_end;
            tiles.coords(work, tm, tn);
            tiles.k_range(work, k_tiles, k_begin, k_end);
            const int m0 = tm * kTileRows, col0 = tn * kTileCols;
            // QUANT: consumer thread ct decodes half h of tile row r.
            const int deq_r = (threadIdx.x - 128) >> 1, deq_h = threadIdx.x & 1;
            WRow deq_w{nullptr, nullptr, -1, 0};
            if constexpr (QUANT) {
                const int n = tile_w_row<BN, SWIGLU>(p, tn, deq_r);
                if (n < p.N) deq_w = locate(p.qb, p.K, n);
            }
            int prev_stage = 0;
            for (int kt = k_begin; kt < k_end; ++kt) {
                hopper::mbarrier_wait(full + stage, phase);
                const unsigned char* a = smem + stage * L::kStageBytes + consumer * MB * 64 * (kBK * 2);
                const unsigned char* b = smem + stage * L::kStageBytes + L::kABytes;
                if constexpr (QUANT) {
                    unsigned char* w_tile = smem + L::kDeqOffset + deq_tile * L::kBBytes;
                    decode_half(deq_w, p.K, kt, b + deq_r * kRawRowBytes, w_tile, deq_r, deq_h);
                    hopper::fence_proxy_async_shared();  // the stores, before wgmma reads them
                    hopper::named_barrier_sync(1, 256);  // every row of the tile is written
                    b = w_tile;
                    deq_tile = deq_tile == L::kDeqTiles - 1 ? 0 : deq_tile + 1;
                }
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) hopper::fence_accumulators(acc[mb]);
                hopper::wgmma_fence();
                // Descriptors of the k tile's first 16 k; a step of 16 k (32 bytes) or of a 64-row
                // block adds to the address field (in 16-byte units).
                const uint64_t desc_a = hopper::sw128_descriptor(a), desc_b = hopper::sw128_descriptor(b);
#pragma unroll
                for (int kk = 0; kk < kBK / 16; ++kk) {
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb) {
                        const uint32_t a_step = (mb * 64 * (kBK * 2) + 32 * kk) / 16, b_step = 32 * kk / 16;
                        hopper::wgmma_bf16<BN>(acc[mb], hopper::descriptor_add(desc_a, a_step),
                                               hopper::descriptor_add(desc_b, b_step), kt > k_begin || kk > 0);
                    }
                }
                hopper::wgmma_commit();
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) hopper::fence_accumulators(acc[mb]);
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
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) hopper::fence_accumulators(acc[mb]);
            release(prev_stage);
            if (tiles.splits > 1 &&
                !merge_split_partials<BN, MB>(p, tm * tiles.tiles_n + tn, work % tiles.splits, tiles.splits,
                                              m0 + consumer * MB * 64 + warp * 16 + (lane >> 2), acc))
                continue;  // another split of this tile finishes it

            const int ct = threadIdx.x & 127;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) {
                const int row0 = m0 + (consumer * MB + mb) * 64;  // this block's rows
                if constexpr (ROPE_HD > 0) {
                    // Tiles of q heads only through TMA (a tile that also holds k heads, as SmolLM2's
                    // 576 q columns leave one, takes the register stores below).
                    if (p.rope_q_tma && col0 + BN <= p.out.rope.n_heads * ROPE_HD) {
                        if (row0 >= p.M) continue;
                        rope_q_in_place<BN, ROPE_HD>(p, row0 + warp * 16 + (lane >> 2), lane & 3, acc[mb]);
                        epilogue_tma<BN, STAGES, QUANT, MB, true>(&out_map, smem + L::kResOffset, consumer, ct, warp,
                                                                  lane, row0, col0, p.out.rope.n_heads * ROPE_HD,
                                                                  false, staged_boxes, acc[mb]);
                        continue;
                    }
                }
                if (!SWIGLU && ROPE_HD == 0 && p.epilogue_tma) {
                    if (row0 >= p.M) continue;
                    if (p.ep == Epilogue::StoreBf16) {
                        epilogue_tma<BN, STAGES, QUANT, MB, true>(&out_map, smem + L::kResOffset, consumer, ct, warp,
                                                                  lane, row0, col0, p.width, false, staged_boxes,
                                                                  acc[mb]);
                    } else {
                        epilogue_tma<BN, STAGES, QUANT, MB, false>(&out_map, smem + L::kResOffset, consumer, ct, warp,
                                                                   lane, row0, col0, p.width,
                                                                   p.ep == Epilogue::AddResidual, staged_boxes,
                                                                   acc[mb]);
                    }
                    continue;
                }
                const int g = lane >> 2, t = lane & 3;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row0 + warp * 16 + g + 8 * h;
                    if constexpr (SWIGLU) {
                        // Gate column c sits in accumulator group c / 8, its up column BN / 16 groups later.
#pragma unroll
                        for (int i = 0; i < BN / 16; ++i) {
                            const float* gate = acc[mb] + 4 * i + 2 * h;
                            const float* up = acc[mb] + 4 * (i + BN / 16) + 2 * h;
                            store_swiglu_pair(p, row, col0 + 8 * i + 2 * t, gate[0], up[0], gate[1], up[1]);
                        }
                    } else if constexpr (ROPE_HD > 0) {
                        store_rope_row<BN, ROPE_HD>(p, row, col0 / ROPE_HD, t, acc[mb] + 2 * h);
                    } else if (p.ep == Epilogue::AddResidual) {
                        // Eight groups per batch: all BN / 8 at once would spill at BN = 256.
#pragma unroll
                        for (int i0 = 0; i0 < BN / 8; i0 += 8) {
                            float2 y[8];
#pragma unroll
                            for (int j = 0; j < 8; ++j)
                                y[j] = make_float2(acc[mb][4 * (i0 + j) + 2 * h], acc[mb][4 * (i0 + j) + 2 * h + 1]);
                            add_residual_pairs(p, row, col0 + 8 * i0 + 2 * t, y);
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < BN / 8; ++i) {
                            store_pair(p, row, col0 + 8 * i + 2 * t, acc[mb][4 * i + 2 * h], acc[mb][4 * i + 2 * h + 1]);
                        }
                    }
                }
            }
        }
        // The residual boxes' adds have landed and no TMA still reads this CTA's shared memory.
        if ((p.epilogue_tma || p.rope_q_tma) && (threadIdx.x & 127) == 0) hopper::bulk_wait_all();
    }
#else
    __trap();  // built without sm_90a: the host never launches this (see gemm_sm90_available)
#endif
}

// [rows, K] bf16 row-major, boxes of box_rows x kBK (64) in the 128-byte swizzle.
inline CUtensorMap make_tensor_map(const bf16* base, int rows, int K, int box_rows) {
    static_assert(kBK == 64, "make_tensor_map_sw128 boxes are 64 columns wide");
    return hopper::make_tensor_map_sw128(base, rows, K, box_rows, "gemm_bf16");
}

using KernelFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, GemmArgs, TileMap);

// The instance for p's epilogue. RopeKV has instances for head_dim 64 and 128 where BN holds
// whole heads (the caller checks rope_fusable first).
template <int BN, int STAGES, bool QUANT, int MB>
KernelFn pick_kernel(const GemmArgs& p) {
    if (p.ep == Epilogue::SwiGLU) return gemm_sm90_kernel<BN, STAGES, true, 0, QUANT, MB>;
    if (p.ep != Epilogue::RopeKV) return gemm_sm90_kernel<BN, STAGES, false, 0, QUANT, MB>;
    if constexpr (BN % 128 == 0) {
        if (p.out.rope.head_dim == 128) return gemm_sm90_kernel<BN, STAGES, false, 128, QUANT, MB>;
    }
    if constexpr (BN % 64 == 0) {
        if (p.out.rope.head_dim == 64) return gemm_sm90_kernel<BN, STAGES, false, 64, QUANT, MB>;
    }
    BRRR_CHECK(false, "gemm_bf16: no RopeKV instance for head_dim " << p.out.rope.head_dim << " with tiles of "
                                                                   << BN << " columns");
    return nullptr;
}

// The destination's map for epilogue_tma (boxes of 64 rows); other epilogues never touch it and
// get `unused` in its place.
inline CUtensorMap epilogue_map(const GemmArgs& p, const CUtensorMap& unused) {
    if (p.rope_q_tma) {
        const int q_dim = p.out.rope.n_heads * p.out.rope.head_dim;
        return hopper::make_tensor_map_2d_sw128(p.out.rope.q_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.M, q_dim,
                                                q_dim, 64, "gemm_bf16");
    }
    if (p.epilogue_tma && p.ep == Epilogue::StoreBf16) {
        return hopper::make_tensor_map_2d_sw128(p.out.out_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.M, p.width,
                                                p.out.ld_out, 64, "gemm_bf16");
    }
    if (p.epilogue_tma) {
        float* dst = p.ep == Epilogue::AddResidual ? p.out.residual : p.out.out_f32;
        return hopper::make_tensor_map_f32_sw128(dst, p.M, p.width, p.out.ld_out, 64, "gemm_bf16");
    }
    return unused;
}

// The tiles of p for tile_rows x BN tiles walked in groups of group_m tile rows, K split `splits` ways.
template <int BN>
TileMap tile_map(const GemmArgs& p, int tile_rows, int group_m, int splits) {
    const int k_tiles = CEIL_DIV(p.K, kBK);
    const int k_per_split = CEIL_DIV(k_tiles, splits);
    return TileMap{CEIL_DIV(p.M, tile_rows), CEIL_DIV(p.width, p.ep == Epilogue::SwiGLU ? BN / 2 : BN),
                   std::max(1, group_m), CEIL_DIV(k_tiles, k_per_split), k_per_split};  // no split left without k tiles
}

// Dynamic shared memory of pick_kernel<BN, STAGES, QUANT, MB>(p)'s instance.
template <int BN, int STAGES, bool QUANT, int MB>
size_t smem_bytes(const GemmArgs& p) {
    const bool res = p.ep != Epilogue::SwiGLU;  // as pick_kernel's instances
    return res ? Layout<BN, STAGES, true, QUANT, MB>::kSmemBytes : Layout<BN, STAGES, false, QUANT, MB>::kSmemBytes;
}

// One configuration: MB x 128 rows and BN columns of W per tile, STAGES ring slots; at most
// `max_ctas` CTAs walk the tiles (0: one CTA per tile); K split `splits` ways (p.out.split must
// then hold splits slots per tile and a counter per tile). QUANT: W is p.qb, copied raw by the
// producer and decoded by the consumers (no W map).
template <int BN, int STAGES, bool QUANT = false, int MB = 1>
void launch(const GemmArgs& p, int max_ctas, int group_m, cudaStream_t stream, int splits = 1) {
    constexpr int kTileRows = MB * kBM;
    const CUtensorMap x_map = make_tensor_map(p.x, p.M, p.K, kTileRows);
    const CUtensorMap w_map = QUANT ? x_map : make_tensor_map(p.W, p.N, p.K, BN / 2);
    const CUtensorMap out_map = epilogue_map(p, x_map);
    const TileMap tiles = tile_map<BN>(p, kTileRows, group_m, splits);
    BRRR_CHECK(tiles.splits == 1 ||
                   ((size_t)tiles.tiles_m * tiles.tiles_n * tiles.splits * kTileRows * BN <= p.out.split.floats &&
                    tiles.tiles_m * tiles.tiles_n <= p.out.split.n_counters),
               "gemm_bf16: split-K scratch too small for " << tiles.splits << " splits");
    const size_t smem = smem_bytes<BN, STAGES, QUANT, MB>(p);
    const KernelFn kernel = pick_kernel<BN, STAGES, QUANT, MB>(p);
    allow_dynamic_smem(kernel, smem);
    const int num_work = tiles.tiles_m * tiles.tiles_n * tiles.splits;
    const int grid = max_ctas > 0 ? std::min(num_work, std::max(1, max_ctas)) : num_work;
    kernel<<<grid, kThreads, smem, stream>>>(x_map, w_map, out_map, p, tiles);
    CUDA_CHECK_LAUNCH("gemm_sm90_kernel");
}

}  // namespace sm90
}  // namespace cuda
}  // namespace brrr
