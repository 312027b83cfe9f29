// attention_prefill_wgmma.cuh — variant 14 of the prefill attention lab: the causal prefill at
// head_dim 128 on warpgroup MMA (wgmma), the instruction that feeds Hopper's tensor cores at full
// rate (mma.sync, which the shipped kernel uses, reaches about two thirds of it).
//
// A CTA owns 128 queries of one head as two warpgroups of 64 rows. Per KV tile of 128 positions:
//   S = Q K^T    wgmma m64n128k16 x 8 k-steps, Q and K from shared memory (K-major, 128-byte
//                swizzle, the layout the GEMM uses: hopper::sw128_descriptor)
//   softmax      online, fp32, in the S accumulators (a row lives in the 4 threads of a quad)
//   O += P V     wgmma m64n128k16 x 8 k-steps, P from registers (the S accumulators of positions
//                16j..16j+15 are the A fragment of k-step j: the layouts coincide) and V from
//                shared memory as an MN-major operand (positions x hd, hd contiguous, same swizzle;
//                descriptor: 16 KB between the two 64-wide hd halves, 1 KB between 8-row groups)
// Q, K and V arrive by cp.async (16-byte chunks placed where the 128-byte swizzle puts them),
// K/V double-buffered; a proxy fence makes those generic-proxy writes visible to wgmma.
// What it does not do yet (FlashAttention-3): TMA loads from a producer warp, softmax of one
// warpgroup overlapping the other's MMAs (ping-pong), S of the next tile in flight during this
// tile's softmax. hd 64 runs the shipped kernel.
// H100 (run O, benchmarks/results/h100-sxm/attention_prefill_lab/): 0 failures in 144 cases;
// Llama-3-8B heads 133 / 323 / 380 / 393 TF/s at 512 / 2048 / 8192 / 16384 tokens, 1.44 / 1.13 /
// 1.09 / 1.23x the shipped mma.sync kernel.
#pragma once

#include "cuda/hopper.cuh"

namespace lab {

namespace hopper = brrr::cuda::hopper;

constexpr int kWgRows = 128, kWgKV = 128, kWgThreads = 256, kWgHD = 128;
constexpr int kWgHalf = 64 * 2;                     // bytes of one 64-wide swizzled row
constexpr int kWgTileBytes = 128 * kWgHD * 2;       // a 128 x 128 bf16 tile: 32 KB
constexpr int kWgHalfBytes = kWgTileBytes / 2;      // one 64-wide half of it: 16 KB
// Q, then K and V in two stages each, plus 1 KB to align the start to the swizzle's 1024 bytes.
constexpr size_t kWgSmem = 5 * (size_t)kWgTileBytes + 1024;

__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Descriptor of an MN-major, 128-byte-swizzled operand: rows of 128 bytes (64 elements of N),
// 8-row atoms 1024 bytes apart, the next 64 elements of N `half_bytes` further. The PTX ISA's
// canonical layout for this case, ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) in elements, makes the
// leading offset the step between 64-wide N blocks and the stride offset the step between 8-row
// groups of K. Checked on H100: with the two the other way round every hd-128 case failed.
__device__ __forceinline__ uint64_t sw128_mn_descriptor(const void* tile, uint32_t half_bytes) {
    const uint64_t addr = ptx::smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((half_bytes & 0x3FFFF) >> 4) << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}

// d += A * B for a 64 x 128 x 16 step, A (bf16, the m64k16 fragment) from registers, B through
// the descriptor of an MN-major tile (N contiguous: imm-trans-b = 1); always accumulates.
__device__ __forceinline__ void wgmma_m64n128k16_rs_bf16_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p_acc, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// Where 16-byte chunk c (0..15) of row r of a 128-wide tile lives: the 64-wide half c / 8, row r
// of it, chunk c % 8 moved by the swizzle (XOR with r % 8).
__device__ __forceinline__ uint32_t wg_chunk_offset(int r, int c) {
    return (uint32_t)((c >> 3) * kWgHalfBytes + r * kWgHalf + (((c & 7) ^ (r & 7)) << 4));
}

__global__ void __launch_bounds__(kWgThreads, 1) prefill_wgmma_hd128_kernel(PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int HD = kWgHD;
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* base = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    unsigned char* Qs = base;                        // [2 halves][128 rows][128 B]
    unsigned char* Ks = base + kWgTileBytes;         // [2 stages] of the same
    unsigned char* Vs = base + 3 * kWgTileBytes;     // [2 stages]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kWgRows;
    const int kv_total = a.start_pos + a.T;
    const int kv_end = a.start_pos + min(q0 + kWgRows, a.T);
    const int n_tiles = CEIL_DIV(kv_end, kWgKV);
    const size_t slot_base = (size_t)a.slot * a.max_seq;

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.k_cache);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.v_cache);
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

    // This thread's rows: r0 = 16 w + g and r1 = r0 + 8 of its warpgroup's 64.
    const int wg_first_pos = a.start_pos + q0 + 64 * wg;
    const int wg_last_pos = wg_first_pos + 63;
    int row_pos[2];
    float row_max[2], row_sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        row_pos[h] = wg_first_pos + 16 * w + g + 8 * h;
        row_max[h] = -INFINITY;
        row_sum[h] = 0.f;
    }
    float o[64], s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
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
        if (kv0 <= wg_last_pos) {
            const unsigned char* Kst = Ks + stage * kWgTileBytes;
            const unsigned char* Vst = Vs + stage * kWgTileBytes;

            // S = Q K^T: k-step ks reads 16 columns of hd, in half ks / 4 at byte 32 (ks % 4).
            hopper::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < HD / 16; ++ks) {
                const int off = (ks >> 2) * kWgHalfBytes + (ks & 3) * 32;
                hopper::wgmma_m64n128k16_bf16(s, hopper::sw128_descriptor(q_wg + off),
                                              hopper::sw128_descriptor(Kst + off), ks > 0);
            }
            hopper::wgmma_commit();
            hopper::wgmma_wait<0>();
            hopper::fence_accumulators(s);

            // s[4i + e] is S[row h = e / 2][position kv0 + 8i + 2 t4 + e % 2].
            const bool diagonal = kv0 + kWgKV - 1 > wg_first_pos + 16 * w;
            if (diagonal) {
#pragma unroll
                for (int i = 0; i < 16; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (kv0 + 8 * i + 2 * t4 + (e & 1) > row_pos[e >> 1]) s[4 * i + e] = -INFINITY;
            }
            float alpha[2], shift[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float new_max = fmaxf(row_max[h], mx * a.scale_log2);
                shift[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
                alpha[h] = exp2f(row_max[h] - shift[h]);
                row_max[h] = new_max;
                row_sum[h] *= alpha[h];
            }
            uint32_t p[8][4];  // A fragments of the 8 k-steps of P V
#pragma unroll
            for (int i = 0; i < 16; ++i) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[4 * i + e] = exp2f(fmaf(s[4 * i + e], a.scale_log2, -shift[e >> 1]));
                    row_sum[e >> 1] += s[4 * i + e];
                }
                p[i >> 1][(i & 1) * 2 + 0] = util::pack_bf16x2(s[4 * i + 0], s[4 * i + 1]);
                p[i >> 1][(i & 1) * 2 + 1] = util::pack_bf16x2(s[4 * i + 2], s[4 * i + 3]);
            }
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                o[4 * i + 0] *= alpha[0];
                o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1];
                o[4 * i + 3] *= alpha[1];
            }

            // O += P V: k-step j covers positions 16j..16j+15, rows 16j.. of both hd halves.
            hopper::wgmma_fence();
#pragma unroll
            for (int j = 0; j < kWgKV / 16; ++j)
                wgmma_m64n128k16_rs_bf16_tb(o, p[j], sw128_mn_descriptor(Vst + j * 16 * kWgHalf, kWgHalfBytes));
            hopper::wgmma_commit();
            hopper::wgmma_wait<0>();
            hopper::fence_accumulators(o);
        }
        __syncthreads();  // the stage is overwritten by the next iteration's loads
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = q0 + 64 * wg + 16 * w + g + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
            for (int i = 0; i < 16; ++i) dst[(8 * i + 2 * t4) / 2] = util::pack_bf16x2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
        }
    }
#endif
}

void launch_wgmma_hd128(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot, int start_pos,
                        int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, int max_seq,
                        cudaStream_t stream) {
    if (head_dim != 128) {
        brrr::cuda::attention_prefill(q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                                      head_dim, max_seq, stream);
        return;
    }
    brrr::cuda::check_attention_shapes("prefill_wgmma", n_heads, n_kv_heads, head_dim, max_seq);
    if (T == 0) return;
    const PrefillArgs a = brrr::cuda::prefill_args(q, k_cache, v_cache, slot, start_pos, T, out, n_heads,
                                                   n_kv_heads, head_dim, max_seq);
    CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_hd128_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)kWgSmem));
    prefill_wgmma_hd128_kernel<<<brrr::cuda::prefill_grid(a), kWgThreads, kWgSmem, stream>>>(a);
    CUDA_CHECK_LAUNCH("prefill_wgmma_hd128_kernel");
}

}  // namespace lab
