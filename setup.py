"""Build of llminfer's native core: the C sources in csrc/ and the Cython
module llminfer/_core.pyx, as one extension.

Kernel files for one instruction set (kernels/x86_avx2.c, kernels/arm_neon_dot.c)
are compiled with that set's flags, and only them: the rest of the core is built
for the baseline of the target, and dispatch.c picks a level at run time. So a
wheel built on a new CPU runs on any CPU of its family.

Environment:
  LLMINFER_NO_OPENMP=1     build without OpenMP (one thread)
  LLMINFER_OPENMP_PREFIX   where libomp lives (macOS; default: Homebrew's)
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
    "x86_avx2_iq.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"]),
    "x86_avx512.c": ("x86_64", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
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


class BuildExt(build_ext):
    def build_extension(self, ext):
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


c_sources = sorted(str(p) for p in CSRC.rglob("*.c"))
headers = sorted(str(p) for p in CSRC.rglob("*.h"))

extensions = cythonize(
    [
        Extension(
            "llminfer._core",
            sources=["llminfer/_core.pyx"] + c_sources,
            include_dirs=[str(CSRC), np.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            depends=headers + c_sources + ["llminfer/_clib.pxd"],
        )
    ],
    compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
)

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
