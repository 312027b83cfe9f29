// attention_prefill_wgmma.cuh — variants 14-17 of the prefill attention lab: the causal prefill at
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
// The two warpgroups step through the tiles together (a CTA barrier per tile). hd 64 runs the
// shipped kernel. H100 (run O, benchmarks/results/h100-sxm/attention_prefill_lab/): 0 failures
// in 144 cases; Llama-3-8B heads 133 / 323 / 380 / 393 TF/s at 512 / 2048 / 8192 / 16384 tokens,
// 1.44 / 1.13 / 1.09 / 1.23x the shipped mma.sync kernel.
//
// Variants 15-19 (written after run O, not yet run) take the next steps of FlashAttention-3: a
// producer warpgroup loads Q, K and V by TMA into a ring of 2 or 3 slots with full / empty
// mbarriers (the GEMM's pipeline), and the two consumer warpgroups run independently, so one's
// softmax overlaps the other's MMAs; in 17 each warpgroup's softmax of a 64-position block also
// overlaps its own previous block's P V; 18 and 19 are 16 and 17 with the two warpgroups taking
// turns on the tensor cores (ping-pong, named barriers).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

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

// Arrive at named barrier `id` without waiting; `threads` counts those that sync plus those that arrive.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
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

// d (+)= A * B^T for a 64 x 64 x 16 step, A and B through descriptors of K-major tiles (the
// N = 64 sibling of hopper::wgmma_m64n128k16_bf16; accumulate = 0 overwrites).
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p_acc, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Where 16-byte chunk c (0..15) of row r of a 128-wide tile lives: the 64-wide half c / 8, row r
// of it, chunk c % 8 moved by the swizzle (XOR with r % 8): what a TMA box of 64 x rows in the
// 128-byte swizzle writes.
__device__ __forceinline__ uint32_t wg_chunk_offset(int r, int c) {
    return (uint32_t)((c >> 3) * kWgHalfBytes + r * kWgHalf + (((c & 7) ^ (r & 7)) << 4));
}

// The online-softmax state of a warpgroup's 64 query rows; this thread holds rows r0 = 16 w + g
// and r1 = r0 + 8 (w the warp in the warpgroup, g = lane / 4) and, in o[4i + e], O[row e / 2]
// [hd column 8i + 2 t4 + e % 2] (the wgmma accumulator layout).
struct WgRows {
    int row_pos[2];  // cache position of rows r0, r1
    float row_max[2], row_sum[2];  // max in log2 units; sum is this thread's share of the row
    float o[64];
};

__device__ __forceinline__ void wg_rows_init(WgRows& st, int warp_first_pos, int g) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        st.row_pos[h] = warp_first_pos + g + 8 * h;
        st.row_max[h] = -INFINITY;
        st.row_sum[h] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) st.o[i] = 0.f;
}

// The pieces of one block of N = 128 or 64 KV positions from kv0 for a warpgroup. q_wg: its 64 Q
// rows; Kst / Vst: the block's first K and V rows (each two swizzled 64-wide halves, kWgHalfBytes
// apart). The issue_* functions only issue and commit a wgmma group; the caller waits.

// S = Q K^T: k-step ks reads 16 columns of hd, in half ks / 4 at byte 32 (ks % 4).
template <int N>
__device__ __forceinline__ void wg_issue_s(float (&s)[N / 2], const unsigned char* q_wg, const unsigned char* Kst) {
#pragma unroll
    for (int ks = 0; ks < kWgHD / 16; ++ks) {
        const int off = (ks >> 2) * kWgHalfBytes + (ks & 3) * 32;
        const uint64_t a = hopper::sw128_descriptor(q_wg + off), b = hopper::sw128_descriptor(Kst + off);
        if constexpr (N == 128) hopper::wgmma_m64n128k16_bf16(s, a, b, ks > 0);
        else wgmma_m64n64k16_bf16(s, a, b, ks > 0);
    }
    hopper::wgmma_commit();
}

// O += P V: k-step j covers positions 16j..16j+15, rows 16j.. of both hd halves.
template <int N>
__device__ __forceinline__ void wg_issue_pv(float (&o)[64], const uint32_t (&p)[N / 16][4], const unsigned char* Vst) {
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
        wgmma_m64n128k16_rs_bf16_tb(o, p[j], sw128_mn_descriptor(Vst + j * 16 * kWgHalf, kWgHalfBytes));
    hopper::wgmma_commit();
}

// The causal mask and the online softmax on a finished S: s becomes P (fp32, relative to the new
// row max), the row statistics move on, alpha is what O must be scaled by before P V is added.
// s[4i + e] is S[row e / 2][position kv0 + 8i + 2 t4 + e % 2].
template <int N>
__device__ __forceinline__ void wg_softmax(WgRows& st, float (&s)[N / 2], int kv0, int warp_first_pos, int t4,
                                           float scale_log2, float (&alpha)[2]) {
    if (kv0 + N - 1 > warp_first_pos) {
#pragma unroll
        for (int i = 0; i < N / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (kv0 + 8 * i + 2 * t4 + (e & 1) > st.row_pos[e >> 1]) s[4 * i + e] = -INFINITY;
    }
    float shift[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < N / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(st.row_max[h], mx * scale_log2);
        shift[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
        alpha[h] = exp2f(st.row_max[h] - shift[h]);
        st.row_max[h] = new_max;
        st.row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * i + e] = exp2f(fmaf(s[4 * i + e], scale_log2, -shift[e >> 1]));
            st.row_sum[e >> 1] += s[4 * i + e];
        }
    }
}

// P as the A fragments of the N / 16 k-steps of P V: the S accumulators of positions
// 16j..16j+15 are k-step j's fragment (the layouts coincide).
template <int N>
__device__ __forceinline__ void wg_pack_p(const float (&s)[N / 2], uint32_t (&p)[N / 16][4]) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
        p[i >> 1][(i & 1) * 2 + 0] = util::pack_bf16x2(s[4 * i + 0], s[4 * i + 1]);
        p[i >> 1][(i & 1) * 2 + 1] = util::pack_bf16x2(s[4 * i + 2], s[4 * i + 3]);
    }
}

__device__ __forceinline__ void wg_rescale_o(WgRows& st, const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        st.o[4 * i + 0] *= alpha[0];
        st.o[4 * i + 1] *= alpha[0];
        st.o[4 * i + 2] *= alpha[1];
        st.o[4 * i + 3] *= alpha[1];
    }
}

struct NoHook {
    __device__ __forceinline__ void operator()() const {}
};

// One tile start to finish: returns with every wgmma complete, so its shared memory may be reused.
// after_issue_s runs once S = Q K^T is on its way (18 hands the tensor cores to the other warpgroup
// there).
template <class AfterIssueS = NoHook>
__device__ __forceinline__ void wg_attend_tile(WgRows& st, const unsigned char* q_wg, const unsigned char* Kst,
                                               const unsigned char* Vst, int kv0, int warp_first_pos, int t4,
                                               float scale_log2, AfterIssueS after_issue_s = {}) {
    float s[64], alpha[2];
    uint32_t p[8][4];
    hopper::wgmma_fence();
    wg_issue_s<128>(s, q_wg, Kst);
    after_issue_s();
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(s);
    wg_softmax<128>(st, s, kv0, warp_first_pos, t4, scale_log2, alpha);
    wg_pack_p<128>(s, p);
    wg_rescale_o(st, alpha);
    hopper::wgmma_fence();
    wg_issue_pv<128>(st.o, p, Vst);
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(st.o);
}

// O / l of rows r0, r1 into out, rows past T skipped.
__device__ __forceinline__ void wg_store_rows(WgRows& st, const PrefillArgs& a, int row0, int hq, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = st.row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * kWgHD);
#pragma unroll
            for (int i = 0; i < 16; ++i)
                dst[(8 * i + 2 * t4) / 2] = util::pack_bf16x2(st.o[4 * i + 2 * h] * inv, st.o[4 * i + 2 * h + 1] * inv);
        }
    }
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

    const int wg_first_pos = a.start_pos + q0 + 64 * wg;
    const int warp_first_pos = wg_first_pos + 16 * w;
    WgRows st;
    wg_rows_init(st, warp_first_pos, g);
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
            wg_attend_tile(st, q_wg, Ks + stage * kWgTileBytes, Vs + stage * kWgTileBytes, kv0, warp_first_pos, t4,
                           a.scale_log2);
        __syncthreads();  // the stage is overwritten by the next iteration's loads
    }
    wg_store_rows(st, a, q0 + 64 * wg + 16 * w + g, hq, t4);
#endif
}

// The launchers of 14-17: hd 64 goes to the shipped kernel; at hd 128 the shapes are checked and,
// unless T = 0, launch_hd128 gets the kernel arguments.
template <class LaunchHd128>
void launch_at_hd128(const char* op, const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot,
                     int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, int max_seq,
                     cudaStream_t stream, LaunchHd128 launch_hd128) {
    if (head_dim != 128) {
        brrr::cuda::attention_prefill(q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                                      head_dim, max_seq, stream);
        return;
    }
    brrr::cuda::check_attention_shapes(op, n_heads, n_kv_heads, head_dim, max_seq);
    if (T == 0) return;
    launch_hd128(brrr::cuda::prefill_args(q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                                          head_dim, max_seq));
}

void launch_wgmma_hd128(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot, int start_pos,
                        int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, int max_seq,
                        cudaStream_t stream) {
    launch_at_hd128("prefill_wgmma", q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                    head_dim, max_seq, stream, [&](const PrefillArgs& a) {
        CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_hd128_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)kWgSmem));
        prefill_wgmma_hd128_kernel<<<brrr::cuda::prefill_grid(a), kWgThreads, kWgSmem, stream>>>(a);
        CUDA_CHECK_LAUNCH("prefill_wgmma_hd128_kernel");
    });
}

// ---- 15-19: a producer warpgroup loads by TMA, the two consumers run independently ---------------
//
// Warpgroup 0 is the producer: one thread issues the TMA copies of Q (once) and of each KV tile's
// K and V into a ring of STAGES slots; warpgroups 1 and 2 consume, 64 query rows each. Slot s has
// two barriers, as in the GEMM (gemm.cu): full[s] completes when its 64 KB have landed, empty[s]
// when the 8 consumer warps are done with it (a warpgroup whose rows end before the tile arrives
// without computing). The consumers never wait for each other, so one's softmax overlaps the
// other's MMAs, and the loads run ahead by STAGES - 1 tiles. TMA zero-fills the rows past T and
// past the filled cache (the maps end there), so nothing outside is read. PIPELINED (17) also
// overlaps within a warpgroup: a 64-position block's softmax runs while the previous block's P V
// is on the tensor cores (FlashAttention-3's intra-warpgroup overlap). It works in half tiles:
// with whole 128-position blocks ptxas spilled 252 bytes and serialized the wgmmas (C7512) though
// it did use registers past the 168 of the kernel's entry (up to R186; setmaxnreg is honoured: a
// toy kernel reaches R207), at a 40 / 232 and a 24 / 240 producer / consumer split alike.
// PINGPONG (18, 19) orders the two consumers' MMAs, FlashAttention-3's ping-pong: left alone the
// two can drift into step and run their softmaxes at the same time, leaving the tensor cores idle.
constexpr int kWsThreads = 384;

// The turns of PINGPONG: consumer c waits for its turn at named barrier kTurnBarrier + c and, its
// MMAs issued, opens the other's turn with an arrival there. Both take the same number of turns
// (rounds with nothing to issue included: the lower warpgroup's rows end a tile early), consumer 1
// opens consumer 0's first turn and none after its own last, so every arrival meets its wait. That
// matters twice over: a barrier must not be left half-arrived at exit, and a second arrival before
// the other's wait would complete the barrier for the wrong round. (Without PINGPONG, no-ops.)
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2; 0 is __syncthreads
template <bool ON>
struct TurnOrder {
    int me, turns_left;
    __device__ __forceinline__ TurnOrder(int consumer, int turns) : me(consumer), turns_left(turns) {
        if (ON && me == 1) named_barrier_arrive(kTurnBarrier, 256);
    }
    __device__ __forceinline__ void take() const {
        if constexpr (ON) hopper::named_barrier_sync(kTurnBarrier + me, 256);
    }
    __device__ __forceinline__ void pass() {
        if constexpr (ON) {
            if (--turns_left > 0 || me == 0) named_barrier_arrive(kTurnBarrier + 1 - me, 256);
        }
    }
};
template <int STAGES>
constexpr size_t ws_smem_bytes() {
    return (size_t)kWgTileBytes * (1 + 2 * STAGES) + (1 + 2 * STAGES) * sizeof(uint64_t) + 1024;
}

template <int STAGES, bool PIPELINED, bool PINGPONG>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_wgmma_ws_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map, PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // 64K registers per SM: producer 128 x 40 + consumers 256 x 232 = 64512 (the GEMM's split).
    constexpr int kProducerRegs = 40, kConsumerRegs = 232;
    constexpr int kStageBytes = 2 * kWgTileBytes;  // K, then V
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* base = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    unsigned char* Qs = base;
    unsigned char* ring = base + kWgTileBytes;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(ring + STAGES * kStageBytes);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + STAGES;
    if (threadIdx.x == 0) {
        hopper::mbarrier_init(q_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            hopper::mbarrier_init(full + s, 1);
            hopper::mbarrier_init(empty + s, 8);
        }
        hopper::fence_barrier_init();
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / 128;
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kWgRows;
    const int kv_end = a.start_pos + min(q0 + kWgRows, a.T);
    const int n_tiles = CEIL_DIV(kv_end, kWgKV);

    if (warpgroup == 0) {
        hopper::regs_decrease<kProducerRegs>();
        if (threadIdx.x == 0) {
            hopper::prefetch_tensor_map(&q_map);
            hopper::prefetch_tensor_map(&k_map);
            hopper::prefetch_tensor_map(&v_map);
            hopper::mbarrier_arrive_expect_tx(q_full, kWgTileBytes);
            hopper::tma_load_2d(Qs, &q_map, hq * kWgHD, q0, q_full);
            hopper::tma_load_2d(Qs + kWgHalfBytes, &q_map, hq * kWgHD + 64, q0, q_full);
            int stage = 0;
            uint32_t phase = 0;
            for (int kt = 0; kt < n_tiles; ++kt) {
                hopper::mbarrier_wait(empty + stage, phase ^ 1);
                unsigned char* k = ring + stage * kStageBytes;
                unsigned char* v = k + kWgTileBytes;
                const int col = kvh * kWgHD, p0 = kt * kWgKV;
                hopper::mbarrier_arrive_expect_tx(full + stage, kStageBytes);
                hopper::tma_load_2d(k, &k_map, col, p0, full + stage);
                hopper::tma_load_2d(k + kWgHalfBytes, &k_map, col + 64, p0, full + stage);
                hopper::tma_load_2d(v, &v_map, col, p0, full + stage);
                hopper::tma_load_2d(v + kWgHalfBytes, &v_map, col + 64, p0, full + stage);
                if (++stage == STAGES) {
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
        WgRows st;
        wg_rows_init(st, warp_first_pos, g);
        const unsigned char* q_wg = Qs + 64 * consumer * kWgHalf;
        hopper::mbarrier_wait(q_full, 0);
        int stage = 0;
        uint32_t phase = 0;
        auto next_slot = [&] {
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        };
        auto release = [&](int slot) {
            if (lane == 0) hopper::mbarrier_arrive(empty + slot);
        };
        // The tiles this warpgroup computes: those that start at or before its last row.
        const int n_mine = min(n_tiles, (wg_first_pos + 63) / kWgKV + 1);
        // Issue rounds: one per tile; PIPELINED, one per 64-position block plus the last P V.
        constexpr int kRoundsPerTile = PIPELINED ? 2 : 1;
        TurnOrder<PINGPONG> turns(consumer, kRoundsPerTile * n_tiles + (PIPELINED ? 1 : 0));
        if constexpr (!PIPELINED) {
            for (int kt = 0; kt < n_mine; ++kt) {
                hopper::mbarrier_wait(full + stage, phase);
                const unsigned char* k = ring + stage * kStageBytes;
                turns.take();
                wg_attend_tile(st, q_wg, k, k + kWgTileBytes, kt * kWgKV, warp_first_pos, t4, a.scale_log2,
                               [&] { turns.pass(); });
                release(stage);
                next_slot();
            }
        } else {
            // In 64-position halves of the tiles (sub-block u = half u % 2 of tile u / 2): sub-block
            // u's S = Q K^T is issued together with sub-block u-1's O += P V; once S is done its
            // softmax runs while P V is still on the tensor cores, then O is rescaled and P packed
            // for the next round. Halves keep S, P and O within ptxas's 168 registers (whole tiles
            // spilled); a tile's slot is released when its second half's P V has finished. Block 0
            // is peeled off: a wgmma issued under a branch makes ptxas serialize them all (C7520).
            constexpr int kSub = 64;
            float s[kSub / 2], alpha[2];
            uint32_t p[kSub / 16][4];
            const int n_sub = 2 * n_mine;
            auto k_rows = [&](int slot, int u) { return ring + slot * kStageBytes + (u & 1) * kSub * kWgHalf; };
            int cur = stage;  // the slot of sub-block u
            hopper::mbarrier_wait(full + cur, phase);
            next_slot();
            turns.take();
            hopper::wgmma_fence();
            wg_issue_s<kSub>(s, q_wg, k_rows(cur, 0));
            turns.pass();
            hopper::wgmma_wait<0>();
            hopper::fence_accumulators(s);
            wg_softmax<kSub>(st, s, 0, warp_first_pos, t4, a.scale_log2, alpha);
            wg_pack_p<kSub>(s, p);  // O is still zero: nothing to rescale
            for (int u = 1; u < n_sub; ++u) {
                const int prev = cur;  // the slot of sub-block u - 1
                if ((u & 1) == 0) {
                    cur = stage;
                    hopper::mbarrier_wait(full + cur, phase);
                    next_slot();
                }
                turns.take();
                hopper::wgmma_fence();
                wg_issue_s<kSub>(s, q_wg, k_rows(cur, u));
                wg_issue_pv<kSub>(st.o, p, k_rows(prev, u - 1) + kWgTileBytes);
                turns.pass();
                hopper::wgmma_wait<1>();  // S done; P V may still run
                hopper::fence_accumulators(s);
                wg_softmax<kSub>(st, s, u * kSub, warp_first_pos, t4, a.scale_log2, alpha);
                hopper::wgmma_wait<0>();
                hopper::fence_accumulators(st.o);
                if ((u & 1) == 0) release(prev);  // sub-block u - 1 finished its tile
                wg_rescale_o(st, alpha);
                wg_pack_p<kSub>(s, p);
            }
            turns.take();
            hopper::wgmma_fence();
            wg_issue_pv<kSub>(st.o, p, k_rows(cur, n_sub - 1) + kWgTileBytes);
            turns.pass();
            hopper::wgmma_wait<0>();
            hopper::fence_accumulators(st.o);
            release(cur);
        }
        // Tiles past this warpgroup's rows: handed back unread (the other warpgroup needs them), their
        // turns taken empty.
        for (int kt = n_mine; kt < n_tiles; ++kt) {
            hopper::mbarrier_wait(full + stage, phase);
            release(stage);
            next_slot();
            for (int r = 0; r < kRoundsPerTile; ++r) {
                turns.take();
                turns.pass();
            }
        }
        wg_store_rows(st, a, q0 + 64 * consumer + 16 * w + g, hq, t4);
    }
#endif
}

// The driver's tensor-map encoder, found through the runtime (as gemm.cu finds it).
PFN_cuTensorMapEncodeTiled_v12000 lab_tensor_map_encoder() {
    static const auto encoder = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        BRRR_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "no cuTensorMapEncodeTiled in this driver");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return encoder;
}

// [rows, cols] bf16 row-major, boxes of 64 columns x 128 rows in the 128-byte swizzle; rows past
// `rows` read as zeros. gemm.cu's make_tensor_map with 128-row boxes; a copy, since the lab does
// not build gemm.cu (a shared one belongs in csrc/ once a TMA attention kernel moves there).
CUtensorMap box64x128_map(const bf16* base, int rows, int cols) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * sizeof(bf16)};
    const cuuint32_t box[2] = {64, 128};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = lab_tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base),
                                                dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    BRRR_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error " << (int)r << ")");
    return map;
}

template <int STAGES, bool PIPELINED, bool PINGPONG = false>
void launch_wgmma_ws_hd128(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot, int start_pos,
                           int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, int max_seq,
                           cudaStream_t stream) {
    launch_at_hd128("prefill_wgmma_ws", q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                    head_dim, max_seq, stream, [&](const PrefillArgs& a) {
        // Q as [T, Hq * hd]; this slot's K and V as [filled positions, Hkv * hd].
        const int kv_row = n_kv_heads * head_dim;
        const size_t slot_offset = (size_t)slot * max_seq * kv_row;
        const CUtensorMap q_map = box64x128_map(q, T, n_heads * head_dim);
        const CUtensorMap k_map = box64x128_map(k_cache + slot_offset, start_pos + T, kv_row);
        const CUtensorMap v_map = box64x128_map(v_cache + slot_offset, start_pos + T, kv_row);
        auto kernel = prefill_wgmma_ws_kernel<STAGES, PIPELINED, PINGPONG>;
        constexpr size_t smem = ws_smem_bytes<STAGES>();
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<brrr::cuda::prefill_grid(a), kWsThreads, smem, stream>>>(q_map, k_map, v_map, a);
        CUDA_CHECK_LAUNCH("prefill_wgmma_ws_kernel");
    });
}

}  // namespace lab
