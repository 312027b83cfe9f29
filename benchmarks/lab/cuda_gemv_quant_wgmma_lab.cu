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
// same bf16; the decode, the x staging, the tile stream and the wgmma steps are the engine's
// (gemv_quant_wgmma.cuh), and the slice length (512-4096 k) is a template argument as there. NR,
// the staged x rows and the wgmma's N, is 16 (m64n16k16; Q4_K only) or 64 (m64n64k16: the form
// the engine ships for decode batches of 17-64 rows).
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

#include "cuda/gemv_quant_wgmma.cuh"
#include "cuda/hopper.cuh"
#include "cuda/ptx.cuh"
#include "cuda/quant_decode.cuh"
#include "cuda/quant_pieces.cuh"

namespace lab {

using brrr::cuda::qpieces::QM;
using brrr::cuda::qwgmma::TileStream;
using brrr::quant::QType;
namespace qwgmma = brrr::cuda::qwgmma;
namespace hopper = brrr::cuda::hopper;
namespace ptx = brrr::cuda::ptx;

// 64 k of NR x rows in the 128-byte swizzle: NR / 8 1024-byte atoms.
template <int NR>
__host__ __device__ constexpr int box_bytes() { return NR * 128; }

// PF: W tiles a lane holds in flight ahead of the one it decodes (1 or 2). WAIT: wgmma groups (one
// a chunk) left in flight before the next chunk's decode overwrites registers (1 or 2). STAGE =
// false skips the staging of x (timing only: wrong results), to price it.
template <QType T, int NR, int KSLICE, int WG, int PF, int WAIT, bool STAGE>
__global__ void __launch_bounds__(WG * 128, 1)
    q4k_wgmma(const uint8_t* __restrict__ W, const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int M,
              int N, int K, int KS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int g = lane >> 2, t = lane & 3;
    constexpr int ks = KSLICE, tiles = ks / 256;  // KS = K / KSLICE slices
    const int slice = blockIdx.x % KS, tile0 = slice * tiles;
    const int ctas = gridDim.x / KS, cta = blockIdx.x / KS;
    const int blocks = N / 64, step = WG * ctas, rb0 = wg * ctas + cta;
    using F = QM<T>;
    float* out = y + (size_t)slice * M * N;
    TileStream<T> w(W, N, K, tile0, tiles, rb0, step, 16 * warp + g, t);
    // buf[0] the tile being decoded, buf[1 .. PF] the ones in flight (W does not wait for x).
    typename F::Raw lo[PF + 1], hi[PF + 1];
#pragma unroll
    for (int f = 0; f < PF; ++f) w.next(lo[f], hi[f]);
    if (STAGE) qwgmma::stage_x<T, NR, KSLICE>(xs, x, M, K, slice * ks);
    hopper::fence_proxy_async_shared();
    __syncthreads();
    const uint64_t desc0 = hopper::sw128_descriptor(xs);

    for (int rb = rb0; rb < blocks; rb += step) {
        float acc[NR / 2];
#pragma unroll
        for (int i = 0; i < NR / 2; ++i) acc[i] = 0.f;
        for (int tile = 0; tile < tiles; ++tile) {
            w.next(lo[PF], hi[PF]);
            const uint64_t desc_tile = hopper::descriptor_add(desc0, tile * qwgmma::kTileDescUnits<NR>);
#pragma unroll
            for (int j = 0; j < F::kPieces; ++j)
#pragma unroll
                for (int c = 0; c < F::kChunks; ++c)
                    qwgmma::chunk_mma<T, NR, WAIT>(acc, lo[0], hi[0], t, j, c, desc_tile);
#pragma unroll
            for (int f = 0; f < PF; ++f) lo[f] = lo[f + 1], hi[f] = hi[f + 1];
        }
        hopper::wgmma_wait<0>();
        hopper::fence_accumulators(acc);
        qwgmma::store_rows<NR>(out, acc, M, N, 64 * rb + 16 * warp + g, t);
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
    // The slice's length is the kernel's template argument (stage_x's, as in the engine).
    void (*kernel)(const uint8_t*, const __nv_bfloat16*, float*, int, int, int, int) = nullptr;
    switch (K / KS) {
        case 512: kernel = q4k_wgmma<T, NR, 512, WG, PF, WAIT, STAGE>; break;
        case 1024: kernel = q4k_wgmma<T, NR, 1024, WG, PF, WAIT, STAGE>; break;
        case 2048: kernel = q4k_wgmma<T, NR, 2048, WG, PF, WAIT, STAGE>; break;
        case 4096: kernel = q4k_wgmma<T, NR, 4096, WG, PF, WAIT, STAGE>; break;
        default: return 7;
    }
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
