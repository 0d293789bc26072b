/* x86_avx2_x16.c: MXFP4 products over weights repacked at load (repack.h),
 * with AVX2 on 256-bit vectors: a group's 16 rows as two halves of 8, row r
 * of a half in int32 lane r.
 *
 * Read straight from the file's 17-byte blocks, one row at a time, AVX2's
 * MXFP4 decode is held by its instructions, not by memory: every block
 * costs a lookup, a horizontal reduction to one sum and a scale of its own
 * (x86_avx2_iq.c). Over the repacked groups a 32-byte load holds four level
 * indices (two nibbles each) of each of 8 rows; the levels + 12 (0..24,
 * unsigned) go through one vpshufb, vpmaddubsw multiplies them by four
 * activation bytes broadcast to every lane, and row r's sum builds up in
 * lane r with no horizontal step. The 12 comes out as 12 * the block's sum
 * (the driver's terms hold 128 * it, repack.h). The 8 rows' E8M0 exponents
 * become their floats with integer steps, and the float steps follow
 * scalar_iq.c per lane: acc = fma(isum, d * dx, acc), blocks in order. So
 * each row's result is the scalar kernel's to the bit.
 *
 * Bounds of the int16 steps: a vpmaddubsw word is two products of at most
 * 24 * 128; four such words (two chunks, low and high nibbles) stay under
 * 2^15 before vpmaddwd widens them.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "../common.h"
#include "iq_tables.h"
#include "x86_gemm.h" /* bcast4, store_lanes8, UNROLL */

#define NC LI_X16_NC
#define MX_BLOCK (256 + 16) /* a block's 4 chunks of indices, then its 16 exponents (repack.h) */

/* Decode reads each group once from memory; the lines this far ahead are
 * hinted into L1 as the kernel reaches each block (the prefetchers alone
 * fell behind a plain read). Measurements: docs/kernel-tuning.md#avx2-mxfp4-x16 */
#ifndef MX_PREFETCH_AHEAD
#define MX_PREFETCH_AHEAD 2048
#endif

/* the 8 E8M0 exponents at p as li_e8m0_half's floats: (e - 1) << 23, or
 * for e < 2 the subnormal 0x00200000 << e */
LI_INLINE __m256 e8m0x8(const uint8_t *p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

LI_INLINE void mxfp4_cols(const uint8_t *g, int64_t nb, const char *x, size_t xs, const int nc, const int32_t *terms,
                          float *y, size_t ys, int nr) {
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)(const void *)li_kvalues_mxfp4), _mm_set1_epi8(LI_MXFP4_OFFSET)));
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi16(1);
    __m256 acc[NC][2];
    UNROLL for (int c = 0; c < nc; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * MX_BLOCK;
        if (nc == 1)
            for (int l = 0; l < MX_BLOCK; l += 64) _mm_prefetch((const char *)blk + MX_PREFETCH_AHEAD + l, _MM_HINT_T0);
        UNROLL for (int h = 0; h < 2; h++) {
            __m256i s[NC][2]; /* per column: chunks 0-1 and 2-3, int16 pair sums */
            UNROLL for (int j = 0; j < 4; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * j + 32 * h));
                const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, m4));
                const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), m4));
                UNROLL for (int c = 0; c < nc; c++) {
                    const int8_t *a = (const int8_t *)(x + (size_t)c * xs + (size_t)b * sizeof(act_q8_0)) +
                                      offsetof(act_q8_0, qs);
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(a + 4 * j)),
                                                       _mm256_maddubs_epi16(hi, bcast4(a + 16 + 4 * j)));
                    s[c][j / 2] = j % 2 ? _mm256_add_epi16(s[c][j / 2], p) : p;
                }
            }
            const __m256 dw = e8m0x8(blk + 256 + 8 * h);
            UNROLL for (int c = 0; c < nc; c++) {
                const char *ab = x + (size_t)c * xs + (size_t)b * sizeof(act_q8_0);
                float dx;
                memcpy(&dx, ab + offsetof(act_q8_0, d), sizeof dx);
                const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(s[c][0], one), _mm256_madd_epi16(s[c][1], one));
                const __m256i is = _mm256_sub_epi32(sum, _mm256_set1_epi32(terms[c * nb + b] / 128 * LI_MXFP4_OFFSET));
                acc[c][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[c][h]);
            }
        }
    }
    UNROLL for (int c = 0; c < nc; c++) {
        store_lanes8(y + (size_t)c * ys, acc[c][0], nr);
        if (nr > 8) store_lanes8(y + (size_t)c * ys + 8, acc[c][1], nr - 8);
    }
}

/* one group against nc activation rows; hints: the AVX-512 kernels' stream
 * choices, which this one does not take (it hints its own lines into L1) */
static void x16_mxfp4(const void *group, int64_t k, const void *xq, size_t xs, int nc, const int32_t *terms, float *y,
                      size_t ys, int nr, unsigned hints) {
    (void)hints;
    const uint8_t *g = (const uint8_t *)group;
    const char *x = (const char *)xq;
    switch (nc) {
    case 1: mxfp4_cols(g, k / 32, x, xs, 1, terms, y, ys, nr); break;
    case 2: mxfp4_cols(g, k / 32, x, xs, 2, terms, y, ys, nr); break;
    case 3: mxfp4_cols(g, k / 32, x, xs, 3, terms, y, ys, nr); break;
    default: mxfp4_cols(g, k / 32, x, xs, 4, terms, y, ys, nr); break;
    }
}
LI_STATIC_ASSERT(LI_X16_NC == 4, "x16_mxfp4 takes up to 4 activation rows");

void li_x16_fill_avx2(li_kernels *t) { t->x16[LI_TYPE_MXFP4] = x16_mxfp4; }
#elif defined(LI_ARCH_X86)
void li_x16_fill_avx2(li_kernels *t) { (void)t; } /* built without the AVX2 flags */
#else
typedef int li_empty_translation_unit;
#endif
