// nccl.h — the NCCL calls tensor parallelism makes, resolved at run time from libnccl.so.2, so the
// build needs no NCCL headers and a process that never runs tensor-parallel never loads it.
//
// The declarations below follow NCCL's stable C ABI (nccl.h of NCCL 2.x): ncclUniqueId is 128
// opaque bytes, a communicator an opaque pointer, results ints (0 = success), ncclInt8 = 0,
// ncclFloat32 = 7, ncclBfloat16 = 9 (NCCL 2.10 on), ncclSum = 0. All calls are stream-ordered and
// may be captured into CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace brrr {
namespace cuda {
namespace nccl {

struct UniqueId {
    char bytes[128];
};
using Comm = void*;

// Loads libnccl (`library`: a path, or "" for the dynamic loader's search of libnccl.so.2) once per
// process; throws brrr::Error naming what was tried when it cannot.
void load(const std::string& library);
// A fresh communicator id (rank 0 makes it; every rank passes it to init_rank).
UniqueId unique_id();
// Joins the `size`-rank communicator as `rank` on the current device; blocks until all have joined.
Comm init_rank(const UniqueId& id, int rank, int size);
// Sum over the ranks of `count` floats at `in` into `out` (in == out: in place), ordered on `stream`.
void all_reduce_sum(const float* in, float* out, size_t count, Comm comm, cudaStream_t stream);
// The same over `count` bf16 values (NCCL adds in fp32 and rounds each step's sum to bf16).
void all_reduce_sum(const __nv_bfloat16* in, __nv_bfloat16* out, size_t count, Comm comm, cudaStream_t stream);
// Rank r's `bytes` bytes at `in` (device memory) land at out + r * bytes on every rank, ordered on
// `stream`; out holds size * bytes.
void all_gather_bytes(const void* in, void* out, size_t bytes, Comm comm, cudaStream_t stream);
// Frees the communicator (noexcept: engines call it while releasing).
void destroy(Comm comm) noexcept;

}  // namespace nccl
}  // namespace cuda
}  // namespace brrr
