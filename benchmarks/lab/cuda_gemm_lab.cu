// cuda_gemm_lab.cu — the prefill GEMM y = x W^T from the engine's mma.sync kernel to the Hopper
// wgmma + TMA kernel, variant by variant, beside cuBLAS on the same shapes.
//
// Every variant is production code or a numbered lab form of it: 01 is the mma.sync kernel
// (gemm_sm80, the path sm_80 keeps), 02.. are configurations of the sm90 kernel template
// (csrc/cuda/gemm_sm90.cuh: tile width, ring depth, one CTA per tile or a persistent grid,
// tile-order grouping), 08 "auto" is exactly what gemm_bf16 runs on a Hopper device (gemm_sm90),
// and 09 / 10 run clusters of two CTAs sharing W tiles (gemm_sm90_cluster.cuh, lab only).
//
//   check  every variant x every epilogue (StoreBf16, StoreF32, AddResidual, SwiGLU) on odd and
//          model shapes (SmolLM2 576/192/1536, Llama 2048/4096/8192/14336/128256): random inputs,
//          outputs NaN-poisoned, compared with cuBLAS (fp32 accumulate, fp32 out) by relative
//          Frobenius error (< 1e-2), no NaN allowed, padding columns of a strided output untouched.
//   bench  Llama-3-8B projection shapes at M = 512 .. 8192 (+ 8192^3): each variant checked on the
//          shape, then timed with CUDA events (3 warm-ups, median of 25) beside cublasGemmEx with
//          bf16 output; TFLOP/s, % of cuBLAS, relative error. JSON lines to argv[2].
//
//          Then the GEMV/GEMM switch point (M = 1..16) and the fused epilogues at full size.
//
// Build and run: benchmarks/lab/run_gemm_lab.sh (nvcc ... -gencode=arch=compute_90a,code=sm_90a
// cuda_gemm_lab.cu csrc/cuda/{gemm_sm80,gemm_sm90,matmul,gemv,norm,rope}.cu -lcublas).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/gemm_common.cuh"
#include "cuda/gemm_sm90.cuh"
#include "gemm_sm90_cluster.cuh"

using namespace brrr::cuda;

namespace lab {

#define LAB_CHECK(call)                                                                           \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            std::exit(2);                                                                         \
        }                                                                                         \
    } while (0)
#define LAB_CUBLAS(call)                                                                  \
    do {                                                                                  \
        cublasStatus_t st_ = (call);                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                               \
            std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, (int)st_); \
            std::exit(2);                                                                 \
        }                                                                                 \
    } while (0)

// ---- data -------------------------------------------------------------------------------------
__device__ __forceinline__ float hash_uniform(uint64_t i, uint64_t seed) {
    uint64_t h = (i + seed * 0x632BE59BD9B4E019ull) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return (float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}
__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16_rn(hash_uniform(i, seed) * scale);
}
__global__ void fill_f32(float* p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash_uniform(i, seed);
}

// The expected output, packed [M, width], from cuBLAS's fp32 y [M, N] (and the residual before).
__global__ void expected_output(const float* y, const float* residual_before, int ld_res, int M, int N,
                                int width, Epilogue ep, float* out) {
    const size_t total = (size_t)M * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int m = (int)(i / width), n = (int)(i % width);
        const float v = y[(size_t)m * N + n];
        if (ep == Epilogue::SwiGLU) {
            out[i] = v / (1.f + expf(-v)) * y[(size_t)m * N + width + n];
        } else if (ep == Epilogue::AddResidual) {
            out[i] = residual_before[(size_t)m * ld_res + n] + v;
        } else {
            out[i] = v;
        }
    }
}

__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(bf16 v) { return __bfloat162float(v); }

// sums[0] += (got - ref)^2, sums[1] += ref^2; counts[0] non-finite outputs, counts[1] padding
// entries changed, counts[2] entries off by more than `tol`, first_bad the smallest such index.
template <typename T>
__global__ void compare(const T* got, const float* ref, const float* pad_before, int M, int width, int ld,
                        float tol, double* sums, unsigned long long* counts, unsigned long long* first_bad) {
    double d2 = 0, r2 = 0;
    unsigned long long nonfinite = 0, pad_bad = 0, off = 0;
    const size_t total = (size_t)M * ld;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int m = (int)(i / ld), n = (int)(i % ld);
        const float g = as_float(got[i]);
        if (n >= width) {
            const bool same = pad_before ? g == pad_before[i] : isnan(g);
            pad_bad += !same;
            continue;
        }
        const float r = ref[(size_t)m * width + n];
        if (!isfinite(g)) {
            ++nonfinite;
            atomicMin(first_bad, (unsigned long long)i);
            continue;
        }
        d2 += (double)(g - r) * (g - r);
        r2 += (double)r * r;
        if (fabsf(g - r) > tol) {
            ++off;
            atomicMin(first_bad, (unsigned long long)i);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        d2 += __shfl_xor_sync(0xffffffffu, d2, o);
        r2 += __shfl_xor_sync(0xffffffffu, r2, o);
        nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, o);
        pad_bad += __shfl_xor_sync(0xffffffffu, pad_bad, o);
        off += __shfl_xor_sync(0xffffffffu, off, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sums, d2);
        atomicAdd(sums + 1, r2);
        atomicAdd(counts, nonfinite);
        atomicAdd(counts + 1, pad_bad);
        atomicAdd(counts + 2, off);
    }
}

// ---- variants ---------------------------------------------------------------------------------
int g_sms = 0;

bool sm90_ok(const GemmArgs& p) { return tma_compatible(p); }

struct Variant {
    const char* name;
    bool needs_tma;  // sm90 kernels: only where TMA can describe x and W
    void (*run)(const GemmArgs&, cudaStream_t);
};

const Variant kVariants[] = {
    {"01_mma_sync_128x128_s3", false, [](const GemmArgs& p, cudaStream_t s) { gemm_sm80(p, s); }},
    {"02_wgmma_128x128_s6_grid", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<128, 6>(p, 0, 8, s); }},
    {"03_wgmma_128x256_s4_grid", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<256, 4>(p, 0, 8, s); }},
    {"04_wgmma_128x128_s6_persist", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<128, 6>(p, g_sms, 8, s); }},
    {"05_wgmma_128x256_s4_persist", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<256, 4>(p, g_sms, 8, s); }},
    {"06_wgmma_128x256_s3_persist", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<256, 3>(p, g_sms, 8, s); }},
    {"07_wgmma_128x256_s4_persist_g16", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<256, 4>(p, g_sms, 16, s); }},
    {"08_auto_gemm_bf16", true, [](const GemmArgs& p, cudaStream_t s) { gemm_sm90(p, 1, g_sms, s); }},
    {"09_wgmma_128x256_s4_persist_cluster2", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch_cluster<256, 4>(p, g_sms, 8, s); }},
    {"10_wgmma_128x128_s6_persist_cluster2", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch_cluster<128, 6>(p, g_sms, 8, s); }},
    {"11_wgmma_128x192_s5_persist", true, [](const GemmArgs& p, cudaStream_t s) { sm90::launch<192, 5>(p, g_sms, 8, s); }},
};

// ---- buffers ----------------------------------------------------------------------------------
struct Buffers {
    bf16 *x = nullptr, *W = nullptr, *out_bf16 = nullptr;
    float *out_f32 = nullptr, *residual = nullptr, *residual_before = nullptr, *y_ref = nullptr, *expected = nullptr;
    bf16* cublas_out = nullptr;
    double* sums = nullptr;
    unsigned long long *counts = nullptr, *first_bad = nullptr;
};

size_t g_max_x = 0, g_max_w = 0, g_max_out = 0;
Buffers g_buf;
cublasHandle_t g_cublas;
int g_failures = 0;

void alloc_buffers(size_t max_x, size_t max_w, size_t max_out) {
    g_max_x = max_x;
    g_max_w = max_w;
    g_max_out = max_out;
    LAB_CHECK(cudaMalloc(&g_buf.x, max_x * sizeof(bf16) + 64));
    LAB_CHECK(cudaMalloc(&g_buf.W, max_w * sizeof(bf16) + 64));
    LAB_CHECK(cudaMalloc(&g_buf.out_bf16, max_out * sizeof(bf16)));
    LAB_CHECK(cudaMalloc(&g_buf.cublas_out, max_out * sizeof(bf16)));
    LAB_CHECK(cudaMalloc(&g_buf.out_f32, max_out * sizeof(float)));
    LAB_CHECK(cudaMalloc(&g_buf.residual, max_out * sizeof(float)));
    LAB_CHECK(cudaMalloc(&g_buf.residual_before, max_out * sizeof(float)));
    LAB_CHECK(cudaMalloc(&g_buf.y_ref, max_out * sizeof(float)));
    LAB_CHECK(cudaMalloc(&g_buf.expected, max_out * sizeof(float)));
    LAB_CHECK(cudaMalloc(&g_buf.sums, 2 * sizeof(double)));
    LAB_CHECK(cudaMalloc(&g_buf.counts, 3 * sizeof(unsigned long long)));
    LAB_CHECK(cudaMalloc(&g_buf.first_bad, sizeof(unsigned long long)));
}

uint64_t g_seed = 1;

void fill_inputs(int M, int N, int K) {
    fill_bf16<<<1024, 256>>>(g_buf.x, (size_t)M * K, g_seed++, 1.0f);
    fill_bf16<<<1024, 256>>>(g_buf.W, (size_t)N * K, g_seed++, 1.0f / std::sqrt((float)K));
    LAB_CHECK(cudaGetLastError());
}

// cuBLAS: row-major y [M, N] = x [M, K] W [N, K]^T is column-major y^T = W^T(op T) x^T.
void cublas_gemm(int M, int N, int K, void* out, cudaDataType out_type) {
    const float one = 1.f, zero = 0.f;
    LAB_CUBLAS(cublasGemmEx(g_cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, g_buf.W, CUDA_R_16BF, K, g_buf.x,
                            CUDA_R_16BF, K, &zero, out, out_type, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct Result {
    double rel_err = 0;
    unsigned long long nonfinite = 0, pad_bad = 0, off = 0;
    bool ran = false, ok = false;
};

const char* ep_name(Epilogue ep) {
    switch (ep) {
        case Epilogue::StoreBf16: return "store_bf16";
        case Epilogue::StoreF32: return "store_f32";
        case Epilogue::AddResidual: return "add_residual";
        case Epilogue::SwiGLU: return "swiglu";
    }
    return "?";
}

// Poisons the output, runs the variant once and compares with cuBLAS's y_ref (already computed).
Result check_variant(const Variant& v, int M, int N, int K, Epilogue ep, int ld_extra, bool verbose) {
    Result r;
    const int width = ep == Epilogue::SwiGLU ? N / 2 : N;
    const int ld = width + ld_extra;
    EpilogueArgs out;
    out.ld_out = ld_extra ? ld : 0;
    out.out_bf16 = g_buf.out_bf16;
    out.out_f32 = g_buf.out_f32;
    out.residual = g_buf.residual;
    const GemmArgs p = gemm_args(g_buf.x, g_buf.W, M, N, K, ep, out);
    if (v.needs_tma && !sm90_ok(p)) return r;
    r.ran = true;
    const size_t n_out = (size_t)M * ld;
    LAB_CHECK(cudaMemset(g_buf.out_bf16, 0xff, n_out * sizeof(bf16)));  // NaN
    LAB_CHECK(cudaMemset(g_buf.out_f32, 0xff, n_out * sizeof(float)));
    if (ep == Epilogue::AddResidual) {
        fill_f32<<<1024, 256>>>(g_buf.residual, n_out, g_seed++);
        LAB_CHECK(cudaMemcpy(g_buf.residual_before, g_buf.residual, n_out * sizeof(float), cudaMemcpyDeviceToDevice));
    }
    expected_output<<<1024, 256>>>(g_buf.y_ref, g_buf.residual_before, ld, M, N, width, ep, g_buf.expected);
    v.run(p, 0);
    LAB_CHECK(cudaGetLastError());
    LAB_CHECK(cudaDeviceSynchronize());

    // Pass 1: the norms. Pass 2 (same kernel): entries off by more than 8x the rms error allowed.
    double sums[2];
    unsigned long long counts[3], first_bad;
    auto run_compare = [&](float tol) {
        LAB_CHECK(cudaMemset(g_buf.sums, 0, 2 * sizeof(double)));
        LAB_CHECK(cudaMemset(g_buf.counts, 0, 3 * sizeof(unsigned long long)));
        LAB_CHECK(cudaMemset(g_buf.first_bad, 0xff, sizeof(unsigned long long)));
        if (ep == Epilogue::StoreF32) {
            compare<float><<<528, 256>>>(g_buf.out_f32, g_buf.expected, nullptr, M, width, ld, tol, g_buf.sums,
                                         g_buf.counts, g_buf.first_bad);
        } else if (ep == Epilogue::AddResidual) {
            compare<float><<<528, 256>>>(g_buf.residual, g_buf.expected, g_buf.residual_before, M, width, ld, tol,
                                         g_buf.sums, g_buf.counts, g_buf.first_bad);
        } else {
            compare<bf16><<<528, 256>>>(g_buf.out_bf16, g_buf.expected, nullptr, M, width, ld, tol, g_buf.sums,
                                        g_buf.counts, g_buf.first_bad);
        }
        LAB_CHECK(cudaGetLastError());
        LAB_CHECK(cudaMemcpy(sums, g_buf.sums, sizeof sums, cudaMemcpyDeviceToHost));
        LAB_CHECK(cudaMemcpy(counts, g_buf.counts, sizeof counts, cudaMemcpyDeviceToHost));
        LAB_CHECK(cudaMemcpy(&first_bad, g_buf.first_bad, sizeof first_bad, cudaMemcpyDeviceToHost));
    };
    run_compare(INFINITY);
    r.rel_err = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : (sums[0] > 0 ? INFINITY : 0);
    r.nonfinite = counts[0];
    r.pad_bad = counts[1];
    r.ok = r.nonfinite == 0 && r.pad_bad == 0 && r.rel_err < 1e-2;
    if (!r.ok && verbose) {
        const double ref_rms = std::sqrt(sums[1] / ((double)M * width));
        run_compare((float)(0.08 * ref_rms));
        r.off = counts[2];
        std::printf("    FAIL detail: %llu non-finite, %llu padding changed, %llu of %lld off by > 0.08 rms",
                    r.nonfinite, r.pad_bad, r.off, (long long)M * width);
        if (first_bad != ~0ull) {
            const int m = (int)(first_bad / ld), n = (int)(first_bad % ld);
            float got = 0, want = 0;
            if (ep == Epilogue::StoreF32 || ep == Epilogue::AddResidual) {
                LAB_CHECK(cudaMemcpy(&got, (ep == Epilogue::StoreF32 ? g_buf.out_f32 : g_buf.residual) + first_bad,
                                     sizeof got, cudaMemcpyDeviceToHost));
            } else {
                bf16 h;
                LAB_CHECK(cudaMemcpy(&h, g_buf.out_bf16 + first_bad, sizeof h, cudaMemcpyDeviceToHost));
                got = __bfloat162float(h);
            }
            LAB_CHECK(cudaMemcpy(&want, g_buf.expected + (size_t)m * width + n, sizeof want, cudaMemcpyDeviceToHost));
            std::printf("; first at row %d col %d: got %.5g want %.5g", m, n, got, want);
        }
        std::printf("\n");
        // A few got/want pairs of rows 0, 1, 8, 64 (a permutation shows as values in the wrong place).
        const int show = std::min(width, 12);
        for (int m : {0, 1, 8, 64}) {
            if (m >= M) break;
            float want[12], got[12];
            LAB_CHECK(cudaMemcpy(want, g_buf.expected + (size_t)m * width, show * sizeof(float), cudaMemcpyDeviceToHost));
            if (ep == Epilogue::StoreF32 || ep == Epilogue::AddResidual) {
                const float* src = (ep == Epilogue::StoreF32 ? g_buf.out_f32 : g_buf.residual) + (size_t)m * ld;
                LAB_CHECK(cudaMemcpy(got, src, show * sizeof(float), cudaMemcpyDeviceToHost));
            } else {
                bf16 h[12];
                LAB_CHECK(cudaMemcpy(h, g_buf.out_bf16 + (size_t)m * ld, show * sizeof(bf16), cudaMemcpyDeviceToHost));
                for (int i = 0; i < show; ++i) got[i] = __bfloat162float(h[i]);
            }
            std::printf("    row %3d got :", m);
            for (int i = 0; i < show; ++i) std::printf(" %8.4f", got[i]);
            std::printf("\n    row %3d want:", m);
            for (int i = 0; i < show; ++i) std::printf(" %8.4f", want[i]);
            std::printf("\n");
        }
    }
    return r;
}

void print_check(const Variant& v, int M, int N, int K, Epilogue ep, int ld_extra, const Result& r) {
    if (!r.ran) {
        std::printf("  %-34s M=%5d N=%6d K=%5d %-12s ld+%d  n/a (TMA needs K %% 8 == 0)\n", v.name, M, N, K,
                    ep_name(ep), ld_extra);
        return;
    }
    std::printf("  %-34s M=%5d N=%6d K=%5d %-12s ld+%d  rel_err %.3e  nan %llu pad %llu  %s\n", v.name, M, N, K,
                ep_name(ep), ld_extra, r.rel_err, r.nonfinite, r.pad_bad, r.ok ? "ok" : "FAIL");
    if (!r.ok) ++g_failures;
}

struct Shape {
    int M, N, K, ld_extra;
};

bool selected(const Variant& v, const std::vector<std::string>& only) {
    return only.empty() || std::find(only.begin(), only.end(), std::string(v.name).substr(0, 2)) != only.end();
}

void run_checks(FILE* json, const std::vector<std::string>& only) {
    const Shape shapes[] = {
        {37, 960, 576, 0},     {300, 3072, 576, 0},   {300, 576, 1536, 0},   {129, 576, 576, 0},
        {200, 250, 200, 0},    {77, 130, 264, 0},     {1000, 386, 1000, 0},  {77, 264, 200, 3},
        {17, 2048, 2048, 0},   {333, 6144, 4096, 0},  {2048, 6144, 4096, 0}, {1000, 28672, 4096, 0},
        {515, 4096, 14336, 0}, {300, 128256, 2048, 0}, {129, 200, 577, 0},   {8, 64, 64, 0},
    };
    const Epilogue eps[] = {Epilogue::StoreBf16, Epilogue::StoreF32, Epilogue::AddResidual, Epilogue::SwiGLU};
    for (const Shape& s : shapes) {
        fill_inputs(s.M, s.N, s.K);
        cublas_gemm(s.M, s.N, s.K, g_buf.y_ref, CUDA_R_32F);
        LAB_CHECK(cudaDeviceSynchronize());
        for (const Variant& v : kVariants) {
            if (!selected(v, only)) continue;
            for (Epilogue ep : eps) {
                const Result r = check_variant(v, s.M, s.N, s.K, ep, s.ld_extra, true);
                print_check(v, s.M, s.N, s.K, ep, s.ld_extra, r);
                if (r.ran)
                    std::fprintf(json,
                                 "{\"mode\":\"check\",\"variant\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"epilogue\":\"%s\","
                                 "\"ld_extra\":%d,\"rel_err\":%.4e,\"nonfinite\":%llu,\"pad_changed\":%llu,\"ok\":%s}\n",
                                 v.name, s.M, s.N, s.K, ep_name(ep), s.ld_extra, r.rel_err, r.nonfinite, r.pad_bad,
                                 r.ok ? "true" : "false");
            }
        }
        std::fflush(stdout);
    }
}

template <typename F>
float median_ms(F&& launch, int warmup = 3, int reps = 25) {
    for (int i = 0; i < warmup; ++i) launch();
    cudaEvent_t start, stop;
    LAB_CHECK(cudaEventCreate(&start));
    LAB_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) {
        LAB_CHECK(cudaEventRecord(start));
        launch();
        LAB_CHECK(cudaEventRecord(stop));
        LAB_CHECK(cudaEventSynchronize(stop));
        LAB_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
    }
    LAB_CHECK(cudaGetLastError());
    LAB_CHECK(cudaEventDestroy(start));
    LAB_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

void run_bench(FILE* json, const std::vector<std::string>& only) {
    const Shape nk[] = {{0, 6144, 4096, 0}, {0, 4096, 4096, 0}, {0, 28672, 4096, 0}, {0, 4096, 14336, 0}};
    std::vector<Shape> shapes;
    for (int M : {512, 2048, 4096, 8192})
        for (const Shape& s : nk) shapes.push_back({M, s.N, s.K, 0});
    shapes.push_back({8192, 8192, 8192, 0});
    std::printf("\n%-34s %6s %6s %6s %9s %8s %10s\n", "variant", "M", "N", "K", "TFLOP/s", "%cuBLAS", "rel_err");
    for (const Shape& s : shapes) {
        fill_inputs(s.M, s.N, s.K);
        cublas_gemm(s.M, s.N, s.K, g_buf.y_ref, CUDA_R_32F);
        const double flop = 2.0 * s.M * s.N * s.K;
        const float cublas_ms = median_ms([&] { cublas_gemm(s.M, s.N, s.K, g_buf.cublas_out, CUDA_R_16BF); });
        const double cublas_tf = flop / (cublas_ms * 1e-3) / 1e12;
        std::printf("%-34s %6d %6d %6d %9.1f %8s %10s\n", "cublas_bf16_out", s.M, s.N, s.K, cublas_tf, "100.0", "-");
        std::fprintf(json, "{\"mode\":\"bench\",\"variant\":\"cublas\",\"M\":%d,\"N\":%d,\"K\":%d,\"ms\":%.4f,\"tflops\":%.1f}\n",
                     s.M, s.N, s.K, cublas_ms, cublas_tf);
        for (const Variant& v : kVariants) {
            if (!selected(v, only)) continue;
            const Result r = check_variant(v, s.M, s.N, s.K, Epilogue::StoreBf16, 0, true);
            if (!r.ok) {
                print_check(v, s.M, s.N, s.K, Epilogue::StoreBf16, 0, r);
                continue;
            }
            EpilogueArgs out;
            out.out_bf16 = g_buf.out_bf16;
            const GemmArgs p = gemm_args(g_buf.x, g_buf.W, s.M, s.N, s.K, Epilogue::StoreBf16, out);
            const float ms = median_ms([&] { v.run(p, 0); });
            const double tf = flop / (ms * 1e-3) / 1e12;
            std::printf("%-34s %6d %6d %6d %9.1f %8.1f %10.2e\n", v.name, s.M, s.N, s.K, tf, 100.0 * tf / cublas_tf,
                        r.rel_err);
            std::fprintf(json,
                         "{\"mode\":\"bench\",\"variant\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"ms\":%.4f,\"tflops\":%.1f,"
                         "\"pct_cublas\":%.1f,\"rel_err\":%.3e}\n",
                         v.name, s.M, s.N, s.K, ms, tf, 100.0 * tf / cublas_tf, r.rel_err);
        }
        std::fflush(stdout);
        std::fflush(json);
    }
    const Variant& prod = *std::find_if(std::begin(kVariants), std::end(kVariants),
                                        [](const Variant& v) { return std::strncmp(v.name, "08", 2) == 0; });
    if (!selected(prod, only)) return;  // the sections below run the production dispatch

    // Where matmul_bf16 should switch from the GEMV (gemv.cu, M <= 16) to this GEMM: both sides
    // timed on decode-sized M for the Llama-3.2-1B and Llama-3-8B projections.
    std::printf("\nGEMV vs GEMM at small M (StoreBf16, microseconds)\n%6s %6s %6s %10s %10s %10s\n", "M", "N", "K",
                "gemv", "gemm_auto", "mma_sync");
    const Shape decode_nk[] = {{0, 2048, 2048, 0}, {0, 3072, 2048, 0}, {0, 6144, 4096, 0}, {0, 4096, 14336, 0}};
    for (const Shape& s : decode_nk) {
        fill_inputs(16, s.N, s.K);
        for (int M : {1, 2, 4, 8, 12, 16}) {
            EpilogueArgs out;
            out.out_bf16 = g_buf.out_bf16;
            const GemmArgs p = gemm_args(g_buf.x, g_buf.W, M, s.N, s.K, Epilogue::StoreBf16, out);
            const float gemv_ms = median_ms([&] { gemv_bf16(g_buf.x, g_buf.W, M, s.N, s.K, Epilogue::StoreBf16, out, 0); });
            const float gemm_ms = median_ms([&] { gemm_sm90(p, 1, g_sms, 0); });
            const float mma_ms = median_ms([&] { gemm_sm80(p, 0); });
            std::printf("%6d %6d %6d %10.2f %10.2f %10.2f\n", M, s.N, s.K, gemv_ms * 1e3, gemm_ms * 1e3, mma_ms * 1e3);
            std::fprintf(json,
                         "{\"mode\":\"switch\",\"M\":%d,\"N\":%d,\"K\":%d,\"gemv_us\":%.2f,\"gemm_auto_us\":%.2f,"
                         "\"mma_sync_us\":%.2f}\n",
                         M, s.N, s.K, gemv_ms * 1e3, gemm_ms * 1e3, mma_ms * 1e3);
        }
    }

    // The fused epilogues at full size, on the production dispatch: the MLP's w13 (SwiGLU) and w2
    // (AddResidual), attention's wo, the qkv (StoreF32), timed too.
    struct EpShape {
        Shape s;
        Epilogue ep;
    };
    const EpShape ep_shapes[] = {{{2048, 28672, 4096, 0}, Epilogue::SwiGLU},
                                 {{2048, 4096, 14336, 0}, Epilogue::AddResidual},
                                 {{2048, 4096, 4096, 0}, Epilogue::AddResidual},
                                 {{2048, 6144, 4096, 0}, Epilogue::StoreF32}};
    std::printf("\nfused epilogues, %s\n", prod.name);
    for (const EpShape& e : ep_shapes) {
        const Shape& s = e.s;
        fill_inputs(s.M, s.N, s.K);
        cublas_gemm(s.M, s.N, s.K, g_buf.y_ref, CUDA_R_32F);
        const Result r = check_variant(prod, s.M, s.N, s.K, e.ep, 0, true);
        print_check(prod, s.M, s.N, s.K, e.ep, 0, r);
        EpilogueArgs out;
        out.out_bf16 = g_buf.out_bf16;
        out.out_f32 = g_buf.out_f32;
        out.residual = g_buf.residual;
        const GemmArgs p = gemm_args(g_buf.x, g_buf.W, s.M, s.N, s.K, e.ep, out);
        const float ms = median_ms([&] { prod.run(p, 0); });
        const double tf = 2.0 * s.M * s.N * s.K / (ms * 1e-3) / 1e12;
        std::printf("  %-12s M=%d N=%d K=%d: %.1f TFLOP/s\n", ep_name(e.ep), s.M, s.N, s.K, tf);
        std::fprintf(json,
                     "{\"mode\":\"epilogue\",\"variant\":\"%s\",\"epilogue\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,"
                     "\"tflops\":%.1f,\"rel_err\":%.3e,\"ok\":%s}\n",
                     prod.name, ep_name(e.ep), s.M, s.N, s.K, tf, r.rel_err, r.ok ? "true" : "false");
    }
}

}  // namespace lab

int main(int argc, char** argv) {
    using namespace lab;
    if (argc < 3 || (std::strcmp(argv[1], "check") != 0 && std::strcmp(argv[1], "bench") != 0)) {
        std::fprintf(stderr, "usage: %s check|bench OUT.jsonl [variant numbers, e.g. 01,05; default all]\n", argv[0]);
        return 2;
    }
    std::vector<std::string> only;
    if (argc > 3) {
        for (const char* c = argv[3]; *c;) {
            only.emplace_back(c, 2);
            c += 2;
            if (*c == ',') ++c;
        }
    }
    cudaDeviceProp prop;
    LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    std::printf("%s, %d SMs, cc %d.%d\n", prop.name, g_sms, prop.major, prop.minor);
    cudaFuncAttributes attr;
    LAB_CHECK(cudaFuncGetAttributes(&attr, sm90::gemm_sm90_kernel<256, 4, false, 0, false>));
    int sms = 0;
    const bool production_uses_sm90 = gemm_sm90_available(&sms);
    std::printf("sm90 kernel binaryVersion %d; gemm_bf16 takes the sm90 path here: %s\n", attr.binaryVersion,
                production_uses_sm90 ? "yes" : "NO");
    if (prop.major != 9) {
        std::fprintf(stderr, "not a Hopper device: the wgmma variants cannot run here\n");
        return 2;
    }
    LAB_CUBLAS(cublasCreate(&g_cublas));
    FILE* json = std::fopen(argv[2], "w");
    if (!json) {
        std::fprintf(stderr, "cannot write %s\n", argv[2]);
        return 2;
    }
    alloc_buffers((size_t)8192 * 14336, (size_t)128256 * 2048, (size_t)8192 * 28672);
    try {
        if (std::strcmp(argv[1], "check") == 0) run_checks(json, only);
        else run_bench(json, only);
    } catch (const brrr::Error& e) {
        std::fprintf(stderr, "brrr::Error: %s\n", e.what());
        return 2;
    }
    std::fclose(json);
    std::printf("\n%d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}
