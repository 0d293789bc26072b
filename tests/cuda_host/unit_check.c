/* unit_check.c: drives the GPU's block arithmetic (csrc/cuda/quant_units.h)
 * on the host, for tests/test_cuda_units.py. Built by the test with the C
 * compiler (LI_HD is static inline) and, where nvcc is installed, with nvcc
 * as CUDA C++ (LI_HD is __host__ __device__), so the code the kernels run is
 * checked on a machine without a GPU.
 *
 *   unit_check unpack TYPE IN OUT   IN: whole blocks of TYPE; OUT: float32, each unit dequantized
 *   unit_check quant IN OUT         IN: float32 (a multiple of 32); OUT: act_q8_1 blocks
 *   unit_check dot TYPE K IN ACT OUT  rows of K weights of TYPE . ACT (float32 [K], quantized here)
 * Exit status 0 on success, 2 on bad arguments or files.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/quant_units.h"

static void *read_all(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*size > 0 ? (size_t)*size : 1);
    if (buf && fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static int write_all(const char *path, const void *buf, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const int ok = fwrite(buf, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "unpack")) {
        const int type = atoi(argv[2]), bb = li_u_block_bytes(type), upb = li_u_per_block(type);
        long size = 0;
        const uint8_t *in = (const uint8_t *)read_all(argv[3], &size);
        if (!li_u_supported(type) || !in || size % bb) return 2;
        const long nb = size / bb;
        float *out = (float *)malloc((size_t)(nb * upb * LI_UNIT) * sizeof(float));
        for (long b = 0; b < nb; b++)
            for (int j = 0; j < upb; j++) {
                li_unit u;
                li_unpack_unit(type, in + b * bb, j, &u);
                li_unit_dequant(&u, out + (b * upb + j) * LI_UNIT);
            }
        return write_all(argv[4], out, (size_t)(nb * upb * LI_UNIT) * sizeof(float)) ? 0 : 2;
    }
    if (argc == 4 && !strcmp(argv[1], "quant")) {
        long size = 0;
        const float *in = (const float *)read_all(argv[2], &size);
        if (!in || size % (LI_UNIT * 4)) return 2;
        const long nu = size / (LI_UNIT * 4);
        act_q8_1 *out = (act_q8_1 *)malloc((size_t)nu * sizeof(act_q8_1));
        for (long i = 0; i < nu; i++) li_quantize_q8_1(in + i * LI_UNIT, out + i);
        return write_all(argv[3], out, (size_t)nu * sizeof(act_q8_1)) ? 0 : 2;
    }
    if (argc == 7 && !strcmp(argv[1], "dot")) {
        const int type = atoi(argv[2]), k = atoi(argv[3]);
        const int bb = li_u_block_bytes(type), upb = li_u_per_block(type);
        long wsize = 0, asize = 0;
        const uint8_t *w = (const uint8_t *)read_all(argv[4], &wsize);
        const float *x = (const float *)read_all(argv[5], &asize);
        if (!li_u_supported(type) || !w || !x || k <= 0 || k % (upb * LI_UNIT) || asize != (long)k * 4) return 2;
        const long row = (long)(k / (upb * LI_UNIT)) * bb, units = k / LI_UNIT;
        if (wsize % row) return 2;
        const long rows = wsize / row;
        act_q8_1 *a = (act_q8_1 *)malloc((size_t)units * sizeof(act_q8_1));
        for (long i = 0; i < units; i++) li_quantize_q8_1(x + i * LI_UNIT, a + i);
        float *out = (float *)malloc((size_t)rows * sizeof(float));
        for (long r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (long i = 0; i < units; i++) {
                li_unit u;
                li_unpack_unit(type, w + r * row + (i / upb) * bb, (int)(i % upb), &u);
                acc += li_unit_dot(&u, a + i);
            }
            out[r] = acc;
        }
        return write_all(argv[6], out, (size_t)rows * sizeof(float)) ? 0 : 2;
    }
    fprintf(stderr, "usage: unit_check unpack TYPE IN OUT | quant IN OUT | dot TYPE K W ACT OUT\n");
    return 2;
}
