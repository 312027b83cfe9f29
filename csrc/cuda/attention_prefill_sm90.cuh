// attention_prefill_sm90.cuh — the Hopper prefill kernel (TMA + wgmma) and its launch
// (attention_prefill_sm90.cu has the design). A header so that the lab (benchmarks/lab/
// cuda_attention_prefill_lab.cu) builds its variants from the same per-tile step.
#pragma once

#include <cmath>

#include "cuda/attention_common.cuh"
#include "cuda/check.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

constexpr int kSm90Threads = 384;
constexpr int kSm90Stages = 2;
constexpr int kSwRowBytes = 128;                    // one swizzled row: 64 bf16
[[maybe_unused]] constexpr int kSwBlockBytes = kPreRows * kSwRowBytes;  // a 64-wide column block of a 128-row tile

template <int HD>
struct Sm90Layout {
    static constexpr int kTileBytes = kPreRows * HD * 2;  // Q, K or V tile: 128 rows x hd
    static constexpr int kStageBytes = 2 * kTileBytes;     // K, then V
    // Q, the ring, the barriers (q_full, full[], empty[]), and 1 KB to align Q to the swizzle atom.
    static constexpr size_t bytes =
        (size_t)kTileBytes + (size_t)kSm90Stages * kStageBytes + (1 + 2 * kSm90Stages) * sizeof(uint64_t) + 1024;
};

// The online-softmax state of a warpgroup's 64 query rows. This thread holds rows r0 = 16 w + g
// and r1 = r0 + 8 (w the warp in the warpgroup, g = lane / 4) and, in o[4i + e], O[row e / 2]
// [hd column 8i + 2 t4 + e % 2] (the wgmma accumulator layout).
template <int HD>
struct WgRows {
    int row_pos[2];                // cache position of rows r0, r1
    float row_max[2], row_sum[2];  // max in log2 units; sum is this thread's share of the row
    float o[HD / 2];
};

template <int HD>
__device__ __forceinline__ void wg_rows_init(WgRows<HD>& st, int warp_first_pos, int g) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        st.row_pos[h] = warp_first_pos + g + 8 * h;
        st.row_max[h] = -INFINITY;
        st.row_sum[h] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) st.o[i] = 0.f;
}

// O / l of this thread's rows row0 and row0 + 8 into out, rows past T skipped.
template <int HD>
__device__ __forceinline__ void wg_store_rows(const WgRows<HD>& st, const PrefillArgs& a, int row0, int hq, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = st.row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
            for (int i = 0; i < HD / 8; ++i)
                dst[(8 * i + 2 * t4) / 2] = util::pack_bf16x2(st.o[4 * i + 2 * h] * inv, st.o[4 * i + 2 * h + 1] * inv);
        }
    }
}

// S = Q K^T for one 128-position tile: k-step ks reads 16 columns of hd, in column block ks / 4 at
// byte 32 (ks % 4). q_wg is the warpgroup's first Q row in block 0.
template <int HD>
__device__ __forceinline__ void wg_issue_s(float (&s)[64], const unsigned char* q_wg, const unsigned char* Kst) {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        const int off = (ks >> 2) * kSwBlockBytes + (ks & 3) * 32;
        hopper::wgmma_m64n128k16_bf16(s, hopper::sw128_descriptor(q_wg + off), hopper::sw128_descriptor(Kst + off),
                                      ks > 0);
    }
    hopper::wgmma_commit();
}

// O += P V: k-step j covers positions 16j..16j+15, rows 16j.. of every column block of V.
template <int HD>
__device__ __forceinline__ void wg_issue_pv(float (&o)[HD / 2], const uint32_t (&p)[8][4], const unsigned char* Vst) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
        hopper::wgmma_rs_tb<HD>(o, p[j], hopper::sw128_mn_descriptor(Vst + j * 16 * kSwRowBytes, kSwBlockBytes));
    hopper::wgmma_commit();
}

// The causal mask and the online softmax on a finished S of the tile at kv0: s becomes P (fp32,
// relative to the new row max), the statistics move on, and O is rescaled for the P V to come.
// s[4i + e] is S[row e / 2][position kv0 + 8i + 2 t4 + e % 2].
template <int HD>
__device__ __forceinline__ void wg_softmax(WgRows<HD>& st, float (&s)[64], int kv0, int warp_first_pos, int t4,
                                           float scale_log2) {
    if (kv0 + 127 > warp_first_pos) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (kv0 + 8 * i + 2 * t4 + (e & 1) > st.row_pos[e >> 1]) s[4 * i + e] = -INFINITY;
    }
    float shift[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(st.row_max[h], mx * scale_log2);
        shift[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
        alpha[h] = exp2f(st.row_max[h] - shift[h]);
        st.row_max[h] = new_max;
        st.row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * i + e] = exp2f(fmaf(s[4 * i + e], scale_log2, -shift[e >> 1]));
            st.row_sum[e >> 1] += s[4 * i + e];
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
        st.o[4 * i + 0] *= alpha[0];
        st.o[4 * i + 1] *= alpha[0];
        st.o[4 * i + 2] *= alpha[1];
        st.o[4 * i + 3] *= alpha[1];
    }
}

// One tile start to finish; returns with every wgmma complete, so its slot may be released.
template <int HD>
__device__ __forceinline__ void wg_attend_tile(WgRows<HD>& st, const unsigned char* q_wg, const unsigned char* Kst,
                                               const unsigned char* Vst, int kv0, int warp_first_pos, int t4,
                                               float scale_log2) {
    float s[64];
    uint32_t p[8][4];
    hopper::wgmma_fence();
    wg_issue_s<HD>(s, q_wg, Kst);
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(s);
    wg_softmax<HD>(st, s, kv0, warp_first_pos, t4, scale_log2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        p[i >> 1][(i & 1) * 2 + 0] = util::pack_bf16x2(s[4 * i + 0], s[4 * i + 1]);
        p[i >> 1][(i & 1) * 2 + 1] = util::pack_bf16x2(s[4 * i + 2], s[4 * i + 3]);
    }
    hopper::wgmma_fence();
    wg_issue_pv<HD>(st.o, p, Vst);
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(st.o);
}

template <int HD>
__global__ void __launch_bounds__(kSm90Threads, 1)
    attention_prefill_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap k_tail,
                                  const __grid_constant__ CUtensorMap v_tail, PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = Sm90Layout<HD>;
    constexpr int kBlocks = HD / 64;  // 64-wide column blocks per tile
    // 64K registers per SM: producer 128 x 40 + consumers 256 x 232 = 64512 (the GEMM's split).
    constexpr int kProducerRegs = 40, kConsumerRegs = 232;
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* Qs = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    unsigned char* ring = Qs + L::kTileBytes;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(ring + kSm90Stages * L::kStageBytes);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + kSm90Stages;
    if (threadIdx.x == 0) {
        hopper::mbarrier_init(q_full, 1);
        for (int s = 0; s < kSm90Stages; ++s) {
            hopper::mbarrier_init(full + s, 1);
            hopper::mbarrier_init(empty + s, 8);
        }
        hopper::fence_barrier_init();
    }
    __syncthreads();

    const int warpgroup = hopper::warpgroup_index();
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kPreRows;
    const int kv_end = a.start_pos + min(q0 + kPreRows, a.T);
    const int n_tiles = CEIL_DIV(kv_end, kPreRows);

    if (warpgroup == 0) {
        hopper::regs_decrease<kProducerRegs>();
        if (threadIdx.x == 0) {
            hopper::prefetch_tensor_map(&q_map);
            hopper::prefetch_tensor_map(&k_map);
            hopper::prefetch_tensor_map(&v_map);
            hopper::prefetch_tensor_map(&k_tail);
            hopper::prefetch_tensor_map(&v_tail);
            hopper::mbarrier_arrive_expect_tx(q_full, L::kTileBytes);
#pragma unroll
            for (int b = 0; b < kBlocks; ++b) hopper::tma_load_2d(Qs + b * kSwBlockBytes, &q_map, hq * HD + 64 * b, q0, q_full);
            // A tile is kPreRows / block_size cache blocks, each its own box. The block holding the
            // last filled position, and any past it, come through the tail maps, which end at that
            // position: the rest of the box is TMA's zeros, never a stale row of the pool.
            const int bs = a.kv.pages.block_size, per_tile = kPreRows / bs;
            const int last_block = (a.start_pos + a.T - 1) / bs;
            const int32_t* blocks = a.kv.pages.table + (size_t)a.slot * a.kv.pages.blocks_per_seq;
            int stage = 0;
            uint32_t phase = 0;
            for (int kt = 0; kt < n_tiles; ++kt) {
                hopper::mbarrier_wait(empty + stage, phase ^ 1);
                unsigned char* k = ring + stage * L::kStageBytes;
                unsigned char* v = k + L::kTileBytes;
                hopper::mbarrier_arrive_expect_tx(full + stage, L::kStageBytes);
                for (int j = 0; j < per_tile; ++j) {
                    const int block = kt * per_tile + j;
                    const bool tail = block >= last_block;
                    const int row = tail ? 0 : blocks[block] * bs;
#pragma unroll
                    for (int b = 0; b < kBlocks; ++b) {
                        const int off = b * kSwBlockBytes + j * bs * kSwRowBytes;
                        hopper::tma_load_2d(k + off, tail ? &k_tail : &k_map, kvh * HD + 64 * b, row, full + stage);
                        hopper::tma_load_2d(v + off, tail ? &v_tail : &v_map, kvh * HD + 64 * b, row, full + stage);
                    }
                }
                if (++stage == kSm90Stages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    } else {
        hopper::regs_increase<kConsumerRegs>();
        const int consumer = warpgroup - 1;
        const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) & 3, g = lane >> 2, t4 = lane & 3;
        const int wg_first_pos = a.start_pos + q0 + 64 * consumer;
        const int warp_first_pos = wg_first_pos + 16 * w;
        WgRows<HD> st;
        wg_rows_init(st, warp_first_pos, g);
        const unsigned char* q_wg = Qs + 64 * consumer * kSwRowBytes;
        hopper::mbarrier_wait(q_full, 0);
        // The tiles this warpgroup computes start at or before its last row; the later ones are
        // released unread (the other warpgroup needs them).
        const int n_mine = min(n_tiles, (wg_first_pos + 63) / kPreRows + 1);
        // Two loops, not a branch around the MMAs: ptxas serializes every wgmma of a kernel that
        // issues one under a condition (C7520).
        int stage = 0;
        uint32_t phase = 0;
        auto release = [&] {
            if (lane == 0) hopper::mbarrier_arrive(empty + stage);
            if (++stage == kSm90Stages) {
                stage = 0;
                phase ^= 1;
            }
        };
        for (int kt = 0; kt < n_mine; ++kt) {
            hopper::mbarrier_wait(full + stage, phase);
            const unsigned char* k = ring + stage * L::kStageBytes;
            wg_attend_tile<HD>(st, q_wg, k, k + L::kTileBytes, kt * kPreRows, warp_first_pos, t4, a.scale_log2);
            release();
        }
        for (int kt = n_mine; kt < n_tiles; ++kt) {
            hopper::mbarrier_wait(full + stage, phase);
            release();
        }
        wg_store_rows(st, a, q0 + 64 * consumer + 16 * w + g, hq, t4);
    }
#else
    __trap();  // built without sm_90a: the host never launches this (see prefill_sm90_ready)
#endif
}


// Whether this device runs attention_prefill_sm90_kernel (launch.cuh: Hopper and an sm_90a build).
inline bool prefill_sm90_ready() { return runs_sm90a(attention_prefill_sm90_kernel<128>); }

// Q as [T, Hq * hd] in boxes of 128 x 64; the pool's K and V as [n_blocks * block_size, Hkv * hd]
// in boxes of one block x 64, and the tail maps: the slot's last filled block, ending at the last
// filled position (slot_blocks: the slot's table row on the host).
template <int HD>
void launch_prefill_sm90(const PrefillArgs& a, const int32_t* slot_blocks, int pool_rows, dim3 grid,
                         cudaStream_t stream) {
    const int kv_row = a.n_kv_heads * HD, bs = a.kv.pages.block_size;
    const int last_block = (a.start_pos + a.T - 1) / bs;
    const size_t tail_offset = (size_t)slot_blocks[last_block] * bs * kv_row;
    const int tail_rows = a.start_pos + a.T - last_block * bs;
    const char* op = "attention_prefill";
    const CUtensorMap q_map = hopper::make_tensor_map_sw128(a.q, a.T, a.n_heads * HD, kPreRows, op);
    const CUtensorMap k_map = hopper::make_tensor_map_sw128(a.kv.k, pool_rows, kv_row, bs, op);
    const CUtensorMap v_map = hopper::make_tensor_map_sw128(a.kv.v, pool_rows, kv_row, bs, op);
    const bf16* k = static_cast<const bf16*>(a.kv.k);  // a bf16 cache: attention_prefill routes e4m3 elsewhere
    const bf16* v = static_cast<const bf16*>(a.kv.v);
    const CUtensorMap k_tail = hopper::make_tensor_map_sw128(k + tail_offset, tail_rows, kv_row, bs, op);
    const CUtensorMap v_tail = hopper::make_tensor_map_sw128(v + tail_offset, tail_rows, kv_row, bs, op);
    auto kernel = attention_prefill_sm90_kernel<HD>;
    constexpr size_t smem = Sm90Layout<HD>::bytes;
    allow_dynamic_smem(kernel, smem);
    kernel<<<grid, kSm90Threads, smem, stream>>>(q_map, k_map, v_map, k_tail, v_tail, a);
    CUDA_CHECK_LAUNCH("attention_prefill_sm90_kernel");
}

}  // namespace cuda
}  // namespace brrr
