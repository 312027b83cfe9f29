// allreduce.h — one rank's side of the one-shot all-reduce (allreduce.cu): its IPC buffer, the
// peers' buffers opened in this process, and the checks that decide whether the kernel may run at
// all (every rank on this host, P2P between every pair of GPUs). NCCL carries the handle exchange.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cuda/nccl.h"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

class OneShotAllReduce {
public:
    OneShotAllReduce() = default;
    ~OneShotAllReduce() { close(); }
    OneShotAllReduce(const OneShotAllReduce&) = delete;
    OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

    // Collective over `comm` (every rank calls it with the same capacity and blocks, on its
    // engine's device and stream): allocates this rank's buffer for messages of up to
    // `capacity_bytes`, whose kernels launch `blocks` CTAs (their flags), exchanges
    // the IPC handles and host identities, opens the peers' buffers. Returns "" when the kernel
    // may run, else why it may not (the same words on every rank), holding nothing then. Throws
    // brrr::Error when a CUDA or NCCL call fails outright.
    std::string open(nccl::Comm comm, int rank, int size, size_t capacity_bytes, int blocks, cudaStream_t stream);
    // Closes the peers' buffers in this process (once this rank's kernels are done).
    void close_peers() noexcept;
    // close_peers, then frees this rank's buffer. CUDA leaves freeing an exported buffer before
    // every importer has closed it undefined, and a peer may still read it in its last kernel
    // after this rank's has finished: a clean end is leave(), on every rank.
    void close() noexcept;
    // The clean end, every rank together (a collective over `comm`): waits for this rank's
    // kernels on `stream`, close_peers, a barrier over the communicator (no rank frees its buffer
    // before every peer has closed it), then close. Never on a fault path: a dead peer would
    // leave the barrier waiting. Nothing to do when the group is not open.
    void leave(nccl::Comm comm, cudaStream_t stream);
    bool ready() const { return own_ != nullptr; }
    size_t capacity_bytes() const { return peers_.half_floats * sizeof(float); }
    // Largest message of run_ll: min(capacity_bytes(), tuning::kAllReduceLLMaxBytes).
    size_t ll_capacity_bytes() const { return 2 * peers_.ll_lines * sizeof(float); }
    // all_reduce_oneshot (ops.h) on this group: count floats, at most capacity_bytes().
    void run(const float* in, float* out, size_t count, cudaStream_t stream) const;
    // all_reduce_ll (ops.h) on this group: count floats, at most ll_capacity_bytes().
    void run_ll(const float* in, float* out, size_t count, cudaStream_t stream) const;
    // all_reduce_rows (ops.h) on this group: rows x D bf16 parts, at most capacity_bytes().
    void run_rows(const bf16* part, float* x, const bf16* norm_w, bf16* y, int rows, int D, float eps,
                  cudaStream_t stream) const;
    // NaN into the half of this rank's data region that the next call uses, so a test sees any
    // element read before it was written. Synchronizes `stream`.
    void poison(cudaStream_t stream) const;


private:
    AllReducePeers peers_;
    char* own_ = nullptr;
    size_t own_bytes_ = 0;
    std::vector<void*> opened_;  // peers' buffers from cudaIpcOpenMemHandle
};

}  // namespace cuda
}  // namespace brrr
