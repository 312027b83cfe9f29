// module.cpp — the extension module llama_brrr._C: how engine errors become Python exceptions,
// what the build holds, and the pieces the engine handle, cpu_ops and testing files register.
//
// Python API of llama_brrr._C (the engine handle: engine.cpp; cpu_ops: cpu_ops.cpp):
//   cuda_compiled() -> bool                   built with nvcc
//   cuda_device_count() -> int                0 without a GPU or driver (never raises)
//   cpu_simd() -> str                         SIMD path the CPU kernels were built for
//   rope_inv_freq(config: dict) -> ndarray[f32 head_dim/2]   with the config's rope scaling
//   profile_now() -> float                    seconds on the clock every profile record uses
//   sampling_params_dtype                     numpy dtype of one sampling row (model.h's
//                                             SamplingParams: temperature, top_k, top_p, min_p,
//                                             repetition_penalty, seed), what Engine.sample and
//                                             Engine.decode_steps take as `params`
//   sampling_params_problem(temperature, top_k, top_p, min_p, repetition_penalty) -> str
//                                             "" when the row is usable, else the rule it breaks
#include "bindings/bindings.h"

#include "cpu/simd.h"
#include "profile/profile.h"

#ifdef BRRR_WITH_CUDA
#include "cuda/engine_cuda.h"
#endif

using namespace brrr::bindings;

PYBIND11_MODULE(_C, m) {
    m.doc() = "llama_brrr engine (C++ core); see csrc/bindings/ for the API";

    // Derived before base: OutOfMemory and InvalidArgument derive from brrr::Error.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const brrr::OutOfMemory& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
        } catch (const brrr::InvalidArgument& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
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
#ifdef BRRR_WITH_CUDA
    m.def("cuda_device_count", [] { return brrr::cuda_device_count(); },
          "Usable CUDA devices; 0 without a GPU or driver (never raises)");
#else
    m.def("cuda_device_count", [] { return 0; }, "Usable CUDA devices: always 0 in a CPU-only build");
#endif
    m.def("nccl_unique_id", [](const std::string& library) -> py::bytes {
#ifdef BRRR_WITH_CUDA
        std::string id;
        {
            py::gil_scoped_release release;
            id = brrr::cuda_nccl_unique_id(library);
        }
        return py::bytes(id);
#else
        (void)library;
        throw std::runtime_error("this build has no CUDA support, so no NCCL: rebuild with nvcc "
                                 "(LLAMA_BRRR_CUDA=1) for tensor parallelism");
#endif
    }, py::arg("library") = "",
       "A new NCCL communicator id (bytes) for Engine.init_tensor_parallel; loads libnccl from "
       "`library` (a path; \"\" = libnccl.so.2 by the dynamic loader's search) on first use");
    m.def("cpu_simd", [] { return std::string(brrr::cpu::kSimdName); },
          "The SIMD path the CPU kernels were compiled for: avx512, avx2 or scalar");
    m.def("rope_inv_freq", [](const py::dict& config) {
        const std::vector<float> f = brrr::rope_inv_freq(config_from_dict(config));
        py::array_t<float> out((py::ssize_t)f.size());
        std::copy(f.begin(), f.end(), out.mutable_data());
        return out;
    }, py::arg("config"), "RoPE inverse frequencies [head_dim/2] with the config's scaling");
    m.def("profile_now", [] { return brrr::profile::now(); },
          "Seconds on the host steady_clock, the timeline of every profile record");

    m.attr("sampling_params_dtype") = sampling_params_dtype();
    m.def("sampling_params_problem", [](float temperature, int64_t top_k, float top_p, float min_p,
                                        float repetition_penalty) {
        brrr::SamplingParams p;
        p.temperature = temperature;
        p.top_k = saturate_int(top_k);
        p.top_p = top_p;
        p.min_p = min_p;
        p.repetition_penalty = repetition_penalty;
        return brrr::sampling_params_problem(p);
    }, py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
       py::arg("repetition_penalty"),
       "\"\" when a sampling row is usable, else the rule it breaks, naming the field (the engine's "
       "rules, csrc/model.cpp)");

    bind_engine(m);
    bind_cpu_ops(m);
    bind_quant_ops(m);
#ifdef BRRR_WITH_CUDA
    bind_testing(m);
#endif
}
