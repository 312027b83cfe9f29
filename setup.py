"""Builds the one extension, llama_brrr._C, from csrc/.

C++ sources (csrc/*.cpp, csrc/cpu/*.cpp, csrc/profile/*.cpp) go through the host compiler with
-O3, OpenMP and the host's SIMD. CUDA sources (csrc/cuda/*.cu) go through nvcc when it is found;
LLAMA_BRRR_CUDA=1 forces CUDA on (and fails without nvcc), =0 forces it off.
cudart is linked statically, so the module imports on a machine with nvcc but no GPU or driver.
LLAMA_BRRR_CUDA_ARCHS picks the GPU targets (default "90a;80": Hopper with wgmma, plus Ampere).
"""

import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_nvcc():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
            if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
                nvcc = os.path.join(home, "bin", "nvcc")
                break
    return nvcc


def cuda_wanted():
    flag = os.environ.get("LLAMA_BRRR_CUDA", "").strip()
    nvcc = find_nvcc()
    if flag == "0":
        return None
    if flag == "1" and nvcc is None:
        sys.exit("LLAMA_BRRR_CUDA=1 but nvcc was not found on PATH or in CUDA_HOME")
    return nvcc


def gencode_flags():
    archs = os.environ.get("LLAMA_BRRR_CUDA_ARCHS", "90a;80")
    flags = []
    for arch in filter(None, (a.strip() for a in archs.split(";"))):
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


NVCC = cuda_wanted()
CUDA_SOURCES = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu"))) if NVCC else []
CPP_SOURCES = sorted(
    glob.glob(os.path.join("csrc", "*.cpp"))
    + glob.glob(os.path.join("csrc", "cpu", "*.cpp"))
    + glob.glob(os.path.join("csrc", "profile", "*.cpp"))
    + glob.glob(os.path.join("csrc", "bindings", "*.cpp"))
)


class BuildExtWithCuda(build_ext):
    """Compiles csrc/cuda/*.cu with nvcc (in parallel) and links the objects into _C."""

    def build_extension(self, ext):
        if CUDA_SOURCES:
            ext.extra_objects = list(ext.extra_objects or []) + self.compile_cuda(ext)
        super().build_extension(ext)

    def compile_cuda(self, ext):
        out_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(out_dir, exist_ok=True)
        flags = ["-O3", "-std=c++17", "--use_fast_math", "-Xcompiler", "-fPIC", "-Icsrc",
                 "-DBRRR_WITH_CUDA", "-lineinfo", "--expt-relaxed-constexpr"] + gencode_flags()

        def one(src):
            obj = os.path.join(out_dir, os.path.basename(src) + ".o")
            if (not self.force and os.path.exists(obj)
                    and os.path.getmtime(obj) > max(os.path.getmtime(p) for p in
                                                    [src] + glob.glob("csrc/**/*.h", recursive=True))):
                return obj
            cmd = [NVCC, "-c", src, "-o", obj] + flags
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd, cwd=ROOT)
            return obj

        jobs = int(os.environ.get("MAX_JOBS", os.cpu_count() or 2))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, CUDA_SOURCES))


def cuda_paths():
    """(include dirs, library dirs, libraries) for the host-compiled sources when CUDA is on."""
    if not NVCC:
        return [], [], []
    cuda_home = os.environ.get("CUDA_HOME") or os.path.dirname(os.path.dirname(os.path.realpath(NVCC)))
    if not os.path.exists(os.path.join(cuda_home, "include", "cuda_runtime.h")):
        cuda_home = "/usr/local/cuda"  # nvcc on PATH may be a wrapper script
    candidates = (cuda_home, os.path.join(cuda_home, "targets", "x86_64-linux"))
    incs = [os.path.join(c, "include") for c in candidates if os.path.isdir(os.path.join(c, "include"))]
    libdirs = [d for c in candidates for d in (os.path.join(c, "lib64"), os.path.join(c, "lib"))
               if os.path.isdir(d)]
    return incs, libdirs, ["cudart_static", "rt", "dl", "pthread"]


cuda_incs, lib_dirs, libs = cuda_paths()
march = os.environ.get("LLAMA_BRRR_MARCH", "native")
ext = Pybind11Extension(
    "llama_brrr._C",
    CPP_SOURCES,
    include_dirs=["csrc"] + cuda_incs,
    define_macros=[("BRRR_WITH_CUDA", "1")] if NVCC else [],
    extra_compile_args=["-O3", f"-march={march}", "-fopenmp", "-ffp-contract=fast"],
    extra_link_args=["-fopenmp"],
    library_dirs=lib_dirs,
    libraries=libs,
    cxx_std=17,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtWithCuda})
