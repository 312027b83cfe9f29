"""Properties of the built module's machine code that no test of results would notice. The decode
chain's overlap: at M = 1 the CUDA-core GEMV issues its first step's weight loads before
griddepcontrol.wait (ACQBULK in SASS), so the weight stream starts while the previous kernel
drains. The compiler is free to sink loads past the wait when nothing in the source stops it,
which costs ~9% of a Llama-3.2-1B decode token. The Hopper wgmma loops (the GEMM, prefill
attention, gemv_quant_wgmma): their shared-memory descriptors live in uniform registers, where
wgmma reads them, so no R2UR move sits between two wgmma of a k step (with the warpgroup index in
a vector register there were up to 32 a k tile). gemv_quant_wgmma holds its W tiles in flight in
registers, and no instance spills them.
Needs cuobjdump (the CUDA toolkit's, or triton's)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(candidate) if candidate.exists() else None


def _sm90_functions(module_path: str, tool: str) -> dict[str, str]:
    sass = subprocess.run([tool, "-sass", "-arch", "sm_90a", module_path], capture_output=True,
                          text=True, timeout=300).stdout
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _opcodes(body: str) -> list[str]:
    ops = []
    for line in body.splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops.append(m.group(1))
    return ops


def _module_sm90_functions() -> dict[str, str]:
    from llama_brrr import _C

    if _C is None:
        pytest.skip("llama_brrr._C is not built; run `python setup.py build_ext --inplace`")
    if not _C.cuda_compiled():
        pytest.skip("llama_brrr._C was built without CUDA")
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA toolkit or triton)")
    functions = _sm90_functions(_C.__file__, tool)
    if not functions:
        pytest.skip("the module holds no sm_90a code (LLAMA_BRRR_CUDA_ARCHS without 90a)")
    return functions


def test_m1_gemv_streams_weights_before_the_pdl_wait():
    functions = _module_sm90_functions()
    # gemv_kernel<M = 1, UNITS, Pairing, VEC = true, NORM, LOADS>: every vector instance at M = 1.
    m1_vec = {name: body for name, body in functions.items()
              if re.search(r"gemv_kernelILi1ELi\d+ELN\w*PairingE\dELb1ELb[01]ELi\d+E", name)}
    assert m1_vec, "no M = 1 vector GEMV instance found in the module's sm_90a code"
    for name, body in m1_vec.items():
        ops = _opcodes(body)
        assert "ACQBULK" in ops, f"{name}: no griddepcontrol.wait"
        wait = ops.index("ACQBULK")
        loads = int(re.search(r"ELi(\d+)EEEv", name).group(1))
        streamed = sum(op.startswith("LDG.E.NA") for op in ops[:wait])
        assert streamed == loads, (f"{name}: {streamed} weight loads before griddepcontrol.wait, "
                                   f"expected the first step's {loads}")


def test_wgmma_descriptors_come_from_uniform_registers():
    functions = _module_sm90_functions()
    with_wgmma = {name: _opcodes(body) for name, body in functions.items()
                  if "gemm_sm90_kernel" in name or "attention_prefill" in name or "gemv_quant_wgmma" in name}
    with_wgmma = {name: ops for name, ops in with_wgmma.items() if any(op.startswith("HGMMA") for op in ops)}
    assert any("gemm_sm90_kernel" in name for name in with_wgmma), "no wgmma GEMM in the module's sm_90a code"
    for name, ops in with_wgmma.items():
        at = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
        # Neighbours in one k step's run of wgmma (a run's members are a few instructions apart).
        moves = sum(op.startswith("R2UR") for a, b in zip(at, at[1:]) if b - a < 24 for op in ops[a + 1:b])
        assert moves == 0, f"{name}: {moves} R2UR moves between the wgmma of its k steps"


def test_gemv_quant_wgmma_keeps_its_tiles_in_registers():
    # Each type's warpgroups a CTA and W tiles ahead a lane (kWarpgroups, kTilesAhead) are the most
    # its registers hold: a spill puts the tiles in flight into local memory, which lost 4-37%.
    functions = _module_sm90_functions()
    kernels = {name: _opcodes(body) for name, body in functions.items() if "gemv_quant_wgmma_kernel" in name}
    assert len(kernels) >= 16, f"{len(kernels)} gemv_quant_wgmma instances in the module's sm_90a code, expected 16"
    for name, ops in kernels.items():
        local = [op for op in ops if op.startswith(("STL", "LDL"))]
        assert not local, f"{name}: {len(local)} local-memory accesses (a register spill)"
