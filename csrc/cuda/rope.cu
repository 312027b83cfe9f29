// rope.cu — rotary position embedding on q and k (rotate-half pairing: dim i with i + hd/2), q
// written out as bf16 for attention, k and v appended to this layer's KV cache.
//
//   qkv      [M, (Hq + 2 Hkv) * hd] f32   row m = token at positions[m] of sequence slot slots[m]
//   q_out    [M, Hq, hd] bf16
//   kv       this layer's paged cache (ops.h KvCache): k, v [n_blocks * block_size][Hkv][hd] bf16,
//            or e4m3 (kv.fp8: rounded to nearest even, saturating)
//   angle(m, i) = positions[m] * inv_freq[i]      (fp32 product, as the PyTorch reference does)
//
// Grid (M, Hq + 2 Hkv): one block per (row, head), hd/2 threads, one rotation pair per thread;
// v heads are plain copies. The rotation and the cache addressing are util::store_rope_kv, which
// the GEMV's RopeKV epilogue (gemv.cu) shares, so decode and prefill place q, k, v identically.
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

__global__ void rope_kv_append_kernel(const float* __restrict__ qkv, RopeKVArgs r) {
    const int m = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
    const int qkv_dim = (r.n_heads + 2 * r.n_kv_heads) * r.head_dim;
    const float* src = qkv + (size_t)m * qkv_dim + (size_t)head * r.head_dim;
    util::store_rope_kv(r, m, head, i, src[i], src[i + r.head_dim / 2]);
}

}  // namespace

void rope_kv_append(const float* qkv, const RopeKVArgs& rope, int M, cudaStream_t stream) {
    util::check_rope_kv("rope_kv_append", rope, M);
    BRRR_CHECK(qkv != nullptr, "rope_kv_append: qkv must be a device pointer, got null");
    if (M == 0) return;
    const dim3 grid(M, rope.n_heads + 2 * rope.n_kv_heads);
    rope_kv_append_kernel<<<grid, rope.head_dim / 2, 0, stream>>>(qkv, rope);
    CUDA_CHECK_LAUNCH();
}

void rope_kv_append(const float* qkv, const int* positions, const int* slots,
                    const float* inv_freq, bf16* q_out, const KvCache& kv, int M,
                    int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
    RopeKVArgs r;
    r.positions = positions;
    r.slots = slots;
    r.inv_freq = inv_freq;
    r.q_out = q_out;
    r.kv = kv;
    r.n_heads = n_heads;
    r.n_kv_heads = n_kv_heads;
    r.head_dim = head_dim;
    rope_kv_append(qkv, r, M, stream);
}

}  // namespace cuda
}  // namespace brrr
