// engine_cuda.h — the CUDA backend as the host code sees it: a factory and a device count.
// Plain C++ (no CUDA types), so the bindings (csrc/bindings/) and other host sources can include
// it; the engine itself lives in engine.cu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "model.h"

namespace brrr {

// An Engine whose weights, KV cache and forward pass live on GPU `device`. weight_dtype is the
// storage type of the weights on the device (bf16; f16 inputs are converted to it).
// Throws brrr::Error for a bad config or device, brrr::OutOfMemory when the model, KV cache and
// scratch do not fit (the message names the bytes requested and free, and what to lower).
// quant_types: canonical matrix name -> GGML type id of the matrices kept quantized (cuda/qlayout.h).
std::unique_ptr<Engine> make_cuda_engine(const Config& config, DType weight_dtype, int device,
                                         const std::unordered_map<std::string, int>& quant_types = {});

// Number of usable CUDA devices; 0 when there is no GPU or no driver. Never throws.
int cuda_device_count();

// The key of canonical tensor `tensor_index` (weight_names order) under init_random(seed): the
// CPU engine's rule. With fill_normal_bf16(p, numel, key, mean, std) it reproduces the engine's
// random weights anywhere (benchmarks build their PyTorch opponents from it).
uint64_t init_random_key(uint64_t seed, size_t tensor_index);

// Decode replays one CUDA graph per batch size (on by default); off runs every kernel eagerly.
// A no-op for engines that are not CUDA engines, so callers need not know the backend.
void cuda_set_use_graphs(Engine& engine, bool on);
bool cuda_use_graphs(const Engine& engine);

// Where a CUDA engine's device memory went (bytes of its one arena): weights, the KV cache pool,
// the other buffers, and among those the scratch long prompts dequantize quantized matrices into:
// the largest such matrix whole, or about the L2 (dequant_sliced) where a whole one would not fit
// under gpu_memory_utilization beside the KV cache. False for engines that are not CUDA engines.
struct CudaMemoryUse {
    size_t weights = 0, kv_cache = 0, buffers = 0, dequant_scratch = 0;
    bool dequant_sliced = false;
};
bool cuda_memory_use(const Engine& engine, CudaMemoryUse* out);

// Tensor parallelism (cuda/nccl.h): a new NCCL id (128 bytes), loading libnccl from `library`
// ("" = libnccl.so.2 by the loader's search) on first use.
std::string cuda_nccl_unique_id(const std::string& library);
// Makes `engine` (built with this rank's shard of the model) rank `rank` of `size`: from then on
// every forward pass sums the residual stream over the ranks after wo and w2. Blocks until every
// rank has joined. Throws brrr::Error for an engine that is not a CUDA engine.
void cuda_init_tensor_parallel(Engine& engine, const std::string& unique_id, int rank, int size,
                               const std::string& library);

// The group's all-reduce, for tests and benchmarks. Residual messages of at most oneshot_max_bytes
// take the one-shot IPC kernel when `oneshot` (every rank on one host, P2P between all GPUs), else
// NCCL; why_not says why the one-shot kernel is off ("" when on, or on a single GPU).
struct CudaAllReduceInfo {
    bool oneshot = false;
    size_t oneshot_max_bytes = 0;
    size_t ll_max_bytes = 0;  // residual messages up to this take all_reduce_ll (0: none)
    std::string why_not;
};
CudaAllReduceInfo cuda_all_reduce_info(Engine& engine);
// Every rank calls these together, with the same count / bytes and method ("nccl" | "oneshot" | "ll"):
// out = the sum over the ranks of their `in` (count floats, host memory, a multiple of 4); and the
// median microseconds per all-reduce of `bytes` captured `iters` times into one CUDA graph and
// replayed `repeats` times. brrr::InvalidArgument for a bad method, size or an engine outside a
// group; brrr::Error for "oneshot" where it is off.
void cuda_all_reduce(Engine& engine, const float* in, float* out, size_t count, const std::string& method);
double cuda_all_reduce_bench(Engine& engine, size_t bytes, const std::string& method, int iters, int repeats);
// Every rank together, on a normal stop before the engines are dropped: ends the one-shot group
// cleanly (a peer's buffer is unmapped everywhere before its owner frees it). A no-op for engines
// outside a group or not on CUDA.
void cuda_leave_tensor_parallel(Engine& engine);

}  // namespace brrr
