/* finite.c: whether a stored tensor's scales are finite, checked once at load.
 *
 * A NaN or infinite block scale makes its whole block non-finite, and the
 * forward pass does not carry that to the logits: the activation quantizers
 * (Q8_0, Q8_K) take a block's largest magnitude with comparisons that skip
 * a NaN, and round NaN to an integer, so the next quantized product sees a
 * finite stand-in and the logits come out finite and wrong. So the scales
 * are read where they are stored: every block's f16 d (and dmin, or Q4_1's
 * and Q5_1's m), MXFP4's E8M0 exponent (0xFF is its NaN), IQ1_M's d spread
 * over its scale words; integer sub-scales cannot be non-finite. F16, BF16
 * and F32 tensors are all values, so all of them are read: a pass reads each
 * once per token anyway. Layouts as blocks.h (gguf's numpy code is the
 * reference).
 */
#include <stddef.h>
#include <string.h>

#include "blocks.h"
#include "llminfer.h"
#include "util.h"
#include "repack.h"  /* li_release_row */

#define CHUNK ((size_t)2 << 20) /* bytes scanned before their pages go back */

static int half_bad(uint16_t h) { return (h & 0x7C00) == 0x7C00; } /* f16: exponent all ones */

static uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The first of the 16-bit values lo..hi-1 at p whose bits under mask are all
 * set (an exponent of all ones: Inf or NaN), or -1. Branch-free over runs of
 * 4096, so the compiler vectorises it: F16 and BF16 weights are all values. */
static int64_t first_all_ones(const uint8_t *p, int64_t lo, int64_t hi, uint16_t mask) {
    for (int64_t i0 = lo; i0 < hi; i0 += 4096) {
        const int64_t i1 = i0 + 4096 < hi ? i0 + 4096 : hi;
        int any = 0;
        for (int64_t i = i0; i < i1; i++) any |= (u16_at(p + 2 * (size_t)i) & mask) == mask;
        if (any)
            for (int64_t i = i0; i < i1; i++)
                if ((u16_at(p + 2 * (size_t)i) & mask) == mask) return i;
    }
    return -1;
}

/* IQ1_M's f16 d, over the top nibbles of its four scale words */
static uint16_t iq1_m_d(const uint8_t *b) {
    const uint8_t *s = b + offsetof(block_iq1_m, scales);
    uint16_t d = 0;
    for (int i = 0; i < 4; i++) d |= (uint16_t)((u16_at(s + 2 * i) >> 12) << (4 * i));
    return d;
}

/* The byte offsets of a block's f16 scales (*n of them, at most 2) and the
 * block's size; 0 for a type whose elements are checked one by one (F16,
 * BF16, F32) or checked by a rule of its own (MXFP4, IQ1_M), -1 for a type
 * not known here. */
static int scale_layout(int type, size_t *size, size_t at[2], int *n) {
    *n = 1;
#define ONE(blk, f) (*size = sizeof(blk), at[0] = offsetof(blk, f), 1)
#define TWO(blk, f, g) (*size = sizeof(blk), at[0] = offsetof(blk, f), at[1] = offsetof(blk, g), *n = 2, 1)
    switch (type) {
    case LI_TYPE_Q4_0: return ONE(block_q4_0, d);
    case LI_TYPE_Q4_1: return TWO(block_q4_1, d, m);
    case LI_TYPE_Q5_0: return ONE(block_q5_0, d);
    case LI_TYPE_Q5_1: return TWO(block_q5_1, d, m);
    case LI_TYPE_Q8_0: return ONE(block_q8_0, d);
    case LI_TYPE_Q2_K: return TWO(block_q2_K, d, dmin);
    case LI_TYPE_Q3_K: return ONE(block_q3_K, d);
    case LI_TYPE_Q4_K: return TWO(block_q4_K, d, dmin);
    case LI_TYPE_Q5_K: return TWO(block_q5_K, d, dmin);
    case LI_TYPE_Q6_K: return ONE(block_q6_K, d);
    case LI_TYPE_IQ4_NL: return ONE(block_iq4_nl, d);
    case LI_TYPE_IQ4_XS: return ONE(block_iq4_xs, d);
    case LI_TYPE_TQ1_0: return ONE(block_tq1_0, d);
    case LI_TYPE_TQ2_0: return ONE(block_tq2_0, d);
    case LI_TYPE_IQ2_XXS: return ONE(block_iq2_xxs, d);
    case LI_TYPE_IQ2_XS: return ONE(block_iq2_xs, d);
    case LI_TYPE_IQ2_S: return ONE(block_iq2_s, d);
    case LI_TYPE_IQ3_XXS: return ONE(block_iq3_xxs, d);
    case LI_TYPE_IQ3_S: return ONE(block_iq3_s, d);
    case LI_TYPE_IQ1_S: return ONE(block_iq1_s, d);
    case LI_TYPE_F32: *size = 4; return 0;
    case LI_TYPE_F16: *size = 2; return 0;
    case LI_TYPE_BF16: *size = 2; return 0;
    case LI_TYPE_MXFP4: *size = sizeof(block_mxfp4); return 0;
    case LI_TYPE_IQ1_M: *size = sizeof(block_iq1_m); return 0;
    default: return -1;
    }
#undef ONE
#undef TWO
}

/* the first bad unit (block, or element of a float type) of [lo, hi), or -1 */
static int64_t scan(int type, const uint8_t *p, size_t size, const size_t at[2], int n, int by_layout, int64_t lo,
                    int64_t hi) {
    if (by_layout) {
        for (int64_t b = lo; b < hi; b++) {
            const uint8_t *blk = p + (size_t)b * size;
            if (half_bad(u16_at(blk + at[0])) || (n == 2 && half_bad(u16_at(blk + at[1])))) return b;
        }
        return -1;
    }
    switch (type) {
    case LI_TYPE_F32:
        for (int64_t i = lo; i < hi; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * (size_t)i, 4);
            if ((v & 0x7F800000u) == 0x7F800000u) return i;
        }
        return -1;
    case LI_TYPE_F16:
        return first_all_ones(p, lo, hi, 0x7C00); /* f16: the exponent's five bits */
    case LI_TYPE_BF16:
        return first_all_ones(p, lo, hi, 0x7F80); /* bf16: f32's eight */
    case LI_TYPE_MXFP4:
        for (int64_t b = lo; b < hi; b++)
            if (p[(size_t)b * size + offsetof(block_mxfp4, e)] == 0xFF) return b;
        return -1;
    case LI_TYPE_IQ1_M:
        for (int64_t b = lo; b < hi; b++)
            if (half_bad(iq1_m_d(p + (size_t)b * size))) return b;
        return -1;
    default:
        return -1;
    }
}

int li_first_nonfinite(int type, const void *data, size_t nbytes, int release, int64_t *unit) {
    if (!unit) return li_fail(LI_E_ARG, "no output for the first non-finite unit");
    *unit = -1;
    size_t size = 0, at[2] = {0, 0};
    int n = 0;
    const int by_layout = scale_layout(type, &size, at, &n);
    if (by_layout < 0) return li_fail(LI_E_TYPE, "no scale layout for tensor type %d", type);
    if (nbytes % size) return li_fail(LI_E_SHAPE, "%zu bytes are not a whole number of %zu-byte units", nbytes, size);
    if (nbytes && !data) return li_fail(LI_E_ARG, "no data to check");
    const uint8_t *p = (const uint8_t *)data;
    const int64_t units = (int64_t)(nbytes / size), per_chunk = (int64_t)(CHUNK / size);
    for (int64_t lo = 0; lo < units; lo += per_chunk) {
        const int64_t hi = lo + per_chunk < units ? lo + per_chunk : units;
        const int64_t bad = scan(type, p, size, at, n, by_layout, lo, hi);
        /* a mapped file's pages go back as they are read: the check holds no
         * more of the model in memory than a chunk */
        if (release) li_release_row(p, nbytes, p + (size_t)lo * size, (size_t)(hi - lo) * size);
        if (bad >= 0) {
            *unit = bad;
            return LI_OK;
        }
    }
    return LI_OK;
}
