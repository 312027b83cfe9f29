// decode_persistent.cu — every layer of a batch-1 decode step in one kernel (sm_90a).
//
//   x [D] fp32, the residual stream of the one sequence, updated in place. Per layer, the steps of
//   forward_decode (forward.cu) in the same order, each a phase of this kernel:
//     QKV   q, cache[k, v] = rope(rmsnorm(x) * attn_norm · wqkv^T)
//     ATTN  att = attention(q, cache)                       (flash_decode_block, flash_decode.cuh)
//     WO    x += att · wo^T
//     W13   hb = silu(xn · w1^T) * (xn · w3^T), xn = rmsnorm(x) * ffn_norm
//     W2    x += hb · w2^T
//   The final norm and the LM head stay a GEMV kernel after this one.
//
// Why one kernel: at batch 1 each step is a few microseconds of weight streaming, and between two
// kernels the stream stops: the next grid's CTAs become resident only as the last ones of the
// previous grid drain, and each pays launch, first-byte latency and its x staging before its
// bandwidth ramps up. PDL and early weight loads hid part of it; five such boundaries per layer
// still cost about 20% of the 1B decode step (issue 3's figures).
//
// The trick: weights never depend on activations. One CTA per SM, all resident (cooperative
// launch); phases are separated by a grid barrier (an atomic counter in global memory). Each of
// the CTA's 8 warps streams its own future W rows into its own ring of 4 KB slots in shared memory
// with cp.async, `slots` pieces ahead of what it is consuming, across phase and layer boundaries:
// while the warps wait at a barrier, run attention or stage x, the rows of the next phases keep
// arriving, up to the rings' capacity (128-160 KB a CTA, 17-21 MB over the GPU, 6-7 us of HBM
// time). Lane l copies the 16-byte vectors of a piece it will itself read, so a lane waits only
// for its own copies (cp.async.wait_group), never for another lane's or warp's.
//   Not TMA: a first form fed the rings from a producer warp by 1-D bulk copies (TMA); the stream
// itself then topped out near 2.5 TB/s (H100, consumers doing no arithmetic: 69% of the copy rate
// at 1B; 4 or 8 KB copies, one or eight issuing lanes alike; benchmarks/lab/
// cuda_decode_persistent_lab.cu at 49d6c7a). The cp.async loads take the path the GEMV's
// ld.global streams take.
//
// Work split: in each matmul phase the CTA owns a contiguous range of units (one W row, or the
// gate/up or RoPE rotation pair, as in gemv.cu), and warp w takes units w, w + 8, ... of it.
//
// Same bits as the per-step kernels: a sequence decoded alone (this kernel) and inside a batch
// (gemv.cu, flash_decode) must agree exactly. So each row's dot product runs as in gemv.cu at
// M = 1 (lane l takes the 16-byte vectors l, l + 32, ... of the row in order, then the butterfly),
// the RMSNorm's sums run on 128 threads in gemv.cu's order (gemv_math.cuh), the epilogues are
// kernel_util.cuh's, and attention is flash_decode's CTA code with flash_decode's splits. Data
// written by other CTAs of this grid is read through L2 only (ld.cg, cp.async.cg).
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/flash_decode.cuh"
#include "cuda/gemv_math.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

using gemv_math::Pairing;

constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * kConsumerWarps;  // 256: also the flash_decode CTA size
// Lab knobs: benchmarks/lab/run_decode_persistent_lab.sh builds variants with -D; the engine
// builds the defaults.
#ifndef BRRR_DP_PIECE_BYTES
#define BRRR_DP_PIECE_BYTES 4096
#endif
#ifndef BRRR_DP_NO_MATH
#define BRRR_DP_NO_MATH 0
#endif
constexpr int kPieceBytes = BRRR_DP_PIECE_BYTES;  // one ring slot: a multiple of 512 (32 lanes x 16 B)
constexpr int kMaxSlots = 8;                      // ring slots a warp (cp.async.wait_group takes 0..7)

struct KernelArgs {
    PersistentDecode p;
    DecodeArgs attn;  // flash_decode's arguments for B = 1; the caches are set per layer
    int slots;        // ring slots per warp
    int work_off;     // shared memory: ring | work (x staging or attention)
    // Lab only (benchmarks/lab/cuda_decode_persistent_lab.cu): when set, thread 0 of each CTA
    // writes the global timer at every phase boundary ([CTA][layer][kTraceEventsPerLayer]).
    unsigned long long* trace;
    // Trace events per layer: QKV staged, arrived, left; ATTN arrived, left; then staged, arrived,
    // left for WO, W13 and W2.
    static constexpr int kTraceEventsPerLayer = 14;
};


// The device code exists only in the sm_90a image (the extension is also built for sm_80).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kNormThreads = 128;       // gemv.cu's CTA size: the RMSNorm sums' order
constexpr int kPieceVecs = kPieceBytes / 16;  // 16-byte vectors per slot: a multiple of 32

// One matmul phase: which matrix, and how its output splits into units.
struct MatmulPhase {
    const bf16* W;  // [rows, K]
    int K, units, half_n;
    Pairing pairing;
    __device__ int rows_per_unit() const { return pairing == Pairing::None ? 1 : 2; }
    __device__ int pieces_per_row() const { return CEIL_DIV(K * 2, kPieceBytes); }
    __device__ int piece_bytes(int q) const { return min(kPieceBytes, K * 2 - q * kPieceBytes); }
};

enum Step { kQKV = 0, kWo = 1, kW13 = 2, kW2 = 3 };

__device__ MatmulPhase matmul_phase(const PersistentDecode& p, const DecodeLayer& L, int step) {
    const int q_dim = p.n_heads * p.head_dim;
    switch (step) {
        case kQKV: return {L.wqkv, p.dim, (p.n_heads + 2 * p.n_kv_heads) * p.head_dim / 2, p.head_dim / 2, Pairing::Rope};
        case kWo: return {L.wo, q_dim, p.dim, 0, Pairing::None};
        case kW13: return {L.w13, p.dim, p.hidden, p.hidden, Pairing::SwiGLU};
        default: return {L.w2, p.hidden, p.dim, 0, Pairing::None};
    }
}

// This CTA's units of a phase: a contiguous share, sizes differing by at most one.
__device__ int2 cta_units(int units) {
    return make_int2((int)((long long)units * blockIdx.x / gridDim.x),
                     (int)((long long)units * (blockIdx.x + 1) / gridDim.x));
}

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void trace_event(const KernelArgs& a, int& event) {
    if (a.trace && threadIdx.x == 0) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        a.trace[(size_t)blockIdx.x * a.p.n_layers * KernelArgs::kTraceEventsPerLayer + event] = now;
    }
    ++event;
}

// Every consumer of every CTA has finished the phase and its writes are visible to all: the CTA's
// warps meet, then thread 0 adds one arrival with release semantics (covering the writes the
// meeting ordered before it) and waits with acquire loads for all gridDim.x. `target` (thread
// 0's) counts the arrivals this CTA waits for; the launcher zeroes the counter.
__device__ void grid_barrier(const KernelArgs& a, unsigned& target, int& event) {
    __syncthreads();
    trace_event(a, event);
    if (threadIdx.x == 0) {
        target += gridDim.x;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.p.barrier) : "memory");
        while (ld_acquire_gpu(a.p.barrier) < target) {
        }
    }
    __syncthreads();
    trace_event(a, event);
}

// ---- the weight stream: each warp copies its own future rows into its ring -------------------

// The pieces one warp streams, in the order it consumes them: layer, step, unit (warp, warp + 8,
// ... of the CTA's units), row of the unit, piece of the row. It runs `slots` pieces ahead of the
// consumption, across phase and layer boundaries: weights never depend on activations.
struct PieceCursor {
    const PersistentDecode* p;
    int warp, l, step, u, pc, pieces, ppr, K, half_n;
    int2 mine, rows;
    const char* W;
    Pairing pairing;
    bool done;

    __device__ PieceCursor(const PersistentDecode& pd, int w) : p(&pd), warp(w), l(0), step(kQKV), done(false) {
        open();
    }
    // Settles on phase (l, step) at this warp's first unit, or the next phase that has one.
    __device__ void open() {
        for (; l < p->n_layers; step == kW2 ? (step = kQKV, ++l) : ++step) {
            const MatmulPhase ph = matmul_phase(*p, p->layers[l], step);
            mine = cta_units(ph.units);
            u = mine.x + warp;
            if (u >= mine.y) continue;
            W = reinterpret_cast<const char*>(ph.W);
            K = ph.K;
            half_n = ph.half_n;
            pairing = ph.pairing;
            ppr = ph.pieces_per_row();
            pieces = ph.rows_per_unit() * ppr;
            rows = gemv_math::unit_rows(pairing, u, half_n);
            pc = 0;
            return;
        }
        done = true;
    }
    __device__ void next() {
        if (++pc < pieces) return;
        pc = 0;
        u += kConsumerWarps;
        if (u < mine.y) {
            rows = gemv_math::unit_rows(pairing, u, half_n);
            return;
        }
        step == kW2 ? (step = kQKV, ++l) : ++step;
        open();
    }
    // This lane's share of the current piece into `slot` (lane l copies the 16-byte vectors l,
    // l + 32, ...: exactly those it reads when it consumes the piece, so no other lane's copy is
    // ever waited for), as one cp.async group; past the last piece an empty group, which keeps
    // the count of groups in flight the same.
    __device__ void issue(unsigned char* slot, int lane) {
        if (!done) {
            const int second = pc >= ppr, q = pc - (second ? ppr : 0);
            const size_t row = second ? rows.y : rows.x;
            const char* src = W + row * K * 2 + (size_t)q * kPieceBytes;
            const int n16 = min(kPieceBytes, K * 2 - q * kPieceBytes) / 16;
            for (int v = lane; v < n16; v += 32) ptx::cp_async_16(slot + 16 * v, src + 16 * v, true);
            next();
        }
        ptx::cp_async_commit();
    }
};

// cp.async.wait_group with a run-time count: all but the newest n groups of this thread landed.
__device__ __forceinline__ void cp_async_wait_newest(int n) {
    switch (n) {
        case 0: ptx::cp_async_wait<0>(); break;
        case 1: ptx::cp_async_wait<1>(); break;
        case 2: ptx::cp_async_wait<2>(); break;
        case 3: ptx::cp_async_wait<3>(); break;
        case 4: ptx::cp_async_wait<4>(); break;
        case 5: ptx::cp_async_wait<5>(); break;
        case 6: ptx::cp_async_wait<6>(); break;
        default: ptx::cp_async_wait<7>(); break;
    }
}

// One warp's ring: `slots` pieces of kPieceBytes, the cursor `slots` pieces ahead of `taken`.
struct WarpRing {
    unsigned char* base;
    int slots;
    uint32_t taken;
    PieceCursor ahead;

    __device__ WarpRing(unsigned char* ring, int n_slots, const PersistentDecode& p, int warp, int lane)
        : base(ring + (size_t)warp * n_slots * kPieceBytes), slots(n_slots), taken(0), ahead(p, warp) {
        for (int s = 0; s < slots; ++s) ahead.issue(base + (size_t)s * kPieceBytes, lane);
    }
    // The next piece, landed (this lane's vectors of it).
    __device__ const uint4* wait_next() {
        cp_async_wait_newest(slots - 1);
        return reinterpret_cast<const uint4*>(base + (size_t)(taken % slots) * kPieceBytes);
    }
    // The piece wait_next gave is consumed: its slot takes the piece `slots` further on.
    __device__ void release(int lane) {
        __syncwarp();  // every lane's reads of the slot come before any copy into it
        ahead.issue(base + (size_t)(taken % slots) * kPieceBytes, lane);
        ++taken;
    }
};

// ---- the consumers ----------------------------------------------------------------------------

// xs = bf16(x * rstd * norm_w), K values (K % 8 == 0). The sum of squares runs on the first 128
// threads exactly as in one gemv.cu CTA; they also keep x in shared memory (xf, K floats), so x
// crosses from L2 once.
__device__ void stage_normalized(const float* x, const bf16* norm_w, int K, float eps, uint4* xs, float4* xf) {
    __shared__ float warp_sums[kNormThreads / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < kNormThreads) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (int i = threadIdx.x; i < K / 4; i += kNormThreads) xf[i] = __ldcg(x4 + i);
        const float s = util::warp_sum(gemv_math::row_sq_sum_vec<kNormThreads, false>(
            reinterpret_cast<const float*>(xf), K, threadIdx.x));
        if (lane == 0) warp_sums[warp] = s;
    }
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
    const float r = gemv_math::row_rstd_from_sum(total, K, eps);
    for (int i = threadIdx.x; i < K / 8; i += kThreads) {
        const uint4 wp = *reinterpret_cast<const uint4*>(norm_w + 8 * i);
        xs[i] = gemv_math::normalize_x8(xf[2 * i], xf[2 * i + 1], wp, r);
    }
    __syncthreads();
}

// xs = src, K bf16 values (K % 8 == 0), written by other CTAs in the phase before.
__device__ void stage_plain(const bf16* src, int K, uint4* xs) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int i = threadIdx.x; i < K / 8; i += kThreads) xs[i] = __ldcg(s + i);
    __syncthreads();
}

// This warp's units of a phase: each unit's rows from the warp's ring, dotted with xs; then
// epilogue(unit, y0, y1) on lane 0 (y1: the partner row's result for paired units).
template <typename Epilogue>
__device__ void run_matmul(const MatmulPhase& ph, const uint4* xs, WarpRing& ring, Epilogue epilogue) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int2 mine = cta_units(ph.units);
    const int ppr = ph.pieces_per_row(), R = ph.rows_per_unit();
    for (int u = mine.x + warp; u < mine.y; u += kConsumerWarps) {
        float y[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (r >= R) break;
            float acc = 0.f;
            for (int q = 0; q < ppr; ++q) {
                const uint4* w = ring.wait_next();
                const uint4* x = xs + q * kPieceVecs;
                const int n8 = ph.piece_bytes(q) / 16;
#pragma unroll 8
                for (int v = lane; v < n8; v += 32)
                    if (!BRRR_DP_NO_MATH) acc = util::dot8_bf16(w[v], x[v], acc);
                ring.release(lane);
            }
            y[r] = util::warp_sum(acc);
        }
        if (lane == 0) epilogue(u, y[0], y[1]);
    }
}

template <int HD, int GMAX>
__device__ void run_layers(const KernelArgs& a, unsigned char* smem) {
    const PersistentDecode& p = a.p;
    unsigned char* work = smem + a.work_off;
    uint4* xs = reinterpret_cast<uint4*>(work);                         // [K / 8] the matmul's x
    float4* xf = reinterpret_cast<float4*>(work + (size_t)p.dim * 2);  // [dim / 4] x in fp32
    const int q_dim = p.n_heads * p.head_dim;
    WarpRing ring(smem, a.slots, p, threadIdx.x >> 5, threadIdx.x & 31);
    unsigned arrivals = 0;
    int event = 0;
    for (int l = 0; l < p.n_layers; ++l) {
        const DecodeLayer L = p.layers[l];
        // QKV: RoPE and the KV-cache append in the epilogue
        RopeKVArgs rope;
        rope.positions = p.positions;
        rope.slots = p.slots;
        rope.inv_freq = p.inv_freq;
        rope.q_out = p.q;
        rope.k_cache = L.k_cache;
        rope.v_cache = L.v_cache;
        rope.n_heads = p.n_heads;
        rope.n_kv_heads = p.n_kv_heads;
        rope.head_dim = p.head_dim;
        rope.max_seq = p.max_seq;
        const int half = p.head_dim / 2;
        stage_normalized(p.x, L.attn_norm, p.dim, p.eps, xs, xf);
        trace_event(a, event);
        run_matmul(matmul_phase(p, L, kQKV), xs, ring, [&](int u, float y0, float y1) {
            const int head = u / half;
            util::store_rope_kv(rope, 0, head, u - head * half, y0, y1);
        });
        grid_barrier(a, arrivals, event);
        // ATTN: flash_decode's CTAs as work items, split-major so the few live splits of a short
        // context land on distinct SMs
        DecodeArgs d = a.attn;
        d.k_cache = L.k_cache;
        d.v_cache = L.v_cache;
        const int n_y = d.n_kv_heads * d.head_blocks, items = d.n_splits * n_y;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            flash_decode_block<HD, GMAX, kThreads, /*PDL=*/false>(d, item / n_y, item % n_y, 0, work, [] { __syncthreads(); });
            __syncthreads();
        }
        grid_barrier(a, arrivals, event);
        // WO: x += att · wo^T
        stage_plain(p.att, q_dim, xs);
        trace_event(a, event);
        run_matmul(matmul_phase(p, L, kWo), xs, ring,
                   [&](int u, float y0, float) { p.x[u] = __ldcg(p.x + u) + y0; });
        grid_barrier(a, arrivals, event);
        // W13: SwiGLU in the epilogue
        stage_normalized(p.x, L.ffn_norm, p.dim, p.eps, xs, xf);
        trace_event(a, event);
        EpilogueArgs swiglu;
        swiglu.out_bf16 = p.hb;
        run_matmul(matmul_phase(p, L, kW13), xs, ring,
                   [&](int u, float gate, float up) { util::store_swiglu(swiglu, u, gate, up); });
        grid_barrier(a, arrivals, event);
        // W2: x += hb · w2^T
        stage_plain(p.hb, p.hidden, xs);
        trace_event(a, event);
        run_matmul(matmul_phase(p, L, kW2), xs, ring,
                   [&](int u, float y0, float) { p.x[u] = __ldcg(p.x + u) + y0; });
        if (l + 1 < p.n_layers) {
            grid_barrier(a, arrivals, event);
        } else {
            __syncthreads();
            trace_event(a, event);
        }
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int HD, int GMAX>
__global__ void __launch_bounds__(kThreads, 1) decode_layers_persistent_kernel(const KernelArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    run_layers<HD, GMAX>(a, ptx::dynamic_smem<unsigned char>());
#else
    __trap();  // built without sm_90a: plan() never picks this kernel then
#endif
}

using KernelFn = void (*)(KernelArgs);

template <int HD>
KernelFn pick_gmax(int gmax) {
    switch (gmax) {
        case 1: return decode_layers_persistent_kernel<HD, 1>;
        case 2: return decode_layers_persistent_kernel<HD, 2>;
        case 4: return decode_layers_persistent_kernel<HD, 4>;
        default: return decode_layers_persistent_kernel<HD, 8>;
    }
}

template <int HD>
size_t attention_smem(int gmax) {
    switch (gmax) {
        case 1: return DecodeSmem<HD, 1, kThreads>::bytes;
        case 2: return DecodeSmem<HD, 2, kThreads>::bytes;
        case 4: return DecodeSmem<HD, 4, kThreads>::bytes;
        default: return DecodeSmem<HD, 8, kThreads>::bytes;
    }
}

// The kernel for these shapes and its arguments, or why there is none (a non-empty `why`).
struct Plan {
    KernelFn kernel = nullptr;
    KernelArgs args;
    size_t smem = 0;
    const char* why = "";
};

// LLAMA_BRRR_DECODE_PERSISTENT=0 runs batch-1 decode as per-step kernels (for measuring), read once.
bool persistent_enabled() {
    static const bool on = env_flag("LLAMA_BRRR_DECODE_PERSISTENT", true);
    return on;
}

Plan plan(const PersistentDecode& p) {
    Plan out;
    if (!persistent_enabled()) return out.why = "switched off by LLAMA_BRRR_DECODE_PERSISTENT=0", out;
    if (p.head_dim != 64 && p.head_dim != 128) return out.why = "head_dim is not 64 or 128", out;
    const int q_dim = p.n_heads * p.head_dim;
    if (p.dim % 8 || p.hidden % 8 || q_dim % 8) return out.why = "a matmul's K is not a multiple of 8", out;
    if (p.n_kv_heads < 1 || p.n_heads % p.n_kv_heads) return out.why = "n_heads is not a multiple of n_kv_heads", out;
    const DeviceFacts f = device_facts();
    if (f.major != 9) return out.why = "not a Hopper GPU", out;
    const int gmax = decode_gmax(p.n_heads / p.n_kv_heads);
    out.kernel = p.head_dim == 64 ? pick_gmax<64>(gmax) : pick_gmax<128>(gmax);
    if (!runs_sm90a(out.kernel)) return out.kernel = nullptr, out.why = "the build has no sm_90a code", out;
    int dev = 0, coop = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    if (!coop) return out.kernel = nullptr, out.why = "the device has no cooperative launch", out;

    KernelArgs& a = out.args;
    a.p = p;
    a.attn = decode_args(p.q, nullptr, nullptr, p.slots, p.positions, p.att, p.attn_scratch, 1, p.n_heads,
                         p.n_kv_heads, p.head_dim, p.max_seq, p.max_splits);
    if (a.attn.threads != kThreads) return out.kernel = nullptr, out.why = "flash_decode runs 128-thread CTAs", out;
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, out.kernel));
    const size_t x_bytes = (size_t)std::max({p.dim, p.hidden, q_dim}) * sizeof(bf16);
    const size_t attn_bytes = p.head_dim == 64 ? attention_smem<64>(gmax) : attention_smem<128>(gmax);
    const size_t norm_bytes = (size_t)p.dim * (sizeof(bf16) + sizeof(float));  // xs and xf of a normalized x
    const size_t work = (std::max({x_bytes, norm_bytes, attn_bytes}) + 127) / 128 * 128;
    const size_t per_slot = (size_t)kConsumerWarps * kPieceBytes;
    const long long room = (long long)f.smem_optin - (long long)attr.sharedSizeBytes - (long long)work;
    a.slots = room > 0 ? (int)std::min<long long>(room / (long long)per_slot, kMaxSlots) : 0;
    if (a.slots < 2) return out.kernel = nullptr, out.why = "shared memory holds fewer than 2 ring slots a warp", out;
    a.work_off = kConsumerWarps * a.slots * kPieceBytes;
    a.trace = nullptr;
    out.smem = a.work_off + work;
    CUDA_CHECK(cudaFuncSetAttribute(out.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)out.smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, out.kernel, kThreads, out.smem));
    if (per_sm < 1) return out.kernel = nullptr, out.why = "one CTA does not fit on an SM", out;
    return out;
}

// Zeroes the grid-barrier counter, then launches the plan's kernel cooperatively: every CTA
// resident at once, which the grid barrier needs (else it could wait for a CTA that never starts).
void launch(const Plan& pl, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(pl.args.p.barrier, 0, sizeof(unsigned), stream));
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(device_facts().sm_count);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = pl.smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    (void)cudaLaunchKernelEx(&config, pl.kernel, pl.args);
    CUDA_CHECK_LAUNCH("decode_layers_persistent_kernel");
}

}  // namespace

bool decode_layers_persistent_supported(const PersistentDecode& p) { return plan(p).kernel != nullptr; }

void decode_layers_persistent(const PersistentDecode& p, cudaStream_t stream) {
    BRRR_CHECK(p.layers && p.x && p.q && p.att && p.hb && p.positions && p.slots && p.inv_freq && p.barrier,
               "decode_layers_persistent: a buffer is null");
    BRRR_CHECK(p.n_layers >= 1 && p.dim >= 1 && p.hidden >= 1 && p.max_seq >= 1 && p.max_splits >= 1 && p.eps > 0.f,
               "decode_layers_persistent: bad sizes n_layers=" << p.n_layers << " dim=" << p.dim << " hidden="
                                                              << p.hidden << " max_seq=" << p.max_seq);
    BRRR_CHECK(p.max_splits == 1 || p.attn_scratch, "decode_layers_persistent: max_splits > 1 needs attn_scratch");
    const Plan pl = plan(p);
    BRRR_CHECK(pl.kernel, "decode_layers_persistent: not available here (" << pl.why
                                                                           << "); run the per-step kernels");
    launch(pl, stream);
}

}  // namespace cuda
}  // namespace brrr
