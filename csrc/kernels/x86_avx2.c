/* x86_avx2.c: kernels for x86-64 with AVX2, FMA and F16C (Haswell, Zen and
 * later). Built with -mavx2 -mfma -mf16c (/arch:AVX2); reached only after
 * dispatch.c has seen those features in cpuid.
 *
 * Layout of this file: small helpers; then per weight type an `unpack_*` that
 * turns a block into 32-byte vectors of small unsigned integers (element order
 * kept, 32 elements a vector) plus its scales, shared by the dequantizer and
 * the dot product; then the dequantizers, the activation quantizers, the dot
 * products (and dot_rows, several weight rows per call, for Q4_0, Q4_1, Q5_0,
 * Q5_1 and Q8_0), and the vector ops.
 *
 * Dequantizers do the scalar file's float operations in its order (mul then
 * add or sub, never fused), so their results are bit-identical to it and to
 * gguf's numpy code. Activation quantizers round half to even like lrintf,
 * giving the scalar file's bytes. Dot products multiply 8-bit integers with
 * vpmaddubsw (unsigned weight x signed activation) and vpmaddwd, and reuse
 * one decoded weight block for all the nc activation rows. For the quantized
 * types they give scalar.c's results to the bit: each block's integer sum is
 * exact, and the float steps per block are scalar.c's fused multiply-adds,
 * in its order (see scalar.c on the dot products). Float weights keep 8-lane
 * partial sums, the same operations for every column.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "../common.h"

/* ---- helpers ---- */

LI_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

LI_INLINE __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

LI_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

LI_INLINE int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

LI_INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

LI_INLINE __m256i combine128(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles, then the high ones */
LI_INLINE __m256i nibbles_lo_hi(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(combine128(v, _mm_srli_epi16(v, 4)), _mm256_set1_epi8(15));
}

/* 32 bits -> 32 bytes, byte j all ones where bit j is set */
LI_INLINE __m256i bits_to_mask(const uint8_t p[4]) {
    uint32_t h;
    memcpy(&h, p, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                             0x0101010101010101LL, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}

/* 8 lanes of sums of u[j] * s[j] over groups of 4 bytes; u unsigned, s signed,
 * |u * s| pairs within int16 for every use here */
LI_INLINE __m256i mul_sum_us8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* the same with each int16 pair product weighted by the int16 lanes of w */
LI_INLINE __m256i mul_sum_us8_w(__m256i u, __m256i s, __m256i w) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), w);
}

/* a vector of (q * a) sums for signed q, a: |q| times a with q's sign */
LI_INLINE __m256i mul_sum_ss8(__m256i absq, __m256i q, __m256i a) {
    return mul_sum_us8(absq, _mm256_sign_epi8(a, q));
}

/* four vectors of 16 int16 lanes summed pairwise twice (wrapping): lanes
 * 2j, 2j+1 of each 128-bit half hold the sums of p[j]'s 8 lanes there */
LI_INLINE __m256i fold4_i16(const __m256i p[4]) {
    return _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
}

/* int16 lane j of v (a 128-bit lane repeated twice) broadcast to all lanes */
LI_INLINE __m256i bcast_i16(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j)));
}

/* the byte indices of group16_weights' shuffles, kept in memory: built in
 * registers (as the compiler does with constants made by intrinsics) they
 * cost more instructions than the shuffles, in loops short of registers */
static const uint8_t group16_masks[4][32] = {
#define G16_MASK(v) {4 * v, 4 * v + 1, 4 * v, 4 * v + 1, 4 * v, 4 * v + 1, 4 * v, 4 * v + 1,         \
                     4 * v, 4 * v + 1, 4 * v, 4 * v + 1, 4 * v, 4 * v + 1, 4 * v, 4 * v + 1,         \
                     4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3, \
                     4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3, 4 * v + 2, 4 * v + 3}
    G16_MASK(0), G16_MASK(1), G16_MASK(2), G16_MASK(3)
#undef G16_MASK
};

/* For groups of 16 (Q2_K, Q3_K, Q6_K): from 16 int16 scales s, the madd weights
 * of vector v (elements 32v..32v+31): scale 2v in the low lane, 2v+1 in the high */
LI_INLINE void group16_weights(__m256i s, __m256i wts[8]) {
    const __m256i lo = _mm256_permute4x64_epi64(s, 0x44), hi = _mm256_permute4x64_epi64(s, 0xee);
    for (int v = 0; v < 4; v++) {
        const __m256i m = loadu(group16_masks[v]);
        wts[v] = _mm256_shuffle_epi8(lo, m);
        wts[v + 4] = _mm256_shuffle_epi8(hi, m);
    }
}

/* For groups of 16 when four vectors are folded (fold4_i16): lanes 2j, 2j+1
 * of the low half belong to group 2(4g + j), of the high half to group
 * 2(4g + j) + 1, so the weights are the even groups' scales, doubled, in the
 * low half and the odd groups' in the high half (g = 0: groups 0-7, 1: 8-15). */
LI_INLINE void group16_fold_weights(__m256i s, __m256i wts[2]) {
    const __m256i m = combine128(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13),
                                 _mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
    wts[0] = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(s, 0x44), m);
    wts[1] = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(s, 0xee), m);
}

/* sum over four vectors of u (unsigned, at most 7) times 128 activation
 * bytes at a, each 16-bit lane weighted by wts after folding */
LI_INLINE __m256i fold4_dot(const __m256i u[4], const int8_t *a, __m256i wts) {
    __m256i p[4];
    for (int j = 0; j < 4; j++) p[j] = _mm256_maddubs_epi16(u[j], loadu(a + 32 * j));
    return _mm256_madd_epi16(fold4_i16(p), wts);
}

/* write 32 floats: scale * q[j] for the 32 signed bytes of q (no rounding
 * beyond the scalar file's single multiply) */
LI_INLINE void store_scaled32(float *y, __m256i q, float scale) {
    const __m256 d = _mm256_set1_ps(scale);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* n floats (n = 8 or 16) from bytes q: y = d * q - m (mul, then sub) */
LI_INLINE void store_affine(float *y, __m128i q, int n, float d, float m, int add) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int j = 0; j < n; j += 8) {
        const __m256 f = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)));
        _mm256_storeu_ps(y + j, add ? _mm256_add_ps(f, vm) : _mm256_sub_ps(f, vm));
        q = _mm_srli_si128(q, 8);
    }
}

/* ---- unpacking: blocks to vectors of unsigned bytes, element order kept ---- */

/* Q4_0 / Q4_1: 0..15 */
LI_INLINE __m256i unpack_q4(const uint8_t qs[16]) { return nibbles_lo_hi(qs); }

/* Q5_0 / Q5_1: 0..31 */
LI_INLINE __m256i unpack_q5(const uint8_t qh[4], const uint8_t qs[16]) {
    return _mm256_or_si256(nibbles_lo_hi(qs),
                           _mm256_and_si256(bits_to_mask(qh), _mm256_set1_epi8(16)));
}

/* Q2_K: u[v] (0..3) holds elements 32v..32v+31; sc, mn the 4-bit scales and mins as int16 */
LI_INLINE void unpack_q2_K(const block_q2_K *b, __m256i u[8], __m256i *sc, __m256i *mn) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i x = loadu(b->qs + 32 * h);
        u[4 * h + 0] = _mm256_and_si256(x, m3);
        u[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 2), m3);
        u[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m3);
        u[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(x, 6), m3);
    }
    const __m128i s = _mm_loadu_si128((const __m128i *)b->scales);
    *sc = _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(15)));
    *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15)));
}

/* Q3_K: u[v] = q + 4 (0..7); sc the signed 6-bit scales (minus 32) as int16 */
LI_INLINE void unpack_q3_K(const block_q3_K *b, __m256i u[8], __m256i *sc) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = loadu(b->hmask); /* bit v of byte l: element 32v + l has its high bit */
    /* bit v of each byte moved to bit 2 (the mask keeps only that bit, so the
     * 16-bit shifts never mix the two bytes of a lane) */
    const __m256i hb[8] = {
        _mm256_slli_epi16(hm, 2), _mm256_slli_epi16(hm, 1), hm, _mm256_srli_epi16(hm, 1),
        _mm256_srli_epi16(hm, 2), _mm256_srli_epi16(hm, 3), _mm256_srli_epi16(hm, 4),
        _mm256_srli_epi16(hm, 5)};
    for (int h = 0; h < 2; h++) {
        const __m256i x = loadu(b->qs + 32 * h);
        for (int s = 0; s < 4; s++) {
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(x, 2 * s), m3);
            u[4 * h + s] = _mm256_or_si256(lo, _mm256_and_si256(hb[4 * h + s], four));
        }
    }
    /* low 4 bits of group g in bytes 0-7 (g % 8, nibble g / 8), high 2 bits in
     * bytes 8-11 (g % 4, bit pair g / 4): four words of four groups each */
    uint32_t a0, a1, a2;
    memcpy(&a0, b->scales, 4);
    memcpy(&a1, b->scales + 4, 4);
    memcpy(&a2, b->scales + 8, 4);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const uint32_t w0 = (a0 & m4) | (a2 & m2) << 4;
    const uint32_t w1 = (a1 & m4) | ((a2 >> 2) & m2) << 4;
    const uint32_t w2 = ((a0 >> 4) & m4) | ((a2 >> 4) & m2) << 4;
    const uint32_t w3 = ((a1 >> 4) & m4) | ((a2 >> 6) & m2) << 4;
    const __m128i s = _mm_sub_epi8(_mm_set_epi32((int)w3, (int)w2, (int)w1, (int)w0),
                                   _mm_set1_epi8(32));
    *sc = _mm256_cvtepi8_epi16(s);
}

/* the 6-bit scales and mins of Q4_K / Q5_K, 8 of each, in the low 8 bytes */
LI_INLINE void unpack_k_scales(const uint8_t s[K_SCALE_SIZE], __m128i *sc, __m128i *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, top = 0x30303030u;
    /* groups 0-3: low 6 bits of bytes 0-3 (4-7 for mins); groups 4-7: a
     * nibble of bytes 8-11 plus the top 2 bits of bytes 0-3 (4-7) */
    const uint32_t sc_lo = w0 & m6, mn_lo = w1 & m6;
    const uint32_t sc_hi = (w2 & m4) | ((w0 >> 2) & top);
    const uint32_t mn_hi = ((w2 >> 4) & m4) | ((w1 >> 2) & top);
    *sc = _mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo);
    *mn = _mm_set_epi32(0, 0, (int)mn_hi, (int)mn_lo);
}

/* Q4_K: u[v] (0..15) holds sub-block v of 32 */
LI_INLINE void unpack_q4_K(const block_q4_K *b, __m256i u[8]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m256i x = loadu(b->qs + 32 * c);
        u[2 * c] = _mm256_and_si256(x, m4);
        u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    }
}

/* Q5_K: u[v] (0..31) */
LI_INLINE void unpack_q5_K(const block_q5_K *b, __m256i u[8]) {
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    __m256i h = loadu(b->qh); /* bit v of byte l: bit 4 of element 32v + l */
    for (int c = 0; c < 4; c++) {
        const __m256i x = loadu(b->qs + 32 * c);
        /* bits 0 and 1 of each byte of h go to bit 4 (the shifts stay inside
         * each byte for the bits kept by the mask) */
        u[2 * c] = _mm256_or_si256(_mm256_and_si256(x, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
        u[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4),
                                       _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
        h = _mm256_srli_epi16(h, 2);
    }
}

/* Q6_K: u[v] = q + 32 (0..63) */
LI_INLINE void unpack_q6_K(const block_q6_K *b, __m256i u[8]) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = loadu(b->ql + 64 * h), l1 = loadu(b->ql + 64 * h + 32);
        const __m256i qh = loadu(b->qh + 32 * h); /* bit pair s: elements 32s + l of the half */
        u[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_and_si256(qh, m2));
        u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
    }
}

/* ---- dequantization ---- */

static void dequant_f16(const void *src, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < k; i++) y[i] = f16(x[i]);
}

static void dequant_bf16(const void *src, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; i++) y[i] = li_bf16_to_f32(x[i]);
}

static void dequant_q4_0(const void *src, float *y, int64_t k) {
    const block_q4_0 *b = (const block_q4_0 *)src;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0)
        store_scaled32(y, _mm256_sub_epi8(unpack_q4(b[i].qs), _mm256_set1_epi8(8)), f16(b[i].d));
}

static void dequant_q4_1(const void *src, float *y, int64_t k) {
    const block_q4_1 *b = (const block_q4_1 *)src;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const __m256i u = unpack_q4(b[i].qs);
        const float d = f16(b[i].d), m = f16(b[i].m);
        store_affine(y, _mm256_castsi256_si128(u), 16, d, m, 1);
        store_affine(y + 16, _mm256_extracti128_si256(u, 1), 16, d, m, 1);
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t k) {
    const block_q5_0 *b = (const block_q5_0 *)src;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0)
        store_scaled32(y, _mm256_sub_epi8(unpack_q5(b[i].qh, b[i].qs), _mm256_set1_epi8(16)),
                       f16(b[i].d));
}

static void dequant_q5_1(const void *src, float *y, int64_t k) {
    const block_q5_1 *b = (const block_q5_1 *)src;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const __m256i u = unpack_q5(b[i].qh, b[i].qs);
        const float d = f16(b[i].d), m = f16(b[i].m);
        store_affine(y, _mm256_castsi256_si128(u), 16, d, m, 1);
        store_affine(y + 16, _mm256_extracti128_si256(u, 1), 16, d, m, 1);
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t k) {
    const block_q8_0 *b = (const block_q8_0 *)src;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0)
        store_scaled32(y, loadu(b[i].qs), f16(b[i].d));
}

/* groups of 16 with a signed scale and no min: y = (d * sc[g]) * q */
LI_INLINE void store_groups16(float *y, const __m256i q[8], const int16_t sc[16], float d) {
    for (int v = 0; v < 8; v++) {
        const __m128i lo = _mm256_castsi256_si128(q[v]), hi = _mm256_extracti128_si256(q[v], 1);
        const __m256 d0 = _mm256_set1_ps(d * (float)sc[2 * v]);
        const __m256 d1 = _mm256_set1_ps(d * (float)sc[2 * v + 1]);
        float *o = y + 32 * v;
        _mm256_storeu_ps(o + 0, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
    }
}

static void dequant_q2_K(const void *src, float *y, int64_t k) {
    const block_q2_K *b = (const block_q2_K *)src;
    __m256i u[8], sc, mn;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        unpack_q2_K(&b[i], u, &sc, &mn);
        for (int v = 0; v < 8; v++) {
            const int g = 2 * v;
            const __m128i lo = _mm256_castsi256_si128(u[v]), hi = _mm256_extracti128_si256(u[v], 1);
            store_affine(y + 32 * v, lo, 16, d * (float)(b[i].scales[g] & 15),
                         dmin * (float)(b[i].scales[g] >> 4), 0);
            store_affine(y + 32 * v + 16, hi, 16, d * (float)(b[i].scales[g + 1] & 15),
                         dmin * (float)(b[i].scales[g + 1] >> 4), 0);
        }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t k) {
    const block_q3_K *b = (const block_q3_K *)src;
    __m256i u[8], sc;
    int16_t s[16];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q3_K(&b[i], u, &sc);
        for (int v = 0; v < 8; v++) u[v] = _mm256_sub_epi8(u[v], _mm256_set1_epi8(4));
        _mm256_storeu_si256((__m256i *)s, sc);
        store_groups16(y, u, s, f16(b[i].d));
    }
}

/* Q4_K / Q5_K: y = (d * sc[v]) * u - (dmin * mn[v]) over sub-blocks of 32 */
LI_INLINE void store_groups32(float *y, const __m256i u[8], __m128i sc, __m128i mn, float d,
                              float dmin) {
    uint8_t s[16], m[16];
    _mm_storeu_si128((__m128i *)s, sc);
    _mm_storeu_si128((__m128i *)m, mn);
    for (int v = 0; v < 8; v++) {
        const float dl = d * (float)s[v], ml = dmin * (float)m[v];
        store_affine(y + 32 * v, _mm256_castsi256_si128(u[v]), 16, dl, ml, 0);
        store_affine(y + 32 * v + 16, _mm256_extracti128_si256(u[v], 1), 16, dl, ml, 0);
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)src;
    __m256i u[8];
    __m128i sc, mn;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q4_K(&b[i], u);
        unpack_k_scales(b[i].scales, &sc, &mn);
        store_groups32(y, u, sc, mn, f16(b[i].d), f16(b[i].dmin));
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)src;
    __m256i u[8];
    __m128i sc, mn;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q5_K(&b[i], u);
        unpack_k_scales(b[i].scales, &sc, &mn);
        store_groups32(y, u, sc, mn, f16(b[i].d), f16(b[i].dmin));
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)src;
    __m256i u[8];
    int16_t s[16];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q6_K(&b[i], u);
        for (int v = 0; v < 8; v++) u[v] = _mm256_sub_epi8(u[v], _mm256_set1_epi8(32));
        for (int g = 0; g < 16; g++) s[g] = b[i].scales[g];
        store_groups16(y, u, s, f16(b[i].d));
    }
}

/* ---- activation quantization ---- */

LI_INLINE __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* 32 floats at x times id, rounded half to even (the MXCSR default, as
 * lrintf), packed to 32 bytes in order */
LI_INLINE __m256i round_pack32(const float *x, __m256 id) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 0), id));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* the packs work per 128-bit lane: put the 4-byte pieces back in order */
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

LI_INLINE float absmax_n(const float *x, int n) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
    return hmax_ps(m);
}

/* the sum of 32 signed bytes */
LI_INLINE int32_t sum_i8(__m256i q) {
    return hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                        _mm256_set1_epi16(1)));
}

/* the scalar file's rounding (and llama.cpp's): id = 127/amax, round half to
 * even, scales kept at float16 precision */
LI_INLINE float f16_round(float v) { return _cvtsh_ss(_cvtss_sh(v, 0)); }

static void quant_act_q8_0(const float *x, void *dst, int64_t k) {
    act_q8_0 *y = (act_q8_0 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax_n(x, QK8_0), id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = f16_round(amax / 127.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, round_pack32(x, _mm256_set1_ps(id)));
    }
}

static void quant_act_q8_1(const float *x, void *dst, int64_t k) {
    act_q8_1 *y = (act_q8_1 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax_n(x, QK8_0), id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float d = amax / 127.0f;
        const __m256i q = round_pack32(x, _mm256_set1_ps(id));
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        y[i].d = f16_round(d);
        y[i].s = f16_round(d * (float)sum_i8(q));
    }
}

/* the first element of largest magnitude, with its sign */
LI_INLINE float signed_absmax(const float *x, int n, float amax) {
    const __m256 va = _mm256_set1_ps(amax);
    for (int j = 0; j < n; j += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
        for (int b = 0; m && b < 8; b++)
            if ((m >> b) & 1) return x[j + b];
    }
    return amax;
}

static void quant_act_q8_K(const float *x, void *dst, int64_t k) {
    act_q8_K *y = (act_q8_K *)dst;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float amax = absmax_n(x, QK_K);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* the element of largest magnitude maps to -127 exactly */
        const float iscale = -127.0f / signed_absmax(x, QK_K, amax);
        const __m256 vid = _mm256_set1_ps(iscale);
        y[i].d = 1.0f / iscale;
        for (int v = 0; v < QK_K / 32; v++) {
            const __m256i q = round_pack32(x + 32 * v, vid);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * v), q);
            /* 16-bit pair sums, then the two groups of 16: lanes 0-7 and 8-15 */
            const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
            const __m256i s4 = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
            __m256i s = _mm256_hadd_epi32(s4, s4);
            s = _mm256_hadd_epi32(s, s); /* lane 0: group 2v four times, lane 1: 2v+1 */
            y[i].bsums[2 * v] = (int16_t)_mm256_extract_epi32(s, 0);
            y[i].bsums[2 * v + 1] = (int16_t)_mm256_extract_epi32(s, 4);
        }
    }
}

/* ---- dot products: one weight row against nc <= LI_DOT_MAX_NC activation rows ----
 * Each type has an inline worker taking nc as a constant; the table entry
 * switches on nc so every worker is compiled with its loops unrolled. */

#define DISPATCH_NC(worker, k, w, x, xs, nc, s)      \
    switch (nc) {                                    \
    case 1: worker(k, w, x, xs, s, 1); break;        \
    case 2: worker(k, w, x, xs, s, 2); break;        \
    case 3: worker(k, w, x, xs, s, 3); break;        \
    default: worker(k, w, x, xs, s, 4); break;       \
    }
LI_STATIC_ASSERT(LI_DOT_MAX_NC == 4, "DISPATCH_NC covers nc up to 4");

/* F32 / F16 / BF16 weights: float rows; `load8` gives 8 weights as floats */
LI_INLINE __m256 load8_f32(const void *w, int64_t i) { return _mm256_loadu_ps((const float *)w + i); }
LI_INLINE __m256 load8_f16(const void *w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
}
LI_INLINE __m256 load8_bf16(const void *w, int64_t i) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
LI_INLINE float scalar_f32(const void *w, int64_t i) { return ((const float *)w)[i]; }
LI_INLINE float scalar_f16(const void *w, int64_t i) { return f16(((const uint16_t *)w)[i]); }
LI_INLINE float scalar_bf16(const void *w, int64_t i) { return li_bf16_to_f32(((const uint16_t *)w)[i]); }

#define FLOAT_DOT_WORKER(name, load8, scalar1)                                                  \
    LI_INLINE void name(int64_t k, const void *w, const void *x, size_t xs, float *s,          \
                        const int nc) {                                                         \
        __m256 acc0[LI_DOT_MAX_NC], acc1[LI_DOT_MAX_NC];                                        \
        for (int c = 0; c < nc; c++) acc0[c] = acc1[c] = _mm256_setzero_ps();                   \
        int64_t i = 0;                                                                          \
        for (; i + 16 <= k; i += 16) {                                                          \
            const __m256 w0 = load8(w, i), w1 = load8(w, i + 8);                                \
            for (int c = 0; c < nc; c++) {                                                      \
                const float *a = ACT_ROW(float, x, c, xs) + i;                                  \
                acc0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a), acc0[c]);                     \
                acc1[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a + 8), acc1[c]);                 \
            }                                                                                   \
        }                                                                                       \
        for (int c = 0; c < nc; c++) {                                                          \
            const float *a = ACT_ROW(float, x, c, xs);                                          \
            float t = hsum_ps(_mm256_add_ps(acc0[c], acc1[c]));                                 \
            for (int64_t j = i; j < k; j++) t += scalar1(w, j) * a[j];                          \
            s[c] = t;                                                                           \
        }                                                                                       \
    }

FLOAT_DOT_WORKER(dot_f32_n, load8_f32, scalar_f32)
FLOAT_DOT_WORKER(dot_f16_n, load8_f16, scalar_f16)
FLOAT_DOT_WORKER(dot_bf16_n, load8_bf16, scalar_bf16)

static void dot_f32(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    DISPATCH_NC(dot_f32_n, k, w, x, xs, nc, s)
}
static void dot_f16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    DISPATCH_NC(dot_f16_n, k, w, x, xs, nc, s)
}
static void dot_bf16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    DISPATCH_NC(dot_bf16_n, k, w, x, xs, nc, s)
}

/* ---- decode and small batches of the quantized types: scalar.c's formula ----
 * Up to four weight rows against up to four activation rows per call. Each
 * row gets exactly scalar.c's operations: per block an exact integer sum,
 * then its fused multiply-adds in block order (the same as the prefill
 * panels of x86_avx2_gemm.c and x86_avx512.c do), whatever the call, so a
 * row's result does not depend on its batch. How the work is laid out
 * follows what ran fastest here, decode (one activation row) first:
 *
 * - Q4_0, Q4_1, Q5_0, Q5_1 (rows32): one pass, the four rows side by side,
 *   a block of each in turn; the four rows' pair sums fold with vphaddw
 *   into one vector of block sums (lane r: row r), and the scales apply to
 *   the four rows at once.
 * - Q8_0 in decode (rows_q8_0_decode): one row at a time, a single stream
 *   from memory, in an integer pass as the K-quants' below, the four rows'
 *   chains side by side within the last row's pass (with more than one
 *   activation row, rows32 as above).
 * - K-quants (rows_k), in two passes over chunks of PASS_BLOCKS
 *   super-blocks: an integer pass reads one weight row at a time, front to
 *   back, and keeps each super-block's exact sums (as floats: scalar.c's
 *   conversion) and scales in a small buffer; a float pass transposes four
 *   super-blocks of it at a time (lane r: row r) and applies the scales to
 *   the four rows at once. In decode (rows_k_decode) the same, but a call's
 *   rows are summed as one run of super-blocks, one at a time, with Q4_K's
 *   and Q6_K's sums written for one activation row.
 *
 * Reading rows side by side (a short stream per row) was what cost most:
 * from DRAM it ran Q8_0 and the K-quants at about half their one-row speed
 * on the machine this was tuned on, prefetching or not; the narrow 32-value
 * blocks lost little, and the one-pass fold does less work per block. */

#define PASS_BLOCKS 128 /* super-blocks in a chunk: 32768 values */

typedef struct {
    float isum[LI_DOT_MAX_NC][4][PASS_BLOCKS]; /* [column][row][block] exact integer sums */
    float imin[LI_DOT_MAX_NC][4][PASS_BLOCKS]; /* K-quants with a min */
    float d[4][PASS_BLOCKS], m[4][PASS_BLOCKS]; /* [row][block]: d, and m or dmin */
} pass_buf;

/* four rows of 4 floats at p[0..3] transposed: t[j] lane r = p[r][j] */
LI_INLINE void load_t4(const float *p0, const float *p1, const float *p2, const float *p3, __m128 t[4]) {
    t[0] = _mm_loadu_ps(p0);
    t[1] = _mm_loadu_ps(p1);
    t[2] = _mm_loadu_ps(p2);
    t[3] = _mm_loadu_ps(p3);
    _MM_TRANSPOSE4_PS(t[0], t[1], t[2], t[3]);
}

/* bytes of one weight block */
LI_INLINE size_t blk32_bytes(const int type) {
    switch (type) {
    case LI_TYPE_Q4_0: return sizeof(block_q4_0);
    case LI_TYPE_Q4_1: return sizeof(block_q4_1);
    case LI_TYPE_Q5_0: return sizeof(block_q5_0);
    case LI_TYPE_Q5_1: return sizeof(block_q5_1);
    default: return sizeof(block_q8_0);
    }
}

/* the block at p as 32 unsigned bytes: q + off, or Q8_0's signed q itself */
LI_INLINE __m256i blk32_values(const int type, const char *p) {
    switch (type) {
    case LI_TYPE_Q4_0: return unpack_q4(((const block_q4_0 *)(const void *)p)->qs);
    case LI_TYPE_Q4_1: return unpack_q4(((const block_q4_1 *)(const void *)p)->qs);
    case LI_TYPE_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)(const void *)p;
        return unpack_q5(b->qh, b->qs);
    }
    case LI_TYPE_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)(const void *)p;
        return unpack_q5(b->qh, b->qs);
    }
    default: return loadu(((const block_q8_0 *)(const void *)p)->qs);
    }
}

/* the two f16 at byte `at` of four rows' blocks, as floats (lane r: row r):
 * the first in *lo, the second in *hi (one 32-bit load a row) */
LI_INLINE void f16x2_rows(const char *const row[4], size_t at, __m128 *lo, __m128 *hi) {
    int32_t v[4];
    for (int r = 0; r < 4; r++) memcpy(&v[r], row[r] + at, 4);
    const __m128i h = _mm_shuffle_epi8(_mm_setr_epi32(v[0], v[1], v[2], v[3]),
                                       _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    const __m256 f = _mm256_cvtph_ps(h);
    *lo = _mm256_castps256_ps128(f);
    *hi = _mm256_extractf128_ps(f, 1);
}

/* lane r: the sum of the 8 int32 lanes of v[r] */
LI_INLINE __m128i hsum8x4_epi32(const __m256i v[4]) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

LI_INLINE int k_has_min(const int type) {
    return type == LI_TYPE_Q2_K || type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K;
}

/* bytes of a block; where its f16 d sits (dmin, where there is one, follows) */
LI_INLINE size_t k_bytes(const int type) {
    switch (type) {
    case LI_TYPE_Q2_K: return sizeof(block_q2_K);
    case LI_TYPE_Q3_K: return sizeof(block_q3_K);
    case LI_TYPE_Q4_K: return sizeof(block_q4_K);
    case LI_TYPE_Q5_K: return sizeof(block_q5_K);
    default: return sizeof(block_q6_K);
    }
}
LI_INLINE size_t k_d_at(const int type) {
    switch (type) {
    case LI_TYPE_Q2_K: return offsetof(block_q2_K, d);
    case LI_TYPE_Q3_K: return offsetof(block_q3_K, d);
    case LI_TYPE_Q4_K: return offsetof(block_q4_K, d);
    case LI_TYPE_Q5_K: return offsetof(block_q5_K, d);
    default: return offsetof(block_q6_K, d);
    }
}
LI_STATIC_ASSERT(offsetof(block_q2_K, dmin) == offsetof(block_q2_K, d) + 2 &&
                     offsetof(block_q4_K, dmin) == 2 && offsetof(block_q5_K, dmin) == 2,
                 "dmin follows d");

/* Q4_K and Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min. The
 * pair sums of four sub-blocks are folded with vphaddw (each 16-bit lane then
 * holds 8 products of at most 31 * 127: no overflow), so one vpmaddwd applies
 * four scales at once: lanes 2j, 2j+1 of each 128-bit half belong to
 * sub-block j of the four. */
LI_INLINE __m256i k_groups32_isum(const __m256i u[8], __m256i sc2, const act_q8_K *a) {
    __m256i isum = _mm256_setzero_si256();
    for (int g = 0; g < 2; g++) {
        __m256i p[4];
        for (int j = 0; j < 4; j++)
            p[j] = _mm256_maddubs_epi16(u[4 * g + j], loadu(a->qs + 32 * (4 * g + j)));
        /* two calls, not one with g ? 0xee : 0x44: clang and MSVC want a constant immediate */
        const __m256i wts = g ? _mm256_permute4x64_epi64(sc2, 0xee) : _mm256_permute4x64_epi64(sc2, 0x44);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(fold4_i16(p), wts));
    }
    return isum;
}

/* one row's super-block at p against the nc activation blocks a[c]: v[c] =
 * vphaddd(isum, imin) for the types with a min (each half: isum, isum, imin,
 * imin partial sums), else isum with the offset taken out */
LI_INLINE void k_row_sums(const int type, const char *p, const act_q8_K *const a[LI_DOT_MAX_NC],
                          const int nc, __m256i v[LI_DOT_MAX_NC]) {
    __m256i u[8];
    switch (type) {
    case LI_TYPE_Q2_K: {
        __m256i sc, mn, wts[2];
        unpack_q2_K((const block_q2_K *)(const void *)p, u, &sc, &mn);
        group16_fold_weights(sc, wts);
        for (int c = 0; c < nc; c++) {
            __m256i isum = _mm256_setzero_si256();
            for (int g = 0; g < 2; g++)
                isum = _mm256_add_epi32(isum, fold4_dot(u + 4 * g, a[c]->qs + 128 * g, wts[g]));
            v[c] = _mm256_hadd_epi32(isum, _mm256_madd_epi16(mn, loadu(a[c]->bsums)));
        }
        break;
    }
    case LI_TYPE_Q3_K: {
        __m256i sc, wts[2];
        unpack_q3_K((const block_q3_K *)(const void *)p, u, &sc);
        group16_fold_weights(sc, wts);
        for (int c = 0; c < nc; c++) {
            __m256i isum = _mm256_setzero_si256();
            for (int g = 0; g < 2; g++)
                isum = _mm256_add_epi32(isum, fold4_dot(u + 4 * g, a[c]->qs + 128 * g, wts[g]));
            /* u = q + 4: take 4 * sum(sc * group sums) back out */
            v[c] = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_madd_epi16(sc, loadu(a[c]->bsums)), 2));
        }
        break;
    }
    case LI_TYPE_Q4_K:
    case LI_TYPE_Q5_K: {
        __m128i sc8, mn8;
        if (type == LI_TYPE_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)(const void *)p;
            unpack_q4_K(b, u);
            unpack_k_scales(b->scales, &sc8, &mn8);
        } else {
            const block_q5_K *b = (const block_q5_K *)(const void *)p;
            unpack_q5_K(b, u);
            unpack_k_scales(b->scales, &sc8, &mn8);
        }
        const __m256i sc2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8)); /* s0 s0 s1 s1 .. s7 s7 */
        /* min of sub-block v times its two group sums: mins doubled, one per group of 16 */
        const __m256i mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        for (int c = 0; c < nc; c++)
            v[c] = _mm256_hadd_epi32(k_groups32_isum(u, sc2, a[c]), _mm256_madd_epi16(mn, loadu(a[c]->bsums)));
        break;
    }
    default: { /* Q6_K */
        const block_q6_K *b = (const block_q6_K *)(const void *)p;
        __m256i wts[8];
        unpack_q6_K(b, u);
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        group16_weights(sc, wts);
        for (int c = 0; c < nc; c++) {
            __m256i isum = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++)
                isum = _mm256_add_epi32(isum, mul_sum_us8_w(u[j], loadu(a[c]->qs + 32 * j), wts[j]));
            /* u = q + 32: take 32 * sum(sc * group sums) back out */
            v[c] = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_madd_epi16(sc, loadu(a[c]->bsums)), 5));
        }
        break;
    }
    }
}


/* Q4_0, Q4_1, Q5_0, Q5_1 (and Q8_0 with several activation rows): the four
 * rows side by side. Weights stay unsigned for vpmaddubsw (u = q + off for
 * Q4_0 / Q5_0, whose offset comes out of each row's pair sums before the
 * fold as off * (pair sums of qx), computed once for all rows; Q8_0
 * multiplies |q| by qx with q's sign). The four rows' pair sums fold with
 * vphaddw into 16-bit lanes 2r, 2r + 1 of each 128-bit half (8 products of
 * at most 16 * 127, or 31 * 127 for the types with a min: no overflow), widen,
 * and the two halves add: one vector of the rows' block sums. Q8_0's pair
 * sums (up to 2 * 128 * 127) widen first and fold with vphaddd. Four streams
 * a row apart are what the prefetchers pick up late, so each row asks for
 * the same bytes of the row nr further on, which the next call will read
 * (past the matrix end that is harmless: prefetches never fault).
 * y[c * ys + r] for r < nr (1..4), c < nc; rows past nr repeat row nr - 1,
 * their lanes computed and dropped */
LI_INLINE void rows32(const int type, int64_t k, const void *w, size_t ws, int nr, const void *x,
                      size_t xs, float *y, size_t ys, const int nc) {
    const int min = type == LI_TYPE_Q4_1 || type == LI_TYPE_Q5_1, sign = type == LI_TYPE_Q8_0;
    const int off = type == LI_TYPE_Q4_0 ? 8 : type == LI_TYPE_Q5_0 ? 16 : 0;
    const size_t bb = blk32_bytes(type), ab = min ? sizeof(act_q8_1) : sizeof(act_q8_0);
    const size_t qo = min ? offsetof(act_q8_1, qs) : offsetof(act_q8_0, qs);
    const __m256i one = _mm256_set1_epi16(1), voff = _mm256_set1_epi8((char)off);
    const char *row[4];
    for (int r = 0; r < 4; r++) row[r] = (const char *)w + (size_t)LI_MIN(r, nr - 1) * ws;
    __m128 acc[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm_setzero_ps();
    const int64_t nb = k / 32;
    for (int64_t i = 0; i < nb; i++) {
        const size_t at = (size_t)i * bb;
        if (nc == 1 && (i & 3) == 0) /* the next four blocks of the rows the next call reads */
            for (int r = 0; r < nr; r++)
                for (size_t o = 0; o < 4 * bb; o += 64) _mm_prefetch(row[r] + at + (size_t)nr * ws + o, _MM_HINT_T0);
        __m256i u[4], q[4];
        for (int r = 0; r < 4; r++) {
            q[r] = blk32_values(type, row[r] + at);
            u[r] = sign ? _mm256_sign_epi8(q[r], q[r]) : q[r];
        }
        __m128 dw, mw; /* d and (Q4_1, Q5_1) m lead every block */
        f16x2_rows(row, at, &dw, &mw);
        for (int c = 0; c < nc; c++) {
            const char *xb = (const char *)x + (size_t)c * xs + (size_t)i * ab;
            const __m256i a = loadu(xb + qo);
            __m256i p[4];
            __m128i isum;
            if (sign) {
                for (int r = 0; r < 4; r++) p[r] = mul_sum_ss8(u[r], q[r], a);
                isum = hsum8x4_epi32(p);
            } else {
                const __m256i corr = _mm256_maddubs_epi16(voff, a);
                for (int r = 0; r < 4; r++) {
                    p[r] = _mm256_maddubs_epi16(u[r], a);
                    if (off) p[r] = _mm256_sub_epi16(p[r], corr);
                }
                const __m256i s = _mm256_madd_epi16(fold4_i16(p), one);
                isum = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            }
            float dx;
            memcpy(&dx, xb, 4); /* d comes first in both activation formats */
            acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, _mm_set1_ps(dx)), acc[c]);
            if (min) {
                float sx;
                memcpy(&sx, xb + offsetof(act_q8_1, s), 4);
                acc[c] = _mm_fmadd_ps(mw, _mm_set1_ps(sx), acc[c]);
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        float t[4];
        _mm_storeu_ps(t, acc[c]);
        for (int r = 0; r < nr; r++) y[(size_t)c * ys + (size_t)r] = t[r];
    }
}

/* h[c] = vphaddd of the sums (k_row_sums) of super-blocks i0 at p0 and i1 at p1 */
LI_INLINE void k_pair_sums(const int type, const char *p0, const char *p1, int64_t i0, int64_t i1,
                           const void *x, size_t xs, const int nc, __m256i h[LI_DOT_MAX_NC]) {
    const act_q8_K *a[LI_DOT_MAX_NC];
    __m256i v0[LI_DOT_MAX_NC], v1[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) a[c] = ACT_ROW(act_q8_K, x, c, xs) + i0;
    k_row_sums(type, p0, a, nc, v0);
    for (int c = 0; c < nc; c++) a[c] = ACT_ROW(act_q8_K, x, c, xs) + i1;
    k_row_sums(type, p1, a, nc, v1);
    for (int c = 0; c < nc; c++) h[c] = _mm256_hadd_epi32(v0[c], v1[c]);
}

/* In decode (kd_run below) the integer pass hints the weight stream K_AHEAD
 * bytes ahead of its loads: rows are read one after another, front to back,
 * so the stream runs on into the next rows (and, at a share's end, past it:
 * hints never fault). The hardware prefetchers alone left a 1-thread Q4_K or
 * Q6_K matvec well short of a plain read on a Zen 3 host; measurements:
 * docs/kernel-tuning.md#avx2-k-quant-stream-hints */
#ifndef K_AHEAD
#define K_AHEAD 4096
#endif

/* the integer pass of a K-quant over super-blocks i0 .. i0+n of one row */
LI_INLINE void int_pass_k(const int type, const char *row, int r, int64_t i0, int n, const void *x,
                          size_t xs, const int nc, pass_buf *pb) {
    const int min = k_has_min(type);
    const size_t bb = k_bytes(type);
    for (int j = 0; j < n; j += 4) {
        /* past the chunk's end, the last super-block again (its sums land past n, unused) */
        int64_t idx[4];
        if (j + 4 <= n)
            for (int t = 0; t < 4; t++) idx[t] = i0 + j + t;
        else
            for (int t = 0; t < 4; t++) idx[t] = i0 + LI_MIN(j + t, n - 1);
        const char *blk[4];
        for (int t = 0; t < 4; t++) blk[t] = row + (size_t)idx[t] * bb;
        /* h[0]: vphaddd of super-blocks 0 and 1's sums, h[1]: of 2 and 3 (folded
         * as they come, so that few vectors stay live) */
        __m256i h[2][LI_DOT_MAX_NC];
        k_pair_sums(type, blk[0], blk[1], idx[0], idx[1], x, xs, nc, h[0]);
        k_pair_sums(type, blk[2], blk[3], idx[2], idx[3], x, xs, nc, h[1]);
        __m128 dw, mw; /* d then dmin; Q3_K's and Q6_K's d ends the block: read it as a second half */
        if (min)
            f16x2_rows(blk, k_d_at(type), &dw, &mw);
        else
            f16x2_rows(blk, k_d_at(type) - 2, &mw, &dw);
        _mm_storeu_ps(pb->d[r] + j, dw);
        if (min) _mm_storeu_ps(pb->m[r] + j, mw);
        for (int c = 0; c < nc; c++) {
            if (min) {
                /* each half: (isum, imin) of super-blocks 0, 1, then of 2, 3 */
                const __m256i h01 = h[0][c], h23 = h[1][c];
                const __m128 f01 = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h01), _mm256_extracti128_si256(h01, 1)));
                const __m128 f23 = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h23), _mm256_extracti128_si256(h23, 1)));
                _mm_storeu_ps(pb->isum[c][r] + j, _mm_shuffle_ps(f01, f23, _MM_SHUFFLE(2, 0, 2, 0)));
                _mm_storeu_ps(pb->imin[c][r] + j, _mm_shuffle_ps(f01, f23, _MM_SHUFFLE(3, 1, 3, 1)));
            } else {
                const __m256i hh = _mm256_hadd_epi32(h[0][c], h[1][c]); /* each half: super-blocks 0-3 */
                const __m128i is = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
                _mm_storeu_ps(pb->isum[c][r] + j, _mm_cvtepi32_ps(is));
            }
        }
    }
}

/* scalar.c's float steps for four rows at once (lane r: row r) over the
 * first m (<= 4) of four super-blocks: D, M (d, dmin) and I, IM (exact sums)
 * transposed, a the activation row's blocks; kmin: a type with a min */
LI_INLINE __m128 chain4(const int kmin, const __m128 D[4], const __m128 M[4], const __m128 I[4],
                        const __m128 IM[4], const act_q8_K *a, int m, __m128 acc) {
    for (int t = 0; t < 4; t++) {
        if (t == m) break;
        const __m128 dx = _mm_set1_ps(a[t].d);
        acc = _mm_fmadd_ps(I[t], _mm_mul_ps(D[t], dx), acc);
        if (kmin) acc = _mm_fnmadd_ps(IM[t], _mm_mul_ps(M[t], dx), acc);
    }
    return acc;
}

/* the float pass over the n super-blocks of a chunk starting at i0: scalar.c's
 * steps for four rows at once; kmin: a type with a min */
LI_INLINE void float_pass(const int kmin, const pass_buf *pb, int64_t i0, int n, const void *x,
                          size_t xs, const int nc, __m128 acc[LI_DOT_MAX_NC]) {
    for (int j = 0; j < n; j += 4) {
        const int cnt = LI_MIN(4, n - j);
        __m128 D[4], M[4];
        load_t4(pb->d[0] + j, pb->d[1] + j, pb->d[2] + j, pb->d[3] + j, D);
        if (kmin) load_t4(pb->m[0] + j, pb->m[1] + j, pb->m[2] + j, pb->m[3] + j, M);
        for (int c = 0; c < nc; c++) {
            __m128 I[4], IM[4];
            load_t4(pb->isum[c][0] + j, pb->isum[c][1] + j, pb->isum[c][2] + j, pb->isum[c][3] + j, I);
            if (kmin) load_t4(pb->imin[c][0] + j, pb->imin[c][1] + j, pb->imin[c][2] + j, pb->imin[c][3] + j, IM);
            acc[c] = chain4(kmin, D, M, I, IM, ACT_ROW(act_q8_K, x, c, xs) + i0 + j, cnt, acc[c]);
        }
    }
}

/* K-quants: y[c * ys + r] = dot(weight row r, activation row c), r < nr (1..4), c < nc */
LI_INLINE void rows_k(const int type, int64_t k, const void *w, size_t ws, int nr, const void *x,
                      size_t xs, float *y, size_t ys, const int nc) {
    const int64_t nb = k / QK_K;
    pass_buf pb;
    /* lanes of missing rows: zeros, computed and dropped */
    for (int r = nr; r < 4; r++) {
        memset(pb.d[r], 0, sizeof(pb.d[r]));
        memset(pb.m[r], 0, sizeof(pb.m[r]));
        for (int c = 0; c < nc; c++) {
            memset(pb.isum[c][r], 0, sizeof(pb.isum[c][r]));
            memset(pb.imin[c][r], 0, sizeof(pb.imin[c][r]));
        }
    }
    __m128 acc[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm_setzero_ps();
    for (int64_t i0 = 0; i0 < nb; i0 += PASS_BLOCKS) {
        const int n = (int)LI_MIN(PASS_BLOCKS, nb - i0);
        for (int r = 0; r < nr; r++) int_pass_k(type, (const char *)w + (size_t)r * ws, r, i0, n, x, xs, nc, &pb);
        float_pass(k_has_min(type), &pb, i0, n, x, xs, nc, acc);
    }
    for (int c = 0; c < nc; c++) {
        float t[4];
        _mm_storeu_ps(t, acc[c]);
        for (int r = 0; r < nr; r++) y[(size_t)c * ys + (size_t)r] = t[r];
    }
}

/* K-quants in decode (one activation row): as rows_q8_0_decode below, a
 * single stream of super-blocks, front to back. A call's rows lie one after
 * another in memory, so with rows of up to PASS_BLOCKS super-blocks the nr
 * rows are one run of nr * nb super-blocks, summed four at a time into a
 * buffer (entry r * nb + i: row r's super-block i; rows of 1536 values are
 * six super-blocks, which a row at a time left a tail of two each), and then
 * the four rows' chains (lane r: row r) run over it in block order. Longer
 * rows go a chunk of PASS_BLOCKS super-blocks at a time, row by row. */
#define KD_SIZE (4 * PASS_BLOCKS + 4) /* and 4 read past the last row by the chains' transposes */
typedef struct {
    float isum[KD_SIZE], imin[KD_SIZE]; /* exact integer sums (as floats), of the sums with a min */
    float d[KD_SIZE], m[KD_SIZE];       /* d, and dmin for the types with a min */
} kd_buf;

/* the chains over blocks j .. j+m-1 (m <= 4); row r's entries start at r * stride */
LI_INLINE void kd_chain4(const int kmin, const kd_buf *pb, size_t stride, const act_q8_K *a, int j, int m,
                         __m128 *acc) {
    __m128 D[4], M[4], I[4], IM[4];
    const size_t s1 = stride + (size_t)j, s2 = 2 * stride + (size_t)j, s3 = 3 * stride + (size_t)j;
    load_t4(pb->d + j, pb->d + s1, pb->d + s2, pb->d + s3, D);
    load_t4(pb->isum + j, pb->isum + s1, pb->isum + s2, pb->isum + s3, I);
    if (kmin) {
        load_t4(pb->m + j, pb->m + s1, pb->m + s2, pb->m + s3, M);
        load_t4(pb->imin + j, pb->imin + s1, pb->imin + s2, pb->imin + s3, IM);
    }
    *acc = chain4(kmin, D, M, I, IM, a + j, m, *acc);
}

/* Q6_K's k_row_sums for one activation row, one vector of 32 values at a
 * time (no arrays of eight values and eight weights live at once) */
LI_INLINE __m256i q6_K_sums1(const block_q6_K *b, const act_q8_K *a) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(0x30);
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    __m256i isum0 = _mm256_setzero_si256(), isum1 = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        /* as unpack_q6_K and group16_weights */
        const __m256i s = h ? _mm256_permute4x64_epi64(sc, 0xee) : _mm256_permute4x64_epi64(sc, 0x44);
        const __m256i l0 = loadu(b->ql + 64 * h), l1 = loadu(b->ql + 64 * h + 32);
        const __m256i qh = loadu(b->qh + 32 * h);
        const int8_t *q8 = a->qs + 128 * h;
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        isum0 = _mm256_add_epi32(isum0, mul_sum_us8_w(u0, loadu(q8), _mm256_shuffle_epi8(s, loadu(group16_masks[0]))));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        isum1 = _mm256_add_epi32(isum1, mul_sum_us8_w(u1, loadu(q8 + 32), _mm256_shuffle_epi8(s, loadu(group16_masks[1]))));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
        isum0 = _mm256_add_epi32(isum0, mul_sum_us8_w(u2, loadu(q8 + 64), _mm256_shuffle_epi8(s, loadu(group16_masks[2]))));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
        isum1 = _mm256_add_epi32(isum1, mul_sum_us8_w(u3, loadu(q8 + 96), _mm256_shuffle_epi8(s, loadu(group16_masks[3]))));
    }
    /* u = q + 32: take 32 * sum(sc * group sums) back out */
    return _mm256_sub_epi32(_mm256_add_epi32(isum0, isum1), _mm256_slli_epi32(_mm256_madd_epi16(sc, loadu(a->bsums)), 5));
}

/* the byte indices that broadcast 16-bit lane j of each 128-bit half */
static const uint8_t bcast16_masks[8][32] = {
#define B16_MASK(j) {2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, \
                     2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, \
                     2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, \
                     2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1}
    B16_MASK(0), B16_MASK(1), B16_MASK(2), B16_MASK(3), B16_MASK(4), B16_MASK(5), B16_MASK(6), B16_MASK(7)
#undef B16_MASK
};

/* Q4_K's k_row_sums for one activation row: each sub-block's pair sums
 * weighted by its scale (broadcast with one vpshufb) in one vpmaddwd, not
 * folded four at a time with vphaddw as k_groups32_isum does (a vphaddw is
 * three micro-ops, one every two cycles on Zen 3: with one activation row
 * the folds, not the multiplies, were what a super-block waited on) */
LI_INLINE __m256i q4_K_sums1(const block_q4_K *b, const act_q8_K *a) {
    /* unpack_k_scales in vector registers (fewer instructions than its
     * scalar words and inserts): dwords w0 w1 w2 of the 12 bytes (the 4
     * after them are the block's first values, unused); r: sc0-3, sc4-7,
     * mn0-3, mn4-7 */
    const __m128i w = _mm_loadu_si128((const __m128i *)(const void *)b->scales);
    const __m128i lo = _mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0));                     /* w0 w2 w1 w2 */
    const __m128i top = _mm_srli_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)), 2); /* w0 w0 w1 w1, >> 2 */
    const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 0, 4)), _mm_set1_epi8(0x0f)),
                                    _mm_and_si128(top, _mm_set1_epi8(0x30)));
    const __m128i r = _mm_blend_epi32(_mm_and_si128(lo, _mm_set1_epi8(0x3f)), hi, 0xA);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(r)); /* s0 .. s7 in each half */
    const __m256i mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(r, r));
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i isum0 = _mm256_setzero_si256(), isum1 = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
        const __m256i x = loadu(b->qs + 32 * c);
        const int8_t *q8 = a->qs + 64 * c;
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(x, m4), loadu(q8));
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4), loadu(q8 + 32));
        isum0 = _mm256_add_epi32(isum0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, loadu(bcast16_masks[2 * c]))));
        isum1 = _mm256_add_epi32(isum1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, loadu(bcast16_masks[2 * c + 1]))));
    }
    return _mm256_hadd_epi32(_mm256_add_epi32(isum0, isum1), _mm256_madd_epi16(mn, loadu(a->bsums)));
}

/* one super-block's k_row_sums against one activation row */
LI_INLINE __m256i kd_sums(const int type, const char *p, const act_q8_K *a) {
    if (type == LI_TYPE_Q6_K) return q6_K_sums1((const block_q6_K *)(const void *)p, a);
    if (type == LI_TYPE_Q4_K) return q4_K_sums1((const block_q4_K *)(const void *)p, a);
    const act_q8_K *at[LI_DOT_MAX_NC] = {a};
    __m256i v[LI_DOT_MAX_NC];
    k_row_sums(type, p, at, 1, v);
    return v[0];
}

/* the sums v[0..3] (kd_sums) of four super-blocks at blk[0..3] into the
 * buffer's entries e .. e+3, with their d (and dmin) */
LI_INLINE void kd_store4(const int type, const char *const blk[4], const __m256i v[4], kd_buf *pb, size_t e) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m128 dw, mw; /* d then dmin; Q3_K's and Q6_K's d ends the block: read it as a second half */
    if (k_has_min(type)) {
        f16x2_rows(blk, k_d_at(type), &dw, &mw);
        _mm_storeu_ps(pb->m + e, mw);
        /* each half: (isum, imin) of super-blocks 0, 1, then of 2, 3 */
        const __m128 f01 = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h01), _mm256_extracti128_si256(h01, 1)));
        const __m128 f23 = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h23), _mm256_extracti128_si256(h23, 1)));
        _mm_storeu_ps(pb->isum + e, _mm_shuffle_ps(f01, f23, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm_storeu_ps(pb->imin + e, _mm_shuffle_ps(f01, f23, _MM_SHUFFLE(3, 1, 3, 1)));
    } else {
        f16x2_rows(blk, k_d_at(type) - 2, &mw, &dw);
        const __m256i hh = _mm256_hadd_epi32(h01, h23); /* each half: super-blocks 0-3 */
        _mm_storeu_ps(pb->isum + e, _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1))));
    }
    _mm_storeu_ps(pb->d + e, dw);
}

/* cnt super-blocks from p, one after another, into entries e .. e+cnt-1
 * (rounded up to 4, zeros past cnt); super-block i of the run is column
 * i mod nb of a row (a: the activation row's blocks). The weight
 * stream is hinted K_AHEAD bytes ahead (at a run's end into the next
 * call's rows: hints never fault). */
LI_INLINE void kd_run(const int type, const char *p, int cnt, const act_q8_K *a, int nb, kd_buf *pb, size_t e) {
    const size_t bb = k_bytes(type);
    int i = 0, ai = 0;
    for (; i + 4 <= cnt; i += 4, p += 4 * bb) {
        for (size_t o = 0; o < 4 * bb; o += 64) _mm_prefetch(p + K_AHEAD + o, _MM_HINT_T0);
        /* one super-block a step, not unrolled: unrolled, the compiler
         * interleaves the four and spills most of their vectors */
        __m256i v[4];
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 1
#endif
        for (int t = 0; t < 4; t++) {
            v[t] = kd_sums(type, p + t * bb, a + ai);
            if (++ai == nb) ai = 0;
        }
        const char *const blk[4] = {p, p + bb, p + 2 * bb, p + 3 * bb};
        kd_store4(type, blk, v, pb, e + (size_t)i);
    }
    if (i < cnt) { /* the last one to three: zeros past cnt, the scales of the last one again */
        const int m = cnt - i;
        for (size_t o = 0; o < 4 * bb; o += 64) _mm_prefetch(p + K_AHEAD + o, _MM_HINT_T0);
        __m256i v[4];
        const char *blk[4];
        for (int t = 0; t < 4; t++) {
            blk[t] = p + (size_t)LI_MIN(t, m - 1) * bb;
            if (t < m) {
                v[t] = kd_sums(type, blk[t], a + ai);
                if (++ai == nb) ai = 0;
            } else {
                v[t] = _mm256_setzero_si256();
            }
        }
        kd_store4(type, blk, v, pb, e + (size_t)i);
    }
}

/* rows [nr, 4) of the buffer (row r at r * stride, n entries and the 4 the
 * transposes read past them): zeros, their lanes computed and dropped */
LI_INLINE void kd_zero_rows(kd_buf *pb, size_t stride, int n, int nr) {
    for (int r = nr; r < 4; r++) {
        const size_t e = (size_t)r * stride, len = ((size_t)n + 4) * sizeof(float);
        memset(pb->isum + e, 0, len);
        memset(pb->imin + e, 0, len);
        memset(pb->d + e, 0, len);
        memset(pb->m + e, 0, len);
    }
}

LI_INLINE void rows_k_decode(const int type, int64_t k, const void *w, size_t ws, int nr, const act_q8_K *x,
                             float *y) {
    const int64_t nb = k / QK_K;
    const size_t bb = k_bytes(type);
    const int kmin = k_has_min(type);
    kd_buf pb;
    __m128 acc = _mm_setzero_ps();
    if (nb <= PASS_BLOCKS && ws == (size_t)nb * bb) { /* the rows as one run */
        const int n = (int)nb;
        kd_run(type, (const char *)w, nr * n, x, n, &pb, 0);
        if (nr < 4) kd_zero_rows(&pb, (size_t)n, n, nr);
        for (int j = 0; j < n; j += 4) kd_chain4(kmin, &pb, (size_t)n, x, j, LI_MIN(4, n - j), &acc);
    } else {
        kd_zero_rows(&pb, PASS_BLOCKS, PASS_BLOCKS, nr);
        for (int64_t i0 = 0; i0 < nb; i0 += PASS_BLOCKS) {
            const int n = (int)LI_MIN(PASS_BLOCKS, nb - i0);
            for (int r = 0; r < nr; r++)
                kd_run(type, (const char *)w + (size_t)r * ws + (size_t)i0 * bb, n, x + i0, n, &pb,
                       (size_t)r * PASS_BLOCKS);
            for (int j = 0; j < n; j += 4) kd_chain4(kmin, &pb, PASS_BLOCKS, x + i0, j, LI_MIN(4, n - j), &acc);
        }
    }
    float t[4];
    _mm_storeu_ps(t, acc);
    for (int r = 0; r < nr; r++) y[r] = t[r];
}

/* K-quants: rows_k_decode for one activation row, rows_k for more */
LI_INLINE void rows_kq(const int type, int64_t k, const void *w, size_t ws, int nr, const void *x, size_t xs,
                       float *y, size_t ys, const int nc) {
    if (nc == 1)
        rows_k_decode(type, k, w, ws, nr, (const act_q8_K *)x, y);
    else
        rows_k(type, k, w, ws, nr, x, xs, y, ys, nc);
}

#define ROWS_Q_ENTRIES(name, T, worker)                                                        \
    static void dot_rows_##name(int64_t k, const void *w, size_t ws, int nr, const void *x,    \
                                size_t xs, int nc, float *y, size_t ys) {                       \
        switch (nc) {                                                                           \
        case 1: worker(LI_TYPE_##T, k, w, ws, nr, x, xs, y, ys, 1); break;                      \
        case 2: worker(LI_TYPE_##T, k, w, ws, nr, x, xs, y, ys, 2); break;                      \
        case 3: worker(LI_TYPE_##T, k, w, ws, nr, x, xs, y, ys, 3); break;                      \
        default: worker(LI_TYPE_##T, k, w, ws, nr, x, xs, y, ys, 4); break;                     \
        }                                                                                       \
    }                                                                                           \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        dot_rows_##name(k, w, 0, 1, x, xs, nc, s, 1);                                           \
    }
LI_STATIC_ASSERT(LI_DOT_MAX_NC == 4 && LI_DOT_MAX_NR == 4, "rows32 and rows_k take up to 4 rows and 4 columns");
ROWS_Q_ENTRIES(q4_0, Q4_0, rows32)
ROWS_Q_ENTRIES(q5_0, Q5_0, rows32)
ROWS_Q_ENTRIES(q4_1, Q4_1, rows32)
ROWS_Q_ENTRIES(q5_1, Q5_1, rows32)
ROWS_Q_ENTRIES(q2_K, Q2_K, rows_kq)
ROWS_Q_ENTRIES(q3_K, Q3_K, rows_kq)
ROWS_Q_ENTRIES(q4_K, Q4_K, rows_kq)
ROWS_Q_ENTRIES(q5_K, Q5_K, rows_kq)
ROWS_Q_ENTRIES(q6_K, Q6_K, rows_kq)
#undef ROWS_Q_ENTRIES

/* Q8_0 in decode (one activation row): one weight row at a time, front to
 * back, a single stream from memory (reading four rows side by side, or even
 * two, ran Q8_0, the widest 32-value block, at half speed or less from DRAM).
 * A row's fused multiply-adds are a serial chain, one a block, whose latency
 * alone would hold a row to about one block per four cycles; so the (up to)
 * four rows' chains run in the lanes of one vector, block by block in order:
 * per lane, scalar.c's fmaf(isum, d * dx, acc). An integer pass takes each row
 * in turn and keeps its blocks' exact sums and f16 scales in a small buffer;
 * the last row's pass also runs the four chains, a few blocks behind its own
 * sums, so that their latency hides under its integer work instead of
 * following it. A row of up to Q8_PASS blocks (8192 values) is one pass. */
#define Q8_PASS 256
/* The integer pass hints the weight stream Q8_AHEAD bytes ahead of its
 * loads, as the K-quants' does (K_AHEAD above): the hardware prefetchers
 * alone left a 1-thread matvec well short of a plain read on a Zen 3 host;
 * measurements: docs/kernel-tuning.md#avx2-q8-0-decode */
#ifndef Q8_AHEAD
#define Q8_AHEAD 2048
#endif

typedef struct {
    float isum[4][Q8_PASS];  /* [row][block] exact integer sums */
    uint16_t d[4][Q8_PASS];  /* [row][block] the f16 scales as stored */
} q8_buf;

/* the exact integer sums of blocks b[0..7] against a[0..7], lane t: block t */
LI_INLINE __m256i q8_isum8(const block_q8_0 *b, const act_q8_0 *a) {
    __m256i p[8];
    for (int t = 0; t < 8; t++) {
        const __m256i q = loadu(b[t].qs);
        p[t] = mul_sum_ss8(_mm256_sign_epi8(q, q), q, loadu(a[t].qs));
    }
    /* a tree of blends, one shuffle and one add a pair (vphaddd would be
     * two shuffles and an add, and shuffles are what this pass runs short
     * of). p2[t]: lane 2i sums two of p[2t]'s lanes, lane 2i+1 two of
     * p[2t+1]'s; p4[t]: lane u of each 128-bit half sums p[4t+u]'s four
     * lanes there; the last level adds the halves: lane t, block t. */
    __m256i p2[4], p4[2];
    for (int t = 0; t < 4; t++)
        p2[t] = _mm256_add_epi32(_mm256_blend_epi32(p[2 * t], p[2 * t + 1], 0xAA),
                                 _mm256_shuffle_epi32(_mm256_blend_epi32(p[2 * t + 1], p[2 * t], 0xAA), 0xB1));
    for (int t = 0; t < 2; t++)
        p4[t] = _mm256_add_epi32(_mm256_blend_epi32(p2[2 * t], p2[2 * t + 1], 0xCC),
                                 _mm256_shuffle_epi32(_mm256_blend_epi32(p2[2 * t + 1], p2[2 * t], 0xCC), 0x4E));
    return _mm256_add_epi32(_mm256_blend_epi32(p4[0], p4[1], 0xF0), _mm256_permute2x128_si256(p4[0], p4[1], 0x21));
}

/* the f16 scales of blocks b[0..7] as stored, lane t: block t */
LI_INLINE __m128i q8_scales8(const block_q8_0 *b) {
    __m128i v = _mm_cvtsi32_si128(b[0].d);
    v = _mm_insert_epi16(v, b[1].d, 1);
    v = _mm_insert_epi16(v, b[2].d, 2);
    v = _mm_insert_epi16(v, b[3].d, 3);
    v = _mm_insert_epi16(v, b[4].d, 4);
    v = _mm_insert_epi16(v, b[5].d, 5);
    v = _mm_insert_epi16(v, b[6].d, 6);
    return _mm_insert_epi16(v, b[7].d, 7);
}

/* four rows' scales of blocks j .. j+3 as floats, d[t] lane r = row r's block j+t */
LI_INLINE void q8_scales_t4(const q8_buf *pb, int j, __m128 d[4]) {
    for (int r = 0; r < 4; r++)
        d[r] = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)&pb->d[r][j]));
    _MM_TRANSPOSE4_PS(d[0], d[1], d[2], d[3]);
}

/* the four chains over blocks j .. j+m-1 (m <= 4) of the chunk (a: its activation blocks) */
LI_INLINE void q8_chain4(const q8_buf *pb, const act_q8_0 *a, int j, int m, __m128 *acc) {
    __m128 d[4], f[4];
    q8_scales_t4(pb, j, d);
    load_t4(&pb->isum[0][j], &pb->isum[1][j], &pb->isum[2][j], &pb->isum[3][j], f);
    if (m == 4) {
        for (int t = 0; t < 4; t++) *acc = _mm_fmadd_ps(f[t], _mm_mul_ps(d[t], _mm_set1_ps(a[j + t].d)), *acc);
    } else {
        for (int t = 0; t < m; t++) *acc = _mm_fmadd_ps(f[t], _mm_mul_ps(d[t], _mm_set1_ps(a[j + t].d)), *acc);
    }
}

/* blocks [0, n) of one row (b, from the chunk's first block) into row r of
 * the buffer; entries up to n rounded up to 4 are written (zeros past n).
 * With chain set (the last row), the four chains follow over the blocks
 * whose sums are in. */
LI_INLINE void q8_int_pass(const block_q8_0 *b, const act_q8_0 *a, int n, int r, q8_buf *pb, int chain,
                           __m128 *acc) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        /* past the row's end: the next row's blocks, or nothing (hints never fault) */
        for (int o = 0; o < 8 * (int)sizeof(block_q8_0); o += 64)
            _mm_prefetch((const char *)(b + j) + Q8_AHEAD + o, _MM_HINT_T0);
        _mm256_storeu_ps(&pb->isum[r][j], _mm256_cvtepi32_ps(q8_isum8(b + j, a + j)));
        _mm_storeu_si128((__m128i *)(void *)&pb->d[r][j], q8_scales8(b + j));
        if (chain) {
            q8_chain4(pb, a, j, 4, acc);
            q8_chain4(pb, a, j + 4, 4, acc);
        }
    }
    for (; j < n; j += 4) { /* the last n - j < 8 blocks, four at a time, zeros past n */
        const int m = LI_MIN(4, n - j);
        __m256i p[4];
        for (int t = 0; t < 4; t++) {
            if (t < m) {
                const __m256i q = loadu(b[j + t].qs);
                p[t] = mul_sum_ss8(_mm256_sign_epi8(q, q), q, loadu(a[j + t].qs));
                pb->d[r][j + t] = b[j + t].d;
            } else {
                p[t] = _mm256_setzero_si256();
                pb->d[r][j + t] = 0;
            }
        }
        _mm_storeu_ps(&pb->isum[r][j], _mm_cvtepi32_ps(hsum8x4_epi32(p)));
        if (chain) q8_chain4(pb, a, j, m, acc);
    }
}

static void rows_q8_0_decode(int64_t k, const void *w, size_t ws, int nr, const act_q8_0 *x, float *y) {
    const int64_t nb = k / 32;
    q8_buf pb;
    for (int r = nr; r < 4; r++) { /* lanes of missing rows: zeros, computed and dropped */
        memset(pb.isum[r], 0, sizeof(pb.isum[r]));
        memset(pb.d[r], 0, sizeof(pb.d[r]));
    }
    __m128 acc = _mm_setzero_ps();
    for (int64_t i0 = 0; i0 < nb; i0 += Q8_PASS) {
        const int n = (int)LI_MIN(Q8_PASS, nb - i0);
        for (int r = 0; r < nr; r++)
            q8_int_pass((const block_q8_0 *)(const void *)((const char *)w + (size_t)r * ws) + i0, x + i0, n, r,
                        &pb, r == nr - 1, &acc);
    }
    float t[4];
    _mm_storeu_ps(t, acc);
    for (int r = 0; r < nr; r++) y[r] = t[r];
}

static void dot_rows_q8_0(int64_t k, const void *w, size_t ws, int nr, const void *x, size_t xs,
                          int nc, float *y, size_t ys) {
    switch (nc) {
    case 1: rows_q8_0_decode(k, w, ws, nr, (const act_q8_0 *)x, y); break;
    case 2: rows32(LI_TYPE_Q8_0, k, w, ws, nr, x, xs, y, ys, 2); break;
    case 3: rows32(LI_TYPE_Q8_0, k, w, ws, nr, x, xs, y, ys, 3); break;
    default: rows32(LI_TYPE_Q8_0, k, w, ws, nr, x, xs, y, ys, 4); break;
    }
}

static void dot_q8_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    dot_rows_q8_0(k, w, 0, 1, x, xs, nc, s, 1);
}

/* ---- vector ops ---- */

/* e^x for x in float range: x = n ln2 + r, |r| <= ln2/2, e^r by the Cephes
 * polynomial, then 2^n into the exponent bits. Below -87.3 the result is 0
 * (where expf would give a subnormal), above 88.7 it saturates. */
LI_INLINE __m256 exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static void rms_norm(const float *x, const float *w, float *y, int64_t k, float eps) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < k; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / (double)k + (double)eps));
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= k; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < k; i++) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

static void softmax(float *x, int64_t k) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    float mx = hmax_ps(vm);
    for (; i < k; i++) mx = LI_MAX(mx, x[i]);
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vs = _mm256_setzero_ps();
    for (i = 0; i + 8 <= k; i += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    double sum = hsum_ps(vs);
    for (; i < k; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    const __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= k; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
    for (; i < k; i++) x[i] *= inv;
}

/* SiLU is computed, x / (1 + exp(-x)) (exp_ps: a few ulp, as the table's
 * interpolation; tests/test_ops.py's bound holds for both), and GELU read
 * from ggml's f16 table, which the peer's results depend on. SiLU's two
 * tables (value and slope, 256 KiB each) had been gathered here too, but a
 * decode pass streams megabytes of weights between one layer's gating and
 * the next, and the gathers missed L2; computing it is faster
 * (docs/kernel-tuning.md#avx2-silu). The scalar and NEON levels keep the table. */
static void act_apply(int fn, const float *x, const float *u, float *y, int64_t n) {
    const int silu = fn == LI_FN_SILU;
    const __m256 hi = _mm256_set1_ps(silu ? LI_SILU_HI : LI_GELU_HI);
    const __m256 lo = _mm256_set1_ps(silu ? LI_SILU_LO : LI_GELU_LO);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        __m256 v;
        if (silu) {
            v = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), xv))));
        } else {
            const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(xv, _MM_FROUND_TO_NEAREST_INT));
            v = _mm256_i32gather_ps(li_lut_gelu, idx, 4);
        }
        v = _mm256_blendv_ps(v, xv, _mm256_cmp_ps(xv, hi, _CMP_GE_OQ));
        v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(xv, lo, _CMP_LE_OQ));
        if (u) v = _mm256_mul_ps(v, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(y + i, v);
    }
    if (i < n) li_act_apply_scalar(fn, x + i, u ? u + i : NULL, y + i, n - i);
}

static float dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_f16(b, i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8_f16(b, i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_f16(b, i), s0);
    float acc = hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++) acc += a[i] * f16(b[i]);
    return acc;
}

static void axpy_f16(float a, const uint16_t *x, float *y, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8_f16(x, i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * f16(x[i]);
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = li_f32_to_f16(x[i]);
}

static void f16_to_f32(const uint16_t *x, float *y, int64_t n) { dequant_f16(x, y, n); }

static float vdot_f32(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float acc = hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy_f32(float a, const float *x, float *y, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void scale_f32(float *x, float a, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
    for (; i < n; i++) x[i] *= a;
}

static void add_f32(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void mul_f32(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] * b[i];
}

/* ---- attention over an F16 cache ----
 * The heads of a group (grouped-query attention) share each cached row: it
 * is converted from F16 once and used for all of them. */

/* four 8-lane sums reduced to one vector of four totals */
LI_INLINE __m128 hsum4_ps(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* scores of g <= 4 heads against rows j, j+1 (d a multiple of 8): each
 * 8-value slice of the two rows is converted once for all g heads */
LI_INLINE void scores_gx2(const float *q, size_t q_stride, const int g, const uint16_t *k0,
                          const uint16_t *k1, int64_t d, float scale, float *out, size_t out_ld, int64_t j) {
    __m256 a[4][2];
    for (int h = 0; h < g; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 x0 = load8_f16(k0, i), x1 = load8_f16(k1, i);
        for (int h = 0; h < g; h++) {
            const __m256 qh = _mm256_loadu_ps(q + (size_t)h * q_stride + i);
            a[h][0] = _mm256_fmadd_ps(qh, x0, a[h][0]);
            a[h][1] = _mm256_fmadd_ps(qh, x1, a[h][1]);
        }
    }
    const __m256 zero = _mm256_setzero_ps();
    for (int h = 0; h < g; h += 2) {
        float t[4];
        _mm_storeu_ps(t, _mm_mul_ps(hsum4_ps(a[h][0], a[h][1], h + 1 < g ? a[h + 1][0] : zero,
                                             h + 1 < g ? a[h + 1][1] : zero),
                                    _mm_set1_ps(scale)));
        out[(size_t)h * out_ld + (size_t)j] = t[0];
        out[(size_t)h * out_ld + (size_t)j + 1] = t[1];
        if (h + 1 < g) {
            out[(size_t)(h + 1) * out_ld + (size_t)j] = t[2];
            out[(size_t)(h + 1) * out_ld + (size_t)j + 1] = t[3];
        }
    }
}

/* the same for one row j: each head's sum reduced as scores_gx2 reduces it,
 * so a score does not depend on which rows share its call */
LI_INLINE void scores_gx1(const float *q, size_t q_stride, const int g, const uint16_t *k0, int64_t d, float scale,
                          float *out, size_t out_ld, int64_t j) {
    __m256 a[4];
    for (int h = 0; h < g; h++) a[h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 x0 = load8_f16(k0, i);
        for (int h = 0; h < g; h++) a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * q_stride + i), x0, a[h]);
    }
    const __m256 zero = _mm256_setzero_ps();
    for (int h = 0; h < g; h += 2) {
        float t[4];
        _mm_storeu_ps(t, _mm_mul_ps(hsum4_ps(a[h], zero, h + 1 < g ? a[h + 1] : zero, zero), _mm_set1_ps(scale)));
        out[(size_t)h * out_ld + (size_t)j] = t[0];
        if (h + 1 < g) out[(size_t)(h + 1) * out_ld + (size_t)j] = t[2];
    }
}

static void attn_scores_f16(const float *q, size_t q_stride, int nh, const uint16_t *k, size_t stride,
                            int64_t n, int64_t d, float scale, float *out, size_t out_ld) {
    for (int h0 = 0; h0 < nh; h0 += 4) {
        const int g = LI_MIN(4, nh - h0);
        const float *qg = q + (size_t)h0 * q_stride;
        float *og = out + (size_t)h0 * out_ld;
        int64_t j = 0;
        if (d % 8 == 0)
            for (; j + 2 <= n; j += 2) {
                const uint16_t *k0 = k + (size_t)j * stride, *k1 = k0 + stride;
                /* rows a few steps ahead when other heads' columns sit between
                 * rows (a strided read); contiguous rows stream by themselves */
                if (stride != (size_t)d)
                    for (int64_t b = 0; b < d * 2; b += 64) {
                        _mm_prefetch((const char *)(k0 + 8 * stride) + b, _MM_HINT_T0);
                        _mm_prefetch((const char *)(k1 + 8 * stride) + b, _MM_HINT_T0);
                    }
                switch (g) {
                case 4: scores_gx2(qg, q_stride, 4, k0, k1, d, scale, og, out_ld, j); break;
                case 3: scores_gx2(qg, q_stride, 3, k0, k1, d, scale, og, out_ld, j); break;
                case 2: scores_gx2(qg, q_stride, 2, k0, k1, d, scale, og, out_ld, j); break;
                default: scores_gx2(qg, q_stride, 1, k0, k1, d, scale, og, out_ld, j); break;
                }
            }
        if (d % 8 == 0) {
            if (j < n) scores_gx1(qg, q_stride, g, k + (size_t)j * stride, d, scale, og, out_ld, j);
            continue;
        }
        for (; j < n; j++)
            for (int h = 0; h < g; h++)
                og[(size_t)h * out_ld + (size_t)j] = scale * dot_f32_f16(qg + (size_t)h * q_stride, k + (size_t)j * stride, d);
    }
}

/* out_h += sum_j p_h[j] v_j over 32 columns at a time, up to 3 heads held in
 * 12 registers while each row is converted once */
static void attn_accum_f16(const float *p, size_t p_ld, int nh, const uint16_t *v, size_t stride,
                           int64_t n, int64_t d, float *out, size_t out_stride) {
    for (int h0 = 0; h0 < nh; h0 += 3) {
        const int g = LI_MIN(3, nh - h0);
        int64_t i0 = 0;
        for (; i0 + 32 <= d; i0 += 32) {
            __m256 acc[3][4];
            for (int h = 0; h < g; h++)
                for (int r = 0; r < 4; r++) acc[h][r] = _mm256_loadu_ps(out + (size_t)(h0 + h) * out_stride + i0 + 8 * r);
            for (int64_t j = 0; j < n; j++) {
                const uint16_t *vj = v + (size_t)j * stride + i0;
                if (stride != (size_t)d) _mm_prefetch((const char *)(vj + 8 * stride), _MM_HINT_T0);
                const __m256 x0 = load8_f16(vj, 0), x1 = load8_f16(vj, 8), x2 = load8_f16(vj, 16), x3 = load8_f16(vj, 24);
                for (int h = 0; h < g; h++) {
                    const __m256 pj = _mm256_set1_ps(p[(size_t)(h0 + h) * p_ld + (size_t)j]);
                    acc[h][0] = _mm256_fmadd_ps(pj, x0, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(pj, x1, acc[h][1]);
                    acc[h][2] = _mm256_fmadd_ps(pj, x2, acc[h][2]);
                    acc[h][3] = _mm256_fmadd_ps(pj, x3, acc[h][3]);
                }
            }
            for (int h = 0; h < g; h++)
                for (int r = 0; r < 4; r++) _mm256_storeu_ps(out + (size_t)(h0 + h) * out_stride + i0 + 8 * r, acc[h][r]);
        }
        if (i0 < d)
            for (int h = 0; h < g; h++)
                for (int64_t j = 0; j < n; j++)
                    axpy_f16(p[(size_t)(h0 + h) * p_ld + (size_t)j], v + (size_t)j * stride + i0,
                             out + (size_t)(h0 + h) * out_stride + i0, d - i0);
    }
}

static float exp_sum(float *x, int64_t n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vs = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    double sum = hsum_ps(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    return (float)sum;
}

/* two vectors of 8 columns: the maxima, then the exponentials and their
 * sums lane by lane (the panel's columns are the lanes: no horizontal step) */
static void softmax_panel(float *p, int64_t n, float *sum) {
    __m256 m0 = _mm256_loadu_ps(p), m1 = _mm256_loadu_ps(p + 8);
    for (int64_t i = 1; i < n; i++) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + 16 * i));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(p + 16 * i + 8));
    }
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i++) {
        const __m256 e0 = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p + 16 * i), m0));
        const __m256 e1 = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p + 16 * i + 8), m1));
        _mm256_storeu_ps(p + 16 * i, e0);
        _mm256_storeu_ps(p + 16 * i + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    _mm256_storeu_ps(sum, s0);
    _mm256_storeu_ps(sum + 8, s1);
}

/* min and max in 4 accumulators each, NaN found by an unordered compare */
static void range_f32(const float *x, int64_t n, float *lo, float *hi) {
    __m256 mn[4], mx[4], un = _mm256_setzero_ps();
    for (int r = 0; r < 4; r++) mn[r] = mx[r] = _mm256_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int r = 0; r < 4; r++) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * r);
            mn[r] = _mm256_min_ps(mn[r], v);
            mx[r] = _mm256_max_ps(mx[r], v);
            un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
    const __m256 m0 = _mm256_min_ps(_mm256_min_ps(mn[0], mn[1]), _mm256_min_ps(mn[2], mn[3]));
    const __m256 m1 = _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3]));
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_movehdup_ps(s));
    float a = _mm_cvtss_f32(s), b = hmax_ps(m1);
    int nan = _mm256_movemask_ps(un) != 0;
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        a = x[i] < a ? x[i] : a;
        b = x[i] > b ? x[i] : b;
    }
    *lo = nan ? NAN : a;
    *hi = nan ? NAN : b;
}

/* tanh of 8 floats: Eigen's rational approximation (an odd polynomial of
 * degree 13 over an even one of degree 6, the input clamped to +-7.99881,
 * where it reaches 1; x itself below 4e-4), within 4e-7 relative of tanh
 * over the floats (6.6 ulp just below 1); NaN stays NaN (the clamps take
 * x second, which min/max return when it is NaN) */
LI_INLINE __m256 tanh_ps(__m256 x) {
    const __m256 c = _mm256_set1_ps(7.99881172180175781f);
    const __m256 xc = _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), c), _mm256_min_ps(c, x));
    const __m256 x2 = _mm256_mul_ps(xc, xc);
    __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(-2.76076847742355e-16f), _mm256_set1_ps(2.00018790482477e-13f));
    p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(-8.60467152213735e-11f));
    p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(5.12229709037114e-08f));
    p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(1.48572235717979e-05f));
    p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(6.37261928875436e-04f));
    p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(4.89352455891786e-03f));
    p = _mm256_mul_ps(xc, p);
    __m256 q = _mm256_fmadd_ps(x2, _mm256_set1_ps(1.19825839466702e-06f), _mm256_set1_ps(1.18534705686654e-04f));
    q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(2.26843463243900e-03f));
    q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(4.89352518554385e-03f));
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    return _mm256_blendv_ps(_mm256_div_ps(p, q), x, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0004f), _CMP_LT_OQ));
}

LI_INLINE __m256 softcap_ps(__m256 v, __m256 scale, __m256 cap, int capped) {
    const __m256 z = _mm256_mul_ps(v, scale);
    return capped ? _mm256_mul_ps(cap, tanh_ps(_mm256_div_ps(z, cap))) : z;
}

/* the last n % 8 through the same vector steps (in a buffer), so that an
 * element's result does not depend on where a thread's share ends */
static void softcap_f32(float *x, int64_t n, float scale, float cap) {
    const __m256 vs = _mm256_set1_ps(scale), vc = _mm256_set1_ps(cap);
    const int capped = cap > 0.0f;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, softcap_ps(_mm256_loadu_ps(x + i), vs, vc, capped));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(t, softcap_ps(_mm256_loadu_ps(t), vs, vc, capped));
        memcpy(x + i, t, (size_t)(n - i) * sizeof(float));
    }
}

void li_kernels_fill_avx2(li_kernels *t) {
    li_kernels_fill_scalar(t);
    t->isa = LI_ISA_AVX2;
#define SET(T, name)                          \
    t->dequant[LI_TYPE_##T] = dequant_##name; \
    t->dot[LI_TYPE_##T] = dot_##name;
    SET(F16, f16) SET(BF16, bf16);
    SET(Q4_0, q4_0) SET(Q4_1, q4_1) SET(Q5_0, q5_0) SET(Q5_1, q5_1) SET(Q8_0, q8_0);
    SET(Q2_K, q2_K) SET(Q3_K, q3_K) SET(Q4_K, q4_K) SET(Q5_K, q5_K) SET(Q6_K, q6_K);
#undef SET
    t->dot[LI_TYPE_F32] = dot_f32; /* F32 rows dequantize by memcpy, kept from the scalar table */
    t->dot_rows[LI_TYPE_Q4_0] = dot_rows_q4_0;
    t->dot_rows[LI_TYPE_Q5_0] = dot_rows_q5_0;
    t->dot_rows[LI_TYPE_Q4_1] = dot_rows_q4_1;
    t->dot_rows[LI_TYPE_Q5_1] = dot_rows_q5_1;
    t->dot_rows[LI_TYPE_Q8_0] = dot_rows_q8_0;
    t->dot_rows[LI_TYPE_Q2_K] = dot_rows_q2_K;
    t->dot_rows[LI_TYPE_Q3_K] = dot_rows_q3_K;
    t->dot_rows[LI_TYPE_Q4_K] = dot_rows_q4_K;
    t->dot_rows[LI_TYPE_Q5_K] = dot_rows_q5_K;
    t->dot_rows[LI_TYPE_Q6_K] = dot_rows_q6_K;
    t->quant_act[LI_ACT_Q8_0] = quant_act_q8_0;
    t->quant_act[LI_ACT_Q8_1] = quant_act_q8_1;
    t->quant_act[LI_ACT_Q8_K] = quant_act_q8_K;
    t->attn_scores_f16 = attn_scores_f16;
    t->attn_accum_f16 = attn_accum_f16;
    t->exp_sum = exp_sum;
    t->range_f32 = range_f32;
    t->softcap_f32 = softcap_f32;
    t->softmax_panel = softmax_panel;
    li_gemm_fill_avx2(t);
    li_sgemm_fill_avx2(t); /* x86_avx2_sgemm.c: the float GEMM's register tile */
    li_kernels_fill_avx2_iq(t); /* x86_avx2_iq.c: the i-quants, ternary types and MXFP4 */
    li_x16_fill_avx2(t);        /* x86_avx2_x16.c: MXFP4 over the repacked groups */
    t->rms_norm = rms_norm;
    t->softmax = softmax;
    t->act_apply = act_apply;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f16 = axpy_f16;
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
    t->dot_f32 = vdot_f32;
    t->axpy_f32 = axpy_f32;
    t->scale_f32 = scale_f32;
    t->add_f32 = add_f32;
    t->mul_f32 = mul_f32;
    li_recurrent_fill_avx2(t); /* x86_avx2_recurrent.c: the recurrent mixers */
}
#elif defined(LI_ARCH_X86)
/* built without the AVX2 flags: the table stays scalar and dispatch skips it */
void li_kernels_fill_avx2(li_kernels *t) { li_kernels_fill_scalar(t); }
#else
typedef int li_empty_translation_unit;
#endif
