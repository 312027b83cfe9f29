// kernel_util.cuh — small pieces the matmul and attention kernels share: bf16 bit unpacking,
// warp reductions, the matmul epilogue as a device function, and the host-side argument check
// every matmul launcher runs before it launches anything.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common.h"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {
namespace util {

// Which W rows a GEMV unit (one output column, or one pair of them) streams: the paired epilogues
// need rows that meet in one output, SwiGLU's gate row j and up row H + j, RoPE's dims i and
// i + hd/2 of one head.
enum class Pairing { None, SwiGLU, Rope };
inline Pairing pairing_of(Epilogue ep) {
    return ep == Epilogue::SwiGLU ? Pairing::SwiGLU : ep == Epilogue::RopeKV ? Pairing::Rope : Pairing::None;
}
// First W row of unit c, and its partner row for paired units (half_n: SwiGLU's H, RoPE's hd/2).
template <Pairing P>
__device__ __forceinline__ int2 unit_rows(int c, int half_n) {
    if (P == Pairing::SwiGLU) return make_int2(c, c + half_n);
    if (P == Pairing::Rope) {
        const int head = c / half_n, i = c - head * half_n;
        const int r0 = head * 2 * half_n + i;
        return make_int2(r0, r0 + half_n);
    }
    return make_int2(c, c);
}

// A bf16 is the top half of an fp32, so unpacking a bf16x2 word is a shift and a mask.
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
// The fp16 in the low 16 bits of h, as a float (the scales of GGML blocks).
__device__ __forceinline__ float f16_bits(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
// Bits 0..3 of `nib` into bit 4 of bytes 0..3 (the fifth bits of Q5 codes): nib * (1 + 2^7 + 2^14 +
// 2^21) puts bit k at 8k, and the other partial products land on distinct positions, so nothing
// carries.
__device__ __forceinline__ uint32_t spread4(uint32_t nib) { return ((nib * 0x00204081u) & 0x01010101u) << 4; }

// A bf16x2 as its 32 bits (low half = .x), and back.
__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 h) { return *reinterpret_cast<const uint32_t*>(&h); }
__device__ __forceinline__ __nv_bfloat162 as_bf16x2(uint32_t u) { return *reinterpret_cast<const __nv_bfloat162*>(&u); }
// Two floats rounded to bf16 (nearest even), low half first: the layout of an mma A fragment
// (one F2FP for the pair).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return bf16x2_bits(__floats2bfloat162_rn(lo, hi));
}

// Eight fp32 values (lo, then hi) normalized and weighted as bf16(x * rstd * w), w eight bf16
// weights: the rounding of rmsnorm_residual, which every fused RMSNorm must reproduce bit for bit.
__device__ __forceinline__ uint4 rmsnorm_bf16x8(float4 lo, float4 hi, float rstd, uint4 w) {
    uint4 out;
    out.x = pack_bf16x2(lo.x * rstd * bf16_lo(w.x), lo.y * rstd * bf16_hi(w.x));
    out.y = pack_bf16x2(lo.z * rstd * bf16_lo(w.y), lo.w * rstd * bf16_hi(w.y));
    out.z = pack_bf16x2(hi.x * rstd * bf16_lo(w.z), hi.y * rstd * bf16_hi(w.z));
    out.w = pack_bf16x2(hi.z * rstd * bf16_lo(w.w), hi.w * rstd * bf16_hi(w.w));
    return out;
}

// e4m3, the fp8 KV cache's element: rounded from fp32 to nearest even, saturating at +-448 (NaN
// stays NaN); two values low byte first.
__device__ __forceinline__ uint8_t to_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
__device__ __forceinline__ uint16_t pack_e4m3x2(float lo, float hi) {
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
// Two e4m3 values widened to fp32, exactly: every e4m3 value is an fp16 (and a bf16) value.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
// Two e4m3 values as an f16x2 word (low first), exactly: one conversion instruction.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
// Two floats rounded to fp16 (nearest even), low half first.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
// Two e4m3 values as a bf16x2 word (low first), exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t v) {
    const float2 f = e4m3x2_to_float2(v);
    return pack_bf16x2(f.x, f.y);
}
// Four e4m3 bytes (one word) widened, in order, to four bf16 or (F16) fp16 values (two words), exactly.
template <bool F16>
__device__ __forceinline__ uint2 widen_e4m3x4(uint32_t w) {
    const uint16_t lo = (uint16_t)w, hi = (uint16_t)(w >> 16);
    return F16 ? make_uint2(e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi))
               : make_uint2(e4m3x2_to_bf16x2(lo), e4m3x2_to_bf16x2(hi));
}
// Sixteen e4m3 bytes widened, in order, to sixteen bf16 or (F16) fp16 values at dst (two uint4),
// exactly: how the attention kernels turn a 16-byte copy of an e4m3 cache into an MMA tile.
template <bool F16>
__device__ __forceinline__ void widen_e4m3x16(const uint4& bytes, uint4* dst) {
    const uint2 a = widen_e4m3x4<F16>(bytes.x), b = widen_e4m3x4<F16>(bytes.y);
    const uint2 c = widen_e4m3x4<F16>(bytes.z), d = widen_e4m3x4<F16>(bytes.w);
    dst[0] = make_uint4(a.x, a.y, b.x, b.y);
    dst[1] = make_uint4(c.x, c.y, d.x, d.y);
}
// Eight KV elements as eight bf16 (a uint4), dims in order: bf16 as they are, e4m3 widened.
__device__ __forceinline__ uint4 kv8_to_bf16x8(const uint4& v) { return v; }
__device__ __forceinline__ uint4 kv8_to_bf16x8(const uint2& v) {
    const uint2 a = widen_e4m3x4<false>(v.x), b = widen_e4m3x4<false>(v.y);
    return make_uint4(a.x, a.y, b.x, b.y);
}

// acc + dot(w, x) over the eight bf16 pairs of two 16-byte vectors.
__device__ __forceinline__ float dot8_bf16(const uint4& w, const uint4& x, float acc) {
    acc = fmaf(bf16_lo(w.x), bf16_lo(x.x), acc);
    acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
    acc = fmaf(bf16_lo(w.y), bf16_lo(x.y), acc);
    acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
    acc = fmaf(bf16_lo(w.z), bf16_lo(x.z), acc);
    acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
    acc = fmaf(bf16_lo(w.w), bf16_lo(x.w), acc);
    acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
    return acc;
}

// Butterfly reductions: every lane ends with the result. All 32 lanes must call them.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
// Sum over the block (a whole number of warps); every thread gets the result. All threads must
// call it; it ends with a barrier, so a loop may call it again at once.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x + 31) >> 5;
        v = warp_sum(lane < n_warps ? warp_sums[lane] : 0.f);
        if (lane == 0) warp_sums[0] = v;
    }
    __syncthreads();
    const float total = warp_sums[0];
    __syncthreads();
    return total;
}

// Split-K style merges (flash_decode's splits, the GEMM's split-K tiles): each of `splits` groups
// of threads writes its partial to global memory, then counts itself in; the last to arrive reads
// every partial and merges. Every thread of the group calls this after writing its share, and
// `group_barrier` synchronizes exactly those threads (the CTA, or a named barrier). Returns, in
// every thread of the group, whether this group arrived last; the last one re-arms the counter to
// zero (every split has arrived, so nobody else touches it in this call).
// release = true (what every caller passes): the barrier orders every thread's partial before the
// leader's one acq_rel atomic, which publishes them and, for the last group, acquires the others'
// (the barrier after it passes that on): one ordered round trip. false: a fence in every thread
// before a relaxed atomic and another after it (slower: docs/kernels/attention.md).
template <class GroupBarrier>
__device__ __forceinline__ bool arrived_last(int* counter, int splits, bool leader, bool release,
                                             GroupBarrier group_barrier) {
    __shared__ int is_last;
    if (!release) __threadfence();
    group_barrier();
    if (leader) {
        const int before = release ? ptx::atomic_add_acq_rel_gpu(counter, 1) : atomicAdd(counter, 1);
        is_last = before + 1 == splits;
        if (is_last) *counter = 0;
    }
    group_barrier();
    if (!is_last) return false;
    if (!release) __threadfence();
    return true;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// One fp32 result y[m, n] leaving the chip; `idx` = m * ld + n (ld resolved by check_matmul).
// SwiGLU goes through store_swiglu instead: it needs the gate and the up value.
__device__ __forceinline__ void store_result(Epilogue ep, const EpilogueArgs& a, size_t idx, float y) {
    if (ep == Epilogue::StoreBf16) {
        a.out_bf16[idx] = __float2bfloat16_rn(y);
    } else if (ep == Epilogue::StoreF32) {
        a.out_f32[idx] = y;
    } else {
        a.residual[idx] += y;
    }
}
__device__ __forceinline__ void store_swiglu(const EpilogueArgs& a, size_t idx, float gate, float up) {
    a.out_bf16[idx] = __float2bfloat16_rn(silu(gate) * up);
}

// RoPE (rotate-half): dim i of a q or k head pairs with dim i + hd/2, both turned by the angle
// positions[m] * inv_freq[i]; q goes to q_out, k and v (v unrotated) into the caches.
// Positions reach 1e5 radians, where the hardware sin/cos that --use_fast_math selects is off by
// whole percents, so the fp32 angle is first reduced to [-pi, pi] by k = rint(angle / 2 pi)
// turns, 2 pi split in three parts (Cody-Waite): 6.28125 has 8 significant bits, so k * 6.28125
// is exact for k < 2^16 (angles up to 4e5), and the two later terms add rounding errors of about
// 1e-7. Then |sin/cos error| < 4e-7 (2^-21.4 for the hardware functions on [-pi, pi]), against
// 1e-3 of a bf16 rounding. (It was sincos in double until the prefill GEMM's epilogue, which
// turns 64-128 angles per thread and tile, showed the FP64 units.)
struct RopeAngle {
    float cos, sin;
};
__device__ __forceinline__ RopeAngle rope_angle(const RopeKVArgs& r, int pos, int i) {
    const float angle = (float)pos * r.inv_freq[i];
    const float turns = rintf(angle * 0.159154943091895336f);  // 1 / (2 pi)
    float x = fmaf(-turns, 6.28125f, angle);
    x = fmaf(-turns, 1.9353071693331003e-3f, x);
    x = fmaf(-turns, 1.0253131677018246e-11f, x);
    RopeAngle a;
    __sincosf(x, &a.sin, &a.cos);
    return a;
}
__device__ __forceinline__ bool rope_rotates(const RopeKVArgs& r, int head) {
    return head < r.n_heads + r.n_kv_heads;  // q and k heads; v heads follow them
}
// The cache row of token pos of slot, or -1 where the cache has no place for it (a position
// outside the slot or no block there). q asks too, though it does not go there: its NaN is what
// shows that the row's k and v were dropped.
__device__ __forceinline__ int64_t rope_cache_row(const RopeKVArgs& r, int pos, int slot) {
    return pos >= 0 && pos < r.kv.max_seq && slot >= 0 ? r.kv.pages.row(slot, pos) : -1;
}
// One rotation pair of a q or k head (v is not rotated). A bad position gives NaN rather than
// some rotation, so that the mistake cannot pass unseen. Explicit roundings, no FMA: left to the
// compiler, `x0 * cos - x1 * sin` contracts into whichever FMA each kernel instance picks, and a
// row's q and K would then depend on the instance (the GEMV's row count) by an fp32 ulp.
__device__ __forceinline__ void rope_rotate(float x0, float x1, RopeAngle a, bool pos_ok, float& y0, float& y1) {
    y0 = pos_ok ? __fsub_rn(__fmul_rn(x0, a.cos), __fmul_rn(x1, a.sin)) : NAN;
    y1 = pos_ok ? __fadd_rn(__fmul_rn(x1, a.cos), __fmul_rn(x0, a.sin)) : NAN;
}

// Dims i .. i + NP - 1 and their partners i + hd/2 .. of head `head` of row m (token `pos` of
// cache slot `slot`): x0[j] is dim i + j, x1[j] its partner, a[j] its angle (unused for v heads).
// NP = 2 writes pairs (i even). A position the cache cannot hold writes no cache entry and
// leaves q as NaN, so the mistake cannot pass unseen.
template <int NP>
__device__ __forceinline__ void store_rope_kv_dims(const RopeKVArgs& r, int m, int pos, int slot, int head, int i,
                                                   const float* x0, const float* x1, const RopeAngle* a) {
    const int64_t cache_row = rope_cache_row(r, pos, slot);
    const bool pos_ok = cache_row >= 0;
    const bool is_q = head < r.n_heads;
    if (!pos_ok && !is_q) return;
    float y0[NP], y1[NP];
#pragma unroll
    for (int j = 0; j < NP; ++j) {
        if (!rope_rotates(r, head)) {
            y0[j] = x0[j];
            y1[j] = x1[j];
        } else {
            rope_rotate(x0[j], x1[j], a[j], pos_ok, y0[j], y1[j]);
        }
    }
    const int half = r.head_dim / 2;
    bf16* dst;
    if (is_q) {
        dst = r.q_out + ((size_t)m * r.n_heads + head) * r.head_dim;
    } else {
        const bool is_k = rope_rotates(r, head);
        const int kv_head = head - r.n_heads - (is_k ? 0 : r.n_kv_heads);
        const size_t at = ((size_t)cache_row * r.n_kv_heads + kv_head) * r.head_dim;
        if (r.kv.fp8) {
            uint8_t* dst8 = static_cast<uint8_t*>(is_k ? r.kv.k : r.kv.v) + at;
            if (NP == 2) {
                *reinterpret_cast<uint16_t*>(dst8 + i) = pack_e4m3x2(y0[0], y0[NP - 1]);
                *reinterpret_cast<uint16_t*>(dst8 + i + half) = pack_e4m3x2(y1[0], y1[NP - 1]);
            } else {
                dst8[i] = to_e4m3(y0[0]);
                dst8[i + half] = to_e4m3(y1[0]);
            }
            return;
        }
        dst = static_cast<bf16*>(is_k ? r.kv.k : r.kv.v) + at;
    }
    if (NP == 2) {
        *reinterpret_cast<uint32_t*>(dst + i) = pack_bf16x2(y0[0], y0[NP - 1]);
        *reinterpret_cast<uint32_t*>(dst + i + half) = pack_bf16x2(y1[0], y1[NP - 1]);
    } else {
        dst[i] = __float2bfloat16_rn(y0[0]);
        dst[i + half] = __float2bfloat16_rn(y1[0]);
    }
}

// The rotation pair (dim i, dim i + hd/2) of head `head` of row m's q|k|v, x0 and x1 in fp32.
__device__ __forceinline__ void store_rope_kv(const RopeKVArgs& r, int m, int head, int i, float x0,
                                              float x1) {
    const int pos = r.positions[m], slot = r.slots[m];
    const RopeAngle a = rope_rotates(r, head) ? rope_angle(r, pos, i) : RopeAngle{0.f, 0.f};
    store_rope_kv_dims<1>(r, m, pos, slot, head, i, &x0, &x1, &a);
}

// One 16-row W tile of a tensor-core GEMV CTA, as a lane sees it: rows lo (fragment rows g) and
// hi (g + 8), or, for paired units, unit u's two rows; ok_lo / ok_hi: whether those rows exist.
struct MmaTileRows {
    int u, lo, hi;
    bool ok_lo, ok_hi;
};

// The end of a tensor-core GEMV CTA (gemv.cu's gemv_mma_kernel, gemv_quant_mma.cu): the WARPS
// warps' C fragments of MT W tiles times NT n8 tiles of x rows, acc[mt * NT + nt], are summed in
// warp order through shared memory `partial` [WARPS][MT * NT][4][32] (a fixed order: a row's
// result does not depend on M), then warp mt * NT + nt stores that pair of tiles through the
// epilogue (MT * NT <= WARPS).
template <Pairing P, int MT, int NT, int WARPS>
__device__ __forceinline__ void store_mma_gemv_tiles(const float (&acc)[MT * NT][4], float* partial, int warp,
                                                     int lane, int M, const MmaTileRows (&rows)[MT], int half_n,
                                                     Epilogue ep, const EpilogueArgs& out) {
    static_assert(MT * NT <= WARPS, "one warp stores each (W tile, x tile) pair");
    constexpr int kTiles = MT * NT;
#pragma unroll
    for (int ti = 0; ti < kTiles; ++ti)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[((warp * kTiles + ti) * 4 + i) * 32 + lane] = acc[ti][i];
    __syncthreads();
    if (warp >= kTiles) return;
    const int mt = MT == 1 ? 0 : warp / NT, nt = warp - mt * NT;
    // This warp's W tile, by selects: a runtime index into rows[] would go to local memory.
    MmaTileRows r = rows[0];
#pragma unroll
    for (int i = 1; i < MT; ++i)
        if (mt == i) r = rows[i];
    float c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        c[i] = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) c[i] += partial[((w * kTiles + warp) * 4 + i) * 32 + lane];
    }
    // C fragment: c[e] = (row lo, x row 8 nt + 2t + e), c[2 + e] = (row hi, the same x row).
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int m = 8 * nt + 2 * (lane & 3) + e;
        if (m >= M) continue;
        if (P == Pairing::Rope) {
            if (!r.ok_lo) continue;
            const int head = r.u / half_n;
            store_rope_kv(out.rope, m, head, r.u - head * half_n, c[e], c[2 + e]);
        } else if (P == Pairing::SwiGLU) {
            if (r.ok_lo) store_swiglu(out, (size_t)m * out.ld_out + r.u, c[e], c[2 + e]);
        } else {
            if (r.ok_lo) store_result(ep, out, (size_t)m * out.ld_out + r.lo, c[e]);
            if (r.ok_hi) store_result(ep, out, (size_t)m * out.ld_out + r.hi, c[2 + e]);
        }
    }
}

// Checks the destinations of a RopeKV epilogue (or rope_kv_append) for M rows.
inline void check_rope_kv(const char* op, const RopeKVArgs& r, int M) {
    BRRR_CHECK(M >= 0 && r.n_heads > 0 && r.n_kv_heads > 0 && r.kv.max_seq > 0,
               op << ": bad sizes M=" << M << " n_heads=" << r.n_heads << " n_kv_heads="
                  << r.n_kv_heads << " max_seq=" << r.kv.max_seq);
    BRRR_CHECK(r.head_dim >= 2 && r.head_dim % 2 == 0 && r.head_dim <= 2048,
               op << ": head_dim must be even and <= 2048, got " << r.head_dim);
    BRRR_CHECK(r.positions && r.slots && r.inv_freq && r.q_out && r.kv.k && r.kv.v && r.kv.pages.table,
               op << ": RoPE needs positions, slots, inv_freq, q_out, the k and v caches and their block "
                     "table; one is null");
    BRRR_CHECK(r.kv.pages.block_size > 0 && (r.kv.pages.block_size & (r.kv.pages.block_size - 1)) == 0 &&
                   (int64_t)r.kv.pages.blocks_per_seq * r.kv.pages.block_size >= r.kv.max_seq,
               op << ": the block table must cover max_seq=" << r.kv.max_seq << " positions in power-of-two "
                     "blocks, got " << r.kv.pages.blocks_per_seq << " blocks of " << r.kv.pages.block_size);
}

inline bool aligned_to(const void* p, uintptr_t bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Checks one matmul's operands and resolves args.ld_out (0 = packed) to the real row stride.
// Returns the output width: N, or N / 2 for SwiGLU.
// RopeKV is accepted only where the caller implements it (allow_rope).
inline int check_matmul(const char* op, const bf16* x, const bf16* W, int M, int N, int K,
                        Epilogue ep, EpilogueArgs& args, bool allow_rope = false) {
    BRRR_CHECK(M >= 0 && N >= 1 && K >= 1,
               op << ": sizes must be M >= 0, N >= 1, K >= 1; got M=" << M << " N=" << N << " K=" << K);
    BRRR_CHECK(x != nullptr && W != nullptr, op << ": x and W must be device pointers, got null");
    BRRR_CHECK(aligned_to(x, 2) && aligned_to(W, 2), op << ": x and W must be 2-byte aligned (bf16)");
    const int ep_id = static_cast<int>(ep);
    BRRR_CHECK(ep_id >= 0 && ep_id <= 4, op << ": unknown epilogue " << ep_id
                                            << " (0 StoreBf16, 1 StoreF32, 2 AddResidual, 3 SwiGLU, 4 RopeKV)");
    BRRR_CHECK(allow_rope || ep != Epilogue::RopeKV,
               op << ": the RopeKV epilogue is not implemented here (gemv_bf16 / rmsnorm_matmul_bf16 have it)");
    int width = N;
    if (ep == Epilogue::SwiGLU) {
        BRRR_CHECK(N % 2 == 0, op << ": SwiGLU needs an even N (gate rows | up rows), got N=" << N);
        width = N / 2;
    }
    if (ep == Epilogue::RopeKV) {
        check_rope_kv(op, args.rope, M);
        const RopeKVArgs& r = args.rope;
        BRRR_CHECK(N == (r.n_heads + 2 * r.n_kv_heads) * r.head_dim,
                   op << ": RopeKV needs N = (n_heads + 2 n_kv_heads) * head_dim = "
                      << (r.n_heads + 2 * r.n_kv_heads) * r.head_dim << ", got N=" << N);
        return N / 2;  // rotation pairs; the destinations are packed, ld_out is unused
    }
    BRRR_CHECK(args.ld_out >= 0, op << ": ld_out must be >= 0 (0 = packed), got " << args.ld_out);
    if (args.ld_out == 0) args.ld_out = width;
    BRRR_CHECK(args.ld_out >= width, op << ": ld_out=" << args.ld_out
                                        << " is shorter than an output row of " << width);
    switch (ep) {
        case Epilogue::StoreBf16:
        case Epilogue::SwiGLU:
            BRRR_CHECK(args.out_bf16 != nullptr && aligned_to(args.out_bf16, 2),
                       op << ": this epilogue writes args.out_bf16, which is null or misaligned");
            break;
        case Epilogue::StoreF32:
            BRRR_CHECK(args.out_f32 != nullptr && aligned_to(args.out_f32, 4),
                       op << ": StoreF32 writes args.out_f32, which is null or not 4-byte aligned");
            break;
        case Epilogue::AddResidual:
            BRRR_CHECK(args.residual != nullptr && aligned_to(args.residual, 4),
                       op << ": AddResidual updates args.residual, which is null or not 4-byte aligned");
            break;
        case Epilogue::RopeKV: break;  // checked above
    }
    return width;
}

}  // namespace util
}  // namespace cuda
}  // namespace brrr
