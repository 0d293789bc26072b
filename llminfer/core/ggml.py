"""GGML and GGUF constants: tensor types with their block sizes, file types,
metadata value types, token types and the tokenizer keys this package reads.

They are the numbers of ggml's own enums (ggml.h, gguf.h, llama-vocab.h), kept
here so that loading a model (or `llminfer bench`, whose peak memory is one of
its figures) does not import the gguf package: its import pulls in yaml and
sentencepiece, 7 MiB of resident memory before a weight is read.
tests/core/test_gguf_file.py checks them against the gguf package.
"""

from enum import IntEnum


class GGMLQuantizationType(IntEnum):
    """ggml_type: a tensor's element type."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


# type: (elements per block, bytes per block)
GGML_QUANT_SIZES = {
    GGMLQuantizationType.F32: (1, 4),
    GGMLQuantizationType.F16: (1, 2),
    GGMLQuantizationType.Q4_0: (32, 18),
    GGMLQuantizationType.Q4_1: (32, 20),
    GGMLQuantizationType.Q5_0: (32, 22),
    GGMLQuantizationType.Q5_1: (32, 24),
    GGMLQuantizationType.Q8_0: (32, 34),
    GGMLQuantizationType.Q8_1: (32, 40),
    GGMLQuantizationType.Q2_K: (256, 84),
    GGMLQuantizationType.Q3_K: (256, 110),
    GGMLQuantizationType.Q4_K: (256, 144),
    GGMLQuantizationType.Q5_K: (256, 176),
    GGMLQuantizationType.Q6_K: (256, 210),
    GGMLQuantizationType.Q8_K: (256, 292),
    GGMLQuantizationType.IQ2_XXS: (256, 66),
    GGMLQuantizationType.IQ2_XS: (256, 74),
    GGMLQuantizationType.IQ3_XXS: (256, 98),
    GGMLQuantizationType.IQ1_S: (256, 50),
    GGMLQuantizationType.IQ4_NL: (32, 18),
    GGMLQuantizationType.IQ3_S: (256, 110),
    GGMLQuantizationType.IQ2_S: (256, 82),
    GGMLQuantizationType.IQ4_XS: (256, 136),
    GGMLQuantizationType.I8: (1, 1),
    GGMLQuantizationType.I16: (1, 2),
    GGMLQuantizationType.I32: (1, 4),
    GGMLQuantizationType.I64: (1, 8),
    GGMLQuantizationType.F64: (1, 8),
    GGMLQuantizationType.IQ1_M: (256, 56),
    GGMLQuantizationType.BF16: (1, 2),
    GGMLQuantizationType.TQ1_0: (256, 54),
    GGMLQuantizationType.TQ2_0: (256, 66),
    GGMLQuantizationType.MXFP4: (32, 17),
    GGMLQuantizationType.NVFP4: (64, 36),
    GGMLQuantizationType.Q1_0: (128, 18),
}


class LlamaFileType(IntEnum):
    """llama_ftype: general.file_type, the type mix llama-quantize wrote."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    GUESSED = 1024


class GGUFValueType(IntEnum):
    """gguf_type: the type of a metadata value."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class TokenType(IntEnum):
    """llama_token_type: tokenizer.ggml.token_type values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Keys:
    """Metadata keys."""

    class Tokenizer:
        ADD_BOS = "tokenizer.ggml.add_bos_token"
        ADD_EOS = "tokenizer.ggml.add_eos_token"
        ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
        BOS_ID = "tokenizer.ggml.bos_token_id"
        EOM_ID = "tokenizer.ggml.eom_token_id"
        EOS_ID = "tokenizer.ggml.eos_token_id"
        EOT_ID = "tokenizer.ggml.eot_token_id"
        FIM_MID_ID = "tokenizer.ggml.fim_mid_token_id"
        FIM_PAD_ID = "tokenizer.ggml.fim_pad_token_id"
        FIM_PRE_ID = "tokenizer.ggml.fim_pre_token_id"
        FIM_REP_ID = "tokenizer.ggml.fim_rep_token_id"
        FIM_SEP_ID = "tokenizer.ggml.fim_sep_token_id"
        FIM_SUF_ID = "tokenizer.ggml.fim_suf_token_id"
        LIST = "tokenizer.ggml.tokens"
        MERGES = "tokenizer.ggml.merges"
        MIDDLE_ID = "tokenizer.ggml.middle_token_id"
        MODEL = "tokenizer.ggml.model"
        PRE = "tokenizer.ggml.pre"
        PREFIX_ID = "tokenizer.ggml.prefix_token_id"
        SCORES = "tokenizer.ggml.scores"
        SUFFIX_ID = "tokenizer.ggml.suffix_token_id"
        TOKEN_TYPE = "tokenizer.ggml.token_type"
        UNK_ID = "tokenizer.ggml.unknown_token_id"
