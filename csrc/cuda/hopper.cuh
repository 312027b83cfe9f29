// hopper.cuh — the sm_90a instructions of the Hopper GEMM (gemm_sm90.cuh) and prefill attention,
// each behind a small device function: mbarriers, the TMA bulk tensor copy, warpgroup MMA
// (wgmma) with its shared-memory matrix descriptors, the warpgroup index, and setmaxnreg.
// Everything here needs sm_90a: callers compile it only under __CUDA_ARCH_FEAT_SM90_ALL (the
// extension is also built for sm_80, where none of this exists).
//
// wgmma.m64nNk16 (bf16 in, fp32 accumulate), both operands in shared memory, K-major (rows of A
// and rows of W are K-contiguous), stored as TMA's 128-byte swizzle writes them: rows of 128 bytes
// (64 bf16), 8-row atoms of 1024 bytes, 16-byte chunk c of row r at chunk c ^ (r % 8). A
// descriptor names such a tile by its start address and the 1024-byte stride between atoms; the
// k-th 16-wide slice of the 64-wide tile starts 32 * k bytes further (the hardware applies the
// swizzle to the full address, which is why every tile starts on a 1024-byte boundary).
//
// Accumulator layout of m64nN (per warpgroup; w = warp in the group, g = lane / 4, t = lane % 4):
//   d[4i + 0..1] = D[16w + g][8i + 2t .. 8i + 2t + 1]   d[4i + 2..3] = D[16w + g + 8][same columns]
// The same layout is the A fragment of a register-sourced wgmma (wgmma_rs_tb): the accumulators of
// columns 16j..16j+15 are k-step j's A operand, which is how attention feeds P to P V.
//
// Also here, for the host: the driver's tensor-map encoder and the one map shape both the GEMM and
// the attention use (bf16 rows, 64-column boxes in the 128-byte swizzle).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.cuh"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {
namespace hopper {

// ---- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(ptx::smem_addr(bar)), "r"(arrivals)
                 : "memory");
}
// Makes initialized barriers visible to the other threads and to the TMA unit (async proxy).
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(ptx::smem_addr(bar)) : "memory");
}
// One arrival, made when every cp.async this thread issued before it has landed (counted among
// the barrier's expected arrivals: .noinc).
__device__ __forceinline__ void mbarrier_arrive_cp_async(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(ptx::smem_addr(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ptx::smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
// Blocks until the phase with parity `parity` has completed. A fresh barrier is in phase 0, and
// the phase "before" it (parity 1) counts as complete: a producer waiting for free slots starts
// with parity 1 and passes at once.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    const uint32_t addr = ptx::smem_addr(bar);
    uint32_t done = 0;
#ifdef BRRR_MBARRIER_TIMEOUT
    // Lab builds: a lost arrival traps after 2 s instead of hanging the machine.
    uint64_t start_ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start_ns));
#endif
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
#ifdef BRRR_MBARRIER_TIMEOUT
        uint64_t now_ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now_ns));
        if (!done && now_ns - start_ns > 2000000000ull) __trap();
#endif
    } while (!done);
}

// ---- TMA --------------------------------------------------------------------------------------
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Copies the box at (inner, outer) of `map` into shared memory at `dst`; completes on `bar` as
// transaction bytes (the full box, out-of-bounds parts zero-filled).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int inner, int outer,
                                            uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(ptx::smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(ptx::smem_addr(bar))
        : "memory");
}

// Adds the box at `src` (shared memory, laid out as `map` describes) into global memory at
// (inner, outer) of `map`, element by element in L2; parts of the box past the matrix are
// dropped. Completes as a bulk group of the issuing thread (bulk_commit / bulk_wait_*); the
// writers of `src` must have run fence_proxy_async_shared() before the issue.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, const void* src, int inner, int outer) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
            reinterpret_cast<uint64_t>(map)),
        "r"(inner), "r"(outer), "r"(ptx::smem_addr(src))
        : "memory");
}
// Asks L2 for the box at (inner, outer) of `map`: no shared memory, nothing to wait for.
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap* map, int inner, int outer) {
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(inner), "r"(outer)
                 : "memory");
}
// Stores the box at `src` (shared memory, laid out as `map` describes) to global memory at
// (inner, outer) of `map`; parts of the box past the matrix are dropped. Completes as a bulk
// group, like tma_reduce_add_2d.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int inner, int outer) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(inner), "r"(outer), "r"(ptx::smem_addr(src))
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until at most Pending of this thread's bulk groups still read their shared memory.
template <int Pending>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}
// Until every bulk group of this thread has completed, its global writes included.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the async proxy (TMA) that reads them next.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- warpgroup MMA ----------------------------------------------------------------------------
// Descriptor of a K-major, 128-byte-swizzled tile starting at `tile` (1024-byte aligned plus a
// multiple of 32 bytes for the k slice): start address, leading offset 1 (unused by this
// layout), stride 1024 bytes between 8-row atoms, swizzle mode 1 = 128B.
__device__ __forceinline__ uint64_t sw128_descriptor(const void* tile) {
    const uint64_t addr = ptx::smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

// desc with `units` (16-byte steps) added to its start address: a 32-bit add on the low word, for
// steps inside one shared-memory tile (the 14-bit field does not overflow).
__device__ __forceinline__ uint64_t descriptor_add(uint64_t desc, uint32_t units) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + units);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most `Pending` of this warpgroup's committed wgmma groups are in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across an async wgmma boundary.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The operand lists of the m64nN wgmma forms: accumulator registers d[0 .. N/2) as "+f"
// constraints, and their placeholders %0 .. in the instruction text, 32 at a time.
#define BRRR_WGMMA_D8(i) \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
    "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define BRRR_WGMMA_D32(i) BRRR_WGMMA_D8(i), BRRR_WGMMA_D8((i) + 8), BRRR_WGMMA_D8((i) + 16), BRRR_WGMMA_D8((i) + 24)
#define BRRR_WGMMA_R0_31 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define BRRR_WGMMA_R32_63 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BRRR_WGMMA_R64_95 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define BRRR_WGMMA_R96_127 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// d (+)= A * B^T for a 64 x N x 16 step; A and B through descriptors; accumulate = 0 overwrites.
// wgmma_m64n<N>k16_bf16(d, desc_a, desc_b, accumulate): D_REGS names d's placeholders, A, B, ACC
// those of the three inputs, which follow the N / 2 accumulators.
#define BRRR_WGMMA_SS(N, D_REGS, A, B, ACC, ...)                                                          \
    __device__ __forceinline__ void wgmma_m64n##N##k16_bf16(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                            int accumulate) {                              \
        asm volatile(                                                                                      \
            "{\n.reg .pred p_acc;\n"                                                                       \
            "setp.ne.b32 p_acc, " ACC ", 0;\n"                                                             \
            "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D_REGS "}, " A ", " B              \
            ", p_acc, 1, 1, 0, 0;\n}\n"                                                                     \
            : __VA_ARGS__                                                                                  \
            : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                                  \
    }
BRRR_WGMMA_SS(128, BRRR_WGMMA_R0_31 ", " BRRR_WGMMA_R32_63, "%64", "%65", "%66", BRRR_WGMMA_D32(0), BRRR_WGMMA_D32(32))
BRRR_WGMMA_SS(192, BRRR_WGMMA_R0_31 ", " BRRR_WGMMA_R32_63 ", " BRRR_WGMMA_R64_95, "%96", "%97", "%98",
              BRRR_WGMMA_D32(0), BRRR_WGMMA_D32(32), BRRR_WGMMA_D32(64))
BRRR_WGMMA_SS(256, BRRR_WGMMA_R0_31 ", " BRRR_WGMMA_R32_63 ", " BRRR_WGMMA_R64_95 ", " BRRR_WGMMA_R96_127, "%128",
              "%129", "%130", BRRR_WGMMA_D32(0), BRRR_WGMMA_D32(32), BRRR_WGMMA_D32(64), BRRR_WGMMA_D32(96))
#undef BRRR_WGMMA_SS

template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                           int accumulate) {
    static_assert(N == 128 || N == 192 || N == 256, "wgmma_bf16: N is 128, 192 or 256");
    if constexpr (N == 128) wgmma_m64n128k16_bf16(d, desc_a, desc_b, accumulate);
    else if constexpr (N == 192) wgmma_m64n192k16_bf16(d, desc_a, desc_b, accumulate);
    else wgmma_m64n256k16_bf16(d, desc_a, desc_b, accumulate);
}

// Descriptor of an MN-major, 128-byte-swizzled B operand (N contiguous): rows of 128 bytes (64
// elements of N), 8-row atoms 1024 bytes apart, the next 64 elements of N `n_block_bytes` further.
// The PTX ISA's canonical layout for this case, ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) in elements,
// makes the leading offset the step between 64-wide N blocks and the stride offset the step
// between 8-row groups of K (checked on H100: the other way round fails every case).
__device__ __forceinline__ uint64_t sw128_mn_descriptor(const void* tile, uint32_t n_block_bytes) {
    const uint64_t addr = ptx::smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((n_block_bytes & 0x3FFFF) >> 4) << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}

// d += A * B for a 64 x N x 16 step, A (bf16, the m64k16 fragment) from registers, B through the
// descriptor of an MN-major tile (imm-trans-b = 1); always accumulates.
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb_bf16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" BRRR_WGMMA_R0_31
        "}, {%32, %33, %34, %35}, %36, p_acc, 1, 1, 1;\n}\n"
        : BRRR_WGMMA_D32(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p_acc;\n"
        "setp.ne.b32 p_acc, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" BRRR_WGMMA_R0_31 ", " BRRR_WGMMA_R32_63
        "}, {%64, %65, %66, %67}, %68, p_acc, 1, 1, 1;\n}\n"
        : BRRR_WGMMA_D32(0), BRRR_WGMMA_D32(32)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
template <int N>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    static_assert(N == 64 || N == 128, "wgmma_rs_tb: N is 64 or 128");
    if constexpr (N == 64) wgmma_m64n64k16_rs_tb_bf16(d, a, desc_b);
    else wgmma_m64n128k16_rs_tb_bf16(d, a, desc_b);
}

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads, whole warps: lets some
// warpgroups of a CTA meet without the others.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- warp specialization ----------------------------------------------------------------------
// This thread's warpgroup (threadIdx.x / 128), broadcast from lane 0 so that the compiler knows
// it is the same in every lane: shared-memory addresses built from it then live in uniform
// registers, and a wgmma takes its descriptors from there with no R2UR moves per instruction.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }

// ---- register budget per warpgroup (takes effect under __launch_bounds__(threads, 1)) --------
template <int Regs>
__device__ __forceinline__ void regs_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void regs_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}

// ---- tensor maps (host) -------------------------------------------------------------------------
// The driver's encoder, found through the runtime (no -lcuda needed).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const auto encoder = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        BRRR_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                   "the CUDA driver has no cuTensorMapEncodeTiled (driver older than CUDA 12?)");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    return encoder;
}

// A [rows, cols] row-major matrix of `elem_bytes`-byte elements with a row stride of `ld` elements
// (16-byte aligned base and stride) seen in boxes of one 128-byte row (128 / elem_bytes columns) x
// box_rows rows in the 128-byte swizzle; boxes reaching past the matrix read zeros there (a
// store or reduce drops those parts). Encoding costs a few hundred host nanoseconds and allocates
// nothing, so every launch builds its own (the map travels by value in the kernel's parameters).
// `op` names the caller in the error.
inline CUtensorMap make_tensor_map_2d_sw128(const void* base, CUtensorMapDataType type, int elem_bytes, int rows,
                                            int cols, int ld, int box_rows, const char* op) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * elem_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / elem_bytes), (cuuint32_t)box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = tensor_map_encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box,
                                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    BRRR_CHECK(r == CUDA_SUCCESS, op << ": cuTensorMapEncodeTiled failed (error " << (int)r << ") for a [" << rows
                                     << ", " << cols << "] matrix of " << elem_bytes
                                     << "-byte elements with row stride " << ld);
    return map;
}
// A packed bf16 matrix (cols % 8 == 0) in boxes of 64 columns: the GEMM's and attention's operands.
inline CUtensorMap make_tensor_map_sw128(const void* base, int rows, int cols, int box_rows, const char* op) {
    return make_tensor_map_2d_sw128(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, cols, cols, box_rows, op);
}
// An fp32 matrix (ld % 4 == 0) in boxes of 32 columns: the destination of the GEMM's TMA
// epilogues (reduce-add into the residual, StoreF32).
inline CUtensorMap make_tensor_map_f32_sw128(float* base, int rows, int cols, int ld, int box_rows, const char* op) {
    return make_tensor_map_2d_sw128(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, rows, cols, ld, box_rows, op);
}

#undef BRRR_WGMMA_D8
#undef BRRR_WGMMA_D32
#undef BRRR_WGMMA_R0_31
#undef BRRR_WGMMA_R32_63
#undef BRRR_WGMMA_R64_95
#undef BRRR_WGMMA_R96_127

}  // namespace hopper
}  // namespace cuda
}  // namespace brrr
