// profile_events.cuh — EventClock: the profile::Clock of the CUDA engine (csrc/profile/profile.h).
// A mark is a cudaEvent recorded on the engine stream; its time is the event's elapsed time since a
// reference event that was recorded (and waited for) when profiling was switched on, placed on the
// host steady_clock timeline at that moment. Events come from a pool created when profiling is
// switched on and grown on demand, never on the unprofiled path; take() recycles them.
//
// Capture mode: while capture_into(list) is set, each stamp creates a fresh event, records it as an
// external event node of the graph being captured (cudaEventRecordExternal) and returns its index in
// `list`; the graph owns those events and the engine reads them after each replay (seconds_of).
//
// Hold: an eager decode pass launched while profiling is bracketed by hold() / release(). hold()
// enqueues a kernel that spins until release() flips a flag in mapped host memory, so the GPU
// starts the pass only once the host has enqueued all of it. Without it a GPU that outruns the
// host waits inside a kernel's [start, end] marks for the host to launch that kernel, and launch
// overhead would be booked as kernel time. The spin time itself is in no record: it is overhead.
// The wait gives up after kHoldTimeoutNs, so a host that blocks while holding costs time, not a hang.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "profile/profile.h"

namespace brrr {
namespace cuda {

class EventClock final : public profile::Clock {
public:
    ~EventClock() override { release(); }
    // Records the reference event on `stream` and waits for it; creates the first pool.
    void begin(cudaStream_t stream);
    void release() noexcept;

    int64_t stamp() override;
    // Held, the GPU runs the ops back to back: one mark between two ops is their boundary.
    bool separate_end_marks() const override { return !holding_; }
    void wait() override;
    double seconds(int64_t mark) override { return seconds_of(pool_[(size_t)mark]); }
    double elapsed(int64_t a, int64_t b) override;
    void recycle() override { used_ = 0; }

    void capture_into(std::vector<cudaEvent_t>* list) { capture_ = list; }
    void hold();
    void release_hold();
    bool holding() const { return holding_; }
    // A completed event's time on the host timeline.
    double seconds_of(cudaEvent_t event);
    double elapsed_between(cudaEvent_t a, cudaEvent_t b);

private:
    cudaStream_t stream_ = nullptr;
    cudaEvent_t ref_ = nullptr;
    double host_ref_ = 0;
    std::vector<cudaEvent_t> pool_;
    size_t used_ = 0;
    std::vector<cudaEvent_t>* capture_ = nullptr;
    unsigned* gate_ = nullptr;         // mapped pinned host memory: the generation released last
    unsigned* gate_device_ = nullptr;  // its device address
    unsigned generation_ = 0;
    bool holding_ = false;
};

}  // namespace cuda
}  // namespace brrr
