/* quantize.h: float rows to stored weight types (quantize.c). */
#ifndef LLMINFER_QUANTIZE_H
#define LLMINFER_QUANTIZE_H

#include <stdint.h>

/* k floats (a multiple of the type's block size) into k/block blocks at dst */
typedef void (*li_quantize_fn)(const float *src, void *dst, int64_t k);
/* NULL when we cannot quantize to `type` */
li_quantize_fn li_weight_quantizer(int type);

/* quantize_iq.c */
void li_quantize_iq4_nl(const float *src, void *dst, int64_t k);
void li_quantize_iq4_xs(const float *src, void *dst, int64_t k);
void li_quantize_mxfp4(const float *src, void *dst, int64_t k);

#endif
