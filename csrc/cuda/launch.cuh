// launch.cuh — programmatic dependent launch (PDL) for the decode chain, the device facts the
// launchers ask for (SM count, compute capability), cached per device, and the answers about
// kernels they ask for (occupancy, shared-memory attributes), remembered per kernel and device.
//
// A batch-1 decode step is ~100 short kernels; between two of them the GPU normally drains the
// first grid completely before the second one's CTAs start, a gap of a few microseconds per kernel
// that no amount of bandwidth wins back. On Hopper a kernel launched with PDL may start while its
// predecessor is still running: its CTAs become resident, set up (and may do work that does not
// depend on the predecessor), then block in pdl_wait() until the predecessor has finished and its
// writes are visible. A PDL kernel calls pdl_launch_dependents() right after its own wait (the
// CUDA-core GEMV before it: below), so the chain stays ordered:
//
//   kernel N-1   [=========== body ===========]
//   kernel N          [setup | wait ..........][==== body ====]
//
// Rules for a kernel launched through launch_pdl: every CTA waits before it exits, and triggers
// after its wait, except the CUDA-core GEMV (gemv.cu, what M = 1 takes), which triggers before it
// so that the next kernel's CTAs can take the room its single-wave grids leave. Behind a run of
// GEMVs a kernel may therefore start while kernels several back still run. Before pdl_wait() a kernel may read data
// no earlier kernel of the stream writes (weights) and data written before the current decode
// step (positions, slots, earlier tokens' K/V): the step's first kernel (embed, or a plain launch)
// triggers after its wait, so everything before it has completed when anything after it starts.
// Read the latter through L2 (ld.global.cg, cp.async.cg), never L1, which an earlier kernel may
// have left stale. After the wait, anything.
// Kernels launched plainly after a PDL kernel are fully ordered as usual. Below sm_90 both device
// calls compile to nothing and the launch attribute is not set, so the same code runs serialized
// on Ampere. CUDA graphs capture the attribute as a programmatic edge, so replayed decode steps
// overlap the same way.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/check.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

// Blocks until every earlier grid of the stream has completed and its memory is visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL kernel of the stream start launching its CTAs.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Facts of the current device, asked once per device id.
struct DeviceFacts {
    int sm_count;
    int major;     // compute capability
    int l2_bytes;     // L2 cache size
    int smem_optin;   // shared memory one CTA may opt in to (sm_80 163 KB, sm_86/89 99 KB, sm_90 227 KB)
    int smem_per_sm;  // shared memory an SM can hold, what a carveout percentage is of (sm_90 228 KB)
};

inline DeviceFacts device_facts() {
    // sm_count is stored last: a reader that sees it non-zero sees the others.
    // 0 = not asked yet
    static std::atomic<int> cached_sms[64], cached_major[64], cached_l2[64], cached_smem[64], cached_sm_smem[64];
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const bool cacheable = dev >= 0 && dev < 64;
    if (cacheable && cached_sms[dev].load() > 0)
        return {cached_sms[dev].load(), cached_major[dev].load(), cached_l2[dev].load(), cached_smem[dev].load(),
                cached_sm_smem[dev].load()};
    DeviceFacts f{0, 0, 0, 0, 0};
    CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&f.l2_bytes, cudaDevAttrL2CacheSize, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    if (cacheable) {
        cached_major[dev].store(f.major);
        cached_l2[dev].store(f.l2_bytes);
        cached_smem[dev].store(f.smem_optin);
        cached_sm_smem[dev].store(f.smem_per_sm);
        cached_sms[dev].store(f.sm_count);
    }
    return f;
}

// Whether `kernel` runs here as sm_90a code: a Hopper device, and a build that holds the kernel's
// sm_90a image (LLAMA_BRRR_CUDA_ARCHS has 90a; the sm_80 image of a wgmma / TMA kernel only traps).
// Asked once per device (per kernel signature: the answer is the build's, the same for all).
template <typename... KernelArgs>
bool runs_sm90a(void (*kernel)(KernelArgs...)) {
    static std::atomic<int> state[64];  // per device: 0 unknown, 1 yes, 2 no
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64) return false;
    int s = state[dev].load(std::memory_order_relaxed);
    if (s == 0) {
        cudaFuncAttributes attr;
        const bool has_code = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
        cudaGetLastError();  // a missing image is an answer here, not an error to report later
        s = device_facts().major == 9 && has_code ? 1 : 2;
        state[dev].store(s, std::memory_order_relaxed);
    }
    return s == 1;
}

// ---- answers about kernels, remembered --------------------------------------------------------
// An occupancy query or a function attribute costs host microseconds, and a launcher asks the same
// few of them about the same kernels on every launch (eager ones: a captured graph replays none).
// One table for the process, under a lock, keyed by (kernel, device, question, its arguments).
// Every change of a function attribute goes through here, so the table knows each one's value.
namespace memo {

enum class Question { ResidentCtas, MaxDynamicSmem, Carveout };
using Key = std::tuple<const void*, int, Question, int, size_t>;

struct Table {
    std::mutex lock;
    std::map<Key, int> answers;
};

inline Table& table() {
    static Table t;
    return t;
}

inline int current_device() {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return dev;
}

}  // namespace memo

// CTAs of `kernel` at `threads` threads and `smem` bytes of dynamic shared memory that fit on the
// current GPU at once (0: not even one an SM).
template <typename... KernelArgs>
int resident_ctas(void (*kernel)(KernelArgs...), int threads, size_t smem) {
    const memo::Key key{reinterpret_cast<const void*>(kernel), memo::current_device(), memo::Question::ResidentCtas,
                        threads, smem};
    memo::Table& t = memo::table();
    std::lock_guard<std::mutex> hold(t.lock);
    const auto seen = t.answers.find(key);
    if (seen != t.answers.end()) return seen->second;
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const int ctas = per_sm * device_facts().sm_count;
    t.answers.emplace(key, ctas);
    return ctas;
}

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current device (past
// 48 KB the opt-in). Only ever raised, so a launch of fewer bytes never lowers the limit under
// another launch of the same kernel that needs more.
template <typename... KernelArgs>
void allow_dynamic_smem(void (*kernel)(KernelArgs...), size_t bytes) {
    const memo::Key key{reinterpret_cast<const void*>(kernel), memo::current_device(),
                        memo::Question::MaxDynamicSmem, 0, 0};
    memo::Table& t = memo::table();
    std::lock_guard<std::mutex> hold(t.lock);
    const auto seen = t.answers.find(key);
    if (seen != t.answers.end() && (size_t)seen->second >= bytes) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    t.answers[key] = (int)bytes;
}

// Asks for `percent` of the SM's unified L1 / shared memory as shared memory when `kernel` runs
// on the current device (a preference the driver rounds up to a size it offers).
template <typename... KernelArgs>
void prefer_carveout(void (*kernel)(KernelArgs...), int percent) {
    const memo::Key key{reinterpret_cast<const void*>(kernel), memo::current_device(), memo::Question::Carveout, 0,
                        0};
    memo::Table& t = memo::table();
    std::lock_guard<std::mutex> hold(t.lock);
    const auto seen = t.answers.find(key);
    if (seen != t.answers.end() && seen->second == percent) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
    t.answers[key] = percent;
}

// Whether launch_pdl sets the PDL attribute: tuning::kPdlEnv (LLAMA_BRRR_PDL=0 turns it off),
// read once per process.
inline bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv(tuning::kPdlEnv);
        if (v == nullptr || *v == '\0') return true;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        return *end != '\0' || n != 0;  // only an integer 0 turns it off
    }();
    return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization on sm_90+.
// The caller checks the launch with CUDA_CHECK_LAUNCH as after any launch.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = device_facts().major >= 9 && pdl_enabled() ? 1 : 0;
    // A launch error is left for the caller's CUDA_CHECK_LAUNCH, exactly like <<<...>>>.
    (void)cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

}  // namespace cuda
}  // namespace brrr
