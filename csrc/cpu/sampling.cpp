// sampling.cpp — the sampler of sampling.h on one row of fp32 logits.
//
// The trick: the draw order is "heaviest first", but a full sort of a 50k-128k vocabulary per
// token costs more than the rest of a small model's decode. The order is therefore sorted
// lazily: a growing prefix (64, then doubling) is partial-sorted only as far as top-k, top-p or
// the draw actually walk. Peaked distributions, the common case, touch a few dozen tokens.
#include "cpu/sampling.h"

#include "cpu/simd.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace brrr {
namespace cpu {

namespace {

// Sums of up to 1024 terms are formed in float lanes and added up in double: 50k-128k entries
// then lose no more than ~1e-6 relative, at SIMD speed.
constexpr int kSumBlock = 1024;

// x[i] = exp((x[i] - shift) / divisor) for i < n; returns the sum of the new x.
double exp_in_place(float* x, int n, float shift, float divisor) {
    const vfloat vshift = vset1(shift), vdivisor = vset1(divisor);
    double total = 0;
    for (int b = 0; b < n; b += kSumBlock) {
        const int end = std::min(n, b + kSumBlock);
        vfloat acc = vzero();
        int i = b;
        for (; i + kLanes <= end; i += kLanes) {
            const vfloat e = vexp(vdiv(vsub(vload(x + i), vshift), vdivisor));
            vstore(x + i, e);
            acc = vadd(acc, e);
        }
        float block = vsum(acc);
        for (; i < end; ++i) block += x[i] = std::exp((x[i] - shift) / divisor);
        total += block;
    }
    return total;
}

// log(sum(exp(x))) over a row.
double log_sum_exp(const float* x, int n) {
    const float max_x = max_value(x, n);
    const vfloat vmax_x = vset1(max_x);
    double total = 0;
    for (int b = 0; b < n; b += kSumBlock) {
        const int end = std::min(n, b + kSumBlock);
        vfloat acc = vzero();
        int i = b;
        for (; i + kLanes <= end; i += kLanes) acc = vadd(acc, vexp(vsub(vload(x + i), vmax_x)));
        float block = vsum(acc);
        for (; i < end; ++i) block += std::exp(x[i] - max_x);
        total += block;
    }
    return max_x + std::log(total);
}

void apply_repetition_penalty(float* z, const int32_t* history, int n_history, float penalty,
                              std::vector<uint8_t>& seen) {
    for (int i = 0; i < n_history; ++i) {
        const int32_t t = history[i];
        if (t < 0 || seen[t]) continue;
        seen[t] = 1;
        z[t] = z[t] > 0 ? z[t] / penalty : z[t] * penalty;
    }
    for (int i = 0; i < n_history; ++i)
        if (history[i] >= 0) seen[history[i]] = 0;
}

// The lowest index holding the maximum (0 if the row is all NaN).
int32_t argmax(const float* z, int n) {
    const float best = max_value(z, n);
    for (int i = 0; i < n; ++i)
        if (z[i] == best) return i;
    return 0;
}

// order[0, sorted) holds the heaviest tokens in draw order; grow() extends that prefix.
class LazyOrder {
public:
    LazyOrder(const float* w, std::vector<int32_t>& order, int n) : w_(w), order_(order), n_(n) {
        std::iota(order_.begin(), order_.begin() + n_, 0);
    }
    int32_t at(int i) {
        if (i >= sorted_) grow(i + 1);
        return order_[i];
    }
    void grow(int needed) {
        const int target = std::min(n_, std::max({needed, 2 * sorted_, 64}));
        const float* w = w_;
        auto heavier = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
        const auto first = order_.begin() + sorted_, middle = order_.begin() + target,
                   last = order_.begin() + n_;
        if (target - sorted_ <= 256) {
            // A small heap rejects most candidates with one comparison.
            std::partial_sort(first, middle, last, heavier);
        } else {
            // Select the next heaviest in linear time, then sort only those.
            std::nth_element(first, middle - 1, last, heavier);
            std::sort(first, middle, heavier);
        }
        sorted_ = target;
    }

private:
    const float* w_;
    std::vector<int32_t>& order_;
    int n_;
    int sorted_ = 0;
};

}  // namespace

int32_t sample_row(const float* logits, int vocab, const int32_t* history, int n_history,
                   const SamplingParams& p, uint64_t step, SampleScratch& scratch,
                   float* logprob) {
    BRRR_CHECK(vocab > 0, "sampling: empty logits row");
    for (int i = 0; i < n_history; ++i)
        BRRR_CHECK(history[i] < vocab, "sampling: history token id " << history[i]
                                       << " is out of range for vocab_size " << vocab);
    if ((int)scratch.z.size() < vocab) {
        scratch.z.resize(vocab);
        scratch.order.resize(vocab);
        scratch.seen.assign(vocab, 0);
    }
    float* z = scratch.z.data();
    const bool penalize = p.repetition_penalty != 1.f;
    if (penalize || p.temperature != 0.f) std::copy(logits, logits + vocab, z);
    if (penalize) apply_repetition_penalty(z, history, n_history, p.repetition_penalty, scratch.seen);

    int32_t token;
    if (p.temperature == 0.f) {
        token = argmax(penalize ? z : logits, vocab);
    } else {
        // z becomes the weights w (top token exactly 1).
        const float z_max = z[argmax(z, vocab)];
        const double total = exp_in_place(z, vocab, z_max, p.temperature);
        const float* w = z;
        LazyOrder order(w, scratch.order, vocab);

        int n_keep = vocab;
        double mass = total;
        if (p.top_k > 0 && p.top_k < vocab) {
            n_keep = p.top_k;
            mass = 0;
            for (int i = 0; i < n_keep; ++i) mass += w[order.at(i)];
        }
        if (p.top_p < 1.f) {
            const double target = p.top_p * mass;
            double cum = 0;
            int i = 0;
            while (i < n_keep) {
                cum += w[order.at(i++)];
                if (cum >= target) break;
            }
            n_keep = i;
            mass = cum;
        }
        if (p.min_p > 0.f) {
            // max w is 1, so the threshold is min_p itself; sorted order makes the survivors
            // a prefix of the kept tokens.
            if (n_keep == vocab) {
                int count = 0;
                double kept = 0;
                for (int i = 0; i < vocab; ++i)
                    if (w[i] >= p.min_p) { ++count; kept += w[i]; }
                n_keep = count;
                mass = kept;
            } else {
                int i = 1;
                double kept = w[order.at(0)];
                while (i < n_keep && w[order.at(i)] >= p.min_p) kept += w[order.at(i++)];
                n_keep = i;
                mass = kept;
            }
        }

        const double target = (double)uniform01(p.seed, step) * mass;
        double cum = 0;
        token = order.at(n_keep - 1);  // reached only if rounding leaves cum <= target
        for (int i = 0; i < n_keep; ++i) {
            cum += w[order.at(i)];
            if (cum > target) {
                token = order.at(i);
                break;
            }
        }
    }
    if (logprob) *logprob = (float)((double)logits[token] - log_sum_exp(logits, vocab));
    return token;
}

}  // namespace cpu
}  // namespace brrr
