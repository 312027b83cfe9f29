// profile.cpp — the Recorder's slow paths (only reached while profiling is on) and the names
// Python sees for the enums.
#include "profile/profile.h"

namespace brrr {
namespace profile {

void Recorder::open_op(const char* name, OpClass op_class, Cost cost) {
    int64_t start;
    if (open_) {
        const int64_t end = clock_->stamp();
        records_.back().end_mark = end;
        start = clock_->separate_end_marks() ? clock_->stamp() : end;
    } else {
        start = clock_->stamp();
    }
    Record r;
    r.name = name;
    r.kind = Kind::Kernel;
    r.op_class = op_class;
    r.phase = phase_;
    r.cost = cost;
    r.start_mark = start;
    records_.push_back(r);
    open_ = true;
}

void Recorder::close_op() {
    records_.back().end_mark = clock_->stamp();
    open_ = false;
}

void Recorder::add_marked(const char* name, Kind kind, int64_t start_mark, int64_t end_mark,
                          int group) {
    Record r;
    r.name = name;
    r.kind = kind;
    r.phase = phase_;
    r.group = group;
    r.start_mark = start_mark;
    r.end_mark = end_mark;
    records_.push_back(r);
}

void resolve(std::vector<Record>& records, Clock& clock) {
    for (Record& r : records) {
        if (r.start_mark < 0) continue;
        r.t0 = clock.seconds(r.start_mark);
        r.t1 = r.end_mark >= 0 ? r.t0 + clock.elapsed(r.start_mark, r.end_mark) : r.t0;
        r.start_mark = r.end_mark = -1;
    }
}

std::vector<Record> Recorder::take() {
    std::vector<Record> out;
    if (open_) close_op();
    if (clock_) {
        clock_->wait();
        resolve(records_, *clock_);
        clock_->recycle();
    }
    out.swap(records_);
    return out;
}

void Recorder::clear() {
    if (clock_) {
        clock_->wait();
        clock_->recycle();
    }
    records_.clear();
    open_ = false;
}

const char* op_class_name(OpClass c) {
    switch (c) {
        case OpClass::Matmul: return "matmul";
        case OpClass::Attention: return "attention";
        case OpClass::Norm: return "norm";
        case OpClass::Elementwise: return "elementwise";
        case OpClass::Sampling: return "sampling";
        case OpClass::Copy: return "copy";
    }
    return "elementwise";
}

const char* phase_name(Phase p) {
    switch (p) {
        case Phase::Prefill: return "prefill";
        case Phase::Decode: return "decode";
        case Phase::Sample: return "sample";
    }
    return "decode";
}

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Kernel: return "kernel";
        case Kind::Replay: return "replay";
        case Kind::Call: return "call";
    }
    return "kernel";
}

}  // namespace profile
}  // namespace brrr
