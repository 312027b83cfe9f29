// cpu_ops.cpp — _C.cpu_ops: the CPU kernels on numpy float32 arrays, for tests. Each returns a
// new array, or writes into `out=` when given (tests pass NaN-poisoned arrays there to catch
// unwritten elements).
//   rmsnorm(x[M, D], w[D], eps, out=None) -> [M, D]
//   matmul(x[M, K], w[N, K], w_dtype="f32"|"bf16", out=None, accumulate=False) -> [M, N]
//   rope(x[M, W], positions[int32 M], inv_freq[hd/2], n_heads, head_dim) -> rotated copy
//   attention(q[M, H*hd], k_cache[S, KV*hd], v_cache[S, KV*hd], positions[int32 M], n_heads,
//             n_kv_heads, head_dim, out=None) -> [M, H*hd]   row m sees cache rows [0, pos[m]]
//   swiglu(h13[M, 2H], out=None) -> [M, H]
//   sample_row(logits[V], history[int32 n], temperature=0, top_k=0, top_p=1, min_p=0,
//              repetition_penalty=1, seed=0, step=0) -> (token, logprob)
#include "bindings/bindings.h"

#include "cpu/kernels.h"
#include "cpu/sampling.h"

namespace brrr {
namespace bindings {

namespace {

// `out` as a checked [rows, cols] float32 array, or a new one when None.
py::array_t<float> output_array(const py::object& out, py::ssize_t rows, py::ssize_t cols) {
    if (out.is_none()) return py::array_t<float>({rows, cols});
    return checked_array<float>(out, "out", {rows, cols}, "float32 array matching the result shape");
}

}  // namespace

void bind_cpu_ops(py::module_& m) {
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
        brrr::cpu::matmul(xp, wp, t, yp, (int)M, (int)N, (int)K, (int)N, accumulate);
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
                            const py::object& out, const py::object& block_table, int block_size) {
        if (n_heads < 1 || n_kv_heads < 1 || head_dim < 1 || n_heads % n_kv_heads)
            bad_argument("need n_heads a positive multiple of n_kv_heads >= 1 and head_dim >= 1");
        if (block_size < 1 || (block_size & (block_size - 1)))
            bad_argument("block_size must be a power of two, got " + std::to_string(block_size));
        auto qa = checked_array<float>(q, "q", {-1, (py::ssize_t)n_heads * head_dim},
                                       "float32 array of shape (M, n_heads*head_dim)");
        const py::ssize_t M = qa.shape(0);
        auto ka = checked_array<float>(k_cache, "k_cache", {-1, (py::ssize_t)n_kv_heads * head_dim},
                                       "float32 array of shape (S, n_kv_heads*head_dim)");
        const py::ssize_t S = ka.shape(0);
        auto va = checked_array<float>(v_cache, "v_cache", {S, (py::ssize_t)n_kv_heads * head_dim},
                                       "float32 array shaped like k_cache");
        auto pos = checked_array<int32_t>(positions, "positions", {M}, "int32 array of shape (M,)");
        // The pool's blocks in position order: the given table, else the cache rows as they lie.
        std::vector<int32_t> table;
        if (block_table.is_none()) {
            for (py::ssize_t b = 0; b < CEIL_DIV(S, (py::ssize_t)block_size); ++b) table.push_back((int32_t)b);
        } else {
            auto t = checked_array<int32_t>(block_table, "block_table", {-1}, "int32 array of shape (n_blocks,)");
            table.assign(t.data(), t.data() + t.shape(0));
            for (size_t i = 0; i < table.size(); ++i)
                if (table[i] < 0 || ((py::ssize_t)table[i] + 1) * block_size > S)
                    bad_argument("block_table[" + std::to_string(i) + "] = " + std::to_string(table[i]) +
                                 " is not a whole block of the cache's " + std::to_string(S) + " rows");
        }
        const py::ssize_t covered = std::min((py::ssize_t)table.size() * block_size, S);
        for (py::ssize_t i = 0; i < M; ++i)
            if (pos.data()[i] < 0 || pos.data()[i] >= covered)
                bad_argument("positions[" + std::to_string(i) + "] = " + std::to_string(pos.data()[i]) +
                             " is outside the cache [0, " + std::to_string(covered) + ")");
        auto y = output_array(out, M, (py::ssize_t)n_heads * head_dim);
        const std::vector<int32_t> slots(M, 0);
        const brrr::KvPages pages{table.data(), (int)table.size(), block_size};
        const float *qp = qa.data(), *kp = ka.data(), *vp = va.data();
        const int32_t* pp = pos.data();
        float* yp = y.mutable_data();
        py::gil_scoped_release release;
        brrr::cpu::attention(qp, n_heads * head_dim, kp, vp, pages, n_kv_heads * head_dim, slots.data(), pp,
                             yp, (int)M, n_heads, n_kv_heads, head_dim);
        return y;
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("positions"), py::arg("n_heads"),
       py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("out") = py::none(),
       py::arg("block_table") = py::none(), py::arg("block_size") = 16,
       "causal GQA attention: row m attends to cache positions [0, positions[m]]; position p is "
       "cache row block_table[p / block_size] * block_size + p % block_size (default: row p)");

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

    ops.def("round_to_e4m3", [](const py::object& x) {
        auto xa = checked_array<float>(x, "x", {-1}, "float32 array of shape (n,)");
        py::array_t<float> y(xa.shape(0));
        std::copy(xa.data(), xa.data() + xa.shape(0), y.mutable_data());
        brrr::cpu::round_to_e4m3(y.mutable_data(), (size_t)xa.shape(0));
        return y;
    }, py::arg("x"), "x rounded to the nearest e4m3 value (ties to even, saturating at +-448)");

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
        const std::string problem = brrr::sampling_params_problem(p);
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
}

}  // namespace bindings
}  // namespace brrr
