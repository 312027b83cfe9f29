// cuda_attention_prefill_lab.cu — the causal prefill attention kernels of
// attention_prefill_variants.cuh, each checked against a float64 reference and timed on the
// attention heads of Llama-3.2-1B and Llama-3-8B.
//
// This file includes the prefill kernels' headers and links their .cu files (run_attention_prefill_lab.sh),
// so variants 11-13 and 15 run the production kernels. Every variant is a
// launcher with attention_prefill's signature: q [T][Hq][hd], the paged caches (ops.h KvCache) with
// the slot's block table row on the host, and out [T][Hq][hd], all bf16. The lab lays the caches
// out as [slots][max_seq][Hkv][hd], max_seq a multiple of the block size, under the identity block
// table (attention_prefill_variants.cuh says why). Query token i sits at position start_pos + i and
// attends to cache positions [0, start_pos + i] of its slot (the new tokens' K/V are already
// there); GQA: query head h reads KV head h / (Hq / Hkv).
//
//   nvcc -O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
//        -gencode=arch=compute_90a,code=sm_90a benchmarks/lab/cuda_attention_prefill_lab.cu \
//        csrc/cuda/attention_prefill_sm80.cu csrc/cuda/attention_prefill_sm90.cu -o prefill_lab
//   ./prefill_lab check   every variant on odd lengths, offsets and GQA groups; exit 1 on a failure
//   ./prefill_lab bench [--skip V,V]   Llama-3.2-1B and Llama-3-8B heads at T = 512..16384, JSON lines
//                         on stdout; the named variants (those that failed the check) are not timed
//   --block-size N        after either: the KV block size (16, 32, 64 or 128; default 16)
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_prefill_sm80.cuh"
#include "cuda/attention_prefill_sm90.cuh"

using brrr::cuda::bf16;

#include "attention_prefill_variants.cuh"

namespace lab {

using brrr::bf16_to_f32;
using brrr::f32_to_bf16;

void fill_normal(std::vector<uint16_t>& bits, std::mt19937& rng) {
    std::normal_distribution<float> n01;
    for (auto& x : bits) x = f32_to_bf16(n01(rng));
}

// One cudaMalloc'd array of bf16 bit patterns, freed on every way out (exceptions included).
class DeviceBits {
public:
    explicit DeviceBits(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, n * sizeof(uint16_t))); }
    ~DeviceBits() { cudaFree(p_); }
    DeviceBits(const DeviceBits&) = delete;
    DeviceBits& operator=(const DeviceBits&) = delete;

    bf16* get() const { return reinterpret_cast<bf16*>(p_); }
    void upload(const std::vector<uint16_t>& h) {
        CUDA_CHECK(cudaMemcpy(p_, h.data(), std::min(h.size(), n_) * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
    std::vector<uint16_t> download() const {
        std::vector<uint16_t> h(n_);
        CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        return h;
    }

private:
    uint16_t* p_ = nullptr;
    size_t n_;
};

// The identity block table of `slots` slots of max_seq positions on the device (slot s, block j ->
// s * blocks_per_seq + j), and the KvCache over k and v laid out [slots][max_seq][Hkv][hd].
class IdentityTable {
public:
    IdentityTable(int slots, int max_seq, int block_size) : block_size_(block_size), bps_(max_seq / block_size) {
        BRRR_CHECK(max_seq % block_size == 0,
                   "identity table: max_seq=" << max_seq << " must be a multiple of block_size=" << block_size);
        host_.resize((size_t)slots * bps_);
        for (size_t i = 0; i < host_.size(); ++i) host_[i] = (int32_t)i;
        CUDA_CHECK(cudaMalloc(&p_, host_.size() * sizeof(int32_t)));
        CUDA_CHECK(cudaMemcpy(p_, host_.data(), host_.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    ~IdentityTable() { cudaFree(p_); }
    IdentityTable(const IdentityTable&) = delete;
    IdentityTable& operator=(const IdentityTable&) = delete;

    // The caches of the first `slots` slots at max_seq = blocks_per_seq * block_size.
    brrr::cuda::KvCache cache(bf16* k, bf16* v, int slots) const {
        brrr::cuda::KvCache kv;
        kv.k = k;
        kv.v = v;
        kv.pages = {p_, bps_, block_size_};
        kv.n_blocks = slots * bps_;
        kv.max_seq = bps_ * block_size_;
        return kv;
    }
    const int32_t* row(int slot) const { return host_.data() + (size_t)slot * bps_; }

private:
    int32_t* p_ = nullptr;
    std::vector<int32_t> host_;
    int block_size_, bps_;
};

// ---- check: every variant against a float64 reference ------------------------------------------

constexpr uint16_t kPoison = 0x7FC1;  // a quiet NaN: an output the kernel never writes stays non-finite
constexpr size_t kGuardElems = 4096;  // after out: a write past the last row or head lands here
constexpr int kCacheSlots = 3;
constexpr int kSlot = 1;      // the sequence sits between two slots of other data
constexpr int kTailRows = 3;  // at least this many cache rows past start_pos + T: filled, but no query may see them
constexpr double kAbsTol = 2e-2, kRelTol = 2e-2;  // bf16 output and bf16 P in the PV product

struct Case {
    int head_dim, n_heads, n_kv_heads, T, start_pos, block_size;

    // Whole blocks: the identity table's condition.
    int max_seq() const { return CEIL_DIV(start_pos + T + kTailRows, block_size) * block_size; }
    size_t out_elems() const { return (size_t)T * n_heads * head_dim; }
    size_t cache_elems() const { return (size_t)kCacheSlots * max_seq() * n_kv_heads * head_dim; }
    std::string describe() const {
        return "hd=" + std::to_string(head_dim) + " Hq=" + std::to_string(n_heads) + " Hkv=" +
               std::to_string(n_kv_heads) + " T=" + std::to_string(T) + " start_pos=" + std::to_string(start_pos);
    }
};

std::vector<Case> check_cases(int block_size) {
    struct Heads { int n_heads, n_kv_heads; };
    const Heads heads[] = {{4, 1}, {8, 2}, {3, 3}, {6, 2}};
    const int lengths[] = {1, 17, 64, 127, 130, 333};  // one token, partial tiles, exact tiles, several
    const int starts[] = {0, 5, 70};                    // fresh prompt, short and tile-crossing prefix
    std::vector<Case> cases;
    for (int hd : {64, 128})
        for (const Heads& h : heads)
            for (int T : lengths)
                for (int start : starts) cases.push_back({hd, h.n_heads, h.n_kv_heads, T, start, block_size});
    return cases;
}

// Inputs of one case (the whole cache random, every slot different) and the expected output.
struct CaseData {
    std::vector<uint16_t> q, k, v;
    std::vector<double> expected;  // [T][Hq][hd]
};

// softmax(q k^T / sqrt(hd)) v over cache positions [0, start_pos + t] of kSlot, in float64 on the
// bf16 inputs.
std::vector<double> reference(const Case& c, const CaseData& d) {
    const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
    const size_t row = (size_t)c.n_kv_heads * hd;  // one cache position
    const size_t slot_base = (size_t)kSlot * c.max_seq() * row;
    std::vector<double> k(row * (c.start_pos + c.T)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
        k[i] = bf16_to_f32(d.k[slot_base + i]);
        v[i] = bf16_to_f32(d.v[slot_base + i]);
    }
    const double scale = 1.0 / std::sqrt((double)hd);
    std::vector<double> out(c.out_elems(), 0.0), q(hd), s(c.start_pos + c.T);
    for (int t = 0; t < c.T; ++t)
        for (int h = 0; h < c.n_heads; ++h) {
            const size_t q_at = ((size_t)t * c.n_heads + h) * hd;
            const int kvh = h / group, seen = c.start_pos + t + 1;
            for (int i = 0; i < hd; ++i) q[i] = bf16_to_f32(d.q[q_at + i]);
            double mx = -INFINITY;
            for (int p = 0; p < seen; ++p) {
                const double* kp = &k[p * row + (size_t)kvh * hd];
                double dot = 0;
                for (int i = 0; i < hd; ++i) dot += q[i] * kp[i];
                s[p] = dot * scale;
                mx = std::max(mx, s[p]);
            }
            double sum = 0;
            for (int p = 0; p < seen; ++p) sum += s[p] = std::exp(s[p] - mx);
            double* o = &out[q_at];
            for (int p = 0; p < seen; ++p) {
                const double w = s[p] / sum;
                const double* vp = &v[p * row + (size_t)kvh * hd];
                for (int i = 0; i < hd; ++i) o[i] += w * vp[i];
            }
        }
    return out;
}

CaseData make_case_data(const Case& c, unsigned seed) {
    std::mt19937 rng(seed);
    CaseData d;
    d.q.resize(c.out_elems());
    d.k.resize(c.cache_elems());
    d.v.resize(c.cache_elems());
    fill_normal(d.q, rng);
    fill_normal(d.k, rng);
    fill_normal(d.v, rng);
    d.expected = reference(c, d);
    return d;
}

// The error a launch left: a bad launch at once, a fault inside the kernel at the synchronize.
cudaError_t launch_error() {
    const cudaError_t launch = cudaGetLastError();
    const cudaError_t sync = cudaDeviceSynchronize();
    return launch != cudaSuccess ? launch : sync;
}

// After a fault the context is lost and every later call fails as well: nothing more to check.
bool context_usable() {
    cudaGetLastError();
    return cudaDeviceSynchronize() == cudaSuccess;
}

// Compares one call's output buffer (out followed by the guard) with the reference; returns ""
// when it passes, else what went wrong. max_err: the largest finite |out - expected| so far.
std::string compare(const Case& c, const CaseData& d, const std::vector<uint16_t>& got, double& max_err) {
    size_t out_of_tol = 0, non_finite = 0, guard_written = 0, worst = 0;
    double worst_excess = 0;
    for (size_t i = 0; i < c.out_elems(); ++i) {
        const double g = bf16_to_f32(got[i]), want = d.expected[i];
        if (!std::isfinite(g)) {
            ++non_finite;
            continue;
        }
        const double err = std::fabs(g - want), excess = err - (kAbsTol + kRelTol * std::fabs(want));
        max_err = std::max(max_err, err);
        if (excess > 0) {
            if (out_of_tol == 0 || excess > worst_excess) worst = i, worst_excess = excess;
            ++out_of_tol;
        }
    }
    for (size_t i = c.out_elems(); i < got.size(); ++i) guard_written += got[i] != kPoison;
    if (out_of_tol == 0 && non_finite == 0 && guard_written == 0) return "";

    std::string why = std::to_string(out_of_tol) + " out of tolerance, " + std::to_string(non_finite) +
                      " non-finite, " + std::to_string(guard_written) + " guard elements written";
    if (out_of_tol) {
        const size_t hd = c.head_dim, t = worst / (c.n_heads * hd), h = worst / hd % c.n_heads;
        char buf[160];
        std::snprintf(buf, sizeof buf, "; worst t=%zu h=%zu d=%zu: got %.5g want %.5g", t, h, worst % hd,
                      (double)bf16_to_f32(got[worst]), d.expected[worst]);
        why += buf;
    }
    return why;
}

struct VariantTally {
    int cases = 0, failures = 0;
    double max_err = 0;
};

// Runs one variant on one case twice, each time on freshly poisoned output (the second call
// catches state left behind by the first). Returns "" when both pass, else what went wrong.
// Sets context_lost when a CUDA error leaves the device unusable.
std::string run_case(const PrefillVariant& variant, const Case& c, const CaseData& d, const DeviceBits& q,
                     const DeviceBits& k, const DeviceBits& v, const IdentityTable& table, DeviceBits& out,
                     cudaStream_t stream, double& max_err, bool& context_lost) {
    const brrr::cuda::KvCache kv = table.cache(k.get(), v.get(), kCacheSlots);
    const std::vector<uint16_t> poison(c.out_elems() + kGuardElems, kPoison);
    std::string failures;
    for (int call = 1; call <= 2; ++call) {
        out.upload(poison);
        std::string why;
        try {
            variant.launch(q.get(), kv, table.row(kSlot), kSlot, c.start_pos, c.T, out.get(), c.n_heads,
                           c.n_kv_heads, c.head_dim, stream);
        } catch (const std::exception& e) {
            why = std::string("threw: ") + e.what();
        }
        const cudaError_t err = launch_error();
        if (err != cudaSuccess) {
            why += (why.empty() ? "" : "; ") + std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                   cudaGetErrorString(err) + ")";
            if (!context_usable()) {
                context_lost = true;
                return failures + "call " + std::to_string(call) + ": " + why;
            }
        }
        if (why.empty()) why = compare(c, d, out.download(), max_err);
        if (!why.empty()) failures += (failures.empty() ? "" : " | ") + ("call " + std::to_string(call) + ": " + why);
    }
    return failures;
}

int check(int block_size) {
    const std::vector<Case> cases = check_cases(block_size);
    std::vector<VariantTally> tally(std::size(kPrefillVariants));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    bool context_lost = false;
    for (size_t ci = 0; ci < cases.size() && !context_lost; ++ci) {
        const Case& c = cases[ci];
        const CaseData d = make_case_data(c, (unsigned)ci + 1);
        DeviceBits q(d.q.size()), k(d.k.size()), v(d.v.size()), out(c.out_elems() + kGuardElems);
        const IdentityTable table(kCacheSlots, c.max_seq(), block_size);
        q.upload(d.q);
        k.upload(d.k);
        v.upload(d.v);
        for (size_t vi = 0; vi < std::size(kPrefillVariants) && !context_lost; ++vi) {
            const PrefillVariant& variant = kPrefillVariants[vi];
            VariantTally& counts = tally[vi];
            double case_err = 0;
            const std::string why = run_case(variant, c, d, q, k, v, table, out, stream, case_err, context_lost);
            ++counts.cases;
            counts.max_err = std::max(counts.max_err, case_err);
            if (!why.empty()) {
                ++counts.failures;
                std::printf("FAIL %s %s: max err %.3g; %s\n", variant.name, c.describe().c_str(), case_err,
                            why.c_str());
                std::fflush(stdout);
            }
        }
    }
    if (context_lost) std::printf("the CUDA context is lost after that error: the remaining cases did not run\n");
    int failures = 0;
    for (size_t vi = 0; vi < std::size(kPrefillVariants); ++vi) {
        const VariantTally& counts = tally[vi];
        std::printf("%s: %d cases, %d failures, max err %.3g (KV blocks of %d)\n", kPrefillVariants[vi].name,
                    counts.cases, counts.failures, counts.max_err, block_size);
        failures += counts.failures;
    }
    cudaStreamDestroy(stream);
    return failures || context_lost ? 1 : 0;
}

// ---- bench: µs per call and TF/s on Llama head shapes --------------------------------------------

struct BenchShape {
    const char* name;
    int n_heads, n_kv_heads, head_dim;
};
const BenchShape kBenchShapes[] = {{"llama3.2-1b", 32, 8, 64}, {"llama3-8b", 32, 8, 128}};
const int kBenchLengths[] = {512, 2048, 8192, 16384};

constexpr int kWarmupCalls = 3;
constexpr int kRepeats = 7;
constexpr double kMinBatchUs = 2000;  // a batch long enough that event resolution does not matter
constexpr int kMaxBatchCalls = 1000;

struct Timing {
    double median_us, min_us, max_us;  // per call
};

// Warm-up calls, one timed call to size a batch of at least kMinBatchUs, then kRepeats batches
// between one pair of events each. Calls within a batch queue back to back on the stream, so the
// time is the GPU's, launch gaps included only where the GPU waits for the host.
template <class Launch>
Timing time_calls(Launch&& launch, cudaStream_t stream) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    auto batch_us = [&](int calls) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < calls; ++i) launch();
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        return ms * 1e3 / calls;
    };
    for (int i = 0; i < kWarmupCalls; ++i) launch();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double one_call_us = std::max(batch_us(1), 1e-3);
    const int calls = (int)std::clamp(std::ceil(kMinBatchUs / one_call_us), 1.0, (double)kMaxBatchCalls);
    std::vector<double> per_call;
    for (int r = 0; r < kRepeats; ++r) per_call.push_back(batch_us(calls));
    std::sort(per_call.begin(), per_call.end());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return {per_call[per_call.size() / 2], per_call.front(), per_call.back()};
}

// skip: ",name,name," of variants not to time (those that failed the check).
int bench(const std::string& skip, int block_size) {
    std::mt19937 rng(11);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int longest = *std::max_element(std::begin(kBenchLengths), std::end(kBenchLengths));
    for (const BenchShape& sh : kBenchShapes) {
        // Sized for the longest T and reused for the shorter ones: with slot 0 and max_seq = T the
        // cache of T positions is the first T rows, and q / out the first T tokens. Slot 0's
        // identity row at max_seq = T is the first T / block_size entries of the longest one's.
        std::fprintf(stderr, "%s: random inputs for T=%d\n", sh.name, longest);
        std::vector<uint16_t> q_host((size_t)longest * sh.n_heads * sh.head_dim);
        std::vector<uint16_t> k_host((size_t)longest * sh.n_kv_heads * sh.head_dim), v_host(k_host.size());
        fill_normal(q_host, rng);
        fill_normal(k_host, rng);
        fill_normal(v_host, rng);
        DeviceBits q(q_host.size()), k(k_host.size()), v(v_host.size()), out(q_host.size());
        q.upload(q_host);
        k.upload(k_host);
        v.upload(v_host);
        const IdentityTable longest_table(1, longest, block_size);
        for (int T : kBenchLengths) {
            BRRR_CHECK(T % block_size == 0, "bench: T=" << T << " must be a multiple of block_size=" << block_size);
            brrr::cuda::KvCache kv = longest_table.cache(k.get(), v.get(), 1);
            kv.pages.blocks_per_seq = T / block_size;
            kv.n_blocks = T / block_size;
            kv.max_seq = T;
            // QK^T and PV over the causal half: 2 x (2 hd T^2 / 2) per head, as bench_kernels.py counts.
            const double flops = 2.0 * sh.n_heads * sh.head_dim * (double)T * T;
            double first_us = 0;
            for (size_t vi = 0; vi < std::size(kPrefillVariants); ++vi) {
                const PrefillVariant& variant = kPrefillVariants[vi];
                if (skip.find("," + std::string(variant.name) + ",") != std::string::npos) continue;
                std::fprintf(stderr, "  T=%d %s\n", T, variant.name);
                const Timing t = time_calls(
                    [&] {
                        variant.launch(q.get(), kv, longest_table.row(0), 0, 0, T, out.get(), sh.n_heads,
                                       sh.n_kv_heads, sh.head_dim, stream);
                    },
                    stream);
                if (vi == 0) first_us = t.median_us;
                std::printf("{\"variant\": \"%s\", \"shape\": \"%s\", \"T\": %d, \"us\": %.3f, \"us_min\": %.3f, "
                            "\"us_max\": %.3f, \"tflops\": %.2f, \"vs_first\": %.3f, \"block_size\": %d}\n",
                            variant.name, sh.name, T, t.median_us, t.min_us, t.max_us,
                            flops / (t.median_us * 1e-6) / 1e12, first_us / t.median_us, block_size);
                std::fflush(stdout);
            }
        }
    }
    cudaStreamDestroy(stream);
    return 0;
}

}  // namespace lab

int main(int argc, char** argv) {
    const std::string mode = argc >= 2 ? argv[1] : "";
    // Options after the mode, each with its value: --skip (bench only), --block-size.
    std::string skip;
    int block_size = 16;
    bool args_ok = argc % 2 == 0;
    for (int i = 2; args_ok && i + 1 < argc; i += 2) {
        const std::string opt = argv[i], value = argv[i + 1];
        if (opt == "--skip" && mode == "bench") {
            skip = value;
        } else if (opt == "--block-size") {
            char* end = nullptr;
            const long n = std::strtol(value.c_str(), &end, 10);
            args_ok = *end == '\0' && (n == 16 || n == 32 || n == 64 || n == 128);
            if (!args_ok) std::fprintf(stderr, "--block-size must be 16, 32, 64 or 128, got '%s'\n", value.c_str());
            block_size = (int)n;
        } else {
            args_ok = false;
        }
    }
    try {
        if (args_ok && mode == "check") return lab::check(block_size);
        if (args_ok && mode == "bench") return lab::bench("," + skip + ",", block_size);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    std::fprintf(stderr, "usage: %s check [--block-size N] | bench [--skip VARIANT,VARIANT...] [--block-size N]\n",
                 argv[0]);
    return 2;
}
