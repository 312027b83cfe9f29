"""Where the time went: compute, memory or overhead, per phase, per op class and per kernel.

    import llama_brrr
    with llama_brrr.profile() as prof:
        llm.generate("Once upon a time", max_tokens=64)
    s = prof.summary()          # ProfileSummary: print(s), s.to_dict(), s.write_roofline(path), ...

The engines time every kernel launch while a profile is active (csrc/profile/profile.h explains
the clocks, engine.cu the CUDA-graph sampling); this module only turns their records into the
report, by the definitions of docs/design.md ("Metric definitions"):
  wall      host time inside the phase's spans (model.py marks prefill and decode)
  busy      time some kernel ran
  bound     a kernel is compute-bound when flops / peak_flops > bytes / peak_bw, else memory-bound;
            on a GPU, latency-bound when even the larger of the two is under the launch floor
            per call (peaks.GPU_LAUNCH_FLOOR_S): its time is the launch, not its work
  compute, memory   busy split in the ratio of compute-, memory- and latency-bound kernel time;
  overhead  wall - busy (the device idle, waiting for the host) + the latency-bound share, so
            compute + memory + overhead = wall exactly
  MFU, MBU  kernel FLOPs (bytes) of the phase / (wall x peak); *_measured against calibrated peaks
Kernels sampled from instrumented CUDA-graph replays count for every replay of their graph, and
are then scaled so that a graph's kernels add up to its measured replay time: inside a plain
replay consecutive kernels overlap (programmatic dependent launch), which the event nodes of an
instrumented replay prevent, so the serialized times are each kernel's share, not its wall time.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass

OP_CLASSES = ("matmul", "attention", "norm", "elementwise", "sampling", "copy")
PHASES = ("prefill", "decode")

# ---- the active profile and the hooks model.py calls -----------------------------------------

_active: "profile | None" = None


def active() -> "profile | None":
    return _active


class _NoSpan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_SPAN = _NoSpan()


class _Span:
    def __init__(self, prof: "profile", name: str, phase: str | None, tokens: int):
        self.prof, self.name, self.phase, self.tokens = prof, name, phase, tokens

    def __enter__(self):
        self.t0 = _now()
        return self

    def __exit__(self, *exc):
        self.prof._spans.append((self.name, self.phase, self.t0, _now(), self.tokens))
        return False


def span(name: str, phase: str | None = None, tokens: int = 0):
    """A host span of Python-side work (tokenize, a generation phase); free when not profiling.
    phase "prefill"/"decode" makes the span part of that phase's wall time; tokens counts the
    tokens the span processed (for tokens/s)."""
    return _Span(_active, name, phase, tokens) if _active is not None else _NO_SPAN


def mark() -> float | None:
    """The start of a span recorded later by record_span; None (free) when not profiling."""
    return _now() if _active is not None else None


def record_span(name: str, phase: str | None, start: float | None, tokens: int = 0) -> None:
    """Records the span [start, now) opened by mark(); a no-op when that mark was None."""
    if start is not None and _active is not None:
        _active._spans.append((name, phase, start, _now(), tokens))


def attach(engine, weights: str | None = None) -> None:
    """Switches profiling on for `engine` (a _C.Engine) if a profile is active; `weights` describes
    its weights' storage types and bytes for the report (Llama.weights_summary)."""
    if _active is not None:
        _active.attach(engine, weights)


def _now() -> float:
    from . import _C

    return _C.profile_now()


# ---- the context manager ----------------------------------------------------------------------

class profile:
    """Profiles every engine used inside the `with` block (Llama.generate/stream/forward attach
    theirs; attach() takes any other). One profile at a time."""

    def __init__(self, peaks=None):
        self._peaks = peaks
        self._engines = []
        self._records: list[tuple] = []
        self._spans: list[tuple] = []
        self._backend = None
        self._device = None
        self._weights = None
        self._summary = None

    def __enter__(self) -> "profile":
        global _active
        if _active is not None:
            raise RuntimeError("a llama_brrr.profile() is already active; profiles do not nest")
        _active = self
        self._t_enter = _now()
        return self

    def __exit__(self, *exc) -> bool:
        global _active
        _active = None
        for engine in self._engines:
            self._records.extend(engine.profile_records())
            engine.profile_enabled = False
        self._engines = []
        return False

    def attach(self, engine, weights: str | None = None) -> None:
        if weights is None:
            weights = getattr(engine, "weights_summary", None)
        engine = getattr(engine, "engine", engine)  # a Llama or its _C.Engine
        if weights is not None:
            self._weights = weights
        if any(e is engine for e in self._engines):
            return
        if self._backend is not None and engine.backend != self._backend:
            raise ValueError("one profile covers engines of one backend; profile the cpu and cuda "
                             "runs separately")
        self._backend = engine.backend
        self._device = getattr(engine, "device_name", None)
        engine.profile_enabled = True
        self._engines.append(engine)

    def summary(self, peaks=None) -> "ProfileSummary":
        if _active is self:
            raise RuntimeError("summary() is available once the `with llama_brrr.profile()` block has ended")
        if self._backend is None:
            raise RuntimeError("nothing was profiled: no Llama engine ran inside the `with` block")
        from . import peaks as peaks_module

        pk = peaks or self._peaks or peaks_module.get_peaks(self._backend)
        if self._backend == "cpu" and pk.bw is None:
            # No datasheet bandwidth for a CPU: a quick calibration gives a ceiling to classify by.
            pk = peaks_module.calibrate("cpu", quick=True)
        summary = build_summary(self._records, self._spans, pk, self._backend)
        summary.data["weights"] = self._weights
        return summary


# ---- building the summary --------------------------------------------------------------------

@dataclass
class _Rec:
    name: str
    kind: str
    op_class: str
    phase: str
    flops: float
    bytes: float
    t0: float
    t1: float
    group: int
    sampled: bool


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _bound(flops: float, nbytes: float, peaks, calls: float = 1.0) -> str:
    """compute, memory, or latency (GPU kernels whose roofline time per call is under the launch
    floor). flops and bytes are the totals over `calls` launches."""
    if not peaks.flops or not peaks.bw:
        return "memory" if nbytes else "compute"
    t_compute, t_memory = flops / peaks.flops, nbytes / peaks.bw
    floor = getattr(peaks, "launch_floor_s", None)
    if floor and calls > 0 and max(t_compute, t_memory) / calls < floor:
        return "latency"
    return "compute" if t_compute > t_memory else "memory"


def _phase_of(phase: str) -> str:
    return "decode" if phase == "sample" else phase


def build_summary(records, spans, peaks, backend: str, device: str | None = None) -> "ProfileSummary":
    """The report of engine records (tuples from Engine.profile_records) and Python spans."""
    recs = [_Rec(*r) for r in records]
    kernels = [r for r in recs if r.kind == "kernel"]
    replays = [r for r in recs if r.kind == "replay"]
    calls = [r for r in recs if r.kind == "call"]

    # A sampled kernel stands for every replay of its graph.
    n_replays, n_sampled = defaultdict(int), defaultdict(int)
    for r in replays:
        n_replays[r.group] += 1
        n_sampled[r.group] += r.sampled

    # Per graph: replay time actually measured / the sampled kernels' time standing for it (<= 1).
    replay_s, sampled_s = defaultdict(float), defaultdict(float)
    for r in replays:
        replay_s[r.group] += r.t1 - r.t0
    for r in kernels:
        if r.sampled:
            sampled_s[r.group] += (r.t1 - r.t0) * n_replays[r.group] / n_sampled[r.group]
    overlap = {g: min(1.0, replay_s[g] / sampled_s[g]) if sampled_s[g] > 0 else 1.0 for g in sampled_s}

    def weight(r: _Rec) -> float:
        return n_replays[r.group] / n_sampled[r.group] if r.sampled else 1.0

    def duration(r: _Rec) -> float:
        return (r.t1 - r.t0) * (overlap[r.group] if r.sampled else 1.0)

    phases, kernel_rows = {}, []
    for ph in PHASES:
        windows = [(a, b) for _, p, a, b, _ in spans if p == ph]
        if not windows:  # the engine was driven directly: its entry points bound the phase
            windows = [(r.t0, r.t1) for r in calls if _phase_of(r.phase) == ph]
        mine = [r for r in kernels if _phase_of(r.phase) == ph]
        if not windows and not mine:
            continue
        wall = _union(windows)
        if not wall and mine:
            wall = max(r.t1 for r in mine) - min(r.t0 for r in mine)
        busy = (_union((r.t0, r.t1) for r in mine if not r.sampled)
                + sum(duration(r) * weight(r) for r in mine if r.sampled))
        busy = min(busy, wall)

        agg = {}
        for r in mine:
            key = (r.name, r.op_class)
            a = agg.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            w = weight(r)
            a[0] += w
            a[1] += duration(r) * w
            a[2] += r.flops * w
            a[3] += r.bytes * w
        raw = {"compute": 0.0, "memory": 0.0, "latency": 0.0}
        flops = nbytes = 0.0
        for (name, cls), (n, t, f, b) in agg.items():
            bound = _bound(f, b, peaks, n)
            raw[bound] += t
            flops += f
            nbytes += b
            kernel_rows.append({"name": name, "op_class": cls, "phase": ph, "calls": round(n, 3),
                                "time_s": t, "flops": f, "bytes": b, "bound": bound})
        total_raw = sum(raw.values())
        compute_s = busy * raw["compute"] / total_raw if total_raw else 0.0
        latency_s = busy * raw["latency"] / total_raw if total_raw else 0.0
        memory_s = busy - compute_s - latency_s
        overhead_s = wall - busy + latency_s
        tokens = sum(n for _, p, _, _, n in spans if p == ph)

        def util(amount, peak):
            return amount / (wall * peak) if peak and wall else None

        split = {"compute": compute_s, "memory": memory_s, "overhead": overhead_s}
        phases[ph] = {
            "wall_s": wall, "compute_s": compute_s, "memory_s": memory_s, "overhead_s": overhead_s,
            "busy_s": busy, "latency_s": latency_s, "flops": flops, "bytes": nbytes, "tokens": tokens,
            "tokens_per_s": tokens / wall if wall and tokens else None,
            "mfu": util(flops, peaks.flops_datasheet), "mbu": util(nbytes, peaks.bw_datasheet),
            "mfu_measured": util(flops, peaks.flops_measured),
            "mbu_measured": util(nbytes, peaks.bw_measured),
            "dominant": max(split, key=split.get),
        }
    kernel_rows.sort(key=lambda k: (PHASES.index(k["phase"]), -k["time_s"]))
    data = {"device": device or peaks.device, "backend": backend, "peaks": peaks.to_dict(),
            "phases": phases, "kernels": kernel_rows}
    timeline = ([(r.name, r.kind, r.op_class, _phase_of(r.phase), r.t0, r.t1, r.group, r.sampled)
                 for r in recs]
                + [(name, "span", "", phase or "", a, b, -1, False) for name, phase, a, b, _ in spans])
    return ProfileSummary(data, timeline)


# ---- the report -------------------------------------------------------------------------------

def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


class ProfileSummary:
    """The structured report: to_dict() (JSON-ready, see docs/profiling.md), table() / str(), and
    the pictures. from_dict() rebuilds one from to_dict()'s output (without the timeline)."""

    def __init__(self, data: dict, timeline: list | None = None):
        self.data = data
        self.timeline = timeline or []

    # -- data ----------------------------------------------------------------------------------
    @property
    def phases(self) -> dict:
        return self.data["phases"]

    @property
    def kernels(self) -> list:
        return self.data["kernels"]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.data))

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.data, **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "ProfileSummary":
        missing = {"device", "backend", "peaks", "phases", "kernels"} - set(data)
        if missing:
            raise ValueError(f"not a profile summary: missing keys {sorted(missing)}")
        return cls(json.loads(json.dumps(data)))

    def _peak(self, key: str):
        p = self.data["peaks"]
        return p.get(f"{key}_datasheet") or p.get(f"{key}_measured")

    def _kernel_stats(self, k: dict, wall: float) -> dict:
        t = k["time_s"]
        flops_s = k["flops"] / t if t > 0 else 0.0
        bw_s = k["bytes"] / t if t > 0 else 0.0
        peak = self._peak("flops") if k["bound"] == "compute" else self._peak("bw")
        achieved = flops_s if k["bound"] == "compute" else bw_s
        return {"share": t / wall if wall else 0.0, "tflops": flops_s / 1e12, "gbps": bw_s / 1e9,
                "peak_share": achieved / peak if peak else None}

    # -- text ----------------------------------------------------------------------------------
    def table(self) -> str:
        d = self.data
        p = d["peaks"]

        def rate(v, scale, unit):
            return "n/a" if v is None else f"{v / scale:,.1f} {unit}"

        lines = [f"llama_brrr profile: {d['device']} ({d['backend']})",
                 f"peaks: datasheet {rate(p['flops_datasheet'], 1e12, 'TFLOP/s')}, "
                 f"{rate(p['bw_datasheet'], 1e9, 'GB/s')}; measured "
                 f"{rate(p['flops_measured'], 1e12, 'TFLOP/s')}, {rate(p['bw_measured'], 1e9, 'GB/s')}"]
        if d.get("weights"):
            lines.append(f"weights: {d['weights']}")
        for ph, P in d["phases"].items():
            wall = P["wall_s"]
            lines.append("")
            tps = "" if P["tokens_per_s"] is None else f", {P['tokens']} tok, {P['tokens_per_s']:,.1f} tok/s"
            lines.append(f"== {ph}: wall {_fmt_time(wall)}{tps}; dominant: {P['dominant']}")
            lines.append(f"   compute {_fmt_time(P['compute_s'])} ({_fmt_pct(P['compute_s'] / wall if wall else None)})"
                         f" | memory {_fmt_time(P['memory_s'])} ({_fmt_pct(P['memory_s'] / wall if wall else None)})"
                         f" | overhead {_fmt_time(P['overhead_s'])} ({_fmt_pct(P['overhead_s'] / wall if wall else None)})"
                         + (f", of which latency-bound kernels {_fmt_time(P['latency_s'])}"
                            if P.get("latency_s") else ""))
            lines.append(f"   MFU {_fmt_pct(P['mfu'])} (measured peak {_fmt_pct(P['mfu_measured'])})"
                         f" | MBU {_fmt_pct(P['mbu'])} (measured peak {_fmt_pct(P['mbu_measured'])})")
            rows = [k for k in d["kernels"] if k["phase"] == ph]
            by_class = {}
            for k in rows:
                c = by_class.setdefault(k["op_class"], {"name": k["op_class"], "op_class": k["op_class"],
                                                        "calls": 0, "time_s": 0.0, "flops": 0.0, "bytes": 0.0})
                for key in ("calls", "time_s", "flops", "bytes"):
                    c[key] += k[key]
            header = (f"   {'':<18} {'calls':>9} {'time':>11} {'wall%':>6} {'TFLOP/s':>9} {'GB/s':>9}"
                      f" {'peak%':>6}  bound")
            lines.append("   by op class")
            lines.append(header)
            for c in sorted(by_class.values(), key=lambda c: -c["time_s"]):
                c["bound"] = _bound_of(c, self)
                s = self._kernel_stats(c, wall)
                lines.append(f"   {c['name']:<18} {c['calls']:>9,.0f} {_fmt_time(c['time_s']):>11} "
                             f"{100 * s['share']:>5.1f}% {s['tflops']:>9.3f} {s['gbps']:>9.1f} "
                             f"{_fmt_pct(s['peak_share']):>6}  {c['bound']}")
            lines.append("   by kernel")
            lines.append(header)
            for k in rows:
                s = self._kernel_stats(k, wall)
                lines.append(f"   {k['name'][:18]:<18} {k['calls']:>9,.0f} {_fmt_time(k['time_s']):>11} "
                             f"{100 * s['share']:>5.1f}% {s['tflops']:>9.3f} {s['gbps']:>9.1f} "
                             f"{_fmt_pct(s['peak_share']):>6}  {k['bound']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    # -- pictures ------------------------------------------------------------------------------
    def write_roofline(self, path) -> None:
        """Each kernel a point: arithmetic intensity (FLOP/byte) against achieved FLOP/s, under the
        bandwidth and compute roofs (datasheet solid, measured dashed)."""
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(8, 6))
        points = [k for k in self.kernels if k["time_s"] > 0 and k["bytes"] > 0 and k["flops"] > 0]
        xs = [k["flops"] / k["bytes"] for k in points] or [1.0]
        lo, hi = min(xs + [0.1]) / 2, max(xs + [1000.0]) * 2
        p = self.data["peaks"]
        for style, fkey, bkey in (("-", "flops_datasheet", "bw_datasheet"), ("--", "flops_measured", "bw_measured")):
            peak_f, peak_b = p.get(fkey), p.get(bkey)
            if peak_f and peak_b:
                ridge = peak_f / peak_b
                ax.plot([lo, ridge, hi], [lo * peak_b, peak_f, peak_f], style, color="gray",
                        label=f"roof ({fkey.split('_')[1]})")
        markers = {"prefill": "o", "decode": "s"}
        colors = dict(zip(OP_CLASSES, ("C0", "C1", "C2", "C3", "C4", "C5")))
        for k in points:
            ax.scatter(k["flops"] / k["bytes"], k["flops"] / k["time_s"], marker=markers.get(k["phase"], "o"),
                       color=colors.get(k["op_class"], "k"), s=30)
            ax.annotate(f"{k['name']} ({k['phase'][0]})", (k["flops"] / k["bytes"], k["flops"] / k["time_s"]),
                        fontsize=6, alpha=0.7)
        for cls, color in colors.items():
            ax.scatter([], [], color=color, label=cls)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(f"roofline: {self.data['device']} (o prefill, s decode)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def write_breakdown(self, path) -> None:
        """Stacked bars: compute / memory / overhead seconds of each phase (labels in % of wall)."""
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        names = list(self.phases)
        bottom = [0.0] * len(names)
        for part, color in (("compute", "C0"), ("memory", "C1"), ("overhead", "C7")):
            values = [self.phases[n][f"{part}_s"] for n in names]
            ax.bar(names, values, bottom=bottom, color=color, label=part)
            for i, v in enumerate(values):
                wall = self.phases[names[i]]["wall_s"]
                if wall and v / wall > 0.04:
                    ax.text(i, bottom[i] + v / 2, f"{100 * v / wall:.0f}%", ha="center", va="center", fontsize=8)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylabel("seconds")
        ax.set_title(f"where the time went: {self.data['device']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def write_trace(self, path) -> None:
        """Chrome-trace / Perfetto JSON: kernels (device track), graph replays, engine calls and
        Python spans (host track), microseconds from the first event."""
        if not self.timeline:
            raise ValueError("this summary has no timeline (it was rebuilt from a dict); write the "
                             "trace from the summary that profile() returned")
        t_first = min(e[4] for e in self.timeline)
        tracks = {"span": 1, "call": 2, "replay": 3, "kernel": 4}
        events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": label}}
                  for label, tid in (("python", 1), ("engine calls", 2), ("graph replays", 3), ("kernels", 4))]
        for name, kind, cls, phase, t0, t1, group, sampled in self.timeline:
            tid = tracks[kind] + (1 if kind == "kernel" and sampled else 0)
            events.append({"name": name, "cat": cls or kind, "ph": "X", "pid": 1, "tid": tid,
                           "ts": (t0 - t_first) * 1e6, "dur": max(t1 - t0, 0.0) * 1e6,
                           "args": {"phase": phase, "group": group, "sampled": sampled}})
        if any(e[1] == "kernel" and e[7] for e in self.timeline):
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 5,
                           "args": {"name": "kernels (sampled graph replays)"}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)


def _bound_of(row: dict, summary: ProfileSummary) -> str:
    class _P:
        flops = summary._peak("flops")
        bw = summary._peak("bw")
        launch_floor_s = summary.data["peaks"].get("launch_floor_s")

    return _bound(row["flops"], row["bytes"], _P, row.get("calls", 1.0))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("the profile pictures need matplotlib: pip install matplotlib "
                          "(or pip install 'llama_brrr[bench]')") from error
    return plt


# ---- PyTorch runs ---------------------------------------------------------------------------

def _torch_class(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "gemv", "matmul", "aten::mm", "addmm", "linear", "bmm", "cutlass", "sm90_xmma", "ampere_bf16", "nvjet")):
        return "matmul"
    if any(k in n for k in ("flash", "sdpa", "attention", "fmha", "scaled_dot")):
        return "attention"
    if "norm" in n:
        return "norm"
    if any(k in n for k in ("softmax", "topk", "sort", "multinomial", "argmax")):
        return "sampling"
    if any(k in n for k in ("memcpy", "memset", "copy_", "aten::to", "aten::cat", "index_select", "embedding")):
        return "copy"
    return "elementwise"


def _dtype_width(dtype: str) -> int:
    """Bytes per element of a profiler dtype name ("c10::BFloat16", "long int", "float", ...);
    4 when unknown."""
    d = (dtype or "").lower()
    if any(k in d for k in ("half", "bfloat16")):
        return 2
    if any(k in d for k in ("long", "double", "int64")):
        return 8
    if any(k in d for k in ("bool", "char", "int8", "byte")):
        return 1
    return 4


def _shape_bytes(evt, dtypes=None) -> float:
    """Bytes an op moves, from its recorded input shapes: every input read once and an output the
    size of the largest input written once (elements of 4 bytes unless the dtype says otherwise). The
    dtypes come from the event (input_dtypes) or else from dtypes[event id] (_kineto_maps)."""
    shapes = getattr(evt, "input_shapes", None) or []
    types = list(getattr(evt, "input_dtypes", None) or (dtypes or {}).get(evt.id) or [])
    types += [""] * (len(shapes) - len(types))
    sizes = []
    for shape, dtype in zip(shapes, types):
        if not shape:
            continue
        sizes.append(math.prod(shape) * _dtype_width(dtype))
    if not sizes:
        return 0.0
    gathered = _gather_bytes(evt.name.lower(), shapes, sizes)
    if gathered is not None:
        return gathered
    out = _matmul_out_bytes(evt.name.lower(), shapes, types)
    return float(sum(sizes) + (out if out is not None else max(sizes)))


def _gather_bytes(name: str, shapes, sizes) -> float | None:
    """A table lookup (embedding(W[V, D], ids), index_select(W, 0, ids)) reads only the rows it
    gathers, not the table: ids read, then their rows read and written."""
    if "embedding" in name and len(shapes) >= 2 and len(shapes[0]) == 2 and shapes[1]:
        ids = shapes[1]
    elif "index_select" in name and len(shapes) >= 3 and len(shapes[0]) == 2 and shapes[2]:
        ids = shapes[2]
    else:
        return None
    row_bytes = sizes[0] / shapes[0][0]
    return float(sum(sizes[1:]) + 2 * math.prod(ids) * row_bytes)


def _matmul_out_bytes(name: str, shapes, types) -> float | None:
    """Bytes of a matmul op's output: rows of A x columns of B, where A and B sit in the argument
    order of each op (linear(x, W[N, K]); addmm(bias, A, B[K, N]); mm / bmm / matmul(A, B[.., K, N]))."""
    if "linear" in name and len(shapes) >= 2 and shapes[0] and len(shapes[1]) == 2:
        a, n, dtype = shapes[0], shapes[1][0], types[0]
    elif "addmm" in name and len(shapes) >= 3 and shapes[1] and shapes[2]:
        a, n, dtype = shapes[1], shapes[2][-1], types[1]
    elif any(k in name for k in ("aten::mm", "bmm", "matmul")) and len(shapes) >= 2 and shapes[0] and shapes[1]:
        a, n, dtype = shapes[0], shapes[1][-1], types[0]
    else:
        return None
    return math.prod(a[:-1]) * n * _dtype_width(dtype)


def _tree_flops(evt) -> float:
    """torch's FLOP estimate of an op: its own, else its children's (aten::matmul -> aten::mm)."""
    own = float(getattr(evt, "flops", 0) or 0)
    if own:
        return own
    return sum(_tree_flops(child) for child in getattr(evt, "cpu_children", None) or [])


def _duration(evt) -> float:
    return evt.time_range.end - evt.time_range.start


def _kineto_maps(tp) -> tuple[dict, dict]:
    """From the profiler's raw kineto events: kernel event id -> id of the CPU op that launched it,
    and CPU op id -> its input dtypes. FunctionEvent carries both itself only in recent torch
    (linked_correlation_id and input_dtypes in 2.13, neither in 2.11)."""
    try:
        raw = tp.profiler.kineto_results.events()
    except AttributeError:
        return {}, {}
    links, dtypes = {}, {}
    for e in raw:
        if str(e.device_type()).endswith("CPU"):
            dtypes[e.correlation_id()] = list(e.dtypes())
        else:
            links[e.correlation_id()] = e.linked_correlation_id()
    return links, dtypes


def _gpu_kernel_costs(kernels, cpu_events, links=None, dtypes=None) -> list[tuple[str, float, float]]:
    """(op class, FLOPs, bytes) of each CUDA kernel event. A kernel carries no shapes or FLOP
    estimate itself; the CPU op that launched it (its linked_correlation_id, or links[kernel id],
    e.g. aten::mm for a cuBLAS kernel) does, and is shared among that op's kernels by their
    durations. A kernel with no linked op keeps (0, 0) and is classed by its own name."""
    # Runtime calls (cudaLaunchKernel) are CPU events too, numbered in another id space.
    ops = {e.id: e for e in cpu_events if not e.name.startswith(("cuda", "cuLaunch", "cuMem"))}
    links = links or {}

    def launcher(k):
        return ops.get(getattr(k, "linked_correlation_id", 0) or links.get(k.id))

    launched = defaultdict(float)  # op id -> total duration of its kernels
    for k in kernels:
        op = launcher(k)
        if op is not None:
            launched[op.id] += _duration(k)
    costs = []
    for k in kernels:
        op = launcher(k)
        if op is None:
            costs.append((_torch_class(k.name), 0.0, 0.0))
            continue
        share = _duration(k) / launched[op.id] if launched[op.id] > 0 else 1.0
        op_class = _torch_class(op.name)
        costs.append((op_class if op_class != "elementwise" else _torch_class(k.name),
                      _tree_flops(op) * share, _shape_bytes(op, dtypes) * share))
    return costs


def _share_unattributed(costs, kernels, model_flops=None, model_bytes=None) -> list[tuple[str, float, float]]:
    """Kernels that carry no cost estimate (no launching op in the trace: those replayed from a CUDA
    graph, as every kernel of torch.compile's reduce-overhead decode is) take what the phase's
    analytic totals leave beyond the estimated kernels, shared by duration. Without that they
    would class as latency-bound, and a graph's memory-bound GEMVs would read as overhead."""
    bare = [i for i, (_, f, b) in enumerate(costs) if f == 0 and b == 0]
    span = sum(_duration(kernels[i]) for i in bare)
    if not bare or span <= 0 or not (model_flops or model_bytes):
        return costs
    flops_left = max(0.0, float(model_flops or 0) - sum(c[1] for c in costs))
    bytes_left = max(0.0, float(model_bytes or 0) - sum(c[2] for c in costs))
    shared = list(costs)
    for i in bare:
        share = _duration(kernels[i]) / span
        shared[i] = (costs[i][0], flops_left * share, bytes_left * share)
    return shared


def profile_torch(fn, *args, model_flops=None, model_bytes=None, tokens=None, phase="decode",
                  peaks=None, **kwargs) -> ProfileSummary:
    """Runs fn(*args, **kwargs) (e.g. a HF model's generate) under torch.profiler and reports it as
    profile() reports the engine: CUDA kernels when a GPU is in use, else the top-level CPU ops.
    FLOPs come from torch's own estimates (with_flops) and bytes from recorded input shapes; a
    phase total given as model_flops / model_bytes replaces the sum of the estimates, and what it
    leaves beyond them goes to the GPU kernels no op estimates (_share_unattributed)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    try:
        import torch
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile
    except ImportError as error:
        raise ImportError("profile_torch needs PyTorch (pip install torch)") from error
    from . import peaks as peaks_module

    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with torch_profile(activities=activities, record_shapes=True, with_flops=True) as tp:
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0

    events = tp.events()
    if on_gpu:
        ops = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
        backend_peaks = peaks or peaks_module.get_peaks("cuda")
    else:
        ops = [e for e in events if getattr(e, "cpu_parent", None) is None
               and not e.name.startswith(("ProfilerStep", "[memory]", "Profiler"))]
        backend_peaks = peaks or peaks_module.get_peaks("cpu")
        if backend_peaks.bw is None:
            backend_peaks = peaks_module.calibrate("cpu", quick=True)
    # Re-based on the host span: torch's clock (microseconds) starts anywhere.
    base = min((e.time_range.start for e in ops), default=0.0)
    links, dtypes = _kineto_maps(tp)
    if on_gpu:
        cpu_events = [e for e in events if not str(getattr(e, "device_type", "")).endswith("CUDA")]
        costs = _share_unattributed(_gpu_kernel_costs(ops, cpu_events, links, dtypes), ops, model_flops,
                                    model_bytes)
    else:
        costs = [(_torch_class(e.name), _tree_flops(e), _shape_bytes(e, dtypes)) for e in ops]
    records = []
    for e, (op_class, flops, nbytes) in zip(ops, costs):
        a, b = (e.time_range.start - base) * 1e-6, (e.time_range.end - base) * 1e-6
        records.append((e.name, "kernel", op_class, phase, flops, nbytes, a, b, -1, False))
    first = min((r[6] for r in records), default=0.0)
    spans = [("torch_fn", phase, first, first + wall, int(tokens or 0))]
    summary = build_summary(records, spans, backend_peaks, "torch",
                            device=backend_peaks.device)
    P = summary.data["phases"].get(phase)
    if P is not None:
        if model_flops is not None:
            P["flops"] = float(model_flops)
        if model_bytes is not None:
            P["bytes"] = float(model_bytes)

        def util(amount, peak):
            return amount / (P["wall_s"] * peak) if peak and P["wall_s"] else None

        p = backend_peaks
        P["mfu"], P["mbu"] = util(P["flops"], p.flops_datasheet), util(P["bytes"], p.bw_datasheet)
        P["mfu_measured"], P["mbu_measured"] = util(P["flops"], p.flops_measured), util(P["bytes"], p.bw_measured)
    return summary


__all__ = ["profile", "profile_torch", "ProfileSummary", "build_summary", "span", "attach", "active"]
