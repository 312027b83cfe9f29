// allreduce.cu — the one-shot all-reduce of tensor parallelism on the GPUs of one host: every rank
// ends with out = sum over the ranks of their `in` (fp32, count floats), in one kernel launch that
// CUDA graphs capture like any other.
//
// Shapes: count a multiple of 4 (the residual stream's rows x dim; dim is), at most the capacity
// the group was opened with (tuning::all_reduce_oneshot_max_bytes in the engine); 2 to 8 ranks.
//
// The trick (the "custom all-reduce" of vLLM and SGLang): each rank owns one IPC-shareable buffer
// (flags, round counters, a data region of two halves) whose address every peer has opened. The
// kernel copies in into its own half, raises a flag in every peer's buffer, waits for every peer's
// flag, then reads every rank's half over NVLink / PCIe P2P and writes the sum. Small messages pay
// one launch and one flag round trip instead of NCCL's protocol steps.
//
// Decode messages (up to tuning::kAllReduceLLMaxBytes) take all_reduce_ll, the low-latency form:
// no barrier, no copy into the own half and no read across the links. Each rank stores its values
// straight into its slot in every peer's buffer as 16-byte lines {v0, round, v1, round} (a flag
// beside every value, NCCL's "LL" protocol), then polls its own slots, local memory, until both
// flags of each line show this round, and sums in rank order. A value is on the links once, in
// one direction, at twice the bytes.
//
// Prefill chunks (past the one-shot capacity) cross the links as bf16: each rank's wo / w2 GEMM
// stores its partial product in bf16 (the rounding any bf16 GEMM output has), half the bytes of
// the fp32 residual, which itself is never rounded. Two ways to sum them:
//   - all_reduce_rows (a 2-rank group, opened with rows_ x dim bf16 halves and
//     tuning::kAllReduceRowsBlocks CTAs): the same buffer, flags and barrier as the one-shot
//     kernel, by rows. CTA b copies rows b, b + blocks, ... of its part into its half, meets the
//     peers' CTAs b, then for each of those rows sums every rank's part in fp32 in rank order, adds
//     the sum into x and, when given norm weights, writes y = bf16(rmsnorm(x) * w) for the next
//     matmul: the sum, the add and the RMSNorm pass in one kernel, each rank reading its peer's part
//     once over the links (at N ranks (N - 1) x the part, where a ring moves 2 (N - 1) / N x: equal
//     at 2, which is why larger groups take NCCL).
//   - NCCL's bf16 all-reduce, then add_bf16_into_f32 (x[i] += float(partial[i])) or rmsnorm_add_bf16.
//
// Invariants:
//   - Pairing. CTA b of every rank copies and later reads the same elements (a fixed grid of the
//     group's blocks, the same on every rank: element e in CTA (e / threads) mod blocks, row m in
//     CTA m mod blocks), and waits only for the flags of the peers' CTAs b: a flag says exactly
//     "my part of this round is in".
//   - Rounds. Flags are never reset: CTA b's round counter lives in device memory (a graph replay
//     advances it like an eager call) and every rank makes the same calls in the same order, so
//     the peers' CTAs b count the same rounds; a wait is "flag >= round" in wrapping arithmetic.
//   - Double buffering, one barrier. Round k uses half k mod 2. Before rank A's CTA b overwrites
//     half k mod 2 in round k + 2, it passed round k + 1's barrier, so every peer's CTA b wrote its
//     round k + 1 flag, after its pdl_wait, so that peer's whole round-k kernel (every read of A's
//     half k mod 2) had completed. Every CTA takes part in every call, so this holds for all CTAs.
//   - Identical results. Every rank adds the halves in rank order 0..N-1 in fp32: bit-identical
//     sums on every rank, which then sample identical tokens.
//   - Memory order. Copies, then __syncthreads, then st.release.sys of the flags (cumulative over
//     the CTA's writes); ld.acquire.sys of the peers' flags, then __syncthreads, then the reads,
//     16 bytes each through L2 (ld.global.cg), never a stale L1 line.
//   - LL lines. A line is stored and polled as one 16-byte volatile access, and a reader takes a
//     half {value, round} whose flag reads `round` as holding that round's value. The PTX model
//     promises atomicity only per 4-byte element of a vector access; the hardware writes an
//     aligned 16-byte store whole, which NCCL's LL protocol relies on in the same way. Rounds are CTA b's counter, as above (the same grid and element mapping as
//     the one-shot kernel, whose calls share the counters); a slot line of half k mod 2 was last
//     written in round k - 2 or earlier, so no stale flag equals the round. The halves' reuse is
//     safe by the same argument as the one-shot kernel's: a rank in round k has every peer's
//     round k - 1 lines, stored after that peer's pdl_wait, so every read of round k - 2 is done.
//     The slots are their own region: no value of the other kernels is ever read as a flag.
//   - PDL: pdl_wait before anything (in is the previous kernel's output, the counters the previous
//     call's), then trigger, as the decode chain's rule says (launch.cuh). The fixed grid is far
//     within the GPU's resident CTAs (tuning.h), so every CTA is resident while it spins.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <type_traits>

#include "cuda/allreduce.h"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kThreads = tuning::kAllReduceOneShotThreads;
constexpr int kRowThreads = tuning::kAllReduceRowsThreads;
constexpr int kMaxRanks = AllReducePeers::kMaxRanks;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

__device__ __forceinline__ void store_release_sys(unsigned* p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire_sys(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The barrier of round `round` for CTA blockIdx.x, after its copy into its half: publish it to the
// peers' CTAs of the same index, wait for theirs. Every thread of the CTA calls it.
template <int N>
__device__ __forceinline__ void meet_peers(const AllReducePeers& p, unsigned round) {
    const int b = blockIdx.x, t = threadIdx.x;
    __syncthreads();
    if (t == 0) p.counters[b] = round;  // every thread read it before the barrier above
    if (t < N && t != p.rank) {
        store_release_sys(p.signals[t] + b * kMaxRanks + p.rank, round);
        const unsigned* flag = p.signals[p.rank] + b * kMaxRanks + t;
        while (static_cast<int>(load_acquire_sys(flag) - round) < 0) {
        }
    }
    __syncthreads();
}

template <int N>
__global__ void __launch_bounds__(kThreads) all_reduce_oneshot_kernel(const float4* in, float4* out, int n4,
                                                                     AllReducePeers p) {
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned round = p.counters[b] + 1u;
    const size_t half = (round & 1u) * p.half_floats;
    const int stride = gridDim.x * blockDim.x;

    float4* mine = reinterpret_cast<float4*>(p.data[p.rank] + half);
    for (int e = b * blockDim.x + t; e < n4; e += stride) mine[e] = in[e];
    meet_peers<N>(p, round);

    const float4* src[N];
#pragma unroll
    for (int r = 0; r < N; ++r) src[r] = reinterpret_cast<const float4*>(p.data[r] + half);
    for (int e = b * blockDim.x + t; e < n4; e += stride) {
        float4 v[N];
#pragma unroll
        for (int r = 0; r < N; ++r) v[r] = __ldcg(src[r] + e);
        float4 s = v[0];
#pragma unroll
        for (int r = 1; r < N; ++r) {
            s.x += v[r].x;
            s.y += v[r].y;
            s.z += v[r].z;
            s.w += v[r].w;
        }
        out[e] = s;
    }
}

// One 16-byte line, stored into a peer's memory or polled in one's own, bypassing L1.
__device__ __forceinline__ void store_line_volatile(uint4* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ uint4 load_line_volatile(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Two values a thread per step: line e of this rank's slot in every peer, then the peers' lines e
// of this rank's slots, summed in rank order (the one-shot kernel's order, so the same bits).
template <int N>
__global__ void __launch_bounds__(kThreads) all_reduce_ll_kernel(const float2* in, float2* out, int n2,
                                                                AllReducePeers p) {
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned round = p.counters[b] + 1u;
    const size_t half = (round & 1u) * (size_t)N * p.ll_lines;  // in lines
    const int stride = gridDim.x * blockDim.x;
    for (int e = b * blockDim.x + t; e < n2; e += stride) {
        const float2 v = in[e];
        const uint4 line = make_uint4(__float_as_uint(v.x), round, __float_as_uint(v.y), round);
#pragma unroll
        for (int r = 0; r < N; ++r)
            if (r != p.rank) store_line_volatile(p.lines[r] + half + (size_t)p.rank * p.ll_lines + e, line);
        float2 part[N];
#pragma unroll
        for (int r = 0; r < N; ++r) {
            if (r == p.rank) {
                part[r] = v;
                continue;
            }
            const uint4* src = p.lines[p.rank] + half + (size_t)r * p.ll_lines + e;
            uint4 got = load_line_volatile(src);
            while (got.y != round || got.w != round) got = load_line_volatile(src);
            part[r] = make_float2(__uint_as_float(got.x), __uint_as_float(got.z));
        }
        float2 sum = part[0];
#pragma unroll
        for (int r = 1; r < N; ++r) sum.x += part[r].x, sum.y += part[r].y;
        out[e] = sum;
    }
    __syncthreads();  // every thread read counters[b] above
    if (t == 0) p.counters[b] = round;
}

// Eight bf16 values as floats, added into s.
__device__ __forceinline__ void add_bf16x8(const uint4& v, float (&s)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        s[2 * j] += util::bf16_lo(w[j]);
        s[2 * j + 1] += util::bf16_hi(w[j]);
    }
}

// Rows of D values (D % 8 == 0), 8 a thread per step: part and y bf16, x fp32; w null: no norm.
template <int N>
__global__ void __launch_bounds__(kRowThreads) all_reduce_rows_kernel(const uint4* part, float4* x, const uint4* w,
                                                                     uint4* y, int rows, int D, float eps,
                                                                     AllReducePeers p) {
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.x, t = threadIdx.x, n8 = D / 8;
    const unsigned round = p.counters[b] + 1u;
    const size_t half = (round & 1u) * p.half_floats;

    uint4* mine = reinterpret_cast<uint4*>(p.data[p.rank] + half);
    for (int m = b; m < rows; m += gridDim.x)
        for (int i = t; i < n8; i += blockDim.x) mine[(size_t)m * n8 + i] = part[(size_t)m * n8 + i];
    meet_peers<N>(p, round);

    const uint4* src[N];
#pragma unroll
    for (int r = 0; r < N; ++r) src[r] = reinterpret_cast<const uint4*>(p.data[r] + half);
    for (int m = b; m < rows; m += gridDim.x) {
        const size_t row8 = (size_t)m * n8;
        float4* xr = x + 2 * row8;
        float sum_sq = 0.f;
        for (int i = t; i < n8; i += blockDim.x) {
            uint4 v[N];
#pragma unroll
            for (int r = 0; r < N; ++r) v[r] = __ldcg(src[r] + row8 + i);
            float s[8] = {};
#pragma unroll
            for (int r = 0; r < N; ++r) add_bf16x8(v[r], s);
            float4 lo = xr[2 * i], hi = xr[2 * i + 1];
            lo.x += s[0], lo.y += s[1], lo.z += s[2], lo.w += s[3];
            hi.x += s[4], hi.y += s[5], hi.z += s[6], hi.w += s[7];
            xr[2 * i] = lo;
            xr[2 * i + 1] = hi;
            sum_sq += lo.x * lo.x + lo.y * lo.y + lo.z * lo.z + lo.w * lo.w;
            sum_sq += hi.x * hi.x + hi.y * hi.y + hi.z * hi.z + hi.w * hi.w;
        }
        if (!w) continue;
        const float rstd = rsqrtf(util::block_sum(sum_sq) / (float)D + eps);
        for (int i = t; i < n8; i += blockDim.x) {  // this thread's own x values, just written
            y[row8 + i] = util::rmsnorm_bf16x8(xr[2 * i], xr[2 * i + 1], rstd, w[i]);
        }
    }
}

// What one rank tells the others in the first exchange.
struct RankCard {
    cudaIpcMemHandle_t handle;
    char pci[32];        // the GPU's PCI bus id, to find its device index in every process
    uint64_t host;       // hostname and boot id, hashed: equal on one machine (one OS instance)
    char why_not[160];   // this rank's own reason the one-shot path cannot run, or ""
};
constexpr size_t kWhyBytes = sizeof(RankCard::why_not);

uint64_t host_identity() {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    std::string key = name;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    if (boot >> boot_id) key += "/" + boot_id;
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    return h;
}

void set_why(char* dst, const std::string& why) {
    std::memset(dst, 0, kWhyBytes);
    std::memcpy(dst, why.data(), std::min(why.size(), kWhyBytes - 1));
}

struct DeviceFree {
    void operator()(void* p) const { cudaFree(p); }
};

// Every rank's `bytes` at host `mine` gathered into host `all` (size * bytes), through the device.
void gather(const void* mine, void* all, size_t bytes, int rank, int size, nccl::Comm comm,
            cudaStream_t stream) {
    void* raw = nullptr;
    CUDA_CHECK(cudaMalloc(&raw, bytes * size));
    std::unique_ptr<void, DeviceFree> buf(raw);
    char* slots = static_cast<char*>(raw);
    CUDA_CHECK(cudaMemcpyAsync(slots + rank * bytes, mine, bytes, cudaMemcpyHostToDevice, stream));
    nccl::all_gather_bytes(slots + rank * bytes, slots, bytes, comm, stream);
    CUDA_CHECK(cudaMemcpyAsync(all, slots, bytes * size, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Four values a thread per step (one 16-byte load of x, one 8-byte load of partial).
__global__ void add_bf16_into_f32_kernel(const uint2* __restrict__ partial, float4* __restrict__ x, size_t n4) {
    pdl_wait();
    pdl_launch_dependents();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const uint2 p = partial[i];
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&p.x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&p.y));
        float4 v = x[i];
        v.x += lo.x, v.y += lo.y, v.z += hi.x, v.w += hi.y;
        x[i] = v;
    }
}

// Calls launch(std::integral_constant<int, N>{}) for a group of N = 2..kMaxRanks ranks: the
// kernels are instantiated per group size, so that their loops over the ranks unroll.
template <typename Launch>
void with_group_size(int size, Launch&& launch) {
    switch (size) {
        case 2: return launch(std::integral_constant<int, 2>{});
        case 3: return launch(std::integral_constant<int, 3>{});
        case 4: return launch(std::integral_constant<int, 4>{});
        case 5: return launch(std::integral_constant<int, 5>{});
        case 6: return launch(std::integral_constant<int, 6>{});
        case 7: return launch(std::integral_constant<int, 7>{});
        default: return launch(std::integral_constant<int, kMaxRanks>{});
    }
}

}  // namespace

void all_reduce_oneshot(const float* in, float* out, size_t count, const AllReducePeers& peers,
                        cudaStream_t stream) {
    BRRR_CHECK(peers.size >= 2 && peers.size <= kMaxRanks && peers.rank >= 0 && peers.rank < peers.size,
               "all_reduce_oneshot: rank " << peers.rank << " of " << peers.size << " (2 to "
                                           << kMaxRanks << " ranks)");
    BRRR_CHECK(count % 4 == 0 && count <= peers.half_floats,
               "all_reduce_oneshot: " << count << " floats, which must be a multiple of 4 and at most "
                                      << peers.half_floats << " (the group's capacity)");
    BRRR_CHECK(util::aligned_to(in, 16) && util::aligned_to(out, 16),
               "all_reduce_oneshot: in and out must be 16-byte aligned");
    const int n4 = static_cast<int>(count / 4);
    const float4* in4 = reinterpret_cast<const float4*>(in);
    float4* out4 = reinterpret_cast<float4*>(out);
    with_group_size(peers.size, [&](auto n) {
        launch_pdl(all_reduce_oneshot_kernel<decltype(n)::value>, peers.blocks, kThreads, 0, stream, in4, out4, n4,
                   peers);
    });
    CUDA_CHECK_LAUNCH();
}

void all_reduce_ll(const float* in, float* out, size_t count, const AllReducePeers& peers, cudaStream_t stream) {
    BRRR_CHECK(peers.size >= 2 && peers.size <= kMaxRanks && peers.rank >= 0 && peers.rank < peers.size,
               "all_reduce_ll: rank " << peers.rank << " of " << peers.size << " (2 to " << kMaxRanks << " ranks)");
    BRRR_CHECK(count % 4 == 0 && count <= 2 * peers.ll_lines,
               "all_reduce_ll: " << count << " floats, which must be a multiple of 4 and at most "
                                 << 2 * peers.ll_lines << " (the group's low-latency capacity)");
    BRRR_CHECK(util::aligned_to(in, 16) && util::aligned_to(out, 16), "all_reduce_ll: in and out must be 16-byte aligned");
    const int n2 = static_cast<int>(count / 2);
    const float2* in2 = reinterpret_cast<const float2*>(in);
    float2* out2 = reinterpret_cast<float2*>(out);
    with_group_size(peers.size, [&](auto n) {
        launch_pdl(all_reduce_ll_kernel<decltype(n)::value>, peers.blocks, kThreads, 0, stream, in2, out2, n2, peers);
    });
    CUDA_CHECK_LAUNCH();
}

void all_reduce_rows(const bf16* part, float* x, const bf16* norm_w, bf16* y, int rows, int D, float eps,
                     const AllReducePeers& peers, cudaStream_t stream) {
    BRRR_CHECK(peers.size >= 2 && peers.size <= kMaxRanks && peers.rank >= 0 && peers.rank < peers.size,
               "all_reduce_rows: rank " << peers.rank << " of " << peers.size << " (2 to " << kMaxRanks << " ranks)");
    BRRR_CHECK(rows >= 0 && D > 0 && D % 8 == 0 && (size_t)rows * D <= 2 * peers.half_floats,
               "all_reduce_rows: " << rows << " rows of " << D << " values: D must be a multiple of 8 and the rows "
                                   << "at most the group's capacity of " << 2 * peers.half_floats << " bf16 values");
    BRRR_CHECK(util::aligned_to(part, 16) && util::aligned_to(x, 16) && util::aligned_to(norm_w, 16) &&
                   util::aligned_to(y, 16),
               "all_reduce_rows: part, x, norm_w and y must be 16-byte aligned");
    BRRR_CHECK(!norm_w || (y && eps > 0.f), "all_reduce_rows: a norm needs y and eps > 0");
    if (rows == 0) return;
    const uint4* p8 = reinterpret_cast<const uint4*>(part);
    float4* x4 = reinterpret_cast<float4*>(x);
    const uint4* w8 = reinterpret_cast<const uint4*>(norm_w);
    uint4* y8 = reinterpret_cast<uint4*>(y);
    switch (peers.size) {
        case 2: launch_pdl(all_reduce_rows_kernel<2>, peers.blocks, kRowThreads, 0, stream, p8, x4, w8, y8, rows, D, eps, peers); break;
        case 3: launch_pdl(all_reduce_rows_kernel<3>, peers.blocks, kRowThreads, 0, stream, p8, x4, w8, y8, rows, D, eps, peers); break;
        case 4: launch_pdl(all_reduce_rows_kernel<4>, peers.blocks, kRowThreads, 0, stream, p8, x4, w8, y8, rows, D, eps, peers); break;
        default: BRRR_FAIL("all_reduce_rows: " << peers.size << " ranks: the kernel takes 2 to 4");
    }
    CUDA_CHECK_LAUNCH();
}

void add_bf16_into_f32(const bf16* partial, float* x, size_t count, cudaStream_t stream) {
    BRRR_CHECK(count % 4 == 0, "add_bf16_into_f32: " << count << " values, which must be a multiple of 4");
    BRRR_CHECK(util::aligned_to(partial, 16) && util::aligned_to(x, 16),
               "add_bf16_into_f32: partial and x must be 16-byte aligned");
    if (count == 0) return;
    constexpr int kAddThreads = 256;
    const size_t n4 = count / 4;
    const int blocks = (int)std::min<size_t>(CEIL_DIV(n4, (size_t)kAddThreads), (size_t)device_facts().sm_count * 8);
    launch_pdl(add_bf16_into_f32_kernel, blocks, kAddThreads, 0, stream, reinterpret_cast<const uint2*>(partial),
               reinterpret_cast<float4*>(x), n4);
    CUDA_CHECK_LAUNCH();
}

// ---- OneShotAllReduce ---------------------------------------------------------------------------

std::string OneShotAllReduce::open(nccl::Comm comm, int rank, int size, size_t capacity_bytes, int blocks,
                                   cudaStream_t stream) {
    close();
    if (size < 2 || size > kMaxRanks)
        return std::to_string(size) + " ranks: the one-shot kernel takes 2 to " + std::to_string(kMaxRanks);
    BRRR_CHECK(rank >= 0 && rank < size && capacity_bytes > 0 && blocks > 0,
               "one-shot all-reduce: rank " << rank << " of " << size << ", capacity " << capacity_bytes
                                            << ", blocks " << blocks);
    // [flags: blocks x kMaxRanks][counters: blocks][data: 2 halves][LL slots: 2 halves x size
    // senders x ll_lines], each piece 256-byte aligned
    const size_t half_floats = align_up(capacity_bytes) / sizeof(float);
    const size_t ll_lines = std::min(capacity_bytes, tuning::kAllReduceLLMaxBytes) / sizeof(float) / 4 * 2;
    const size_t signals_bytes = align_up(sizeof(unsigned) * blocks * kMaxRanks);
    const size_t counters_bytes = align_up(sizeof(unsigned) * blocks);
    const size_t data_bytes = 2 * half_floats * sizeof(float);
    own_bytes_ = signals_bytes + counters_bytes + data_bytes + 2 * (size_t)size * ll_lines * sizeof(uint4);
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    void* raw = nullptr;
    CUDA_CHECK(cudaMalloc(&raw, own_bytes_));
    own_ = static_cast<char*>(raw);
    opened_.assign(size, nullptr);
    try {
        // Zero flags and counters on every rank before any rank can see this buffer: the exchange
        // below is ordered after the memset on this stream and completes only once all ranks
        // have reached it.
        CUDA_CHECK(cudaMemsetAsync(own_, 0, own_bytes_, stream));
        RankCard card;
        std::memset(&card, 0, sizeof card);
        card.host = host_identity();
        CUDA_CHECK(cudaDeviceGetPCIBusId(card.pci, sizeof card.pci, device));
        const cudaError_t got = cudaIpcGetMemHandle(&card.handle, own_);
        if (got != cudaSuccess) {
            cudaGetLastError();
            set_why(card.why_not, std::string("cudaIpcGetMemHandle failed (") + cudaGetErrorString(got) + ")");
        }
        std::vector<RankCard> cards(size);
        gather(&card, cards.data(), sizeof card, rank, size, comm, stream);

        std::string why;
        for (int r = 0; r < size && why.empty(); ++r)
            if (cards[r].why_not[0]) why = "rank " + std::to_string(r) + ": " + cards[r].why_not;
        // Every rank knows now whether any rank failed to export; only the opening below can
        // still differ between ranks, so its outcome is exchanged too.
        if (why.empty()) {
            std::string mine;
            for (int p = 0; p < size && mine.empty(); ++p) {
                if (p == rank) continue;
                const std::string peer = "rank " + std::to_string(p);
                if (cards[p].host != cards[rank].host) {
                    mine = peer + " runs on another host";
                    break;
                }
                int peer_device = -1;
                if (cudaDeviceGetByPCIBusId(&peer_device, cards[p].pci) != cudaSuccess) {
                    cudaGetLastError();
                    mine = peer + "'s GPU (PCI " + cards[p].pci + ") is not visible to this process "
                           "(CUDA_VISIBLE_DEVICES)";
                    break;
                }
                if (peer_device == device) {
                    mine = peer + " shares cuda:" + std::to_string(device);
                    break;
                }
                int can = 0;
                CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer_device));
                if (!can) {
                    mine = "no peer-to-peer access from cuda:" + std::to_string(device) + " to cuda:" +
                           std::to_string(peer_device) + " (" + peer + ")";
                    break;
                }
                void* ptr = nullptr;
                const cudaError_t err = cudaIpcOpenMemHandle(&ptr, cards[p].handle, cudaIpcMemLazyEnablePeerAccess);
                if (err != cudaSuccess) {
                    cudaGetLastError();
                    mine = std::string("cudaIpcOpenMemHandle of ") + peer + "'s buffer failed (" +
                           cudaGetErrorString(err) + ")";
                    break;
                }
                opened_[p] = ptr;
            }
            char mine_why[kWhyBytes];
            set_why(mine_why, mine);
            std::vector<char> all(kWhyBytes * size);
            gather(mine_why, all.data(), kWhyBytes, rank, size, comm, stream);
            for (int r = 0; r < size && why.empty(); ++r)
                if (all[r * kWhyBytes]) why = "rank " + std::to_string(r) + ": " + &all[r * kWhyBytes];
        }
        if (!why.empty()) {
            close();
            return why;
        }
    } catch (...) {
        close();
        throw;
    }
    peers_ = AllReducePeers{};
    peers_.rank = rank;
    peers_.size = size;
    peers_.half_floats = half_floats;
    peers_.ll_lines = ll_lines;
    peers_.blocks = blocks;
    for (int r = 0; r < size; ++r) {
        char* base = r == rank ? own_ : static_cast<char*>(opened_[r]);
        peers_.signals[r] = reinterpret_cast<unsigned*>(base);
        peers_.data[r] = reinterpret_cast<float*>(base + signals_bytes + counters_bytes);
        peers_.lines[r] = reinterpret_cast<uint4*>(base + signals_bytes + counters_bytes + data_bytes);
    }
    peers_.counters = reinterpret_cast<unsigned*>(own_ + signals_bytes);
    return "";
}

void OneShotAllReduce::close_peers() noexcept {
    for (void*& p : opened_)
        if (p) cudaIpcCloseMemHandle(p), p = nullptr;
    cudaGetLastError();
}

void OneShotAllReduce::close() noexcept {
    close_peers();
    opened_.clear();
    if (own_) cudaFree(own_), own_ = nullptr;
    own_bytes_ = 0;
    peers_ = AllReducePeers{};
    cudaGetLastError();
}

void OneShotAllReduce::leave(nccl::Comm comm, cudaStream_t stream) {
    if (!ready()) return;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    close_peers();
    // The barrier: each rank's all-gather starts once its stream is idle, so once it returns
    // every rank has closed its peers' buffers.
    const char mine = 0;
    std::vector<char> all(peers_.size);
    gather(&mine, all.data(), 1, peers_.rank, peers_.size, comm, stream);
    close();
}

void OneShotAllReduce::run(const float* in, float* out, size_t count, cudaStream_t stream) const {
    BRRR_CHECK(ready(), "the one-shot all-reduce is not open");
    all_reduce_oneshot(in, out, count, peers_, stream);
}

void OneShotAllReduce::run_ll(const float* in, float* out, size_t count, cudaStream_t stream) const {
    BRRR_CHECK(ready(), "the one-shot all-reduce is not open");
    all_reduce_ll(in, out, count, peers_, stream);
}

void OneShotAllReduce::run_rows(const bf16* part, float* x, const bf16* norm_w, bf16* y, int rows, int D, float eps,
                                cudaStream_t stream) const {
    BRRR_CHECK(ready(), "the one-shot all-reduce is not open");
    all_reduce_rows(part, x, norm_w, y, rows, D, eps, peers_, stream);
}

// Only the half the next call writes: a peer may still be reading the other one (the previous
// call's), while none reads this one any more (the double-buffering invariant above).
void OneShotAllReduce::poison(cudaStream_t stream) const {
    BRRR_CHECK(ready(), "the one-shot all-reduce is not open");
    unsigned round = 0;  // every CTA's counter is the same: each takes part in every call
    CUDA_CHECK(cudaMemcpyAsync(&round, peers_.counters, sizeof round, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const size_t next_half = ((round + 1u) & 1u) * peers_.half_floats;
    CUDA_CHECK(cudaMemsetAsync(peers_.data[peers_.rank] + next_half, 0xFF, peers_.half_floats * sizeof(float), stream));
}

}  // namespace cuda
}  // namespace brrr
