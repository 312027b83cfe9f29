// testing.cpp — _C.testing: every CUDA launcher of ops.h on raw device pointers (Python ints,
// e.g. torch's data_ptr()), for the kernel tests and benchmarks. Not part of the API: nothing
// checks that a pointer holds what the launcher reads.
//
// Each call launches on the current device's default stream, then synchronizes the device, so a
// failing kernel raises here (RuntimeError naming it) rather than in a later, unrelated call.
// Sizes are checked to fit an int; what a kernel needs to stay in bounds (head_dim, alignment,
// split-K scratch) is checked per op.
#include "bindings/bindings.h"

#ifdef BRRR_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cuda/engine_cuda.h"
#include "cuda/ops.h"

namespace brrr {
namespace bindings {

namespace {

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

// A paged KV cache from a test's arguments (ops.h KvCache): k, v pools of n_blocks * block_size
// rows and a device block table [slots][ceil(max_seq / block_size)]. block_table = 0 asks for the
// identity layout over caches shaped [slots, max_seq, Hkv, hd] (max_seq a multiple of
// block_size), which this object allocates for the call; `slots` then is one past the largest slot.
// fp8: the caches hold e4m3 bytes (a torch.float8_e4m3fn tensor), else bf16.
struct PagedKv {
    brrr::cuda::KvCache kv;
    int32_t* owned = nullptr;
    PagedKv(uintptr_t k_cache, uintptr_t v_cache, int64_t max_seq, uintptr_t block_table, int64_t block_size,
            int64_t n_blocks, int64_t slots, bool fp8 = false) {
        CudaOp::check_sizes({{"max_seq", max_seq}, {"block_size", block_size}, {"n_blocks", n_blocks}});
        if (block_size < 16 || block_size > 128 || (block_size & (block_size - 1)))
            bad_argument("block_size must be 16, 32, 64 or 128, got " + std::to_string(block_size));
        kv.k = CudaOp::ptr(k_cache, "k_cache");
        kv.v = CudaOp::ptr(v_cache, "v_cache");
        kv.fp8 = fp8;
        kv.max_seq = (int)max_seq;
        const int bps = (int)CEIL_DIV(max_seq, block_size);
        kv.pages = {nullptr, bps, (int)block_size};
        if (block_table) {
            if (n_blocks < 1) bad_argument("n_blocks (the pool's block count) must be >= 1 with a block_table");
            kv.pages.table = reinterpret_cast<const int32_t*>(block_table);
            kv.n_blocks = (int)n_blocks;
            return;
        }
        if (max_seq % block_size)
            bad_argument("without a block_table the caches are [slots, max_seq, Hkv, hd]: max_seq (" +
                         std::to_string(max_seq) + ") must be a multiple of block_size (" + std::to_string(block_size) + ")");
        std::vector<int32_t> identity((size_t)std::max<int64_t>(slots, 1) * bps);
        for (size_t i = 0; i < identity.size(); ++i) identity[i] = (int32_t)i;
        CudaOp::check(cudaMalloc(&owned, identity.size() * sizeof(int32_t)), "PagedKv");
        CudaOp::check(cudaMemcpy(owned, identity.data(), identity.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                      "PagedKv");
        kv.pages.table = owned;
        kv.n_blocks = (int)identity.size();
    }
    ~PagedKv() {
        if (owned) cudaFree(owned);
    }
    PagedKv(const PagedKv&) = delete;
    PagedKv& operator=(const PagedKv&) = delete;
    // One past the largest of n slots in device memory (the identity layout's slot count).
    static int64_t slot_count(uintptr_t slots, int64_t n) {
        if (!slots || n <= 0) return 1;
        std::vector<int32_t> h(n);
        CudaOp::check(cudaMemcpy(h.data(), reinterpret_cast<const void*>(slots), n * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost), "PagedKv");
        return (int64_t)*std::max_element(h.begin(), h.end()) + 1;
    }
    // Table rows [0, n_slots), on the host.
    std::vector<int32_t> host_rows(int n_slots) const {
        std::vector<int32_t> rows((size_t)n_slots * kv.pages.blocks_per_seq);
        CudaOp::check(cudaMemcpy(rows.data(), kv.pages.table, rows.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                      "PagedKv");
        return rows;
    }
    // The table row of `slot`, on the host.
    std::vector<int32_t> host_row(int slot) const {
        std::vector<int32_t> row(kv.pages.blocks_per_seq);
        CudaOp::check(cudaMemcpy(row.data(), kv.pages.table + (size_t)slot * row.size(), row.size() * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost), "PagedKv");
        return row;
    }
};

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

// testing.gemv_quant and testing.gemv_quant_mma: the same arguments, checked and turned into one
// EpilogueArgs (pointers the epilogue does not use may be 0; the launchers check the rest).
struct CudaQuantMatmul {
    static brrr::cuda::EpilogueArgs args(const char* op, int64_t type, int64_t M, int64_t N, int64_t K,
                                         int64_t epilogue, uintptr_t out, uintptr_t out_f32, uintptr_t residual,
                                         int64_t ld_out, uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                                         uintptr_t q_out, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
        CudaOp::check_sizes({{"M", M}, {"N", N}, {"K", K}, {"ld_out", ld_out}, {"n_heads", n_heads},
                             {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}});
        if (type < 0 || type > 255)
            bad_argument(std::string(op) + ": type must be a GGML type id, got " + std::to_string(type));
        if (epilogue < 0 || epilogue > 4)
            bad_argument(std::string(op) + ": epilogue must be 0 StoreBf16, 1 StoreF32, 2 AddResidual, 3 SwiGLU or "
                         "4 RopeKV, got " + std::to_string(epilogue));
        brrr::cuda::EpilogueArgs a;
        a.out_bf16 = reinterpret_cast<brrr::cuda::bf16*>(out);
        a.out_f32 = reinterpret_cast<float*>(out_f32);
        a.residual = reinterpret_cast<float*>(residual);
        a.ld_out = (int)ld_out;
        a.rope.positions = reinterpret_cast<const int*>(positions);
        a.rope.slots = reinterpret_cast<const int*>(slots);
        a.rope.inv_freq = reinterpret_cast<const float*>(inv_freq);
        a.rope.q_out = reinterpret_cast<brrr::cuda::bf16*>(q_out);
        a.rope.n_heads = (int)n_heads;
        a.rope.n_kv_heads = (int)n_kv_heads;
        a.rope.head_dim = (int)head_dim;
        return a;
    }
};

struct CudaAttention {
    static void check_heads(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
        if (head_dim != 64 && head_dim != 128)
            bad_argument("head_dim must be 64 or 128 on the GPU, got " + std::to_string(head_dim));
        if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads)
            bad_argument("n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" +
                         std::to_string(n_kv_heads) + ")");
    }
};

// The set-up the quantized-GEMM bindings share: the epilogue's arguments (with a RopeKV call's
// paged cache, kept alive beside them), W's parts (a Python list of (type, pointer, rows) in row
// order) and x.
struct QuantGemmCall {
    brrr::cuda::EpilogueArgs args;
    std::optional<PagedKv> paged;
    brrr::cuda::GemmWeightPart parts[brrr::cuda::kMaxWeightParts];
    int n_parts = 0;
    const brrr::cuda::bf16* x = nullptr;
};
void quant_gemm_call(const char* op, QuantGemmCall& c, const py::list& parts, uintptr_t x, int64_t M, int64_t N,
                     int64_t K, int64_t epilogue, uintptr_t out, uintptr_t out_f32, uintptr_t residual,
                     int64_t ld_out, const py::object& split, uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                     uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim, int64_t max_seq, uintptr_t block_table, int64_t block_size, int64_t n_blocks,
                     bool kv_fp8) {
    c.args = CudaQuantMatmul::args(op, 0, M, N, K, epilogue, out, out_f32, residual, ld_out, positions, slots,
                                   inv_freq, q_out, n_heads, n_kv_heads, head_dim);
    c.args.split = CudaMatmul::split_scratch(split);
    if (epilogue == 4) {
        c.paged.emplace(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, M),
                        kv_fp8);
        c.args.rope.kv = c.paged->kv;
    }
    if (parts.size() < 1 || parts.size() > (size_t)brrr::cuda::kMaxWeightParts)
        bad_argument(std::string(op) + ": parts must list 1 to " + std::to_string(brrr::cuda::kMaxWeightParts) +
                     " (type, W, rows) tuples, got " + std::to_string(parts.size()));
    int row0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
        const auto t = parts[i].cast<std::tuple<int64_t, uintptr_t, int64_t>>();
        CudaOp::check_sizes({{"part rows", std::get<2>(t)}});
        if (std::get<0>(t) < 0 || std::get<0>(t) > 255)
            bad_argument(std::string(op) + ": a part's type must be 0 (bf16) or a GGML type id, got " +
                         std::to_string(std::get<0>(t)));
        c.parts[i] = {(int)std::get<0>(t), CudaOp::ptr(std::get<1>(t), "W"), row0, (int)std::get<2>(t)};
        row0 += (int)std::get<2>(t);
    }
    c.n_parts = (int)parts.size();
    c.x = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(x, "x"));
}

// Defines testing.`name` on quantized parts: quant_gemm_call's keyword arguments, then one of type
// Extra... each (named in `more`, followed by the doc); run(c, M, N, K, epilogue, extra...) launches
// on the set-up c.
template <typename... Extra, typename Run, typename... More>
void def_quant_gemm(py::module_& testing, const char* name, Run run, More&&... more) {
    testing.def(
        name,
        [name, run](const py::list& parts, uintptr_t x, int64_t M, int64_t N, int64_t K, int64_t epilogue, uintptr_t out,
                    uintptr_t out_f32, uintptr_t residual, int64_t ld_out, const py::object& split,
                    uintptr_t positions, uintptr_t slots, uintptr_t inv_freq, uintptr_t q_out, uintptr_t k_cache,
                    uintptr_t v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                    uintptr_t block_table, int64_t block_size, int64_t n_blocks, bool kv_fp8, Extra... extra) {
            QuantGemmCall c;
            quant_gemm_call(name, c, parts, x, M, N, K, epilogue, out, out_f32, residual, ld_out, split, positions,
                            slots, inv_freq, q_out, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq,
                            block_table, block_size, n_blocks, kv_fp8);
            run(c, M, N, K, epilogue, extra...);
        },
        py::arg("parts"), py::arg("x"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
        py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
        py::arg("split") = py::none(), py::arg("positions") = 0, py::arg("slots") = 0, py::arg("inv_freq") = 0,
        py::arg("q_out") = 0, py::arg("k_cache") = 0, py::arg("v_cache") = 0, py::arg("n_heads") = 0,
        py::arg("n_kv_heads") = 0, py::arg("head_dim") = 0, py::arg("max_seq") = 0, py::arg("block_table") = 0,
        py::arg("block_size") = 16, py::arg("n_blocks") = 0, py::arg("kv_fp8") = false, std::forward<More>(more)...);
}

}  // namespace

void bind_testing(py::module_& m) {
    py::module_ testing = m.def_submodule(
        "testing", "CUDA launchers on raw device pointers, for tests and kernel benchmarks; not part of the API");

    testing.def("embed", [](uintptr_t tokens, uintptr_t table, uintptr_t x, int64_t M, int64_t D,
                             int64_t V, uintptr_t history, uintptr_t slots, uintptr_t positions,
                             int64_t max_batch, int64_t max_seq, int64_t vocab_offset, int64_t vocab_rows) {
        CudaOp::check_sizes({{"M", M}, {"D", D}, {"V", V}, {"max_batch", max_batch}, {"max_seq", max_seq},
                             {"vocab_offset", vocab_offset}, {"vocab_rows", vocab_rows}});
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
                          static_cast<float*>(CudaOp::ptr(x, "x")), (int)M, (int)D, (int)V, (int)vocab_offset,
                          (int)(vocab_rows ? vocab_rows : V - vocab_offset), record, 0);
        CudaOp::finish("testing.embed");
    }, py::arg("tokens"), py::arg("table"), py::arg("x"), py::arg("M"), py::arg("D"), py::arg("V"),
       py::arg("history") = 0, py::arg("slots") = 0, py::arg("positions") = 0, py::arg("max_batch") = 0,
       py::arg("max_seq") = 0, py::arg("vocab_offset") = 0, py::arg("vocab_rows") = 0,
       "x[m] = float(table[tokens[m] - vocab_offset]); tokens int32 [M], table bf16 [vocab_rows, D] "
       "(vocab_rows 0: V - vocab_offset), x f32 [M, D]; with a history (int32 [max_batch, max_seq]) "
       "also history[slots[m], positions[m]] = tokens[m]");

    testing.def("rmsnorm_residual", [](uintptr_t x, uintptr_t residual, uintptr_t w, uintptr_t y,
                                        int64_t M, int64_t D, float eps, bool residual_bf16) {
        CudaOp::check_sizes({{"M", M}, {"D", D}});
        if (!(eps > 0)) bad_argument("eps must be > 0, got " + std::to_string(eps));
        if (residual_bf16 && !residual) bad_argument("residual_bf16 needs a residual");
        py::gil_scoped_release release;
        float* xp = static_cast<float*>(CudaOp::ptr(x, "x"));
        const auto* wp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(w, "w"));
        auto* yp = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(y, "y"));
        if (residual_bf16)
            brrr::cuda::rmsnorm_add_bf16(xp, reinterpret_cast<const brrr::cuda::bf16*>(residual), wp, yp, (int)M,
                                         (int)D, eps, 0);
        else
            brrr::cuda::rmsnorm_residual(xp, residual ? reinterpret_cast<const float*>(residual) : nullptr, wp, yp,
                                         (int)M, (int)D, eps, 0);
        CudaOp::finish("testing.rmsnorm_residual");
    }, py::arg("x"), py::arg("residual"), py::arg("w"), py::arg("y"), py::arg("M"), py::arg("D"),
       py::arg("eps"), py::arg("residual_bf16") = false,
       "x += residual (residual = 0: none; fp32, or bf16 with residual_bf16: rmsnorm_add_bf16); "
       "y = bf16(x * rsqrt(mean(x^2) + eps) * w); x f32 [M, D]");

    testing.def("rope_kv_append", [](uintptr_t qkv, uintptr_t positions, uintptr_t slots,
                                      uintptr_t inv_freq, uintptr_t q_out, uintptr_t k_cache,
                                      uintptr_t v_cache, int64_t M, int64_t n_heads,
                                      int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, uintptr_t block_table,
                                      int64_t block_size, int64_t n_blocks, bool kv_fp8) {
        CudaOp::check_sizes({{"M", M}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
                             {"head_dim", head_dim}, {"max_seq", max_seq}});
        const PagedKv paged(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, M), kv_fp8);
        py::gil_scoped_release release;
        brrr::cuda::rope_kv_append(
            static_cast<const float*>(CudaOp::ptr(qkv, "qkv")), static_cast<const int*>(CudaOp::ptr(positions, "positions")),
            static_cast<const int*>(CudaOp::ptr(slots, "slots")), static_cast<const float*>(CudaOp::ptr(inv_freq, "inv_freq")),
            static_cast<brrr::cuda::bf16*>(CudaOp::ptr(q_out, "q_out")), paged.kv, (int)M, (int)n_heads,
            (int)n_kv_heads, (int)head_dim, 0);
        CudaOp::finish("testing.rope_kv_append");
    }, py::arg("qkv"), py::arg("positions"), py::arg("slots"), py::arg("inv_freq"), py::arg("q_out"),
       py::arg("k_cache"), py::arg("v_cache"), py::arg("M"), py::arg("n_heads"),
       py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("max_seq"), py::arg("block_table") = 0,
       py::arg("block_size") = 16, py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       "rotate-half RoPE of q and k from qkv f32 [M, (Hq+2Hkv)*hd]; q_out bf16 [M, Hq, hd]; k, v "
       "into the paged caches (PagedKv: by default [max_batch, max_seq, Hkv, hd]) at (slots[m], positions[m])");

    testing.def("sample_tokens", [](uintptr_t logits, uintptr_t history, uintptr_t slots,
                                     uintptr_t positions, const py::object& params,
                                     const py::object& step, int64_t V, int64_t max_seq) {
        auto st = checked_array<uint64_t>(step, "step", {-1}, "uint64 array of shape (B,)");
        const py::ssize_t B = st.shape(0);
        auto rows = sampling_rows(params, B);
        CudaOp::check_sizes({{"B", B}, {"V", V}, {"max_seq", max_seq}});
        if (B < 1 || V < 1) bad_argument("need B >= 1 rows and V >= 1 logits");
        const float* lg = static_cast<const float*>(CudaOp::ptr(logits, "logits"));
        const int* hist = static_cast<const int*>(CudaOp::ptr(history, "history"));
        const int* sl = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
        int* pos = static_cast<int*>(CudaOp::ptr(positions, "positions"));
        py::array_t<int32_t> tokens(B);
        py::array_t<float> logprobs(B);
        int32_t* tok_out = tokens.mutable_data();
        float* lp_out = logprobs.mutable_data();
        const brrr::SamplingParams* host_params = rows_of(rows);
        const uint64_t* host_steps = st.data();
        const size_t params_bytes = sizeof(brrr::SamplingParams) * B;
        const size_t steps_bytes = sizeof(uint64_t) * B;
        const size_t scratch_bytes = brrr::cuda::sample_scratch_bytes((int)B, (int)V);
        const size_t out_bytes = (sizeof(int) + sizeof(float)) * B;
        {
            py::gil_scoped_release release;
            // One temporary block: params | steps | outputs | scratch, each 256-byte aligned.
            auto up = [](size_t n) { return (n + 255) / 256 * 256; };
            const size_t total = up(params_bytes) + up(steps_bytes) + up(out_bytes) + scratch_bytes;
            void* raw = nullptr;
            CudaOp::check(cudaMalloc(&raw, total), "testing.sample_tokens: cudaMalloc of its scratch");
            std::unique_ptr<void, cudaError_t (*)(void*)> guard(raw, cudaFree);
            char* block = static_cast<char*>(raw);
            auto* d_params = reinterpret_cast<brrr::SamplingParams*>(block);
            auto* d_steps = reinterpret_cast<uint64_t*>(block + up(params_bytes));
            int* d_tokens = reinterpret_cast<int*>(block + up(params_bytes) + up(steps_bytes));
            float* d_logprobs = reinterpret_cast<float*>(d_tokens + B);
            void* d_scratch = block + up(params_bytes) + up(steps_bytes) + up(out_bytes);
            CudaOp::check(cudaMemcpy(d_params, host_params, params_bytes, cudaMemcpyHostToDevice),
                          "testing.sample_tokens: upload");
            CudaOp::check(cudaMemcpy(d_steps, host_steps, steps_bytes, cudaMemcpyHostToDevice),
                          "testing.sample_tokens: upload");
            brrr::cuda::sample_tokens(lg, hist, sl, pos, d_params, d_steps, (int)B, (int)V,
                                      (int)max_seq, d_scratch, d_tokens, d_logprobs,
                                      brrr::cuda::SampleFeedBack{}, 0);
            CudaOp::finish("testing.sample_tokens");
            CudaOp::check(cudaMemcpy(tok_out, d_tokens, sizeof(int) * B, cudaMemcpyDeviceToHost),
                          "testing.sample_tokens: download");
            CudaOp::check(cudaMemcpy(lp_out, d_logprobs, sizeof(float) * B, cudaMemcpyDeviceToHost),
                          "testing.sample_tokens: download");
        }
        return py::make_tuple(tokens, logprobs);
    }, py::arg("logits"), py::arg("history"), py::arg("slots"), py::arg("positions"),
       py::arg("params"), py::arg("step"), py::arg("V"), py::arg("max_seq"),
       "(tokens int32 [B], logprobs f32 [B]) from logits f32 [B, V] on the device by the rules of "
       "cpu/sampling.h; history int32 [max_batch, max_seq], slots/positions int32 [B] device "
       "pointers; params (sampling_params_dtype) and step (uint64) numpy arrays of shape (B,)");

    testing.def("fill_normal_bf16", [](uintptr_t p, uint64_t n, uint64_t key, float mean, float std) {
        if (!(std::isfinite(mean) && std::isfinite(std) && std >= 0))
            bad_argument("mean and std must be finite and std >= 0");
        py::gil_scoped_release release;
        brrr::cuda::fill_normal_bf16(static_cast<brrr::cuda::bf16*>(CudaOp::ptr(p, "p")), (size_t)n, key, mean,
                                     std, 0);
        CudaOp::finish("testing.fill_normal_bf16");
    }, py::arg("p"), py::arg("n"), py::arg("key"), py::arg("mean") = 0.f, py::arg("std") = 1.f,
       "p[i] = bf16(mean + std * z_i), z from the counter stream `key` (see init_random_key)");

    testing.def("init_random_key", [](uint64_t seed, uint64_t tensor_index) {
        return brrr::init_random_key(seed, (size_t)tensor_index);
    }, py::arg("seed"), py::arg("tensor_index"),
       "the fill_normal_bf16 key of canonical tensor `tensor_index` (weight_names order) under "
       "Engine.init_random(seed); norms use mean 1, everything else mean 0");

    testing.def("convert_f32_to_bf16", [](uintptr_t src, uintptr_t dst, uint64_t n) {
        py::gil_scoped_release release;
        brrr::cuda::convert_f32_to_bf16(static_cast<const float*>(CudaOp::ptr(src, "src")),
                                        static_cast<brrr::cuda::bf16*>(CudaOp::ptr(dst, "dst")), (size_t)n, 0);
        CudaOp::finish("testing.convert_f32_to_bf16");
    }, py::arg("src"), py::arg("dst"), py::arg("n"), "dst[i] = bf16(src[i]), round to nearest even");

    testing.def("add_bf16_into_f32", [](uintptr_t partial, uintptr_t x, uint64_t n) {
        py::gil_scoped_release release;
        brrr::cuda::add_bf16_into_f32(static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(partial, "partial")),
                                      static_cast<float*>(CudaOp::ptr(x, "x")), (size_t)n, 0);
        CudaOp::finish("testing.add_bf16_into_f32");
    }, py::arg("partial"), py::arg("x"), py::arg("n"),
       "x[i] += float(partial[i]) (tensor parallelism: summed bf16 partials into the residual)");

    // ---- matmuls and attention ----
    // Matmuls: x [M, K] bf16, W [N, K] bf16; epilogue 0 StoreBf16 (out), 1 StoreF32 (out_f32),
    // 2 AddResidual (residual += y), 3 SwiGLU (out [M, N/2] = silu(gate) * up). Pointers the
    // epilogue does not use may be 0; ld_out 0 means packed rows.
    testing.def("gemv_bf16", [](uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K, int64_t epilogue,
                                 uintptr_t out, uintptr_t out_f32, uintptr_t residual, int64_t ld_out,
                                 const std::string& path) {
        if (M > 16) bad_argument("gemv_bf16: M=" + std::to_string(M) + " rows; the GEMV takes at most 16");
        using brrr::cuda::GemvPath;
        if (path != "auto" && path != "cuda_cores" && path != "tensor_cores")
            bad_argument("gemv_bf16: path must be 'auto', 'cuda_cores' or 'tensor_cores', got '" + path + "'");
        const GemvPath chosen = path == "cuda_cores"     ? GemvPath::CudaCores
                                : path == "tensor_cores" ? GemvPath::TensorCores
                                                         : GemvPath::Auto;
        CudaMatmul::run("testing.gemv_bf16",
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
    // ---- quantized weights (qlayout tiles, GGML type ids) and int8 activations (quant::ActBlock,
    // 48 bytes per 32 values) ----
    testing.def("gemv_quant", [](int64_t type, uintptr_t W, uintptr_t xq, int64_t M, int64_t N, int64_t K,
                                  int64_t epilogue, uintptr_t out, uintptr_t out_f32, uintptr_t residual,
                                  int64_t ld_out, uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                                  uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache, int64_t n_heads,
                                  int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, uintptr_t x,
                                  uintptr_t x_f32, uintptr_t norm_w, double eps, uintptr_t scratch,
                                  uintptr_t block_table, int64_t block_size, int64_t n_blocks, bool kv_fp8,
                                  int64_t type1, uintptr_t W1, int64_t rows0, uintptr_t counters) {
        brrr::cuda::EpilogueArgs args =
            CudaQuantMatmul::args("gemv_quant", type, M, N, K, epilogue, out, out_f32, residual, ld_out, positions,
                                  slots, inv_freq, q_out, n_heads, n_kv_heads, head_dim);
        CudaOp::check_sizes({{"type1", type1}, {"rows0", rows0}});
        std::optional<PagedKv> paged;
        if (epilogue == 4) {
            paged.emplace(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, M), kv_fp8);
            args.rope.kv = paged->kv;
        }
        const void* wp = CudaOp::ptr(W, "W");
        brrr::cuda::QuantGemvInput in;
        in.xq = reinterpret_cast<const brrr::quant::ActBlock*>(xq);
        in.x = reinterpret_cast<const brrr::cuda::bf16*>(x);
        in.x_f32 = reinterpret_cast<const float*>(x_f32);
        in.norm_w = reinterpret_cast<const brrr::cuda::bf16*>(norm_w);
        in.eps = (float)eps;
        in.scratch = reinterpret_cast<brrr::quant::ActBlock*>(scratch);
        in.counters = reinterpret_cast<unsigned*>(counters);
        if (type1 != 0) {  // a matrix of two types: rows [0, rows0) in W, the rest of type1 in W1
            const void* w1p = CudaOp::ptr(W1, "W1");
            py::gil_scoped_release release;
            brrr::cuda::gemv_quant_pair((int)type, wp, (int)rows0, (int)type1, w1p, in, (int)M, (int)N, (int)K,
                                        static_cast<brrr::cuda::Epilogue>(epilogue), args, 0);
        } else if (x == 0 && x_f32 == 0) {
            const auto* xp = static_cast<const brrr::quant::ActBlock*>(CudaOp::ptr(xq, "xq"));
            py::gil_scoped_release release;
            brrr::cuda::gemv_quant((int)type, wp, xp, (int)M, (int)N, (int)K,
                                   static_cast<brrr::cuda::Epilogue>(epilogue), args, 0);
        } else {  // gemv_quant_in: the kernel (or the scratch path) quantizes the rows itself
            py::gil_scoped_release release;
            brrr::cuda::gemv_quant_in((int)type, wp, in, (int)M, (int)N, (int)K,
                                      static_cast<brrr::cuda::Epilogue>(epilogue), args, 0);
        }
        CudaOp::finish("testing.gemv_quant");
    }, py::arg("type"), py::arg("W"), py::arg("xq"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
       py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
       py::arg("positions") = 0, py::arg("slots") = 0, py::arg("inv_freq") = 0, py::arg("q_out") = 0,
       py::arg("k_cache") = 0, py::arg("v_cache") = 0, py::arg("n_heads") = 0, py::arg("n_kv_heads") = 0,
       py::arg("head_dim") = 0, py::arg("max_seq") = 0, py::arg("x") = 0, py::arg("x_f32") = 0,
       py::arg("norm_w") = 0, py::arg("eps") = 0.0, py::arg("scratch") = 0, py::arg("block_table") = 0,
       py::arg("block_size") = 16, py::arg("n_blocks") = 0, py::arg("kv_fp8") = false, py::arg("type1") = 0,
       py::arg("W1") = 0, py::arg("rows0") = 0, py::arg("counters") = 0,
       "decode GEMV on quantized weights (M <= 16): y = xq . dequant(W).T with the epilogue (as "
       "rmsnorm_matmul_bf16's); W = qlayout tiles (quant_ops.gpu_repack), xq = ActBlocks [M, K / 32]; "
       "or (xq = 0) gemv_quant_in on bf16 rows x or fp32 rows x_f32 normalized by norm_w, eps; "
       "type1 != 0: gemv_quant_pair, rows [0, rows0) of type `type` in W and the rest of type1 in W1; "
       "counters: gemv_quant_counter_words() zeroed int32 words (QuantGemvInput::counters) or 0");
    testing.def("gemv_quant_counter_words", []() { return brrr::cuda::kGemvQuantCounterWords; },
                "words of the counters argument of gemv_quant (QuantGemvInput::counters)");
    testing.def("gemv_quant_fuses_pair", [](int64_t type0, int64_t type1, int64_t epilogue) {
        return brrr::cuda::gemv_quant_fuses_pair((int)type0, (int)type1, static_cast<brrr::cuda::Epilogue>(epilogue));
    }, py::arg("type0"), py::arg("type1"), py::arg("epilogue"),
       "whether a matrix of parts of type0 then type1 runs as one gemv_quant launch (type1, W1, rows0)");
    testing.def("gemv_quant_mma", [](int64_t type, uintptr_t W, uintptr_t x, int64_t M, int64_t N, int64_t K,
                                      int64_t epilogue, uintptr_t out, uintptr_t out_f32, uintptr_t residual,
                                      int64_t ld_out, uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                                      uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache, int64_t n_heads,
                                      int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, uintptr_t block_table,
                                      int64_t block_size, int64_t n_blocks, bool kv_fp8) {
        brrr::cuda::EpilogueArgs args =
            CudaQuantMatmul::args("gemv_quant_mma", type, M, N, K, epilogue, out, out_f32, residual, ld_out,
                                  positions, slots, inv_freq, q_out, n_heads, n_kv_heads, head_dim);
        std::optional<PagedKv> paged;
        if (epilogue == 4) {
            paged.emplace(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, M), kv_fp8);
            args.rope.kv = paged->kv;
        }
        const void* wp = CudaOp::ptr(W, "W");
        const auto* xp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(x, "x"));
        py::gil_scoped_release release;
        brrr::cuda::gemv_quant_mma((int)type, wp, xp, (int)M, (int)N, (int)K,
                                   static_cast<brrr::cuda::Epilogue>(epilogue), args, 0);
        CudaOp::finish("testing.gemv_quant_mma");
    }, py::arg("type"), py::arg("W"), py::arg("x"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
       py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
       py::arg("positions") = 0, py::arg("slots") = 0, py::arg("inv_freq") = 0, py::arg("q_out") = 0,
       py::arg("k_cache") = 0, py::arg("v_cache") = 0, py::arg("n_heads") = 0, py::arg("n_kv_heads") = 0,
       py::arg("head_dim") = 0, py::arg("max_seq") = 0, py::arg("block_table") = 0, py::arg("block_size") = 16,
       py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       "decode GEMV on quantized weights on the tensor cores (M <= 64): y = x . bf16(dequant(W)).T with the "
       "epilogue (as gemv_quant's); W = qlayout tiles (quant_ops.gpu_repack), x = bf16 rows [M, K]");
    def_quant_gemm(testing, "gemm_quant", [](QuantGemmCall& c, int64_t M, int64_t N, int64_t K, int64_t epilogue) {
        py::gil_scoped_release release;
        brrr::cuda::gemm_quant(c.parts, c.n_parts, c.x, (int)M, (int)N, (int)K,
                               static_cast<brrr::cuda::Epilogue>(epilogue), c.args, 0);
        CudaOp::finish("testing.gemm_quant");
    },
       "prefill GEMM on quantized weights (Hopper): y = x . bf16(dequant(W)).T with the epilogue; W = parts, "
       "a list of (type, pointer, rows) in row order (type 0: bf16 [rows, K], else qlayout tiles), x = bf16 "
       "[M, K]; split as for gemm_bf16");
    def_quant_gemm<uintptr_t, int64_t>(testing, "gemm_dequant_slices", [](QuantGemmCall& c, int64_t M, int64_t N,
                                         int64_t K, int64_t epilogue, uintptr_t scratch, int64_t scratch_elems) {
        auto* sp = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(scratch, "scratch"));
        if (scratch_elems < 0) bad_argument("gemm_dequant_slices: scratch_elems must be >= 0, got " + std::to_string(scratch_elems));
        py::gil_scoped_release release;
        brrr::cuda::gemm_dequant_slices(c.parts, c.n_parts, c.x, (int)M, (int)N, (int)K,
                                        static_cast<brrr::cuda::Epilogue>(epilogue), c.args, sp, (size_t)scratch_elems, 0);
        CudaOp::finish("testing.gemm_dequant_slices");
    },
       py::arg("scratch") = 0, py::arg("scratch_elems") = 0,
       "prefill on quantized weights, any GPU: W (parts as gemm_quant's) dequantized into scratch "
       "[scratch_elems] bf16 a slice of output columns at a time, each slice through gemm_bf16");
    testing.def("gemm_dequant_slice_cols", [](int64_t M, int64_t N, int64_t K, int64_t epilogue, int64_t scratch_elems) {
        CudaOp::check_sizes({{"M", M}, {"N", N}, {"K", K}, {"scratch_elems", scratch_elems}});
        return brrr::cuda::gemm_dequant_slice_cols((int)M, (int)N, (int)K, static_cast<brrr::cuda::Epilogue>(epilogue),
                                                   (size_t)scratch_elems);
    }, py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"), py::arg("scratch_elems"),
       "the slice width (output columns) gemm_dequant_slices cuts such a call into");
    def_quant_gemm<uintptr_t, int64_t>(testing, "gemv_quant_wgmma", [](QuantGemmCall& c, int64_t M, int64_t N,
                                         int64_t K, int64_t epilogue, uintptr_t planes, int64_t plane_floats) {
        auto* pp = static_cast<float*>(CudaOp::ptr(planes, "planes"));
        if (plane_floats < 0) bad_argument("gemv_quant_wgmma: plane_floats must be >= 0, got " + std::to_string(plane_floats));
        py::gil_scoped_release release;
        brrr::cuda::gemv_quant_wgmma(c.parts, c.n_parts, c.x, (int)M, (int)N, (int)K,
                                     static_cast<brrr::cuda::Epilogue>(epilogue), c.args, pp, (size_t)plane_floats, 0);
        CudaOp::finish("testing.gemv_quant_wgmma");
    },
       py::arg("planes") = 0, py::arg("plane_floats") = 0,
       "decode batches of 17-64 rows on quantized weights of every kept type (Hopper): y = x . Wb.T with the "
       "epilogue, Wb as gemv_quant_mma decodes W; parts as gemm_quant's, planes fp32 scratch [plane_floats] "
       "(gemv_quant_wgmma_plane_floats)");
    testing.def("gemv_quant_wgmma_takes", [](const py::list& parts, int64_t M, int64_t K, int64_t plane_floats) {
        CudaOp::check_sizes({{"M", M}, {"K", K}, {"plane_floats", plane_floats}});
        brrr::cuda::GemmWeightPart p[brrr::cuda::kMaxWeightParts];
        if (parts.size() < 1 || parts.size() > (size_t)brrr::cuda::kMaxWeightParts)
            bad_argument("gemv_quant_wgmma_takes: parts must list 1 to " + std::to_string(brrr::cuda::kMaxWeightParts) +
                         " (type, rows) tuples");
        int N = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
            const auto t = parts[i].cast<std::tuple<int64_t, int64_t>>();
            p[i] = {(int)std::get<0>(t), nullptr, N, (int)std::get<1>(t)};
            N += (int)std::get<1>(t);
        }
        return brrr::cuda::gemv_quant_wgmma_takes(p, (int)parts.size(), (int)M, N, (int)K, (size_t)plane_floats);
    }, py::arg("parts"), py::arg("M"), py::arg("K"), py::arg("plane_floats"),
       "whether CudaEngine::matmul runs a matrix of these parts ((type, rows) in row order) on gemv_quant_wgmma "
       "at M rows, given planes of plane_floats floats");
    testing.def("gemv_quant_wgmma_plane_floats", [](int64_t M, int64_t N, int64_t K) {
        CudaOp::check_sizes({{"M", M}, {"N", N}, {"K", K}});
        return brrr::cuda::gemv_quant_wgmma_plane_floats((int)M, (int)N, (int)K);
    }, py::arg("M"), py::arg("N"), py::arg("K"), "the fp32 scratch gemv_quant_wgmma needs for such a call");
    testing.def("gemm_quant_available", []() { return brrr::cuda::gemm_quant_available(); },
                "whether gemm_quant runs on this device (Hopper, sm_90a image)");
    testing.def("quantize_act_bf16", [](uintptr_t x, uintptr_t xq, int64_t M, int64_t K) {
        CudaOp::check_sizes({{"M", M}, {"K", K}});
        const auto* xp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(x, "x"));
        auto* qp = static_cast<brrr::quant::ActBlock*>(CudaOp::ptr(xq, "xq"));
        py::gil_scoped_release release;
        brrr::cuda::quantize_act_bf16(xp, qp, (int)M, (int)K, 0);
        CudaOp::finish("testing.quantize_act_bf16");
    }, py::arg("x"), py::arg("xq"), py::arg("M"), py::arg("K"),
       "xq (ActBlocks, uint8 [M, K / 32 * 48]) = the int8 blocks of x bf16 [M, K]");
    testing.def("rmsnorm_quantize_act", [](uintptr_t x, uintptr_t norm_w, float eps, uintptr_t xq, int64_t M,
                                            int64_t K) {
        CudaOp::check_sizes({{"M", M}, {"K", K}});
        const auto* xp = static_cast<const float*>(CudaOp::ptr(x, "x"));
        const auto* wp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(norm_w, "norm_w"));
        auto* qp = static_cast<brrr::quant::ActBlock*>(CudaOp::ptr(xq, "xq"));
        py::gil_scoped_release release;
        brrr::cuda::rmsnorm_quantize_act(xp, wp, eps, qp, (int)M, (int)K, 0);
        CudaOp::finish("testing.rmsnorm_quantize_act");
    }, py::arg("x"), py::arg("norm_w"), py::arg("eps"), py::arg("xq"), py::arg("M"), py::arg("K"),
       "xq = the int8 blocks of rmsnorm(x) * norm_w in fp32; x f32 [M, K]");
    testing.def("dequantize_f32", [](int64_t type, uintptr_t W, uintptr_t out, int64_t N, int64_t K) {
        CudaOp::check_sizes({{"N", N}, {"K", K}});
        if (type < 0 || type > 255) bad_argument("dequantize_f32: type must be a GGML type id, got " + std::to_string(type));
        const void* wp = CudaOp::ptr(W, "W");
        auto* op = static_cast<float*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        brrr::cuda::dequantize_f32((int)type, wp, (int)N, (int)K, op, 0);
        CudaOp::finish("testing.dequantize_f32");
    }, py::arg("type"), py::arg("W"), py::arg("out"), py::arg("N"), py::arg("K"),
       "out f32 [N, K] = dequant(W), W in qlayout tiles");
    testing.def("dequantize_bf16", [](int64_t type, uintptr_t W, uintptr_t out, int64_t N, int64_t K, int64_t ld_out,
                                      int64_t row0, int64_t rows) {
        CudaOp::check_sizes({{"N", N}, {"K", K}, {"ld_out", ld_out}, {"row0", row0}, {"rows", rows}});
        if (type < 0 || type > 255) bad_argument("dequantize_bf16: type must be a GGML type id, got " + std::to_string(type));
        const void* wp = CudaOp::ptr(W, "W");
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        brrr::cuda::dequantize_bf16((int)type, wp, (int)N, (int)K, (int)row0, rows ? (int)rows : (int)(N - row0), op,
                                    (int)ld_out, 0);
        CudaOp::finish("testing.dequantize_bf16");
    }, py::arg("type"), py::arg("W"), py::arg("out"), py::arg("N"), py::arg("K"), py::arg("ld_out") = 0,
       py::arg("row0") = 0, py::arg("rows") = 0,
       "out bf16 [rows, ld_out] = rows [row0, row0 + rows) of dequant(W) [N, K] rounded to nearest (ld_out 0: K; "
       "rows 0: to N)");
    testing.def("embed_quant", [](uintptr_t tokens, int64_t type, uintptr_t table, uintptr_t x, int64_t M, int64_t D,
                                   int64_t V, uintptr_t history, uintptr_t slots, uintptr_t positions,
                                   int64_t max_batch, int64_t max_seq, int64_t vocab_offset, int64_t vocab_rows) {
        CudaOp::check_sizes({{"M", M}, {"D", D}, {"V", V}, {"max_batch", max_batch}, {"max_seq", max_seq},
                             {"vocab_offset", vocab_offset}, {"vocab_rows", vocab_rows}});
        if (type < 0 || type > 255) bad_argument("embed_quant: type must be a GGML type id, got " + std::to_string(type));
        brrr::cuda::TokenHistory record;
        if (history) {
            record.history = static_cast<int*>(CudaOp::ptr(history, "history"));
            record.slots = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
            record.positions = static_cast<const int*>(CudaOp::ptr(positions, "positions"));
            record.max_batch = (int)max_batch;
            record.max_seq = (int)max_seq;
        }
        const auto* tp = static_cast<const int*>(CudaOp::ptr(tokens, "tokens"));
        const void* wp = CudaOp::ptr(table, "table");
        auto* xp = static_cast<float*>(CudaOp::ptr(x, "x"));
        py::gil_scoped_release release;
        brrr::cuda::embed_quant(tp, (int)type, wp, xp, (int)M, (int)D, (int)V, (int)vocab_offset,
                                (int)(vocab_rows ? vocab_rows : V - vocab_offset), record, 0);
        CudaOp::finish("testing.embed_quant");
    }, py::arg("tokens"), py::arg("type"), py::arg("table"), py::arg("x"), py::arg("M"), py::arg("D"), py::arg("V"),
       py::arg("history") = 0, py::arg("slots") = 0, py::arg("positions") = 0, py::arg("max_batch") = 0,
       py::arg("max_seq") = 0, py::arg("vocab_offset") = 0, py::arg("vocab_rows") = 0,
       "x[m] = dequant(table row tokens[m] - vocab_offset) f32; table in qlayout tiles [vocab_rows, D]; "
       "vocabulary rows and history as testing.embed");
    // The tensor-core GEMM and the engine's matmul dispatch take the same arguments.
    const struct {
        const char* name;
        void (*launch)(const brrr::cuda::bf16*, const brrr::cuda::bf16*, int, int, int, brrr::cuda::Epilogue,
                       const brrr::cuda::EpilogueArgs&, cudaStream_t);
        const char* doc;
    } matmuls[] = {
        {"gemm_bf16", brrr::cuda::gemm_bf16,
         "tensor-core GEMM, any M: y = x @ W.T with the epilogue fused; split = (partials, floats, counters, "
         "n_counters) lends it split-K scratch (sizes: gemm_split_scratch_sizes; counters zeroed)"},
        {"matmul_bf16", brrr::cuda::matmul_bf16,
         "the engine's matmul: GEMV for small M, tensor-core GEMM above (split as for gemm_bf16)"},
    };
    for (const auto& matmul : matmuls) {
        const std::string op = std::string("testing.") + matmul.name;
        const auto launch = matmul.launch;
        testing.def(matmul.name, [op, launch](uintptr_t x, uintptr_t W, int64_t M, int64_t N, int64_t K,
                                              int64_t epilogue, uintptr_t out, uintptr_t out_f32,
                                              uintptr_t residual, int64_t ld_out, const py::object& split) {
            CudaMatmul::run(op.c_str(), launch, x, W, M, N, K, epilogue, out, out_f32, residual, ld_out, split);
        }, py::arg("x"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("epilogue"),
           py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0, py::arg("ld_out") = 0,
           py::arg("split") = py::none(), matmul.doc);
    }
    testing.def("gemm_split_scratch_sizes", [](int64_t sm_count) {
        if (sm_count < 1 || sm_count > 4096) bad_argument("gemm_split_scratch_sizes: sm_count must be in [1, 4096]");
        return py::make_tuple((int64_t)brrr::cuda::gemm_split_scratch_floats((int)sm_count),
                              (int64_t)brrr::cuda::gemm_split_scratch_counters((int)sm_count));
    }, py::arg("sm_count"), "(floats, counters) of the split-K scratch the engine gives its GEMMs");

    testing.def("rmsnorm_matmul_bf16", [](uintptr_t x, uintptr_t norm_w, float eps, uintptr_t W, int64_t M,
                                           int64_t N, int64_t K, int64_t epilogue, uintptr_t out,
                                           uintptr_t out_f32, uintptr_t residual, int64_t ld_out, uintptr_t xn,
                                           uintptr_t positions, uintptr_t slots, uintptr_t inv_freq,
                                           uintptr_t q_out, uintptr_t k_cache, uintptr_t v_cache, int64_t n_heads,
                                           int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                                           const py::object& split, uintptr_t block_table, int64_t block_size,
                                           int64_t n_blocks, bool kv_fp8) {
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
        args.rope.n_heads = (int)n_heads;
        args.rope.n_kv_heads = (int)n_kv_heads;
        args.rope.head_dim = (int)head_dim;
        args.split = CudaMatmul::split_scratch(split);
        std::optional<PagedKv> paged;
        if (epilogue == 4) {
            paged.emplace(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, M), kv_fp8);
            args.rope.kv = paged->kv;
        }
        const auto* xp = static_cast<const float*>(CudaOp::ptr(x, "x"));
        const auto* np = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(norm_w, "norm_w"));
        const auto* wp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(W, "W"));
        py::gil_scoped_release release;
        brrr::cuda::rmsnorm_matmul_bf16(xp, np, eps, wp, (int)M, (int)N, (int)K,
                                        static_cast<brrr::cuda::Epilogue>(epilogue), args,
                                        reinterpret_cast<brrr::cuda::bf16*>(xn), 0);
        CudaOp::finish("testing.rmsnorm_matmul_bf16");
    }, py::arg("x"), py::arg("norm_w"), py::arg("eps"), py::arg("W"), py::arg("M"), py::arg("N"), py::arg("K"),
       py::arg("epilogue"), py::arg("out") = 0, py::arg("out_f32") = 0, py::arg("residual") = 0,
       py::arg("ld_out") = 0, py::arg("xn") = 0, py::arg("positions") = 0, py::arg("slots") = 0,
       py::arg("inv_freq") = 0, py::arg("q_out") = 0, py::arg("k_cache") = 0, py::arg("v_cache") = 0,
       py::arg("n_heads") = 0, py::arg("n_kv_heads") = 0, py::arg("head_dim") = 0, py::arg("max_seq") = 0,
       py::arg("split") = py::none(), py::arg("block_table") = 0, py::arg("block_size") = 16,
       py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       "y = bf16(rmsnorm(x) * norm_w) @ W.T with the epilogue (4 RopeKV: q -> q_out, k/v -> caches "
       "at (slots[m], positions[m])); x f32 [M, K]; M > 16 uses xn bf16 [M, K] (and out_f32 [M, N] "
       "for RopeKV) as scratch");

    testing.def("flash_decode_scratch_floats", [](int64_t B, int64_t n_heads, int64_t head_dim, int64_t max_splits) {
        CudaOp::check_sizes({{"B", B}, {"n_heads", n_heads}, {"head_dim", head_dim}, {"max_splits", max_splits}});
        if (max_splits < 1) bad_argument("max_splits must be >= 1");
        return brrr::cuda::flash_decode_scratch_floats((int)B, (int)n_heads, (int)head_dim, (int)max_splits);
    }, py::arg("B"), py::arg("n_heads"), py::arg("head_dim"), py::arg("max_splits"),
       "floats of scratch flash_decode needs for this batch and split limit; zero it before the first call");
    testing.def("flash_decode", [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slots,
                                    uintptr_t positions, uintptr_t out, uintptr_t scratch, int64_t B,
                                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                                    int64_t max_splits, uintptr_t block_table, int64_t block_size, int64_t n_blocks, bool kv_fp8,
                                    bool early_trigger) {
        CudaOp::check_sizes({{"B", B}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
                             {"head_dim", head_dim}, {"max_seq", max_seq}, {"max_splits", max_splits}});
        CudaAttention::check_heads(n_heads, n_kv_heads, head_dim);
        if (max_seq < 1 || max_splits < 1) bad_argument("max_seq and max_splits must be >= 1");
        if (max_splits > 1 && scratch == 0)
            bad_argument("scratch must be a device buffer of flash_decode_scratch_floats() floats when max_splits > 1");
        if (q % 16 || k_cache % 16 || v_cache % 16)
            bad_argument("q, k_cache and v_cache must be 16-byte aligned (rows are read 16 bytes a lane)");
        const auto* qp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(q, "q"));
        const PagedKv paged(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, PagedKv::slot_count(slots, B), kv_fp8);
        const int* sp = static_cast<const int*>(CudaOp::ptr(slots, "slots"));
        const int* pp = static_cast<const int*>(CudaOp::ptr(positions, "positions"));
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        brrr::cuda::flash_decode(qp, paged.kv, sp, pp, op, reinterpret_cast<float*>(scratch), (int)B, (int)n_heads,
                                 (int)n_kv_heads, (int)head_dim, (int)max_splits, early_trigger, 0);
        CudaOp::finish("testing.flash_decode");
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"), py::arg("positions"),
       py::arg("out"), py::arg("scratch"), py::arg("B"), py::arg("n_heads"), py::arg("n_kv_heads"),
       py::arg("head_dim"), py::arg("max_seq"), py::arg("max_splits"), py::arg("block_table") = 0,
       py::arg("block_size") = 16, py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       py::arg("early_trigger") = false,
       "one query per sequence: q bf16 [B, Hq, hd] over the paged caches (PagedKv: by default [max_batch, max_seq, Hkv, hd]) "
       "positions [0, positions[b]] of slot slots[b] (int32 device arrays); out bf16 [B, Hq * hd]");
    testing.def("attention_prefill", [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, int64_t slot,
                                         int64_t start_pos, int64_t T, uintptr_t out, int64_t n_heads,
                                         int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, bool mma_sync,
                                         uintptr_t block_table, int64_t block_size, int64_t n_blocks, bool kv_fp8) {
        CudaOp::check_sizes({{"slot", slot}, {"start_pos", start_pos}, {"T", T}, {"n_heads", n_heads},
                             {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"max_seq", max_seq}});
        CudaAttention::check_heads(n_heads, n_kv_heads, head_dim);
        if (start_pos + T > max_seq)
            bad_argument("start_pos + T = " + std::to_string(start_pos + T) + " exceeds max_seq = " + std::to_string(max_seq));
        const auto* qp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(q, "q"));
        const PagedKv paged(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, slot + 1, kv_fp8);
        const std::vector<int32_t> row = paged.host_row((int)slot);
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        (mma_sync ? brrr::cuda::attention_prefill_mma_sync : brrr::cuda::attention_prefill)(
            qp, paged.kv, row.data(), (int)slot, (int)start_pos, (int)T, op, (int)n_heads, (int)n_kv_heads,
            (int)head_dim, 0);
        CudaOp::finish("testing.attention_prefill");
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slot"), py::arg("start_pos"),
       py::arg("T"), py::arg("out"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"),
       py::arg("max_seq"), py::arg("mma_sync") = false, py::arg("block_table") = 0, py::arg("block_size") = 16,
       py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       "causal prefill of T tokens at positions start_pos.. of cache slot `slot` (their K/V already "
       "in the cache): q bf16 [T, Hq, hd], out bf16 [T, Hq * hd]. mma_sync=True runs the pre-Hopper "
       "kernel whatever the GPU (Hopper runs TMA-fed wgmma otherwise)");
    testing.def("attention_prefill_segments", [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, uintptr_t segments,
                                                  int64_t n_segments, uintptr_t out, int64_t n_heads, int64_t n_kv_heads,
                                                  int64_t head_dim, int64_t max_seq, uintptr_t block_table,
                                                  int64_t block_size, int64_t n_blocks, bool kv_fp8) {
        CudaOp::check_sizes({{"n_segments", n_segments}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
                             {"head_dim", head_dim}, {"max_seq", max_seq}});
        CudaAttention::check_heads(n_heads, n_kv_heads, head_dim);
        const auto* segs = static_cast<const brrr::cuda::PrefillSegment*>(CudaOp::ptr(segments, "segments"));
        std::vector<brrr::cuda::PrefillSegment> host(n_segments);
        CudaOp::check(cudaMemcpy(host.data(), segs, host.size() * sizeof(host[0]), cudaMemcpyDeviceToHost),
                      "testing.attention_prefill_segments");
        int n_slots = 1;
        for (const auto& g : host) n_slots = std::max(n_slots, g.slot + 1);
        const PagedKv paged(k_cache, v_cache, max_seq, block_table, block_size, n_blocks, n_slots, kv_fp8);
        const std::vector<int32_t> tables = paged.host_rows(n_slots);
        const auto* qp = static_cast<const brrr::cuda::bf16*>(CudaOp::ptr(q, "q"));
        auto* op = static_cast<brrr::cuda::bf16*>(CudaOp::ptr(out, "out"));
        py::gil_scoped_release release;
        brrr::cuda::attention_prefill_segments(qp, paged.kv, segs, host.data(), tables.data(), (int)n_segments, op,
                                               (int)n_heads, (int)n_kv_heads, (int)head_dim, 0);
        CudaOp::finish("testing.attention_prefill_segments");
    }, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("segments"), py::arg("n_segments"),
       py::arg("out"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("max_seq"),
       py::arg("block_table") = 0, py::arg("block_size") = 16, py::arg("n_blocks") = 0, py::arg("kv_fp8") = false,
       "causal prefill of n segments in one launch: segments int32 [n, 4] on the device, each (row0, slot, "
       "start_pos, rows), its rows [row0, row0 + rows) of q bf16 [rows, Hq, hd] and out bf16 [rows, Hq * hd] "
       "the tokens at positions start_pos.. of `slot` (their K/V already in the cache)");
}

}  // namespace bindings
}  // namespace brrr

#endif  // BRRR_WITH_CUDA
