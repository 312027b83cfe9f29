// quant_ops.cpp — the quantized CPU kernels and quantizers on numpy arrays (tests, benchmarks).
//
// Python API of llama_brrr._C.quant_ops (type: "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q4_k" |
// "q5_k" | "q6_k" or its GGML id; isa: "auto" | "scalar" | "avx2" | "avx512vnni" | "amx" (AMX-INT8
// tiles for the GEMM from amx_min_rows rows of x, the avx512vnni kernels below); n_threads 0 =
// OpenMP's default; `out=` takes a preallocated, e.g. NaN-poisoned, result array):
//   cpu_features() -> str              the features the dispatch looks at, e.g. "avx2 fma avx512f ..."
//   best_isa() -> str                  what isa="auto" runs here
//   isa_supported(isa) -> bool
//   row_bytes(type, K) -> int          bytes of one row of K values
//   quantize(type, x[N, K] f32, out=None) -> uint8[N, row_bytes]       ggml's reference quantizers
//   dequantize(type, blocks[N, row_bytes] uint8, K, out=None) -> f32[N, K]
//   first_bad_scale(type, blocks uint8 (any shape, whole blocks)) -> int   block index, -1 if none
//   gemv(type, w[N, row_bytes] uint8, x[K] f32, isa="auto", n_threads=0, out=None) -> f32[N]
//   gemm(type, w[N, row_bytes] uint8, x[M, K] f32, isa="auto", n_threads=0, out=None) -> f32[M, N]
//   matmul(type, w[N, row_bytes] uint8, x[M, K] f32, out[M, L] f32, col=0, accumulate=False,
//          isa="auto", n_threads=0) -> out
//       quant::matmul as the engine calls it: x quantized per row (quantize_activation_rows), then
//       out[:, col:col + N] = x . W^T (+= with accumulate); rows of out are L >= col + N floats
//       apart (ldy = L), the other columns untouched.
//   quantize_activations(x[M, K] f32) -> uint8[M, K / 32 * 48]   the ActBlocks of each row (d[2],
//       dsum[2] f32, qs[32] int8 per block: quant::ActBlock), the rule every matmul path uses
//   gpu_repack(type, blocks[n_rows, row_bytes] uint8, K, N=0, first_row=0, out=None) -> uint8[matrix_bytes]
//       rows [first_row, first_row + n_rows) of an N-row matrix (N = 0: n_rows, the whole matrix)
//       into the CUDA tiles of cuda/qlayout.h; `out` (the whole matrix) receives them in place
//   gpu_unpack(type, packed uint8[matrix_bytes], N, K, first_row=0, n_rows=-1) -> uint8[n_rows, row_bytes]
//       the inverse (n_rows = -1: to the last row)
// Bad arguments raise ValueError naming the parameter.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "common.h"
#include "cpu/quant.h"
#include "cuda/qlayout.h"

namespace py = pybind11;
namespace q = brrr::quant;

namespace {

[[noreturn]] void bad(const std::string& message) { throw py::value_error(message); }

std::string shape_str(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

q::QType parse_type(const py::object& type) {
    if (py::isinstance<py::int_>(type)) {
        const int id = type.cast<int>();
        if (!q::known_type(id))
            bad("type: GGML type id " + std::to_string(id) + " is not a kept quantized type "
                "(q4_0=2, q4_1=3, q5_0=6, q5_1=7, q8_0=8, q4_k=12, q5_k=13, q6_k=14)");
        return (q::QType)id;
    }
    if (!py::isinstance<py::str>(type)) bad("type must be a type name such as \"q4_k\" or a GGML type id");
    const std::string name = type.cast<std::string>();
    for (int id : q::kTypeIds)
        if (name == q::type_name((q::QType)id)) return (q::QType)id;
    bad("type: unknown quantized type \"" + name + "\" (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)");
}

q::Isa parse_isa(const std::string& isa) {
    q::Isa out;
    if (isa == "auto") out = q::Isa::Auto;
    else if (isa == "scalar") out = q::Isa::Scalar;
    else if (isa == "avx2") out = q::Isa::Avx2;
    else if (isa == "avx512vnni") out = q::Isa::Avx512Vnni;
    else if (isa == "amx") out = q::Isa::Amx;
    else bad("isa must be \"auto\", \"scalar\", \"avx2\", \"avx512vnni\" or \"amx\"; got \"" + isa + "\"");
    if (!q::isa_supported(out)) bad("isa \"" + isa + "\" is not supported by this CPU (" + q::cpu_features() + ")");
    return out;
}

size_t checked_row_bytes(q::QType t, int64_t K, const char* name) {
    const int be = q::block_elems(t);
    if (K <= 0 || K % be)
        bad(std::string(name) + " = " + std::to_string(K) + ": " + q::type_name(t) +
            " rows hold whole blocks of " + std::to_string(be) + " values");
    return q::row_bytes(t, K);
}

template <typename T>
py::array_t<T> checked(const py::handle& obj, const char* name, int ndim, const std::string& expected) {
    if (!py::isinstance<py::array>(obj)) bad(std::string(name) + " must be a numpy array (" + expected + ")");
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!py::isinstance<py::array_t<T>>(a) || !(a.flags() & py::array::c_style) || a.ndim() != ndim)
        bad(std::string(name) + " must be a C-contiguous " + expected + "; got " +
            py::str(a.dtype()).cast<std::string>() + " of shape " + shape_str(a));
    return py::reinterpret_borrow<py::array_t<T>>(a);
}

template <typename T>
py::array_t<T> output(const py::object& out, std::vector<py::ssize_t> shape, const std::string& expected) {
    if (out.is_none()) return py::array_t<T>(shape);
    auto a = checked<T>(out, "out", (int)shape.size(), expected);
    for (size_t i = 0; i < shape.size(); ++i)
        if (a.shape(i) != shape[i]) bad("out must have shape matching the result (" + expected + "); got " + shape_str(a));
    return a;
}

// Weights as uint8 [N, row_bytes(K)]; returns N.
py::ssize_t weight_rows(const py::array_t<uint8_t>& w, q::QType t, int64_t K) {
    const size_t rb = q::row_bytes(t, K);
    if ((size_t)w.shape(1) != rb)
        bad("w has " + std::to_string(w.shape(1)) + " bytes per row; " + q::type_name(t) + " rows of K = " +
            std::to_string(K) + " take " + std::to_string(rb));
    return w.shape(0);
}

}  // namespace

void brrr::bindings::bind_quant_ops(py::module_& m) {
    py::module_ ops = m.def_submodule("quant_ops", "Quantized CPU kernels and quantizers on numpy arrays");

    ops.def("cpu_features", [] { return q::cpu_features(); });
    ops.attr("amx_min_rows") = q::kAmxMinRows;
    ops.def("best_isa", [] { return std::string(q::isa_name(q::best_isa())); });
    ops.def("isa_supported", [](const std::string& isa) {
        if (isa == "auto") return true;
        if (isa == "scalar") return q::isa_supported(q::Isa::Scalar);
        if (isa == "avx2") return q::isa_supported(q::Isa::Avx2);
        if (isa == "avx512vnni") return q::isa_supported(q::Isa::Avx512Vnni);
        if (isa == "amx") return q::isa_supported(q::Isa::Amx);
        bad("isa must be \"auto\", \"scalar\", \"avx2\", \"avx512vnni\" or \"amx\"; got \"" + isa + "\"");
    }, py::arg("isa"));
    ops.def("row_bytes", [](const py::object& type, int64_t K) {
        const q::QType t = parse_type(type);
        return checked_row_bytes(t, K, "K");
    }, py::arg("type"), py::arg("K"));

    ops.def("quantize", [](const py::object& type, const py::object& x, const py::object& out) {
        const q::QType t = parse_type(type);
        auto xa = checked<float>(x, "x", 2, "float32 array of shape (N, K)");
        const py::ssize_t N = xa.shape(0), K = xa.shape(1);
        const size_t rb = checked_row_bytes(t, K, "x.shape[1]");
        auto y = output<uint8_t>(out, {N, (py::ssize_t)rb}, "uint8 (N, row_bytes)");
        const float* xp = xa.data();
        uint8_t* yp = y.mutable_data();
        py::gil_scoped_release release;
        q::quantize_rows(t, xp, yp, N, K);
        return y;
    }, py::arg("type"), py::arg("x"), py::arg("out") = py::none(), "fp32 rows -> GGUF blocks (ggml's reference)");

    ops.def("dequantize", [](const py::object& type, const py::object& blocks, int64_t K, const py::object& out) {
        const q::QType t = parse_type(type);
        checked_row_bytes(t, K, "K");
        auto w = checked<uint8_t>(blocks, "blocks", 2, "uint8 array of shape (N, row_bytes)");
        const py::ssize_t N = weight_rows(w, t, K);
        auto y = output<float>(out, {N, (py::ssize_t)K}, "float32 (N, K)");
        const size_t rb = q::row_bytes(t, K);
        const uint8_t* wp = w.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        for (py::ssize_t n = 0; n < N; ++n) q::dequantize_row(t, wp + n * rb, yp + n * K, K);
        return y;
    }, py::arg("type"), py::arg("blocks"), py::arg("K"), py::arg("out") = py::none(),
       "GGUF blocks -> their exact fp32 values");

    ops.def("first_bad_scale", [](const py::object& type, const py::array& blocks) {
        const q::QType t = parse_type(type);
        if (!py::isinstance<py::array_t<uint8_t>>(blocks) || !(blocks.flags() & py::array::c_style))
            bad("blocks must be a C-contiguous uint8 array");
        const size_t bb = q::block_bytes(t);
        if ((size_t)blocks.nbytes() % bb)
            bad("blocks holds " + std::to_string(blocks.nbytes()) + " bytes, not whole " + q::type_name(t) +
                " blocks of " + std::to_string(bb));
        return q::first_bad_scale(t, blocks.data(), (int64_t)(blocks.nbytes() / bb));
    }, py::arg("type"), py::arg("blocks"), "index of the first block with a NaN / inf fp16 scale, or -1");

    ops.def("gemv", [](const py::object& type, const py::object& w, const py::object& x, const std::string& isa,
                       int n_threads, const py::object& out) {
        const q::QType t = parse_type(type);
        const q::Isa i = parse_isa(isa);
        auto xa = checked<float>(x, "x", 1, "float32 array of shape (K,)");
        const int64_t K = xa.shape(0);
        checked_row_bytes(t, K, "x.shape[0]");
        auto wa = checked<uint8_t>(w, "w", 2, "uint8 array of shape (N, row_bytes)");
        const py::ssize_t N = weight_rows(wa, t, K);
        if (n_threads < 0) bad("n_threads must be >= 0 (0: all)");
        auto y = output<float>(out, {N}, "float32 (N,)");
        const uint8_t* wp = wa.data();
        const float* xp = xa.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        q::gemv(t, wp, xp, yp, N, K, i, n_threads);
        return y;
    }, py::arg("type"), py::arg("w"), py::arg("x"), py::arg("isa") = "auto", py::arg("n_threads") = 0,
       py::arg("out") = py::none(), "y = W . x on quantized W, x quantized per block of 32");

    ops.def("gemm", [](const py::object& type, const py::object& w, const py::object& x, const std::string& isa,
                       int n_threads, const py::object& out) {
        const q::QType t = parse_type(type);
        const q::Isa i = parse_isa(isa);
        auto xa = checked<float>(x, "x", 2, "float32 array of shape (M, K)");
        const int64_t M = xa.shape(0), K = xa.shape(1);
        checked_row_bytes(t, K, "x.shape[1]");
        auto wa = checked<uint8_t>(w, "w", 2, "uint8 array of shape (N, row_bytes)");
        const py::ssize_t N = weight_rows(wa, t, K);
        if (n_threads < 0) bad("n_threads must be >= 0 (0: all)");
        auto y = output<float>(out, {(py::ssize_t)M, N}, "float32 (M, N)");
        const uint8_t* wp = wa.data();
        const float* xp = xa.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        q::gemm(t, wp, xp, yp, M, N, K, i, n_threads);
        return y;
    }, py::arg("type"), py::arg("w"), py::arg("x"), py::arg("isa") = "auto", py::arg("n_threads") = 0,
       py::arg("out") = py::none(), "Y = X . W^T on quantized W, X quantized per block of 32");

    ops.def("matmul", [](const py::object& type, const py::object& w, const py::object& x, const py::object& out,
                         int64_t col, bool accumulate, const std::string& isa, int n_threads) {
        const q::QType t = parse_type(type);
        const q::Isa i = parse_isa(isa);
        auto xa = checked<float>(x, "x", 2, "float32 array of shape (M, K)");
        const int64_t M = xa.shape(0), K = xa.shape(1);
        checked_row_bytes(t, K, "x.shape[1]");
        auto wa = checked<uint8_t>(w, "w", 2, "uint8 array of shape (N, row_bytes)");
        const int64_t N = weight_rows(wa, t, K);
        if (n_threads < 0) bad("n_threads must be >= 0 (0: all)");
        auto y = checked<float>(out, "out", 2, "float32 array of shape (M, L), L >= col + N");
        if (y.shape(0) != M || col < 0 || col + N > y.shape(1))
            bad("out has shape " + ::shape_str(y) + "; it needs " + std::to_string(M) + " rows and col (" +
                std::to_string(col) + ") + N (" + std::to_string(N) + ") <= its columns, col >= 0");
        const int64_t ldy = y.shape(1);
        const uint8_t* wp = wa.data();
        const float* xp = xa.data();
        float* yp = y.mutable_data() + col;
        {
            py::gil_scoped_release release;
            std::vector<q::ActBlock> xq((size_t)(M * (K / 32)));
            q::quantize_activation_rows(xp, xq.data(), M, K, n_threads);
            q::matmul(t, wp, xq.data(), yp, M, N, K, ldy, accumulate, i, n_threads);
        }
        return y;
    }, py::arg("type"), py::arg("w"), py::arg("x"), py::arg("out"), py::arg("col") = 0,
       py::arg("accumulate") = false, py::arg("isa") = "auto", py::arg("n_threads") = 0,
       "out[:, col:col + N] (+)= x . W^T: quant::matmul with ldy = out.shape[1]");

    ops.def("quantize_activations", [](const py::object& x) {
        auto xa = checked<float>(x, "x", 2, "float32 array of shape (M, K)");
        const py::ssize_t M = xa.shape(0), K = xa.shape(1);
        if (K <= 0 || K % 32) bad("x.shape[1] = " + std::to_string(K) + ": activation rows hold whole blocks of 32");
        const py::ssize_t row = K / 32 * (py::ssize_t)sizeof(q::ActBlock);
        py::array_t<uint8_t> y({M, row});
        const float* xp = xa.data();
        auto* yp = reinterpret_cast<q::ActBlock*>(y.mutable_data());
        py::gil_scoped_release release;
        for (py::ssize_t m = 0; m < M; ++m) q::quantize_activations(xp + m * K, yp + m * (K / 32), K);
        return y;
    }, py::arg("x"), "the ActBlocks of each row of x, as bytes: uint8 [M, K / 32 * 48]");

    ops.def("gpu_repack", [](const py::object& type, const py::object& blocks, int64_t K, int64_t N,
                             int64_t first_row, const py::object& out) {
        const q::QType t = parse_type(type);
        checked_row_bytes(t, K, "K");
        auto w = checked<uint8_t>(blocks, "blocks", 2, "uint8 array of shape (n_rows, row_bytes)");
        const int64_t n_rows = weight_rows(w, t, K);
        if (N == 0) N = n_rows;
        if (N < 1 || first_row < 0 || first_row + n_rows > N)
            bad("rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + n_rows) +
                ") do not fit a matrix of N = " + std::to_string(N) + " rows");
        const py::ssize_t total = (py::ssize_t)brrr::qlayout::matrix_bytes((int)t, N, K);
        py::array_t<uint8_t> y;
        if (out.is_none()) {
            y = py::array_t<uint8_t>(total);
            std::memset(y.mutable_data(), 0, (size_t)total);  // the 16-byte alignment padding
        } else {
            y = output<uint8_t>(out, {total}, "uint8 (matrix_bytes,)");
        }
        const uint8_t* wp = w.data();
        uint8_t* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::qlayout::repack_rows((int)t, wp, first_row, n_rows, N, K, yp);
        return y;
    }, py::arg("type"), py::arg("blocks"), py::arg("K"), py::arg("N") = 0, py::arg("first_row") = 0,
       py::arg("out") = py::none(), "GGUF blocks -> the CUDA engine's tiles (cuda/qlayout.h)");

    ops.def("gpu_unpack", [](const py::object& type, const py::object& packed, int64_t N, int64_t K,
                             int64_t first_row, int64_t n_rows) {
        const q::QType t = parse_type(type);
        const size_t rb = checked_row_bytes(t, K, "K");
        if (N < 1) bad("N must be >= 1, got " + std::to_string(N));
        if (n_rows < 0) n_rows = N - first_row;
        if (first_row < 0 || first_row + n_rows > N)
            bad("rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + n_rows) +
                ") are not inside a matrix of N = " + std::to_string(N) + " rows");
        auto p = checked<uint8_t>(packed, "packed", 1, "uint8 array of shape (matrix_bytes,)");
        const size_t total = brrr::qlayout::matrix_bytes((int)t, N, K);
        if ((size_t)p.shape(0) != total)
            bad("packed holds " + std::to_string(p.shape(0)) + " bytes; a " + q::type_name(t) + " matrix of " +
                std::to_string(N) + " x " + std::to_string(K) + " takes " + std::to_string(total));
        py::array_t<uint8_t> y({(py::ssize_t)n_rows, (py::ssize_t)rb});
        const uint8_t* pp = p.data();
        uint8_t* yp = y.mutable_data();
        py::gil_scoped_release release;
        if (n_rows > 0) brrr::qlayout::unpack_rows((int)t, pp, first_row, n_rows, N, K, yp);
        return y;
    }, py::arg("type"), py::arg("packed"), py::arg("N"), py::arg("K"), py::arg("first_row") = 0,
       py::arg("n_rows") = -1, "the CUDA engine's tiles -> GGUF blocks (the inverse of gpu_repack)");
}
