/* quant_units.h: the block arithmetic of the GPU kernels, written once for
 * the host and the device, so that a host test (tests/cuda_host/) checks on
 * a machine without a GPU exactly the code the kernels run.
 *
 * Every weight type the GPU runs is read in "units" of 32 consecutive values
 * of a row: a 32-element block is one unit, a 256-element K-quant super-block
 * is eight. A unit unpacks to 32 small integers (4 to a 32-bit word, for
 * dp4a) and the affine map that gives the weights back:
 *     w[i] = sc[i / 16] * q[i] + mn
 * (two scales because Q6_K scales groups of 16; the others repeat one). Its
 * dot product with 32 activations quantized to 8 bits (act_q8_1 of blocks.h:
 * x ~= d * qx, s = d * sum(qx)) is then
 *     d * (sc[0] * sum_{i<16} q qx + sc[1] * sum_{i>=16} q qx) + mn * s
 * with integer sums. The block layouts are those of csrc/blocks.h (the facts
 * of ggml's formats); the unpacking follows csrc/kernels/unpack.h.
 *
 * Compiled three ways: by nvcc or hipcc for the device (LI_HD is
 * __host__ __device__), by nvcc for the host, and by a plain C compiler for
 * the host test (LI_HD is static inline). Plain C99 that is also C++.
 */
#ifndef LLMINFER_CUDA_QUANT_UNITS_H
#define LLMINFER_CUDA_QUANT_UNITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../blocks.h"
#include "../common.h"
#include "../llminfer.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define LI_HD static __host__ __device__ __forceinline__
#else
#define LI_HD static inline
#endif

#define LI_UNIT 32 /* values per unit */

typedef struct {
    int32_t q[8];  /* 32 int8 values, 4 per word, little end first */
    float sc[2];   /* scale of values [0, 16) and [16, 32) */
    float mn;      /* added to every value */
} li_unit;

/* ---- f16: the C core's own conversions (common.h), device-callable ---- */

/* round to nearest even at f16 precision: the activation scales are kept so,
 * as the CPU's (and ggml's) are */
LI_HD float li_u_f16_round(float v) { return li_f16_to_f32(li_f32_to_f16(v)); }

LI_HD uint16_t li_u_load16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

LI_HD int32_t li_u_pack4(int a, int b, int c, int d) {
    return (int32_t)((uint32_t)(a & 0xff) | ((uint32_t)(b & 0xff) << 8) | ((uint32_t)(c & 0xff) << 16) |
                     ((uint32_t)(d & 0xff) << 24));
}

/* ---- the types ---- */

/* 1 for the types whose units this file unpacks */
LI_HD int li_u_supported(int type) {
    switch (type) {
    case LI_TYPE_Q4_0:
    case LI_TYPE_Q4_1:
    case LI_TYPE_Q5_0:
    case LI_TYPE_Q5_1:
    case LI_TYPE_Q8_0:
    case LI_TYPE_Q4_K:
    case LI_TYPE_Q5_K:
    case LI_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

LI_HD int li_u_block_bytes(int type) {
    switch (type) {
    case LI_TYPE_Q4_0: return (int)sizeof(block_q4_0);
    case LI_TYPE_Q4_1: return (int)sizeof(block_q4_1);
    case LI_TYPE_Q5_0: return (int)sizeof(block_q5_0);
    case LI_TYPE_Q5_1: return (int)sizeof(block_q5_1);
    case LI_TYPE_Q8_0: return (int)sizeof(block_q8_0);
    case LI_TYPE_Q4_K: return (int)sizeof(block_q4_K);
    case LI_TYPE_Q5_K: return (int)sizeof(block_q5_K);
    case LI_TYPE_Q6_K: return (int)sizeof(block_q6_K);
    default: return 0;
    }
}

/* units in one block of the type */
LI_HD int li_u_per_block(int type) {
    return type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K || type == LI_TYPE_Q6_K ? QK_K / LI_UNIT : 1;
}

/* the 6-bit scale and min of group j (0..7) of a Q4_K / Q5_K block */
LI_HD void li_u_k_scale(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* 32 values of a 32-element block with 4 low bits in qs (element l in the
 * low nibble of qs[l], l + 16 in the high one), a fifth bit from qh (bit l),
 * or none (qh NULL), minus bias */
LI_HD void li_u_nibbles(const uint8_t *qs, const uint8_t *qh, int bias, int32_t q[8]) {
    const uint32_t h = qh ? (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
                                ((uint32_t)qh[3] << 24)
                          : 0u;
    for (int w = 0; w < 8; w++) {
        int v[4];
        for (int i = 0; i < 4; i++) {
            const int l = w * 4 + i;
            const int lo = l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4;
            v[i] = (lo | (int)(((h >> l) & 1u) << 4)) - bias;
        }
        q[w] = li_u_pack4(v[0], v[1], v[2], v[3]);
    }
}

/* Unit j of the block at blk (j < li_u_per_block(type)). */
LI_HD void li_unpack_unit(int type, const uint8_t *blk, int j, li_unit *u) {
    u->mn = 0.0f;
    switch (type) {
    case LI_TYPE_Q4_0:
        u->sc[0] = u->sc[1] = li_f16_to_f32(li_u_load16(blk));
        li_u_nibbles(blk + 2, 0, 8, u->q);
        return;
    case LI_TYPE_Q4_1:
        u->sc[0] = u->sc[1] = li_f16_to_f32(li_u_load16(blk));
        u->mn = li_f16_to_f32(li_u_load16(blk + 2));
        li_u_nibbles(blk + 4, 0, 0, u->q);
        return;
    case LI_TYPE_Q5_0:
        u->sc[0] = u->sc[1] = li_f16_to_f32(li_u_load16(blk));
        li_u_nibbles(blk + 6, blk + 2, 16, u->q);
        return;
    case LI_TYPE_Q5_1:
        u->sc[0] = u->sc[1] = li_f16_to_f32(li_u_load16(blk));
        u->mn = li_f16_to_f32(li_u_load16(blk + 2));
        li_u_nibbles(blk + 8, blk + 4, 0, u->q);
        return;
    case LI_TYPE_Q8_0:
        u->sc[0] = u->sc[1] = li_f16_to_f32(li_u_load16(blk));
        for (int w = 0; w < 8; w++) {
            const uint8_t *p = blk + 2 + 4 * w;
            u->q[w] = (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                                ((uint32_t)p[3] << 24));
        }
        return;
    case LI_TYPE_Q4_K:
    case LI_TYPE_Q5_K: {
        /* d, dmin, scales[12], (qh[32] for Q5_K), qs[128]: group j's element l
         * sits in nibble (j & 1) of qs[32 * (j / 2) + l], its fifth bit in bit j of qh[l] */
        const int five = type == LI_TYPE_Q5_K;
        const float d = li_f16_to_f32(li_u_load16(blk)), dmin = li_f16_to_f32(li_u_load16(blk + 2));
        const uint8_t *qh = blk + 16, *qs = blk + 16 + (five ? QK_K / 8 : 0) + 32 * (j / 2);
        int sc, mn;
        li_u_k_scale(blk + 4, j, &sc, &mn);
        u->sc[0] = u->sc[1] = d * (float)sc;
        u->mn = -dmin * (float)mn;
        const int shift = 4 * (j & 1);
        for (int w = 0; w < 8; w++) {
            int v[4];
            for (int i = 0; i < 4; i++) {
                const int l = w * 4 + i;
                v[i] = ((qs[l] >> shift) & 0xf) | (five ? ((qh[l] >> j) & 1) << 4 : 0);
            }
            u->q[w] = li_u_pack4(v[0], v[1], v[2], v[3]);
        }
        return;
    }
    case LI_TYPE_Q6_K: {
        /* ql[128], qh[64], scales[16] (int8), d: unit j is elements 128h + 32s + l
         * (h = j / 4, s = j % 4), low bits in nibble s / 2 of ql[64h + 32(s & 1) + l],
         * high bits in bits 2s of qh[32h + l], scale scales[8h + 2s + l / 16] */
        const int h = j / 4, s = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (s & 1), *qh = blk + QK_K / 2 + 32 * h;
        const int8_t *scales = (const int8_t *)(blk + QK_K / 2 + QK_K / 4);
        const float d = li_f16_to_f32(li_u_load16(blk + QK_K / 2 + QK_K / 4 + QK_K / 16));
        u->sc[0] = d * (float)scales[8 * h + 2 * s];
        u->sc[1] = d * (float)scales[8 * h + 2 * s + 1];
        const int shift = 4 * (s >> 1);
        for (int w = 0; w < 8; w++) {
            int v[4];
            for (int i = 0; i < 4; i++) {
                const int l = w * 4 + i;
                v[i] = (((ql[l] >> shift) & 0xf) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
            }
            u->q[w] = li_u_pack4(v[0], v[1], v[2], v[3]);
        }
        return;
    }
    default: /* refused when the weights are uploaded (li_u_supported) */
        memset(u, 0, sizeof(*u));
        return;
    }
}

/* ---- activations ---- */

/* 32 floats to act_q8_1, exactly as the CPU's quant_act_q8_1 does it:
 * d = amax / 127 (kept at f16 precision), q = nearest(x * 127 / amax),
 * s = d * sum(q) (f16 precision) */
LI_HD void li_quantize_q8_1(const float *x, act_q8_1 *y) {
    float amax = 0.0f;
    for (int j = 0; j < LI_UNIT; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < LI_UNIT; j++) {
        const int q = (int)rintf(x[j] * id);
        y->qs[j] = (int8_t)q;
        sum += q;
    }
    y->d = li_u_f16_round(d);
    y->s = li_u_f16_round(d * (float)sum);
}

/* c + the dot product of the four signed bytes of a and b */
LI_HD int li_dp4a(int32_t a, int32_t b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(a, b, c);
#else
    /* the host, and HIP (whose sdot4 builtins exist on some targets only) */
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * i)) *
                                     (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * i));
    return c;
#endif
}

/* the dot product of a unit with 32 activations whose values are the words
 * aq[8] (4 int8 each), scale ad and scaled sum as */
LI_HD float li_unit_dot_words(const li_unit *u, const int32_t *aq, float ad, float as) {
    int s0 = 0, s1 = 0;
    for (int w = 0; w < 4; w++) s0 = li_dp4a(u->q[w], aq[w], s0);
    for (int w = 4; w < 8; w++) s1 = li_dp4a(u->q[w], aq[w], s1);
    return ad * (u->sc[0] * (float)s0 + u->sc[1] * (float)s1) + u->mn * as;
}

LI_HD float li_unit_dot(const li_unit *u, const act_q8_1 *a) {
    int32_t aq[8];
    memcpy(aq, a->qs, sizeof(aq));
    return li_unit_dot_words(u, aq, a->d, a->s);
}

/* the 32 weights of a unit as floats */
LI_HD void li_unit_dequant(const li_unit *u, float *out) {
    for (int l = 0; l < LI_UNIT; l++) {
        const int q = (int)(int8_t)(uint8_t)((uint32_t)u->q[l / 4] >> (8 * (l % 4)));
        out[l] = u->sc[l / 16] * (float)q + u->mn;
    }
}

#endif
