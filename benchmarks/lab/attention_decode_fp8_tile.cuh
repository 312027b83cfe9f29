// attention_decode_fp8_tile.cuh — lab variant 27 of cuda_flash_decode_lab.cu: flash_decode's
// tensor-core kernel as it read an e4m3 cache before the shipped form. Each lane widened the
// pieces it had copied into a per-warp fp16 tile in shared memory ([2][16][HD + 8]), and the warp
// read the tile with ldmatrix as it reads a bf16 cache: per 16 positions 4 KB of bytes read back,
// 8 KB of fp16 written and 8 KB read by ldmatrix, beside the 4 KB cp.async wrote. The shipped
// kernel (attention_decode.cuh) reads the bytes with ldmatrix and widens in registers. Only the
// FP8 instances are used (the bf16 path is the shipped one).
#pragma once

#include "cuda/attention_decode.cuh"

namespace brrr {
namespace cuda {
namespace lab_fp8_tile {

template <int HD, bool FP8>
struct DecodeMmaTileLayout {
    static constexpr int kPitch = HD + 8;  // bf16 tile rows: ldmatrix rows in distinct bank groups
    static constexpr size_t tile_bytes = (size_t)2 * 16 * kPitch * 2;   // K then V, 16-bit elements
    static constexpr size_t copy_bytes = FP8 ? (size_t)2 * 16 * HD : tile_bytes;  // one stage as copied
    static constexpr size_t warp_bytes(int stages) { return stages * copy_bytes + (FP8 ? tile_bytes : 0); }
};

template <int HD, int GMAX, int THREADS, int STAGES, bool FP8>
__global__ void __launch_bounds__(THREADS) flash_decode_mma_tile_kernel(DecodeArgs a) {
    static_assert(STAGES >= 2 && GMAX <= 8, "a stage to fill beside the one read; head rows g < 8 of the A tile");
    using L = DecodeLayout<HD, GMAX, THREADS>;
    using M = DecodeMmaTileLayout<HD, FP8>;
    constexpr int kWarps = L::kWarps, P = M::kPitch;
    constexpr int kPiece = FP8 ? 16 : 8;              // elements a 16-byte copy brings
    constexpr int kPieces = 16 * HD / kPiece / 32;    // per lane, per tile (K or V)

    unsigned char* smem = ptx::dynamic_smem<unsigned char>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    DecodeCta cta;
    if (!start_cta<HD, GMAX, THREADS>(a, cta)) return;
    const int b = cta.b, kvh = cta.kvh, n_g = cta.n_g, head0 = cta.head0, c0 = cta.c0, c1 = cta.c1;

    const int slot = __ldcg(a.slots + b);
    auto step_base = [&](int step) { return c0 + (step * kWarps + warp) * 16; };
    unsigned char* ring = smem + L::tiles_off + (size_t)warp * M::warp_bytes(STAGES);
    uint16_t* tile = reinterpret_cast<uint16_t*>(FP8 ? ring + STAGES * M::copy_bytes : nullptr);  // FP8 only
    const size_t elem = FP8 ? 1 : 2;
    // Copies the K and V rows of a step into stage st: lane-strided 16-byte pieces; rows past c1
    // or without a block are zeros (their scores are masked).
    auto copy_step = [&](int step) {
        const int base = step_base(step), st = step % STAGES;
        unsigned char* dst = ring + st * M::copy_bytes;
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
            const int c = lane + 32 * i, r = c / (HD / kPiece), col = (c % (HD / kPiece)) * kPiece;
            const int p = base + r;
            const int64_t row = p < c1 ? a.kv.pages.row(slot, p) : -1;
            const size_t at = row < 0 ? 0 : ((size_t)(row * a.n_kv_heads + kvh) * HD + col) * elem;
            // stage layout: FP8 [K|V][16][HD] bytes; bf16 the tile itself, [K|V][16][P]
            const size_t kv_stride = FP8 ? (size_t)16 * HD : (size_t)16 * P * 2;
            const size_t off = FP8 ? (size_t)r * HD + col : ((size_t)r * P + col) * 2;
            ptx::cp_async_16(dst + off, static_cast<const unsigned char*>(a.kv.k) + at, row >= 0);
            ptx::cp_async_16(dst + kv_stride + off, static_cast<const unsigned char*>(a.kv.v) + at, row >= 0);
        }
    };
    // FP8: this lane's pieces of stage st widened into the warp's fp16 tile.
    auto widen_step = [&](int step) {
        const unsigned char* src = ring + (step % STAGES) * M::copy_bytes;
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
            const int c = lane + 32 * i, r = c / (HD / kPiece), col = (c % (HD / kPiece)) * kPiece;
#pragma unroll
            for (int kv = 0; kv < 2; ++kv)
                util::widen_e4m3x16<true>(*reinterpret_cast<const uint4*>(src + kv * 16 * HD + r * HD + col),
                                          reinterpret_cast<uint4*>(tile + (kv * 16 + r) * P + col));
        }
    };

    // The copies start after the wait: at batches the attention is long beside the kernel before.
    pdl_wait();
#pragma unroll
    for (int step = 0; step < STAGES - 1; ++step) {
        if (step_base(step) < c1) copy_step(step);
        ptx::cp_async_commit();
    }
    if constexpr (HD < tuning::kDecodeLateTriggerHeadDim) pdl_launch_dependents();

    // The MMA's operand type: bf16, or fp16 for an e4m3 cache.
    auto mma = [](float d[4], const uint32_t a4[4], const uint32_t b2[2]) {
        if constexpr (FP8) ptx::mma_f16_16816(d, a4, b2);
        else ptx::mma_bf16_16816(d, a4, b2);
    };
    auto pack = [](float lo, float hi) { return FP8 ? util::pack_f16x2(lo, hi) : util::pack_bf16x2(lo, hi); };
    // Q as the A operand of each 16-dim k-step: row g is head g (zeros past n_g), rows g + 8 zeros.
    uint32_t qa[HD / 16][4];
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(a.q + ((size_t)b * a.n_heads + head0 + g) * HD);
    auto q_pair = [&](int d) {
        const uint32_t w = qrow[d / 2];
        return FP8 ? pack(util::bf16_lo(w), util::bf16_hi(w)) : w;
    };
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        qa[ks][0] = g < n_g ? q_pair(ks * 16 + 2 * t4) : 0u;
        qa[ks][2] = g < n_g ? q_pair(ks * 16 + 8 + 2 * t4) : 0u;
        qa[ks][1] = qa[ks][3] = 0u;
    }

    float row_max = -INFINITY, row_sum = 0.f;  // head g's, in log2 units; the sum is this lane's share
    float o[HD / 8][4];
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;

    for (int step = 0; step_base(step) < c1; ++step) {
        const int base = step_base(step);
        __syncwarp();  // every lane is done with the stage (and tile) refilled below
        if (step_base(step + STAGES - 1) < c1) copy_step(step + STAGES - 1);
        ptx::cp_async_commit();
        ptx::cp_async_wait<STAGES - 1>();  // this lane's pieces of this step have landed
        const uint16_t* Kt;
        if constexpr (FP8) {
            widen_step(step);
            Kt = tile;
        } else {
            Kt = reinterpret_cast<const uint16_t*>(ring + (step % STAGES) * M::copy_bytes);
        }
        __syncwarp();  // and every other lane's
        const uint16_t* Vt = Kt + 16 * P;

        // S = Q K^T: positions 0-7 (n-tile 0) and 8-15 (n-tile 1) of the step.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            uint32_t r[4];
            ptx::ldmatrix_x4(r, Kt + ((lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma(s[0], qa[ks], b0);
            mma(s[1], qa[ks], b1);
        }
        uint32_t pa[4];
        decode_softmax_step<HD, FP8>(s, base, c1, t4, a.scale_log2, row_max, row_sum, o, pa);

        // O += P V: P's row g as the A operand, V through ldmatrix.trans.
#pragma unroll
        for (int i = 0; i < HD / 16; ++i) {
            uint32_t r[4];
            ptx::ldmatrix_x4_trans(r, Vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma(o[2 * i], pa, b0);
            mma(o[2 * i + 1], pa, b1);
        }
    }

    // The warp's state into DecodeLayout's slots: row g's sum over its quad, acc columns 2 t4, + 1.
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
    float* warp_m = reinterpret_cast<float*>(smem + L::m_off);
    float* warp_l = reinterpret_cast<float*>(smem + L::l_off);
    float* warp_acc = reinterpret_cast<float*>(smem + L::acc_off);
    if (g < GMAX) {
#pragma unroll
        for (int f = 0; f < HD / 8; ++f)
            *reinterpret_cast<float2*>(warp_acc + (warp * GMAX + g) * HD + f * 8 + 2 * t4) = make_float2(o[f][0], o[f][1]);
        if (t4 == 0) warp_m[warp * GMAX + g] = row_max, warp_l[warp * GMAX + g] = row_sum;
    }
    finish_cta<HD, GMAX, THREADS>(a, cta, smem);
}

template <int HD, int GMAX, int STAGES>
inline void launch(const DecodeArgs& a, int B, cudaStream_t stream) {
    constexpr int kThreads = 128;
    using L = DecodeLayout<HD, GMAX, kThreads>;
    constexpr size_t kBytes = L::tiles_off + (size_t)L::kWarps * DecodeMmaTileLayout<HD, true>::warp_bytes(STAGES);
    auto kernel = flash_decode_mma_tile_kernel<HD, GMAX, kThreads, STAGES, true>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kBytes));
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(kThreads), kBytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_mma_tile_kernel");
}

// The GQA group's instance, with the stages the shipped code gave this form (12 KB of copies a warp).
template <int HD>
inline void launch_group(const DecodeArgs& a, int B, cudaStream_t stream) {
    constexpr size_t kBytesPerWarp = 12 * 1024;
    constexpr size_t n = kBytesPerWarp / DecodeMmaTileLayout<HD, true>::copy_bytes;
    constexpr int kStages = n < 2 ? 2 : n > 4 ? 4 : (int)n;
    switch (decode_gmax(a.group)) {
        case 1: launch<HD, 1, kStages>(a, B, stream); break;
        case 2: launch<HD, 2, kStages>(a, B, stream); break;
        default: launch<HD, 4, kStages>(a, B, stream); break;
    }
}

}  // namespace lab_fp8_tile
}  // namespace cuda
}  // namespace brrr
