// attention_prefill_wgmma.cuh — variant 14 of the prefill attention lab: causal prefill at
// head_dim 128 on warpgroup MMA (wgmma), the instruction that feeds Hopper's tensor cores at full
// rate (mma.sync, which the mma.sync kernel 11 uses, reaches about two thirds of it), with Q, K and
// V brought in by cp.async.
//
// A CTA owns 128 queries of one head as two warpgroups of 64 rows; per KV tile of 128 positions
// each runs the engine's per-tile step (attention_prefill_sm90.cuh: wg_attend_tile, S = Q K^T and O += P V on
// wgmma, P from registers, V an MN-major operand). Q, K and V arrive by cp.async (16-byte chunks
// placed where the 128-byte swizzle puts them), K/V double-buffered; a proxy fence makes those
// generic-proxy writes visible to wgmma. The two warpgroups step through the tiles together (a CTA
// barrier per tile). hd 64 runs the mma.sync kernel. H100 (run O): 0 failures in 144 cases;
// Llama-3-8B heads 133 / 323 / 380 / 393 TF/s at 512 / 2048 / 8192 / 16384 tokens.
//
// 15 is what ships since (attention_prefill_sm90_kernel): the same per-tile step with a producer
// warpgroup feeding both consumers by TMA through two ring slots, so the consumers run
// independently. Run P measured it at 414 / 551 / 566 TF/s (2048 / 8192 / 16384 tokens, 8B heads)
// beside variants that are no longer in the lab (their code is at commit 6f119d6): 16, the same
// with three slots (407 / 546 / 543); 17, each warpgroup's softmax of a 64-position half tile
// overlapping its own previous P V, FlashAttention-3's intra-warpgroup overlap (389 / 467 / 430;
// whole 128-position blocks spilled at ptxas's 168 registers and serialized the wgmmas); 18 and 19,
// 16 and 17 with the two consumers taking turns on the tensor cores, FlashAttention-3's ping-pong
// (413 / 527 / 530 and 380 / 454 / 462).
#pragma once

#include "cuda/hopper.cuh"

namespace lab {

namespace hopper = brrr::cuda::hopper;

constexpr int kWgRows = 128, kWgKV = 128, kWgThreads = 256, kWgHD = 128;
constexpr int kWgHalf = 64 * 2;                     // bytes of one 64-wide swizzled row
constexpr int kWgTileBytes = 128 * kWgHD * 2;       // a 128 x 128 bf16 tile: 32 KB
constexpr int kWgHalfBytes = kWgTileBytes / 2;      // one 64-wide half of it: 16 KB
using brrr::cuda::WgRows;
// Q, then K and V in two stages each, plus 1 KB to align the start to the swizzle's 1024 bytes.
constexpr size_t kWgSmem = 5 * (size_t)kWgTileBytes + 1024;

__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Where 16-byte chunk c (0..15) of row r of a 128-wide tile lives: the 64-wide half c / 8, row r
// of it, chunk c % 8 moved by the swizzle (XOR with r % 8): what a TMA box of 64 x rows in the
// 128-byte swizzle writes.
__device__ __forceinline__ uint32_t wg_chunk_offset(int r, int c) {
    return (uint32_t)((c >> 3) * kWgHalfBytes + r * kWgHalf + (((c & 7) ^ (r & 7)) << 4));
}

// ---- 14: both warpgroups load by cp.async and step through the tiles together ---------------------

__global__ void __launch_bounds__(kWgThreads, 1) prefill_wgmma_hd128_kernel(PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int HD = kWgHD;
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* base = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    unsigned char* Qs = base;                     // [2 halves][128 rows][128 B]
    unsigned char* Ks = base + kWgTileBytes;      // [2 stages] of the same
    unsigned char* Vs = base + 3 * kWgTileBytes;  // [2 stages]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kWgRows;
    const int kv_total = a.start_pos + a.T;
    const int kv_end = a.start_pos + min(q0 + kWgRows, a.T);
    const int n_tiles = CEIL_DIV(kv_end, kWgKV);
    const size_t slot_base = (size_t)a.slot * a.kv.max_seq;  // the identity table's rows (check_contiguous)

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.kv.k);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.kv.v);
    for (int i = tid; i < kWgRows * HD / 8; i += kWgThreads) {
        const int r = i >> 4, c = i & 15;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + wg_chunk_offset(r, c), qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + c * 8, ok);
    }
    auto load_kv = [&](int stage, int p0) {
        unsigned char* Kst = Ks + stage * kWgTileBytes;
        unsigned char* Vst = Vs + stage * kWgTileBytes;
        for (int i = tid; i < kWgKV * HD / 8; i += kWgThreads) {
            const int r = i >> 4, c = i & 15;
            const int p = p0 + r;
            const bool ok = p < kv_total;
            const size_t off = ((slot_base + (ok ? p : 0)) * a.n_kv_heads + kvh) * HD + c * 8;
            ptx::cp_async_16(Kst + wg_chunk_offset(r, c), kbits + off, ok);
            ptx::cp_async_16(Vst + wg_chunk_offset(r, c), vbits + off, ok);
        }
    };
    load_kv(0, 0);
    ptx::cp_async_commit();

    const int wg_first_pos = a.start_pos + q0 + 64 * wg;
    const int warp_first_pos = wg_first_pos + 16 * w;
    WgRows<HD> st;
    brrr::cuda::wg_rows_init(st, warp_first_pos, g);
    const unsigned char* q_wg = Qs + 64 * wg * kWgHalf;  // the warpgroup's 64 rows (8 atoms in)

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int stage = kt & 1, kv0 = kt * kWgKV;
        if (kt + 1 < n_tiles) {
            load_kv(stage ^ 1, kv0 + kWgKV);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        fence_proxy_async_smem();  // this thread's cp.async data, visible to the async proxy
        __syncthreads();
        if (kv0 <= wg_first_pos + 63)
            brrr::cuda::wg_attend_tile<HD>(st, q_wg, Ks + stage * kWgTileBytes, Vs + stage * kWgTileBytes, kv0,
                                           warp_first_pos, t4, a.scale_log2);
        __syncthreads();  // the stage is overwritten by the next iteration's loads
    }
    brrr::cuda::wg_store_rows(st, a, q0 + 64 * wg + 16 * w + g, hq, t4);
#endif
}

// The launcher of 14: hd 64 runs the mma.sync kernel (11).
void launch_wgmma_hd128(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos,
                        int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    if (head_dim != 128) {
        launch_mma_sync_path<64, false>(q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim,
                                        stream);
        return;
    }
    if (!check_contiguous("prefill_wgmma", q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads,
                          head_dim))
        return;
    const PrefillArgs a =
        brrr::cuda::prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_hd128_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)kWgSmem));
    prefill_wgmma_hd128_kernel<<<brrr::cuda::prefill_grid(a), kWgThreads, kWgSmem, stream>>>(a);
    CUDA_CHECK_LAUNCH("prefill_wgmma_hd128_kernel");
}

}  // namespace lab
