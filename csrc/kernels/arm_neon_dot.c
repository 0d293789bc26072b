/* arm_neon_dot.c: the NEON table with its integer dot products done by SDOT
 * (FEAT_DotProd: Cortex-A55/A76 and later, Neoverse, Apple M1 and later).
 * Built with -march=armv8.2-a+dotprod (setup.py); reached only after
 * dispatch.c has seen the CPU report it (HWCAP_ASIMDDP, sysctl, ...).
 *
 * Everything but the quantized dot products comes from arm_neon.c; those are
 * arm_neon_quants.h compiled again here over SDOT, each instruction adding
 * four byte products into each int32 lane.
 */
#include "kernels.h"

#if defined(LI_ARCH_ARM64) && defined(__ARM_FEATURE_DOTPROD) && !defined(__ARM_BIG_ENDIAN)
#include <arm_neon.h>

#include "../common.h"

LI_INLINE int32x4_t idot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

#include "arm_neon_quants.h"

void li_kernels_fill_neon_dot(li_kernels *t) {
    li_kernels_fill_neon(t);
    if (t->isa != LI_ISA_NEON) return; /* no NEON level in this build: stay as it is */
    set_quant_dots(t);
    t->isa = LI_ISA_NEON_DOT;
}
#elif defined(LI_ARCH_ARM64)
/* built without the dot-product flags: the table stays scalar and dispatch skips it */
void li_kernels_fill_neon_dot(li_kernels *t) { li_kernels_fill_scalar(t); }
#else
typedef int li_empty_translation_unit;
#endif
