// attention_prefill_variants.cuh — the kernels compared by cuda_attention_prefill_lab.cu. Each
// variant is a launcher with attention_prefill's signature. 01 is the first production kernel
// (kept here as it was); 11 is the mma.sync kernel as it shipped until Hopper got its own (07's
// kernel, grid order by L2 fit), 12 and 13 its other paths: 32-position K/V tiles at hd 128 (what
// GPUs with 99 KB of shared memory per CTA get) and the grid order of a K/V larger than L2. 15 is
// attention_prefill as it ships: on Hopper the TMA-fed wgmma kernel at hd 64 and 128, elsewhere 11.
//
// The first kernel (01) gives each warp 16 query rows, so every K or V fragment a warp reads
// from shared memory with ldmatrix feeds two mma.sync: on H100 shared memory then binds before the
// tensor cores do (a 512-byte ldmatrix.x4 is 4 clocks of the SM's 128 B/clock, two m16n8k16 are
// about 3). The variants 02-10 are instances of prefill_tiled_kernel<HD, KV, WARPS, MT, QREG>
// below, the production mma.sync kernel with its shape as template parameters (11-13 run the
// production kernel itself, attention_prefill_sm80.cuh), with the grid order set per variant:
//   WARPS  warps per CTA;  MT  16-row m-tiles per warp (query rows per CTA = 16 * WARPS * MT);
//   QREG   Q fragments kept in registers for the whole KV loop (else re-read from shared memory
//          at every k-step: at hd 128 and MT 2 they would not fit beside the accumulators).
//   KV     positions per K/V tile (64, or 32: half the S registers);
//   HEADS_FAST  grid x = head, y = query tile (longest first): the first wave is every head's
//          longest tiles and the heads of one KV group run side by side (01's grid has x = query
//          tile, so a wave is a few heads' tiles, long and short alike).
// With MT = 2 every K/V fragment feeds four mma instead of two. Unlike 01, the template skips the
// KV tiles that lie wholly above a warp's diagonal (01 masks them) and applies the softmax scale
// inside the exponent's FFMA instead of a separate multiply.
// 14 (attention_prefill_wgmma.cuh) moves hd 128 to warpgroup MMA fed by cp.async; 15 feeds it by
// TMA from a producer warpgroup (attention_prefill_sm90_kernel, attention_prefill_sm90.cuh).
//
// The cache is paged (ops.h KvCache). The production kernels (11-13, 15) read every K/V row
// through the block table; the lab's own kernels (01-10, 14) predate paging and read row
// slot * max_seq + p of the pool, the contiguous [slots][max_seq][Hkv][hd] layout. The lab runs
// them all on that layout with the identity table over it (slot s, block j -> s * blocks_per_seq +
// j), so every variant sees the same rows; check_contiguous rejects any other table.
#pragma once

namespace lab {

using brrr::cuda::KvCache;

// attention_prefill's signature: slot_blocks is the slot's table row on the host.
using PrefillLauncher = void (*)(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot,
                                 int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                                 cudaStream_t stream);

struct PrefillVariant {
    const char* name;
    PrefillLauncher launch;
};

using brrr::cuda::PrefillArgs;
namespace ptx = brrr::cuda::ptx;
namespace util = brrr::cuda::util;

// The checks attention_prefill makes, and for the lab's own kernels that the slot's blocks are
// the identity ones they assume (another table would be read wrong, not rejected). False when
// there is nothing to do (T = 0).
inline bool check_contiguous(const char* op, const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot,
                             int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim) {
    if (!brrr::cuda::check_prefill(op, q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim))
        return false;
    const int bs = kv.pages.block_size, bps = kv.pages.blocks_per_seq;
    BRRR_CHECK(kv.max_seq == bps * bs, op << ": the lab kernels read a contiguous cache: max_seq=" << kv.max_seq
                                          << " must be blocks_per_seq * block_size = " << bps * bs);
    for (int b = 0; b < CEIL_DIV(start_pos + T, bs); ++b)
        BRRR_CHECK(slot_blocks[b] == slot * bps + b,
                   op << ": the lab kernels need the identity block table; slot " << slot << " block " << b
                      << " is " << slot_blocks[b] << ", not " << slot * bps + b);
    return true;
}

// ---- 01: the first production kernel, 64 queries per CTA (4 warps x 16 rows) --------------------

constexpr int kRows64 = 64, kRows64KV = 64, kRows64Threads = 128;

template <int HD>
__global__ void __launch_bounds__(kRows64Threads) prefill_rows64_kernel(PrefillArgs a) {
    constexpr int P = HD + 8;  // padded pitch: ldmatrix rows in distinct bank groups
    constexpr int kKSteps = HD / 16;
    constexpr int kOutFrags = HD / 8;
    uint16_t* Qs = ptx::dynamic_smem<uint16_t>();
    uint16_t* Ks = Qs + kRows64 * P;  // [2][kRows64KV][P]
    uint16_t* Vs = Ks + 2 * kRows64KV * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int q_tile = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int hq = blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kRows64;
    const int kv_total = a.start_pos + a.T;                       // filled cache positions
    const int kv_end = a.start_pos + min(q0 + kRows64, a.T);     // what this tile's last row sees
    const int n_tiles = CEIL_DIV(kv_end, kRows64KV);
    const size_t slot_base = (size_t)a.slot * a.kv.max_seq;  // the identity table's rows (check_contiguous)

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.kv.k);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.kv.v);
    constexpr int kChunks = kRows64 * HD / 8;  // 16-byte chunks per tile (Q, K or V)
    for (int c = tid; c < kChunks; c += kRows64Threads) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + r * P + col, qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + col, ok);
    }
    auto load_kv = [&](int stage, int p0) {
        uint16_t* Kst = Ks + stage * kRows64KV * P;
        uint16_t* Vst = Vs + stage * kRows64KV * P;
        for (int c = tid; c < kChunks; c += kRows64Threads) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int p = p0 + r;
            const bool ok = p < kv_total;
            const size_t off = ((slot_base + (ok ? p : 0)) * a.n_kv_heads + kvh) * HD + col;
            ptx::cp_async_16(Kst + r * P + col, kbits + off, ok);
            ptx::cp_async_16(Vst + r * P + col, vbits + off, ok);
        }
    };
    load_kv(0, 0);
    ptx::cp_async_commit();

    // This thread's two rows (g and g + 8 of the warp's 16) and their absolute positions.
    const int row_pos[2] = {a.start_pos + q0 + warp * 16 + g, a.start_pos + q0 + warp * 16 + g + 8};
    const int warp_first_pos = a.start_pos + q0 + warp * 16;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};  // this thread's share; the quad is summed at the end
    float o[kOutFrags][4];
#pragma unroll
    for (int f = 0; f < kOutFrags; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
    uint32_t qf[kKSteps][4];

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int stage = kt & 1, kv0 = kt * kRows64KV;
        if (kt + 1 < n_tiles) {
            load_kv(stage ^ 1, kv0 + kRows64KV);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks)
                ptx::ldmatrix_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * P + ks * 16 + (lane >> 4) * 8);
        }
        const uint16_t* Kst = Ks + stage * kRows64KV * P;
        const uint16_t* Vst = Vs + stage * kRows64KV * P;

        // S = Q K^T for the warp's 16 rows x 64 positions.
        float s[kRows64KV / 8][4];
#pragma unroll
        for (int f = 0; f < kRows64KV / 8; ++f) s[f][0] = s[f][1] = s[f][2] = s[f][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
            for (int nj = 0; nj < kRows64KV / 16; ++nj) {
                uint32_t r[4];
                ptx::ldmatrix_x4(r, Kst + (nj * 16 + (lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx::mma_bf16_16816(s[2 * nj], qf[ks], b0);
                ptx::mma_bf16_16816(s[2 * nj + 1], qf[ks], b1);
            }
        }

        // Scale into log2 units; mask the future (only tiles reaching past the warp's first row).
        const bool diagonal = kv0 + kRows64KV - 1 > warp_first_pos;
#pragma unroll
        for (int f = 0; f < kRows64KV / 8; ++f) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[f][e] *= a.scale_log2;
                if (diagonal && kv0 + f * 8 + 2 * t4 + (e & 1) > row_pos[e >> 1]) s[f][e] = -INFINITY;
            }
        }

        // Online softmax: a row lives in the 4 threads of a quad.
        float alpha[2], base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int f = 0; f < kRows64KV / 8; ++f) mx = fmaxf(mx, fmaxf(s[f][2 * h], s[f][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float new_max = fmaxf(row_max[h], mx);
            base[h] = new_max == -INFINITY ? 0.f : new_max;  // a fully masked row so far
            alpha[h] = exp2f(row_max[h] - base[h]);
            row_max[h] = new_max;
            row_sum[h] *= alpha[h];
        }
#pragma unroll
        for (int f = 0; f < kRows64KV / 8; ++f) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[f][e] = exp2f(s[f][e] - base[e >> 1]);
                row_sum[e >> 1] += s[f][e];
            }
        }
#pragma unroll
        for (int f = 0; f < kOutFrags; ++f) {
            o[f][0] *= alpha[0];
            o[f][1] *= alpha[0];
            o[f][2] *= alpha[1];
            o[f][3] *= alpha[1];
        }

        // O += P V: the S accumulators of positions 16j..16j+15 are the A fragment of k-step j.
#pragma unroll
        for (int j = 0; j < kRows64KV / 16; ++j) {
            const uint32_t pa[4] = {util::pack_bf16x2(s[2 * j][0], s[2 * j][1]),
                                    util::pack_bf16x2(s[2 * j][2], s[2 * j][3]),
                                    util::pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                    util::pack_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int i = 0; i < HD / 16; ++i) {
                // Matrices: (pos 0-7, d 0-7), (pos 8-15, d 0-7), (pos 0-7, d 8-15), (pos 8-15, d 8-15).
                uint32_t r[4];
                ptx::ldmatrix_x4_trans(r, Vst + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx::mma_bf16_16816(o[2 * i], pa, b0);
                ptx::mma_bf16_16816(o[2 * i + 1], pa, b1);
            }
        }
        __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = q0 + warp * 16 + g + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
            for (int f = 0; f < kOutFrags; ++f)
                dst[(f * 8 + 2 * t4) / 2] = util::pack_bf16x2(o[f][2 * h] * inv, o[f][2 * h + 1] * inv);
        }
    }
}

void launch_rows64(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos, int T,
                   bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    if (!check_contiguous("prefill_rows64", q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads,
                          head_dim))
        return;
    // heads_fast is the shipped kernel's; 01 always runs query tiles fastest.
    const PrefillArgs a =
        brrr::cuda::prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    const dim3 grid(CEIL_DIV(T, kRows64), n_heads);
    const size_t smem = (size_t)(kRows64 + 4 * kRows64KV) * (head_dim + 8) * sizeof(uint16_t);
    auto kernel = head_dim == 64 ? prefill_rows64_kernel<64> : prefill_rows64_kernel<128>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kRows64Threads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH("prefill_rows64_kernel");
}

// ---- 02-10: the mma.sync kernel at other shapes ---------------------------------------------------
// The grid order comes from a.heads_fast, set here per variant.

// The production mma.sync kernel (attention_prefill_sm80.cuh: attention_prefill_kernel<HD, KV>, its
// WARPS = 4, MT = 2, QREG = hd 64) with its shape as template parameters: WARPS warps of MT 16-row
// m-tiles each; QREG keeps the Q fragments in registers for the whole KV loop.
template <int HD, int KV, int WARPS, int MT, bool QREG>
__global__ void __launch_bounds__(WARPS * 32) prefill_tiled_kernel(PrefillArgs a) {
    constexpr int P = HD + 8;  // padded pitch: ldmatrix rows in distinct bank groups
    constexpr int kKSteps = HD / 16, kOutFrags = HD / 8;
    constexpr int kRows = 16 * WARPS * MT, kThreads = 32 * WARPS;
    uint16_t* Qs = ptx::dynamic_smem<uint16_t>();
    uint16_t* Ks = Qs + kRows * P;  // [2][KV][P]
    uint16_t* Vs = Ks + 2 * KV * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    // The longest query tiles (the last ones) are scheduled first.
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kRows;
    const int kv_total = a.start_pos + a.T;                 // filled cache positions
    const int kv_end = a.start_pos + min(q0 + kRows, a.T);  // what this tile's last row sees
    const int n_tiles = CEIL_DIV(kv_end, KV);
    const size_t slot_base = (size_t)a.slot * a.kv.max_seq;  // the identity table's rows (check_contiguous)

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.kv.k);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.kv.v);
    for (int c = tid; c < kRows * HD / 8; c += kThreads) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + r * P + col, qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + col, ok);
    }
    auto load_kv = [&](int stage, int p0) {
        uint16_t* Kst = Ks + stage * KV * P;
        uint16_t* Vst = Vs + stage * KV * P;
        for (int c = tid; c < KV * HD / 8; c += kThreads) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int p = p0 + r;
            const bool ok = p < kv_total;
            const size_t off = ((slot_base + (ok ? p : 0)) * a.n_kv_heads + kvh) * HD + col;
            ptx::cp_async_16(Kst + r * P + col, kbits + off, ok);
            ptx::cp_async_16(Vst + r * P + col, vbits + off, ok);
        }
    };
    load_kv(0, 0);
    ptx::cp_async_commit();

    // The warp's 16 * MT rows are contiguous, so the KV tiles past its last row are skipped whole.
    const int warp_row0 = warp * 16 * MT;
    const int warp_first_pos = a.start_pos + q0 + warp_row0;
    const int warp_last_pos = warp_first_pos + 16 * MT - 1;
    int row_pos[MT][2];                    // this thread's rows g and g + 8 of each m-tile
    float row_max[MT][2], row_sum[MT][2];  // max in log2 units; sum is this thread's share
    float o[MT][kOutFrags][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            row_pos[mt][h] = warp_first_pos + mt * 16 + g + 8 * h;
            row_max[mt][h] = -INFINITY;
            row_sum[mt][h] = 0.f;
        }
#pragma unroll
        for (int f = 0; f < kOutFrags; ++f) o[mt][f][0] = o[mt][f][1] = o[mt][f][2] = o[mt][f][3] = 0.f;
    }
    uint32_t qf[QREG ? MT : 1][QREG ? kKSteps : 1][4];  // 1 x 1, unused, when Q is re-read
    auto q_fragment = [&](uint32_t r[4], int mt, int ks) {
        ptx::ldmatrix_x4(r, Qs + (warp_row0 + mt * 16 + (lane & 15)) * P + ks * 16 + (lane >> 4) * 8);
    };

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int stage = kt & 1, kv0 = kt * KV;
        if (kt + 1 < n_tiles) {
            load_kv(stage ^ 1, kv0 + KV);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        __syncthreads();
        if (QREG && kt == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int ks = 0; ks < kKSteps; ++ks) q_fragment(qf[QREG ? mt : 0][QREG ? ks : 0], mt, ks);
        }
        if (kv0 <= warp_last_pos) {
            const uint16_t* Kst = Ks + stage * KV * P;
            const uint16_t* Vst = Vs + stage * KV * P;

            // S = Q K^T for the warp's rows x KV positions: each K fragment feeds the MT m-tiles.
            float s[MT][KV / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int f = 0; f < KV / 8; ++f) s[mt][f][0] = s[mt][f][1] = s[mt][f][2] = s[mt][f][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks) {
                uint32_t qcur[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (QREG) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) qcur[mt][e] = qf[QREG ? mt : 0][QREG ? ks : 0][e];
                    } else {
                        q_fragment(qcur[mt], mt, ks);
                    }
                }
#pragma unroll
                for (int nj = 0; nj < KV / 16; ++nj) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4(r, Kst + (nj * 16 + (lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_bf16_16816(s[mt][2 * nj], qcur[mt], b0);
                        ptx::mma_bf16_16816(s[mt][2 * nj + 1], qcur[mt], b1);
                    }
                }
            }

            // Mask the future on the tiles that reach past the warp's first row; online softmax
            // (a row lives in the 4 threads of a quad), the scale applied in the exponent's FFMA.
            const bool diagonal = kv0 + KV - 1 > warp_first_pos;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (diagonal) {
#pragma unroll
                    for (int f = 0; f < KV / 8; ++f)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (kv0 + f * 8 + 2 * t4 + (e & 1) > row_pos[mt][e >> 1]) s[mt][f][e] = -INFINITY;
                }
                float alpha[2], base[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int f = 0; f < KV / 8; ++f) mx = fmaxf(mx, fmaxf(s[mt][f][2 * h], s[mt][f][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float new_max = fmaxf(row_max[mt][h], mx * a.scale_log2);
                    base[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
                    alpha[h] = exp2f(row_max[mt][h] - base[h]);
                    row_max[mt][h] = new_max;
                    row_sum[mt][h] *= alpha[h];
                }
#pragma unroll
                for (int f = 0; f < KV / 8; ++f) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mt][f][e] = exp2f(fmaf(s[mt][f][e], a.scale_log2, -base[e >> 1]));
                        row_sum[mt][e >> 1] += s[mt][f][e];
                    }
                }
#pragma unroll
                for (int f = 0; f < kOutFrags; ++f) {
                    o[mt][f][0] *= alpha[0];
                    o[mt][f][1] *= alpha[0];
                    o[mt][f][2] *= alpha[1];
                    o[mt][f][3] *= alpha[1];
                }
            }

            // O += P V: the S accumulators of positions 16j..16j+15 are the A fragment of k-step
            // j (the two layouts coincide); each V fragment feeds the MT m-tiles.
#pragma unroll
            for (int j = 0; j < KV / 16; ++j) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = util::pack_bf16x2(s[mt][2 * j][0], s[mt][2 * j][1]);
                    pa[mt][1] = util::pack_bf16x2(s[mt][2 * j][2], s[mt][2 * j][3]);
                    pa[mt][2] = util::pack_bf16x2(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
                    pa[mt][3] = util::pack_bf16x2(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
                }
#pragma unroll
                for (int i = 0; i < HD / 16; ++i) {
                    // Matrices: (pos 0-7, d 0-7), (pos 8-15, d 0-7), (pos 0-7, d 8-15), (pos 8-15, d 8-15).
                    uint32_t r[4];
                    ptx::ldmatrix_x4_trans(r, Vst + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
                    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_bf16_16816(o[mt][2 * i], pa[mt], b0);
                        ptx::mma_bf16_16816(o[mt][2 * i + 1], pa[mt], b1);
                    }
                }
            }
        }
        __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = row_sum[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = q0 + warp_row0 + mt * 16 + g + 8 * h;
            if (row < a.T) {
                const float inv = 1.f / l;
                uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
                for (int f = 0; f < kOutFrags; ++f)
                    dst[(f * 8 + 2 * t4) / 2] = util::pack_bf16x2(o[mt][f][2 * h] * inv, o[mt][f][2 * h + 1] * inv);
            }
        }
    }
}


// QREG_HD64: keep Q in registers at hd 64 when MT = 2 (at hd 128 and MT = 2 it is always re-read).
// KV128: the KV tile at hd 128 (hd 64 always takes 64).
template <int HD, int WARPS, int MT, bool QREG_HD64, int KV128, bool HEADS_FAST>
void launch_tiled_hd(PrefillArgs a, cudaStream_t stream) {
    constexpr bool kQReg = MT == 1 || (HD == 64 && QREG_HD64);
    constexpr int KV = HD == 128 ? KV128 : 64;
    auto kernel = prefill_tiled_kernel<HD, KV, WARPS, MT, kQReg>;
    constexpr size_t smem = (size_t)(16 * WARPS * MT + 4 * KV) * (HD + 8) * sizeof(uint16_t);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    a.heads_fast = HEADS_FAST;
    const int q_tiles = CEIL_DIV(a.T, 16 * WARPS * MT);
    const dim3 grid = HEADS_FAST ? dim3(a.n_heads, q_tiles) : dim3(q_tiles, a.n_heads);
    kernel<<<grid, WARPS * 32, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH("prefill_tiled_kernel");
}

template <int WARPS, int MT, bool QREG_HD64, int KV128 = 64, bool HEADS_FAST = false>
void launch_tiled(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos, int T,
                  bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    if (!check_contiguous("prefill_tiled", q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads,
                          head_dim))
        return;
    // launch_tiled_hd overrides heads_fast with the variant's grid order.
    const PrefillArgs a =
        brrr::cuda::prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    if (head_dim == 64) launch_tiled_hd<64, WARPS, MT, QREG_HD64, KV128, HEADS_FAST>(a, stream);
    else launch_tiled_hd<128, WARPS, MT, QREG_HD64, KV128, HEADS_FAST>(a, stream);
}

// ---- 11-13: the mma.sync kernel as it shipped, and its other paths -------------------------------
// The production kernel, so the rows come through the block table.

template <int KV128, bool FORCE_TILES_FAST>
void launch_mma_sync_path(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos,
                          int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    if (!brrr::cuda::check_prefill("mma_sync_path", q, kv, slot_blocks, slot, start_pos, T, out, n_heads, n_kv_heads,
                                    head_dim))
        return;
    PrefillArgs a = brrr::cuda::prefill_args(q, kv, slot, start_pos, T, out, n_heads, n_kv_heads, head_dim);
    if (FORCE_TILES_FAST) a.heads_fast = false;
    const dim3 grid = brrr::cuda::prefill_grid(a);
    if (head_dim == 64) brrr::cuda::launch_prefill<64, 64, false>(a, grid, stream);
    else brrr::cuda::launch_prefill<128, KV128, false>(a, grid, stream);
}

}  // namespace lab

#include "attention_prefill_wgmma.cuh"

namespace lab {

const PrefillVariant kPrefillVariants[] = {
    {"01_rows64", launch_rows64},
    {"02_rows64_skip_ffma", launch_tiled<4, 1, true>},
    {"03_rows128_8warps", launch_tiled<8, 1, true>},
    {"04_rows128_2tiles", launch_tiled<4, 2, true>},
    {"05_rows128_2tiles_qsmem", launch_tiled<4, 2, false>},
    {"06_rows256_8w_2tiles", launch_tiled<8, 2, true>},
    {"07_rows128_2tiles_headsfast", launch_tiled<4, 2, true, 64, true>},
    {"08_rows64_skip_headsfast", launch_tiled<4, 1, true, 64, true>},
    {"09_rows128_2tiles_kv32_headsfast", launch_tiled<4, 2, true, 32, true>},
    {"10_rows256_8w_2tiles_headsfast", launch_tiled<8, 2, true, 64, true>},
    {"11_mma_sync", launch_mma_sync_path<64, false>},
    {"12_mma_sync_kv32", launch_mma_sync_path<32, false>},
    {"13_mma_sync_tiles_fast", launch_mma_sync_path<64, true>},
    {"14_wgmma_hd128", launch_wgmma_hd128},
    {"15_shipped_tma_wgmma", brrr::cuda::attention_prefill},
};

}  // namespace lab
