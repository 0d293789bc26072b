/* iq_tables.h: the value tables of the i-quants, IQ4_NL/IQ4_XS and MXFP4
 * (iq_tables.c, generated from the gguf package by tools/gen_iq_tables.py). */
#ifndef LLMINFER_IQ_TABLES_H
#define LLMINFER_IQ_TABLES_H

#include <stdint.h>

extern const int8_t li_kvalues_iq4nl[16];  /* IQ4_NL, IQ4_XS levels */
extern const int8_t li_kvalues_mxfp4[16];  /* E2M1 values doubled */
extern const uint8_t li_ksigns_iq2xs[128]; /* 7 sign bits -> 8 with even parity */
extern const int8_t li_sign_bytes[256][8]; /* bit j of the index -> element j is -1, else +1 */
extern const uint8_t li_iq2xxs_grid[256][8];
extern const uint8_t li_iq2xs_grid[512][8];
extern const uint8_t li_iq2s_grid[1024][8];
extern const uint8_t li_iq3xxs_grid[256][4];
extern const uint8_t li_iq3s_grid[512][4];
extern const int8_t li_iq1s_grid[2048][8]; /* -1, 0, 1 */

#endif
