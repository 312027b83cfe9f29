// cuda_gemv_lab.cu — the decode GEMV y[m, n] = sum_k x[m, k] W[n, k] for M = 1..16 rows: the
// engine's CUDA-core kernel (gemv.cu) against a tensor-core one.
//
// Why: the engine's GEMV forms each product on the CUDA cores. At M = 1 that is far below what
// the weight stream allows, but every row of x multiplies the whole of W again, so at M = 16 the
// FMAs (plus the bf16 unpacking) take about as long as streaming W, and batched decode pays for
// both (kernels.json "switch": 52.6 us for the 1B w13 at M = 16, 26 us at M = 4, 24 at M = 1).
// mma.sync m16n8k16 does 16 rows x 8 columns x 16 k in one instruction.
//
// The trick that makes the MMA a streaming kernel: a dot product does not care in which order k
// is summed, so k may be permuted, the same way in A (x) and B (W). Lane (g, t) of a warp loads
// 16 bytes, k = 8t .. 8t + 7 of W row g (8 rows x 64 contiguous bytes per warp instruction), and
// that load *is* its B fragment for two MMAs (k pairs 8t+0/1 and 8t+2/3 as the fragment's k pairs
// 2t/2t+1 and 2t+8/9, then 8t+4..7 the same way); x rows g and g + 8 are loaded at the same k and
// split identically into the A fragments. No shared memory, no shuffles, no reduction across
// lanes: the MMA sums over k inside the instruction.
//
// The accumulation order of row m never depends on the other rows (they are other rows of A), so
// row m of a batch is bit-identical to the same row alone: what the engine's batched decode
// promises. The check below verifies it.
//
//   09, 10      05 and 07 launched with PDL like 01: the first W loads before the wait, the next
//               step's W loads in flight during this step's MMAs. Not yet run on a GPU.
//   variant 01  gemv_bf16, the engine's kernel (StoreF32), launched with PDL as in the engine: in
//               the timed chain its next launch starts streaming while this one drains, which
//               the MMA variants (plain launches) do not get
//   02..        gemv_mma<NT, KSPLIT, U>: a CTA owns NT n8 tiles (8 NT rows of W); its KSPLIT
//               warps split K into contiguous ranges and add their partial tiles in warp order
//               through shared memory; each lane keeps NT x U 16-byte W loads in flight.
//
// check: every variant on odd and model shapes (K % 32 != 0, N % 8 != 0), M = 1, 2, 5, 8, 16:
//        output NaN-poisoned, relative Frobenius error against a one-thread-per-output fp32
//        reference <= 1e-4, no NaN; the MMA variants also bit-identical per row between M = 16
//        and M = 1.
// bench: the decode matrices of Llama-3.2-1B and Llama-3-8B at M = 1, 4, 8, 16, timed as a CUDA
//        graph of 50 launches, each on the next of enough weight copies that none is in L2;
//        GB/s counts W + x + y once; % of a 1 GiB device-to-device copy (read + write).
//
//   nvcc -std=c++17 -O3 --use_fast_math -Icsrc -DBRRR_WITH_CUDA -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/lab/cuda_gemv_lab.cu csrc/cuda/gemv.cu csrc/cuda/{gemm_sm80,gemm_sm90,matmul}.cu csrc/cuda/norm.cu \
//        csrc/cuda/rope.cu -o /tmp/gemv_lab && /tmp/gemv_lab
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "lab_timing.cuh"

using namespace brrr::cuda;

namespace lab {

constexpr size_t kRotateBytes = 200u << 20;  // 4x the L2 of an H100
constexpr int kLaunchesPerGraph = 50;

// ---- the tensor-core GEMV ------------------------------------------------------------------------

// PDL: launched with programmatic dependent launch like the engine's GEMV; the first step's W
// loads are issued before the wait (weights never depend on the kernel before), and each step's
// W loads for the next step go out before the current step's MMAs (double-buffered registers).
template <int NT, int KSPLIT, int U, bool PDL>
__global__ void __launch_bounds__(32 * KSPLIT) gemv_mma_kernel(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                                               float* __restrict__ y, int M, int N, int K) {
    __shared__ float partial[KSPLIT][NT][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 8 * NT;
    // This warp's range of 32-wide k chunks.
    const int chunks = CEIL_DIV(K, 32);
    const int per_warp = CEIL_DIV(chunks, KSPLIT);
    const int c_begin = warp * per_warp, c_end = min(chunks, c_begin + per_warp);

    const uint16_t* wbits = reinterpret_cast<const uint16_t*>(W);
    const uint16_t* xbits = reinterpret_cast<const uint16_t*>(x);
    const uint16_t* wrow[NT];
    bool wrow_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int n = n0 + 8 * j + g;
        wrow_ok[j] = n < N;
        wrow[j] = wbits + (size_t)(wrow_ok[j] ? n : 0) * K;
    }
    const bool xa_ok = g < M, xb_ok = g + 8 < M;
    const uint16_t* xa_row = xbits + (size_t)(xa_ok ? g : 0) * K;
    const uint16_t* xb_row = xbits + (size_t)(xb_ok ? g + 8 : 0) * K;

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    // K % 8 == 0: a lane's 16-byte piece at k is all in or all out of its range.
    auto piece_ok = [&](int c) { return c < c_end && c * 32 + 8 * t < K; };
    uint4 w[NT][U];
    auto load_w = [&](uint4 (&dst)[NT][U], int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = (c0 + u) * 32 + 8 * t;
#pragma unroll
            for (int j = 0; j < NT; ++j)
                dst[j][u] = piece_ok(c0 + u) && wrow_ok[j] ? ptx::ld_stream_16(wrow[j] + k) : zero;
        }
    };
    if (PDL) {
        load_w(w, c_begin);
        pdl_wait();
        pdl_launch_dependents();
    }
    for (int c0 = c_begin; c0 < c_end; c0 += U) {
        uint4 xa[U], xb[U], next[NT][U];
        if (PDL) load_w(next, c0 + U);  // in flight during this step's MMAs (zeros past the range)
        else load_w(w, c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = (c0 + u) * 32 + 8 * t;
            const bool ok = piece_ok(c0 + u);
            xa[u] = ok && xa_ok ? __ldg(reinterpret_cast<const uint4*>(xa_row + k)) : zero;
            xb[u] = ok && xb_ok ? __ldg(reinterpret_cast<const uint4*>(xb_row + k)) : zero;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint32_t a_lo[4] = {xa[u].x, xb[u].x, xa[u].y, xb[u].y};
            const uint32_t a_hi[4] = {xa[u].z, xb[u].z, xa[u].w, xb[u].w};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const uint32_t b_lo[2] = {w[j][u].x, w[j][u].y}, b_hi[2] = {w[j][u].z, w[j][u].w};
                ptx::mma_bf16_16816(acc[j], a_lo, b_lo);
                ptx::mma_bf16_16816(acc[j], a_hi, b_hi);
            }
        }
        if (PDL) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < NT; ++j) w[j][u] = next[j][u];
        }
    }

    // The KSPLIT partial tiles, added in warp order (a fixed order: the result is the same every run).
    if (KSPLIT > 1) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) partial[warp][j][e][lane] = acc[j][e];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float s = partial[0][j][e][lane];
                for (int w = 1; w < KSPLIT; ++w) s += partial[w][j][e][lane];
                acc[j][e] = s;
            }
    }
    // C fragment: (row g, columns 2t, 2t + 1) and (row g + 8, the same columns).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int col = n0 + 8 * j + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = g + 8 * h;
            if (row >= M) continue;
            if (col < N) y[(size_t)row * N + col] = acc[j][2 * h];
            if (col + 1 < N) y[(size_t)row * N + col + 1] = acc[j][2 * h + 1];
        }
    }
}

// ---- variants ------------------------------------------------------------------------------------

using Launcher = void (*)(const bf16* x, const bf16* W, float* y, int M, int N, int K, cudaStream_t s);

void launch_engine(const bf16* x, const bf16* W, float* y, int M, int N, int K, cudaStream_t s) {
    EpilogueArgs args;
    args.out_f32 = y;
    gemv_bf16(x, W, M, N, K, Epilogue::StoreF32, args, s);
}

template <int NT, int KSPLIT, int U, bool PDL = false>
void launch_mma(const bf16* x, const bf16* W, float* y, int M, int N, int K, cudaStream_t s) {
    const dim3 grid(CEIL_DIV(N, 8 * NT)), block(32 * KSPLIT);
    if (PDL) launch_pdl(gemv_mma_kernel<NT, KSPLIT, U, PDL>, grid, block, 0, s, x, W, y, M, N, K);
    else gemv_mma_kernel<NT, KSPLIT, U, PDL><<<grid, block, 0, s>>>(x, W, y, M, N, K);
    CUDA_CHECK(cudaGetLastError());
}

struct Variant {
    const char* name;
    Launcher launch;
    bool batch_invariant;  // checked bit for bit: a row of M equals that row run alone
};

const Variant kVariants[] = {
    // Not bit-invariant: gemv_bf16 runs a row alone (M = 1) on the CUDA cores and M >= 2 rows on
    // the tensor cores (tuning::kGemvTensorCoreMinRows), which round differently.
    {"01_engine", launch_engine, false},
    {"02_mma_nt2_k4_u4", launch_mma<2, 4, 4>, true},
    {"03_mma_nt4_k4_u2", launch_mma<4, 4, 2>, true},
    {"04_mma_nt1_k4_u8", launch_mma<1, 4, 8>, true},
    {"05_mma_nt2_k8_u4", launch_mma<2, 8, 4>, true},
    {"06_mma_nt2_k2_u4", launch_mma<2, 2, 4>, true},
    {"07_mma_nt1_k8_u8", launch_mma<1, 8, 8>, true},
    {"08_mma_nt4_k8_u2", launch_mma<4, 8, 2>, true},
    {"09_mma_nt2_k8_u4_pdl", launch_mma<2, 8, 4, true>, true},
    {"10_mma_nt1_k8_u8_pdl", launch_mma<1, 8, 8, true>, true},
};

// ---- data and reference --------------------------------------------------------------------------

__global__ void fill_uniform_bf16(bf16* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + seed) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        const float u = (float)(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        p[i] = __float2bfloat16_rn((2.f * u - 1.f) * scale);
    }
}

__global__ void fill_nan(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __int_as_float(0x7fc00000);
}

__global__ void reference_gemv(const bf16* x, const bf16* W, float* y, int M, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N) return;
    double acc = 0.0;
    for (int k = 0; k < K; ++k)
        acc += (double)__bfloat162float(x[(size_t)m * K + k]) * (double)__bfloat162float(W[(size_t)n * K + k]);
    y[(size_t)m * N + n] = (float)acc;
}

std::vector<float> download(const float* p, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// ---- check ---------------------------------------------------------------------------------------

// One variant on one shape at M rows: relative Frobenius error, NaN count, and (batch_invariant)
// whether rows 0, M/2 and M-1 match the same rows run alone bit for bit.
bool check_one(const Variant& v, int M, int N, int K, cudaStream_t s) {
    bf16 *x, *W, *x1;
    float *y, *y1, *ref;
    CUDA_CHECK(cudaMalloc(&x, (size_t)M * K * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&x1, (size_t)K * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&W, (size_t)N * K * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&y, (size_t)M * N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&y1, (size_t)N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&ref, (size_t)M * N * sizeof(float)));
    fill_uniform_bf16<<<256, 256, 0, s>>>(x, (size_t)M * K, 11 + M, 1.7f);
    fill_uniform_bf16<<<1024, 256, 0, s>>>(W, (size_t)N * K, 5 + N, 0.035f);
    fill_nan<<<256, 256, 0, s>>>(y, (size_t)M * N);
    reference_gemv<<<dim3(CEIL_DIV(N, 128), M), 128, 0, s>>>(x, W, ref, M, N, K);
    v.launch(x, W, y, M, N, K, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<float> got = download(y, (size_t)M * N), want = download(ref, (size_t)M * N);
    double err = 0.0, norm = 0.0;
    size_t nans = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) ++nans;
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    const double rel = std::sqrt(err / std::max(norm, 1e-30));
    bool invariant = true;
    if (v.batch_invariant) {
        for (int m : {0, M / 2, M - 1}) {
            CUDA_CHECK(cudaMemcpyAsync(x1, x + (size_t)m * K, K * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
            fill_nan<<<64, 256, 0, s>>>(y1, N);
            v.launch(x1, W, y1, 1, N, K, s);
            CUDA_CHECK(cudaStreamSynchronize(s));
            const std::vector<float> alone = download(y1, N);
            invariant = invariant && std::equal(alone.begin(), alone.end(), got.begin() + (size_t)m * N,
                                                [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; });
        }
    }
    const bool ok = nans == 0 && rel <= 1e-4 && invariant;
    std::printf("check %-20s M=%2d N=%6d K=%6d  rel err %.2e  nan %zu  batch-invariant %s%s\n", v.name, M, N, K,
                rel, nans, v.batch_invariant ? (invariant ? "yes" : "NO") : "-", ok ? "" : "  FAILED");
    for (void* p : {(void*)x, (void*)x1, (void*)W, (void*)y, (void*)y1, (void*)ref}) CUDA_CHECK(cudaFree(p));
    return ok;
}

// ---- bench ---------------------------------------------------------------------------------------

float copy_bandwidth() {
    const size_t n = 1u << 30;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, n));
    CUDA_CHECK(cudaMalloc(&b, n));
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int i = 0; i < 6; ++i) {
        CUDA_CHECK(cudaEventRecord(start));
        CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (i > 0) best = std::min(best, ms);
    }
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return 2.f * n / (best * 1e-3f);
}

// Seconds per launch: a graph of 50 launches over the rotated weights, median of 6 replays.
float time_variant(const Variant& v, const bf16* x, const std::vector<bf16*>& weights, float* y, int M, int N,
                   int K, cudaStream_t s) {
    const double us = graph_replay_us(
        s, kLaunchesPerGraph, [&](int i) { v.launch(x, weights[i % weights.size()], y, M, N, K, s); }, 6, 1);
    return (float)(us * 1e-6 / kLaunchesPerGraph);
}

struct Shape {
    const char* name;
    int N, K;
};

}  // namespace lab

int main(int argc, char** argv) {
    using namespace lab;
    const std::string mode = argc > 1 ? argv[1] : "all";
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bool all_ok = true;
    if (mode == "all" || mode == "check") {
        const Shape shapes[] = {{"odd", 203, 584}, {"odd2", 1000, 1032}, {"1B wo", 2048, 2048}, {"8B w2", 4096, 14336}};
        for (const Variant& v : kVariants)
            for (const Shape& sh : shapes)
                for (int M : {1, 2, 5, 8, 16}) all_ok = check_one(v, M, sh.N, sh.K, s) && all_ok;
        std::printf(all_ok ? "check: all variants match the reference\n" : "check: SOME VARIANTS FAILED\n");
    }
    if (mode == "all" || mode == "bench") {
        const Shape shapes[] = {{"1B wqkv", 3072, 2048}, {"1B wo", 2048, 2048},   {"1B w13", 16384, 2048},
                                {"1B w2", 2048, 8192},   {"8B wqkv", 6144, 4096}, {"8B wo", 4096, 4096},
                                {"8B w13", 28672, 4096}, {"8B w2", 4096, 14336}};
        const float copy_bw = copy_bandwidth();
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("%s: device copy %.2f TB/s (read + write)\n", prop.name, copy_bw / 1e12f);
        std::printf("%-9s %3s", "shape", "M");
        for (const Variant& v : kVariants) std::printf(" %20s", v.name);
        std::printf("   (us per launch, %% of copy, x of 01)\n");
        for (const Shape& sh : shapes) {
            const size_t w_bytes = (size_t)sh.N * sh.K * sizeof(bf16);
            const size_t copies = std::max<size_t>(1, (kRotateBytes + w_bytes - 1) / w_bytes);
            std::vector<bf16*> weights(copies);
            for (size_t c = 0; c < copies; ++c) {
                CUDA_CHECK(cudaMalloc(&weights[c], w_bytes));
                fill_uniform_bf16<<<1024, 256, 0, s>>>(weights[c], (size_t)sh.N * sh.K, 1000 * c + 1, 0.035f);
            }
            bf16* x;
            float* y;
            CUDA_CHECK(cudaMalloc(&x, (size_t)16 * sh.K * sizeof(bf16)));
            CUDA_CHECK(cudaMalloc(&y, (size_t)16 * sh.N * sizeof(float)));
            fill_uniform_bf16<<<64, 256, 0, s>>>(x, (size_t)16 * sh.K, 7, 1.7f);
            CUDA_CHECK(cudaStreamSynchronize(s));
            for (int M : {1, 4, 8, 16}) {
                const double bytes = (double)w_bytes + (double)M * sh.K * sizeof(bf16) + (double)M * sh.N * sizeof(float);
                std::printf("%-9s %3d", sh.name, M);
                float base = 0.f;
                for (const Variant& v : kVariants) {
                    const float t = time_variant(v, x, weights, y, M, sh.N, sh.K, s);
                    if (base == 0.f) base = t;
                    std::printf(" %7.2f %4.0f%% %4.2fx", t * 1e6, 100.0 * bytes / t / copy_bw, base / t);
                }
                std::printf("\n");
                std::fflush(stdout);
            }
            for (bf16* w : weights) CUDA_CHECK(cudaFree(w));
            CUDA_CHECK(cudaFree(x));
            CUDA_CHECK(cudaFree(y));
        }
    }
    CUDA_CHECK(cudaStreamDestroy(s));
    return all_ok ? 0 : 1;
}
