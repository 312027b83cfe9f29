// quant.h — GGUF block formats kept as they are, and the CPU kernels that run on them.
//
// Weight formats (byte layouts exactly ggml's; sizes static_asserted):
//   Q8_0 34 B / 32   Q4_0 18 B / 32   Q4_1 20 B / 32   Q5_0 22 B / 32   Q5_1 24 B / 32
//   Q4_K 144 B / 256   Q5_K 176 B / 256   Q6_K 210 B / 256.  A weight matrix W[N, K] is N rows of K / block_elems blocks, row-major.
// Activation format (ours): ActBlock, 32 values as int8 with an fp32 scale and the two scaled
// 16-value sums, so every weight type dots against the same activation row (rule in quant_gemv.cpp).
//
// Kernels: quantize_activations, vec_dot, gemv (M = 1) and gemm (M > 1), each on one of three
// instruction-set paths picked at run time from the CPU's features (or forced, for tests).
// Quantizers: quantize_rows, ggml's reference algorithms (bit-identical; see quant_quantize.cpp).
// Errors (bad sizes, unknown types, a path this CPU lacks) are brrr::Error via BRRR_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace brrr {
namespace quant {

// GGML type ids, as stored in a GGUF file.
enum class QType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
// Every kept type, in id order (type tables and error messages iterate over it).
constexpr int kTypeIds[] = {2, 3, 6, 7, 8, 12, 13, 14};

constexpr int kBlock32 = 32;   // elements of a Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 block and of an ActBlock
constexpr int kBlockK = 256;   // elements of a K-quant super-block

struct BlockQ8_0 {        // x[i] = d * qs[i]
    uint16_t d;           // fp16 scale
    int8_t qs[32];
};
struct BlockQ4_0 {        // x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8)
    uint16_t d;
    uint8_t qs[16];
};
struct BlockQ4_1 {        // x[j] = d * (qs[j] & 15) + m, x[j + 16] = d * (qs[j] >> 4) + m
    uint16_t d, m;
    uint8_t qs[16];
};
// Q5: the fifth bit of value j is bit j of qh read as a little-endian uint32 (ggml's layout).
struct BlockQ5_0 {        // x[j] = d * ((qs[j] & 15 | hbit(j) << 4) - 16), x[j + 16] from qs[j] >> 4
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
struct BlockQ5_1 {        // x[j] = d * (qs[j] & 15 | hbit(j) << 4) + m, likewise x[j + 16]
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
};
// K-quants: 8 sub-blocks of 32 (Q4_K, Q5_K) or 16 of 16 (Q6_K), with 6- or 8-bit sub-scales.
struct BlockQ4_K {        // x = d * sc[s] * q - dmin * m[s]; q 4 bit
    uint16_t d, dmin;
    uint8_t scales[12];   // sc[8], m[8] as 6-bit values packed (ggml's get_scale_min_k4)
    uint8_t qs[128];      // per 64 values: 32 bytes, low nibbles first 32, high nibbles next 32
};
// ggml's get_scale_min_k4: the 6-bit scale d and min m of sub-block j (0..7) of a Q4_K / Q5_K
// block from its 12 packed scale bytes q (cuda/qlayout.h has the same on 32-bit words).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}
struct BlockQ5_K {        // as Q4_K with a fifth bit from qh
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];       // bit s of qh[l]: high bit of value 32 * s + l
    uint8_t qs[128];
};
struct BlockQ6_K {        // x = d * scales[s] * (q - 32); q 6 bit, sub-blocks of 16
    uint8_t ql[128];      // low 4 bits
    uint8_t qh[64];       // high 2 bits
    int8_t scales[16];
    uint16_t d;
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

// 32 activations: x[i] ~= d * qs[i]. d is stored twice and the half sums already scaled,
// dsum[h] = d * (sum of qs[16 h .. 16 h + 15]), so one 16-byte load times a chunk's
// {s_lo, s_hi, b_lo, b_hi} gives both lane scales and both bias terms (quant_gemv.cpp).
struct ActBlock {
    float d[2];
    float dsum[2];
    int8_t qs[32];
};
static_assert(sizeof(ActBlock) == 48, "ActBlock is 48 bytes");

// Instruction-set paths of the kernels. Auto = the best this CPU supports. Amx = the AVX-512 VNNI
// kernels for M < kAmxMinRows and AMX-INT8 tiles for the GEMM from kAmxMinRows rows of X on
// (needs the AMX tile permission, requested from the OS once per process).
enum class Isa : int { Auto = 0, Scalar = 1, Avx2 = 2, Avx512Vnni = 3, Amx = 4 };
// Rows of X from which the Amx path runs tiles (below, each output row equals its M = 1 GEMV).
constexpr int64_t kAmxMinRows = 16;

// ---- formats (quant_formats.cpp) -------------------------------------------------------------
bool known_type(int type_id);
QType checked_type(int type_id);               // throws for ids the engine does not keep quantized
const char* type_name(QType t);                // "q4_k" ...
QType type_from_name(const std::string& name);  // throws for unknown names
// Elements of a block: 32, or 256 for the K-quants' super-blocks.
constexpr int block_elems(QType t) {
    return t == QType::Q4_K || t == QType::Q5_K || t == QType::Q6_K ? kBlockK : kBlock32;
}
size_t block_bytes(QType t);
size_t row_bytes(QType t, int64_t K);          // throws unless K is a positive multiple of block_elems
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_f16_bits(float f);             // round to nearest even, as F16C and numpy
// y[K] = the exact float values of one row of blocks (ggml's dequantize_row_*).
void dequantize_row(QType t, const void* blocks, float* y, int64_t K);
// Index of the first of n_blocks blocks whose fp16 scale fields (d, and m / dmin) hold NaN or
// inf, or -1: what a loader checks before keeping a tensor quantized.
int64_t first_bad_scale(QType t, const void* blocks, int64_t n_blocks);

// ---- quantizers (quant_quantize.cpp) ---------------------------------------------------------
// rows of x[N, K] -> N rows of row_bytes(t, K); OpenMP over rows.
void quantize_rows(QType t, const float* x, void* out, int64_t N, int64_t K);

// ---- kernels (quant_gemv.cpp) ----------------------------------------------------------------
Isa best_isa();                    // what Auto resolves to on this CPU
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);     // "scalar", "avx2", "avx512vnni", "amx"
std::string cpu_features();        // e.g. "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni"
// K / 32 activation blocks of one fp32 row.
void quantize_activations(const float* x, ActBlock* out, int64_t K);
// Xq[M, K / 32] = the activation blocks of each row of X[M, K]; OpenMP over rows.
void quantize_activation_rows(const float* X, ActBlock* Xq, int64_t M, int64_t K, int n_threads = 0);
// dot(W row, activation row) for one row of K values.
float vec_dot(QType t, const void* w_row, const ActBlock* x, int64_t K, Isa isa = Isa::Auto);
// Y[M, N] = Xq . W[N, K]^T (Y += ... with accumulate) on activations already quantized
// (Xq: M rows of K / 32 blocks); Y rows ldy >= N floats apart, so a fused matrix can be run
// piece by piece into its column ranges. M = 1 is the GEMV, M > 1 reuses W rows across rows of
// X. n_threads 0 = the calling team's size (omp_get_max_threads).
void matmul(QType t, const void* W, const ActBlock* Xq, float* Y, int64_t M, int64_t N, int64_t K,
            int64_t ldy, bool accumulate, Isa isa = Isa::Auto, int n_threads = 0);
// y[N] = W[N, K] . x[K] and Y[M, N] = X[M, K] . W[N, K]^T on fp32 activations (quantized here).
void gemv(QType t, const void* W, const float* x, float* y, int64_t N, int64_t K,
          Isa isa = Isa::Auto, int n_threads = 0);
void gemm(QType t, const void* W, const float* X, float* Y, int64_t M, int64_t N, int64_t K,
          Isa isa = Isa::Auto, int n_threads = 0);

}  // namespace quant
}  // namespace brrr
