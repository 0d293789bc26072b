/* x86_avx2_iq.c: AVX2 dot products of the non-linear, grid, ternary and MXFP4
 * types (scalar_iq.c is their specification). Built with -mavx2 -mfma -mf16c;
 * li_kernels_fill_avx2 calls li_kernels_fill_avx2_iq. Dequantization stays
 * the scalar file's (it runs once per row of an embedding lookup, not per
 * token), but for IQ4_NL's and MXFP4's: a table lookup and one multiply per
 * value, d * level as scalar_iq.c's, so gguf's bits.
 *
 * IQ4_NL, IQ4_XS and MXFP4: a block's 4-bit indices become its 32 signed
 * values through one vpshufb over the 16-entry level table; products with the
 * activations are formed as |w| x (a with w's sign) by vpmaddubsw. IQ4_NL
 * and MXFP4 (Q8_0): four blocks' exact sums come out of one vphaddd tree,
 * and the fused multiply-adds take them in block order, scalar_iq.c's chain;
 * dot_rows runs four rows' chains in the lanes of one vector. IQ4_XS (Q8_K):
 * the int16 pair sums of each block are multiplied by its scale in vpmaddwd
 * and a super-block's sum is one integer.
 *
 * The grid types: each 8 values are one grid row (a 64-bit load; 32-bit for
 * the IQ3 grids), four rows make a 32-value vector, and their signs, looked
 * up the same way as bytes of +-1, go onto the activations by vpsignb. The
 * int16 pair sums are multiplied by the groups' integer scales in vpmaddwd.
 * IQ1_S and IQ1_M's values 8 * grid +- 1 are formed in bytes. TQ1_0 and
 * TQ2_0 multiply the unsigned trits t by the activations and take out the
 * offset as sum(a) from the Q8_K group sums. Every block's integer sum is
 * exact, so the results are scalar_iq.c's to the bit.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <immintrin.h>
#include <stddef.h>

#include "../common.h"
#include "unpack_iq.h"
#include "x86_gemm.h"

LI_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

LI_INLINE __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

LI_INLINE int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* lane r: the sum of the 8 int32 lanes of v[r] */
LI_INLINE __m128i hsum8x4_epi32(const __m256i v[4]) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

LI_INLINE uint64_t u64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

LI_INLINE uint32_t u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 8 int32 partial sums of m * (a signed like s): |w| x a with w's sign when
 * m = |w|, s = w; or grid x a with the grid's signs when m = grid, s = +-1 */
LI_INLINE __m256i mul_sign(__m256i m, __m256i s, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(a, s)), _mm256_set1_epi16(1));
}

/* ---- IQ4_NL, MXFP4: 32-value blocks of table levels against Q8_0 ---- */

LI_INLINE __m256i level_table(const int8_t t[16]) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)t);
    return _mm256_set_m128i(v, v);
}

/* block b of a row: its values and its float scale */
LI_INLINE __m256i nl4_block(const int type, const void *row, int64_t b, __m256i table, float *d) {
    if (type == LI_TYPE_IQ4_NL) {
        const block_iq4_nl *x = (const block_iq4_nl *)row + b;
        *d = f16(x->d);
        return nl4_lookup(x->qs, table);
    }
    const block_mxfp4 *x = (const block_mxfp4 *)row + b;
    *d = li_e8m0_half(x->e);
    return nl4_lookup(x->qs, table);
}

/* y = d * level, 32 values a block */
LI_INLINE void nl4_dequant(const int type, const void *src, float *y, int64_t k) {
    const __m256i table = level_table(type == LI_TYPE_MXFP4 ? li_kvalues_mxfp4 : li_kvalues_iq4nl);
    for (int64_t i = 0; i < k / 32; i++, y += 32) {
        float d;
        const __m256i q = nl4_block(type, src, i, table, &d);
        const __m256 vd = _mm256_set1_ps(d);
        const __m128i h[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
        for (int j = 0; j < 4; j++) {
            const __m128i b = j % 2 ? _mm_unpackhi_epi64(h[j / 2], h[j / 2]) : h[j / 2];
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))));
        }
    }
}

static void dequant_iq4_nl(const void *src, float *y, int64_t k) { nl4_dequant(LI_TYPE_IQ4_NL, src, y, k); }
static void dequant_mxfp4(const void *src, float *y, int64_t k) { nl4_dequant(LI_TYPE_MXFP4, src, y, k); }

LI_INLINE void nl4_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                       float *s) {
    const int64_t nb = k / 32;
    const __m256i table = level_table(type == LI_TYPE_MXFP4 ? li_kvalues_mxfp4 : li_kvalues_iq4nl);
    __m128 acc[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i += 4) {
        const int n = (int)LI_MIN(4, nb - i);
        __m256i q[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
        float d[4] = {0};
        for (int t = 0; t < n; t++) q[t] = nl4_block(type, w, i + t, table, &d[t]);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            __m256i p[4];
            for (int t = 0; t < 4; t++) p[t] = t < n ? mul_sign(_mm256_sign_epi8(q[t], q[t]), q[t], loadu(a[t].qs))
                                                     : _mm256_setzero_si256();
            float f[4];
            _mm_storeu_ps(f, _mm_cvtepi32_ps(hsum8x4_epi32(p)));
            for (int t = 0; t < n; t++)
                acc[c] = _mm_fmadd_ss(_mm_set_ss(f[t]), _mm_set_ss(d[t] * a[t].d), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = _mm_cvtss_f32(acc[c]);
}

/* Several rows (dot_rows): one row's fused multiply-adds are a serial chain,
 * one a block, which bounds a single row's speed; four rows' chains run side
 * by side in the lanes of one vector. Each row is read on its own, front to
 * back, in an integer pass over up to NL4_PASS blocks (a whole row of up to
 * 8192 values, so the four rows are one stream from memory) that keeps the
 * blocks' exact sums and scales, and a float pass then runs the four chains,
 * block by block in order: per lane, scalar_iq.c's fmaf(isum, d * dx, acc).
 * The integer pass has no branch inside a row's whole quads of blocks, and
 * the scales are formed with integer instructions beside the vector work. */
#define NL4_PASS 256 /* blocks of 32 in a chunk */

typedef struct {
    float isum[LI_DOT_MAX_NC][4][NL4_PASS]; /* [column][row][block] */
    float d[4][NL4_PASS];                   /* [row][block] */
} nl4_buf;

LI_INLINE void load_t4(const float *p0, const float *p1, const float *p2, const float *p3, __m128 t[4]) {
    t[0] = _mm_loadu_ps(p0);
    t[1] = _mm_loadu_ps(p1);
    t[2] = _mm_loadu_ps(p2);
    t[3] = _mm_loadu_ps(p3);
    _MM_TRANSPOSE4_PS(t[0], t[1], t[2], t[3]);
}

/* bytes of one block, and the offset of its 16 bytes of indices */
LI_INLINE size_t nl4_bytes(const int type) { return type == LI_TYPE_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl); }
LI_INLINE size_t nl4_qs(const int type) {
    return type == LI_TYPE_MXFP4 ? offsetof(block_mxfp4, qs) : offsetof(block_iq4_nl, qs);
}

/* li_e8m0_half of every exponent byte: one load a block, beside the vector
 * work (filled by li_kernels_fill_avx2_iq, before any kernel runs) */
static float e8m0_half_table[256];

/* the block's scale: e8m0 as li_e8m0_half, or the f16 d */
LI_INLINE float nl4_scale(const int type, const uint8_t *b) {
    if (type == LI_TYPE_MXFP4) return e8m0_half_table[((const block_mxfp4 *)(const void *)b)->e];
    uint16_t h;
    memcpy(&h, b + offsetof(block_iq4_nl, d), 2);
    return f16(h);
}

/* four blocks' exact sums against column c's activation blocks a[0..3] into
 * isum (lane t: block t); blocks t >= nt are zeros and their activations
 * are not read. MXFP4's levels are at most 12 in magnitude, so a sum of 8
 * of its products (at most 8 * 12 * 127 = 12192) fits in int16: the pair
 * sums fold with two rounds of vphaddw before one vpmaddwd widens them,
 * where IQ4_NL's (up to 127) widen first and fold as int32. */
LI_INLINE void nl4_sums4(const int type, const __m256i q[4], const __m256i m[4], const act_q8_0 *a, int nt,
                         float *isum) {
    __m256i p[4];
    if (type == LI_TYPE_MXFP4) {
        for (int t = 0; t < 4; t++)
            p[t] = t < nt ? _mm256_maddubs_epi16(m[t], _mm256_sign_epi8(loadu(a[t].qs), q[t])) : _mm256_setzero_si256();
        /* lane r of each 128-bit half: words 2r, 2r + 1 hold block r's sums of 8 */
        const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
        const __m256i s = _mm256_madd_epi16(h, _mm256_set1_epi16(1));
        const __m128i v = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        _mm_storeu_ps(isum, _mm_cvtepi32_ps(v));
        return;
    }
    for (int t = 0; t < 4; t++) p[t] = t < nt ? mul_sign(m[t], q[t], loadu(a[t].qs)) : _mm256_setzero_si256();
    _mm_storeu_ps(isum, _mm_cvtepi32_ps(hsum8x4_epi32(p)));
}

/* blocks [i0, i0 + n) of one row into lane r of the buffer, from its index 0;
 * entries up to n rounded up to 4 are written (zeros past n) */
LI_INLINE void nl4_int_pass(const int type, const void *row, int r, int64_t i0, int n, const void *x, size_t xs,
                            const int nc, __m256i table, nl4_buf *pb) {
    const size_t bb = nl4_bytes(type), qo = nl4_qs(type);
    const uint8_t *b = (const uint8_t *)row + (size_t)i0 * bb;
    int j = 0;
    for (; j + 4 <= n; j += 4, b += 4 * bb) {
        __m256i q[4], m[4];
        for (int t = 0; t < 4; t++) {
            q[t] = nl4_lookup(b + t * bb + qo, table);
            m[t] = _mm256_sign_epi8(q[t], q[t]);
            pb->d[r][j + t] = nl4_scale(type, b + t * bb);
        }
        for (int c = 0; c < nc; c++) nl4_sums4(type, q, m, ACT_ROW(act_q8_0, x, c, xs) + i0 + j, 4, &pb->isum[c][r][j]);
    }
    if (j < n) {
        const int nt = n - j;
        __m256i q[4], m[4];
        for (int t = 0; t < 4; t++) {
            q[t] = t < nt ? nl4_lookup(b + t * bb + qo, table) : _mm256_setzero_si256();
            m[t] = _mm256_sign_epi8(q[t], q[t]);
            pb->d[r][j + t] = t < nt ? nl4_scale(type, b + t * bb) : 0.0f;
        }
        for (int c = 0; c < nc; c++) nl4_sums4(type, q, m, ACT_ROW(act_q8_0, x, c, xs) + i0 + j, nt, &pb->isum[c][r][j]);
    }
}

/* the four chains over blocks [i0, i0 + n) of the buffer: quads whole, then
 * the last blocks one by one (no term for a block past the row) */
LI_INLINE void nl4_float_pass(const nl4_buf *pb, int64_t i0, int n, const void *x, size_t xs, const int nc,
                              __m128 *acc) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        __m128 d[4];
        load_t4(&pb->d[0][j], &pb->d[1][j], &pb->d[2][j], &pb->d[3][j], d);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i0 + j;
            __m128 f[4];
            load_t4(&pb->isum[c][0][j], &pb->isum[c][1][j], &pb->isum[c][2][j], &pb->isum[c][3][j], f);
            for (int t = 0; t < 4; t++) acc[c] = _mm_fmadd_ps(f[t], _mm_mul_ps(d[t], _mm_set1_ps(a[t].d)), acc[c]);
        }
    }
    if (j < n) {
        __m128 d[4];
        load_t4(&pb->d[0][j], &pb->d[1][j], &pb->d[2][j], &pb->d[3][j], d);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i0 + j;
            __m128 f[4];
            load_t4(&pb->isum[c][0][j], &pb->isum[c][1][j], &pb->isum[c][2][j], &pb->isum[c][3][j], f);
            for (int t = 0; t < n - j; t++)
                acc[c] = _mm_fmadd_ps(f[t], _mm_mul_ps(d[t], _mm_set1_ps(a[t].d)), acc[c]);
        }
    }
}

LI_INLINE void nl4_rows(const int type, int64_t k, const void *w, size_t ws, int nr, const void *x, size_t xs,
                        const int nc, float *y, size_t ys) {
    const int64_t nb = k / 32;
    const __m256i table = level_table(type == LI_TYPE_MXFP4 ? li_kvalues_mxfp4 : li_kvalues_iq4nl);
    nl4_buf pb;
    for (int r = nr; r < 4; r++) { /* lanes of missing rows: zeros, computed and dropped */
        memset(pb.d[r], 0, sizeof(pb.d[r]));
        for (int c = 0; c < nc; c++) memset(pb.isum[c][r], 0, sizeof(pb.isum[c][r]));
    }
    __m128 acc[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm_setzero_ps();
    for (int64_t i0 = 0; i0 < nb; i0 += NL4_PASS) {
        const int n = (int)LI_MIN(NL4_PASS, nb - i0);
        for (int r = 0; r < nr; r++) nl4_int_pass(type, (const char *)w + (size_t)r * ws, r, i0, n, x, xs, nc, table, &pb);
        nl4_float_pass(&pb, i0, n, x, xs, nc, acc);
    }
    for (int c = 0; c < nc; c++) {
        float t[4];
        _mm_storeu_ps(t, acc[c]);
        for (int r = 0; r < nr; r++) y[(size_t)c * ys + (size_t)r] = t[r];
    }
}

#define NL4_ENTRY(name, T)                                                                        \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        switch (nc) {                                                                             \
        case 1: nl4_dot(LI_TYPE_##T, k, w, x, xs, 1, s); break;                                   \
        case 2: nl4_dot(LI_TYPE_##T, k, w, x, xs, 2, s); break;                                   \
        case 3: nl4_dot(LI_TYPE_##T, k, w, x, xs, 3, s); break;                                   \
        default: nl4_dot(LI_TYPE_##T, k, w, x, xs, 4, s); break;                                  \
        }                                                                                         \
    }                                                                                             \
    static void dot_rows_##name(int64_t k, const void *w, size_t ws, int nr, const void *x, size_t xs, \
                                int nc, float *y, size_t ys) {                                    \
        switch (nc) {                                                                             \
        case 1: nl4_rows(LI_TYPE_##T, k, w, ws, nr, x, xs, 1, y, ys); break;                      \
        case 2: nl4_rows(LI_TYPE_##T, k, w, ws, nr, x, xs, 2, y, ys); break;                      \
        case 3: nl4_rows(LI_TYPE_##T, k, w, ws, nr, x, xs, 3, y, ys); break;                      \
        default: nl4_rows(LI_TYPE_##T, k, w, ws, nr, x, xs, 4, y, ys); break;                     \
        }                                                                                         \
    }
LI_STATIC_ASSERT(LI_DOT_MAX_NR == 4, "nl4_rows takes up to 4 rows");
NL4_ENTRY(iq4_nl, IQ4_NL)
NL4_ENTRY(mxfp4, MXFP4)
#undef NL4_ENTRY

/* ---- IQ4_XS against Q8_K: per super-block, sum over blocks b of
 * (ls_b - 32) * sum(q * qx) in int32 lanes, then scalar_iq.c's one
 * fmaf(isum, d * dx, acc) ---- */
LI_INLINE void iq4_xs_dot(int64_t k, const void *w, const void *x, size_t xs, const int nc, float *s) {
    const __m256i table = level_table(li_kvalues_iq4nl);
    __m128 acc[LI_DOT_MAX_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_iq4_xs *b = (const block_iq4_xs *)w + i;
        __m256i isum[LI_DOT_MAX_NC];
        for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const __m256i v = nl4_lookup(b->qs + 16 * g, table);
            const __m256i m = _mm256_sign_epi8(v, v), sc = _mm256_set1_epi16((short)iq4_xs_scale(b, g));
            for (int c = 0; c < nc; c++) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                /* |v| <= 127 and |a| <= 127: a pair sum fits int16, times |sc| <= 32 an int32 */
                const __m256i p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(loadu(a->qs + 32 * g), v));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, sc));
            }
        }
        const float d = f16(b->d);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            acc[c] = _mm_fmadd_ss(_mm_set_ss((float)hsum_epi32(isum[c])), _mm_set_ss(d * a->d), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = _mm_cvtss_f32(acc[c]);
}

static void dot_iq4_xs(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    switch (nc) {
    case 1: iq4_xs_dot(k, w, x, xs, 1, s); break;
    case 2: iq4_xs_dot(k, w, x, xs, 2, s); break;
    case 3: iq4_xs_dot(k, w, x, xs, 3, s); break;
    default: iq4_xs_dot(k, w, x, xs, 4, s); break;
    }
}

/* ---- grid types against Q8_K ---- */

LI_INLINE __m256i rows8(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3) {
    return _mm256_set_epi64x((long long)u64(r3), (long long)u64(r2), (long long)u64(r1), (long long)u64(r0));
}

LI_INLINE __m256i signs8(uint8_t s0, uint8_t s1, uint8_t s2, uint8_t s3) {
    return rows8((const uint8_t *)li_sign_bytes[s0], (const uint8_t *)li_sign_bytes[s1],
                 (const uint8_t *)li_sign_bytes[s2], (const uint8_t *)li_sign_bytes[s3]);
}

/* 8 * g + delta bytewise, g in {-1, 0, 1} */
LI_INLINE __m256i iq1_values(__m256i g, __m256i delta) {
    const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);
    return _mm256_add_epi8(_mm256_add_epi8(g4, g4), delta);
}

LI_INLINE __m256i delta8(int n0, int n1, int n2, int n3) {
    const long long m = 0x0101010101010101LL, neg = -1LL; /* +1 or -1 in every byte */
    return _mm256_set_epi64x(n3 ? neg : m, n2 ? neg : m, n1 ? neg : m, n0 ? neg : m);
}

/* group g of 32 values of a grid block: magnitudes *m, signs *s (see
 * mul_sign), and the two 16-value groups' raw scales sc[0], sc[1] */
LI_INLINE void grid_group(const int type, const void *blk, int g, __m256i *m, __m256i *s, int sc[2]) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: {
        const uint8_t *p = (const uint8_t *)((const block_iq2_xxs *)blk)->qs + 8 * g;
        const uint32_t aux = u32(p + 4);
        *m = rows8(li_iq2xxs_grid[p[0]], li_iq2xxs_grid[p[1]], li_iq2xxs_grid[p[2]], li_iq2xxs_grid[p[3]]);
        *s = signs8(li_ksigns_iq2xs[aux & 127], li_ksigns_iq2xs[(aux >> 7) & 127],
                    li_ksigns_iq2xs[(aux >> 14) & 127], li_ksigns_iq2xs[(aux >> 21) & 127]);
        sc[0] = sc[1] = (int)(aux >> 28);
        return;
    }
    case LI_TYPE_IQ2_XS: {
        const block_iq2_xs *b = (const block_iq2_xs *)blk;
        const uint16_t *q = b->qs + 4 * g;
        *m = rows8(li_iq2xs_grid[q[0] & 511], li_iq2xs_grid[q[1] & 511], li_iq2xs_grid[q[2] & 511],
                   li_iq2xs_grid[q[3] & 511]);
        *s = signs8(li_ksigns_iq2xs[q[0] >> 9], li_ksigns_iq2xs[q[1] >> 9], li_ksigns_iq2xs[q[2] >> 9],
                    li_ksigns_iq2xs[q[3] >> 9]);
        sc[0] = b->scales[g] & 15;
        sc[1] = b->scales[g] >> 4;
        return;
    }
    case LI_TYPE_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)blk;
        const uint8_t *q = b->qs + 4 * g, *sg = b->qs + 32 + 4 * g;
        const int h = b->qh[g];
        *m = rows8(li_iq2s_grid[q[0] | ((h << 8) & 0x300)], li_iq2s_grid[q[1] | ((h << 6) & 0x300)],
                   li_iq2s_grid[q[2] | ((h << 4) & 0x300)], li_iq2s_grid[q[3] | ((h << 2) & 0x300)]);
        *s = signs8(sg[0], sg[1], sg[2], sg[3]);
        sc[0] = b->scales[g] & 15;
        sc[1] = b->scales[g] >> 4;
        return;
    }
    case LI_TYPE_IQ3_XXS: {
        const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
        const uint8_t *q = b->qs + 8 * g;
        const uint32_t aux = u32(b->qs + 64 + 4 * g);
        *m = _mm256_set_epi32((int)u32(li_iq3xxs_grid[q[7]]), (int)u32(li_iq3xxs_grid[q[6]]),
                              (int)u32(li_iq3xxs_grid[q[5]]), (int)u32(li_iq3xxs_grid[q[4]]),
                              (int)u32(li_iq3xxs_grid[q[3]]), (int)u32(li_iq3xxs_grid[q[2]]),
                              (int)u32(li_iq3xxs_grid[q[1]]), (int)u32(li_iq3xxs_grid[q[0]]));
        *s = signs8(li_ksigns_iq2xs[aux & 127], li_ksigns_iq2xs[(aux >> 7) & 127],
                    li_ksigns_iq2xs[(aux >> 14) & 127], li_ksigns_iq2xs[(aux >> 21) & 127]);
        sc[0] = sc[1] = (int)(aux >> 28);
        return;
    }
    case LI_TYPE_IQ3_S: {
        const block_iq3_s *b = (const block_iq3_s *)blk;
        const uint8_t *q = b->qs + 8 * g, *sg = b->signs + 4 * g;
        const int h = b->qh[g];
        int v[8];
        for (int e = 0; e < 8; e++) v[e] = (int)u32(li_iq3s_grid[q[e] | (((h >> e) & 1) << 8)]);
        *m = _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        *s = signs8(sg[0], sg[1], sg[2], sg[3]);
        sc[0] = sc[1] = (b->scales[g / 2] >> (4 * (g % 2))) & 15;
        return;
    }
    case LI_TYPE_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)blk;
        const uint8_t *q = b->qs + 4 * g;
        const unsigned h = b->qh[g];
        const __m256i gv = rows8((const uint8_t *)li_iq1s_grid[q[0] | ((h << 8) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[1] | ((h << 5) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[2] | ((h << 2) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[3] | ((h >> 1) & 0x700)]);
        const int neg = (h >> 15) & 1;
        const __m256i v = iq1_values(gv, delta8(neg, neg, neg, neg));
        *m = _mm256_sign_epi8(v, v);
        *s = v;
        sc[0] = sc[1] = (int)((h >> 12) & 7);
        return;
    }
    default: { /* IQ1_M */
        const block_iq1_m *b = (const block_iq1_m *)blk;
        const uint8_t *q = b->qs + 4 * g;
        const int h0 = b->qh[2 * g], h1 = b->qh[2 * g + 1];
        const __m256i gv = rows8((const uint8_t *)li_iq1s_grid[q[0] | ((h0 << 8) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[1] | ((h0 << 4) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[2] | ((h1 << 8) & 0x700)],
                                 (const uint8_t *)li_iq1s_grid[q[3] | ((h1 << 4) & 0x700)]);
        const __m256i v = iq1_values(gv, delta8((h0 >> 3) & 1, (h0 >> 7) & 1, (h1 >> 3) & 1, (h1 >> 7) & 1));
        *m = _mm256_sign_epi8(v, v);
        *s = v;
        const unsigned w = iq_u16(b->scales + 2 * (g / 2));
        sc[0] = (int)((w >> (6 * (g % 2))) & 7);
        sc[1] = (int)((w >> (6 * (g % 2) + 3)) & 7);
        return;
    }
    }
}

LI_INLINE size_t grid_bytes(const int type) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: return sizeof(block_iq2_xxs);
    case LI_TYPE_IQ2_XS: return sizeof(block_iq2_xs);
    case LI_TYPE_IQ2_S: return sizeof(block_iq2_s);
    case LI_TYPE_IQ3_XXS: return sizeof(block_iq3_xxs);
    case LI_TYPE_IQ3_S: return sizeof(block_iq3_s);
    case LI_TYPE_IQ1_S: return sizeof(block_iq1_s);
    default: return sizeof(block_iq1_m);
    }
}

LI_INLINE float grid_d(const int type, const void *blk) {
    if (type == LI_TYPE_IQ1_M) return f16(iq1_m_d((const block_iq1_m *)blk));
    uint16_t d;
    memcpy(&d, blk, 2); /* every other grid block starts with d */
    return f16(d);
}

LI_INLINE float grid_factor(const int type) {
    return type == LI_TYPE_IQ3_XXS ? 0.25f : type == LI_TYPE_IQ3_S ? 1.0f : 0.125f;
}

LI_INLINE void grid_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                        float *out) {
    const size_t bytes = grid_bytes(type);
    const float f = grid_factor(type);
    float acc[LI_DOT_MAX_NC] = {0};
    for (int64_t i = 0; i < k / QK_K; i++) {
        const void *blk = (const char *)w + (size_t)i * bytes;
        __m256i isum[LI_DOT_MAX_NC];
        for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i m, s;
            int sc[2];
            grid_group(type, blk, g, &m, &s, sc);
            const __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)(2 * sc[1] + 1)),
                                                 _mm_set1_epi16((short)(2 * sc[0] + 1)));
            for (int c = 0; c < nc; c++) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                const __m256i p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(loadu(a->qs + 32 * g), s));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, scv));
            }
        }
        const float d = grid_d(type, blk);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            acc[c] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)hsum_epi32(isum[c])),
                                                _mm_set_ss(d * a->d * f), _mm_set_ss(acc[c])));
        }
    }
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

#define GRID_ENTRY(name, T)                                                                       \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        switch (nc) {                                                                             \
        case 1: grid_dot(LI_TYPE_##T, k, w, x, xs, 1, s); break;                                  \
        case 2: grid_dot(LI_TYPE_##T, k, w, x, xs, 2, s); break;                                  \
        case 3: grid_dot(LI_TYPE_##T, k, w, x, xs, 3, s); break;                                  \
        default: grid_dot(LI_TYPE_##T, k, w, x, xs, 4, s); break;                                 \
        }                                                                                         \
    }
GRID_ENTRY(iq2_xxs, IQ2_XXS)
GRID_ENTRY(iq2_xs, IQ2_XS)
GRID_ENTRY(iq2_s, IQ2_S)
GRID_ENTRY(iq3_xxs, IQ3_XXS)
GRID_ENTRY(iq3_s, IQ3_S)
GRID_ENTRY(iq1_s, IQ1_S)
GRID_ENTRY(iq1_m, IQ1_M)
#undef GRID_ENTRY

/* ---- TQ1_0, TQ2_0: unsigned trits t against Q8_K, minus sum(a) ---- */

/* the 256 trits of a TQ1_0 block, unsigned (t = value + 1); plain loops the
 * compiler vectorizes */
LI_INLINE void tq1_trits(const block_tq1_0 *b, uint8_t t[QK_K]) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int n = 0; n < 5; n++) {
        for (int m = 0; m < 32; m++) t[32 * n + m] = (uint8_t)(((uint16_t)(uint8_t)(b->qs[m] * pow3[n]) * 3) >> 8);
        for (int m = 0; m < 16; m++)
            t[160 + 16 * n + m] = (uint8_t)(((uint16_t)(uint8_t)(b->qs[32 + m] * pow3[n]) * 3) >> 8);
    }
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++) t[240 + 4 * n + j] = (uint8_t)(((uint16_t)(uint8_t)(b->qh[j] * pow3[n]) * 3) >> 8);
}

LI_INLINE int32_t act_sum(const act_q8_K *a) {
    int32_t s = 0;
    for (int g = 0; g < 16; g++) s += a->bsums[g];
    return s;
}

LI_INLINE void tq_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                      float *out) {
    float acc[LI_DOT_MAX_NC] = {0};
    const __m256i ones = _mm256_set1_epi16(1), three = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < k / QK_K; i++) {
        __m256i t[8];
        float d;
        if (type == LI_TYPE_TQ1_0) {
            const block_tq1_0 *b = (const block_tq1_0 *)w + i;
            uint8_t u[QK_K];
            tq1_trits(b, u);
            for (int j = 0; j < 8; j++) t[j] = loadu(u + 32 * j);
            d = f16(b->d);
        } else {
            const block_tq2_0 *b = (const block_tq2_0 *)w + i;
            for (int h = 0; h < 2; h++) {
                const __m256i v = loadu(b->qs + 32 * h);
                t[4 * h] = _mm256_and_si256(v, three);
                t[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), three);
                t[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), three);
                t[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), three);
            }
            d = f16(b->d);
        }
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            __m256i p = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(t[j], loadu(a->qs + 32 * j)));
            /* 8 products of at most 3 * 128 summed per int16 lane: below 2^15 */
            const int32_t isum = hsum_epi32(_mm256_madd_epi16(p, ones)) - act_sum(a);
            acc[c] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)isum), _mm_set_ss(d * a->d * 1.0f),
                                                _mm_set_ss(acc[c])));
        }
    }
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

#define TQ_ENTRY(name, T)                                                                         \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        switch (nc) {                                                                             \
        case 1: tq_dot(LI_TYPE_##T, k, w, x, xs, 1, s); break;                                    \
        case 2: tq_dot(LI_TYPE_##T, k, w, x, xs, 2, s); break;                                    \
        case 3: tq_dot(LI_TYPE_##T, k, w, x, xs, 3, s); break;                                    \
        default: tq_dot(LI_TYPE_##T, k, w, x, xs, 4, s); break;                                   \
        }                                                                                         \
    }
TQ_ENTRY(tq1_0, TQ1_0)
TQ_ENTRY(tq2_0, TQ2_0)
#undef TQ_ENTRY

void li_kernels_fill_avx2_iq(li_kernels *t) {
    for (int e = 0; e < 256; e++) e8m0_half_table[e] = li_e8m0_half((uint8_t)e);
    t->dequant[LI_TYPE_IQ4_NL] = dequant_iq4_nl;
    t->dequant[LI_TYPE_MXFP4] = dequant_mxfp4;
    t->dot[LI_TYPE_IQ4_NL] = dot_iq4_nl;
    t->dot[LI_TYPE_MXFP4] = dot_mxfp4;
    t->dot[LI_TYPE_IQ4_XS] = dot_iq4_xs;
    t->dot_rows[LI_TYPE_IQ4_NL] = dot_rows_iq4_nl;
    t->dot_rows[LI_TYPE_MXFP4] = dot_rows_mxfp4;
    t->dot[LI_TYPE_TQ1_0] = dot_tq1_0;
    t->dot[LI_TYPE_TQ2_0] = dot_tq2_0;
    t->dot[LI_TYPE_IQ2_XXS] = dot_iq2_xxs;
    t->dot[LI_TYPE_IQ2_XS] = dot_iq2_xs;
    t->dot[LI_TYPE_IQ2_S] = dot_iq2_s;
    t->dot[LI_TYPE_IQ3_XXS] = dot_iq3_xxs;
    t->dot[LI_TYPE_IQ3_S] = dot_iq3_s;
    t->dot[LI_TYPE_IQ1_S] = dot_iq1_s;
    t->dot[LI_TYPE_IQ1_M] = dot_iq1_m;
}
#elif defined(LI_ARCH_X86)
void li_kernels_fill_avx2_iq(li_kernels *t) { (void)t; } /* built without the AVX2 flags */
#else
typedef int li_empty_translation_unit;
#endif
