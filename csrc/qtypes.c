/* qtypes.c: the facts about each tensor type that the rest of the core asks
 * for: block size, bytes per block, and the activation format its dot product
 * takes. Types absent here (IQ*, TQ*, ...) have block_size 0: unsupported.
 */
#include "kernels/kernels.h"

const li_type_traits li_types[LI_TYPE_COUNT] = {
    [LI_TYPE_F32] = {"F32", 1, 4, LI_ACT_F32},
    [LI_TYPE_F16] = {"F16", 1, 2, LI_ACT_F32},
    [LI_TYPE_BF16] = {"BF16", 1, 2, LI_ACT_F32},
    [LI_TYPE_Q4_0] = {"Q4_0", QK4_0, sizeof(block_q4_0), LI_ACT_Q8_0},
    [LI_TYPE_Q4_1] = {"Q4_1", QK4_1, sizeof(block_q4_1), LI_ACT_Q8_1},
    [LI_TYPE_Q5_0] = {"Q5_0", QK5_0, sizeof(block_q5_0), LI_ACT_Q8_0},
    [LI_TYPE_Q5_1] = {"Q5_1", QK5_1, sizeof(block_q5_1), LI_ACT_Q8_1},
    [LI_TYPE_Q8_0] = {"Q8_0", QK8_0, sizeof(block_q8_0), LI_ACT_Q8_0},
    [LI_TYPE_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K), LI_ACT_Q8_K},
    [LI_TYPE_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K), LI_ACT_Q8_K},
    [LI_TYPE_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K), LI_ACT_Q8_K},
    [LI_TYPE_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K), LI_ACT_Q8_K},
    [LI_TYPE_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K), LI_ACT_Q8_K},
    /* MXFP4 takes Q8_0 to share Q8_0's prefill panels; IQ4_XS takes Q8_K as ggml's does (scalar_iq.c) */
    [LI_TYPE_IQ4_NL] = {"IQ4_NL", QK4_NL, sizeof(block_iq4_nl), LI_ACT_Q8_0},
    [LI_TYPE_IQ4_XS] = {"IQ4_XS", QK_K, sizeof(block_iq4_xs), LI_ACT_Q8_K},
    [LI_TYPE_MXFP4] = {"MXFP4", QK_MXFP4, sizeof(block_mxfp4), LI_ACT_Q8_0},
    [LI_TYPE_TQ1_0] = {"TQ1_0", QK_K, sizeof(block_tq1_0), LI_ACT_Q8_K},
    [LI_TYPE_TQ2_0] = {"TQ2_0", QK_K, sizeof(block_tq2_0), LI_ACT_Q8_K},
    [LI_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs), LI_ACT_Q8_K},
    [LI_TYPE_IQ2_XS] = {"IQ2_XS", QK_K, sizeof(block_iq2_xs), LI_ACT_Q8_K},
    [LI_TYPE_IQ2_S] = {"IQ2_S", QK_K, sizeof(block_iq2_s), LI_ACT_Q8_K},
    [LI_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, sizeof(block_iq3_xxs), LI_ACT_Q8_K},
    [LI_TYPE_IQ3_S] = {"IQ3_S", QK_K, sizeof(block_iq3_s), LI_ACT_Q8_K},
    [LI_TYPE_IQ1_S] = {"IQ1_S", QK_K, sizeof(block_iq1_s), LI_ACT_Q8_K},
    [LI_TYPE_IQ1_M] = {"IQ1_M", QK_K, sizeof(block_iq1_m), LI_ACT_Q8_K},
};

static const struct {
    int block_size, type_size;
} act_formats[LI_ACT_COUNT] = {
    [LI_ACT_F32] = {1, 4},
    [LI_ACT_Q8_0] = {QK8_0, sizeof(act_q8_0)},
    [LI_ACT_Q8_1] = {QK8_0, sizeof(act_q8_1)},
    [LI_ACT_Q8_K] = {QK_K, sizeof(act_q8_K)},
};

int li_act_block_size(int act) { return act_formats[act].block_size; }

size_t li_act_row_bytes(int act, int64_t k) {
    return (size_t)(k / act_formats[act].block_size) * (size_t)act_formats[act].type_size;
}

static int supported(int type) {
    return type >= 0 && type < LI_TYPE_COUNT && li_types[type].block_size > 0;
}

int li_type_sizes(int type, int *block_size, int *type_size) {
    if (!supported(type)) return LI_E_TYPE;
    if (block_size) *block_size = li_types[type].block_size;
    if (type_size) *type_size = li_types[type].type_size;
    return LI_OK;
}

size_t li_row_bytes(int type, int64_t k) {
    if (!supported(type) || k <= 0 || k % li_types[type].block_size != 0) return 0;
    return (size_t)(k / li_types[type].block_size) * (size_t)li_types[type].type_size;
}

const char *li_type_name(int type) { return supported(type) ? li_types[type].name : "unsupported"; }

const char *li_status_name(int status) {
    switch (status) {
    case LI_OK: return "ok";
    case LI_E_ARG: return "invalid argument";
    case LI_E_TYPE: return "unsupported tensor type";
    case LI_E_SHAPE: return "inconsistent sizes";
    case LI_E_NOMEM: return "out of memory";
    case LI_E_ISA: return "instruction set not available";
    case LI_E_CONTEXT: return "position outside the context";
    case LI_E_TOKEN: return "token id outside the vocabulary";
    case LI_E_KV: return "KV block table out of range";
    case LI_E_DEVICE: return "GPU backend error";
    default: return "unknown error";
    }
}
