/* x86_avx2_gemm.c: the AVX2 prefill kernels over packed panels (gemm.h).
 * Built with -mavx2 -mfma -mf16c; filled into the AVX2 table by
 * li_kernels_fill_avx2.
 *
 * A panel interleaves 8 weight rows four values at a time, so one 32-byte
 * chunk times 4 activation bytes broadcast to every lane gives, after
 * maddubs and madd, each row's 4-value partial dot product in its own 32-bit
 * lane. Lanes accumulate in int32 across a block (32 values) or a K-quant
 * super-block (256 values, the integer sub-scales multiplying in the madd),
 * then one conversion and one fused multiply-add per block apply the scales
 * of all 8 rows at once. Four activation rows share each chunk load.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <stddef.h>

#include "iq_tables.h"
#include "x86_gemm.h"

#define R LI_PANEL_ROWS
#define NC_MAX 4

/* ---- 32-value blocks: Q4_0, Q5_0 (offset), Q4_1, Q5_1 (min), Q8_0 (signed) ---- */

/* grp chunks' maddubs results are summed in int16 before one madd: 4 for
 * values up to 5 bits (4 * 2*31*127 < 2^15; MXFP4's level + 12 is at most
 * 24), 1 for the magnitudes of the signed panels (up to 127) */
static inline void blk32_cols(const li_panel *p, int nr, const char *x, size_t xs, int64_t c0,
                              const int nc, const int grp, const int sign, const int32_t *asum,
                              float *y, size_t ys) {
    const int64_t nb = p->nb;
    const int min = p->has_min, off = p->offset;
    const size_t ab = min ? sizeof(act_q8_1) : sizeof(act_q8_0);
    const size_t qo = min ? offsetof(act_q8_1, qs) : offsetof(act_q8_0, qs);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[NC_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = p->w + (size_t)b * 8 * R * 4;
        const uint8_t *wab = sign ? p->wa + (size_t)b * 8 * R * 4 : wb;
        const char *xb[NC_MAX];
        for (int c = 0; c < nc; c++) xb[c] = x + (size_t)(c0 + c) * xs + (size_t)b * ab;
        __m256i ia[NC_MAX];
        for (int c = 0; c < nc; c++) ia[c] = _mm256_setzero_si256();
        UNROLL for (int j0 = 0; j0 < 8; j0 += grp) {
            __m256i h[NC_MAX];
            UNROLL for (int c = 0; c < nc; c++) h[c] = _mm256_setzero_si256();
            UNROLL for (int j = j0; j < j0 + grp; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
                const __m256i wa = sign ? _mm256_loadu_si256((const __m256i *)(wab + 32 * j)) : w;
                UNROLL for (int c = 0; c < nc; c++) {
                    const __m256i a = bcast4((const int8_t *)xb[c] + qo + 4 * j);
                    h[c] = _mm256_add_epi16(h[c], sign ? _mm256_maddubs_epi16(wa, _mm256_sign_epi8(a, w))
                                                       : _mm256_maddubs_epi16(w, a));
                }
            }
            UNROLL for (int c = 0; c < nc; c++) ia[c] = _mm256_add_epi32(ia[c], _mm256_madd_epi16(h[c], ones));
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
    for (int c = 0; c < nc; c++) store_lanes8(y + (size_t)(c0 + c) * ys, acc[c], nr);
}

#define BLK32_ALL_COLS(grp, sign)                                                               \
    do {                                                                                        \
        int64_t c0 = 0;                                                                         \
        for (; c0 + NC_MAX <= n; c0 += NC_MAX)                                                  \
            blk32_cols(p, nr, x, xs, c0, NC_MAX, grp, sign, asum, y, ys);                       \
        switch (n - c0) {                                                                       \
        case 3: blk32_cols(p, nr, x, xs, c0, 3, grp, sign, asum, y, ys); break;                 \
        case 2: blk32_cols(p, nr, x, xs, c0, 2, grp, sign, asum, y, ys); break;                 \
        case 1: blk32_cols(p, nr, x, xs, c0, 1, grp, sign, asum, y, ys); break;                 \
        default: break;                                                                         \
        }                                                                                       \
    } while (0)

static void gemm_blk32(const li_panel *p, int nr, const void *xq, size_t xs, int64_t n,
                       const int32_t *asum, float *y, size_t ys) {
    const char *x = (const char *)xq;
    if (p->sign)
        BLK32_ALL_COLS(1, 1);
    else
        BLK32_ALL_COLS(4, 0);
}

/* ---- K-quant super-blocks against act_q8_K ---- */

/* One super-block's 64 chunks in spans of `span` chunks whose maddubs
 * results are summed in int16 before one madd applies the sub-scale: 8 for
 * Q4_K (its sub-blocks of 32 share a scale, and 8 * 2*15*128 < 2^15), 4 for
 * the other types up to 5 bits, 2 for Q6_K's 6. IQ4_XS's level + 128 (bits
 * 8) would overflow a pair sum: each chunk is flipped back to the signed
 * levels q and multiplied as |q| x (a with q's sign), one chunk at a time,
 * so there is no offset to take out. Everything is unrolled within a span
 * and the activation pointers advance with the chunks, so the loop is the
 * loads, maddubs and adds and little else. */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE __forceinline
#endif

static ALWAYS_INLINE void ksuper_tile(const li_panel *p, int nr, const char *x, size_t xs, const int nc,
                                      const int span, const int levels, const int min, const int32_t *asum,
                                      float *y, size_t ys) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const int64_t nb = p->nb;
    __m256 acc[NC_MAX];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nb; s++) {
        const uint8_t *ws = p->w + (size_t)s * 64 * R * 4;
        const int16_t *scs = p->sc + (size_t)s * 16 * R * 2;
        const act_q8_K *a[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) a[c] = (const act_q8_K *)(const void *)(x + (size_t)c * xs) + s;
        const int8_t *q[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) q[c] = a[c]->qs;
        __m256i ia[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) ia[c] = _mm256_setzero_si256();
        for (int j0 = 0; j0 < 64; j0 += span) {
            __m256i h[NC_MAX];
            UNROLL for (int c = 0; c < nc; c++) h[c] = _mm256_setzero_si256();
            UNROLL for (int j = 0; j < span; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(ws + 32 * j));
                if (levels) {
                    const __m256i lq = _mm256_xor_si256(w, flip), m = _mm256_sign_epi8(lq, lq);
                    UNROLL for (int c = 0; c < nc; c++)
                        h[c] = _mm256_maddubs_epi16(m, _mm256_sign_epi8(bcast4(q[c] + 4 * j), lq));
                } else {
                    UNROLL for (int c = 0; c < nc; c++) {
                        const __m256i t = _mm256_maddubs_epi16(w, bcast4(q[c] + 4 * j));
                        h[c] = _mm256_add_epi16(h[c], t);
                        /* left free, GCC 12 gathered a span's maddubs results on the stack */
                        KEEP_IN_REGISTER(h[c]);
                    }
                }
            }
            /* the span's sub-scale: group j0 / 4 of 16 (for Q4_K's span of 8, groups 2i and 2i+1 share it) */
            const __m256i sc = _mm256_loadu_si256((const __m256i *)(scs + (size_t)(j0 / 4) * R * 2));
            UNROLL for (int c = 0; c < nc; c++) ia[c] = _mm256_add_epi32(ia[c], _mm256_madd_epi16(h[c], sc));
            ws += 32 * span;
            UNROLL for (int c = 0; c < nc; c++) q[c] += 4 * span;
        }
        /* the mins and offsets: sum over groups of mc * (activation sum of the group); IQ4_XS's
         * signed levels have none */
        __m256i im[NC_MAX];
        UNROLL for (int c = 0; c < nc; c++) im[c] = _mm256_setzero_si256();
        if (asum) { /* Q4_K: the sums of 32 against the mins of its sub-blocks, two by two */
            const int16_t *mcs = p->mc32 + (size_t)s * 4 * R * 2;
            UNROLL for (int q2 = 0; q2 < 4; q2++) {
                const __m256i mc = _mm256_loadu_si256((const __m256i *)(mcs + (size_t)q2 * R * 2));
                UNROLL for (int c = 0; c < nc; c++) {
                    const __m256i bs = _mm256_set1_epi32(asum[(size_t)c * (size_t)(8 * nb) + (size_t)s * 8 + (size_t)q2]);
                    im[c] = _mm256_add_epi32(im[c], _mm256_madd_epi16(mc, bs));
                }
            }
        } else if (!levels) {
            const int16_t *mcs = p->mc + (size_t)s * 8 * R * 2;
            UNROLL for (int pr = 0; pr < 8; pr++) {
                const __m256i mc = _mm256_loadu_si256((const __m256i *)(mcs + (size_t)pr * R * 2));
                UNROLL for (int c = 0; c < nc; c++) {
                    const __m256i bs = bcast4((const int8_t *)(a[c]->bsums + 2 * pr));
                    im[c] = _mm256_add_epi32(im[c], _mm256_madd_epi16(mc, bs));
                }
            }
        }
        const __m256 dw = _mm256_loadu_ps(p->d + s * R), mw = _mm256_loadu_ps(p->m + s * R);
        UNROLL for (int c = 0; c < nc; c++) acc[c] = ksuper_accumulate(acc[c], ia[c], im[c], dw, mw, a[c]->d, min);
    }
    UNROLL for (int c = 0; c < nc; c++) store_lanes8(y + (size_t)c * ys, acc[c], nr);
}

/* all n columns, NC_MAX at a time, for one (span, levels, min) */
static ALWAYS_INLINE void ksuper_all(const li_panel *p, int nr, const char *x, size_t xs, int64_t n,
                                     const int span, const int levels, const int min, const int32_t *asum,
                                     float *y, size_t ys) {
    const size_t as = (size_t)(8 * p->nb); /* an activation row's entries of asum */
    int64_t c0 = 0;
    for (; c0 + NC_MAX <= n; c0 += NC_MAX)
        ksuper_tile(p, nr, x + (size_t)c0 * xs, xs, NC_MAX, span, levels, min, asum ? asum + (size_t)c0 * as : NULL,
                    y + (size_t)c0 * ys, ys);
    x += (size_t)c0 * xs;
    y += (size_t)c0 * ys;
    if (asum) asum += (size_t)c0 * as;
    switch (n - c0) {
    case 3: ksuper_tile(p, nr, x, xs, 3, span, levels, min, asum, y, ys); break;
    case 2: ksuper_tile(p, nr, x, xs, 2, span, levels, min, asum, y, ys); break;
    case 1: ksuper_tile(p, nr, x, xs, 1, span, levels, min, asum, y, ys); break;
    default: break;
    }
}

/* one instance per kind of panel, so that every span and flag is a constant */
static void ksuper_q4k(const li_panel *p, int nr, const char *x, size_t xs, int64_t n, const int32_t *asum,
                       float *y, size_t ys) {
    ksuper_all(p, nr, x, xs, n, 8, 0, 1, asum, y, ys);
}
static void ksuper_min4(const li_panel *p, int nr, const char *x, size_t xs, int64_t n, float *y, size_t ys) {
    ksuper_all(p, nr, x, xs, n, 4, 0, 1, NULL, y, ys);
}
static void ksuper_off4(const li_panel *p, int nr, const char *x, size_t xs, int64_t n, float *y, size_t ys) {
    ksuper_all(p, nr, x, xs, n, 4, 0, 0, NULL, y, ys);
}
static void ksuper_off2(const li_panel *p, int nr, const char *x, size_t xs, int64_t n, float *y, size_t ys) {
    ksuper_all(p, nr, x, xs, n, 2, 0, 0, NULL, y, ys);
}
static void ksuper_levels(const li_panel *p, int nr, const char *x, size_t xs, int64_t n, float *y, size_t ys) {
    ksuper_all(p, nr, x, xs, n, 1, 1, 0, NULL, y, ys);
}

static void gemm_ksuper(const li_panel *p, int nr, const void *xq, size_t xs, int64_t n,
                        const int32_t *asum, float *y, size_t ys) {
    const char *x = (const char *)xq;
    if (p->bits == 8)
        ksuper_levels(p, nr, x, xs, n, y, ys); /* IQ4_XS */
    else if (p->bits == 6)
        ksuper_off2(p, nr, x, xs, n, y, ys); /* Q6_K */
    else if (p->bits == 4 && p->mc32) /* a K-super panel of 4-bit values is Q4_K's */
        ksuper_q4k(p, nr, x, xs, n, asum, y, ys); /* sub-blocks of 32; the mins through mc32 */
    else if (p->has_min)
        ksuper_min4(p, nr, x, xs, n, y, ys); /* Q2_K, Q5_K */
    else
        ksuper_off4(p, nr, x, xs, n, y, ys); /* Q3_K */
}

/* ---- panel values straight from the file's blocks ---- */

/* v[r]: 32 consecutive values 32m..32m+31 of row r; chunk 8m + i of the
 * panel is dword i of each row side by side, so the 8 chunks are the 8 x 8
 * transpose of the rows' dwords */
static inline void put_transposed(uint8_t *dst, const __m256i v[R]) {
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    /* u[e]: dword e (low half) and e + 4 (high half) of rows 0..3; u[4 + e]: of rows 4..7 */
    const __m256i u[8] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3),
                          _mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6),
                          _mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7)};
    for (int e = 0; e < 4; e++) {
        _mm256_storeu_si256((__m256i *)(dst + 32 * e), _mm256_permute2x128_si256(u[e], u[4 + e], 0x20));
        _mm256_storeu_si256((__m256i *)(dst + 32 * (e + 4)), _mm256_permute2x128_si256(u[e], u[4 + e], 0x31));
    }
}

/* BLK32: Q8_0's values as stored and their magnitudes; MXFP4's levels + 12
 * through a biased copy of the level table. Block b of row r is one vector,
 * eight rows' blocks one transpose. */
static void panel_values_blk32(int type, const void *w, size_t row_bytes, int nr, int64_t nb, uint8_t *dst,
                               uint8_t *dst_abs) {
    int8_t biased[16];
    for (int i = 0; i < 16; i++) biased[i] = (int8_t)(li_kvalues_mxfp4[i] + LI_MXFP4_OFFSET);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)biased));
    const size_t bb = type == LI_TYPE_Q8_0 ? sizeof(block_q8_0) : sizeof(block_mxfp4);
    for (int64_t b = 0; b < nb; b++) {
        __m256i v[R], a[R];
        for (int r = 0; r < R; r++) {
            if (r >= nr) {
                v[r] = a[r] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *x = (const uint8_t *)w + (size_t)r * row_bytes + (size_t)b * bb;
            a[r] = _mm256_setzero_si256();
            if (type == LI_TYPE_Q8_0) {
                v[r] = _mm256_loadu_si256((const __m256i *)(const void *)(x + offsetof(block_q8_0, qs)));
                a[r] = _mm256_sign_epi8(v[r], v[r]);
            } else {
                v[r] = nl4_lookup(x + offsetof(block_mxfp4, qs), table);
            }
        }
        put_transposed(dst + (size_t)b * 32 * R, v);
        if (dst_abs) put_transposed(dst_abs + (size_t)b * 32 * R, a);
    }
}

/* Q4_K: values 64c + l and 64c + 32 + l are the low and high nibbles of
 * qs[32c + l]; Q6_K: gemm.h's u = q + 32 is the stored 6-bit value, its
 * four runs of 32 per half as unpack.h's unpack_q6_K takes them apart */
static int panel_values(int type, const void *w, size_t row_bytes, int nr, int64_t nb, uint8_t *dst,
                        uint8_t *dst_abs) {
    if ((type == LI_TYPE_Q8_0 && dst_abs) || type == LI_TYPE_MXFP4) {
        panel_values_blk32(type, w, row_bytes, nr, nb, dst, dst_abs);
        return 1;
    }
    if (type != LI_TYPE_Q4_K && type != LI_TYPE_Q6_K) return 0;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t s = 0; s < nb; s++) {
        uint8_t *ds = dst + (size_t)s * 64 * R * 4;
        if (type == LI_TYPE_Q4_K) {
            for (int c = 0; c < 4; c++) {
                __m256i lo[R], hi[R];
                for (int r = 0; r < R; r++) {
                    if (r >= nr) {
                        lo[r] = hi[r] = _mm256_setzero_si256();
                        continue;
                    }
                    const block_q4_K *x = (const block_q4_K *)(const void *)((const char *)w + (size_t)r * row_bytes) + s;
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
                    lo[r] = _mm256_and_si256(q, m4);
                    hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                }
                put_transposed(ds + (size_t)(16 * c) * 32, lo);
                put_transposed(ds + (size_t)(16 * c + 8) * 32, hi);
            }
        } else {
            for (int h = 0; h < 2; h++) {
                __m256i v[4][R];
                for (int r = 0; r < R; r++) {
                    if (r >= nr) {
                        v[0][r] = v[1][r] = v[2][r] = v[3][r] = _mm256_setzero_si256();
                        continue;
                    }
                    const block_q6_K *x = (const block_q6_K *)(const void *)((const char *)w + (size_t)r * row_bytes) + s;
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
                    v[0][r] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                    v[1][r] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                    v[2][r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                    v[3][r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                }
                for (int t = 0; t < 4; t++) put_transposed(ds + (size_t)(8 * (4 * h + t)) * 32, v[t]);
            }
        }
    }
    return 1;
}

void li_gemm_fill_avx2(li_kernels *t) {
    t->gemm[LI_PANEL_BLK32] = gemm_blk32;
    t->gemm[LI_PANEL_KSUPER] = gemm_ksuper;
    t->panel_values = panel_values;
}
#elif defined(LI_ARCH_X86)
void li_gemm_fill_avx2(li_kernels *t) { (void)t; } /* built without the AVX2 flags */
#else
typedef int li_empty_translation_unit;
#endif
