// nccl.cu — nccl.h's calls through dlopen/dlsym of libnccl.so.2 (see nccl.h for why).
#include "cuda/nccl.h"

#include <dlfcn.h>

#include <mutex>

#include "common.h"

namespace brrr {
namespace cuda {
namespace nccl {

namespace {

constexpr int kInt8 = 0;     // ncclInt8
constexpr int kFloat32 = 7;  // ncclFloat32
constexpr int kBfloat16 = 9;  // ncclBfloat16
constexpr int kSum = 0;      // ncclSum

struct Api {
    void* handle = nullptr;
    int (*get_unique_id)(UniqueId*) = nullptr;
    int (*comm_init_rank)(Comm*, int, UniqueId, int) = nullptr;
    int (*all_reduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
    int (*all_gather)(const void*, void*, size_t, int, Comm, cudaStream_t) = nullptr;
    int (*comm_destroy)(Comm) = nullptr;
    const char* (*error_string)(int) = nullptr;
};

Api& api() {
    static Api a;
    return a;
}
std::mutex& api_mutex() {
    static std::mutex m;
    return m;
}

template <typename F>
void resolve(void* handle, const char* name, F* fn) {
    *fn = reinterpret_cast<F>(dlsym(handle, name));
    BRRR_CHECK(*fn, "libnccl has no symbol " << name << ": it is not an NCCL 2 library");
}

void check(int result, const char* call) {
    if (result == 0) return;
    const char* why = api().error_string ? api().error_string(result) : "unknown";
    BRRR_FAIL("NCCL " << call << " failed with error " << result << " (" << why << ")");
}

const Api& loaded() {
    BRRR_CHECK(api().handle, "NCCL is not loaded: call nccl::load first");
    return api();
}

}  // namespace

void load(const std::string& library) {
    std::lock_guard<std::mutex> lock(api_mutex());
    Api& a = api();
    if (a.handle) return;
    const std::string name = library.empty() ? "libnccl.so.2" : library;
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* why = dlerror();
        BRRR_FAIL("cannot load NCCL from '" << name << "' (" << (why ? why : "unknown error")
                  << "): install it (pip install nvidia-nccl-cu12, which PyTorch's CUDA wheels bring) "
                     "or pass the path of libnccl.so.2");
    }
    Api next;
    next.handle = handle;
    resolve(handle, "ncclGetUniqueId", &next.get_unique_id);
    resolve(handle, "ncclCommInitRank", &next.comm_init_rank);
    resolve(handle, "ncclAllReduce", &next.all_reduce);
    resolve(handle, "ncclAllGather", &next.all_gather);
    resolve(handle, "ncclCommDestroy", &next.comm_destroy);
    resolve(handle, "ncclGetErrorString", &next.error_string);
    a = next;
}

UniqueId unique_id() {
    UniqueId id{};
    check(loaded().get_unique_id(&id), "ncclGetUniqueId");
    return id;
}

Comm init_rank(const UniqueId& id, int rank, int size) {
    BRRR_CHECK(size >= 1 && rank >= 0 && rank < size,
               "tensor parallel: rank " << rank << " is not in [0, " << size << ")");
    Comm comm = nullptr;
    check(loaded().comm_init_rank(&comm, size, id, rank), "ncclCommInitRank");
    return comm;
}

void all_reduce_sum(const float* in, float* out, size_t count, Comm comm, cudaStream_t stream) {
    check(loaded().all_reduce(in, out, count, kFloat32, kSum, comm, stream), "ncclAllReduce");
}

void all_reduce_sum(const __nv_bfloat16* in, __nv_bfloat16* out, size_t count, Comm comm, cudaStream_t stream) {
    check(loaded().all_reduce(in, out, count, kBfloat16, kSum, comm, stream), "ncclAllReduce (bf16)");
}

void all_gather_bytes(const void* in, void* out, size_t bytes, Comm comm, cudaStream_t stream) {
    check(loaded().all_gather(in, out, bytes, kInt8, comm, stream), "ncclAllGather");
}

void destroy(Comm comm) noexcept {
    if (comm && api().comm_destroy) api().comm_destroy(comm);
}

}  // namespace nccl
}  // namespace cuda
}  // namespace brrr
