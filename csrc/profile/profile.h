// profile.h — the instrumentation core both engines share: what one kernel launch costs (FLOPs and
// bytes from its shapes), and the Recorder that timestamps launches when profiling is on.
//
// Every launch in a forward pass is preceded by one line
//     prof_.op("wqkv", profile::OpClass::Matmul, profile::matmul_cost(M, N, K, 2));
// which closes the previous launch's record and opens this one; prof_.end() closes the last one
// of a phase. When profiling is off, op() and end() are a single well-predicted branch on a bool
// and record nothing (the cost arguments are a handful of integer multiplies).
//
// Timestamps come from a Clock the engine supplies when it switches profiling on:
//   CPU   host steady_clock; one mark between consecutive ops (ops run back to back on the host).
//   CUDA  cudaEvents on the engine stream (csrc/cuda/profile_events.cu); two marks between ops
//         (end of the previous, start of the next), so a GPU left idle waiting for the host shows
//         as a gap between kernels, i.e. as overhead, and not as kernel time.
// A mark is an opaque id; take() asks the clock to resolve ids into seconds on the host's
// steady_clock timeline (the same clock as Python's time.perf_counter on Linux), then recycles them.
//
// Costs are analytic: every input read once, every output written once (a residual updated in
// place counts as read and written). They are what an ideal kernel must move, so achieved GB/s
// is comparable across implementations.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace brrr {
namespace profile {

enum class OpClass : int { Matmul = 0, Attention = 1, Norm = 2, Elementwise = 3, Sampling = 4, Copy = 5 };
enum class Phase : int { Prefill = 0, Decode = 1, Sample = 2 };
// Kernel: one launch. Replay: one CUDA-graph replay (a whole decode step), timed by two events.
// Call: one engine entry point (prefill / decode / sample) on the host, dispatch included.
enum class Kind : int { Kernel = 0, Replay = 1, Call = 2 };

struct Cost {
    double flops = 0;
    double bytes = 0;
};

// Y[M, N] = X[M, K] · W[N, K]^T: W read in w_bytes per element, X in x_bytes, Y written in y_bytes
// (y_bytes doubled when Y is a residual updated in place).
inline Cost matmul_cost(int64_t M, int64_t N, int64_t K, double w_bytes, int x_bytes = 2, int y_bytes = 4) {
    return {2.0 * M * N * K, (double)N * K * w_bytes + (double)M * K * x_bytes + (double)M * N * y_bytes};
}
// One query token per sequence over `context_positions` cached positions in total (summed over
// the batch): q·K^T and p·V are 2·hd FLOPs each per head and position; each K/V element read once
// per KV head (GQA-aware kernels), q and out once.
inline Cost attention_decode_cost(int64_t B, int64_t context_positions, int n_heads, int n_kv_heads,
                                  int head_dim, int kv_bytes, int act_bytes = 2) {
    return {4.0 * n_heads * head_dim * (double)context_positions,
            2.0 * n_kv_heads * head_dim * (double)context_positions * kv_bytes +
                2.0 * B * n_heads * head_dim * act_bytes};
}
// T causal query tokens at positions start_pos.. of one sequence: row t sees start_pos + t + 1
// positions; the cache [0, start_pos + T) is read once.
inline Cost attention_prefill_cost(int64_t T, int64_t start_pos, int n_heads, int n_kv_heads,
                                   int head_dim, int kv_bytes, int act_bytes = 2) {
    const double seen = (double)T * start_pos + (double)T * (T + 1) / 2;
    return {4.0 * n_heads * head_dim * seen,
            2.0 * n_kv_heads * head_dim * (double)(start_pos + T) * kv_bytes +
                2.0 * T * n_heads * head_dim * act_bytes};
}
// RMSNorm of M rows of D: square, sum, scale, weight (about 4 FLOPs per element).
inline Cost norm_cost(int64_t M, int64_t D, int in_bytes, int out_bytes, int w_bytes) {
    return {4.0 * M * D, (double)M * D * (in_bytes + out_bytes) + (double)D * w_bytes};
}
// Anything elementwise or a copy: the caller counts its FLOPs and bytes.
inline Cost elementwise_cost(double flops, double bytes) { return {flops, bytes}; }
inline Cost copy_cost(double bytes) { return {0, 2 * bytes}; }
// Sampling B rows of V logits: a few passes over the row (max, exp-sum, selection).
inline Cost sample_cost(int64_t B, int64_t V) { return {5.0 * B * V, 4.0 * B * V}; }

// Seconds on the host's monotonic clock (CLOCK_MONOTONIC on Linux, as time.perf_counter).
inline double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The source of timestamps (see the banner). Only called while profiling is on.
class Clock {
public:
    virtual ~Clock() = default;
    virtual int64_t stamp() = 0;              // a mark at this point of the work
    virtual bool separate_end_marks() const = 0;
    virtual void wait() {}                    // until every mark so far has happened
    virtual double seconds(int64_t mark) = 0;  // after wait(): the mark's time on the host clock
    // Seconds from mark a to mark b; a clock whose absolute times are coarse (float milliseconds
    // since profiling began) measures short intervals directly.
    virtual double elapsed(int64_t a, int64_t b) { return seconds(b) - seconds(a); }
    virtual void recycle() {}                 // marks taken so far will not be asked for again
};

// Host steady_clock marks, for the CPU engine (and the CUDA engine's host spans).
class HostClock final : public Clock {
public:
    int64_t stamp() override {
        marks_.push_back(now());
        return (int64_t)marks_.size() - 1;
    }
    bool separate_end_marks() const override { return false; }
    double seconds(int64_t mark) override { return marks_[(size_t)mark]; }
    void recycle() override { marks_.clear(); }

private:
    std::vector<double> marks_;
};

struct Record {
    const char* name = "";  // a string literal: records outlive nothing they point into
    Kind kind = Kind::Kernel;
    OpClass op_class = OpClass::Elementwise;
    Phase phase = Phase::Decode;
    Cost cost;
    int group = -1;        // CUDA-graph replays: the graph (decode batch size) a record belongs to
    bool sampled = false;  // a kernel timed inside an instrumented graph replay (see engine.cu)
    int64_t start_mark = -1, end_mark = -1;  // unresolved marks; -1 once t0/t1 hold the times
    double t0 = 0, t1 = 0;                    // seconds, host steady_clock timeline
};

class Recorder {
public:
    bool on() const { return clock_ != nullptr; }
    // Starts recording with `clock` (owned by the engine, alive until stop()); nullptr stops.
    void start(Clock* clock) { clock_ = clock; }
    void stop() { clock_ = nullptr; open_ = false; }
    Clock* clock() const { return clock_; }

    void set_phase(Phase p) { phase_ = p; }
    Phase phase() const { return phase_; }

    void op(const char* name, OpClass op_class, Cost cost) {
        if (clock_) open_op(name, op_class, cost);
    }
    void end() {
        if (clock_ && open_) close_op();
    }
    // An already-timed record (host spans, resolved graph replays).
    void add(const Record& r) { records_.push_back(r); }
    // A Call or Replay record whose marks the caller took from the clock.
    void add_marked(const char* name, Kind kind, int64_t start_mark, int64_t end_mark, int group = -1);

    size_t size() const { return records_.size(); }
    std::vector<Record>& records() { return records_; }
    // Every record with its times resolved; the recorder is left empty. Waits for the clock.
    std::vector<Record> take();
    void clear();

private:
    void open_op(const char* name, OpClass op_class, Cost cost);
    void close_op();

    Clock* clock_ = nullptr;
    Phase phase_ = Phase::Decode;
    bool open_ = false;  // records_.back() is a kernel still waiting for its end mark
    std::vector<Record> records_;
};

// What an engine that can be profiled offers; csrc/bindings/engine.cpp reaches it by dynamic_cast.
class Profiled {
public:
    virtual ~Profiled() = default;
    virtual Recorder& recorder() = 0;
    // Switching on sets up the clock (the CUDA engine creates its event pool then); off drops
    // whatever was recorded and not taken.
    virtual void profile_enable(bool on) = 0;
    virtual bool profile_enabled() const = 0;
    // Every record so far, times resolved (the CUDA engine synchronizes its stream first).
    virtual std::vector<Record> profile_take() = 0;
};

// Resolves the records' marks through `clock` (after clock.wait()).
void resolve(std::vector<Record>& records, Clock& clock);

const char* op_class_name(OpClass c);
const char* phase_name(Phase p);
const char* kind_name(Kind k);

}  // namespace profile
}  // namespace brrr
