/* unpack.h: each weight block as small integers and its scales, in plain C.
 * One function per layout (blocks.h says where each bit lives); the scalar
 * kernels and the prefill panel packing (gemm.c) are written over these. */
#ifndef LLMINFER_UNPACK_H
#define LLMINFER_UNPACK_H

#include <stdint.h>

#include "../blocks.h"

static inline void unpack_q4_0(const block_q4_0 *b, int8_t q[QK4_0]) {
    for (int j = 0; j < QK4_0 / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 15) - 8);
        q[j + QK4_0 / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

static inline void unpack_q4_1(const block_q4_1 *b, int8_t q[QK4_1]) {
    for (int j = 0; j < QK4_1 / 2; j++) {
        q[j] = (int8_t)(b->qs[j] & 15);
        q[j + QK4_1 / 2] = (int8_t)(b->qs[j] >> 4);
    }
}

/* the 5-bit values, unsigned, shared by Q5_0 and Q5_1 */
static inline void unpack_5bit(const uint8_t qh[4], const uint8_t qs[16], int8_t q[32]) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                       (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
        q[j + 16] = (int8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}

/* Q2_K: q in [0,3]; sc[g], mn[g] the 4-bit scale and min of group g of 16 */
static inline void unpack_q2_K(const block_q2_K *b, int8_t q[QK_K], int sc[16], int mn[16]) {
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * s + l] = (int8_t)((b->qs[32 * h + l] >> (2 * s)) & 3);
    for (int g = 0; g < 16; g++) {
        sc[g] = b->scales[g] & 15;
        mn[g] = b->scales[g] >> 4;
    }
}

/* Q3_K: q in [-4,3]; sc[g] the signed 6-bit scale of group g of 16 */
static inline void unpack_q3_K(const block_q3_K *b, int8_t q[QK_K], int sc[16]) {
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) {
                const int i = 128 * h + 32 * s + l;
                const int lo = (b->qs[32 * h + l] >> (2 * s)) & 3;
                const int hi = (b->hmask[l] >> (i / 32)) & 1;
                q[i] = (int8_t)(lo - (hi ? 0 : 4));
            }
    /* low 4 bits: bytes 0-7 (two groups a byte), high 2 bits: bytes 8-11 */
    for (int g = 0; g < 16; g++) {
        const int lo = (b->scales[g % 8] >> (4 * (g / 8))) & 15;
        const int hi = (b->scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (lo | hi << 4) - 32;
    }
}

/* the 6-bit scales and mins of Q4_K and Q5_K (8 groups of 32) */
static inline void unpack_k_scales(const uint8_t s[K_SCALE_SIZE], int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4;
        mn[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
}

static inline void unpack_q4_K(const block_q4_K *b, int8_t q[QK_K], int sc[8], int mn[8]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(b->qs[32 * c + l] & 15);
            q[64 * c + 32 + l] = (int8_t)(b->qs[32 * c + l] >> 4);
        }
    unpack_k_scales(b->scales, sc, mn);
}

static inline void unpack_q5_K(const block_q5_K *b, int8_t q[QK_K], int sc[8], int mn[8]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int i0 = 64 * c + l, i1 = 64 * c + 32 + l;
            q[i0] = (int8_t)((b->qs[32 * c + l] & 15) | ((b->qh[l] >> (i0 / 32)) & 1) << 4);
            q[i1] = (int8_t)((b->qs[32 * c + l] >> 4) | ((b->qh[l] >> (i1 / 32)) & 1) << 4);
        }
    unpack_k_scales(b->scales, sc, mn);
}

/* Q6_K: q in [-32, 31]; scales are the block's int8 scales */
static inline void unpack_q6_K(const block_q6_K *b, int8_t q[QK_K]) {
    /* each half: 4 runs of 32 with constant shifts (value 32s + l of the
     * half: ql[l + 32 (s & 1)] >> 4 (s / 2), bit pair s of qh[l]), which the
     * compiler vectorizes; the prefill panel packing runs on it */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

#endif
