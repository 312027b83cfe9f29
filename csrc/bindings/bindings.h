// bindings.h — what every file of the Python bindings shares: the argument checks that name the
// argument, its expected form and what came, and the GIL and sampling-row helpers.
//
// The bindings, one file per thing bound (together the extension llama_brrr._C):
//   module.cpp   the module: error translation, build facts, the SamplingParams dtype, RoPE tables
//   engine.cpp   _C.Engine, the one engine handle of both backends
//   cpu_ops.cpp  _C.cpu_ops, the CPU kernels on numpy arrays (tests)
//   testing.cpp  _C.testing, the CUDA launchers on raw device pointers (tests and kernel
//                benchmarks only; not part of the API)
// Errors: bad arguments -> ValueError naming the argument (the engines' InvalidArgument too),
// missing config keys -> KeyError, engine failures -> RuntimeError, allocation failures ->
// MemoryError with the bytes.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "model.h"

namespace py = pybind11;

namespace brrr {
namespace bindings {

[[noreturn]] inline void bad_argument(const std::string& message) { throw py::value_error(message); }

inline std::string shape_of(const py::array& a) {
    brrr::Message s;
    s << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    s << (a.ndim() == 1 ? ",)" : ")");
    return s.str();
}

inline std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

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

inline brrr::DType parse_dtype(const std::string& s, const char* what) {
    if (s == "f32" || s == "float32") return brrr::DType::F32;
    if (s == "f16" || s == "float16") return brrr::DType::F16;
    if (s == "bf16" || s == "bfloat16") return brrr::DType::BF16;
    bad_argument(std::string(what) + " must be \"f32\", \"f16\" or \"bf16\", got \"" + s + "\"");
}

// A Python int narrowed to int, saturating: a value past int's range stays out of every range
// the engine checks, so the engine's message names it rather than a wrapped value.
inline int saturate_int(int64_t v) {
    return (int)std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
}

// The numpy record dtype of one model.h SamplingParams (field names, types and offsets of the
// struct), what _C.sampling_params_dtype exposes and the sampling calls take as `params`. Built
// from a field spec rather than registered with PYBIND11_NUMPY_DTYPE, whose registration crashed
// at import on the GPU machine's Python 3.12 / numpy 2.5.
inline const py::dtype& sampling_params_dtype() {
    PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::dtype> storage;
    return storage
        .call_once_and_store_result([] {
            using P = brrr::SamplingParams;
            static_assert(sizeof(float) == 4 && sizeof(int) == 4, "the record's formats");
            py::dict spec;
            spec["names"] = py::make_tuple("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed");
            spec["formats"] = py::make_tuple("<f4", "<i4", "<f4", "<f4", "<f4", "<u8");
            spec["offsets"] = py::make_tuple(offsetof(P, temperature), offsetof(P, top_k), offsetof(P, top_p),
                                             offsetof(P, min_p), offsetof(P, repetition_penalty), offsetof(P, seed));
            spec["itemsize"] = sizeof(P);
            return py::dtype::from_args(spec);
        })
        .get_stored();
}

// The sampling rows of a batch call: `obj` as B records of sampling_params_dtype(), each held to
// sampling_params_problem (model.h). The one place the sampling rules are enforced. The returned
// array keeps the rows alive; rows_of() reads them as model.h's struct.
inline py::array sampling_rows(const py::handle& obj, py::ssize_t B) {
    const char* expected = "array of _C.sampling_params_dtype of shape (B,)";
    if (!py::isinstance<py::array>(obj))
        bad_argument(std::string("params must be a numpy array (") + expected + "), got " +
                     py::str(py::type::of(obj)).cast<std::string>());
    py::array rows = py::reinterpret_borrow<py::array>(obj);
    if (!rows.dtype().equal(sampling_params_dtype()) || !(rows.flags() & py::array::c_style) ||
        rows.ndim() != 1 || rows.shape(0) != B) {
        brrr::Message s;
        s << "params must be a C-contiguous " << expected << " with B = " << B << "; got a "
          << ((rows.flags() & py::array::c_style) ? "" : "non-contiguous ") << dtype_of(rows)
          << " array of shape " << shape_of(rows);
        bad_argument(s.str());
    }
    const auto* p = static_cast<const brrr::SamplingParams*>(rows.data());
    for (py::ssize_t i = 0; i < B; ++i) {
        const std::string problem = brrr::sampling_params_problem(p[i]);
        if (!problem.empty()) bad_argument("sampling row " + std::to_string(i) + ": " + problem);
    }
    return rows;
}
inline const brrr::SamplingParams* rows_of(const py::array& rows) {
    return static_cast<const brrr::SamplingParams*>(rows.data());
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

brrr::Config config_from_dict(const py::dict& d);

void bind_engine(py::module_& m);
void bind_cpu_ops(py::module_& m);
void bind_quant_ops(py::module_& m);
#ifdef BRRR_WITH_CUDA
void bind_testing(py::module_& m);
#endif

}  // namespace bindings
}  // namespace brrr
