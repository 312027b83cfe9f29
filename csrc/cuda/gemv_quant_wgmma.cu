// gemv_quant_wgmma.cu — decode batches of 17-64 rows on quantized weights, on Hopper's warpgroup
// MMA with W decoded into the A operand's registers: y[m, n] = sum_k x[m, k] * Wb[n, k], Wb the
// weights as gemv_quant_mma decodes them (quant_pieces.cuh's pieces, quant_decode.cuh's bf16x2).
//
//   W: 1..3 parts of qlayout tiles of the kept types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
//      Q6_K; Q6_K's fp16 d in each part's tail), each a multiple of 64 rows; K a multiple of
//      kSliceK; x [M <= 64, K] bf16, 16-byte aligned.
//   planes: fp32 [K / kSliceK, M, N] scratch (the engine lends deq_, idle at these rows).
//
// Why: gemm_quant decodes each k tile of W into a bf16 tile in shared memory that two consumer
// warpgroups meet at a barrier over, and at 17-64 rows that path, not HBM or the MMAs, sets its
// pace (docs/kernels/gemm.md, "At 17-64 rows"); the tensor-core GEMV reads all M x rows through L1
// per 16 W rows, so past 16 rows its time grows with M. Here
//   * a warpgroup's 4 warps decode 64 W rows (16 each: lane (g, t) rows g and g + 8 of its warp's
//     16, the pieces gemv_quant_mma's lane t loads) straight into the A fragments of
//     wgmma.m64nNRk16, whose B is x (NR = 32 staged rows up to M = 32, else 64): no W tile in
//     shared memory, no barrier between warpgroups, the MMA asynchronous beside the next chunk's
//     decode, each lane's next one or two W tiles in flight in registers (kTilesAhead: the W
//     stream's latency, not the decode, is what a tile waits for);
//   * K is cut into slices of kSliceK: CTA c keeps slice c % KS, stages its NR x rows of the slice
//     once (64 or 128 KB) in the 128-byte swizzle, with k permuted to the lanes' chunk order (a lane's
//     chunk of 8 consecutive k fills mma slots 2t.. of two k16 steps), and its warpgroups walk the
//     64-row blocks of W; each slice stores its partial sums into its plane;
//   * planes_epilogue adds the planes in slice order and stores, adds into the residual or
//     applies the SwiGLU; a RopeKV sums into args.out_f32 for rope_kv_append.
//   The device pieces (chunk decode, x staging, tile stream, wgmma step, stores) are
//   gemv_quant_wgmma.cuh's, which the kernel lab shares.
// Invariants: a row's sum runs in a fixed order (k in order within a slice, slices in order), the
// same whatever M, NR and the other rows are; x rows past M are staged as zeros and their outputs never
// stored. gemv_quant_wgmma_takes says which calls the kernel serves (else the engine runs the
// GEMV or gemm_quant); the launcher checks shapes and pointers before any launch.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cpu/quant.h"
#include "cuda/check.cuh"
#include "cuda/gemv_quant_wgmma.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/qlayout.h"
#include "cuda/quant_pieces.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

using qpieces::QM;
using qwgmma::TileStream;
using quant::QType;

constexpr int kMaxRows = 64;  // x rows a call: the widest wgmma's N
constexpr int kSliceK = 1024;  // k of a slice: 16 boxes of 64 k
// The x rows staged (the wgmma's N) for M rows: 32 or 64. Up to 32 rows the 32-column MMA and half
// the staging took w13 from 49.6 to 41.5 us at 17 rows (docs/kernels/gemm.md, "At 17-64 rows").
constexpr int staged_rows(int M) { return M <= 32 ? 32 : 64; }
// A slice's x: kSliceK / 64 boxes of 64 k of NR rows in the 128-byte swizzle (128 KB at 64 rows).
template <int NR>
constexpr int kStageBytes = kSliceK / 64 * NR * 128;
// Warpgroups a CTA (one CTA an SM), and the W tiles a lane has in flight while it decodes one: the
// stream of W, not the decode, sets the pace (docs/kernels/gemm.md, "At 17-64 rows"), so each type
// takes the most tiles ahead that its registers hold without spilling. Two ahead: 3 warpgroups (168
// registers) for the 32-value 4- and 5-bit types and Q4_K, 2 (255) for Q6_K, whose raw tile is
// wider. One: Q8_0 and Q5_K at 3, which lost with two (Q8_0 at 2 warpgroups 1.09-1.21x slower).
template <QType T>
constexpr int kWarpgroups = T == QType::Q6_K ? 2 : 3;
template <QType T>
constexpr int kTilesAhead = T == QType::Q8_0 || T == QType::Q5_K ? 1 : 2;

// One part's partial sums: planes[slice][m][n] for its rows n (planes already offset to the
// part's first column; ld the matrix's N, plane the floats between planes). The grid is a
// multiple of KS CTAs; CTA c takes slice c % KS and walks 64-row blocks c / KS, + C / KS, ...,
// warpgroup w starting w C / KS further.
template <QType T, int NR>
__global__ void __launch_bounds__(kWarpgroups<T> * 128, 1)
    gemv_quant_wgmma_kernel(const uint8_t* __restrict__ W, const bf16* __restrict__ x, float* __restrict__ planes,
                            int M, int rows, int K, int ld, size_t plane) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using F = QM<T>;
    constexpr int WG = kWarpgroups<T>, A = kTilesAhead<T>;
    constexpr int kTilesPerSlice = kSliceK / 256;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int g = lane >> 2, t = lane & 3;
    const int KS = K / kSliceK, slice = blockIdx.x % KS, tile0 = slice * kTilesPerSlice;
    const int ctas = gridDim.x / KS, cta = blockIdx.x / KS;
    const int blocks = rows / 64, step = WG * ctas, rb0 = wg * ctas + cta;
    float* out = planes + (size_t)slice * plane;
    TileStream<T> w(W, rows, K, tile0, kTilesPerSlice, rb0, step, 16 * warp + g, t);
    // [0] the tile being decoded, [1..A] the next ones, in flight during the decode.
    typename F::Raw lo[A + 1], hi[A + 1];
#pragma unroll
    for (int a = 0; a < A; ++a) w.next(lo[a], hi[a]);
    qwgmma::stage_x<T, NR, kSliceK>(xs, x, M, K, slice * kSliceK);
    hopper::fence_proxy_async_shared();
    __syncthreads();
    const uint64_t desc0 = hopper::sw128_descriptor(xs);

    for (int rb = rb0; rb < blocks; rb += step) {
        float acc[NR / 2];
#pragma unroll
        for (int i = 0; i < NR / 2; ++i) acc[i] = 0.f;
        // The loop walks the tile's descriptor itself (not a tile index it would scale): ptxas then
        // keeps it in a uniform register, with no R2UR between the wgmma.
        constexpr uint32_t kStep = qwgmma::kTileDescUnits<NR>;
        const uint32_t desc_end = (uint32_t)desc0 + kTilesPerSlice * kStep;
        for (uint64_t desc_tile = desc0; (uint32_t)desc_tile != desc_end;
             desc_tile = hopper::descriptor_add(desc_tile, kStep)) {
            w.next(lo[A], hi[A]);
#pragma unroll
            for (int j = 0; j < F::kPieces; ++j)
#pragma unroll
                for (int c = 0; c < F::kChunks; ++c)
                    qwgmma::chunk_mma<T, NR, 1>(acc, lo[0], hi[0], t, j, c, desc_tile);
#pragma unroll
            for (int a = 0; a < A; ++a) lo[a] = lo[a + 1], hi[a] = hi[a + 1];
        }
        hopper::wgmma_wait<0>();
        hopper::fence_accumulators(acc);
        qwgmma::store_rows<NR>(out, acc, M, ld, 64 * rb + 16 * warp + g, t);
    }
#else
    __trap();  // built without sm_90a: the host never launches this (gemm_quant_available)
#endif
}

// y[m, n] = the sum of planes[0..KS)[m, n] in plane order, through the epilogue: stored (StoreF32,
// StoreBf16) at m ld_out + n or added into the residual there (AddResidual); SwiGLU (H = N / 2)
// out_bf16[m H + j] = swiglu(y[m, j], y[m, H + j]), packed as swiglu_f32 stores it and through the
// same util::store_swiglu. A thread takes 4 consecutive n (N is a multiple of 64) and asks for 4
// planes before it adds them, so that loads, not their latency one after another, set the pace.
__device__ __forceinline__ void add4(float4& y, const float4& p) { y.x += p.x, y.y += p.y, y.z += p.z, y.w += p.w; }

__device__ __forceinline__ float4 sum_planes(const float4* p, int KS, size_t plane4) {
    float4 y = __ldcs(p);
    int s = 1;
    for (; s + 4 <= KS; s += 4) {
        const float4 a = __ldcs(p + s * plane4), b = __ldcs(p + (s + 1) * plane4);
        const float4 c = __ldcs(p + (s + 2) * plane4), d = __ldcs(p + (s + 3) * plane4);
        add4(y, a), add4(y, b), add4(y, c), add4(y, d);
    }
    for (; s < KS; ++s) add4(y, __ldcs(p + s * plane4));
    return y;
}

__global__ void planes_epilogue_kernel(const float* __restrict__ planes, int KS, size_t plane, int M, int N,
                                       Epilogue ep, EpilogueArgs a, int ld_out) {
    const int cols = ep == Epilogue::SwiGLU ? N / 2 : N;
    const size_t total4 = (size_t)M * cols / 4, plane4 = plane / 4;
    const float4* p4 = reinterpret_cast<const float4*>(planes);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total4; i += (size_t)gridDim.x * blockDim.x) {
        const size_t m = 4 * i / cols, n = 4 * i % cols;
        const float4* p = p4 + (m * N + n) / 4;
        const float4 y = sum_planes(p, KS, plane4);
        const float ys[4] = {y.x, y.y, y.z, y.w};
        if (ep == Epilogue::SwiGLU) {
            const float4 up = sum_planes(p + cols / 4, KS, plane4);
            const float us[4] = {up.x, up.y, up.z, up.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) util::store_swiglu(a, 4 * i + e, ys[e], us[e]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) util::store_result(ep, a, m * ld_out + n + e, ys[e]);
        }
    }
}

template <QType T, int NR>
void launch_part(const GemmWeightPart& w, const bf16* x, float* planes, int M, int N, int K, size_t plane, int sms,
                 cudaStream_t stream) {
    constexpr int WG = kWarpgroups<T>;
    const int KS = K / kSliceK;
    const int need = CEIL_DIV(w.rows / 64, WG) * KS;
    const int grid = std::min(sms / KS * KS, need);
    const size_t smem = kStageBytes<NR> + 1024;
    auto kernel = gemv_quant_wgmma_kernel<T, NR>;
    allow_dynamic_smem(kernel, smem);
    kernel<<<grid, WG * 128, smem, stream>>>(static_cast<const uint8_t*>(w.data), x, planes + w.row0, M, w.rows, K,
                                             N, plane);
    CUDA_CHECK_LAUNCH("gemv_quant_wgmma_kernel");
}

template <QType T>
struct LaunchPart {  // qlayout::by_type's Fn
    static void run(const GemmWeightPart& w, const bf16* x, float* planes, int M, int N, int K, size_t plane, int sms,
                    cudaStream_t stream) {
        if (staged_rows(M) == 32) launch_part<T, 32>(w, x, planes, M, N, K, plane, sms, stream);
        else launch_part<T, 64>(w, x, planes, M, N, K, plane, sms, stream);
    }
};

}  // namespace

size_t gemv_quant_wgmma_plane_floats(int M, int N, int K) { return (size_t)(K / kSliceK) * M * N; }

bool gemv_quant_wgmma_takes(const GemmWeightPart* parts, int n_parts, int M, int N, int K, size_t plane_floats) {
    if (M <= tuning::kGemvMaxRows || M > kMaxRows || K % kSliceK != 0 || K / kSliceK > device_facts().sm_count)
        return false;
    if (gemv_quant_wgmma_plane_floats(M, N, K) > plane_floats) return false;
    long long units = 0;  // work items: 64-row blocks x slices
    for (int i = 0; i < n_parts; ++i) {
        if (!qlayout::has_layout(parts[i].type) || parts[i].rows % 64 != 0) return false;
        units += (long long)(parts[i].rows / 64) * (K / kSliceK);
    }
    return units >= tuning::kGemvQuantWgmmaMinUnits;
}

void gemv_quant_wgmma(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep,
                      const EpilogueArgs& args, float* planes, size_t plane_floats, cudaStream_t stream) {
    BRRR_CHECK(parts != nullptr && n_parts >= 1 && n_parts <= kMaxWeightParts,
               "gemv_quant_wgmma: W must come as 1 to " << kMaxWeightParts << " parts, got " << n_parts);
    BRRR_CHECK(M >= 1 && M <= kMaxRows && N >= 1 && K >= kSliceK && K % kSliceK == 0,
               "gemv_quant_wgmma: M=" << M << ", N=" << N << ", K=" << K << " (M in [1, " << kMaxRows
                                      << "], K a positive multiple of " << kSliceK << ")");
    BRRR_CHECK(K / kSliceK <= device_facts().sm_count,
               "gemv_quant_wgmma: K=" << K << " takes more slices than the GPU has SMs");
    int next_row = 0;
    for (int i = 0; i < n_parts; ++i) {
        const GemmWeightPart& w = parts[i];
        BRRR_CHECK(qlayout::has_layout(w.type) && w.row0 == next_row && w.rows >= 64 && w.rows % 64 == 0 && w.data != nullptr &&
                       util::aligned_to(w.data, 16),
                   "gemv_quant_wgmma: part " << i << " (type " << w.type << ", rows [" << w.row0 << ", "
                                             << w.row0 + w.rows << ")) must be tiles of a kept quantized type "
                                             << "(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on 16-byte "
                                             << "aligned memory, a multiple of 64 rows, the parts covering [0, N) "
                                             << "in order");
        next_row += w.rows;
    }
    BRRR_CHECK(next_row == N, "gemv_quant_wgmma: the parts hold " << next_row << " rows, N=" << N);
    BRRR_CHECK(x != nullptr && util::aligned_to(x, 16), "gemv_quant_wgmma: x must be 16-byte aligned");
    const size_t plane = (size_t)M * N;
    BRRR_CHECK(planes != nullptr && util::aligned_to(planes, 16),
               "gemv_quant_wgmma: the planes must be 16-byte aligned device memory");
    BRRR_CHECK(gemv_quant_wgmma_plane_floats(M, N, K) <= plane_floats,
               "gemv_quant_wgmma: the planes need " << gemv_quant_wgmma_plane_floats(M, N, K) << " floats, got "
                                                    << plane_floats);
    const int ld = args.ld_out ? args.ld_out : N;
    switch (ep) {
        case Epilogue::StoreF32: BRRR_CHECK(args.out_f32, "gemv_quant_wgmma: StoreF32 needs out_f32"); break;
        case Epilogue::StoreBf16: BRRR_CHECK(args.out_bf16, "gemv_quant_wgmma: StoreBf16 needs out_bf16"); break;
        case Epilogue::AddResidual: BRRR_CHECK(args.residual, "gemv_quant_wgmma: AddResidual needs residual"); break;
        case Epilogue::SwiGLU:
            BRRR_CHECK(args.out_bf16 && N % 2 == 0, "gemv_quant_wgmma: SwiGLU needs out_bf16 and an even N");
            break;
        case Epilogue::RopeKV:
            BRRR_CHECK(args.out_f32, "gemv_quant_wgmma: RopeKV stages q|k|v in args.out_f32 [M, N]; got null");
            break;
    }
    BRRR_CHECK(ld >= N || ep == Epilogue::SwiGLU || ep == Epilogue::RopeKV,
               "gemv_quant_wgmma: ld_out=" << ld << " is less than N=" << N);
    const int sms = device_facts().sm_count;
    for (int i = 0; i < n_parts; ++i)
        qlayout::by_type<LaunchPart>(parts[i].type, parts[i], x, planes, M, N, K, plane, sms, stream);
    // The planes' sum through the epilogue; a RopeKV finishes from the fp32 [M, N] sum in
    // args.out_f32 as the GEMV's staged parts do (rope_kv_append).
    const int KS = K / kSliceK;
    const int threads = 256, blocks = (int)std::min<size_t>(CEIL_DIV(plane / 4, (size_t)threads), 8 * (size_t)sms);
    const Epilogue sum_ep = ep == Epilogue::RopeKV ? Epilogue::StoreF32 : ep;
    const int sum_ld = ep == Epilogue::RopeKV ? N : ld;
    planes_epilogue_kernel<<<blocks, threads, 0, stream>>>(planes, KS, plane, M, N, sum_ep, args, sum_ld);
    CUDA_CHECK_LAUNCH("planes_epilogue_kernel");
    if (ep == Epilogue::RopeKV) rope_kv_append(args.out_f32, args.rope, M, stream);
}

}  // namespace cuda
}  // namespace brrr
