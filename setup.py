"""Builds the one extension, llama_brrr._C, from csrc/.

C++ sources (every csrc/**/*.cpp) go through the host compiler with -O3, OpenMP and the host's
SIMD. CUDA sources (every csrc/cuda/**/*.cu) go through nvcc when it is found; LLAMA_BRRR_CUDA=1
forces CUDA on (and fails without nvcc), =0 forces it off. cudart is linked statically, so the
module imports on a machine with nvcc but no GPU or driver. LLAMA_BRRR_CUDA_ARCHS picks the GPU
targets (default "90a;80": Hopper with wgmma, plus Ampere). MAX_JOBS sets how many sources compile
at once (default: one host compile at a time, one nvcc per core).

Rebuilds are incremental and follow headers: both compilers write a make-style dependency file
beside each object (-MMD), listing every project header the source included, `.h` and `.cuh`
alike; the next build recompiles an object when its source, any header in that list, or (for
nvcc) its command line is newer or different, and nothing else. `build_ext --force` rebuilds all.
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
HEADER_PATTERNS = ("*.h", "*.cuh", "*.hpp", "*.inl")


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


def sources(pattern):
    """Every file under csrc/ matching pattern, in a stable order, relative to the repo root."""
    return sorted(os.path.relpath(p, ROOT)
                  for p in glob.glob(os.path.join(ROOT, "csrc", pattern), recursive=True))


def dependency_file(obj):
    return os.path.splitext(obj)[0] + ".d"


def read_dependencies(dep_file):
    """The prerequisites listed in a make-style dependency file (`obj: a.h b.cuh \\` lines)."""
    with open(dep_file) as f:
        text = f.read().replace("\\\n", " ")
    deps = []
    for line in text.splitlines():
        _, sep, rest = line.partition(": ")
        if not sep:
            continue
        # Make escapes spaces in paths as "\ "; keep such a path whole.
        deps += [d.replace("\0", " ") for d in rest.replace("\\ ", "\0").split()]
    return deps


FORCE = []  # holds True once build_ext runs with --force


def out_of_date(obj, src):
    """Whether obj must be compiled again: --force, it or its dependency file missing, or src or
    any header it included last time newer than it (or gone)."""
    dep_file = dependency_file(obj)
    if FORCE or not (os.path.exists(obj) and os.path.exists(dep_file)):
        return True
    built = os.path.getmtime(obj)
    for path in [src] + read_dependencies(dep_file):
        full = path if os.path.isabs(path) else os.path.join(ROOT, path)
        if not os.path.exists(full) or os.path.getmtime(full) > built:
            return True
    return False


NVCC = cuda_wanted()
CUDA_SOURCES = sources(os.path.join("cuda", "**", "*.cu")) if NVCC else []
CPP_SOURCES = sources(os.path.join("**", "*.cpp"))
HEADERS = [h for pattern in HEADER_PATTERNS for h in sources(os.path.join("**", pattern))]

# The host objects: compiled by distutils, skipped when out_of_date says they are current.
ParallelCompile("MAX_JOBS", default=1, needs_recompile=out_of_date).install()


class BuildExtWithCuda(build_ext):
    """Compiles csrc/cuda/**/*.cu with nvcc (in parallel) and links the objects into _C."""

    def build_extension(self, ext):
        if self.force:
            FORCE.append(True)
        if CUDA_SOURCES:
            cuda_objects = self.compile_cuda(ext)
            ext.extra_objects = list(ext.extra_objects or []) + cuda_objects
            # A CUDA object compiled again (a new command line, say) is newer than the module,
            # which makes setuptools link it even when no source or header changed.
            ext.depends = list(ext.depends) + cuda_objects
        super().build_extension(ext)

    def compile_cuda(self, ext):
        out_dir = os.path.join(self.build_temp, "cuda")
        os.makedirs(out_dir, exist_ok=True)
        flags = ["-O3", "-std=c++17", "--use_fast_math", "-Xcompiler", "-fPIC", "-Icsrc",
                 "-DBRRR_WITH_CUDA", "-lineinfo", "--expt-relaxed-constexpr"] + gencode_flags()

        def one(src):
            # csrc/cuda/a/b.cu -> a_b.cu.o, so files of one name in two folders do not collide.
            name = os.path.relpath(src, os.path.join("csrc", "cuda")).replace(os.sep, "_")
            obj = os.path.join(out_dir, name + ".o")
            cmd = [NVCC, "-c", src, "-o", obj, "-MMD", "-MF", dependency_file(obj)] + flags
            command_file = obj + ".cmd"
            same_command = (os.path.exists(command_file)
                            and open(command_file).read() == shlex.join(cmd))
            if same_command and not out_of_date(obj, src):
                return obj
            print(shlex.join(cmd), flush=True)
            subprocess.check_call(cmd, cwd=ROOT)
            with open(command_file, "w") as f:
                f.write(shlex.join(cmd))
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
    # -MMD writes the dependency file (obj minus .o plus .d) that out_of_date reads back.
    extra_compile_args=["-O3", f"-march={march}", "-fopenmp", "-ffp-contract=fast", "-MMD"],
    extra_link_args=["-fopenmp"],
    library_dirs=lib_dirs,
    libraries=libs,
    cxx_std=17,
    # Any header or CUDA source newer than the module makes setuptools look again; out_of_date
    # then picks which objects actually recompile.
    depends=HEADERS + CUDA_SOURCES,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtWithCuda})
