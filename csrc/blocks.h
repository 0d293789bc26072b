/* blocks.h: the block layouts of the GGUF weight types, and of the
 * activation formats that our dot products pair them with.
 *
 * Weight blocks are the on-disk layouts of GGML (the same facts as the gguf
 * package's quants.py); their sizes are asserted here and checked against
 * gguf.GGML_QUANT_SIZES by tests/test_blocks.py. All f16 fields are stored as
 * raw uint16_t bits. Every type size but MXFP4's (17 bytes, a struct of bytes
 * only, alignment 1) is even, so these structs (alignment 2) can be overlaid
 * on a row of a memory-mapped tensor. Fields wider than a byte that a type
 * size would misalign (IQ1_M's scales) are kept as bytes and read with memcpy.
 *
 * Activation blocks (act_q8_0, act_q8_1, act_q8_k) are our own in-memory
 * formats: the same idea as ggml's Q8_0 / Q8_1 / Q8_K but with float scales,
 * since they never reach a file and a float needs no conversion in the hot
 * loop.
 */
#ifndef LLMINFER_BLOCKS_H
#define LLMINFER_BLOCKS_H

#include <stdint.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK4_NL 32
#define QK_MXFP4 32

/* x = d * (q - 8), q in [0, 15]; qs[j] holds element j (low nibble) and j+16 (high) */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

/* x = d * q + m, q in [0, 15] */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;

/* x = d * (q - 16), q in [0, 31]; bit j of qh is bit 4 of element j */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

/* x = d * q + m, q in [0, 31] */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;

/* x = d * q, q in [-127, 127] */
typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0;

/* Super-block of 256: 16 groups of 16, each x = d*(scales&15)*q - dmin*(scales>>4),
 * q in [0, 3]; element 128*h + 32*s + l sits in bits 2s of qs[32*h + l]. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} block_q2_K;

/* 16 groups of 16, x = d * (scale6 - 32) * (q2 - (hbit ? 0 : 4));
 * element 32*b + l has its high bit in bit b of hmask[l]. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} block_q3_K;

/* 8 groups of 32, x = d*sc*q - dmin*m, q in [0, 15], sc and m 6-bit packed in
 * scales[12]; qs[32*c + l] holds element 64*c + l (low) and 64*c + 32 + l (high). */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;

/* As Q4_K with a fifth bit: element 32*b + l has bit 4 in bit b of qh[l]. */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

/* 16 groups of 16, x = d * scales[g] * (q - 32), q in [0, 63]. In half h
 * (elements 128h..128h+127) ql[64h + l] holds element 128h + l (low nibble) and
 * 128h + 64 + l (high); qh[32h + l] bits 2s hold bits 4-5 of element 128h + 32s + l. */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} block_q6_K;

/* ---- non-linear and grid types (the i-quants, ternary, MXFP4) ----
 * Value tables (kvalues, grids, sign patterns) are in kernels/iq_tables.h. */

/* x = d * kvalues_iq4nl[q], q the 4-bit index; nibbles as Q4_0's */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;

/* 8 groups of 32, x = d * (ls - 32) * kvalues_iq4nl[q]; ls 6-bit: low 4 bits
 * in scales_l[g/2] >> 4*(g%2), high 2 in scales_h >> 2g; qs[16g + j] holds
 * element 32g + j (low nibble) and 32g + 16 + j (high) */
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

/* x = 2^(e - 128) * kvalues_mxfp4[q] (E2M1 doubled, so the E8M0 scale is
 * halved); nibbles as Q4_0's */
typedef struct {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
} block_mxfp4;

/* ternary, x = d * (t - 1), t in {0,1,2}: 5 trits a byte in qs (element
 * 32n + m in qs[m] for m < 32, 160 + 16n + m in qs[32 + m]), 4 in qh
 * (element 240 + 4n + j in qh[j]); trit n of byte b is ((b * 3^n mod 256) * 3) >> 8 */
typedef struct {
    uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
    uint8_t qh[QK_K / 64];
    uint16_t d;
} block_tq1_0;

/* ternary, x = d * (t - 1), t = (qs[32h + m] >> 2l) & 3 for element 128h + 32l + m */
typedef struct {
    uint8_t qs[QK_K / 4];
    uint16_t d;
} block_tq2_0;

/* 8 groups of 32 as 4 grid rows of 8: qs[4g..4g+3] as two uint32, the first's
 * bytes index iq2xxs_grid, the second has 4 x 7-bit sign indices (ksigns_iq2xs)
 * and the group's scale s in bits 28-31: x = d * (0.5 + s) / 4 * grid * sign */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];
} block_iq2_xxs;

/* qs[i]: 9-bit iq2xs_grid index and 7-bit sign index for 8 values; scales[g]:
 * two 4-bit scales, one for each 16 of group g of 32: x = d * (0.5 + s) / 4 * grid * sign */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
} block_iq2_xs;

/* qs[0..31]: low 8 bits of 10-bit iq2s_grid indices (2 more in qh[g] >> 2l),
 * qs[32..63]: one sign byte per 8 values; scales as IQ2_XS */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
} block_iq2_s;

/* qs[0..63]: iq3xxs_grid indices (4 values each); qs[64..95]: per group of 32
 * a uint32 of 4 x 7-bit sign indices and the scale s in bits 28-31:
 * x = d * (0.5 + s) / 2 * grid * sign */
typedef struct {
    uint16_t d;
    uint8_t qs[3 * QK_K / 8];
} block_iq3_xxs;

/* 9-bit iq3s_grid indices (low 8 in qs, bit 8 in qh), explicit sign bits, and
 * 4-bit scales per group of 32: x = d * (1 + 2s) * grid * sign */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
} block_iq3_s;

/* 11-bit iq1s_grid indices (low 8 in qs, 3 more in qh[g] >> 3l); qh[g] bits
 * 12-14 the scale s of group g of 32, bit 15 the sign of its delta:
 * x = d * (2s + 1) * (grid +- 1/8) */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
} block_iq1_s;

/* as IQ1_S but a 3-bit scale per 16 values and a delta sign per 8: qh nibble
 * l holds index bits 8-10 of grid row l and its delta sign (bit 3); scales:
 * four uint16 (kept as bytes) with 3-bit scales in bits 0-11 and the f16 d
 * spread over their top nibbles */
typedef struct {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
} block_iq1_m;

/* ---- activation formats (ours, in memory only) ---- */

/* x ~= d * q, for Q4_0 / Q5_0 / Q8_0 weights */
typedef struct {
    float d;
    int8_t qs[QK8_0];
} act_q8_0;

/* x ~= d * q, s = d * sum(q): for weights with a min (Q4_1 / Q5_1) */
typedef struct {
    float d;
    float s;
    int8_t qs[QK8_0];
} act_q8_1;

/* x ~= d * q over 256 values; bsums[g] = sum of q over group g of 16 (K-quants) */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} act_q8_K;

#ifdef __cplusplus /* the GPU sources (csrc/cuda/) are C++ */
#define LI_STATIC_ASSERT(c, msg) static_assert(c, msg)
#else
#define LI_STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#endif
LI_STATIC_ASSERT(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");
LI_STATIC_ASSERT(sizeof(block_q4_1) == 2 + 2 + QK4_1 / 2, "block_q4_1 size");
LI_STATIC_ASSERT(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");
LI_STATIC_ASSERT(sizeof(block_q5_1) == 2 + 2 + 4 + QK5_1 / 2, "block_q5_1 size");
LI_STATIC_ASSERT(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");
LI_STATIC_ASSERT(sizeof(block_q2_K) == 2 + 2 + QK_K / 16 + QK_K / 4, "block_q2_K size");
LI_STATIC_ASSERT(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "block_q3_K size");
LI_STATIC_ASSERT(sizeof(block_q4_K) == 2 + 2 + QK_K / 2 + K_SCALE_SIZE, "block_q4_K size");
LI_STATIC_ASSERT(sizeof(block_q5_K) == 2 + 2 + QK_K / 2 + QK_K / 8 + K_SCALE_SIZE, "block_q5_K size");
LI_STATIC_ASSERT(sizeof(block_q6_K) == 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, "block_q6_K size");
LI_STATIC_ASSERT(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "block_iq4_nl size");
LI_STATIC_ASSERT(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "block_iq4_xs size");
LI_STATIC_ASSERT(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "block_mxfp4 size");
LI_STATIC_ASSERT(sizeof(block_tq1_0) == 2 + 4 * 13, "block_tq1_0 size");
LI_STATIC_ASSERT(sizeof(block_tq2_0) == 2 + 64, "block_tq2_0 size");
LI_STATIC_ASSERT(sizeof(block_iq2_xxs) == 2 + QK_K / 4, "block_iq2_xxs size");
LI_STATIC_ASSERT(sizeof(block_iq2_xs) == 2 + QK_K / 4 + QK_K / 32, "block_iq2_xs size");
LI_STATIC_ASSERT(sizeof(block_iq2_s) == 2 + QK_K / 4 + QK_K / 16, "block_iq2_s size");
LI_STATIC_ASSERT(sizeof(block_iq3_xxs) == 2 + 3 * QK_K / 8, "block_iq3_xxs size");
LI_STATIC_ASSERT(sizeof(block_iq3_s) == 2 + 13 * QK_K / 32 + QK_K / 64, "block_iq3_s size");
LI_STATIC_ASSERT(sizeof(block_iq1_s) == 2 + QK_K / 8 + QK_K / 16, "block_iq1_s size");
LI_STATIC_ASSERT(sizeof(block_iq1_m) == QK_K / 8 + QK_K / 16 + QK_K / 32, "block_iq1_m size");
LI_STATIC_ASSERT(sizeof(act_q8_0) == 4 + QK8_0, "act_q8_0 size");
LI_STATIC_ASSERT(sizeof(act_q8_1) == 4 + 4 + QK8_0, "act_q8_1 size");
LI_STATIC_ASSERT(sizeof(act_q8_K) == 4 + QK_K + 2 * (QK_K / 16), "act_q8_K size");

#endif
