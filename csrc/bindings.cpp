// bindings.cpp — the only pybind11 file: the Python face of the engine, with argument checks that
// name the parameter, its shape and what was expected. brrr::Error -> RuntimeError (ValueError
// for bad arguments), brrr::OutOfMemory -> MemoryError.
//
// Python API of llama_brrr._C:
//   cuda_compiled() -> bool                   built with nvcc
//   cuda_device_count() -> int                0 without a GPU or driver (never raises)
//   cpu_simd() -> str                         SIMD path the CPU kernels were built for
//   rope_inv_freq(config: dict) -> ndarray[f32 head_dim/2]   with the config's rope scaling
//   Engine(backend: "cpu"|"cuda", config: dict, dtype: "f32"|"f16"|"bf16", device: int = 0,
//          n_threads: int = 0)              config keys: ModelConfig.engine_dict(); the cpu
//                                            backend stores "f32" or "bf16", n_threads 0 = all
//     .config -> dict,  .backend -> str,  .dtype -> str
//     .set_weight(name, array, dtype)        array: C-contiguous numpy; dtype "f32"|"f16"|"bf16"
//                                            (bf16 arrays as their uint16 bits or ml_dtypes.bfloat16)
//     .get_weight(name) -> np.ndarray[f32]
//     .init_random(seed, std=0.02)
//     .prefill(slot, tokens[int32 T], start_pos=0, logits="last") -> ndarray | None
//        logits "all" -> [T, vocab], "last" -> [1, vocab] (either is what sample() then
//        draws from), "none" -> None: no LM head at all (sample() raises until the next call)
//     .decode(tokens[int32 B], slots[int32 B], positions[int32 B], logits=True) -> [B, vocab] | None
//        one token per sequence; each slot at most once per call
//     .sample(slots[int32 B], positions[int32 B], temperature[f32 B], top_k[int32 B],
//             top_p[f32 B], min_p[f32 B], repetition_penalty[f32 B], seed[uint64 B],
//             step[uint64 B]) -> (tokens[int32 B], logprobs[f32 B])
//        samples from the logits of the most recent prefill (B = 1) or decode (row i = sequence i);
//        repetition penalty covers the slot's tokens at positions [0, positions[i]]; rules in
//        csrc/cpu/sampling.h
//   cpu_ops: the CPU kernels on numpy float32 arrays, for tests; `out=` takes a preallocated
//   (e.g. NaN-poisoned) result array
//     rmsnorm(x[M, D], w[D], eps, out=None) -> [M, D]
//     matmul(x[M, K], w[N, K], w_dtype="f32"|"bf16", out=None, accumulate=False) -> [M, N]
//     rope(x[M, W], positions[int32 M], inv_freq[hd/2], n_heads, head_dim) -> rotated copy
//     attention(q[M, H*hd], k_cache[S, KV*hd], v_cache[S, KV*hd], positions[int32 M], n_heads,
//               n_kv_heads, head_dim, out=None) -> [M, H*hd]   row m sees cache rows [0, pos[m]]
//     swiglu(h13[M, 2H], out=None) -> [M, H]
//     sample_row(logits[V], history[int32 n], temperature=0, top_k=0, top_p=1, min_p=0,
//                repetition_penalty=1, seed=0, step=0) -> (token, logprob)
//   cuda_ops: the CUDA launchers on device pointers (ints, e.g. torch's data_ptr()), for tests
//
// Errors: bad arguments -> ValueError (missing config keys -> KeyError), naming the argument;
// engine failures -> RuntimeError; allocation failures -> MemoryError with the bytes.

#include <exception>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/engine_cpu.h"
#include "cpu/kernels.h"
#include "cpu/sampling.h"
#include "cpu/simd.h"
#include "model.h"
#include "profile/profile.h"

#ifdef BRRR_WITH_CUDA
#include "cuda/engine_cuda.h"
#include "cuda/ops.h"
#endif

namespace py = pybind11;

void bind_quant_ops(py::module_& m);  // csrc/bindings/quant_ops.cpp

namespace {

// Rounds one Engine.decode_steps call may run (CudaEngine::kMaxDecodeSteps, its token ring).
constexpr int64_t kMaxDecodeSteps = 64;

// ---- argument checking ------------------------------------------------------------------------
// Arguments are checked here, before any backend sees them, so both backends raise the same
// ValueError for the same mistake; the engines check again for their C++ callers.

[[noreturn]] void bad_argument(const std::string& message) { throw py::value_error(message); }

std::string shape_of(const py::array& a) {
    brrr::Message s;
    s << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    s << (a.ndim() == 1 ? ",)" : ")");
    return s.str();
}

std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// `obj` as a C-contiguous numpy array of T with shape.size() dims, each matching `shape` where
// that entry is >= 0 (-1: any length). The message names the argument, what was expected and
// what came.
template <typename T>
py::array_t<T> checked_array(const py::handle& obj, const char* name, std::vector<py::ssize_t> shape,
                             const char* expected) {
    if (!py::isinstance<py::array>(obj))
        bad_argument(std::string(name) + " must be a numpy array (" + expected + "), got " +
                     py::str(py::type::of(obj)).cast<std::string>());
    py::array a = py::reinterpret_borrow<py::array>(obj);
    bool ok = py::isinstance<py::array_t<T>>(a) && (a.flags() & py::array::c_style) &&
              a.ndim() == (py::ssize_t)shape.size();
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
    if (!ok) {
        brrr::Message s;
        s << name << " must be a C-contiguous " << expected << "; got a "
          << ((a.flags() & py::array::c_style) ? "" : "non-contiguous ") << dtype_of(a)
          << " array of shape " << shape_of(a);
        bad_argument(s.str());
    }
    return py::reinterpret_borrow<py::array_t<T>>(a);
}

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
    return d;
}

brrr::DType parse_dtype(const std::string& s, const char* what) {
    if (s == "f32" || s == "float32") return brrr::DType::F32;
    if (s == "f16" || s == "float16") return brrr::DType::F16;
    if (s == "bf16" || s == "bfloat16") return brrr::DType::BF16;
    bad_argument(std::string(what) + " must be \"f32\", \"f16\" or \"bf16\", got \"" + s + "\"");
}

// ---- the engine handle ------------------------------------------------------------------------

std::unique_ptr<brrr::Engine> make_engine(const std::string& backend, const brrr::Config& cfg,
                                          brrr::DType dtype, int device, int n_threads) {
    if (backend == "cpu") {
        if (dtype == brrr::DType::F16)
            bad_argument("the CPU engine stores weights as \"f32\" or \"bf16\" (f16 inputs are "
                         "converted); dtype \"f16\" is for the cuda backend");
        if (device != 0) bad_argument("device must be 0 for the cpu backend, got " + std::to_string(device));
        if (n_threads < 0) bad_argument("n_threads must be >= 0 (0 = all cores), got " + std::to_string(n_threads));
        return std::make_unique<brrr::cpu::CpuEngine>(cfg, dtype, n_threads);
    }
    if (backend == "cuda") {
#ifdef BRRR_WITH_CUDA
        if (device < 0) bad_argument("device must be >= 0, got " + std::to_string(device));
        return brrr::make_cuda_engine(cfg, dtype, device);
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

    void check_slot(int64_t slot, const char* what) const {
        if (slot < 0 || slot >= cfg().max_batch)
            bad_argument(std::string(what) + " " + std::to_string(slot) + " is out of range: the "
                         "engine has max_batch = " + std::to_string(cfg().max_batch) +
                         " KV slots (0.." + std::to_string(cfg().max_batch - 1) + ")");
    }
    void check_tokens(const int32_t* tokens, py::ssize_t n, const char* what) const {
        for (py::ssize_t i = 0; i < n; ++i)
            if (tokens[i] < 0 || tokens[i] >= cfg().vocab_size)
                bad_argument(std::string(what) + "[" + std::to_string(i) + "] = token id " +
                             std::to_string(tokens[i]) + " is out of range for vocab_size " +
                             std::to_string(cfg().vocab_size));
    }
    // Every row of a batch call: a valid slot (each at most once) and a position in the context.
    void check_rows(const int32_t* slots, const int32_t* positions, py::ssize_t n) const {
        for (py::ssize_t i = 0; i < n; ++i) {
            check_slot(slots[i], ("slots[" + std::to_string(i) + "] =").c_str());
            for (py::ssize_t j = 0; j < i; ++j)
                if (slots[j] == slots[i])
                    bad_argument("slot " + std::to_string(slots[i]) + " appears twice (slots[" +
                                 std::to_string(j) + "] and slots[" + std::to_string(i) + "])");
            if (positions[i] < 0)
                bad_argument("positions[" + std::to_string(i) + "] = " + std::to_string(positions[i]) +
                             " must be >= 0");
            if (positions[i] >= cfg().max_seq_len)
                bad_argument("context is full: positions[" + std::to_string(i) + "] = " +
                             std::to_string(positions[i]) + " but max_seq_len is " +
                             std::to_string(cfg().max_seq_len) +
                             " (create the engine with a larger max_seq_len)");
        }
    }
    void check_batch(py::ssize_t batch) const {
        if (batch < 1 || batch > cfg().max_batch)
            bad_argument("batch size " + std::to_string(batch) + " must be in [1, max_batch = " +
                         std::to_string(cfg().max_batch) + "]");
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

// ---- cpu_ops helpers ----------------------------------------------------------------------------

// `out` as a checked [rows, cols] float32 array, or a new one when None.
py::array_t<float> output_array(const py::object& out, py::ssize_t rows, py::ssize_t cols) {
    if (out.is_none()) return py::array_t<float>({rows, cols});
    return checked_array<float>(out, "out", {rows, cols}, "float32 array matching the result shape");
}

std::vector<py::ssize_t> dims(const py::array& a) {
    return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}


// Runs f with the GIL released. An engine error is carried out of the GIL-free region and
// rethrown once the GIL is held again, so unwinding never crosses the release guard.
template <class F>
void without_gil(F&& f) {
    std::exception_ptr error;
    {
        py::gil_scoped_release release;
        try {
            f();
        } catch (...) {
            error = std::current_exception();
        }
    }
    if (error) std::rethrow_exception(error);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "llama_brrr engine (C++ core); see csrc/bindings.cpp for the API";
    bind_quant_ops(m);

    // brrr::OutOfMemory derives from brrr::Error, so it must be matched first.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const brrr::OutOfMemory& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
        } catch (const brrr::Error& e) {
            PyErr_SetString(PyExc_RuntimeError, e.what());
        }
    });

    m.def("cuda_compiled", [] {
#ifdef BRRR_WITH_CUDA
        return true;
#else
        return false;
#endif
    }, "True when this build includes the CUDA backend");
#ifndef BRRR_WITH_CUDA
    m.def("cuda_device_count", [] { return 0; }, "Usable CUDA devices: always 0 in a CPU-only build");
#endif
    m.def("cpu_simd", [] { return std::string(brrr::cpu::kSimdName); },
          "The SIMD path the CPU kernels were compiled for: avx512, avx2 or scalar");
    m.def("rope_inv_freq", [](const py::dict& config) {
        const std::vector<float> f = brrr::rope_inv_freq(config_from_dict(config));
        py::array_t<float> out((py::ssize_t)f.size());
        std::copy(f.begin(), f.end(), out.mutable_data());
        return out;
    }, py::arg("config"), "RoPE inverse frequencies [head_dim/2] with the config's scaling");

    // ---- Engine ---------------------------------------------------------------------------------
    py::class_<PyEngine> engine_cls(m, "Engine", "One model's weights, KV cache and forward pass");
    engine_cls.def(py::init([](const std::string& backend, const py::dict& config,
                               const std::string& dtype, int device, int n_threads) {
        const brrr::Config cfg = config_from_dict(config);
        auto e = std::make_unique<PyEngine>();
        e->backend = backend;
        e->dtype = parse_dtype(dtype, "dtype");
        e->impl = make_engine(backend, cfg, e->dtype, device, n_threads);
        e->profiled = dynamic_cast<brrr::profile::Profiled*>(e->impl.get());
        return e;
    }), py::arg("backend"), py::arg("config"), py::arg("dtype"), py::arg("device") = 0,
       py::arg("n_threads") = 0);
    engine_cls.def_property_readonly("config", [](PyEngine& self) { return config_to_dict(self.cfg()); });
    engine_cls.def_property_readonly("backend", [](PyEngine& self) { return self.backend; });
    engine_cls.def_property_readonly("dtype", [](PyEngine& self) { return std::string(brrr::dtype_name(self.dtype)); });

    engine_cls.def("set_weight", [](PyEngine& self, const std::string& name, const py::array& array,
                                    const std::string& dtype) {
        std::vector<int64_t> expected;
        try {
            expected = brrr::weight_shape(self.cfg(), name);
        } catch (const brrr::Error& e) {
            bad_argument(e.what());
        }
        const brrr::DType t = weight_array_dtype(array, dtype, name);
        const std::vector<py::ssize_t> d = dims(array);
        const std::vector<int64_t> shape(d.begin(), d.end());
        if (shape != expected) {
            brrr::Message s;
            s << "weight '" << name << "' has shape " << shape_of(array) << " but the config expects (";
            for (size_t i = 0; i < expected.size(); ++i) s << (i ? ", " : "") << expected[i];
            s << (expected.size() == 1 ? ",)" : ")");
            bad_argument(s.str());
        }
        const void* src = array.data();
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.mutex);
        self.impl->set_weight(name, src, t, shape);
    }, py::arg("name"), py::arg("array"), py::arg("dtype"));

    engine_cls.def("get_weight", [](PyEngine& self, const std::string& name) {
        std::vector<int64_t> shape;
        try {
            shape = brrr::weight_shape(self.cfg(), name);
        } catch (const brrr::Error& e) {
            bad_argument(e.what());
        }
        py::array_t<float> out(std::vector<py::ssize_t>(shape.begin(), shape.end()));
        float* dst = out.mutable_data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            self.impl->get_weight(name, dst);
        });
        return out;
    }, py::arg("name"));

    engine_cls.def("init_random", [](PyEngine& self, uint64_t seed, float std) {
        if (!(std::isfinite(std) && std >= 0)) bad_argument("std must be a finite number >= 0");
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(self.mutex);
        self.impl->init_random(seed, std);
    }, py::arg("seed"), py::arg("std") = 0.02f);

    engine_cls.def("prefill", [](PyEngine& self, int64_t slot, const py::object& tokens,
                                 int64_t start_pos, const std::string& logits) -> py::object {
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (T,)");
        const py::ssize_t T = tok.shape(0);
        const int V = self.cfg().vocab_size;
        if (T < 1) bad_argument("tokens must hold at least one token");
        self.check_slot(slot, "slot");
        if (start_pos < 0) bad_argument("start_pos must be >= 0, got " + std::to_string(start_pos));
        if (start_pos + T > self.cfg().max_seq_len)
            bad_argument("context is full: " + std::to_string(T) + " tokens at start_pos " +
                         std::to_string(start_pos) + " need " + std::to_string(start_pos + T) +
                         " positions but max_seq_len is " + std::to_string(self.cfg().max_seq_len) +
                         " (create the engine with a larger max_seq_len)");
        self.check_tokens(tok.data(), T, "tokens");
        if (logits != "none" && logits != "last" && logits != "all")
            bad_argument("logits must be \"none\", \"last\" or \"all\", got \"" + logits + "\"");
        py::object result = py::none();
        float* out = nullptr;
        if (logits != "none") {
            py::array_t<float> arr({logits == "all" ? T : (py::ssize_t)1, (py::ssize_t)V});
            out = arr.mutable_data();
            result = arr;
        }
        const int32_t* ids = tok.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->prefill((int)slot, ids, (int)T, (int)start_pos, out, logits == "all");
            self.record_call("prefill", brrr::profile::Phase::Prefill, t0);
        });
        return result;
    }, py::arg("slot"), py::arg("tokens"), py::arg("start_pos") = 0, py::arg("logits") = "last");

    engine_cls.def("decode", [](PyEngine& self, const py::object& tokens, const py::object& slots,
                                const py::object& positions, bool logits) -> py::object {
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (B,)");
        const py::ssize_t B = tok.shape(0);
        auto sl = checked_array<int32_t>(slots, "slots", {B}, "int32 array of shape (B,) like tokens");
        auto pos = checked_array<int32_t>(positions, "positions", {B}, "int32 array of shape (B,) like tokens");
        self.check_batch(B);
        self.check_rows(sl.data(), pos.data(), B);
        self.check_tokens(tok.data(), B, "tokens");
        py::object result = py::none();
        float* out = nullptr;
        if (logits) {
            py::array_t<float> arr({B, (py::ssize_t)self.cfg().vocab_size});
            out = arr.mutable_data();
            result = arr;
        }
        const int32_t *t = tok.data(), *s = sl.data(), *p = pos.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->decode(t, s, p, (int)B, out);
            self.record_call("decode", brrr::profile::Phase::Decode, t0);
        });
        return result;
    }, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("logits") = true);

    engine_cls.def("sample", [](PyEngine& self, const py::object& slots, const py::object& positions,
                                const py::object& temperature, const py::object& top_k,
                                const py::object& top_p, const py::object& min_p,
                                const py::object& repetition_penalty, const py::object& seed,
                                const py::object& step) {
        auto sl = checked_array<int32_t>(slots, "slots", {-1}, "int32 array of shape (B,)");
        const py::ssize_t B = sl.shape(0);
        auto pos = checked_array<int32_t>(positions, "positions", {B}, "int32 array of shape (B,)");
        auto temp = checked_array<float>(temperature, "temperature", {B}, "float32 array of shape (B,)");
        auto tk = checked_array<int32_t>(top_k, "top_k", {B}, "int32 array of shape (B,)");
        auto tp = checked_array<float>(top_p, "top_p", {B}, "float32 array of shape (B,)");
        auto mp = checked_array<float>(min_p, "min_p", {B}, "float32 array of shape (B,)");
        auto rp = checked_array<float>(repetition_penalty, "repetition_penalty", {B}, "float32 array of shape (B,)");
        auto sd = checked_array<uint64_t>(seed, "seed", {B}, "uint64 array of shape (B,)");
        auto st = checked_array<uint64_t>(step, "step", {B}, "uint64 array of shape (B,)");
        self.check_batch(B);
        self.check_rows(sl.data(), pos.data(), B);
        std::vector<brrr::SamplingParams> params(B);
        for (py::ssize_t i = 0; i < B; ++i) {
            brrr::SamplingParams& p = params[i];
            p.temperature = temp.data()[i];
            p.top_k = tk.data()[i];
            p.top_p = tp.data()[i];
            p.min_p = mp.data()[i];
            p.repetition_penalty = rp.data()[i];
            p.seed = sd.data()[i];
            const std::string problem = brrr::cpu::sampling_params_problem(p);
            if (!problem.empty()) bad_argument("sampling row " + std::to_string(i) + ": " + problem);
        }
        py::array_t<int32_t> tokens(B);
        py::array_t<float> logprobs(B);
        int32_t* tok_out = tokens.mutable_data();
        float* lp_out = logprobs.mutable_data();
        const int32_t *s = sl.data(), *p = pos.data();
        const uint64_t* steps = st.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->sample(s, p, params.data(), steps, (int)B, tok_out, lp_out);
            self.record_call("sample", brrr::profile::Phase::Sample, t0);
        });
        return py::make_tuple(tokens, logprobs);
    }, py::arg("slots"), py::arg("positions"), py::arg("temperature"), py::arg("top_k"),
       py::arg("top_p"), py::arg("min_p"), py::arg("repetition_penalty"), py::arg("seed"),
       py::arg("step"));

    engine_cls.def("decode_steps", [](PyEngine& self, const py::object& tokens, const py::object& slots,
                                      const py::object& positions, const py::object& temperature,
                                      const py::object& top_k, const py::object& top_p,
                                      const py::object& min_p, const py::object& repetition_penalty,
                                      const py::object& seed, const py::object& step, int64_t n_steps) {
        auto tok = checked_array<int32_t>(tokens, "tokens", {-1}, "int32 array of shape (B,)");
        const py::ssize_t B = tok.shape(0);
        auto sl = checked_array<int32_t>(slots, "slots", {B}, "int32 array of shape (B,) like tokens");
        auto pos = checked_array<int32_t>(positions, "positions", {B}, "int32 array of shape (B,) like tokens");
        auto temp = checked_array<float>(temperature, "temperature", {B}, "float32 array of shape (B,)");
        auto tk = checked_array<int32_t>(top_k, "top_k", {B}, "int32 array of shape (B,)");
        auto tp = checked_array<float>(top_p, "top_p", {B}, "float32 array of shape (B,)");
        auto mp = checked_array<float>(min_p, "min_p", {B}, "float32 array of shape (B,)");
        auto rp = checked_array<float>(repetition_penalty, "repetition_penalty", {B}, "float32 array of shape (B,)");
        auto sd = checked_array<uint64_t>(seed, "seed", {B}, "uint64 array of shape (B,)");
        auto st = checked_array<uint64_t>(step, "step", {B}, "uint64 array of shape (B,)");
        self.check_batch(B);
        if (n_steps < 1 || n_steps > kMaxDecodeSteps)
            bad_argument("n_steps must be in [1, " + std::to_string(kMaxDecodeSteps) + "], got " +
                         std::to_string(n_steps));
        self.check_rows(sl.data(), pos.data(), B);
        for (py::ssize_t i = 0; i < B; ++i)
            if (pos.data()[i] + n_steps - 1 >= self.cfg().max_seq_len)
                bad_argument("context is full: positions[" + std::to_string(i) + "] = " +
                             std::to_string(pos.data()[i]) + " leaves room for " +
                             std::to_string(self.cfg().max_seq_len - pos.data()[i]) + " of the " +
                             std::to_string(n_steps) + " steps asked for (max_seq_len is " +
                             std::to_string(self.cfg().max_seq_len) + ")");
        self.check_tokens(tok.data(), B, "tokens");
        std::vector<brrr::SamplingParams> params(B);
        for (py::ssize_t i = 0; i < B; ++i) {
            brrr::SamplingParams& p = params[i];
            p.temperature = temp.data()[i];
            p.top_k = tk.data()[i];
            p.top_p = tp.data()[i];
            p.min_p = mp.data()[i];
            p.repetition_penalty = rp.data()[i];
            p.seed = sd.data()[i];
            const std::string problem = brrr::cpu::sampling_params_problem(p);
            if (!problem.empty()) bad_argument("sampling row " + std::to_string(i) + ": " + problem);
        }
        py::array_t<int32_t> out_tokens({(py::ssize_t)n_steps, B});
        py::array_t<float> out_logprobs({(py::ssize_t)n_steps, B});
        int32_t* tok_out = out_tokens.mutable_data();
        float* lp_out = out_logprobs.mutable_data();
        const int32_t *t = tok.data(), *s = sl.data(), *p = pos.data();
        const uint64_t* steps = st.data();
        without_gil([&] {
            std::lock_guard<std::mutex> lock(self.mutex);
            const double t0 = brrr::profile::now();
            self.impl->decode_steps(t, s, p, params.data(), steps, (int)B, (int)n_steps, tok_out, lp_out);
            self.record_call("decode_steps", brrr::profile::Phase::Decode, t0);
        });
        return py::make_tuple(out_tokens, out_logprobs);
    }, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("temperature"),
       py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("repetition_penalty"),
       py::arg("seed"), py::arg("step"), py::arg("n_steps"),
       "n_steps rounds of decode + sample, each round's tokens fed back as the next round's inputs "
       "(on the device for CUDA); returns (tokens, logprobs), each of shape (n_steps, B)");

    // ---- profiling (llama_brrr/profiler.py reads these) -------------------------------------------
    //   profile_now() -> float                 seconds on the clock every record uses (steady_clock)
    //   Engine.profile_enabled (read/write)    on: every launch is timed (see csrc/profile/profile.h)
    //   Engine.profile_records() -> list of (name, kind, op_class, phase, flops, bytes, t0, t1,
    //        group, sampled), oldest first; the engine's records are handed over and forgotten
    //   Engine.profile_clear()                 drops the records without reading them
    m.def("profile_now", [] { return brrr::profile::now(); },
          "Seconds on the host steady_clock, the timeline of every profile record");
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

#ifndef BRRR_WITH_CUDA
    // The CUDA build defines this property in its region; here it exists so callers need not
    // know the build. No engine of a CPU-only build has graphs.
    engine_cls.def_property("use_cuda_graphs", [](PyEngine&) { return false; },
                            [](PyEngine&, bool) {},
                            "cuda backend only: replay CUDA graphs in decode; always False here");
#endif

    // ---- cpu_ops: the CPU kernels on numpy arrays (tests) ----------------------------------------
    // Each returns a new float32 array, or writes into `out` when given (tests pass NaN-poisoned
    // arrays there to catch unwritten elements).
    py::module_ ops = m.def_submodule("cpu_ops", "CPU kernels on numpy float32 arrays, for tests");

    ops.def("rmsnorm", [](const py::object& x, const py::object& w, float eps, const py::object& out) {
        auto xa = checked_array<float>(x, "x", {-1, -1}, "float32 array of shape (M, D)");
        const py::ssize_t M = xa.shape(0), D = xa.shape(1);
        auto wa = checked_array<float>(w, "w", {D}, "float32 array of shape (D,)");
        auto y = output_array(out, M, D);
        const float *xp = xa.data(), *wp = wa.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::cpu::rmsnorm(xp, wp, yp, (int)M, (int)D, eps);
        return y;
    }, py::arg("x"), py::arg("w"), py::arg("eps"), py::arg("out") = py::none(),
       "y = x * rsqrt(mean(x^2) + eps) * w, row by row");

    ops.def("matmul", [](const py::object& x, const py::array& w, const std::string& w_dtype,
                         const py::object& out, bool accumulate) {
        auto xa = checked_array<float>(x, "x", {-1, -1}, "float32 array of shape (M, K)");
        const py::ssize_t M = xa.shape(0), K = xa.shape(1);
        const brrr::DType t = parse_dtype(w_dtype, "w_dtype");
        if (t == brrr::DType::F16) bad_argument("w_dtype must be \"f32\" or \"bf16\" on the CPU");
        const std::string got = dtype_of(w);
        const bool dtype_ok = t == brrr::DType::F32 ? py::isinstance<py::array_t<float>>(w)
                                                    : w.itemsize() == 2 && (got == "uint16" || got == "bfloat16");
        if (!dtype_ok || w.ndim() != 2 || w.shape(1) != K || !(w.flags() & py::array::c_style))
            bad_argument("w must be a C-contiguous (N, K=" + std::to_string(K) + ") array of " +
                         (t == brrr::DType::F32 ? "float32" : "bf16 bits (uint16 or ml_dtypes.bfloat16)") +
                         "; got " + got + " of shape " + shape_of(w));
        const py::ssize_t N = w.shape(0);
        if (accumulate && out.is_none()) bad_argument("accumulate=True needs out (the array to add into)");
        auto y = output_array(out, M, N);
        const float* xp = xa.data();
        const void* wp = w.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::cpu::matmul(xp, wp, t, yp, (int)M, (int)N, (int)K, accumulate);
        return y;
    }, py::arg("x"), py::arg("w"), py::arg("w_dtype") = "f32", py::arg("out") = py::none(),
       py::arg("accumulate") = false, "y = x @ w.T (y += x @ w.T with accumulate=True)");

    ops.def("rope", [](const py::object& x, const py::object& positions, const py::object& inv_freq,
                       int n_heads, int head_dim) {
        auto xa = checked_array<float>(x, "x", {-1, -1}, "float32 array of shape (M, width)");
        const py::ssize_t M = xa.shape(0), width = xa.shape(1);
        if (n_heads < 1 || head_dim < 2 || head_dim % 2 || (py::ssize_t)n_heads * head_dim > width)
            bad_argument("need n_heads >= 1, an even head_dim and n_heads * head_dim <= x.shape[1]; "
                         "got n_heads=" + std::to_string(n_heads) + ", head_dim=" +
                         std::to_string(head_dim) + ", x.shape[1]=" + std::to_string(width));
        auto pos = checked_array<int32_t>(positions, "positions", {M}, "int32 array of shape (M,)");
        auto freq = checked_array<float>(inv_freq, "inv_freq", {head_dim / 2}, "float32 array of shape (head_dim/2,)");
        py::array_t<float> y({M, width});
        std::copy(xa.data(), xa.data() + M * width, y.mutable_data());
        const int32_t* pp = pos.data();
        const float* fp = freq.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        std::vector<float> cos((size_t)M * (head_dim / 2)), sin(cos.size());
        brrr::cpu::rope_tables(pp, fp, (int)M, head_dim / 2, cos.data(), sin.data());
        brrr::cpu::rope(yp, (int)M, (int)width, n_heads, head_dim, cos.data(), sin.data());
        return y;
    }, py::arg("x"), py::arg("positions"), py::arg("inv_freq"), py::arg("n_heads"), py::arg("head_dim"),
       "x with the first n_heads heads of each row rotated (rotate-half) by its position");

    ops.def("attention", [](const py::object& q, const py::object& k_cache, const py::object& v_cache,
                            const py::object& positions, int n_heads, int n_kv_heads, int head_dim,
                            const py::object& out) {
        if (n_heads < 1 || n_kv_heads < 1 || head_dim < 1 || n_heads % n_kv_heads)
            bad_argument("need n_heads a positive multiple of n_kv_heads >= 1 and head_dim >= 1");
        auto qa = checked_array<float>(q, "q", {-1, (py::ssize_t)n_heads * head_dim},
                                       "float32 array of shape (M, n_heads*head_dim)");
        const py::ssize_t M = qa.shape(0);
        auto ka = checked_array<float>(k_cache, "k_cache", {-1, (py::ssize_t)n_kv_heads * head_dim},
                                       "float32 array of shape (S, n_kv_heads*head_dim)");
        const py::ssize_t S = ka.shape(0);
        auto va = checked_array<float>(v_cache, "v_cache", {S, (py::ssize_t)n_kv_heads * head_dim},
                                       "float32 array shaped like k_cache");
        auto pos = checked_array<int32_t>(positions, "positions", {M}, "int32 array of shape (M,)");
        for (py::ssize_t i = 0; i < M; ++i)
            if (pos.data()[i] < 0 || pos.data()[i] >= S)
                bad_argument("positions[" + std::to_string(i) + "] = " + std::to_string(pos.data()[i]) +
                             " is outside the cache [0, " + std::to_string(S) + ")");
        auto y = output_array(out, M, (py::ssize_t)n_heads * head_dim);
        const std::vector<int32_t> slots(M, 0);
        const float *qp = qa.data(), *kp = ka.data(), *vp = va.data();
        const int32_t* pp = pos.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::cpu::attention(qp, n_heads * head_dim, kp, vp, 0, n_kv_heads * head_dim, slots.data(), pp,
                             yp, (int)M, n_heads, n_kv_heads, head_dim);
        return y;
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"), py::arg("n_heads"),
       py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("out") = py::none(),
       "causal GQA attention: row m attends to cache rows [0, positions[m]]");

    ops.def("swiglu", [](const py::object& h13, const py::object& out) {
        auto ha = checked_array<float>(h13, "h13", {-1, -1}, "float32 array of shape (M, 2H)");
        const py::ssize_t M = ha.shape(0), H = ha.shape(1) / 2;
        if (ha.shape(1) % 2) bad_argument("h13 must have an even number of columns (gate | up)");
        auto y = output_array(out, M, H);
        const float* hp = ha.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::cpu::swiglu(hp, yp, (int)M, (int)H);
        return y;
    }, py::arg("h13"), py::arg("out") = py::none(), "silu(gate) * up on gate|up rows");

    ops.def("sample_row", [](const py::object& logits, const py::object& history, float temperature,
                             int top_k, float top_p, float min_p, float repetition_penalty,
                             uint64_t seed, uint64_t step) {
        auto la = checked_array<float>(logits, "logits", {-1}, "float32 array of shape (V,)");
        auto ha = checked_array<int32_t>(history, "history", {-1}, "int32 array of token ids");
        const py::ssize_t V = la.shape(0), n = ha.shape(0);
        if (V < 1) bad_argument("logits must not be empty");
        for (py::ssize_t i = 0; i < n; ++i)
            if (ha.data()[i] >= V)
                bad_argument("history[" + std::to_string(i) + "] = " + std::to_string(ha.data()[i]) +
                             " is out of range for " + std::to_string(V) + " logits");
        brrr::SamplingParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.repetition_penalty = repetition_penalty;
        p.seed = seed;
        const std::string problem = brrr::cpu::sampling_params_problem(p);
        if (!problem.empty()) bad_argument(problem);
        static thread_local brrr::cpu::SampleScratch scratch;
        float logprob = 0.f;
        const float* lp = la.data();
        const int32_t* hp = ha.data();
        int32_t token;
        {
            py::gil_scoped_release release;
            token = brrr::cpu::sample_row(lp, (int)V, hp, (int)n, p, step, scratch, &logprob);
        }
        return py::make_tuple(token, logprob);
    }, py::arg("logits"), py::arg("history"), py::arg("temperature") = 0.f, py::arg("top_k") = 0,
       py::arg("top_p") = 1.f, py::arg("min_p") = 0.f, py::arg("repetition_penalty") = 1.f,
       py::arg("seed") = 0, py::arg("step") = 0,
       "(token, logprob) by the engine's sampling rules (csrc/cpu/sampling.h)");

    // What the CUDA region below may use: `m`, `engine_cls` (py::class_<PyEngine>; the backend
    // engine is `self.impl`), and the helpers of the anonymous namespace above (checked_array,
    // bad_argument, config_from_dict, parse_dtype, PyEngine::check_*).

#ifdef BRRR_WITH_CUDA
    // ==== CUDA region begin ====
    // ---- cuda engine + cuda_ops (norm/rope/embed/sampling/init) ----
    m.def("cuda_device_count", [] { return brrr::cuda_device_count(); },
          "Usable CUDA devices; 0 without a GPU or driver (never raises)");
    engine_cls.def_property(
        "use_cuda_graphs", [](PyEngine& self) { return brrr::cuda_use_graphs(*self.impl); },
        [](PyEngine& self, bool on) {
            std::lock_guard<std::mutex> lock(self.mutex);
            brrr::cuda_set_use_graphs(*self.impl, on);
        },
        "cuda backend: decode replays one CUDA graph per batch size (default True); False runs "
        "every kernel eagerly. Always False, and setting it does nothing, on the cpu backend");

    // cuda_ops: each launcher on device pointers (Python ints, e.g. torch's data_ptr()) on the
    // current device's default stream, then a device synchronize, so a failing kernel raises
    // here (RuntimeError naming it) rather than in a later, unrelated call. Tests only.
    py::module_ cuda_ops = m.def_submodule("cuda_ops", "CUDA launchers on device pointers, for tests");
    struct CudaOp {
        static void* ptr(uintptr_t address, const char* name) {
            if (address == 0) bad_argument(std::string(name) + " must be a device pointer, got 0");
            return reinterpret_cast<void*>(address);
        }
        static void check_sizes(std::initializer_list<std::pair<const char*, int64_t>> sizes) {
            for (const auto& s : sizes)
                if (s.second < 0 || s.second > std::numeric_limits<int>::max())
                    bad_argument(std::string(s.first) + " must be in [0, 2^31), got " +
                                 std::to_string(s.second));
        }
        // A CUDA error as the engine reports it: RuntimeError, MemoryError for an allocation.
        static void check(cudaError_t err, const char* op) {
            if (err == cudaSuccess) return;
            cudaGetLastError();
            const std::string message = std::string(op) + ": " + cudaGetErrorName(err) + " (" +
                                        cudaGetErrorString(err) + ")";
            if (err == cudaErrorMemoryAllocation) throw brrr::OutOfMemory(message);
            throw brrr::Error(message);
        }
        static void finish(const char* op) {
            check(cudaGetLastError(), op);
            check(cudaDeviceSynchronize(), op);
        }
    };

    cuda_ops.def("embed", [](uintptr_t tokens, uintptr_t table, uintptr_t x, int64_t M, int64_t D,
                             int64_t V, uintptr_t history, uintptr_t slots, uintptr_t positions,
                             int64_t max_batch, int64_t max_seq) {
        CudaOp::check_sizes({{"M", M}, {"D", D}, {"V", V}, {"max_batch", max_batch}, {"max_seq", max_seq}});
        brrr::cuda::TokenHistory record;
        if (history) {
            if (max_batch < 1 || max_seq < 1)
                bad_argument("a token history needs max_batch >= 1 and max_seq >= 1, got " +
                             std::to_string(max_batch) + " and " + std::to_string(max_seq));
            record.history = static_cast<int*>(CudaOp::ptr(history, "history"));
            record.slots = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
            record.positions = static_cast<const int*>(CudaOp::ptr(positions, "positions"));
            record.max_batch = (int)max_batch;
            record.max_seq = (int)max_seq;
        }
        py::gil_scoped_release release;
        brrr::cuda::embed(static_cast<const int*>(CudaOp::ptr(tokens, "tokens")),
                          static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(table, "table")),
                          static_cast<float*>(CudaOp::ptr(x, "x")), (int)M, (int)D, (int)V, record, 0);
        CudaOp::finish("cuda_ops.embed");
    }, py::arg("tokens"), py::arg("table"), py::arg("x"), py::arg("M"), py::arg("D"), py::arg("V"),
       py::arg("history") = 0, py::arg("slots") = 0, py::arg("positions") = 0, py::arg("max_batch") = 0,
       py::arg("max_seq") = 0,
       "x[m] = float(table[tokens[m]]); tokens int32 [M], table bf16 [V, D], x f32 [M, D]; with a "
       "history (int32 [max_batch, max_seq]) also history[slots[m], positions[m]] = tokens[m]");

    cuda_ops.def("rmsnorm_residual", [](uintptr_t x, uintptr_t residual, uintptr_t w, uintptr_t y,
                                        int64_t M, int64_t D, float eps) {
        CudaOp::check_sizes({{"M", M}, {"D", D}});
        if (!(eps > 0)) bad_argument("eps must be > 0, got " + std::to_string(eps));
        py::gil_scoped_release release;
        brrr::cuda::rmsnorm_residual(static_cast<float*>(CudaOp::ptr(x, "x")),
                                     residual ? reinterpret_cast<const float*>(residual) : nullptr,
                                     static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(w, "w")),
                                     static_cast<brrr::cuda::bf16*>(CudaOp::ptr(y, "y")), (int)M, (int)D, eps, 0);
        CudaOp::finish("cuda_ops.rmsnorm_residual");
    }, py::arg("x"), py::arg("residual"), py::arg("w"), py::arg("y"), py::arg("M"), py::arg("D"),
       py::arg("eps"),
       "x += residual (residual = 0: none); y = bf16(x * rsqrt(mean(x^2) + eps) * w); x f32 [M, D]");

    cuda_ops.def("rope_kv_append", [](uintptr_t qkv, uintptr_t positions, uintptr_t slots,
                                      uintptr_t inv_freq, uintptr_t q_out, uintptr_t k_cache,
                                      uintptr_t v_cache, int64_t M, int64_t n_heads,
                                      int64_t n_kv_heads, int64_t head_dim, int64_t max_seq) {
        CudaOp::check_sizes({{"M", M}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
                             {"head_dim", head_dim}, {"max_seq", max_seq}});
        py::gil_scoped_release release;
        brrr::cuda::rope_kv_append(
            static_cast<const float*>(CudaOp::ptr(qkv, "qkv")), static_cast<const int*>(CudaOp::ptr(positions, "positions")),
            static_cast<const int*>(CudaOp::ptr(slots, "slots")), static_cast<const float*>(CudaOp::ptr(inv_freq, "inv_freq")),
            static_cast<brrr::cuda::bf16*>(CudaOp::ptr(q_out, "q_out")),
            static_cast<brrr::cuda::bf16*>(CudaOp::ptr(k_cache, "k_cache")),
            static_cast<brrr::cuda::bf16*>(CudaOp::ptr(v_cache, "v_cache")), (int)M, (int)n_heads,
            (int)n_kv_heads, (int)head_dim, (int)max_seq, 0);
        CudaOp::finish("cuda_ops.rope_kv_append");
    }, py::arg("qkv"), py::arg("positions"), py::arg("slots"), py::arg("inv_freq"), py::arg("q_out"),
       py::arg("k_cache"), py::arg("v_cache"), py::arg("M"), py::arg("n_heads"),
       py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("max_seq"),
       "rotate-half RoPE of q and k from qkv f32 [M, (Hq+2Hkv)*hd]; q_out bf16 [M, Hq, hd]; k, v "
       "into bf16 caches [max_batch, max_seq, Hkv, hd] at (slots[m], positions[m])");

    cuda_ops.def("sample_tokens", [](uintptr_t logits, uintptr_t history, uintptr_t slots,
                                     uintptr_t positions, const py::object& temperature,
                                     const py::object& top_k, const py::object& top_p,
                                     const py::object& min_p, const py::object& repetition_penalty,
                                     const py::object& seed, const py::object& step, int64_t V,
                                     int64_t max_seq) {
        auto temp = checked_array<float>(temperature, "temperature", {-1}, "float32 array of shape (B,)");
        const py::ssize_t B = temp.shape(0);
        auto tk = checked_array<int32_t>(top_k, "top_k", {B}, "int32 array of shape (B,)");
        auto tp = checked_array<float>(top_p, "top_p", {B}, "float32 array of shape (B,)");
        auto mp = checked_array<float>(min_p, "min_p", {B}, "float32 array of shape (B,)");
        auto rp = checked_array<float>(repetition_penalty, "repetition_penalty", {B}, "float32 array of shape (B,)");
        auto sd = checked_array<uint64_t>(seed, "seed", {B}, "uint64 array of shape (B,)");
        auto st = checked_array<uint64_t>(step, "step", {B}, "uint64 array of shape (B,)");
        CudaOp::check_sizes({{"B", B}, {"V", V}, {"max_seq", max_seq}});
        if (B < 1 || V < 1) bad_argument("need B >= 1 rows and V >= 1 logits");
        std::vector<brrr::cuda::SampleParamsDev> params(B);
        for (py::ssize_t i = 0; i < B; ++i) {
            brrr::SamplingParams p;
            p.temperature = temp.data()[i];
            p.top_k = tk.data()[i];
            p.top_p = tp.data()[i];
            p.min_p = mp.data()[i];
            p.repetition_penalty = rp.data()[i];
            p.seed = sd.data()[i];
            const std::string problem = brrr::cpu::sampling_params_problem(p);
            if (!problem.empty()) bad_argument("sampling row " + std::to_string(i) + ": " + problem);
            params[i] = {p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, p.seed};
        }
        const float* lg = static_cast<const float*>(CudaOp::ptr(logits, "logits"));
        const int* hist = static_cast<const int*>(CudaOp::ptr(history, "history"));
        const int* sl = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
        int* pos = static_cast<int*>(CudaOp::ptr(positions, "positions"));
        py::array_t<int32_t> tokens(B);
        py::array_t<float> logprobs(B);
        int32_t* tok_out = tokens.mutable_data();
        float* lp_out = logprobs.mutable_data();
        const size_t params_bytes = sizeof(brrr::cuda::SampleParamsDev) * B;
        const size_t steps_bytes = sizeof(uint64_t) * B;
        const size_t scratch_bytes = brrr::cuda::sample_scratch_bytes((int)B, (int)V);
        const size_t out_bytes = (sizeof(int) + sizeof(float)) * B;
        {
            py::gil_scoped_release release;
            // One temporary block: params | steps | outputs | scratch, each 256-byte aligned.
            auto up = [](size_t n) { return (n + 255) / 256 * 256; };
            const size_t total = up(params_bytes) + up(steps_bytes) + up(out_bytes) + scratch_bytes;
            void* raw = nullptr;
            CudaOp::check(cudaMalloc(&raw, total), "cuda_ops.sample_tokens: cudaMalloc of its scratch");
            std::unique_ptr<void, cudaError_t (*)(void*)> guard(raw, cudaFree);
            char* block = static_cast<char*>(raw);
            auto* d_params = reinterpret_cast<brrr::cuda::SampleParamsDev*>(block);
            auto* d_steps = reinterpret_cast<uint64_t*>(block + up(params_bytes));
            int* d_tokens = reinterpret_cast<int*>(block + up(params_bytes) + up(steps_bytes));
            float* d_logprobs = reinterpret_cast<float*>(d_tokens + B);
            void* d_scratch = block + up(params_bytes) + up(steps_bytes) + up(out_bytes);
            CudaOp::check(cudaMemcpy(d_params, params.data(), params_bytes, cudaMemcpyHostToDevice),
                          "cuda_ops.sample_tokens: upload");
            CudaOp::check(cudaMemcpy(d_steps, st.data(), steps_bytes, cudaMemcpyHostToDevice),
                          "cuda_ops.sample_tokens: upload");
            brrr::cuda::sample_tokens(lg, hist, sl, pos, d_params, d_steps, (int)B, (int)V,
                                      (int)max_seq, d_scratch, d_tokens, d_logprobs,
                                      brrr::cuda::SampleFeedBack{}, 0);
            CudaOp::finish("cuda_ops.sample_tokens");
            CudaOp::check(cudaMemcpy(tok_out, d_tokens, sizeof(int) * B, cudaMemcpyDeviceToHost),
                          "cuda_ops.sample_tokens: download");
            CudaOp::check(cudaMemcpy(lp_out, d_logprobs, sizeof(float) * B, cudaMemcpyDeviceToHost),
                          "cuda_ops.sample_tokens: download");
        }
        return py::make_tuple(tokens, logprobs);
    }, py::arg("logits"), py::arg("history"), py::arg("slots"), py::arg("positions"),
       py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
       py::arg("repetition_penalty"), py::arg("seed"), py::arg("step"), py::arg("V"),
       py::arg("max_seq"),
       "(tokens int32 [B], logprobs f32 [B]) from logits f32 [B, V] on the device by the rules of "
       "cpu/sampling.h; history int32 [max_batch, max_seq], slots/positions int32 [B] device "
       "pointers; the sampling parameters are numpy arrays of shape (B,)");

    cuda_ops.def("fill_normal_bf16", [](uintptr_t p, uint64_t n, uint64_t key, float mean, float std) {
        if (!(std::isfinite(mean) && std::isfinite(std) && std >= 0))
            bad_argument("mean and std must be finite and std >= 0");
        py::gil_scoped_release release;
        brrr::cuda::fill_normal_bf16(static_cast<brrr::cuda::bf16*>(CudaOp::ptr(p, "p")), (size_t)n, key, mean,
                                     std, 0);
        CudaOp::finish("cuda_ops.fill_normal_bf16");
    }, py::arg("p"), py::arg("n"), py::arg("key"), py::arg("mean") = 0.f, py::arg("std") = 1.f,
       "p[i] = bf16(mean + std * z_i), z from the counter stream `key` (see init_random_key)");

    cuda_ops.def("init_random_key", [](uint64_t seed, uint64_t tensor_index) {
        return brrr::init_random_key(seed, (size_t)tensor_index);
    }, py::arg("seed"), py::arg("tensor_index"),
       "the fill_normal_bf16 key of canonical tensor `tensor_index` (weight_names order) under "
       "Engine.init_random(seed); norms use mean 1, everything else mean 0");

    cuda_ops.def("convert_f32_to_bf16", [](uintptr_t src, uintptr_t dst, uint64_t n) {
        py::gil_scoped_release release;
        brrr::cuda::convert_f32_to_bf16(static_cast<const float*>(CudaOp::ptr(src, "src")),
                                        static_cast<brrr::cuda::bf16*>(CudaOp::ptr(dst, "dst")), (size_t)n, 0);
        CudaOp::finish("cuda_ops.convert_f32_to_bf16");
    }, py::arg("src"), py::arg("dst"), py::arg("n"), "dst[i] = bf16(src[i]), round to nearest even");

    // ---- cuda_ops (gemv/gemm/attention) ----
    // Matmuls: x [M, K] bf16, W [N, K] bf16; epilogue 0 StoreBf16 (out), 1 StoreF32 (out_f32),
    // 2 AddResidual (residual += y), 3 SwiGLU (out [M, N/2] = silu(gate) * up). Pointers the
    // epilogue does not use may be 0; ld_out 0 means packed rows.
    struct CudaMatmul {
        // split: None, or (partials, floats, counters, n_counters), device pointers and their lengths.
        static brrr::cuda::SplitKScratch split_scratch(const py::object& split) {
            brrr::cuda::SplitKScratch sc;
            if (split.is_none()) return sc;
            const auto t = split.cast<std::tuple<uintptr_t, int64_t, uintptr_t, int64_t>>();
            CudaOp::check_sizes({{"split floats", std::get<1>(t)}, {"split counters", std::get<3>(t)}});
            sc.partials = static_cast<float*>(CudaOp::ptr(std::get<0>(t), "split partials"));
            sc.floats = (size_t)std::get<1>(t);
            sc.counters = static_cast<unsigned*>(CudaOp::ptr(std::get<2>(t), "split counters"));
            sc.n_counters = (int)std::get<3>(t);
            return sc;
        }
        // A matmul launcher of ops.h, or a lambda around one.
        using Launcher = std::function<void(const brrr::cuda::bf16*, const brrr::cuda::bf16*, int, int, int,
                                            brrr::cuda::Epilogue, const brrr::cuda::EpilogueArgs&, cudaStream_t)>;
        static void run(const char* op, const Launcher& launcher, uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K, int64_t epilogue,
                        uintptr_t out, uintptr_t out_f32, uintptr_t residual, int64_t ld_out,
                        const py::object& split = py::none()) {
            CudaOp::check_sizes({{"M", M}, {"N", N}, {"K", K}, {"ld_out", ld_out}});
            if (N < 1 || K < 1) bad_argument(std::string(op) + ": N and K must be >= 1");
            if (epilogue < 0 || epilogue > 3)
                bad_argument(std::string(op) + ": epilogue must be 0 StoreBf16, 1 StoreF32, 2 AddResidual or "
                             "3 SwiGLU, got " + std::to_string(epilogue));
            const auto ep = static_cast<brrr::cuda::Epilogue>(epilogue);
            if (ep == brrr::cuda::Epilogue::SwiGLU && N % 2)
                bad_argument(std::string(op) + ": SwiGLU needs an even N (gate rows | up rows), got " + std::to_string(N));
            brrr::cuda::EpilogueArgs args;
            switch (ep) {
                case brrr::cuda::Epilogue::StoreBf16:
                case brrr::cuda::Epilogue::SwiGLU:
                    args.out_bf16 = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out")); break;
                case brrr::cuda::Epilogue::StoreF32:
                    args.out_f32 = static_cast<float*>(CudaOp::ptr(out_f32, "out_f32")); break;
                case brrr::cuda::Epilogue::AddResidual:
                    args.residual = static_cast<float*>(CudaOp::ptr(residual, "residual")); break;
                case brrr::cuda::Epilogue::RopeKV: break;  // refused above: it needs rmsnorm_matmul_bf16's arguments
            }
            args.ld_out = (int)ld_out;
            args.split = split_scratch(split);
            const int width = ep == brrr::cuda::Epilogue::SwiGLU ? (int)N / 2 : (int)N;
            if (ld_out != 0 && ld_out < width)
                bad_argument(std::string(op) + ": ld_out=" + std::to_string(ld_out) + " is shorter than an output row (" +
                             std::to_string(width) + ")");
            const auto* xp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(x, "x"));
            const auto* wp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(W, "W"));
            py::gil_scoped_release release;
            launcher(xp, wp, (int)M, (int)N, (int)K, ep, args, 0);
            CudaOp::finish(op);
        }
    };
    cuda_ops.def("gemv_bf16", [](uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K, int64_t epilogue,
                                 uintptr_t out, uintptr_t out_f32, uintptr_t residual, int64_t ld_out,
                                 const std::string& path) {
        if (M > 16) bad_argument("gemv_bf16: M=" + std::to_string(M) + " rows; the GEMV takes at most 16");
        using brrr::cuda::GemvPath;
        if (path != "auto" && path != "cuda_cores" && path != "tensor_cores")
            bad_argument("gemv_bf16: path must be 'auto', 'cuda_cores' or 'tensor_cores', got '" + path + "'");
        const GemvPath chosen = path == "cuda_cores"     ? GemvPath::CudaCores
                                : path == "tensor_cores" ? GemvPath::TensorCores
                                                         : GemvPath::Auto;
        CudaMatmul::run("cuda_ops.gemv_bf16",
                        [chosen](const brrr::cuda::bf16* x, const brrr::cuda::bf16* W, int M, int N, int K,
                                 brrr::cuda::Epilogue ep, const brrr::cuda::EpilogueArgs& args, cudaStream_t s) {
                            brrr::cuda::gemv_bf16(x, W, M, N, K, ep, args, s, chosen);
                        },
                        x, W, M, N, K, epilogue, out, out_f32, residual, ld_out);
    }, py::arg("x"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
       py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
       py::arg("path") = "auto",
       "decode GEMV (M <= 16): y = x @ W.T with the epilogue fused (see the comment above); path: 'auto' "
       "(the engine's choice by M), 'cuda_cores' or 'tensor_cores'");
    cuda_ops.def("gemm_bf16", [](uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K, int64_t epilogue,
                                 uintptr_t out, uintptr_t out_f32, uintptr_t residual, int64_t ld_out,
                                 const py::object& split) {
        CudaMatmul::run("cuda_ops.gemm_bf16", brrr::cuda::gemm_bf16, x, W, M, N, K, epilogue, out, out_f32, residual,
                        ld_out, split);
    }, py::arg("x"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
       py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
       py::arg("split") = py::none(),
       "tensor-core GEMM, any M: y = x @ W.T with the epilogue fused; split = (partials, floats, counters, "
       "n_counters) lends it split-K scratch (sizes: gemm_split_scratch_sizes; counters zeroed)");
    cuda_ops.def("matmul_bf16", [](uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K, int64_t epilogue,
                                   uintptr_t out, uintptr_t out_f32, uintptr_t residual, int64_t ld_out,
                                   const py::object& split) {
        CudaMatmul::run("cuda_ops.matmul_bf16", brrr::cuda::matmul_bf16, x, W, M, N, K, epilogue, out, out_f32, residual,
                        ld_out, split);
    }, py::arg("x"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
       py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
       py::arg("split") = py::none(),
       "the engine's matmul: GEMV for small M, tensor-core GEMM above (split as for gemm_bf16)");
    cuda_ops.def("gemm_split_scratch_sizes", [](int64_t sm_count) {
        if (sm_count < 1 || sm_count > 4096) bad_argument("gemm_split_scratch_sizes: sm_count must be in [1, 4096]");
        return py::make_tuple((int64_t)brrr::cuda::gemm_split_scratch_floats((int)sm_count),
                              (int64_t)brrr::cuda::gemm_split_scratch_counters((int)sm_count));
    }, py::arg("sm_count"), "(floats, counters) of the split-K scratch the engine gives its GEMMs");

    cuda_ops.def("rmsnorm_matmul_bf16", [](uintptr_t x, uintptr_t norm_w, float eps, uintptr_t W, int64_t M,
                                           int64_t N, int64_t K, int64_t epilogue, uintptr_t out,
                                           uintptr_t out_f32, uintptr_t residual, int64_t ld_out, uintptr_t xn,
                                           uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                                           uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache, int64_t n_heads,
                                           int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                                           const py::object& split) {
        CudaOp::check_sizes({{"M", M}, {"N", N}, {"K", K}, {"ld_out", ld_out}, {"n_heads", n_heads},
                             {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"max_seq", max_seq}});
        if (epilogue < 0 || epilogue > 4)
            bad_argument("rmsnorm_matmul_bf16: epilogue must be 0 StoreBf16, 1 StoreF32, 2 AddResidual, "
                         "3 SwiGLU or 4 RopeKV, got " + std::to_string(epilogue));
        brrr::cuda::EpilogueArgs args;
        args.out_bf16 = reinterpret_cast<brrr::cuda::bf16*>(out);
        args.out_f32 = reinterpret_cast<float*>(out_f32);
        args.residual = reinterpret_cast<float*>(residual);
        args.ld_out = (int)ld_out;
        args.rope.positions = reinterpret_cast<const int*>(positions);
        args.rope.slots = reinterpret_cast<const int*>(slots);
        args.rope.inv_freq = reinterpret_cast<const float*>(inv_freq);
        args.rope.q_out = reinterpret_cast<brrr::cuda::bf16*>(q_out);
        args.rope.k_cache = reinterpret_cast<brrr::cuda::bf16*>(k_cache);
        args.rope.v_cache = reinterpret_cast<brrr::cuda::bf16*>(v_cache);
        args.rope.n_heads = (int)n_heads;
        args.rope.n_kv_heads = (int)n_kv_heads;
        args.rope.head_dim = (int)head_dim;
        args.rope.max_seq = (int)max_seq;
        args.split = CudaMatmul::split_scratch(split);
        const auto* xp = static_cast<const float*>(CudaOp::ptr(x, "x"));
        const auto* np = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(norm_w, "norm_w"));
        const auto* wp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(W, "W"));
        py::gil_scoped_release release;
        brrr::cuda::rmsnorm_matmul_bf16(xp, np, eps, wp, (int)M, (int)N, (int)K,
                                        static_cast<brrr::cuda::Epilogue>(epilogue), args,
                                        reinterpret_cast<brrr::cuda::bf16*>(xn), 0);
        CudaOp::finish("cuda_ops.rmsnorm_matmul_bf16");
    }, py::arg("x"), py::arg("norm_w"), py::arg("eps"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"),
       py::arg("epilogue"), py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0,
       py::arg("ld_out") = 0, py::arg("xn") = 0, py::arg("positions") = 0, py::arg("slots") = 0,
       py::arg("inv_freq") = 0, py::arg("q_out") = 0, py::arg("k_cache") = 0, py::arg("v_cache") = 0,
       py::arg("n_heads") = 0, py::arg("n_kv_heads") = 0, py::arg("head_dim") = 0, py::arg("max_seq") = 0,
       py::arg("split") = py::none(),
       "y = bf16(rmsnorm(x) * norm_w) @ W.T with the epilogue (4 RopeKV: q -> q_out, k/v -> caches "
       "at (slots[m], positions[m])); x f32 [M, K]; M > 16 uses xn bf16 [M, K] (and out_f32 [M, N] "
       "for RopeKV) as scratch");

    struct CudaAttention {
        static void check_heads(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
            if (head_dim != 64 && head_dim != 128)
                bad_argument("head_dim must be 64 or 128 on the GPU, got " + std::to_string(head_dim));
            if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads)
                bad_argument("n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" +
                             std::to_string(n_kv_heads) + ")");
        }
    };
    cuda_ops.def("flash_decode_scratch_floats", [](int64_t B, int64_t n_heads, int64_t head_dim, int64_t max_splits) {
        CudaOp::check_sizes({{"B", B}, {"n_heads", n_heads}, {"head_dim", head_dim}, {"max_splits", max_splits}});
        if (max_splits < 1) bad_argument("max_splits must be >= 1");
        return brrr::cuda::flash_decode_scratch_floats((int)B, (int)n_heads, (int)head_dim, (int)max_splits);
    }, py::arg("B"), py::arg("n_heads"), py::arg("head_dim"), py::arg("max_splits"),
       "floats of scratch flash_decode needs for this batch and split limit; zero it before the first call");
    cuda_ops.def("flash_decode", [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slots,
                                    uintptr_t positions, uintptr_t out, uintptr_t scratch, int64_t B,
                                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                                    int64_t max_splits) {
        CudaOp::check_sizes({{"B", B}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
                             {"head_dim", head_dim}, {"max_seq", max_seq}, {"max_splits", max_splits}});
        CudaAttention::check_heads(n_heads, n_kv_heads, head_dim);
        if (max_seq < 1 || max_splits < 1) bad_argument("max_seq and max_splits must be >= 1");
        if (max_splits > 1 && scratch == 0)
            bad_argument("scratch must be a device buffer of flash_decode_scratch_floats() floats when max_splits > 1");
        if (q % 16 || k_cache % 16 || v_cache % 16)
            bad_argument("q, k_cache and v_cache must be 16-byte aligned (rows are read 16 bytes a lane)");
        const auto* qp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(q, "q"));
        const auto* kp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(k_cache, "k_cache"));
        const auto* vp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(v_cache, "v_cache"));
        const int* sp = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
        const int* pp = static_cast<const int*>(CudaOp::ptr(positions, "positions"));
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        brrr::cuda::flash_decode(qp, kp, vp, sp, pp, op, reinterpret_cast<float*>(scratch), (int)B, (int)n_heads,
                                 (int)n_kv_heads, (int)head_dim, (int)max_seq, (int)max_splits, 0);
        CudaOp::finish("cuda_ops.flash_decode");
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"), py::arg("positions"),
       py::arg("out"), py::arg("scratch"), py::arg("B"), py::arg("n_heads"), py::arg("n_kv_heads"),
       py::arg("head_dim"), py::arg("max_seq"), py::arg("max_splits"),
       "one query per sequence: q bf16 [B, Hq, hd] over cache bf16 [max_batch, max_seq, Hkv, hd] "
       "positions [0, positions[b]] of slot slots[b] (int32 device arrays); out bf16 [B, Hq * hd]");
    cuda_ops.def("attention_prefill", [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, int64_t slot,
                                         int64_t start_pos, int64_t T, uintptr_t out, int64_t n_heads,
                                         int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, bool mma_sync) {
        CudaOp::check_sizes({{"slot", slot}, {"start_pos", start_pos}, {"T", T}, {"n_heads", n_heads},
                             {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"max_seq", max_seq}});
        CudaAttention::check_heads(n_heads, n_kv_heads, head_dim);
        if (start_pos + T > max_seq)
            bad_argument("start_pos + T = " + std::to_string(start_pos + T) + " exceeds max_seq = " + std::to_string(max_seq));
        const auto* qp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(q, "q"));
        const auto* kp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(k_cache, "k_cache"));
        const auto* vp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(v_cache, "v_cache"));
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        (mma_sync ? brrr::cuda::attention_prefill_mma_sync : brrr::cuda::attention_prefill)(
            qp, kp, vp, (int)slot, (int)start_pos, (int)T, op, (int)n_heads, (int)n_kv_heads, (int)head_dim,
            (int)max_seq, 0);
        CudaOp::finish("cuda_ops.attention_prefill");
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slot"), py::arg("start_pos"),
       py::arg("T"), py::arg("out"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"),
       py::arg("max_seq"), py::arg("mma_sync") = false,
       "causal prefill of T tokens at positions start_pos.. of cache slot `slot` (their K/V already "
       "in the cache): q bf16 [T, Hq, hd], out bf16 [T, Hq * hd]. mma_sync=True runs the pre-Hopper "
       "kernel whatever the GPU (Hopper runs TMA-fed wgmma otherwise)");
    // ==== CUDA region end ====
#endif
}
