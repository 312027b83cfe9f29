// check.cuh — every CUDA runtime call and kernel launch goes through these, so a failure becomes a
// brrr::Error "file:line: <call or launcher>: <CUDA's error string>" instead of a silent wrong
// answer. cudaErrorMemoryAllocation becomes brrr::OutOfMemory (Python MemoryError) with the free
// device memory in the message.
//
//   CUDA_CHECK(cudaMemcpyAsync(...));      any runtime call returning cudaError_t
//   kernel<<<grid, block, smem, stream>>>(...);
//   CUDA_CHECK_LAUNCH();                   after every launch; names the enclosing launcher
//   CUDA_CHECK_LAUNCH("rmsnorm_vec8");     ... or the kernel, when a launcher has several
//
// Launch errors (bad grid, too much shared memory) are reported by cudaGetLastError at once;
// faults inside a kernel only surface at the next synchronizing call, which is checked too.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common.h"

namespace brrr {
namespace cuda {

inline std::string gib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

// Free device memory right now, or 0 when even that query fails (the message still helps).
inline size_t free_device_bytes() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return free_b;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
    // A failed allocation is not sticky: clear it so the next launch check does not report it.
    if (err == cudaErrorMemoryAllocation) cudaGetLastError();
    brrr::Message os;
    os << brrr::where(file, line) << what << ": " << cudaGetErrorName(err) << " ("
       << cudaGetErrorString(err) << ")";
    if (err == cudaErrorMemoryAllocation) {
        os << "; " << gib(free_device_bytes()) << " free on the device";
        throw brrr::OutOfMemory(os.str());
    }
    throw brrr::Error(os.str());
}

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
    if (err != cudaSuccess) throw_cuda_error(err, what, file, line);
}

// `name` is "" when the caller gave none; then the enclosing function names the launch.
inline void check_launch(const char* file, int line, const char* func, const char* name) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return;
    std::string what = std::string("launch in ") + func;
    if (name[0]) what += std::string(" (") + name + ")";
    throw_cuda_error(err, what.c_str(), file, line);
}

}  // namespace cuda
}  // namespace brrr

#define CUDA_CHECK(call) ::brrr::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH(...) \
    ::brrr::cuda::check_launch(__FILE__, __LINE__, __func__, "" __VA_ARGS__)
