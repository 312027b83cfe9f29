// gemm_sm90_cluster.cuh — GEMM lab variants 09 / 10: the Hopper GEMM (csrc/cuda/gemm_sm90.cuh) in
// clusters of two CTAs that share their W tiles.
//
// Two CTAs of a cluster take vertically adjacent tiles with the same W columns; each loads its
// own x box and one of the two W boxes, multicast into both CTAs, halving the W traffic out of
// L2. A ring slot is then free only when the consumers of both CTAs are done with it (empty[s]
// counts 2 x 8 warps; each consumer warp arrives locally and remotely), and neither CTA may exit
// while its peer can still arrive on its barriers (the final cluster_sync). Remote arrivals are
// released at CTA scope: at cluster scope each compiled to a MEMBAR.ALL.GPU in the consumers' k
// loop. The persistent grid is capped at the clusters the GPU holds at once (a cluster lives in
// one GPC). Everything but the cluster mechanics (tiles, epilogues, split-K merge, tensor maps)
// is the production header's. It lost against single CTAs: docs/kernels/gemm.md.
// Epilogues: StoreBf16 / StoreF32 / AddResidual / SwiGLU (what the lab checks); no RopeKV.
#pragma once

#include "cuda/gemm_sm90.cuh"

namespace brrr {
namespace cuda {
namespace sm90 {

__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Every thread of every CTA in the cluster arrives, then waits for all of them.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// An arrival on the barrier at the same offset in CTA `rank` of the cluster. Release at CTA scope
// (the default): what it announces, a slot whose MMAs have retired, needs no ordering of this
// thread's memory operations across the cluster, and .release.cluster compiles to a MEMBAR.ALL.GPU
// before every arrival (the GEMM's clusters ran at half speed that way).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(ptx::smem_addr(bar)),
        "r"(rank)
        : "memory");
}

// The same copy delivered to the same shared-memory offset of every CTA in `cta_mask`, each
// CTA's barrier at that offset receiving the transaction bytes.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int inner, int outer,
                                                      uint64_t* bar, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(ptx::smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(ptx::smem_addr(bar)), "h"(cta_mask)
        : "memory");
}

// One CTA of a pair: the production kernel's walk, with the cluster's W multicast and arrivals.
template <int BN, int STAGES, bool SWIGLU, int ROPE_HD>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_cluster_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap out_map, GemmArgs p, TileMap tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int CLUSTER = 2;
    static_assert(ROPE_HD == 0 || (!SWIGLU && ROPE_HD % 16 == 0 && BN % (ROPE_HD > 0 ? ROPE_HD : 1) == 0), "tiles of whole heads");
    using L = Layout<BN, STAGES, !SWIGLU, false>;
    // 64K registers per SM: producer 128 x 40 + consumers 256 x 232 = 64512.
    constexpr int kProducerRegs = 40, kConsumerRegs = 232;
    constexpr int kTileCols = SWIGLU ? BN / 2 : BN;  // output columns per tile
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* smem = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
    uint64_t* empty = full + STAGES;
    const int warpgroup = threadIdx.x / 128;
    const uint32_t rank = cluster_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            hopper::mbarrier_init(full + s, 1);
            hopper::mbarrier_init(empty + s, kConsumers * 4 * CLUSTER);
        }
        hopper::fence_barrier_init();
    }
    cluster_sync();  // the peer's barriers exist before anything reaches them

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
                                   ? (p.ep == Epilogue::AddResidual ? tuning::kGemmResidualSpread : 0) : 0;
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
                    tma_load_2d_multicast(b + rank * (L::kBBytes / 2), &w_map, kt * kBK, rank ? b_row1 : b_row0,
                                          full + stage, 0x3);
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
            mbarrier_arrive_cluster(empty + slot, rank ^ 1);
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
                !sm90::merge_split_partials<BN>(p, tm * tiles.tiles_n + tn, work % tiles.splits, tiles.splits,
                                          m0 + consumer * 64 + warp * 16 + (lane >> 2), acc))
                continue;  // another split of this tile finishes it

            const int row0 = m0 + consumer * 64, ct = threadIdx.x & 127;  // this warpgroup's rows
            if constexpr (ROPE_HD > 0) {
                // Tiles of q heads only through TMA (a tile that also holds k heads, as SmolLM2's
                // 576 q columns leave one, takes the register stores below).
                if (p.rope_q_tma && col0 + BN <= p.out.rope.n_heads * ROPE_HD) {
                    if (row0 >= p.M) continue;
                    sm90::rope_q_in_place<BN, ROPE_HD>(p, row0 + warp * 16 + (lane >> 2), lane & 3, acc);
                    sm90::epilogue_tma<BN, STAGES, false, true>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0,
                                                   col0, p.out.rope.n_heads * ROPE_HD, false, staged_boxes, acc);
                    continue;
                }
            }
            if (!SWIGLU && ROPE_HD == 0 && p.epilogue_tma) {
                if (row0 >= p.M) continue;
                if (p.ep == Epilogue::StoreBf16) {
                    sm90::epilogue_tma<BN, STAGES, false, true>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0, col0,
                                                   p.width, false, staged_boxes, acc);
                } else {
                    sm90::epilogue_tma<BN, STAGES, false, false>(&out_map, smem + L::kResOffset, consumer, ct, warp, lane, row0,
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
                    sm90::store_rope_row<BN, ROPE_HD>(p, row, col0 / ROPE_HD, t, acc + 2 * h);
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
    cluster_sync();  // no remote arrival may target an exited CTA
#else
    __trap();  // built without sm_90a: the host never launches this (see gemm_sm90_available)
#endif
}


using ClusterKernelFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, GemmArgs, TileMap);

// A launch of `grid` CTAs in clusters of `cluster` along x; the config points at `attr`.
inline cudaLaunchConfig_t cluster_config(int grid, int cluster, size_t smem, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
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

// Clusters of `cluster` CTAs of `kernel` (smem bytes each) that the GPU holds at once: can be
// less than sm_count / cluster (H100 SXM, one CTA per SM: 66 pairs, but 30 clusters of four), and
// a persistent grid sized past it would run its last clusters as a second wave.
inline int resident_clusters(ClusterKernelFn kernel, int cluster, size_t smem) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(cluster, cluster, smem, nullptr, &attr);
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
    return std::max(1, n);
}

// Variants 09 / 10: BN-column tiles, STAGES ring slots, pairs of CTAs, at most max_ctas CTAs.
template <int BN, int STAGES>
void launch_cluster(const GemmArgs& p, int max_ctas, int group_m, cudaStream_t stream) {
    constexpr int kCluster = 2;
    BRRR_CHECK(p.ep != Epilogue::RopeKV, "gemm lab: the cluster variants have no RopeKV instance");
    const CUtensorMap x_map = make_tensor_map(p.x, p.M, p.K, kBM);
    const CUtensorMap w_map = make_tensor_map(p.W, p.N, p.K, BN / 2);
    const CUtensorMap out_map = epilogue_map(p, x_map);
    const TileMap tiles = tile_map<BN>(p, group_m / kCluster, 1);
    const size_t smem = smem_bytes<BN, STAGES, false>(p);
    const ClusterKernelFn kernel = p.ep == Epilogue::SwiGLU ? gemm_sm90_cluster_kernel<BN, STAGES, true, 0>
                                                            : gemm_sm90_cluster_kernel<BN, STAGES, false, 0>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (max_ctas > 0) max_ctas = std::min(max_ctas, kCluster * resident_clusters(kernel, kCluster, smem));
    const int num_work = CEIL_DIV(tiles.tiles_m, kCluster) * tiles.tiles_n;
    const int grid = kCluster * (max_ctas > 0 ? std::min(num_work, std::max(1, max_ctas / kCluster)) : num_work);
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = cluster_config(grid, kCluster, smem, stream, &attr);
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, x_map, w_map, out_map, p, tiles));
    CUDA_CHECK_LAUNCH("gemm_sm90_cluster_kernel");
}

}  // namespace sm90
}  // namespace cuda
}  // namespace brrr
