// lab_timing.cuh — the labs' one way to time a chain of launches: capture it as a CUDA graph,
// replay it, take the median. A replay costs no host launch overhead, which is what decode's
// graphs see too.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/check.cuh"

namespace lab {

// Median microseconds of one replay of a graph of body(0) .. body(launches - 1) captured on
// `s`, over `replays` replays after `warmups` untimed ones.
template <class F>
double graph_replay_us(cudaStream_t s, int launches, F&& body, int replays = 22, int warmups = 3) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) body(i);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < warmups + replays; ++r) {
        CUDA_CHECK(cudaEventRecord(e0, s));
        CUDA_CHECK(cudaGraphLaunch(ge, s));
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (r >= warmups) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    return ms[ms.size() / 2] * 1e3;
}

}  // namespace lab
