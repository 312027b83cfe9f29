// engine.cpp — _C.Engine: one model's weights, KV cache and forward pass on either backend.
// The bindings check what only Python can get wrong (array dtypes, shapes, contiguity, option
// strings) and narrow Python ints; the rules of the call itself (slots, positions, tokens, batch)
// are the engine's, checked once in model.cpp, and arrive here as ValueError all the same.
//
//   Engine(backend: "cpu"|"cuda", config: dict, dtype: "f32"|"f16"|"bf16", device: int = 0,
//          n_threads: int = 0, quant_types: dict = {})
//                                            config keys: ModelConfig.engine_dict(), and a
//                                            tensor-parallel rank's tp_rank / tp_size; the cpu
//                                            backend stores "f32" or "bf16", n_threads 0 = all;
//                                            quant_types: matrix name -> GGML type id of the block
//                                            format it is stored in (cpu only)
//     .config -> dict,  .backend -> str,  .dtype -> str
//     .set_weight(name, array, dtype)        array: C-contiguous numpy; dtype "f32"|"f16"|"bf16"
//                                            (bf16 arrays as their uint16 bits or ml_dtypes.bfloat16);
//                                            quantized at load into a tensor quant_types names
//     .set_weight_blocks(name, blocks, type_id, shape, first_row=0)   a quantized tensor's GGUF
//                                            blocks as they are: uint8 rows of row_bytes, type_id
//                                            its GGML id, shape the whole tensor's; whole, or in
//                                            consecutive row chunks starting at first_row
//     .get_weight(name) -> np.ndarray[f32]
//     .init_random(seed, std=0.02)
//     .prefill(slot, tokens[int32 T], start_pos=0, logits="last") -> ndarray | None
//        logits "all" -> [T, vocab], "last" -> [1, vocab] (either is what sample() then
//        draws from), "none" -> None: no LM head at all (sample() raises until the next call)
//     .prefill_many(slots[int32 S], starts[int32 S], counts[int32 S], tokens[int32 sum(counts)])
//        several sequences' prompt chunks in one pass, no logits
//     .decode(tokens[int32 B], slots[int32 B], positions[int32 B], logits=True) -> [B, vocab] | None
//        one token per sequence; each slot at most once per call
//     .sample(slots[int32 B], positions[int32 B], params[sampling_params_dtype B], step[uint64 B])
//             -> (tokens[int32 B], logprobs[f32 B])
//        samples from the logits of the most recent prefill (B = 1) or decode (row i = sequence i);
//        repetition penalty covers the slot's tokens at positions [0, positions[i]]; rules in
//        csrc/cpu/sampling.h
//     .decode_steps(tokens, slots, positions, params, step, n_steps) -> (tokens, logprobs)
//        n_steps (<= 64) rounds of decode + sample, each [n_steps, B]
//     .decode_launch(tokens, slots, positions, params, step, n_steps)   the same, without waiting
//        (at most 2 pending); tokens[i] = -1 - j continues row j of the previous launch
//     .decode_wait() -> (tokens, logprobs)   the oldest pending launch's results
//     .decode_discard()                      forgets the pending launches
//     .decode_pending                        how many are pending; decode, sample and
//        decode_steps are refused while any is
//     .use_cuda_graphs (read/write)          cuda backend: replay one decode graph per batch size
//     .cuda_memory -> {"weights", "kv_cache", "buffers", "dequant_scratch": bytes, "dequant_sliced": bool}
//        cuda backend: the engine's device memory; None on the cpu backend
//     .set_block_table(slot, blocks[int32 n]) the paged KV cache: the slot's blocks in position order
//     .set_history(slot, start_pos, tokens[int32 n])   repetition-penalty memory of shared positions
//     .init_tensor_parallel(unique_id, rank, size, library="")   cuda backend: join an NCCL group
//     .all_reduce_info() -> {"oneshot": bool, "oneshot_max_bytes": int, "ll_max_bytes": int, "why_not": str}
//     .all_reduce(values[f32 n], method="oneshot") -> [n]   every rank together: the sum of their values
//     .all_reduce_bench(bytes, method, iters=100, repeats=20) -> median us per all-reduce in a graph
//     .leave_tensor_parallel()                every rank together on a normal stop: frees the IPC buffers cleanly
//     profiling (llama_brrr/profiler.py reads these):
//     .profile_enabled (read/write)          on: every launch is timed (see csrc/profile/profile.h)
//     .profile_records() -> list of (name, kind, op_class, phase, flops, bytes, t0, t1, group,
//        sampled), oldest first; the engine's records are handed over and forgotten
//     .profile_clear()                       drops the records without reading them
#include "bindings/bindings.h"

#include <memory>
#include <mutex>

#include "cpu/engine_cpu.h"
#include "profile/profile.h"

#ifdef BRRR_WITH_CUDA
#include "cuda/engine_cuda.h"
#endif

namespace brrr {
namespace bindings {


brrr::Config config_from_dict(const py::dict& d) {
    static const char* keys[] = {
        "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size",
        "max_seq_len", "max_batch", "norm_eps", "rope_theta", "rope_type", "rope_factor",
        "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos",
        "tie_embeddings"};
    std::string missing;
    for (const char* key : keys)
        if (!d.contains(key)) missing += (missing.empty() ? "" : ", ") + std::string(key);
    if (!missing.empty())
        throw py::key_error("engine config is missing keys: " + missing +
                            " (build it with ModelConfig.engine_dict(max_seq_len, max_batch))");
    brrr::Config c;
    try {
        auto as_int = [&](const char* key) {
            const int64_t v = d[key].cast<int64_t>();
            if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
                bad_argument(std::string("config['") + key + "'] = " + std::to_string(v) +
                             " does not fit in a 32-bit int");
            return (int)v;
        };
        c.dim = as_int("dim");
        c.hidden_dim = as_int("hidden_dim");
        c.n_layers = as_int("n_layers");
        c.n_heads = as_int("n_heads");
        c.n_kv_heads = as_int("n_kv_heads");
        c.head_dim = as_int("head_dim");
        c.vocab_size = as_int("vocab_size");
        c.max_seq_len = as_int("max_seq_len");
        c.max_batch = as_int("max_batch");
        c.norm_eps = d["norm_eps"].cast<float>();
        c.rope_theta = d["rope_theta"].cast<float>();
        c.rope_type = static_cast<brrr::RopeType>(as_int("rope_type"));
        c.rope_factor = d["rope_factor"].cast<float>();
        c.rope_low_freq_factor = d["rope_low_freq_factor"].cast<float>();
        c.rope_high_freq_factor = d["rope_high_freq_factor"].cast<float>();
        c.rope_original_max_pos = as_int("rope_original_max_pos");
        c.tie_embeddings = d["tie_embeddings"].cast<bool>();
        // The KV pool's keys are optional: the defaults give every slot its max_seq_len.
        if (d.contains("kv_block_size")) c.kv_block_size = as_int("kv_block_size");
        if (d.contains("kv_blocks")) c.kv_blocks = as_int("kv_blocks");
        if (d.contains("gpu_memory_utilization"))
            c.gpu_memory_utilization = d["gpu_memory_utilization"].cast<float>();
        if (d.contains("kv_cache_dtype")) {
            const std::string kv_type = d["kv_cache_dtype"].cast<std::string>();
            if (kv_type == "auto") c.kv_cache_dtype = brrr::KvCacheDtype::Auto;
            else if (kv_type == "fp8_e4m3") c.kv_cache_dtype = brrr::KvCacheDtype::Fp8E4m3;
            else bad_argument("config['kv_cache_dtype'] must be 'auto' or 'fp8_e4m3', got '" + kv_type + "'");
        }
        // A tensor-parallel rank's (llama_brrr/tp/shard.py, local_config); absent: one engine.
        if (d.contains("tp_rank")) c.tp_rank = as_int("tp_rank");
        if (d.contains("tp_size")) c.tp_size = as_int("tp_size");
    } catch (const py::cast_error&) {
        bad_argument("engine config has a value of the wrong type: ints for sizes, floats for "
                     "norm_eps/rope_*, bool for tie_embeddings");
    }
    try {
        c.validate();
    } catch (const brrr::Error& e) {
        bad_argument(e.what());
    }
    return c;
}

py::dict config_to_dict(const brrr::Config& c) {
    py::dict d;
    d["dim"] = c.dim;
    d["hidden_dim"] = c.hidden_dim;
    d["n_layers"] = c.n_layers;
    d["n_heads"] = c.n_heads;
    d["n_kv_heads"] = c.n_kv_heads;
    d["head_dim"] = c.head_dim;
    d["vocab_size"] = c.vocab_size;
    d["max_seq_len"] = c.max_seq_len;
    d["max_batch"] = c.max_batch;
    d["norm_eps"] = c.norm_eps;
    d["rope_theta"] = c.rope_theta;
    d["rope_type"] = static_cast<int>(c.rope_type);
    d["rope_factor"] = c.rope_factor;
    d["rope_low_freq_factor"] = c.rope_low_freq_factor;
    d["rope_high_freq_factor"] = c.rope_high_freq_factor;
    d["rope_original_max_pos"] = c.rope_original_max_pos;
    d["tie_embeddings"] = c.tie_embeddings;
    d["kv_block_size"] = c.kv_block_size;
    d["kv_blocks"] = c.kv_blocks;
    d["gpu_memory_utilization"] = c.gpu_memory_utilization;
    d["kv_cache_dtype"] = c.kv_cache_dtype == brrr::KvCacheDtype::Fp8E4m3 ? "fp8_e4m3" : "auto";
    d["tp_rank"] = c.tp_rank;
    d["tp_size"] = c.tp_size;
    return d;
}

namespace {

std::unique_ptr<brrr::Engine> make_engine(const std::string& backend, const brrr::Config& cfg,
                                          brrr::DType dtype, int device, int n_threads,
                                          const std::unordered_map<std::string, int>& quant_types) {
    if (backend == "cpu") {
        if (dtype == brrr::DType::F16)
            bad_argument("the CPU engine stores weights as \"f32\" or \"bf16\" (f16 inputs are "
                         "converted); dtype \"f16\" is for the cuda backend");
        if (device != 0) bad_argument("device must be 0 for the cpu backend, got " + std::to_string(device));
        return std::make_unique<brrr::cpu::CpuEngine>(cfg, dtype, n_threads, quant_types);
    }
    if (backend == "cuda") {
#ifdef BRRR_WITH_CUDA
        if (device < 0) bad_argument("device must be >= 0, got " + std::to_string(device));
        return brrr::make_cuda_engine(cfg, dtype, device, quant_types);
#else
        throw std::runtime_error("this build of llama_brrr has no CUDA support; reinstall with "
                                 "nvcc on PATH or LLAMA_BRRR_CUDA=1");
#endif
    }
    bad_argument("backend must be \"cpu\" or \"cuda\", got \"" + backend + "\"");
}

// What Python holds: the backend's engine and a lock, since calls release the GIL and an engine
// runs one call at a time.
struct PyEngine {
    std::unique_ptr<brrr::Engine> impl;
    std::string backend;
    brrr::DType dtype;
    std::mutex mutex;
    brrr::profile::Profiled* profiled = nullptr;  // impl's profiling face (both engines have one)

    const brrr::Config& cfg() const { return impl->config(); }

    // A host span for one entry point (dispatch and argument checks inside the engine included).
    void record_call(const char* name, brrr::profile::Phase phase, double t0) {
        if (!profiled || !profiled->profile_enabled()) return;
        brrr::profile::Record r;
        r.name = name;
        r.kind = brrr::profile::Kind::Call;
        r.phase = phase;
        r.t0 = t0;
        r.t1 = brrr::profile::now();
        profiled->recorder().add(r);
    }
};

// The array a weight arrives as, checked against the dtype it is declared as.
brrr::DType weight_array_dtype(const py::array& a, const std::string& dtype, const std::string& name) {
    const brrr::DType t = parse_dtype(dtype, "dtype");
    const std::string got = dtype_of(a);
    const bool ok = t == brrr::DType::F32 ? py::isinstance<py::array_t<float>>(a)
                                          : a.itemsize() == 2 && (got == "uint16" || got == "int16" ||
                                                                  got == (t == brrr::DType::F16 ? "float16" : "bfloat16"));
    if (!ok)
        bad_argument("weight '" + name + "': an array declared \"" + dtype + "\" must be " +
                     (t == brrr::DType::F32 ? "float32"
                                            : t == brrr::DType::F16 ? "float16 (or its uint16 bits)"
                                                                    : "bfloat16 bits as uint16 (or ml_dtypes.bfloat16)") +
                     ", got " + got);
    if (!(a.flags() & py::array::c_style))
        bad_argument("weight '" + name + "' must be C-contiguous (use np.ascontiguousarray)");
    return t;
}

// The rows of a decode call: tokens, slots and positions, int32 arrays of one length B.
// decode, sample and decode_steps read or overwrite what a pending decode_launch is still
// writing, and wait for nothing: they are refused until its results are taken.
void require_no_pending_decode(const PyEngine& self, const char* call) {
    const int n = self.impl->decode_pending();
    BRRR_CHECK(n == 0, call << ": " << n << " decode_launch call(s) are pending; take their results "
                       "with decode_wait (or drop them with decode_discard) first");
}

struct BatchRows {
    py::array_t<int32_t> tokens, slots, positions;
    py::ssize_t B;
    BatchRows(const py::object& tok, const py::object& sl, const py::object& pos)
        : tokens(checked_array<int32_t>(tok, "tokens", {-1}, "int32 array of shape (B,)")),
          B(tokens.shape(0)) {
        slots = checked_array<int32_t>(sl, "slots", {B}, "int32 array of shape (B,) like tokens");
        positions = checked_array<int32_t>(pos, "positions", {B}, "int32 array of shape (B,) like tokens");
    }
};

// decode_steps' and decode_launch's arguments, checked: the rows, their sampling records and the
// RNG steps.
struct DecodeArgs : BatchRows {
    py::array sampling;
    py::array_t<uint64_t> steps;
    DecodeArgs(const py::object& tok, const py::object& sl, const py::object& pos, const py::object& params,
               const py::object& step)
        : BatchRows(tok, sl, pos), sampling(sampling_rows(params, B)),
          steps(checked_array<uint64_t>(step, "step", {B}, "uint64 array of shape (B,)")) {}
    const brrr::SamplingParams* params() const { return rows_of(sampling); }
};

}  // namespace

void bind_engine(py::module_& m) {
    py::class_<PyEngine> engine_cls(m, "Engine", "One model's weights, KV cache and forward pass");
    engine_cls.def(py::init([](const std::string& backend, const py::dict& config,
                               const std::string& dtype, int device, int n_threads,
                               const py::dict& quant_types) {
        const brrr::Config cfg = config_from_dict(config);
        std::unordered_map<std::string, int> types;
        for (const auto& [key, value] : quant_types) {
            if (!py::isinstance<py::str>(key) || !py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value))
                bad_argument("quant_types maps tensor names (str) to GGML type ids (int), got " +
                             py::repr(key).cast<std::string>() + ": " + py::repr(value).cast<std::string>());
            types[key.cast<std::string>()] = saturate_int(value.cast<int64_t>());
        }
        auto e = std::make_unique<PyEngine>();
        e->backend = backend;
        e->dtype = parse_dtype(dtype, "dtype");
        e->impl = make_engine(backend, cfg, e->dtype, device, n_threads, types);
        e->profiled = dynamic_cast<brrr::profile::Profiled*>(e->impl.get());
        return e;
    }), py::arg("backend"), py::arg("config"), py::arg("dtype"), py::arg("device") = 0,
       py::arg("n_threads") = 0, py::arg("quant_types") = py::dict());
    engine_cls.def_property_readonly("config", [](PyEngine& self) { return config_to_dict(self.cfg()); });
    engine_cls.def_property_readonly("backend", [](PyEngine& self) { return self.backend; });
    engine_cls.def_property_readonly("dtype", [](PyEngine& self) { return std::string(brrr::dtype_name(self.dtype)); });

    engine_cls.def("set_weight", [](PyEngine& self, const std::string& name, const py::array& array,
                                    const std::string& dtype) {
        const brrr::DType t = weight_array_dtype(array, dtype, name);
        const std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
        const void* src = array.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->set_weight(name, src, t, shape);
        });
    }, py::arg("name"), py::arg("array"), py::arg("dtype"));

    engine_cls.def("set_weight_blocks", [](PyEngine& self, const std::string& name, const py::array& blocks,
                                           int64_t type_id, const std::vector<int64_t>& shape,
                                           int64_t first_row) {
        if (!py::isinstance<py::array_t<uint8_t>>(blocks) || !(blocks.flags() & py::array::c_style))
            bad_argument("weight '" + name + "': blocks must be a C-contiguous uint8 array, got " +
                         dtype_of(blocks));
        const void* src = blocks.data();
        const size_t n_bytes = (size_t)blocks.nbytes();
        const int type = saturate_int(type_id);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->set_weight_blocks(name, src, n_bytes, type, shape, first_row);
        });
    }, py::arg("name"), py::arg("blocks"), py::arg("type_id"), py::arg("shape"), py::arg("first_row") = 0);

    engine_cls.def("get_weight", [](PyEngine& self, const std::string& name) {
        const std::vector<int64_t> shape = brrr::weight_shape(self.cfg(), name);
        py::array_t<float> out(std::vector<py::ssize_t>(shape.begin(), shape.end()));
        float* dst = out.mutable_data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->get_weight(name, dst);
        });
        return out;
    }, py::arg("name"));

    engine_cls.def("init_random", [](PyEngine& self, uint64_t seed, float std) {
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->init_random(seed, std);
        });
    }, py::arg("seed"), py::arg("std") = 0.02f);

    engine_cls.def("set_block_table", [](PyEngine& self, int64_t slot, const py::object& blocks) {
        auto ids = checked_array<int32_t>(blocks, "blocks", {-1}, "int32 array of shape (n,)");
        const int32_t* b = ids.data();
        const int n = saturate_int(ids.shape(0)), row = saturate_int(slot);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->set_block_table(row, b, n);
        });
    }, py::arg("slot"), py::arg("blocks"),
       "The KV blocks of slot `slot`, in position order (block i holds positions "
       "[i * kv_block_size, (i + 1) * kv_block_size)); the rest of the slot has none.");

    engine_cls.def("set_history", [](PyEngine& self, int64_t slot, int64_t start_pos, const py::object& tokens) {
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (n,)");
        const int32_t* t = tok.data();
        const int n = saturate_int(tok.shape(0)), row = saturate_int(slot), first = saturate_int(start_pos);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->set_history(row, first, t, n);
        });
    }, py::arg("slot"), py::arg("start_pos"), py::arg("tokens"),
       "Records tokens at positions start_pos.. of slot `slot` for the repetition penalty (for "
       "positions whose KV a prefill did not compute: shared prefix blocks).");

    engine_cls.def("prefill", [](PyEngine& self, int64_t slot, const py::object& tokens,
                                 int64_t start_pos, const std::string& logits) -> py::object {
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (T,)");
        const py::ssize_t T = tok.shape(0);
        if (logits != "none" && logits != "last" && logits != "all")
            bad_argument("logits must be \"none\", \"last\" or \"all\", got \"" + logits + "\"");
        const int32_t* ids = tok.data();
        const int n = saturate_int(T), first = saturate_int(start_pos), row = saturate_int(slot);
        py::object result = py::none();
        float* out = nullptr;
        if (logits != "none") {
            py::array_t<float> arr({logits == "all" ? T : (py::ssize_t)1, (py::ssize_t)self.cfg().vocab_size});
            out = arr.mutable_data();
            result = arr;
        }
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->prefill(row, ids, n, first, out, logits == "all");
            self.record_call("prefill", brrr::profile::Phase::Prefill, t0);
        });
        return result;
    }, py::arg("slot"), py::arg("tokens"), py::arg("start_pos") = 0, py::arg("logits") = "last");

    engine_cls.def("prefill_many", [](PyEngine& self, const py::object& slots, const py::object& starts,
                                      const py::object& counts, const py::object& tokens) {
        auto sl = checked_array<int32_t>(slots, "slots", {-1}, "int32 array of shape (S,)");
        const py::ssize_t S = sl.shape(0);
        auto st = checked_array<int32_t>(starts, "starts", {S}, "int32 array of shape (S,)");
        auto ct = checked_array<int32_t>(counts, "counts", {S}, "int32 array of shape (S,)");
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (sum(counts),)");
        int64_t total = 0;
        for (py::ssize_t i = 0; i < S; ++i) total += ct.data()[i];
        if (total != tok.shape(0))
            bad_argument("tokens holds " + std::to_string(tok.shape(0)) + " ids but counts add up to " +
                         std::to_string(total));
        const int32_t *s = sl.data(), *p = st.data(), *c = ct.data(), *t = tok.data();
        const int n = saturate_int(S);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->prefill_many(s, p, c, n, t);
            self.record_call("prefill", brrr::profile::Phase::Prefill, t0);
        });
    }, py::arg("slots"), py::arg("starts"), py::arg("counts"), py::arg("tokens"),
       "prompt chunks of several sequences in one pass, no logits: counts[i] tokens (the next ones "
       "of `tokens`) at positions starts[i].. of slot slots[i]; the cache ends as that many "
       "prefill calls would leave it");

    engine_cls.def("decode", [](PyEngine& self, const py::object& tokens, const py::object& slots,
                                const py::object& positions, bool logits) -> py::object {
        const BatchRows rows(tokens, slots, positions);
        const py::ssize_t B = rows.B;
        const int32_t *t = rows.tokens.data(), *s = rows.slots.data(), *p = rows.positions.data();
        py::object result = py::none();
        float* out = nullptr;
        if (logits) {
            py::array_t<float> arr({B, (py::ssize_t)self.cfg().vocab_size});
            out = arr.mutable_data();
            result = arr;
        }
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            require_no_pending_decode(self, "decode");
            const double t0 = brrr::profile::now();
            self.impl->decode(t, s, p, saturate_int(B), out);
            self.record_call("decode", brrr::profile::Phase::Decode, t0);
        });
        return result;
    }, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("logits") = true);

    engine_cls.def("sample", [](PyEngine& self, const py::object& slots, const py::object& positions,
                                const py::object& params, const py::object& step) {
        auto sl = checked_array<int32_t>(slots, "slots", {-1}, "int32 array of shape (B,)");
        const py::ssize_t B = sl.shape(0);
        auto pos = checked_array<int32_t>(positions, "positions", {B}, "int32 array of shape (B,)");
        auto rows = sampling_rows(params, B);
        auto st = checked_array<uint64_t>(step, "step", {B}, "uint64 array of shape (B,)");
        const int32_t *s = sl.data(), *p = pos.data();
        py::array_t<int32_t> tokens(B);
        py::array_t<float> logprobs(B);
        int32_t* tok_out = tokens.mutable_data();
        float* lp_out = logprobs.mutable_data();
        const brrr::SamplingParams* rp = rows_of(rows);
        const uint64_t* steps = st.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            require_no_pending_decode(self, "sample");
            const double t0 = brrr::profile::now();
            self.impl->sample(s, p, rp, steps, saturate_int(B), tok_out, lp_out);
            self.record_call("sample", brrr::profile::Phase::Sample, t0);
        });
        return py::make_tuple(tokens, logprobs);
    }, py::arg("slots"), py::arg("positions"), py::arg("params"), py::arg("step"));

    engine_cls.def("decode_steps", [](PyEngine& self, const py::object& tokens, const py::object& slots,
                                      const py::object& positions, const py::object& params,
                                      const py::object& step, int64_t n_steps) {
        const DecodeArgs args(tokens, slots, positions, params, step);
        const py::ssize_t B = args.B;
        const int rounds = saturate_int(n_steps);
        // Sized for the rounds asked, at most kMaxDecodeSteps: the engine refuses more (and fewer
        // than one) before it writes anything.
        const py::ssize_t out_rows = std::clamp(rounds, 0, brrr::kMaxDecodeSteps);
        py::array_t<int32_t> out_tokens({out_rows, B});
        py::array_t<float> out_logprobs({out_rows, B});
        int32_t* tok_out = out_tokens.mutable_data();
        float* lp_out = out_logprobs.mutable_data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            require_no_pending_decode(self, "decode_steps");
            const double t0 = brrr::profile::now();
            self.impl->decode_steps(args.tokens.data(), args.slots.data(), args.positions.data(), args.params(),
                                    args.steps.data(), saturate_int(B), rounds, tok_out, lp_out);
            self.record_call("decode_steps", brrr::profile::Phase::Decode, t0);
        });
        return py::make_tuple(out_tokens, out_logprobs);
    }, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("params"), py::arg("step"),
       py::arg("n_steps"),
       "n_steps rounds of decode + sample, each round's tokens fed back as the next round's inputs "
       "(on the device for CUDA); returns (tokens, logprobs), each of shape (n_steps, B)");

    engine_cls.def("decode_launch", [](PyEngine& self, const py::object& tokens, const py::object& slots,
                                       const py::object& positions, const py::object& params,
                                       const py::object& step, int64_t n_steps) {
        const DecodeArgs args(tokens, slots, positions, params, step);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->decode_launch(args.tokens.data(), args.slots.data(), args.positions.data(), args.params(),
                                     args.steps.data(), saturate_int(args.B), saturate_int(n_steps));
            self.record_call("decode_launch", brrr::profile::Phase::Decode, t0);
        });
    }, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("params"), py::arg("step"),
       py::arg("n_steps"),
       "decode_steps without waiting: enqueues the rounds and returns; decode_wait() takes the "
       "results. tokens[i] = -1 - j continues row j of the previous launch (the token it sampled "
       "last, which the caller need not have read)");

    engine_cls.def("decode_wait", [](PyEngine& self) {
        std::vector<int32_t> tok;
        std::vector<float> lp;
        std::pair<int, int> shape;
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            shape = self.impl->decode_pending_shape();
            BRRR_CHECK(shape.first > 0, "decode_wait: no decode_launch is pending");
            tok.resize((size_t)shape.first * shape.second);
            lp.resize(tok.size());
            self.impl->decode_wait(tok.data(), lp.data());
            self.record_call("decode_wait", brrr::profile::Phase::Decode, t0);
        });
        py::array_t<int32_t> out_tokens({(py::ssize_t)shape.first, (py::ssize_t)shape.second});
        py::array_t<float> out_logprobs({(py::ssize_t)shape.first, (py::ssize_t)shape.second});
        std::copy(tok.begin(), tok.end(), out_tokens.mutable_data());
        std::copy(lp.begin(), lp.end(), out_logprobs.mutable_data());
        return py::make_tuple(out_tokens, out_logprobs);
    }, "the oldest pending decode_launch's (tokens, logprobs), each of shape (n_steps, B); "
       "blocks until its rounds are done");

    engine_cls.def("decode_discard", [](PyEngine& self) {
        std::lock_guard<std::mutex> lock(self.mutex);
        self.impl->decode_discard();
    }, "forgets every pending decode_launch (their rounds still run) and the rows a negative token "
       "could continue");

    engine_cls.def_property_readonly("decode_pending", [](PyEngine& self) {
        std::lock_guard<std::mutex> lock(self.mutex);
        return self.impl->decode_pending();
    }, "decode_launch calls whose results decode_wait has not taken yet");

    engine_cls.def_property_readonly("cuda_memory", [](PyEngine& self) -> py::object {
#ifdef BRRR_WITH_CUDA
        brrr::CudaMemoryUse m;
        if (!brrr::cuda_memory_use(*self.impl, &m)) return py::none();
        py::dict d;
        d["weights"] = m.weights;
        d["kv_cache"] = m.kv_cache;
        d["buffers"] = m.buffers;
        d["dequant_scratch"] = m.dequant_scratch;
        d["dequant_sliced"] = m.dequant_sliced;
        return std::move(d);
#else
        (void)self;
        return py::none();
#endif
    }, "cuda backend: bytes of device memory by use (weights, kv_cache, buffers, and among the buffers "
       "dequant_scratch, where long prompts dequantize quantized matrices: whole, or about the L2 when "
       "dequant_sliced); None on the cpu backend");

    engine_cls.def_property(
        "use_cuda_graphs",
        [](PyEngine& self) {
#ifdef BRRR_WITH_CUDA
            return brrr::cuda_use_graphs(*self.impl);
#else
            (void)self;
            return false;
#endif
        },
        [](PyEngine& self, bool on) {
#ifdef BRRR_WITH_CUDA
            std::lock_guard<std::mutex> lock(self.mutex);
            brrr::cuda_set_use_graphs(*self.impl, on);
#else
            (void)self;
            (void)on;
#endif
        },
        "cuda backend: decode replays one CUDA graph per batch size (default True); False runs "
        "every kernel eagerly. Always False, and setting it does nothing, on the cpu backend");

    engine_cls.def("init_tensor_parallel", [](PyEngine& self, const py::bytes& unique_id, int64_t rank,
                                              int64_t size, const std::string& library) {
#ifdef BRRR_WITH_CUDA
        const std::string id = unique_id;
        const int r = saturate_int(rank), n = saturate_int(size);
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            brrr::cuda_init_tensor_parallel(*self.impl, id, r, n, library);
        });
#else
        (void)self, (void)unique_id, (void)rank, (void)size, (void)library;
        throw std::runtime_error("this build has no CUDA support: tensor parallelism needs cuda engines");
#endif
    }, py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("library") = "",
       "cuda backend: makes this engine (built with its rank's shard of the model) rank `rank` of "
       "`size`, joining the NCCL communicator of `unique_id` (nccl_unique_id()); blocks until "
       "every rank has joined. From then on each forward pass sums the residual stream over the "
       "ranks after wo and w2");

    // The group's all-reduce for tests and benchmarks (cuda/engine_cuda.h); every rank calls together.
    engine_cls.def("all_reduce_info", [](PyEngine& self) {
#ifdef BRRR_WITH_CUDA
        brrr::CudaAllReduceInfo info;
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            info = brrr::cuda_all_reduce_info(*self.impl);
        });
        py::dict d;
        d["oneshot"] = info.oneshot;
        d["oneshot_max_bytes"] = info.oneshot_max_bytes;
        d["ll_max_bytes"] = info.ll_max_bytes;
        d["why_not"] = info.why_not;
        return d;
#else
        (void)self;
        throw std::runtime_error("this build has no CUDA support: tensor parallelism needs cuda engines");
#endif
    }, "cuda backend: whether residual all-reduces of up to oneshot_max_bytes take the one-shot IPC "
       "kernel (else NCCL), those of up to ll_max_bytes its low-latency form, and why_not when they cannot");
    engine_cls.def("all_reduce", [](PyEngine& self, const py::object& values, const std::string& method) {
#ifdef BRRR_WITH_CUDA
        py::array_t<float> in = checked_array<float>(values, "values", {-1}, "float32 array of shape (n,)");
        const size_t n = (size_t)in.shape(0);
        py::array_t<float> out((py::ssize_t)n);
        const float* src = in.data();
        float* dst = out.mutable_data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            brrr::cuda_all_reduce(*self.impl, src, dst, n, method);
        });
        return out;
#else
        (void)self, (void)values, (void)method;
        throw std::runtime_error("this build has no CUDA support: tensor parallelism needs cuda engines");
#endif
    }, py::arg("values"), py::arg("method") = "oneshot",
       "cuda backend, tensor parallel: every rank calls it at once with its own values (float32, a "
       "multiple of 4); returns the sum over the ranks, by method \"oneshot\", \"ll\" or \"nccl\"");
    engine_cls.def("all_reduce_bench", [](PyEngine& self, int64_t bytes, const std::string& method,
                                          int64_t iters, int64_t repeats) {
#ifdef BRRR_WITH_CUDA
        if (bytes <= 0) bad_argument("bytes must be positive, got " + std::to_string(bytes));
        double us = 0;
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            us = brrr::cuda_all_reduce_bench(*self.impl, (size_t)bytes, method, saturate_int(iters),
                                             saturate_int(repeats));
        });
        return us;
#else
        (void)self, (void)bytes, (void)method, (void)iters, (void)repeats;
        throw std::runtime_error("this build has no CUDA support: tensor parallelism needs cuda engines");
#endif
    }, py::arg("bytes"), py::arg("method"), py::arg("iters") = 100, py::arg("repeats") = 20,
       "cuda backend, tensor parallel: every rank calls it at once; the median microseconds per "
       "all-reduce of `bytes` (\"oneshot\", \"ll\" or \"nccl\"), `iters` of them captured in one CUDA graph "
       "and replayed `repeats` times");

    engine_cls.def("leave_tensor_parallel", [](PyEngine& self) {
#ifdef BRRR_WITH_CUDA
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            brrr::cuda_leave_tensor_parallel(*self.impl);
        });
#else
        (void)self;
#endif
    }, "every rank of a tensor-parallel group together, before the engines are dropped: ends the "
       "one-shot all-reduce's IPC sharing cleanly (NCCL carries all-reduces afterwards); a no-op "
       "outside a group");

    engine_cls.def_property("profile_enabled",
        [](PyEngine& self) { return self.profiled && self.profiled->profile_enabled(); },
        [](PyEngine& self, bool on) {
            if (!self.profiled) throw std::runtime_error("this engine cannot be profiled");
            without_gil([&] {
                std::lock_guard<std::mutex> lock(self.mutex);
                self.profiled->profile_enable(on);
            });
        }, "time every kernel launch (and CUDA-graph replay) of this engine");
    engine_cls.def("profile_records", [](PyEngine& self) {
        std::vector<brrr::profile::Record> records;
        if (self.profiled)
            without_gil([&] {
                std::lock_guard<std::mutex> lock(self.mutex);
                records = self.profiled->profile_take();
            });
        py::list out;
        for (const brrr::profile::Record& r : records)
            out.append(py::make_tuple(r.name, brrr::profile::kind_name(r.kind),
                                      brrr::profile::op_class_name(r.op_class),
                                      brrr::profile::phase_name(r.phase), r.cost.flops, r.cost.bytes,
                                      r.t0, r.t1, r.group, r.sampled));
        return out;
    }, "the records so far as (name, kind, op_class, phase, flops, bytes, t0, t1, group, sampled); "
       "taking them empties the engine's list");
    engine_cls.def("profile_clear", [](PyEngine& self) {
        if (!self.profiled) return;
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.profiled->profile_take();
        });
    }, "drops every record not yet taken");
}

}  // namespace bindings
}  // namespace brrr
