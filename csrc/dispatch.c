/* dispatch.c: what the CPU can run, and which kernel table is active.
 *
 * Features are read at run time (cpuid + xgetbv on x86-64, hwcaps / sysctl on
 * aarch64), never assumed from how the package was built, so one wheel runs
 * on any CPU of its family. At init the best available level is chosen;
 * li_isa_select() lets the caller (LLMINFER_ISA) force a lower one.
 */
#include <stdio.h>

#include "common.h"
#include "kernels/kernels.h"

#if defined(LI_ARCH_X86)
#if defined(_MSC_VER)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#endif

#if defined(LI_ARCH_ARM64)
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#elif defined(_WIN32)
#include <windows.h>
#endif
#endif

/* ---- feature detection ---- */

typedef struct {
    int amd; /* the vendor string is AuthenticAMD (or Hygon's, the same cores) */
    int avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avxvnni;
    int neon, dotprod, fp16, i8mm, sve;
} li_features;

static li_features features;
static int features_read = 0;

#if defined(LI_ARCH_X86)
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
#if defined(_MSC_VER)
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i];
#else
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

static uint64_t xgetbv0(void) {
#if defined(_MSC_VER)
    return _xgetbv(0);
#else
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}

static void read_features(li_features *f) {
    unsigned r1[4], r7[4], r71[4], r0[4];
    cpuid(0, 0, r0);
    const unsigned max_leaf = r0[0];
    char vendor[13];
    memcpy(vendor, &r0[1], 4); /* ebx, edx, ecx */
    memcpy(vendor + 4, &r0[3], 4);
    memcpy(vendor + 8, &r0[2], 4);
    vendor[12] = '\0';
    f->amd = strcmp(vendor, "AuthenticAMD") == 0 || strcmp(vendor, "HygonGenuine") == 0;
    cpuid(1, 0, r1);
    if (max_leaf >= 7) {
        cpuid(7, 0, r7);
        cpuid(7, 1, r71);
    } else {
        r7[0] = r7[1] = r7[2] = r7[3] = 0;
        r71[0] = 0;
    }
    const int osxsave = (r1[2] >> 27) & 1;
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int os_avx = (xcr0 & 0x6) == 0x6;        /* XMM and YMM state saved */
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6;   /* plus opmask and ZMM state */
    f->avx = os_avx && ((r1[2] >> 28) & 1);
    f->fma = f->avx && ((r1[2] >> 12) & 1);
    f->f16c = f->avx && ((r1[2] >> 29) & 1);
    f->avx2 = f->avx && ((r7[1] >> 5) & 1);
    f->avx512f = os_avx512 && ((r7[1] >> 16) & 1);
    f->avx512dq = f->avx512f && ((r7[1] >> 17) & 1);
    f->avx512bw = f->avx512f && ((r7[1] >> 30) & 1);
    f->avx512vl = f->avx512f && ((r7[1] >> 31) & 1);
    f->avx512vnni = f->avx512f && ((r7[2] >> 11) & 1);
    f->avxvnni = f->avx && ((r71[0] >> 4) & 1);
}
#elif defined(LI_ARCH_ARM64)
static void read_features(li_features *f) {
    f->neon = 1; /* Advanced SIMD is part of the aarch64 baseline */
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f->fp16 = (hw >> 10) & 1;   /* HWCAP_ASIMDHP */
    f->dotprod = (hw >> 20) & 1; /* HWCAP_ASIMDDP */
    f->sve = (hw >> 22) & 1;    /* HWCAP_SVE */
    f->i8mm = (hw2 >> 13) & 1;  /* HWCAP2_I8MM */
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0) f->dotprod = v;
    v = 0;
    n = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_FP16", &v, &n, NULL, 0) == 0) f->fp16 = v;
    v = 0;
    n = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &n, NULL, 0) == 0) f->i8mm = v;
#elif defined(_WIN32)
    f->dotprod = IsProcessorFeaturePresent(43); /* PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE */
#endif
}
#else
static void read_features(li_features *f) { (void)f; }
#endif

static const li_features *cpu(void) {
    if (!features_read) {
        memset(&features, 0, sizeof(features));
        read_features(&features);
        features_read = 1;
    }
    return &features;
}

void li_cpu_features(char *buf, size_t size) {
    const li_features *f = cpu();
    const struct {
        const char *name;
        int on;
    } list[] = {
        {"avx", f->avx}, {"avx2", f->avx2}, {"fma", f->fma}, {"f16c", f->f16c},
        {"avx512f", f->avx512f}, {"avx512dq", f->avx512dq}, {"avx512bw", f->avx512bw},
        {"avx512vl", f->avx512vl}, {"avx512vnni", f->avx512vnni}, {"avxvnni", f->avxvnni},
        {"neon", f->neon}, {"dotprod", f->dotprod}, {"fp16", f->fp16}, {"i8mm", f->i8mm},
        {"sve", f->sve},
    };
    if (!buf || size == 0) return;
    buf[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) {
        if (!list[i].on) continue;
        const int w = snprintf(buf + used, size - used, "%s%s", used ? " " : "", list[i].name);
        if (w < 0 || (size_t)w >= size - used) break;
        used += (size_t)w;
    }
}

/* ---- levels ---- */

static const char *isa_names[LI_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "neon_dot"};

const char *li_isa_name(int isa) {
    return isa >= 0 && isa < LI_ISA_COUNT ? isa_names[isa] : "unknown";
}

/* the CPU can run the level's instructions */
static int cpu_has(int isa) {
    const li_features *f = cpu();
    switch (isa) {
    case LI_ISA_SCALAR: return 1;
    case LI_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case LI_ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl &&
               f->avx512dq && f->avx512vnni;
    case LI_ISA_NEON: return f->neon;
    case LI_ISA_NEON_DOT: return f->neon && f->dotprod;
    default: return 0;
    }
}

static li_kernels tables[LI_ISA_COUNT];
static int tables_ready = 0;
static int current_isa = LI_ISA_SCALAR;
const li_kernels *li_K = &tables[LI_ISA_SCALAR];
static int stream_for_new = LI_STREAM_L1_NTA; /* the kind a new context takes */

/* A level is ready when the CPU has it and its file was built with its flags
 * (a fill function built without them leaves the table marked as scalar). A
 * fill function is itself compiled for its level, so it is called only where
 * the CPU has that level. */
static int ready[LI_ISA_COUNT];

void li_init(void) {
    if (tables_ready) return;
    li_luts_init();
    li_kernels_fill_scalar(&tables[LI_ISA_SCALAR]);
    ready[LI_ISA_SCALAR] = 1;
#if defined(LI_ARCH_X86)
    if (cpu_has(LI_ISA_AVX2)) li_kernels_fill_avx2(&tables[LI_ISA_AVX2]);
    if (cpu_has(LI_ISA_AVX512)) li_kernels_fill_avx512(&tables[LI_ISA_AVX512]);
#endif
#if defined(LI_ARCH_ARM64)
    if (cpu_has(LI_ISA_NEON)) li_kernels_fill_neon(&tables[LI_ISA_NEON]);
    if (cpu_has(LI_ISA_NEON_DOT)) li_kernels_fill_neon_dot(&tables[LI_ISA_NEON_DOT]);
#endif
    for (int isa = 1; isa < LI_ISA_COUNT; isa++)
        ready[isa] = cpu_has(isa) && tables[isa].isa == isa;
    tables_ready = 1;
    current_isa = li_isa_best();
    li_K = &tables[current_isa];
    stream_for_new = li_stream_hint_default();
}

/* The x16 decode kernels were tuned on Zen 5, whose prefetchnta fills L1
 * from a stream as fast as plain loads read it. On Intel it fills L1 alone,
 * past L2 and its streamer, and each line waits on one of L1's few fill
 * buffers: there the same lines hinted into L2 at the same lead decode
 * fastest, ahead of prefetcht0 and of no hints at all. Other vendors get
 * the L2 hints: the NTA fill is the way AMD's cores are known to read a
 * stream. Measurements: docs/kernel-tuning.md#dispatch-stream-hint */
int li_stream_hint_default(void) {
#if defined(LI_ARCH_X86)
    return cpu()->amd ? LI_STREAM_L1_NTA : LI_STREAM_L2;
#else
    return LI_STREAM_L2; /* no x16 kernels: nothing reads it */
#endif
}

const char *li_stream_hint_name(int kind) {
    static const char *names[LI_STREAM_COUNT] = {"l1_nta", "l2"};
    return kind >= 0 && kind < LI_STREAM_COUNT ? names[kind] : "unknown";
}

int li_stream_hint_current(void) {
    li_init();
    return stream_for_new;
}

int li_stream_hint_select(int kind) {
    li_init();
    if (kind < 0 || kind >= LI_STREAM_COUNT) return LI_E_ARG;
    stream_for_new = kind;
    return LI_OK;
}

int li_isa_available(int isa) {
    li_init();
    return isa >= 0 && isa < LI_ISA_COUNT && ready[isa];
}

int li_isa_best(void) {
    li_init();
    for (int isa = LI_ISA_COUNT - 1; isa > 0; isa--)
        if (ready[isa]) return isa;
    return LI_ISA_SCALAR;
}

int li_isa_current(void) {
    li_init();
    return current_isa;
}

int li_isa_select(int isa) {
    li_init();
    if (isa < 0 || isa >= LI_ISA_COUNT) return LI_E_ARG;
    if (!ready[isa]) return LI_E_ISA;
    current_isa = isa;
    li_K = &tables[isa];
    return LI_OK;
}

int li_openmp_enabled(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int li_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
