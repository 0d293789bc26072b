/* repack.h: weights repacked once at load into interleaved groups of 16 rows.
 *
 * A matrix of a supported type is rewritten, group by group of LI_X16_ROWS
 * rows, so that one 64-byte load holds four consecutive values (or their low
 * nibbles: eight) of each of the 16 rows side by side. With VNNI's vpdpbusd,
 * 32-bit lane r then accumulates row r's exact integer dot product against
 * four activation bytes broadcast to every lane: no horizontal sums, no
 * per-call unpacking into panels (gemm.h), one contiguous stream per group,
 * and the same kernel serves decode (one activation row) and prefill (many).
 *
 * Per row, a kernel does scalar.c's steps to the bit: each block's (or
 * super-block's) exact integer sum, then acc = fma(isum, d * dx, acc) (and
 * fma(-imin, dmin * dx, acc) where there is a min), blocks in order. So a
 * row's result is the same through the repacked path, the dot kernels and
 * the panels, whatever the batch and the thread count.
 *
 * Layouts (v = the stored unsigned value, e = 0..3 the byte in a lane, r the
 * row in the group, "lane r" = bytes 4r..4r+3 of a 64-byte chunk):
 *
 * Q4_0, per block of a group of nb blocks: qs [4 chunks j][16 rows][4], low
 *   nibble of lane r byte e = v[4j+e], high nibble = v[16+4j+e] (v = q + 8,
 *   0..15); then d [16] f16. 288 bytes a block, the group rounded up to 64.
 *   Each block's scales follow its values so that a group, and the groups
 *   after it, are read as one stream in order (x86_avx512_x16.c's
 *   stream_hint); the same holds for the four types below.
 * Q4_1: as Q4_0 with v = q (no offset), then d [16] f16, m [16] f16: 320
 *   bytes a block.
 * Q5_0: per block, Q4_0's 4 chunks of low 4 bits (v = q + 16, 0..31), then a
 *   chunk of fifth bits: bit j of lane r byte e is bit 4 of v[4j+e] (j < 4)
 *   or of v[16+4(j-4)+e] (j >= 4); then d [16] f16. 352 bytes a block (the
 *   file's 22 per block and row).
 * Q5_1: as Q5_0 with v = q, then d and m as Q4_1's: 384 bytes a block.
 * Q8_0: per block, qs [8 chunks j][16][4], byte = q[4j+e] + 128 (unsigned);
 *   then d [16] f16. 544 bytes a block.
 * MXFP4: per block, the level indices laid out as Q4_0's values (4 chunks),
 *   then the 16 rows' E8M0 exponents e [16]: 272 bytes a block (the file's
 *   17 times 16). The AVX-512 kernel looks levels up + 128 (as IQ4_XS's),
 *   and its terms take the offset out as Q8_0's do; the AVX2 one
 *   (x86_avx2_x16.c, whose vpmaddubsw words would overflow at + 128) looks
 *   them up + 12 and takes out terms / 128 * 12. The scale is 2^(e - 128),
 *   as scalar_iq.c's li_e8m0_half.
 * Q4_K, per super-block (2304 bytes, the file's 144 per row times 16):
 *   the sub-blocks' scales and mins in 6 bits (192 bytes): 256 values, sc
 *   [8 sub-blocks][16] then mn [4 pairs p][16][2] (the mins of sub-blocks
 *   2p, 2p+1), stored as Q6_K's values are (below): value i < 192 in bits
 *   0..5 of byte i, bits 2t..2t+1 of value 192 + e in bits 6..7 of byte 64t
 *   + e; d [16] f16; dmin [16] f16; then qs [32 chunks 8i+j][16][4], low
 *   nibble = v[64i+4j+e], high = v[64i+32+4j+e]. The scales come first, so
 *   the kernel reads each super-block in order; one byte per scale (256
 *   bytes, after the values) made the stream 2.8% longer than the file's,
 *   and the 1B Q4_K_M's 2-thread decode on one core's two hyperthreads was
 *   5.2% slower (fresh processes alternating, 5 of 6 pairs).
 * Q5_K, per super-block (2816 bytes, 176 times 16): Q4_K's scales, d and
 *   dmin; then for each pair i of sub-blocks (640 bytes) 2 chunks of fifth
 *   bits (chunk s = 2i + t: bit j of lane r byte e = bit 4 of v[32s + 4j +
 *   e]) and then Q4_K's 8 chunks 8i+j of the low 4 bits, so that the kernel
 *   reads the stream in order (the fifth bits gathered after all the
 *   nibbles made each sub-block pair wait on a load the prefetchers had not
 *   reached: 10 GB/s instead of 20+). One byte per value (Q6_K's way) would
 *   be 45% more to stream per token for two or three fewer instructions per
 *   chunk.
 * Q6_K, per super-block (3392 bytes): for each group g of 16 values, three
 *   chunks P0, P1, P2: byte e of Pt holds v[16g+4t+e] in bits 0..5 and bits
 *   2t..2t+1 of v[16g+12+e] in bits 6..7; v = q + 32, 0..63. Three values
 *   come out with one and each, the fourth with three shifts and three
 *   bitwise steps: 9 vector steps per group against 17 for nibble chunks
 *   and a plane of top bits.
 *   Then sc [16 groups][16] i8; d [16] f16; 32 bytes of padding.
 * IQ4_XS, per super-block (2176 bytes, 136 times 16): the blocks' scales
 *   ls (0..63) [8 blocks][16] in 96 bytes: value i < 64 in bits 0..5 of
 *   byte i; for i >= 64 bits 0..3 in byte 64 + (i - 64) % 32 (the low
 *   nibble for i < 96, else the high) and bits 4..5 in bits 6..7 of byte i
 *   - 64; d [16] f16; then for each of its 8 blocks of 32, 4 chunks of level
 *   indices laid out as Q4_0's values. The kernel looks levels up + 128,
 *   and its terms take the offset out as Q8_0's do (negated: below).
 * A last group with fewer than 16 rows is padded with zero rows. */
#ifndef LLMINFER_REPACK_H
#define LLMINFER_REPACK_H

#include <stddef.h>
#include <stdint.h>

#include "share.h"

struct li_matrix;     /* llminfer.h */
struct li_model_desc; /* llminfer.h */

#define LI_X16_ROWS 16
/* a group's super-block, as laid out above: the repacking writes it, the kernels read it */
#define LI_X16_SB_Q4_K 2304  /* 192 sc and mn + 32 d + 32 dmin, then 2048 values: the file's 144 bytes x 16 */
#define LI_X16_SB_Q5_K 2816  /* Q4_K's scales, then its 2048 nibbles + 512 fifth bits: 176 x 16 */
#define LI_X16_SB_Q6_K 3392  /* 3072 values + 256 sc + 32 d + 32 padding */
#define LI_X16_SB_IQ4_XS 2176 /* 96 scales + 32 d, then 2048 indices: the file's 136 bytes x 16 */
/* most activation rows one kernel call takes */
#define LI_X16_NC 4
/* the least groups a thread takes of its own share at a time in decode,
 * until its last few (li_x16_matmul, li_share_turn's chunk) */
#define LI_X16_NG 4

/* 1 when `type` has a repacked layout */
int li_x16_layout(int type);
/* bytes of one group of 16 rows of k values (a multiple of 64) */
size_t li_x16_group_bytes(int type, int64_t k);
/* groups of a matrix of `rows` rows */
static inline int64_t li_x16_groups(int64_t rows) { return (rows + LI_X16_ROWS - 1) / LI_X16_ROWS; }
/* memory for repacked groups, in 2 MiB pages where the system gives them
 * (see repack.c); freed with li_free_aligned, NULL when out of memory */
void *li_x16_alloc(size_t size);
/* pack groups [g_lo, g_hi) of the matrix src (rows of row_bytes) into dst,
 * which holds all the matrix's groups */
void li_x16_pack(int type, const void *src, size_t row_bytes, int64_t rows, int64_t k, void *dst, int64_t g_lo,
                 int64_t g_hi);

/* y[c * ys + r] = dot(row r of the group, activation row c) for r < nr
 * <= 16, c < nc <= LI_X16_NC; xq: activation rows (stride xs) in the type's
 * activation format; terms: what li_x16_matmul works out from each
 * activation row, per block, row c's after row c-1's: Q4_0, Q5_0, Q8_0,
 * MXFP4: the block's sum times the stored values' offset (8, 16, 128, 128
 * for MXFP4's levels + 128); IQ4_XS: minus 128 times each block of 32's sum (from its Q8_K group sums); Q4_K, Q5_K:
 * the 8 sub-block sums as 4 int16 pairs; Q6_K: minus 32 times each group's
 * sum (16). The last two are negated: the kernels add them (IQ4_XS's, and
 * Q6_K's in prefill, as the start of a sum's chain), with no negation or
 * subtraction. hints: LI_X16_HINT_* flags, the context's prefetch choices
 * for decode (x16_hints in model.c); they change no result. */
typedef void (*li_x16_fn)(const void *group, int64_t k, const void *xq, size_t xs, int nc, const int32_t *terms,
                          float *y, size_t ys, int nr, unsigned hints);

/* How a decode kernel hints its weight stream: LI_X16_HINT_L2 into L2 ahead
 * of its loads (else into L1 as the first line to go: enum li_stream_hint);
 * LI_X16_HINT_NEAR while the team's two threads share one core (the
 * context's placement: probed, or set). Chosen per context, read by the
 * kernels as an argument: never a process-wide value changed mid-pass. */
enum { LI_X16_HINT_L2 = 1u, LI_X16_HINT_NEAR = 2u };

/* Prefill of the super-block types unpacks each group once into
 * LI_X16_UNPACKED(k) bytes and runs the kernel for every 4 activation rows
 * over those: li_x16_unpack_fn writes them (64-byte aligned vals),
 * li_x16u_fn is li_x16_fn reading them. The values (Q5_K, Q6_K, IQ4_XS),
 * 4096 bytes per super-block s, each 64 bytes the 16 rows' 4 values of a
 * chunk as repacked: Q5_K [s][pair i][chunk j][lo: sub-block 2i, hi: 2i +
 * 1] whole values; Q6_K [s][group gi][4 chunks] v = q + 32; IQ4_XS
 * [s][block b][lo 0..3, hi 0..3] levels + 128. Then, from byte 16 k, 256
 * bytes per super-block of scales as bytes (Q4_K, Q5_K: sc [8][16], mn
 * [4][16][2]; IQ4_XS: ls - 32 [8][16] i8): Q4_K's values are read from the
 * group itself. Used from LI_X16_UNPACK_MIN activation rows. */
#define LI_X16_UNPACKED(k) ((size_t)(k) * (LI_X16_ROWS + 1))
#define LI_X16_UNPACK_MIN 8
typedef void (*li_x16_unpack_fn)(const void *group, int64_t k, uint8_t *vals);
typedef void (*li_x16u_fn)(const void *group, const uint8_t *vals, int64_t k, const void *xq, size_t xs, int nc,
                           const int32_t *terms, float *y, size_t ys, int nr);

/* int32s of per-thread scratch li_x16_matmul needs for n activation rows */
size_t li_x16_scratch_ints(int type, int64_t k, int64_t n);
/* y[c, r] = dot(W[r], x[c]) from W's repacked groups, thread ith of nth
 * taking a share of the groups: a fixed one, or with share (share.h; the
 * whole team calls with it) pieces as it goes; scratch: li_x16_scratch_ints
 * of its own */
void li_x16_matmul(int type, const void *packed, int64_t rows, int64_t k, const void *xq, int64_t n, float *y,
                   int64_t y_stride, int32_t *scratch, li_share *share, int ith, int nth, unsigned hints);

/* One product of a joint product (li_x16_matmul's arguments): the
 * products that follow one another with no barrier between them (a
 * layer's q, k and v; gate and up; a MoE layer's experts) shared as one.
 * Shared one by one, each product's end is a place where one thread waits
 * for the other's last group, and each thread's share starts a new stream
 * that its prefetches have not reached: in 2-thread decode on two cores,
 * the 1B Q4_K_M's 512-row k and v read 0.76-0.78 of the bandwidth a plain
 * read reaches, q 0.91, the 8192-row gate and up 0.98. Shared as one, the
 * units are the parts' groups in order, and a thread's share runs on from
 * one part into the next, which li_model_repack places right after it
 * (q, k, v; gate, up; a MoE layer's chosen experts lie apart, and share
 * only the one end). */
typedef struct {
    int type;
    const void *packed;
    int64_t rows, k;
    const void *xq; /* n activation rows in the type's activation format */
    int64_t n;
    float *y;
    int64_t y_stride;
} li_x16_part_desc;

#define LI_X16_MAX_PARTS 32
/* int32s of per-thread scratch li_x16_matmul_parts needs */
size_t li_x16_parts_scratch_ints(const li_x16_part_desc *parts, int np);
/* each part's product as li_x16_matmul gives it, bit for bit whoever
 * computes a group; LI_E_ARG (nothing done) for np outside 1..LI_X16_MAX_PARTS */
int li_x16_matmul_parts(const li_x16_part_desc *parts, int np, int32_t *scratch, li_share *share, int ith, int nth,
                        unsigned hints);

/* Where thread ith of nth starts in the joint product of parts: *p the
 * first group of its share (the fixed share li_x16_matmul_parts starts it
 * on, whether shared or not) and *bytes the rest of that share within the
 * same part, for li_share_sync_ahead; *p NULL, *bytes 0 where it has none */
void li_x16_parts_head(const li_x16_part_desc *parts, int np, int ith, int nth, const void **p, size_t *bytes);

/* part e of a matrix li_model_repack packed in `parts` parts (a MoE
 * layer's experts), as its own packed matrix; NULL when w is not packed */
const void *li_x16_part(const struct li_matrix *w, int parts, int e);

/* After the row [row, row + n) of the matrix [base, base + size) (a clean
 * file mapping) was read: hand back the pages a fault on it may have mapped
 * (the 2 MiB-aligned window around it, within the matrix) */
void li_release_row(const void *base, size_t size, const void *row, size_t n);

/* tok_embd's row at `row` (n bytes, a place in its mapping) into buf from
 * the file li_model_embd_file named: 1 when all n bytes came, else 0 (read
 * the mapping instead) */
int li_embd_read_row(const struct li_model_desc *m, const void *row, size_t n, void *buf);

#endif
