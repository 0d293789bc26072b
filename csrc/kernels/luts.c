/* luts.c: the F16-indexed activation tables the kernels read (SiLU, its
 * slope for interpolation, GELU), filled once by li_init (dispatch.c) before
 * any kernel runs. Baseline flags: the tables are the same on every level.
 */
#include <math.h>
#include <stdint.h>

#include "../common.h"
#include "kernels.h"

float li_lut_silu[65536];
float li_lut_silu_slope[65536];
float li_lut_gelu[65536];

static double silu_ref(double x) {
    if (isinf(x)) return x > 0 ? x : 0.0;
    return x / (1.0 + exp(-x));
}

/* d/dx x*sigmoid(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))) */
static double silu_slope(double x) {
    if (!isfinite(x)) return 0.0;
    const double s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + x * (1.0 - s));
}

/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static double gelu_ref(double x) {
    if (isinf(x)) return x > 0 ? x : 0.0;
    const double c = 0.7978845608028654; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

void li_luts_init(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const double x = li_f16_to_f32((uint16_t)h);
        li_lut_silu[h] = (float)silu_ref(x);
        li_lut_silu_slope[h] = (float)silu_slope(x);
        li_lut_gelu[h] = li_f16_to_f32(li_f32_to_f16((float)gelu_ref(x))); /* ggml keeps it in f16 */
    }
}
