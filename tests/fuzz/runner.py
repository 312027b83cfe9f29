"""The fuzz loop: mutated files, a fork server that runs each in its own process, outcome classes.

A worker process (`python -m tests.fuzz.runner --worker`) imports llama_brrr once, then, for each
case it is sent, forks a child that loads the file with Llama.from_pretrained, generates a few
greedy tokens for a token-id prompt and a text prompt, runs one chat turn, and writes what
happened to a pipe. The worker waits for the child under a timeout (SIGKILL after it) and answers
with one JSON line. So a case costs a fork, not an interpreter start, and a crash or hang takes
down only its child. The worker itself never runs the engine (a fork after OpenMP started its
threads could deadlock the child).

Outcome classes (OUTCOMES): "error" (ModelFileError / UnsupportedModelError, or a ValueError
raised by llama_brrr's own code: a clear refusal), "identical" (same tokens, prompt ids and
log-probabilities as the unmutated seed), "legitimate" (different output after a change to a
field in mutators.LEGITIMATE_FIELDS), "undetectable" (different output after relabelling a tensor
with a type of the same size per value: mutators.is_undetectable; counted apart, not a pass),
"nonfinite" (NonFiniteLogitsError at generation: refused,
but after the load accepted the file), and the failures: "crash" (a signal, no result, or any
other exception type, a ValueError from numpy or gguf included), "hang" (the timeout), "silent"
(different output after a change that is not legitimate, or a non-finite weight loaded without
an error).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import mutators
from .seeds import Seed, copy_seed

PROMPT_IDS = [1, 5, 9, 3]
PROMPT_TEXT = "hello the world"
MESSAGES = [{"role": "user", "content": "hi"}]
MAX_TOKENS = 4
CHILD_MEMORY_BYTES = 4 << 30
OUTCOMES = ("error", "identical", "legitimate", "undetectable", "nonfinite", "crash", "hang", "silent")
FAILURES = ("crash", "hang", "silent")


# ---- inside the forked child ----------------------------------------------------------------------

def run_model(path: str) -> dict:
    """Load, generate, chat; what came out or how it failed."""
    import numpy as np

    from llama_brrr import Llama

    stage = "load"
    try:
        llm = Llama.from_pretrained(path, device="cpu", n_threads=1, max_batch=2, progress=False)
        stage = "generate"
        outs = llm.generate([PROMPT_IDS, PROMPT_TEXT], max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=True)
        stage = "chat"
        chat = llm.chat(MESSAGES, max_tokens=2, ignore_eos=True, logprobs=True)
        logprobs = [v for o in outs for v in o.logprobs] + list(chat.logprobs)
        return {"stage": "done", "tokens": [o.token_ids for o in outs], "prompt_ids": outs[1].prompt_token_ids,
                "chat_prompt": chat.prompt_token_ids, "chat_tokens": chat.token_ids,
                "logprobs": [float(v) for v in logprobs], "finite": bool(np.all(np.isfinite(logprobs)))}
    except BaseException as error:  # the point is to see every kind of failure
        frames = traceback.extract_tb(error.__traceback__)
        return {"stage": stage, "error": f"{type(error).__module__}.{type(error).__qualname__}",
                "bases": [c.__name__ for c in type(error).__mro__], "message": str(error)[:600],
                "origin": frames[-1].filename if frames else "", "traceback": traceback.format_exc()[-4000:]}


def _child(path: str, write_fd: int) -> None:
    import faulthandler
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        # A crash is reported by its signal; a fault handler inherited through fork (pytest's
        # writes to its own copy of stderr) would print the child's stack into the test log.
        faulthandler.disable()
        result = run_model(path)
        payload = json.dumps(result).encode()
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(0)


def _run_forked(path: str, timeout: float) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(path, write_fd)
    os.close(write_fd)
    chunks, deadline, hung = [], time.monotonic() + timeout, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            hung = True
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    if hung:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if hung:
        return {"stage": "hang", "timeout_s": timeout}
    if os.WIFSIGNALED(status):
        return {"stage": "signal", "signal": signal.Signals(os.WTERMSIG(status)).name}
    try:
        return json.loads(b"".join(chunks))
    except json.JSONDecodeError:
        return {"stage": "no-result", "exit_status": os.WEXITSTATUS(status)}


def worker_main() -> None:
    """The fork server: one JSON request per stdin line, one JSON answer per stdout line."""
    import llama_brrr  # noqa: F401  (imported once, shared by every forked child)

    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        result = _run_forked(request["path"], request["timeout"])
        out.write(json.dumps(result) + "\n")
        out.flush()


class Worker:
    """The fork server as seen from the driver; restarted if it ever dies."""

    def __init__(self):
        self._process = None

    def _start(self):
        root = Path(__file__).resolve().parents[2]
        self._process = subprocess.Popen([sys.executable, "-m", "tests.fuzz.runner", "--worker"], cwd=root,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                         env=dict(os.environ, PYTHONPATH=str(root)))

    def run(self, path: Path, timeout: float) -> dict:
        if self._process is None or self._process.poll() is not None:
            self._start()
        self._process.stdin.write(json.dumps({"path": str(path), "timeout": timeout}) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            self.close()
            return {"stage": "worker-died"}
        return json.loads(line)

    def close(self):
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait(timeout=30)
            self._process = None


# ---- classification ---------------------------------------------------------------------------------

def _same(result: dict, baseline: dict) -> bool:
    keys = ("tokens", "prompt_ids", "chat_prompt", "chat_tokens")
    if any(result[k] != baseline[k] for k in keys) or len(result["logprobs"]) != len(baseline["logprobs"]):
        return False
    return all(abs(a - b) <= 1e-4 for a, b in zip(result["logprobs"], baseline["logprobs"]))


def classify(result: dict, baseline: dict, mutation: mutators.Mutation) -> str:
    stage = result["stage"]
    if stage == "hang":
        return "hang"
    if stage in ("signal", "no-result", "worker-died"):
        return "crash"
    if "error" in result:
        bases = result["bases"]
        if "ModelFileError" in bases:
            return "error"
        if "NonFiniteLogitsError" in bases:
            return "nonfinite"
        if "ValueError" in bases and "/llama_brrr/" in result["origin"] and "MemoryError" not in bases:
            return "error"
        return "crash"
    if not result["finite"]:
        return "silent"
    if mutation.field.endswith(":data"):
        return "silent"  # a non-finite weight was loaded without an error
    if _same(result, baseline):
        return "identical"
    if mutators.is_legitimate(mutation.field):
        return "legitimate"
    return "undetectable" if mutators.is_undetectable(mutation) else "silent"


# ---- the driver -----------------------------------------------------------------------------------------

@dataclass
class Case:
    index: int
    seed: str
    role: str
    mutation: mutators.Mutation
    outcome: str
    result: dict
    seconds: float


def mutate(seed: Seed, role: str, data: bytes, rng: random.Random, layouts: dict) -> tuple[bytes, mutators.Mutation]:
    if seed.kind == "gguf":
        if seed.name not in layouts:
            layouts[seed.name] = mutators.GGUFLayout(data)
        layout = layouts[seed.name]
        weights = mutators.GGUF_MUTATORS
        mutator = rng.choices([m for m, _ in weights], weights=[w for _, w in weights])[0]
        out, mutation = mutator(data, layout, rng)
        mutation.how = f"{mutator.__name__}: {mutation.how}"
        return out, mutation
    if seed.kind == "safetensors":
        return {"model": mutators.mutate_safetensors, "config": mutators.mutate_config,
                "tokenizer": mutators.mutate_tokenizer_config}[role](data, rng)
    return {"model": mutators.mutate_llama2c, "tokenizer": mutators.mutate_llama2c_tokenizer}[role](data, rng)


ROLE_WEIGHTS = {"model": 6, "config": 3, "tokenizer": 1}


class Fuzzer:
    """Runs mutated copies of `seeds` (written into `scratch`) through one Worker."""

    def __init__(self, seeds: list[Seed], scratch: Path, timeout: float = 10.0, default_timeout: float = 90.0):
        self.scratch = scratch
        self.timeout, self.default_timeout = timeout, default_timeout
        self.worker = Worker()
        self.seeds = [copy_seed(s, scratch / "seeds") for s in seeds]
        self.original = {s.name: {role: p.read_bytes() for role, p in s.files.items()} for s in self.seeds}
        self.layouts: dict = {}
        self.baselines = {}
        for seed in self.seeds:
            result = self.worker.run(seed.path, self._timeout(seed))
            if result.get("stage") != "done":
                raise RuntimeError(f"seed {seed.name} does not run unmutated: {result}")
            self.baselines[seed.name] = result

    def _timeout(self, seed: Seed) -> float:
        return self.default_timeout if seed.name == "default" else self.timeout

    def run_case(self, index: int, run_seed: int, seed_weights: dict[str, float]) -> Case:
        rng = random.Random(f"{run_seed}:{index}")
        names = [s.name for s in self.seeds]
        seed = self.seeds[names.index(rng.choices(names, weights=[seed_weights.get(n, 1.0) for n in names])[0])]
        roles = list(seed.files)
        role = rng.choices(roles, weights=[ROLE_WEIGHTS[r] for r in roles])[0]
        data = self.original[seed.name][role]
        mutated, mutation = mutate(seed, role, data, rng, self.layouts)
        if seed.name == "default":
            # The default model is not copied: its mutant is written beside the scratch seeds.
            target = self.scratch / "default-mutant.gguf"
            target.write_bytes(mutated)
            path = target
        else:
            seed.files[role].write_bytes(mutated)
            path = seed.path
        start = time.perf_counter()
        try:
            result = self.worker.run(path, self._timeout(seed))
        finally:
            if seed.name != "default":
                seed.files[role].write_bytes(data)
        seconds = time.perf_counter() - start
        outcome = classify(result, self.baselines[seed.name], mutation)
        return Case(index, seed.name, role, mutation, outcome, result, seconds)

    def close(self):
        self.worker.close()


def summarize(cases: list[Case], command: str, run_seed: int, elapsed: float) -> dict:
    counts = {o: 0 for o in OUTCOMES}
    by_seed: dict = {}
    by_mutator: dict = {}
    legitimate_fields: dict = {}
    for case in cases:
        counts[case.outcome] += 1
        by_seed.setdefault(case.seed, {o: 0 for o in OUTCOMES})[case.outcome] += 1
        gguf = case.seed.startswith("gguf") or case.seed == "default"
        mutator = case.mutation.how.split(":")[0] if gguf else case.mutation.field.split(":")[-1]
        by_mutator.setdefault(f"{case.seed.split('-')[0]}/{case.role}/{mutator}", {o: 0 for o in OUTCOMES})[case.outcome] += 1
        if case.outcome == "legitimate":
            legitimate_fields[case.mutation.field] = legitimate_fields.get(case.mutation.field, 0) + 1
    failures = [dict(case=c.index, seed=c.seed, file=c.role, mutation=c.mutation.describe(), outcome=c.outcome,
                     stage=c.result.get("stage"), error=c.result.get("error") or c.result.get("signal"),
                     message=c.result.get("message"), traceback=c.result.get("traceback"))
                for c in cases if c.outcome in FAILURES]
    nonfinite = [dict(case=c.index, seed=c.seed, mutation=c.mutation.describe(), message=c.result.get("message"))
                 for c in cases if c.outcome == "nonfinite"]
    return {"command": command, "seed": run_seed, "cases": len(cases), "elapsed_s": round(elapsed, 1),
            "outcomes": counts, "failures_total": sum(counts[o] for o in FAILURES),
            "by_seed": by_seed, "by_mutator": dict(sorted(by_mutator.items())),
            "legitimate_fields": dict(sorted(legitimate_fields.items())),
            "legitimate_field_patterns": mutators.LEGITIMATE_FIELDS,
            "case_seconds_median": round(sorted(c.seconds for c in cases)[len(cases) // 2], 4) if cases else None,
            "failures": failures, "nonfinite_at_generation": nonfinite}


def main_worker_or_exit() -> None:
    if "--worker" in sys.argv:
        worker_main()
        sys.exit(0)


if __name__ == "__main__":
    main_worker_or_exit()
    sys.exit("tests/fuzz/runner.py is the fork server (--worker); run `python -m tests.fuzz` instead")
