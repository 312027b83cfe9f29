// cuda_flash_decode_lab.cu — variants of flash_decode's launch choices, each checked against a
// float64 reference and timed where it runs in the engine: in a CUDA graph, between PDL kernels
// that stream a weight matrix and then write q and this token's K/V row (what the fused QKV GEMV
// does before attention).
//
// This file includes attention_decode.cuh, so every variant runs the production kernel; they
// differ only in the fewest positions a split takes (DecodeArgs::min_chunk) and the threads per CTA
// (the kernel's THREADS; tuning.h's kDecodeMinChunk and kDecodeThreads), or in the splits a
// sequence may take where the shapes alone would give it one (16-18: at large batches the grid
// already fills the GPU, so decode_args() gives every (sequence, KV head) one CTA over its whole
// context), or in the kernel (19, 25, 28, 26: the register kernel, or the tensor-core kernel with
// 2, 3 or 4 stages, at any batch; launch_flash_decode takes the tensor-core kernel from
// tuning::kDecodeMmaMinCtas one-split CTAs on, with 4 stages where its grid takes no more waves
// than with 2, else 2). The serving mode skips the chunk variants (02-05),
// which change nothing once a sequence has one split. 01 is what ships (decode_args() and
// launch_flash_decode's choice). Variants that are gone with the code they measured (06, 08-11:
// first K/V rows after the PDL wait, the trigger at every head dim, the shared-memory tile kernel;
// 20-24: the cp.async ring kernel) are in docs/kernels/attention.md.
//
// The cache is paged (ops.h KvCache): the lab lays each slot out contiguously, [max_batch][max_seq]
// [Hkv][hd] with max_seq rounded up to a multiple of the block size, and gives the kernel the
// identity block table over it (slot s, block j -> block s * blocks_per_seq + j), so the reference
// and the stand-in below index the plain layout while the kernel reads every row through the table.
//
//   nvcc -O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr -Icsrc -DBRRR_WITH_CUDA \
//        -gencode=arch=compute_90a,code=sm_90a benchmarks/lab/cuda_flash_decode_lab.cu \
//        csrc/cuda/attention_decode.cu -o fd_lab
//   ./fd_lab check    every variant on odd lengths, batches and GQA groups; exit 1 on a failure
//   ./fd_lab bench    Llama-3.2-1B and Llama-3-8B heads at contexts 128..16384, JSON lines on stdout
//   ./fd_lab batch    the same heads at batches 2 to 256 of 1024 / 1536 positions each (serving);
//                     $LAB_VARIANTS picks variants by number (e.g. LAB_VARIANTS=01,20,25)
//   ./fd_lab short    the same heads at batches 4 to 64 of 136-384 positions, timed in the
//                     graphed chain as bench is; $LAB_VARIANTS as for batch
//   --block-size N    after either: the KV block size (16, 32, 64 or 128; default 16)
//   --fp8             after either: an e4m3 cache (kv.fp8; the reference reads the same values)
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention_decode_fp8_tile.cuh"
#include "cuda/attention_decode.cuh"
#include "lab_timing.cuh"

using brrr::cuda::bf16;

namespace lab {

using namespace brrr::cuda;
using brrr::bf16_to_f32;
using brrr::f32_to_bf16;

struct Variant {
    const char* name;
    int min_chunk;  // 0: the shipped value
    int threads;    // 0: the shipped value, else 128
    int splits;     // 0: decode_args()'s, else at least this many (within max_splits)
    int kernel;     // 0: launch_flash_decode's choice; -1 the register kernel at any batch; 2-4 the
                    // tensor-core kernel (128 threads) with that many stages at any batch (25, 28,
                    // 26); 5 (--fp8
                    // only) the tensor-core kernel's earlier e4m3 form at any batch
                    // (attention_decode_fp8_tile.cuh)
};

const Variant kVariants[] = {
    {"01_shipped", 0, 0, 0, 0},
    {"02_chunk128", 128, 0, 0, 0},
    {"03_chunk256", 256, 0, 0, 0},
    {"04_chunk512", 512, 0, 0, 0},
    {"05_one_chunk", 1 << 30, 0, 0, 0},
    {"07_threads128", 0, 128, 0, 0},
    {"16_splits2", 0, 0, 2, 0},
    {"17_splits4", 0, 0, 4, 0},
    {"18_splits8", 0, 0, 8, 0},
    {"19_registers", 0, 0, 0, -1},
    {"25_mma_2stages", 0, 0, 0, 2},
    {"26_mma_4stages", 0, 0, 0, 4},
    {"27_fp8_smem_tile", 0, 0, 0, 5},
    {"28_mma_3stages", 0, 0, 0, 3},
};

// --fp8: the caches hold e4m3 (the host keeps their values as bf16, exactly).
bool g_fp8 = false;

// $LAB_VARIANTS (comma-separated name prefixes, e.g. "01,20,25"): the variants batch mode times; all
// when unset.
bool selected(const Variant& v) {
    if (v.kernel == 5 && !g_fp8) return false;  // an e4m3 kernel only
    const char* env = std::getenv("LAB_VARIANTS");
    if (!env || !*env) return true;
    const std::string list = std::string(",") + env + ",";
    return list.find(std::string(",") + std::string(v.name).substr(0, 2) + ",") != std::string::npos;
}

DecodeArgs variant_args(const Variant& v, DecodeArgs a) {
    if (v.min_chunk) a.min_chunk = v.min_chunk;
    if (v.splits) a.n_splits = std::max(a.n_splits, std::min({v.splits, a.max_splits, kDecMaxSplits}));
    return a;
}

// The variant's kernel: the register kernel at any batch (256 or, 07, 128 threads), the
// tensor-core kernel with its stages at any batch, or launch_flash_decode's choice.
template <int HD, int STAGES, bool FP8>
void launch_mma_group(const DecodeArgs& a, int B, cudaStream_t s) {
    switch (decode_gmax(a.group)) {
        case 1: launch_decode_mma<HD, 1, 128, STAGES, FP8>(a, B, s); break;
        case 2: launch_decode_mma<HD, 2, 128, STAGES, FP8>(a, B, s); break;
        default: launch_decode_mma<HD, 4, 128, STAGES, FP8>(a, B, s); break;
    }
}
template <int HD, int STAGES>
void launch_mma(const DecodeArgs& a, int B, cudaStream_t s) {
    if (g_fp8) launch_mma_group<HD, STAGES, true>(a, B, s);
    else launch_mma_group<HD, STAGES, false>(a, B, s);
}
template <int HD, int THREADS>
void launch_registers(const DecodeArgs& a, int B, cudaStream_t s) {
    with_group_and_element(a, [&](auto gmax, auto fp8) {
        using Piece = std::conditional_t<decltype(fp8)::value, uint2, uint4>;
        launch_decode<HD, decltype(gmax)::value, THREADS, Piece>(a, B, s);
    });
}
template <int HD>
void launch_hd(const Variant& v, const DecodeArgs& a, int B, cudaStream_t s) {
    if (v.kernel == 2) launch_mma<HD, 2>(a, B, s);
    else if (v.kernel == 3) launch_mma<HD, 3>(a, B, s);
    else if (v.kernel == 4) launch_mma<HD, 4>(a, B, s);
    else if (v.kernel == 5) lab_fp8_tile::launch_group<HD>(a, B, s);
    else if (v.kernel == -1) launch_registers<HD, 256>(a, B, s);
    else launch_registers<HD, 128>(a, B, s);
}
void launch_variant(const Variant& v, const DecodeArgs& a, int B, int head_dim, cudaStream_t s) {
    if (v.kernel == 0 && v.threads == 0) launch_flash_decode(a, B, head_dim, s);
    else if (head_dim == 64) launch_hd<64>(v, a, B, s);
    else launch_hd<128>(v, a, B, s);
}

template <class T>
T* device_copy(const std::vector<T>& h) {
    T* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}


uint16_t round_to_e4m3_bits(uint16_t bf16_bits) {
    const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(bf16_to_f32(bf16_bits), __NV_SATFINITE, __NV_E4M3);
    const __half_raw h = __nv_cvt_fp8_to_halfraw(b, __NV_E4M3);
    return f32_to_bf16(__half2float(__half(h)));
}

// One decode problem: B sequences in distinct cache slots, each with its own length.
struct Problem {
    int Hq, Hkv, hd, max_seq, max_batch, max_splits;
    int block_size = 16;
    std::vector<int> lengths, slots;
    std::vector<uint16_t> q, k, v;  // q [B][Hq][hd]; caches [max_batch][max_seq][Hkv][hd]
    bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
    int *dslots = nullptr, *dpos = nullptr;
    int32_t* dtable = nullptr;  // the identity block table [max_batch][max_seq / block_size]
    float* dscratch = nullptr;
    size_t scratch_floats = 0;

    int B() const { return (int)lengths.size(); }
    int blocks_per_seq() const { return max_seq / block_size; }
    // Rounds max_seq up to whole blocks (the identity table's condition), then fills the caches.
    void build(std::mt19937& rng) {
        max_seq = CEIL_DIV(max_seq, block_size) * block_size;
        std::normal_distribution<float> n01;
        const size_t cache = (size_t)max_batch * max_seq * Hkv * hd;
        q.resize((size_t)B() * Hq * hd);
        k.assign(cache, 0xFFFF);  // NaN outside the valid rows: a stray read poisons the output
        v.assign(cache, 0xFFFF);
        for (auto& x : q) x = f32_to_bf16(n01(rng));
        for (int b = 0; b < B(); ++b)
            for (size_t i = 0; i < (size_t)lengths[b] * Hkv * hd; ++i) {
                const size_t at = (size_t)slots[b] * max_seq * Hkv * hd + i;
                k[at] = f32_to_bf16(n01(rng));
                v[at] = f32_to_bf16(n01(rng));
            }
        std::vector<int> pos(B());
        for (int b = 0; b < B(); ++b) pos[b] = lengths[b] - 1;
        dq = reinterpret_cast<bf16*>(device_copy(q));
        if (g_fp8) {
            std::vector<uint8_t> k8(k.size()), v8(v.size());
            for (size_t i = 0; i < k.size(); ++i) {
                k[i] = round_to_e4m3_bits(k[i]), v[i] = round_to_e4m3_bits(v[i]);
                k8[i] = __nv_cvt_float_to_fp8(bf16_to_f32(k[i]), __NV_SATFINITE, __NV_E4M3);
                v8[i] = __nv_cvt_float_to_fp8(bf16_to_f32(v[i]), __NV_SATFINITE, __NV_E4M3);
            }
            dk = reinterpret_cast<bf16*>(device_copy(k8));
            dv = reinterpret_cast<bf16*>(device_copy(v8));
        } else {
            dk = reinterpret_cast<bf16*>(device_copy(k));
            dv = reinterpret_cast<bf16*>(device_copy(v));
        }
        dslots = device_copy(slots);
        dpos = device_copy(pos);
        std::vector<int32_t> table((size_t)max_batch * blocks_per_seq());
        for (size_t i = 0; i < table.size(); ++i) table[i] = (int32_t)i;
        dtable = device_copy(table);
        CUDA_CHECK(cudaMalloc(&dout, (size_t)B() * Hq * hd * 2));
        scratch_floats = flash_decode_scratch_floats(B(), Hq, hd, max_splits);
        CUDA_CHECK(cudaMalloc(&dscratch, scratch_floats * 4));
        CUDA_CHECK(cudaMemset(dscratch, 0, scratch_floats * 4));
    }
    void free() {
        for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dout, (void*)dslots, (void*)dpos, (void*)dtable,
                        (void*)dscratch})
            cudaFree(p);
    }
    KvCache kv() const {
        KvCache c;
        c.k = dk;
        c.v = dv;
        c.pages = {dtable, blocks_per_seq(), block_size};
        c.n_blocks = max_batch * blocks_per_seq();
        c.max_seq = max_seq;
        c.fp8 = g_fp8;
        return c;
    }
    // flash_decode's arguments, with the checks flash_decode makes on the cache.
    DecodeArgs args() const {
        const KvCache c = kv();
        check_kv_cache("flash_decode lab", c);
        return decode_args(dq, c, dslots, dpos, dout, dscratch, B(), Hq, Hkv, hd, max_splits, false);
    }
    // softmax(q k^T / sqrt(hd)) v in float64 for sequence b, head h.
    std::vector<double> reference(int b, int h) const {
        const int kvh = h / (Hq / Hkv), L = lengths[b];
        std::vector<double> s(L), o(hd, 0.0);
        double mx = -INFINITY;
        for (int p = 0; p < L; ++p) {
            double dot = 0;
            for (int d = 0; d < hd; ++d)
                dot += (double)bf16_to_f32(q[((size_t)b * Hq + h) * hd + d]) *
                       bf16_to_f32(k[(((size_t)slots[b] * max_seq + p) * Hkv + kvh) * hd + d]);
            s[p] = dot / std::sqrt((double)hd);
            mx = std::max(mx, s[p]);
        }
        double sum = 0;
        for (int p = 0; p < L; ++p) sum += s[p] = std::exp(s[p] - mx);
        for (int p = 0; p < L; ++p)
            for (int d = 0; d < hd; ++d)
                o[d] += s[p] / sum * bf16_to_f32(v[(((size_t)slots[b] * max_seq + p) * Hkv + kvh) * hd + d]);
        return o;
    }
};

// Runs variant v twice on a poisoned output; checks both results and that the arrival counters
// are zero again after each call. Returns the number of failures printed.
int check_one(const Variant& v, Problem& pr) {
    int fails = 0;
    for (int call = 0; call < 2; ++call) {
        CUDA_CHECK(cudaMemset(pr.dout, 0xFF, (size_t)pr.B() * pr.Hq * pr.hd * 2));
        launch_variant(v, variant_args(v, pr.args()), pr.B(), pr.hd, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> out((size_t)pr.B() * pr.Hq * pr.hd);
        CUDA_CHECK(cudaMemcpy(out.data(), pr.dout, out.size() * 2, cudaMemcpyDeviceToHost));
        double err2 = 0, ref2 = 0, max_err = 0;
        bool finite = true;
        for (int b = 0; b < pr.B(); ++b)
            for (int h = 0; h < pr.Hq; ++h) {
                const std::vector<double> ref = pr.reference(b, h);
                for (int d = 0; d < pr.hd; ++d) {
                    const double got = bf16_to_f32(out[((size_t)b * pr.Hq + h) * pr.hd + d]);
                    finite = finite && std::isfinite(got);
                    err2 += (got - ref[d]) * (got - ref[d]);
                    ref2 += ref[d] * ref[d];
                    max_err = std::max(max_err, std::fabs(got - ref[d]));
                }
            }
        std::vector<float> scratch(pr.scratch_floats);
        CUDA_CHECK(cudaMemcpy(scratch.data(), pr.dscratch, scratch.size() * 4, cudaMemcpyDeviceToHost));
        int armed = 0;  // counters left non-zero
        const size_t per_seq = flash_decode_scratch_floats(1, pr.Hq, pr.hd, pr.max_splits);
        for (int b = 0; b < pr.B(); ++b)
            for (int h = 0; h < pr.Hq; ++h) armed += reinterpret_cast<const int*>(scratch.data() + b * per_seq)[h] != 0;
        const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
        // bf16 output: 2^-8 relative rounding per element; the reference is float64.
        const bool ok = finite && rel < 1e-2 && max_err < 2e-2 && armed == 0;
        if (!ok) {
            std::string lens;
            for (int L : pr.lengths) lens += std::to_string(L) + " ";
            std::printf("FAIL %s Hq=%d Hkv=%d hd=%d lengths=%s call %d: rel %.3g max %.3g finite %d counters %d\n",
                        v.name, pr.Hq, pr.Hkv, pr.hd, lens.c_str(), call, rel, max_err, (int)finite, armed);
            ++fails;
        }
    }
    return fails;
}

int check(int block_size) {
    std::mt19937 rng(7);
    struct Heads { int Hq, Hkv, hd; };
    const Heads heads[] = {{32, 8, 64}, {32, 8, 128}, {4, 4, 64}, {8, 4, 128}, {9, 3, 128}, {16, 1, 64}};
    // the last: enough sequences that decode_args() gives each one split (16-18 split them)
    std::vector<int> many(40);
    for (int b = 0; b < (int)many.size(); ++b) many[b] = 37 + 13 * b;
    const std::vector<std::vector<int>> batches = {
        {1}, {2}, {63}, {64}, {65}, {127}, {129}, {300}, {1000}, {4097}, {1, 64, 129, 2500}, many};
    int fails = 0, runs = 0;
    for (const Heads& hs : heads)
        for (const auto& lengths : batches) {
            Problem pr{hs.Hq, hs.Hkv, hs.hd, 4200, 5, 33, block_size};
            pr.lengths = lengths;
            for (int b = 0; b < pr.B(); ++b) pr.slots.push_back((b * 3 + 1) % pr.max_batch);
            pr.build(rng);
            for (const Variant& v : kVariants)
                if (v.kernel != 5 || g_fp8) fails += check_one(v, pr), runs += 2;
            pr.free();
        }
    std::printf("check: %d calls, %d failures (KV blocks of %d)\n", runs, fails, block_size);
    return fails ? 1 : 0;
}

// ---- timing: 16 layers of [QKV stand-in, flash_decode] in one CUDA graph ------------------------

// Streams its layer's weight and then writes q and this token's K/V row: what the fused QKV GEMV
// leaves for attention. Like the engine's GEMV it issues only its first loads before the PDL
// wait, so the decode kernel before it is not hidden behind the whole stream. The token's row is
// pos[0] of slot 0, row pos[0] of the pool under the identity table.
__global__ void qkv_stand_in(const uint4* __restrict__ weight, size_t n16, const bf16* __restrict__ q_src,
                             bf16* __restrict__ q, bf16* k_cache, bf16* v_cache, const int* __restrict__ pos,
                             int q_elems, int row_elems) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    uint32_t acc = i < n16 ? __ldcs(weight + i).x : 0u;
    pdl_wait();
    pdl_launch_dependents();
    for (i += stride; i < n16; i += stride) acc ^= __ldcs(weight + i).x;
    // One CTA finishes the stream's work for all: a reduction would only add time to the model.
    if (blockIdx.x != 0) return;
    const bf16 zero = __float2bfloat16_rn(acc == 0x12345678u ? 1.f : 0.f);  // keeps the stream live
    const size_t row = (size_t)pos[0] * row_elems;
    for (int j = threadIdx.x; j < q_elems; j += blockDim.x) q[j] = __hadd(q_src[j], zero);
    for (int j = threadIdx.x; j < row_elems; j += blockDim.x) {
        k_cache[row + j] = __hadd(k_cache[row + j], zero);
        v_cache[row + j] = __hadd(v_cache[row + j], zero);
    }
}

struct Timing {
    double chain_us;     // graph of 16 x [stand-in, decode] minus the graph of 16 stand-ins, per layer
    double isolated_us;  // graph of 16 decodes back to back, per call
    double stand_in_us;  // the graph of 16 stand-ins that chain_us subtracts, per layer
};

Timing time_variant(const Variant& v, Problem& pr, const std::vector<uint4*>& weights, size_t weight_bytes,
                    cudaStream_t s) {
    const int layers = (int)weights.size();
    bf16* q_src = nullptr;
    CUDA_CHECK(cudaMalloc(&q_src, (size_t)pr.B() * pr.Hq * pr.hd * 2));
    CUDA_CHECK(cudaMemcpy(q_src, pr.dq, (size_t)pr.B() * pr.Hq * pr.hd * 2, cudaMemcpyDeviceToDevice));
    auto stand_in = [&](int l) {
        launch_pdl(qkv_stand_in, dim3(132), dim3(512), 0, s, (const uint4*)weights[l], weight_bytes / 16,
                   (const bf16*)q_src, pr.dq, pr.dk, pr.dv, (const int*)pr.dpos, pr.Hq * pr.hd, pr.Hkv * pr.hd);
        CUDA_CHECK_LAUNCH("qkv_stand_in");
    };
    const double base = graph_replay_us(s, layers, stand_in);
    const DecodeArgs a = variant_args(v, pr.args());
    const double both = graph_replay_us(s, layers, [&](int l) {
        stand_in(l);
        launch_variant(v, a, pr.B(), pr.hd, s);
    });
    Timing t;
    t.isolated_us = graph_replay_us(s, layers, [&](int) { launch_variant(v, a, pr.B(), pr.hd, s); }) / layers;
    t.chain_us = (both - base) / layers;
    t.stand_in_us = base / layers;
    cudaFree(q_src);
    return t;
}

// The chain's heads and QKV weight shapes (Llama-3.2-1B, Llama-3-8B).
struct ChainShape { const char* name; int Hq, Hkv, hd, qkv_rows, dim; };
const ChainShape kChainShapes[] = {{"llama3.2-1b", 32, 8, 64, 3072, 2048}, {"llama3-8b", 32, 8, 128, 6144, 4096}};

// One QKV weight per layer, 16 of them: more than L2, as in the engine.
std::vector<uint4*> layer_weights(size_t bytes) {
    std::vector<uint4*> weights(16);
    for (auto& w : weights) {
        CUDA_CHECK(cudaMalloc(&w, bytes));
        CUDA_CHECK(cudaMemset(w, 1, bytes));
    }
    return weights;
}

int bench(int block_size) {
    std::mt19937 rng(11);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int contexts[] = {128, 256, 384, 1024, 4096, 16384};
    for (const ChainShape& sh : kChainShapes) {
        const size_t wbytes = (size_t)sh.qkv_rows * sh.dim * 2;
        std::vector<uint4*> weights = layer_weights(wbytes);
        for (int ctx : contexts) {
            Problem pr{sh.Hq, sh.Hkv, sh.hd, 16384, 1, 33, block_size};
            pr.lengths = {ctx};
            pr.slots = {0};
            pr.build(rng);
            const double kv_bytes = 2.0 * ctx * sh.Hkv * sh.hd * (g_fp8 ? 1 : 2);
            for (const Variant& v : kVariants) {
                if (v.splits || v.kernel == 5) continue;  // split 33 ways already; bf16 only here
                const Timing t = time_variant(v, pr, weights, wbytes, s);
                std::printf("{\"shape\": \"%s\", \"context\": %d, \"variant\": \"%s\", \"chain_us\": %.3f, "
                            "\"isolated_us\": %.3f, \"stand_in_us\": %.3f, \"kv_bytes\": %.0f, "
                            "\"isolated_GBps\": %.1f, \"block_size\": %d}\n",
                            sh.name, ctx, v.name, t.chain_us, t.isolated_us, t.stand_in_us, kv_bytes,
                            kv_bytes / (t.isolated_us * 1e3), block_size);
                std::fflush(stdout);
            }
            pr.free();
        }
        for (auto* w : weights) cudaFree(w);
    }
    cudaStreamDestroy(s);
    return 0;
}

// Serving's decode: B sequences of ctx positions each, every variant, isolated us per call (16
// calls back to back in a graph) and the KV bytes a call reads per second.
int bench_batch(int block_size) {
    std::mt19937 rng(13);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct Shape { const char* name; int Hq, Hkv, hd; };
    const Shape shapes[] = {{"llama3.2-1b", 32, 8, 64}, {"llama3-8b", 32, 8, 128}};
    for (const Shape& sh : shapes)
        for (int B : {2, 4, 8, 16, 32, 64, 256})
            for (int ctx : {1024, 1536}) {
                Problem pr{sh.Hq, sh.Hkv, sh.hd, ctx, B, 33, block_size};
                pr.lengths.assign(B, ctx);
                for (int b = 0; b < B; ++b) pr.slots.push_back(b);
                pr.build(rng);
                const double kv_bytes = 2.0 * B * ctx * sh.Hkv * sh.hd * (g_fp8 ? 1 : 2);
                for (const Variant& v : kVariants) {
                    if (v.min_chunk || !selected(v)) continue;
                    const DecodeArgs a = variant_args(v, pr.args());
                    const double us = graph_replay_us(s, 16, [&](int) { launch_variant(v, a, B, sh.hd, s); }) / 16;
                    std::printf("{\"shape\": \"%s\", \"batch\": %d, \"context\": %d, \"variant\": \"%s\", "
                                "\"splits\": %d, \"isolated_us\": %.3f, \"kv_bytes\": %.0f, \"GBps\": %.1f, "
                                "\"block_size\": %d}\n",
                                sh.name, B, ctx, v.name, a.n_splits, us, kv_bytes, kv_bytes / (us * 1e3), block_size);
                    std::fflush(stdout);
                }
                pr.free();
            }
    cudaStreamDestroy(s);
    return 0;
}

// Serving's decode at short contexts: B sequences of ctx positions each (a chat's first hundreds
// of tokens), every selected variant timed as bench does, in the graphed chain behind the QKV
// stand-in (16 layers of weights, more than L2), since a batch's KV at these lengths (8B heads,
// batch 16, 384 positions: 25 MB) would otherwise stay in L2 from one call to the next.
int bench_short(int block_size) {
    std::mt19937 rng(17);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (const ChainShape& sh : kChainShapes) {
        const size_t wbytes = (size_t)sh.qkv_rows * sh.dim * 2;
        std::vector<uint4*> weights = layer_weights(wbytes);
        for (int B : {4, 8, 16, 32, 64})
            for (int ctx : {136, 256, 384}) {
                Problem pr{sh.Hq, sh.Hkv, sh.hd, 512, B, 33, block_size};
                pr.lengths.assign(B, ctx);
                for (int b = 0; b < B; ++b) pr.slots.push_back(b);
                pr.build(rng);
                const double kv_bytes = 2.0 * B * ctx * sh.Hkv * sh.hd * 2;
                for (const Variant& v : kVariants) {
                    if (v.kernel == 5 || !selected(v)) continue;
                    const Timing t = time_variant(v, pr, weights, wbytes, s);
                    std::printf("{\"shape\": \"%s\", \"batch\": %d, \"context\": %d, \"variant\": \"%s\", "
                                "\"splits\": %d, \"chain_us\": %.3f, \"isolated_us\": %.3f, \"stand_in_us\": %.3f, "
                                "\"kv_bytes\": %.0f, \"block_size\": %d}\n",
                                sh.name, B, ctx, v.name, variant_args(v, pr.args()).n_splits, t.chain_us,
                                t.isolated_us, t.stand_in_us, kv_bytes, block_size);
                    std::fflush(stdout);
                }
                pr.free();
            }
        for (auto* w : weights) cudaFree(w);
    }
    cudaStreamDestroy(s);
    return 0;
}

}  // namespace lab

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    int block_size = 16;
    if (argc > 2 && std::string(argv[argc - 1]) == "--fp8") lab::g_fp8 = true, --argc;
    bool args_ok = argc == 2;
    if (argc == 4 && std::string(argv[2]) == "--block-size") {
        char* end = nullptr;
        const long n = std::strtol(argv[3], &end, 10);
        args_ok = *end == '\0' && (n == 16 || n == 32 || n == 64 || n == 128);
        if (!args_ok) std::fprintf(stderr, "--block-size must be 16, 32, 64 or 128, got '%s'\n", argv[3]);
        block_size = (int)n;
    }
    try {
        if (args_ok && mode == "check") return lab::check(block_size);
        // bench's QKV stand-in writes bf16 rows into the cache: batch mode only for e4m3.
        if (args_ok && mode == "bench" && !lab::g_fp8) return lab::bench(block_size);
        if (args_ok && mode == "batch") return lab::bench_batch(block_size);
        if (args_ok && mode == "short" && !lab::g_fp8) return lab::bench_short(block_size);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    std::fprintf(stderr, "usage: %s check|bench|batch|short [--block-size 16|32|64|128] [--fp8]\n", argv[0]);
    return 2;
}
