// embed.cu — token embedding lookup, which also records each token in the per-slot history the
// sampler's repetition penalty reads (one launch for both: at batch-1 decode a launch is a few
// microseconds of an otherwise idle GPU).
//
//   x[m, :] = float(table[tokens[m] - offset, :])   tokens [M], table [rows, D] bf16: vocabulary
//                                                   rows [offset, offset + rows) of V (rows past V,
//                                                   a last shard's padding, are never read); x [M, D] f32
//   history[slots[m] * max_seq + positions[m]] = tokens[m]   (when a TokenHistory is given)
//
// One engine holds the whole vocabulary (offset 0, rows V). A tensor-parallel rank holds its rows
// (model.h, Config::vocab_offset): a token of another rank's rows gives a zero row, so the
// residual all-reduce that follows sums every rank's rows into the embedding, exactly.
// One block per row; rows whose D is a multiple of 8 move 16 bytes per thread per step (8 bf16 in,
// two float4 out). The host validates token ids before they reach the device; a bad id (outside
// [0, V)) that slips through anyway turns the row into NaN instead of reading outside the table:
// in the shard at offset 0 only, the others give zeros, so the sum is NaN on every rank alike.
// Launched with PDL (launch.cuh) behind decode_steps' sampler, which writes the tokens it reads.
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kEmbedThreads = 128;

// Thread 0 of row m's block: the token into its slot's history (rows outside it are skipped).
__device__ __forceinline__ void record_token(const TokenHistory& h, int m, int tok) {
    if (!h.history || threadIdx.x != 0) return;
    const int slot = h.slots[m], pos = h.positions[m];
    if (slot < 0 || slot >= h.max_batch || pos < 0 || pos >= h.max_seq) return;
    h.history[(size_t)slot * h.max_seq + pos] = tok;
}

template <bool VEC8>
__global__ void embed_kernel(const int* __restrict__ tokens, const bf16* __restrict__ table,
                             float* __restrict__ x, int V, int D, int offset, int rows, TokenHistory record) {
    pdl_wait();
    pdl_launch_dependents();
    const int m = blockIdx.x;
    const int tok = tokens[m];
    record_token(record, m, tok);
    float* row_out = x + (size_t)m * D;
    const int local = embed_row_of(tok, V, offset, rows);
    if (local < 0) {
        const float fill = local == kEmbedInvalid ? NAN : 0.f;
        for (int i = threadIdx.x; i < D; i += blockDim.x) row_out[i] = fill;
        return;
    }
    if (!VEC8) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) row_out[i] = __bfloat162float(table[(size_t)local * D + i]);
        return;
    }
    const uint4* row_in = reinterpret_cast<const uint4*>(table + (size_t)local * D);
    float4* out4 = reinterpret_cast<float4*>(row_out);
    for (int i = threadIdx.x; i < D / 8; i += blockDim.x) {
        uint4 packed = row_in[i];
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
        out4[2 * i] = make_float4(a.x, a.y, b.x, b.y);
        out4[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void check_vocab_shard(const char* op, int V, int vocab_offset, int vocab_rows) {
    BRRR_CHECK(vocab_offset >= 0 && vocab_offset < V && vocab_rows > 0,
               op << ": a table of " << vocab_rows << " rows from vocabulary row " << vocab_offset
                  << " holds no row of the " << V << " of the vocabulary");
}

void embed(const int* tokens, const bf16* table, float* x, int M, int D, int V, int vocab_offset, int vocab_rows,
           const TokenHistory& record, cudaStream_t stream) {
    BRRR_CHECK(M >= 0 && D > 0 && V > 0, "embed: bad sizes M=" << M << " D=" << D << " V=" << V);
    check_vocab_shard("embed", V, vocab_offset, vocab_rows);
    BRRR_CHECK(!record.history || (record.slots && record.positions && record.max_batch > 0 && record.max_seq > 0),
               "embed: a token history needs slots, positions and sizes max_batch=" << record.max_batch
                                                                                << " max_seq=" << record.max_seq);
    if (M == 0) return;
    if (D % 8 == 0 && aligned16(table) && aligned16(x)) {
        launch_pdl(embed_kernel<true>, dim3(M), dim3(kEmbedThreads), 0, stream, tokens, table, x, V, D, vocab_offset,
                   vocab_rows, record);
        CUDA_CHECK_LAUNCH("embed_kernel<vec8>");
    } else {
        launch_pdl(embed_kernel<false>, dim3(M), dim3(kEmbedThreads), 0, stream, tokens, table, x, V, D, vocab_offset,
                   vocab_rows, record);
        CUDA_CHECK_LAUNCH("embed_kernel<scalar>");
    }
}

}  // namespace cuda
}  // namespace brrr
