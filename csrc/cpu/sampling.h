// sampling.h — choosing the next token from one row of logits: the rules both backends follow.
//
//   1. repetition penalty (HF rule, each distinct history token once):
//        z = logit > 0 ? logit / penalty : logit * penalty
//   2. temperature == 0: greedy, the argmax of z, lowest index on ties. Done.
//   3. temperature: weights w_i = exp((z_i - max z) / T)  (the top token has w = 1)
//   4. top-k (k > 0): keep the k heaviest
//   5. top-p (< 1): keep the smallest heaviest-first prefix whose mass >= top_p * kept mass
//   6. min-p (> 0): drop w_i < min_p * max w (always keeps the top token)
//   7. draw: u = uniform01(seed, step); walk the kept tokens heaviest first (ties: lower index
//      first), summing w, and take the first token where the sum exceeds u * kept mass.
// The returned logprob is log_softmax(raw logits)[token]: penalty and filters do not touch it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace brrr {
namespace cpu {

// Working memory for one row, reused across calls so sampling never allocates once warm.
struct SampleScratch {
    std::vector<float> z;          // [vocab] penalized logits, then weights
    std::vector<int32_t> order;    // [vocab] token ids, heaviest first as far as sorted
    std::vector<uint8_t> seen;     // [vocab] history marks, cleared after each use
};

// params: rows that pass sampling_params_problem (model.h; the bindings hold them to it).
// history: the tokens the penalty covers (ids < 0 are skipped as unwritten positions).
int32_t sample_row(const float* logits, int vocab, const int32_t* history, int n_history,
                   const SamplingParams& params, uint64_t step, SampleScratch& scratch,
                   float* logprob);

}  // namespace cpu
}  // namespace brrr
