/* x86_avx512.c: the AVX-512 level: the AVX2 table, with prefill kernels
 * that use VNNI's vpdpbusd (AVX512_VNNI on 256-bit vectors, AVX512VL).
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni (plus
 * the AVX2 flags); dispatch.c reaches it only when cpuid reports all of them.
 *
 * vpdpbusd multiplies unsigned by signed bytes and adds each group of four
 * products straight into an int32 lane, with no int16 step to saturate: one
 * instruction does what maddubs + madd + add do at the AVX2 level, and the
 * broadcast activation bytes fold into it as a memory operand. The panels
 * are the same (gemm.h); Q8_0's signed values are shifted into unsigned ones
 * on the fly (w ^ 0x80 = w + 128) and the shift taken out as 128 * sum(a).
 * With 32 vector registers, 8 activation rows share each weight chunk.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#include <stddef.h>

#include "x86_gemm.h"

#define R LI_PANEL_ROWS
#define NC_MAX 8



static inline void store_rows(float *y, __m256 v, int nr) {
    if (nr == R) {
        _mm256_storeu_ps(y, v);
        return;
    }
    _mm256_mask_storeu_ps(y, (__mmask8)((1u << nr) - 1), v);
}

static inline void blk32_cols(const li_panel *p, int nr, const char *x, size_t xs, int64_t c0,
                              const int nc, const int sign, const int32_t *asum, float *y, size_t ys) {
    const int64_t nb = p->nb;
    const int min = p->has_min, off = sign ? 128 : p->offset;
    const size_t ab = min ? sizeof(act_q8_1) : sizeof(act_q8_0);
    const size_t qo = min ? offsetof(act_q8_1, qs) : offsetof(act_q8_0, qs);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[NC_MAX];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = p->w + (size_t)b * 8 * R * 4;
        const char *xb[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) xb[c] = x + (size_t)(c0 + c) * xs + (size_t)b * ab;
        __m256i ia[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) ia[c] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
            if (sign) w = _mm256_xor_si256(w, flip);
            UNROLL for (int c = 0; c < nc; c++)
                ia[c] = _mm256_dpbusd_epi32(ia[c], w, bcast4((const int8_t *)xb[c] + qo + 4 * j));
        }
        const __m256 dw = _mm256_loadu_ps(p->d + b * R);
        UNROLL for (int c = 0; c < nc; c++) {
            if (off) ia[c] = _mm256_sub_epi32(ia[c], _mm256_set1_epi32(asum[(c0 + c) * nb + b] * off));
            float dx, sx = 0.0f;
            memcpy(&dx, xb[c], 4); /* d comes first in both activation formats */
            if (min) memcpy(&sx, xb[c] + offsetof(act_q8_1, s), 4);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[c]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[c]);
            if (min) acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(p->m + b * R), _mm256_set1_ps(sx), acc[c]);
        }
    }
    UNROLL for (int c = 0; c < nc; c++) store_rows(y + (size_t)(c0 + c) * ys, acc[c], nr);
}

static inline void ksuper_cols(const li_panel *p, int nr, const char *x, size_t xs, int64_t c0,
                               const int nc, float *y, size_t ys) {
    const int64_t nb = p->nb;
    const int min = p->has_min;
    __m256 acc[NC_MAX];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nb; s++) {
        const uint8_t *ws = p->w + (size_t)s * 64 * R * 4;
        const act_q8_K *a[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) a[c] = (const act_q8_K *)(const void *)(x + (size_t)(c0 + c) * xs) + s;
        __m256i ia[NC_MAX], im[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) ia[c] = im[c] = _mm256_setzero_si256();
        for (int g = 0; g < 16; g++) {
            /* the group's scale, from its (sc, sc) int16 pair */
            const __m256i sc = _mm256_srai_epi32(
                _mm256_loadu_si256((const __m256i *)(p->sc + ((size_t)s * 16 + (size_t)g) * R * 2)), 16);
            __m256i gs[NC_MAX];
            UNROLL for (int c = 0; c < nc; c++) gs[c] = _mm256_setzero_si256();
            UNROLL for (int j = 4 * g; j < 4 * g + 4; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(ws + 32 * j));
                UNROLL for (int c = 0; c < nc; c++) gs[c] = _mm256_dpbusd_epi32(gs[c], w, bcast4(a[c]->qs + 4 * j));
            }
            UNROLL for (int c = 0; c < nc; c++) ia[c] = _mm256_add_epi32(ia[c], _mm256_mullo_epi32(gs[c], sc));
        }
        for (int pr = 0; pr < 8; pr++) {
            const __m256i mc = _mm256_loadu_si256((const __m256i *)(p->mc + ((size_t)s * 8 + (size_t)pr) * R * 2));
            UNROLL for (int c = 0; c < nc; c++)
                im[c] = _mm256_dpwssd_epi32(im[c], mc, bcast4((const int8_t *)(a[c]->bsums + 2 * pr)));
        }
        const __m256 dw = _mm256_loadu_ps(p->d + s * R), mw = _mm256_loadu_ps(p->m + s * R);
        UNROLL for (int c = 0; c < nc; c++) acc[c] = ksuper_accumulate(acc[c], ia[c], im[c], dw, mw, a[c]->d, min);
    }
    UNROLL for (int c = 0; c < nc; c++) store_rows(y + (size_t)(c0 + c) * ys, acc[c], nr);
}

/* the whole batch in groups of NC_MAX rows, the remainder with constant counts */
#define ALL_COLS(call)                                        \
    do {                                                      \
        int64_t c0 = 0;                                       \
        for (; c0 + NC_MAX <= n; c0 += NC_MAX) call(NC_MAX);  \
        switch (n - c0) {                                     \
        case 7: call(7); break;                               \
        case 6: call(6); break;                               \
        case 5: call(5); break;                               \
        case 4: call(4); break;                               \
        case 3: call(3); break;                               \
        case 2: call(2); break;                               \
        case 1: call(1); break;                               \
        default: break;                                       \
        }                                                     \
    } while (0)

static void gemm_blk32(const li_panel *p, int nr, const void *xq, size_t xs, int64_t n,
                       const int32_t *asum, float *y, size_t ys) {
    const char *x = (const char *)xq;
#define SIGNED(nc) blk32_cols(p, nr, x, xs, c0, nc, 1, asum, y, ys)
#define UNSIGNED(nc) blk32_cols(p, nr, x, xs, c0, nc, 0, asum, y, ys)
    if (p->sign)
        ALL_COLS(SIGNED);
    else
        ALL_COLS(UNSIGNED);
#undef SIGNED
#undef UNSIGNED
}

static void gemm_ksuper(const li_panel *p, int nr, const void *xq, size_t xs, int64_t n,
                        const int32_t *asum, float *y, size_t ys) {
    (void)asum;
    const char *x = (const char *)xq;
#define KCOLS(nc) ksuper_cols(p, nr, x, xs, c0, nc, y, ys)
    ALL_COLS(KCOLS);
#undef KCOLS
}

void li_kernels_fill_avx512(li_kernels *t) {
    li_kernels_fill_avx2(t);
    t->isa = LI_ISA_AVX512;
    t->gemm[LI_PANEL_BLK32] = gemm_blk32;
    t->gemm[LI_PANEL_KSUPER] = gemm_ksuper;
    li_x16_fill_avx512(t);
    li_recurrent_fill_avx512(t); /* x86_avx512_recurrent.c: the recurrent mixers */
}
#elif defined(LI_ARCH_X86)
/* built without the AVX-512 flags: the table stays scalar and dispatch skips it */
void li_kernels_fill_avx512(li_kernels *t) { li_kernels_fill_scalar(t); }
#else
typedef int li_empty_translation_unit;
#endif
