/* x86_avx512_x16.c: products over weights repacked at load (repack.h), with
 * AVX-512 and VNNI on 512-bit vectors: 16 weight rows in the 16 int32 lanes.
 *
 * Per 64-byte chunk of a group, vpdpbusd multiplies each lane's four
 * unsigned weight bytes by four activation bytes broadcast to all lanes
 * (an embedded-broadcast memory operand) and adds the four products into the
 * lane: row r's exact integer sum builds up in lane r. Offsets of the stored
 * values (Q4_0: q + 8, Q5_0: q + 16, Q8_0: q + 128, Q6_K: q + 32; IQ4_XS's
 * and MXFP4's levels + 128) come out as offset *
 * sum(activation block) in integer; K-quant sub-scales multiply their
 * sub-block sums (vpmulld) before the super-block's sum. The float steps
 * then follow scalar.c for 16 rows at once, blocks in order.
 *
 * Built with the AVX-512 flags (setup.py); dispatch.c reaches it only when
 * cpuid reports them. Without them the file defines an empty filler.
 */
#include "../common.h"
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#include <string.h>

#include "iq_tables.h"
#include "x86_gemm.h" /* UNROLL */

#define NC LI_X16_NC

/* four activation bytes in every 32-bit lane */
LI_INLINE __m512i bc4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc + vpdpbusd(w, the four bytes at p in every lane), the broadcast an
 * embedded memory operand (GCC 12 does not fold _mm512_set1_epi32 into
 * vpdpbusd by itself; a separate vpbroadcastd per product costs decode an
 * instruction in five) */
LI_INLINE __m512i dpb(__m512i acc, __m512i w, const int8_t *p) {
#if defined(__GNUC__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, bc4(p));
#endif
}

/* Decode streams each group from memory once, and the hardware prefetchers
 * alone fall behind a plain read. A hint to L2 PREFETCH_AHEAD bytes on, for
 * the lines at multiples of PREFETCH_STEP in the stream (sparse, and evenly
 * spaced whatever the block size), lets them run ahead. The super-block
 * kernels hint a whole super-block at its start, which already reaches a
 * super-block further, so they lead by less (PREFETCH_AHEAD_K).
 * Measurements: docs/kernel-tuning.md#x16-l2-stream-hints */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 16384
#endif
#ifndef PREFETCH_AHEAD_K
#define PREFETCH_AHEAD_K 8192
#endif
#ifndef PREFETCH_STEP
#define PREFETCH_STEP 1024
#endif
/* an L2 hint for each line of [p, p + bytes) at a multiple of PREFETCH_STEP, `dist` bytes on */
LI_INLINE void ahead(const uint8_t *p, int bytes, const int dist) {
    const uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)bytes;
    for (uintptr_t o = (a + PREFETCH_STEP - 1) & ~(uintptr_t)(PREFETCH_STEP - 1); o < e; o += PREFETCH_STEP)
        _mm_prefetch((const char *)o + dist, _MM_HINT_T1);
}

/* One activation row is read for every group, but a group of a long row
 * (Q6_K at k = 8192: 108 KiB) streams more through L1 than it holds, and the
 * weight lines would evict the activations between one group and the next.
 * A non-temporal hint on each line of a super-block shortly before it is
 * read (already in L2: `ahead`; how far before, in each kernel) fills it
 * into L1 as the first to go, and the activations stay. Only for decode:
 * prefill reuses each group for several activation rows. stream_l1_at hints
 * each line that starts in [p, p + bytes), `lead` bytes on: pieces that
 * tile the stream hint each line once. Measurements:
 * docs/kernel-tuning.md#x16-l1-stream-hints */
LI_INLINE void stream_l1_at(const uint8_t *p, int bytes, int lead, const unsigned hints) {
    const uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)bytes;
    if (hints & LI_X16_HINT_L2) { /* the same lines into L2 (the context's choice; by default on Intel) */
        for (uintptr_t o = (a + 63) & ~(uintptr_t)63; o < e; o += 64) _mm_prefetch((const char *)o + lead, _MM_HINT_T1);
        return;
    }
    for (uintptr_t o = (a + 63) & ~(uintptr_t)63; o < e; o += 64) _mm_prefetch((const char *)o + lead, _MM_HINT_NTA);
}

/* The hints for the block of `bytes` at p in a group of 32-value blocks,
 * whose scales (and mins) follow each block's values (repack.h), so that a
 * group, and the groups after it, are one stream read in order: one line in
 * every PREFETCH_STEP bytes, PREFETCH_AHEAD on. Scales gathered after a
 * group's blocks made several streams, each restarted every group, and the
 * access pattern, not the work, set the pace; one stream in order reads as
 * fast as a plain read.
 *
 * In decode they also take an L1 hint, L1_LEAD_32 bytes on (stream_l1_at):
 * a hint at the block about to be read comes too late and costs
 * instructions; a lead of a few KiB arrives in time, and longer or shorter
 * ones decoded slower. Measurements: docs/kernel-tuning.md#x16-32-value-blocks */
LI_INLINE void stream_hint(const uint8_t *p, int bytes) { ahead(p, bytes, PREFETCH_AHEAD); }

/* Whether a kernel hints its stream into L2 (ahead, stream_hint). In decode
 * (one activation column) the L1 hints (stream_l1_at) lead the loads by a
 * few KiB, and the L2 hints on top cost more than they bring, except while
 * the team's two threads share a core (LI_X16_HINT_NEAR), where each reads at
 * half the pace. Q8_0 and the 5-bit 32-value types lose without them and
 * keep them, and so does a prompt (several columns, no L1 hints).
 * Measurements: docs/kernel-tuning.md#x16-l2-hints-in-decode */
LI_INLINE int l2_hints(int nc, unsigned hints) { return nc > 1 || (hints & LI_X16_HINT_NEAR); }

#define L1_LEAD_32 6144

LI_INLINE __m512i load64(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

/* t in every lane. With several activation columns (prefill), through a
 * general register (a scalar load, then vpbroadcastd from it): there every
 * vpdpbusd reads its activation bytes with a vector load and the weights
 * take more, so the vector loads, not the multiply pipes, set the pace, and
 * a broadcast load is one more of them. IQ4_XS's kernel took its terms this
 * way before they were stored negated (a negation in a register forced it)
 * and keeps it; Q4_K's and Q5_K's mins, few per product, take a broadcast
 * load (a register gained nothing there). Measurements:
 * docs/kernel-tuning.md#x16-term-broadcast */
LI_INLINE __m512i term_bcast(int32_t t) {
#if defined(__GNUC__)
    __asm__("" : "+r"(t));
#endif
    return _mm512_set1_epi32(t);
}

/* 16 f16 at p as floats */
LI_INLINE __m512 f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }

LI_INLINE float act_d(const char *blk) {
    float d;
    memcpy(&d, blk, 4); /* d leads every activation block */
    return d;
}

LI_INLINE void store16(float *y, __m512 v, int nr) {
    if (nr == LI_X16_ROWS)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), v);
}

/* a block of 32 values as 4 chunks of nibbles (Q4_0, Q4_1): lo[j] the low
 * nibbles, hi[j] the high ones left in place, 16 times their values (the
 * sum over them is divided back exactly: see block_sum) */
LI_INLINE void nibbles16(const uint8_t *qs, __m512i lo[4], __m512i hi[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i w = load64(qs + 64 * j);
        lo[j] = _mm512_and_si512(w, m4);
        hi[j] = _mm512_andnot_si512(m4, w);
    }
}

/* The fifth bit of 5-bit values (Q5_0, Q5_1, Q5_K): bit j of each byte of h moved to
 * bit 4 and the rest cleared. A 16-bit shift moves a neighbouring byte's
 * bits only into bits 0..3 (left, by 4 - j <= 4) or 5..7 (right, by
 * j - 4 <= 3), which the mask clears. One bit plane per 32 values keeps the
 * repacked copy at the file's size; the price is a shift, an and and a
 * ternary-logic or per 64 values. */
LI_INLINE __m512i bit4(__m512i h, const int j) {
    const __m512i b = j < 4 ? _mm512_slli_epi16(h, (unsigned)(4 - j)) : j > 4 ? _mm512_srli_epi16(h, (unsigned)(j - 4)) : h;
    return _mm512_and_si512(b, _mm512_set1_epi8(0x10));
}

/* (w & 0x0F) | b in one instruction (0xEA: A & B | C) */
LI_INLINE __m512i or_nibble(__m512i w, __m512i b) {
    return _mm512_ternarylogic_epi32(w, _mm512_set1_epi8(0x0F), b, 0xEA);
}

/* a block of 32 5-bit values as 4 chunks of nibbles and a chunk h of fifth
 * bits (Q5_0, Q5_1): lo[j] values 4j..4j+3, hi[j] values 16+4j..16+4j+3,
 * whole (block_sum's hi_shift 0) */
LI_INLINE void fivebits16(const uint8_t *qs, __m512i lo[4], __m512i hi[4]) {
    const __m512i h = load64(qs + 256);
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i w = load64(qs + 64 * j);
        lo[j] = or_nibble(w, bit4(h, j));
        hi[j] = or_nibble(_mm512_srli_epi16(w, 4), bit4(h, 4 + j));
    }
}

/* a block of Q4_0/Q4_1 (bits 4: nibbles16) or Q5_0/Q5_1 (bits 5: fivebits16) */
LI_INLINE void values16(const uint8_t *qs, __m512i lo[4], __m512i hi[4], const int bits) {
    if (bits == 5)
        fivebits16(qs, lo, hi);
    else
        nibbles16(qs, lo, hi);
}

/* lane r: row r's exact sum over a block of 32 against the activation bytes
 * a: lo[j] holds values 4j..4j+3, hi[j] values 16+4j..16+4j+3 times
 * 2^hi_shift; two chains of four products */
LI_INLINE __m512i block_sum(const __m512i lo[4], const __m512i hi[4], const int8_t *a, const int hi_shift) {
    __m512i s0 = dpb(_mm512_setzero_si512(), lo[0], a);
    __m512i s1 = dpb(_mm512_setzero_si512(), hi[0], a + 16);
    UNROLL for (int j = 1; j < 4; j++) {
        s0 = dpb(s0, lo[j], a + 4 * j);
        s1 = dpb(s1, hi[j], a + 16 + 4 * j);
    }
    return _mm512_add_epi32(s0, hi_shift ? _mm512_srai_epi32(s1, hi_shift) : s1);
}

/* Every kernel takes one group at a time, in order (stream_hint above for
 * the 32-value blocks): groups read side by side make several streams, which
 * read slower than one (docs/kernel-tuning.md#x16-one-group-at-a-time). */

/* lane c: the group's 16 rows against activation row c, to y + c * ys */
LI_INLINE void store_cols(float *y, size_t ys, const __m512 acc[NC], const int nc, int nr) {
    UNROLL for (int c = 0; c < nc; c++) store16(y + (size_t)c * ys, acc[c], nr);
}

/* ---- Q4_0 (bits 4) and Q5_0 (bits 5): per block, 4 chunks of nibbles
 * (256 bytes), for Q5_0 a chunk of fifth bits, then the block's 16 scales ---- */

/* Q4_0's decode hints into L2 (LI_X16_HINT_L2: Intel) lead by half the L1
 * hints' bytes, which Q4_0 decoded faster with on Intel; Q5_0, not measured
 * so, keeps L1_LEAD_32. Measurements: docs/kernel-tuning.md#x16-q4_0-l2-lead */
#define Q4_0_L2_LEAD (L1_LEAD_32 / 2)

LI_INLINE void q4_0_cols(const uint8_t *g, int64_t nb, const char *x, size_t xs, const int nc, const int32_t *terms,
                         float *y, size_t ys, int nr, const int bits, const unsigned hints) {
    const size_t bb = bits == 5 ? 320 : 256, stride = bb + 32; /* a block's values, then its scales */
    const int l2 = bits == 5 || l2_hints(nc, hints);
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = g + (size_t)b * stride, *dd = qs + bb;
        if (l2) stream_hint(qs, (int)stride);
        if (nc == 1)
            stream_l1_at(qs, (int)stride, bits == 4 && (hints & LI_X16_HINT_L2) ? Q4_0_L2_LEAD : L1_LEAD_32, hints);
        __m512i lo[4], hi[4];
        values16(qs, lo, hi, bits);
        const __m512 dw = f16x16(dd);
        UNROLL for (int c = 0; c < nc; c++) {
            const char *blk = x + (size_t)c * xs + (size_t)b * sizeof(act_q8_0);
            const int8_t *a = (const int8_t *)blk + offsetof(act_q8_0, qs);
            const __m512i is =
                _mm512_sub_epi32(block_sum(lo, hi, a, bits == 5 ? 0 : 4), _mm512_set1_epi32(terms[c * nb + b]));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(act_d(blk))), acc[c]);
        }
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- Q4_1 and Q5_1: Q4_0's and Q5_0's layouts without the offset, each block's 16 mins after its scales ---- */

LI_INLINE void q4_1_cols(const uint8_t *g, int64_t nb, const char *x, size_t xs, const int nc, float *y, size_t ys,
                         int nr, const int bits, const unsigned hints) {
    const size_t bb = bits == 5 ? 320 : 256, stride = bb + 64; /* values, scales, mins */
    const int l2 = bits == 5 || l2_hints(nc, hints);
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = g + (size_t)b * stride, *dd = qs + bb, *mm = dd + 32;
        if (l2) stream_hint(qs, (int)stride);
        if (nc == 1) stream_l1_at(qs, (int)stride, L1_LEAD_32, hints);
        __m512i lo[4], hi[4];
        values16(qs, lo, hi, bits);
        const __m512 dw = f16x16(dd), mw = f16x16(mm);
        UNROLL for (int c = 0; c < nc; c++) {
            const char *blk = x + (size_t)c * xs + (size_t)b * sizeof(act_q8_1);
            const int8_t *a = (const int8_t *)blk + offsetof(act_q8_1, qs);
            const __m512i is = block_sum(lo, hi, a, bits == 5 ? 0 : 4);
            float sx;
            memcpy(&sx, blk + offsetof(act_q8_1, s), 4);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(act_d(blk))), acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[c]);
        }
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- MXFP4: per block, 4 chunks of level indices laid out as Q4_0's values
 * (256 bytes), then the block's 16 E8M0 exponents. A level through the table
 * + 128 (nl4_values, as IQ4_XS's), the 128 out as 128 * the block's sum (the
 * terms, as Q8_0's); then scalar_iq.c's acc = fma(isum, d * dx, acc) per
 * block, d = 2^(e - 128). ---- */

/* 4-bit indices into a 16-entry table of signed levels, + 128: lo[j] values
 * 4j.., hi[j] values 16 + 4j.. of the block whose 4 chunks are at p */
LI_INLINE void nl4_values(const uint8_t *p, const int8_t table[16], __m512i lo[4], __m512i hi[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)(const void *)table),
                                                            _mm_set1_epi8((char)0x80)));
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i w = load64(p + 64 * j);
        lo[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(w, m4));
        hi[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(w, 4), m4));
    }
}

/* the 16 E8M0 exponents at p as li_e8m0_half's floats: (e - 1) << 23, or
 * for e < 2 the subnormal 0x00200000 << e */
LI_INLINE __m512 e8m0x16(const uint8_t *p) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, sub));
}

LI_INLINE void mxfp4_cols(const uint8_t *g, int64_t nb, const char *x, size_t xs, const int nc, const int32_t *terms,
                          float *y, size_t ys, int nr, const unsigned hints) {
    const size_t stride = 256 + 16; /* a block's indices, then its exponents */
    const int l2 = l2_hints(nc, hints);
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = g + (size_t)b * stride;
        if (l2) stream_hint(qs, (int)stride);
        if (nc == 1) stream_l1_at(qs, (int)stride, L1_LEAD_32, hints);
        __m512i lo[4], hi[4];
        nl4_values(qs, li_kvalues_mxfp4, lo, hi);
        const __m512 dw = e8m0x16(qs + 256);
        UNROLL for (int c = 0; c < nc; c++) {
            const char *blk = x + (size_t)c * xs + (size_t)b * sizeof(act_q8_0);
            const int8_t *a = (const int8_t *)blk + offsetof(act_q8_0, qs);
            const __m512i is = _mm512_sub_epi32(block_sum(lo, hi, a, 0), _mm512_set1_epi32(terms[c * nb + b]));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(act_d(blk))), acc[c]);
        }
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- Q8_0: per block, 8 chunks of q + 128 (512 bytes), then its 16 scales ---- */

/* Q8_0's decode hints into L2 (LI_X16_HINT_L2: Intel) lead by twice the L1
 * hints' bytes, which Q8_0 decoded faster with on Intel; the other types
 * gained nothing from it and keep L1_LEAD_32. Measurements:
 * docs/kernel-tuning.md#x16-q8_0-l2-lead */
#define Q8_0_L2_LEAD (2 * L1_LEAD_32)

LI_INLINE void q8_0_cols(const uint8_t *g, int64_t nb, const char *x, size_t xs, const int nc, const int32_t *terms,
                         float *y, size_t ys, int nr, const unsigned hints) {
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = g + (size_t)b * (512 + 32), *dd = qs + 512;
        stream_hint(qs, 512 + 32);
        if (nc == 1) stream_l1_at(qs, 512 + 32, (hints & LI_X16_HINT_L2) ? Q8_0_L2_LEAD : L1_LEAD_32, hints);
        const __m512 dw = f16x16(dd);
        UNROLL for (int c = 0; c < nc; c++) {
            const char *blk = x + (size_t)c * xs + (size_t)b * sizeof(act_q8_0);
            const int8_t *a = (const int8_t *)blk + offsetof(act_q8_0, qs);
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            __m512i s2 = _mm512_setzero_si512(), s3 = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 8; j += 4) {
                s0 = dpb(s0, load64(qs + 64 * j), a + 4 * j);
                s1 = dpb(s1, load64(qs + 64 * (j + 1)), a + 4 * j + 4);
                s2 = dpb(s2, load64(qs + 64 * (j + 2)), a + 4 * j + 8);
                s3 = dpb(s3, load64(qs + 64 * (j + 3)), a + 4 * j + 12);
            }
            const __m512i is = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3)),
                                                _mm512_set1_epi32(terms[c * nb + b]));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(act_d(blk))), acc[c]);
        }
    }
    store_cols(y, ys, acc, nc, nr);
}

/* 256 values of 6 bits from three chunks (P0, P1, P2) at p (repack.h: Q6_K's
 * values, Q4_K's and Q5_K's sub-block scales and mins): u[t] = Pt & 0x3F for
 * t < 3; u[3] gathers bits 6..7 of P0, P1, P2 into its bits 0..1, 2..3,
 * 4..5. Each 16-bit shift brings the neighbouring byte's bits only into
 * places the selects or the mask drop: P2 is masked to its bits 6..7
 * before its shift. */
LI_INLINE void six_bits(const uint8_t *p, __m512i u[4]) {
    const __m512i m6 = _mm512_set1_epi8(0x3F);
    const __m512i p0 = load64(p), p1 = load64(p + 64), p2 = load64(p + 128);
    u[0] = _mm512_and_si512(p0, m6);
    u[1] = _mm512_and_si512(p1, m6);
    u[2] = _mm512_and_si512(p2, m6);
    /* 0xE4: c ? a : b, bit by bit */
    const __m512i lo = _mm512_ternarylogic_epi32(_mm512_srli_epi16(p0, 6), _mm512_srli_epi16(p1, 4), _mm512_set1_epi8(0x03), 0xE4);
    u[3] = _mm512_ternarylogic_epi32(lo, _mm512_srli_epi16(_mm512_andnot_si512(m6, p2), 2), _mm512_set1_epi8(0x0F), 0xE4);
}

/* where super-block s of a group of k values keeps its scales as bytes in
 * the unpacked layout, after the values (repack.h) */
LI_INLINE size_t unpacked_scales(int64_t k, int64_t s) { return LI_X16_ROWS * (size_t)k + 256 * (size_t)s; }

/* a super-block's scales as bytes, from the 6-bit form it is stored in, for
 * the kernels' byte loads (a union, so the bytes sit 64-byte aligned) */
typedef union {
    __m512i v[4];
    uint8_t b[256];
} scale_bytes;

/* ---- Q4_K and Q5_K ----
 * Q4_K, per super-block (2304 bytes): sc and mn in 6 bits (192), d, dmin,
 * then 32 chunks of nibbles. Q5_K (2816 bytes): the same scales, then for
 * each pair of sub-blocks 2 chunks of fifth bits and its 8 chunks of
 * nibbles; whole values 0..31. With `five` a constant, each kernel keeps
 * only its own unpacking. */

/* where repack.h's unpacked layouts put super-block s's values: Q5_K's
 * chunk j of pair i (lo, then hi 64 bytes on), Q6_K's group gi (4 chunks),
 * IQ4_XS's block b (lo 0..3, then hi 0..3 256 bytes on) */
LI_INLINE size_t q5_K_unpacked(int64_t s, int i, int j) { return (size_t)s * 4096 + 1024 * (size_t)i + 128 * (size_t)j; }
LI_INLINE size_t q6_K_unpacked(int64_t s, int gi) { return (size_t)s * 4096 + 256 * (size_t)gi; }
LI_INLINE size_t iq4_xs_unpacked(int64_t s, int b) { return (size_t)s * 4096 + 512 * (size_t)b; }

/* Q5_K's values of chunk j of sub-block pair i: lo (sub-block 2i), hi (2i + 1), whole */
LI_INLINE void q5_K_values(const uint8_t *si, const __m512i h0, const __m512i h1, const int j, __m512i *lo, __m512i *hi) {
    const __m512i w = load64(si + 64 * j);
    *lo = or_nibble(w, bit4(h0, j));
    *hi = or_nibble(_mm512_srli_epi16(w, 4), bit4(h1, j));
}

/* unpacked (a constant): read the group's values from vals, as
 * x16_unpack_q5_K left them (Q5_K only), instead of from g. A constant, not
 * `vals != NULL` at run time: with the run-time test GCC kept both ways to
 * the values, with a branch per chunk and registers given to the unused
 * one. Measurements: docs/kernel-tuning.md#x16-unpacked-constant */
LI_INLINE void k45_cols(const uint8_t *g, const int unpacked, const uint8_t *vals, int64_t nb, const char *x, size_t xs, const int nc,
                        const int32_t *terms, float *y, size_t ys, int nr, const int five, const unsigned hints) {
    const int sb_bytes = five ? LI_X16_SB_Q5_K : LI_X16_SB_Q4_K; /* sc and mn 192, d and dmin 64, then the values */
    const int near = (hints & LI_X16_HINT_NEAR) != 0;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nb; s++) {
        const uint8_t *sb = g + (size_t)s * (size_t)sb_bytes;
        /* sc [8 sub-blocks][16], mn [4 pairs][16][2] as bytes: unpacked, from
         * vals (li_x16_unpack_fn left them there once for the group), else
         * worked out here from the super-block's first lines (a super-block
         * ahead decoded slower: docs/kernel-tuning.md#x16-k45). */
        scale_bytes own;
        if (!unpacked) six_bits(sb, own.v);
        const uint8_t *scm = unpacked ? vals + unpacked_scales(nb * QK_K, s) : own.b;
        if (unpacked || l2_hints(nc, hints)) ahead(sb, sb_bytes, PREFETCH_AHEAD_K);
        /* the super-block two on into L1 (in the group, or in the group a
         * share reads next), or the next one while the team's two threads
         * share a core (LI_X16_HINT_NEAR), where each thread goes at half the
         * pace and the same lead in bytes is twice as long in time: nearer,
         * the lines came too late; further ahead decoded slower.
         * IQ4_XS and Q6_K lead by about as many bytes. A quarter of the
         * lines at the start of each pair of sub-blocks (below), not all of
         * them at the super-block's start, spreads the hints through the
         * loads. Measurements: docs/kernel-tuning.md#x16-k45 */
        const int l1_lead = (near ? 1 : 2) * sb_bytes, quarter = sb_bytes / 4;
        const act_q8_K *a[NC];
        UNROLL for (int c = 0; c < nc; c++) a[c] = (const act_q8_K *)(const void *)(x + (size_t)c * xs) + s;
        __m512i isum[NC], imin[NC];
        UNROLL for (int c = 0; c < nc; c++) isum[c] = imin[c] = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            if (nc == 1 && !unpacked) stream_l1_at(sb + i * quarter, i == 3 ? sb_bytes - 3 * quarter : quarter, l1_lead, hints);
            const uint8_t *si = five ? sb + 256 + 640 * i + 128 : sb + 256 + 512 * i; /* the pair's nibble chunks */
            const __m512i h0 = five && !unpacked ? load64(si - 128) : m4, h1 = five && !unpacked ? load64(si - 64) : m4;
            __m512i sa[NC], sbv[NC], sa2[NC], sbv2[NC]; /* odd chunks in chains of their own */
            UNROLL for (int c = 0; c < nc; c++) sa[c] = sbv[c] = sa2[c] = sbv2[c] = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 8; j++) {
                __m512i lo, hi;
                if (unpacked && five) {
                    lo = load64(vals + q5_K_unpacked(s, i, j));
                    hi = load64(vals + q5_K_unpacked(s, i, j) + 64);
                } else if (five) {
                    q5_K_values(si, h0, h1, j, &lo, &hi);
                } else { /* Q4_K: the high nibbles left in place, 16 times their values */
                    const __m512i w = load64(si + 64 * j);
                    lo = _mm512_and_si512(w, m4);
                    hi = _mm512_andnot_si512(m4, w);
                }
                UNROLL for (int c = 0; c < nc; c++) {
                    if (j & 1) {
                        sa2[c] = dpb(sa2[c], lo, a[c]->qs + 64 * i + 4 * j);
                        sbv2[c] = dpb(sbv2[c], hi, a[c]->qs + 64 * i + 32 + 4 * j);
                    } else {
                        sa[c] = dpb(sa[c], lo, a[c]->qs + 64 * i + 4 * j);
                        sbv[c] = dpb(sbv[c], hi, a[c]->qs + 64 * i + 32 + 4 * j);
                    }
                }
            }
            UNROLL for (int c = 0; c < nc; c++) {
                sa[c] = _mm512_add_epi32(sa[c], sa2[c]);
                sbv[c] = _mm512_add_epi32(sbv[c], sbv2[c]);
            }
            const uint8_t *sc = scm + 32 * i;
            const __m512i sc0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)sc));
            const __m512i sc1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sc + 16)));
            UNROLL for (int c = 0; c < nc; c++)
                isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(sa[c], sc0),
                                                                     _mm512_mullo_epi32(five ? sbv[c] : _mm512_srai_epi32(sbv[c], 4), sc1)));
        }
        UNROLL for (int p = 0; p < 4; p++) { /* lane r: mn(2p) * sum(2p) + mn(2p+1) * sum(2p+1) */
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(scm + 128 + 32 * p)));
            UNROLL for (int c = 0; c < nc; c++)
                imin[c] = _mm512_dpwssd_epi32(imin[c], mn, _mm512_set1_epi32(terms[(c * nb + s) * 4 + p]));
        }
        const __m512 dw = f16x16(sb + 192), mw = f16x16(sb + 224);
        UNROLL for (int c = 0; c < nc; c++) {
            const __m512 dx = _mm512_set1_ps(a[c]->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, dx), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin[c]), _mm512_mul_ps(mw, dx), acc[c]);
        }
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- Q6_K: per super-block (3392 bytes) 16 groups of (P0, P1, P2), sc, d ---- */

/* unpacked (a constant): the values from vals, as x16_unpack_q6_K left them */
LI_INLINE void q6_K_cols(const uint8_t *g, const int unpacked, const uint8_t *vals, int64_t nb, const char *x, size_t xs, const int nc,
                         const int32_t *terms, float *y, size_t ys, int nr, const unsigned hints) {
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nb; s++) {
        const uint8_t *sb = g + (size_t)s * LI_X16_SB_Q6_K;
        /* Unlike the other super-block kernels, this one ignores
         * LI_X16_HINT_NEAR: with the team's two threads on one core's
         * hyperthreads it decodes faster as it does apart (no L2 hints, the
         * L1 lead below). Measurements: docs/kernel-tuning.md#x16-q6_k */
        if (unpacked || l2_hints(nc, 0)) ahead(sb, LI_X16_SB_Q6_K, PREFETCH_AHEAD_K);
        /* one and a half super-blocks ahead (k45_cols's lead in bytes),
         * a quarter of the lines every 4 groups (below), as k45_cols spreads
         * them (docs/kernel-tuning.md#x16-q6_k) */
        const int l1_lead = 5088;
        const act_q8_K *a[NC];
        UNROLL for (int c = 0; c < nc; c++) a[c] = (const act_q8_K *)(const void *)(x + (size_t)c * xs) + s;
        __m512i isum[NC];
        UNROLL for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        for (int gi = 0; gi < 16; gi++) {
            if (nc == 1 && !unpacked && (gi & 3) == 0) stream_l1_at(sb + LI_X16_SB_Q6_K / 4 * (gi >> 2), LI_X16_SB_Q6_K / 4, l1_lead, hints);
            __m512i u[4];
            if (unpacked)
                UNROLL for (int t = 0; t < 4; t++) u[t] = load64(vals + q6_K_unpacked(s, gi) + 64 * t);
            else
                six_bits(sb + 192 * gi, u);
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sb + 3072 + 16 * gi)));
            UNROLL for (int c = 0; c < nc; c++) {
                const int8_t *q = a[c]->qs + 16 * gi;
                /* the offset's term (negated): with several columns it starts
                 * the first chain (term_bcast); decode, with one, has fewer
                 * chains to overlap, and a chain that waits for the term's
                 * load runs slower: there it is added after the sum */
                const int32_t term = terms[(c * nb + s) * 16 + gi];
                __m512i t0 = dpb(nc > 1 ? term_bcast(term) : _mm512_setzero_si512(), u[0], q);
                __m512i t1 = dpb(_mm512_setzero_si512(), u[1], q + 4);
                t0 = dpb(t0, u[2], q + 8);
                t1 = dpb(t1, u[3], q + 12);
                __m512i t = _mm512_add_epi32(t0, t1);
                if (nc == 1) t = _mm512_add_epi32(t, _mm512_set1_epi32(term));
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(t, sc));
            }
        }
        const __m512 dw = f16x16(sb + 3328);
        UNROLL for (int c = 0; c < nc; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(a[c]->d)), acc[c]);
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- IQ4_XS: per super-block (2176 bytes) the blocks' scales ls in 6 bits,
 * d, then 8 blocks of 4 chunks of level indices. A level through the
 * table in every 128-bit lane (vpshufb), + 128 to be unsigned; the 128 comes
 * out as 128 * the block's sum. Against Q8_K a block's sum times its scale
 * (vpmulld) adds into the super-block's integer sum, and scalar_iq.c's one
 * acc = fma(isum, d * dx, acc) follows. With Q8_0 activations each block
 * took a conversion, a multiply and an fma, which share the pipes vpdpbusd
 * needs (docs/kernel-tuning.md#x16-iq4_xs). ---- */

/* block b's levels + 128 from its 4 chunks of indices at p: lo[j] values
 * 4j.., hi[j] values 16 + 4j.. */
LI_INLINE void iq4_xs_values(const uint8_t *p, __m512i lo[4], __m512i hi[4]) { nl4_values(p, li_kvalues_iq4nl, lo, hi); }

/* the super-block's 128 block scales ls - 32 (8 blocks of 16 rows) as
 * signed bytes, from the 96 bytes at p (repack.h): blocks 0..3's ls whole
 * in bits 0..5 of the first chunk, bits 4..5 of blocks 4..7's in its bits
 * 6..7, and their bits 0..3 in 32 bytes of nibbles (values 0..31 low, 32..63
 * high) */
LI_INLINE void iq4_xs_scales(const uint8_t *p, __m512i ls[2]) {
    const __m512i p0 = load64(p), m4 = _mm512_set1_epi8(0x0F), b32 = _mm512_set1_epi8(32);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64));
    const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
    /* 0xEA: A & B | C: the nibbles, then bits 6..7 of the first chunk moved to 4..5 */
    const __m512i hi = _mm512_ternarylogic_epi32(qq, m4, _mm512_and_si512(_mm512_srli_epi16(p0, 2), _mm512_set1_epi8(0x30)), 0xEA);
    ls[0] = _mm512_sub_epi8(_mm512_and_si512(p0, _mm512_set1_epi8(0x3F)), b32);
    ls[1] = _mm512_sub_epi8(hi, b32);
}

/* unpacked (a constant): the values from vals, as x16_unpack_iq4_xs left them */
LI_INLINE void iq4_xs_cols(const uint8_t *g, const int unpacked, const uint8_t *vals, int64_t nb, const char *x, size_t xs, const int nc,
                           const int32_t *terms, float *y, size_t ys, int nr, const unsigned hints) {
    const int near = (hints & LI_X16_HINT_NEAR) != 0;
    __m512 acc[NC];
    UNROLL for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nb; s++) {
        const uint8_t *sb = g + (size_t)s * LI_X16_SB_IQ4_XS;
        if (unpacked || l2_hints(nc, hints)) ahead(sb, LI_X16_SB_IQ4_XS, PREFETCH_AHEAD_K);
        /* two ahead, one near, as k45_cols, but all of the lines at the
         * super-block's start: spread as k45_cols spreads them, they were
         * slower here (docs/kernel-tuning.md#x16-iq4_xs) */
        if (nc == 1 && !unpacked) stream_l1_at(sb, LI_X16_SB_IQ4_XS, (near ? 1 : 2) * LI_X16_SB_IQ4_XS, hints);
        scale_bytes lsb; /* ls - 32 [8 blocks][16]: unpacked, from vals */
        if (!unpacked) iq4_xs_scales(sb, lsb.v);
        const uint8_t *ls_at = unpacked ? vals + unpacked_scales(nb * QK_K, s) : lsb.b;
        const act_q8_K *a[NC];
        __m512i isum[NC];
        UNROLL for (int c = 0; c < nc; c++) {
            a[c] = (const act_q8_K *)(const void *)(x + (size_t)c * xs) + s;
            isum[c] = _mm512_setzero_si512();
        }
        for (int b = 0; b < 8; b++) {
            __m512i lo[4], hi[4];
            if (unpacked) {
                UNROLL for (int j = 0; j < 4; j++) {
                    lo[j] = load64(vals + iq4_xs_unpacked(s, b) + 64 * j);
                    hi[j] = load64(vals + iq4_xs_unpacked(s, b) + 256 + 64 * j);
                }
            } else {
                iq4_xs_values(sb + 128 + 256 * b, lo, hi);
            }
            const __m512i ls = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(ls_at + 16 * b)));
            UNROLL for (int c = 0; c < nc; c++) {
                const int8_t *q = a[c]->qs + 32 * b;
                /* sum((level + 128) * a) - 128 * sum(a): the low values in a chain from
                 * -128 * the block's sum, the high ones in a second chain */
                __m512i is = term_bcast(terms[c * nb * 8 + 8 * s + b]), is2 = _mm512_setzero_si512();
                UNROLL for (int j = 0; j < 4; j++) {
                    is = dpb(is, lo[j], q + 4 * j);
                    is2 = dpb(is2, hi[j], q + 16 + 4 * j);
                }
                is = _mm512_add_epi32(is, is2);
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(is, ls));
            }
        }
        const __m512 d = f16x16(sb + 96);
        UNROLL for (int c = 0; c < nc; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(a[c]->d)), acc[c]);
    }
    store_cols(y, ys, acc, nc, nr);
}

/* ---- the table's entries: the lanes (groups x activation rows) as constants ---- */

/* one group against nc activation rows */
#define X16_ENTRY(name, call)                                                                                     \
    static void x16_##name(const void *group, int64_t k, const void *xq, size_t xs, int nc, const int32_t *terms, \
                           float *y, size_t ys, int nr, unsigned hints) {                                         \
        const uint8_t *g = (const uint8_t *)group;                                                                \
        const char *x = (const char *)xq;                                                                         \
        switch (nc) {                                                                                             \
        case 1: call(1); break;                                                                                   \
        case 2: call(2); break;                                                                                   \
        case 3: call(3); break;                                                                                   \
        default: call(4); break;                                                                                  \
        }                                                                                                         \
    }
LI_STATIC_ASSERT(LI_X16_NC == 4, "the entries below take up to 4 activation rows");

#define Q4_0_CALL(n) q4_0_cols(g, k / 32, x, xs, n, terms, y, ys, nr, 4, hints)
#define Q4_1_CALL(n) q4_1_cols(g, k / 32, x, xs, n, y, ys, nr, 4, hints)
#define Q5_0_CALL(n) q4_0_cols(g, k / 32, x, xs, n, terms, y, ys, nr, 5, hints)
#define Q5_1_CALL(n) q4_1_cols(g, k / 32, x, xs, n, y, ys, nr, 5, hints)
#define Q8_0_CALL(n) q8_0_cols(g, k / 32, x, xs, n, terms, y, ys, nr, hints)
#define MXFP4_CALL(n) mxfp4_cols(g, k / 32, x, xs, n, terms, y, ys, nr, hints)
#define Q4_K_CALL(n) k45_cols(g, 0, NULL, k / QK_K, x, xs, n, terms, y, ys, nr, 0, hints)
#define Q5_K_CALL(n) k45_cols(g, 0, NULL, k / QK_K, x, xs, n, terms, y, ys, nr, 1, hints)
#define Q6_K_CALL(n) q6_K_cols(g, 0, NULL, k / QK_K, x, xs, n, terms, y, ys, nr, hints)
#define IQ4_XS_CALL(n) iq4_xs_cols(g, 0, NULL, k / QK_K, x, xs, n, terms, y, ys, nr, hints)
X16_ENTRY(q4_0, Q4_0_CALL)
X16_ENTRY(q4_1, Q4_1_CALL)
X16_ENTRY(q5_0, Q5_0_CALL)
X16_ENTRY(q5_1, Q5_1_CALL)
X16_ENTRY(q8_0, Q8_0_CALL)
X16_ENTRY(mxfp4, MXFP4_CALL)
X16_ENTRY(q4_K, Q4_K_CALL)
X16_ENTRY(q5_K, Q5_K_CALL)
X16_ENTRY(q6_K, Q6_K_CALL)
X16_ENTRY(iq4_xs, IQ4_XS_CALL)

/* ---- prefill over a group's values unpacked once (repack.h's li_x16_unpack_fn) ----
 * A prefill call takes at most LI_X16_NC activation rows, so a group met n
 * rows n / 4 times, and the types whose values take the most work to unpack
 * (Q5_K's fifth bits, Q6_K's two planes, IQ4_XS's level lookups) spent it
 * that often; they unpack once per group instead
 * (docs/kernel-tuning.md#x16-unpack-once). The unpacked values are the same
 * bytes, so the sums are too. */

/* super-block s's scales, nv vectors of bytes, where the unpacked layout keeps them */
LI_INLINE void put_scale_bytes(uint8_t *vals, int64_t k, int64_t s, const __m512i *v, const int nv) {
    UNROLL for (int t = 0; t < nv; t++) _mm512_storeu_si512((void *)(vals + unpacked_scales(k, s) + 64 * t), v[t]);
}

static void x16_unpack_q4_K(const void *group, int64_t k, uint8_t *vals) {
    for (int64_t s = 0; s < k / QK_K; s++) {
        __m512i u[4];
        six_bits((const uint8_t *)group + (size_t)s * LI_X16_SB_Q4_K, u);
        put_scale_bytes(vals, k, s, u, 4);
    }
}

static void x16_unpack_q5_K(const void *group, int64_t k, uint8_t *vals) {
    for (int64_t s = 0; s < k / QK_K; s++) {
        const uint8_t *sb = (const uint8_t *)group + (size_t)s * LI_X16_SB_Q5_K;
        __m512i u[4];
        six_bits(sb, u);
        put_scale_bytes(vals, k, s, u, 4);
        UNROLL for (int i = 0; i < 4; i++) {
            const uint8_t *si = sb + 256 + 640 * i + 128;
            const __m512i h0 = load64(si - 128), h1 = load64(si - 64);
            UNROLL for (int j = 0; j < 8; j++) {
                __m512i lo, hi;
                q5_K_values(si, h0, h1, j, &lo, &hi);
                _mm512_storeu_si512((void *)(vals + q5_K_unpacked(s, i, j)), lo);
                _mm512_storeu_si512((void *)(vals + q5_K_unpacked(s, i, j) + 64), hi);
            }
        }
    }
}

static void x16_unpack_q6_K(const void *group, int64_t k, uint8_t *vals) {
    for (int64_t s = 0; s < k / QK_K; s++) {
        const uint8_t *sb = (const uint8_t *)group + (size_t)s * LI_X16_SB_Q6_K;
        for (int gi = 0; gi < 16; gi++) {
            __m512i u[4];
            six_bits(sb + 192 * gi, u);
            UNROLL for (int t = 0; t < 4; t++) _mm512_storeu_si512((void *)(vals + q6_K_unpacked(s, gi) + 64 * t), u[t]);
        }
    }
}

static void x16_unpack_iq4_xs(const void *group, int64_t k, uint8_t *vals) {
    for (int64_t s = 0; s < k / QK_K; s++) {
        const uint8_t *sb = (const uint8_t *)group + (size_t)s * LI_X16_SB_IQ4_XS;
        __m512i ls[2];
        iq4_xs_scales(sb, ls);
        put_scale_bytes(vals, k, s, ls, 2);
        for (int b = 0; b < 8; b++) {
            __m512i lo[4], hi[4];
            iq4_xs_values(sb + 128 + 256 * b, lo, hi);
            UNROLL for (int j = 0; j < 4; j++) {
                _mm512_storeu_si512((void *)(vals + iq4_xs_unpacked(s, b) + 64 * j), lo[j]);
                _mm512_storeu_si512((void *)(vals + iq4_xs_unpacked(s, b) + 256 + 64 * j), hi[j]);
            }
        }
    }
}

#define UNPACKED_ENTRY(name, call)                                                                                 \
    static void x16u_##name(const void *group, const uint8_t *vals, int64_t k, const void *xq, size_t xs, int nc, \
                            const int32_t *terms, float *y, size_t ys, int nr) {                                   \
        const uint8_t *g = (const uint8_t *)group;                                                                 \
        const char *x = (const char *)xq;                                                                          \
        switch (nc) {                                                                                              \
        case 1: call(1); break;                                                                                    \
        case 2: call(2); break;                                                                                    \
        case 3: call(3); break;                                                                                    \
        default: call(4); break;                                                                                   \
        }                                                                                                          \
    }
#define Q4_K_UCALL(n) k45_cols(g, 1, vals, k / QK_K, x, xs, n, terms, y, ys, nr, 0, 0u)
#define Q5_K_UCALL(n) k45_cols(g, 1, vals, k / QK_K, x, xs, n, terms, y, ys, nr, 1, 0u)
#define Q6_K_UCALL(n) q6_K_cols(g, 1, vals, k / QK_K, x, xs, n, terms, y, ys, nr, 0u)
#define IQ4_XS_UCALL(n) iq4_xs_cols(g, 1, vals, k / QK_K, x, xs, n, terms, y, ys, nr, 0u)
UNPACKED_ENTRY(q4_K, Q4_K_UCALL)
UNPACKED_ENTRY(q5_K, Q5_K_UCALL)
UNPACKED_ENTRY(q6_K, Q6_K_UCALL)
UNPACKED_ENTRY(iq4_xs, IQ4_XS_UCALL)

/* ---- attention over an F16 cache: the weighted sum of value rows ----
 * The AVX2 kernel holds 3 heads x 32 columns and so, with 4 query heads per
 * KV head, converts every value row four times over (two column halves for
 * 3 heads, then again for the fourth) for a 64-wide head. Here 4 heads x 64
 * columns sit in 16 registers and each row is converted once. Each output
 * element is the same fma chain over the rows in order as the AVX2 kernel's,
 * so the results are the same bits. */
static void (*accum_f16_avx2)(const float *p, size_t p_ld, int nh, const uint16_t *v, size_t stride, int64_t n,
                              int64_t d, float *out, size_t out_stride);

LI_INLINE void accum_heads(const float *p, size_t p_ld, const int g, const uint16_t *v, size_t stride, int64_t n,
                           int64_t d, int64_t i0, float *out, size_t out_stride) {
    __m512 acc[4][4];
    UNROLL for (int h = 0; h < g; h++) UNROLL for (int r = 0; r < 4; r++)
        acc[h][r] = _mm512_loadu_ps(out + (size_t)h * out_stride + i0 + 16 * r);
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *vj = v + (size_t)j * stride + i0;
        if (stride != (size_t)d) _mm_prefetch((const char *)(vj + 8 * stride), _MM_HINT_T0);
        __m512 x[4];
        UNROLL for (int r = 0; r < 4; r++) x[r] = f16x16((const uint8_t *)(vj + 16 * r));
        UNROLL for (int h = 0; h < g; h++) {
            const __m512 pj = _mm512_set1_ps(p[(size_t)h * p_ld + (size_t)j]);
            UNROLL for (int r = 0; r < 4; r++) acc[h][r] = _mm512_fmadd_ps(pj, x[r], acc[h][r]);
        }
    }
    UNROLL for (int h = 0; h < g; h++) UNROLL for (int r = 0; r < 4; r++)
        _mm512_storeu_ps(out + (size_t)h * out_stride + i0 + 16 * r, acc[h][r]);
}

static void attn_accum_f16_512(const float *p, size_t p_ld, int nh, const uint16_t *v, size_t stride, int64_t n,
                               int64_t d, float *out, size_t out_stride) {
    if (d % 64 != 0) {
        accum_f16_avx2(p, p_ld, nh, v, stride, n, d, out, out_stride);
        return;
    }
    for (int h0 = 0; h0 < nh; h0 += 4) {
        const int g = LI_MIN(4, nh - h0);
        const float *ph = p + (size_t)h0 * p_ld;
        float *oh = out + (size_t)h0 * out_stride;
        for (int64_t i0 = 0; i0 < d; i0 += 64) switch (g) {
            case 4: accum_heads(ph, p_ld, 4, v, stride, n, d, i0, oh, out_stride); break;
            case 3: accum_heads(ph, p_ld, 3, v, stride, n, d, i0, oh, out_stride); break;
            case 2: accum_heads(ph, p_ld, 2, v, stride, n, d, i0, oh, out_stride); break;
            default: accum_heads(ph, p_ld, 1, v, stride, n, d, i0, oh, out_stride); break;
            }
    }
}

/* the int8 peak: 12 independent vpdpbusd chains (more than latency x
 * throughput), 64 multiply-adds each; returns how many were done */
int64_t li_x16_peak_probe(int64_t iters) {
    __m512i acc[12];
    const __m512i w = _mm512_set1_epi8(3), a = _mm512_set1_epi8(5);
    UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++) {
        UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], w, a);
#if defined(__GNUC__)
        __asm__ volatile("" ::: "memory"); /* keep the loop */
#endif
    }
    __m512i t = acc[0];
    UNROLL for (int j = 1; j < 12; j++) t = _mm512_add_epi32(t, acc[j]);
    volatile int32_t sink = _mm512_reduce_add_epi32(t);
    (void)sink;
    return iters * 12 * 64;
}

void li_x16_fill_avx512(li_kernels *t) {
    t->x16[LI_TYPE_Q4_0] = x16_q4_0;
    t->x16[LI_TYPE_Q4_1] = x16_q4_1;
    t->x16[LI_TYPE_Q5_0] = x16_q5_0;
    t->x16[LI_TYPE_Q5_1] = x16_q5_1;
    t->x16[LI_TYPE_Q8_0] = x16_q8_0;
    t->x16[LI_TYPE_MXFP4] = x16_mxfp4;
    t->x16[LI_TYPE_Q4_K] = x16_q4_K;
    t->x16[LI_TYPE_Q5_K] = x16_q5_K;
    t->x16[LI_TYPE_Q6_K] = x16_q6_K;
    t->x16[LI_TYPE_IQ4_XS] = x16_iq4_xs;
    accum_f16_avx2 = t->attn_accum_f16;
    t->attn_accum_f16 = attn_accum_f16_512;
    t->x16_unpack[LI_TYPE_Q4_K] = x16_unpack_q4_K;
    t->x16u[LI_TYPE_Q4_K] = x16u_q4_K;
    t->x16_unpack[LI_TYPE_Q5_K] = x16_unpack_q5_K;
    t->x16u[LI_TYPE_Q5_K] = x16u_q5_K;
    t->x16_unpack[LI_TYPE_Q6_K] = x16_unpack_q6_K;
    t->x16u[LI_TYPE_Q6_K] = x16u_q6_K;
    t->x16_unpack[LI_TYPE_IQ4_XS] = x16_unpack_iq4_xs;
    t->x16u[LI_TYPE_IQ4_XS] = x16u_iq4_xs;
}
#elif defined(LI_ARCH_X86)
/* built without the AVX-512 flags: no repacked kernels, the dot kernels serve */
void li_x16_fill_avx512(li_kernels *t) { (void)t; }
int64_t li_x16_peak_probe(int64_t iters) {
    (void)iters;
    return 0;
}
#else
typedef int li_empty_translation_unit;
#endif
