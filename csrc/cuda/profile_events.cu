// profile_events.cu — EventClock (profile_events.cuh): cudaEvent timestamps for the profiler.
// No kernels here: only event bookkeeping on the engine stream.
#include "cuda/check.cuh"
#include "cuda/profile_events.cuh"

namespace brrr {
namespace cuda {

namespace {
constexpr size_t kFirstPool = 1024;
}

void EventClock::begin(cudaStream_t stream) {
    stream_ = stream;
    if (!ref_) CUDA_CHECK(cudaEventCreate(&ref_));
    CUDA_CHECK(cudaEventRecord(ref_, stream_));
    CUDA_CHECK(cudaEventSynchronize(ref_));
    host_ref_ = profile::now();
    while (pool_.size() < kFirstPool) {
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreate(&e));
        pool_.push_back(e);
    }
    used_ = 0;
}

void EventClock::release() noexcept {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    pool_.clear();
    if (ref_) cudaEventDestroy(ref_), ref_ = nullptr;
    used_ = 0;
}

int64_t EventClock::stamp() {
    cudaEvent_t e = nullptr;
    if (capture_) {
        CUDA_CHECK(cudaEventCreate(&e));
        capture_->push_back(e);
        CUDA_CHECK(cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal));
        return (int64_t)capture_->size() - 1;
    }
    if (used_ == pool_.size()) {
        const size_t grow = pool_.size();
        for (size_t i = 0; i < grow; ++i) {
            CUDA_CHECK(cudaEventCreate(&e));
            pool_.push_back(e);
        }
    }
    e = pool_[used_];
    CUDA_CHECK(cudaEventRecord(e, stream_));
    return (int64_t)used_++;
}

void EventClock::wait() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

double EventClock::seconds_of(cudaEvent_t event) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ref_, event));
    return host_ref_ + 1e-3 * ms;
}

double EventClock::elapsed_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return 1e-3 * ms;
}

double EventClock::elapsed(int64_t a, int64_t b) {
    return elapsed_between(pool_[(size_t)a], pool_[(size_t)b]);
}

}  // namespace cuda
}  // namespace brrr
