// cuda_gemv_quant_wgmma_lab.cu — lab: the K-quant decode GEMV at 9-16 rows (or 33-64) on
// Hopper's warpgroup MMA, W decoded into the A operand's registers, x staged once per CTA in
// shared memory as the B operand (Machete's arrangement), beside the engine's gemv_quant_mma
// (mma.sync, x read by every lane from L1) in the same process: benchmarks/lab/gemv_quant_wgmma_lab.py
// builds this file into a shared library and drives both on the same repacked weights.
//
// y[m, n] = sum_k x[m, k] * Wb[n, k], W [N, K] in qlayout's Q4_K or Q6_K tiles (N a multiple of
// 64, K of 256; Q6_K's d in the tail), x [M <= NR, K] bf16, y fp32 [M, N] (or, with KS > 1 k
// slices, KS planes that add_planes sums in slice order). A lane reads and decodes its pieces as
// gemv_quant_mma does (quant_pieces.cuh, quant_decode.cuh's bf16x2), so a weight decodes to the
// same bf16. NR, the staged x rows and the wgmma's N, is 16 (m64n16k16; Q4_K only) or 64
// (m64n64k16: decode batches of 33-64 rows, where the engine runs gemm_quant).
//
// The question: at 16 rows gemv_quant_mma is bound by its x loads (each warp reads all 16 x rows
// through L1 for 16-32 W rows: L1's wavefronts, docs/kernels/gemv.md) and by the registers of the
// x fragments and of two W tiles. Here
//   * a warpgroup's 4 warps decode 64 W rows (16 each, the A fragment of wgmma.m64n16k16 is the
//     m16n8k16 A fragment of each warp's rows) and one wgmma per 16 k takes x from shared memory:
//     no x loads through the LSU, no x registers, and the MMA runs async beside the next decode;
//   * the CTA stages its k slice of x (16 rows; 128 KB at K = 4096, KS = 1) in shared memory once,
//     in the 128-byte swizzle the wgmma descriptor reads, with the k order permuted to match the
//     lanes' decode: a lane's chunk of 8 consecutive k (gemv_quant_mma's pieces and chunks, the
//     same 16-byte loads of the qlayout tile) fills mma slots 2t.. of two k16 steps, so the staging
//     puts x's k in that order;
//   * the grid is persistent: CTA c keeps slice c % KS and its warpgroups walk the 64-row blocks
//     (warpgroup w of the CTA takes blocks w C' + c', w C' + c' + WG C', .., C' = C / KS, c' = c / KS),
//     each lane holding its next W tile in registers while it decodes this one.
// Invariants: a row's sum runs in a fixed order (k steps in order within a slice, slices added in
// order), independent of M and of the other rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/hopper.cuh"
#include "cuda/ptx.cuh"
#include "cuda/quant_decode.cuh"
#include "cuda/quant_pieces.cuh"

namespace lab {

using brrr::cuda::qdec::Coef;
using brrr::cuda::qdec::chunk_bf16x2;
using brrr::cuda::qdec::scale_x2;
using brrr::cuda::qpieces::chunk_of;
using brrr::cuda::qpieces::QM;
using brrr::quant::QType;
namespace hopper = brrr::cuda::hopper;
namespace ptx = brrr::cuda::ptx;

// 64 k of NR x rows in the 128-byte swizzle: NR / 8 1024-byte atoms.
template <int NR>
__host__ __device__ constexpr int box_bytes() { return NR * 128; }

// A lane's pieces of a tile (quant_pieces.cuh, as gemv_quant_mma reads them) decoded chunk by
// chunk: chunk c of piece j as 4 bf16x2, 8 values consecutive in k from lane_k(t) + chunk_k(j, c)
// into the tile.
template <QType T>
__device__ __forceinline__ void decode_chunk(const typename QM<T>::Raw& r, int t, int j, int c, uint32_t out[4]) {
    Coef k;
    uint32_t u0, u1;
    chunk_of<T>(r, t, j, c, k, u0, u1);
    chunk_bf16x2<T>(u0, u1, scale_x2<T>(k), out);
}
// The lane t and chunk c whose chunk of piece 0 starts at 8 r into the tile (r < 16).
template <QType T>
__device__ __forceinline__ void lane_chunk(int r, int& t, int& c) {
    t = c = 0;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
            if (QM<T>::lane_k(tt) + QM<T>::chunk_k(0, cc) == 8 * r) t = tt, c = cc;
}

// d += A B for one 64 x 16 x 16 step: A (the warpgroup's 64 W rows) from registers, B (16 x rows of
// 16 k) through a K-major 128-byte-swizzle descriptor.
__device__ __forceinline__ void wgmma_m64n16k16_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p_acc, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// The same for 64 x rows: d[4 i + e] = D[16 warp + g][8 i + 2 t + e], i = 0..7.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p_acc, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
template <int NR>
__device__ __forceinline__ void wgmma_rs(float (&d)[NR / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    if constexpr (NR == 16) wgmma_m64n16k16_rs(d, a, desc_b);
    else wgmma_m64n64k16_rs(d, a, desc_b);
}

// Stages x rows [0, NR) of k slice [k0, k0 + ks) into `xs` (ks / 64 boxes), in step order: step
// s = 16 tile + 2 (4 j + c) + h holds, at slot 2t + e, x[k] for k = tile 256 + 128 j + 8 r + 4h
// + e where lane_chunk<T>(r) = (t, c), and at slot 8 + 2t + e the same k + 2. Rows past M are zero. Each
// thread asks for up to kStageLoads 16-byte pieces before it stores any, so the staging waits on
// L2 a few times, not once a piece.
constexpr int kStageLoads = 4;
template <QType T, int NR>
__device__ void stage_x(uint8_t* xs, const __nv_bfloat16* x, int M, int K, int k0, int ks) {
    constexpr int kBoxBytes = box_bytes<NR>();
    const int per_row = ks / 8, groups = NR * per_row;  // 8-value groups of the slice's NR rows
    for (int i0 = threadIdx.x; i0 < groups; i0 += kStageLoads * blockDim.x) {
        uint4 v[kStageLoads];
#pragma unroll
        for (int u = 0; u < kStageLoads; ++u) {
            const int i = i0 + u * blockDim.x, n = i / per_row;
            v[u] = make_uint4(0u, 0u, 0u, 0u);
            if (i < groups && n < M) v[u] = __ldg(reinterpret_cast<const uint4*>(x + (size_t)n * K + k0 + 8 * (i % per_row)));
        }
#pragma unroll
        for (int u = 0; u < kStageLoads; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i >= groups) break;
            const int n = i / per_row, k = 8 * (i % per_row);  // k into the slice
            const int tile = k / 256, o = k % 256, j = o / 128;
            int t, c;
            lane_chunk<T>((o % 128) >> 3, t, c);
            const uint32_t pair[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const int h = p >> 1, slot = (p & 1) * 8 + 2 * t;
                const int s = 16 * tile + 2 * (4 * j + c) + h;
                const int byte = 32 * (s & 3) + 2 * slot;
                const int chunk = (byte >> 4) ^ (n & 7);
                *reinterpret_cast<uint32_t*>(xs + (s >> 2) * kBoxBytes + n * 128 + (chunk << 4) + (byte & 15)) = pair[p];
            }
        }
    }
}

// PF: W tiles a lane holds in flight ahead of the one it decodes (1 or 2). WAIT: wgmma groups (one
// a chunk) left in flight before the next chunk's decode overwrites registers (1 or 2). STAGE =
// false skips the staging of x (timing only: wrong results), to price it.
template <QType T, int NR, int WG, int PF, int WAIT, bool STAGE>
__global__ void __launch_bounds__(WG * 128, 1)
    q4k_wgmma(const uint8_t* __restrict__ W, const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int M,
              int N, int K, int KS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int kBoxBytes = box_bytes<NR>();
    extern __shared__ uint8_t smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int g = lane >> 2, t = lane & 3;
    const int ks = K / KS, slice = blockIdx.x % KS, tiles = ks / 256, tile0 = slice * tiles;
    const int ctas = gridDim.x / KS, cta = blockIdx.x / KS;
    const int blocks = N / 64, step = WG * ctas, rb0 = wg * ctas + cta;
    using F = QM<T>;
    const int row_tiles = K / 256;
    const size_t row_stride = (size_t)row_tiles * F::kTileBytes;
    // Q6_K's fp16 d, [N, row_tiles] after the tiles (qlayout's tail); unused by Q4_K.
    const unsigned short* tail = reinterpret_cast<const unsigned short*>(W + (size_t)N * row_stride);
    float* out = y + (size_t)slice * M * N;

    // The prefetch cursor over this warpgroup's stream of tiles: block pb (rb0, rb0 + step, ..), tile
    // pt of the slice, at pp (and pd, its d); the pointers move a tile at a time and are rebuilt
    // only at a new block.
    int pb = rb0, pt = 0;
    auto row_of = [&](int b) { return (size_t)(64 * b + 16 * warp + g); };
    const uint8_t* pp = W + row_of(pb) * row_stride + (size_t)tile0 * F::kTileBytes;
    const unsigned short* pd = tail + row_of(pb) * row_tiles + tile0;
    auto fetch = [&](typename F::Raw& lo, typename F::Raw& hi) {
        if (pb < blocks) {
            lo = F::load(pp, pd, t, 256);
            hi = F::load(pp + 8 * row_stride, pd + 8 * row_tiles, t, 256);
        }
        pp += F::kTileBytes;
        ++pd;
        if (++pt == tiles) {
            pt = 0;
            pb += step;
            pp = W + row_of(pb) * row_stride + (size_t)tile0 * F::kTileBytes;
            pd = tail + row_of(pb) * row_tiles + tile0;
        }
    };
    // buf[0] the tile being decoded, buf[1 .. PF] the ones in flight (W does not wait for x).
    typename F::Raw lo[PF + 1], hi[PF + 1];
#pragma unroll
    for (int f = 0; f < PF; ++f) fetch(lo[f], hi[f]);
    if (STAGE) stage_x<T, NR>(xs, x, M, K, slice * ks, ks);
    hopper::fence_proxy_async_shared();
    __syncthreads();
    const uint64_t desc0 = hopper::sw128_descriptor(xs);

    for (int rb = rb0; rb < blocks; rb += step) {
        float acc[NR / 2];
#pragma unroll
        for (int i = 0; i < NR / 2; ++i) acc[i] = 0.f;
        for (int tile = 0; tile < tiles; ++tile) {
            fetch(lo[PF], hi[PF]);
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    uint32_t rl[4], rh[4];
                    decode_chunk<T>(lo[0], t, j, c, rl);
                    decode_chunk<T>(hi[0], t, j, c, rh);
                    const uint32_t a0[4] = {rl[0], rh[0], rl[1], rh[1]};
                    const uint32_t a1[4] = {rl[2], rh[2], rl[3], rh[3]};
                    const int s = 16 * tile + 2 * (4 * j + c);
                    const uint64_t d0 = hopper::descriptor_add(desc0, (uint32_t)((s >> 2) * (kBoxBytes / 16) + 2 * (s & 3)));
                    hopper::wgmma_fence();
                    wgmma_rs<NR>(acc, a0, d0);
                    wgmma_rs<NR>(acc, a1, hopper::descriptor_add(d0, 2));
                    hopper::wgmma_commit();
                    hopper::wgmma_wait<WAIT>();
                }
#pragma unroll
            for (int f = 0; f < PF; ++f) lo[f] = lo[f + 1], hi[f] = hi[f + 1];
        }
        hopper::wgmma_wait<0>();
        hopper::fence_accumulators(acc);
        // d[4i + e] = D[16 warp + g][8i + 2t + e], d[4i + 2 + e] = D[16 warp + g + 8][same]
        const int n = 64 * rb + 16 * warp + g;
#pragma unroll
        for (int i = 0; i < NR / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = 8 * i + 2 * t + e;
                if (m < M) {
                    out[(size_t)m * N + n] = acc[4 * i + e];
                    out[(size_t)m * N + n + 8] = acc[4 * i + 2 + e];
                }
            }
    }
#endif
}

__global__ void add_planes(const float* __restrict__ part, float* __restrict__ y, int planes, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int p = 1; p < planes; ++p) s += part[p * n + i];
        y[i] = s;
    }
}

template <QType T, int NR, int WG, int PF, int WAIT, bool STAGE>
int launch(const void* W, const void* x, float* y, float* part, int M, int N, int K, int KS, int ctas_per_sm) {
    if (M < 1 || M > NR || N % 64 || K % 256 || (K / 256) % KS) return 1;
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const size_t smem = (size_t)(K / KS) / 64 * box_bytes<NR>() + 1024;
    auto kernel = q4k_wgmma<T, NR, WG, PF, WAIT, STAGE>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) return 2;
    // Whole multiples of KS CTAs, at most one per warpgroup's worth of blocks.
    int ctas = sms * ctas_per_sm / KS * KS;
    const int need = (N / 64 + WG - 1) / WG * KS;
    if (ctas > need) ctas = need;
    float* out = KS == 1 ? y : part;
    kernel<<<ctas, WG * 128, smem>>>(static_cast<const uint8_t*>(W), static_cast<const __nv_bfloat16*>(x), out, M,
                                     N, K, KS);
    if (KS > 1) add_planes<<<2 * sms, 256>>>(part, y, KS, (size_t)M * N);
    return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

template <QType T, int NR, int WG>
int launch_form(int form, const void* W, const void* x, float* y, float* part, int M, int N, int K, int KS, int cps) {
    switch (form) {
        case 0: return launch<T, NR, WG, 1, 1, true>(W, x, y, part, M, N, K, KS, cps);
        case 1: return launch<T, NR, WG, 2, 1, true>(W, x, y, part, M, N, K, KS, cps);
        case 2: return launch<T, NR, WG, 1, 2, true>(W, x, y, part, M, N, K, KS, cps);
        case 3: return launch<T, NR, WG, 1, 1, false>(W, x, y, part, M, N, K, KS, cps);
        default: return 5;
    }
}
template <QType T, int NR>
int launch_wg(int wg, int form, const void* W, const void* x, float* y, float* part, int M, int N, int K, int ks,
              int cps) {
    switch (wg) {
        case 1: return launch_form<T, NR, 1>(form, W, x, y, part, M, N, K, ks, cps);
        case 2: return launch_form<T, NR, 2>(form, W, x, y, part, M, N, K, ks, cps);
        case 3: return launch_form<T, NR, 3>(form, W, x, y, part, M, N, K, ks, cps);
        case 4: return launch_form<T, NR, 4>(form, W, x, y, part, M, N, K, ks, cps);
        default: return 4;
    }
}

}  // namespace lab

// W: qlayout Q4_K tiles [N rows]; x bf16 [M, K]; y fp32 [M, N]; part fp32 [KS, M, N] (KS > 1);
// wg warpgroups a CTA (1..4), ks k slices, ctas_per_sm CTAs an SM asked for; form 0 (one tile
// ahead, one wgmma group left in flight), 1 (two tiles ahead), 2 (two groups in flight), 3 (form 0
// without x's staging: timing only); nr the staged x rows (16 or 64; M <= nr); type the GGML id
// (12 Q4_K; 14 Q6_K, at nr = 64 only). 0 on success.
extern "C" int q4k_wgmma_launch(const void* W, const void* x, float* y, float* part, int M, int N, int K, int wg,
                                int ks, int ctas_per_sm, int form, int nr, int type) {
    if (type == 12 && nr == 16) return lab::launch_wg<brrr::quant::QType::Q4_K, 16>(wg, form, W, x, y, part, M, N, K, ks, ctas_per_sm);
    if (type == 12 && nr == 64) return lab::launch_wg<brrr::quant::QType::Q4_K, 64>(wg, form, W, x, y, part, M, N, K, ks, ctas_per_sm);
    if (type == 14 && nr == 64) return lab::launch_wg<brrr::quant::QType::Q6_K, 64>(wg, form, W, x, y, part, M, N, K, ks, ctas_per_sm);
    return 6;
}
