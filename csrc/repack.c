/* repack.c: the repacked layouts of repack.h (plain C, once per load), the
 * multiply driver over them, and repacking a whole model.
 *
 * Packing goes through the unpackers of unpack.h: each row's blocks become
 * small integers and scales, which are then laid out as the kernels read
 * them, so a layout follows from what the values are, not from where a
 * file's bits happen to sit. */
#define _DEFAULT_SOURCE /* madvise */
#include "repack.h"

#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "common.h"
#include "util.h"
#include "kernels/kernels.h"
#include "kernels/unpack.h"
#include "kernels/unpack_iq.h"

#define G LI_X16_ROWS
#define PACK_CHUNK 64 /* groups packed before their rows' pages go back */

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t li_x16_group_bytes(int type, int64_t k) {
    switch (type) {
    case LI_TYPE_Q4_0: return round64((size_t)(k / 32) * (256 + 32));
    case LI_TYPE_Q4_1: return round64((size_t)(k / 32) * (256 + 64));
    case LI_TYPE_Q5_0: return round64((size_t)(k / 32) * (320 + 32));
    case LI_TYPE_Q5_1: return round64((size_t)(k / 32) * (320 + 64));
    case LI_TYPE_Q8_0: return round64((size_t)(k / 32) * (512 + 32));
    case LI_TYPE_MXFP4: return round64((size_t)(k / 32) * (256 + 16));
    case LI_TYPE_Q4_K: return (size_t)(k / QK_K) * LI_X16_SB_Q4_K;
    case LI_TYPE_Q5_K: return (size_t)(k / QK_K) * LI_X16_SB_Q5_K;
    case LI_TYPE_Q6_K: return (size_t)(k / QK_K) * LI_X16_SB_Q6_K;
    case LI_TYPE_IQ4_XS: return (size_t)(k / QK_K) * LI_X16_SB_IQ4_XS;
    default: return 0;
    }
}

int li_x16_layout(int type) { return li_x16_group_bytes(type, QK_K) != 0; }

/* lane r, byte e of chunk `ch` (64 bytes) */
#define LANE(ch, r, e) ((ch)[4 * (r) + (e)])

/* Q4_0's, Q4_1's, IQ4_XS's and MXFP4's 16 bytes of nibbles are already what a lane
 * wants (byte i: value i low, value i + 16 high): 4 bytes to each chunk */
static inline void put_nibbles16(uint8_t *blk, int r, const uint8_t qs[16]) {
    for (int j = 0; j < 4; j++) memcpy(blk + 64 * j + 4 * r, qs + 4 * j, 4);
}

/* the 16 rows' f16 scale (or min) at p, row r's */
static inline void put_half(uint8_t *p, int r, uint16_t h) { memcpy(p + 2 * r, &h, 2); }

static void pack_q4_0(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_0 *x = (const block_q4_0 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (256 + 32);
        put_nibbles16(blk, r, x->qs); /* v = q + 8: the stored nibble */
        put_half(blk + 256, r, x->d);
    }
}

/* MXFP4: the level indices as Q4_0's values, then the block's 16 E8M0 exponents */
static void pack_mxfp4(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_mxfp4 *x = (const block_mxfp4 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (256 + 16);
        put_nibbles16(blk, r, x->qs);
        blk[256 + r] = x->e;
    }
}

static void pack_q4_1(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_1 *x = (const block_q4_1 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (256 + 64);
        put_nibbles16(blk, r, x->qs);
        put_half(blk + 256, r, x->d);
        put_half(blk + 256 + 32, r, x->m);
    }
}

/* Q5_0's and Q5_1's fifth bits (bit i of qh: value i's) as one chunk after
 * the nibbles: lane r, byte e, bit j the fifth bit of the value whose low 4
 * bits are chunk j's low nibble (j < 4) or chunk j - 4's high nibble */
static inline void put_fifth_bits(uint8_t *chunk, int r, const uint8_t qh[4]) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int e = 0; e < 4; e++) {
        unsigned b = 0;
        for (int j = 0; j < 4; j++) b |= ((h >> (4 * j + e)) & 1) << j | ((h >> (16 + 4 * j + e)) & 1) << (4 + j);
        LANE(chunk, r, e) = (uint8_t)b;
    }
}

static void pack_q5_0(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q5_0 *x = (const block_q5_0 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (320 + 32);
        put_nibbles16(blk, r, x->qs); /* v = q + 16 with the fifth bit */
        put_fifth_bits(blk + 256, r, x->qh);
        put_half(blk + 320, r, x->d);
    }
}

static void pack_q5_1(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q5_1 *x = (const block_q5_1 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (320 + 64);
        put_nibbles16(blk, r, x->qs);
        put_fifth_bits(blk + 256, r, x->qh);
        put_half(blk + 320, r, x->d);
        put_half(blk + 320 + 32, r, x->m);
    }
}

static void pack_q8_0(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q8_0 *x = (const block_q8_0 *)(const void *)row + b;
        uint8_t *blk = g + (size_t)b * (512 + 32);
        for (int j = 0; j < 8; j++) {
            uint32_t v;
            memcpy(&v, x->qs + 4 * j, 4);
            v ^= 0x80808080u; /* q + 128, byte by byte */
            memcpy(blk + 64 * j + 4 * r, &v, 4);
        }
        put_half(blk + 512, r, x->d);
    }
}

/* Value i (0..63) of 256 six-bit values in three chunks at p, as Q6_K's
 * values are (x86_avx512_x16.c's six_bits): bits 0..5 of byte i for i <
 * 192, else bits 2t..2t+1 of it in bits 6..7 of byte 64t + i - 192, t =
 * 0..2. Bytes mix rows' values, so each write keeps the other bits. */
static void put_six(uint8_t *p, int i, unsigned v) {
    if (i < 192) {
        p[i] = (uint8_t)((p[i] & 0xC0) | v);
        return;
    }
    for (int t = 0; t < 3; t++) {
        uint8_t *b = p + 64 * t + (i - 192);
        *b = (uint8_t)((*b & 0x3F) | ((v >> (2 * t)) & 3) << 6);
    }
}

/* Q4_K's and Q5_K's scales at the super-block's start, t: 256 six-bit
 * values (put_six), sc [8 sub-blocks][16] then mn [4 pairs p][16][2] (the
 * mins of sub-blocks 2p, 2p+1), in 192 bytes; d [16] f16; dmin [16] f16 */
static void put_k_scales(uint8_t *t, int r, const uint8_t scales[12], uint16_t d, uint16_t dmin) {
    int sc[8], mn[8];
    unpack_k_scales(scales, sc, mn);
    for (int j = 0; j < 8; j++) {
        put_six(t, 16 * j + r, (unsigned)sc[j]);
        put_six(t, 128 + 32 * (j / 2) + 2 * r + j % 2, (unsigned)mn[j]);
    }
    uint16_t *dd = (uint16_t *)(void *)(t + 192);
    dd[r] = d;
    dd[G + r] = dmin;
}

static void pack_q4_K(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t s = 0; s < nb; s++) {
        const block_q4_K *x = (const block_q4_K *)(const void *)row + s;
        uint8_t *sb = g + (size_t)s * LI_X16_SB_Q4_K;
        /* byte 32i + t of qs holds v[64i + t] low and v[64i + 32 + t] high: chunk 8i + j's lane as it is */
        put_k_scales(sb, r, x->scales, x->d, x->dmin);
        for (int c = 0; c < 32; c++) memcpy(sb + 256 + 64 * c + 4 * r, x->qs + 4 * c, 4);
    }
}

/* Q4_K's nibble chunks with each pair i of sub-blocks led by its two chunks
 * of fifth bits (640 bytes a pair): chunk s = 2i + t, lane r, byte e, bit j
 * is bit 4 of v[32s + 4j + e] (the file's bit s of qh[4j + e]) */
static void pack_q5_K(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t s = 0; s < nb; s++) {
        const block_q5_K *x = (const block_q5_K *)(const void *)row + s;
        uint8_t *sb = g + (size_t)s * LI_X16_SB_Q5_K;
        put_k_scales(sb, r, x->scales, x->d, x->dmin);
        uint8_t *v = sb + 256; /* the pairs */
        for (int c = 0; c < 32; c++) memcpy(v + 640 * (c / 8) + 128 + 64 * (c % 8) + 4 * r, x->qs + 4 * c, 4);
        for (int sub = 0; sub < 8; sub++)
            for (int e = 0; e < 4; e++) {
                unsigned h = 0;
                for (int j = 0; j < 8; j++) h |= (unsigned)((x->qh[4 * j + e] >> sub) & 1) << j;
                LANE(v + 640 * (sub / 2) + 64 * (sub % 2), r, e) = (uint8_t)h;
            }
    }
}

static void pack_q6_K(const char *row, int r, int64_t nb, uint8_t *g) {
    uint8_t u[QK_K]; /* q + 32, 0..63: unpack.h's unpack_q6_K in loops the compiler vectorizes */
    for (int64_t s = 0; s < nb; s++) {
        const block_q6_K *x = (const block_q6_K *)(const void *)row + s;
        uint8_t *sb = g + (size_t)s * LI_X16_SB_Q6_K;
        for (int hh = 0; hh < 2; hh++) {
            const uint8_t *ql = x->ql + 64 * hh, *qh = x->qh + 32 * hh;
            uint8_t *o = u + 128 * hh;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
                o[l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                o[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
        }
        for (int gi = 0; gi < 16; gi++) {
            uint8_t *p = sb + 192 * gi;
            for (int e = 0; e < 4; e++) {
                const int v3 = u[16 * gi + 12 + e];
                for (int t = 0; t < 3; t++) LANE(p + 64 * t, r, e) = (uint8_t)(u[16 * gi + 4 * t + e] | ((v3 >> (2 * t)) & 3) << 6);
            }
            sb[3072 + 16 * gi + r] = (uint8_t)x->scales[gi];
        }
        uint16_t *dd = (uint16_t *)(void *)(sb + 3328);
        dd[r] = x->d;
    }
}

/* IQ4_XS's scale i = 16 b + r (ls, 0..63) of the 128 at p, as
 * x86_avx512_x16.c's iq4_xs_scales reads them: i < 64 in bits 0..5 of byte
 * i; i >= 64 its bits 0..3 in byte 64 + (i - 64) % 32 (the low nibble for
 * i < 96), bits 4..5 in bits 6..7 of byte i - 64. Bytes mix rows' values,
 * so each write keeps the other bits. */
static void put_iq4_xs_scale(uint8_t *p, int i, unsigned v) {
    if (i < 64) {
        p[i] = (uint8_t)((p[i] & 0xC0) | v);
        return;
    }
    uint8_t *nib = p + 64 + (i - 64) % 32;
    *nib = (uint8_t)(i < 96 ? (*nib & 0xF0) | (v & 15) : (*nib & 0x0F) | (v & 15) << 4);
    p[i - 64] = (uint8_t)((p[i - 64] & 0x3F) | (v >> 4) << 6);
}

static void pack_iq4_xs(const char *row, int r, int64_t nb, uint8_t *g) {
    for (int64_t s = 0; s < nb; s++) {
        const block_iq4_xs *x = (const block_iq4_xs *)(const void *)row + s;
        uint8_t *sb = g + (size_t)s * LI_X16_SB_IQ4_XS;
        for (int b = 0; b < 8; b++) {
            /* a block's 16 bytes hold index i in the low nibble and i + 16 in the high, as Q4_0 */
            put_nibbles16(sb + 128 + 256 * b, r, x->qs + 16 * b);
            put_iq4_xs_scale(sb, 16 * b + r, (unsigned)(iq4_xs_scale(x, b) + 32));
        }
        ((uint16_t *)(void *)(sb + 96))[r] = x->d;
    }
}

void li_x16_pack(int type, const void *src, size_t row_bytes, int64_t rows, int64_t k, void *dst, int64_t g_lo,
                 int64_t g_hi) {
    const size_t gb = li_x16_group_bytes(type, k);
    const int64_t nb = type == LI_TYPE_Q4_0 || type == LI_TYPE_Q4_1 || type == LI_TYPE_Q5_0 || type == LI_TYPE_Q5_1 ||
                               type == LI_TYPE_Q8_0 || type == LI_TYPE_MXFP4
                           ? k / 32
                           : k / QK_K;
    for (int64_t gi = g_lo; gi < g_hi; gi++) {
        uint8_t *g = (uint8_t *)dst + (size_t)gi * gb;
        /* every byte but padding is written below; a group cut short gets zero rows */
        if ((gi + 1) * G > rows) memset(g, 0, gb);
        for (int r = 0; r < G && gi * G + r < rows; r++) {
            const char *row = (const char *)src + (size_t)(gi * G + r) * row_bytes;
            switch (type) {
            case LI_TYPE_Q4_0: pack_q4_0(row, r, nb, g); break;
            case LI_TYPE_Q4_1: pack_q4_1(row, r, nb, g); break;
            case LI_TYPE_Q5_0: pack_q5_0(row, r, nb, g); break;
            case LI_TYPE_Q5_1: pack_q5_1(row, r, nb, g); break;
            case LI_TYPE_Q8_0: pack_q8_0(row, r, nb, g); break;
            case LI_TYPE_MXFP4: pack_mxfp4(row, r, nb, g); break;
            case LI_TYPE_Q4_K: pack_q4_K(row, r, nb, g); break;
            case LI_TYPE_Q5_K: pack_q5_K(row, r, nb, g); break;
            case LI_TYPE_Q6_K: pack_q6_K(row, r, nb, g); break;
            case LI_TYPE_IQ4_XS: pack_iq4_xs(row, r, nb, g); break;
            default: break;
            }
        }
    }
}

/* ---- the driver ---- */

int li_x16_available(int type) {
    li_init();
    return type >= 0 && type < LI_TYPE_COUNT && li_x16_layout(type) && li_K->x16[type] != NULL;
}

/* int32s of per-column terms the kernels take from the activations, per block (super-block) */
static int64_t terms_per_block(int type) {
    switch (type) {
    case LI_TYPE_Q4_0: case LI_TYPE_Q5_0: case LI_TYPE_Q8_0: case LI_TYPE_MXFP4: case LI_TYPE_IQ4_XS:
        return 1; /* offset * sum of a block of 32 */
    case LI_TYPE_Q4_K: case LI_TYPE_Q5_K: return 4; /* the sub-block sums, in int16 pairs */
    case LI_TYPE_Q6_K: return 16;                  /* 32 * each group's sum */
    default: return 0;
    }
}

static int64_t blocks_of(int type, int64_t k) {
    return type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K || type == LI_TYPE_Q6_K ? k / QK_K : k / 32;
}

/* the types repack.h gives an unpacked layout, from n activation rows */
static int unpacked_layout(int type, int64_t n) {
    return n >= LI_X16_UNPACK_MIN &&
           (type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K || type == LI_TYPE_Q6_K || type == LI_TYPE_IQ4_XS);
}

/* whether li_x16_matmul unpacks each group once for n activation rows */
static int unpacks(int type, int64_t n) {
    return unpacked_layout(type, n) && li_K->x16_unpack[type] && li_K->x16u[type];
}

/* the terms of activation row a (terms_per_block(type) per block) */
static void act_terms(int type, const char *a, int64_t nb, int32_t *t) {
    for (int64_t b = 0; b < nb; b++) {
        if (type == LI_TYPE_Q4_0 || type == LI_TYPE_Q5_0 || type == LI_TYPE_Q8_0 || type == LI_TYPE_MXFP4) {
            const act_q8_0 *x = (const act_q8_0 *)(const void *)a + b;
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += x->qs[i];
            t[b] = s * (type == LI_TYPE_Q4_0 ? 8 : type == LI_TYPE_Q5_0 ? 16 : 128); /* the stored values' offset (MXFP4: the kernel's levels + 128) */
        } else if (type == LI_TYPE_IQ4_XS) { /* block b of 32: group sums 2 (b % 8) and the next of super-block b / 8 */
            const act_q8_K *x = (const act_q8_K *)(const void *)a + b / 8;
            t[b] = -128 * (x->bsums[2 * (b % 8)] + x->bsums[2 * (b % 8) + 1]); /* negated: the kernel's chain starts there */
        } else if (type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K) {
            const act_q8_K *x = (const act_q8_K *)(const void *)a + b;
            for (int p = 0; p < 4; p++) {
                const int32_t lo = x->bsums[4 * p] + x->bsums[4 * p + 1], hi = x->bsums[4 * p + 2] + x->bsums[4 * p + 3];
                t[4 * b + p] = (int32_t)(((uint32_t)(uint16_t)(int16_t)lo) | ((uint32_t)(uint16_t)(int16_t)hi << 16));
            }
        } else if (type == LI_TYPE_Q6_K) {
            const act_q8_K *x = (const act_q8_K *)(const void *)a + b;
            for (int g = 0; g < 16; g++) t[16 * b + g] = -32 * x->bsums[g]; /* negated, as IQ4_XS's */
        }
    }
}

/* groups [lo, hi) of the product (li_x16_matmul's arguments): terms as
 * act_terms left them for the n rows, vals room for one unpacked group */
static void x16_groups(int type, const void *packed, int64_t rows, int64_t k, const void *xq, int64_t n, float *y,
                       int64_t y_stride, const int32_t *terms, uint8_t *vals, int64_t lo, int64_t hi,
                       unsigned hints) {
    const size_t xs = li_act_row_bytes(li_types[type].act_type, k);
    const size_t gb = li_x16_group_bytes(type, k);
    const int64_t per_col = blocks_of(type, k) * terms_per_block(type);
    const int unpack = unpacks(type, n);
    const int64_t chunks = (n + LI_X16_NC - 1) / LI_X16_NC, groups = li_x16_groups(rows);
    for (int64_t gi = lo; gi < hi; gi++) {
        const int nr = (int)LI_MIN(G, rows - gi * G);
        const char *g = (const char *)packed + (size_t)gi * gb;
        /* Prefill reads a group from memory once, where it is unpacked or
         * in its first column chunk, and the prefetchers alone brought it
         * in at a few GB/s: unpacking Q5_K took 7% of a 1-thread pp512.
         * While one group is worked on, the next is hinted into L2, a share
         * of its lines after each chunk (past hi too: the work sharing
         * usually hands this thread the group after its claim next). */
        const char *next = chunks > 1 && gi + 1 < groups ? g + gb : NULL;
        size_t hinted = 0;
        if (unpack) li_K->x16_unpack[type](g, k, vals);
        for (int64_t c0 = 0; c0 < n; c0 += LI_X16_NC) {
            if (next)
                for (const size_t upto = gb * (size_t)(c0 / LI_X16_NC + 1) / (size_t)chunks; hinted < upto; hinted += 64)
                    li_hint_l2(next + hinted);
            const char *x = (const char *)xq + (size_t)c0 * xs;
            const int nc = (int)LI_MIN(LI_X16_NC, n - c0);
            float *yc = y + c0 * y_stride + gi * G;
            if (unpack)
                li_K->x16u[type](g, vals, k, x, xs, nc, terms + c0 * per_col, yc, (size_t)y_stride, nr);
            else
                li_K->x16[type](g, k, x, xs, nc, terms + c0 * per_col, yc, (size_t)y_stride, nr, hints);
        }
    }
}

/* int32s of one part's terms for its n rows */
static size_t part_terms(const li_x16_part_desc *p) {
    return (size_t)p->n * (size_t)(blocks_of(p->type, p->k) * terms_per_block(p->type));
}

size_t li_x16_parts_scratch_ints(const li_x16_part_desc *parts, int np) {
    size_t terms = 0, vals = 0;
    for (int i = 0; i < np; i++) {
        terms += part_terms(&parts[i]);
        if (unpacked_layout(parts[i].type, parts[i].n))
            vals = LI_MAX(vals, (LI_X16_UNPACKED(parts[i].k) + 64) / sizeof(int32_t)); /* 64-byte aligned */
    }
    return terms + vals;
}

size_t li_x16_scratch_ints(int type, int64_t k, int64_t n) {
    /* room for the unpacked values whatever the level: a context sized under
     * one level may multiply under another */
    const li_x16_part_desc p = {type, NULL, 0, k, NULL, n, NULL, 0};
    return li_x16_parts_scratch_ints(&p, 1);
}

/* units [u0, u1) of the joint product: the parts' groups in order, at[i] the first of part i's */
static void x16_units(const li_x16_part_desc *parts, int np, const int64_t *at, int32_t *const *terms, uint8_t *vals,
                      int64_t u0, int64_t u1, unsigned hints) {
    for (int i = 0; i < np && u0 < u1; i++) {
        if (u0 >= at[i + 1]) continue;
        const int64_t e = LI_MIN(u1, at[i + 1]);
        const li_x16_part_desc *p = &parts[i];
        x16_groups(p->type, p->packed, p->rows, p->k, p->xq, p->n, p->y, p->y_stride, terms[i], vals, u0 - at[i],
                   e - at[i], hints);
        u0 = e;
    }
}

int li_x16_matmul_parts(const li_x16_part_desc *parts, int np, int32_t *scratch, li_share *share, int ith, int nth,
                        unsigned hints) {
    if (np < 1 || np > LI_X16_MAX_PARTS)
        return li_fail(LI_E_ARG, "a joint product of %d parts (1 to %d)", np, LI_X16_MAX_PARTS);
    int32_t *terms[LI_X16_MAX_PARTS];
    int64_t at[LI_X16_MAX_PARTS + 1];
    int32_t *t = scratch;
    int decode = 1;
    at[0] = 0;
    for (int i = 0; i < np; i++) { /* each thread works out the terms it needs: all of them */
        const li_x16_part_desc *p = &parts[i];
        const size_t xs = li_act_row_bytes(li_types[p->type].act_type, p->k);
        const int64_t nb = blocks_of(p->type, p->k), per_col = nb * terms_per_block(p->type);
        terms[i] = t;
        if (per_col > 0)
            for (int64_t c = 0; c < p->n; c++)
                act_terms(p->type, (const char *)p->xq + (size_t)c * xs, nb, t + c * per_col);
        t += part_terms(p);
        at[i + 1] = at[i] + li_x16_groups(p->rows);
        decode &= p->n == 1 && !unpacks(p->type, p->n);
    }
    uint8_t *vals = (uint8_t *)(((uintptr_t)t + 63) & ~(uintptr_t)63);
    const int64_t units = at[np];
    /* a unit of the work sharing is a group; in decode (a group is short
     * work there) a thread takes at least LI_X16_NG of its own at a time
     * until its last few, for fewer claims per product, and then one at a
     * time, so that the other thread waits at most a group at the end */
    if (share && nth > 1 && units <= LI_SHARE_MAX_UNITS) { /* the same test for every thread */
        li_share_turn st;
        int64_t u0, u1;
        li_share_open(share, units, ith, nth, &st);
        if (decode) st.chunk = LI_X16_NG;
        while (li_share_next(share, &st, &u0, &u1)) x16_units(parts, np, at, terms, vals, u0, u1, hints);
        return LI_OK;
    }
    int64_t lo, hi;
    li_split(units, ith, nth, &lo, &hi);
    x16_units(parts, np, at, terms, vals, lo, hi, hints);
    return LI_OK;
}

void li_x16_parts_head(const li_x16_part_desc *parts, int np, int ith, int nth, const void **p, size_t *bytes) {
    int64_t units = 0, lo, hi;
    *p = NULL;
    *bytes = 0;
    for (int i = 0; i < np; i++) units += li_x16_groups(parts[i].rows);
    li_split(units, ith, nth, &lo, &hi);
    for (int i = 0; i < np && lo < hi; i++) { /* lo - at: lo's place in part i */
        const int64_t ng = li_x16_groups(parts[i].rows);
        if (lo < ng) {
            const size_t gb = li_x16_group_bytes(parts[i].type, parts[i].k);
            *p = (const char *)parts[i].packed + (size_t)lo * gb;
            *bytes = (size_t)(LI_MIN(hi, ng) - lo) * gb;
            return;
        }
        lo -= ng;
        hi -= ng;
    }
}

void li_x16_matmul(int type, const void *packed, int64_t rows, int64_t k, const void *xq, int64_t n, float *y,
                   int64_t y_stride, int32_t *scratch, li_share *share, int ith, int nth, unsigned hints) {
    const li_x16_part_desc p = {type, packed, rows, k, xq, n, y, y_stride};
    (void)li_x16_matmul_parts(&p, 1, scratch, share, ith, nth, hints);
}

/* ---- a whole model ---- */

/* The repacked rows are read as a stream once per token: in 2 MiB pages
 * where the system gives them on request (Linux's transparent huge pages in
 * "madvise" mode), a stream costs a TLB walk per 2 MiB instead of per 4 KiB. */
#define HUGE_PAGE ((size_t)2 << 20)
void *li_x16_alloc(size_t size) {
    const size_t align = size >= HUGE_PAGE ? HUGE_PAGE : 64;
    void *p = li_alloc_aligned(size, align); /* whole huge pages: the advice covers only this block */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p && align == HUGE_PAGE) (void)madvise(p, (size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    return p;
}

/* the matrices a forward pass multiplies by (not the embedding, whose rows
 * are looked up), each with the parts it is cut into: a MoE layer's expert
 * tensors hold n_expert matrices one after another, each packed into groups
 * of its own so that an expert's slice (model.c's expert_slice) is whole
 * groups of the packed copy too */
typedef struct {
    li_matrix *w;
    int parts;
} packable;

/* a malloc'd list of them in layers first_layer.. (and the output head), *n
 * long; NULL when out of memory */
static packable *model_matrices(li_model_desc *m, int first_layer, int with_output, int *n) {
    packable *out = malloc(sizeof(*out) * (size_t)(1 + 24 * m->n_layer));
    *n = 0;
    if (!out) return NULL;
    if (with_output) out[(*n)++] = (packable){&m->output, 1};
    for (int il = LI_MAX(first_layer, 0); il < m->n_layer; il++) {
        li_layer_desc *L = (li_layer_desc *)(void *)&m->layers[il];
        li_matrix *ws[] = {&L->wq,      &L->wk,         &L->wv,       &L->wo,         &L->w_gate,
                           &L->w_up,    &L->w_down,     &L->ssm_in,   &L->ssm_z,      &L->ssm_beta,
                           &L->ssm_alpha, &L->ssm_out,  &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                           &L->pe_gate, &L->pe_proj};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            if (ws[i]->data) out[(*n)++] = (packable){ws[i], 1};
        li_matrix *es[] = {&L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_up_exps};
        for (size_t i = 0; i < sizeof(es) / sizeof(es[0]); i++)
            if (es[i]->data && L->router.data && m->n_expert > 0 && es[i]->rows % m->n_expert == 0)
                out[(*n)++] = (packable){es[i], m->n_expert};
    }
    return out;
}

/* bytes of one part's packed groups (rows / parts rows) */
static size_t part_bytes(const li_matrix *w, int parts) {
    return li_x16_group_bytes(w->type, w->k) * (size_t)li_x16_groups(w->rows / parts);
}

/* whether li_model_repack packs p */
static int packs(const packable *p) {
    return !p->w->packed && li_x16_available(p->w->type) && p->w->rows > 0 && li_x16_group_bytes(p->w->type, p->w->k);
}

const void *li_x16_part(const li_matrix *w, int parts, int e) {
    return w->packed ? (const char *)w->packed + (size_t)e * part_bytes(w, parts) : NULL;
}

/* Hand the pages of [p, p + n) back to the file: they are clean, and the
 * kernel reads them again from the page cache if anything touches them. */
static void release_pages(const void *p, size_t n) {
#if defined(__unix__) || defined(__APPLE__)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)p;
    (void)n;
#endif
}

/* A fault on a mapped file maps more than its page: the cached pages around
 * it (fault_around_bytes, 64 KiB) and, since Linux 6.12, the whole large
 * folio readahead put it in, up to the 2 MiB around it (a folio is mapped
 * only within one PMD). So each embedding lookup left up to 16 pages
 * resident, 26-38 MB after a 512-token prompt, and more from a cold page
 * cache. MADV_RANDOM does not stop that (kernel 6.18); handing back the
 * 2 MiB-aligned window after the row is read does. Only pages wholly inside
 * the matrix are touched, so nothing else in the mapping is affected. */
#define RELEASE_WINDOW ((uintptr_t)2 << 20)
void li_release_row(const void *matrix, size_t size, const void *row, size_t n) {
    const uintptr_t base = (uintptr_t)matrix;
    uintptr_t lo = (uintptr_t)row & ~(RELEASE_WINDOW - 1), hi = ((uintptr_t)row + n + RELEASE_WINDOW - 1) & ~(RELEASE_WINDOW - 1);
    lo = lo < base ? base : lo;
    hi = hi > base + size ? base + size : hi;
    release_pages((const void *)lo, hi - lo); /* its whole pages: none outside the matrix */
}

/* Each lookup through the mapping faults its row in and hands the window
 * back with madvise, which on a multi-threaded process also flushes the
 * other threads' TLBs: an interrupt to each core the team runs on, a VM
 * exit on a virtual machine. Reading the row with pread touches neither:
 * SmolLM2's 2-thread decode went from 281 to 297 tokens/s (tg128,
 * alternating builds; with the release merely skipped, 298 to 310; the 1B
 * model's within noise). */
int li_model_embd_file(li_model_desc *m, int fd, int64_t offset) {
    if (!m) return li_fail(LI_E_ARG, "no model description");
    if (fd < 0 || offset < 0) return li_fail(LI_E_ARG, "file descriptor %d and offset %lld must not be negative", fd, (long long)offset);
#if defined(__unix__) || defined(__APPLE__)
    m->embd_fd = fd;
    m->embd_offset = offset;
    m->embd_file = 1;
#endif
    return LI_OK;
}

int li_embd_read_row(const li_model_desc *m, const void *row, size_t n, void *buf) {
#if defined(__unix__) || defined(__APPLE__)
    if (!m->embd_file) return 0;
    const char *base = (const char *)m->tok_embd.data, *r = (const char *)row;
    if (r < base || (size_t)(r - base) + n > m->tok_embd.nbytes) return 0;
    const int64_t at64 = m->embd_offset + (int64_t)(r - base), off_max = sizeof(off_t) >= 8 ? INT64_MAX : INT32_MAX;
    if (at64 > off_max - (int64_t)n) return 0; /* beyond a 32-bit off_t */
    const off_t at = (off_t)at64;
    size_t got = 0;
    while (got < n) {
        const ssize_t k = pread(m->embd_fd, (char *)buf + got, n - got, at + (off_t)got);
        if (k > 0)
            got += (size_t)k;
        else if (k < 0 && errno == EINTR)
            continue;
        else
            return 0; /* an error, or the file ends early (truncated: the caller's check names it) */
    }
    return 1;
#else
    (void)m, (void)row, (void)n, (void)buf;
    return 0;
#endif
}

size_t li_model_repack_size(li_model_desc *m, int first_layer, int with_output) {
    li_init();
    if (!m || !m->layers || m->n_layer <= 0) return 0;
    int n;
    packable *ms = model_matrices(m, first_layer, with_output, &n);
    size_t total = 0;
    for (int i = 0; ms && i < n; i++)
        if (packs(&ms[i])) total += round64(part_bytes(ms[i].w, ms[i].parts) * (size_t)ms[i].parts);
    free(ms);
    return total;
}

int li_model_repack(li_model_desc *m, int first_layer, int with_output, int n_threads, int release,
                    size_t *bytes) {
    li_init();
    if (bytes) *bytes = 0;
    if (!m || !m->layers || m->n_layer <= 0) return li_fail(LI_E_ARG, "no model description to repack");
    if (m->packed_arena) return LI_OK; /* repacked already */
    int n;
    packable *ms = model_matrices(m, first_layer, with_output, &n);
    if (!ms) return li_fail(LI_E_NOMEM, "out of memory repacking the model");
    /* One block for all of them, each matrix 64-byte aligned in it: 2 MiB
     * pages per matrix would round every small one (a 1B model's k and v)
     * up to whole pages, 150 MB of a 1B model's resident memory. Untouched
     * pages cost nothing, so the peak still holds one matrix twice, not the
     * model: each is packed, then its file pages handed back. */
    const size_t total = li_model_repack_size(m, first_layer, with_output);
    uint8_t *arena = total ? li_x16_alloc(total) : NULL;
    size_t off = 0;
    (void)n_threads; /* without OpenMP */
    for (int i = 0; arena && i < n; i++) {
        if (!packs(&ms[i])) continue;
        li_matrix *w = ms[i].w;
        const int parts = ms[i].parts;
        const size_t pb = part_bytes(w, parts);
        uint8_t *dst = arena + off;
        off += round64(pb * (size_t)parts);
        const size_t row = w->nbytes / (size_t)w->rows;
        const int64_t rows = w->rows / parts, ng = li_x16_groups(rows);
        for (int e = 0; e < parts; e++) {
            const char *src = (const char *)w->data + (size_t)e * (size_t)rows * row;
            uint8_t *pd = dst + (size_t)e * pb;
            /* a chunk of groups at a time, its rows' pages handed back once it
             * is packed: the peak holds one chunk twice, not the matrix (Gemma 3
             * 270M's tied 178 MB head made the load peak 107 MB above the rest) */
            for (int64_t c0 = 0; c0 < ng; c0 += PACK_CHUNK) {
                const int64_t c1 = LI_MIN(ng, c0 + PACK_CHUNK);
                int64_t g;
#ifdef _OPENMP
#pragma omp parallel for num_threads(n_threads > 0 ? n_threads : 1) schedule(dynamic, 4)
#endif
                for (g = c0; g < c1; g++) li_x16_pack(w->type, src, row, rows, w->k, pd, g, g + 1);
                if (release) {
                    const size_t r0 = (size_t)c0 * G * row, r1 = LI_MIN((size_t)c1 * G, (size_t)rows) * row;
                    release_pages(src + r0, r1 - r0);
                }
            }
        }
        w->packed = dst;
        if (bytes) *bytes += pb * (size_t)parts;
        /* the pages the chunks shared; a tied output's too: the embedding
         * lookups fault back in only the rows they read */
        if (release) release_pages(w->data, w->nbytes);
    }
    m->packed_arena = arena;
    /* the lookups may hand their rows back unless the CPU's head reads the
     * embedding's own rows every token */
    m->embd_release = release && (m->output.data != m->tok_embd.data || m->output.packed != NULL || !with_output);
    free(ms);
    return LI_OK; /* no memory for the block: the matrices keep the dot kernels, results unchanged */
}

void li_model_unpack(li_model_desc *m) {
    if (!m || !m->layers || m->n_layer <= 0) return;
    int n;
    packable *ms = model_matrices(m, 0, 1, &n);
    if (!ms) return;
    for (int i = 0; i < n; i++) ms[i].w->packed = NULL;
    free(ms);
    li_free_aligned(m->packed_arena);
    m->packed_arena = NULL;
    m->embd_release = 0;
}
