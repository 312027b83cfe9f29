// cpu_gemv_01_prefetch.cpp — lab: decode GEMV (y = W x, W [N, K] fp32 or bf16) streaming rate
// with and without software prefetch of the next tile, for the SmolLM2-135M projection shapes.
//
// Why: bf16 rows of K = 576 are only 18 cache lines long, too short for the hardware stream
// prefetcher to ramp up before a tile of 8 rows is done, so the plain kernel reaches ~15 GB/s
// where fp32 reaches ~22. Prefetching the next tile (contiguous: rows n0+8.. follow) spread over
// the K loop keeps enough lines in flight.
// Each variant is checked against a double-precision reference before it is timed.
//
// Seen on the 2-core dev box (a pure 2-thread read loop gives ~21-23 GB/s there):
//   bf16: none 13-16 GB/s, T0 15-21, T1 19-24, T1 two tiles ahead ~ the same as T1
//   f32:  22-26 GB/s whichever variant (noise between runs larger than the differences)
// -> csrc/cpu/matmul.cpp prefetches the next tile into L2 (T1) for both dtypes.
//
//   g++ -O3 -march=native -fopenmp -std=c++17 -Icsrc benchmarks/lab/cpu_gemv_01_prefetch.cpp \
//       -o /tmp/gemv_lab && /tmp/gemv_lab
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/simd.h"

using namespace brrr;
using namespace brrr::cpu;

constexpr int kRows = 8;

// hint: 0 = no prefetch, 1 = next tile into L1 (T0), 2 = next tile into L2 (T1),
//       3 = the tile after next into L2 (T1)
template <typename WT, int Hint>
void gemv(const float* x, const WT* W, float* y, int N, int K) {
    const int n_tiles = N / kRows;
    const int steps = K / kLanes;
    const size_t tile_bytes = (size_t)kRows * K * sizeof(WT);
    const int lines_per_step = (int)CEIL_DIV(CEIL_DIV(tile_bytes, 64), (size_t)steps);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tiles; ++t) {
        const WT* w = W + (size_t)t * kRows * K;
        const char* next = reinterpret_cast<const char*>(w + (size_t)(Hint == 3 ? 2 : 1) * kRows * K);
        vfloat acc[kRows];
        for (auto& a : acc) a = vzero();
        for (int s = 0; s < steps; ++s) {
            const int k = s * kLanes;
            if (Hint) {
                for (int p = 0; p < lines_per_step; ++p)
                    _mm_prefetch(next + ((size_t)s * lines_per_step + p) * 64,
                                 Hint == 1 ? _MM_HINT_T0 : _MM_HINT_T1);
            }
            const vfloat xv = vload(x + k);
            for (int j = 0; j < kRows; ++j) acc[j] = vfma(xv, vload(w + (size_t)j * K + k), acc[j]);
        }
        for (int j = 0; j < kRows; ++j) y[t * kRows + j] = vsum(acc[j]);
    }
}

template <typename WT, int Hint>
double run(const std::vector<std::vector<WT>>& mats, const float* x, float* y, int N, int K) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (const auto& m : mats) gemv<WT, Hint>(x, m.data(), y, N, K);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return (double)mats.size() * N * K * sizeof(WT) / best / 1e9;
}

template <typename WT>
void shape(int N, int K, const char* name) {
    const size_t per = (size_t)N * K;
    const int n_mats = (int)std::max<size_t>(1, (400u << 20) / (per * sizeof(WT)));
    std::vector<std::vector<WT>> mats(n_mats, std::vector<WT>(per));
    std::vector<float> x(K), y(N);
    unsigned seed = 1;
    auto rnd = [&] { seed = seed * 1664525u + 1013904223u; return (float)(seed >> 8) / (1 << 24) - 0.5f; };
    for (auto& m : mats)
        for (auto& v : m) {
            if constexpr (sizeof(WT) == 4) v = rnd(); else v = f32_to_bf16(rnd());
        }
    for (auto& v : x) v = rnd();
    // correctness of every variant on the first matrix
    auto check = [&](auto fn) {
        std::fill(y.begin(), y.end(), NAN);
        fn(x.data(), mats[0].data(), y.data(), N, K);
        double worst = 0;
        for (int n = 0; n < N; ++n) {
            double ref = 0;
            for (int k = 0; k < K; ++k) ref += (double)x[k] * load_scalar(&mats[0][(size_t)n * K + k]);
            worst = std::max(worst, std::fabs(ref - y[n]));
        }
        return worst;
    };
    const double e0 = check(gemv<WT, 0>), e1 = check(gemv<WT, 1>), e2 = check(gemv<WT, 2>),
                 e3 = check(gemv<WT, 3>);
    const double g0 = run<WT, 0>(mats, x.data(), y.data(), N, K);
    const double g1 = run<WT, 1>(mats, x.data(), y.data(), N, K);
    const double g2 = run<WT, 2>(mats, x.data(), y.data(), N, K);
    const double g3 = run<WT, 3>(mats, x.data(), y.data(), N, K);
    std::printf("%-5s %-8s N=%6d K=%5d  none %5.1f  T0 %5.1f  T1 %5.1f  T1+2 %5.1f GB/s  (max err %.0e)\n",
                sizeof(WT) == 4 ? "f32" : "bf16", name, N, K, g0, g1, g2, g3,
                std::max(std::max(e0, e1), std::max(e2, e3)));
}

int main() {
    std::printf("threads %d, simd %s\n", omp_get_max_threads(), kSimdName);
    const struct { int N, K; const char* name; } shapes[] = {
        {960, 576, "wqkv"}, {576, 576, "wo"}, {3072, 576, "w13"}, {576, 1536, "w2"}, {49152, 576, "lm_head"}};
    for (const auto& s : shapes) shape<float>(s.N, s.K, s.name);
    for (const auto& s : shapes) shape<uint16_t>(s.N, s.K, s.name);
}
