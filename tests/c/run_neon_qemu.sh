#!/bin/sh
# run_neon_qemu.sh: build the C core for aarch64 with test_kernels_neon.c and
# check both NEON levels against the scalar kernels. On an aarch64 machine
# it builds and runs natively; elsewhere it cross-compiles and runs under
# qemu-user.
#
#   tests/c/run_neon_qemu.sh [--seed N] [-v]
#
# Three runs:
#   1. -O2, arm_neon_dot.c with -march=armv8.2-a+dotprod, CPU "max" (has
#      SDOT): both levels tested, dispatch must pick neon_dot.
#   2. the same binary on a Cortex-A72 (no SDOT): neon tested, the dot level
#      must be reported unavailable and dispatch must pick neon.
#   3. -O3 (as setup.py builds), arm_neon_dot.c without the dot-product flags:
#      neon tested again, and the dot table must stay scalar.
# Exits 0 when all pass, 1 on a failure, 0 with a SKIP line when the cross
# compiler or qemu is missing (set LLMINFER_REQUIRE_NEON_TEST=1 to make that
# an error).
#
# Tools (Debian/Ubuntu): apt-get install gcc-aarch64-linux-gnu qemu-user
# Overrides: CC, QEMU, QEMU_LD_PREFIX (default /usr/aarch64-linux-gnu).
set -u

cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
ARGS="$*"

skip() {
    echo "SKIP neon kernel test: $1"
    if [ "${LLMINFER_REQUIRE_NEON_TEST:-0}" = 1 ]; then exit 1; fi
    exit 0
}

case "$(uname -m)" in
    aarch64|arm64)
        CC=${CC:-cc}
        run_on() { shift; "$@"; }   # native: the CPU is what it is
        NATIVE=1 ;;
    *)
        CC=${CC:-aarch64-linux-gnu-gcc}
        QEMU=${QEMU:-qemu-aarch64}
        QEMU_LD_PREFIX=${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}
        command -v "$QEMU" >/dev/null 2>&1 || skip "$QEMU not found (apt-get install qemu-user)"
        run_on() { cpu=$1; shift; "$QEMU" -cpu "$cpu" -L "$QEMU_LD_PREFIX" "$@"; }
        NATIVE=0 ;;
esac
command -v "${CC%% *}" >/dev/null 2>&1 || skip "${CC%% *} not found (apt-get install gcc-aarch64-linux-gnu)"

BUILD=$(mktemp -d "${TMPDIR:-/tmp}/llminfer-neon-test.XXXXXX") || exit 2
trap 'rm -rf "$BUILD"' EXIT

CORE="csrc/qtypes.c csrc/dispatch.c csrc/ops.c csrc/gemm.c csrc/quantize.c csrc/kernels/scalar.c csrc/kernels/arm_neon.c
      csrc/kernels/scalar_iq.c csrc/kernels/iq_tables.c csrc/kernels/arm_neon_iq.c csrc/quantize_iq.c
      csrc/kernels/luts.c csrc/repack.c csrc/share.c csrc/errors.c csrc/alloc.c csrc/model.c csrc/model_check.c
      csrc/context.c csrc/attention.c csrc/encoder.c csrc/recurrent.c csrc/lora.c csrc/kernels/scalar_recurrent.c
      csrc/kernels/arm_neon_recurrent.c"
BASE="-std=c11 -ffp-contract=off -fno-math-errno -Wall -Wno-unused-function -Icsrc"

# build OUT OPT DOTFLAGS: every file but arm_neon_dot.c with OPT, that one with OPT DOTFLAGS
build() {
    out=$1 opt=$2 dotflags=$3
    objs=""
    for src in $CORE tests/c/test_kernels_neon.c; do
        obj="$BUILD/$(basename "$src" .c)$opt.o"
        $CC $BASE $opt -c "$src" -o "$obj" || return 1
        objs="$objs $obj"
    done
    $CC $BASE $opt $dotflags -c csrc/kernels/arm_neon_dot.c -o "$BUILD/arm_neon_dot$opt$dotflags.o" || return 1
    # static: qemu then needs no aarch64 libraries at run time
    $CC -static $objs "$BUILD/arm_neon_dot$opt$dotflags.o" -lm -o "$out" 2>/dev/null ||
        $CC $objs "$BUILD/arm_neon_dot$opt$dotflags.o" -lm -o "$out"
}

echo "== building for aarch64 with $CC"
build "$BUILD/test_dot" -O2 "-march=armv8.2-a+dotprod" || { echo "FAIL: build"; exit 1; }
build "$BUILD/test_nodot" -O3 "" || { echo "FAIL: build"; exit 1; }

status=0
runs=0
failed=""
run() {
    name=$1; shift
    echo "== $name"
    runs=$((runs + 1))
    if ! run_on "$@"; then status=1; failed="$failed [$name]"; fi
}

if [ "$NATIVE" = 1 ]; then
    run "native, -O2, dot-product build" native "$BUILD/test_dot" --strict $ARGS
    run "native, -O3, no dot-product build" native "$BUILD/test_nodot" --strict --dot-build no $ARGS
else
    run "qemu -cpu max, -O2, dot-product build" max "$BUILD/test_dot" --strict --expect-best neon_dot $ARGS
    run "qemu -cpu cortex-a72 (no SDOT), same binary" cortex-a72 "$BUILD/test_dot" --strict --expect-best neon $ARGS
    run "qemu -cpu max, -O3, arm_neon_dot.c without dot-product flags" max "$BUILD/test_nodot" --strict --dot-build no --expect-best neon $ARGS
fi

echo
if [ $status = 0 ]; then
    echo "neon kernel test: PASS ($runs runs)"
else
    echo "neon kernel test: FAIL in$failed"
fi
exit $status
