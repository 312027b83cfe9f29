// cuda_decode_persistent_lab.cu — where the time of decode_layers_persistent goes.
//
// Includes decode_persistent.cu, so it runs the production kernel, on random bf16 weights of the
// Llama-3.2-1B and Llama-3-8B layer shapes (one sequence at position 256 of a 512-slot cache):
//   * its time per launch (CUDA events, 20 launches after 3 warm-ups) against the weight bytes it
//     streams, beside a device-to-device copy measured in the same run;
//   * one launch with the kernel's trace on: the global timer at every phase boundary of every
//     CTA, summarized per phase over layers 1..L-2: staging x, the matmul (or attention), the
//     span from the first CTA's start to the last one's arrival, and the grid barrier's wait.
// Correctness is the engine tests' job (tests/test_cuda_engine.py holds this kernel to the
// per-step kernels bit for bit); the timing here does not look at the outputs.
//
//   nvcc -O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
//        -gencode=arch=compute_90a,code=sm_90a benchmarks/lab/cuda_decode_persistent_lab.cu \
//        csrc/cuda/attention.cu -o dp_lab && ./dp_lab
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/decode_persistent.cu"

namespace lab {

using namespace brrr::cuda;

struct Shape {
    const char* name;
    int dim, hidden, n_heads, n_kv_heads, head_dim, n_layers;
};

__global__ void fill_random(bf16* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = __float2bfloat16_rn(scale * ((float)(z >> 40) / (float)(1 << 24) - 0.5f));
    }
}

template <typename T>
T* device_alloc(size_t n) {
    T* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
    return p;
}

double copy_gbps() {
    const size_t bytes = size_t(1) << 30;
    char* a = device_alloc<char>(bytes);
    char* b = device_alloc<char>(bytes);
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(t0));
    for (int i = 0; i < 5; ++i) CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return 2.0 * 5 * bytes / (ms * 1e-3) / 1e9;  // read + write
}

void run(const Shape& s, double copy) {
    const int D = s.dim, H = s.hidden, hd = s.head_dim, L = s.n_layers, max_seq = 512, pos = 256;
    const int q_dim = s.n_heads * hd, qkv = (s.n_heads + 2 * s.n_kv_heads) * hd;
    const size_t per_layer = (size_t)2 * D + (size_t)qkv * D + (size_t)D * q_dim + (size_t)2 * H * D + (size_t)D * H;
    const size_t kv_layer = (size_t)max_seq * s.n_kv_heads * hd;
    bf16* weights = device_alloc<bf16>(per_layer * L);
    bf16* cache = device_alloc<bf16>(2 * kv_layer * L);
    fill_random<<<1024, 256>>>(weights, per_layer * L, 1, 0.04f);
    fill_random<<<1024, 256>>>(cache, 2 * kv_layer * L, 2, 1.0f);
    std::vector<DecodeLayer> table(L);
    for (int l = 0; l < L; ++l) {
        bf16* w = weights + per_layer * l;
        DecodeLayer& t = table[l];
        t.attn_norm = w;
        t.ffn_norm = w + D;
        t.wqkv = w + 2 * D;
        t.wo = t.wqkv + (size_t)qkv * D;
        t.w13 = t.wo + (size_t)D * q_dim;
        t.w2 = t.w13 + (size_t)2 * H * D;
        t.k_cache = cache + 2 * kv_layer * l;
        t.v_cache = t.k_cache + kv_layer;
    }
    DecodeLayer* d_table = device_alloc<DecodeLayer>(L);
    CUDA_CHECK(cudaMemcpy(d_table, table.data(), sizeof(DecodeLayer) * L, cudaMemcpyHostToDevice));
    std::vector<float> inv_freq(hd / 2), x0(D);
    for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(500000.f, -2.f * i / hd);
    for (int i = 0; i < D; ++i) x0[i] = std::sin(0.37f * i);
    int host_ints[2] = {pos, 0};
    int* ints = device_alloc<int>(2);
    CUDA_CHECK(cudaMemcpy(ints, host_ints, sizeof(host_ints), cudaMemcpyHostToDevice));
    float* d_inv = device_alloc<float>(hd / 2);
    CUDA_CHECK(cudaMemcpy(d_inv, inv_freq.data(), sizeof(float) * hd / 2, cudaMemcpyHostToDevice));
    float* x = device_alloc<float>(D);
    const int sms = device_facts().sm_count;
    const int max_splits = std::max(1, std::min({CEIL_DIV(2 * sms, s.n_kv_heads), max_seq / 64, 64}));

    PersistentDecode p;
    p.layers = d_table;
    p.n_layers = L;
    p.dim = D;
    p.hidden = H;
    p.n_heads = s.n_heads;
    p.n_kv_heads = s.n_kv_heads;
    p.head_dim = hd;
    p.max_seq = max_seq;
    p.max_splits = max_splits;
    p.eps = 1e-5f;
    p.x = x;
    p.q = device_alloc<bf16>(q_dim);
    p.att = device_alloc<bf16>(q_dim);
    p.hb = device_alloc<bf16>(H);
    p.positions = ints;
    p.slots = ints + 1;
    p.inv_freq = d_inv;
    p.attn_scratch = device_alloc<float>(flash_decode_scratch_floats(1, s.n_heads, hd, max_splits));
    p.barrier = device_alloc<unsigned>(1);
    Plan pl = plan(p);
    if (!pl.kernel) {
        std::printf("%s: no persistent kernel here (%s)\n", s.name, pl.why);
        return;
    }
    auto reset_and_launch = [&] {
        CUDA_CHECK(cudaMemcpyAsync(x, x0.data(), sizeof(float) * D, cudaMemcpyHostToDevice));
        launch(pl, nullptr);
    };
    for (int i = 0; i < 3; ++i) reset_and_launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    const int reps = 20;
    CUDA_CHECK(cudaEventRecord(t0));
    for (int i = 0; i < reps; ++i) launch(pl, nullptr);
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    const double us = 1e3 * ms / reps;
    const double layer_bytes = 2.0 * (per_layer - 2 * D);
    const double ideal_us = layer_bytes * L / (copy * 1e9) * 1e6;
    std::printf("%s: %d CTAs x %d threads, %d ring slots of %d B a warp, %zu B shared\n", s.name, sms, kThreads,
                pl.args.slots, kPieceBytes, pl.smem);
    std::printf("  kernel %.1f us per launch = %.0f GB/s of weights; at the copy rate (%.0f GB/s) %.1f us: %.1f%%\n",
                us, layer_bytes * L / (us * 1e-6) / 1e9, copy, ideal_us, 100.0 * ideal_us / us);

    // One traced launch.
    constexpr int kEvents = KernelArgs::kTraceEventsPerLayer;
    const size_t n_events = (size_t)sms * L * kEvents;
    unsigned long long* d_trace = device_alloc<unsigned long long>(n_events);
    pl.args.trace = d_trace;
    reset_and_launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned long long> tr(n_events);
    CUDA_CHECK(cudaMemcpy(tr.data(), d_trace, sizeof(unsigned long long) * n_events, cudaMemcpyDeviceToHost));
    auto ev = [&](int cta, int l, int e) -> double {  // consumer event e of layer l (e < 0: previous layer)
        if (e < 0) --l, e += kEvents;
        return (double)tr[((size_t)cta * L + l) * kEvents + e];
    };
    // Per phase: the event that starts it (a barrier leave), staged (-1: none), arrive, leave.
    struct PhaseEvents {
        const char* name;
        int start, staged, arrive, leave;
    };
    const PhaseEvents phases[] = {{"QKV", -1, 0, 1, 2}, {"ATTN", 2, -1, 3, 4}, {"WO", 4, 5, 6, 7},
                                  {"W13", 7, 8, 9, 10}, {"W2", 10, 11, 12, 13}};
    std::printf("  per layer, layers 1..%d, us (mean over CTAs; span: first start to last arrival)\n", L - 2);
    std::printf("  %-5s %8s %8s %8s %8s\n", "phase", "stage", "work", "span", "barrier");
    double layer_total = 0;
    for (const PhaseEvents& ph : phases) {
        double stage = 0, work = 0, span = 0, barrier = 0;
        int n = 0;
        for (int l = 1; l < L - 1; ++l) {
            double first_start = 1e30, last_arrive = 0, first_leave = 1e30;
            for (int c = 0; c < sms; ++c) {
                const double start = ev(c, l, ph.start), arrive = ev(c, l, ph.arrive);
                const double staged = ph.staged >= 0 ? ev(c, l, ph.staged) : start;
                stage += staged - start;
                work += arrive - staged;
                first_start = std::min(first_start, start);
                last_arrive = std::max(last_arrive, arrive);
                first_leave = std::min(first_leave, ev(c, l, ph.leave));
                ++n;
            }
            span += last_arrive - first_start;
            barrier += first_leave - last_arrive;
        }
        const double layers = L - 2;
        std::printf("  %-5s %8.2f %8.2f %8.2f %8.2f\n", ph.name, stage / n / 1e3, work / n / 1e3,
                    span / layers / 1e3, barrier / layers / 1e3);
        layer_total += (span + barrier) / layers;
    }
    std::printf("  sum of spans and barriers %.2f us per layer; weights at the copy rate %.2f us per layer\n",
                layer_total / 1e3, ideal_us / L);
    for (void* ptr : {(void*)weights, (void*)cache, (void*)d_table, (void*)ints, (void*)d_inv, (void*)x, (void*)p.q,
                      (void*)p.att, (void*)p.hb, (void*)p.attn_scratch, (void*)p.barrier, (void*)d_trace})
        CUDA_CHECK(cudaFree(ptr));
}

}  // namespace lab

int main() {
    try {
        const double copy = lab::copy_gbps();
        std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy);
        lab::run({"llama3.2-1b", 2048, 8192, 32, 8, 64, 16}, copy);
        lab::run({"llama3-8b", 4096, 14336, 32, 8, 128, 32}, copy);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
