// sampling.cu — one token per sequence, chosen on the device by exactly the rules of
// cpu/sampling.h (so a seed means the same thing on both backends):
//   penalty (distinct history tokens) -> greedy argmax when T == 0, else weights
//   w_i = exp((z_i - max z) / T) -> top-k -> top-p -> min-p -> draw with uniform01(seed, step),
//   walking the kept tokens heaviest first (ties: lower index first) until the running sum
//   exceeds u * kept mass. logprob = log_softmax(raw logits)[token].
//
//   logits [B, V] f32, history [max_batch, max_seq] i32, scratch [B, V] f32 (the weights w)
//
// Pass A (the raw log-sum-exp for the logprob and the argmax of the penalized logits, all greedy
// decoding needs) is split over the row: sample_scan_kernel gives each ~2048-logit slice its own
// block and writes one ScanPart per slice; one block per row then merges the parts (one block per
// row would stream a 128k-logit row at one SM's bandwidth).
//
// Then one block of 1024 threads per row (temperature > 0 only). The trick is that every filter and the draw is "walk the
// tokens heaviest first until a running sum (of 1s for top-k, of w for top-p and the draw)
// reaches a target" — and that needs no sort. Non-negative floats order like their bit patterns,
// so a radix select over the 32-bit keys of w finds the stopping key in three histogram passes
// (11 + 11 + 10 bits, the histogram in shared memory), and one ordered pass over the tokens with
// exactly that key finds the index among ties. A bin's tokens share their exponent, so its mass is
// kept as integer sums of mantissas (exact, and 32-bit shared atomics are native). A kept set is
// always a prefix of the heaviest-first order, stored as a Cut (key, idx): token i is kept iff
// key_i > key, or key_i == key and i <= idx.
//
// With a SampleFeedBack the sampler also closes the loop of engine.decode_steps on the device: the
// token just sampled becomes the next decode's input and the row moves one position on, in the
// sampling kernel's last step rather than a launch of its own (a few microseconds a token at
// batch 1, where the GPU has nothing else to do). Choosing greedy tokens in the LM head's tail
// instead was tried and lost (docs/kernels/sampling.md). Across engine.decode_launch calls the
// loop closes the same way: a row given as token -1 - j takes the token row j of the previous
// launch sampled last (continue_rows_kernel), so the host launches the next rounds before it has
// read the last ones.
//
// Bitwise agreement with the CPU: the build uses fast math, so the arithmetic that decides which
// token wins is spelled out in IEEE-rounded intrinsics, exp is taken in double and rounded to
// float (what glibc's expf returns), and masses are summed in double as on the CPU (a bin's mass
// exactly). Only the summation order differs, which moves a boundary by ~1e-16 relative.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "model.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;
constexpr int kPasses = 3;
__constant__ int kDigitShift[kPasses] = {21, 10, 0};
__constant__ int kDigitBits[kPasses] = {11, 11, 10};

struct Cut {
    uint32_t key;
    int idx;
};
constexpr Cut kKeepAll = {0u, INT_MAX};

__device__ __forceinline__ bool in_cut(uint32_t key, int i, Cut c) {
    return key > c.key || (key == c.key && i <= c.idx);
}
// The intersection of two kept prefixes is the shorter one.
__device__ __forceinline__ Cut shorter(Cut a, Cut b) {
    return (a.key > b.key || (a.key == b.key && a.idx < b.idx)) ? a : b;
}
__device__ __forceinline__ uint32_t key_of(float w) { return __float_as_uint(w); }

struct Shared {
    // The walk's histogram. A bin's weights share their exponent, so its mass is kept exactly as
    // integer sums of their mantissas' high 11 and low 12 bits (bin_mass): 32-bit shared atomics
    // are native, where a double's is a compare-and-swap loop (twice the time of the walk).
    int count[kMaxBins];
    unsigned mant_hi[kMaxBins], mant_lo[kMaxBins];
    double warp_d[kWarps];
    float warp_f[kWarps];
    int warp_i[kWarps];
    int choice_pos, lo_pos, found;
    double choice_above;
};

// ---- block-wide reductions (every thread gets the result) ------------------------------------

__device__ double block_sum(double v, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sh.warp_d[warp] = v;
    __syncthreads();
    double total = 0;
    for (int i = 0; i < kWarps; ++i) total += sh.warp_d[i];
    __syncthreads();
    return total;
}

// Exclusive prefix sum over threads in threadIdx order.
__device__ double block_exclusive_scan(double v, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inclusive = v;
    for (int o = 1; o < 32; o <<= 1) {
        const double up = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += up;
    }
    if (lane == 31) sh.warp_d[warp] = inclusive;
    __syncthreads();
    double offset = 0;
    for (int i = 0; i < warp; ++i) offset += sh.warp_d[i];
    __syncthreads();
    return offset + inclusive - v;
}

// Largest value, lowest index among equals (the CPU's strict-greater scan from index 0).
__device__ void block_argmax(float& v, int& idx, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    if (lane == 0) { sh.warp_f[warp] = v; sh.warp_i[warp] = idx; }
    __syncthreads();
    v = sh.warp_f[0];
    idx = sh.warp_i[0];
    for (int i = 1; i < kWarps; ++i)
        if (sh.warp_f[i] > v || (sh.warp_f[i] == v && sh.warp_i[i] < idx)) { v = sh.warp_f[i]; idx = sh.warp_i[i]; }
    __syncthreads();
}

// Running log-sum-exp state (max m, sum s of exp(x - m)). Each thread adds its ~V/1024 terms in
// fp32 (single-instruction exp: this pass sits on every token's path), threads merge in double;
// the logprob it feeds is reported, never used to choose, so ~1e-6 is plenty.
struct Lse {
    float m = -INFINITY;
    double s = 0.0;
};
struct LseF {
    float m = -INFINITY;
    float s = 0.f;
};
__device__ __forceinline__ void lse_add(LseF& a, float x) {
    if (x > a.m) {
        a.s = (a.m == -INFINITY ? 0.f : a.s * __expf(a.m - x)) + 1.f;
        a.m = x;
    } else if (x != -INFINITY) {
        a.s += __expf(x - a.m);
    }
}
__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
    if (b.m == -INFINITY) return a;
    if (a.m == -INFINITY) return b;
    Lse r;
    r.m = fmaxf(a.m, b.m);
    r.s = a.s * exp((double)a.m - r.m) + b.s * exp((double)b.m - r.m);
    return r;
}
// The Lse of the lane `offset` away (xor): one butterfly step of a warp-wide merge.
__device__ __forceinline__ Lse lse_shfl_xor(Lse v, int offset) {
    Lse other;
    other.m = __shfl_xor_sync(0xffffffffu, v.m, offset);
    other.s = __shfl_xor_sync(0xffffffffu, v.s, offset);
    return other;
}
__device__ double block_log_sum_exp(Lse v, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = lse_merge(v, lse_shfl_xor(v, o));
    if (lane == 0) { sh.warp_f[warp] = v.m; sh.warp_d[warp] = v.s; }
    __syncthreads();
    Lse total;
    for (int i = 0; i < kWarps; ++i) {
        Lse w;
        w.m = sh.warp_f[i];
        w.s = sh.warp_d[i];
        total = lse_merge(total, w);
    }
    __syncthreads();
    return (double)total.m + log(total.s);
}

// ---- the heaviest-first walk ------------------------------------------------------------------

// The mass of a bin whose keys start with key_bits (the walk's prefix and the bin's digit): every
// weight in it has the exponent field E of those bits, so the sum of (2^23 + mantissa) x
// 2^(E - 150) (normal) or mantissa x 2^-149 (subnormal) over its `count` weights is exact in double
// (at most 2^20 x 2^24 before the scaling). NaN weights (E = 255) give NaN, as summing them would.
__device__ double bin_mass(uint32_t key_bits, int count, unsigned hi, unsigned lo) {
    const int E = (int)((key_bits >> 23) & 0xFFu);
    if (E == 0xFF) return count ? (double)NAN : 0.0;
    const double mantissas = (double)hi * 4096.0 + (double)lo + (E ? (double)count * 8388608.0 : 0.0);
    return ldexp(mantissas, max(E, 1) - 150);
}

__device__ double mass_of(const float* w, int V, Cut c, Shared& sh) {
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) {
        const float wi = w[i];
        if (in_cut(key_of(wi), i, c)) sum += (double)wi;
    }
    return block_sum(sum, sh);
}

// Index of the j-th token (0-based, in index order) of cut c whose key is exactly `key`.
__device__ int nth_with_key(const float* w, int V, Cut c, uint32_t key, int j, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) sh.found = -1;
    __syncthreads();
    int base = 0;
    for (int start = 0; start < V; start += kThreads) {
        const int i = start + threadIdx.x;
        bool hit = false;
        if (i < V) {
            const uint32_t k = key_of(w[i]);
            hit = k == key && in_cut(k, i, c);
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) sh.warp_i[warp] = __popc(ballot);
        __syncthreads();
        int offset = 0, total = 0;
        for (int wi = 0; wi < kWarps; ++wi) {
            if (wi < warp) offset += sh.warp_i[wi];
            total += sh.warp_i[wi];
        }
        const int rank = base + offset + __popc(ballot & ((1u << lane) - 1u));
        if (hit && rank == j) sh.found = i;
        __syncthreads();
        if (sh.found >= 0) break;
        base += total;
    }
    const int found = sh.found;
    __syncthreads();
    return found;
}

struct Walk {
    Cut cut;     // the kept prefix ending at the stopping token
    int token;   // the stopping token
    double cum;  // running sum including it
};

// Walks the tokens of `within` heaviest first, summing 1 per token (unit) or w, and stops at
// the first token where the sum reaches the target (sum >= target; sum > target when strict).
// When the sum never gets there (rounding at the very end), stops at the last token.
//
// Each pass picks the highest digit whose running sum reaches the target. "Highest" is an
// atomicMin over bin positions rather than a test of one interval per bin, so that sums rounded
// differently by neighbouring threads can never yield two choices, or none.
__device__ Walk walk_heaviest_first(const float* w, int V, Cut within, bool unit, double target,
                                    bool strict, Shared& sh) {
    bool take_last = false;
    uint32_t prefix = 0, prefix_mask = 0;
    double above = 0;  // weight of `within` tokens with keys above the current prefix range
    for (int pass = 0; pass < kPasses; ++pass) {
        const int shift = kDigitShift[pass], n_bins = 1 << kDigitBits[pass];
        for (int d = threadIdx.x; d < n_bins; d += kThreads) {
            sh.count[d] = 0;
            sh.mant_hi[d] = sh.mant_lo[d] = 0u;
        }
        if (threadIdx.x == 0) {
            sh.choice_pos = INT_MAX;
            sh.lo_pos = -1;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += kThreads) {
            const uint32_t k = key_of(w[i]);
            if ((k & prefix_mask) != prefix || !in_cut(k, i, within)) continue;
            const int d = (int)((k >> shift) & (uint32_t)(n_bins - 1));
            atomicAdd(&sh.count[d], 1);
            if (!unit) {  // a count walk needs no masses
                atomicAdd(&sh.mant_hi[d], (k & 0x7FFFFFu) >> 12);
                atomicAdd(&sh.mant_lo[d], k & 0xFFFu);
            }
        }
        __syncthreads();

        // Thread t owns the bins at descending positions 2t and 2t + 1 (position 0 = top digit).
        double own[2] = {0.0, 0.0}, before[2] = {0.0, 0.0};
        int own_count[2] = {0, 0};
        for (int s = 0; s < 2; ++s) {
            const int pos = 2 * threadIdx.x + s;
            if (pos < n_bins) {
                const int d = n_bins - 1 - pos;
                own_count[s] = sh.count[d];
                const uint32_t bits = prefix | ((uint32_t)d << shift);
                own[s] = unit ? (double)own_count[s] : bin_mass(bits, own_count[s], sh.mant_hi[d], sh.mant_lo[d]);
                if (own_count[s] > 0) atomicMax(&sh.lo_pos, pos);
            }
        }
        before[0] = above + block_exclusive_scan(own[0] + own[1], sh);
        before[1] = before[0] + own[0];
        if (!take_last) {
            for (int s = 0; s < 2; ++s) {
                const double after = before[s] + own[s];
                if (own_count[s] > 0 && (strict ? after > target : after >= target))
                    atomicMin(&sh.choice_pos, 2 * threadIdx.x + s);
            }
        }
        __syncthreads();
        for (int s = 0; s < 2; ++s)
            if (2 * (int)threadIdx.x + s == sh.choice_pos) sh.choice_above = before[s];
        __syncthreads();
        int pos;
        if (!take_last && sh.choice_pos != INT_MAX) {
            pos = sh.choice_pos;
            above = sh.choice_above;
        } else {
            take_last = true;
            pos = sh.lo_pos;
            for (int p = 0; p < pos; ++p) {  // everything above the lowest bin is walked past
                const int d = n_bins - 1 - p;
                const uint32_t bits = prefix | ((uint32_t)d << shift);
                above += unit ? (double)sh.count[d] : bin_mass(bits, sh.count[d], sh.mant_hi[d], sh.mant_lo[d]);
            }
        }
        pos = max(pos, 0);  // lo_pos is -1 only for an empty cut, which the callers never pass
        const int digit = n_bins - 1 - pos;
        const int n_ties = sh.count[digit];
        __syncthreads();
        prefix |= (uint32_t)digit << shift;
        prefix_mask |= (uint32_t)(n_bins - 1) << shift;
        if (pass == kPasses - 1) {
            // Every token left has key == prefix and the same weight t: pick the j-th in index order.
            const double t = unit ? 1.0 : (double)__uint_as_float(prefix);
            int j;
            if (take_last || !(t > 0.0)) {
                j = n_ties - 1;
            } else {
                const double need = (target - above) / t;
                const double jd = strict ? floor(need) : ceil(need) - 1.0;
                j = (int)fmax(0.0, fmin((double)(n_ties - 1), jd));  // clamps NaN and overflow too
            }
            const int idx = nth_with_key(w, V, within, prefix, j, sh);
            Walk r;
            r.cut = Cut{prefix, idx};
            r.token = idx;
            r.cum = above + (double)(j + 1) * t;
            return r;
        }
    }
    return Walk{within, -1, 0.0};  // unreachable: the last pass returns
}

// ---- pass A, split over the row ----------------------------------------------------------------

constexpr int kScanThreads = 256;
constexpr int kScanWarps = kScanThreads / 32;
constexpr int kScanSpan = 2048;  // logits per scan block, about: the row is cut into equal slices
constexpr int kMaxParts = 128;

// One slice's log-sum-exp state of the raw logits and argmax (lowest index among equals) of the
// penalized ones.
struct ScanPart {
    double lse_s;
    float lse_m;
    float z;
    int idx;
};

int scan_parts(int V) { return std::min(kMaxParts, CEIL_DIV(V, kScanSpan)); }

// Where the parts live in the scratch: after the [B, V] fp32 weights, 16-byte aligned.
size_t parts_offset(int B, int V) { return ((size_t)B * V * sizeof(float) + 15) / 16 * 16; }

__device__ __forceinline__ float penalize_logit(float l, float penalty) {
    return l > 0.f ? __fdiv_rn(l, penalty) : __fmul_rn(l, penalty);
}

// grid (n_parts, B). Same per-element rules as the CPU scan; only the summation order of the
// log-sum-exp differs (it is reported, never used to choose).
__global__ void __launch_bounds__(kScanThreads)
    sample_scan_kernel(const float* __restrict__ logits, const int* __restrict__ history,
                       const int* __restrict__ slots, const int* __restrict__ positions,
                       const SampleParamsDev* __restrict__ params, int V, int max_seq,
                       ScanPart* __restrict__ parts) {
    extern __shared__ unsigned seen_slice[];  // [ceil(span / 32)] history marks of this slice
    __shared__ float warp_m[kScanWarps], warp_z[kScanWarps];
    __shared__ double warp_s[kScanWarps];
    __shared__ int warp_i[kScanWarps];
    // logits come from the LM head, history and positions from the kernels before it.
    pdl_wait();
    pdl_launch_dependents();

    const int part = blockIdx.x, n_parts = gridDim.x, b = blockIdx.y;
    const int span = CEIL_DIV(V, n_parts);
    const int lo = part * span, hi = min(V, lo + span);
    const float* row = logits + (size_t)b * V;
    const float penalty = params[b].repetition_penalty;
    const bool penalize = penalty != 1.f;

    if (penalize) {
        for (int i = threadIdx.x; i < CEIL_DIV(span, 32); i += kScanThreads) seen_slice[i] = 0u;
        __syncthreads();
        const int n_history = min(max(positions[b] + 1, 0), max_seq);
        const int* h = history + (size_t)slots[b] * max_seq;
        for (int i = threadIdx.x; i < n_history; i += kScanThreads) {
            const int t = h[i];
            if (t >= lo && t < hi) atomicOr(&seen_slice[(t - lo) >> 5], 1u << ((t - lo) & 31));
        }
        __syncthreads();
    }

    LseF lse;
    float z_best = -INFINITY;
    int i_best = INT_MAX;
    constexpr int kInFlight = 8;  // loads per thread before any math
    for (int i0 = lo + threadIdx.x; i0 < hi; i0 += kInFlight * kScanThreads) {
        float l[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
            const int i = i0 + u * kScanThreads;
            l[u] = i < hi ? row[i] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
            const int i = i0 + u * kScanThreads;
            if (i < hi) {
                lse_add(lse, l[u]);
                const bool hit = penalize && ((seen_slice[(i - lo) >> 5] >> ((i - lo) & 31)) & 1u);
                const float z = hit ? penalize_logit(l[u], penalty) : l[u];
                if (z > z_best || (z == z_best && i < i_best)) { z_best = z; i_best = i; }
            }
        }
    }

    Lse v;
    v.m = lse.m;
    v.s = lse.s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        v = lse_merge(v, lse_shfl_xor(v, o));
        const float oz = __shfl_xor_sync(0xffffffffu, z_best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i_best, o);
        if (oz > z_best || (oz == z_best && oi < i_best)) { z_best = oz; i_best = oi; }
    }
    if (lane == 0) {
        warp_m[warp] = v.m;
        warp_s[warp] = v.s;
        warp_z[warp] = z_best;
        warp_i[warp] = i_best;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        Lse total;
        float z = -INFINITY;
        int idx = INT_MAX;
        for (int w = 0; w < kScanWarps; ++w) {
            Lse x;
            x.m = warp_m[w];
            x.s = warp_s[w];
            total = lse_merge(total, x);
            if (warp_z[w] > z || (warp_z[w] == z && warp_i[w] < idx)) { z = warp_z[w]; idx = warp_i[w]; }
        }
        parts[(size_t)b * n_parts + part] = ScanPart{total.s, total.m, z, idx};
    }
}

// ---- the kernel -------------------------------------------------------------------------------

// positions and steps carry no __restrict__: a feed-back advances them (after every read of them).
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, const int* __restrict__ history,
                  const int* __restrict__ slots, int* positions,
                  const SampleParamsDev* __restrict__ params, uint64_t* steps,
                  int V, int max_seq, const ScanPart* __restrict__ parts, int n_parts, float* w_all,
                  int* __restrict__ out_tokens, float* __restrict__ out_logprobs, SampleFeedBack fb) {
    extern __shared__ unsigned seen[];  // [ceil(V / 32)] history marks (temperature > 0 only)
    __shared__ Shared sh;
    pdl_wait();  // the scan's parts
    pdl_launch_dependents();
    const int b = blockIdx.x;
    // Read before the block's first barrier, so thread 0's feed-back at the end follows every read.
    const int position = positions[b];
    const uint64_t step = steps[b];
    const float* row = logits + (size_t)b * V;
    float* w = w_all + (size_t)b * V;
    const SampleParamsDev p = params[b];
    const float penalty = p.repetition_penalty;
    const bool penalize = penalty != 1.f && p.temperature != 0.f;

    if (penalize) {
        const int n_words = (V + 31) / 32;
        for (int i = threadIdx.x; i < n_words; i += kThreads) seen[i] = 0u;
        __syncthreads();
        const int slot = slots[b];
        const int n_history = min(max(position + 1, 0), max_seq);
        const int* h = history + (size_t)slot * max_seq;
        for (int i = threadIdx.x; i < n_history; i += kThreads) {
            const int t = h[i];
            if (t >= 0 && t < V) atomicOr(&seen[t >> 5], 1u << (t & 31));
        }
        __syncthreads();
    }
    auto penalized = [&](int i, float l) {
        if (!penalize || !((seen[i >> 5] >> (i & 31)) & 1u)) return l;
        return penalize_logit(l, penalty);
    };

    // Pass A's parts: log-sum-exp of the raw logits (for the logprob), argmax of the penalized z.
    Lse raw;
    float z_best = -INFINITY;
    int i_best = INT_MAX;
    if (threadIdx.x < n_parts) {
        const ScanPart part = parts[(size_t)b * n_parts + threadIdx.x];
        raw.m = part.lse_m;
        raw.s = part.lse_s;
        z_best = part.z;
        i_best = part.idx;
    }
    const double log_total = block_log_sum_exp(raw, sh);
    block_argmax(z_best, i_best, sh);
    if (i_best == INT_MAX) i_best = 0;  // every z NaN: the CPU scan keeps index 0

    int token = i_best;
    if (p.temperature != 0.f) {
        // Pass B: weights; the top token gets exactly exp(0) = 1.
        double sum = 0;
        for (int i = threadIdx.x; i < V; i += kThreads) {
            const float z = penalized(i, row[i]);
            const float wi = (float)exp((double)__fdiv_rn(__fsub_rn(z, z_best), p.temperature));
            w[i] = wi;
            sum += (double)wi;
        }
        double mass = block_sum(sum, sh);  // its barrier also publishes w to the whole block

        Cut kept = kKeepAll;
        if (p.top_k > 0 && p.top_k < V) {
            kept = walk_heaviest_first(w, V, kept, true, (double)p.top_k, false, sh).cut;
            mass = mass_of(w, V, kept, sh);
        }
        if (p.top_p < 1.f) {
            const Walk r = walk_heaviest_first(w, V, kept, false, (double)p.top_p * mass, false, sh);
            kept = r.cut;
            mass = r.cum;
        }
        if (p.min_p > 0.f) {
            kept = shorter(kept, Cut{key_of(p.min_p), INT_MAX});
            mass = mass_of(w, V, kept, sh);
        }
        const double target = (double)uniform01(p.seed, step) * mass;
        token = walk_heaviest_first(w, V, kept, false, target, true, sh).token;
    }
    // The walk always lands on a token of the kept set; this only keeps a broken invariant from
    // turning into an out-of-bounds read below.
    if (token < 0 || token >= V) token = i_best;
    if (threadIdx.x == 0) {
        out_tokens[b] = token;
        if (out_logprobs) out_logprobs[b] = (float)((double)row[token] - log_total);
        if (fb.tokens) {
            fb.tokens[b] = token;
            fb.positions[b] += 1;
            positions[b] = position + 1;
            steps[b] = step + 1;
        }
    }
}

size_t seen_bytes(int V) { return (size_t)((V + 31) / 32) * sizeof(unsigned); }

// tokens[b] < 0: row b continues row -1 - tokens[b] of the previous launch, whose last-round
// tokens are fed[]; other rows keep the token the host gave.
__global__ void continue_rows_kernel(int* tokens, const int* fed, int B) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B && tokens[b] < 0) tokens[b] = fed[-1 - tokens[b]];
}

}  // namespace

void continue_decode_rows(int* tokens, const int* fed, int B, cudaStream_t stream) {
    BRRR_CHECK(B >= 0, "continue_decode_rows: bad batch " << B);
    if (B == 0) return;
    constexpr int kRowsPerBlock = 256;
    continue_rows_kernel<<<CEIL_DIV(B, kRowsPerBlock), kRowsPerBlock, 0, stream>>>(tokens, fed, B);
    CUDA_CHECK_LAUNCH("continue_rows_kernel");
}

size_t sample_scratch_bytes(int B, int V) {
    BRRR_CHECK(B >= 0 && V > 0, "sample_scratch_bytes: bad sizes B=" << B << " V=" << V);
    return parts_offset(B, V) + (size_t)B * scan_parts(V) * sizeof(ScanPart);
}

void sample_tokens(const float* logits, const int* history, const int* slots, int* positions,
                   const SampleParamsDev* params, uint64_t* steps, int B, int V, int max_seq,
                   void* scratch, int* out_tokens, float* out_logprobs, const SampleFeedBack& feed_back,
                   cudaStream_t stream) {
    BRRR_CHECK(B >= 0 && V > 0 && max_seq > 0,
               "sample_tokens: bad sizes B=" << B << " V=" << V << " max_seq=" << max_seq);
    BRRR_CHECK(V <= (1 << 20),
               "sample_tokens: vocab_size " << V << " exceeds 1,048,576 (the histogram's 32-bit mantissa sums)");
    BRRR_CHECK(!feed_back.tokens || feed_back.positions,
               "sample_tokens: a feed-back needs the decode's positions as well as its tokens");
    if (B == 0) return;
    const size_t smem = seen_bytes(V);
    // The history bitmap is V bits of shared memory; beyond the default 48 KiB opt in.
    if (smem + sizeof(Shared) > 48 * 1024) {
        const int optin = device_facts().smem_optin;
        BRRR_CHECK(smem + sizeof(Shared) <= (size_t)optin,
                   "sample_tokens: vocab_size " << V << " needs " << smem + sizeof(Shared)
                                                << " bytes of shared memory; this GPU allows " << optin);
        allow_dynamic_smem(sample_kernel, smem);
    }
    const int n_parts = scan_parts(V);
    ScanPart* parts = reinterpret_cast<ScanPart*>(static_cast<char*>(scratch) + parts_offset(B, V));
    const size_t slice_bytes = (size_t)CEIL_DIV(CEIL_DIV(V, n_parts), 32) * sizeof(unsigned);
    launch_pdl(sample_scan_kernel, dim3(n_parts, B), dim3(kScanThreads), slice_bytes, stream, logits,
               history, slots, positions, params, V, max_seq, parts);
    CUDA_CHECK_LAUNCH("sample_scan_kernel");
    launch_pdl(sample_kernel, dim3(B), dim3(kThreads), smem, stream, logits, history, slots, positions,
               params, steps, V, max_seq, static_cast<const ScanPart*>(parts), n_parts,
               static_cast<float*>(scratch), out_tokens, out_logprobs, feed_back);
    CUDA_CHECK_LAUNCH("sample_kernel");
}

}  // namespace cuda
}  // namespace brrr
