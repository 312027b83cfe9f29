// rope.cu — rotary position embedding on q and k (rotate-half pairing: dim i with i + hd/2), q
// written out as bf16 for attention, k and v appended to this layer's KV cache.
//
//   qkv      [M, (Hq + 2 Hkv) * hd] f32   row m = token at positions[m] of sequence slot slots[m]
//   q_out    [M, Hq, hd] bf16
//   k_cache, v_cache  [max_batch][max_seq][Hkv][hd] bf16 (this layer's slice)
//   angle(m, i) = positions[m] * inv_freq[i]      (fp32 product, as the PyTorch reference does)
//
// Grid (M, Hq + 2 Hkv): one block per (row, head), hd/2 threads, one rotation pair per thread;
// v heads are plain copies. cos/sin are taken in double of the fp32 angle: positions reach 1e5
// radians, where the fast-math sin/cos the build enables would be off by whole percents.
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

__global__ void rope_kv_append_kernel(const float* __restrict__ qkv,
                                      const int* __restrict__ positions,
                                      const int* __restrict__ slots,
                                      const float* __restrict__ inv_freq, bf16* __restrict__ q_out,
                                      bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                      int n_heads, int n_kv_heads, int head_dim, int max_seq) {
    const int m = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
    const int half = head_dim / 2;
    const int qkv_dim = (n_heads + 2 * n_kv_heads) * head_dim;
    const int pos = positions[m], slot = slots[m];
    const bool pos_ok = pos >= 0 && pos < max_seq && slot >= 0;
    const float* src = qkv + (size_t)m * qkv_dim + (size_t)head * head_dim;
    const float x0 = src[i], x1 = src[i + half];

    if (head >= n_heads + n_kv_heads) {  // v: copied into the cache unrotated
        if (!pos_ok) return;
        const int vh = head - n_heads - n_kv_heads;
        bf16* dst = v_cache + (((size_t)slot * max_seq + pos) * n_kv_heads + vh) * head_dim;
        dst[i] = __float2bfloat16_rn(x0);
        dst[i + half] = __float2bfloat16_rn(x1);
        return;
    }

    const float angle = (float)pos * inv_freq[i];
    double s, c;
    sincos((double)angle, &s, &c);
    const float sin_a = (float)s, cos_a = (float)c;
    const float r0 = x0 * cos_a - x1 * sin_a;
    const float r1 = x1 * cos_a + x0 * sin_a;

    if (head < n_heads) {
        bf16* dst = q_out + ((size_t)m * n_heads + head) * head_dim;
        // A position the cache cannot hold leaves q as NaN, so the mistake cannot pass unseen.
        dst[i] = __float2bfloat16_rn(pos_ok ? r0 : NAN);
        dst[i + half] = __float2bfloat16_rn(pos_ok ? r1 : NAN);
    } else if (pos_ok) {
        const int kh = head - n_heads;
        bf16* dst = k_cache + (((size_t)slot * max_seq + pos) * n_kv_heads + kh) * head_dim;
        dst[i] = __float2bfloat16_rn(r0);
        dst[i + half] = __float2bfloat16_rn(r1);
    }
}

}  // namespace

void rope_kv_append(const float* qkv, const int* positions, const int* slots,
                    const float* inv_freq, bf16* q_out, bf16* k_cache, bf16* v_cache, int M,
                    int n_heads, int n_kv_heads, int head_dim, int max_seq, cudaStream_t stream) {
    BRRR_CHECK(M >= 0 && n_heads > 0 && n_kv_heads > 0 && max_seq > 0,
               "rope_kv_append: bad sizes M=" << M << " n_heads=" << n_heads
                                              << " n_kv_heads=" << n_kv_heads
                                              << " max_seq=" << max_seq);
    BRRR_CHECK(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= 2048,
               "rope_kv_append: head_dim must be even and <= 2048, got " << head_dim);
    if (M == 0) return;
    const dim3 grid(M, n_heads + 2 * n_kv_heads);
    rope_kv_append_kernel<<<grid, head_dim / 2, 0, stream>>>(qkv, positions, slots, inv_freq, q_out,
                                                            k_cache, v_cache, n_heads, n_kv_heads,
                                                            head_dim, max_seq);
    CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace brrr
