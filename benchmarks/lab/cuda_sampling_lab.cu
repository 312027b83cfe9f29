// cuda_sampling_lab.cu — times the sampler (ops.h sample_tokens) on the shapes decode gives it:
// B = 1, 16 and 256 rows of 128,256 logits, greedy and temperature > 0 with the common filters.
// Each variant is its own binary: this file linked with csrc/cuda/sampling.cu, or with a copy of
// it that run_sampling_lab.sh patched (benchmarks/lab/variants/sampling_*.patch).
//
// Prints one JSON line per (B, case): us per call (mean of 20 calls between two CUDA events, after
// 3 warm-up calls) and an FNV hash of the tokens drawn, so the script can tell which variants
// choose the same tokens as 01.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.cuh"
#include "cuda/ops.h"

using namespace brrr::cuda;

namespace {

struct Case {
    const char* name;
    brrr::SamplingParams p;
};

uint64_t fnv(const std::vector<int>& v) {
    uint64_t h = 1469598103934665603ull;
    for (int x : v) h = (h ^ (uint32_t)x) * 1099511628211ull;
    return h;
}

}  // namespace

int main() {
    const int V = 128256, kMaxB = 256, kMaxSeq = 64;
    std::mt19937 rng(7);
    std::normal_distribution<float> n01;
    std::vector<float> logits((size_t)kMaxB * V);
    for (auto& x : logits) x = 3.f * n01(rng);  // a random-weight model's spread
    std::vector<int> history((size_t)kMaxB * kMaxSeq), slots(kMaxB), positions(kMaxB, kMaxSeq - 1);
    for (auto& t : history) t = (int)(rng() % V);
    for (int b = 0; b < kMaxB; ++b) slots[b] = b;

    float *d_logits, *d_logprobs;
    int *d_history, *d_slots, *d_positions, *d_tokens;
    brrr::SamplingParams* d_params;
    uint64_t* d_steps;
    void* d_scratch;
    CUDA_CHECK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_history, history.size() * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_slots, kMaxB * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_positions, kMaxB * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_tokens, kMaxB * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_logprobs, kMaxB * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_params, kMaxB * sizeof(brrr::SamplingParams)));
    CUDA_CHECK(cudaMalloc(&d_steps, kMaxB * sizeof(uint64_t)));
    CUDA_CHECK(cudaMalloc(&d_scratch, sample_scratch_bytes(kMaxB, V)));
    CUDA_CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_history, history.data(), history.size() * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_slots, slots.data(), kMaxB * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_positions, positions.data(), kMaxB * sizeof(int), cudaMemcpyHostToDevice));

    // (temperature, top_k, top_p, min_p, repetition_penalty), seed 12345
    auto params = [](float t, int k, float top_p, float min_p, float penalty) {
        return brrr::SamplingParams{t, k, top_p, min_p, penalty, 12345};
    };
    const Case cases[] = {
        {"greedy", params(0.f, 0, 1.f, 0.f, 1.f)},
        {"t1", params(1.f, 0, 1.f, 0.f, 1.f)},
        {"t0.7_topk40", params(0.7f, 40, 1.f, 0.f, 1.f)},
        {"t0.8_topp0.95", params(0.8f, 0, 0.95f, 0.f, 1.f)},
        {"t0.8_all_filters", params(0.8f, 50, 0.95f, 0.02f, 1.2f)},
    };
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int B : {1, 16, 256}) {
        for (const Case& c : cases) {
            std::vector<brrr::SamplingParams> ps(B, c.p);
            std::vector<uint64_t> steps(B);
            for (int b = 0; b < B; ++b) steps[b] = 1000 + b;
            CUDA_CHECK(cudaMemcpy(d_params, ps.data(), B * sizeof(ps[0]), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(d_steps, steps.data(), B * sizeof(uint64_t), cudaMemcpyHostToDevice));
            auto call = [&] {
                sample_tokens(d_logits, d_history, d_slots, d_positions, d_params, d_steps, B, V, kMaxSeq, d_scratch,
                              d_tokens, d_logprobs, SampleFeedBack{}, 0);
            };
            for (int i = 0; i < 3; ++i) call();
            CUDA_CHECK(cudaEventRecord(e0));
            constexpr int kCalls = 20;
            for (int i = 0; i < kCalls; ++i) call();
            CUDA_CHECK(cudaEventRecord(e1));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0.f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            std::vector<int> tokens(B);
            CUDA_CHECK(cudaMemcpy(tokens.data(), d_tokens, B * sizeof(int), cudaMemcpyDeviceToHost));
            std::printf("{\"B\": %d, \"case\": \"%s\", \"us\": %.2f, \"tokens_fnv\": \"%016llx\"}\n", B, c.name,
                        1000.f * ms / kCalls, (unsigned long long)fnv(tokens));
            std::fflush(stdout);
        }
    }
    return 0;
}
