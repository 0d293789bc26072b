/* blocks.h: the block layouts of the GGUF weight types, and of the
 * activation formats that our dot products pair them with.
 *
 * Weight blocks are the on-disk layouts of GGML (the same facts as the gguf
 * package's quants.py); their sizes are asserted here and checked against
 * gguf.GGML_QUANT_SIZES by tests/test_blocks.py. All f16 fields are stored as
 * raw uint16_t bits. Every type size is even, so these structs (alignment 2)
 * can be overlaid on a row of a memory-mapped tensor.
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
LI_STATIC_ASSERT(sizeof(act_q8_0) == 4 + QK8_0, "act_q8_0 size");
LI_STATIC_ASSERT(sizeof(act_q8_1) == 4 + 4 + QK8_0, "act_q8_1 size");
LI_STATIC_ASSERT(sizeof(act_q8_K) == 4 + QK_K + 2 * (QK_K / 16), "act_q8_K size");

#endif
