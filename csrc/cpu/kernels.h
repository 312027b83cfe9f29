// kernels.h — every CPU kernel the forward pass calls, on one screen. Row-major; W is [N, K]
// (out, in), stored as fp32 or bf16 bits (uint16). Activations and accumulation are fp32.
// Kernels parallelize with OpenMP over the calling thread's team size (the engine sets it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"
#include "model.h"

namespace brrr {
namespace cpu {

// ---- matmul.cpp -----------------------------------------------------------------------------
// Y[M, N] = X[M, K] · W[N, K]^T (or Y += ... when accumulate: the residual add of wo and w2).
// M <= 8 streams W once as a GEMV; larger M runs register-tiled blocks that reuse each W tile
// across every row of X. w_dtype: F32 or BF16. Y rows are ldy >= N floats apart.
void matmul(const float* X, const void* W, DType w_dtype, float* Y, int M, int N, int K, int ldy,
            bool accumulate);

// ---- kernels.cpp ----------------------------------------------------------------------------
// y[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * w; x, y [M, D] (may alias), w [D].
void rmsnorm(const float* x, const float* w, float* y, int M, int D, float eps);

// cos/sin[m, i] of angle positions[m] * inv_freq[i]; cos, sin [M, half], inv_freq [half].
void rope_tables(const int32_t* positions, const float* inv_freq, int M, int half, float* cos,
                 float* sin);
// Rotates n_heads heads of head_dim in place in each of M rows (row stride `stride` floats),
// rotate-half pairing (i, i + head_dim/2), with the tables of rope_tables.
void rope(float* x, int M, int stride, int n_heads, int head_dim, const float* cos,
          const float* sin);

// Causal attention of M query rows over a paged KV cache, GQA, fp32 softmax, scale
// 1/sqrt(head_dim). Row m reads keys/values at positions [0, positions[m]] of slot slots[m]:
//   key (slot s, position p, kv head g) = k_cache + pages.row(s, p)*kv_stride + g*head_dim.
// q [M, n_heads*head_dim] with row stride q_stride; out [M, n_heads*head_dim] (packed).
void attention(const float* q, int q_stride, const float* k_cache, const float* v_cache,
               const KvPages& pages, int kv_stride, const int32_t* slots,
               const int32_t* positions, float* out, int M, int n_heads, int n_kv_heads,
               int head_dim);

// out[m, j] = silu(h13[m, j]) * h13[m, H + j]; h13 [M, 2H] = gate|up, out [M, H].
void swiglu(const float* h13, float* out, int M, int H);

// x[i] rounded in place to the nearest e4m3 value (ties to even, saturating at +-448, NaN kept):
// what the CUDA engine's fp8 KV cache stores (model.h, KvCacheDtype::Fp8E4m3).
void round_to_e4m3(float* x, size_t n);

}  // namespace cpu
}  // namespace brrr
