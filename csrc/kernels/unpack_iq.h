/* unpack_iq.h: the blocks of the i-quants, ternary types and MXFP4 as small
 * signed integers and their raw scale fields, in plain C (blocks.h says where
 * each bit lives). The scalar kernels (scalar_iq.c), the prefill panels
 * (gemm.c) and the SIMD files' tails are written over these.
 *
 * The grid types come out as q[256] with x = scale(s[g]) * q for group g of
 * 16 values, s[g] the raw scale field of the group (the 32-value groups of
 * IQ2_XXS, IQ3_XXS, IQ3_S and IQ1_S fill two entries). IQ1_S and IQ1_M's
 * values grid +- 1/8 are returned as 8 * grid +- 1, exact integers.
 */
#ifndef LLMINFER_UNPACK_IQ_H
#define LLMINFER_UNPACK_IQ_H

#include <stdint.h>
#include <string.h>

#include "../blocks.h"
#include "iq_tables.h"

static inline uint32_t iq_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t iq_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* 2^(e - 128) as a float: ggml's E8M0 "half" scale (subnormal for e < 2) */
static inline float li_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* 4-bit indices of a 32-value block into a 16-entry table, Q4_0's nibble order */
static inline void unpack_nl4(const uint8_t qs[16], const int8_t table[16], int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = table[qs[j] & 15];
        q[j + 16] = table[qs[j] >> 4];
    }
}

/* IQ4_XS: the 6-bit scale of group g of 32, minus 32 */
static inline int iq4_xs_scale(const block_iq4_xs *b, int g) {
    return (((b->scales_l[g / 2] >> (4 * (g % 2))) & 15) | (((b->scales_h >> (2 * g)) & 3) << 4)) - 32;
}

static inline void unpack_iq4_xs(const block_iq4_xs *b, int8_t q[QK_K]) {
    for (int g = 0; g < 8; g++) unpack_nl4(b->qs + 16 * g, li_kvalues_iq4nl, q + 32 * g);
}

/* ternary: t - 1 in {-1, 0, 1} (TQ2_0's unused code 3 gives 2) */
static inline void unpack_tq1_0(const block_tq1_0 *b, int8_t q[QK_K]) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int n = 0; n < 5; n++) {
        for (int m = 0; m < 32; m++) {
            const uint8_t v = (uint8_t)(b->qs[m] * pow3[n]);
            q[32 * n + m] = (int8_t)((((uint16_t)v * 3) >> 8) - 1);
        }
        for (int m = 0; m < 16; m++) {
            const uint8_t v = (uint8_t)(b->qs[32 + m] * pow3[n]);
            q[160 + 16 * n + m] = (int8_t)((((uint16_t)v * 3) >> 8) - 1);
        }
    }
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++) {
            const uint8_t v = (uint8_t)(b->qh[j] * pow3[n]);
            q[240 + 4 * n + j] = (int8_t)((((uint16_t)v * 3) >> 8) - 1);
        }
}

static inline void unpack_tq2_0(const block_tq2_0 *b, int8_t q[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 4; l++)
            for (int m = 0; m < 32; m++) q[128 * h + 32 * l + m] = (int8_t)(((b->qs[32 * h + m] >> (2 * l)) & 3) - 1);
}

/* 8 grid values with 8 signs (bit j of `signs` negates value j) */
static inline void put_signed8(const uint8_t *grid, uint8_t signs, int8_t *q) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)((signs >> j) & 1 ? -grid[j] : grid[j]);
}

static inline void unpack_iq2_xxs(const block_iq2_xxs *b, int8_t q[QK_K], int s[16]) {
    const uint8_t *p = (const uint8_t *)b->qs;
    for (int g = 0; g < 8; g++) {
        const uint32_t idx = iq_u32(p + 8 * g), aux = iq_u32(p + 8 * g + 4);
        for (int l = 0; l < 4; l++)
            put_signed8(li_iq2xxs_grid[(idx >> (8 * l)) & 255], li_ksigns_iq2xs[(aux >> (7 * l)) & 127],
                        q + 32 * g + 8 * l);
        s[2 * g] = s[2 * g + 1] = (int)(aux >> 28);
    }
}

static inline void unpack_iq2_xs(const block_iq2_xs *b, int8_t q[QK_K], int s[16]) {
    for (int e = 0; e < 32; e++)
        put_signed8(li_iq2xs_grid[b->qs[e] & 511], li_ksigns_iq2xs[b->qs[e] >> 9], q + 8 * e);
    for (int g = 0; g < 16; g++) s[g] = (b->scales[g / 2] >> (4 * (g % 2))) & 15;
}

static inline void unpack_iq2_s(const block_iq2_s *b, int8_t q[QK_K], int s[16]) {
    for (int e = 0; e < 32; e++) {
        const int idx = b->qs[e] | (((b->qh[e / 4] >> (2 * (e % 4))) & 3) << 8);
        put_signed8(li_iq2s_grid[idx], b->qs[32 + e], q + 8 * e);
    }
    for (int g = 0; g < 16; g++) s[g] = (b->scales[g / 2] >> (4 * (g % 2))) & 15;
}

static inline void unpack_iq3_xxs(const block_iq3_xxs *b, int8_t q[QK_K], int s[16]) {
    for (int g = 0; g < 8; g++) {
        const uint32_t aux = iq_u32(b->qs + 64 + 4 * g);
        for (int l = 0; l < 4; l++) {
            uint8_t grid[8];
            memcpy(grid, li_iq3xxs_grid[b->qs[8 * g + 2 * l]], 4);
            memcpy(grid + 4, li_iq3xxs_grid[b->qs[8 * g + 2 * l + 1]], 4);
            put_signed8(grid, li_ksigns_iq2xs[(aux >> (7 * l)) & 127], q + 32 * g + 8 * l);
        }
        s[2 * g] = s[2 * g + 1] = (int)(aux >> 28);
    }
}

static inline void unpack_iq3_s(const block_iq3_s *b, int8_t q[QK_K], int s[16]) {
    for (int i = 0; i < 32; i++) { /* 8 values: grid entries 2i and 2i+1 */
        uint8_t grid[8];
        for (int h = 0; h < 2; h++) {
            const int e = 2 * i + h;
            const int idx = b->qs[e] | (((b->qh[e / 8] >> (e % 8)) & 1) << 8);
            memcpy(grid + 4 * h, li_iq3s_grid[idx], 4);
        }
        put_signed8(grid, b->signs[i], q + 8 * i);
    }
    for (int g = 0; g < 8; g++) s[2 * g] = s[2 * g + 1] = (b->scales[g / 2] >> (4 * (g % 2))) & 15;
}

/* 8 values 8 * grid + (neg ? -1 : 1) */
static inline void put_iq1(const int8_t *grid, int neg, int8_t *q) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * grid[j] + (neg ? -1 : 1));
}

static inline void unpack_iq1_s(const block_iq1_s *b, int8_t q[QK_K], int s[16]) {
    for (int g = 0; g < 8; g++) {
        const unsigned h = b->qh[g];
        for (int l = 0; l < 4; l++)
            put_iq1(li_iq1s_grid[b->qs[4 * g + l] | (((h >> (3 * l)) & 7) << 8)], (h >> 15) & 1, q + 32 * g + 8 * l);
        s[2 * g] = s[2 * g + 1] = (int)((h >> 12) & 7);
    }
}

/* IQ1_M's f16 d, spread over the top nibbles of its four scale words */
static inline uint16_t iq1_m_d(const block_iq1_m *b) {
    uint16_t d = 0;
    for (int i = 0; i < 4; i++) d |= (uint16_t)((iq_u16(b->scales + 2 * i) >> 12) << (4 * i));
    return d;
}

static inline void unpack_iq1_m(const block_iq1_m *b, int8_t q[QK_K], int s[16]) {
    for (int e = 0; e < 32; e++) {
        const int nib = (b->qh[e / 2] >> (4 * (e % 2))) & 15;
        put_iq1(li_iq1s_grid[b->qs[e] | ((nib & 7) << 8)], nib >> 3, q + 8 * e);
    }
    for (int g = 0; g < 16; g++) s[g] = (iq_u16(b->scales + 2 * (g / 4)) >> (3 * (g % 4))) & 7;
}

#endif
