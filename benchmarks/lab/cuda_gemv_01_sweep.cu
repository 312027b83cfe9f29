// cuda_gemv_01_sweep.cu — which shape of the M = 1 GEMV (csrc/cuda/gemv.cu) streams fastest:
// warps per CTA x output columns per warp, on the decode matrices of Llama-3.2-1B and Llama-3-8B.
//
// Every variant is the production kernel template (this file includes gemv.cu), checked against a
// plain one-thread-per-row fp32 reference kernel (max relative error <= 1e-4 on StoreF32), then
// timed as a CUDA graph of 50 launches (what decode replays), each launch on the next of enough
// weight copies that none is in L2. GB/s counts W + x + y once; "% copy" is against a 1 GiB
// device-to-device cudaMemcpy (read + write). The winner's WARPS / units_per_warp go to gemv.cu.
//
//   nvcc -std=c++17 -O3 --use_fast_math -Icsrc -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/lab/cuda_gemv_01_sweep.cu -o /tmp/gemv_sweep && /tmp/gemv_sweep
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/gemv.cu"

using namespace brrr::cuda;

namespace lab {

#define LAB_CHECK(call)                                                                       \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

constexpr size_t kRotateBytes = 200u << 20;  // 4x the L2 of an H100
constexpr int kLaunchesPerGraph = 50;

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

__global__ void reference_gemv(const bf16* x, const bf16* W, float* y, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += __bfloat162float(x[k]) * __bfloat162float(W[(size_t)n * K + k]);
    y[n] = acc;
}

struct Shape {
    const char* name;
    int N, K;
};

float copy_bandwidth() {
    const size_t n = 1u << 30;
    void *a, *b;
    LAB_CHECK(cudaMalloc(&a, n));
    LAB_CHECK(cudaMalloc(&b, n));
    cudaEvent_t start, stop;
    LAB_CHECK(cudaEventCreate(&start));
    LAB_CHECK(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int i = 0; i < 6; ++i) {
        LAB_CHECK(cudaEventRecord(start));
        LAB_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
        LAB_CHECK(cudaEventRecord(stop));
        LAB_CHECK(cudaEventSynchronize(stop));
        float ms;
        LAB_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (i > 0 && ms < best) best = ms;
    }
    LAB_CHECK(cudaFree(a));
    LAB_CHECK(cudaFree(b));
    return 2.f * n / (best * 1e-3f);
}

// One variant on one shape: {max relative error vs the reference, seconds per launch}.
template <int UNITS, int WARPS>
std::pair<float, float> run_variant(const bf16* x, const std::vector<bf16*>& weights, float* y,
                                    const float* y_ref, int N, int K, cudaStream_t stream) {
    auto kernel = gemv_kernel<1, UNITS, WARPS, false, true>;
    const int blocks = CEIL_DIV(N, WARPS * UNITS);
    const size_t smem = (size_t)K * sizeof(uint16_t);
    EpilogueArgs args;
    args.out_f32 = y;
    args.ld_out = N;
    kernel<<<blocks, WARPS * 32, smem, stream>>>(x, weights[0], N, 0, K, K, Epilogue::StoreF32, args);
    LAB_CHECK(cudaGetLastError());
    LAB_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> got(N), ref(N);
    LAB_CHECK(cudaMemcpy(got.data(), y, N * sizeof(float), cudaMemcpyDeviceToHost));
    LAB_CHECK(cudaMemcpy(ref.data(), y_ref, N * sizeof(float), cudaMemcpyDeviceToHost));
    float max_err = 0.f, max_ref = 1e-30f;
    for (int i = 0; i < N; ++i) {
        max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
        max_ref = std::max(max_ref, std::fabs(ref[i]));
    }

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    LAB_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kLaunchesPerGraph; ++i)
        kernel<<<blocks, WARPS * 32, smem, stream>>>(x, weights[i % weights.size()], N, 0, K, K,
                                                     Epilogue::StoreF32, args);
    LAB_CHECK(cudaStreamEndCapture(stream, &graph));
    LAB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    LAB_CHECK(cudaEventCreate(&start));
    LAB_CHECK(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int rep = 0; rep < 7; ++rep) {
        LAB_CHECK(cudaEventRecord(start, stream));
        LAB_CHECK(cudaGraphLaunch(exec, stream));
        LAB_CHECK(cudaEventRecord(stop, stream));
        LAB_CHECK(cudaEventSynchronize(stop));
        float ms;
        LAB_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (rep > 0) times.push_back(ms * 1e-3f / kLaunchesPerGraph);  // rep 0 warms up
    }
    std::sort(times.begin(), times.end());
    LAB_CHECK(cudaGraphExecDestroy(exec));
    LAB_CHECK(cudaGraphDestroy(graph));
    return {max_err / max_ref, times[times.size() / 2]};
}

}  // namespace lab

int main() {
    using namespace lab;
    const Shape shapes[] = {{"1B wqkv", 3072, 2048},   {"1B wo", 2048, 2048},     {"1B w13", 16384, 2048},
                            {"1B w2", 2048, 8192},     {"1B lm_head", 128256, 2048}, {"8B wqkv", 6144, 4096},
                            {"8B wo", 4096, 4096},     {"8B w13", 28672, 4096},   {"8B w2", 4096, 14336},
                            {"8B lm_head", 128256, 4096}};
    const float copy_bw = copy_bandwidth();
    cudaDeviceProp prop;
    LAB_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s: device copy %.2f TB/s (read + write)\n", prop.name, copy_bw / 1e12f);
    std::printf("%-12s %-14s %10s %8s %8s %10s\n", "shape", "warps x units", "us", "GB/s", "% copy", "max rel err");
    cudaStream_t stream;
    LAB_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    bool all_ok = true;
    for (const Shape& s : shapes) {
        const size_t w_bytes = (size_t)s.N * s.K * sizeof(bf16);
        const size_t copies = std::max<size_t>(1, (kRotateBytes + w_bytes - 1) / w_bytes);
        std::vector<bf16*> weights(copies);
        for (size_t c = 0; c < copies; ++c) {
            LAB_CHECK(cudaMalloc(&weights[c], w_bytes));
            fill_uniform_bf16<<<1024, 256>>>(weights[c], (size_t)s.N * s.K, 1000 * c + 1, 0.035f);
        }
        bf16* x;
        float *y, *y_ref;
        LAB_CHECK(cudaMalloc(&x, s.K * sizeof(bf16)));
        LAB_CHECK(cudaMalloc(&y, s.N * sizeof(float)));
        LAB_CHECK(cudaMalloc(&y_ref, s.N * sizeof(float)));
        fill_uniform_bf16<<<64, 256>>>(x, s.K, 7, 1.7f);
        reference_gemv<<<CEIL_DIV(s.N, 128), 128>>>(x, weights[0], y_ref, s.N, s.K);
        LAB_CHECK(cudaGetLastError());
        LAB_CHECK(cudaDeviceSynchronize());
        const double bytes = (double)w_bytes + s.K * sizeof(bf16) + s.N * sizeof(float);
        auto report = [&](const char* variant, std::pair<float, float> r) {
            const bool ok = r.first <= 1e-4f;
            all_ok = all_ok && ok;
            std::printf("%-12s %-14s %10.2f %8.0f %7.1f%% %10.1e%s\n", s.name, variant, r.second * 1e6,
                        bytes / r.second / 1e9, 100.0 * bytes / r.second / copy_bw, r.first, ok ? "" : "  WRONG");
        };
        report("4 x 1", run_variant<1, 4>(x, weights, y, y_ref, s.N, s.K, stream));
        report("4 x 2", run_variant<2, 4>(x, weights, y, y_ref, s.N, s.K, stream));
        report("8 x 1", run_variant<1, 8>(x, weights, y, y_ref, s.N, s.K, stream));
        report("8 x 2", run_variant<2, 8>(x, weights, y, y_ref, s.N, s.K, stream));
        report("2 x 2", run_variant<2, 2>(x, weights, y, y_ref, s.N, s.K, stream));
        for (bf16* w : weights) LAB_CHECK(cudaFree(w));
        LAB_CHECK(cudaFree(x));
        LAB_CHECK(cudaFree(y));
        LAB_CHECK(cudaFree(y_ref));
    }
    LAB_CHECK(cudaStreamDestroy(stream));
    std::printf(all_ok ? "all variants match the reference\n" : "SOME VARIANTS ARE WRONG\n");
    return all_ok ? 0 : 1;
}
