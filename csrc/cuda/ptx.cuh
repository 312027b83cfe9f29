// ptx.cuh — the few PTX instructions the matmul and attention kernels need that CUDA C++ does not
// expose directly, each behind a small device function: streaming 16-byte loads, cp.async with
// zero fill, ldmatrix, and the bf16 tensor-core mma m16n8k16 with fp32 accumulation.
// Shared by the GEMV, GEMM and attention kernels; sm_80 and newer.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", bf16): g = lane / 4, t = lane % 4.
//   A (16x16, row-major) a[0] = A[g][2t..2t+1]  a[1] = A[g+8][2t..]  a[2] = A[g][2t+8..]  a[3] = A[g+8][2t+8..]
//   B (16x8, k x n)      b[0] = B[2t..2t+1][g]  b[1] = B[2t+8..2t+9][g]
//   C/D (16x8, fp32)     c[0..1] = C[g][2t..2t+1]   c[2..3] = C[g+8][2t..2t+1]
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; each lane receives, in
// register i, row g elements 2t..2t+1 of matrix i (.trans: column g, rows 2t and 2t+1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace brrr {
namespace cuda {
namespace ptx {

// The kernels' dynamic shared memory, 16-byte aligned (every user carves typed arrays from it).
template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
    extern __shared__ __align__(16) unsigned char brrr_dynamic_smem[];
    return reinterpret_cast<T*>(brrr_dynamic_smem);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes of read-only data that is used exactly once: skip L1 and ask L2 to fetch 256-byte
// sectors, which keeps more of the HBM pipe busy per request when streaming weights.
__device__ __forceinline__ uint4 ld_stream_16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// c + the sum of the four products of a's bytes read unsigned with b's bytes read signed.
__device__ __forceinline__ int dp4a_u8_s8(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// *p += v at GPU scope, returning the old value, as one acquire-release: the caller's earlier writes
// (and those a CTA barrier ordered before it) are published with the count, and whoever reads the
// count sees what the earlier counters published.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
    int old;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Asynchronous 16-byte global -> shared copy; when `valid` is false nothing is read and the 16
// bytes are zero-filled (tile tails, masked rows). `src` must still be a mapped address.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem_dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}
// The same for 4 bytes (4-byte aligned on both sides), through L1.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem_dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem_row)));
}

// d += A * B for one 16x8x16 tile (layouts above), bf16 or fp16 operands.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace ptx
}  // namespace cuda
}  // namespace brrr
