"""Build of llminfer's native core: the C sources in csrc/ and the Cython
module llminfer/_core.pyx, as one extension.

Kernel files for one instruction set (kernels/x86_avx2.c, kernels/arm_neon_dot.c)
are compiled with that set's flags, and only them: the rest of the core is built
for the baseline of the target, and dispatch.c picks a level at run time. So a
wheel built on a new CPU runs on any CPU of its family.

Environment:
  LLMINFER_NO_OPENMP=1     build without OpenMP (one thread)
  LLMINFER_OPENMP_PREFIX   where libomp lives (macOS; default: Homebrew's)
  LLMINFER_CUDA=1          also build the GPU backend (csrc/cuda/) with nvcc into
                           llminfer._cuda, linked statically against the CUDA
                           runtime (cudart_static): users need only the driver
  LLMINFER_CUDA_ARCHS      GPU architectures, ";"-separated (default
                           75;80;86;89;90, plus PTX of the last for newer GPUs)
  LLMINFER_HIP=1           build it with hipcc into llminfer._hip instead (ROCm;
                           linked against libamdhip64, as ROCm has no static runtime)
  LLMINFER_HIP_ARCHS       AMD targets (default gfx90a;gfx942;gfx1100)
  CUDA_HOME / ROCM_PATH    where the toolkits live (default /usr/local/cuda, /opt/rocm)
Without LLMINFER_CUDA or LLMINFER_HIP the build is CPU-only.
"""

import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent.resolve()
CSRC = Path("csrc")


def target_arch():
    """'x86_64', 'arm64' or 'other', for the platform being built for."""
    archflags = os.environ.get("ARCHFLAGS", "").split()
    arches = {archflags[i + 1] for i, a in enumerate(archflags[:-1]) if a == "-arch"}
    if len(arches) == 1:
        return "arm64" if arches == {"arm64"} else "x86_64" if arches == {"x86_64"} else "other"
    plat = sysconfig.get_platform().lower()
    if plat.endswith(("x86_64", "amd64")):
        return "x86_64"
    if plat.endswith(("aarch64", "arm64")):
        return "arm64"
    return "other"


# kernel file -> flags (gcc/clang, msvc), applied only when building for its family
ISA_FLAGS = {
    "x86_avx2.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx2_gemm.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx2_sgemm.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx2_iq.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx2_recurrent.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx2_x16.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx512.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                                "-mavx512dq", "-mavx512vnni"], ["/arch:AVX512"]),
    "x86_avx512_x16.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                                    "-mavx512dq", "-mavx512vnni"], ["/arch:AVX512"]),
    "x86_avx512_recurrent.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                                          "-mavx512dq", "-mavx512vnni"], ["/arch:AVX512"]),
    "arm_neon_dot.c": ("arm64", ["-march=armv8.2-a+dotprod"], []),
}


def isa_flags(source, compiler_type):
    entry = ISA_FLAGS.get(Path(source).name)
    if entry is None:
        return None
    arch, unix, msvc = entry
    if arch != target_arch():
        return []
    return msvc if compiler_type == "msvc" else unix


def try_compile(compiler, cflags, ldflags):
    """True when a small OpenMP program compiles and links with these flags."""
    src = "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "omp_check.c")
        with open(path, "w") as f:
            f.write(src)
        try:
            objs = compiler.compile([path], output_dir=tmp, extra_postargs=cflags)
            compiler.link_executable(objs, "omp_check", output_dir=tmp, extra_postargs=ldflags)
            return True
        except Exception:
            return False


def openmp_flags(compiler):
    """(compile flags, link flags) for OpenMP, or None when not available."""
    if os.environ.get("LLMINFER_NO_OPENMP"):
        return None
    if compiler.compiler_type == "msvc":
        return ["/openmp"], []
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    if sys.platform == "darwin":
        prefix = os.environ.get("LLMINFER_OPENMP_PREFIX")
        if not prefix:
            try:
                prefix = subprocess.run(["brew", "--prefix", "libomp"], capture_output=True,
                                        text=True, check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                prefix = "/opt/homebrew/opt/libomp"
        candidates.append(([f"-I{prefix}/include", "-Xpreprocessor", "-fopenmp"],
                           [f"-L{prefix}/lib", "-lomp", f"-Wl,-rpath,{prefix}/lib"]))
    for cflags, ldflags in candidates:
        if try_compile(compiler, cflags, ldflags):
            return cflags, ldflags
    return None


def gpu_kind():
    """'cuda', 'hip' or None: which GPU backend this build adds."""
    cuda, hip = os.environ.get("LLMINFER_CUDA", "") not in ("", "0"), os.environ.get("LLMINFER_HIP", "") not in ("", "0")
    if cuda and hip:
        raise SystemExit("llminfer: set LLMINFER_CUDA or LLMINFER_HIP, not both")
    return "cuda" if cuda else "hip" if hip else None


def gpu_compile(kind, source, out_dir):
    """Compile csrc/cuda/backend.cu with nvcc or hipcc; the object's path."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    obj = str(Path(out_dir) / f"backend_{kind}.o")
    common = ["-O3", "-std=c++17", f"-I{CSRC}", "-c", source, "-o", obj]
    if kind == "cuda":
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        nvcc = os.path.join(home, "bin", "nvcc")
        if not os.path.exists(nvcc):
            nvcc = "nvcc"
        archs = [a for a in os.environ.get("LLMINFER_CUDA_ARCHS", "75;80;86;89;90").split(";") if a]
        gencode = []
        for a in archs:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        gencode += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
        cmd = [nvcc, "-Xcompiler", "-fPIC", *gencode, *common]
    else:
        rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
        hipcc = os.path.join(rocm, "bin", "hipcc")
        if not os.path.exists(hipcc):
            hipcc = "hipcc"
        archs = [a for a in os.environ.get("LLMINFER_HIP_ARCHS", "gfx90a;gfx942;gfx1100").split(";") if a]
        cmd = [hipcc, "-x", "hip", "-fPIC", "-DLLMINFER_HIP", *[f"--offload-arch={a}" for a in archs], *common]
    print("llminfer:", " ".join(cmd))
    env = dict(os.environ)
    if kind == "hip":
        env.setdefault("HIP_PLATFORM", "amd")  # hipcc would pick nvcc on a machine with CUDA too
    subprocess.run(cmd, check=True, env=env)
    return obj


def gpu_link(kind):
    """(library_dirs, libraries) for the GPU module."""
    if kind == "cuda":
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        dirs = [d for d in (os.path.join(home, "lib64"), os.path.join(home, "lib"),
                            os.path.join(home, "targets", "x86_64-linux", "lib")) if os.path.isdir(d)]
        return dirs, ["cudart_static", "rt", "pthread", "dl", "stdc++"]
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    return [os.path.join(rocm, "lib")], ["amdhip64", "stdc++"]


class BuildExt(build_ext):
    def build_extension(self, ext):
        kind = getattr(ext, "gpu_kind", None)
        if kind:
            ext.extra_objects = [gpu_compile(kind, str(CSRC / "cuda" / "backend.cu"), self.build_temp)]
            ext.library_dirs, ext.libraries = gpu_link(kind)
            super().build_extension(ext)
            return
        ctype = self.compiler.compiler_type
        if ctype == "msvc":
            base = ["/O2", "/std:c11", "/fp:precise"]
        else:
            base = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno",
                    "-Wall", "-Wno-unused-function"]
        omp = openmp_flags(self.compiler)
        link = []
        if omp is None:
            print("llminfer: building without OpenMP (kernels will run on one thread)")
        else:
            base = base + omp[0]
            link = omp[1]
        # Each instruction-set file is compiled on its own with its flags.
        special = [s for s in ext.sources if isa_flags(s, ctype) is not None]
        for src in special:
            objs = self.compiler.compile(
                [src], output_dir=self.build_temp, macros=ext.define_macros,
                include_dirs=ext.include_dirs, extra_postargs=base + isa_flags(src, ctype),
                depends=ext.depends, debug=self.debug)
            ext.extra_objects.extend(objs)
        ext.sources = [s for s in ext.sources if s not in special]
        ext.extra_compile_args = base
        ext.extra_link_args = link
        super().build_extension(ext)


# the GPU sources (csrc/cuda/) build into their own module, below
c_sources = sorted(str(p) for p in CSRC.rglob("*.c") if "cuda" not in p.parts)
headers = sorted(str(p) for p in CSRC.rglob("*.h"))

extensions = cythonize(
    [
        Extension(
            "llminfer._core",
            sources=["llminfer/_core.pyx"] + c_sources,
            include_dirs=[str(CSRC), np.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            depends=headers + c_sources + ["llminfer/_clib.pxd", "llminfer/_desc.pxi", "llminfer/_desc_types.pxi"],
        )
    ],
    compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
)

kind = gpu_kind()
if kind:
    name = "_cuda" if kind == "cuda" else "_hip"
    gpu_ext = Extension(f"llminfer.{name}", sources=[str(CSRC / "cuda" / "module.c")], include_dirs=[str(CSRC)],
                        define_macros=[("LLMINFER_GPU_MODULE", name)],
                        depends=headers + [str(CSRC / "cuda" / "backend.cu")])
    gpu_ext.gpu_kind = kind
    extensions.append(gpu_ext)

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
