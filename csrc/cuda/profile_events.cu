// profile_events.cu — EventClock (profile_events.cuh): cudaEvent timestamps for the profiler, and
// the one kernel of the profiler, hold_kernel: a single thread that sleeps until the host releases
// the stream (or a timeout passes).
#include <atomic>

#include "cuda/check.cuh"
#include "cuda/profile_events.cuh"

namespace brrr {
namespace cuda {

namespace {
constexpr size_t kFirstPool = 1024;
constexpr unsigned long long kHoldTimeoutNs = 100ull * 1000 * 1000;

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hold_kernel(const volatile unsigned* gate, unsigned generation) {
    const unsigned long long t0 = global_ns();
    while ((int)(*gate - generation) < 0 && global_ns() - t0 < kHoldTimeoutNs) __nanosleep(1000);
}
}  // namespace

void EventClock::hold() {
    if (!gate_) {
        CUDA_CHECK(cudaHostAlloc(&gate_, sizeof(unsigned), cudaHostAllocMapped));
        *gate_ = generation_;
        CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&gate_device_), gate_, 0));
    }
    hold_kernel<<<1, 1, 0, stream_>>>(gate_device_, ++generation_);
    CUDA_CHECK_LAUNCH("hold_kernel");
    holding_ = true;
}

void EventClock::release_hold() {
    if (!gate_) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *reinterpret_cast<volatile unsigned*>(gate_) = generation_;
    holding_ = false;
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
    if (gate_) {
        *reinterpret_cast<volatile unsigned*>(gate_) = generation_;  // a held stream goes on
        if (stream_) cudaStreamSynchronize(stream_);
        cudaFreeHost(gate_);
        gate_ = gate_device_ = nullptr;
    }
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
