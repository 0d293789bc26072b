/* test_kernels_neon.c: the NEON kernel levels checked against the scalar
 * table, the specification. Built for aarch64 with the C core (no Python) and
 * run natively or under qemu-aarch64 by run_neon_qemu.sh.
 *
 * Every entry of each level's li_kernels is called on random data over
 * several sizes, next to the scalar entry, and compared:
 *   dequant, quant_act, lut_apply, axpy_*, scale/add/mul, f16<->f32:
 *       bit for bit (memcmp, NaN payloads included)
 *   dot (weights x activations), dot_f32, dot_f32_f16:
 *       |got - ref| <= 1e-5 * sum_i |w_i x_i|; with --strict the quantized
 *       weight types must also match bit for bit, as they are built to
 *   rms_norm, softmax: |got - ref| <= 1e-6 * |ref| + 1e-40 per element
 *   conv_rows (the recurrent mixers' convolution): bit for bit
 *   gdn_head, mamba2_head: the state after the rows within 1e-5 of its
 *       largest value, each output within 1e-5 of its token's largest sum of
 *       magnitudes (RECURRENT_REL)
 * Weight blocks are random bytes with their f16 scales made finite; every
 * buffer ends where a PROT_NONE page begins, so a read past it faults.
 *
 * Options:
 *   --seed N            random seed (default 1)
 *   --dot-build yes|no  whether arm_neon_dot.c was built with dot-product
 *                       flags (default yes); with no, its table must stay scalar
 *   --expect-best NAME  the level dispatch must choose (e.g. neon_dot, neon)
 *   --strict            quantized dots must be bit-identical
 *   -v                  a line per table entry, not only per group
 * Exit status: 0 all passed, 1 a check failed, 2 could not run.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "kernels/kernels.h"

/* ---- random numbers (splitmix64) ---- */

static uint64_t rng;

static uint64_t rnd64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rnd32(void) { return (uint32_t)(rnd64() >> 32); }
static int rnd_below(int n) { return (int)(rnd64() % (uint64_t)n); }
/* uniform in [-1, 1) */
static float unif(void) { return (float)(rnd64() >> 40) * (2.0f / 16777216.0f) - 1.0f; }

static float gauss(void) {
    const double u1 = ((double)(rnd64() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = (double)(rnd64() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* a finite f16 of magnitude up to 2^5, sometimes subnormal or zero */
static uint16_t rnd_f16_scale(void) {
    const uint16_t e = (uint16_t)rnd_below(21); /* 0: zero or subnormal */
    return (uint16_t)((rnd32() & 0x83ffu) | (e << 10));
}

/* ---- guarded buffers ---- */

typedef struct {
    unsigned char *base;
    size_t len;
} region;

static region regions[64];
static int n_regions;

/* n bytes that end where an inaccessible page begins */
static void *gmalloc(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t body = (n + page - 1) / page * page;
    if (n_regions == (int)(sizeof(regions) / sizeof(regions[0]))) {
        fprintf(stderr, "test: too many buffers\n");
        exit(2);
    }
    unsigned char *p = mmap(NULL, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p + body, page, PROT_NONE) != 0) {
        fprintf(stderr, "test: mmap/mprotect failed\n");
        exit(2);
    }
    regions[n_regions].base = p;
    regions[n_regions++].len = body + page;
    unsigned char *r = p + body - n;
    for (size_t i = 0; i < n; i++) r[i] = (unsigned char)rnd32(); /* garbage, not zeros */
    return r;
}

static void gfree_all(void) {
    for (int i = 0; i < n_regions; i++) munmap(regions[i].base, regions[i].len);
    n_regions = 0;
}

/* ---- bookkeeping ---- */

static int verbose, strict;
static long total_cases, total_fails, total_exact;

typedef struct {
    const char *level, *group;
    char name[24];
    int cases, exact, fails;
    double worst; /* largest error / allowed error seen */
} tally;

/* the check under way, for the fault handler */
static char current[64] = "setup";

static void say(const char *m) {
    if (write(1, m, strlen(m)) < 0) _exit(1);
}

static void on_fault(int sig) {
    say("FAIL: crashed in ");
    say(current);
    say(sig == SIGILL ? ": illegal instruction (a level run on a CPU without it?)\n"
                      : ": bad memory access (a read or write past the end of a buffer?)\n");
    _exit(1);
}

static tally start(const char *level, const char *group, const char *name) {
    snprintf(current, sizeof(current), "%s %s %s", level, group, name);
    tally t;
    memset(&t, 0, sizeof(t));
    t.level = level;
    t.group = group;
    snprintf(t.name, sizeof(t.name), "%s", name);
    return t;
}

static void finish(tally *t, const char *how, int replaced) {
    total_cases += t->cases;
    total_fails += t->fails;
    total_exact += t->exact;
    if (verbose || t->fails)
        printf("  %-9s %-9s %-11s %-9s %4d cases, %4d bit-identical, worst %.2f of tolerance%s%s\n",
               t->level, t->group, t->name, replaced ? "" : "(scalar)", t->cases, t->exact, t->worst,
               how, t->fails ? "  FAIL" : "");
}

static void fail(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(tally *t, const char *fmt, ...) {
    if (t->fails++ < 3) {
        va_list ap;
        va_start(ap, fmt);
        printf("    FAIL %s %s %s: ", t->level, t->group, t->name);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}

static int same_bits(const void *a, const void *b, size_t n, size_t *at) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            *at = i;
            return 0;
        }
    return 1;
}

static uint32_t fbits(float f) { return li_f32_bits(f); }

/* ---- data ---- */

static const int weight_types[] = {LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_Q4_0,
                                   LI_TYPE_Q4_1, LI_TYPE_Q5_0, LI_TYPE_Q5_1, LI_TYPE_Q8_0,
                                   LI_TYPE_Q2_K, LI_TYPE_Q3_K, LI_TYPE_Q4_K, LI_TYPE_Q5_K,
                                   LI_TYPE_Q6_K, LI_TYPE_IQ4_NL, LI_TYPE_IQ4_XS, LI_TYPE_MXFP4,
                                   LI_TYPE_TQ1_0, LI_TYPE_TQ2_0, LI_TYPE_IQ2_XXS, LI_TYPE_IQ2_XS,
                                   LI_TYPE_IQ2_S, LI_TYPE_IQ3_XXS, LI_TYPE_IQ3_S, LI_TYPE_IQ1_S,
                                   LI_TYPE_IQ1_M};
#define N_WEIGHT_TYPES ((int)(sizeof(weight_types) / sizeof(weight_types[0])))

static const int block_counts[] = {1, 2, 3, 5, 8, 17};
static const int float_lengths[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 257, 1000};
#define N_BLOCK_COUNTS ((int)(sizeof(block_counts) / sizeof(block_counts[0])))
#define N_FLOAT_LENGTHS ((int)(sizeof(float_lengths) / sizeof(float_lengths[0])))

/* the k to try for a type (or activation format) of block size bs */
static int sizes_for(int bs, int64_t out[32]) {
    int n = 0;
    if (bs == 1)
        for (int i = 0; i < N_FLOAT_LENGTHS; i++) out[n++] = float_lengths[i];
    else
        for (int i = 0; i < N_BLOCK_COUNTS; i++) out[n++] = (int64_t)block_counts[i] * bs;
    return n;
}

/* A row of k weights of `type` from random bytes, with each f16 scale set
 * finite. wild: F16/BF16 values are any bit pattern (NaN, inf, subnormal);
 * otherwise finite values of moderate size. */
static void random_weights(int type, void *dst, int64_t k, int wild) {
    unsigned char *p = dst;
    const size_t n = li_row_bytes(type, k);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rnd32();
    const int64_t nb = k / li_types[type].block_size;
    switch (type) {
    case LI_TYPE_F32:
        for (int64_t i = 0; i < k; i++) ((float *)dst)[i] = gauss();
        break;
    case LI_TYPE_F16:
        if (!wild)
            for (int64_t i = 0; i < k; i++) ((uint16_t *)dst)[i] = li_f32_to_f16(gauss());
        break;
    case LI_TYPE_BF16:
        if (!wild)
            for (int64_t i = 0; i < k; i++) ((uint16_t *)dst)[i] = (uint16_t)(fbits(gauss()) >> 16);
        break;
#define FIX(T, ...)                                        \
    for (int64_t i = 0; i < nb; i++) {                     \
        T *b = (T *)dst + i;                               \
        __VA_ARGS__                                        \
    }                                                      \
    break;
    case LI_TYPE_Q4_0: FIX(block_q4_0, b->d = rnd_f16_scale();)
    case LI_TYPE_Q4_1: FIX(block_q4_1, b->d = rnd_f16_scale(); b->m = rnd_f16_scale();)
    case LI_TYPE_Q5_0: FIX(block_q5_0, b->d = rnd_f16_scale();)
    case LI_TYPE_Q5_1: FIX(block_q5_1, b->d = rnd_f16_scale(); b->m = rnd_f16_scale();)
    case LI_TYPE_Q8_0: FIX(block_q8_0, b->d = rnd_f16_scale();)
    case LI_TYPE_Q2_K: FIX(block_q2_K, b->d = rnd_f16_scale(); b->dmin = rnd_f16_scale();)
    case LI_TYPE_Q3_K: FIX(block_q3_K, b->d = rnd_f16_scale();)
    case LI_TYPE_Q4_K: FIX(block_q4_K, b->d = rnd_f16_scale(); b->dmin = rnd_f16_scale();)
    case LI_TYPE_Q5_K: FIX(block_q5_K, b->d = rnd_f16_scale(); b->dmin = rnd_f16_scale();)
    case LI_TYPE_Q6_K: FIX(block_q6_K, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ4_NL: FIX(block_iq4_nl, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ4_XS: FIX(block_iq4_xs, b->d = rnd_f16_scale();)
    case LI_TYPE_MXFP4: FIX(block_mxfp4, b->e = (uint8_t)(112 + rnd_below(24));)
    case LI_TYPE_TQ1_0: FIX(block_tq1_0, b->d = rnd_f16_scale();)
    case LI_TYPE_TQ2_0: FIX(block_tq2_0, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ2_XXS: FIX(block_iq2_xxs, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ2_XS: FIX(block_iq2_xs, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ2_S: FIX(block_iq2_s, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ3_XXS: FIX(block_iq3_xxs, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ3_S: FIX(block_iq3_s, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ1_S: FIX(block_iq1_s, b->d = rnd_f16_scale();)
    case LI_TYPE_IQ1_M: /* d in the top nibbles of the four scale words */
        FIX(block_iq1_m, {
            const uint16_t d = rnd_f16_scale();
            for (int j = 0; j < 4; j++) {
                uint16_t v;
                memcpy(&v, b->scales + 2 * j, 2);
                v = (uint16_t)((v & 0x0fff) | (((d >> (4 * j)) & 15) << 12));
                memcpy(b->scales + 2 * j, &v, 2);
            }
        })
#undef FIX
    default: break;
    }
}

/* Activation-like floats in one of several patterns:
 * 0 gaussian at a random scale, 1 gaussian with a few large outliers,
 * 2 all zero, 3 ties: block maxima of exactly 127 and other values n + 0.5
 * (so x * id lands on halves), 4 tiny (subnormal: 1/d overflows),
 * 5 random finite bit patterns (any exponent), 6 with +-inf. */
#define N_PATTERNS 7
static void random_floats(float *x, int64_t k, int pattern, int bs) {
    const float scale = ldexpf(1.0f, rnd_below(21) - 10);
    for (int64_t i = 0; i < k; i++) {
        switch (pattern) {
        case 0: x[i] = gauss() * scale; break;
        case 1: x[i] = gauss() * scale * (rnd_below(50) == 0 ? 100.0f : 1.0f); break;
        case 2: x[i] = 0.0f; break;
        case 3: x[i] = (float)(rnd_below(253) - 126) + (rnd_below(2) ? 0.5f : -0.5f); break;
        case 4: x[i] = li_bits_f32(rnd32() & 0x800000ffu); break;
        case 5: {
            uint32_t u = rnd32();
            if (((u >> 23) & 0xff) == 0xff) u &= ~(1u << 30); /* not inf / NaN */
            x[i] = li_bits_f32(u);
            break;
        }
        default: x[i] = rnd_below(40) == 0 ? (rnd_below(2) ? INFINITY : -INFINITY) : gauss(); break;
        }
    }
    if (pattern == 3)
        for (int64_t i = 0; i + bs <= k; i += bs) x[i + rnd_below(bs)] = rnd_below(2) ? 127.0f : -127.0f;
}

/* ---- the checks ---- */

static int replaced_dequant(const li_kernels *L, const li_kernels *S, int t) { return L->dequant[t] != S->dequant[t]; }

static void check_dequant(const char *lv, const li_kernels *L, const li_kernels *S) {
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int type = weight_types[ti];
        tally t = start(lv, "dequant", li_types[type].name);
        int64_t ks[32];
        const int nk = sizes_for(li_types[type].block_size, ks);
        for (int si = 0; si < nk; si++)
            for (int rep = 0; rep < 3; rep++) {
                const int64_t k = ks[si];
                void *w = gmalloc(li_row_bytes(type, k));
                random_weights(type, w, k, 1);
                float *y0 = gmalloc((size_t)k * 4), *y1 = gmalloc((size_t)k * 4);
                S->dequant[type](w, y0, k);
                L->dequant[type](w, y1, k);
                size_t at;
                t.cases++;
                if (same_bits(y0, y1, (size_t)k * 4, &at))
                    t.exact++;
                else
                    fail(&t, "k=%lld element %zu: %a (%08x) vs scalar %a (%08x)", (long long)k, at / 4,
                         y1[at / 4], fbits(y1[at / 4]), y0[at / 4], fbits(y0[at / 4]));
                gfree_all();
            }
        finish(&t, "", replaced_dequant(L, S, type));
    }
}

static const char *act_names[LI_ACT_COUNT] = {"F32", "Q8_0", "Q8_1", "Q8_K"};

static void check_quant_act(const char *lv, const li_kernels *L, const li_kernels *S) {
    for (int act = 0; act < LI_ACT_COUNT; act++) {
        tally t = start(lv, "quant_act", act_names[act]);
        const int bs = li_act_block_size(act);
        int64_t ks[32];
        const int nk = sizes_for(bs == 1 ? 32 : bs, ks); /* F32: any k; use 32-multiples */
        for (int si = 0; si < nk; si++)
            for (int pattern = 0; pattern < N_PATTERNS; pattern++) {
                const int64_t k = ks[si];
                const size_t rb = li_act_row_bytes(act, k);
                float *x = gmalloc((size_t)k * 4);
                random_floats(x, k, pattern, bs);
                unsigned char *y0 = gmalloc(rb), *y1 = gmalloc(rb);
                S->quant_act[act](x, y0, k);
                L->quant_act[act](x, y1, k);
                size_t at;
                t.cases++;
                if (same_bits(y0, y1, rb, &at))
                    t.exact++;
                else
                    fail(&t, "k=%lld pattern %d: byte %zu of the row differs (%02x vs scalar %02x)",
                         (long long)k, pattern, at, y1[at], y0[at]);
                gfree_all();
            }
        finish(&t, "", L->quant_act[act] != S->quant_act[act]);
    }
}

static int is_quantized(int type) { return li_types[type].act_type != LI_ACT_F32; }

static void check_dot(const char *lv, const li_kernels *L, const li_kernels *S) {
    const double tol = 1e-5;
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int type = weight_types[ti];
        const int act = li_types[type].act_type;
        tally t = start(lv, "dot", li_types[type].name);
        int64_t ks[32];
        const int nk = sizes_for(li_types[type].block_size, ks);
        for (int si = 0; si < nk; si++)
            for (int nc = 1; nc <= LI_DOT_MAX_NC; nc++)
                for (int pad = 0; pad <= 12; pad += 12) {
                    const int64_t k = ks[si];
                    if (k % li_act_block_size(act)) continue;
                    const size_t rb = li_act_row_bytes(act, k), stride = rb + (size_t)pad;
                    void *w = gmalloc(li_row_bytes(type, k));
                    random_weights(type, w, k, 0);
                    float *wf = gmalloc((size_t)k * 4);
                    S->dequant[type](w, wf, k);
                    float *x = gmalloc((size_t)k * 4 * (size_t)nc);
                    for (int c = 0; c < nc; c++) random_floats(x + c * k, k, rnd_below(2), 1);
                    unsigned char *xq = gmalloc(stride * (size_t)(nc - 1) + rb);
                    for (int c = 0; c < nc; c++) S->quant_act[act](x + c * k, xq + (size_t)c * stride, k);
                    float ref[LI_DOT_MAX_NC], got[LI_DOT_MAX_NC];
                    S->dot[type](k, w, xq, stride, nc, ref);
                    L->dot[type](k, w, xq, stride, nc, got);
                    for (int c = 0; c < nc; c++) {
                        double mag = 0.0;
                        for (int64_t i = 0; i < k; i++) mag += fabs((double)wf[i] * x[c * k + i]);
                        const double err = fabs((double)got[c] - ref[c]), allowed = tol * mag + 1e-30;
                        t.cases++;
                        const int exact = fbits(got[c]) == fbits(ref[c]);
                        t.exact += exact;
                        if (err / allowed > t.worst) t.worst = err / allowed;
                        /* bit-identical passes even when both overflowed (large activations
                         * can push Q8_1's float16 sum to inf, in ggml as here) */
                        if (!exact && (!(err <= allowed) || (strict && is_quantized(type))))
                            fail(&t, "k=%lld nc=%d row %d pad %d: %.9g vs scalar %.9g (sum|wx| %.3g)",
                                 (long long)k, nc, c, pad, got[c], ref[c], mag);
                    }
                    gfree_all();
                }
        finish(&t, strict && is_quantized(type) ? " (strict)" : "", L->dot[type] != S->dot[type]);
    }
}


/* random floats for the element-wise ops: mostly gaussian, some any bits */
static void op_floats(float *x, int64_t n, int wild) {
    for (int64_t i = 0; i < n; i++)
        x[i] = wild && rnd_below(8) == 0 ? li_bits_f32(rnd32()) : gauss() * 4.0f;
}

static void op_halfs(uint16_t *x, int64_t n, int wild) {
    for (int64_t i = 0; i < n; i++)
        x[i] = wild && rnd_below(8) == 0 ? (uint16_t)rnd32() : li_f32_to_f16(gauss());
}

static void expect_same(tally *t, const void *got, const void *ref, size_t bytes, int64_t n,
                        const char *what) {
    size_t at;
    t->cases++;
    if (same_bits(got, ref, bytes, &at))
        t->exact++;
    else
        fail(t, "n=%lld %s: byte %zu differs", (long long)n, what, at);
}

/* |got - ref| <= rel * |ref| + abs per element, NaN where ref is NaN */
static void expect_close(tally *t, const float *got, const float *ref, int64_t n, double rel,
                         double abs_tol, const char *what) {
    t->cases++;
    int exact = 1;
    for (int64_t i = 0; i < n; i++) {
        if (fbits(got[i]) != fbits(ref[i])) exact = 0;
        if (isnan(ref[i]) && isnan(got[i])) continue;
        const double err = fabs((double)got[i] - ref[i]), allowed = rel * fabs(ref[i]) + abs_tol;
        if (err / allowed > t->worst) t->worst = err / allowed;
        if (!(err <= allowed)) {
            fail(t, "n=%lld %s: element %lld %.9g vs scalar %.9g", (long long)n, what, (long long)i,
                 got[i], ref[i]);
            return;
        }
    }
    t->exact += exact;
}

static void expect_close_sum(tally *t, float got, float ref, double mag, int64_t n) {
    const double err = fabs((double)got - ref), allowed = 1e-5 * mag + 1e-30;
    t->cases++;
    t->exact += fbits(got) == fbits(ref);
    if (err / allowed > t->worst) t->worst = err / allowed;
    if (!(err <= allowed)) fail(t, "n=%lld: %.9g vs scalar %.9g (sum|ab| %.3g)", (long long)n, got, ref, mag);
}

static void check_vector_ops(const char *lv, const li_kernels *L, const li_kernels *S) {
    static const int64_t lens[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 257, 1000, 4099};
    const int nl = (int)(sizeof(lens) / sizeof(lens[0]));

    tally t = start(lv, "vec", "rms_norm");
    for (int li = 0; li < nl; li++)
        for (int withw = 0; withw < 2; withw++) {
            const int64_t n = lens[li];
            float *x = gmalloc((size_t)n * 4), *w = gmalloc((size_t)n * 4);
            float *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
            op_floats(x, n, 0);
            op_floats(w, n, 0);
            S->rms_norm(x, withw ? w : NULL, y0, n, 1e-5f);
            L->rms_norm(x, withw ? w : NULL, y1, n, 1e-5f);
            expect_close(&t, y1, y0, n, 1e-6, 1e-40, withw ? "with w" : "no w");
            gfree_all();
        }
    finish(&t, "", L->rms_norm != S->rms_norm);

    t = start(lv, "vec", "softmax");
    for (int li = 0; li < nl; li++)
        for (int spread = 0; spread < 4; spread++) {
            const int64_t n = lens[li];
            const float sc[4] = {1.0f, 10.0f, 60.0f, 300.0f};
            float *x0 = gmalloc((size_t)n * 4), *x1 = gmalloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) x0[i] = gauss() * sc[spread];
            if (n > 2) x0[rnd_below((int)n)] = -INFINITY; /* a masked position */
            memcpy(x1, x0, (size_t)n * 4);
            S->softmax(x0, n);
            L->softmax(x1, n);
            expect_close(&t, x1, x0, n, 1e-6, 1e-40, "softmax");
            gfree_all();
        }
    finish(&t, "", L->softmax != S->softmax);

    t = start(lv, "vec", "softcap_f32"); /* a level's own tanh: within 1e-6 of tanhf's, relative */
    for (int li = 0; li < nl; li++)
        for (int v = 0; v < 3; v++) { /* cap 30 (Gemma's logits), cap 1, no cap with a scale */
            const int64_t n = lens[li];
            const float cap = v == 0 ? 30.0f : v == 1 ? 1.0f : 0.0f, scale = v == 2 ? 0.75f : 1.0f;
            float *x0 = gmalloc((size_t)n * 4), *x1 = gmalloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) x0[i] = gauss() * (v == 0 ? 60.0f : 3.0f);
            if (n > 4) { /* signed zero, overflow, NaN, a value where the approximation is x itself */
                x0[0] = -0.0f;
                x0[1] = cap > 0.0f ? -INFINITY : -1e30f; /* (expect_close takes no infinite result) */
                x0[2] = NAN;
                x0[3] = 3e-4f * cap;
            }
            memcpy(x1, x0, (size_t)n * 4);
            S->softcap_f32(x0, n, scale, cap);
            L->softcap_f32(x1, n, scale, cap);
            expect_close(&t, x1, x0, n, 1e-6, 1e-40, v == 0 ? "cap 30" : v == 1 ? "cap 1" : "no cap");
            gfree_all();
        }
    finish(&t, "", L->softcap_f32 != S->softcap_f32);

    t = start(lv, "vec", "act_apply");
    for (int li = 0; li < nl; li++)
        for (int withu = 0; withu < 4; withu++) { /* bit 0: with u; bit 1: GELU, else SiLU */
            const int64_t n = lens[li];
            float *x = gmalloc((size_t)n * 4), *u = gmalloc((size_t)n * 4);
            float *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
            op_floats(x, n, 1);
            for (int64_t i = 0; i < n; i++)
                if (rnd_below(4) == 0) /* halfway between two halfs, or near the f16 limits */
                    x[i] = li_bits_f32((fbits(x[i]) & ~0x1fffu) | (rnd_below(2) ? 0x1000u : 0x0fffu));
            op_floats(u, n, 0);
            const int act = (withu & 2) ? LI_FN_GELU : LI_FN_SILU;
            S->act_apply(act, x, (withu & 1) ? u : NULL, y0, n);
            L->act_apply(act, x, (withu & 1) ? u : NULL, y1, n);
            expect_same(&t, y1, y0, (size_t)n * 4, n, (withu & 1) ? "with u" : "no u");
            gfree_all();
        }
    finish(&t, "", L->act_apply != S->act_apply);

    t = start(lv, "vec", "dot_f32_f16");
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        float *a = gmalloc((size_t)n * 4);
        uint16_t *b = gmalloc((size_t)n * 2);
        op_floats(a, n, 0);
        op_halfs(b, n, 0);
        double mag = 0.0;
        for (int64_t i = 0; i < n; i++) mag += fabs((double)a[i] * li_f16_to_f32(b[i]));
        expect_close_sum(&t, L->dot_f32_f16(a, b, n), S->dot_f32_f16(a, b, n), mag, n);
        gfree_all();
    }
    finish(&t, "", L->dot_f32_f16 != S->dot_f32_f16);

    t = start(lv, "vec", "dot_f32");
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        float *a = gmalloc((size_t)n * 4), *b = gmalloc((size_t)n * 4);
        op_floats(a, n, 0);
        op_floats(b, n, 0);
        double mag = 0.0;
        for (int64_t i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
        expect_close_sum(&t, L->dot_f32(a, b, n), S->dot_f32(a, b, n), mag, n);
        gfree_all();
    }
    finish(&t, "", L->dot_f32 != S->dot_f32);

    t = start(lv, "vec", "axpy_f16");
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        uint16_t *x = gmalloc((size_t)n * 2);
        float *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
        op_halfs(x, n, 1);
        op_floats(y0, n, 1);
        memcpy(y1, y0, (size_t)n * 4);
        const float a = gauss();
        S->axpy_f16(a, x, y0, n);
        L->axpy_f16(a, x, y1, n);
        expect_same(&t, y1, y0, (size_t)n * 4, n, "axpy_f16");
        gfree_all();
    }
    finish(&t, "", L->axpy_f16 != S->axpy_f16);

    t = start(lv, "vec", "axpy_f32");
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        float *x = gmalloc((size_t)n * 4), *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
        op_floats(x, n, 1);
        op_floats(y0, n, 1);
        memcpy(y1, y0, (size_t)n * 4);
        const float a = gauss();
        S->axpy_f32(a, x, y0, n);
        L->axpy_f32(a, x, y1, n);
        expect_same(&t, y1, y0, (size_t)n * 4, n, "axpy_f32");
        gfree_all();
    }
    finish(&t, "", L->axpy_f32 != S->axpy_f32);

    t = start(lv, "vec", "f32_to_f16");
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        float *x = gmalloc((size_t)n * 4);
        uint16_t *y0 = gmalloc((size_t)n * 2), *y1 = gmalloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            const int kind = rnd_below(4);
            uint32_t u = rnd32();
            if (kind == 1) u = (u & 0x80000000u) | ((u % 0x1f000000u) + 0x30000000u); /* f16 range */
            if (kind == 2) u = (u & ~0x1fffu) | 0x1000u;                           /* halfway */
            x[i] = kind == 3 ? gauss() : li_bits_f32(u);
        }
        S->f32_to_f16(x, y0, n);
        L->f32_to_f16(x, y1, n);
        expect_same(&t, y1, y0, (size_t)n * 2, n, "f32_to_f16");
        gfree_all();
    }
    finish(&t, "", L->f32_to_f16 != S->f32_to_f16);

    t = start(lv, "vec", "f16_to_f32");
    {
        /* every half, in one call, then short lengths for the tails */
        uint16_t *x = gmalloc(65536 * 2);
        float *y0 = gmalloc(65536 * 4), *y1 = gmalloc(65536 * 4);
        for (int i = 0; i < 65536; i++) x[i] = (uint16_t)i;
        S->f16_to_f32(x, y0, 65536);
        L->f16_to_f32(x, y1, 65536);
        expect_same(&t, y1, y0, 65536 * 4, 65536, "all halfs");
        gfree_all();
    }
    for (int li = 0; li < nl; li++) {
        const int64_t n = lens[li];
        uint16_t *x = gmalloc((size_t)n * 2);
        float *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
        op_halfs(x, n, 1);
        S->f16_to_f32(x, y0, n);
        L->f16_to_f32(x, y1, n);
        expect_same(&t, y1, y0, (size_t)n * 4, n, "f16_to_f32");
        gfree_all();
    }
    finish(&t, "", L->f16_to_f32 != S->f16_to_f32);

    const char *names[3] = {"scale_f32", "add_f32", "mul_f32"};
    for (int op = 0; op < 3; op++) {
        t = start(lv, "vec", names[op]);
        for (int li = 0; li < nl; li++) {
            const int64_t n = lens[li];
            float *a = gmalloc((size_t)n * 4), *b = gmalloc((size_t)n * 4);
            float *y0 = gmalloc((size_t)n * 4), *y1 = gmalloc((size_t)n * 4);
            op_floats(a, n, 1);
            op_floats(b, n, 1);
            if (op == 0) {
                memcpy(y0, a, (size_t)n * 4);
                memcpy(y1, a, (size_t)n * 4);
                const float s = gauss();
                S->scale_f32(y0, s, n);
                L->scale_f32(y1, s, n);
            } else if (op == 1) {
                S->add_f32(a, b, y0, n);
                L->add_f32(a, b, y1, n);
            } else {
                S->mul_f32(a, b, y0, n);
                L->mul_f32(a, b, y1, n);
            }
            expect_same(&t, y1, y0, (size_t)n * 4, n, names[op]);
            gfree_all();
        }
        finish(&t, "", op == 0 ? L->scale_f32 != S->scale_f32
                       : op == 1 ? L->add_f32 != S->add_f32 : L->mul_f32 != S->mul_f32);
    }
}

/* ---- the recurrent mixers (scalar_recurrent.c is their specification) ---- */

/* The rows of one sequence in a batch of 2n + 1: every other row, so the
 * kernels' row indices and strides are exercised. */
static int32_t *seq_rows(int64_t n) {
    int32_t *rows = gmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(2 * i + 1);
    return rows;
}

/* |got - ref| <= rel * max |ref| (the whole array's scale) per element */
static void expect_normwise(tally *t, const float *got, const float *ref, int64_t n, double rel, const char *what) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)ref[i]) > mx) mx = fabs((double)ref[i]);
    t->cases++;
    int exact = 1;
    for (int64_t i = 0; i < n; i++) {
        if (fbits(got[i]) != fbits(ref[i])) exact = 0;
        const double err = fabs((double)got[i] - ref[i]), allowed = rel * mx + 1e-30;
        if (err / allowed > t->worst) t->worst = err / allowed;
        if (!(err <= allowed)) {
            fail(t, "%s: element %lld %.9g vs scalar %.9g (max |ref| %.3g)", what, (long long)i, got[i], ref[i], mx);
            return;
        }
    }
    t->exact += exact;
}

/* |got - ref| <= rel * mag[i] per element of each sequence row rows[i] (width
 * values a row, ld apart) */
static void expect_per_token(tally *t, const float *got, const float *ref, const int32_t *rows, int64_t n,
                             int64_t width, size_t ld, const double *mag, double rel, const char *what) {
    t->cases++;
    int exact = 1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < width; j++) {
            const size_t at = (size_t)rows[i] * ld + (size_t)j;
            if (fbits(got[at]) != fbits(ref[at])) exact = 0;
            const double err = fabs((double)got[at] - ref[at]), allowed = rel * mag[i] + 1e-30;
            if (err / allowed > t->worst) t->worst = err / allowed;
            if (!(err <= allowed)) {
                fail(t, "%s: token %lld value %lld %.9g vs scalar %.9g (magnitude %.3g)", what, (long long)i,
                     (long long)j, got[at], ref[at], mag[i]);
                return;
            }
        }
    t->exact += exact;
}

/* a unit vector scaled by s, as gdn_norm_qk leaves q and k */
static void unit_row(float *x, int64_t n, float s) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = gauss();
        ss += (double)x[i] * x[i];
    }
    const float r = (float)(s / sqrt(ss > 0 ? ss : 1.0));
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

/* Tolerance of the delta rule's and the scan's outputs and states against
 * the scalar order: fused multiply-adds and lane-wise partial sums round
 * differently, and the state carries the difference from token to token
 * (the decay shrinks it). A state is held to its largest value; a token's
 * outputs, sums that may cancel, to the largest sum of their terms'
 * magnitudes over the head's rows (magnitudes from the scalar kernel, run a
 * token at a time: the same bits as one call). */
#define RECURRENT_REL 1e-5

/* per token of rows: max over j of sum_e |S_j,e q_e|, S after the token */
static void gdn_magnitudes(const li_kernels *S, const float *S_in, int64_t dk, int64_t dv, const int32_t *rows,
                           int64_t n, const float *q, const float *k, size_t ld, const float *v, const float *al,
                           const float *be, float dt_b, float a, float *o, double *mag) {
    float *St = gmalloc((size_t)(dv * dk) * 4);
    memcpy(St, S_in, (size_t)(dv * dk) * 4);
    for (int64_t i = 0; i < n; i++) {
        S->gdn_head(St, dk, dv, rows + i, 1, q, k, ld, v, (size_t)dv, al, be, 1, dt_b, a, o, (size_t)dv);
        const float *qt = q + (size_t)rows[i] * ld;
        mag[i] = 0.0;
        for (int64_t j = 0; j < dv; j++) {
            double m = 0.0;
            for (int64_t e = 0; e < dk; e++) m += fabs((double)St[j * dk + e] * qt[e]);
            if (m > mag[i]) mag[i] = m;
        }
    }
}

/* per token of rows: max over i of (sum_e |S_i,e C_e| + |x_i d|) |SiLU(z_i)|, S after the token */
static void mamba2_magnitudes(const li_kernels *S, const float *S_in, int64_t hd, int64_t ds, const int32_t *rows,
                              int64_t n, const float *x, size_t ld, const float *B, const float *Cm, const float *dt,
                              float dt_b, float a, float d, const float *z, float *y, double *mag) {
    float *St = gmalloc((size_t)(hd * ds) * 4);
    memcpy(St, S_in, (size_t)(hd * ds) * 4);
    for (int64_t k = 0; k < n; k++) {
        S->mamba2_head(St, hd, ds, rows + k, 1, x, ld, B, Cm, dt, 1, dt_b, a, d, z, (size_t)hd, y, (size_t)hd);
        const size_t t = (size_t)rows[k];
        mag[k] = 0.0;
        for (int64_t i = 0; i < hd; i++) {
            double m = fabs((double)x[t * ld + (size_t)i] * d);
            for (int64_t e = 0; e < ds; e++) m += fabs((double)St[i * ds + e] * Cm[t * ld + (size_t)e]);
            const double zi = z[t * (size_t)hd + (size_t)i];
            m *= fabs(zi / (1.0 + exp(-zi)));
            if (m > mag[k]) mag[k] = m;
        }
    }
}

static void check_recurrent(const char *lv, const li_kernels *L, const li_kernels *S) {
    static const int64_t channels[] = {1, 3, 4, 5, 8, 17, 64, 67};
    static const int taps[] = {1, 2, 4, 5};
    static const int64_t tokens[] = {1, 3, 17, 40};
    static const int64_t widths[] = {1, 3, 4, 7, 8, 9, 16, 17, 33, 128};

    tally t = start(lv, "recurrent", "conv_rows");
    for (int ci = 0; ci < 8; ci++)
        for (int ki = 0; ki < 4; ki++)
            for (int ni = 0; ni < 4; ni++)
                for (int var = 0; var < 4; var++) { /* bit 0: SiLU; bit 1: bias */
                    const int64_t C = channels[ci], n = tokens[ni], T = 2 * n + 1, c0 = C > 4 ? 1 : 0;
                    const int K = taps[ki], h = K - 1;
                    float *x = gmalloc((size_t)(T * C) * 4), *w = gmalloc((size_t)(C * K) * 4);
                    float *bias = gmalloc((size_t)C * 4), *st0 = gmalloc((size_t)(C * h + 1) * 4);
                    float *st1 = gmalloc((size_t)(C * h + 1) * 4);
                    float *y0 = gmalloc((size_t)(T * C) * 4), *y1 = gmalloc((size_t)(T * C) * 4);
                    const int32_t *rows = seq_rows(n);
                    op_floats(x, T * C, 0);
                    op_floats(w, C * K, 0);
                    op_floats(bias, C, 0);
                    op_floats(st0, C * h + 1, 0);
                    memcpy(st1, st0, (size_t)(C * h + 1) * 4);
                    memcpy(y1, y0, (size_t)(T * C) * 4);
                    S->conv_rows(x, (size_t)C, y0, (size_t)C, rows, n, w, (var & 2) ? bias : NULL, K, st0, c0, C,
                                 var & 1);
                    L->conv_rows(x, (size_t)C, y1, (size_t)C, rows, n, w, (var & 2) ? bias : NULL, K, st1, c0, C,
                                 var & 1);
                    expect_same(&t, y1, y0, (size_t)(T * C) * 4, C, "conv output");
                    expect_same(&t, st1, st0, (size_t)(C * h + 1) * 4, C, "conv window");
                    gfree_all();
                }
    finish(&t, " (bit-identical)", L->conv_rows != S->conv_rows);

    t = start(lv, "recurrent", "gdn_head");
    for (int wi = 0; wi < 10; wi++)
        for (int vi = 0; vi < 3; vi++)
            for (int ni = 0; ni < 4; ni++) {
                const int64_t dk = widths[wi], dv = (int64_t[]){1, 5, 16}[vi], n = tokens[ni], T = 2 * n + 1;
                const int64_t ld = dk + 3; /* q and k rows wider than dk, as in the forward pass's buffer */
                float *q = gmalloc((size_t)(T * ld) * 4), *k = gmalloc((size_t)(T * ld) * 4);
                float *v = gmalloc((size_t)(T * dv) * 4), *al = gmalloc((size_t)T * 4), *be = gmalloc((size_t)T * 4);
                float *S0 = gmalloc((size_t)(dv * dk) * 4), *S1 = gmalloc((size_t)(dv * dk) * 4);
                float *o0 = gmalloc((size_t)(T * dv) * 4), *o1 = gmalloc((size_t)(T * dv) * 4);
                const int32_t *rows = seq_rows(n);
                for (int64_t r = 0; r < T; r++) {
                    unit_row(q + r * ld, dk, (float)(1.0 / sqrt((double)dk)));
                    unit_row(k + r * ld, dk, 1.0f);
                }
                op_floats(v, T * dv, 0);
                op_floats(al, T, 0);
                op_floats(be, T, 0);
                op_floats(S0, dv * dk, 0);
                memcpy(S1, S0, (size_t)(dv * dk) * 4);
                memset(o0, 0, (size_t)(T * dv) * 4);
                memset(o1, 0, (size_t)(T * dv) * 4);
                const float dt_b = gauss(), a = -expf(gauss());
                double *mag = gmalloc((size_t)n * 8);
                float *om = gmalloc((size_t)(T * dv) * 4);
                gdn_magnitudes(S, S0, dk, dv, rows, n, q, k, (size_t)ld, v, al, be, dt_b, a, om, mag);
                S->gdn_head(S0, dk, dv, rows, n, q, k, (size_t)ld, v, (size_t)dv, al, be, 1, dt_b, a, o0, (size_t)dv);
                L->gdn_head(S1, dk, dv, rows, n, q, k, (size_t)ld, v, (size_t)dv, al, be, 1, dt_b, a, o1, (size_t)dv);
                expect_per_token(&t, o1, o0, rows, n, dv, (size_t)dv, mag, RECURRENT_REL, "gdn output");
                expect_normwise(&t, S1, S0, dv * dk, RECURRENT_REL, "gdn state");
                gfree_all();
            }
    finish(&t, "", L->gdn_head != S->gdn_head);

    t = start(lv, "recurrent", "mamba2_head");
    for (int wi = 0; wi < 10; wi++)
        for (int hi = 0; hi < 3; hi++)
            for (int ni = 0; ni < 4; ni++) {
                const int64_t ds = widths[wi], hd = (int64_t[]){1, 3, 8}[hi], n = tokens[ni], T = 2 * n + 1;
                const int64_t ld = LI_MAX(ds, hd) + 5;
                float *x = gmalloc((size_t)(T * ld) * 4), *B = gmalloc((size_t)(T * ld) * 4);
                float *Cm = gmalloc((size_t)(T * ld) * 4), *dt = gmalloc((size_t)T * 4), *z = gmalloc((size_t)(T * hd) * 4);
                float *S0 = gmalloc((size_t)(hd * ds) * 4), *S1 = gmalloc((size_t)(hd * ds) * 4);
                float *y0 = gmalloc((size_t)(T * hd) * 4), *y1 = gmalloc((size_t)(T * hd) * 4);
                const int32_t *rows = seq_rows(n);
                op_floats(x, T * ld, 0);
                op_floats(B, T * ld, 0);
                op_floats(Cm, T * ld, 0);
                op_floats(dt, T, 0);
                op_floats(z, T * hd, 0);
                op_floats(S0, hd * ds, 0);
                memcpy(S1, S0, (size_t)(hd * ds) * 4);
                memset(y0, 0, (size_t)(T * hd) * 4);
                memset(y1, 0, (size_t)(T * hd) * 4);
                const float dt_b = gauss(), a = -expf(gauss()), d = gauss();
                double *mag = gmalloc((size_t)n * 8);
                float *ym = gmalloc((size_t)(T * hd) * 4);
                mamba2_magnitudes(S, S0, hd, ds, rows, n, x, (size_t)ld, B, Cm, dt, dt_b, a, d, z, ym, mag);
                S->mamba2_head(S0, hd, ds, rows, n, x, (size_t)ld, B, Cm, dt, 1, dt_b, a, d, z, (size_t)hd, y0,
                               (size_t)hd);
                L->mamba2_head(S1, hd, ds, rows, n, x, (size_t)ld, B, Cm, dt, 1, dt_b, a, d, z, (size_t)hd, y1,
                               (size_t)hd);
                expect_per_token(&t, y1, y0, rows, n, hd, (size_t)hd, mag, RECURRENT_REL, "mamba2 output");
                expect_normwise(&t, S1, S0, hd * ds, RECURRENT_REL, "mamba2 state");
                gfree_all();
            }
    finish(&t, "", L->mamba2_head != S->mamba2_head);
}

/* entries a level leaves as the scalar ones (pointer-equal), by name */
static void list_inherited(const char *lv, const li_kernels *L, const li_kernels *S) {
    char buf[512] = "";
    size_t used = 0;
#define NOTE(cond, ...)                                                                     \
    if (cond) used += (size_t)snprintf(buf + used, used < sizeof(buf) ? sizeof(buf) - used : 0, \
                                       __VA_ARGS__);
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int ty = weight_types[ti];
        NOTE(L->dequant[ty] == S->dequant[ty], " dequant[%s]", li_types[ty].name)
        NOTE(L->dot[ty] == S->dot[ty], " dot[%s]", li_types[ty].name)
    }
    for (int a = 0; a < LI_ACT_COUNT; a++) NOTE(L->quant_act[a] == S->quant_act[a], " quant_act[%s]", act_names[a])
#undef NOTE
    printf("  %s: entries left as scalar:%s\n", lv, used ? buf : " none");
}

static void check_level(const char *lv, const li_kernels *L, const li_kernels *S) {
    const long before = total_fails, cases = total_cases;
    list_inherited(lv, L, S);
    check_dequant(lv, L, S);
    check_quant_act(lv, L, S);
    check_dot(lv, L, S);
    check_vector_ops(lv, L, S);
    check_recurrent(lv, L, S);
    printf("  %s: %ld cases, %ld failures\n", lv, total_cases - cases, total_fails - before);
}

int main(int argc, char **argv) {
    uint64_t seed = 1;
    int dot_build = 1;
    const char *expect_best = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--dot-build") && i + 1 < argc)
            dot_build = !strcmp(argv[++i], "yes");
        else if (!strcmp(argv[i], "--expect-best") && i + 1 < argc)
            expect_best = argv[++i];
        else if (!strcmp(argv[i], "--strict"))
            strict = 1;
        else if (!strcmp(argv[i], "-v"))
            verbose = 1;
        else {
            fprintf(stderr, "usage: %s [--seed N] [--dot-build yes|no] [--expect-best ISA] [--strict] [-v]\n",
                    argv[0]);
            return 2;
        }
    }
    rng = seed;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGSEGV, on_fault);
    signal(SIGBUS, on_fault);
    signal(SIGILL, on_fault);

    char feats[256];
    li_cpu_features(feats, sizeof(feats));
    const int best = li_isa_best();
    printf("cpu features: %s\nbest level: %s (seed %llu%s)\n", feats, li_isa_name(best),
           (unsigned long long)seed, strict ? ", strict" : "");
    int bad_setup = 0;
    if (expect_best && strcmp(expect_best, li_isa_name(best)) != 0) {
        printf("FAIL dispatch chose %s, expected %s\n", li_isa_name(best), expect_best);
        bad_setup = 1;
    }

    li_kernels S, N, D;
    li_kernels_fill_scalar(&S);
    li_kernels_fill_neon(&N);
    if (N.isa != LI_ISA_NEON) {
        printf("FAIL the neon table is marked %s\n", li_isa_name(N.isa));
        bad_setup = 1;
    } else {
        check_level("neon", &N, &S);
    }

    if (!dot_build) {
        /* built without the flags the fill function is plain code: safe to call */
        li_kernels_fill_neon_dot(&D);
        if (D.isa != LI_ISA_SCALAR || li_isa_available(LI_ISA_NEON_DOT)) {
            printf("FAIL neon_dot built without dot-product flags is not left scalar\n");
            bad_setup = 1;
        } else {
            printf("  neon_dot: built without dot-product flags, table left scalar, level unavailable: ok\n");
        }
    } else if (!li_isa_available(LI_ISA_NEON_DOT)) {
        printf("  neon_dot: skipped, this CPU does not report dot-product instructions\n");
    } else {
        li_kernels_fill_neon_dot(&D);
        if (D.isa != LI_ISA_NEON_DOT) {
            printf("FAIL the neon_dot table is marked %s\n", li_isa_name(D.isa));
            bad_setup = 1;
        } else {
            check_level("neon_dot", &D, &S);
        }
    }

    const int ok = !bad_setup && total_fails == 0;
    printf("%s: %ld cases, %ld bit-identical, %ld failures\n", ok ? "PASS" : "FAIL", total_cases,
           total_exact, total_fails);
    return ok ? 0 : 1;
}
